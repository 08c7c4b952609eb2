"""`kiln dedup migrate-index`: move an older Kiln's near-dup index into the dedup_index datasets, once."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from kiln.cli.base import BAD_INPUT, EXIT_OK, bad_input, open_store


def add_dedup_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `dedup migrate-index`: move an old near-dup index (LocalIndex folder, S3 copy, or Redis) into
    per-refresh bucket indexes in the dedup_index datasets (kiln.dedup.migrate)."""
    parser = subparsers.add_parser("dedup", help="near-duplicate index maintenance")
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    migrate = actions.add_parser(
        "migrate-index", help="move the old near-dup index into the dedup_index datasets (once, after upgrading)",
        description="Gives every refresh's dedup_index dataset written before the bucket index its bucket index, "
                    "from the old index's records and shingle sets. Refreshes already migrated are left alone. A "
                    "migrated dataset gets a new data version (files were added); its manifest names the version it "
                    "replaces, whose decisions it holds unchanged, so `kiln audit lineage` and the data card do not "
                    "report its consumers (deduplicated_documents) as built from a superseded version. Old indexes "
                    "were all built with the affine32 signature scheme: migrating needs dedup.near.scheme: affine32 "
                    "in the config (and keeps it for later refreshes); with the default fss-splitmix64-v1 it is "
                    "refused, and the way to the faster scheme is a backfill instead of a migration.")
    old = migrate.add_mutually_exclusive_group()
    old.add_argument("--from", dest="folder", type=Path, metavar="DIR",
                     help="the old index folder (default: $KILN_HOME/dedup_index/NAME, or its copy on S3 with "
                          "storage.backend: s3)")
    old.add_argument("--redis", metavar="URL", help="the old index was on Redis at this URL (default for a "
                                                    "password: put the URL in KILN_REDIS_URL and pass --redis env)")
    migrate.add_argument("--name", default="kiln",
                         help="the name the old index was written under: its Redis keys kiln:dedup:NAME, or its "
                              "folder dedup_index/NAME (default kiln)")
    migrate.add_argument("--home", type=Path, help="KILN_HOME holding data/ (default: $KILN_HOME, else ./.kiln)")
    migrate.add_argument("--config", type=Path,
                         help="project config (default: $KILN_CONFIG, else configs/default.yaml)")
    migrate.set_defaults(func=run_migrate_index)
    return parser


def run_migrate_index(args: argparse.Namespace) -> int:
    import os

    from kiln.common.config import kiln_home, load_config
    from kiln.dedup.migrate import OldRedisIndex, migrate_index, migrate_local

    try:
        home, config = (args.home or kiln_home()).resolve(), load_config(args.config)
        store, near = open_store(home, config), config.dedup.near
        if args.redis:
            url = os.environ.get("KILN_REDIS_URL") if args.redis == "env" else args.redis
            if not url:
                raise ValueError("--redis env: KILN_REDIS_URL is not set; export it (redis://host:6379/0) or pass "
                                 "the URL itself as --redis")
            result = migrate_index(store, OldRedisIndex(url, args.name), near)
        else:
            folder = args.folder or (home / "dedup_index" / args.name)
            result = migrate_local(store, near, folder if folder.exists() or store.remote is None else None,
                                   args.name)
    except BAD_INPUT as exc:  # ConfigError, MigrationError and StorageError included
        return bad_input("dedup migrate-index", exc)
    for r, n in result["migrated"].items():
        print(f"dedup_index[{r}]: bucket index of {n:,} accepted documents written")
    for r in result["already_migrated"]:
        print(f"dedup_index[{r}]: already has a bucket index; left alone")
    print("the old index is no longer read; remove it when you no longer need it")
    return EXIT_OK
