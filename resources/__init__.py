"""Dagster resources: thin, typed handles on Kiln's config, storage, data engine, dedup index, training launcher and MLflow."""

from resources.config import KilnConfig
from resources.dedup_index import DedupIndexStore
from resources.engine import KilnEngine
from resources.storage import KilnStorage
from resources.training import MlflowTracking, TrainingLauncher

__all__ = ["DedupIndexStore", "KilnConfig", "KilnEngine", "KilnStorage", "MlflowTracking", "TrainingLauncher"]
