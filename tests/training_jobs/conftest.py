"""Environment and data for the training-job tests.

DeepSpeed reads DS_ACCELERATOR and TORCH_EXTENSIONS_DIR at import, and JIT-builds its shm comm op into the
latter (~35 s the first time): a persistent folder ($KILN_HOME/torch_extensions, else the repo's
.kiln/torch_extensions) makes every later run reuse it. Set here, at import, so the subprocesses the tests
launch inherit it even when a test's kiln_home fixture points KILN_HOME at a temporary folder.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pytest
import torch
from filelock import FileLock

from training_jobs.launch import launch_command as training_launch_command
from training_jobs.settings import TrainingSettings

REPO = Path(__file__).resolve().parents[2]

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
if not torch.cuda.is_available():
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
os.environ.setdefault("TORCH_EXTENSIONS_DIR",
                      str(Path(os.environ.get("KILN_HOME") or REPO / ".kiln").resolve() / "torch_extensions"))

SEQ = 32
PROBE = "tests.training_jobs.construction_probe"  # training_jobs.train with a record of what the engine was given


@dataclass(frozen=True)
class TokenDataset:
    dir: Path
    tokenizer_dir: Path
    tokenizer_sha256: str
    vocab_size: int


def built_once(tmp_path_factory, name: str, build: Callable[[Path], None]) -> Path:
    """The folder `build` filled, once per test session: pytest-xdist's workers share it (their base temp folders
    have one parent), the first to ask builds it under a file lock and the others wait for it, as pytest-xdist's
    docs suggest for session fixtures. Tests read it and never write into it."""
    base = tmp_path_factory.getbasetemp()
    shared = base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base
    folder = shared / name
    with FileLock(str(shared / f"{name}.lock")):
        if not (folder / ".built").exists():
            shutil.rmtree(folder, ignore_errors=True)  # a build that failed part-way
            folder.mkdir()
            build(folder)
            (folder / ".built").touch()
    return folder


@pytest.fixture(scope="session")
def token_dataset(tmp_path_factory) -> TokenDataset:
    """A real tokenizer and token shard set (train + val), built in code from the test corpus."""
    def build(root: Path) -> None:
        from kiln.tokens.shard_writer import write_token_shards
        from tests.token_corpus import NATURAL, shard_settings, standard_sources, train_small_tokenizer

        sources = standard_sources(root)
        tok_dir = train_small_tokenizer(root, sources)
        result = write_token_shards(sources, tok_dir, shard_settings(seq_len=SEQ, val_fraction=0.15), NATURAL,
                                    root / "token_shards", progress=False)
        (root / "token_shards" / "_manifest.json").write_text(json.dumps({"stats": result.manifest_stats()}),
                                                              encoding="utf-8")
        (root / "dataset.json").write_text(json.dumps({"tokenizer_dir": str(tok_dir), "sha256": result.tokenizer_sha256,
                                                       "vocab_size": result.vocab_size}))

    root = built_once(tmp_path_factory, "tokens", build)
    made = json.loads((root / "dataset.json").read_text())
    return TokenDataset(root / "token_shards", Path(made["tokenizer_dir"]), made["sha256"], made["vocab_size"])


def launch(run_config: Path, nproc: int = 1, launcher: str = "torchrun", env: dict[str, str] | None = None,
           timeout: int = 300, cpu: bool = True, module: str = "training_jobs.train") -> subprocess.CompletedProcess:
    """Run training_jobs.train (or a module that wraps it, e.g. tests.training_jobs.construction_probe) in `nproc`
    processes (on CPU unless cpu=False, even where a GPU is visible); the output is kept for assertion messages."""
    cmd, full_env = launch_command(run_config, nproc, launcher, env, cpu, module)
    return subprocess.run(cmd, cwd=REPO, env=full_env, capture_output=True, text=True, timeout=timeout)


def launch_command(run_config: Path, nproc: int = 1, launcher: str = "torchrun", env: dict[str, str] | None = None,
                   cpu: bool = True, module: str = "training_jobs.train") -> tuple[list[str], dict[str, str]]:
    """The launcher's command (training_jobs.launch, as the Dagster resource builds it; `python`: one plain process)
    and the environment of a test run: one OpenMP thread per rank, no MLflow unless `env` names one."""
    bin_dir = Path(sys.executable).parent
    if nproc == 1 and launcher == "python":
        cmd = [sys.executable, "-m", module, "--run-config", str(run_config)]
    else:
        cmd = training_launch_command(launcher, run_config, nproc, module=module)
    full_env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    full_env.pop("MLFLOW_TRACKING_URI", None)  # a test that wants MLflow passes it in `env`
    if cpu:
        full_env.update(DS_ACCELERATOR="cpu", CUDA_VISIBLE_DEVICES="")
    full_env.update(env or {})
    full_env["PATH"] = f"{bin_dir}{os.pathsep}{full_env.get('PATH', '')}"
    return cmd, full_env


def read_metrics(output_dir: Path) -> dict[int, dict]:
    """metrics.jsonl as {step: row} (a step logged twice, after a rollback or resume, keeps its last row)."""
    rows = {}
    for line in (Path(output_dir) / "metrics.jsonl").read_text(encoding="utf-8").splitlines():
        row = json.loads(line)
        if "train/loss" in row:
            rows[row["step"]] = row
    return rows


# ------------------------------------------------------------------------------------ training runs

BASE = dict(seq_len=32, micro_batch_size=4, max_steps=12, log_every_steps=2, val_batches=4,
            schedule=dict(lr=3e-3, min_lr=3e-4, warmup_steps=3, total_steps=12),
            checkpoint=dict(every_steps=4, keep_last=2), monitor=dict(window=5, min_history=3))


def write_run(root: Path, token_dataset, output: Path, experiment: str = "kiln-tests", **overrides) -> Path:
    settings = {**BASE, **overrides}
    for key in ("schedule", "checkpoint", "monitor"):
        settings[key] = {**BASE[key], **overrides.get(key, {})}
    run = TrainingSettings(**settings).to_run_config(
        dataset_dir=token_dataset.dir, tokenizer_sha256=token_dataset.tokenizer_sha256, output_dir=output,
        tokenizer_dir=token_dataset.tokenizer_dir, experiment=experiment, run_name=output.name)
    return run.write(root / f"{output.name}.json")


def check(done) -> None:
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-6000:]


def summary_of(output: Path) -> dict:
    return json.loads((output / "summary.json").read_text())


def mlflow_store(root: Path, experiment: str) -> str:
    """A SQLite MLflow store in `root` with `experiment` created; its tracking URI."""
    import mlflow

    uri = f"sqlite:///{root / 'mlflow.db'}"
    mlflow.MlflowClient(uri).create_experiment(experiment, artifact_location=str(root / "artifacts"))
    return uri


def run_a_mlflow_uri(run_a: Path) -> str:
    """The MLflow store run_a logged to."""
    return f"sqlite:///{run_a.parent / 'mlflow.db'}"


@pytest.fixture(scope="session")
def run_a(tmp_path_factory, token_dataset) -> Path:
    """The uninterrupted reference: torchrun, 2 ranks, 12 steps, a checkpoint every 4 (keep 2), steps 3-4 profiled,
    logged to its own MLflow store (run_a_mlflow_uri); shared by the training-loop tests and the recipes (a base
    checkpoint). Through construction_probe (training_jobs.train, untouched, plus a record of the model as the engine
    received it, in a/construction/): the zero.Init test reads it."""
    def build(root: Path) -> None:
        uri = mlflow_store(root, "kiln-tests")
        (root / "tmp").mkdir()  # the launch's TMPDIR: test_two_rank_run_learns_and_reports checks torchrun left nothing
        # Validation every 6 steps and a profile of steps 3 and 4 here only: neither may change a single training
        # loss (the resume tests compare with run_b, which has neither).
        check(launch(write_run(root, token_dataset, root / "a", val_every_steps=6, profile_steps=(3, 4)), nproc=2,
                     env={"MLFLOW_TRACKING_URI": uri, "TMPDIR": str(root / "tmp")}, module=PROBE))

    return built_once(tmp_path_factory, "run_a", build) / "a"


@pytest.fixture(scope="session")
def run_b(tmp_path_factory, token_dataset) -> Path:
    """run_a's settings stopped at step 8 (of the same 12-step schedule), through the deepspeed launcher: the
    resume tests continue copies of it; the Ray launcher test compares with it."""
    def build(root: Path) -> None:
        check(launch(write_run(root, token_dataset, root / "b", max_steps=8), nproc=2, launcher="deepspeed"))

    return built_once(tmp_path_factory, "run_b", build) / "b"
