"""Failures, checkpoint interval and the work they cost.

* Failures are independent and exponential per GPU, so rates add: cluster MTBF M = MTBF_gpu / n_gpus.
  The default per-GPU MTBF (~50,000 h) is what Llama 3 saw: 419 unexpected interruptions in 54 days
  on 16,384 H100s (Dubey et al. 2024, Sec. 3.3.4) → a 3.1 h cluster MTBF.
* Young (1974): optimal checkpoint interval τ ≈ sqrt(2·δ·M) for checkpoint write time δ.
* Daly (2006), higher-order estimate: τ = sqrt(2δM)·[1 + (1/3)·sqrt(δ/2M) + (1/9)·(δ/2M)] - δ for
  δ < 2M, else τ = M.
* Daly (2006) expected wall time with restarts (restart time R, solve time T_s, interval τ):
  T_w = M·e^(R/M)·(e^((τ+δ)/M) - 1)·T_s/τ. Lost-work fraction = 1 - T_s/T_w.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass

LLAMA3_GPU_MTBF_HOURS = 54 * 24 / 419 * 16384  # ≈ 50,700 h per GPU (Dubey et al. 2024, Sec. 3.3.4)
# Daly's factor grows as e^((R + τ + δ)/M); past this exponent it is beyond any float (e^709.8), and long before it
# the run would almost never get from one checkpoint to the next
MAX_FAILURE_EXPONENT = 700.0


def _require_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def cluster_mtbf_hours(gpu_mtbf_hours: float, n_gpus: int) -> float:
    """M = MTBF_gpu / n (independent exponential failures: failure rates add)."""
    _require_positive(gpu_mtbf_hours=gpu_mtbf_hours, n_gpus=n_gpus)
    return gpu_mtbf_hours / n_gpus


def young_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """τ = sqrt(2·δ·M) (Young 1974), in the units of the inputs."""
    _require_positive(checkpoint_seconds=checkpoint_seconds, mtbf_seconds=mtbf_seconds)
    return math.sqrt(2.0 * checkpoint_seconds * mtbf_seconds)


def daly_interval(checkpoint_seconds: float, mtbf_seconds: float) -> float:
    """Daly (2006) higher-order optimum: sqrt(2δM)·[1 + (1/3)·sqrt(δ/2M) + (1/9)·(δ/2M)] - δ,
    or M when δ ≥ 2M."""
    delta, mtbf = checkpoint_seconds, mtbf_seconds
    _require_positive(checkpoint_seconds=delta, mtbf_seconds=mtbf)
    if delta >= 2.0 * mtbf:
        return mtbf
    x = delta / (2.0 * mtbf)
    return math.sqrt(2.0 * delta * mtbf) * (1.0 + math.sqrt(x) / 3.0 + x / 9.0) - delta


def expected_wall_time_factor(
    interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float, restart_seconds: float
) -> float:
    """T_w / T_s = M·e^(R/M)·(e^((τ+δ)/M) - 1)/τ (Daly 2006, expected completion time with failures)."""
    _require_positive(interval_seconds=interval_seconds, mtbf_seconds=mtbf_seconds)
    tau, delta, mtbf = interval_seconds, checkpoint_seconds, mtbf_seconds
    return mtbf * math.exp(restart_seconds / mtbf) * math.expm1((tau + delta) / mtbf) / tau


def lost_work_fraction(
    interval_seconds: float, checkpoint_seconds: float, mtbf_seconds: float, restart_seconds: float
) -> float:
    """Share of wall time not spent on useful training: checkpoint writes, recomputed work, restarts."""
    factor = expected_wall_time_factor(interval_seconds, checkpoint_seconds, mtbf_seconds, restart_seconds)
    return 1.0 - 1.0 / factor


@dataclass(frozen=True)
class ReliabilityEstimate:
    n_gpus: int
    gpu_mtbf_hours: float
    cluster_mtbf_hours: float
    checkpoint_write_seconds: float
    restart_seconds: float
    young_interval_minutes: float
    daly_interval_minutes: float
    lost_work_fraction: float  # at Daly's interval
    expected_failures: float
    wall_clock_days_ideal: float
    wall_clock_days_expected: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def estimate_reliability(
    *,
    n_gpus: int,
    gpu_mtbf_hours: float,
    checkpoint_write_seconds: float,
    restart_seconds: float,
    wall_clock_days: float,
) -> ReliabilityEstimate:
    """Checkpoint interval, lost work and the wall-clock it adds to a failure-free `wall_clock_days`."""
    mtbf_s = cluster_mtbf_hours(gpu_mtbf_hours, n_gpus) * 3600.0
    daly = daly_interval(checkpoint_write_seconds, mtbf_s)
    exponent = (restart_seconds + daly + checkpoint_write_seconds) / mtbf_s
    if exponent > MAX_FAILURE_EXPONENT:
        raise ValueError(
            f"checkpointing cannot make progress: a restart ({restart_seconds:g} s), a checkpoint interval and its "
            f"write ({checkpoint_write_seconds:g} s) take {exponent:.3g} times the cluster's mean time between "
            f"failures ({mtbf_s:.3g} s: gpu_mtbf_hours {gpu_mtbf_hours:g} / {n_gpus} GPUs), so a failure almost "
            f"always comes first; lower checkpoint_write_seconds or restart_minutes, or raise gpu_mtbf_hours"
        )
    factor = expected_wall_time_factor(daly, checkpoint_write_seconds, mtbf_s, restart_seconds)
    expected_days = wall_clock_days * factor
    return ReliabilityEstimate(
        n_gpus=n_gpus,
        gpu_mtbf_hours=gpu_mtbf_hours,
        cluster_mtbf_hours=mtbf_s / 3600.0,
        checkpoint_write_seconds=checkpoint_write_seconds,
        restart_seconds=restart_seconds,
        young_interval_minutes=young_interval(checkpoint_write_seconds, mtbf_s) / 60.0,
        daly_interval_minutes=daly / 60.0,
        lost_work_fraction=1.0 - 1.0 / factor,
        expected_failures=expected_days * 86400.0 / mtbf_s,
        wall_clock_days_ideal=wall_clock_days,
        wall_clock_days_expected=expected_days,
    )
