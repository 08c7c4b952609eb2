"""The training entry point: one process per rank, launched by torchrun or the deepspeed launcher, or run
inside a Ray Train worker by training_jobs/ray_launch.py.

    torchrun --standalone --nproc_per_node 2 -m training_jobs.train --run-config run.json
    deepspeed --num_gpus 2 --module training_jobs.train --run-config run.json
    python -m training_jobs.ray_launch --num-workers 2 --run-config run.json   # on a Ray cluster
    python -m training_jobs.train --run-config run.json          # one process, no launcher

On CPU set DS_ACCELERATOR=cpu (the default here when no GPU is visible). Training on CPU skips DeepSpeed's
shared-memory all-reduce op (see setup.init_distributed), so nothing is JIT-built; TORCH_EXTENSIONS_DIR (default
$KILN_HOME/torch_extensions when KILN_HOME is set) keeps any op that a DeepSpeed config does build.

Writes into the run config's output_dir: checkpoints/ (see checkpoint.py), export/ (see export.py),
metrics.jsonl (a row every step, rank 0; written at each logging interval, before a checkpoint and at the end,
also when the run fails) and summary.json (at the end, atomically, also when the run fails).
Metrics go to MLflow when MLFLOW_TRACKING_URI is set, and the final figures to Dagster when launched
through Dagster Pipes.

Test-only fault injection: KILN_INJECT_FAULT="spike@12" multiplies the loss of step 12 by 100 (once per
process; "spike@12x5" by 5), "nan@12" makes it NaN, "hang@12" stops in step 12 (to be killed).

The loop is here (Host, Progress, Trainer, main); setting the process up is in training_jobs/setup.py, one
optimizer step and validation in training_jobs/step.py, metrics, MLflow, Pipes and summary.json in
training_jobs/reporting.py.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import os
import sys
import time
import traceback
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from kiln.tokens.shard_format import ShardError
from training_jobs import checkpoint, scaling_names
from training_jobs.base import BaseCheckpointError, check_compatible, load_base
from training_jobs.flops import device_peak_flops, mfu
from training_jobs.loader import Prefetcher
from training_jobs.model import ModelConfig, flops_per_token, param_count
from training_jobs.monitor import ROLLBACK, Event, StabilityMonitor, TrainingDiverged
from training_jobs.profiling import StepProfiler
from training_jobs.reporting import (
    SUMMARY_FORMAT,
    Reporter,
    Stopwatch,
    flatten,
    open_pipes,
    peak_memory_gib,
    progress_line,
    throughput,
    write_json_atomic,
)
from training_jobs.schedule import warmup_problem
from training_jobs.settings import RunConfig, profile_window_problem, schedule_too_short
from training_jobs.setup import (
    Dist,
    TokenizerMismatch,
    UnsharedFolder,
    broadcast_object,
    build_engine,
    check_layout,
    check_shared_folder,
    check_tokenizer,
    data_shard,
    deepspeed_config,
    default_environment,
    init_distributed,
    objective_for,
    open_data,
    pin_data_versions,
    resolve_compile,
    resolve_layout,
    resolve_precision,
)
from training_jobs.step import FaultInjector, StepFigures, current_lr, evaluate, refresh_lr, train_step


@dataclass
class Host:
    """What a process manager around the entry point adds (the Ray launcher, training_jobs/ray_launch.py); the
    deepspeed launcher and torchrun need none of it."""

    pipes: Any = None  # rank 0's Pipes messages go here instead of through Pipes' own channel
    after_checkpoint: Callable[[int, Path], None] | None = None  # on every rank, after each complete checkpoint
    owns_process_group: bool = True  # False: the host set up torch.distributed and tears it down


# -------------------------------------------------------------------------------------------- the run

@dataclass
class Progress:
    """Where the run stands (the counters also go into checkpoints, see Trainer.kiln_state)."""

    step: int = 0
    tokens_seen: int = 0  # tokens of the optimizer steps that count (a rollback takes them back)
    tokens_skipped: int = 0  # tokens of data skipped by rollbacks
    last_checkpoint: Path | None = None
    resumed_from: str | None = None
    timings: list[float] = field(default_factory=list)  # seconds per step in this process
    profiled: list[float] = field(default_factory=list)  # ... of the steps under training.profile_steps, apart
    last_loss: float | None = None


@dataclass
class Launched:
    """An optimizer step whose work is queued on the device; its figures are not read yet."""

    step: int
    lr: float
    tokens_seen: int
    figures: StepFigures
    loader_after: dict[str, Any]  # the loader's position after this step's batches: a rollback rewinds to it
    started: float  # perf_counter when the step was launched ...
    queued: float  # ... and when its work was all queued (on CPU: done)


# What restarting the run cannot change: its inputs refused, on every rank alike (the shards, among them a version
# materialized again since the run was set up, the tokenizer file, the base checkpoint, or a checkpoint in its folder
# that is another run's: another model, tokenizer or number of ranks; the message says what to do), or a checkpoint
# folder the ranks do not all see (machines without a shared filesystem). A launcher that restarts failed workers (Ray
# Train) stops at the first.
REFUSALS = (ShardError, TokenizerMismatch, BaseCheckpointError, checkpoint.CheckpointMismatch, UnsharedFolder)

KEPT, REJECTED, ROLLED_BACK = "kept", "rejected", "rolled back"  # what the monitor's judgement did to a step


class Trainer:
    """One run's components; `fit()` is the training loop."""

    def __init__(self, run: RunConfig, dist: Dist, report: Reporter, host: Host | None = None):
        # Where the run's wall time went, besides the steps (p.timings), from here: the layout, the data, the engine
        # and a base checkpoint to consolidate are the run's startup as much as resuming is (goodput counts them).
        self.stopwatch = Stopwatch()
        self.stopwatch.start()
        with self.stopwatch.timing("startup"):
            self._build(run, dist, report, host)

    def _build(self, run: RunConfig, dist: Dist, report: Reporter, host: Host | None) -> None:
        t = self.t = run.training
        self.run, self.dist, self.report, self.host = run, dist, report, host or Host()
        self.shard = data_shard(dist, t)  # refuses a layout that does not fit the world, before anything is read
        check_tokenizer(run)
        check_shared_folder(dist, run.checkpoint_dir())  # before a step is trained that no checkpoint could keep
        run = pin_data_versions(run, dist)  # one version of each shard set for every rank and split
        # The ZeRO stage, micro-batch and grad_accum the settings leave open, chosen for this device (layout.py)
        run, self.layout = resolve_layout(run, dist, self.shard)
        self.run, self.t = run, run.training
        t = self.t
        torch.manual_seed(t.seed)
        # Read ahead on a thread; the checkpoints store the position of the batches trained on.
        train, self.val = open_data(run, dist, self.shard)
        self.loader = Prefetcher(train, depth=2, device=dist.device)
        self.objective = objective_for(run, self.shard)
        self.seq_len = self.loader.seq_len
        self.long_document_share = self.loader.long_document_share(self.seq_len)
        self.cfg = ModelConfig(**t.model.architecture(self.loader.shard_set.vocab_size, self.seq_len))
        check_layout(t, self.cfg)
        self.max_steps = t.resolved_max_steps(self.shard.world_size, self.seq_len)
        if short := schedule_too_short(t.schedule.total_steps, self.max_steps):  # max_steps from a token budget
            raise ValueError(short)
        if problem := profile_window_problem(t.profile_steps, self.max_steps):  # likewise
            raise ValueError(problem)
        self.total_steps = t.schedule.total_steps or self.max_steps
        self.tokens_per_step = t.tokens_per_step(self.shard.world_size, self.seq_len)
        self.precision = resolve_precision(t.precision)
        self.ds_config = deepspeed_config(t, self.precision, self.cfg)
        self.monitor = StabilityMonitor(t.monitor)
        base = None
        if run.base_checkpoint:  # continued pretraining: the base's weights, checked, then only its description kept
            base = load_base(run.base_checkpoint)
            check_compatible(base, self.cfg, run.tokenizer_sha256)
        self.base = base.describe() if base else None
        self.compiled, self.compile_why = resolve_compile(t)
        self.engine = build_engine(self.cfg, t, self.ds_config, self.total_steps, self.monitor, base,
                                   compiled=self.compiled)
        del base
        self.device_name, self.peak = device_peak_flops(t.peak_tflops)
        self.flops_per_token = flops_per_token(self.cfg, self.seq_len)
        self.n_params, self.n_non_embedding = param_count(self.cfg), param_count(self.cfg, non_embedding=True)
        self.ckpt_root = run.checkpoint_dir()
        self.progress = Progress()
        self.fault = FaultInjector(os.environ.get("KILN_INJECT_FAULT"))
        # Checkpoint files are written on a thread (every rank; its host's ranks share the memory for the copies:
        # torchrun and Ray Train say how many in LOCAL_WORLD_SIZE, the deepspeed launcher in LOCAL_SIZE) and hashed
        # on another (rank 0; idle elsewhere).
        local_ranks = int(os.environ.get("LOCAL_WORLD_SIZE") or os.environ.get("LOCAL_SIZE") or 1)
        self.writer = checkpoint.BackgroundWriter(local_ranks)
        self.manifests = checkpoint.ManifestWriter()
        self.unreported: list[tuple[int, Path]] = []  # checkpoints not yet handed to host.after_checkpoint
        self.stalls: list[float] = []  # seconds each save held the loop up
        self.profiler = StepProfiler(t.profile_steps, Path(run.output_dir), active=dist.main)

    # ------------------------------------------------------------------ the loop

    def fit(self) -> float | None:
        """Train to max_steps (resuming if a checkpoint exists), then checkpoint, validate and export."""
        t, p = self.t, self.progress
        with self.stopwatch.timing("startup"):
            self.resume()
            self.start_tracking()
        self.tokens_at_start = p.tokens_seen
        self.profiler.resume_from(p.step)  # a window the earlier launch began: the rest of it
        self.cadence = self.checkpoint_cadence()
        if self.base is not None and p.step == 0:  # the base's loss on this run's held-back tokens, before any update
            self.base_val = self.validate(0)
        self.t_start, self.first_step, self.last_ready = time.perf_counter(), p.step, -math.inf
        # The monitor judges each step one step late: step k is launched, then step k-1's figures are read (done by
        # then, and the device has step k queued behind them). Before anything keeps a step (validation, a
        # checkpoint, the end) the loop drains: the step's own figures are read and judged first, so a spike or NaN
        # rolls back before it can reach a checkpoint. When step k-1 is rolled back, step k has run too, on weights
        # the rollback discards: its work is dropped and the loader rewound to the end of step k-1's batches, so the
        # data skipped (tokens_skipped, the event's skipped_steps) is exactly that of the steps from the checkpoint to
        # the bad one, as if it had been judged at once.
        pending: Launched | None = None  # the newest step, not judged yet
        while p.step < self.max_steps:
            self.profiler.before_launch(p.step + 1)
            launched = self.launch()
            self.profiler.after(p.step)
            if pending is not None and self.settle(pending) == ROLLED_BACK:
                pending = None
                continue
            pending = launched
            validate_now = bool(t.val_every_steps) and p.step % t.val_every_steps == 0
            save_now = self.cadence.due(p.step, time.monotonic())  # every rank, every step: see Cadence
            if validate_now or save_now or p.step == self.max_steps:
                verdict, pending = self.settle(pending), None  # drain: judged before it is kept
                if verdict != KEPT:
                    continue
            if validate_now:
                self.validate(p.step)
            if save_now:
                self.save()
        self.train_seconds = time.perf_counter() - self.t_start
        self.loader.close()
        with self.stopwatch.timing("profile"):  # training.profile_steps' table and trace, once the loop is done
            self.profiler.report()
        # Once per run, however long: the last save, and waiting until every checkpoint is written and hashed (the
        # export and summary need the last one complete). Its own part of the wall time, apart from the cadence's.
        with self.stopwatch.timing("final_checkpoint"):
            if p.last_checkpoint is None or p.last_checkpoint.name != checkpoint.tag_for(p.step):
                self._save()
            self.report_complete_checkpoints()
        self.final_val = self.validate(part="final_validation")
        self.probe = self.loss_probe()
        self.export()
        self.stopwatch.stop()
        return self.final_val["loss"] if self.final_val else None

    def close(self) -> None:
        """Stop the prefetch thread and end the background writers once their jobs are done (a diverged or failed
        run may still be writing a checkpoint)."""
        self.loader.close()
        self.writer.close()
        self.manifests.close()

    def launch(self) -> Launched:
        """Queue one optimizer step; nothing here waits for the device."""
        p = self.progress
        started = time.perf_counter()
        lr = current_lr(self.engine)  # the LR of this update (the scheduler moves on inside the step)
        loss = train_step(self.engine, self.loader, self.t.grad_accum, p.step + 1, self.fault, self.objective)
        figures = StepFigures(loss, self.engine.get_global_grad_norm())
        p.step, p.tokens_seen = p.step + 1, p.tokens_seen + self.tokens_per_step
        return Launched(p.step, lr, p.tokens_seen, figures, self.loader.state_dict(), started, time.perf_counter())

    def settle(self, done: Launched) -> str:
        """Read a launched step's figures, let the monitor judge them and report the step: KEPT, REJECTED (an anomaly
        with no checkpoint to return to: the LR is lowered and the step not reported) or ROLLED_BACK."""
        t, p, report = self.t, self.progress, self.report
        loss, grad_norm = done.figures.read()
        # Seconds per step: from its launch (or the previous step's end, if later) to its figures on the host; on
        # CPU the step ended when its work was queued.
        ready = max(done.queued, time.perf_counter()) if done.figures.asynchronous else done.queued
        dt, self.last_ready = ready - max(done.started, self.last_ready), ready
        event = self.monitor.observe(done.step, loss, grad_norm, phase=self.loader.phase_at(done.loader_after))
        if event is not None and event.action == ROLLBACK:
            return ROLLED_BACK if self.roll_back(event, done.loader_after) else REJECTED
        if event is not None:
            report.event(event)
        # a profiled step is slower than the others: kept out of the step throughput, not out of the wall time
        (p.profiled if self.profiler.covers(done.step) else p.timings).append(dt)
        p.last_loss = loss
        tokens_per_s = self.tokens_per_step / dt
        metrics = {"train/loss": loss, self.objective.loss_name: loss, "train/grad_norm": grad_norm,
                   "train/lr": done.lr,
                   "train/tokens_per_s": tokens_per_s, "train/tokens_seen": done.tokens_seen,
                   "train/mfu": mfu(self.flops_per_token, tokens_per_s, self.peak, self.dist.world_size),
                   "train/peak_memory_gib": peak_memory_gib()}
        log_now = done.step % t.log_every_steps == 0 or done.step == self.max_steps
        report.step(done.step, metrics, to_mlflow=log_now)  # metrics.jsonl is written when MLflow is
        if log_now:
            pace = (time.perf_counter() - self.t_start) / max(done.step - self.first_step, 1)  # s/step, all in
            report.line(progress_line(done.step, self.max_steps, metrics, dt, pace * (self.max_steps - done.step)))
        return KEPT

    # ------------------------------------------------------------------ components

    def kiln_state(self) -> dict[str, Any]:
        p = self.progress
        return {"tokens_seen": p.tokens_seen, "tokens_skipped": p.tokens_skipped, "last_loss": p.last_loss,
                "loader": self.loader.state_dict(),
                "monitor": self.monitor.state_dict(), "mlflow_run_id": self.report.mlflow_run_id}

    def checkpoint_cadence(self) -> checkpoint.Cadence:
        c = self.t.checkpoint
        return checkpoint.Cadence(c.every_steps, c.every_minutes, self.t.log_every_steps, time.monotonic(),
                                  agree=lambda wanted: bool(broadcast_object(self.dist, wanted)))

    def save(self) -> None:
        """A checkpoint at the cadence: the stopwatch's "checkpoint" part."""
        with self.stopwatch.timing("checkpoint"):
            self._save()

    def _save(self) -> None:
        """Write a checkpoint: every rank's files on its BackgroundWriter's thread, then rank 0's ManifestWriter
        completes it (hashes, manifest, rotation), both in the background. The seconds this call held the loop up
        (copying the state to host memory, mostly) are its stall; callers time it inside a stopwatch part, so the
        stalls never add up to more than the parts."""
        p = self.progress
        start = time.perf_counter()
        self.report.flush()  # metrics.jsonl holds every step a checkpoint holds
        if self.unreported:  # the previous checkpoint has had a whole interval to complete
            self.report_complete_checkpoints()
        meta = {"model": self.cfg.to_dict(), "tokens_seen": p.tokens_seen, "loader": self.loader.state_dict(),
                "stability_events": len(self.monitor.events), "layout": self.layout_record(), **self.trained_on()}
        synchronous_before = self.writer.synchronous_because
        p.last_checkpoint = checkpoint.save(self.engine, self.ckpt_root, p.step, self.kiln_state(),
                                            self.t.checkpoint.keep_last, meta, self.manifests, self.writer)
        self.unreported.append((p.step, p.last_checkpoint))
        self.cadence.saved(time.monotonic())
        stall = time.perf_counter() - start
        self.stalls.append(stall)
        self.report.step(p.step, {"checkpoint/stall_s": stall}, to_mlflow=True)
        self.report.line(f"step {p.step}: checkpoint {p.last_checkpoint} (training waited {stall:.2f} s; written "
                         f"and hashed in the background)")
        if self.writer.synchronous_because != synchronous_before:
            self.report.line(f"warning: checkpoint file written before training went on: "
                             f"{self.writer.synchronous_because}")

    def report_complete_checkpoints(self) -> None:
        """Wait for this rank's pending writes and rank 0's pending manifests, then hand the now complete checkpoints
        to the host (on every rank: a host's report may be collective, as Ray Train's is)."""
        self.writer.wait()  # this rank's files
        if self.dist.main:
            self.manifests.wait()  # every rank's, hashed
        for step, path in self.unreported:
            if self.host.after_checkpoint is not None:
                self.host.after_checkpoint(step, path)
        self.unreported = []

    def layout_record(self) -> dict[str, Any]:
        """The layout and why (layout.py), with the ZeRO stage the engine runs (the JSON's when none was chosen)."""
        return {**self.layout.to_dict(), "zero_stage": self.ds_config["zero_optimization"].get("stage")}

    def trained_on(self) -> dict[str, Any]:
        """What a later continued run checks and replays from (training_jobs.base reads it back)."""
        return {"tokenizer_sha256": self.run.tokenizer_sha256, "dataset_dir": self.run.dataset_dir,
                "dataset_data_version": self.run.dataset_data_version, "base_checkpoint": self.base}

    def newest_checkpoint(self) -> checkpoint.Found | None:
        found, refused = None, None
        if self.dist.main:
            self.manifests.wait()  # a checkpoint still being hashed is complete soon, not one to move aside
            try:
                found = checkpoint.find_resumable(self.ckpt_root, warn=self.report.line)
            except checkpoint.CheckpointFormatError as exc:  # every rank stops with it, none waits for rank 0
                refused = str(exc)
        found, refused = broadcast_object(self.dist, (found, refused))
        if refused:
            raise checkpoint.CheckpointFormatError(refused)
        return found

    def load(self, found: checkpoint.Found) -> dict[str, Any]:
        state = checkpoint.load(self.engine, self.ckpt_root, found)
        p = self.progress
        p.step, p.tokens_seen, p.last_checkpoint = found.step, state["tokens_seen"], found.path
        return state

    def resume(self) -> None:
        if not self.t.checkpoint.resume:
            if checkpoint.checkpoints(self.ckpt_root, complete_only=False):
                raise FileExistsError(
                    f"{self.ckpt_root} already holds checkpoints and checkpoint.resume is false: a new run there would "
                    f"mix with them (rotation, rollbacks); set checkpoint.resume: true to continue that run, or give "
                    f"this one another output_dir / checkpoint.dir")
            return
        found = self.newest_checkpoint()
        if found is None:
            return
        problem = checkpoint.not_this_run(found.path, self.cfg.to_dict(), self.run.tokenizer_sha256,
                                          self.dist.world_size) if self.dist.main else None
        if problem := broadcast_object(self.dist, problem):
            raise checkpoint.CheckpointMismatch(problem)
        state = self.load(found)
        # A rollback to this checkpoint that no later checkpoint holds yet (the run died after it): its state, so the
        # data it skipped stays skipped and the rollback counted, its LR reduction in force
        rolled_back = checkpoint.rollback_record(self.ckpt_root, found) if self.dist.main else None
        if rolled_back := broadcast_object(self.dist, rolled_back):
            state = {**state, **rolled_back}
            self.report.line(f"resuming as rolled back to {found.path.name} (the rollback recorded after it)")
        self.loader.load_state_dict(state["loader"])
        self.monitor.load_state_dict(state["monitor"])
        self.progress.tokens_skipped, self.progress.resumed_from = state["tokens_skipped"], str(found.path)
        self.progress.last_loss = state["last_loss"]
        self.resume_run_id = state["mlflow_run_id"]
        refresh_lr(self.engine)
        self.report.line(f"resumed from {found.path} at step {found.step}")

    def roll_back(self, event: Event, loader_after: dict[str, Any]) -> bool:
        """Back to the last good checkpoint in a fresh engine; the data between that checkpoint and the spike is
        skipped (the loader stands after the spike step's batches, `loader_after`); the LR is lowered for a while.
        False when there is no checkpoint to return to: then only the LR is lowered."""
        with self.stopwatch.timing("rollback"):
            return self._roll_back(event, loader_after)

    def _roll_back(self, event: Event, loader_after: dict[str, Any]) -> bool:
        found = self.newest_checkpoint()
        if found is None:
            if event.kind == "nan":
                raise TrainingDiverged(f"{event.message} before the first checkpoint, so there is nothing to roll "
                                       f"back to; lower schedule.lr or raise warmup_steps (and checkpoint earlier)")
            self.monitor.reduce_lr_without_rollback(event, next_step=self.engine.lr_scheduler.last_epoch)
            refresh_lr(self.engine)  # the next update's LR was set before the spike was judged
            self.report.event(event)
            return False
        del self.engine
        gc.collect()
        self.engine = build_engine(self.cfg, self.t, self.ds_config, self.total_steps, self.monitor,
                                   compiled=self.compiled)
        spike_step = event.step
        state = self.load(found)
        self.monitor.rolled_back(event, found.step, state["monitor"])  # raises TrainingDiverged when out of retries
        self.progress.tokens_skipped += (spike_step - found.step) * self.tokens_per_step
        if self.loader.state_dict() != loader_after:  # the step after the spike read on: its batches are read again
            self.loader.load_state_dict(loader_after)
        refresh_lr(self.engine)
        if self.dist.main:  # until the next checkpoint, what a run that dies meanwhile resumes from (see resume)
            checkpoint.record_rollback(self.ckpt_root, found, self.kiln_state())
        self.report.event(event)
        self.report.line(f"rolled back to step {found.step} ({found.path.name}); skipping the data of steps "
                         f"{found.step + 1}..{spike_step}; LR x{event.lr_factor} until step {event.lr_reduced_until}")
        return True

    @torch.no_grad()
    def loss_probe(self) -> dict[str, Any] | None:
        """The trained model's loss on one held-back sequence, recorded with the sequence itself: the checkpoint
        asset reloads the export and must reproduce it (a check that fails when the saved weights are not the
        trained ones). Every rank runs the forward (ZeRO-3 gathers parameters collectively); rank 0's is kept."""
        if self.val is None:
            return None
        self.val.load_state_dict({**self.val.state_dict(), "epoch": 0, "position": 0})
        x, y = (t[:1] for t in self.val.next_batch())
        if self.engine.pipeline_parallelism:
            from training_jobs.pipeline import probe_loss

            loss = probe_loss(self.engine, x, y)
        else:
            self.engine.eval()
            with torch.compiler.set_stance("force_eager"):  # one forward at batch 1: not worth compiling a graph for
                loss = self.engine(x.to(self.engine.device), y.to(self.engine.device)).float().item()
            self.engine.train()
        return {"inputs": x[0].tolist(), "targets": y[0].tolist(), "loss": loss}

    def validate(self, log_at_step: int | None = None, part: str = "validation") -> dict[str, Any] | None:
        """Validation loss and perplexity by position, timed as the stopwatch's `part`; logged as a step's metrics
        when log_at_step is given (the final figures go out with the summary instead)."""
        with self.stopwatch.timing(part):
            result = evaluate(self.engine, self.val, self.t.val_batches)
        if result is None:
            return None
        by_position = ", ".join(f"{k} {v:.2f}" for k, v in result["ppl_pos"].items())
        self.report.line(f"step {self.progress.step}: val loss {result['loss']:.4f}; perplexity by position "
                         f"{by_position}")
        if log_at_step is not None:
            self.report.step(log_at_step, {"val/loss": result["loss"],
                                           **{f"val/ppl_pos/{k}": v for k, v in result["ppl_pos"].items()}},
                             to_mlflow=True)
        return result

    def export(self) -> None:
        with self.stopwatch.timing("export"):
            self._export()

    def _export(self) -> None:
        self.exports: dict[str, str] = {}
        if self.dist.main and self.t.export:
            from training_jobs.export import export_checkpoint

            self.exports = export_checkpoint(self.progress.last_checkpoint, Path(self.run.output_dir) / "export",
                                             self.cfg, self.t.export, self.run.tokenizer_dir,
                                             {"steps": self.progress.step, "tokens_seen": self.progress.tokens_seen,
                                              **self.trained_on()})
            self.report.line(f"exported {', '.join(f'{k}: {v}' for k, v in self.exports.items())}")
        torch.distributed.barrier()

    def start_tracking(self) -> None:
        t, cfg = self.t, self.cfg
        params = {**flatten("training", t.model_dump(mode="json")), **flatten("model", cfg.to_dict()),
                  scaling_names.N_PARAMS: self.n_params, "model.n_params_non_embedding": self.n_non_embedding,
                  "model.flops_per_token": self.flops_per_token, "world_size": self.dist.world_size,
                  "tokens_per_step": self.tokens_per_step, "max_steps": self.max_steps, "precision": self.precision,
                  "compile": self.compiled, "compile.why": self.compile_why,
                  "device": self.device_name, "dataset_dir": self.run.dataset_dir,
                  "dataset_data_version": self.run.dataset_data_version,
                  "tokenizer_sha256": self.run.tokenizer_sha256,
                  "data.long_document_token_share": round(self.long_document_share, 4),
                  **flatten("layout", self.layout_record()),
                  **({scaling_names.BASE_CHECKPOINT: self.base["path"], "base_checkpoint.sha256": self.base["sha256"]}
                     if self.base else {}),
                  **({"replay.share": self.run.replay.share, "replay.dataset_dir": self.run.replay.dataset_dir}
                     if self.run.replay else {})}
        artifacts = {"deepspeed_config.json": self.ds_config, "run_config.json": self.run.model_dump(mode="json"),
                     "model_config.json": cfg.to_dict()}
        self.report.start_mlflow(self.run, getattr(self, "resume_run_id", None), params, artifacts)
        todo = (f"steps {self.progress.step + 1}..{self.max_steps} of {self.tokens_per_step:,} tokens"
                if self.progress.step < self.max_steps else f"nothing to train: already at step {self.progress.step}")
        if self.base is not None:
            self.report.line(f"continued pretraining from {self.base['path']} ({self.base['kind']})")
        self.report.line(f"layout: {self.layout_record()['reason']}")
        if problem := warmup_problem(self.t.resolved_schedule(), self.total_steps):  # a warning: a smoke run may
            self.report.line(f"warning: {problem}")  # want it so
        self.report.line(f"training {self.n_params:,} parameters ({self.n_non_embedding:,} non-embedding) on "
                         f"{self.dist.world_size} x {self.device_name} in {self.precision}; {todo}")

    def summary(self, status: str, val_loss: float | None = None, error: str | None = None) -> dict[str, Any]:
        p = self.progress
        if status != "completed":  # fit() waited already when it got to the end
            with contextlib.suppress(Exception):  # a failed write only leaves that checkpoint incomplete
                self.writer.wait()
            if status == "failed":  # only rank 0 gets here: the other ranks may be gone, their files with them
                self.manifests.abandon()
            with contextlib.suppress(Exception):
                self.manifests.wait()
        ckpt = p.last_checkpoint
        manifest = ckpt / checkpoint.MANIFEST if ckpt is not None else None
        figures = throughput(self.tokens_per_step, p.tokens_seen - getattr(self, "tokens_at_start", p.tokens_seen),
                             p.timings, p.profiled, self.stopwatch, self.flops_per_token, self.peak,
                             self.dist.world_size)
        figures["checkpoint_stall"] = {"count": len(self.stalls), "total_s": round(sum(self.stalls), 3),
                                       "max_s": round(max(self.stalls, default=0.0), 3)}
        figures["throughput_of"] = "this launch"
        if not (p.timings or p.profiled) and (earlier := self._summary_of_the_launch_that_trained()) is not None:
            # A launch that trained nothing (the run materialized again after it completed) keeps the figures of the
            # launch that trained, instead of none (kiln plan's own MFU would lose the run).
            figures = {k: earlier.get(k) for k in figures} | {"throughput_of": "an earlier launch"}
        return {
            "format": SUMMARY_FORMAT, "status": status, "error": error,
            "steps": p.step, "max_steps": self.max_steps, "final_loss": p.last_loss, "val_loss": val_loss,
            "val_ppl_pos": (getattr(self, "final_val", None) or {}).get("ppl_pos"), "objective": self.t.objective,
            "base_checkpoint": self.base, "base_val_loss": (getattr(self, "base_val", None) or {}).get("loss"),
            # what the replay loader left out for removal requests (documents, their tokens, sequences skipped)
            "replay": {**self.run.replay.model_dump(exclude={"exclude"}),
                       "excluded": self.loader.source.replay.excluded}
            if self.run.replay else None,
            "long_document_token_share": self.long_document_share,
            # the loader's cursor at the end (the last checkpoint's): what the run read is derived from it after the
            # run (kiln.governance.exposure), instead of logging every document read
            "loader": self.loader.state_dict(),
            "loss_probe": getattr(self, "probe", None),
            "tokens_seen": p.tokens_seen, "tokens_skipped": p.tokens_skipped, "tokens_per_step": self.tokens_per_step,
            # step throughput (tokens_per_s, mfu), goodput over the whole run (from building the trainer) and without
            # its one-time parts, where the time went (reporting.throughput), the checkpoint stall
            **figures,
            "profile": self.profiler.result,  # training.profile_steps: the window, the GPU's busy fraction, files
            "steps_this_run": len(p.timings + p.profiled),
            "train_seconds": round(getattr(self, "train_seconds", 0.0), 3),
            "world_size": self.dist.world_size, "device": self.device_name, "precision": self.precision,
            "compile": {"enabled": self.compiled, "why": self.compile_why},
            "parallelism": {"tp": self.t.parallelism.tp, "pp": self.t.parallelism.pp, "dp": self.shard.world_size,
                            "zero_stage": self.ds_config["zero_optimization"].get("stage")},
            "layout": self.layout_record(),  # the stage and micro-batch, who chose them and why
            # rank 0's peak: device memory allocated on a GPU (what the layout's estimate predicts), RSS on CPU
            "peak_memory_gib": peak_memory_gib(),
            "peak_flops_per_device": self.peak, "n_params": self.n_params,
            "n_params_non_embedding": self.n_non_embedding, "flops_per_token": self.flops_per_token,
            "model": self.cfg.to_dict(), "stability_events": [e.to_dict() for e in self.monitor.events],
            "rollbacks": self.monitor.rollbacks, "mlflow_run_id": self.report.mlflow_run_id,
            "checkpoint": str(ckpt) if ckpt else None, "resumed_from": p.resumed_from,
            "checkpoint_sha256": checkpoint.sha256_file(manifest)
            if manifest is not None and manifest.is_file() else None,
            "exports": getattr(self, "exports", {}),
            "summary_path": str(Path(self.run.output_dir) / "summary.json"),
        }

    def _summary_of_the_launch_that_trained(self) -> dict[str, Any] | None:
        """The run folder's summary.json, when it holds a launch's figures (that launch's that trained, or carried
        over by one that trained nothing)."""
        try:
            earlier = json.loads((Path(self.run.output_dir) / "summary.json").read_text(encoding="utf-8"))
        except (OSError, ValueError):
            return None
        return earlier if earlier.get("tokens_per_s") is not None else None


def main(argv: list[str] | None = None, host: Host | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train a Kiln model on token shards with DeepSpeed.")
    parser.add_argument("--run-config", required=True, type=Path, help="the run config JSON (RunConfig)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help="set by the deepspeed launcher (torchrun sets LOCAL_RANK instead)")
    args = parser.parse_args(argv)
    if args.local_rank is not None:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    run = RunConfig.read(args.run_config)
    default_environment()
    dist = init_distributed()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if dist.main:
        Path(run.output_dir).mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        host = host or Host()
        report = Reporter(run, dist, host.pipes if host.pipes is not None else open_pipes(dist, stack))
        trainer = None
        try:
            trainer = Trainer(run, dist, report, host)
            val_loss = trainer.fit()
            summary = trainer.summary("completed", val_loss)
        except TrainingDiverged as exc:
            if trainer is None:
                raise
            summary = trainer.summary("diverged", error=str(exc))
        except Exception:
            report.flush()  # the steps before the failure stay in metrics.jsonl
            if dist.main:  # the launching asset reads why from summary.json
                error = traceback.format_exc(limit=5)
                failed = (trainer.summary("failed", error=error) if trainer is not None else
                          {"format": SUMMARY_FORMAT, "status": "failed", "error": error, "stability_events": []})
                write_json_atomic(Path(run.output_dir) / "summary.json", failed)
                if trainer is not None:
                    report.finish(failed, failed=True)
            raise
        finally:
            if trainer is not None:
                trainer.close()
        if dist.main:
            write_json_atomic(Path(run.output_dir) / "summary.json", summary)
            report.finish(summary, failed=summary["status"] != "completed")
            report.line(f"done: {summary['status']}, {summary['steps']} steps, final loss {summary['final_loss']}, "
                        f"val loss {summary['val_loss']}; summary {Path(run.output_dir) / 'summary.json'}")
    torch.distributed.barrier()
    if host.owns_process_group:
        torch.distributed.destroy_process_group()
    return 0 if summary["status"] == "completed" else 3


def exit_now(code: int) -> None:
    """End a rank whose work is done and written without Python's teardown. The teardown frees DeepSpeed's and
    torch's objects in whatever order it finds them while gloo's threads still run: a 2-rank CPU run ended in SIGABRT
    ("terminate called without an active exception") after its summary was written, once in seven test suites, and its
    collections took 2.1 s per rank on the 2-core VM. The files are closed by then; logging and stdio are flushed
    here. torch's compile workers watch their parent and leave with it."""
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    exit_now(main())  # a failure raises out of main() instead, through Python's own exit and torchrun's error file
