from pathlib import Path

import dagster as dg

from kiln.config import NearDedup, kiln_home
from kiln.dedup.index import DedupIndex, open_index
from kiln.remote import S3Remote


class DedupIndexStore(dg.ConfigurableResource):
    """The persistent near-dup index: local files under `root`, or Redis, as `dedup.near.index` says. With S3
    storage (`remote`, from `KilnStorage.store().remote`) the local files are a cache of the index on S3."""

    root: str = str(kiln_home() / "dedup_index")

    def open(self, near: NearDedup, remote: S3Remote | None = None) -> DedupIndex:
        return open_index(near.index, near, Path(self.root), remote=remote)
