"""Kiln's code location: `dagster dev -w workspace.yaml` or `dagster asset materialize -m orchestration.definitions`."""

from __future__ import annotations

import dagster as dg

from assets import curation, dedup, governance, planning, quality, tokens, training
from orchestration.deployments import deployment_resources
from resources import DedupIndexStore, KilnConfig, KilnStorage, MlflowTracking, TrainingLauncher  # noqa: F401 (tests)

# The main job: the whole asset graph, run per source partition (cross-source steps read every partition).
kiln_job = dg.define_asset_job("kiln", selection=dg.AssetSelection.groups("curation", "dedup", "quality", "tokens",
                                                                               "training", "governance"),
                               description="Everything from raw sources to a trained, evaluated checkpoint and its "
                                           "data card.")
plan_job = dg.define_asset_job("plan", selection=dg.AssetSelection.groups("planning"),
                               description="The run plan from the config's `planning:` section.")

defs = dg.Definitions(
    assets=dg.load_assets_from_modules([curation, dedup, quality, tokens, training, planning, governance]),
    jobs=[kiln_job, plan_job],
    resources=deployment_resources(),  # KILN_DEPLOYMENT: local (default) or production
)
