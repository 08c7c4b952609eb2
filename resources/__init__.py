"""Dagster resources: thin, typed handles on Kiln's config and storage."""

from resources.config import KilnConfig
from resources.storage import KilnStorage

__all__ = ["KilnConfig", "KilnStorage"]
