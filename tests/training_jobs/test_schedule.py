"""Learning-rate schedules: warmup, cosine, WSD, and the LambdaLR DeepSpeed steps."""

from __future__ import annotations

import pytest
import torch

from training_jobs.schedule import lambda_lr, lr_at
from training_jobs.settings import ScheduleSettings

COSINE = ScheduleSettings(kind="cosine", lr=1e-3, min_lr=1e-4, warmup_steps=10)
WSD = ScheduleSettings(kind="wsd", lr=1e-3, min_lr=1e-4, warmup_steps=10, decay_fraction=0.2)


def test_warmup_is_linear_up_to_the_peak():
    assert [lr_at(s, COSINE, 100) for s in (0, 4, 9)] == pytest.approx([1e-4, 5e-4, 1e-3])


def test_cosine_goes_from_peak_to_min_lr():
    assert lr_at(10, COSINE, 100) == pytest.approx(1e-3)
    assert lr_at(55, COSINE, 100) == pytest.approx((1e-3 + 1e-4) / 2)  # halfway: the mean
    assert lr_at(99, COSINE, 100) == pytest.approx(1e-4, rel=1e-2)
    assert lr_at(100, COSINE, 100) == lr_at(500, COSINE, 100) == 1e-4
    lrs = [lr_at(s, COSINE, 100) for s in range(10, 100)]
    assert lrs == sorted(lrs, reverse=True)


def test_wsd_is_stable_then_decays_linearly_over_the_last_fraction():
    assert {lr_at(s, WSD, 100) for s in range(10, 80)} == {1e-3}
    assert lr_at(90, WSD, 100) == pytest.approx((1e-3 + 1e-4) / 2)
    assert lr_at(100, WSD, 100) == 1e-4
    # extending a WSD run before its decay leaves the LRs so far unchanged
    assert [lr_at(s, WSD, 100) for s in range(80)] == [lr_at(s, WSD, 200) for s in range(80)]


def test_no_warmup():
    s = ScheduleSettings(lr=1e-3, min_lr=0.0, warmup_steps=0)
    assert lr_at(0, s, 10) == 1e-3


def test_lambda_lr_drives_the_optimizer_and_takes_a_scale():
    params = [torch.nn.Parameter(torch.zeros(2))]
    opt = torch.optim.AdamW(params, lr=123.0)  # replaced by the schedule's lr
    halved_from_5 = lambda step: 0.5 if step >= 5 else 1.0  # noqa: E731
    sched = lambda_lr(opt, COSINE, 100, scale=halved_from_5)
    seen = []
    for _ in range(8):
        seen.append(opt.param_groups[0]["lr"])
        opt.step()
        sched.step()
    expected = [lr_at(s, COSINE, 100) * (0.5 if s >= 5 else 1.0) for s in range(8)]
    assert seen == pytest.approx(expected)


def test_a_warmup_as_long_as_the_run_is_named_with_where_the_rate_ends():
    """The default config's 30 warmup steps on a 10-step run: the rate climbs lr/30 a step and stops at step 10's
    10/30 x 3e-3 = 1e-3, a third of the peak, and never decays (the trainer prints this as a warning)."""
    from training_jobs.schedule import warmup_problem

    s = ScheduleSettings(lr=3e-3, min_lr=3e-4, warmup_steps=30)
    assert warmup_problem(s, 31) is None
    assert warmup_problem(s, 10) == ("the warmup (30 steps) is not shorter than the schedule's 10 steps: the learning "
                                     "rate never reaches training.schedule.lr 0.003 (it ends at 0.001) and never "
                                     "decays; lower schedule.warmup_steps (or rewarmup_steps) below the run's steps")
