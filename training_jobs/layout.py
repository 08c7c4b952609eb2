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

The estimate per rank is the trainer's memory count, kept with the planner's memory model so that `kiln plan`
decides with the same figures (kiln.planning.memory, estimate_trainer_memory: each term is explained there).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from kiln.planning.memory import (
    GIB,
    LOSS_BYTES_PER_LOGIT,
    ZERO3_LIVE,
    KilnModel,
    MemoryUse,
    activation_bytes_per_token_layer,
    estimate_trainer_memory,
    loss_bytes,
    overlaps_communication,
    reduce_buffers,
    uses_autocast,
)
from training_jobs.model import ModelConfig, param_count
from training_jobs.settings import DEFAULT_MICRO_BATCH

USABLE_FRACTION = 0.9  # of the device's memory; the planner's default (recommend_parallelism)
MICROBATCHES_PER_STAGE = 4  # with pipeline stages, as kiln.planning.parallelism


def kiln_model(cfg: ModelConfig) -> KilnModel:
    """The numbers of `cfg` the memory count reads."""
    return KilnModel(vocab_size=cfg.vocab_size, d_model=cfg.d_model, n_layers=cfg.n_layers,
                     kv_width=cfg.n_kv_heads * cfg.head_dim, ffn_hidden=cfg.ffn_hidden,
                     block_params=param_count(cfg, non_embedding=True), params=param_count(cfg))


def estimate(cfg: ModelConfig, **layout: Any) -> MemoryUse:
    """Per-rank memory of one layout of `cfg` (kiln.planning.memory.estimate_trainer_memory's arguments)."""
    return estimate_trainer_memory(kiln_model(cfg), **layout)


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
