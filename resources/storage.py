import functools
import os
from typing import Any

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
            return Store.configured(self.root, settings)
        client = s3_client(self.s3 or S3Resource())
        return Store.configured(self.root, settings, S3Remote.connect(client, settings.bucket, settings.prefix,
                                                                      settings.create_bucket))


def s3_client(s3: S3Resource) -> Any:
    """One boto3 client per process for the same settings and AWS_* environment, shared by the steps (clients are
    thread-safe): building one loads botocore's service models, 0.1-0.3 s of CPU, and every step opens the store."""
    aws_environ = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("AWS_")))
    return _client(s3.model_dump_json(), aws_environ)


@functools.lru_cache(maxsize=8)
def _client(settings: str, aws_environ: tuple) -> Any:  # aws_environ: a key only (boto3 reads os.environ)
    return S3Resource.model_validate_json(settings).get_client()
