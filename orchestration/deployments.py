"""Resource wiring per deployment, chosen by `KILN_DEPLOYMENT`: `local` (the default: everything under
KILN_HOME on this machine) or `production` (deploy/production/README.md: an MLflow server, training on
Ray Train workers across the Ray cluster, values read from the run's environment when a run starts)."""

from __future__ import annotations

import os

import dagster as dg
from dagster_aws.s3 import S3Resource

from resources import KilnConfig, KilnEngine, KilnStorage, MlflowTracking, TrainingLauncher

DEPLOYMENTS = ("local", "production")


def deployment_resources(deployment: str | None = None) -> dict[str, object]:
    """The resources of `orchestration.definitions` for a deployment (default: `$KILN_DEPLOYMENT`, else local).

    Production differs only where a resource has something to say about the deployment: the MLflow server
    (`MLFLOW_TRACKING_URI`), the training workers on the Ray cluster, and the S3 client's region
    (`AWS_REGION`). Backends are chosen in KILN_CONFIG, not here: `storage.backend: s3` puts every artifact in
    a bucket through the `S3Resource` wired below (endpoint and credentials from the standard AWS_*
    variables or the pod's role; the near-dup index is part of the dedup_index datasets, so it goes there too), and
    `engine.ray_address` (or the standard `RAY_ADDRESS`) runs the per-document stages on a Ray cluster.
    """
    deployment = deployment or os.environ.get("KILN_DEPLOYMENT") or "local"
    if deployment not in DEPLOYMENTS:
        raise ValueError(f"KILN_DEPLOYMENT={deployment!r}: expected one of {', '.join(DEPLOYMENTS)}")
    config = KilnConfig()
    s3 = S3Resource(region_name=os.environ.get("AWS_REGION")) if deployment == "production" else S3Resource()
    common = {"kiln_config": config, "storage": KilnStorage(kiln_config=config, s3=s3),
              "engine": KilnEngine(),
              "pipes_subprocess_client": dg.PipesSubprocessClient()}
    if deployment == "local":
        return {**common, "training_launcher": TrainingLauncher(), "mlflow_tracking": MlflowTracking()}
    return {**common,
            "training_launcher": TrainingLauncher(launcher="ray", num_workers=dg.EnvVar.int("KILN_TRAINING_WORKERS")),
            "mlflow_tracking": MlflowTracking(tracking_uri=dg.EnvVar("MLFLOW_TRACKING_URI"))}

