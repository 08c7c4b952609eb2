"""The `kiln` command line. Bad arguments get a clear message and exit code 2."""

from __future__ import annotations

import argparse
import sys

from kiln.cli.governance import add_audit_parser, add_dedup_parser, add_forget_parser
from kiln.cli.plan import add_plan_parser


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="kiln", description="Kiln: raw text corpora to a pretrained model.")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_plan_parser(commands)
    add_audit_parser(commands)
    add_forget_parser(commands)
    add_dedup_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)


if __name__ == "__main__":
    sys.exit(main())
