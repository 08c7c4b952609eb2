"""Training objectives: span corruption round-trips (a second implementation rebuilds the text from input and
target), its noise matches T5's published density and span length, prefix-LM targets leave the prefix out."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from training_jobs.model import IGNORE
from training_jobs.objectives import (
    MEAN_SPAN,
    NOISE_DENSITY,
    PrefixLM,
    SpanCorruption,
    corrupted_length,
    noise_spans,
    span_corrupt,
    text_length_for,
)

SENTINELS = np.arange(7, 7 + 100)


def rebuild(inputs: list[int], target: list[int], sentinels) -> list[int]:
    """Replace each sentinel in the input by what follows that sentinel in the target, up to the next one."""
    sentinels = set(int(s) for s in sentinels)
    spans, current = {}, None
    for t in target:
        if t in sentinels:
            current = t
            spans[current] = []
        else:
            spans[current].append(t)
    out = []
    for t in inputs:
        out.extend(spans[t] if t in sentinels else [t])
    return out


@settings(max_examples=200, deadline=None)
@given(st.integers(2, 600), st.integers(0, 2**32 - 1))
def test_span_corruption_round_trips(length, seed):
    rng = np.random.default_rng(seed)
    text = rng.integers(200, 8000, size=length)
    inputs, target = span_corrupt(text, SENTINELS, np.random.default_rng(seed))
    assert rebuild(inputs.tolist(), target.tolist(), SENTINELS) == text.tolist()
    assert len(inputs) + len(target) == corrupted_length(length)
    assert target[0] == SENTINELS[0]  # the target opens with the first sentinel


def test_noise_follows_t5s_density_and_mean_span():
    """Raffel et al. 2020: 15% of tokens corrupted, in spans of mean length 3. For 512 tokens: 77 noise tokens in
    26 spans (round(512 x 0.15) = 77, round(77 / 3) = 26), 26 kept runs between and before them."""
    kept, noise = noise_spans(512, np.random.default_rng(0))
    assert noise.sum() == 77 and len(noise) == len(kept) == 26 and (noise >= 1).all() and (kept >= 1).all()
    assert kept.sum() + noise.sum() == 512
    assert noise.mean() == pytest.approx(MEAN_SPAN, abs=0.05) and noise.sum() / 512 == pytest.approx(NOISE_DENSITY, abs=0.01)


def test_the_longest_text_that_fits_the_window():
    # 512 + 2 x 26 = 564 tokens > 513; 467 -> 70 noise, 23 spans: 467 + 46 = 513 exactly.
    assert corrupted_length(467) == 513 and text_length_for(513) == 467
    assert corrupted_length(468) > 513


def test_span_corruption_batches_train_on_the_target_only():
    rng = np.random.default_rng(1)
    window = torch.from_numpy(rng.integers(200, 8000, size=(3, 65)))
    x, y = window[:, :-1], window[:, 1:]
    inputs, targets, prefix = SpanCorruption(list(SENTINELS), pad_id=0, seed=5)(x, y, step=3, micro=0)
    assert inputs.shape == targets.shape == (3, 64)
    length = text_length_for(65)
    for b in range(3):
        n_in = int(prefix[b])
        kept = (targets[b] != IGNORE).nonzero().flatten().tolist()
        n = n_in + len(kept)  # input + target tokens; the rest is padding
        assert kept == list(range(n_in - 1, n - 1))  # loss from the last input position to the target's end
        last = int(targets[b, -1])  # token T of the sequence appears only as the last target
        seq = inputs[b].tolist() + [0 if last == IGNORE else last]
        assert targets[b, n_in - 1:n - 1].tolist() == seq[n_in:n]
        assert rebuild(seq[:n_in], seq[n_in:n], SENTINELS) == window[b, :length].tolist()
        assert (inputs[b, n:] == 0).all()
    again = SpanCorruption(list(SENTINELS), pad_id=0, seed=5)(x, y, step=3, micro=0)
    assert all(torch.equal(a, b) for a, b in zip(again, (inputs, targets, prefix)))  # deterministic per step


def test_span_corruption_without_sentinels_says_what_to_set():
    with pytest.raises(ValueError, match="tokenizer.sentinel_tokens"):
        SpanCorruption([], pad_id=0)


def test_prefix_lm_leaves_the_prefix_out_of_the_loss():
    window = torch.arange(200, 200 + 4 * 33).view(4, 33)
    x, y = window[:, :-1], window[:, 1:]
    inputs, targets, split = PrefixLM(seed=1)(x, y, step=7, micro=1)
    assert torch.equal(inputs, x) and ((split >= 1) & (split <= 31)).all()
    for b in range(4):
        p = int(split[b])
        # Hand-worked: position i predicts token i + 1; tokens 1..p-1 lie in the prefix, visible to those queries.
        assert (targets[b, :p - 1] == IGNORE).all() and torch.equal(targets[b, p - 1:], y[b, p - 1:])
    other = PrefixLM(seed=1)(x, y, step=8, micro=1)[2]
    assert not torch.equal(other, split)  # a new draw per step
