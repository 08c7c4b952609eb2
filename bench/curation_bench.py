"""Curation throughput on the embedded corpus: each step alone, then the whole chain on 1 and all cores.

    .venv/bin/python bench/curation_bench.py [--config configs/default.yaml] [--limit 1000] [--without garbage]

Prints docs/s and MB/s per core for every step (single process, its batch form where it has one; on the
documents that reach it in its profile order would be unfair to late steps, so every step sees every document
of the sources whose profile uses it), and for the whole filter stage on 1 and all cores (the process pool),
cold and warm. Figures are for the machine it runs on; quote them with the machine named. `--without STEP` leaves
a step out of every profile: the chain's cost of that step is the difference of the two runs' docs/CPU-s.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import tempfile
import time
from copy import deepcopy as copy
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.common.config import load_config  # noqa: E402
from kiln.common.stats import StageStats  # noqa: E402
from kiln.common.storage import Store  # noqa: E402
from kiln.curation.documents import Document  # noqa: E402
from kiln.curation.filters.registry import build_step  # noqa: E402
from kiln.curation.pipeline import filter_documents, ingest, profile_steps, run_steps  # noqa: E402
from kiln.curation.readers import read_source  # noqa: E402
from kiln.engine import ProcessPool  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.environ.get("KILN_CONFIG", "configs/default.yaml"))
    ap.add_argument("--limit", type=int, default=1000, help="documents per source")
    ap.add_argument("--without", action="append", default=[], help="leave this step out of every profile")
    args = ap.parse_args()
    config = load_config(args.config)
    config = config.model_copy(update={"profiles": {name: [s for s in steps if s.step not in args.without]
                                                    for name, steps in config.profiles.items()}})
    # Parts are the unit of parallel work: make enough of them that every core has some.
    config = config.model_copy(update={"reading": config.reading.model_copy(update={"rows_per_part": 100})})
    cores = os.cpu_count() or 1
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores, Python {platform.python_version()}")

    docs_by_source = {s.name: [d for d in read_source(s.model_copy(update={"max_documents": args.limit}), config.reading)
                               if isinstance(d, Document)] for s in config.sources}
    total_docs = sum(map(len, docs_by_source.values()))
    total_mb = sum(len(d.text.encode()) for ds in docs_by_source.values() for d in ds) / 1e6
    print(f"corpus: {total_docs:,} documents, {total_mb:.1f} MB from {', '.join(docs_by_source)}\n")

    print(f"{'step':<20}{'docs':>8}{'MB':>8}{'docs/s/core':>14}{'MB/s/core':>12}")
    seen = {}
    for source in config.sources:
        for spec in profile_steps(config, source.name):
            seen.setdefault((spec.step, repr(spec.params)), (spec, []))[1].extend(docs_by_source[source.name])
    for (name, _), (spec, docs) in seen.items():
        step = build_step(spec.step, spec.params)
        run_steps([copy(d) for d in docs[:10]], [step], StageStats(), 0)  # warm: models and tables load once
        fresh = [copy(d) for d in docs]
        mb = sum(len(d.text.encode()) for d in fresh) / 1e6
        t0 = time.perf_counter()
        run_steps(fresh, [step], StageStats(), 0)  # a step's batch form where it has one, as the stage runs it
        dt = time.perf_counter() - t0
        label = name if spec.params == {} else f"{name}*"
        print(f"{label:<20}{len(fresh):>8,}{mb:>8.1f}{len(fresh) / dt:>14,.0f}{mb / dt:>12.2f}")
    print("(* = with a profile's parameter overrides)\n")

    with tempfile.TemporaryDirectory() as tmp:
        store = Store(Path(tmp))
        for source in config.sources:
            capped = source.model_copy(update={"max_documents": args.limit})
            with store.staging("raw", source.name) as w:
                ingest(capped, config.reading, w, progress=False)
                w.commit(code_version="bench", config={}, inputs={}, counts={})
        print("whole chain (the filter stage: read parts, every step, write kept and rejected parts); cold = the first\n"
              "run in fresh worker processes (imports, language model, tables), warm = the second")
        print(f"{'run':<8}{'workers':>8}{'docs/s':>10}{'MB/s':>8}{'docs/s/core':>14}{'MB/s/core':>12}"
              f"{'docs/CPU-s':>12}")
        for workers in sorted({1, cores}):
            engine = ProcessPool(workers)
            for run in ("cold", "warm"):
                t0, cpu0, n, mb = time.perf_counter(), time.process_time(), 0, 0.0
                for source in config.sources:
                    parts = store.files("raw", source.name, "documents")
                    mb += sum(len(d.text.encode()) for d in docs_by_source[source.name]) / 1e6
                    n += len(docs_by_source[source.name])
                    with store.staging(f"filtered-{workers}-{run}", source.name) as w:
                        filter_documents(parts, profile_steps(config, source.name), config.curation.exact_dedup, w,
                                         engine, progress=False)
                        w.commit(code_version="bench", config={}, inputs={}, counts={})
                dt, cpu = time.perf_counter() - t0, time.process_time() - cpu0
                # One worker runs in this process: its CPU time is the chain's, whatever else loads the machine.
                per_cpu = f"{n / cpu:>12,.0f}" if workers == 1 else f"{'':>12}"
                print(f"{run:<8}{workers:>8}{n / dt:>10,.0f}{mb / dt:>8.2f}{n / dt / workers:>14,.0f}"
                      f"{mb / dt / workers:>12.2f}{per_cpu}")
    print("\nin-process (1 worker) the step section above already loaded the models: its cold row is warm too;\n"
          "docs/CPU-s (1 worker) counts this process's CPU time, the figure to compare on a loaded machine")


if __name__ == "__main__":
    main()
