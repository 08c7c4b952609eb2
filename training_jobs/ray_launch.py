"""The Ray launcher: Kiln's training entry point on Ray Train workers, restarted automatically when one is lost.

    python -m training_jobs.ray_launch --run-config run.json --num-workers 2 [--address HOST:6379]

Ray Train's `TorchTrainer` starts `--num-workers` workers on the Ray cluster (`--address`, else RAY_ADDRESS, else
an embedded local Ray that stops with this process) and sets up their process group (gloo on CPU, nccl on GPUs);
each worker runs `training_jobs.train.main`, whose `deepspeed.init_distributed` reuses that group.

Recovery: `FailureConfig(max_failures)`. When a worker or its node dies, Ray Train stops the group and starts a
new one, whose workers resume from Kiln's newest verified checkpoint (`checkpoint.find_resumable`: manifest and
hashes), exactly as any restart of the entry point does. After each Kiln checkpoint the workers report a pointer
to it (`kiln_checkpoint.json`: folder, step, manifest sha256) as the Ray Train checkpoint, so Ray's run state
names the same checkpoint: Kiln's format stays the only one, and no weights are copied.

Dagster sees the run through Pipes: this driver is the process Dagster launched, but the workers may run on
other machines, where Pipes' message file does not exist. So rank 0 hands its messages (progress lines, the
final materialization) to a Ray queue that lives on this driver's node; the driver prints the lines and passes
everything to its own Pipes context when it has one. (Worker output stays in Ray's logs on each node: forwarded
to the driver it would also carry Ray Train's own chatter.) The workers log to MLflow themselves (MLFLOW_* is
forwarded: use a tracking server every node can reach), and they read shards and write checkpoints under the run
config's folders, which every node must see at the same path (a shared filesystem), as with any multi-node
launcher.

Exit code: 0 when the run completed, 3 when it diverged (the trainer's own codes), 1 when it failed (after
`max_failures` restarts, or at once when its inputs were refused: `train.REFUSALS`, which a restart cannot change);
summary.json says why.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import queue as stdlib_queue
import sys
import threading
import time
from pathlib import Path
from typing import Any

from kiln.common.manifest import read_json_or_empty

# What the workers need from the launching environment (Ray starts them with the cluster's own environment).
FORWARDED = ("MLFLOW_TRACKING_URI", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_RUN_ID", "MLFLOW_DISABLE_TELEMETRY",
             "TORCH_EXTENSIONS_DIR", "DS_ACCELERATOR", "KILN_HOME", "PYTHONPATH", "KILN_INJECT_FAULT",
             "CUDA_VISIBLE_DEVICES")
POINTER = "kiln_checkpoint.json"


class _Log:
    def __init__(self, send):
        self.info = lambda text: send(("log", text))


class RelayedPipes:
    """The slice of a Pipes context the trainer uses (`log.info`, `report_asset_materialization`), sent over a
    Ray queue to the driver. A message that cannot be sent is dropped: reporting must never stop training."""

    def __init__(self, channel):
        self.channel = channel
        self.log = _Log(self._send)

    def _send(self, message: tuple) -> None:
        try:
            self.channel.put(message, timeout=30)
        except Exception:  # noqa: BLE001: the driver's queue is gone (driver or its node lost)
            pass

    def report_asset_materialization(self, metadata: dict[str, Any], data_version: str | None = None) -> None:
        self._send(("materialization", metadata, data_version))


def report_checkpoint(step: int, folder: Path) -> None:
    """After a Kiln checkpoint, on every rank (Ray Train's report is collective): rank 0 reports a pointer."""
    import tempfile

    import ray.train

    from training_jobs import checkpoint

    if ray.train.get_context().get_world_rank() != 0:
        ray.train.report({"step": step})
        return
    with tempfile.TemporaryDirectory(prefix="kiln-ray-ckpt-") as tmp:
        (Path(tmp) / POINTER).write_text(json.dumps(
            {"path": str(folder), "step": step,
             "manifest_sha256": checkpoint.sha256_file(folder / checkpoint.MANIFEST)}))
        ray.train.report({"step": step}, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def train_worker(config: dict[str, Any]) -> None:
    """One Ray Train worker: Kiln's entry point in this process, on the group Ray Train set up."""
    import ray.train

    from training_jobs import train

    relay = RelayedPipes(config["channel"]) if ray.train.get_context().get_world_rank() == 0 else None
    previous = ray.train.get_checkpoint()
    if previous is not None and relay is not None:
        with previous.as_directory() as folder:
            pointer = json.loads((Path(folder) / POINTER).read_text())
        relay.log.info(f"restarted by Ray Train; its last reported checkpoint is {pointer['path']} (step "
                       f"{pointer['step']}); resuming from Kiln's newest verified checkpoint")
    host = train.Host(pipes=relay, after_checkpoint=report_checkpoint, owns_process_group=False)
    try:
        code = train.main(["--run-config", config["run_config"]], host=host)
    except train.REFUSALS:
        return  # summary.json says why; a restart would read the same inputs and be refused again
    if code not in (0, 3):
        raise RuntimeError(f"training_jobs.train exited with {code}")


def run(run_config: Path, num_workers: int, address: str | None, max_failures: int, use_gpu: bool | None,
        pipes=None) -> int:
    import ray
    from ray.train import FailureConfig, RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer
    from ray.util.queue import Queue
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from training_jobs.settings import RunConfig as KilnRunConfig

    kiln_run = KilnRunConfig.read(run_config)
    env = {k: os.environ[k] for k in FORWARDED if k in os.environ}
    env.setdefault("PYTHONPATH", str(Path(__file__).resolve().parents[1]))
    address = address or os.environ.get("RAY_ADDRESS") or None
    # Embedded: at least one logical CPU per worker, so a laptop runs as many ranks as asked for.
    local = {} if address else {"num_cpus": max(os.cpu_count() or 1, num_workers), "include_dashboard": False}
    ray.init(address=address, runtime_env={"env_vars": env}, log_to_driver=False, **local)
    try:
        if use_gpu is None:
            use_gpu = ray.cluster_resources().get("GPU", 0) > 0
        here = ray.get_runtime_context().get_node_id()
        nodes = sum(node["Alive"] for node in ray.nodes())
        print(f"Ray cluster of {nodes} nodes; {num_workers} workers ({'one GPU' if use_gpu else 'one CPU'} each); "
              f"driver node {here}", flush=True)
        # Restartable: should the queue's node die (or be declared dead when its heartbeats lag), Ray restarts it,
        # elsewhere if need be (soft affinity), and the lines after the outage still reach the driver.
        channel = Queue(actor_options={"num_cpus": 0, "max_restarts": -1, "scheduling_strategy":
                                       NodeAffinitySchedulingStrategy(here, soft=True)})
        output = Path(kiln_run.output_dir).resolve()
        trainer = TorchTrainer(
            train_worker,
            train_loop_config={"run_config": str(Path(run_config).resolve()), "channel": channel},
            scaling_config=ScalingConfig(num_workers=num_workers, use_gpu=use_gpu),
            run_config=RunConfig(name=kiln_run.run_name or output.name, storage_path=str(output / "ray"),
                                 failure_config=FailureConfig(max_failures=max_failures)))
        error = _fit_relaying(trainer, channel, pipes)
    finally:
        ray.shutdown()
    if error is not None:
        print(f"Ray Train gave up after {max_failures} restarts: {error}", file=sys.stderr, flush=True)
        return 1
    summary = read_json_or_empty(output / "summary.json")
    if summary.get("status") == "failed":  # refused (train.REFUSALS): not restarted
        print(f"training refused, not restarted: {summary['error'].strip().splitlines()[-1]}", file=sys.stderr,
              flush=True)
    return {"completed": 0, "diverged": 3}.get(summary.get("status"), 1)


def _fit_relaying(trainer, channel, pipes) -> BaseException | None:
    """trainer.fit(), meanwhile printing rank 0's lines from the queue and passing its messages to Pipes; returns
    why Ray Train gave up, or None."""
    outcome: dict[str, BaseException | None] = {}

    def fit() -> None:
        try:
            outcome["error"] = trainer.fit().error
        except Exception as exc:  # noqa: BLE001: TrainingFailedError and friends; the driver reports it
            outcome["error"] = exc

    thread = threading.Thread(target=fit, daemon=True)
    thread.start()
    warned = False
    while thread.is_alive() or _has_messages(channel):
        try:
            message = channel.get(timeout=1)
        except stdlib_queue.Empty:  # ray.util.queue.Empty subclasses it
            continue
        except Exception as exc:  # noqa: BLE001: unreachable for a while (a node is failing); training goes on
            if not warned:
                print(f"the workers' message queue is unavailable ({type(exc).__name__}); retrying (the lines are "
                      f"also in Ray's worker logs)", file=sys.stderr, flush=True)
                warned = True
            time.sleep(1)
            continue
        if message[0] == "log":
            print(message[1], flush=True)
            if pipes is not None:
                pipes.log.info(message[1])
        elif pipes is not None:
            pipes.report_asset_materialization(metadata=message[1], data_version=message[2])
    return outcome["error"]


def _has_messages(channel) -> bool:
    try:
        return not channel.empty()
    except Exception:  # noqa: BLE001: the queue is gone: nothing more will come
        return False


def _at_least_one(text: str) -> int:
    """--num-workers: Ray Train's ScalingConfig takes 0 without a word (its placement still starts one worker)."""
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{value}: a run needs at least 1 training worker")
    return value


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train a Kiln model on Ray Train workers (DeepSpeed).")
    parser.add_argument("--run-config", required=True, type=Path, help="the run config JSON (RunConfig)")
    parser.add_argument("--num-workers", type=_at_least_one, required=True, help="training workers (ranks) in all")
    parser.add_argument("--address", default=None,
                        help="the Ray cluster's GCS address (host:6379, auto); default RAY_ADDRESS, else local Ray")
    parser.add_argument("--max-failures", type=int, default=3, help="restarts of the worker group before giving up")
    parser.add_argument("--gpu", choices=("auto", "yes", "no"), default="auto",
                        help="one GPU per worker (auto: when the cluster has GPUs)")
    args = parser.parse_args(argv)
    from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

    with contextlib.ExitStack() as stack:
        pipes = (stack.enter_context(open_dagster_pipes()) if PipesEnvVarParamsLoader().is_dagster_pipes_process()
                 else None)
        return run(args.run_config, args.num_workers, args.address, args.max_failures,
                   {"auto": None, "yes": True, "no": False}[args.gpu], pipes)


if __name__ == "__main__":
    sys.exit(main())
