"""A run of a checkpoint written by Kiln before issue 34 (commit 4e5cb2d: ZeRO-3 on one CPU rank, fp32, the
unfused loss, per-step syncs): tests/data/checkpoint_before_issue34/ holds its step-4 checkpoint and the losses
that code logged for steps 5 to 8 when it ran on. The shards are regenerated here, bit for bit, from a seed.

    python -m tests.training_jobs.old_run DIR    # writes DIR/shards, DIR/run.json (how the fixture was made:
                                                 # then torchrun --nproc_per_node 1 -m training_jobs.train ...)
"""

from __future__ import annotations

import sys
from pathlib import Path

from kiln.tokens.shard_format import write_random_shard_set
from training_jobs.settings import TrainingSettings

FIXTURE = Path(__file__).resolve().parents[1] / "data" / "checkpoint_before_issue34"
SHA = "ab" * 32
VOCAB = 64


def shards(folder: Path) -> Path:
    """Random tokens from a fixed seed: 20,000 for training, 4,000 for validation."""
    return write_random_shard_set(folder, 20_000, 4_000, VOCAB, seed=34, tokenizer_sha256=SHA)


def settings(max_steps: int = 8) -> TrainingSettings:
    return TrainingSettings(
        model={"preset": "tiny", "d_model": 16, "n_layers": 1, "n_heads": 2, "pad_vocab_to_multiple_of": 8},
        seq_len=32, micro_batch_size=4, max_steps=max_steps, log_every_steps=1, val_batches=2, precision="fp32",
        schedule={"lr": 3e-3, "min_lr": 3e-4, "warmup_steps": 2, "total_steps": 8},
        checkpoint={"every_steps": 4, "keep_last": 2}, export=[])


def run_config(root: Path, max_steps: int = 8) -> Path:
    run = settings(max_steps).to_run_config(dataset_dir=shards(root / "shards"), tokenizer_sha256=SHA,
                                            output_dir=root / "out")
    return run.write(root / "run.json")


if __name__ == "__main__":
    print(run_config(Path(sys.argv[1])))
