"""The Ray launcher on a real two-node Ray cluster on loopback (two raylets on 127.0.0.2, one CPU each, so the two
workers land on different nodes): the same losses as the deepspeed launcher, and a node lost mid-run is survived.

The references are the training tests' runs with the same settings (conftest.py): run_b through the deepspeed
launcher (steps 1-8) and run_a through torchrun (steps 1-12, its val loss); test_train_cpu shows those two agree
bit for bit. Equality: every launcher runs the same entry point with the same seed, data order, world size (2)
and collectives (gloo on CPU), one compute thread per rank (OMP_NUM_THREADS=1 there, and Ray gives a 1-CPU worker
one thread), so the float operations are the same ones in the same order. The tolerance is 1e-6 relative: room
for the last bits of a float32 loss, far below a change of one step's data or one update (those move the loss by
1e-3 or more).
"""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from tests.ray_cluster import start_cluster
from tests.training_jobs.conftest import REPO, launch_command, read_metrics, summary_of, write_run

pytestmark = pytest.mark.slow

RTOL = 1e-6


@pytest.fixture(scope="module")
def cluster():
    started = start_cluster(nodes=2)
    yield started
    started.stop()


class Driver:
    """The Ray launcher's process, its output read as it comes (the test acts on what it says)."""

    def __init__(self, run_config: Path, cluster, env: dict[str, str] | None = None):
        _, full_env = launch_command(run_config, 1, "python", env)
        self.process = subprocess.Popen(
            [sys.executable, "-m", "training_jobs.ray_launch", "--run-config", str(run_config), "--num-workers", "2",
             "--max-failures", "2"],
            cwd=REPO, env={**full_env, **cluster.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
        self.lines: list[str] = []
        self.reader = threading.Thread(target=lambda: self.lines.extend(self.process.stdout), daemon=True)
        self.reader.start()

    def node(self) -> str | None:
        """The Ray node this driver is attached to (it prints it once connected)."""
        return next((line.split()[-1] for line in self.lines if "driver node" in line), None)

    def wait(self, timeout: int = 600) -> tuple[int, str]:
        code = self.process.wait(timeout=timeout)
        self.reader.join(timeout=30)
        return code, "".join(self.lines)


def losses(output: Path) -> dict[int, float]:
    return {step: row["train/loss"] for step, row in read_metrics(output).items()}


def test_ray_launcher_survives_a_lost_node_with_the_deepspeed_launchers_losses(cluster, run_a, run_b, token_dataset,
                                                                                 tmp_path):
    cluster.ensure_nodes(2)
    out = tmp_path / "ray-killed"
    # run_a's settings (12 steps, a checkpoint every 4). 0.5 s more per step: time to kill a node after the first
    # checkpoint while the run is still going (a killed raylet's workers run on for a second or two).
    driver = Driver(write_run(tmp_path, token_dataset, out, val_every_steps=6), cluster,
                    env={"KILN_INJECT_FAULT": "slow@500"})
    deadline = time.monotonic() + 300
    while not (driver.node() and (out / "checkpoints" / "step_00000004" / "manifest.json").exists()):
        assert driver.process.poll() is None and time.monotonic() < deadline, "".join(driver.lines)[-6000:]
        time.sleep(0.1)
    # A node running a training worker, not the driver's (a driver loses its run with its node, as on any cluster;
    # on one host Ray may attach the driver to either raylet).
    victim = next(n for n in cluster.live_nodes() if cluster.node_id(n) != driver.node())
    cluster.kill_node(victim)
    killed_at = max(losses(out), default=0)
    cluster.ensure_nodes(2)  # a replacement machine joins; the new worker group needs two 1-CPU nodes
    code, output = driver.wait()
    (tmp_path / "driver.log").write_text(output)
    # The driver's own lines: Ray prints the last lines of a killed raylet's log too.
    output = "".join(line for line in output.splitlines(keepends=True) if "(raylet)" not in line and
                     not line.startswith(" "))
    assert code == 0, output[-6000:]
    assert killed_at < 12, "the node died after the run had finished: nothing was recovered"
    summary = summary_of(out)
    assert summary["status"] == "completed" and summary["steps"] == 12 and summary["world_size"] == 2
    # Resumed from Kiln's newest verified checkpoint, which may be newer than the last one Ray Train recorded: the
    # workers of a killed raylet can run on for a few steps before Ray declares the node dead.
    assert summary["resumed_from"] is not None
    assert "done: completed" in output  # rank 0's lines reach the driver through the relay
    # Every step equals the references': those before the kill, and those the new workers redid from the
    # checkpoint (metrics.jsonl keeps a redone step's last row).
    got = losses(out)
    assert sorted(got) == list(range(1, 13))
    assert {s: got[s] for s in range(1, 9)} == pytest.approx(losses(run_b), rel=RTOL)  # the deepspeed launcher
    assert got == pytest.approx(losses(run_a), rel=RTOL)
    assert summary["final_loss"] == pytest.approx(summary_of(run_a)["final_loss"], rel=RTOL)
    assert summary["val_loss"] == pytest.approx(summary_of(run_a)["val_loss"], rel=RTOL)
    # Ray Train's own record names Kiln's last checkpoint (a pointer, not a copy of the weights).
    pointers = sorted((out / "ray").rglob("kiln_checkpoint.json"))
    assert pointers and json.loads(pointers[-1].read_text())["path"] == summary["checkpoint"]
    assert not list((out / "ray").rglob("*.pt"))


def test_a_run_whose_inputs_are_refused_is_not_restarted(cluster, token_dataset, tmp_path):
    """Ray Train restarts a worker group whatever a worker raised. A run whose inputs are refused (here its shards
    are not the version the run was set up on, as when the partition is materialized again after the asset checked
    it) would be refused again by each restart: the launcher stops at the first, with the reason."""
    from training_jobs.settings import RunConfig

    cluster.ensure_nodes(2)
    out = tmp_path / "refused"
    path = write_run(tmp_path, token_dataset, out)
    RunConfig.read(path).model_copy(update={"dataset_data_version": "a-version-since-replaced"}).write(path)
    code, output = Driver(path, cluster).wait()  # --max-failures 2
    assert code == 1, output[-6000:]
    assert "training refused, not restarted: training_jobs.loader.DatasetReplaced: " in output, output[-6000:]
    assert "gave up" not in output
    summary = summary_of(out)
    assert summary["status"] == "failed" and "this run was set up on version a-version-since-replaced" in \
        summary["error"]
