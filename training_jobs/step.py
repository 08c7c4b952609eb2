"""One optimizer step and what the loop measures around it: the LR helpers, the test-only fault injector
(KILN_INJECT_FAULT), train_step, StepFigures (a step's loss and grad norm, rank 0's on every rank so all ranks take
the same decision, read by the host without stalling the device) and the validation pass (evaluate, perplexity by
position)."""

from __future__ import annotations

import math
import time
from typing import Any

import torch

from training_jobs.loader import Prefetcher, ReplayLoader, ShardLoader
from training_jobs.model import loss_sums_by_position
from training_jobs.objectives import Objective


def refresh_lr(engine) -> None:
    """Set the LR for the next update from the schedule (after a load: it may now include a rollback's
    reduction)."""
    sched = engine.lr_scheduler
    for group, base, fn in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
        group["lr"] = base * fn(sched.last_epoch)


def current_lr(engine) -> float:
    return float(engine.lr_scheduler.optimizer.param_groups[0]["lr"])


class FaultInjector:
    """KILN_INJECT_FAULT="spike@K[xF]" or "nan@K": corrupt the loss of step K once; "hang@K": stop in step K
    so a test can kill the processes mid-step; "slow@MS": sleep MS milliseconds in every step, so a test can
    kill a node while the run is under way (tests only)."""

    def __init__(self, spec: str | None):
        self.kind, self.step, self.factor = None, -1, 100.0
        if spec:
            kind, _, rest = spec.partition("@")
            step, _, factor = rest.partition("x")
            if kind not in ("spike", "nan", "hang", "slow") or not step.isdigit():
                raise ValueError(f"KILN_INJECT_FAULT={spec!r}: expected spike@STEP[xFACTOR], nan@STEP, hang@STEP "
                                 f"or slow@MILLISECONDS")
            self.kind, self.step, self.factor = kind, int(step), float(factor or 100)

    def __call__(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        if self.kind == "slow":
            time.sleep(self.step / 1000)
            return loss
        if step != self.step:
            return loss
        self.step = -1  # once: after a rollback the same step number gets other data
        if self.kind == "hang":
            print(f"KILN_INJECT_FAULT: hanging in step {step}", flush=True)  # a test kills the run on this line
            time.sleep(3600)
        return loss * float("nan") if self.kind == "nan" else loss * self.factor


def train_step(engine, loader: Prefetcher | ShardLoader | ReplayLoader, grad_accum: int, step: int,
               fault: FaultInjector, objective: Objective) -> torch.Tensor:
    """One optimizer step over grad_accum micro-batches; returns the mean loss over every rank as a float64 scalar
    on the device, without waiting for it (the caller reads it a step later, see StepFigures)."""
    if engine.pipeline_parallelism:
        # Every stage reads the batches (only the first and last use them), so all ranks' loaders stay at the same
        # position. DeepSpeed returns the mean over micro-batches and replicas, on every stage. The fault corrupts
        # the reported loss only: the stages run their own backward passes.
        batches = [objective(*loader.next_batch(), step, micro)[:2] for micro in range(grad_accum)]
        return fault(step, engine.train_batch(iter(batches))).detach().to(torch.float64)
    total = torch.zeros((), dtype=torch.float32, device=engine.device)
    d = engine.device
    for micro in range(grad_accum):
        x, y, prefix = objective(*loader.next_batch(), step, micro)
        # non_blocking: the prefetcher's batches are pinned on CUDA, so the copy overlaps the work queued before it
        x, y = x.to(d, non_blocking=True), y.to(d, non_blocking=True)
        loss = fault(step, engine(x, y, None if prefix is None else prefix.to(d, non_blocking=True)))
        engine.backward(loss)  # DeepSpeed divides by grad_accum itself
        engine.step()  # updates only at the accumulation boundary
        total += loss.detach().float()
    torch.distributed.all_reduce(total)
    return total.to(torch.float64) / (grad_accum * torch.distributed.get_world_size())


class StepFigures:
    """A step's loss and grad norm on their way to the host. Rank 0's values are broadcast on the device right after
    the step's work, so every rank reads the same numbers and takes the same decision (rollback or not); on CUDA they
    are then copied into pinned memory asynchronously, behind an event. `read()` waits for that event only: called
    once the next step is queued, it returns as soon as this step is done, and the device never runs dry. On CPU
    everything is synchronous and `read()` returns at once."""

    def __init__(self, loss: torch.Tensor, grad_norm: torch.Tensor | float | None):
        self.has_norm = grad_norm is not None  # None when DeepSpeed computes no norm: the same on every rank
        norm = torch.as_tensor(math.nan if grad_norm is None else grad_norm, device=loss.device)
        values = torch.stack([loss.to(torch.float64).reshape(()), norm.to(torch.float64).reshape(())])
        torch.distributed.broadcast(values, 0)
        self.asynchronous = values.is_cuda
        if self.asynchronous:
            self._host = torch.empty(2, dtype=torch.float64, pin_memory=True)
            self._host.copy_(values, non_blocking=True)
            self._ready = torch.cuda.Event()
            self._ready.record()
        else:
            self._host = values

    def read(self) -> tuple[float, float | None]:
        """(loss, grad norm or None), rank 0's; waits until the step is done on the device."""
        if self.asynchronous:
            self._ready.synchronize()
        loss, norm = self._host.tolist()
        return loss, norm if self.has_norm else None


# Perplexity by position in the window (of the predicted token): a long-context extension should lower the
# far buckets. MLflow metric names allow no "+", hence "4k-up".
POSITION_BUCKETS = (("0-1k", 0, 1024), ("1k-4k", 1024, 4096), ("4k-up", 4096, None))


@torch.no_grad()
def evaluate(engine, val: ShardLoader | None, batches: int | None) -> dict[str, Any] | None:
    """Causal LM loss over the first `batches` validation micro-batches of every rank (the same ones each time),
    whatever the training objective: {"loss": mean, "ppl_pos": {bucket: perplexity}}."""
    if val is None:
        return None
    engine.eval()
    val.load_state_dict({**val.state_dict(), "epoch": 0, "position": 0})
    n = val.batches_per_epoch if batches is None else min(batches, val.batches_per_epoch)
    buckets = [(name, lo, hi) for name, lo, hi in POSITION_BUCKETS if lo < val.seq_len]
    sums = torch.zeros(len(buckets), dtype=torch.float64, device=engine.device)
    counts = torch.zeros(len(buckets), dtype=torch.float64, device=engine.device)

    def add(by_position: torch.Tensor, rows: int) -> None:  # (T,) summed over `rows` sequences
        for i, (_, lo, hi) in enumerate(buckets):
            sums[i] += by_position[lo:hi].sum()
            counts[i] += by_position[lo:hi].numel() * rows

    if engine.pipeline_parallelism:  # the last stage has the sums; the other stages add nothing
        from training_jobs.pipeline import position_sums

        by_position = position_sums(engine, [val.next_batch() for _ in range(n)])
        if by_position is not None:
            add(by_position.to(engine.device), n * val.batch_size)
    else:
        for _ in range(n):
            x, y = val.next_batch()
            add(loss_sums_by_position(engine(x.to(engine.device)), y.to(engine.device)), x.shape[0])
    torch.distributed.all_reduce(sums)
    torch.distributed.all_reduce(counts)
    engine.train()
    return {"loss": (sums.sum() / counts.sum()).item(),
            "ppl_pos": {name: math.exp(min((sums[i] / counts[i]).item(), 50.0))
                        for i, (name, _, _) in enumerate(buckets)}}
