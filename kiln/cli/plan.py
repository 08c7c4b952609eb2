"""`kiln plan`: the planner on the command line (`add_plan_parser` registers it, `run_plan` runs it).

Flags map one-to-one onto `PlanRequest` fields; `--config project.yaml` reads the `planning:` key
first and flags override it. Invalid input prints `kiln plan: <message>` to stderr and returns 2.
Output: a table, `--json` (the whole plan; its "training" key is the layout as the project config's
`training:` section takes it), or `--training-yaml` (only that block, as YAML).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from kiln.cli.base import EXIT_BAD_INPUT, EXIT_OK, bad_input
from kiln.common.secrets import redact_url
from kiln.planning import own_mfu
from kiln.planning.fits import runs_from_mlflow
from kiln.planning.memory import GIB
from kiln.planning.plan import Plan, PlanRequest, make_plan


def _name_amount(text: str) -> tuple[str, float]:
    name, sep, amount = text.partition("=")
    try:
        if not sep or not name:
            raise ValueError
        return name, float(amount)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected NAME=NUMBER, got {text!r}") from None


def add_plan_parser(subparsers: Any) -> argparse.ArgumentParser:
    """Register `plan` on an argparse subparsers object; returns the new parser."""
    parser = subparsers.add_parser(
        "plan",
        help="size, cost and lay out a pretraining run from a budget",
        description="Model size, tokens, GPU-hours, days, parallelism, memory per GPU and failure costs "
        "for a budget. Unset flags take the config's `planning:` values, then the defaults.",
        argument_default=argparse.SUPPRESS,
    )
    add = parser.add_argument
    budget = parser.add_mutually_exclusive_group()
    budget.add_argument("--budget-usd", dest="budget_usd", type=float, help="dollars of GPU time")
    budget.add_argument("--budget-flops", dest="budget_flops", type=float, help="training FLOPs, e.g. 1e23")
    add("--gpu", help="GPU type, e.g. H100-SXM, H200, A100-80GB, B200, MI300X")
    add("--peak-tflops", dest="peak_tflops", type=float, help="override the dense bf16 peak per GPU")
    add("--gpus", dest="n_gpus", type=int, help="total GPUs")
    add("--nodes", type=int, help="nodes (x --gpus-per-node)")
    add("--gpus-per-node", dest="gpus_per_node", type=int, help="GPUs per node (default 8)")
    add("--price", dest="price_per_gpu_hour", type=float, help="USD per GPU-hour")
    add("--mfu", type=float, help="model FLOPs utilisation, 0 < mfu <= 1 (default: the steady goodput MFU of Kiln's "
        "finished runs on this GPU kind, in KILN_HOME/runs and --mlflow-uri's experiment; without any, 0.4)")
    add("--inter-node-gb-s", dest="inter_node_gb_s", type=float, help="network GB/s per GPU per direction")
    add("--intra-node-gb-s", dest="intra_node_gb_s", type=float, help="NVLink GB/s per GPU per direction")
    add("--sizing", choices=["auto", "chinchilla", "hoffmann", "kaplan", "inference"], help="sizing rule")
    add("--n-layers", dest="n_layers", type=int, help="fix the architecture (with --d-model, --n-heads)")
    add("--d-model", dest="d_model", type=int)
    add("--n-heads", dest="n_heads", type=int)
    add("--vocab-size", dest="vocab_size", type=int)
    add("--seq-len", dest="seq_len", type=int)
    add("--global-batch-tokens", dest="global_batch_tokens", type=int)
    add("--inference-tokens", dest="inference_tokens", type=float, help="expected lifetime inference tokens")
    add("--zero-stage", dest="zero_stage", type=int, choices=[0, 1, 2, 3])
    add("--offload-optimizer", dest="offload_optimizer", action="store_true")
    add("--offload-params", dest="offload_params", action="store_true")
    add("--no-flash-attention", dest="flash_attention", action="store_false")
    add("--recompute", choices=["auto", "none", "selective", "full"])
    add("--gpu-mtbf-hours", dest="gpu_mtbf_hours", type=float, help="mean time between failures of one GPU")
    add("--checkpoint-write-seconds", dest="checkpoint_write_seconds", type=float)
    add("--restart-minutes", dest="restart_minutes", type=float)
    add("--source", dest="available_tokens", action="append", type=_name_amount, metavar="NAME=TOKENS",
        help="tokens available in a source (repeatable)")
    add("--weight", dest="mixture_weights", action="append", type=_name_amount, metavar="NAME=WEIGHT",
        help="mixture weight of a source (repeatable; default: proportional to tokens)")
    add("--config", type=Path, help="project YAML; its `planning:` mapping is the starting point "
        "(default: $KILN_CONFIG, else configs/default.yaml when it exists, else the defaults alone)")
    add("--mlflow-uri", dest="mlflow_uri", help="tracking URI with finished runs to fit own scaling laws")
    add("--experiment", help="MLflow experiment name (with --mlflow-uri)")
    output = parser.add_mutually_exclusive_group()
    output.add_argument("--json", dest="json", action="store_true", help="print JSON instead of the table")
    output.add_argument("--training-yaml", dest="training_yaml", action="store_true",
                        help="print only the layout as YAML to put under `training:` in the project config")
    parser.set_defaults(func=run_plan)
    return parser


def _config_values(path: Path) -> dict[str, Any]:
    """The `planning:` values set in a project config, validated with the rest of it."""
    from kiln.common.config import load_config

    return load_config(path).planning.model_dump(exclude_unset=True)


def _project_config(given: dict[str, Any]) -> Path | None:
    """--config, else the project config every kiln command reads ($KILN_CONFIG, else configs/default.yaml); the
    plan needs no project, so without either it starts from the defaults."""
    from kiln.common.config import config_path

    if "config" in given:
        return given["config"]
    path = config_path()
    return path if "KILN_CONFIG" in os.environ or path.is_file() else None


def request_from_args(args: argparse.Namespace) -> PlanRequest:
    given = vars(args)
    config = _project_config(given)
    values = _config_values(config) if config is not None else {}
    # A flag replaces the config's values of the same quantity, given in whichever form.
    for flags, keys in ((("budget_usd", "budget_flops"), ("budget_usd", "budget_flops")),
                        (("n_gpus", "nodes"), ("n_gpus", "nodes"))):
        if any(f in given for f in flags):
            for key in keys:
                values.pop(key, None)
    for key in ("available_tokens", "mixture_weights"):
        if key in given:
            values[key] = {**values.get(key, {}), **dict(given[key])}
    shape = {k: given[k] for k in ("n_layers", "d_model", "n_heads") if k in given}
    if shape:
        values["model"] = {**(values.get("model") or {}), **shape}
    merged = ("available_tokens", "mixture_weights")  # merged per source above
    values.update({k: v for k, v in given.items() if k in PlanRequest.model_fields and k not in merged})
    return PlanRequest.model_validate(values)


def validation_messages(exc: ValidationError) -> list[str]:
    """One line per problem, naming the field, the value given and what is allowed."""
    lines = []
    for error in exc.errors():
        where = ".".join(str(part) for part in error["loc"])
        if error["type"] == "value_error":  # our own validators already name field and value
            message = str(error["ctx"]["error"])
            lines.append(f"{where}: {message}" if where and not message.startswith(where) else message)
        elif error["type"] == "missing":  # its input is the mapping the key is missing from: not worth printing
            together = " (--n-layers, --d-model and --n-heads fix the shape together)" * where.startswith("model.")
            lines.append(f"{where}: {error['msg']}{together}")
        else:
            lines.append(f"{where}={error['input']!r}: {error['msg']}")
    return lines


def run_plan(args: argparse.Namespace) -> int:
    """Print the plan (table or --json); exit code 0, or 2 with `kiln plan: <message>` on bad input."""
    try:
        request = request_from_args(args)
        runs, tracked = None, []
        if "experiment" in args and "mlflow_uri" not in args:
            raise ValueError("--experiment needs --mlflow-uri URI, the tracking store its runs are read from")
        if "mlflow_uri" in args:
            if "experiment" not in args:
                raise ValueError("--mlflow-uri needs --experiment NAME")
            runs, tracked = _tracked_runs(args.mlflow_uri, args.experiment)
        plan = make_plan(request, runs, own_mfu.merged(tracked, own_mfu.runs_in(kiln_runs_dir())))
    except ValidationError as exc:
        for line in validation_messages(exc):
            print(f"kiln plan: {line}", file=sys.stderr)
        return EXIT_BAD_INPUT
    except ValueError as exc:  # a config error is several lines: each gets the prefix
        return bad_input("plan", exc)
    if getattr(args, "training_yaml", False):
        print(training_yaml(plan))
    else:
        # strict JSON: a NaN would print as a bare NaN, which JSON parsers refuse
        print(json.dumps(plan.to_dict(), indent=2, allow_nan=False) if getattr(args, "json", False)
              else plan.render())
    return EXIT_OK


def _tracked_runs(uri: str, experiment: str) -> tuple[list, list]:
    """The experiment's runs, for the own scaling law and the own MFU; a store that cannot be read is bad input (a
    missing SQLite file would otherwise be created empty, and MLflow's own errors come as tracebacks)."""
    from mlflow.exceptions import MlflowException
    from sqlalchemy.exc import SQLAlchemyError

    if uri.startswith("sqlite:///") and not Path(uri.removeprefix("sqlite:///")).is_file():
        raise ValueError(f"--mlflow-uri {uri}: no such SQLite file (a tracking store is read, never created here)")
    try:
        return runs_from_mlflow(uri, experiment), own_mfu.runs_from_mlflow(uri, experiment)
    except (MlflowException, SQLAlchemyError) as exc:  # an unreachable server; a file that is no tracking database
        raise ValueError(f"--mlflow-uri {redact_url(uri)}: {str(exc).splitlines()[0]}") from None


def kiln_runs_dir() -> Path:
    """Where the training asset keeps its runs (assets/training.py), each with its summary.json."""
    from kiln.common.config import kiln_home

    return kiln_home() / "runs"


def training_yaml(plan: Plan) -> str:
    """The plan's `training:` keys as YAML with a comment saying where they go (`--training-yaml`)."""
    lines = [
        "# under `training:` in the project config; micro_batch and grad_accum there replace",
        "# training.micro_batch_size and training.grad_accum (remove those, or keep them equal)",
    ]
    layout = plan.training_layout
    if plan.kiln_layout is not None:  # the recommended layout is TP x PP at once: say why this one, and its cost
        lines.append(f"# the best layout Kiln's trainer runs (TP or PP at 1), not the plan's TP {plan.parallelism.tp} "
                     f"x PP {plan.parallelism.pp}: see `kiln plan`'s warnings")
    if "model" in layout.training_block():
        lines.append("# model.activation_checkpointing: merge it into training.model if the config has one (the "
                     "layout fits only with it)")
    if not layout.fits:
        lines.append(f"# warning: it does not fit: {layout.needed_bytes / GIB:.1f} GiB per GPU needed, "
                     f"{layout.usable_bytes / GIB:.1f} GiB usable")
    return "\n".join([*lines, plan.training_yaml()])
