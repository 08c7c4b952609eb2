"""Dagster resources: thin, typed handles on Kiln's config, storage, data engine, training launcher and MLflow."""

from resources.config import KilnConfig
from resources.engine import KilnEngine
from resources.storage import KilnStorage
from resources.training import MlflowTracking, TrainingLauncher

__all__ = ["KilnConfig", "KilnEngine", "KilnStorage", "MlflowTracking", "TrainingLauncher"]
