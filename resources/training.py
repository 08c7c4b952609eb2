import os
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Optional, get_args

import dagster as dg
from pydantic import field_validator

from kiln.common.config import kiln_home
from kiln.common.secrets import redact, redact_url
from training_jobs.launch import launch_command
from training_jobs.settings import TrainingSettings

LAUNCHERS = get_args(TrainingSettings.model_fields["launcher"].annotation)
CPU_RANKS = 2  # processes of a training run on a machine without GPUs: the gloo data-parallel path, tested here


class TrainingLauncher(dg.ConfigurableResource):
    """How a training run's processes start. `launcher` unset follows the project config's `training.launcher`:
    `torchrun` or `deepspeed` start `nproc_per_node` processes on this machine; `ray` starts `num_workers` Ray
    Train workers on the Ray cluster the data engine uses (`ray_address` here, else `engine.ray_address`, else
    RAY_ADDRESS, else an embedded local Ray), restarted from the newest checkpoint when a worker or its node is
    lost (up to `max_failures` times). Many machines means Ray: training_jobs/ray_launch.py."""

    launcher: Optional[str] = None  # torchrun | deepspeed | ray; None: training.launcher
    # deepspeed / torchrun: processes on this machine, one per GPU; None: every visible GPU (CUDA_VISIBLE_DEVICES
    # narrows them), or CPU_RANKS processes (gloo) where there is none
    nproc_per_node: int | None = None
    # ray: training workers (ranks) in all, one GPU each where the cluster has GPUs; None: nproc_per_node
    num_workers: int | None = None  # (no Field bounds: a deployment's EnvVar.int is validated as 0 at load time)
    max_failures: int = 3  # ray: restarts of the worker group before the run fails; -1: no limit
    ray_address: str | None = None  # ray: the cluster's GCS address, over engine.ray_address
    master_port: int | None = None  # None: a free port per launch (torchrun picks it): runs on one host never collide

    @field_validator("launcher")
    @classmethod
    def _known(cls, value: str | None) -> str | None:
        if value not in (None, *LAUNCHERS):
            raise ValueError(f"TrainingLauncher.launcher {value!r}: expected one of {', '.join(LAUNCHERS)}, or leave "
                             f"it unset to follow training.launcher")
        return value

    def chosen(self, configured: str) -> str:
        return self.launcher or configured

    def ranks_per_node(self) -> int:
        """nproc_per_node, or this machine's GPUs: a machine with GPUs trains on all of them unless told otherwise."""
        if self.nproc_per_node is not None:
            return self.nproc_per_node
        import torch

        return torch.cuda.device_count() or CPU_RANKS

    def world_size(self, configured: str) -> int:
        """The ranks a launch starts: what the layout (training.parallelism) must divide."""
        on_ray = self.chosen(configured) == "ray"
        if on_ray and self.num_workers is not None:  # 0 is a setting (KILN_TRAINING_WORKERS=0), not "unset"
            if self.num_workers < 1:
                raise ValueError(f"TrainingLauncher.num_workers is {self.num_workers}: the ray launcher needs at least "
                                 f"1 training worker; set num_workers (KILN_TRAINING_WORKERS in the deployments) to "
                                 f"1 or more, or leave it unset to start nproc_per_node workers")
            return self.num_workers
        ranks = self.ranks_per_node()
        if ranks < 1:
            raise ValueError(f"TrainingLauncher starts {ranks} training processes: set nproc_per_node (or num_workers "
                             f"for ray) to at least 1")
        return ranks

    def command(self, run_config: Path, configured: str = "torchrun", ray_address: str | None = None) -> list[str]:
        """The launch command; `configured`: training.launcher, `ray_address`: engine.ray_address."""
        launcher = self.chosen(configured)
        try:
            return launch_command(launcher, run_config, self.world_size(configured), master_port=self.master_port,
                                  max_failures=self.max_failures, ray_address=self.ray_address or ray_address)
        except FileNotFoundError as exc:
            raise FileNotFoundError(f"TrainingLauncher: {exc}") from None

    def env(self) -> dict[str, str]:
        """What every training process needs: CPU accelerator when there is no GPU, the JIT-op cache."""
        env = {"MLFLOW_DISABLE_TELEMETRY": "true",
               "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(kiln_home() / "torch_extensions")),
               "PYTHONPATH": os.pathsep.join(filter(None, [str(Path(__file__).resolve().parents[1]),
                                                           os.environ.get("PYTHONPATH")]))}
        if "DS_ACCELERATOR" in os.environ:
            env["DS_ACCELERATOR"] = os.environ["DS_ACCELERATOR"]
        return env


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

    @contextmanager
    def calls(self, what: str) -> Iterator[None]:
        """Calls to the tracking store: MLflow's errors quote the tracking URI, user:password@ included, and Dagster
        records a step's error with its cause and traceback. One is raised again as a `dg.Failure` naming `what` and
        the store without credentials, the original neither chained nor kept as context."""
        try:
            yield
        except dg.Failure:
            raise
        except Exception as exc:  # noqa: BLE001: any MLflow, HTTP or database error
            raise dg.Failure(description=f"{what} failed at MLflow at {redact_url(self.tracking_uri)}: "
                                         f"{type(exc).__name__}: {redact(str(exc))}") from None

    def end_unfinished(self, run_id: str, status: str) -> bool:
        """End run `run_id` as `status` (FAILED, KILLED) if it is still RUNNING: the ranks end their run themselves,
        but not when they never started (a launcher that could not start, a folder another launch took) or were
        killed outright, and the MLflow UI would show it running for ever. A run they ended keeps its status; a
        retry of the same run folder reopens it. True when it was ended here."""
        client = self.client()
        if client.get_run(run_id).info.status != "RUNNING":
            return False
        client.set_terminated(run_id, status)
        return True

    def run_url(self, experiment_id: str, run_id: str) -> str:
        """The run's page in the MLflow UI: the tracking server's (without the URI's credentials: the page goes into
        Dagster's metadata and the data card), or `make mlflow`'s for a local store."""
        base = redact_url(self.tracking_uri) if self.tracking_uri.startswith("http") else self.ui_url
        return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs/{run_id}"
