"""`kiln runs`: the training runs' folders (`$KILN_HOME/runs/<run key>/`, and with `storage.mirror_runs` their copies
on S3, `<prefix>/_runs/<run key>/`), listed, and the checkpoints of the runs the store has moved past pruned
(kiln/common/run_folders.py says which runs stay and what of a pruned run stays)."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from pathlib import Path
from typing import Any

from kiln.cli.base import BAD_INPUT, EXIT_OK, bad_input, open_store


def add_runs_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `runs list` and `runs prune`."""
    parser = subparsers.add_parser(
        "runs", help="list the training runs' folders; prune the checkpoints of runs the store has moved past",
        description=__doc__.split("\n\n")[0])
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_text in (("list", "each run: status, steps, checkpoints here and on S3, and whether prune keeps it"),
                            ("prune", "delete the checkpoints of the runs the store has moved past (here and on "
                                      "S3); without --yes, only says what it would delete")):
        sub = actions.add_parser(name, help=help_text, description=help_text)
        sub.add_argument("--keep", type=int, metavar="N",
                         help="besides the runs the store names, keep the N newest others (default: the config's "
                              "storage.keep_old_run_checkpoints, else 1)")
        sub.add_argument("--home", type=Path, help="KILN_HOME holding runs/ (default: $KILN_HOME, else ./.kiln)")
        sub.add_argument("--config", type=Path,
                         help="project config (default: $KILN_CONFIG, else configs/default.yaml)")
        sub.add_argument("--json", action="store_true", help="print the runs as JSON")
        if name == "prune":
            sub.add_argument("--yes", action="store_true", help="delete (without it: a dry run)")
    parser.set_defaults(func=run_runs)
    return parser


def run_runs(args: argparse.Namespace) -> int:
    from kiln.common.config import kiln_home, load_config
    from kiln.common.run_folders import prune, survey

    try:
        if args.keep is not None and args.keep < 0:
            raise ValueError(f"--keep {args.keep}: give 0 or more newer runs to keep")
        home, config = (args.home or kiln_home()).resolve(), load_config(args.config)
        keep = args.keep if args.keep is not None else config.storage.keep_old_run_checkpoints
        keep = 1 if keep is None else keep
        store = open_store(home, config) \
            if (home / "data").is_dir() or config.storage.backend == "s3" else None
        runs = survey(home / "runs", store, config.storage.mirror_runs, keep)
        deleting = args.action == "prune" and args.yes
        freed = prune(home / "runs", runs, store.remote if store is not None and config.storage.mirror_runs else None) \
            if deleting else None
    except BAD_INPUT as exc:
        return bad_input(f"runs {args.action}", exc)
    if args.json:
        print(json.dumps({"runs": [asdict(r) for r in runs], "freed_bytes": freed}, indent=2))
        return EXIT_OK
    for r in runs:
        s3 = f", {len(r.on_s3)} on S3" if r.on_s3 else ""
        fate = f"kept: {r.kept_because}" if r.kept_because else \
            ("checkpoints deleted" if deleting else "prune deletes its checkpoints")
        print(f"{r.key}  {r.status:<10} {r.steps if r.steps is not None else '-':>7} steps  "
              f"{len(r.checkpoints)} checkpoint{'' if len(r.checkpoints) == 1 else 's'} here "
              f"({r.checkpoint_bytes / 1e6:,.1f} MB){s3}  [{fate}]")
    if not runs:
        print(f"no training runs in {home / 'runs'}" + (" nor on S3" if store and store.remote else ""))
    doomed = [r for r in runs if r.doomed]
    if args.action == "prune" and not deleting:
        print(f"dry run: the checkpoints of {len(doomed)} run{'' if len(doomed) == 1 else 's'} would go "
              f"({sum(r.checkpoint_bytes for r in doomed) / 1e6:,.1f} MB here); --yes deletes them")
    elif deleting:
        print(f"deleted the checkpoints of {len(doomed)} run{'' if len(doomed) == 1 else 's'}: "
              f"{freed / 1e6:,.1f} MB here" + (", and their copies on S3" if any(r.on_s3 for r in doomed) else ""))
    return EXIT_OK
