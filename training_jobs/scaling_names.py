"""The names under which every finished training run records what `kiln plan --mlflow-uri` fits scaling laws on:
one set, written by training (training_jobs.reporting) and read by the planner (kiln.planning.fits), and which runs
are such a point (`is_scaling_point`)."""

from __future__ import annotations

N_PARAMS = "model.n_params"  # param (logged when the run starts): parameters, embeddings included
TOKENS = "scaling/tokens"  # metric: tokens the optimizer steps saw (rolled-back steps excluded)
FLOPS = "scaling/flops"  # metric: training FLOPs, the model's FLOPs per token (attention included) x tokens
FINAL_VAL_LOSS = "scaling/final_val_loss"  # metric: validation loss of the final model

OBJECTIVE = "training.objective"  # param: clm, prefix_lm or span_corruption (absent before it was logged: clm)
BASE_CHECKPOINT = "base_checkpoint"  # param, only where the run continued from a base checkpoint


def is_scaling_point(objective: str | None, base_checkpoint: object) -> bool:
    """Whether a run is a point on the laws the planner fits (loss of a model trained from scratch with the causal LM
    objective, on the tokens it saw): a continued run's loss owes to its base's tokens too, which scaling/tokens would
    leave out; prefix-LM and span-corruption runs validate the CLM loss of a model trained on another objective."""
    return (objective or "clm") == "clm" and not base_checkpoint
