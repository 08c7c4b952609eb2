import os
import shutil
import socket
import sys
from pathlib import Path
from typing import Literal

import dagster as dg

from kiln.config import kiln_home


class TrainingLauncher(dg.ConfigurableResource):
    """How a training run's processes start: on this machine (the deepspeed launcher or torchrun with
    `nproc_per_node` processes), or across the nodes of a DeepSpeed hostfile (multi-node)."""

    launcher: Literal["deepspeed", "torchrun"] = "deepspeed"
    nproc_per_node: int = 2  # GPUs per node; on CPU, processes (gloo)
    hostfile: str | None = None  # MPI-style "worker-0 slots=8" lines: the deepspeed launcher runs over ssh
    num_nodes: int | None = None  # with a hostfile: the first N hosts (default: all)
    master_port: int | None = None  # None: a free port per launch, so runs on one host never collide

    def command(self, run_config: Path) -> list[str]:
        entry = ["training_jobs.train", "--run-config", str(run_config)]
        port = str(self.master_port or _free_port())
        if self.launcher == "torchrun":
            if self.hostfile:
                raise ValueError("TrainingLauncher: a hostfile needs launcher='deepspeed' (torchrun is started per "
                                 "node by your scheduler); set launcher: deepspeed or drop hostfile")
            return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(self.nproc_per_node),
                    "--master_port", port, "-m", *entry]
        binary = shutil.which("deepspeed", path=str(Path(sys.executable).parent) + os.pathsep + os.environ.get("PATH", ""))
        if binary is None:
            raise FileNotFoundError("TrainingLauncher: the `deepspeed` launcher is not installed next to this Python; "
                                    "install deepspeed or set launcher: torchrun")
        nodes = ["--hostfile", self.hostfile] + (["--num_nodes", str(self.num_nodes)] if self.num_nodes else []) \
            if self.hostfile else []
        return [binary, *nodes, "--num_gpus", str(self.nproc_per_node), "--master_port", port, "--module", *entry]

    def env(self) -> dict[str, str]:
        """What every training process needs: CPU accelerator when there is no GPU, the JIT-op cache."""
        env = {"MLFLOW_DISABLE_TELEMETRY": "true",
               "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(kiln_home() / "torch_extensions")),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                           os.environ.get("PYTHONPATH")]))}
        if "DS_ACCELERATOR" in os.environ:
            env["DS_ACCELERATOR"] = os.environ["DS_ACCELERATOR"]
        return env


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MlflowTracking(dg.ConfigurableResource):
    """Where training runs are tracked: a SQLite store under KILN_HOME by default, or an `mlflow server`."""

    tracking_uri: str = f"sqlite:///{kiln_home() / 'mlflow.db'}"
    artifact_location: str = str(kiln_home() / "mlartifacts")  # for experiments Kiln creates (SQLite store)
    experiment: str = "kiln"
    ui_url: str = "http://127.0.0.1:5000"  # where a local store is browsed (`make mlflow`); a server is its own UI

    def client(self):
        """A client bound to this store. Not `mlflow.set_tracking_uri`: that sets MLFLOW_TRACKING_URI for the
        whole process, and every process it starts later would log to this store."""
        import mlflow

        return mlflow.MlflowClient(self.tracking_uri)

    def prepare(self) -> str:
        """The experiment id, created on first use (with artifacts under KILN_HOME for a local store)."""
        client = self.client()
        found = client.get_experiment_by_name(self.experiment)
        if found is not None:
            return found.experiment_id
        location = Path(self.artifact_location).resolve().as_uri() if not self.tracking_uri.startswith("http") else None
        return client.create_experiment(self.experiment, artifact_location=location)

    def env(self) -> dict[str, str]:
        return {"MLFLOW_TRACKING_URI": self.tracking_uri, "MLFLOW_EXPERIMENT_NAME": self.experiment}

    def run_url(self, experiment_id: str, run_id: str) -> str:
        """The run's page in the MLflow UI: the tracking server's, or `make mlflow`'s for a local store."""
        base = self.tracking_uri if self.tracking_uri.startswith("http") else self.ui_url
        return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
