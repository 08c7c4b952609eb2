"""Where a step's time goes: `training.profile_steps: [first, last]` runs torch.profiler over those optimizer steps
on rank 0 and writes, into <output_dir>/profile/,

    ops.txt       torch.profiler's table of operators and kernels, by self device time (self CPU time on CPU)
    trace.json    the Chrome / Perfetto trace of the window (chrome://tracing, ui.perfetto.dev)

and summary.json's `profile`: the window's wall seconds and, on a GPU, the share of it the device spent in kernels
(`device_busy_fraction`) and the CUDA calls in which the host waited for the device (`host_waits`). A step whose
kernels take less time than the host takes to queue them leaves the GPU idle: a busy fraction well below 1 says the
loop (Python, DeepSpeed's hooks, launches) is what limits the step, not the model's arithmetic. Only operator names
and timings are recorded (no shapes, no data)."""

from __future__ import annotations

import collections
import time
from pathlib import Path
from typing import Any

import torch

PROFILE_DIR = "profile"
# CUDA runtime calls in which the host waits for the device. In a window of a loop that runs ahead of the GPU: one
# cudaDeviceSynchronize (the window's close), one cudaEventSynchronize a step (the loss and grad norm of the step
# before, read while this one is queued: training_jobs.step.StepFigures), and nothing else.
HOST_WAITS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize")


class StepProfiler:
    """Profiles optimizer steps first..last (1-based, as the progress lines count) on the rank that is `active`.
    The loop calls `before_launch(step)` before it queues a step and `after(step)` once that step is launched; the
    window closes after `last` with one device synchronisation, so it holds the whole of those steps' work. The
    tables and the trace are written by `report()`, which the trainer calls after the loop: that work (seconds for a
    long trace) is not a step's."""

    def __init__(self, steps: tuple[int, int] | None, output_dir: Path, active: bool):
        self.first, self.last = steps if steps else (0, -1)
        self.folder = Path(output_dir) / PROFILE_DIR
        self.active = active and steps is not None
        self.profiler: Any = None  # while the window is open
        self.stopped: Any = None  # once it has closed, until report()
        self.started, self.wall = 0.0, 0.0
        self.result: dict[str, Any] | None = None

    def resume_from(self, done: int) -> None:
        """The run resumes with `done` steps behind it: a window begun in an earlier launch (whose profile was never
        written: the report comes after the loop) profiles the rest of it; one that ended there covers nothing."""
        if done >= self.first and self.profiler is None:
            self.first = done + 1
            if self.first > self.last:
                self.first, self.last, self.active = 0, -1, False

    def covers(self, step: int) -> bool:
        """Whether `step` is in the window (on every rank: the others wait for the profiled one at collectives)."""
        return self.first <= step <= self.last

    def before_launch(self, step: int) -> None:
        if not self.active or step != self.first or self.profiler is not None:
            return
        activities = [torch.profiler.ProfilerActivity.CPU]
        if torch.cuda.is_available():
            activities.append(torch.profiler.ProfilerActivity.CUDA)
            torch.cuda.synchronize()  # the window starts with an idle device: its kernels are this window's
        self.profiler = torch.profiler.profile(activities=activities, record_shapes=False)
        self.profiler.__enter__()
        self.started = time.perf_counter()

    def after(self, step: int) -> None:
        if self.profiler is None or step != self.last:
            return
        if torch.cuda.is_available():
            torch.cuda.synchronize()
        self.wall = time.perf_counter() - self.started
        self.profiler.__exit__(None, None, None)
        self.stopped, self.profiler = self.profiler, None

    def report(self) -> None:
        """The window's operator table, trace and busy fraction (`result`), once it has closed."""
        profile, self.stopped = self.stopped, None
        if profile is None:
            return
        self.folder.mkdir(parents=True, exist_ok=True)
        on_gpu = torch.cuda.is_available()
        sort_by = "self_device_time_total" if on_gpu else "self_cpu_time_total"
        table = profile.key_averages().table(sort_by=sort_by, row_limit=60)
        (self.folder / "ops.txt").write_text(table + "\n", encoding="utf-8")
        profile.export_chrome_trace(str(self.folder / "trace.json"))
        events = profile.events()
        counts = collections.Counter(e.name for e in events)
        waits = {name: counts[name] for name in HOST_WAITS}  # none on CPU
        busy = None
        if on_gpu:  # the device's own events (kernels, copies): the operators that launched them would count twice
            device = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA]
            busy = sum(e.time_range.elapsed_us() for e in device) / 1e6 / self.wall if self.wall > 0 else None
        self.result = {"steps": [self.first, self.last], "wall_s": round(self.wall, 4),
                       "device_busy_fraction": None if busy is None else round(busy, 4), "host_waits": waits,
                       "ops": str(self.folder / "ops.txt"), "trace": str(self.folder / "trace.json")}


__all__ = ["HOST_WAITS", "PROFILE_DIR", "StepProfiler"]
