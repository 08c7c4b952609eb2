"""The command that starts a training run's processes, for every launcher: one place for the Dagster resource
(resources/training.py), the benchmarks and the tests. Dagster-free, so a GPU machine with only the training
dependencies (bench/train_bench.py) builds the same command a materialization runs.

Every launcher runs under `python -m training_jobs.launch` (supervise): a SIGINT or SIGTERM to the launch command's
process alone stops every rank and every process the launcher started before that process exits. That is what
Dagster Pipes sends when a run is terminated from the UI (PipesSubprocessClient's forward_termination), and what
`kill PID` and process supervisors send. A launch also stops when the process that started it is gone, or when
its own process is SIGKILLed (its reaper), and holds its run folder's lock (`.launch.lock`, flock) while it runs:
a second launch of the same folder is refused.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import traceback
import uuid
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
    return [sys.executable, "-m", "training_jobs.launch", "--run-config", str(run_config),
            *launcher_command(launcher, run_config, ranks, master_port, module, max_failures, ray_address)]


def launcher_command(launcher: str, run_config: Path, ranks: int, master_port: int | None, module: str,
                     max_failures: int, ray_address: str | None) -> list[str]:
    entry = [module, "--run-config", str(run_config)]
    if launcher == "torchrun":
        where = ["--master_port", str(master_port)] if master_port else ["--standalone"]
        # In the run folder: without --log-dir, torchrun leaves an empty torchelastic_* folder in /tmp every launch.
        logs = ["--log-dir", str(output_dir_of(run_config) / TORCHELASTIC_LOGS)]
        return [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", str(ranks), *where, *logs,
                "-m", *entry]
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


TORCHELASTIC_LOGS = "torchelastic"  # in the run folder: torchrun's per-attempt folders (a failed rank's error.json)
LOCK = ".launch.lock"  # in the run folder: held (flock) by the launch that trains there
# Held by the materialization that launches there, from its check of the folder to the launch's end: it writes
# run_config.json and the MLflow run id before its launch holds LOCK, which a second one must not rewrite.
MATERIALIZING = ".materialize.lock"
BUSY = 75  # the supervisor's exit status when another launch holds the run folder (EX_TEMPFAIL)


class RunFolderBusy(RuntimeError):
    """Another launch is training in this run folder; the message names it and what to do."""


def _busy_message(folder: Path, holder: str) -> str:
    return (f"{folder} is being trained by another launch ({holder or 'holder not recorded'}): stop it (Terminate "
            f"its Dagster run, or kill that pid) or wait for it to end, then launch again")


@contextlib.contextmanager
def run_folder_lock(folder: Path, name: str = LOCK):
    """Hold `folder`'s launch lock (or another of its locks: `name`) for the block (its file descriptor), recording
    who holds it; RunFolderBusy when another launch does. Two launches of one folder would interleave checkpoints,
    metrics and summaries. The lock lasts while a process holding the descriptor lives, whatever ends the others."""
    folder.mkdir(parents=True, exist_ok=True)
    fd = os.open(folder / name, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunFolderBusy(_busy_message(folder, os.pread(fd, 4096, 0).decode("utf-8", "replace"))) from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"pid {os.getpid()} on {socket.gethostname()} since "
                      f"{time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())}".encode(), 0)
        yield fd
    finally:
        os.close(fd)


def busy(folder: Path) -> str | None:
    """Why `folder` cannot be launched now (another launch holds its lock), or None: the check a caller makes before
    it writes into the folder. The launch itself takes the lock (supervise)."""
    if not (folder / LOCK).is_file():
        return None
    try:
        with run_folder_lock(folder):
            return None
    except RunFolderBusy as exc:
        return str(exc)


def output_dir_of(run_config: Path) -> Path:
    return Path(json.loads(Path(run_config).read_text(encoding="utf-8"))["output_dir"])


FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
SESSION_EXIT_S = 10.0  # what is left of the session after the launcher: SIGTERM, then SIGKILL after this
PARENT_CHECK_S = 1.0  # how often the supervisor looks whether the process that started it is still there


LAUNCH_ENV = "KILN_LAUNCH_ID"  # in the launcher's environment, so in that of everything it starts


def _launch_members(sid: int, launch_id: str) -> list:
    """The running processes of the launch (a zombie, its exit not yet collected, has ended): those of the launcher's
    session `sid`, and those that carry its id in their environment. torchrun starts each rank in a session of its
    own: with torchrun itself killed, its ranks are in no session of the launch, but they inherited its id."""
    import psutil  # a dependency of DeepSpeed and Ray

    members = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if os.getsid(proc.pid) == sid or proc.environ().get(LAUNCH_ENV) == launch_id:
                members.append(proc)
        except (ProcessLookupError, PermissionError, psutil.Error):
            continue
    return members


def supervise(command: list[str], run_config: Path | None = None) -> int:
    """Under the lock of `run_config`'s run folder (BUSY, and a message, when another launch holds it), run `command`
    (a launcher) in a session of its own and pass SIGINT, SIGTERM and SIGHUP on to it; once it has exited, stop what
    is left of the launch, by its session's id and the launch id in its processes' environment (SIGTERM, SIGKILL
    after SESSION_EXIT_S). Returns `command`'s exit
    status (128 + the signal for a signal, as a shell reports it).

    A signal to the launcher alone is what Dagster Pipes sends when a run is terminated, and launchers differ in
    what it reaches. torchrun stops its ranks itself (each in a session of its own; with torchrun killed, they are found by the
    launch id they inherited). DeepSpeed's `deepspeed` runner
    handles signals only for multi-node pdsh launches: it ended and left its launcher and every rank training,
    holding the GPUs and writing checkpoints into the run folder the next attempt uses. The Ray driver shuts its
    embedded Ray down, but on a busy machine Ray Train's actors and ranks, and Ray's agents still starting,
    outlived it. Everything those two start is in the launcher's session.

    The launch also stops with the process that started it (SIGTERM to the launcher once this process's parent is
    gone, looked at every PARENT_CHECK_S): a Dagster step process that is killed (SIGKILL, the out-of-memory
    killer) sends no signal, and its training would go on, unseen, beside the next attempt in the same run folder.
    This process SIGKILLed itself is what its reaper (`_start_reaper`) is for."""
    if run_config is not None:
        try:
            with run_folder_lock(output_dir_of(run_config)) as fd:
                return _supervise(command, fd)
        except RunFolderBusy as exc:
            print(f"training_jobs.launch: {exc}", file=sys.stderr, flush=True)
            return BUSY
    return _supervise(command)


def _supervise(command: list[str], lock_fd: int | None = None) -> int:
    """supervise() past the lock; the launcher inherits the lock's descriptor, so a launcher outliving this process
    still holds its folder, and a reaper (`_start_reaper`) stops what is left of the launcher's session, however
    this process ends (SIGKILLed included)."""
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
    launch_id = uuid.uuid4().hex
    reaper, to_reaper = _start_reaper(launch_id)
    try:
        child = subprocess.Popen(command, start_new_session=True, pass_fds=() if lock_fd is None else (lock_fd,),
                                 env={**os.environ, LAUNCH_ENV: launch_id})
        os.write(to_reaper, child.pid.to_bytes(8, "little"))
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
        os.write(to_reaper, ENDED)
    finally:  # the reaper stops what is left of the session and is waited for: it holds no lock after this
        os.close(to_reaper)
        os.waitpid(reaper, 0)
    return code if code >= 0 else 128 - code


def _stop_launch(sid: int, launch_id: str) -> int:
    """Stop what is left of the launch (`_launch_members`): SIGTERM, SIGKILL after SESSION_EXIT_S. Returns how many
    were left."""
    left = _launch_members(sid, launch_id)
    if left:
        import psutil

        for proc in left:
            with contextlib.suppress(psutil.Error):
                proc.terminate()
        _, alive = psutil.wait_procs(left, timeout=SESSION_EXIT_S)
        for proc in alive:
            with contextlib.suppress(psutil.Error):
                proc.kill()
    return len(left)


ENDED = b"\0"  # what the supervisor writes to its reaper once the launcher has exited and it returns


def _start_reaper(launch_id: str) -> tuple[int, int]:
    """Fork the launch's reaper: a process in a session of its own that waits on a pipe for the launcher's pid (its
    session's id), then for the pipe's end, which comes when this process exits or is killed, and then stops what is
    left of the launch (`_stop_launch`): the one place a launch is stopped, whatever ended it. A SIGKILL to this
    process (`kill -9`, the out-of-memory killer, a process-group kill of the Dagster step) runs no code of its own:
    without the reaper, the launcher and its ranks trained on, unseen. Forked before the launcher starts, so there is
    no moment a launch runs without one; it keeps a copy of the run folder's lock until the session is stopped.
    Returns (its pid, the pipe's write end)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid:
        os.close(read_end)
        return pid, write_end
    try:  # the reaper: no Python exit handlers of the supervisor, hence os._exit
        os.close(write_end)
        os.setsid()  # out of the supervisor's process group: a kill of that group leaves the reaper to do its work
        for signum in FORWARDED:
            signal.signal(signum, signal.SIG_IGN)  # it stops by itself once the launch has
        sid = b""
        while len(sid) < 8 and (chunk := os.read(read_end, 8 - len(sid))):
            sid += chunk
        ended = b""
        while chunk := os.read(read_end, 1):  # returns b"" at the pipe's end, however the supervisor ends
            ended = chunk
        if len(sid) == 8 and (left := _stop_launch(int.from_bytes(sid, "little"), launch_id)) and ended != ENDED:
            print(f"training_jobs.launch: the launch's supervisor ended without stopping its launcher; stopped "
                  f"{left} process{'' if left == 1 else 'es'} left of it", file=sys.stderr, flush=True)
    except BaseException:
        traceback.print_exc()
    finally:
        os._exit(0)


if __name__ == "__main__":  # python -m training_jobs.launch --run-config RUN_CONFIG COMMAND...
    if sys.argv[1:2] != ["--run-config"] or len(sys.argv) < 4:
        sys.exit("usage: python -m training_jobs.launch --run-config RUN_CONFIG LAUNCHER_COMMAND...")
    sys.exit(supervise(sys.argv[3:], Path(sys.argv[2])))
