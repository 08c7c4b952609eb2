"""Peak dense bf16 FLOP/s per accelerator, for MFU = model FLOPs/s ÷ (peak × devices).

Datasheet numbers without 2:4 sparsity (MFU is always measured against the dense peak: PaLM, Chowdhery et
al. 2022, App. B), from the planner's one table of CUDA device names (kiln.planning.hardware.CUDA_NAMES), so a
run's MFU and the plan's GPU kind cannot disagree. On CPU there is no meaningful peak: MFU is None.
"""

from __future__ import annotations

from kiln.planning.hardware import TERA, cuda_device


def peak_flops_for(device_name: str) -> float | None:
    """The dense bf16 peak of a device name as CUDA reports it (kiln.planning.hardware.CUDA_NAMES), or None."""
    return cuda_device(device_name)[1]


def device_peak_flops(override_tflops: float | None = None) -> tuple[str, float | None]:
    """(device name, peak FLOP/s per device) for this process's device; the override wins.
    On CPU the peak is None unless overridden."""
    import torch

    if torch.cuda.is_available():
        name = torch.cuda.get_device_name()
        peak = peak_flops_for(name)
    else:
        name, peak = "cpu", None
    if override_tflops is not None:
        peak = override_tflops * TERA
    return name, peak


def mfu(flops_per_token: float, tokens_per_s: float, peak_flops: float | None, world_size: int) -> float | None:
    """Model FLOPs utilization, or None without a known peak."""
    if peak_flops is None or tokens_per_s <= 0:
        return None
    return flops_per_token * tokens_per_s / (peak_flops * world_size)


__all__ = ["device_peak_flops", "mfu", "peak_flops_for"]
