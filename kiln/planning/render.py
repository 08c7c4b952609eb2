"""A `Plan` as a terminal table (`Plan.render()`): budget, cost and time, the sizing rules side by side,
the chosen model and layout, memory, failures, data epochs, own fits and warnings, in about one screen.
"""

from __future__ import annotations

import math
import textwrap
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from kiln.planning.memory import GIB
from kiln.planning.scaling import HOFFMANN_2022

if TYPE_CHECKING:
    from kiln.planning.plan import Plan

SCREEN_WIDTH = 110


def _count(value: float) -> str:
    for scale, suffix in ((1e12, "T"), (1e9, "B"), (1e6, "M"), (1e3, "K")):
        if abs(value) >= scale:
            return f"{value / scale:.3g}{suffix}"
    return f"{value:.3g}"


def _flow(mapping: dict[str, Any]) -> str:
    """A flat mapping as a one-line YAML flow mapping, `{tp: 2, pp: 1}` (booleans as YAML writes them: `true`)."""
    return "{" + ", ".join(f"{key}: {str(value).lower() if isinstance(value, bool) else value}"
                           for key, value in mapping.items()) + "}"


def _table(headers: Sequence[str], rows: Sequence[Sequence[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(str(c)) for c in column) for column in zip(headers, *rows)]
    line = lambda cells: indent + "  ".join(  # noqa: E731
        str(c).ljust(w) if i == 0 else str(c).rjust(w) for i, (c, w) in enumerate(zip(cells, widths))
    )
    return [line(headers), indent + "  ".join("-" * w for w in widths), *(line(r) for r in rows)]


def _bullets(lines: Sequence[str], width: int = SCREEN_WIDTH) -> list[str]:
    return [textwrap.fill(line, width, initial_indent="  - ", subsequent_indent="    ") for line in lines]


def _render(plan: Plan) -> str:
    r, c, par, rel, mem, shape = (
        plan.request, plan.compute, plan.parallelism, plan.reliability, plan.parallelism.memory, plan.shape
    )
    cluster, gib = plan.cluster, lambda value: f"{value / GIB:.1f}"
    budget = f"${r.budget_usd:,.0f}" if r.budget_usd is not None else f"{r.budget_flops:.3g} FLOPs"
    out = [
        f"Kiln training plan: {budget} on {cluster.n_gpus} x {cluster.gpu.name} "
        f"({cluster.nodes} node{'s' if cluster.nodes > 1 else ''} x {cluster.gpus_per_node})",
        f"  compute     {c.flops:.3g} FLOPs incl. attention ({plan.sizing_flops:.3g} as 6ND) at "
        f"{c.peak_flops / 1e12:.0f} TFLOP/s peak, {plan.mfu.describe()}",
        f"  cost        {c.gpu_hours:,.0f} GPU-hours x ${c.price_per_gpu_hour:g} = ${c.cost_usd:,.0f}",
        f"  time        {c.wall_clock_days:.1f} days ({rel.wall_clock_days_expected:.1f} with failures)",
        "",
        "Model size for this budget (loss from the Hoffmann et al. 2022 fit)",
    ]
    out += _table(
        ["rule", "params", "tokens", "tok/param", "loss"],
        [[a.method, _count(a.n_params), _count(a.tokens), f"{a.tokens_per_param:.1f}",
          f"{HOFFMANN_2022.loss(a.n_params, a.tokens):.3f}"] for a in plan.alternatives],
    )
    if plan.same_loss_inference is not None:
        s = plan.same_loss_inference
        out += _bullets([
            f"Same loss as the fit's optimum for least training + inference FLOPs (Sardana & Frankle 2023): "
            f"{_count(s.n_params)} params on {_count(s.tokens)} tokens ({s.tokens_per_param:.0f} tok/param, "
            f"{s.tokens_per_param / s.reference.tokens_per_param:.1f}x the optimum's), "
            f"{1 - s.total_flops / s.reference_total_flops:.0%} fewer FLOPs over the model's life"
        ])
    config_lines = plan.training_yaml().splitlines()  # the `training:` keys, one a line
    config_lines[0] += " (the layout Kiln runs: see Warnings)" if plan.training_layout is not par else ""
    out += [
        "",
        f"Plan: {plan.target.method}",
        f"  model       {_count(plan.n_params)} params: {shape.n_layers} layers x d_model {shape.d_model} x "
        f"{shape.n_heads} heads, vocab {shape.vocab_size}",
        f"  tokens      {_count(plan.tokens)} ({plan.tokens / plan.n_params:.1f} per param), "
        f"{plan.steps:,} steps of {par.global_batch_tokens:,}; "
        f"loss ~ {HOFFMANN_2022.loss(plan.n_params, plan.tokens):.3f}",
        f"  layout      {par.describe()}",
        *[f"  {'config' if i == 0 else '':<10}  training.{line}" for i, line in enumerate(config_lines)],
        f"  memory/GPU  {gib(par.needed_bytes)} of {gib(par.usable_bytes)} GiB usable"
        + ("" if par.fits else " (DOES NOT FIT)")
        + (f": model states {gib(use.model_states)}, activations {gib(use.activations)}, ZeRO buffers "
           f"{gib(use.buckets + use.zero3_working_set)}, loss {gib(use.loss)} (Kiln's trainer's count)"
           if (use := par.trainer_memory) is not None else
           f": weights {gib(mem.weights)}, grads {gib(mem.gradients)}, optimizer {gib(mem.optimizer)}, "
           f"activations {gib(mem.activations)}, other {gib(mem.zero3_working_set + mem.logits)}"
           + (f"; CPU {gib(mem.cpu_offloaded)}" if mem.cpu_offloaded else "")),
        f"  failures    cluster MTBF {rel.cluster_mtbf_hours:,.0f} h, ~{rel.expected_failures:.0f} failures; "
        f"checkpoint every {rel.daly_interval_minutes:.0f} min (Daly; Young {rel.young_interval_minutes:.0f}), "
        f"{rel.lost_work_fraction:.1%} lost",
        "",
        "Why this layout",
        *_bullets(par.explanation),
    ]
    if plan.data is not None:
        out += ["", "Data (epochs per source; > 4 repeats help little, Muennighoff et al. 2023)"]
        out += _table(
            ["source", "available", "weight", "needed", "epochs"],
            [[s.source, _count(s.available_tokens), f"{s.weight:.2f}", _count(s.needed_tokens),
              f"{s.epochs:.2f}" if math.isfinite(s.epochs) else "no data"] for s in plan.data.sources],
        )
    if plan.own_fit is not None:
        skipped = plan.own_fit["skipped_non_finite"]
        out += ["", f"Own scaling fits ({plan.own_fit['n_runs']} runs"
                + (f"; {skipped} left out for a non-finite loss, tokens, size or compute: diverged" if skipped else "")
                + ")"]
        out += _bullets(_own_fit_lines(plan.own_fit))
    if plan.warnings:
        out += ["", "Warnings", *_bullets(plan.warnings)]
    return "\n".join(out)


def _own_fit_lines(own_fit: dict[str, Any]) -> list[str]:
    compute_law, parametric = own_fit["compute_law"], own_fit["parametric_law"]
    return [
        f"L(C): {compute_law['error']}" if "error" in compute_law
        else f"{compute_law['form']}: loss {compute_law['predicted_loss']:.3f} at this plan's compute "
        f"(90% {compute_law['interval_90'][0]:.3f}-{compute_law['interval_90'][1]:.3f})",
        f"L(N,D): {parametric['error']}" if "error" in parametric
        else f"L(N,D): loss {parametric['predicted_loss']:.3f} for this plan ("
        + (f"90% {parametric['interval_90'][0]:.3f}-{parametric['interval_90'][1]:.3f}" if "interval_90" in parametric
           else "no interval: no resample's law was identified")
        + f"); its own optimum is {_count(parametric['optimal']['n_params'])} params",
    ]
