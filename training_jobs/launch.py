"""The command that starts a training run's processes, for every launcher: one place for the Dagster resource
(resources/training.py), the benchmarks and the tests. Dagster-free, so a GPU machine with only the training
dependencies (bench/train_bench.py) builds the same command a materialization runs."""

from __future__ import annotations

import os
import shutil
import socket
import sys
from pathlib import Path

ENTRY = "training_jobs.train"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch_command(launcher: str, run_config: Path, ranks: int, *, master_port: int | None = None,
                   module: str = ENTRY, max_failures: int = 3, ray_address: str | None = None) -> list[str]:
    """`ranks` processes of `module --run-config run_config`: on this machine (torchrun, deepspeed), or as Ray Train
    workers (ray; `ray_address` unset: RAY_ADDRESS, else an embedded Ray; `max_failures` restarts).
    torchrun without `master_port` rendezvouses on a port it picks itself (`--standalone`)."""
    entry = [module, "--run-config", str(run_config)]
    if launcher == "torchrun":
        where = ["--master_port", str(master_port)] if master_port else ["--standalone"]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), *where, "-m", *entry]
    if launcher == "deepspeed":
        bin_dir = str(Path(sys.executable).parent)
        binary = shutil.which("deepspeed", path=bin_dir + os.pathsep + os.environ.get("PATH", ""))
        if binary is None:
            raise FileNotFoundError("the `deepspeed` launcher is not installed next to this Python; install deepspeed "
                                    "or set training.launcher: torchrun")
        return [binary, "--num_gpus", str(ranks), "--master_port", str(master_port or free_port()), "--module", *entry]
    if launcher == "ray":
        if module != ENTRY:
            raise ValueError("the ray launcher runs training_jobs.train only")
        return [sys.executable, "-m", "training_jobs.ray_launch", "--run-config", str(run_config),
                "--num-workers", str(ranks), "--max-failures", str(max_failures),
                *(["--address", ray_address] if ray_address else [])]
    raise ValueError(f"launcher {launcher!r}: expected torchrun, deepspeed or ray")
