"""Training FLOPs and what they cost: GPU-hours, dollars, wall-clock days.

Two FLOP counts are used, and every number says which:

* `training_flops` = 6·N·D, the convention of the scaling-law papers (Kaplan et al. 2020, Sec. 2.1;
  Hoffmann et al. 2022, Sec. 3): 2N FLOPs per token forward, 4N backward, attention ignored.
* `training_flops_with_attention` adds the attention score/value matmuls with PaLM's count
  (Chowdhery et al. 2022, App. B): 12·n_layers·d_model·seq_len FLOPs per token for forward +
  backward (QK^T and AV, 2 matmuls x 2 FLOPs/MAC x 3 for fwd+bwd, no causal-mask discount).
  Kaplan et al. 2020, Table 1 count only the QK^T product (6·n_layers·n_ctx·d_attn fwd+bwd); we use
  PaLM's because MFU is defined with it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

SECONDS_PER_HOUR = 3600.0
HOURS_PER_DAY = 24.0
PF_DAY = 1e15 * 86400  # FLOPs in one petaflop/s-day (Kaplan et al. 2020 use it as their compute unit)


def _require_positive(**values: float) -> None:
    for name, value in values.items():
        if not value > 0:
            raise ValueError(f"{name} must be > 0, got {value}")


def training_flops(n_params: float, tokens: float) -> float:
    """C = 6·N·D (Kaplan et al. 2020, Sec. 2.1: C ≈ 6N FLOPs per training token)."""
    return 6.0 * n_params * tokens


def attention_flops_per_token(n_layers: int, d_model: int, seq_len: int) -> float:
    """12·L·d_model·T per token, forward + backward (Chowdhery et al. 2022, App. B: 12·L·H·Q·T)."""
    return 12.0 * n_layers * d_model * seq_len


def training_flops_with_attention(
    n_params: float, tokens: float, n_layers: int, d_model: int, seq_len: int
) -> float:
    """(6·N + 12·L·d_model·T)·D: PaLM's model FLOPs, the numerator of MFU."""
    return (6.0 * n_params + attention_flops_per_token(n_layers, d_model, seq_len)) * tokens


def gpu_hours_for_flops(flops: float, peak_flops: float, mfu: float) -> float:
    """Hours of one GPU delivering `mfu` of its peak."""
    _require_positive(flops=flops, peak_flops=peak_flops, mfu=mfu)
    return flops / (peak_flops * mfu) / SECONDS_PER_HOUR


def flops_for_gpu_hours(gpu_hours: float, peak_flops: float, mfu: float) -> float:
    _require_positive(gpu_hours=gpu_hours, peak_flops=peak_flops, mfu=mfu)
    return gpu_hours * SECONDS_PER_HOUR * peak_flops * mfu


def flops_for_budget_usd(
    budget_usd: float, price_per_gpu_hour: float, peak_flops: float, mfu: float
) -> float:
    """Dollars → GPU-hours → FLOPs actually delivered at the given MFU."""
    _require_positive(budget_usd=budget_usd, price_per_gpu_hour=price_per_gpu_hour)
    return flops_for_gpu_hours(budget_usd / price_per_gpu_hour, peak_flops, mfu)


@dataclass(frozen=True)
class ComputeEstimate:
    flops: float
    peak_flops: float
    mfu: float
    n_gpus: int
    price_per_gpu_hour: float
    gpu_hours: float
    cost_usd: float
    wall_clock_days: float

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


def estimate_compute(
    flops: float, *, peak_flops: float, mfu: float, n_gpus: int, price_per_gpu_hour: float
) -> ComputeEstimate:
    """GPU-hours, cost and wall-clock days (no failures; see `reliability`) for a FLOP count."""
    _require_positive(n_gpus=n_gpus, price_per_gpu_hour=price_per_gpu_hour)
    gpu_hours = gpu_hours_for_flops(flops, peak_flops, mfu)
    return ComputeEstimate(
        flops=flops,
        peak_flops=peak_flops,
        mfu=mfu,
        n_gpus=n_gpus,
        price_per_gpu_hour=price_per_gpu_hour,
        gpu_hours=gpu_hours,
        cost_usd=gpu_hours * price_per_gpu_hour,
        wall_clock_days=gpu_hours / n_gpus / HOURS_PER_DAY,
    )
