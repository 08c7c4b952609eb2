"""Peak dense bf16 FLOP/s per accelerator, for MFU = model FLOPs/s ÷ (peak × devices).

Datasheet numbers without 2:4 sparsity (MFU is always measured against the dense peak: PaLM, Chowdhery et
al. 2022, App. B). Matched against `torch.cuda.get_device_name()`; the first pattern that appears in the
name wins, so specific variants come before families. On CPU there is no meaningful peak: MFU is None.
"""

from __future__ import annotations

TERA = 1e12

# (substring of the lower-cased device name, peak dense bf16 FLOP/s). Example names:
# "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA H200", "NVIDIA A100-SXM4-80GB", "NVIDIA L40S".
PEAK_BF16_FLOPS: list[tuple[str, float]] = [
    ("gh200", 989 * TERA),
    ("h200", 989 * TERA),
    ("h100 pcie", 756 * TERA),
    ("h100 nvl", 835 * TERA),
    ("h100", 989 * TERA),  # SXM (HBM3)
    ("h800", 989 * TERA),
    ("b200", 2250 * TERA),
    ("a100", 312 * TERA),
    ("a800", 312 * TERA),
    ("l40s", 362 * TERA),
    ("l40", 181 * TERA),
    ("a10g", 70 * TERA),  # AWS's A10G: lower tensor-core clocks than the A10
    ("a10", 125 * TERA),
    ("l4", 121 * TERA),
    ("rtx 6000 ada", 364 * TERA),
    ("a6000", 155 * TERA),
    ("mi300x", 1307 * TERA),
    ("mi250x", 383 * TERA),
]


def peak_flops_for(device_name: str) -> float | None:
    """The table's peak for a device name, or None if it is not listed."""
    name = device_name.lower()
    for pattern, peak in PEAK_BF16_FLOPS:
        if pattern in name:
            return peak
    return None


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


__all__ = ["PEAK_BF16_FLOPS", "device_peak_flops", "mfu", "peak_flops_for"]
