
from pathlib import Path

import dagster as dg

from kiln.config import kiln_home
from kiln.storage import Store


class KilnStorage(dg.ConfigurableResource):
    """Where datasets live: `<root>/<asset>/<partition>/` with Parquet parts and a `_manifest.json`."""

    root: str = str(kiln_home() / "data")

    def store(self) -> Store:
        return Store(Path(self.root))
