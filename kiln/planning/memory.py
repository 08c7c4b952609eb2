"""GPU memory per device: model states under DDP / ZeRO-1/2/3 (optionally CPU-offloaded) plus activations.

Model states, mixed precision with Adam (Rajbhandari et al. 2020, "ZeRO", Sec. 3.1): bf16 parameters
2 bytes, bf16 gradients 2 bytes, optimizer states K = 12 bytes (fp32 master copy, Adam m and v) per
parameter, 16 in all. ZeRO partitions them over the Nd data-parallel ranks (ZeRO Sec. 5, Fig. 1):
ZeRO-1 (P_os) 2 + 2 + 12/Nd, ZeRO-2 (P_os+g) 2 + 14/Nd, ZeRO-3 (P_os+g+p) 16/Nd.
CPU offload (ZeRO-Offload, Ren et al. 2021; ZeRO-Infinity, Rajbhandari et al. 2021) moves the
optimizer states (and with ZeRO-3 also the parameter shards) to host memory.

Activations per transformer layer, 16-bit, micro-batch b, sequence s, hidden h, heads a, tensor
parallel t (Korthikanti et al. 2022, "Reducing Activation Recomputation", Table 2):
  no recompute          sbh·(34 + 5as/h)                  (t = 1)
  TP                    sbh·(10 + 24/t + 5as/(ht))
  TP + sequence par.    sbh·(34 + 5as/h)/t
  selective recompute   drops the 5as/h attention-score term (FlashAttention stores no scores either)
  full recompute        2sbh (the layer input only; /t with sequence parallelism)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

Recompute = Literal["none", "selective", "full"]
GIB = 2**30

BYTES_PARAM = 2  # bf16 weights (ZeRO Sec. 3.1: 2Ψ)
BYTES_GRAD = 2  # bf16 gradients (2Ψ)
BYTES_OPTIMIZER = 12  # fp32 master weights + Adam m + Adam v (K = 12, KΨ)
BYTES_LOGIT = 4  # one fp32 copy of the logits for the cross-entropy (not in Korthikanti's per-layer count)

# DeepSpeed's defaults (zero/config.py), which Kiln's shipped DeepSpeed JSON keeps: how many parameters ZeRO-3 may keep
# gathered, and within how many parameters fetched a parameter used again is kept instead of released. DeepSpeed's own
# ZeRO-3 estimator (estimate_zero3_model_states_mem_needs) counts only the largest layer gathered; with these limits a
# rank holds far more (zero3_gathered_params).
ZERO3_LIVE = {"stage3_max_live_parameters": 1_000_000_000, "stage3_max_reuse_distance": 1_000_000_000}


def zero3_gathered_params(params: float, leaf: float, max_live: float, max_reuse: float) -> float:
    """A bound on the parameters ZeRO-3 holds gathered (whole, on every rank) at once, of `params`: its prefetcher
    fetches ahead until `max_live` are gathered; a parameter to be used again within `max_reuse` parameters fetched is
    kept instead of released, and the way from a module's forward to its backward passes every later module kept
    that way twice, so those are at most half of it; and the module being fetched, which DeepSpeed fetches whatever
    the limits (`leaf`, the largest: a layer, or a Kiln Block, which ZeRO-3 gathers whole). With DeepSpeed's
    defaults a model under a billion parameters stays gathered from forward to backward. Checked on CPU against the
    parameters a real engine holds (tests/training_jobs/test_compile.py)."""
    return min(params, max(max_live, max_reuse / 2) + leaf)


@dataclass(frozen=True)
class ModelShape:
    """A decoder-only transformer with a GELU MLP of width d_ff (default 4·d_model)."""

    n_layers: int
    d_model: int
    n_heads: int
    vocab_size: int
    d_ff: int | None = None
    tie_embeddings: bool = False

    def __post_init__(self) -> None:
        for name in ("n_layers", "d_model", "n_heads", "vocab_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        if self.d_model % self.n_heads:
            raise ValueError(f"d_model={self.d_model} is not divisible by n_heads={self.n_heads}")

    @property
    def ffn_width(self) -> int:
        return self.d_ff if self.d_ff is not None else 4 * self.d_model

    @property
    def non_embedding_params(self) -> int:
        # Kaplan et al. 2020, Table 1: N ≈ 2·d_model·n_layer·(2·d_attn + d_ff), i.e. 12·L·d² for
        # d_ff = 4d; biases and norms (< 0.1%) are left out.
        return self.n_layers * (4 * self.d_model**2 + 2 * self.d_model * self.ffn_width)

    @property
    def embedding_params(self) -> int:
        return (1 if self.tie_embeddings else 2) * self.vocab_size * self.d_model

    @property
    def n_params(self) -> int:
        return self.non_embedding_params + self.embedding_params

    @property
    def matmul_params(self) -> int:
        """The weights every token is multiplied by, as Kiln's trainer counts FLOPs for MFU
        (training_jobs.model.flops_per_token): every layer's and the output head's; the input embedding is a lookup."""
        return self.non_embedding_params + self.vocab_size * self.d_model

    @property
    def largest_layer_params(self) -> int:
        return max(self.vocab_size * self.d_model, self.d_model * self.ffn_width)

    def to_dict(self) -> dict[str, int | bool]:
        return {
            "n_layers": self.n_layers,
            "d_model": self.d_model,
            "n_heads": self.n_heads,
            "vocab_size": self.vocab_size,
            "d_ff": self.ffn_width,
            "tie_embeddings": self.tie_embeddings,
            "n_params": self.n_params,
            "non_embedding_params": self.non_embedding_params,
        }


def shape_for_params(n_params: float, vocab_size: int, aspect_ratio: float | None = None) -> ModelShape:
    """A plausible shape with about `n_params` parameters (untied embeddings included).

    Aspect ratio d_model/n_layers: 64 up to 1e8 parameters rising log-linearly to 128 at 1e10 and above
    (GPT-3 125M: 64, 1.3B: 85, 6.7B and 175B: 128; Kaplan et al. 2020, Fig. 5 find the loss nearly
    flat for ratios ~20-200). Heads of 64 (128 from d_model 2048), rounded to a multiple of 8 heads
    from 16 on so that any tensor-parallel degree ≤ 8 divides them; then the depth that brings the
    count back to about `n_params`."""
    if not n_params > 0:
        raise ValueError(f"n_params must be > 0, got {n_params}")
    if aspect_ratio is None:
        aspect_ratio = 64.0 * 2.0 ** min(1.0, max(0.0, (math.log10(n_params) - 8.0) / 2.0))

    def total(layers: float) -> float:
        d = aspect_ratio * layers
        return 12 * layers * d**2 + 2 * vocab_size * d

    low, high = 1e-3, 1e4  # bisect the (monotone) parameter count in n_layers
    for _ in range(200):
        mid = math.sqrt(low * high)
        low, high = (mid, high) if total(mid) < n_params else (low, mid)
    d_model_raw = aspect_ratio * low
    head_dim = 128 if d_model_raw >= 2048 else 64
    heads_raw = d_model_raw / head_dim
    n_heads = 8 * round(heads_raw / 8) if heads_raw >= 16 else max(1, round(heads_raw))
    d_model = n_heads * head_dim
    n_layers = max(1, round((n_params - 2 * vocab_size * d_model) / (12 * d_model**2)))
    return ModelShape(n_layers=n_layers, d_model=d_model, n_heads=n_heads, vocab_size=vocab_size)


# Training in fp32 instead: fp32 weights and gradients, Adam m and v, no master copy (16 bytes as well).
FP32_STATE_BYTES = (4, 4, 8)


def model_state_bytes_per_param(zero_stage: int, dp: int, precision: str = "bf16") -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes per parameter on each GPU (ZeRO Sec. 5, Fig. 1), mixed precision
    (bf16) or plain fp32."""
    if zero_stage not in (0, 1, 2, 3):
        raise ValueError(f"zero_stage must be 0 (plain DDP), 1, 2 or 3, got {zero_stage}")
    if dp < 1:
        raise ValueError(f"data-parallel degree must be >= 1, got {dp}")
    if precision not in ("bf16", "fp32"):
        raise ValueError(f"precision must be 'bf16' or 'fp32', got {precision!r}")
    param, grad, optimizer = (BYTES_PARAM, BYTES_GRAD, BYTES_OPTIMIZER) if precision == "bf16" else FP32_STATE_BYTES
    weights = param / dp if zero_stage >= 3 else param
    grads = grad / dp if zero_stage >= 2 else grad
    optimizer = optimizer / dp if zero_stage >= 1 else optimizer
    return weights, grads, optimizer


def activation_bytes_per_layer(
    seq_len: int,
    micro_batch: int,
    d_model: int,
    n_heads: int,
    tp: int = 1,
    sequence_parallel: bool = True,
    recompute: Recompute = "none",
) -> float:
    """Bytes of activations one transformer layer keeps for the backward pass (Korthikanti Table 2)."""
    s, b, h, a, t = seq_len, micro_batch, d_model, n_heads, tp
    sharded = t if sequence_parallel else 1
    if recompute == "full":
        return 2.0 * s * b * h / sharded
    attention_scores = 0.0 if recompute == "selective" else 5.0 * a * s / h
    if recompute not in ("none", "selective"):
        raise ValueError(f"recompute must be 'none', 'selective' or 'full', got {recompute!r}")
    if t == 1 or sequence_parallel:
        return s * b * h * (34.0 + attention_scores) / t
    return s * b * h * (10.0 + 24.0 / t + attention_scores / t)


@dataclass(frozen=True)
class MemoryEstimate:
    """Bytes per GPU (and per GPU's share of host memory when offloading)."""

    weights: float
    gradients: float
    optimizer: float
    zero3_working_set: float  # the weights ZeRO-3 keeps gathered and the largest layer's gradient
    activations: float
    logits: float
    cpu_offloaded: float

    @property
    def model_states(self) -> float:
        return self.weights + self.gradients + self.optimizer

    @property
    def total(self) -> float:
        return self.model_states + self.zero3_working_set + self.activations + self.logits

    def to_dict(self) -> dict[str, float]:
        parts = ("weights", "gradients", "optimizer", "zero3_working_set", "activations", "logits")
        out = {f"{name}_gib": getattr(self, name) / GIB for name in (*parts, "cpu_offloaded")}
        out.update({"model_states_gib": self.model_states / GIB, "total_gib": self.total / GIB})
        return out


def estimate_memory(
    shape: ModelShape,
    *,
    seq_len: int,
    micro_batch: int,
    dp: int,
    tp: int = 1,
    pp: int = 1,
    zero_stage: int = 3,
    recompute: Recompute = "selective",
    sequence_parallel: bool = True,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    microbatches_in_flight: int | None = None,
) -> MemoryEstimate:
    """Per-GPU memory for one (tp, pp, dp) layout.

    With pipeline parallelism (1F1B) the first stage holds activations of min(pp, m) micro-batches
    for its n_layers/pp layers (Korthikanti et al. 2022, pipeline-parallelism subsection of the
    activation-memory section): `microbatches_in_flight`
    defaults to pp, i.e. as much as the whole model's layers for one micro-batch."""
    if offload_params and zero_stage != 3:
        raise ValueError(f"offloading parameters needs ZeRO-3 (ZeRO-Infinity), got zero_stage={zero_stage}")
    if offload_optimizer and zero_stage == 0:
        raise ValueError("offloading the optimizer needs ZeRO-1, 2 or 3, got zero_stage=0")
    params_per_rank = shape.n_params / (tp * pp)
    weights, grads, optimizer = (b * params_per_rank for b in model_state_bytes_per_param(zero_stage, dp))
    cpu = 0.0
    if offload_optimizer:
        cpu, optimizer = cpu + optimizer, 0.0
    if offload_params:
        cpu, weights = cpu + weights, 0.0
    gathered = 0.0
    if zero_stage == 3:  # the weights kept whole, and the largest layer's gradient until it is reduced
        largest = shape.largest_layer_params / tp
        live = zero3_gathered_params(shape.n_params / (tp * pp), largest, ZERO3_LIVE["stage3_max_live_parameters"],
                                     ZERO3_LIVE["stage3_max_reuse_distance"])
        gathered = BYTES_PARAM * live + BYTES_GRAD * largest
    in_flight = min(pp, microbatches_in_flight) if microbatches_in_flight is not None else pp
    per_layer = activation_bytes_per_layer(
        seq_len, micro_batch, shape.d_model, shape.n_heads, tp, sequence_parallel, recompute
    )
    activations = per_layer * shape.n_layers / pp * in_flight
    logits = BYTES_LOGIT * seq_len * micro_batch * shape.vocab_size / tp
    return MemoryEstimate(weights, grads, optimizer, gathered, activations, logits, cpu)
