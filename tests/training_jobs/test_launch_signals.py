"""A signal to a training launcher's process alone stops the whole run, with every launcher, and so does the end of
the process that started the launch, or of the launch command's own process; while a launch runs, no other may
launch into its run folder.

Terminating a run in the Dagster UI sends SIGINT to the launch command's process and to nothing else
(dagster.PipesSubprocessClient with its default forward_termination); `kill PID` and process supervisors send
SIGTERM the same way; a Dagster step process killed outright sends nothing, and nor does a launch command's process
killed outright. A rank left running holds its GPU and goes on writing checkpoints into the run folder.
"""

from __future__ import annotations

import re
import signal
import subprocess
import sys
import time

import psutil
import pytest

from tests.training_jobs.conftest import REPO, launch_command, read_metrics, write_run
from training_jobs import checkpoint, launch


def start_and_wait_for_step_10(launcher: str, tmp_path, token_dataset, parent: list[str] = ()) -> subprocess.Popen:
    """A 2-rank run through the launch command (under `parent`, a command that starts it, if given), once both ranks
    are in step 10, after checkpoint 8: whatever the launcher prints and however long its start took."""
    out = tmp_path / "run"
    config = write_run(tmp_path, token_dataset, out, max_steps=40, schedule={"total_steps": 40})
    cmd, env = launch_command(config, nproc=2, launcher=launcher, env={"KILN_INJECT_FAULT": "hang@10"})
    with open(tmp_path / "launch.log", "wb") as log:
        launched = subprocess.Popen([*parent, *cmd], cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT,
                                    start_new_session=True)  # the test's signal reaches the launcher alone
    deadline = time.monotonic() + 240
    while not (out / "checkpoints" / "step_00000008" / checkpoint.MANIFEST).is_file():
        if launched.poll() is not None or time.monotonic() > deadline:
            kill_all([psutil.Process(launched.pid), *psutil.Process(launched.pid).children(recursive=True)])
            output = (tmp_path / "launch.log").read_text()
            pytest.fail(f"the run ended or stalled before checkpoint 8:\n{output[-3000:]}")
        time.sleep(0.2)
    time.sleep(2)  # into step 10
    return launched


def kill_all(procs: list[psutil.Process]) -> None:
    """What a failed test leaves, by the ids it saw."""
    for proc in procs:
        try:
            proc.kill()
        except psutil.Error:
            pass


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
    launched = start_and_wait_for_step_10(launcher, tmp_path, token_dataset)
    tree = [psutil.Process(launched.pid)]
    try:
        tree += tree[0].children(recursive=True)
        assert len(tree) >= 3, [p.cmdline() for p in tree]  # the launcher and at least its two ranks
        launched.send_signal(signum)
        code = launched.wait(120)
        # A process the launcher stopped may still be in its exit (memory released, cmdline empty, not yet a
        # zombie) when the launcher returns: a few seconds' grace. A rank left behind hangs at step 10 for good.
        deadline = time.monotonic() + 10
        while (alive := running(tree)) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert not alive, (f"still running 10 s after the launcher exited ({code}): {alive}\n"
                           + (tmp_path / "launch.log").read_text()[-3000:])
        assert code != 0  # stopped, not finished
        assert not (tmp_path / "run" / "summary.json").exists()
    finally:
        kill_all(tree)


@pytest.mark.slow
@pytest.mark.parametrize("killed", ["step", "launch"])
def test_a_launch_whose_step_or_own_process_is_killed_stops_every_rank(killed, tmp_path, token_dataset):
    """SIGKILL passes nothing on. With the process that started the launch (a Dagster step) killed, the launch sees
    within seconds that its parent is gone and stops the run. The launch command's own process killed runs none of
    its code: its reaper (a process of its own, in a session of its own) stops the launcher, then lets go of the run
    folder; without it torchrun and both ranks trained on to the end."""
    step = [sys.executable, "-c", "import subprocess, sys, time; subprocess.Popen(sys.argv[1:]); time.sleep(3600)"]
    started = start_and_wait_for_step_10("torchrun", tmp_path, token_dataset, parent=step if killed == "step" else ())
    tree = [psutil.Process(started.pid), *psutil.Process(started.pid).children(recursive=True)]
    out = tmp_path / "run"
    try:
        # [the step,] the launch, torchrun and its two ranks (and the launch's reaper)
        assert len(tree) >= (5 if killed == "step" else 4), [p.cmdline() for p in tree]
        started.kill()
        started.wait()
        deadline = time.monotonic() + 60
        while (alive := running(tree)) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert not alive, f"still running 60 s after the {killed} was killed: {alive}"
        assert launch.busy(out) is None
        assert not (out / "summary.json").exists()
        if killed == "launch":  # torchrun and its two ranks (in sessions of their own, found by the launch id)
            stopped = re.search(r"supervisor ended without stopping its launcher; stopped (\d+) process",
                                (tmp_path / "launch.log").read_text())
            assert stopped and int(stopped.group(1)) >= 3
    finally:
        kill_all(tree)


def test_a_launcher_that_cannot_start_leaves_no_reaper_behind():
    """The supervisor forks its reaper before it starts the launcher; a launcher that cannot start raises, and the
    reaper is told and waited for, not left waiting on its pipe for as long as the caller lives."""
    probe = ("import psutil\nfrom training_jobs import launch\ntry:\n    launch.supervise(['/no/such/launcher'])\n"
             "except FileNotFoundError:\n    print('children', len(psutil.Process().children()))")
    done = subprocess.run([sys.executable, "-c", probe], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "children 0", done.stdout + done.stderr


@pytest.mark.slow
def test_a_second_launch_into_a_folder_being_trained_is_refused_and_writes_nothing(tmp_path, token_dataset):
    first = start_and_wait_for_step_10("torchrun", tmp_path, token_dataset)
    tree = [psutil.Process(first.pid), *psutil.Process(first.pid).children(recursive=True)]
    out = tmp_path / "run"
    try:
        metrics = (out / "metrics.jsonl").read_bytes()
        reason = launch.busy(out)
        assert reason is not None and f"pid {first.pid} on " in reason  # the supervisor holds the lock
        cmd, env = launch_command(tmp_path / "run.json", nproc=2)
        second = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
        assert second.returncode == launch.BUSY
        assert f"{out} is being trained by another launch (pid {first.pid} on " in second.stderr
        assert (out / "metrics.jsonl").read_bytes() == metrics and not (out / "summary.json").exists()
        assert sorted(read_metrics(out)) == list(range(1, 9))  # the first run's steps, nothing of the second
        first.send_signal(signal.SIGINT)
        first.wait(120)
        assert launch.busy(out) is None  # the lock went with the launch
    finally:
        kill_all(tree)


def test_a_rank_in_a_session_of_its_own_is_stopped_when_its_launcher_is_killed(tmp_path):
    """torchrun starts each rank in a session of its own, so with torchrun itself killed (SIGKILL, the out-of-memory
    killer) its ranks were in no session of the launch: they trained on, and the run folder's lock was let go. They
    carry the launch's id in their environment, and are stopped by it. Here a launcher starts a "rank" in a new
    session, then kills itself."""
    pid_file = tmp_path / "rank.pid"
    launcher = ("import os, signal, subprocess, sys, time\n"
                "rank = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(120)'], start_new_session=True)\n"
                f"open({str(pid_file)!r}, 'w').write(str(rank.pid))\n"
                "os.kill(os.getpid(), signal.SIGKILL)\n")
    code = launch.supervise([sys.executable, "-c", launcher])
    try:
        rank = [psutil.Process(int(pid_file.read_text()))]
    except psutil.NoSuchProcess:
        rank = []  # stopped, and already reaped
    try:
        assert code == 128 + signal.SIGKILL
        assert not running(rank), "the rank outlived its killed launcher"
    finally:
        kill_all(rank)


def test_the_ray_launcher_refuses_fewer_than_one_worker(capsys, monkeypatch):
    """`--num-workers 0` went to Ray Train's ScalingConfig, which takes it without a word (and starts one worker):
    refused before Ray starts, naming the option."""
    from training_jobs import ray_launch

    monkeypatch.setattr(ray_launch, "run", lambda *args, **kwargs: pytest.fail("Ray was started"))
    for workers in ("0", "-2"):
        with pytest.raises(SystemExit) as exited:
            ray_launch.main(["--run-config", "run.json", "--num-workers", workers])
        assert exited.value.code == 2
        assert f"--num-workers: {workers}: a run needs at least 1 training worker" in capsys.readouterr().err
