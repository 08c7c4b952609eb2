"""A whole training plan from a budget: model size, tokens, cost, time, parallelism, memory, risks.

`PlanRequest` is what a user (or the project config under `planning:`) says; `make_plan` turns it
into a `Plan` with `.to_dict()` (JSON-ready) and `.render()` (a terminal table, drawn by `render`).

A budget is model FLOPs as PaLM counts them, attention included
(`compute.training_flops_with_attention`, the numerator of MFU); dollars become FLOPs at the given
price, peak and MFU (the user's, else Kiln's own measured on that GPU kind, else 0.4: `own_mfu`). The scaling
laws size models in 6·N·D FLOPs, so the part of the budget they see
is budget / (1 + attention share), and the token count is whatever makes the chosen shape spend the
whole budget. Kaplan's N counts non-embedding parameters; the plan builds a shape with that many
parameters in total (embeddings are a few percent at the sizes it proposes).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import ConfigDict, Field, ValidationInfo, field_validator, model_validator

from kiln.common.strict import Strict
from kiln.planning.compute import (
    ComputeEstimate,
    attention_flops_per_token,
    estimate_compute,
    flops_for_budget_usd,
    training_flops,
)
from kiln.planning.data import DataSufficiency, data_sufficiency
from kiln.planning.fits import NotEnoughRuns, RunPoint, fit_compute_law, fit_parametric_law
from kiln.planning.hardware import GpuSpec, lookup_gpu
from kiln.planning.memory import GIB, ModelShape, shape_for_params
from kiln.planning.own_mfu import MfuChoice, RunThroughput, choose_mfu
from kiln.planning.parallelism import Cluster, ParallelismPlan, recommend_parallelism
from kiln.planning.reliability import LLAMA3_GPU_MTBF_HOURS, ReliabilityEstimate, estimate_reliability
from kiln.planning.render import _flow, _render
from kiln.planning.scaling import (
    HOFFMANN_2022,
    Allocation,
    InferenceAwareAllocation,
    chinchilla_allocation,
    hoffmann_allocation,
    inference_aware_allocation,
    inference_aware_for_budget,
    kaplan_allocation,
)

DEFAULT_BUDGET_FLOPS = 1e21  # a ~3B-parameter demo plan when the config names no budget
HIGH_MFU = 0.6  # PaLM reached 46% MFU, Llama 3 405B 38-43%: above this the plan is optimistic
MIN_STEPS = 1000

Sizing = Literal["auto", "chinchilla", "hoffmann", "kaplan", "inference"]


class ModelShapeRequest(Strict):
    """A fixed architecture instead of a scaling-law size (vocab comes from `PlanRequest.vocab_size`)."""

    n_layers: int = Field(ge=1)
    d_model: int = Field(ge=1)
    n_heads: int = Field(ge=1)
    d_ff: int | None = Field(default=None, ge=1)
    tie_embeddings: bool = False

    @model_validator(mode="after")
    def _heads_divide_width(self) -> ModelShapeRequest:
        if self.d_model % self.n_heads:
            raise ValueError(
                f"model.d_model={self.d_model} must be divisible by model.n_heads={self.n_heads}"
            )
        return self


class PlanRequest(Strict):
    """Everything `make_plan` needs; every field has a default so an embedded demo plan works."""

    # No inf or NaN (Strict), and bounds far past any real run (1e30 FLOPs is ~10^5 times the largest published
    # training compute): beyond them the sizing arithmetic overflows or runs for minutes instead of saying what is
    # wrong. Not frozen: a validator fills the default budget in.
    model_config = ConfigDict(frozen=False)

    # Budget: exactly one of dollars or FLOPs (neither: DEFAULT_BUDGET_FLOPS).
    budget_usd: float | None = Field(default=None, gt=0, le=1e13, description="dollars to spend on GPU time")
    budget_flops: float | None = Field(default=None, gt=0, le=1e30, description="training FLOPs incl. attention")
    # Hardware.
    gpu: str = "H100-SXM"
    peak_tflops: float | None = Field(default=None, gt=0, le=1e6, description="overrides the dense bf16 peak")
    n_gpus: int | None = Field(default=None, ge=1, description="total GPUs (or give nodes)")
    nodes: int | None = Field(default=None, ge=1)
    gpus_per_node: int = Field(default=8, ge=1)
    price_per_gpu_hour: float = Field(default=2.5, ge=1e-4, le=1e6, description="USD; a rough 2025 cloud H100 rate")
    mfu: float | None = Field(default=None, gt=0, le=1, description="model FLOPs utilisation, 0 < mfu <= 1; "
                              "None: Kiln's own on this GPU kind from its finished runs, else 0.4")
    intra_node_gb_s: float | None = Field(default=None, gt=0, description="per GPU per direction; None: table")
    inter_node_gb_s: float = Field(default=50.0, gt=0, description="per GPU per direction (400 Gb/s NIC)")
    # Model and batch.
    sizing: Sizing = "auto"  # auto: "inference" when inference_tokens > 0, else "chinchilla"
    model: ModelShapeRequest | None = None
    vocab_size: int = Field(default=32000, ge=1)
    seq_len: int = Field(default=2048, ge=1)
    global_batch_tokens: int = Field(default=2**21, ge=1)
    inference_tokens: float = Field(default=0.0, ge=0, le=1e20, description="expected lifetime inference tokens")
    # Memory strategy.
    zero_stage: Literal[0, 1, 2, 3] = 3
    offload_optimizer: bool = False
    offload_params: bool = False
    flash_attention: bool = True
    recompute: Literal["auto", "none", "selective", "full"] = "auto"
    usable_memory_fraction: float = Field(default=0.9, gt=0, le=1)
    # Reliability.
    gpu_mtbf_hours: float = Field(default=round(LLAMA3_GPU_MTBF_HOURS, -2), ge=0.01, le=1e9)
    checkpoint_write_seconds: float = Field(default=60.0, gt=0, le=1e6)
    restart_minutes: float = Field(default=10.0, ge=0, le=1e5)
    # Data.
    available_tokens: dict[str, float] = Field(default_factory=dict, description="tokens per source")
    mixture_weights: dict[str, float] = Field(default_factory=dict, description="per source; {} = natural")

    @field_validator("gpu")
    @classmethod
    def _known_gpu(cls, value: str) -> str:
        return lookup_gpu(value).name  # raises UnknownGpu listing the known names

    @field_validator("available_tokens", "mixture_weights")
    @classmethod
    def _non_negative_per_source(cls, value: dict[str, float], info: ValidationInfo) -> dict[str, float]:
        for source, amount in value.items():
            if not amount >= 0:
                raise ValueError(f"{info.field_name}[{source!r}] must be >= 0, got {amount}")
        return value

    @model_validator(mode="after")
    def _consistent(self) -> PlanRequest:
        if self.budget_usd is not None and self.budget_flops is not None:
            raise ValueError(
                f"give exactly one of budget_usd and budget_flops, got budget_usd={self.budget_usd} "
                f"and budget_flops={self.budget_flops}"
            )
        if self.budget_usd is None and self.budget_flops is None:
            self.budget_flops = DEFAULT_BUDGET_FLOPS
        self._resolve_cluster()  # raises on inconsistent n_gpus / nodes / gpus_per_node
        if self.offload_params and self.zero_stage != 3:
            raise ValueError(f"offload_params=True needs zero_stage=3, got zero_stage={self.zero_stage}")
        if self.offload_optimizer and self.zero_stage == 0:
            raise ValueError("offload_optimizer=True needs zero_stage 1, 2 or 3, got zero_stage=0")
        unknown = sorted(set(self.mixture_weights) - set(self.available_tokens))
        if unknown:
            raise ValueError(
                f"mixture_weights names sources without available_tokens: {unknown}; "
                f"available_tokens has {sorted(self.available_tokens)}"
            )
        if self.mixture_weights and sum(self.mixture_weights.values()) <= 0:
            raise ValueError(f"mixture_weights must have a positive sum, got {self.mixture_weights}")
        return self

    def _resolve_cluster(self) -> tuple[int, int]:
        """(nodes, gpus_per_node) from n_gpus and/or nodes."""
        per_node = self.gpus_per_node
        if self.n_gpus is None:
            return (self.nodes or 1), per_node
        if self.n_gpus <= per_node and self.nodes in (None, 1):
            return 1, self.n_gpus
        if self.n_gpus % per_node:
            raise ValueError(
                f"n_gpus={self.n_gpus} spans several nodes but is not a multiple of gpus_per_node={per_node}"
            )
        if self.nodes is not None and self.nodes * per_node != self.n_gpus:
            raise ValueError(
                f"n_gpus={self.n_gpus} disagrees with nodes={self.nodes} x gpus_per_node={per_node}; "
                "give one or the other"
            )
        return self.n_gpus // per_node, per_node

    def gpu_spec(self) -> GpuSpec:
        return lookup_gpu(self.gpu, None if self.peak_tflops is None else self.peak_tflops * 1e12)

    def cluster(self) -> Cluster:
        nodes, per_node = self._resolve_cluster()
        return Cluster(self.gpu_spec(), nodes, per_node, self.inter_node_gb_s, self.intra_node_gb_s)

    def total_flops(self, mfu: float) -> float:
        if self.budget_flops is not None:
            return self.budget_flops
        gpu = self.gpu_spec()
        return flops_for_budget_usd(self.budget_usd, self.price_per_gpu_hour, gpu.peak_flops, mfu)

    def resolved_sizing(self) -> str:
        if self.sizing != "auto":
            return self.sizing
        return "inference" if self.inference_tokens > 0 else "chinchilla"


@dataclass
class Plan:
    request: PlanRequest
    cluster: Cluster
    sizing: str
    sizing_flops: float  # the 6·N·D part of the budget the scaling laws saw
    target: Allocation  # what the sizing rule asked for, before rounding to a shape
    alternatives: list[Allocation]
    same_loss_inference: InferenceAwareAllocation | None
    shape: ModelShape
    tokens: float
    compute: ComputeEstimate
    parallelism: ParallelismPlan
    reliability: ReliabilityEstimate
    data: DataSufficiency | None
    own_fit: dict[str, Any] | None
    mfu: MfuChoice
    warnings: list[str] = field(default_factory=list)
    # The best layout Kiln's trainer runs, when the recommended one combines TP and PP (which it does not run)
    kiln_layout: ParallelismPlan | None = None

    @property
    def n_params(self) -> int:
        return self.shape.n_params

    @property
    def training_layout(self) -> ParallelismPlan:
        """The layout the `training:` config gets: the recommended one, or where Kiln cannot train that, its own
        best one (never a block the config refuses; `fits` says whether it fits)."""
        return self.kiln_layout or self.parallelism

    @property
    def steps(self) -> int:
        return math.ceil(self.tokens / self.parallelism.global_batch_tokens)

    def training_yaml(self) -> str:
        """The project config's `training:` keys this plan sets (ParallelismPlan.training_block) as YAML lines."""
        return "\n".join(f"{key}: {_flow(value)}" for key, value in self.training_layout.training_block().items())

    def to_dict(self) -> dict[str, Any]:
        return {
            "request": self.request.model_dump(mode="json"),
            "cluster": self.cluster.to_dict(),
            "gpu": self.cluster.gpu.to_dict(),
            "sizing": {
                "method": self.sizing,
                "sizing_flops_6nd": self.sizing_flops,
                "target": self.target.to_dict(),
                "alternatives": [
                    {**a.to_dict(), "hoffmann_loss": HOFFMANN_2022.loss(a.n_params, a.tokens)}
                    for a in self.alternatives
                ],
                "same_loss_inference_aware": None
                if self.same_loss_inference is None
                else self.same_loss_inference.to_dict(),
            },
            "model": {
                **self.shape.to_dict(),
                "tokens": self.tokens,
                "tokens_per_param": self.tokens / self.n_params,
                "hoffmann_loss": HOFFMANN_2022.loss(self.n_params, self.tokens),
                "steps": self.steps,
            },
            "compute": self.compute.to_dict(),
            "mfu": self.mfu.to_dict(),
            "parallelism": self.parallelism.to_dict(),
            "kiln_layout": None if self.kiln_layout is None else self.kiln_layout.to_dict(),
            "training": self.training_layout.training_block(),  # paste into the project config's `training:` section
            "reliability": self.reliability.to_dict(),
            "data": None if self.data is None else self.data.to_dict(),
            "own_fit": self.own_fit,
            "warnings": list(self.warnings),
        }

    def render(self) -> str:
        return _render(self)


def _allocate(method: str, flops: float, inference_tokens: float) -> Allocation:
    if method == "chinchilla":
        return chinchilla_allocation(flops)
    if method == "hoffmann":
        return hoffmann_allocation(flops)
    if method == "kaplan":
        return kaplan_allocation(flops)
    best = inference_aware_for_budget(flops, inference_tokens)
    return Allocation("inference-aware", best.n_params, best.tokens)


def _own_fit(runs: Sequence[RunPoint], n_params: float, tokens: float, sizing_flops: float,
             total_flops: float) -> dict[str, Any]:
    # a diverged run (NaN or infinite loss, as MLflow stores it) says nothing about the law and would make it NaN
    finite = [run for run in runs if all(math.isfinite(value) for value in
                                         (run.n_params, run.tokens, run.loss, run.compute))]
    out: dict[str, Any] = {"n_runs": len(finite), "skipped_non_finite": len(runs) - len(finite)}
    runs = finite
    # L(C) is evaluated at this plan's compute as the runs count theirs: Kiln runs log FLOPs with attention
    # (scaling/flops = flops_per_token x tokens), runs without that metric count 6ND (RunPoint.compute)
    logged = all(run.flops is not None for run in runs)
    try:
        out["compute_law"] = fit_compute_law(runs).to_dict(
            flops=total_flops if logged else training_flops(n_params, tokens))
    except NotEnoughRuns as exc:
        out["compute_law"] = {"error": str(exc)}
    try:
        out["parametric_law"] = fit_parametric_law(runs).to_dict(n_params, tokens, sizing_flops)
    except NotEnoughRuns as exc:
        out["parametric_law"] = {"error": str(exc)}
    return out


def make_plan(request: PlanRequest, runs: Sequence[RunPoint] | None = None,
              throughputs: Sequence[RunThroughput] = ()) -> Plan:
    """Size, cost and lay out a training run for `request`; `runs` (finished runs) adds own fits; `throughputs`
    (Kiln's finished runs, `own_mfu`) give the MFU when the request has none."""
    cluster = request.cluster()
    gpu = cluster.gpu
    chosen = choose_mfu(request.mfu, gpu, throughputs)
    budget = request.total_flops(chosen.mfu)
    method = request.resolved_sizing() if request.model is None else "fixed shape"

    # Size the model on the 6ND share of the budget; the attention share depends on the shape, so
    # iterate (a few rounds; the shape is discrete, so stop when it repeats).
    sizing_flops, shape, seen = budget, None, set()
    for _ in range(20):
        if request.model is not None:
            shape = ModelShape(vocab_size=request.vocab_size, **request.model.model_dump())
            target = Allocation(method, shape.n_params, sizing_flops / (6.0 * shape.n_params))
        else:
            target = _allocate(method, sizing_flops, request.inference_tokens)
            shape = shape_for_params(target.n_params, request.vocab_size)
        # FLOPs per token as the trainer counts them (its MFU is the one the plan assumes or reads from own runs):
        # 6 per matmul weight (no FLOPs for the embedding lookup) + attention. The laws size N in 6·N·D.
        flops_per_token = 6.0 * shape.matmul_params + attention_flops_per_token(shape.n_layers, shape.d_model,
                                                                                request.seq_len)
        sizing_flops = budget * 6.0 * shape.n_params / flops_per_token
        if shape in seen:
            break
        seen.add(shape)
    tokens = budget / flops_per_token  # spend the budget exactly with the rounded shape

    rules = ("chinchilla", "hoffmann", "kaplan")
    alternatives = [_allocate(rule, sizing_flops, request.inference_tokens) for rule in rules]
    same_loss = None
    if request.inference_tokens > 0:
        alternatives.append(_allocate("inference", sizing_flops, request.inference_tokens))
        same_loss = inference_aware_allocation(sizing_flops, request.inference_tokens)

    compute = estimate_compute(
        budget, peak_flops=gpu.peak_flops, mfu=chosen.mfu, n_gpus=cluster.n_gpus,
        price_per_gpu_hour=request.price_per_gpu_hour,
    )
    layout_args = dict(
        seq_len=request.seq_len, global_batch_tokens=request.global_batch_tokens,
        flops_per_token=flops_per_token, mfu=chosen.mfu, zero_stage=request.zero_stage,
        recompute=None if request.recompute == "auto" else request.recompute,
        flash_attention=request.flash_attention, offload_optimizer=request.offload_optimizer,
        offload_params=request.offload_params, usable_memory_fraction=request.usable_memory_fraction,
    )
    parallelism = recommend_parallelism(shape, cluster, **layout_args)
    kiln_layout = None if parallelism.kiln_trains_it else recommend_parallelism(
        shape, cluster, **layout_args, tp_with_pp=False)
    reliability = estimate_reliability(
        n_gpus=cluster.n_gpus, gpu_mtbf_hours=request.gpu_mtbf_hours,
        checkpoint_write_seconds=request.checkpoint_write_seconds,
        restart_seconds=60.0 * request.restart_minutes,
        wall_clock_days=compute.wall_clock_days,
    )
    data = None
    if request.available_tokens:
        data = data_sufficiency(tokens, request.available_tokens, request.mixture_weights or None)
    own_fit = None if runs is None else _own_fit(runs, shape.n_params, tokens, sizing_flops, budget)

    plan = Plan(
        request, cluster, method, sizing_flops, target, alternatives, same_loss, shape, tokens, compute,
        parallelism, reliability, data, own_fit, chosen, kiln_layout=kiln_layout,
    )
    plan.warnings.extend(_warnings(plan))
    return plan


def _warnings(plan: Plan) -> list[str]:
    out = []
    if not plan.parallelism.fits:
        out.append(
            f"the model does not fit: {plan.parallelism.needed_bytes / GIB:.1f} GiB per GPU needed, "
            f"{plan.parallelism.usable_bytes / GIB:.1f} GiB usable"
        )
    if plan.mfu.mfu > HIGH_MFU:
        out.append(f"mfu={plan.mfu.mfu:g} is optimistic: large runs report 0.38-0.46 (PaLM, Llama 3)")
    if plan.steps < MIN_STEPS:
        out.append(
            f"only {plan.steps} optimizer steps of {plan.parallelism.global_batch_tokens:,} tokens: "
            "lower global_batch_tokens"
        )
    if plan.parallelism.global_batch_tokens > 1.1 * plan.request.global_batch_tokens:
        out.append(
            f"global batch rounds up to {plan.parallelism.global_batch_tokens:,} tokens "
            f"(asked {plan.request.global_batch_tokens:,}): {plan.parallelism.dp} data-parallel ranks "
            "need at least one sequence each"
        )
    if plan.kiln_layout is not None:
        par, kiln = plan.parallelism, plan.kiln_layout
        own = f"{kiln.describe()}, {kiln.needed_bytes / GIB:.1f} GiB per GPU"
        out.append(
            f"Kiln's trainer runs tensor or pipeline parallelism, not both: TP {par.tp} x PP {par.pp} is a layout "
            f"for a 3D-parallel trainer (Megatron-LM, Megatron-DeepSpeed), and Kiln refuses it. "
            + (f"The best layout Kiln runs is {own}; the `training:` config is that one"
               if kiln.fits else
               f"No layout Kiln runs fits (closest, the `training:` config: {own}, {kiln.usable_bytes / GIB:.1f} "
               f"GiB usable): use more GPUs, CPU offload or a shorter sequence"))
    if plan.data is not None:
        out.extend(plan.data.warnings)
    return out
