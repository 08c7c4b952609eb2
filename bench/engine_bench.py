"""The data engine: curation throughput and memory per engine, worker count and corpus size.

    .venv/bin/python bench/engine_bench.py --corpus demo [--limit 1000]
    .venv/bin/python bench/engine_bench.py --corpus synthetic --documents 100000 [--engines pool,ray] [--workers 1,2]
    .venv/bin/python bench/engine_bench.py --corpus synthetic --documents 1000000 --engines ray --workers 2
    .venv/bin/python bench/engine_bench.py ... --cluster   # also on a two-node Ray cluster on loopback (tests' fixture)
    .venv/bin/python bench/engine_bench.py ... --warm      # time a second pass: workers started, models loaded

For each engine and worker count: the filter stage (normalize → the source's profile → PII: "the curation chain")
and exact dedup (the shuffle) in documents/s and documents/s per worker, then the peak resident memory of the driver
(this process) and of the largest worker process, sampled every 0.2 s. The corpus is read once (`ingest`, not
timed). The synthetic corpus is `kiln.curation.synthetic` (deterministic; profile `prose`), the demo corpus the embedded
sources of configs/default.yaml with their own profiles. Figures are for the machine it runs on: quote them with
the machine named.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln import engine as engines  # noqa: E402
from kiln.common.config import ProjectConfig, load_config, parse_config  # noqa: E402
from kiln.common.storage import Store  # noqa: E402
from kiln.curation.exact_dedup import HashSource, exact_dedup  # noqa: E402
from kiln.curation.pipeline import filter_documents, ingest, profile_steps  # noqa: E402
from kiln.curation.synthetic import write_corpus  # noqa: E402
from kiln.engine import ProcessPool, RayEngine  # noqa: E402

GIB = 1 << 30


class PeakMemory:
    """Peak RSS per process of the workers (Ray's `ray::` processes, or this process's children), sampled."""

    def __init__(self):
        self.peak: dict[int, int] = {}
        self.driver = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _workers(self):
        me = psutil.Process()
        children = {p.pid for p in me.children(recursive=True)}
        for p in psutil.process_iter(["pid", "name"]):
            if p.info["pid"] in children or (p.info["name"] or "").startswith("ray::"):
                yield p

    def _run(self):
        me = psutil.Process()
        while not self._stop.is_set():
            self.driver = max(self.driver, me.memory_info().rss)
            for p in self._workers():
                try:
                    rss = p.memory_info().rss
                except psutil.Error:
                    continue
                self.peak[p.pid] = max(self.peak.get(p.pid, 0), rss)
            time.sleep(0.2)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()

    @property
    def largest(self) -> int:
        return max(self.peak.values(), default=0)


def synthetic_config(corpus: Path, rows_per_part: int):
    return parse_config({
        "sources": [{"name": "web", "kind": "jsonl", "path": str(corpus), "license": "CC-BY", "domain": "web",
                     "quality_tier": 3, "profile": "prose"}],
        "profiles": {name: [{s.step: s.params} for s in steps]
                     for name, steps in load_config("configs/default.yaml").profiles.items()},
        "reading": {"rows_per_part": rows_per_part},
    })


def run(config, raw: Store, out: Path, engine) -> dict:
    store = Store(out)
    docs = 0
    described = engine.describe()  # connects to Ray (or starts it) before the clock starts
    with PeakMemory() as memory:
        t0 = time.perf_counter()
        for source in config.sources:
            with store.staging("filtered", source.name) as writer:
                stats = filter_documents(raw.files("raw", source.name, "documents"), profile_steps(config, source.name),
                                         config.curation.exact_dedup, writer, engine, progress=False)
                writer.commit(code_version="bench", config={}, inputs={}, counts={})
            docs += stats.docs_in
        t_filter = time.perf_counter() - t0
        hashed = [HashSource(s.name, s.quality_tier, tuple(map(str, store.files("filtered", s.name, "documents"))))
                  for s in config.sources]
        t0 = time.perf_counter()
        deduped = 0
        for i, source in enumerate(config.sources):
            with store.staging("curated", source.name) as writer:
                stats = exact_dedup(hashed, i, writer, writer.scratch("shuffle"), engine, progress=False)
                writer.commit(code_version="bench", config={}, inputs={}, counts={})
            deduped += stats.docs_in
        t_dedup = time.perf_counter() - t0
    return {"docs": docs, "filter_s": t_filter, "dedup_docs": deduped, "dedup_s": t_dedup,
            "worker_peak": memory.largest, "driver_peak": memory.driver, "nodes": described.get("nodes", 1)}


def row(name: str, workers: int, tmp: Path, i: int, warm: bool) -> None:
    """One row, in this (fresh) process: prints its figures as JSON."""
    config = ProjectConfig.model_validate_json((tmp / "config.json").read_text())
    engine = ProcessPool(workers) if name == "pool" else RayEngine(workers=workers)  # cluster: RAY_ADDRESS
    if warm:  # a first, untimed pass starts the workers and loads their models
        run(config, Store(tmp / "raw"), tmp / f"warm-{i}", engine)
    print(json.dumps(run(config, Store(tmp / "raw"), tmp / f"out-{i}", engine)))
    engines.shutdown()


def main() -> None:
    if sys.argv[1:2] == ["--row"]:
        return row(sys.argv[2], int(sys.argv[3]), Path(sys.argv[4]), int(sys.argv[5]), sys.argv[6] == "warm")
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", choices=["demo", "synthetic"], default="demo")
    ap.add_argument("--limit", type=int, default=1000, help="demo: documents per source")
    ap.add_argument("--documents", type=int, default=100_000, help="synthetic: documents")
    ap.add_argument("--rows-per-part", type=int, default=2000)
    ap.add_argument("--engines", default="pool,ray")
    ap.add_argument("--workers", default="1,2")
    ap.add_argument("--cluster", action="store_true", help="also a two-node loopback Ray cluster (needs tests/)")
    ap.add_argument("--warm", action="store_true", help="time a second pass (workers started, models loaded)")
    ap.add_argument("--tmp", default=None, help="where the corpus and outputs go (default: a temp folder)")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / GIB:.0f} GiB, Python {platform.python_version()}")

    with tempfile.TemporaryDirectory(dir=args.tmp) as tmp:
        tmp = Path(tmp)
        if args.corpus == "synthetic":
            write_corpus(tmp / "corpus", args.documents, progress=True)
            config = synthetic_config(tmp / "corpus", args.rows_per_part)
        else:
            base = load_config("configs/default.yaml")
            config = base.model_copy(update={
                "sources": [s.model_copy(update={"max_documents": args.limit}) for s in base.sources],
                "reading": base.reading.model_copy(update={"rows_per_part": min(args.rows_per_part, 100)})})
        raw = Store(tmp / "raw")
        t0 = time.perf_counter()
        for source in config.sources:
            with raw.staging("raw", source.name) as writer:
                ingest(source, config.reading, writer, progress=True)
                writer.commit(code_version="bench", config={}, inputs={}, counts={})
        parts = sum(len(raw.files("raw", s.name, "documents")) for s in config.sources)
        print(f"corpus: {args.corpus}, {parts} parts of ≤{config.reading.rows_per_part} documents; "
              f"read in {time.perf_counter() - t0:.0f} s (not timed below)\n")

        (tmp / "config.json").write_text(config.model_dump_json())
        runs = [(e, int(w)) for e in args.engines.split(",") for w in args.workers.split(",")]
        print(f"{'engine':<10}{'workers':>8}{'docs':>10}{'filter docs/s':>15}{'per worker':>12}"
              f"{'dedup docs/s':>14}{'driver peak':>13}{'worker peak':>13}")
        cluster = None
        if args.cluster:
            runs.append(("cluster", 2))
        try:
            for i, (name, workers) in enumerate(runs):
                if name == "cluster":  # started only now: its idle daemons would slow the other rows
                    from tests.ray_cluster import start_cluster

                    cluster = start_cluster(nodes=2)
                # Each row in a process of its own: its own Ray driver and a peak memory of its own.
                env = {**os.environ, **(cluster.env if name == "cluster" else {})}
                out = subprocess.run([sys.executable, __file__, "--row", name, str(workers), str(tmp), str(i),
                                      "warm" if args.warm else "cold"],
                                     env=env, capture_output=True, text=True, check=False)
                if out.returncode != 0:
                    raise SystemExit(f"{name} x{workers} failed:\n{out.stderr[-3000:]}")
                r = json.loads(out.stdout.strip().splitlines()[-1])
                print(f"{name:<10}{workers:>8}{r['docs']:>10,}{r['docs'] / r['filter_s']:>15,.0f}"
                      f"{r['docs'] / r['filter_s'] / workers:>12,.0f}{r['dedup_docs'] / r['dedup_s']:>14,.0f}"
                      f"{r['driver_peak'] / GIB:>12.2f}G{r['worker_peak'] / GIB:>12.2f}G"
                      + (f"  ({r['nodes']} nodes)" if r["nodes"] > 1 else ""), flush=True)
        finally:
            if cluster is not None:
                cluster.stop()
    print("\ndriver peak: the row's process's peak RSS during the row's stages (the corpus was read before); worker peak: "
          "the largest worker process's RSS, sampled every 0.2 s. Ray's connection is made before the clock starts; "
          + ("the timed pass is the second: workers had started and loaded their models in the first." if args.warm
             else "its worker processes start inside the first stage's time (--warm times a second pass)."))


if __name__ == "__main__":
    main()
