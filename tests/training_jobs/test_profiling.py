"""training_jobs.profiling.StepProfiler driven as Trainer.fit drives it (before_launch, after, covers, report)."""

import torch

from training_jobs.profiling import StepProfiler


def drive(profiler: StepProfiler, steps: range) -> list[int]:
    """The loop's calls for these steps; returns the steps it counted as profiled (left out of step throughput)."""
    profiled = []
    for step in steps:
        profiler.before_launch(step)
        torch.ones(8).sum()
        profiler.after(step)
        if profiler.covers(step):
            profiled.append(step)
    profiler.report()
    return profiled


def test_a_window_profiles_its_steps(tmp_path):
    profiler = StepProfiler((3, 4), tmp_path, active=True)
    assert drive(profiler, range(1, 7)) == [3, 4]
    assert profiler.result["steps"] == [3, 4] and (tmp_path / "profile" / "ops.txt").is_file()


def test_a_run_resumed_inside_the_window_profiles_the_rest_of_it(tmp_path):
    """Resumed at step 4 (steps 5.. to go) with a window [3, 6]: before, the window never opened (its first step was
    in the earlier launch), nothing was written, and steps 5 and 6 were still left out of the step throughput."""
    profiler = StepProfiler((3, 6), tmp_path, active=True)
    profiler.resume_from(4)
    assert drive(profiler, range(5, 9)) == [5, 6]
    assert profiler.result["steps"] == [5, 6] and (tmp_path / "profile" / "trace.json").is_file()


def test_a_run_resumed_past_the_window_leaves_no_step_out(tmp_path):
    profiler = StepProfiler((3, 6), tmp_path, active=True)
    profiler.resume_from(6)
    assert drive(profiler, range(7, 10)) == []
    assert profiler.result is None and profiler.profiler is None
