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

Kiln's own trainer (training_jobs/model.py: RMSNorm, grouped-query attention, a SwiGLU MLP; DeepSpeed ZeRO, with
AutoTP tensor parallelism: no sequence parallelism, norms, embedding and head whole on every rank) is counted
differently, by estimate_trainer_memory, which both the trainer's layout (training_jobs.layout) and the planner's
layouts that Kiln trains (kiln.planning.parallelism) use. The trainer's estimate per rank: model states
(model_state_bytes_per_param: ZeRO Sec. 5) for the exact parameter count; ZeRO's gradient buckets of reduce_bucket_size elements, as DeepSpeed allocates them with
contiguous_gradients (the shipped JSON's): at ZeRO-1/2 two with overlap_comm (a double buffer), one without it (a
compiled model's default, overlaps_communication), at ZeRO-3 one, overlap_comm or not;
under ZeRO-3 the weights it keeps gathered (zero3_gathered_params) and one leaf module's gradient (a Block, or the
embedding, whichever is larger); the activations Kiln's own block keeps for backward;
the loss. The activations are counted from training_jobs/model.py instead of Korthikanti et al.'s 34·s·b·h (a GPT
block with a GELU MLP and dropout), in bytes per token and layer, bf16, flash attention (no scores kept):

    two RMSNorms, each its fp32 input 4h and bf16 output 2h, and that output as the projections' input 2h: 16h
    attention: q 2h, k and v 2·2·kv, the attention output 2h and its reshaped copy into o_proj 2h: 6h + 4kv
    SwiGLU: gate, silu(gate), up and their product, each f wide: 8f

i.e. 16h + (6h + 4kv + 8f)/tp (AutoTP splits heads and the MLP, not the norms), kv = n_kv_heads·head_dim, f the
MLP width; double that in fp32. Under autocast (ZeRO-0 in bf16) the residual stream and the norms' outputs are
fp32, and the projections keep their own bf16 copy of their input: 4h more per layer (two norm outputs at 4h, not
2h), 2h more for the final norm, and the loss's hidden-state gradient in fp32. Eager (compile off) autocast casts
again at each projection: q, k and v each keep a bf16 copy of the first norm's output, gate and up of the second's,
6h more per layer, and each block matrix's bf16 copy (2 B a parameter) is kept for backward; a compiled graph casts
each once. Checked against what autograd saves for an eager block, on CPU (tests/training_jobs/test_layout.py): the
count is 3-4% above it in bf16 and under autocast (the reshaped copy into o_proj is a view there). The loss (loss_bytes):
linear_cross_entropy holds one chunk of fp32 logits and its gradient (2 x 4 bytes a logit), the hidden states'
gradient and the weight's fp32 gradient; the whole-logits loss the trainer had before (whole_logits=True;
LOSS_BYTES_PER_LOGIT) bf16 logits, their fp32 copy and log-softmax, then two fp32 gradients in backward. Checked
against docs/bench/long_context_125m_h200.json (125m, seq_len 2048, micro-batch 8, ZeRO-3 with the old d²-sized
buckets, one H200): 14.05 GiB peak allocated, 14.5 GiB estimated (tests/training_jobs/test_layout.py works it
through, with that run's whole-logits loss).
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


# ZeRO's buckets, in elements: DeepSpeed's documented defaults (deepspeed/runtime/zero/config.py; the config-json
# docs), reduce_bucket_size 5e8, stage3_prefetch_bucket_size 5e7, stage3_param_persistence_threshold 1e5, each bucket
# capped at the model's parameter count: DeepSpeed allocates the reduce buffers whole (reduce_buffers), and a
# bucket larger than all the gradients is never filled (5e8 would be 4 GB of fp32 buffers per rank for the CPU demo's
# tiny model). Hugging Face's "auto" sizes, used before (d², 0.9·d², 10·d), made the prefetch smaller than one MLP
# matrix and kept only norm gains whole, so ZeRO-3 gathered every weight on demand in small pieces. Not measured on a
# GPU here; estimate_trainer_memory counts the buffers (training_jobs.setup.zero_buckets sizes them).
DEEPSPEED_BUCKETS = {"reduce_bucket_size": 500_000_000, "stage3_prefetch_bucket_size": 50_000_000,
                     "stage3_param_persistence_threshold": 100_000}


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

    def kiln_model(self) -> KilnModel:
        """This shape as Kiln's trainer builds it (training_jobs/model.py): a SwiGLU MLP 2/3 as wide (three matrices
        for the GELU MLP's two, the same parameters), a kv head per query head, two norm gains a layer and a final
        one."""
        d, f = self.d_model, round(2 * self.ffn_width / 3)
        blocks = self.n_layers * (4 * d * d + 3 * d * f + 2 * d) + d
        return KilnModel(vocab_size=self.vocab_size, d_model=d, n_layers=self.n_layers, kv_width=d, ffn_hidden=f,
                         block_params=blocks, params=blocks + self.embedding_params)

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


# The fp32 logits of one chunk of tokens in linear_cross_entropy stay under this many bytes, so the loss never holds
# the whole (tokens, vocab) logits: at micro-batch 8 x 2048 tokens and a 32k vocabulary those are 2 GiB in fp32, and
# the plain path holds the bf16 logits, their fp32 copy and the fp32 log-softmax kept for backward, then the
# gradient. 256 MiB is about 2,100 tokens a chunk at a 32k vocabulary (500 at 128k): matmuls large enough to run at
# full speed on a GPU. A chunk's peak is about twice this (logsumexp's temporary beside the fp32 logits).
LOSS_CHUNK_BYTES = 256 * 2**20
LOSS_BYTES_PER_LOGIT = 12  # the whole-logits loss (lm_loss) at its peak: bf16 logits 2 + fp32 copy 4 + log-softmax 4 (+ its gradients)
WORKING_BYTES = {"bf16": 2, "fp32": 4}  # activations, gathered weights and gradient buckets


def loss_chunk_tokens(vocab_size: int) -> int:
    return max(1, LOSS_CHUNK_BYTES // (4 * vocab_size))


@dataclass(frozen=True)
class KilnModel:
    """The numbers of Kiln's model (training_jobs.model.ModelConfig) its memory depends on."""

    vocab_size: int
    d_model: int
    n_layers: int
    kv_width: int  # n_kv_heads x head_dim
    ffn_hidden: int  # the SwiGLU width
    block_params: int  # every parameter but the embeddings (training_jobs.model.param_count non_embedding)
    params: int


@dataclass(frozen=True)
class MemoryUse:
    """Estimated bytes per rank at the peak of a step (the start of backward)."""

    model_states: float  # weights, gradients, optimizer states (this rank's share)
    buckets: float  # ZeRO's gradient reduction buffers
    zero3_working_set: float  # ZeRO-3's gathered weights and one leaf module's gradient
    activations: float
    loss: float

    @property
    def total(self) -> float:
        return self.model_states + self.buckets + self.zero3_working_set + self.activations + self.loss

    def to_gib(self) -> dict[str, float]:
        parts = ("model_states", "buckets", "zero3_working_set", "activations", "loss", "total")
        return {name: round(getattr(self, name) / GIB, 3) for name in parts}


def uses_autocast(zero_stage: int | None, precision: str) -> bool:
    """Whether a run trains fp32 weights under bf16 autocast (DeepSpeed's torch_autocast) rather than DeepSpeed's
    bf16 weights with fp32 master copies: at ZeRO-0 in bf16, where DeepSpeed would otherwise wrap the optimizer in
    its BF16_Optimizer (per-parameter hooks again); the same math as the reference loop."""
    return zero_stage == 0 and precision == "bf16"


def overlaps_communication(stage: int, compiled: bool) -> bool:
    """overlap_comm's "auto": reduce gradients on a stream of their own only where that overlaps the backward. At
    ZeRO-3 each block's hooks reduce its gradients while the blocks before it run backward (setup.compile_model
    compiles block by block there), and at ZeRO-1/2 so do an eager model's per-parameter hooks. With the whole model
    compiled (ZeRO-1/2 on CUDA) every gradient comes out of one compiled backward and every hook runs after it
    (tested), so the reduction only waits for the backward's end, and overlap_comm costs a device synchronize at the
    end of each backward (before DeepSpeed reuses its buffers) for nothing; off there is also DeepSpeed's own default
    (on at ZeRO-3 only, zero/config.py). ZeRO-0 has no such hooks."""
    return stage == 3 or (stage in (1, 2) and not compiled)


def reduce_buffers(stage: int, overlap_comm: bool) -> int:
    """How many reduce buckets DeepSpeed allocates (contiguous_gradients): ZeRO-1/2 a second one with overlap_comm
    (stage_1_and_2.py, setup_buckets), ZeRO-3 one whatever overlap_comm (stage3.py), ZeRO-0 none."""
    if stage == 0:
        return 0
    return 2 if stage in (1, 2) and overlap_comm else 1


def activation_bytes_per_token_layer(model: KilnModel, precision: str, tp: int = 1, autocast: bool = False,
                                     compiled: bool = False) -> float:
    """What one of Kiln's blocks keeps for backward per token (the module docstring's count)."""
    h, kv, f = model.d_model, model.kv_width, model.ffn_hidden
    eager_casts = 6 * h if autocast and not compiled else 0  # q, k, v, gate and up cast their inputs each
    return ((16 * h + (6 * h + 4 * kv + 8 * f) / tp) * WORKING_BYTES[precision] / 2 + (4 * h if autocast else 0)
            + eager_casts)


def loss_bytes(model: KilnModel, tokens: int, precision: str, whole_logits: bool = False,
               autocast: bool = False) -> float:
    """The loss's peak (the module docstring's count)."""
    if whole_logits:
        return LOSS_BYTES_PER_LOGIT * tokens * model.vocab_size
    chunk = min(tokens, loss_chunk_tokens(model.vocab_size))
    hidden_grad = 4 if autocast else WORKING_BYTES[precision]
    return 8 * chunk * model.vocab_size + tokens * model.d_model * hidden_grad + 4 * model.vocab_size * model.d_model


def estimate_trainer_memory(model: KilnModel, *, seq_len: int, micro_batch: int, precision: str, zero_stage: int,
                            dp: int, tp: int = 1, pp: int = 1, grad_accum: int = 1,
                            activation_checkpointing: bool = False, reduce_bucket_size: int = 0,
                            whole_logits: bool = False, compiled: bool = False, overlap_comm: bool | None = None,
                            max_live_parameters: int = ZERO3_LIVE["stage3_max_live_parameters"],
                            max_reuse_distance: int = ZERO3_LIVE["stage3_max_reuse_distance"]) -> MemoryUse:
    """Per-rank memory of one layout of Kiln's trainer (each term in the module docstring). `compiled`:
    training.compile resolved; `overlap_comm`: the DeepSpeed JSON's, None for "auto" (overlaps_communication); the last two: the
    JSON's stage3_max_live_parameters and stage3_max_reuse_distance."""
    word = WORKING_BYTES[precision]
    autocast = uses_autocast(zero_stage, precision)
    body = model.block_params
    params = (body / tp + (model.params - body)) / pp  # AutoTP splits the blocks, not the embedding
    # under autocast the states are fp32 weights, gradients and Adam moments: 4 + 4 + 8 B
    states = params * sum(model_state_bytes_per_param(zero_stage, dp, "fp32" if autocast else precision))
    overlap = overlap_comm if overlap_comm is not None else overlaps_communication(zero_stage, compiled)
    buckets = float(reduce_buffers(zero_stage, overlap) * reduce_bucket_size * word)
    zero3 = 0.0
    if zero_stage == 3:  # a Block is a ZeRO-3 leaf: gathered whole, its gradient whole until reduced
        leaf = max(model.vocab_size * model.d_model, body / model.n_layers / tp)
        zero3 = (zero3_gathered_params(params, leaf, max_live_parameters, max_reuse_distance) + leaf) * word
    tokens = seq_len * micro_batch
    per_layer = activation_bytes_per_token_layer(model, precision, tp, autocast, compiled)
    layers = model.n_layers / pp
    if activation_checkpointing:  # each block keeps its input; one block's activations during its recompute
        kept = layers * model.d_model * word + per_layer
    else:
        kept = layers * per_layer
    in_flight = min(pp, grad_accum)  # 1F1B: the first stage holds up to pp micro-batches (Narayanan et al. 2021)
    head = 8 * model.d_model * word / 2 + (2 * model.d_model if autocast else 0)  # the final norm, the lm_head's input
    activations = tokens * (kept * in_flight + head)
    if autocast and not compiled:  # eager autocast's bf16 copies of the block weights, kept for backward
        activations += 2 * body / tp / pp
    return MemoryUse(states, buckets, zero3, activations, loss_bytes(model, tokens, precision, whole_logits, autocast))
