"""`make demo`: materialize the whole asset graph for every source on the embedded corpora.

Runs go through the Dagster instance in `DAGSTER_HOME`, so they show up in `make ui` afterwards.
Stages that read every source (exact dedup) start once all sources have passed the stages before.
"""

from __future__ import annotations

import json
import sys
import time

import dagster as dg

from kiln.config import ConfigError, kiln_home
from kiln.lineage import DOCUMENT_STAGES
from kiln.stats import StageStats, chain, funnel_rows
from kiln.storage import Store

# Step events at INFO, not Dagster's DEBUG flood; the full event log is in the UI.
RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}}}

# Waves of assets: every asset in a wave needs only earlier waves (all partitions of them). A wave of
# unpartitioned assets (the dedup index spans every source) runs once.
WAVES = [["raw_documents", "filtered_documents"], ["curated_documents", "minhash_signatures"], ["dedup_index"],
         ["deduplicated_documents"], ["quality_classifier"], ["quality_scores", "quality_filtered_documents"],
         ["tokenizer", "token_shards"], ["training_run", "checkpoint", "evaluation"], ["data_card"]]
UNPARTITIONED = {"dedup_index", "quality_classifier", "tokenizer", "token_shards", "training_run", "checkpoint",
                 "evaluation", "data_card"}


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
        for partition in [None] if set(wave) <= UNPARTITIONED else partitions:
            print(f"[kiln demo] {', '.join(wave)}{f' [{partition}]' if partition else ''} ...", flush=True)
            partition_tag = {"dagster/partition": partition} if partition else {}
            result = dg.execute_job(dg.reconstructable(kiln_job), instance=instance, run_config=RUN_CONFIG,
                                    asset_selection=[dg.AssetKey(a) for a in wave],
                                    tags={**partition_tag, "kiln/demo": "true"})
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
    print(f"\n{'source':<18}{'raw':>7}{'quarant.':>9}{'filtered':>9}{'exact':>7}{'near':>6}{'bench':>6}"
          f"{'quality':>8}{'final':>7}{'kept':>6}   biggest removal")
    for p in partitions:
        raw, filt, cur, dedup, quality = (StageStats.from_dict(store.manifest(a, p).stats) for a in DOCUMENT_STAGES)
        rows = funnel_rows(chain([raw, filt, cur, dedup, quality]))
        top = max(rows, key=lambda r: r["docs"]) if rows else None
        top_text = f"{top['reason']} ({top['share_of_docs']:.0%})" if top else "-"
        near = sum(dedup.steps["near_dedup"].dropped.values()) if "near_dedup" in dedup.steps else 0
        bench = sum(dedup.steps["decontamination"].dropped.values()) if "decontamination" in dedup.steps else 0
        print(f"{p:<18}{raw.docs_in:>7,}{raw.docs_in - raw.docs_out:>9,}{filt.docs_in - filt.docs_out:>9,}"
              f"{cur.docs_in - cur.docs_out:>7,}{near:>6,}{bench:>6,}{quality.docs_in - quality.docs_out:>8,}"
              f"{quality.docs_out:>7,}{quality.docs_out / max(raw.docs_in, 1):>6.0%}   {top_text}")
    card = store.manifest("quality_classifier").stats["card"]
    if card:
        cv = card["cross_validation"]
        print(f"\nquality classifier (fastText, {cv['folds']}-fold cross-validated): ROC AUC {cv['auc']}, precision "
              f"{cv['precision']}, recall {cv['recall']} on {cv['positives']} + {cv['negatives']} documents")
    index = store.manifest("dedup_index")
    print(f"near-dup index: {index.stats['index']['documents']:,} accepted documents; LSH "
          f"{index.stats['lsh']['bands']} bands x {index.stats['lsh']['rows']} rows, "
          f"{index.stats['verification']['candidate_pairs']:,} candidate pairs verified")
    shards = store.manifest("token_shards")
    card = store.manifest("tokenizer").stats["card"]
    print(f"tokenizer: {card['vocab_size']:,} pieces, sha256 {card['sha256'][:12]}…; token shards: "
          f"{shards.counts['train_tokens']:,} train + {shards.counts['val_tokens']:,} validation tokens in "
          f"{shards.counts['shards']} shards")
    run = store.manifest("training_run").stats
    summary, evaluation = run["summary"], store.manifest("evaluation").stats
    metrics = (store.dataset_dir("training_run") / "metrics.jsonl").read_text().splitlines()
    losses = [m["train/loss"] for m in map(json.loads, metrics) if m.get("train/loss") is not None]
    window = max(1, min(20, len(losses) // 4))  # per-step losses are noisy: mean of the first and last steps
    tokens_per_s = f"{summary['tokens_per_s']:,.0f}" if summary["tokens_per_s"] else "?"
    print(f"training: {summary['n_params']:,} parameters, {summary['steps']} steps on {summary['world_size']} "
          f"processes, {tokens_per_s} tokens/s; train loss {sum(losses[:window]) / window:.2f} → "
          f"{sum(losses[-window:]) / window:.2f} (mean of first / last {window} steps); validation loss "
          f"{evaluation['validation']['loss']:.3f} (perplexity {evaluation['validation']['perplexity']:,.0f})")
    print(f"MLflow run {run['mlflow']['run_id']}: `make mlflow` and open http://127.0.0.1:5000")
    print(f"outputs: {store.root}/<asset>/<source>/ (Parquet parts, rejected-*.parquet, _manifest.json)")
    print(f"run plan: {store.dataset_dir('training_plan') / 'plan.txt'} (or `kiln plan --help`)")
    print(f"data card: {store.dataset_dir('data_card') / 'data_card.md'} (and `kiln audit --help`)")


if __name__ == "__main__":
    sys.exit(main())
