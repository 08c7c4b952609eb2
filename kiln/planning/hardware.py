"""Accelerators the planner knows: dense bf16 peak, memory, and intra-node link bandwidth.

Peaks are the vendors' *dense* (no 2:4 sparsity) bf16 tensor-core numbers from the datasheets; MFU
is always measured against these (PaLM, Chowdhery et al. 2022, App. B). Memory is what the device offers, in
GiB: for HBM parts the marketed capacity (nvidia-smi reports 81,920 MiB on an A100 80GB, 81,559 on an H100: within
1%); the GDDR6 parts keep 1/16 of theirs for ECC, on by default in data centres, so their figure is nvidia-smi's
total (A10 and A10G 23,028 MiB, L4 23,034, L40S 46,068, as reported on those cards), not the marketed 24 or 48 GB.
Link bandwidth is per GPU and per direction, i.e. half the bidirectional figure on the datasheet.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

TERA = 1e12


@dataclass(frozen=True)
class GpuSpec:
    name: str
    peak_flops: float  # dense bf16 FLOP/s
    memory_gib: float
    intra_node_gb_s: float  # per GPU, per direction (NVLink / Infinity Fabric / PCIe)
    link: str  # what that bandwidth is, for explanations

    @property
    def memory_bytes(self) -> float:
        return self.memory_gib * 2**30

    def with_peak(self, peak_flops: float | None) -> GpuSpec:
        """The same GPU with an overridden peak (e.g. a measured matmul ceiling, or fp8)."""
        if peak_flops is None:
            return self
        if not peak_flops > 0:
            raise ValueError(f"peak FLOP/s override must be > 0, got {peak_flops}")
        return replace(self, peak_flops=float(peak_flops))

    def to_dict(self) -> dict[str, float | str]:
        return {
            "name": self.name,
            "peak_tflops": self.peak_flops / TERA,
            "memory_gib": self.memory_gib,
            "intra_node_gb_s": self.intra_node_gb_s,
            "link": self.link,
        }


GPUS: dict[str, GpuSpec] = {
    spec.name: spec
    for spec in (
        GpuSpec("H100-SXM", 989 * TERA, 80, 450, "NVLink 4 (900 GB/s bidirectional)"),
        GpuSpec("H100-PCIe", 756 * TERA, 80, 64, "PCIe 5.0 x16"),
        GpuSpec("H200", 989 * TERA, 141, 450, "NVLink 4 (900 GB/s bidirectional)"),
        GpuSpec("B200", 2250 * TERA, 180, 900, "NVLink 5 (1.8 TB/s bidirectional)"),
        GpuSpec("A100-80GB", 312 * TERA, 80, 300, "NVLink 3 (600 GB/s bidirectional)"),
        GpuSpec("A100-40GB", 312 * TERA, 40, 300, "NVLink 3 (600 GB/s bidirectional)"),
        GpuSpec("A10", 125 * TERA, 23_028 / 1024, 32, "PCIe 4.0 x16"),
        # AWS's A10G runs its tensor cores at lower clocks than the A10: ~70 dense bf16 TFLOP/s.
        GpuSpec("A10G", 70 * TERA, 23_028 / 1024, 32, "PCIe 4.0 x16"),
        GpuSpec("L4", 121 * TERA, 23_034 / 1024, 32, "PCIe 4.0 x16"),
        GpuSpec("L40S", 362 * TERA, 46_068 / 1024, 32, "PCIe 4.0 x16"),
        GpuSpec("MI300X", 1307 * TERA, 192, 448, "Infinity Fabric (7 x 64 GB/s per direction)"),
    )
}

# The name CUDA reports (torch.cuda.get_device_name()) -> the planner's GPU, or the dense bf16 peak of a GPU it has no
# spec for (its runs must not stand for another kind). The first pattern found in the lower-cased name wins, so
# variants come before families: "NVIDIA H100 80GB HBM3" (SXM), "NVIDIA H100 PCIe", "NVIDIA A100-SXM4-40GB".
CUDA_NAMES: list[tuple[str, str | float]] = [
    ("gh200", 989 * TERA), ("h200 nvl", 835 * TERA), ("h200", "H200"), ("h100 pcie", "H100-PCIe"),
    ("h100 nvl", 835 * TERA), ("h100", "H100-SXM"), ("h800", 989 * TERA), ("b200", "B200"),
    ("a100-sxm4-40gb", "A100-40GB"), ("a100-pcie-40gb", "A100-40GB"), ("a100", "A100-80GB"), ("a800", 312 * TERA),
    ("a10g", "A10G"), ("a10", "A10"), ("l40s", "L40S"), ("l40", 181 * TERA), ("l4", "L4"), ("rtx 6000 ada", 364 * TERA),
    ("a6000", 155 * TERA), ("mi300x", "MI300X"), ("mi250x", 383 * TERA),
]


def cuda_device(device_name: str) -> tuple[str | None, float | None]:
    """(the planner's GPU or None, dense bf16 peak FLOP/s or None) for a device name as CUDA reports it; an unlisted
    name (CPU included) is (None, None)."""
    name = device_name.lower()
    for pattern, entry in CUDA_NAMES:
        if pattern in name:
            return (entry, GPUS[entry].peak_flops) if isinstance(entry, str) else (None, entry)
    return None, None


ALIASES = {"H100": "H100-SXM", "A100": "A100-80GB", "H200-SXM": "H200", "B200-SXM": "B200"}


class UnknownGpu(ValueError):
    """The GPU name is not in the table; the message lists the known names."""


def known_gpu_names() -> list[str]:
    return sorted(GPUS) + sorted(ALIASES)


def lookup_gpu(name: str, peak_flops: float | None = None) -> GpuSpec:
    """Case-insensitive lookup (aliases included); `peak_flops` overrides the datasheet peak."""
    by_lower = {key.lower(): spec for key, spec in GPUS.items()}
    by_lower.update({alias.lower(): GPUS[target] for alias, target in ALIASES.items()})
    spec = by_lower.get(name.strip().lower())
    if spec is None:
        raise UnknownGpu(
            f"unknown GPU {name!r}; known GPUs: {', '.join(known_gpu_names())} (for another GPU, name "
            "a known one with the same memory and override its peak, e.g. --peak-tflops)"
        )
    return spec.with_peak(peak_flops)
