"""`make ui`: `dagster dev` (webserver, daemon, code server, runs) with one embedded Ray that every run's steps
share — each step process would otherwise start a Ray of its own (5–10 s a step) — started before Dagster and
stopped after it. Nothing to start when the config names a cluster (`engine.ray_address`, RAY_ADDRESS) or the
engine is the process pool. Arguments go to `dagster dev` as they are.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

from kiln.common.config import ConfigError, load_config
from kiln.engine import EngineError, shared_local_ray


def main(args: list[str]) -> int:
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"[kiln ui] {exc}", file=sys.stderr)
        return 2
    dagster = Path(sys.executable).with_name("dagster")
    try:
        with shared_local_ray(config.engine):  # its address reaches Dagster's processes as RAY_ADDRESS
            # Dagster in a process group of its own, which gets every signal that stops `make ui`: Ctrl-C, and the
            # SIGTERM of `docker stop`, systemd or a CI runner, which reaches only this process. Its webserver,
            # daemon, code servers and run workers all stop, not only `dagster dev`; then Ray stops.
            child = subprocess.Popen([str(dagster), "dev", *args], process_group=0)
            for signum in (signal.SIGINT, signal.SIGTERM):
                signal.signal(signum, lambda signum, _: _signal_group(child.pid, signum))
            code = child.wait()
            _reap_group(child.pid)
            return code
    except EngineError as exc:
        print(f"[kiln ui] {exc}", file=sys.stderr)
        return 2


def _signal_group(pgid: int, signum: int) -> None:
    try:
        os.killpg(pgid, signum)
    except ProcessLookupError:
        pass


def _reap_group(pgid: int, grace_s: float = 20) -> None:
    """Wait for what is left of Dagster's group (code servers stop on their own), then SIGKILL the rest."""
    deadline = time.monotonic() + grace_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.2)
    print(f"[kiln ui] Dagster processes still running after {grace_s:.0f} s: killing them", file=sys.stderr)
    _signal_group(pgid, signal.SIGKILL)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
