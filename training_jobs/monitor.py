"""Training stability monitor: loss spikes, gradient explosions, NaN/Inf, plateaus.

A pure class fed numbers, one call per optimizer step (the train loop feeds each step's figures a step late, so
as not to wait for the device, and every step's before it is validated or checkpointed); the loop acts on what it
returns:

    event = monitor.observe(step, loss, grad_norm)
    if event and event.action == "rollback": ...   # restore the last good checkpoint, skip the data since
                                                    # then, and scale the LR by lr_factor for a while

The response follows PaLM (Chowdhery et al. 2022, Sec. 5.1): restart from a checkpoint before the spike and
skip the batches that were fed in between. Every event is kept (`monitor.events`) and goes into the
checkpoint's client_state, summary.json and MLflow. Rollbacks are bounded: past `max_rollbacks` the
monitor raises `TrainingDiverged`.

Spikes are judged against the rolling mean of recent *healthy* steps (an anomalous step never enters the
window), and only once `min_history` healthy steps are in it. NaN/Inf is judged from the first step.

A level is not a spike. The reference starts again (empty windows) when the data enters another curriculum phase
(`observe(..., phase=)`: a harder phase's loss is judged against that phase's steps), and a loss that stays over the
threshold for `min_history` consecutive steps, steady (within half the spike margin, and not rising) and with healthy
gradients, is taken as the new level when rollbacks are off (`rollback: false`, events only): one `level_shift`
event, and those steps become the window. A NaN never is. With rollbacks on, no level is accepted: a spike rolls
back before it can reach a checkpoint, and before the first checkpoint a diverging loss that holds for a while
must not become the reference the first checkpoint is judged by.
Consecutive anomalies of one kind are one record in `events` (`repeats`, `last_step`), so a long stretch of them does
not grow every checkpoint and summary.
"""

from __future__ import annotations

import math
from collections import deque
from dataclasses import asdict, dataclass, replace
from typing import Any

from training_jobs.settings import MonitorSettings

STATE_FORMAT = "kiln-monitor/1"
ROLLBACK, WARN = "rollback", "warn"


class TrainingDiverged(RuntimeError):
    """Training cannot continue: too many rollbacks, or a NaN with no checkpoint to return to."""


@dataclass
class Event:
    step: int
    kind: str  # "nan" | "loss_spike" | "grad_explosion" | "plateau"
    action: str  # "rollback" | "warn"; the train loop may downgrade a rollback it cannot do to "warn"
    loss: float
    grad_norm: float | None
    reference: float | None  # the rolling mean (or earlier window mean) it was judged against
    threshold: float | None
    message: str
    rollback_to: int | None = None  # filled in when a rollback happened
    skipped_steps: int | None = None  # optimizer steps of data skipped
    lr_factor: float | None = None
    lr_reduced_until: int | None = None
    repeats: int = 0  # further consecutive steps of the same kind this record stands for (in `events`)
    last_step: int | None = None  # the last of them

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def _finite(x: float | None) -> bool:
    return x is None or math.isfinite(x)


class StabilityMonitor:
    def __init__(self, settings: MonitorSettings | None = None):
        self.settings = settings = settings or MonitorSettings()
        self.losses: deque[float] = deque(maxlen=settings.window)
        self.grad_norms: deque[float] = deque(maxlen=settings.window)
        self.plateau_losses: deque[float] = deque(maxlen=2 * settings.plateau_window)
        self.events: list[Event] = []
        self.rollbacks = 0
        self.lr_scale_until = -1  # LR is scaled by lr_factor for steps < this
        self._last_plateau_step = -(10**12)
        self.phase: Any = None  # the curriculum phase the windows were filled in
        # consecutive loss spikes with healthy gradients: (loss, grad norm) of each, a new level if they last
        self.over: deque[tuple[float, float | None]] = deque(maxlen=settings.min_history)
        self._run: Event | None = None  # the record of the current run of consecutive anomalies

    # -- judging

    def observe(self, step: int, loss: float, grad_norm: float | None = None, phase: Any = None) -> Event | None:
        """Judge one optimizer step. Healthy steps enter the rolling windows; an anomaly is returned (and
        recorded) and does not. `phase`: the curriculum phase the step's data came from (None: not known); when it
        changes, the windows start again."""
        s = self.settings
        if not s.enabled:
            return None
        if phase is not None and phase != self.phase:
            if self.phase is not None:
                self._clear_windows()
            self.phase = phase
        event = None
        if not (math.isfinite(loss) and _finite(grad_norm)):
            event = Event(step, "nan", self._action(), loss, grad_norm, None, None,
                          f"non-finite loss {loss} / grad norm {grad_norm} at step {step}")
        elif len(self.losses) >= s.min_history:
            mean_loss = sum(self.losses) / len(self.losses)
            mean_grad = sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else None
            if loss > s.spike_factor * mean_loss:
                event = Event(step, "loss_spike", self._action(), loss, grad_norm, mean_loss,
                              s.spike_factor * mean_loss,
                              f"loss {loss:.4f} at step {step} is {loss / mean_loss:.2f}x the mean of the last "
                              f"{len(self.losses)} steps ({mean_loss:.4f}); threshold {s.spike_factor}x")
            elif grad_norm is not None and mean_grad and grad_norm > s.grad_factor * mean_grad:
                event = Event(step, "grad_explosion", self._action(), loss, grad_norm, mean_grad,
                              s.grad_factor * mean_grad,
                              f"grad norm {grad_norm:.4g} at step {step} is {grad_norm / mean_grad:.1f}x the mean "
                              f"of the last {len(self.grad_norms)} steps ({mean_grad:.4g}); threshold {s.grad_factor}x")
        if event is None and grad_norm is not None and s.grad_norm_max is not None and grad_norm > s.grad_norm_max:
            event = Event(step, "grad_explosion", self._action(), loss, grad_norm, None, s.grad_norm_max,
                          f"grad norm {grad_norm:.4g} at step {step} is above grad_norm_max {s.grad_norm_max}")
        if event is not None:
            return self._anomaly(event)
        self.over.clear()
        self._run = None
        self.losses.append(loss)
        if grad_norm is not None:
            self.grad_norms.append(grad_norm)
        return self._check_plateau(step, loss)

    def _anomaly(self, event: Event) -> Event:
        """Record an anomaly (one record per run of consecutive ones of a kind), or accept a lasting level."""
        s = self.settings
        mean_grad = sum(self.grad_norms) / len(self.grad_norms) if self.grad_norms else None
        healthy_grad = event.grad_norm is None or mean_grad is None or event.grad_norm <= s.grad_factor * mean_grad
        if event.kind == "loss_spike" and healthy_grad:
            self.over.append((event.loss, event.grad_norm))
        else:
            self.over.clear()
        levels = [loss for loss, _ in self.over]
        if not s.rollback and len(levels) == s.min_history and _steady(levels, s.spike_factor):
            return self._new_level(event, levels)
        if self._run is not None and self._run.kind == event.kind:
            self._run.repeats += 1
            self._run.last_step = event.step
        else:
            self.events.append(event)
            self._run = event
            return event
        return replace(event)  # the loop may act on it (a lower LR); the record above stands for it

    def _new_level(self, event: Event, levels: list[float]) -> Event:
        level = sum(levels) / len(levels)
        shift = Event(event.step, "level_shift", WARN, event.loss, event.grad_norm, event.reference, None,
                      f"loss stayed at {level:.4f} for {len(levels)} steps to step {event.step} (the reference was "
                      f"{event.reference:.4f}), steady and with healthy gradients: taken as the new level, the "
                      f"window starts from these steps")
        windows = list(self.over)
        self._clear_windows()
        self.losses.extend(levels)
        self.grad_norms.extend(g for _, g in windows if g is not None)
        self.events.append(shift)
        return shift

    def _clear_windows(self) -> None:
        """A new reference: the loss and grad-norm windows, the plateau window and the run of anomalies start
        again."""
        self.losses.clear()
        self.grad_norms.clear()
        self.plateau_losses.clear()
        self.over.clear()
        self._run = None

    def _action(self) -> str:
        return ROLLBACK if self.settings.rollback else WARN

    def _check_plateau(self, step: int, loss: float) -> Event | None:
        """Warn (once per plateau_window) when the mean loss of the last window improved on the one before
        by less than plateau_min_improvement (a fraction)."""
        s, w = self.settings, self.settings.plateau_window
        self.plateau_losses.append(loss)
        if len(self.plateau_losses) < 2 * w or step - self._last_plateau_step < w:
            return None
        history = list(self.plateau_losses)
        before, recent = sum(history[:w]) / w, sum(history[w:]) / w
        improvement = (before - recent) / before if before > 0 else 0.0
        if improvement >= s.plateau_min_improvement:
            return None
        self._last_plateau_step = step
        event = Event(step, "plateau", WARN, loss, None, before, before * (1 - s.plateau_min_improvement),
                      f"loss plateau: mean over steps {step - w + 1}..{step} is {recent:.4f}, over the {w} before "
                      f"{before:.4f} ({improvement:+.2%}, less than {s.plateau_min_improvement:.2%}); consider "
                      f"the LR schedule, the data mixture or stopping")
        self.events.append(event)
        return event

    # -- acting

    def lr_scale(self, step: int) -> float:
        """Multiplier on the scheduled LR at `step` (optimizer steps done): lr_factor after a rollback."""
        return self.settings.lr_factor if step < self.lr_scale_until else 1.0

    def rolled_back(self, event: Event, to_step: int, checkpoint_state: dict[str, Any] | None) -> None:
        """Record a rollback from event.step to a checkpoint at to_step: count it (raising TrainingDiverged
        past max_rollbacks), restore the windows as they were at the checkpoint, keep every event, and
        lower the LR for the next lr_reduced_steps steps."""
        self.rollbacks += 1
        if self.rollbacks > self.settings.max_rollbacks:
            raise TrainingDiverged(
                f"{event.message}; this would be rollback {self.rollbacks}, over monitor.max_rollbacks = "
                f"{self.settings.max_rollbacks}. Training diverged: lower schedule.lr, raise warmup_steps, "
                f"check the data around step {event.step}, or raise monitor.max_rollbacks. If the loss rose for "
                f"good because the data did (harder data, not a curriculum phase of its own), put that data in its "
                f"own mixture phase (the reference starts again there) or set training.monitor.rollback: false "
                f"(a lasting level is then accepted after monitor.min_history steps)")
        if checkpoint_state is not None:
            self._load_windows(checkpoint_state)
        self.over.clear()
        self._run = None  # the steps after the checkpoint are done again: a later anomaly is a new record
        self.lr_scale_until = to_step + self.settings.lr_reduced_steps
        event.rollback_to, event.skipped_steps = to_step, event.step - to_step
        event.lr_factor, event.lr_reduced_until = self.settings.lr_factor, self.lr_scale_until

    def reduce_lr_without_rollback(self, event: Event, next_step: int) -> None:
        """A spike before the first checkpoint: nothing to return to, so only the LR is lowered, for the
        `lr_reduced_steps` updates from `next_step` (the schedule step the next update takes its LR from: the spike
        is judged a step late, so the update after it has run)."""
        event.action = WARN
        self.lr_scale_until = next_step + self.settings.lr_reduced_steps
        event.lr_factor, event.lr_reduced_until = self.settings.lr_factor, self.lr_scale_until

    # -- state (JSON-able: goes into checkpoints and summary.json)

    def state_dict(self) -> dict[str, Any]:
        return {"format": STATE_FORMAT, "losses": list(self.losses), "grad_norms": list(self.grad_norms),
                "plateau_losses": list(self.plateau_losses), "events": [e.to_dict() for e in self.events],
                "rollbacks": self.rollbacks, "lr_scale_until": self.lr_scale_until,
                "last_plateau_step": self._last_plateau_step, "phase": self.phase,
                # a stretch of anomalies under way: the steps over the threshold so far (a level once they last) and
                # its record (always the newest event), so a resumed run judges the stretch as one uninterrupted
                "over": [list(x) for x in self.over],
                "open_record": len(self.events) - 1 if self._run is not None else None}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if state.get("format") != STATE_FORMAT:
            raise ValueError(f"not a monitor state (format {state.get('format')!r}, expected {STATE_FORMAT!r})")
        self._load_windows(state)
        self.events = [Event(**e) for e in state["events"]]
        self.rollbacks = int(state["rollbacks"])
        self.lr_scale_until = int(state["lr_scale_until"])
        # absent from states written before they were kept: the stretch starts again
        self.over = deque((tuple(x) for x in state.get("over", [])), maxlen=self.settings.min_history)
        record = state.get("open_record")
        self._run = self.events[record] if record is not None else None

    def _load_windows(self, state: dict[str, Any]) -> None:
        self.losses = deque(state["losses"], maxlen=self.settings.window)
        self.grad_norms = deque(state["grad_norms"], maxlen=self.settings.window)
        self.plateau_losses = deque(state["plateau_losses"], maxlen=2 * self.settings.plateau_window)
        self._last_plateau_step = int(state["last_plateau_step"])
        self.phase = state.get("phase")  # None in states from before phases were recorded: adopted at the next step


__all__ = ["Event", "ROLLBACK", "StabilityMonitor", "TrainingDiverged", "WARN"]


def _steady(levels: list[float], spike_factor: float) -> bool:
    """A level, not a divergence: within half the spike margin of its lowest step, and not rising (the least-squares
    rise over the steps under a tenth of the spike margin): a loss climbing 1% a step stays within the first over 20
    steps, never within the second."""
    n, mean = len(levels), sum(levels) / len(levels)
    if max(levels) > min(levels) * (1 + (spike_factor - 1) / 2):
        return False
    if n < 2:
        return True
    centre = (n - 1) / 2
    slope = sum((i - centre) * (x - mean) for i, x in enumerate(levels)) / sum((i - centre) ** 2 for i in range(n))
    return slope * (n - 1) <= mean * (spike_factor - 1) / 10
