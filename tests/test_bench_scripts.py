"""Bench scripts that no other test runs still run end to end, at their smallest settings: a bench that rots is found
here, not by the next person who needs its figure (tokenize_bench and zero_init_bench both broke unnoticed when
settings they built by hand changed shape). The figures themselves are not asserted (tests never assert timings):
only that each writes what it promises."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _run(args: list[str], tmp_path: Path) -> str:
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    done = subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return done.stdout


@pytest.mark.slow
def test_tokenize_bench_runs_through_shards_and_the_loader(tmp_path):
    out = _run(["bench/tokenize_bench.py", "--max-mb", "1", "--sample-mb", "0.5", "--vocab-size", "1000"], tmp_path)
    for line in ("write_token_shards, 1 process", "shard write (mix, shuffle, copy, write)", "loader: "):
        assert line in out, out


@pytest.mark.slow
def test_shard_memory_bench_measures_the_driver_at_two_sizes(tmp_path):
    out = _run(["bench/shard_memory.py", "--docs", "2000,6000", "--rows-per-part", "1000", "--sources", "3"], tmp_path)
    assert "2,000 -> 6,000: the driver keeps" in out and out.count("MiB, Arrow peak") == 2, out
    assert re.search(r"the manifest's stats grow \d+ B per shard", out), out


@pytest.mark.slow
def test_exposure_memory_bench_measures_the_loader_and_the_megatron_export(tmp_path):
    out = _run(["bench/exposure_memory.py", "--loader-only", "--copies", "20000,40000"], tmp_path)
    assert out.count("the Megatron export: NumPy peak") == 2, out
    assert re.search(r"20,000 -> 40,000 per copy: .* the Megatron export at [0-9.]+ B", out), out


def test_storage_s3_bench_moves_a_dataset_and_a_run_checkpoint_through_moto(tmp_path):
    out = _run(["bench/storage_s3_bench.py", "--files", "2", "--mb-per-file", "1"], tmp_path)
    for step in ("commit with S3:", "read into an empty cache:", "run mirror, checkpoint up:",
                 "run mirror, checkpoint down:"):
        assert re.search(rf"{step} +[0-9.]+ s", out), out


def test_loader_open_bench_has_each_rank_read_its_share_of_the_headers(tmp_path):
    out = _run(["bench/loader_open.py", "--shards", "200", "--world-sizes", "1,4,64"], tmp_path)
    assert re.search(r"200 shards: the manifest \([0-9.]+ MiB\) is read in [0-9.]+ s, holds [0-9.]+ MiB", out), out
    # rank 0 checks shards 0, W, 2W, ...: 200, 50 and ceil(200 / 64) = 4 of them
    for world_size, read in ((1, 200), (4, 50), (64, 4)):
        opened = rf"world size +{world_size}: rank 0 opens in [0-9.]+ s, reading {read} shard headers"
        assert re.search(opened, out), out


@pytest.mark.slow
def test_zero_init_bench_builds_a_zero3_engine_with_and_without_zero_init(tmp_path):
    _run(["bench/zero_init_bench.py", "--preset", "tiny", "--nproc", "2", "--json", str(tmp_path / "z.json")],
         tmp_path)
    results = json.loads((tmp_path / "z.json").read_text())["results"]
    assert [r["zero_init"] for r in results] == [False, True]
    assert all(len(r["ranks"]) == 2 and all(x["initialized"]["rss_gib"] > 0 for x in r["ranks"]) for r in results)


@pytest.mark.slow
def test_membership_bench_times_the_intake_hashes_against_the_raw_scan(tmp_path):
    out = _run(["bench/membership_bench.py", "--documents", "300", "600", "--s3"], tmp_path)  # it asserts both
    for line in ("intake hashes: 1 bucket file(s)", "exact search by text: ", "the raw scan it replaces",  # find the same
                 "on S3 (moto on loopback), 600 raw documents in parts of 500 ", "in parts of 5,000 "):
        assert line in out, out
    assert re.search(r"[0-9.]+x the documents: the search [0-9.]+x", out), out


@pytest.mark.slow
def test_refresh_history_bench_decides_refreshes_against_the_ones_before(tmp_path):
    out = _run(["bench/refresh_history.py", "--refresh-docs", "600", "--refreshes", "3", "--repeat", "1",
                "--whole-files", "--docs-row-group", "4", "--json", str(tmp_path / "h.json")],
               tmp_path)  # it checks both sides decide alike
    figures = json.loads((tmp_path / "h.json").read_text())
    rows = figures["refreshes"]
    # each refresh's index is the next one's history: the earlier accepted documents add up, refresh by refresh
    assert [r["earlier_indexed"] for r in rows] == [0, rows[0]["with_history"]["kept"],
                                                    rows[0]["with_history"]["kept"] + rows[1]["with_history"]["kept"]]
    # the planted copies of earlier documents are found there, and only with the history
    assert all(r["with_history"]["matched_earlier_refreshes"] > 0 for r in rows[1:])
    assert all(r["alone"]["matched_earlier_refreshes"] == 0 for r in rows)
    assert all(r["extra_read_mb"] > 0 for r in rows[1:])  # the earlier index was read
    assert set(figures["summary"]) >= {"cpu_s_per_earlier_doc", "read_bytes_per_earlier_doc", "noise_cpu_s"}
    assert "history's cost, a line through refreshes 1..2" in out, out
    assert all(r["whole_files"]["kept"] == r["with_history"]["kept"] for r in rows), out
    assert (tmp_path / "h.png").stat().st_size > 0  # the plot beside the JSON
    # the earlier shingles the candidate pairs need, read by row groups of 4: at least those documents, at most
    # 4 rows per needed document, and fewer than the earlier documents (about 50 needed of ~1,100 in ~275 groups)
    for r in rows[1:]:
        h = r["with_history"]
        assert 0 < h["shingle_docs_needed"] <= h["shingle_rows_read"] <= 4 * h["shingle_docs_needed"]
        assert h["shingle_rows_read"] < r["earlier_indexed"]
        assert r["shingle_rows_expected"] == pytest.approx(h["shingle_rows_read"], rel=0.3)
    assert figures["summary"]["docs_row_group"] == 4
