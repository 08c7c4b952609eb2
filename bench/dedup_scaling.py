"""Two workers over one for exact dedup and near dedup, measured so that a shared machine's noise shows.

    .venv/bin/python bench/dedup_scaling.py --run-dir /tmp/s1m/run-1000000-local-1 --engines local,ray --rounds 1 \
        --json docs/bench/dedup_scaling_1m.json

Input: a run folder that `bench/scale_bench.py --keep-runs local:1` kept (its filtered documents and signature
parts). Each trial re-runs one stage on one engine and worker count, in a fresh process, into a fresh scratch folder:
  exact  kiln.curation.exact_dedup.exact_dedup of the filtered parts, committed to a store (as scale_bench's stage)
  near   kiln.dedup.buckets.decide_distributed of the signature parts (as scale_bench's stage)
The engine is started and warmed before the clock starts. Per stage, trials run in rounds of ABBA order over both
factors: pool 1, Ray 1, pool 2, Ray 2, then the same backwards (each half-round holds every engine and worker
count once), so that a slow minute of the host weighs on every arm alike: on a shared VM the same stage's wall and CPU
seconds moved by 1.5x between runs minutes apart (hypervisor steal, and neighbours slowing the same instructions),
more than the effects being measured. Per trial: wall seconds, CPU seconds of the trial's process and its
descendants, and the machine's counters over the trial (`scale_bench.machine_counters`: steal included). Per engine
and stage: each half-round's two-over-one ratio (one worker's wall over two workers'), the ratio of the medians, and
Ray's CPU seconds over the pool's per worker count, each half-round's and of the medians.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.scale_bench import SOURCE, RssSampler, machine_counters, machine_delta  # noqa: E402
from kiln.common.manifest import write_json_atomic  # noqa: E402

STAGES = ("exact", "near")


def trial(args) -> dict:
    from kiln.common.config import load_config
    from kiln.common.storage import Store
    from kiln.curation.exact_dedup import HashSource, exact_dedup
    from kiln.dedup.buckets import decide_distributed
    from kiln.engine import ProcessPool, RayEngine
    from kiln.engine.base import warm_worker

    run, scratch = Path(args.run_dir), Path(args.scratch)
    shutil.rmtree(scratch, ignore_errors=True)
    scratch.mkdir(parents=True)
    engine = ProcessPool(args.workers) if args.engine == "local" else RayEngine(workers=args.workers)
    # pool / Ray started, its workers' modules imported (the pool's forkserver preloads them; Ray's import on use)
    engine.map_parts(warm_worker, list(range(2 * args.workers)), desc="warm", progress=False)
    near = load_config(args.config).dedup.near  # before the clock, as scale_bench reads it once per run
    sampler = RssSampler(1.0)
    cpu0, machine0 = sampler.cpu_seconds(), machine_counters()
    start = time.perf_counter()
    if args.stage == "exact":
        files = tuple(map(str, Store(run / "store").files("filtered", SOURCE, "documents")))
        store = Store(scratch / "store")
        with store.staging("curated", SOURCE) as w:
            stats = exact_dedup([HashSource(SOURCE, 1, files)], 0, w, scratch / "shuffle", engine, progress=False)
            w.commit(code_version="bench", config={}, inputs={}, counts={})
        out = {"docs_out": stats.docs_out}
    else:
        parts = sorted((run / "signatures").glob("*.parquet"))
        result = decide_distributed(parts, {SOURCE: (1, 0)}, [], scratch / "work", scratch / "out", near, "bench",
                                    engine=engine)
        out = {"kept": result["kept"], "rounds_s": result["timing"]}
    wall = time.perf_counter() - start
    cpu1 = sampler.cpu_seconds()
    return {"stage": args.stage, "engine": args.engine, "workers": args.workers, "wall_s": round(wall, 3),
            "cpu_s": round(sum(cpu1.values()) - sum(cpu0.values()), 2),
            "machine": machine_delta(machine0, machine_counters()), **out}


def schedule(engines: list[str], rounds: int) -> list[tuple[int, str, int]]:
    """(half-round, engine, workers) in ABBA order over engines and worker counts: each half-round holds every arm
    once, the second half of a round in the first half's reverse."""
    forward = [(engine, workers) for workers in (1, 2) for engine in engines]
    out = []
    for r in range(rounds):
        out += [(2 * r, e, w) for e, w in forward] + [(2 * r + 1, e, w) for e, w in reversed(forward)]
    return out


def _median_ratio(a: list[float], b: list[float]) -> float:
    return round(statistics.median(a) / statistics.median(b), 3)


def summary(trials: list[dict]) -> dict:
    """Per stage and engine: one worker's wall over two workers' per half-round and of the medians; per stage and
    worker count, Ray's CPU seconds over the pool's, per half-round and of the medians."""
    out: dict = {}
    for stage in sorted({t["stage"] for t in trials}):
        mine = [t for t in trials if t["stage"] == stage]
        at = {(t["half"], t["engine"], t["workers"]): t for t in mine}
        halves = sorted({t["half"] for t in mine})
        for engine in sorted({t["engine"] for t in mine}):
            one = [at[h, engine, 1]["wall_s"] for h in halves if (h, engine, 1) in at]
            two = [at[h, engine, 2]["wall_s"] for h in halves if (h, engine, 2) in at]
            out[f"{engine}:{stage}"] = {
                "one_worker_wall_s": one, "two_workers_wall_s": two, "median_ratio": _median_ratio(one, two),
                "half_round_ratios": [round(a / b, 3) for a, b in zip(one, two)],
                "cpu_s": {w: [at[h, engine, w]["cpu_s"] for h in halves if (h, engine, w) in at] for w in (1, 2)},
                "steal_s": [t["machine"].get("cpu_steal_s") for t in mine if t["engine"] == engine]}
        if {"local", "ray"} <= {t["engine"] for t in mine}:
            for w in (1, 2):
                pool = [at[h, "local", w]["cpu_s"] for h in halves if (h, "local", w) in at and (h, "ray", w) in at]
                ray = [at[h, "ray", w]["cpu_s"] for h in halves if (h, "local", w) in at and (h, "ray", w) in at]
                out[f"ray_cpu_over_pool:{stage}:{w}"] = {
                    "half_rounds": [round(r / p, 3) for r, p in zip(ray, pool)], "of_medians": _median_ratio(ray, pool)}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run-dir", required=True, help="a run folder kept by scale_bench.py --keep-runs")
    ap.add_argument("--engines", default="local,ray")
    ap.add_argument("--stages", default=",".join(STAGES))
    ap.add_argument("--rounds", type=int, default=1, help="ABBA rounds per stage (each: every engine and worker count twice)")
    ap.add_argument("--scratch", default=None, help="scratch folder (default: next to the run folder)")
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--json", default=None)
    ap.add_argument("--trial", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--engine", default="local", help=argparse.SUPPRESS)
    ap.add_argument("--workers", type=int, default=1, help=argparse.SUPPRESS)
    ap.add_argument("--stage", default="exact", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.trial:
        print(json.dumps(trial(args)))
        return
    scratch = Path(args.scratch or f"{args.run_dir.rstrip('/')}-scaling")
    trials = []
    try:
        for stage in args.stages.split(","):
            for half, engine, workers in schedule(args.engines.split(","), args.rounds):
                cmd = [sys.executable, __file__, "--trial", "--engine", engine, "--workers", str(workers),
                       "--stage", stage, "--run-dir", args.run_dir, "--scratch", str(scratch),
                       "--config", args.config]
                done = subprocess.run(cmd, check=True, capture_output=True, text=True)
                t = {"half": half, **json.loads(done.stdout.strip().splitlines()[-1])}
                trials.append(t)
                print(f"{engine}:{workers} {stage}: {t['wall_s']:.1f} s wall, {t['cpu_s']:.1f} CPU-s, steal "
                      f"{t['machine'].get('cpu_steal_s')} s", flush=True)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    out = {"argv": sys.argv[1:], "trials": trials, "summary": summary(trials)}
    print(json.dumps(out["summary"], indent=1))
    if args.json:
        write_json_atomic(Path(args.json), json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
