"""The run's layout, chosen for speed: the ZeRO stage and micro-batch the settings leave open.

ZeRO-3 gathers every weight again in each forward and backward: 3Ψ of traffic per micro-batch, against 2Ψ per
step for ZeRO-1 and 2, the same as plain data parallelism (Rajbhandari et al. 2020, "ZeRO", Sec. 7); Hugging
Face's DeepSpeed guide ranks speed 0 > 1 > 2 > 3. Larger micro-batches keep the matmuls large. So, unless the
settings fix them (training.parallelism.zero_stage, a stage in the user's DeepSpeed JSON, micro_batch_size):

- ZeRO stage: on one data-parallel rank without tensor or pipeline parallelism, 0 when it reaches the largest
  micro-batch any stage reaches: there ZeRO has nothing to partition and no gradient to reduce, yet its per-parameter
  gradient hooks, bucket copies and per-tensor norms cost host time every step (bench/step_overhead.py), while
  ZeRO-0 runs torch's fused AdamW on fp32 weights under bf16 autocast (uses_autocast), as the reference loop of
  bench/train_bench.py does.
  Otherwise the lower of 1 and 2 that reaches the largest micro-batch either reaches; ZeRO-3 only when neither fits
  micro-batch 1 (it partitions the weights as well). With pipeline stages: 1 (DeepSpeed's pipeline engine runs 0
  or 1).
- micro-batch: the largest divisor of the per-rank batch (micro_batch_size x grad_accum, 8 x grad_accum when
  "auto": the global batch of the settings is kept) that fits; grad_accum = per-rank batch / micro-batch. A
  divisor always exists (1), so the global batch never changes. With pipeline stages, only splits that leave
  at least 4·pp micro-batches per step (where the batch allows), as the planner does.
- fits: the estimate below within 90% of the device's memory (the planner's headroom,
  kiln.planning.parallelism), the rest for the CUDA context, NCCL and the allocator's fragmentation.
- on CPU there is no device memory to plan against: the DeepSpeed JSON's stage and micro-batch 8, as before.

The estimate per rank: model states from the planner's memory model (kiln.planning.memory: ZeRO Sec. 5) for the
exact parameter count; ZeRO's gradient buckets of reduce_bucket_size elements, as DeepSpeed allocates them with
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

from dataclasses import dataclass
from typing import Any

from kiln.planning.memory import GIB, ZERO3_LIVE, model_state_bytes_per_param, zero3_gathered_params
from training_jobs.model import ModelConfig, loss_chunk_tokens, param_count
from training_jobs.settings import DEFAULT_MICRO_BATCH

USABLE_FRACTION = 0.9  # of the device's memory; the planner's default (recommend_parallelism)
LOSS_BYTES_PER_LOGIT = 12  # the whole-logits loss (lm_loss) at its peak: bf16 logits 2 + fp32 copy 4 + log-softmax 4 (+ its gradients)
WORKING_BYTES = {"bf16": 2, "fp32": 4}  # activations, gathered weights and gradient buckets
MICROBATCHES_PER_STAGE = 4  # with pipeline stages, as kiln.planning.parallelism


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


def activation_bytes_per_token_layer(cfg: ModelConfig, precision: str, tp: int = 1, autocast: bool = False,
                                     compiled: bool = False) -> float:
    """What one of Kiln's blocks keeps for backward per token (the module docstring's count)."""
    h, kv, f = cfg.d_model, cfg.n_kv_heads * cfg.head_dim, cfg.ffn_hidden
    eager_casts = 6 * h if autocast and not compiled else 0  # q, k, v, gate and up cast their inputs each
    return ((16 * h + (6 * h + 4 * kv + 8 * f) / tp) * WORKING_BYTES[precision] / 2 + (4 * h if autocast else 0)
            + eager_casts)


def loss_bytes(cfg: ModelConfig, tokens: int, precision: str, whole_logits: bool = False,
               autocast: bool = False) -> float:
    """The loss's peak (the module docstring's count)."""
    if whole_logits:
        return LOSS_BYTES_PER_LOGIT * tokens * cfg.vocab_size
    chunk = min(tokens, loss_chunk_tokens(cfg.vocab_size))
    hidden_grad = 4 if autocast else WORKING_BYTES[precision]
    return 8 * chunk * cfg.vocab_size + tokens * cfg.d_model * hidden_grad + 4 * cfg.vocab_size * cfg.d_model


def estimate(cfg: ModelConfig, *, seq_len: int, micro_batch: int, precision: str, zero_stage: int, dp: int,
             tp: int = 1, pp: int = 1, grad_accum: int = 1, activation_checkpointing: bool = False,
             reduce_bucket_size: int = 0, whole_logits: bool = False, compiled: bool = False,
             overlap_comm: bool | None = None, max_live_parameters: int = ZERO3_LIVE["stage3_max_live_parameters"],
             max_reuse_distance: int = ZERO3_LIVE["stage3_max_reuse_distance"]) -> MemoryUse:
    """Per-rank memory of one layout (see the module docstring for each term). `compiled`: training.compile
    resolved; `overlap_comm`: the DeepSpeed JSON's, None for "auto" (overlaps_communication); the last two: the
    JSON's stage3_max_live_parameters and stage3_max_reuse_distance."""
    word = WORKING_BYTES[precision]
    autocast = uses_autocast(zero_stage, precision)
    body = param_count(cfg, non_embedding=True)
    params = (body / tp + (param_count(cfg) - body)) / pp  # AutoTP splits the blocks, not the embedding
    # under autocast the states are fp32 weights, gradients and Adam moments: 4 + 4 + 8 B
    states = params * sum(model_state_bytes_per_param(zero_stage, dp, "fp32" if autocast else precision))
    overlap = overlap_comm if overlap_comm is not None else overlaps_communication(zero_stage, compiled)
    buckets = float(reduce_buffers(zero_stage, overlap) * reduce_bucket_size * word)
    zero3 = 0.0
    if zero_stage == 3:  # a Block is a ZeRO-3 leaf: gathered whole, its gradient whole until reduced
        leaf = max(cfg.vocab_size * cfg.d_model, body / cfg.n_layers / tp)
        zero3 = (zero3_gathered_params(params, leaf, max_live_parameters, max_reuse_distance) + leaf) * word
    tokens = seq_len * micro_batch
    per_layer = activation_bytes_per_token_layer(cfg, precision, tp, autocast, compiled)
    layers = cfg.n_layers / pp
    if activation_checkpointing:  # each block keeps its input; one block's activations during its recompute
        kept = layers * cfg.d_model * word + per_layer
    else:
        kept = layers * per_layer
    in_flight = min(pp, grad_accum)  # 1F1B: the first stage holds up to pp micro-batches (Narayanan et al. 2021)
    head = 8 * cfg.d_model * word / 2 + (2 * cfg.d_model if autocast else 0)  # the final norm, the lm_head's input
    activations = tokens * (kept * in_flight + head)
    if autocast and not compiled:  # eager autocast's bf16 copies of the block weights, kept for backward
        activations += 2 * body / tp / pp
    return MemoryUse(states, buckets, zero3, activations, loss_bytes(cfg, tokens, precision, whole_logits, autocast))


@dataclass(frozen=True)
class Layout:
    """The ZeRO stage (None: the DeepSpeed JSON's), micro-batch and grad_accum of a run, and why."""

    zero_stage: int | None
    micro_batch: int
    grad_accum: int
    reason: str
    chosen: tuple[str, ...] = ()  # which of "zero_stage", "micro_batch" were chosen here (the rest were given)
    memory: MemoryUse | None = None  # the estimate for this layout (None on CPU)
    device_memory: int | None = None  # bytes

    def to_dict(self) -> dict[str, Any]:
        return {"zero_stage": self.zero_stage, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
                "chosen": list(self.chosen), "reason": self.reason,
                "memory_gib": self.memory.to_gib() if self.memory else None,
                "device_memory_gib": round(self.device_memory / GIB, 3) if self.device_memory else None}


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def choose_layout(cfg: ModelConfig, *, seq_len: int, precision: str, device_memory: int | None, dp: int,
                  sequences_per_rank: int, tp: int = 1, pp: int = 1, zero_stage: int | None = None,
                  micro_batch: int | None = None, activation_checkpointing: bool = False,
                  reduce_bucket_size: int = 0, whole_logits: bool = False, compiled: bool = False,
                  overlap_comm: bool | None = None,
                  max_live_parameters: int = ZERO3_LIVE["stage3_max_live_parameters"],
                  max_reuse_distance: int = ZERO3_LIVE["stage3_max_reuse_distance"],
                  zero_stage_from: str = "training.parallelism.zero_stage",
                  micro_batch_from: str = "training.micro_batch_size") -> Layout:
    """The layout of a run (rules in the module docstring). `zero_stage` / `micro_batch` given: kept, and
    `*_from` says who gave them; `sequences_per_rank`: the global batch / dp, which the layout keeps;
    `device_memory`: bytes per device, None on CPU; the DeepSpeed settings after `reduce_bucket_size`: as
    estimate's."""
    if micro_batch is not None and sequences_per_rank % micro_batch:
        raise ValueError(f"the per-rank batch of {sequences_per_rank} sequences is not a multiple of the "
                         f"micro-batch {micro_batch}")
    splits = [micro_batch] if micro_batch else [m for m in range(sequences_per_rank, 0, -1)
                                                 if sequences_per_rank % m == 0]
    if pp > 1 and not micro_batch and device_memory is not None:  # the planner's rule: >= 4·pp micro-batches per
        # step keep the 1F1B bubble (pp-1)/(m+pp-1) near 20% or below (kiln.planning.parallelism)
        splits = [m for m in splits if sequences_per_rank // m >= MICROBATCHES_PER_STAGE * pp] or splits[-1:]
    stage_given = zero_stage is not None
    if pp > 1 and not stage_given:
        zero_stage, zero_stage_from = 1, "pipeline stages: DeepSpeed's pipeline engine runs ZeRO-0/1 only"
    # what this function decides (the rest was given); on CPU the stage stays the JSON's unless pipelined
    stage_decided = not stage_given and (device_memory is not None or pp > 1)
    chosen = tuple(name for name, decided in (("zero_stage", stage_decided), ("micro_batch", micro_batch is None))
                   if decided)
    if device_memory is None:
        micro = micro_batch or max(m for m in splits if m <= DEFAULT_MICRO_BATCH)
        stage = f"ZeRO-{zero_stage} ({zero_stage_from})" if zero_stage is not None else "the DeepSpeed JSON's stage"
        given = f" ({micro_batch_from})" if micro_batch else ""
        return Layout(zero_stage, micro, sequences_per_rank // micro,
                      f"no accelerator, no device memory to plan against: {stage}, micro-batch {micro}{given}", chosen)

    usable = USABLE_FRACTION * device_memory

    def use(stage: int, micro: int) -> MemoryUse:
        return estimate(cfg, seq_len=seq_len, micro_batch=micro, precision=precision, zero_stage=stage, dp=dp, tp=tp,
                        pp=pp, grad_accum=sequences_per_rank // micro,
                        activation_checkpointing=activation_checkpointing,
                        reduce_bucket_size=reduce_bucket_size, whole_logits=whole_logits, compiled=compiled,
                        overlap_comm=overlap_comm, max_live_parameters=max_live_parameters,
                        max_reuse_distance=max_reuse_distance)

    def largest_fitting(stage: int) -> int | None:
        return next((m for m in splits if use(stage, m).total <= usable), None)

    budget = f"the usable {_gib(usable)} ({USABLE_FRACTION:.0%} of {_gib(device_memory)})"
    if zero_stage is not None:
        stage, micro = zero_stage, largest_fitting(zero_stage)
        why_stage = f"ZeRO-{stage}: {zero_stage_from}"
    else:
        single = dp == 1 and tp == 1 and pp == 1
        reach = {s: largest_fitting(s) for s in ((0, 1, 2) if single else (1, 2))}
        best = max((m for m in reach.values() if m), default=None)
        if best is not None:
            stage, micro = min(s for s, m in reach.items() if m == best), best
            states = use(stage, micro).model_states
            why_stage = (f"ZeRO-{stage}: model states {_gib(states)} per rank fit without partitioning the weights "
                         f"(no ZeRO-3 re-gathering)")
            if stage == 0:
                why_stage += ("; one data-parallel rank leaves ZeRO nothing to partition or reduce (no per-parameter "
                              "gradient hooks)" + ("; fp32 weights under bf16 autocast" * uses_autocast(0, precision)))
            if stage == 2:
                why_stage += (f"; ZeRO-1 reaches only micro-batch {reach[1]}" if reach[1] else
                              f"; ZeRO-1 needs {_gib(use(1, splits[-1]).total)} at micro-batch {splits[-1]}")
        else:
            stage, micro = 3, largest_fitting(3)
            why_stage = (f"ZeRO-3: ZeRO-2 needs {_gib(use(2, splits[-1]).total)} per rank at micro-batch "
                         f"{splits[-1]}, more than {budget}; partitioning the weights over dp {dp} too")
    fits = micro is not None
    micro = micro if fits else splits[-1]
    memory = use(stage, micro)
    grad_accum = sequences_per_rank // micro
    if not fits:
        remedies = ["set training.model.activation_checkpointing"] * (not activation_checkpointing)
        remedies += ["use more GPUs", "a shorter seq_len"]
        if stage == 3:  # the limits DeepSpeed keeps gathered weights within (zero3_gathered_params)
            remedies.append(f"lower zero_optimization.stage3_max_live_parameters and stage3_max_reuse_distance "
                            f"({max_live_parameters:.3g} and {max_reuse_distance:.3g}) in the DeepSpeed JSON "
                            f"(training.deepspeed_config), within which ZeRO-3's working set is "
                            f"{_gib(memory.zero3_working_set)}")
        why_micro = (f"micro-batch {micro}: does not fit by this estimate ({_gib(memory.total)} > {budget}); expect "
                     f"out-of-memory: {', '.join(remedies[:-1])} or {remedies[-1]}")
    elif micro_batch:
        why_micro = f"micro-batch {micro}: {micro_batch_from} ({_gib(memory.total)} of {budget})"
    elif micro == sequences_per_rank:
        why_micro = (f"micro-batch {micro}: the whole per-rank batch fits ({_gib(memory.total)} of {budget}), "
                     f"grad_accum 1")
    else:
        larger = splits[splits.index(micro) - 1]
        why_micro = (f"micro-batch {micro}: the largest split of the per-rank batch of {sequences_per_rank} that fits "
                     f"({_gib(memory.total)} of {budget}; {larger} would need {_gib(use(stage, larger).total)}), "
                     f"grad_accum {grad_accum} keeps the global batch")
    return Layout(stage, micro, grad_accum, f"{why_stage}; {why_micro}", chosen, memory, device_memory)


__all__ = ["LOSS_BYTES_PER_LOGIT", "loss_bytes", "USABLE_FRACTION", "Layout", "MemoryUse", "activation_bytes_per_token_layer",
           "choose_layout", "estimate", "overlaps_communication", "reduce_buffers", "uses_autocast"]
