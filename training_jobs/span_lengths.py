"""Span corruption's arithmetic (T5: noise density 0.15, mean span 3): how many noise spans a text gets, how long
its input + target is, the longest text a window holds, and so how many sentinel tokens a run at a seq_len needs.
The objective (training_jobs.objectives) and the checks before launch (the project config, the training_run asset)
both count from here, so a configuration refused before launch is exactly one that would fail at step 1.

Standard library only: the project config imports it without torch or numpy.
"""

from __future__ import annotations

NOISE_DENSITY, MEAN_SPAN = 0.15, 3.0


def noise_and_spans(length: int, density: float = NOISE_DENSITY, mean_span: float = MEAN_SPAN) -> tuple[int, int]:
    """(noise tokens, noise spans) of a text of `length`, as T5's random_spans_noise_mask counts them: at least one
    of each, at least one kept token, every span at least one token and separated by a kept run."""
    noise = min(max(int(round(length * density)), 1), length - 1)
    spans = min(max(int(round(noise / mean_span)), 1), noise, length - noise)
    return noise, spans


def corrupted_length(length: int, density: float = NOISE_DENSITY, mean_span: float = MEAN_SPAN) -> int:
    """Tokens of input + target for a text of `length`: the text plus two sentinels per span."""
    return length + 2 * noise_and_spans(length, density, mean_span)[1]


def text_length_for(window: int, density: float = NOISE_DENSITY, mean_span: float = MEAN_SPAN) -> int:
    """The longest text whose input + target fits in `window` tokens."""
    length = int(window / (1 + 2 * density / mean_span)) + 2
    while corrupted_length(length, density, mean_span) > window:
        length -= 1
    return length


def sentinels_needed(seq_len: int) -> int:
    """Sentinel tokens a span-corruption run at `seq_len` needs: one per noise span of the text its window of
    seq_len + 1 tokens holds (what `SpanCorruption` cuts every row to)."""
    return noise_and_spans(text_length_for(seq_len + 1))[1]


def longest_seq_len(sentinels: int) -> int:
    """The longest seq_len that `sentinels` sentinel tokens cover (0 if none: every text has a span)."""
    if sentinels < 1:
        return 0
    lo, hi = 1, 2
    while sentinels_needed(hi) <= sentinels:  # needed grows with seq_len: double, then bisect
        lo, hi = hi, hi * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if sentinels_needed(mid) <= sentinels else (lo, mid)
    return lo


def sentinel_problem(seq_len: int, seq_len_key: str, sentinels: int, have: str, fix: str) -> str | None:
    """None when `sentinels` cover span corruption at `seq_len`; else the error: the keys, the number needed,
    `have` (where the sentinel count comes from) and `fix` ('{need}' is filled in), or a shorter seq_len."""
    need = sentinels_needed(seq_len)
    if sentinels >= need:
        return None
    shorter = longest_seq_len(sentinels)
    return (f"training.objective span_corruption at seq_len {seq_len} ({seq_len_key}) needs {need} sentinel tokens "
            f"(noise_density {NOISE_DENSITY}, mean_span {MEAN_SPAN:g}: one per noise span of a window); {have}: "
            f"{fix.format(need=need)}" + (f", or lower {seq_len_key} to ≤ {shorter}" if shorter >= 8 else ""))


__all__ = ["MEAN_SPAN", "NOISE_DENSITY", "corrupted_length", "longest_seq_len", "noise_and_spans", "sentinel_problem",
           "sentinels_needed", "text_length_for"]
