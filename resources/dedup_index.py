from pathlib import Path

import dagster as dg

from kiln.config import NearDedup, kiln_home
from kiln.dedup.index import DedupIndex, open_index


class DedupIndexStore(dg.ConfigurableResource):
    """The persistent near-dup index: local files under `root`, or Redis, as `dedup.near.index` says."""

    root: str = str(kiln_home() / "dedup_index")

    def open(self, near: NearDedup) -> DedupIndex:
        return open_index(near.index, near, Path(self.root))
