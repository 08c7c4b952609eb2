"""The `kiln` command line, one module per command: `plan`, `audit`, `forget`, `dedup` (and `base`, what they share).
Bad arguments get a clear message and exit code 2. Outside Dagster: the same library code the assets call,
over the same store (`$KILN_HOME/data`) and project config (`$KILN_CONFIG`)."""

from __future__ import annotations

import argparse
import sys

from kiln.cli.audit import add_audit_parser
from kiln.cli.dedup import add_dedup_parser
from kiln.cli.forget import add_forget_parser
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
