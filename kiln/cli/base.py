"""What every `kiln` command shares: exit codes, bad-input messages on stderr, and opening the store the
assets write (`$KILN_HOME/data`, kept in step with S3 when `storage.backend: s3`)."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from kiln.common.remote import StorageError
from kiln.common.secrets import redact

EXIT_OK = 0
EXIT_BAD_INPUT = 2
# What a command reports as `kiln <command>: <message>`, exit 2: a bad flag or config (ValueError: ConfigError and
# each command's own errors) and storage that cannot be used as configured (a missing bucket, a refused or corrupt
# object), whose messages say what to change.
BAD_INPUT = (ValueError, StorageError)


def open_store(home: Path, config, pull_current: bool = True) -> Any:
    """The store the assets write: `home/data`, kept in step with S3 when `storage.backend: s3` (credentials
    and endpoint from the standard AWS_* environment, as boto3 reads them; with `pull_current`, the current
    datasets are pulled into the local cache first, shards included)."""
    from kiln.common.storage import Store

    if config.storage.backend == "s3":
        import boto3
        from botocore.exceptions import BotoCoreError

        from kiln.common.remote import S3Remote
        from kiln.common.storage import IncompleteDataset
        from kiln.governance.forget import REQUESTS
        from kiln.governance.lineage import DOCUMENT_STAGES
        from kiln.governance.refresh import load_refreshes, partition

        settings = config.storage
        try:
            client = boto3.client("s3")
        except BotoCoreError as exc:  # a profile that does not exist, a broken ~/.aws/config: said, not a traceback
            raise StorageError(f"storage: cannot set up the S3 client for bucket {settings.bucket!r} ({exc}); check "
                               f"AWS_PROFILE and the other AWS_* variables, or ~/.aws/config") from None
        store = Store.configured(home / "data", settings, S3Remote.connect(client, settings.bucket, settings.prefix,
                                                                           settings.create_bucket))
        if not pull_current:
            return store
        # The audit reads the local folders: bring every current dataset it may read into the cache first.
        refreshes = [r.key for r in load_refreshes(store)]
        wanted = [(stage, partition(s.name, r)) for stage in DOCUMENT_STAGES for s in config.sources
                  for r in refreshes] + [(a, r) for a in ("dedup_index", "token_shards") for r in refreshes] + \
            [(a, None) for a in ("quality_classifier", "tokenizer", "training_run", "checkpoint", "evaluation",
                                 "data_card", REQUESTS)]
        for asset, key in wanted:
            try:
                store.manifest(asset, key)
            except IncompleteDataset:
                continue
        return store
    if not (home / "data").is_dir():
        raise ValueError(f"no Kiln store at {home / 'data'}; set KILN_HOME or --home (`make demo` creates one)")
    return Store.configured(home / "data", config.storage)


def bad_input(command: str, exc: Exception) -> int:
    """`kiln <command>: <message>` on stderr (one prefix per line of a multi-line config error), exit 2. A URL in the
    message is shown without its `user:password@`: a library's own message (MLflow's, a driver's) may quote the URL
    it was given whole."""
    for line in str(exc).splitlines():
        print(f"kiln {command}: {redact(line)}", file=sys.stderr)
    return EXIT_BAD_INPUT
