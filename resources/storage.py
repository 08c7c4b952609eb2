from pathlib import Path

import dagster as dg
from dagster_aws.s3 import S3Resource

from kiln.common.config import kiln_home, load_config
from kiln.common.remote import S3Remote
from kiln.common.storage import Store
from resources.config import KilnConfig


class KilnStorage(dg.ConfigurableResource):
    """Where datasets live: `<root>/<asset>/<partition>/` with Parquet parts and a `_manifest.json`; with
    `storage.backend: s3` in the project config, durably in an S3 bucket and `root` is the local cache."""

    root: str = str(kiln_home() / "data")
    kiln_config: KilnConfig | None = None  # whose `storage:` section picks the backend; None: KILN_CONFIG
    s3: S3Resource | None = None  # endpoint, region, credentials for `backend: s3`; None: S3Resource() (AWS_* env)

    def store(self) -> Store:
        """The store for one step; with S3, the bucket is checked (or created) here, before any work."""
        settings = (self.kiln_config.load() if self.kiln_config is not None else load_config()).storage
        if settings.backend == "local":
            return Store(Path(self.root))
        client = (self.s3 or S3Resource()).get_client()
        return Store(Path(self.root), S3Remote.connect(client, settings.bucket, settings.prefix,
                                                       settings.create_bucket))
