"""`kiln forget`: record a removal request (a source, a URL regex, or a file of doc ids); the next
materialization of token_shards and quality_filtered_documents leaves the matching documents out."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from kiln.cli.base import BAD_INPUT, EXIT_OK, bad_input, open_store


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
    except BAD_INPUT as exc:  # ConfigError, ForgetError and StorageError included
        return bad_input("forget", exc)
    if args.json:
        print(json.dumps(request.to_dict(), indent=2, ensure_ascii=False))
        return EXIT_OK
    shown = request.value if isinstance(request.value, str) else f"{len(request.value)} doc ids"
    print(f"removal request {request.request_id} recorded ({request.kind}: {shown})")
    if request.unknown_ids:
        print(f"  warning: {request.unknown_ids} of the {len(request.value)} doc ids name no document of this store "
              f"(doc ids are Kiln's: `kiln audit membership --text FILE` finds a document's)")
    if request.matched == 0:
        print("  warning: the pattern matches no document's URL as intake read it (every source and refresh); "
              "recorded all the same, for documents still to come")
    for a in request.affected:
        read = a.get("read")
        reached = "its run recorded no exposure" if read is None else \
            f"its run read {read['documents']:,} of them ({read['tokens']:,} tokens read)"
        print(f"  affected checkpoint {a['checkpoint']}: its training set held {a['documents']:,} matching "
              f"document{'' if a['documents'] == 1 else 's'} ({a['tokens']:,} tokens) from {', '.join(a['sources'])}, "
              f"{reached}; " +
              ("its data card says so from its next materialization" if a["current"] else
               "replaced in the store since (a model that may still be in use)"))
    if not request.affected:
        print("  no checkpoint in the store was trained on matching documents")
    print("  the next materialization of token_shards (and of quality_filtered_documents) excludes them")
    return EXIT_OK
