"""Dagster resources: thin, typed handles on Kiln's config, storage and dedup index."""

from resources.config import KilnConfig
from resources.dedup_index import DedupIndexStore
from resources.storage import KilnStorage

__all__ = ["DedupIndexStore", "KilnConfig", "KilnStorage"]
