"""`kiln audit`: lineage, membership, source, data card and refresh questions on the command line
(`add_audit_parser`).

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
from typing import TYPE_CHECKING, Any

from kiln.cli.base import BAD_INPUT, EXIT_OK, bad_input, open_store
from kiln.common.display import visible

if TYPE_CHECKING:
    from kiln.common.config import ProjectConfig
    from kiln.common.storage import Store


def add_audit_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `audit` (`lineage`, `membership`, `source`, `card`, `refreshes`, `rejected`) on an argparse subparsers
    object."""
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
                         help="`checkpoint` (the current one), a data version (or 6+ leading characters), a "
                              "checkpoint folder, or any dataset by its asset key (token_shards/REFRESH, "
                              "curated_documents/SOURCE/REFRESH, tokenizer)")

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

    card = questions.add_parser("card", parents=[common], help="the data card of a checkpoint, a replaced one too",
                                description="The data card of a checkpoint the store published: the current one, or "
                                            "one a later training replaced (described from the store's history of "
                                            "manifests, as it was trained). Markdown, or JSON with --json.")
    card.add_argument("checkpoint", metavar="CHECKPOINT", nargs="?", default="checkpoint",
                      help="as for lineage (default: the current checkpoint)")
    card.add_argument("--out", type=Path, metavar="DIR",
                      help="write data_card.md, data_card.json and the funnel chart (PNG) into DIR instead "
                           "(with --json, print the written paths as JSON)")

    questions.add_parser("refreshes", parents=[common], help="which files made up each refresh, and what is pending",
                         description="Every registered refresh (when, by what, which landed files), its documents per "
                                     "source and token shards, and the files waiting in the landing area.")
    rejected = questions.add_parser("rejected", parents=[common], help="a sample of what one rule removed",
                                    description="Ids, urls and PII-redacted excerpts of documents a stage removed for "
                                                "a reason, the text read back from raw_documents (which only a user "
                                                "allowed to read the raw layer can open). Documents under a removal "
                                                "request are never shown.")
    rejected.add_argument("--stage", required=True, help="filtered_documents, curated_documents, "
                                                         "deduplicated_documents or quality_filtered_documents")
    rejected.add_argument("--reason", required=True, help="e.g. gopher_quality.min_stop_words, or gopher_quality "
                                                          "for all of its rules; a wrong one lists the stage's reasons")
    rejected.add_argument("--sample", type=int, default=5, help="documents to show (default 5)")
    rejected.add_argument("--source", action="append", help="only this source (repeatable; default: all, one dropped "
                                                              "from the config since included)")
    rejected.add_argument("--refresh", help="only this refresh (default: all)")
    parser.set_defaults(func=run_audit)
    return parser


def _read_text(path: Path) -> str:
    try:
        text = sys.stdin.read() if str(path) == "-" else path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ValueError(f"--text: no such file {str(path)!r}") from None
    except IsADirectoryError:
        raise ValueError(f"--text: {str(path)!r} is a directory; give a file holding the document's text") from None
    except UnicodeDecodeError as exc:
        raise ValueError(f"--text: {str(path)!r} is not UTF-8 text ({exc.reason} at byte {exc.start})") from None
    except OSError as exc:  # no permission to read it, an I/O error
        raise ValueError(f"--text: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    if not text.strip():
        raise ValueError(f"--text: {str(path)!r} is empty")
    return text


def run_audit(args: argparse.Namespace) -> int:
    """Answer one audit question; exit code 0, or 2 with `kiln audit: <message>` on bad input."""
    from kiln.common.config import kiln_home, load_config
    from kiln.governance.audit import lineage, refresh_report, source_usage
    from kiln.governance.catalog import known_sources
    from kiln.governance.membership import membership
    from kiln.governance.rejected import rejected_sample
    from kiln.governance.render import render

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
        elif args.question == "card":
            return _card(store, config, args.checkpoint, args.out, args.json)
        elif args.question == "refreshes":
            result = refresh_report(store, config)
        elif args.question == "rejected":
            if args.sample < 1:
                raise ValueError(f"--sample {args.sample}: give at least 1")
            # the config's sources, and those only the store holds (dropped from the config since: their documents,
            # and what a rule removed of them, are still there)
            names = known_sources(store, config)
            unknown = set(args.source or []) - set(names)
            if unknown:
                raise ValueError(f"--source {', '.join(sorted(unknown))}: no such source in the config or the store; "
                                 f"sources: {', '.join(names)}")
            result = rejected_sample(store, args.stage, args.reason, args.sample, args.source or names, args.refresh)
        else:
            result = source_usage(store, config, args.name)
    except BAD_INPUT as exc:  # ConfigError, AuditError and StorageError included
        return bad_input("audit", exc)
    # JSON keeps C1 and bidi characters as they are (ensure_ascii=False): as escapes, it is the same JSON.
    print(visible(json.dumps(result.to_dict(), indent=2, ensure_ascii=False, default=str)) if args.json else
          render(result))
    return EXIT_OK


def _card(store: Store, config: ProjectConfig, checkpoint: str, out: Path | None, as_json: bool) -> int:
    """Print a checkpoint's data card, or write it into `out` as the data_card asset does (each file atomically)."""
    from kiln.common.manifest import write_file_atomic, write_json_atomic
    from kiln.governance.data_card import build_data_card
    from kiln.governance.data_card_markdown import FUNNEL_PNG, FUNNEL_TITLE, data_card_markdown, funnel_png

    card = build_data_card(store, config, checkpoint)
    unknown = config.card.list_unknown_licenses
    if out is None:
        # to a terminal: the card's unseen characters (a statement's, a funnel reason's) as escapes
        print(visible(json.dumps(card, indent=2, ensure_ascii=False, default=str) if as_json else
                      data_card_markdown(card, None, unknown)))
        return EXIT_OK
    card["funnel"]["chart"] = FUNNEL_PNG
    chart = funnel_png(card)
    try:
        out.mkdir(parents=True, exist_ok=True)
        write_file_atomic(out / FUNNEL_PNG, lambda f: f.write(chart))
        write_json_atomic(out / "data_card.json", json.dumps(card, indent=2, ensure_ascii=False, default=str))
        write_json_atomic(out / "data_card.md", data_card_markdown(card, f"![{FUNNEL_TITLE}]({FUNNEL_PNG})", unknown))
    except OSError as exc:  # a file where the folder should be, no permission, a full disk: said, not a traceback
        raise ValueError(f"--out {str(out)!r}: cannot write the card there ({exc.strerror or exc}); give a folder "
                         f"you can write to") from None
    written = {"checkpoint": card["checkpoint"]["data_version"], "markdown": str(out / "data_card.md"),
               "json": str(out / "data_card.json"), "chart": str(out / FUNNEL_PNG)}
    if as_json:  # what was written where, for a script (the card itself is in data_card.json)
        print(json.dumps(written, indent=2))
    else:
        print(f"data card of checkpoint {written['checkpoint']}: {written['markdown']} (with data_card.json and "
              f"{FUNNEL_PNG})")
    return EXIT_OK
