import math

import numpy as np
import pytest

from kiln.planning.reliability import (
    LLAMA3_GPU_MTBF_HOURS,
    cluster_mtbf_hours,
    daly_interval,
    estimate_reliability,
    expected_wall_time_factor,
    lost_work_fraction,
    young_interval,
)


def test_cluster_mtbf_and_llama3_default():
    assert cluster_mtbf_hours(50_000, 1000) == 50.0
    # Llama 3: 419 unexpected interruptions in 54 days on 16,384 GPUs → ~3.1 h between failures.
    assert cluster_mtbf_hours(LLAMA3_GPU_MTBF_HOURS, 16384) == pytest.approx(54 * 24 / 419)


def test_young():
    assert young_interval(60.0, 36000.0) == pytest.approx(math.sqrt(2 * 60 * 36000))


@pytest.mark.parametrize("ratio", [1e-3, 1e-2, 1e-1])
def test_daly_interval_minimises_dalys_expected_wall_time(ratio):
    mtbf = 3600.0
    delta = ratio * mtbf
    taus = np.linspace(0.1, 3.0, 100_001) * young_interval(delta, mtbf)
    best = taus[np.argmin([expected_wall_time_factor(t, delta, mtbf, 0.0) for t in taus])]
    assert daly_interval(delta, mtbf) == pytest.approx(best, rel=1e-3)
    assert daly_interval(delta, mtbf) < young_interval(delta, mtbf)  # Young overestimates as δ/M grows


def test_daly_caps_at_mtbf_for_slow_checkpoints():
    assert daly_interval(7200.0, 3600.0) == 3600.0


def test_lost_work_first_order():
    # For δ ≪ M and no restart cost the loss at the optimum is ≈ sqrt(2δ/M) (δ/τ + τ/2M at τ = sqrt(2δM)).
    mtbf, delta = 100 * 3600.0, 60.0
    lost = lost_work_fraction(daly_interval(delta, mtbf), delta, mtbf, 0.0)
    assert lost == pytest.approx(math.sqrt(2 * delta / mtbf), rel=0.02)


def test_estimate_adds_failure_time():
    estimate = estimate_reliability(
        n_gpus=1024, gpu_mtbf_hours=50_000, checkpoint_write_seconds=120, restart_seconds=600, wall_clock_days=30
    )
    assert estimate.cluster_mtbf_hours == pytest.approx(50_000 / 1024)
    # By hand, first order (δ ≪ M): M = 50,000 h / 1,024 = 175,781 s; lost ≈ sqrt(2δ/M) + R/M
    # = sqrt(240 / 175,781) + 600 / 175,781 = 0.0369 + 0.0034 = 0.0404; 30 days / (1 - 0.0404) = 31.26 days;
    # failures ≈ 31.26 d x 24 h / 48.83 h = 15.4.
    assert estimate.lost_work_fraction == pytest.approx(0.0404, rel=0.03)
    assert estimate.wall_clock_days_expected == pytest.approx(31.26, rel=0.01)
    assert estimate.expected_failures == pytest.approx(15.4, rel=0.01)


def test_failures_faster_than_checkpoints_are_refused_not_overflowed():
    """Daly's factor is e^((R + τ + δ)/M)-sized. 1 h per GPU over 16,384 GPUs is M = 3600/16384 = 0.22 s; with δ = 60 s
    (≥ 2M, so τ = M) and R = 600 s the exponent is (600 + 0.22 + 60)/0.22 ≈ 3004: math.exp overflowed (an
    OverflowError traceback from `kiln plan`). It says checkpointing cannot make progress instead, and where the
    exponent stays under 700 (M = 36 s, δ = 60 s, R = 100 s: about 5.3) it computes, if to little good."""
    with pytest.raises(ValueError, match=r"checkpointing cannot make progress: .* take 3e\+03 times"):
        estimate_reliability(n_gpus=16384, gpu_mtbf_hours=1.0, checkpoint_write_seconds=60.0, restart_seconds=600.0,
                             wall_clock_days=10.0)
    slow = estimate_reliability(n_gpus=100, gpu_mtbf_hours=1.0, checkpoint_write_seconds=60.0, restart_seconds=100.0,
                                wall_clock_days=10.0)
    assert math.isfinite(slow.wall_clock_days_expected) and slow.lost_work_fraction > 0.99
