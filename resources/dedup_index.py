from pathlib import Path

import dagster as dg

from kiln.config import NearDedup, kiln_home
from kiln.dedup.index import DedupIndex, open_index
from kiln.remote import S3Remote


class DedupIndexStore(dg.ConfigurableResource):
    """The persistent near-dup index: local files under `root`, or Redis, as `dedup.near.index` says. With S3
    storage (`remote`, from `KilnStorage.store().remote`) the local files are a cache of the index on S3."""

    root: str = str(kiln_home() / "dedup_index")
    # The Redis URL when it carries a password: from the environment (`dg.EnvVar("KILN_REDIS_URL")`), so it is
    # never in the config file or the run's recorded config; overrides `dedup.near.index.redis_url`.
    redis_url: str | None = None

    def open(self, near: NearDedup, remote: S3Remote | None = None) -> DedupIndex:
        settings = near.index.model_copy(update={"redis_url": self.redis_url}) if self.redis_url else near.index
        return open_index(settings, near, Path(self.root), remote=remote)
