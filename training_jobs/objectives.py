"""Training objectives over the loader's windows: causal LM, prefix LM and T5 span corruption, all for the
same decoder (the model takes `prefix_len` for bidirectional attention over a prefix; targets of IGNORE leave
the loss). Validation is causal LM loss for every objective, so runs stay comparable.

clm              inputs = window[:-1], targets = window[1:]; causal attention.
prefix_lm        a split point p drawn uniformly in [1, T-1] per row; attention is bidirectional over the first
                 p tokens and causal after; the loss is on the suffix only (targets inside the prefix would be
                 visible to the query predicting them). The explicit attention mask this needs rules out the flash
                 kernel on GPU: SDPA uses the memory-efficient kernel, which also reads a (B, 1, T, T) mask.
span_corruption  T5's recipe (Raffel et al. 2020, sec. 3.1.4): noise density 0.15, mean span 3; each noise span
                 of the text is replaced by a sentinel in the input, and the target lists each sentinel followed
                 by the span it replaced. Decoder-only formulation (the "non-causal decoder" of Wang et al. 2022):
                 one sequence, input then target, prefix-LM attention over the input and the loss on the target
                 only. The input + target is 2·spans tokens longer than the text, so a window of T + 1 tokens
                 takes the longest text that fits (about T / 1.1 tokens at the defaults); the rest is padding,
                 left out of the loss.

Random draws come from a generator seeded by (seed, rank, step, micro-batch): the same on a resume.
"""

from __future__ import annotations


import numpy as np
import torch

from training_jobs.model import IGNORE
from training_jobs.span_lengths import (
    MEAN_SPAN,
    NOISE_DENSITY,
    corrupted_length,
    noise_and_spans,
    sentinels_needed,
    text_length_for,
)


def _rng(seed: int, rank: int, step: int, micro: int) -> np.random.Generator:
    return np.random.default_rng([seed, rank, step, micro])


# ------------------------------------------------------------------------------------------ span corruption

def _segments(items: int, count: int, rng: np.random.Generator) -> np.ndarray:
    """`items` split into `count` runs of at least one, uniformly over the ways to do so."""
    cuts = np.sort(rng.choice(np.arange(1, items), size=count - 1, replace=False)) if count > 1 else np.zeros(0, int)
    return np.diff(np.concatenate(([0], cuts, [items])))


def noise_spans(length: int, rng: np.random.Generator, density: float = NOISE_DENSITY,
                mean_span: float = MEAN_SPAN) -> tuple[np.ndarray, np.ndarray]:
    """T5's random_spans_noise_mask as run lengths: (kept run lengths, noise run lengths), alternating kept
    then noise, the same number of each, every run at least one token."""
    noise, spans = noise_and_spans(length, density, mean_span)
    return _segments(length - noise, spans, rng), _segments(noise, spans, rng)


def span_corrupt(text: np.ndarray, sentinels: np.ndarray, rng: np.random.Generator, density: float = NOISE_DENSITY,
                 mean_span: float = MEAN_SPAN) -> tuple[np.ndarray, np.ndarray]:
    """(input, target): the input keeps the text with noise span i replaced by sentinels[i]; the target is
    sentinels[i] followed by span i, for every span in order."""
    kept, noise = noise_spans(len(text), rng, density, mean_span)
    if len(kept) > len(sentinels):
        # The config and the training_run asset check this before launch (span_lengths.sentinel_problem).
        raise ValueError(f"{len(kept)} noise spans need as many sentinel tokens; the tokenizer has {len(sentinels)} "
                         f"(tokenizer.sentinel_tokens): raise it, or train on shorter sequences")
    inputs, targets, at = [], [], 0
    for i, (k, n) in enumerate(zip(kept, noise)):
        inputs += [text[at:at + k], sentinels[i:i + 1]]
        targets += [sentinels[i:i + 1], text[at + k:at + k + n]]
        at += k + n
    return np.concatenate(inputs), np.concatenate(targets)


class Objective:
    """Turns a loader batch (inputs, targets: the window's first and last T tokens) into what the model trains
    on: (inputs, targets with IGNORE, prefix_len or None)."""

    name = "clm"

    def __init__(self, seed: int = 0, rank: int = 0):
        self.seed, self.rank = seed, rank

    @property
    def loss_name(self) -> str:
        return "train/loss" if self.name == "clm" else f"train/{self.name}_loss"

    def __call__(self, x: torch.Tensor, y: torch.Tensor, step: int, micro: int):
        return x, y, None


class PrefixLM(Objective):
    name = "prefix_lm"

    def __call__(self, x, y, step, micro):
        B, T = x.shape
        split = torch.from_numpy(_rng(self.seed, self.rank, step, micro).integers(1, T, size=B))  # p in [1, T-1]
        # Position i predicts token i + 1: inside the prefix (i + 1 < p) that token is visible, so no loss there.
        targets = y.masked_fill(torch.arange(T)[None, :] < (split[:, None] - 1), IGNORE)
        return x, targets, split


class SpanCorruption(Objective):
    name = "span_corruption"

    def __init__(self, sentinels: list[int], pad_id: int, seed: int = 0, rank: int = 0):
        super().__init__(seed, rank)
        if not sentinels:
            raise ValueError("training.objective span_corruption needs sentinel tokens in the tokenizer: set "
                             "tokenizer.sentinel_tokens (T5 uses 100) and re-materialize the tokenizer and token "
                             "shards")
        self.sentinels, self.pad_id = np.asarray(sentinels, dtype=np.int64), pad_id

    def __call__(self, x, y, step, micro):
        B, T = x.shape
        windows = torch.cat([x, y[:, -1:]], dim=1).numpy()  # T + 1 tokens per row
        rng = _rng(self.seed, self.rank, step, micro)
        length = text_length_for(T + 1)
        seqs = np.full((B, T + 1), self.pad_id, dtype=np.int64)
        targets = np.full((B, T), IGNORE, dtype=np.int64)
        prefix = np.zeros(B, dtype=np.int64)
        for b in range(B):
            inputs, target = span_corrupt(windows[b, :length], self.sentinels, rng)
            n_in, n = len(inputs), len(inputs) + len(target)
            seqs[b, :n] = np.concatenate([inputs, target])
            # Position i predicts token i + 1: the loss covers the target tokens, n_in .. n - 1.
            targets[b, n_in - 1:n - 1] = seqs[b, n_in:n]
            prefix[b] = n_in
        return torch.from_numpy(seqs[:, :-1]), torch.from_numpy(targets), torch.from_numpy(prefix)


def make_objective(name: str, seed: int, rank: int, sentinels: list[int] | None = None,
                   pad_id: int = 0) -> Objective:
    if name == "prefix_lm":
        return PrefixLM(seed, rank)
    if name == "span_corruption":
        return SpanCorruption(sentinels or [], pad_id, seed, rank)
    return Objective(seed, rank)


__all__ = ["MEAN_SPAN", "NOISE_DENSITY", "Objective", "PrefixLM", "SpanCorruption", "corrupted_length",
           "make_objective", "noise_spans", "sentinels_needed", "span_corrupt", "text_length_for"]
