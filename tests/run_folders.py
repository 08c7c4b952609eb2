"""A training run's folder as the training asset leaves it, for the tests of pruning old runs' checkpoints."""

import json
import os
import time
from pathlib import Path

from training_jobs.checkpoint import write_manifest


def make_run(runs: Path, key: str, steps: list[int], age_s: float, status: str = "completed") -> Path:
    """A run folder as the training asset leaves it: checkpoints (a complete one per step, 100 kB each), one half
    saved, summary, metrics, MLflow run id and an export; every file dated `age_s` ago."""
    folder = runs / key
    for step in steps:
        ckpt = folder / "checkpoints" / f"step_{step:08d}"
        ckpt.mkdir(parents=True)
        (ckpt / "mp_rank_00_model_states.pt").write_bytes(os.urandom(100_000))
        write_manifest(ckpt, step, {})
    (folder / "checkpoints" / f"step_{steps[-1] + 1:08d}").mkdir()  # a save cut short: no manifest
    (folder / "summary.json").write_text(json.dumps({"status": status, "steps": steps[-1]}))
    (folder / "metrics.jsonl").write_text(json.dumps({"step": 1, "train/loss": 5.0}) + "\n")
    (folder / "mlflow_run_id").write_text("abc123\n")
    (folder / "export" / "safetensors").mkdir(parents=True)
    (folder / "export" / "safetensors" / "model.safetensors").write_bytes(b"weights")
    then = time.time() - age_s
    for path in folder.rglob("*"):
        os.utime(path, (then, then))
    return folder
