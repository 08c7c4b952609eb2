"""`make demo`: materialize the whole asset graph for every source on the embedded corpora.

Runs go through the Dagster instance in `DAGSTER_HOME`, so they show up in `make ui` afterwards.
Stages that read every source (exact dedup) start once all sources have passed the stages before.
"""

from __future__ import annotations

import sys
import time

import dagster as dg

from kiln.config import ConfigError, kiln_home
from kiln.stats import StageStats, chain, funnel_rows
from kiln.storage import Store

# Step events at INFO, not Dagster's DEBUG flood; the full event log is in the UI.
RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}

# Waves of assets: every asset in a wave needs only earlier waves (all partitions of them).
WAVES = [["raw_documents", "filtered_documents"], ["curated_documents"]]


def kiln_job() -> dg.JobDefinition:
    from orchestration.definitions import defs

    return defs.resolve_job_def("kiln")


def plan_job() -> dg.JobDefinition:
    from orchestration.definitions import defs

    return defs.resolve_job_def("plan")


def main() -> int:
    try:
        partitions = kiln_job().partitions_def.get_partition_keys()  # loading the code location loads the config
    except ConfigError as exc:
        print(f"[kiln demo] {exc}", file=sys.stderr)
        return 2
    instance = dg.DagsterInstance.get()
    started = time.monotonic()
    for wave in WAVES:
        for partition in partitions:
            print(f"[kiln demo] {', '.join(wave)} [{partition}] ...", flush=True)
            result = dg.execute_job(dg.reconstructable(kiln_job), instance=instance, run_config=RUN_CONFIG,
                                    asset_selection=[dg.AssetKey(a) for a in wave],
                                    tags={"dagster/partition": partition, "kiln/demo": "true"})
            if not result.success:
                print(f"[kiln demo] run {result.run_id} failed; see `make ui` for its logs", file=sys.stderr)
                return 1
    print("[kiln demo] training_plan ...", flush=True)
    if not dg.execute_job(dg.reconstructable(plan_job), instance=instance, run_config=RUN_CONFIG,
                          tags={"kiln/demo": "true"}).success:
        print("[kiln demo] the planning run failed; see `make ui` for its logs", file=sys.stderr)
        return 1
    summarize(Store(kiln_home() / "data"), partitions)
    print(f"[kiln demo] done in {time.monotonic() - started:.0f} s; browse the runs with `make ui`")
    return 0


def summarize(store: Store, partitions: list[str]) -> None:
    print(f"\n{'source':<18}{'raw records':>12}{'quarantined':>12}{'filtered':>10}{'exact dup':>10}{'curated':>9}"
          f"{'kept':>7}   biggest removal")
    for p in partitions:
        raw, filt, cur = (StageStats.from_dict(store.manifest(a, p).stats)
                          for a in ("raw_documents", "filtered_documents", "curated_documents"))
        funnel = chain([raw, filt, cur])
        rows = funnel_rows(funnel)
        top = max(rows, key=lambda r: r["docs"]) if rows else None
        top_text = f"{top['reason']} ({top['share_of_docs']:.0%})" if top else "-"
        print(f"{p:<18}{raw.docs_in:>12,}{raw.docs_in - raw.docs_out:>12,}{filt.docs_in - filt.docs_out:>10,}"
              f"{cur.docs_in - cur.docs_out:>10,}{cur.docs_out:>9,}{cur.docs_out / max(raw.docs_in, 1):>7.0%}   {top_text}")
    print(f"\noutputs: {store.root}/<asset>/<source>/ (Parquet parts, rejected-*.parquet, _manifest.json)")
    print(f"run plan: {store.dataset_dir('training_plan') / 'plan.txt'} (or `kiln plan --help`)")


if __name__ == "__main__":
    sys.exit(main())
