"""The LSH bands x rows choice for near-dedup (numpy only: the config validates `dedup.near` with it, so
`kiln.common.config` imports it; `kiln.dedup.minhash.bands_rows` applies it)."""

from __future__ import annotations

import numpy as np


def candidate_probability(j: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """Probability that a pair with Jaccard `j` shares at least one LSH band (the S-curve)."""
    return 1.0 - (1.0 - np.power(j, rows)) ** bands


def choose_bands(num_perm: int, threshold: float, min_recall: float) -> tuple[int, int]:
    """The bands x rows with the fewest candidates below the threshold among those that find at least
    `min_recall` of pairs *at* the threshold. Candidates are verified exactly, so recall is what
    matters; a plain LSH tuned for threshold 0.8 misses a large share of pairs at J 0.80-0.85."""
    grid = np.linspace(0.0, threshold, 201)
    best, best_fp = None, float("inf")
    for rows in range(1, num_perm + 1):
        for bands in range(2, num_perm // rows + 1):
            if candidate_probability(threshold, bands, rows) < min_recall:
                continue
            fp = float(np.trapezoid(candidate_probability(grid, bands, rows), grid))
            if fp < best_fp - 1e-12:
                best, best_fp = (bands, rows), fp
            break  # more bands only adds candidates for this row count
    if best is None:
        raise ValueError(f"no bands x rows within num_perm={num_perm} reaches recall {min_recall} at Jaccard "
                         f"{threshold}; raise dedup.near.num_perm or lower dedup.near.min_recall")
    return best
