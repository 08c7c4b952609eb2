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


STEADY = SETTINGS.model_copy(update={"plateau_window": 1000})  # no plateau warnings in the way
WARN_ONLY = STEADY.model_copy(update={"rollback": False})


def test_a_lasting_level_shift_is_accepted_once_it_holds_for_min_history_steps():
    """Loss 2.0, then a harder stretch of data at 3.1 for good (1.55x, healthy gradients). Every later step was a
    loss spike for ever: an event each, kept in every checkpoint and summary. Now the first min_history (3) steps
    at the new level are one aggregated spike record, the third is accepted as the new level (one event), and the
    window holds the new level from then on."""
    monitor = StabilityMonitor(WARN_ONLY)
    feed(monitor, [2.0] * 10)
    events = feed(monitor, [3.1] * 200, start=11)
    assert [(e.step, e.kind, e.action) for e in events if e is not None] == \
        [(11, "loss_spike", WARN), (12, "loss_spike", WARN), (13, "level_shift", WARN)]
    spike, shift = monitor.events
    assert (spike.kind, spike.step, spike.last_step, spike.repeats) == ("loss_spike", 11, 12, 1)
    assert (shift.kind, shift.step, shift.reference, shift.loss) == ("level_shift", 13, pytest.approx(2.0), 3.1)
    assert "3 steps" in shift.message and "new level" in shift.message
    assert list(monitor.losses) == [3.1] * 5
    assert monitor.observe(300, 4.8, 1.0).kind == "loss_spike"  # a spike over the new level is still one


def test_a_spike_that_passes_or_keeps_rising_is_no_level_shift():
    monitor = StabilityMonitor(WARN_ONLY)
    feed(monitor, [2.0] * 10)
    events = feed(monitor, [3.5, 3.4, 2.0, 2.0], start=11)  # two steps high, then back: a spike
    assert [e.kind for e in events if e is not None] == ["loss_spike", "loss_spike"]
    assert [(e.kind, e.repeats) for e in monitor.events] == [("loss_spike", 1)]
    rising = feed(monitor, [3.1, 3.6, 4.2, 4.9, 5.7, 6.6], start=15)  # diverging: each step 1.16x the last
    assert all(e.kind == "loss_spike" for e in rising)
    assert list(monitor.losses) == [2.0] * 5 and len(monitor.events) == 2  # one more record for the new run


def test_a_loss_climbing_slowly_is_no_level_and_no_level_is_taken_with_rollbacks_on():
    """Loss 2.0, then 3.1 rising 1% a step (a divergence): any 20 steps of it stay within 1.25x of their lowest
    (1.01^19 = 1.21), the first rule of a level, but the least-squares rise over them (about 19% of the level) is over
    a tenth of the 0.5 spike margin (5%): every step stays a spike. With rollbacks on, not even a flat new level is
    taken: a level would become the reference of the first checkpoint."""
    climbing = [3.1 * 1.01 ** i for i in range(100)]
    warn_only = StabilityMonitor(WARN_ONLY.model_copy(update={"min_history": 20, "window": 20}))
    feed(warn_only, [2.0] * 30)
    assert all(e is not None and e.kind == "loss_spike" for e in feed(warn_only, climbing, start=31))
    assert [e.kind for e in warn_only.events] == ["loss_spike"]
    rolling = StabilityMonitor(STEADY)  # rollback on, no checkpoint to return to: the loop only lowers the LR
    feed(rolling, [2.0] * 10)
    assert all(e.kind == "loss_spike" for e in feed(rolling, [3.1] * 50, start=11))
    assert [e.kind for e in rolling.events] == ["loss_spike"] and list(rolling.losses) == [2.0] * 5


def test_nan_is_never_accepted_as_a_level():
    monitor = StabilityMonitor(WARN_ONLY)
    feed(monitor, [2.0] * 10)
    assert [e.kind for e in feed(monitor, [math.nan] * 10, start=11)] == ["nan"] * 10
    assert list(monitor.losses) == [2.0] * 5


def test_a_spike_still_rolls_back_and_a_rolled_back_one_starts_no_level_shift():
    """With rollback on, the first step over the threshold asks for a rollback (before it reaches a checkpoint);
    after it, the windows are the checkpoint's and the same level again asks for another, up to max_rollbacks."""
    monitor = StabilityMonitor(STEADY)
    feed(monitor, [2.0] * 5)
    at_checkpoint = json.loads(json.dumps(monitor.state_dict()))
    for i in range(2):
        event = monitor.observe(6 + i, 3.1, 1.0)
        assert (event.kind, event.action) == ("loss_spike", ROLLBACK)
        monitor.rolled_back(event, to_step=5, checkpoint_state=at_checkpoint)
    with pytest.raises(TrainingDiverged, match="rollback 3"):
        monitor.rolled_back(monitor.observe(8, 3.1, 1.0), to_step=5, checkpoint_state=at_checkpoint)


def test_a_new_curriculum_phase_starts_a_new_reference():
    """The loss of a harder phase is judged against that phase's own steps, not the last phase's: after the phase
    changes, no spike is judged until min_history steps of it are in the window (NaN is judged throughout)."""
    monitor = StabilityMonitor(STEADY)
    for step in range(1, 11):
        assert monitor.observe(step, 2.0, 1.0, phase=0) is None
    at_checkpoint = json.loads(json.dumps(monitor.state_dict()))
    assert [monitor.observe(step, 3.1, 1.0, phase=1) for step in range(11, 14)] == [None] * 3
    assert list(monitor.losses) == [3.1] * 3
    assert monitor.observe(14, 3.1, math.inf, phase=1).kind == "nan"
    spike = monitor.observe(15, 4.8, 1.0, phase=1)
    assert spike.kind == "loss_spike" and spike.reference == pytest.approx(3.1)
    # rolled back to a checkpoint of phase 0 while the data goes on in phase 1: phase 1's reference starts again
    monitor.rolled_back(spike, to_step=10, checkpoint_state=at_checkpoint)
    assert list(monitor.losses) == [2.0] * 5
    assert monitor.observe(16, 3.1, 1.0, phase=1) is None and list(monitor.losses) == [3.1]
    again = StabilityMonitor(STEADY)
    again.load_state_dict(json.loads(json.dumps(monitor.state_dict())))
    assert again.observe(17, 3.1, 1.0, phase=1) is None and list(again.losses) == [3.1, 3.1]


def test_a_run_resumed_inside_a_stretch_of_spikes_judges_it_as_the_uninterrupted_run():
    """rollback: false, loss 2.0 then 3.1 from step 11, the run checkpointed at step 12 and resumed there (SIGKILL).
    Uninterrupted (hand-worked): steps 11-12 one spike record (repeats 1), step 13 the third step over the threshold
    and the new level. The checkpoint held neither the steps over the threshold so far nor the open record: the
    resumed run counted the level again from step 13 (a second spike record 13-14, the level at 15, its windows a
    level behind until then)."""
    resumed = StabilityMonitor(WARN_ONLY)
    feed(resumed, [2.0] * 10 + [3.1] * 2)
    at_checkpoint = json.loads(json.dumps(resumed.state_dict()))
    resumed = StabilityMonitor(WARN_ONLY)
    resumed.load_state_dict(at_checkpoint)
    feed(resumed, [3.1] * 4, start=13)
    assert [(e.step, e.kind, e.repeats, e.last_step) for e in resumed.events] == \
        [(11, "loss_spike", 1, 12), (13, "level_shift", 0, None)]
    assert list(resumed.losses) == [3.1] * 5


def test_a_resumed_run_continues_the_open_anomaly_record():
    """Grad explosions at steps 9-10 with the checkpoint at 9: one record (repeats 1), as without the resume."""
    resumed = StabilityMonitor(WARN_ONLY)
    feed(resumed, [2.0] * 9, grads=[1.0] * 8 + [50.0])
    at_checkpoint = json.loads(json.dumps(resumed.state_dict()))
    resumed = StabilityMonitor(WARN_ONLY)
    resumed.load_state_dict(at_checkpoint)
    feed(resumed, [2.0], grads=[50.0], start=10)
    assert [(e.step, e.kind, e.repeats, e.last_step) for e in resumed.events] == [(9, "grad_explosion", 1, 10)]


def test_a_monitor_state_from_before_the_open_record_was_kept_still_loads():
    state = StabilityMonitor(WARN_ONLY).state_dict()
    for key in ("over", "open_record"):
        state.pop(key, None)
    StabilityMonitor(WARN_ONLY).load_state_dict(state)
