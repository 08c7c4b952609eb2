"""Config section `storage`: local files, or an S3 bucket with KILN_HOME as the cache."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator, model_validator

from kiln.common.config.base import Strict


class StorageSettings(Strict):
    """Where artifacts live: `local` (files under KILN_HOME/data), or `s3`: every dataset, tokenizer, shard set,
    and checkpoint export (the near-dup index included: it is part of the dedup_index datasets) durably in a bucket, with KILN_HOME as a cache kept in sync.
    Endpoint, region and credentials come from the S3 resource (dagster-aws `S3Resource`: its fields, or the
    standard AWS_* environment variables)."""

    backend: Literal["local", "s3"] = "local"
    bucket: str | None = None
    prefix: str = Field("kiln", pattern=r"^[A-Za-z0-9._/-]*$")  # key prefix inside the bucket ("" for the root)
    create_bucket: bool = False  # create a missing bucket instead of failing with an error naming it
    # How long a replaced version of a dataset stays on local disk for the readers that began before the replace.
    keep_replaced_minutes: float = Field(60, ge=0)
    # With s3: each training run's newest checkpoints and metrics in the bucket too (under `_runs/`), so a run
    # stopped on one machine resumes on another (kiln/common/run_mirror.py). false: they stay on the machine.
    mirror_runs: bool = True
    # With s3: the most the local cache (KILN_HOME/data) may hold, in GB (10^9 bytes). Past it, the datasets used least
    # recently (S3 holds each; none read by a step still running nor for keep_replaced_minutes; none held by a reader)
    # are removed from the cache, and fetched again when read. None: never evicted.
    cache_max_gb: float | None = Field(None, gt=0)
    # After each training_run and checkpoint the store takes: delete the checkpoints of the runs it has moved past
    # (here and, with mirror_runs, on S3), but for this many of the newest (kiln/common/run_folders.py says which
    # runs stay and what of a pruned run stays). None: kept until `kiln runs prune`.
    keep_old_run_checkpoints: int | None = Field(None, ge=0)

    @property
    def keep_replaced_s(self) -> float:
        """`keep_replaced_minutes` as the Store takes it."""
        return self.keep_replaced_minutes * 60

    @property
    def cache_max_bytes(self) -> int | None:
        """`cache_max_gb` as the Store takes it."""
        return None if self.cache_max_gb is None else int(self.cache_max_gb * 1e9)

    @field_validator("bucket")
    @classmethod
    def _bucket_name(cls, value):
        import re

        if value is not None and not re.fullmatch(r"[a-z0-9][a-z0-9.-]{1,61}[a-z0-9]", value):
            raise ValueError(f"{value!r} is not a valid S3 bucket name: 3 to 63 lowercase letters, digits, dots or "
                             f"hyphens, starting and ending with a letter or digit")
        return value

    @model_validator(mode="after")
    def _bucket_for_s3(self):
        if self.backend == "s3" and not self.bucket:
            raise ValueError("storage.backend is 's3' but storage.bucket is not set; name the bucket "
                             "(storage.bucket: my-bucket) or use storage.backend: local")
        if self.backend == "local" and self.cache_max_gb is not None:
            raise ValueError(f"storage.cache_max_gb is {self.cache_max_gb} but storage.backend is 'local': the datasets "
                             f"live only under KILN_HOME, so nothing can be evicted; remove storage.cache_max_gb or "
                             f"use storage.backend: s3")
        return self
