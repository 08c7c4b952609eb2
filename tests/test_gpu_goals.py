"""bench/gpu_goals.py, the table a lent GPU's reply ends with: issue 34's verdicts on hand-worked figures, a figure
the suite did not get read as not measured, and each file taken from the first folder that has it."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("gpu_goals", ROOT / "bench" / "gpu_goals.py")
goals = importlib.util.module_from_spec(spec)
spec.loader.exec_module(goals)


def bench_run(preset: str, stage: int, tokens_per_s: float, mfu: float, reference_mfu: float | None = None,
              ratio: float | None = None, at_cadence: float | None = None) -> dict:
    run = {"preset": preset, "kiln": {
        "tokens_per_s": tokens_per_s, "mfu": mfu, "parallelism": {"zero_stage": stage},
        "layout": {"micro_batch": 8, "memory_gib": {"total": 10.0}}, "peak_memory_gib": 9.0,
        "profile": {"device_busy_fraction": 0.97}, "goodput_at_default_cadence_tokens_per_s": at_cadence}}
    if reference_mfu is not None:
        run.update(reference={"mfu": reference_mfu}, kiln_over_reference=ratio)
    return run


def write(folder: Path, name: str, runs: list[dict], date: str) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / name).write_text(json.dumps({"machine": "H200 box", "date": date, "runs": runs}))


def row(text: str, preset: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(preset + " "))


def test_each_goal_is_met_missed_or_not_measured(tmp_path):
    # 125m: MFU 0.36 >= 0.35, ratio 0.96 >= 0.95, goodput 380,000 / 400,000 = 0.950 >= 0.9: all met
    # 350m: MFU 0.39 < 0.40, ratio 0.94 < 0.95, goodput 135,000 / 150,000 = 0.900: met (the goal is >=)
    # 1b: not in the file
    write(tmp_path, "train_bench_h200.json", [
        bench_run("125m", 0, 400_000, 0.36, 0.38, 0.96, 380_000),
        bench_run("350m", 0, 150_000, 0.39, 0.41, 0.94, 135_000)], "2026-12-01")
    text = goals.summary("h200", [tmp_path])
    assert row(text, "125m").split() == ["125m", "0", "8", "400,000", "36.0%", "met", "38.0%", "0.96", "met",
                                         "0.950", "met", "97%", "0.90"]
    assert row(text, "350m").split()[4:12] == ["39.0%", "MISSED", "41.0%", "0.94", "MISSED", "0.900", "met", "97%"]
    assert row(text, "1b").split() == ["1b", "not", "measured"]
    assert f"{tmp_path}/train_bench_h200.json (2026-12-01)" in text


def test_a_forced_stage_is_compared_with_the_chosen_one_from_an_earlier_call(tmp_path):
    this_call, committed = tmp_path / "out", tmp_path / "docs"
    # the first call's figures, committed; a stale copy of the forced run there must lose to this call's
    write(committed, "train_bench_h200.json", [bench_run("1b", 0, 80_000, 0.50, 0.52, 0.96, 75_000)], "2026-12-01")
    write(committed, "train_bench_1b_zero3_h200.json", [bench_run("1b", 3, 1.0, 0.01)], "2026-11-30")
    write(this_call, "train_bench_1b_zero3_h200.json", [bench_run("1b", 3, 60_000, 0.375)], "2026-12-01")
    text = goals.summary("h200", [this_call, committed])
    # 60,000 / 80,000 = 0.75
    assert ("1b forced to ZeRO-3: ZeRO-3 60,000 tokens/s, MFU 37.5%; the layout's ZeRO-0: 80,000 tokens/s "
            "(forced / chosen 0.75)") in text
    assert f"{this_call}/train_bench_1b_zero3_h200.json (2026-12-01)" in text
    assert f"{committed}/train_bench_1b_zero3_h200.json" not in text
    assert row(text, "1b").split()[4:5] == ["50.0%"]


def test_no_figures_at_all_reads_not_measured(tmp_path):
    text = goals.summary("h100", [tmp_path])
    for preset in ("125m", "350m", "1b"):
        assert row(text, preset).split() == [preset, "not", "measured"]
    assert "forced" not in text
    write(tmp_path, "train_bench_1b_zero3_h100.json", [], "2026-12-01")  # cut short before its one run ended
    assert "1b forced to ZeRO-3: not measured" in goals.summary("h100", [tmp_path])


def test_a_failed_run_reads_failed_with_its_error_and_the_others_keep_their_verdicts(tmp_path):
    failed = {"preset": "1b", "error": "BenchRunFailed: training failed (1); the end of out/train_bench_h200_1b.log:"}
    no_reference = {**bench_run("350m", 0, 150_000, 0.41), "error": "OutOfMemoryError: CUDA out of memory"}
    write(tmp_path, "train_bench_h200.json", [bench_run("125m", 0, 400_000, 0.36, 0.38, 0.96, 380_000),
                                              no_reference, failed], "2026-12-02")
    write(tmp_path, "train_bench_1b_zero3_h200.json", [{"preset": "1b", "error": "BenchRunFailed: timed out"}],
          "2026-12-02")
    text = goals.summary("h200", [tmp_path])
    assert row(text, "1b") == ("1b      failed: BenchRunFailed: training failed (1); the end of "
                               "out/train_bench_h200_1b.log:")
    # Kiln's figures stand when only the reference failed: 0.41 >= 0.40; no ratio
    assert row(text, "350m").split()[4:9] == ["41.0%", "met", "n/a", "n/a", "not"]
    assert "350m: OutOfMemoryError: CUDA out of memory" in text
    assert row(text, "125m").split()[5] == "met"
    assert "1b forced to ZeRO-3: failed (BenchRunFailed: timed out)" in text
