"""Rank 0's outputs: progress lines (stdout, or Dagster's log under Pipes), metrics.jsonl, MLflow (Reporter), the
strict-JSON summary written atomically (write_json_atomic, SUMMARY_FORMAT), the figures a step reports
(peak_memory_gib, progress_line), and where a run's wall time went (Stopwatch, goodput)."""

from __future__ import annotations

import contextlib
import json
import math
import os
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch

from kiln.common.manifest import write_file_atomic
from training_jobs import scaling_names
from training_jobs.flops import mfu
from training_jobs.monitor import Event
from training_jobs.settings import RunConfig
from training_jobs.setup import Dist

SUMMARY_FORMAT = "kiln-training-summary/1"


def _json_safe(value: Any) -> Any:
    """NaN/Inf as strings: summary.json stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    write_file_atomic(path, lambda f: f.write(json.dumps(_json_safe(data), indent=2).encode("utf-8")), flush=False)


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flatten(f"{prefix}.{k}" if prefix else k, v))
        return out
    return {prefix: value}


def drop_torn_line(path: Path) -> None:
    """A run killed while appending to a JSON-lines file leaves its last line cut short: cut that line off before a
    resumed run appends, so every line stays a whole row (a row's steps are logged again after the resume)."""
    try:
        f = open(path, "rb+")
    except FileNotFoundError:
        return
    with f:
        size = f.seek(0, os.SEEK_END)
        if size == 0:
            return
        f.seek(size - 1)
        if f.read(1) == b"\n":
            return  # its last line whole
        end = size
        while end > 0:  # back to the last newline, 64 KiB at a time
            start = max(0, end - 65_536)
            f.seek(start)
            newline = f.read(end - start).rfind(b"\n")
            if newline >= 0:
                f.truncate(start + newline + 1)
                return
            end = start
        f.truncate(0)  # one line, cut short


class Reporter:
    """Rank 0's outputs: progress lines (stdout, or Dagster's log under Pipes), metrics.jsonl, MLflow."""

    def __init__(self, run: RunConfig, dist: Dist, pipes):
        self.active = dist.main
        self.pipes = pipes
        self.metrics_file = Path(run.output_dir) / "metrics.jsonl"
        self.rows: list[str] = []  # metrics.jsonl lines not written yet
        if self.active:
            drop_torn_line(self.metrics_file)
        self.mlflow = None
        self.mlflow_run_id: str | None = None

    def start_mlflow(self, run: RunConfig, resume_run_id: str | None, params: dict[str, Any],
                     artifacts: dict[str, Any]) -> None:
        if not (self.active and os.environ.get("MLFLOW_TRACKING_URI")):
            return
        import mlflow

        self.mlflow = mlflow
        run_id = os.environ.get("MLFLOW_RUN_ID") or resume_run_id  # a run the launcher made, or the resumed one
        if run_id is None:
            mlflow.set_experiment(run.experiment)
        active = mlflow.start_run(run_id=run_id, run_name=None if run_id else run.run_name,
                                  tags=run.tags or None)
        self.mlflow_run_id = active.info.run_id
        # Params are immutable in MLflow: log them once, into a new run or one the launcher created (Dagster
        # makes the run to tag it); a resumed run keeps the ones it has.
        if not active.data.params:
            mlflow.log_params({k: str(v) for k, v in params.items()})
        for name, data in artifacts.items():
            mlflow.log_dict(data, name)

    def line(self, text: str) -> None:
        """Under Dagster Pipes the line goes to Dagster's log only (its console and the UI show it); printing it
        as well showed every line twice in the terminal."""
        if self.active:
            if self.pipes is not None:
                self.pipes.log.info(text)
            else:
                print(text, flush=True)

    def step(self, step: int, metrics: dict[str, Any], to_mlflow: bool) -> None:
        """A row of metrics.jsonl, kept until the next logging interval (`to_mlflow`) instead of opening the file
        every step; `flush()` writes it earlier (before a checkpoint, at the end, when the run fails)."""
        if not self.active:
            return
        self.rows.append(json.dumps(_json_safe({"step": step, **metrics})) + "\n")
        if to_mlflow:
            self.flush()
            if self.mlflow is not None:
                finite = {k: float(v) for k, v in metrics.items()
                          if isinstance(v, (int, float)) and math.isfinite(v)}
                # MLflow's own thread sends them: a round trip to the tracking server each interval would hold up
                # the loop, and the GPU with it (finish() flushes the queue before the run ends)
                self.mlflow.log_metrics(finite, step=step, synchronous=False)

    def flush(self) -> None:
        if self.rows:
            with open(self.metrics_file, "a", encoding="utf-8") as f:
                f.write("".join(self.rows))
            self.rows.clear()

    def event(self, event: Event) -> None:
        self.line(f"stability: {event.kind} -> {event.action}: {event.message}")
        if self.active and self.mlflow is not None:
            self.mlflow.log_metric(f"stability/{event.kind}", 1.0, step=event.step)

    def finish(self, summary: dict[str, Any], failed: bool) -> None:
        if not self.active:
            return
        self.flush()
        if self.mlflow is not None:
            self.mlflow.log_dict(_json_safe(summary), "summary.json")
            self.mlflow.log_dict(_json_safe(summary["stability_events"]), "stability_events.json")
            self.mlflow.log_metrics(throughput_metrics(summary), step=summary["steps"])
            if summary.get("val_loss") is not None:
                self.mlflow.log_metrics({"val/loss": summary["val_loss"],
                                         **{f"val/ppl_pos/{k}": v for k, v in (summary["val_ppl_pos"] or {}).items()}},
                                        step=summary["steps"])
                if not failed and scaling_names.is_scaling_point(summary.get("objective"),
                                                                  summary.get("base_checkpoint")):
                    # what `kiln plan --mlflow-uri` fits on (training_jobs.scaling_names)
                    self.mlflow.log_metrics({
                        scaling_names.TOKENS: float(summary["tokens_seen"]),
                        scaling_names.FLOPS: float(summary["flops_per_token"]) * summary["tokens_seen"],
                        scaling_names.FINAL_VAL_LOSS: float(summary["val_loss"])}, step=summary["steps"])
            self.mlflow.flush_async_logging()  # end_run only stops the queue; the steps' metrics must have landed
            self.mlflow.end_run(status="FAILED" if failed else "FINISHED")
        if self.pipes is not None and not failed:
            keys = ("status", "steps", "objective", "final_loss", "val_loss", "base_val_loss", "tokens_seen",
                    "tokens_per_s", "mfu", "goodput_tokens_per_s", "goodput_mfu", "steady_goodput_tokens_per_s",
                    "n_params", "n_params_non_embedding", "world_size", "rollbacks", "mlflow_run_id", "checkpoint",
                    "summary_path")
            metadata = {k: _json_safe(summary[k]) for k in keys if summary.get(k) is not None}
            metadata["stability_events"] = len(summary["stability_events"])
            self.pipes.report_asset_materialization(metadata=metadata, data_version=summary.get("checkpoint_sha256"))


class Stopwatch:
    """The wall time of a span (start .. stop, or .. now) and the seconds spent in named parts of it; parts must
    not nest (each second counts once)."""

    def __init__(self, clock=time.perf_counter):
        self.clock = clock
        self.started: float | None = None
        self.stopped: float | None = None
        self.parts: dict[str, float] = defaultdict(float)

    def start(self) -> None:
        self.started, self.stopped = self.clock(), None

    def stop(self) -> None:
        self.stopped = self.clock()

    def wall(self) -> float:
        if self.started is None:
            return 0.0
        return (self.stopped if self.stopped is not None else self.clock()) - self.started

    @contextlib.contextmanager
    def timing(self, part: str):
        start = self.clock()
        try:
            yield
        finally:
            self.parts[part] += self.clock() - start


# startup: building the trainer (layout, data, engine, a base checkpoint), resume, MLflow; checkpoint: the saves at the cadence; validation: at val_every_steps (and the base model's
# before continued pretraining). Once per run, however long: final_checkpoint (the last save and waiting until every
# checkpoint is written and hashed), final_validation, export.
TIME_PARTS = ("startup", "checkpoint", "validation", "rollback", "final_checkpoint", "final_validation", "export")
# What a run pays once whatever its length (the first step's compilation, a profiled window among them): a long run
# amortizes these, a benchmark of a few dozen steps does not, so throughput() reports goodput without them too.
ONE_TIME_PARTS = ("startup", "warmup", "profile", "final_checkpoint", "final_validation", "export")


def throughput(tokens_per_step: int, tokens_counted: int, step_times: list[float], profiled_times: list[float],
               stopwatch: Stopwatch, flops_per_token: float, peak_flops: float | None,
               world_size: int) -> dict[str, Any]:
    """The run's throughput three ways, and where its wall time went.

    - `tokens_per_s`, `mfu`: step throughput, over the optimizer steps (`step_times`, in order) but the first, which
      pays for compilation, autotuning and the allocator's first blocks (all of them if there is only one).
    - `goodput_tokens_per_s`, `goodput_mfu`: the tokens of the optimizer steps that counted (`tokens_counted`:
      rolled-back steps do not) over the whole wall time, checkpoints, validation, logging, rollbacks and export
      included.
    - `steady_goodput_tokens_per_s`: goodput without the one-time parts (ONE_TIME_PARTS) and the tokens of the steps
      they hold (the first, the profiled ones): what the loop delivers with its checkpoints, validation and logging at
      their cadence, the figure a long run approaches; `steady_s`, the seconds it is over (kiln plan pools by them).
    - `time`: `train_s` the steps but the first, `warmup_s` the first, `profile_s` the steps under
      training.profile_steps (`profiled_times`) and the stopwatch's "profile" part (writing their report), the
      other parts, and `other_s`, what none claims (logging, steps later rolled back, the loss probe). The parts sum
      to `wall_s`."""
    wall = stopwatch.wall()
    timed = step_times[1:] or step_times  # the steps step throughput times: all but the warm-up
    tokens_per_s = tokens_per_step * len(timed) / sum(timed) if sum(timed) > 0 else None
    spent = {"train_s": sum(step_times[1:]), "warmup_s": sum(step_times[:1]),
             "profile_s": sum(profiled_times) + stopwatch.parts.get("profile", 0.0),
             **{f"{part}_s": stopwatch.parts.get(part, 0.0) for part in TIME_PARTS}}
    spent["other_s"] = wall - sum(spent.values())
    goodput = tokens_counted / wall if wall > 0 else None
    steady_s = wall - sum(spent[f"{part}_s"] for part in ONE_TIME_PARTS)
    steady_tokens = tokens_counted - tokens_per_step * (len(step_times[:1]) + len(profiled_times))
    steady = steady_s > 0 and steady_tokens > 0
    return {"tokens_per_s": tokens_per_s, "mfu": mfu(flops_per_token, tokens_per_s or 0.0, peak_flops, world_size),
            "goodput_tokens_per_s": goodput,
            "goodput_mfu": mfu(flops_per_token, goodput or 0.0, peak_flops, world_size),
            "steady_goodput_tokens_per_s": steady_tokens / steady_s if steady else None,
            "steady_s": steady_s if steady else None,
            "time": {"wall_s": round(wall, 3), **{k: round(v, 3) for k, v in spent.items()}}}


def throughput_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The run's throughput figures as MLflow metrics: step throughput and goodput side by side, the time breakdown
    and the checkpoint stall (finite numbers only: MFU is None without a known peak)."""
    figures = {"run/tokens_per_s": summary.get("tokens_per_s"), "run/mfu": summary.get("mfu"),
               "run/goodput_tokens_per_s": summary.get("goodput_tokens_per_s"),
               "run/goodput_mfu": summary.get("goodput_mfu"),
               "run/steady_goodput_tokens_per_s": summary.get("steady_goodput_tokens_per_s"),
               "run/steady_s": summary.get("steady_s"),
               **{f"run/time/{k}": v for k, v in (summary.get("time") or {}).items()},
               **{f"checkpoint/stall_{k}": v for k, v in (summary.get("checkpoint_stall") or {}).items()}}
    return {k: float(v) for k, v in figures.items() if isinstance(v, (int, float)) and math.isfinite(v)}


def open_pipes(dist: Dist, stack: contextlib.ExitStack):
    """Rank 0's Dagster Pipes context when launched through Pipes, else None."""
    from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

    if dist.main and PipesEnvVarParamsLoader().is_dagster_pipes_process():
        return stack.enter_context(open_dagster_pipes())
    return None


def peak_memory_gib() -> float:
    """Peak memory of this rank: allocated device memory on a GPU, its own resident set size on CPU (not its
    launcher's, which ru_maxrss would start from)."""
    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**30, 3)
    from kiln.common.memory import peak_rss_bytes

    return round(peak_rss_bytes() / 2**30, 3)


def progress_line(step: int, max_steps: int, m: dict[str, Any], dt: float, eta_s: float | None = None) -> str:
    """One progress line; `eta_s`: the seconds left at this run's pace so far (validation and checkpoints in)."""
    mfu_text = f" | mfu {m['train/mfu']:.1%}" if m["train/mfu"] is not None else ""
    grad = "n/a" if m["train/grad_norm"] is None else f"{m['train/grad_norm']:.3f}"  # None: DeepSpeed computed none
    eta = f" | ETA {duration(eta_s)}" if eta_s is not None else ""
    return (f"step {step}/{max_steps} | loss {m['train/loss']:.4f} | grad {grad} | lr {m['train/lr']:.2e} | "
            f"{m['train/tokens_per_s']:,.0f} tok/s{mfu_text} | {dt:.2f} s/step{eta}")


def duration(seconds: float) -> str:
    """4s, 1m05s, 2h03m, 3d04h: two units at most."""
    s = int(round(seconds))
    for unit, size, sub, sub_size in (("d", 86400, "h", 3600), ("h", 3600, "m", 60), ("m", 60, "s", 1)):
        if s >= size:
            return f"{s // size}{unit}{(s % size) // sub_size:02d}{sub}"
    return f"{s}s"
