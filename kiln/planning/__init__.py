"""Run planning: budget → model size, tokens, cost, parallelism, memory, failure costs; each formula cites its paper.

Used by the `training_plan` asset and `kiln plan` (kiln.cli.plan); `plan.make_plan` puts the modules together.
Modules: `compute`, `scaling` (published laws), `fits` (your own runs), `memory`, `parallelism`, `reliability`, `data`.
"""

from kiln.planning.compute import estimate_compute, training_flops, training_flops_with_attention
from kiln.planning.data import data_sufficiency
from kiln.planning.fits import NotEnoughRuns, RunPoint, fit_compute_law, fit_parametric_law, runs_from_mlflow
from kiln.planning.hardware import GPUS, UnknownGpu, lookup_gpu
from kiln.planning.memory import ModelShape, estimate_memory, model_state_bytes_per_param, shape_for_params
from kiln.planning.parallelism import Cluster, pipeline_bubble_fraction, recommend_parallelism
from kiln.planning.plan import Plan, PlanRequest, make_plan
from kiln.planning.reliability import daly_interval, estimate_reliability, young_interval
from kiln.planning.scaling import (
    HOFFMANN_2022,
    ParametricLoss,
    chinchilla_allocation,
    hoffmann_allocation,
    inference_aware_allocation,
    inference_aware_for_budget,
    kaplan_allocation,
)

__all__ = [
    "GPUS",
    "HOFFMANN_2022",
    "Cluster",
    "ModelShape",
    "NotEnoughRuns",
    "ParametricLoss",
    "Plan",
    "PlanRequest",
    "RunPoint",
    "UnknownGpu",
    "chinchilla_allocation",
    "daly_interval",
    "data_sufficiency",
    "estimate_compute",
    "estimate_memory",
    "estimate_reliability",
    "fit_compute_law",
    "fit_parametric_law",
    "hoffmann_allocation",
    "inference_aware_allocation",
    "inference_aware_for_budget",
    "kaplan_allocation",
    "lookup_gpu",
    "make_plan",
    "model_state_bytes_per_param",
    "pipeline_bubble_fraction",
    "recommend_parallelism",
    "runs_from_mlflow",
    "shape_for_params",
    "training_flops",
    "training_flops_with_attention",
    "young_interval",
]
