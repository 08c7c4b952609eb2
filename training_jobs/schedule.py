"""Learning-rate schedules as pure functions of the step, wrapped in a torch LambdaLR for DeepSpeed.

`step` is the number of optimizer steps already taken, so the LR of the first update is lr_at(0).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch

from training_jobs.settings import ScheduleSettings


def lr_at(step: int, s: ScheduleSettings, total_steps: int) -> float:
    """The learning rate for the update after `step` updates.

    warmup: linear from lr/warmup_steps up to lr over warmup_steps updates.
    cosine: then half a cosine from lr down to min_lr at total_steps (Loshchilov & Hutter 2017).
    wsd:    then constant lr, and a linear decay to min_lr over the last decay_fraction of total_steps
            (warmup-stable-decay, Hu et al. 2024, MiniCPM); a run can be extended before its decay starts.
    After total_steps: min_lr.
    """
    if step < s.warmup_steps:
        return s.lr * (step + 1) / s.warmup_steps
    if step >= total_steps:
        return s.min_lr
    if s.kind == "cosine":
        progress = (step - s.warmup_steps) / max(1, total_steps - s.warmup_steps)
        return s.min_lr + 0.5 * (1 + math.cos(math.pi * progress)) * (s.lr - s.min_lr)
    decay_start = max(s.warmup_steps, total_steps - round(s.decay_fraction * total_steps))
    if step < decay_start:
        return s.lr
    progress = (step - decay_start) / max(1, total_steps - decay_start)
    return s.lr + progress * (s.min_lr - s.lr)


def warmup_problem(s: ScheduleSettings, total_steps: int) -> str | None:
    """Why this schedule never does what its settings say, if it does not: a warmup as long as the run."""
    if s.warmup_steps < total_steps:
        return None
    return (f"the warmup ({s.warmup_steps} steps) is not shorter than the schedule's {total_steps} steps: the learning "
            f"rate never reaches training.schedule.lr {s.lr:g} (it ends at {lr_at(total_steps - 1, s, total_steps):g}) "
            f"and never decays; lower schedule.warmup_steps (or rewarmup_steps) below the run's steps")


def lambda_lr(optimizer: torch.optim.Optimizer, s: ScheduleSettings, total_steps: int,
              scale: Callable[[int], float] = lambda step: 1.0) -> torch.optim.lr_scheduler.LambdaLR:
    """A LambdaLR (every param group's base lr is s.lr) whose factor also takes `scale(step)` (the stability
    monitor's LR reduction after a rollback). Its state is only the step count, which DeepSpeed checkpoints."""
    for group in optimizer.param_groups:
        group["lr"] = s.lr
    return torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: lr_at(step, s, total_steps) / s.lr * scale(step))


__all__ = ["lambda_lr", "lr_at"]
