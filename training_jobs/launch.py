"""The command that starts a training run's processes, for every launcher: one place for the Dagster resource
(resources/training.py), the benchmarks and the tests. Dagster-free, so a GPU machine with only the training
dependencies (bench/train_bench.py) builds the same command a materialization runs.

Every launcher runs under `python -m training_jobs.launch` (supervise): a SIGINT or SIGTERM to the launch command's
process alone stops every rank and every process the launcher started before that process exits. That is what
Dagster Pipes sends when a run is terminated from the UI (PipesSubprocessClient's forward_termination), and what
`kill PID` and process supervisors send. A launch also stops when the process that started it is gone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
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
    workers (ray; `ray_address` unset: RAY_ADDRESS, else an embedded Ray; `max_failures` restarts); the launcher
    under `supervise`. torchrun without `master_port` rendezvouses on a port it picks itself (`--standalone`)."""
    return [sys.executable, "-m", "training_jobs.launch",
            *launcher_command(launcher, run_config, ranks, master_port, module, max_failures, ray_address)]


def launcher_command(launcher: str, run_config: Path, ranks: int, master_port: int | None, module: str,
                     max_failures: int, ray_address: str | None) -> list[str]:
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


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SESSION_EXIT_S = 10.0  # what is left of the session after the launcher: SIGTERM, then SIGKILL after this
PARENT_CHECK_S = 1.0  # how often the supervisor looks whether the process that started it is still there


def _session_members(sid: int) -> list:
    """The running processes of session `sid` (a zombie, its exit not yet collected, has ended)."""
    import psutil  # a dependency of DeepSpeed and Ray

    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if os.getsid(proc.pid) == sid and proc.info["status"] != psutil.STATUS_ZOMBIE:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def supervise(command: list[str]) -> int:
    """Run `command` (a launcher) in a session of its own and pass SIGINT, SIGTERM and SIGHUP on to it; once it has
    exited, stop what is left of its session, by the session's id (SIGTERM, SIGKILL after SESSION_EXIT_S). Returns
    `command`'s exit status (128 + the signal for a signal, as a shell reports it).

    A signal to the launcher alone is what Dagster Pipes sends when a run is terminated, and launchers differ in
    what it reaches. torchrun stops its ranks itself (each in a session of its own). DeepSpeed's `deepspeed` runner
    handles signals only for multi-node pdsh launches: it ended and left its launcher and every rank training,
    holding the GPUs and writing checkpoints into the run folder the next attempt uses. The Ray driver shuts its
    embedded Ray down, but on a busy machine Ray Train's actors and ranks, and Ray's agents still starting,
    outlived it. Everything those two start is in the launcher's session.

    The launch also stops with the process that started it (SIGTERM to the launcher once this process's parent is
    gone, looked at every PARENT_CHECK_S): a Dagster step process that is killed (SIGKILL, the out-of-memory
    killer) sends no signal, and its training would go on, unseen, beside the next attempt in the same run folder."""
    child: subprocess.Popen | None = None
    pending: list[int] = []

    def forward(signum: int, _frame) -> None:
        if child is None:
            pending.append(signum)
        else:
            with contextlib.suppress(ProcessLookupError):
                child.send_signal(signum)

    for signum in FORWARDED:
        signal.signal(signum, forward)
    parent = os.getppid()
    child = subprocess.Popen(command, start_new_session=True)
    for signum in pending:  # arrived while the child was starting
        child.send_signal(signum)
    orphaned = False
    while True:
        try:
            code = child.wait(PARENT_CHECK_S)
            break
        except subprocess.TimeoutExpired:
            if not orphaned and os.getppid() != parent:  # adopted by init or a subreaper: the parent is gone
                orphaned = True
                with contextlib.suppress(ProcessLookupError):
                    child.send_signal(signal.SIGTERM)
    left = _session_members(child.pid)
    if left:
        import psutil

        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(left, timeout=SESSION_EXIT_S)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    return code if code >= 0 else 128 - code


if __name__ == "__main__":  # python -m training_jobs.launch COMMAND...: supervise(COMMAND)
    sys.exit(supervise(sys.argv[1:]))
