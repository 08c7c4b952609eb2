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


# What stops `make ui`, and what Dagster's group gets for it: a hang-up becomes the graceful stop (`dagster dev`
# treats SIGTERM as Ctrl-C; SIGHUP would kill its processes outright, runs in flight left STARTED).
STOP_SIGNALS = {signal.SIGINT: signal.SIGINT, signal.SIGTERM: signal.SIGTERM, signal.SIGHUP: signal.SIGTERM}


def main(args: list[str]) -> int:
    try:
        config = load_config()
    except ConfigError as exc:
        print(f"[kiln ui] {exc}", file=sys.stderr)
        return 2
    dagster = Path(sys.executable).with_name("dagster")
    try:
        with shared_local_ray(config.engine):  # its address reaches Dagster's processes as RAY_ADDRESS
            # Dagster in a process group of its own, which gets every signal that stops `make ui`: Ctrl-C, the
            # SIGTERM of `docker stop`, systemd or a CI runner, and the SIGHUP of a closed terminal or a dropped ssh
            # session, which reach only this process. Its webserver, daemon, code servers and run workers all stop,
            # not only `dagster dev`; then Ray stops.
            child = subprocess.Popen([str(dagster), "dev", *args], process_group=0)
            stop = _GroupStop(child.pid)
            for signum in STOP_SIGNALS:
                signal.signal(signum, stop.forward)
            return stop.wait(child)
    except EngineError as exc:
        print(f"[kiln ui] {exc}", file=sys.stderr)
        return 2


class _GroupStop:
    """Forwards a stop signal to Dagster's process group; STOP_GRACE_S after the first one, SIGKILLs what is left
    (`docker stop` waits 10 s by default, systemd 90 s: a clean stop in between beats a kill)."""

    STOP_GRACE_S = 15

    def __init__(self, pgid: int):
        self.pgid, self.asked = pgid, None

    def forward(self, signum: int, _frame) -> None:
        self.asked = self.asked or time.monotonic()
        self.signal(STOP_SIGNALS.get(signum, signum))

    def signal(self, signum: int) -> bool:
        try:
            os.killpg(self.pgid, signum)
            return True
        except ProcessLookupError:
            return False  # nobody left in the group

    def wait(self, child: subprocess.Popen) -> int:
        """dagster dev's exit code, once nothing of its group is left (code servers and run workers included)."""
        while child.poll() is None or self.signal(0):
            if self.asked is None and child.poll() is not None:
                self.asked = time.monotonic()  # dagster dev ended on its own: its leftovers get the same grace
            if self.asked is not None and time.monotonic() - self.asked > self.STOP_GRACE_S:
                print(f"[kiln ui] Dagster processes still running {self.STOP_GRACE_S} s after the stop: killing them",
                      file=sys.stderr)
                self.signal(signal.SIGKILL)
                child.wait()
                break
            time.sleep(0.2)
        return child.returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
