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
    sentinels_needed,
    span_corrupt,
    text_length_for,
)
from training_jobs.span_lengths import longest_seq_len, sentinel_problem

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


def test_the_sentinels_a_run_needs_by_hand():
    """A row of seq_len T is a window of T + 1 tokens cut to the longest text whose input + target fits, start
    int((T + 1) / 1.1) + 2 and step down; spans = round(round(L x 0.15) / 3) (Python rounds half to even).
    T 4096: 4097 / 1.1 = 3724.5 -> 3726: 558.9 -> 559 noise, 186.3 -> 186 spans, 3726 + 372 = 4098 > 4097;
            3725: 558.75 -> 559, 186 spans, 3725 + 372 = 4097 fits.                          186 sentinels.
    T 8192: 8193 / 1.1 = 7448.2 -> 7450: 1117.5 -> 1118, 372.7 -> 373 spans, 7450 + 746 = 8196 > 8193;
            7449: 1117.35 -> 1117, 372.3 -> 372 spans, 7449 + 744 = 8193 fits.              372 sentinels.
    T 2200: 2201 / 1.1 = 2000.9 -> 2002: 300.3 -> 300, 100 spans, 2202 > 2201; 2001: 300.15 -> 300, 2201 fits. 100.
    T 2211: 2212 / 1.1 = 2010.9 -> 2012 (302 noise, 101 spans, 2214), 2011 (301.65 -> 302, 101, 2213) too long;
            2010: 301.5 -> 302, 101 spans, 2212 fits.                                          101 sentinels,
    so T 2210 (window 2211: 2010 needs 2212, 2009 has 301 noise, 100 spans, 2209 fits) is the most 100 cover."""
    assert [sentinels_needed(t) for t in (4096, 8192, 2200, 2210, 2211)] == [186, 372, 100, 100, 101]
    assert longest_seq_len(100) == 2210 and longest_seq_len(0) == 0
    assert sentinel_problem(2210, "training.seq_len", 100, "have 100", "fix") is None
    message = sentinel_problem(4096, "training.seq_len", 100, "tokenizer.sentinel_tokens is 100", "raise it to ≥ {need}")
    assert message == ("training.objective span_corruption at seq_len 4096 (training.seq_len) needs 186 sentinel "
                       "tokens (noise_density 0.15, mean_span 3: one per noise span of a window); "
                       "tokenizer.sentinel_tokens is 100: raise it to ≥ 186, or lower training.seq_len to ≤ 2210")


def _fails_at_step_1(seq_len: int, sentinels: int) -> bool:
    rng = np.random.default_rng(seq_len)
    window = torch.from_numpy(rng.integers(200, 8000, size=(1, seq_len + 1)))
    try:
        SpanCorruption(list(range(7, 7 + sentinels)), pad_id=0)(window[:, :-1], window[:, 1:], step=1, micro=0)
    except ValueError as exc:
        assert "noise spans need as many sentinel tokens" in str(exc)
        return True
    return False


@settings(max_examples=60, deadline=None)
@given(st.integers(8, 700), st.integers(1, 40))
def test_the_check_before_launch_refuses_exactly_what_fails_at_step_1(seq_len, sentinels):
    assert (sentinel_problem(seq_len, "training.seq_len", sentinels, "", "") is not None) == \
        _fails_at_step_1(seq_len, sentinels)


def test_the_issues_long_runs_fail_at_step_1_and_are_refused():
    """100 sentinels (the recipe's): seq_len 2210 runs, 2211 and 4096 fail at step 1 — and the check says so."""
    for seq_len, fails in ((2210, False), (2211, True), (4096, True)):
        assert _fails_at_step_1(seq_len, 100) is fails
        assert (sentinel_problem(seq_len, "training.seq_len", 100, "", "") is not None) is fails


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
