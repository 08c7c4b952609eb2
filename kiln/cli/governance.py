"""`kiln audit` (lineage, membership and source questions) and `kiln forget` (removal requests) on the
command line (`add_audit_parser` / `add_forget_parser` register them).

It reads the same store the assets write (`$KILN_HOME/data`; the near-dup index is part of the dedup_index
datasets) and the project config (`$KILN_CONFIG`). Human-readable by default, `--json` for machines. A question
the store cannot answer as asked (no such checkpoint, unknown source, missing file) prints
`kiln audit: <message>` to stderr and returns 2, like argparse's own errors.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

EXIT_OK = 0
EXIT_BAD_INPUT = 2


def add_audit_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `audit` (with `lineage`, `membership`, `source`) on an argparse subparsers object."""
    parser = subparsers.add_parser(
        "audit", help="what went into a checkpoint, whether a document was trained on, where a source went",
        description="Answers from the manifests and data the assets wrote, for auditors, lawyers and data owners.")
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--home", type=Path, help="KILN_HOME holding data/ (default: $KILN_HOME, "
                                                  "else ./.kiln)")
    common.add_argument("--config", type=Path, help="project config (default: $KILN_CONFIG, else configs/default.yaml)")
    common.add_argument("--json", action="store_true", help="print JSON instead of text")
    questions = parser.add_subparsers(dest="question", required=True, metavar="QUESTION")

    lineage = questions.add_parser("lineage", parents=[common], help="the chain from a checkpoint back to raw sources",
                                   description="Every dataset a checkpoint was built from, back to each source's raw "
                                               "documents: data versions, code versions, git commits, counts, hashes.")
    lineage.add_argument("checkpoint", metavar="CHECKPOINT",
                         help="`checkpoint` (the current one), a data version (or 6+ leading characters), or a "
                              "checkpoint folder")

    member = questions.add_parser("membership", parents=[common], help="was this document in the training data?",
                                  description="Whether a document (exactly, or as a near-duplicate via the MinHash "
                                              "index) reached the training set; if not, at which stage and why it "
                                              "was removed.")
    which = member.add_mutually_exclusive_group(required=True)
    which.add_argument("--text", type=Path, metavar="FILE", help="a UTF-8 file holding the document's text ('-': stdin)")
    which.add_argument("--doc-id", dest="doc_id", metavar="ID", help="the document's Kiln doc_id")
    member.add_argument("--checkpoint", metavar="C", help="only the token shards this checkpoint was trained on count")

    source = questions.add_parser("source", parents=[common], help="the checkpoints and shards that used a source",
                                  description="A source's documents per stage and, per token-shard set, its tokens, "
                                              "shards and the checkpoints trained on them.")
    source.add_argument("name", metavar="NAME", help="the source's name (sources[].name)")

    questions.add_parser("refreshes", parents=[common], help="which files made up each refresh, and what is pending",
                         description="Every registered refresh (when, by what, which landed files), its documents per "
                                     "source and token shards, and the files waiting in the landing area.")
    parser.set_defaults(func=run_audit)
    return parser


def open_store(home: Path, config) -> Any:
    """The store the assets write: `home/data`, kept in step with S3 when `storage.backend: s3` (credentials
    and endpoint from the standard AWS_* environment, as boto3 reads them; the current datasets are pulled
    into the local cache first, shards included)."""
    from kiln.common.storage import Store

    if config.storage.backend == "s3":
        import boto3

        from kiln.common.remote import S3Remote

        from kiln.governance.forget import REQUESTS
        from kiln.governance.lineage import DOCUMENT_STAGES
        from kiln.governance.refresh import load_refreshes, partition
        from kiln.common.storage import IncompleteDataset

        settings = config.storage
        store = Store(home / "data", S3Remote.connect(boto3.client("s3"), settings.bucket, settings.prefix,
                                                      settings.create_bucket))
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
    return Store(home / "data")


def _bad_input(command: str, exc: Exception) -> int:
    """`kiln <command>: <message>` on stderr (one prefix per line of a multi-line config error), exit 2."""
    for line in str(exc).splitlines():
        print(f"kiln {command}: {line}", file=sys.stderr)
    return EXIT_BAD_INPUT


def _read_text(path: Path) -> str:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--text: no such file {str(path)!r}") from None
    except IsADirectoryError:
        raise ValueError(f"--text: {str(path)!r} is a directory; give a file holding the document's text") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"--text: {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    if not text.strip():
        raise ValueError(f"--text: {str(path)!r} is empty")
    return text


def run_audit(args: argparse.Namespace) -> int:
    """Answer one audit question; exit code 0, or 2 with `kiln audit: <message>` on bad input."""
    from kiln.governance.audit import lineage, membership, refresh_report, source_usage
    from kiln.common.config import kiln_home, load_config

    try:
        home = (args.home or kiln_home()).resolve()
        config = load_config(args.config)
        store = open_store(home, config)
        if args.question == "lineage":
            result = lineage(store, args.checkpoint)
        elif args.question == "membership":
            text = _read_text(args.text) if args.text is not None else None
            if args.doc_id is not None and not args.doc_id.strip():
                raise ValueError("--doc-id is empty")
            result = membership(store, config, text=text, doc_id=args.doc_id,
                                checkpoint=args.checkpoint)
        elif args.question == "refreshes":
            result = refresh_report(store, config)
        else:
            result = source_usage(store, config, args.name)
    except ValueError as exc:  # ConfigError and AuditError included
        return _bad_input("audit", exc)
    print(json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=str) if args.json else result.render())
    return EXIT_OK


def add_forget_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `forget`: record a removal request (a source, a URL regex, or a file of doc ids)."""
    parser = subparsers.add_parser(
        "forget", help="record a removal request; the next materialization excludes the documents",
        description="Records a removal request in the store. The next materialization of token_shards leaves "
                    "every matching document of every refresh out, and quality_filtered_documents moves them to its "
                    "rejected table (stage removal_request); the current checkpoint, if trained on any, is flagged "
                    "in the request and in its data card.")
    which = parser.add_mutually_exclusive_group(required=True)
    which.add_argument("--source", metavar="NAME", help="every document of this source")
    which.add_argument("--url-pattern", dest="url_pattern", metavar="P", help="documents whose URL matches this regex")
    which.add_argument("--doc-ids", dest="doc_ids", type=Path, metavar="FILE", help="a file of doc ids, one per line")
    parser.add_argument("--reason", default="", help="why (e.g. the ticket or the publisher's request)")
    parser.add_argument("--home", type=Path, help="KILN_HOME holding data/ (default: $KILN_HOME, else ./.kiln)")
    parser.add_argument("--config", type=Path, help="project config (default: $KILN_CONFIG, else configs/default.yaml)")
    parser.add_argument("--json", action="store_true", help="print the recorded request as JSON")
    parser.set_defaults(func=run_forget)
    return parser


def run_forget(args: argparse.Namespace) -> int:
    from kiln.common.config import kiln_home, load_config
    from kiln.governance.forget import read_doc_ids, record_request

    try:
        home, config = (args.home or kiln_home()).resolve(), load_config(args.config)
        kind, value = (("source", args.source) if args.source is not None else
                       ("url_pattern", args.url_pattern) if args.url_pattern is not None else
                       ("doc_ids", read_doc_ids(args.doc_ids)))
        request = record_request(open_store(home, config), config, kind, value, args.reason)
    except ValueError as exc:  # ConfigError and ForgetError included
        return _bad_input("forget", exc)
    if args.json:
        print(json.dumps(request.to_dict(), indent=2, ensure_ascii=False))
        return EXIT_OK
    shown = request.value if isinstance(request.value, str) else f"{len(request.value)} doc ids"
    print(f"removal request {request.request_id} recorded ({request.kind}: {shown})")
    for a in request.affected:
        print(f"  affected checkpoint {a['checkpoint']}: trained on {a['documents']:,} matching documents "
              f"({a['tokens']:,} tokens) from {', '.join(a['sources'])}; its data card says so from its next "
              "materialization")
    if not request.affected:
        print("  no current checkpoint was trained on matching documents")
    print("  the next materialization of token_shards (and of quality_filtered_documents) excludes them")
    return EXIT_OK


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
    migrate.add_argument("--name", default="kiln", help="the old index's name (dedup.near.index.name; default kiln)")
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
            url = os.environ.get("KILN_REDIS_URL", "") if args.redis == "env" else args.redis
            result = migrate_index(store, OldRedisIndex(url, args.name), near)
        else:
            folder = args.folder or (home / "dedup_index" / args.name)
            result = migrate_local(store, near, folder if folder.exists() or store.remote is None else None,
                                   args.name)
    except ValueError as exc:  # ConfigError and MigrationError included
        return _bad_input("dedup migrate-index", exc)
    for r, n in result["migrated"].items():
        print(f"dedup_index[{r}]: bucket index of {n:,} accepted documents written")
    for r in result["already_migrated"]:
        print(f"dedup_index[{r}]: already has a bucket index; left alone")
    print("the old index is no longer read; remove it when you no longer need it")
    return EXIT_OK
