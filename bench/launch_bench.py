"""What a training launch costs before the first step and after the last: each launcher's own command
(`training_jobs.launch`, the one the `TrainingLauncher` resource gives `training_run`) with the entry module a
probe that reports when its rank is up and exits at once.

    .venv/bin/python bench/launch_bench.py                       # torchrun and deepspeed, 2 ranks, 3 repeats
    .venv/bin/python bench/launch_bench.py --launcher deepspeed --nproc 1 --repeats 5

Prints, per launcher: seconds from the command's start until the last rank is up (what every run pays before
it imports the trainer), and from then until the launcher has exited. Figures are for the machine printed first.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

PROBE = "bench.launch_probe"


def probe_command(launcher: str, nproc: int, folder: Path) -> list[str]:
    """The launch command with the probe as its entry; its run config only names the run folder, whose lock the
    launch holds (the probe reads nothing)."""
    from training_jobs.launch import launch_command

    run_config = folder / "run.json"
    run_config.write_text(json.dumps({"output_dir": str(folder / "out")}))
    return launch_command(launcher, run_config, nproc, module=PROBE)


def time_launch(launcher: str, nproc: int) -> tuple[float, float]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONPATH": str(REPO)}
    env.setdefault("DS_ACCELERATOR", "cpu")
    with tempfile.TemporaryDirectory(prefix="kiln-launch-bench-") as folder:
        command = probe_command(launcher, nproc, Path(folder))
        start = time.time()
        done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True)
        end = time.time()
    ups = [float(line.split()[-1]) for line in done.stdout.splitlines() if line.startswith("kiln-probe-up")]
    if done.returncode != 0 or len(ups) != nproc:
        raise SystemExit(f"{launcher}: exit {done.returncode}, {len(ups)} of {nproc} ranks up\n{done.stderr[-3000:]}")
    return max(ups) - start, end - max(ups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--launcher", default="torchrun,deepspeed", help="comma-separated: torchrun, deepspeed")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, Python {platform.python_version()}")
    for launcher in args.launcher.split(","):
        times = [time_launch(launcher.strip(), args.nproc) for _ in range(args.repeats)]
        up, down = (statistics.median(t[i] for t in times) for i in (0, 1))
        print(f"{launcher}: {args.nproc} ranks up after {up:.1f} s, launcher gone {down:.1f} s after "
              f"(median of {args.repeats}; each: {', '.join(f'{u:.1f}/{d:.1f}' for u, d in times)})")


if __name__ == "__main__":
    main()
