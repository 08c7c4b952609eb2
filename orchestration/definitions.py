"""Kiln's code location: `dagster dev -w workspace.yaml` or `dagster asset materialize -m orchestration.definitions`."""

from __future__ import annotations

import dagster as dg

from assets import curation, dedup, governance, planning, quality, tokens, training
from assets.partitions import document_partitions, refresh_partitions
from orchestration.deployments import deployment_resources
from orchestration.refresh import automation_sensor, landing_sensor, refresh_schedule, removal_requests_sensor
from resources import KilnConfig, KilnEngine, KilnStorage, MlflowTracking, TrainingLauncher  # noqa: F401 (tests)

ASSETS = dg.load_assets_from_modules([curation, dedup, quality, tokens, training, planning, governance])
EXTERNAL = [governance.removal_requests]  # written outside Dagster (`kiln forget`)


def _assets_partitioned_by(partitions_def) -> dg.AssetSelection:
    return dg.AssetSelection.assets(*[a for a in ASSETS if a.partitions_def == partitions_def])


# An asset job runs assets of one partitioning, so the graph is three jobs: per (source, refresh), per refresh, and
# the unpartitioned fits and training. `make demo` (orchestration.demo) runs them in dependency order.
documents_job = dg.define_asset_job(
    "documents", selection=_assets_partitioned_by(document_partitions),
    description="One source in one refresh: read, filter, exact dedup, signatures, near-dedup and decontamination "
                "(with the refresh's dedup index), quality scores and filter.")
refresh_job = dg.define_asset_job(
    "refresh_datasets", selection=_assets_partitioned_by(refresh_partitions),
    description="One refresh over every source: the near-duplicate index decisions, the token shards and their "
                "exports for other trainers (shards.export).")
kiln_job = dg.define_asset_job(
    "kiln", selection=dg.AssetSelection.groups("curation", "dedup", "quality", "tokens", "training", "governance")
    - _assets_partitioned_by(document_partitions) - _assets_partitioned_by(refresh_partitions),
    description="The fits and the training: quality classifier, tokenizer, training run, checkpoint, evaluation and "
                "data card.")
plan_job = dg.define_asset_job("plan", selection=dg.AssetSelection.groups("planning"),
                               description="The run plan from the config's `planning:` section.")

defs = dg.Definitions(
    assets=[*ASSETS, *EXTERNAL],
    jobs=[documents_job, refresh_job, kiln_job, plan_job],
    schedules=[refresh_schedule],
    sensors=[landing_sensor, automation_sensor, removal_requests_sensor],
    resources=deployment_resources(),  # KILN_DEPLOYMENT: local (default) or production
)
