"""The MFU a plan assumes when the user gives none: Kiln's own, measured on finished runs on the same GPU kind.

Every training run ends with a summary.json (training_jobs.train) that says on which device it ran and its
goodput: the tokens of the steps that counted over the wall time, checkpoints, validation, logging and rollbacks
included. A plan turns a budget into GPU-hours of wall time, so goodput is the figure it needs; the step MFU (`mfu`,
optimizer steps only) would promise more than a run delivers. But not the whole run's goodput: the parts a run
pays once (startup, the first step's compilation, the final save and validation, the export) are most of a short
trial run and nothing of the weeks a plan sizes, and the plan adds restarts itself (`reliability`). So a run counts
by its steady goodput (`steady_goodput_tokens_per_s` over `steady_s`, training_jobs.reporting.throughput), or by
its whole goodput if it is from before steady goodput was recorded. Runs are pooled by work, not averaged: MFU =
their model FLOPs / (peak x their GPU-seconds), so a long run counts for more than a short one.

Runs are found in Kiln's run folders (KILN_HOME/runs/*/summary.json, where the training asset writes them) and,
with `kiln plan --mlflow-uri`, in an MLflow experiment (the metrics every run logs at the end).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kiln.common.secrets import redact_url
from kiln.planning.hardware import GpuSpec, cuda_device

ASSUMED_MFU = 0.4  # when the user gives none and Kiln has no finished run on that GPU kind

def gpu_kind(device_name: str) -> str | None:
    """The planner's name for a device name as CUDA reports it, or None (CPU, or a GPU the planner lacks)."""
    return cuda_device(device_name)[0]


@dataclass(frozen=True)
class RunThroughput:
    """What one finished run did with its GPUs."""

    device: str  # as CUDA names it, e.g. "NVIDIA H200"
    model_flops: float  # the model FLOPs of the steps that counted (PaLM's count, attention included)
    gpu_seconds: float  # the seconds they are counted over (steady, else wall) x devices
    source: str  # the summary's path or the MLflow run id
    mlflow_run_id: str | None = None

    @property
    def gpu(self) -> str | None:
        return gpu_kind(self.device)


def from_summary(summary: dict[str, Any], source: str) -> RunThroughput | None:
    """A completed run's throughput from its summary.json, or None (not completed, or from before goodput)."""
    if summary.get("status") != "completed":
        return None
    counted = counted_throughput(summary.get("steady_goodput_tokens_per_s"), summary.get("steady_s"),
                                 summary.get("goodput_tokens_per_s"), (summary.get("time") or {}).get("wall_s"))
    if counted is None:
        return None
    tokens_per_s, seconds = counted
    return RunThroughput(str(summary.get("device")), tokens_per_s * seconds * summary["flops_per_token"],
                         seconds * summary["world_size"], source, summary.get("mlflow_run_id"))


def counted_throughput(steady: float | None, steady_s: float | None, goodput: float | None,
                       wall_s: float | None) -> tuple[float, float] | None:
    """(tokens/s, seconds) a run counts by: its steady goodput where it has one, else its whole goodput."""
    if steady and steady_s:
        return steady, steady_s
    if goodput and wall_s:
        return goodput, wall_s
    return None


def runs_in(runs_dir: Path) -> list[RunThroughput]:
    """The completed runs in Kiln's run folders (one summary.json each)."""
    found = []
    for path in sorted(Path(runs_dir).glob("*/summary.json")):
        try:
            summary = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError):  # a run writing it right now, or a damaged file
            continue
        if not isinstance(summary, dict) or not all(k in summary for k in ("flops_per_token", "world_size")):
            continue  # not a run's summary (edited by hand, another tool's file): nothing to count
        run = from_summary(summary, str(path))
        if run is not None:
            found.append(run)
    return found


def runs_from_mlflow(tracking_uri: str, experiment_name: str) -> list[RunThroughput]:
    """The FINISHED runs of an MLflow experiment that logged goodput (training_jobs.reporting.throughput_metrics),
    counted as from_summary counts them."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ValueError(f"no MLflow experiment named {experiment_name!r} at {redact_url(tracking_uri)}")
    found, page_token = [], None
    while True:
        page = client.search_runs([experiment.experiment_id], filter_string="attributes.status = 'FINISHED'",
                                  page_token=page_token)
        for run in page:
            params, metrics = run.data.params, run.data.metrics
            counted = counted_throughput(metrics.get("run/steady_goodput_tokens_per_s"), metrics.get("run/steady_s"),
                                         metrics.get("run/goodput_tokens_per_s"), metrics.get("run/time/wall_s"))
            if counted and {"device", "world_size", "model.flops_per_token"} <= set(params):
                (tokens_per_s, seconds), per_token = counted, float(params["model.flops_per_token"])
                found.append(RunThroughput(params["device"], tokens_per_s * seconds * per_token,
                                           seconds * int(params["world_size"]), run.info.run_id, run.info.run_id))
        page_token = page.token
        if not page_token:
            return found


def merged(*sources: Iterable[RunThroughput]) -> list[RunThroughput]:
    """Runs from several sources, each once (a run in both a run folder and MLflow counts once)."""
    out, seen = [], set()
    for run in (r for source in sources for r in source):
        key = run.mlflow_run_id or run.source
        if key not in seen:
            seen.add(key)
            out.append(run)
    return out


@dataclass(frozen=True)
class MfuChoice:
    mfu: float
    origin: str  # "given", "measured" or "assumed"
    gpu: str
    n_runs: int = 0
    runs: tuple[str, ...] = ()  # the pooled runs: summary paths or MLflow run ids

    def describe(self) -> str:
        if self.origin == "given":
            return f"MFU {self.mfu:.0%} given"
        if self.origin == "measured":
            return f"MFU {self.mfu:.1%} from {self.n_runs} run{'s' if self.n_runs > 1 else ''} of Kiln on {self.gpu}"
        return f"MFU {self.mfu:.0%} assumed (no runs of Kiln on {self.gpu})"

    def to_dict(self) -> dict[str, Any]:
        return {"mfu": self.mfu, "origin": self.origin, "gpu": self.gpu, "n_runs": self.n_runs,
                "runs": list(self.runs), "text": self.describe()}


def choose_mfu(given: float | None, gpu: GpuSpec, runs: Sequence[RunThroughput]) -> MfuChoice:
    """The user's MFU if given; else the steady goodput MFU of Kiln's runs on this GPU kind, pooled, against this
    plan's peak (an overridden peak included); else ASSUMED_MFU."""
    if given is not None:
        return MfuChoice(given, "given", gpu.name)
    same = [r for r in runs if r.gpu == gpu.name and r.gpu_seconds > 0]
    if not same:
        return MfuChoice(ASSUMED_MFU, "assumed", gpu.name)
    measured = sum(r.model_flops for r in same) / (gpu.peak_flops * sum(r.gpu_seconds for r in same))
    return MfuChoice(min(measured, 1.0), "measured", gpu.name, len(same), tuple(r.source for r in same))
