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


def open_store(home: Path, config) -> Any:
    """The store the assets write: `home/data`, kept in step with S3 when `storage.backend: s3` (credentials
    and endpoint from the standard AWS_* environment, as boto3 reads them). With S3 a dataset comes into the local
    cache when a command reads its files; a question about manifests alone (lineage, `kiln runs`) fetches none."""
    from kiln.common.storage import Store

    if config.storage.backend == "s3":
        import boto3
        from botocore.exceptions import BotoCoreError

        from kiln.common.remote import S3Remote

        settings = config.storage
        try:
            client = boto3.client("s3")
        except BotoCoreError as exc:  # a profile that does not exist, a broken ~/.aws/config: said, not a traceback
            raise StorageError(f"storage: cannot set up the S3 client for bucket {settings.bucket!r} ({exc}); check "
                               f"AWS_PROFILE and the other AWS_* variables, or ~/.aws/config") from None
        return Store.configured(home / "data", settings, S3Remote.connect(client, settings.bucket, settings.prefix,
                                                                          settings.create_bucket))
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
