"""The stability monitor as a pure class, fed numbers."""

from __future__ import annotations

import json
import math

import pytest

from training_jobs.monitor import ROLLBACK, WARN, StabilityMonitor, TrainingDiverged
from training_jobs.settings import MonitorSettings

SETTINGS = MonitorSettings(window=5, min_history=3, spike_factor=1.5, grad_factor=10, plateau_window=4,
                           plateau_min_improvement=0.01, max_rollbacks=2, lr_factor=0.5, lr_reduced_steps=10)


def feed(monitor: StabilityMonitor, losses, grads=None, start: int = 1):
    grads = grads or [1.0] * len(losses)
    return [monitor.observe(start + i, loss, g) for i, (loss, g) in enumerate(zip(losses, grads))]


def test_a_smooth_decreasing_run_raises_nothing():
    monitor = StabilityMonitor(SETTINGS)
    assert feed(monitor, [5.0 - 0.05 * i for i in range(40)]) == [None] * 40
    assert monitor.events == []


def test_loss_spike_against_the_rolling_mean():
    monitor = StabilityMonitor(SETTINGS)
    feed(monitor, [3.0, 3.0, 3.0, 3.0])
    event = monitor.observe(5, 4.6, 1.0)  # 1.53x the mean of 3.0
    assert event.kind == "loss_spike" and event.action == ROLLBACK
    assert event.reference == pytest.approx(3.0) and event.threshold == pytest.approx(4.5)
    assert "1.53x the mean of the last 4 steps" in event.message
    assert monitor.observe(6, 4.4, 1.0) is None  # below 1.5x: healthy
    assert 4.6 not in monitor.losses  # an anomaly never enters the window


def test_no_spike_judgement_before_min_history():
    monitor = StabilityMonitor(SETTINGS)
    assert feed(monitor, [3.0, 30.0]) == [None, None]


def test_nan_and_inf_are_caught_from_the_first_step():
    monitor = StabilityMonitor(SETTINGS)
    assert monitor.observe(1, math.nan, 1.0).kind == "nan"
    assert monitor.observe(2, 3.0, math.inf).kind == "nan"
    assert len(monitor.losses) == 0


def test_gradient_explosion():
    monitor = StabilityMonitor(SETTINGS)
    feed(monitor, [3.0] * 4, [1.0, 1.2, 0.8, 1.0])
    event = monitor.observe(5, 3.0, 25.0)
    assert event.kind == "grad_explosion" and event.reference == pytest.approx(1.0)
    ceiling = StabilityMonitor(MonitorSettings(grad_norm_max=5.0))
    assert ceiling.observe(1, 3.0, 6.0).kind == "grad_explosion"  # an absolute ceiling needs no history


def test_plateau_is_a_warning_once_per_window():
    monitor = StabilityMonitor(SETTINGS)
    events = feed(monitor, [3.0] * 12)
    plateaus = [e for e in events if e is not None]
    assert [e.step for e in plateaus] == [8, 12] and all(e.kind == "plateau" and e.action == WARN for e in plateaus)


def test_rollback_restores_windows_keeps_events_and_lowers_the_lr():
    monitor = StabilityMonitor(SETTINGS)
    feed(monitor, [3.0, 2.9, 2.8])
    at_checkpoint = json.loads(json.dumps(monitor.state_dict()))  # as stored in a checkpoint (step 3)
    feed(monitor, [2.7, 2.6], start=4)
    event = monitor.observe(6, 9.0, 1.0)
    monitor.rolled_back(event, to_step=3, checkpoint_state=at_checkpoint)
    assert list(monitor.losses) == [3.0, 2.9, 2.8]
    assert monitor.events == [event] and monitor.rollbacks == 1
    assert (event.rollback_to, event.skipped_steps, event.lr_reduced_until) == (3, 3, 13)
    assert monitor.lr_scale(3) == monitor.lr_scale(12) == 0.5 and monitor.lr_scale(13) == 1.0


def test_rollbacks_are_bounded():
    monitor = StabilityMonitor(SETTINGS)
    for i in range(2):
        monitor.rolled_back(monitor.observe(10 + i, math.nan, 1.0), to_step=5, checkpoint_state=None)
    with pytest.raises(TrainingDiverged, match="over monitor.max_rollbacks = 2"):
        monitor.rolled_back(monitor.observe(20, math.nan, 1.0), to_step=5, checkpoint_state=None)


def test_without_a_checkpoint_only_the_lr_is_lowered():
    monitor = StabilityMonitor(SETTINGS)
    feed(monitor, [3.0] * 3)
    event = monitor.observe(4, 10.0, 1.0)
    monitor.reduce_lr_without_rollback(event, next_step=5)  # step 4 judged once update 5 ran: from update 6 on
    assert event.action == WARN and monitor.rollbacks == 0
    assert monitor.lr_scale(5) == monitor.lr_scale(14) == 0.5 and monitor.lr_scale(15) == 1.0  # 10 updates


def test_state_round_trips_through_json():
    monitor = StabilityMonitor(SETTINGS)
    feed(monitor, [3.0, 3.0, 3.0, 9.0])
    state = json.loads(json.dumps(monitor.state_dict()))
    again = StabilityMonitor(SETTINGS)
    again.load_state_dict(state)
    assert again.state_dict() == monitor.state_dict()
    assert again.events[0].kind == "loss_spike"


def test_disabled_or_record_only():
    assert StabilityMonitor(MonitorSettings(enabled=False)).observe(1, math.nan, 1.0) is None
    assert StabilityMonitor(MonitorSettings(rollback=False)).observe(1, math.nan, 1.0).action == WARN
