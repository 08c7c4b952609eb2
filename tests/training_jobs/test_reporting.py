"""Progress lines: an ETA a person can read, and each line shown once."""

import json
from types import SimpleNamespace

import pytest

from training_jobs.reporting import (
    Reporter,
    Stopwatch,
    drop_torn_line,
    duration,
    progress_line,
    throughput,
    throughput_metrics,
)

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
    assert "| grad n/a |" in progress_line(87, 100, {**METRICS, "train/grad_norm": None}, 0.5)  # DeepSpeed gave none


def test_a_line_goes_to_dagsters_log_under_pipes_and_to_stdout_otherwise(capsys):
    logged = []
    pipes = SimpleNamespace(log=SimpleNamespace(info=logged.append))
    Reporter.line(SimpleNamespace(active=True, pipes=pipes), "step 1/2")
    assert logged == ["step 1/2"] and capsys.readouterr().out == ""  # Dagster's console shows it: once
    Reporter.line(SimpleNamespace(active=True, pipes=None), "step 2/2")
    assert capsys.readouterr().out == "step 2/2\n"
    Reporter.line(SimpleNamespace(active=False, pipes=None), "rank 1")
    assert capsys.readouterr().out == ""


def test_metrics_rows_are_written_at_the_logging_interval_and_none_is_lost_at_the_end(tmp_path):
    report = Reporter(SimpleNamespace(output_dir=tmp_path), SimpleNamespace(main=True), None)
    written = tmp_path / "metrics.jsonl"

    def steps() -> list[int]:
        return [json.loads(line)["step"] for line in written.read_text().splitlines()]

    report.step(1, {"train/loss": 3.0}, to_mlflow=False)
    report.step(2, {"train/loss": float("nan")}, to_mlflow=False)
    assert not written.exists()  # kept, not written every step
    report.step(3, {"train/loss": 2.0}, to_mlflow=True)  # a logging step: its row and those before it
    assert steps() == [1, 2, 3] and json.loads(written.read_text().splitlines()[1])["train/loss"] == "nan"
    report.step(4, {"train/loss": 1.5}, to_mlflow=False)
    report.flush()  # before a checkpoint
    report.step(5, {"train/loss": 1.4}, to_mlflow=False)
    report.finish({}, failed=True)  # the end of a run, failed or not
    assert steps() == [1, 2, 3, 4, 5]
    Reporter(SimpleNamespace(output_dir=tmp_path), SimpleNamespace(main=False), None).step(6, {}, to_mlflow=True)
    assert steps() == [1, 2, 3, 4, 5]  # other ranks write nothing


def test_a_run_resumed_after_a_kill_mid_append_cuts_the_torn_row_and_appends_whole_ones(tmp_path):
    """SIGKILL while metrics.jsonl is appended leaves its last row cut short; the resumed run's Reporter cuts it off,
    so every line parses (the training_run asset reads them all), and the resumed rows follow."""
    written = tmp_path / "metrics.jsonl"
    written.write_text('{"step": 1, "train/loss": 3.0}\n{"step": 2, "train/loss": 2.9}\n{"step": 3, "tr')
    report = Reporter(SimpleNamespace(output_dir=tmp_path), SimpleNamespace(main=True), None)
    report.step(3, {"train/loss": 2.8}, to_mlflow=True)
    assert [json.loads(line)["step"] for line in written.read_text().splitlines()] == [1, 2, 3]
    # whole lines stay as they are; a lone torn row goes; a torn row longer than one read (64 KiB) is found
    written.write_text('{"step": 1}\n')
    drop_torn_line(written)
    assert written.read_text() == '{"step": 1}\n'
    written.write_text('{"step": 1, "no')
    drop_torn_line(written)
    assert written.read_text() == ""
    written.write_text('{"step": 1}\n{"step": 2}\n{"step": 3, "x": "' + "y" * 100_000)
    drop_torn_line(written)
    assert written.read_text() == '{"step": 1}\n{"step": 2}\n'
    drop_torn_line(tmp_path / "none.jsonl")  # no file yet: nothing to do
    assert not (tmp_path / "none.jsonl").exists()


def test_throughput_goodput_and_steady_goodput_on_a_hand_worked_run():
    now = [0.0]
    watch = Stopwatch(clock=lambda: now[0])
    watch.start()
    for part, seconds in (("startup", 2.0), ("checkpoint", 10.0), ("validation", 5.0), ("profile", 1.0),
                          ("final_validation", 1.0), ("export", 3.0)):
        with watch.timing(part):
            now[0] += seconds
    now[0] = 100.0
    watch.stop()
    now[0] = 500.0  # after stop: not counted
    # Five steps of 240,000 tokens counted, 1.2M tokens in 100 s of wall time: goodput 12,000 tok/s. Three timed steps
    # (8, 30, 22 s; the first, 8 s, is the warm-up) and two profiled (1.5, 2.5 s). Step throughput: the two steps after
    # the warm-up, 480,000 tokens in 52 s. Time: 22 s in the parts above (the profile's report, 1 s, joins the
    # profiled steps: profile_s 5 s); 14 s other. MFU: 6e6 FLOPs/token x tokens/s / (2 devices x 1e12 FLOP/s).
    figures = throughput(240_000, 1_200_000, [8.0, 30.0, 22.0], [1.5, 2.5], watch, 6e6, 1e12, 2)
    assert figures["tokens_per_s"] == pytest.approx(480_000 / 52)
    assert figures["mfu"] == pytest.approx(6e6 * 480_000 / 52 / 2e12)
    assert figures["goodput_tokens_per_s"] == pytest.approx(12_000)
    assert figures["goodput_mfu"] == pytest.approx(0.036)
    assert figures["time"] == {"wall_s": 100.0, "train_s": 52.0, "warmup_s": 8.0, "profile_s": 5.0,
                               "startup_s": 2.0, "checkpoint_s": 10.0, "validation_s": 5.0, "rollback_s": 0.0,
                               "final_checkpoint_s": 0.0, "final_validation_s": 1.0, "export_s": 3.0, "other_s": 14.0}
    # Steady: without startup, the first step, the profile, final validation and export (2 + 8 + 5 + 1 + 3 s) and
    # without the tokens of the first step and the two profiled ones (3 x 240,000): 480,000 tokens in 81 s.
    assert figures["steady_goodput_tokens_per_s"] == pytest.approx(480_000 / 81) and figures["steady_s"] == 81.0
    unprofiled = throughput(240_000, 1_200_000, [8.0, 30.0, 22.0], [], watch, 6e6, None, 1)
    assert unprofiled["steady_goodput_tokens_per_s"] == pytest.approx(960_000 / 85)  # the report's 1 s still out
    assert unprofiled["mfu"] is None and unprofiled["goodput_mfu"] is None  # no peak (CPU): no MFU
    one_step = throughput(240_000, 240_000, [8.0], [], watch, 6e6, None, 1)
    assert one_step["tokens_per_s"] == pytest.approx(30_000)  # a single step is all there is to time
    # nothing left once the warm-up is out
    assert one_step["steady_goodput_tokens_per_s"] is None and one_step["steady_s"] is None
    metrics = throughput_metrics({**figures, "mfu": None,
                                  "checkpoint_stall": {"count": 2, "total_s": 4.0, "max_s": 3.0}})
    assert metrics["run/goodput_tokens_per_s"] == pytest.approx(12_000) and "run/mfu" not in metrics
    assert metrics["run/time/other_s"] == 14.0 and metrics["checkpoint/stall_total_s"] == 4.0
    assert metrics["run/steady_goodput_tokens_per_s"] == pytest.approx(480_000 / 81) and metrics["run/steady_s"] == 81.0


@pytest.mark.parametrize("objective, base, is_point", [
    ("clm", None, True),
    ("clm", {"path": "/runs/base/checkpoints/step_00100000", "kind": "checkpoint"}, False),
    ("prefix_lm", None, False),
    ("span_corruption", None, False)])
def test_only_a_from_scratch_clm_run_logs_the_point_scaling_laws_are_fitted_on(objective, base, is_point):
    """`kiln plan --mlflow-uri` fits L(C) and L(N, D) on scaling/*. A continued run's loss owes to its base's tokens
    too, while scaling/tokens counts only its own; prefix-LM and span corruption validate the CLM loss of a model
    trained on another objective: neither is a point on the from-scratch CLM laws."""
    logged = {}
    fake = SimpleNamespace(log_dict=lambda *a, **k: None, log_metrics=lambda m, step=None, **k: logged.update(m),
                           flush_async_logging=lambda: None, end_run=lambda status: None)
    report = Reporter(SimpleNamespace(output_dir="/nonexistent"), SimpleNamespace(main=False), None)
    report.active, report.mlflow = True, fake
    report.finish({"stability_events": [], "steps": 100, "val_loss": 2.1, "val_ppl_pos": {}, "tokens_seen": 819200,
                   "flops_per_token": 1e6, "objective": objective, "base_checkpoint": base}, failed=False)
    scaling = {k: v for k, v in logged.items() if k.startswith("scaling/")}
    assert logged["val/loss"] == 2.1  # validation is logged either way
    assert scaling == ({"scaling/tokens": 819200.0, "scaling/flops": 8.192e11, "scaling/final_val_loss": 2.1}
                       if is_point else {})
