"""Choose tensor (TP), pipeline (PP) and data (DP) parallel degrees, micro-batch and accumulation.

Rules (Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters",
Sec. 3 takeaways): tensor parallelism only inside a node, where NVLink is an order of magnitude
faster than the network; pipeline parallelism only when the model does not fit otherwise; the rest
data parallel. Each candidate layout takes the largest power-of-two micro-batch that fits (≤ 16, not
past the global batch, and with PP keeping ≥ 4·pp micro-batches per step so the 1F1B bubble stays
≲ 20%). Then:

1. the smallest pipeline degree at which anything fits (PP=1 first: no bubble, and DeepSpeed runs
   only ZeRO-0/1 under PP);
2. among the layouts that fit at that degree (and keep DP ≤ the global batch in sequences, if
   any can), in the order cheaper recompute first (full recompute
   repeats the forward: ~33% more compute), then smaller TP (TP adds two all-reduces per layer in
   forward and backward), the first whose data-parallel traffic can hide behind its compute time;
   if none can, the one with the least traffic. (Under ZeRO-3 that traffic scales with the number of
   micro-batches, so a larger TP that frees memory for a larger micro-batch can win.)

If nothing fits, the layout closest to fitting is returned with `fits` False.

Memory: a layout Kiln's trainer runs (TP or PP at 1) fits by the trainer's own count (memory.estimate_trainer_memory:
DeepSpeed AutoTP, no sequence parallelism, the embedding and head whole on each rank, full recompute as
activation checkpointing), the count the run itself decides with; one it does not run (TP and PP at once, a
Megatron-style 3D layout) by Korthikanti et al.'s figures with sequence parallelism (memory.estimate_memory).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from kiln.planning.hardware import GpuSpec
from kiln.planning.memory import (
    DEEPSPEED_BUCKETS,
    GIB,
    MemoryEstimate,
    MemoryUse,
    ModelShape,
    Recompute,
    estimate_memory,
    estimate_trainer_memory,
)

BYTES_PER_COMM_ELEMENT = 2  # bf16 gradients and parameters on the wire
MICROBATCHES_PER_STAGE = 4  # with PP, aim for m ≥ 4·pp micro-batches per step
MAX_MICRO_BATCH = 16


@dataclass(frozen=True)
class Cluster:
    gpu: GpuSpec
    nodes: int
    gpus_per_node: int
    inter_node_gb_s: float = 50.0  # per GPU per direction: one 400 Gb/s NIC per GPU
    intra_node_gb_s: float | None = None  # None: the GPU's own link (hardware table)

    def __post_init__(self) -> None:
        if self.nodes < 1 or self.gpus_per_node < 1:
            raise ValueError(
                f"a cluster needs >= 1 node and >= 1 GPU per node, got {self.nodes} x {self.gpus_per_node}"
            )

    @property
    def n_gpus(self) -> int:
        return self.nodes * self.gpus_per_node

    @property
    def intra_bandwidth_gb_s(self) -> float:
        return self.intra_node_gb_s if self.intra_node_gb_s is not None else self.gpu.intra_node_gb_s

    def to_dict(self) -> dict:
        return {"gpu": self.gpu.name, "nodes": self.nodes, "gpus_per_node": self.gpus_per_node,
                "n_gpus": self.n_gpus, "intra_node_gb_s": self.intra_bandwidth_gb_s,
                "inter_node_gb_s": self.inter_node_gb_s}


def pipeline_bubble_fraction(pp: int, n_microbatches: int) -> float:
    """Idle share of a 1F1B step: (p-1)/(m+p-1) (Narayanan et al. 2021, Sec. 2.2: bubble time over
    ideal time is (p-1)/m)."""
    if pp < 1 or n_microbatches < 1:
        raise ValueError(f"pp and n_microbatches must be >= 1, got pp={pp}, m={n_microbatches}")
    return (pp - 1) / (n_microbatches + pp - 1)


def tensor_parallel_candidates(n_heads: int, gpus_per_node: int) -> list[int]:
    """Powers of two that fit in one node and divide both the node and the attention heads."""
    out, t = [], 1
    while t <= gpus_per_node:
        if n_heads % t == 0 and gpus_per_node % t == 0:
            out.append(t)
        t *= 2
    return out


def pipeline_parallel_candidates(n_layers: int, n_gpus: int, tp: int) -> list[int]:
    """Stage counts that split the layers evenly and leave an integer data-parallel degree."""
    return [p for p in range(1, n_layers + 1) if n_layers % p == 0 and n_gpus % (tp * p) == 0]


def kiln_trains(tp: int, pp: int) -> bool:
    """Kiln's trainer runs tensor or pipeline parallelism, not both (training_jobs.settings.Parallelism)."""
    return tp == 1 or pp == 1


@dataclass(frozen=True)
class ParallelismPlan:
    tp: int
    pp: int
    dp: int
    zero_stage: int
    recompute: Recompute
    micro_batch: int
    grad_accum: int
    seq_len: int
    target_batch_tokens: int
    n_params: int
    memory: MemoryEstimate
    usable_bytes: float
    bubble_fraction: float
    compute_seconds_per_step: float
    dp_comm_seconds_per_step: float
    explanation: list[str] = field(default_factory=list)
    trainer_memory: MemoryUse | None = None  # Kiln's trainer's count, for a layout it runs

    @property
    def needed_bytes(self) -> float:
        """Per GPU, by the count this layout is judged by (the module docstring)."""
        return self.trainer_memory.total if self.trainer_memory is not None else self.memory.total

    @property
    def fits(self) -> bool:
        return self.needed_bytes <= self.usable_bytes

    @property
    def kiln_trains_it(self) -> bool:
        return kiln_trains(self.tp, self.pp)

    def describe(self) -> str:
        """The layout in words, as `kiln plan` prints it."""
        return (f"TP {self.tp} x PP {self.pp} x DP {self.dp}, ZeRO-{self.zero_stage}, {self.recompute} recompute, "
                f"micro-batch {self.micro_batch} x {self.grad_accum} accumulation"
                + (f", bubble {self.bubble_fraction:.0%}" if self.pp > 1 else ""))

    @property
    def global_batch_sequences(self) -> int:
        return self.micro_batch * self.grad_accum * self.dp

    @property
    def global_batch_tokens(self) -> int:
        return self.global_batch_sequences * self.seq_len

    def training_block(self) -> dict:
        """The project config's `training:` keys for this layout, `{"parallelism": {tp, pp, dp, zero_stage,
        micro_batch, grad_accum}}`, as `training_jobs.settings.Parallelism` reads them (`kiln plan --json`
        prints it under "training"). Its micro_batch / grad_accum fill training.micro_batch_size / grad_accum.
        With full recompute also `{"model": {"activation_checkpointing": True}}`: the layout fits only with it, and
        the trainer recomputes only when told."""
        block: dict = {"parallelism": {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "zero_stage": self.zero_stage,
            "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
        }}
        if self.recompute == "full":
            block["model"] = {"activation_checkpointing": True}
        return block

    def to_dict(self) -> dict:
        return {
            "tp": self.tp, "pp": self.pp, "dp": self.dp, "zero_stage": self.zero_stage,
            "recompute": self.recompute, "micro_batch": self.micro_batch, "grad_accum": self.grad_accum,
            "global_batch_sequences": self.global_batch_sequences,
            "global_batch_tokens": self.global_batch_tokens, "target_batch_tokens": self.target_batch_tokens,
            "fits": self.fits, "usable_gib": self.usable_bytes / GIB, "needed_gib": self.needed_bytes / GIB,
            "memory": self.memory.to_dict(),
            "trainer_memory_gib": None if self.trainer_memory is None else self.trainer_memory.to_gib(),
            "bubble_fraction": self.bubble_fraction,
            "compute_seconds_per_step": self.compute_seconds_per_step,
            "dp_comm_seconds_per_step": self.dp_comm_seconds_per_step,
            "explanation": list(self.explanation),
        }


def _dp_comm_seconds(
    n_params: float, tp: int, pp: int, dp: int, zero_stage: int, grad_accum: int, bandwidth_gb_s: float
) -> float:
    """Data-parallel traffic per optimizer step over one GPU's link (ring collectives move (dp-1)/dp of
    the payload Ψ). DDP / ZeRO-1: 2Ψ per step, the gradients reduced once at the accumulation boundary
    (reduce-scatter + all-gather, or an all-reduce); ZeRO-2: Ψ per micro-batch and Ψ per step, DeepSpeed reducing
    the partitioned gradients in every backward (stage_1_and_2.reduce_ready_partitions_and_remove_grads:
    `partition_gradients or is_gradient_accumulation_boundary()`) so each rank keeps only its shard, then the
    weights all-gathered after the step; ZeRO-3: 3Ψ per micro-batch, the weights being all-gathered in forward and
    backward again (Rajbhandari et al. 2020, Sec. 7.2: 2Ψ and 3Ψ for one micro-batch a step)."""
    if dp == 1:
        return 0.0
    payload = BYTES_PER_COMM_ELEMENT * n_params / (tp * pp) * (dp - 1) / dp
    volume = {3: 3 * payload * grad_accum, 2: payload * (grad_accum + 1)}.get(zero_stage, 2 * payload)
    return volume / (bandwidth_gb_s * 1e9)


def recommend_parallelism(
    shape: ModelShape,
    cluster: Cluster,
    *,
    seq_len: int,
    global_batch_tokens: int,
    flops_per_token: float,
    mfu: float,
    zero_stage: int = 3,
    recompute: Recompute | None = None,
    flash_attention: bool = True,
    offload_optimizer: bool = False,
    offload_params: bool = False,
    usable_memory_fraction: float = 0.9,
    tp_with_pp: bool = True,
) -> ParallelismPlan:
    """The recommended layout (selection rules in the module docstring); memory must fit in
    `usable_memory_fraction` of the GPU. If nothing fits, the closest layout with `fits` False.
    `tp_with_pp` False: only layouts with TP or PP of 1, the ones Kiln's trainer runs."""
    n = cluster.n_gpus
    usable = usable_memory_fraction * cluster.gpu.memory_bytes
    target_sequences = max(1, round(global_batch_tokens / seq_len))
    bandwidth = cluster.inter_node_gb_s if cluster.nodes > 1 else cluster.intra_bandwidth_gb_s
    if recompute is not None:
        recompute_options: tuple[Recompute, ...] = (recompute,)
    else:  # FlashAttention already avoids storing scores: "selective" memory at no recompute cost
        recompute_options = ("selective", "full") if flash_attention else ("none", "full")
    tps = [t for t in tensor_parallel_candidates(shape.n_heads, cluster.gpus_per_node) if t <= n]

    kiln_model = shape.kiln_model()

    def memory_for(tp: int, pp: int, stage: int, mode: Recompute,
                   batch: int) -> tuple[MemoryEstimate, MemoryUse | None, int]:
        dp = n // (tp * pp)
        grad_accum = math.ceil(target_sequences / (batch * dp))
        memory = estimate_memory(
            shape, seq_len=seq_len, micro_batch=batch, dp=dp, tp=tp, pp=pp, zero_stage=stage,
            recompute=mode, offload_optimizer=offload_optimizer and stage > 0,
            offload_params=offload_params and stage == 3, microbatches_in_flight=grad_accum,
        )
        trainer = None
        if kiln_trains(tp, pp):  # as training_jobs.setup lays the run out: compiled only without TP / PP, ZeRO's
            # buckets of DeepSpeed's default size capped at the parameter count (setup.zero_buckets)
            trainer = estimate_trainer_memory(
                kiln_model, seq_len=seq_len, micro_batch=batch, precision="bf16", zero_stage=stage, dp=dp, tp=tp,
                pp=pp, grad_accum=grad_accum, activation_checkpointing=mode == "full",
                reduce_bucket_size=min(DEEPSPEED_BUCKETS["reduce_bucket_size"], kiln_model.params),
                compiled=tp == 1 and pp == 1,
            )
        return memory, trainer, grad_accum

    def layout(tp: int, pp: int, stage: int, mode: Recompute) -> ParallelismPlan:
        dp = n // (tp * pp)
        micro_batch = 1
        while micro_batch * 2 <= MAX_MICRO_BATCH and micro_batch * 2 * dp <= target_sequences:
            memory, trainer, grad_accum = memory_for(tp, pp, stage, mode, micro_batch * 2)
            if (trainer or memory).total > usable or (pp > 1 and grad_accum < MICROBATCHES_PER_STAGE * pp):
                break
            micro_batch *= 2
        memory, trainer, grad_accum = memory_for(tp, pp, stage, mode, micro_batch)
        tokens_per_step = micro_batch * grad_accum * dp * seq_len
        return ParallelismPlan(
            tp=tp, pp=pp, dp=dp, zero_stage=stage, recompute=mode, micro_batch=micro_batch,
            grad_accum=grad_accum, seq_len=seq_len, target_batch_tokens=global_batch_tokens,
            n_params=shape.n_params, memory=memory, usable_bytes=usable,
            bubble_fraction=pipeline_bubble_fraction(pp, grad_accum),
            compute_seconds_per_step=flops_per_token * tokens_per_step / (n * cluster.gpu.peak_flops * mfu),
            dp_comm_seconds_per_step=_dp_comm_seconds(shape.n_params, tp, pp, dp, stage, grad_accum, bandwidth),
            trainer_memory=trainer,
        )

    attempts: list[ParallelismPlan] = []
    chosen = None
    for pp in sorted({p for t in tps for p in pipeline_parallel_candidates(shape.n_layers, n, t)}):
        stage = zero_stage if pp == 1 else min(zero_stage, 1)
        layouts = [
            layout(tp, pp, stage, mode) for mode in recompute_options for tp in tps
            if n % (tp * pp) == 0 and (tp_with_pp or kiln_trains(tp, pp))
        ]
        attempts.extend(layouts)
        fitting = [c for c in layouts if c.fits]
        # Layouts whose DP exceeds the global batch in sequences would inflate the batch: last resort.
        fitting = [c for c in fitting if c.dp <= target_sequences] or fitting
        if fitting:
            hidden = [c for c in fitting if c.dp_comm_seconds_per_step <= c.compute_seconds_per_step]
            chosen = hidden[0] if hidden else min(fitting, key=lambda c: c.dp_comm_seconds_per_step)
            break
    if chosen is None:
        chosen = min(attempts, key=lambda c: c.needed_bytes)
    chosen.explanation.extend(_explain(chosen, cluster, attempts, zero_stage, target_sequences, bandwidth))
    return chosen


def _gib(value: float) -> str:
    return f"{value / GIB:.1f} GiB"


def _why_this_tp(plan: ParallelismPlan, attempts: list[ParallelismPlan], target_sequences: int) -> str:
    smaller = [a for a in attempts if (a.pp, a.recompute) == (plan.pp, plan.recompute) and a.tp < plan.tp]
    if not smaller:
        return "the only degree tried at this pipeline depth"
    nearest = smaller[-1]
    if not nearest.fits:
        return f"TP={nearest.tp} needs {_gib(nearest.needed_bytes)}"
    if nearest.dp > target_sequences:
        return f"TP={nearest.tp} fits too, but its DP {nearest.dp} exceeds the {target_sequences}-sequence batch"
    return (
        f"TP={nearest.tp} fits too, but its data-parallel traffic ({nearest.dp_comm_seconds_per_step:.1f} "
        f"s/step) would not hide behind its compute ({nearest.compute_seconds_per_step:.1f} s); "
        f"TP={plan.tp} frees memory for micro-batch {plan.micro_batch}"
    )


def _explain(
    plan: ParallelismPlan,
    cluster: Cluster,
    attempts: list[ParallelismPlan],
    requested_stage: int,
    target_sequences: int,
    bandwidth: float,
) -> list[str]:
    gpu, memory, lines = cluster.gpu, plan.trainer_memory or plan.memory, []
    counted = " by Kiln's trainer's count" if plan.trainer_memory is not None else ""
    usable = f"the usable {_gib(plan.usable_bytes)} of an {gpu.name} ({gpu.memory_gib:g} GiB)"
    if not plan.fits:
        lines.append(
            f"Nothing fits: the closest layout, TP={plan.tp}, PP={plan.pp} with {plan.recompute} recompute, "
            f"needs {_gib(memory.total)} per GPU{counted} at micro-batch 1, more than {usable}. "
            "Use CPU offload, more GPUs, a shorter sequence or a smaller model."
        )
    else:
        lines.append(
            f"Per GPU{counted}: {_gib(memory.model_states)} of model states (ZeRO-{plan.zero_stage} over DP "
            f"{plan.dp}) + {_gib(memory.activations)} of activations at micro-batch {plan.micro_batch} "
            f"+ {_gib(memory.total - memory.model_states - memory.activations)} other = {_gib(memory.total)}, "
            f"within {usable}."
        )
    if plan.fits and plan.tp > 1:
        lines.append(
            f"Tensor parallelism {plan.tp} stays inside a node ({gpu.link}, {cluster.intra_bandwidth_gb_s:g} "
            f"GB/s per direction vs {cluster.inter_node_gb_s:g} GB/s between nodes): "
            f"{_why_this_tp(plan, attempts, target_sequences)}."
        )
    if plan.fits and plan.pp > 1:
        dropped = (
            f"DeepSpeed runs only ZeRO-0/1 with pipelines, so ZeRO drops to {plan.zero_stage}; "
            if plan.zero_stage < requested_stage
            else ""
        )
        lines.append(
            f"Pipeline parallelism {plan.pp} because nothing fitted with fewer stages; {dropped}with "
            f"{plan.grad_accum} micro-batches per step the 1F1B bubble costs {plan.bubble_fraction:.0%} of it."
        )
    if plan.fits and plan.recompute == "full":
        lines.append("Full activation recompute (an extra forward pass, ~33% more compute) was needed to fit.")
    elif plan.recompute == "selective":
        lines.append("No attention scores are stored (FlashAttention / selective recompute): no extra forward.")
    if plan.memory.cpu_offloaded:
        lines.append(f"CPU offload keeps {_gib(plan.memory.cpu_offloaded)} per GPU in host memory."
                     if plan.trainer_memory is None else
                     "Kiln's trainer offloads nothing to the CPU: this layout counts every model state on the GPU.")
    lines.append(
        f"Micro-batch {plan.micro_batch} x {plan.grad_accum} accumulation steps x DP {plan.dp} = "
        f"{plan.global_batch_sequences} sequences of {plan.seq_len} = {plan.global_batch_tokens:,} tokens "
        f"per step (asked for {plan.target_batch_tokens:,})."
    )
    where = "between nodes" if cluster.nodes > 1 else "inside the node"
    hidden = plan.dp_comm_seconds_per_step <= plan.compute_seconds_per_step
    lines.append(
        f"Data-parallel traffic ≈ {plan.dp_comm_seconds_per_step:.2f} s per step at {bandwidth:g} GB/s "
        f"{where}, {'which can hide behind' if hidden else 'more than'} "
        f"≈ {plan.compute_seconds_per_step:.2f} s of compute."
    )
    if not hidden and plan.zero_stage == 3:
        zero2 = _dp_comm_seconds(plan.n_params, plan.tp, plan.pp, plan.dp, 2, plan.grad_accum, bandwidth)
        lines.append(
            f"ZeRO-3 re-gathers the weights for every micro-batch; ZeRO-2 would move ≈ {zero2:.2f} s per "
            "step if its memory (full bf16 weights per model-parallel rank) fits."
        )
    return lines
