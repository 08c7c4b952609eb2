"""Kiln's code location: `dagster dev -w workspace.yaml` or `dagster asset materialize -m orchestration.definitions`."""

from __future__ import annotations

import dagster as dg

from assets import curation, dedup, planning, tokens, training
from resources import DedupIndexStore, KilnConfig, KilnStorage, MlflowTracking, TrainingLauncher

# The main job: the whole asset graph, run per source partition (cross-source steps read every partition).
kiln_job = dg.define_asset_job("kiln", selection=dg.AssetSelection.groups("curation", "dedup", "tokens", "training"),
                               description="Everything from raw sources to a trained, evaluated checkpoint.")
plan_job = dg.define_asset_job("plan", selection=dg.AssetSelection.groups("planning"),
                               description="The run plan from the config's `planning:` section.")

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([curation, dedup, tokens, training, planning]),
    jobs=[kiln_job, plan_job],
    resources={"kiln_config": KilnConfig(), "storage": KilnStorage(), "dedup_index_store": DedupIndexStore(),
               "training_launcher": TrainingLauncher(), "mlflow_tracking": MlflowTracking(),
               "pipes_subprocess_client": dg.PipesSubprocessClient()},
)
