"""The `kiln` command line, one module per command: `plan`, `audit`, `forget`, `dedup`, `runs` (and `base`, what they
share).
Bad arguments get a clear message and exit code 2. Outside Dagster: the same library code the assets call,
over the same store (`$KILN_HOME/data`) and project config (`$KILN_CONFIG`)."""

from __future__ import annotations

import argparse
import difflib
import os
import sys
from importlib.metadata import PackageNotFoundError, version

from kiln.cli.audit import add_audit_parser
from kiln.cli.dedup import add_dedup_parser
from kiln.cli.forget import add_forget_parser
from kiln.cli.plan import add_plan_parser
from kiln.cli.runs import add_runs_parser


class Parser(argparse.ArgumentParser):
    """argparse that names a mistyped flag, with the flag it was probably meant to be, before anything else:
    `--doc_id` gets "did you mean --doc-id?", not "one of the arguments --text --doc-id is required", and `kiln
    --verison` not "the following arguments are required: COMMAND". Every subcommand's parser is one too (argparse
    builds them with the parent's class). A parser of subcommands judges the flags before its subcommand's name; a
    flag of the subcommands given there is told where it goes (`kiln audit --json lineage`)."""

    def parse_known_args(self, args=None, namespace=None):
        commands = [a for a in self._actions if isinstance(a, argparse._SubParsersAction)]
        flags = [o for a in self._actions for o in a.option_strings if o.startswith("--")]
        for token in sys.argv[1:] if args is None else args:
            if token == "--" or (commands and not token.startswith("-")):  # the rest is the subcommand's
                break
            name = token.split("=", 1)[0]
            if " " in name:  # a value, as argparse reads it ("--reason '--see ticket 12'")
                continue
            if name.startswith("--") and not any(f.startswith(name) for f in flags):  # prefixes are allowed
                choices = {c: sub for a in commands for c, sub in a.choices.items()}
                theirs = [c for c, sub in choices.items() if any(name in o.option_strings for o in sub._actions)]
                if theirs:
                    which = "" if len(theirs) == len(choices) else \
                        f" ({', '.join(theirs)} take{'s' if len(theirs) == 1 else ''} it)"
                    self.error(f"{name} goes after the {(commands[0].metavar or 'command').lower()}: "
                               f"{self.prog} {theirs[0]} ... {name}{which}")
                # 0.75: a typo (--verison, --jsno: 0.83-0.89), not another flag sharing a few letters (`kiln plan
                # --version` is no --json, 0.67)
                close = difflib.get_close_matches(name.replace("_", "-"), flags, n=1, cutoff=0.75)
                self.error(f"unrecognized argument {name}" + (f": did you mean {close[0]}?" if close else ""))
        return super().parse_known_args(args, namespace)


def kiln_version() -> str:
    try:
        return version("kiln-pretrain")
    except PackageNotFoundError:  # run from a source tree that was never installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="kiln", description="Kiln: raw text corpora to a pretrained model.")
    parser.add_argument("--version", action="version", version=f"kiln {kiln_version()}")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    add_plan_parser(commands)
    add_audit_parser(commands)
    add_forget_parser(commands)
    add_dedup_parser(commands)
    add_runs_parser(commands)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except BrokenPipeError:  # `kiln plan | head`: the reader left; as Python's docs advise, quietly
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())  # no second error at exit's flush
        return 1


if __name__ == "__main__":
    sys.exit(main())
