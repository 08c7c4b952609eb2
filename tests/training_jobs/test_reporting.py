"""Progress lines: an ETA a person can read, and each line shown once."""

from types import SimpleNamespace

import pytest

from training_jobs.reporting import Reporter, duration, progress_line

METRICS = {"train/loss": 2.5, "train/grad_norm": 0.75, "train/lr": 3e-4, "train/tokens_per_s": 12345.6,
           "train/mfu": None}


@pytest.mark.parametrize("seconds, shown", [(4.4, "4s"), (65, "1m05s"), (3599.6, "1h00m"), (7385, "2h03m"),
                                            (273600, "3d04h")])
def test_durations_read_in_two_units(seconds, shown):
    assert duration(seconds) == shown  # by hand: 7385 s = 2 h + 3 min + 5 s; 273600 s = 3 d + 4 h


def test_the_progress_line_ends_with_the_eta():
    # 13 steps left at 5 s/step: 65 s
    line = progress_line(87, 100, METRICS, 0.5, eta_s=13 * 5.0)
    assert line == "step 87/100 | loss 2.5000 | grad 0.750 | lr 3.00e-04 | 12,346 tok/s | 0.50 s/step | ETA 1m05s"
    assert "ETA" not in progress_line(87, 100, METRICS, 0.5)


def test_a_line_goes_to_dagsters_log_under_pipes_and_to_stdout_otherwise(capsys):
    logged = []
    pipes = SimpleNamespace(log=SimpleNamespace(info=logged.append))
    Reporter.line(SimpleNamespace(active=True, pipes=pipes), "step 1/2")
    assert logged == ["step 1/2"] and capsys.readouterr().out == ""  # Dagster's console shows it: once
    Reporter.line(SimpleNamespace(active=True, pipes=None), "step 2/2")
    assert capsys.readouterr().out == "step 2/2\n"
    Reporter.line(SimpleNamespace(active=False, pipes=None), "rank 1")
    assert capsys.readouterr().out == ""
