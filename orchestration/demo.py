"""`make demo`: materialize the whole asset graph on the embedded corpora, refresh by refresh.

The first run registers the first refresh (the configured sources); files dropped under
`KILN_HOME/landing/<source>/` become the next refresh on the next run (or at the landing sensor's next
tick under `make ui`). Runs go through the Dagster instance in `DAGSTER_HOME`, so they show up in `make ui`.
Stages that read every source (exact dedup, the dedup index) start once all sources have passed the stages
before.
The per-document stages run on one embedded local Ray that the demo starts and stops (or on the cluster that
`engine.ray_address` / RAY_ADDRESS names).
"""

from __future__ import annotations

import json
import os
import sys
import time
from collections.abc import Callable
from pathlib import Path

import dagster as dg

from kiln.common.config import ConfigError, ProjectConfig, load_config
from kiln.common.stats import StageStats, chain, funnel_rows
from kiln.common.remote import StorageError
from kiln.common.storage import Store
from kiln.engine import EngineError, shared_local_ray
from kiln.governance.catalog import Catalog
from kiln.governance.data_card import merged_stage_stats
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.governance.refresh import latest, load_refreshes, next_refresh, partition

# Step events at INFO, not Dagster's DEBUG flood; the full event log is in the UI. Steps run in the demo's own
# process, one after another: the data engine parallelizes inside each step, and a process per step would pay
# Python, Dagster and a Ray driver's start-up again every time (most of the demo's time on the small corpora).
RUN_CONFIG = {"loggers": {"console": {"config": {"log_level": "INFO"}}},
              "execution": {"config": {"in_process": {}}}}

# One refresh, wave by wave: every asset in a wave needs only earlier waves. Each wave runs per (source, refresh)
# ("documents"), once per refresh ("refresh"), or once when not materialized yet ("once": the quality classifier
# and the tokenizer are fitted on the first refresh and kept, so later refreshes stay comparable).
DOCUMENTS, REFRESH, ONCE = "documents", "refresh", "once"
REFRESH_WAVES = [(["raw_documents", "filtered_documents"], DOCUMENTS),
                 (["curated_documents", "minhash_signatures"], DOCUMENTS), (["dedup_index"], REFRESH),
                 (["deduplicated_documents"], DOCUMENTS), (["quality_classifier"], ONCE),
                 (["quality_scores", "quality_filtered_documents"], DOCUMENTS), (["tokenizer"], ONCE),
                 (["token_shards", "shard_exports"], REFRESH)]
# Then once, on the newest refresh's token shards.
TRAINING_WAVES = [["training_run", "checkpoint", "evaluation"], ["data_card"]]
JOB_OF = {DOCUMENTS: "documents", REFRESH: "refresh_datasets", ONCE: "kiln"}

# A wave's runner: materialize these assets for one partition (None: unpartitioned), True on success.
Materialize = Callable[[list[str], "dg.MultiPartitionKey | str | None"], bool]


def materialize_refresh(materialize: Materialize, store: Store, refresh: str, sources: list[str],
                        refit: set[str] | None = None) -> bool:
    """Every data asset of one refresh, in waves (shared by the demo and the tests). A fitted-once asset named in
    `refit` is fitted again (and taken out of the set)."""
    from assets.partitions import partition_key

    refit = refit if refit is not None else set()
    for assets, kind in REFRESH_WAVES:
        if kind == ONCE:
            if store.published_manifest(assets[0]) is None or assets[0] in refit:
                if not materialize(assets, None):
                    return False
                refit.discard(assets[0])
            continue
        keys = [partition_key(s, refresh) for s in sources] if kind == DOCUMENTS else [refresh]
        if not all(materialize(assets, key) for key in keys):
            return False
    return True


def changed_fits(store: Store, config: ProjectConfig) -> dict[str, list[str]]:
    """The fitted-once assets (the quality classifier, the tokenizer) whose settings in `config` differ from those
    they were fitted with, each with what changed ("tokenizer.vocab_size: 8000 -> 4000")."""
    from assets.quality import classifier_recipe
    from assets.tokens import tokenizer_recipe

    changed = {}
    for asset, recipe in (("quality_classifier", classifier_recipe), ("tokenizer", tokenizer_recipe)):
        manifest = store.published_manifest(asset)
        if manifest is not None and (diff := _differences(manifest.config, recipe(config))):
            changed[asset] = diff
    return changed


def _differences(old, new, prefix: str = "") -> list[str]:
    if isinstance(old, dict) and isinstance(new, dict):
        return [d for key in sorted(set(old) | set(new), key=str)
                for d in _differences(old.get(key), new.get(key), f"{prefix}{key}.")]
    return [] if old == new else [f"{prefix.rstrip('.')}: {old!r} -> {new!r}"]


def job_named(name: str) -> dg.JobDefinition:
    from orchestration.definitions import defs

    return defs.resolve_job_def(name)


def _runner(instance: dg.DagsterInstance) -> Materialize:
    from assets.partitions import document_partitions

    def run(assets: list[str], key) -> bool:
        where = f" [{key}]" if key is not None else ""
        print(f"[kiln demo] {', '.join(assets)}{where} ...", flush=True)
        if key is None:
            job, tags = "kiln", {}
        elif isinstance(key, dg.MultiPartitionKey):
            job, tags = "documents", document_partitions.get_tags_for_partition_key(key)
        else:
            job, tags = "refresh_datasets", {"dagster/partition": key}
        result = dg.execute_job(
            dg.build_reconstructable_job("orchestration.demo", "job_named", reconstructable_args=(job,)),
            instance=instance, run_config=RUN_CONFIG, asset_selection=[dg.AssetKey(a) for a in assets],
            tags={**tags, "kiln/demo": "true"})
        if not result.success:
            print(f"[kiln demo] run {result.run_id} failed; see `make ui` for its logs", file=sys.stderr)
        return result.success

    return run


DEMO_CONFIG = Path(__file__).resolve().parents[1] / "configs" / "demo.yaml"


def main() -> int:
    # Unset KILN_CONFIG: the demo's config (default.yaml plus the demo's toy benchmark); set here, not passed down,
    # so the code location the runs load reads the same file.
    os.environ.setdefault("KILN_CONFIG", str(DEMO_CONFIG))
    try:
        config = load_config()
        job_named("kiln")  # loading the code location validates the config once more, with Dagster's view
    except ConfigError as exc:
        print(f"[kiln demo] {exc}", file=sys.stderr)
        return 2
    try:
        # One Ray for every step of every run (not one per step), stopped when the demo ends.
        with shared_local_ray(config.engine):
            return run_demo(config)
    except (EngineError, StorageError) as exc:  # no Ray to run on; a bucket that cannot be used as configured
        print(f"[kiln demo] {exc}", file=sys.stderr)
        return 2


def run_demo(config: ProjectConfig) -> int:
    from assets.partitions import refresh_partitions

    instance = dg.DagsterInstance.get()
    from resources import KilnStorage

    store = KilnStorage().store()  # the assets' store: local, or S3 with the local cache (storage.backend)
    started = time.monotonic()
    # Partitions added by hand in the UI and not read yet take what has landed, in the order they were added.
    added = instance.get_dynamic_partitions(refresh_partitions.name)
    new, _ = next_refresh(store, config, "cli", waiting=added)
    refreshes = load_refreshes(store)
    known = set(added)
    instance.add_dynamic_partitions(refresh_partitions.name, [r.key for r in refreshes if r.key not in known])
    # The new refresh, and any registered one whose token shards were never built; else the newest again. A refitted
    # classifier re-scores every refresh; a rebuilt tokenizer needs only the newest shards (they hold every refresh).
    refit = changed_fits(store, config)
    for asset, diff in refit.items():
        print(f"[kiln demo] {asset}: settings changed ({'; '.join(diff)}); fitting it again, and what depends on it")
    # (manifests only: with S3 storage, the driver need not download every refresh's shards to see they are there)
    todo = [r.key for r in refreshes if store.published_manifest("token_shards", r.key) is None] or \
        [refreshes[-1].key]
    if "quality_classifier" in refit:
        todo = [r.key for r in refreshes]
    print(f"[kiln demo] refreshes: {', '.join(r.key for r in refreshes)}"
          + (f" (new: {new.key}, trigger {new.trigger})" if new else "") + f"; materializing {', '.join(todo)}")
    run = _runner(instance)
    sources = [s.name for s in config.sources]
    refit = set(refit)
    for key in todo:
        if not materialize_refresh(run, store, key, sources, refit):
            return 1
    for wave in TRAINING_WAVES:
        if not run(wave, None):
            return 1
    print("[kiln demo] training_plan ...", flush=True)
    if not dg.execute_job(dg.build_reconstructable_job("orchestration.demo", "job_named", reconstructable_args=("plan",)),
                          instance=instance, run_config=RUN_CONFIG, tags={"kiln/demo": "true"}).success:
        print("[kiln demo] the planning run failed; see `make ui` for its logs", file=sys.stderr)
        return 1
    summarize(store, sources)
    print(f"[kiln demo] done in {time.monotonic() - started:.0f} s; browse the runs with `make ui`")
    return 0


def summarize(store: Store, sources: list[str]) -> None:
    # Documents read, then removed at each stage (quarantined: unreadable records), then kept: one meaning per word.
    print(f"\n{'':<25}{'documents removed by':-^45}")
    print(f"{'source':<18}{'read':>7}{'quarant.':>9}{'filters':>9}{'exact':>7}{'near':>6}{'bench':>6}"
          f"{'quality':>8}{'kept':>7}{'share':>6}   biggest removal   (all refreshes)")
    catalog, refreshes = Catalog(store), load_refreshes(store)
    for p in sources:
        merged = merged_stage_stats(catalog, [partition(p, r.key) for r in refreshes])
        raw, filt, cur, dedup, quality = (merged.get(stage, StageStats()) for stage in DOCUMENT_STAGES)
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
    _, index = latest(store, "dedup_index")
    lsh = index.stats.get("lsh")  # none with dedup.near.enabled false
    print(f"near-dup index: {index.stats['index']['documents']:,} accepted documents" + (
        f"; LSH {lsh['bands']} bands x {lsh['rows']} rows, {index.stats['verification']['candidate_pairs']:,} "
        "candidate pairs verified" if lsh else ""))
    refresh, shards = latest(store, "token_shards")
    card = store.manifest("tokenizer").stats["card"]
    print(f"tokenizer: {card['vocab_size']:,} pieces, sha256 {card['sha256'][:12]}…; token shards: "
          f"{shards.counts['train_tokens']:,} train + {shards.counts['val_tokens']:,} validation tokens in "
          f"{shards.counts['shards']} shards (refresh {refresh}: refreshes {', '.join(shards.config['refreshes'])})")
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
    print(f"outputs: {store.root}/<asset>/<source>/<refresh>/ (Parquet parts, rejected-*.parquet, _manifest.json)")
    print(f"run plan: {store.dataset_dir('training_plan') / 'plan.txt'} (or `kiln plan --help`)")
    print(f"data card: {store.dataset_dir('data_card') / 'data_card.md'} (and `kiln audit --help`)")


if __name__ == "__main__":
    sys.exit(main())
