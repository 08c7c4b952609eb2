"""`make ui`: `dagster dev` (webserver, daemon, code server, runs) with one embedded Ray that every run's steps
share — each step process would otherwise start a Ray of its own (5–10 s a step) — started before Dagster and
stopped after it. Nothing to start when the config names a cluster (`engine.ray_address`, RAY_ADDRESS) or the
engine is the process pool. Arguments go to `dagster dev` as they are.
"""

from __future__ import annotations

import signal
import subprocess
import sys
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
            child = subprocess.Popen([str(dagster), "dev", *args])
            signal.signal(signal.SIGTERM, lambda *_: child.terminate())  # stop Dagster, then Ray, as on Ctrl-C
            try:
                return child.wait()
            except KeyboardInterrupt:  # Ctrl-C reached `dagster dev` too (one process group): let it stop first
                return child.wait()
    except EngineError as exc:
        print(f"[kiln ui] {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
