"""Where near dedup's CPU goes: the signature stage and `decide_distributed` on one process, under cProfile, over a
run folder `bench/scale_bench.py --keep-runs local:1` kept (its curated parts). Prints the wall and CPU seconds,
each round's seconds and the functions that took the most time of their own.

    .venv/bin/python bench/near_profile.py --run-dir WORK/run-1000000-local-1 [--top 25] [--pstats out.pstats]

One process (the SERIAL engine), so every task's time is in the profile; the signatures and the decisions are written
under --work (default: a temporary folder), never into the run folder.
"""

from __future__ import annotations

import argparse
import cProfile
import glob
import pstats
import shutil
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from kiln.common.config import load_config  # noqa: E402
from kiln.dedup.buckets import decide_distributed  # noqa: E402
from kiln.dedup.signing import compute_signatures, signature_groups  # noqa: E402
from kiln.engine import SERIAL  # noqa: E402

SOURCE = "scale"  # scale_bench's one source


def profiled(fn):
    """fn() under cProfile: (its result, wall seconds, CPU seconds, the profile)."""
    profile = cProfile.Profile()
    wall, cpu = time.perf_counter(), time.process_time()
    profile.enable()
    try:
        result = fn()
    finally:
        profile.disable()
    return result, time.perf_counter() - wall, time.process_time() - cpu, profile


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run-dir", required=True, help="a run folder kept by scale_bench.py (--keep-runs local:1)")
    parser.add_argument("--config", default=str(ROOT / "configs" / "default.yaml"))
    parser.add_argument("--work", help="where signatures and decisions go (default: a temporary folder)")
    parser.add_argument("--top", type=int, default=25, help="functions listed per stage")
    parser.add_argument("--pstats", help="also save the decide stage's profile here (for pstats / snakeviz)")
    args = parser.parse_args()

    near = load_config(args.config).dedup.near
    # glob follows each dataset's link to its current version and skips the hidden version folders
    curated = sorted(map(Path, glob.glob(f"{Path(args.run_dir) / 'store' / 'curated'}/**/part-*.parquet",
                                         recursive=True)))
    if not curated:
        sys.exit(f"{args.run_dir}: no curated parts under store/curated (keep a run with --keep-runs local:1)")
    work = Path(args.work or tempfile.mkdtemp(prefix="kiln-near-profile-"))
    shutil.rmtree(work / "signatures", ignore_errors=True)
    (work / "signatures").mkdir(parents=True)
    groups = signature_groups(curated, near.rows_per_part)
    parts = [work / "signatures" / f"signatures-{k:05d}.parquet" for k in range(len(groups))]

    signed, wall, cpu, profile = profiled(lambda: compute_signatures(groups, parts, near, engine=SERIAL,
                                                                     progress=False))
    print(f"signatures: {signed.documents:,} documents in {len(parts)} parts, {wall:.1f} s wall, {cpu:.1f} s CPU")
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)

    result, wall, cpu, profile = profiled(lambda: decide_distributed(
        parts, {SOURCE: (1, 0)}, [], work / "near-work", work / "near-out", near, "profile", engine=SERIAL))
    rounds = ", ".join(f"{k} {v:.1f}" for k, v in result["timing"].items() if k != "total_seconds")
    print(f"decide: {wall:.1f} s wall, {cpu:.1f} s CPU; rounds (s): {rounds}")
    if args.pstats:
        profile.dump_stats(args.pstats)
    pstats.Stats(profile).sort_stats("tottime").print_stats(args.top)
    if not args.work:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
