"""Run training_jobs.train unchanged and record, on each rank, what the trainer hands to deepspeed.initialize and
what AutoTP made of it: the evidence the zero.Init and tensor-parallel tests check (losses alone cannot tell a
partitioned or sharded model from a whole one). The trainer knows nothing of it.

    torchrun --standalone --nproc_per_node 2 -m tests.training_jobs.construction_probe --run-config run.json

writes <output_dir>/construction/rank<r>.pt (torch.load) with
  before: {name: {numel, ds_numel, ds_shape, partition}}  each parameter of the built model as the engine receives
          it: param.data's size, and under ZeRO-3 the whole size and this rank's partition (param.ds_tensor);
  tp:     {module name: {weight, tp_world_size, tp_index, group_ranks, is_tp_group}}  each AutoTP layer after
          deepspeed.initialize: this rank's slice (gathered over ZeRO, so whole for this tp rank) and its group.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from training_jobs import train
from training_jobs.settings import RunConfig
from training_jobs.setup import default_environment, import_deepspeed


def before_engine(model: torch.nn.Module) -> dict[str, dict]:
    return {name: {"numel": p.data.numel(), "ds_numel": getattr(p, "ds_numel", None),
                   "ds_shape": tuple(getattr(p, "ds_shape", p.shape)),
                   "partition": p.ds_tensor.detach().clone() if getattr(p, "ds_tensor", None) is not None else None}
            for name, p in model.named_parameters()}


def tp_layers(module: torch.nn.Module) -> dict[str, dict]:
    import deepspeed
    from deepspeed.utils import groups

    found = {}
    for name, layer in module.named_modules():
        if getattr(layer, "mp_group", None) is None or getattr(layer, "weight", None) is None:
            continue
        with deepspeed.zero.GatheredParameters([layer.weight]):  # collective: every rank walks the same layers
            weight = layer.weight.detach().clone()
        found[name] = {"weight": weight, "tp_world_size": layer.tp_world_size, "tp_index": layer.tp_index,
                       "group_ranks": torch.distributed.get_process_group_ranks(layer.mp_group),
                       "is_tp_group": layer.mp_group is groups.get_tensor_model_parallel_group()}
    return found


def main(argv: list[str]) -> int:
    default_environment()  # before deepspeed is imported, as train.main does
    deepspeed = import_deepspeed()  # as init_distributed imports it (without MLflow)

    out = Path(RunConfig.read(Path(argv[argv.index("--run-config") + 1])).output_dir) / "construction"
    original, seen = deepspeed.initialize, []

    def initialize(*args, model, **kwargs):
        if seen:  # a rollback builds the engine again: the first one is the construction
            return original(*args, model=model, **kwargs)
        seen.append(True)
        before = before_engine(model)
        engine, *rest = original(*args, model=model, **kwargs)
        out.mkdir(parents=True, exist_ok=True)
        torch.save({"before": before, "tp": tp_layers(engine.module)}, out / f"rank{torch.distributed.get_rank()}.pt")
        return (engine, *rest)

    deepspeed.initialize = initialize
    return train.main(argv)


if __name__ == "__main__":
    train.exit_now(main(sys.argv[1:]))  # as training_jobs.train ends a rank
