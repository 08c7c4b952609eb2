"""Is this machine quiet enough to measure a ratio? The same fixed work (pure Python and a numpy sort, ~0.2 s of
one core) timed in CPU seconds, again and again, on an otherwise idle machine.

    .venv/bin/python bench/host_noise.py [--samples 40] [--pause-s 2] [--json OUT]

CPU seconds of fixed work move only when the core itself runs faster or slower: frequency, or, on a shared VM, the
hypervisor's other tenants on the same physical cores and caches (which /proc/stat's steal does not show). The
ratio goals of bench/scale_bench.py (Ray's CPU per MB within 1.1x the pool's, two workers at least 1.9x one) sit
5-10% from where the engines measure; two runs of a stage compared minutes apart carry the machine's drift over
those minutes. With a coefficient of variation above `QUIET_CV`, that drift is as large as the margins and a ratio
can miss or meet its goal by chance (scale_bench.py records this probe before and after its series).
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import numpy as np

QUIET_CV = 0.02  # well inside the goals' 5-10% margins


def fixed_work() -> float:
    """CPU seconds of this thread for the same work every call: interpreted bytecode and a memory-bound sort, the
    two kinds of work the curation stages do."""
    start = time.thread_time()
    total = 0
    for i in range(1_500_000):
        total += i * i % 7
    np.sort(np.random.default_rng(0).integers(0, 1 << 60, 2_000_000, dtype=np.uint64))
    return time.thread_time() - start


def spread(samples: list[float]) -> dict:
    """Summary of repeated timings of the same work: coefficient of variation (population), median, max / min."""
    cv = statistics.pstdev(samples) / statistics.fmean(samples)
    return {"samples": len(samples), "median_s": round(statistics.median(samples), 4),
            "min_s": round(min(samples), 4), "max_s": round(max(samples), 4),
            "max_over_min": round(max(samples) / min(samples), 3), "cv": round(cv, 4), "quiet": cv <= QUIET_CV}


def describe(noise: dict) -> str:
    verdict = "quiet" if noise["quiet"] else (f"NOT quiet: above {QUIET_CV}, the drift is as large as the goals' "
                                              "margins, and a ratio can miss or meet its goal by chance")
    return (f"fixed work, {noise['samples']} samples: median {noise['median_s']} s, min {noise['min_s']}, max "
            f"{noise['max_s']} (max/min {noise['max_over_min']}), cv {noise['cv']}: {verdict}")


def measure(samples: int = 20, pause_s: float = 0.5) -> dict:
    fixed_work()  # first call pays numpy's page faults
    timings = []
    for _ in range(samples):
        timings.append(fixed_work())
        time.sleep(pause_s)
    return spread(timings)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--pause-s", type=float, default=2.0, help="idle seconds between samples (drift shows over minutes)")
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    result = measure(args.samples, args.pause_s)
    print(describe(result))
    if args.json:
        Path(args.json).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
