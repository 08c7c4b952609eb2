"""A signal to a training launcher's process alone stops the whole run, with every launcher.

Terminating a run in the Dagster UI sends SIGINT to the launch command's process and to nothing else
(dagster.PipesSubprocessClient with its default forward_termination); `kill PID` and process supervisors send
SIGTERM the same way. A rank left running holds its GPU and goes on writing checkpoints into the run folder.
"""

from __future__ import annotations

import signal
import subprocess
import time

import psutil
import pytest

from tests.training_jobs.conftest import REPO, launch_command, write_run
from training_jobs import checkpoint


def running(procs: list[psutil.Process]) -> list[str]:
    """The processes of `procs` still running (a zombie has ended), as 'pid command' for a failure message."""
    alive = []
    for proc in procs:
        try:
            if proc.status() != psutil.STATUS_ZOMBIE:
                alive.append(f"{proc.pid} {' '.join(proc.cmdline())[:160]}")
        except psutil.NoSuchProcess:
            continue
    return alive


@pytest.mark.slow
@pytest.mark.parametrize("launcher, signum", [("torchrun", signal.SIGINT), ("deepspeed", signal.SIGINT),
                                              ("deepspeed", signal.SIGTERM), ("ray", signal.SIGINT),
                                              ("ray", signal.SIGTERM)])
def test_a_signal_to_the_launcher_alone_stops_every_rank(launcher, signum, tmp_path, token_dataset):
    out = tmp_path / "run"
    config = write_run(tmp_path, token_dataset, out, max_steps=40, schedule={"total_steps": 40})
    # Both ranks stop in step 10, after checkpoint 8: the signal comes while the run is training, whatever the launcher
    # prints and however long its start took.
    cmd, env = launch_command(config, nproc=2, launcher=launcher, env={"KILN_INJECT_FAULT": "hang@10"})
    with open(tmp_path / "launch.log", "wb") as log:
        launched = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # the test's signal reaches the launcher alone
    tree = [psutil.Process(launched.pid)]
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoints" / "step_00000008" / checkpoint.MANIFEST).is_file():
            assert launched.poll() is None and time.monotonic() < deadline, (
                "the run ended or stalled before checkpoint 8:\n" + (tmp_path / "launch.log").read_text()[-3000:])
            time.sleep(0.2)
        time.sleep(2)  # into step 10
        tree += tree[0].children(recursive=True)
        assert len(tree) >= 3, [p.cmdline() for p in tree]  # the launcher and at least its two ranks
        launched.send_signal(signum)
        code = launched.wait(120)
        alive = running(tree)
        assert not alive, (f"still running after the launcher exited ({code}): {alive}\n"
                           + (tmp_path / "launch.log").read_text()[-3000:])
        assert code != 0  # stopped, not finished
        assert not (out / "summary.json").exists()
    finally:  # what survived a failure, by the ids this test saw
        for proc in tree:
            try:
                proc.kill()
            except psutil.Error:
                pass
