"""The names under which every finished training run records what `kiln plan --mlflow-uri` fits scaling laws on:
one set, written by training (training_jobs.train) and read by the planner (kiln.planning.fits)."""

N_PARAMS = "model.n_params"  # param (logged when the run starts): parameters, embeddings included
TOKENS = "scaling/tokens"  # metric: tokens the optimizer steps saw (rolled-back steps excluded)
FLOPS = "scaling/flops"  # metric: training FLOPs, the model's FLOPs per token (attention included) x tokens
FINAL_VAL_LOSS = "scaling/final_val_loss"  # metric: validation loss of the final model
