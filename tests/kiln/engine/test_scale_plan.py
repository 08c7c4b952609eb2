"""bench/scale_plan.py's projection against a hand-worked case: a fake bench with round numbers, every expected value
worked out below by hand (never by calling the code under test)."""

import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.common.config import load_config
from kiln.dedup import bucket_index
from kiln.dedup.shuffle import write_partitioned

ROOT = Path(__file__).resolve().parents[3]
spec = importlib.util.spec_from_file_location("scale_plan", ROOT / "bench" / "scale_plan.py")
plan_mod = importlib.util.module_from_spec(spec)
sys.modules["scale_plan"] = plan_mod  # dataclasses look their module up there
spec.loader.exec_module(plan_mod)

# A bench of 1,000 documents, 3 MB of text (3 KB a document, as 30 TB / 10e9: text and documents scale alike, x 1e7).
# Filter and exact dedup see all 3 MB; 900 documents (2.7 MB) reach signatures and near dedup; 800 are kept.
RATES = {"ingest": 100.0, "filter": 50.0, "exact_dedup": 200.0, "signatures": 10.0, "near_dedup": 20.0}
MB = {"ingest": 3.0, "filter": 3.0, "exact_dedup": 3.0, "signatures": 2.7, "near_dedup": 2.7}


def run(engine: str, workers: int, docs: int = 1000, rates: dict | None = None) -> dict:
    rates = {**RATES, **(rates or {})}
    return {"engine": engine, "workers": workers, "docs": docs, "partitions": 8, "max_bucket": 1000,
            "stages": {s: {"mb": MB[s], "mb_per_cpu_s": rates[s], "load_avg_1m_start": 1.0,
                           "peak_rss_mib": {"driver": 400, "worker": 300 if workers > 1 else None}} for s in RATES},
            "near_stats": {"documents": 900, "kept": 800, "verification": {"candidate_pairs": 4}},
            "files": {"signature_parts": 2}, "peak_rss_mib": {"driver": 400, "worker": None}}


# Per 1,000 bench documents: (bytes, files). Per document: bytes / 1,000.
FOLDERS = {"corpus": [3_300_000, 1], "raw": [1_000_000, 2], "filtered": [1_000_000, 2], "curated": [1_000_000, 2],
           "exact_shuffle": [50_000, 4], "signatures": [3_000_000, 2], "decisions": [100_000, 2],
           "index_buckets": [200_000, 8], "index_ids": [30_000, 8], "index_docs": [2_000_000, 2],
           "work:keys": [400_000, 2], "work:nodes": [10_000, 2], "work:pairs_a": [20_000, 2],
           "work:cc": [5_000, 16]}
MEASURED = {"folders": FOLDERS, "key_row_bytes": 90.0, "signature_doc_bytes": 2000.0, "decision_row_bytes": 50.0}
TARGET = dict(docs=10e9, text_tb=30, near_rows_per_part=100_000, partitions=1000, refresh_docs=1e8, core_hour_usd=0.05,
              storage_usd_per_tb_month=23.0)


def project(runs, measured=MEASURED, **target):
    t = plan_mod.Target(**{**TARGET, **target})
    # a pickled task 400 B; layout file: 100 B per signature part, 5 B per earlier docs part; 16 bands; bucket row
    # 20 B; earlier rank 17 B
    return plan_mod.project(runs, t, measured, (400.0, 100.0, 5.0), 16, 20, 17)


def test_core_hours_wall_and_cost_per_stage():
    bench = {"runs": [run("local", 1), run("ray", 2, rates={"near_dedup": 10.0}), run("ray", 2, docs=100,
                                                                                  rates={"ingest": 1.0}),
                      {**run("ray", 2, rates={"near_dedup": 5.0}), "repeat": 1}]}  # a --repeat's 2nd: not used
    runs = plan_mod.largest_runs(bench)
    assert [(r["engine"], r["docs"]) for r in runs] == [("local", 1000), ("ray", 1000)]
    p = project(runs, cores=100, utilization=0.5)
    rows = {r["stage"]: r for r in p["stages"]}
    # text entering a stage at the target = stage MB x (30e12 B / 3e6 B): ingest 30 TB, signatures 27 TB.
    # ingest: 30e12 B / (100 MB per CPU-s = 100e6 B/s) / 3600 = 83.33 core-hours (the 100-document run, with its
    # rate of 1, is not at the largest N and is ignored)
    assert rows["ingest"]["core_hours"] == pytest.approx(83.333, rel=1e-4)
    assert rows["ingest"]["text_tb"] == pytest.approx(30.0)
    assert rows["filter"]["core_hours"] == pytest.approx(166.667, rel=1e-4)  # 30e12 / 50e6 / 3600
    assert rows["exact_dedup"]["core_hours"] == pytest.approx(41.667, rel=1e-4)  # 30e12 / 200e6 / 3600
    assert rows["signatures"]["core_hours"] == pytest.approx(750.0)  # 27e12 / 10e6 / 3600
    # near_dedup: the lowest rate at N = 1000 is ray:2's 10 MB/CPU-s, not local:1's 20: 27e12 / 10e6 / 3600 = 750
    assert rows["near_dedup"]["core_hours"] == pytest.approx(750.0)
    assert rows["near_dedup"]["run"] == "ray:2 @ 1,000" and rows["near_dedup"]["worker_mib"] == 300
    assert rows["ingest"]["worker_mib"] in (300, 400)  # both runs have rate 100 for ingest
    # total 83.333 + 166.667 + 41.667 + 750 + 750 = 1791.667 core-hours; $0.05 each = $89.58
    assert p["q"]["core_hours"][0] == pytest.approx(1791.667, rel=1e-5)
    assert p["q"]["compute_usd"][0] == pytest.approx(89.583, rel=1e-4)
    # wall on 100 cores at 50% busy: 750 / (100 x 0.5) = 15 h
    assert rows["signatures"]["wall_hours"] == pytest.approx(15.0)
    assert rows["signatures"]["usd"] == pytest.approx(37.5)  # 750 x 0.05


def test_cores_for_a_deadline():
    # local:1 only: 83.333 + 166.667 + 41.667 + 750 + 375 = 1416.667 core-hours; in 10 h at 80%: 1416.667 / 8
    # = 177.08 -> 178 cores
    p = project([run("local", 1)], hours=10, utilization=0.8)
    assert p["q"]["cores"][0] == 178


def test_bytes_files_shuffle_and_memory():
    p = project([run("local", 1)], cores=100)
    q = {k: v for k, (v, _) in p["q"].items()}
    rows = {r["stage"]: r for r in p["stages"]}
    # x 1e7 documents (text scales alike): signatures reads curated 1,000 B/doc = 10 TB, writes 3,000 B/doc = 30 TB
    assert rows["signatures"]["read_tb"] == pytest.approx(10.0)
    assert rows["signatures"]["write_tb"] == pytest.approx(30.0)
    assert rows["ingest"]["read_tb"] == pytest.approx(33.0)  # corpus 3,300 B/doc
    # near dedup reads signatures 3,000 + work (400 + 10 + 20 + 5) = 3,435 B/doc -> 34.35 TB
    assert rows["near_dedup"]["read_tb"] == pytest.approx(34.35)
    # persisted 1,000 x 3 + 3,000 + 100 + 200 + 30 + 2,000 = 8,330 B/doc -> 83.3 TB -> x $23 = $1,915.90 a month
    assert q["persisted_tb"] == pytest.approx(83.3) and q["storage_usd_month"] == pytest.approx(1915.9)
    # persisted files: raw, filtered, curated 2 each at the bench's reading parts -> 2 x 1e7 x 3 = 6e7; signatures,
    # decisions, index docs 2 each per 2 signature parts -> 90,000 x 3 = 270,000; index buckets and ids 8 each per 8
    # key partitions -> 1,000 x 2 = 2,000: 60,272,000 PUTs x $0.005 / 1,000 = $301.36
    assert q["persisted_put_usd"] == pytest.approx(301.36)
    # near dedup sees 9e9 documents (900 of 1,000) -> 90,000 parts of 100,000; 8e9 accepted
    assert q["parts"] == 90_000
    # bucket index: 8e9 accepted x 16 bands x 20 B = 2.56e12 B
    assert q["bucket_index_raw_tb"] == pytest.approx(2.56)
    # band-key shuffle: 9e9 x 16 = 1.44e11 rows x 90 B = 12.96 TB of Arrow; / 1,000 partitions / 2^30 = 12.07 GiB
    assert q["keys_rows"] == pytest.approx(1.44e11) and q["keys_arrow_tb"] == pytest.approx(12.96)
    assert q["pairs_task_gib"] == pytest.approx(12.96e12 / 1000 / 2**30)
    assert q["keys_disk_tb"] == pytest.approx(4.0)  # 400 B/doc
    # keys task: 100,000 x (2,000 B signature row + 16 x 90 B) = 3.44e8 B
    assert q["keys_task_gib"] == pytest.approx(3.44e8 / 2**30)
    # files, one per writing task: keys, nodes and pairs_a 2 each, written per signature part (2 at the bench) ->
    # 90,000 parts; the components' folder: 16 files = 2 rounds x 8 partition tasks -> 2 x 1,000 = 2,000
    assert p["files"] == {"keys": pytest.approx(9e4), "nodes": pytest.approx(9e4), "pairs_a": pytest.approx(9e4),
                          "cc": pytest.approx(2e3)}
    assert q["keys_files_per_round"] == 90_000
    # what the pairs tasks read: 90,000 writers x 1,000 partitions = 9e7 segments of 4.0 TB / 9e7 = 44,444 B
    assert q["keys_segments_per_round"] == 9e7 and q["keys_segment_kib"] == pytest.approx(4e12 / 9e7 / 1024)
    # what the verify tasks read: only the attach files holding their pairs, so at most one segment per distinct
    # candidate pair: 4 pairs per 900 documents x 9e9 = 4e7, far under 90,000 attach tasks x 90,000 parts = 8.1e9
    assert q["candidate_pairs"] == pytest.approx(4e7)
    assert q["verify_segments_per_round"] == pytest.approx(4e7)
    # driver: a task carries its layout as a file name, so max(90,000 parts, 1,000 partitions) tasks x 400 B
    # = 3.6e7 B, whatever the parts; the layout file itself: 90,000 parts x 100 B = 9e6 B, once
    assert q["driver_task_list_gb"] == pytest.approx(0.036)
    assert q["layout_file_mb"] == pytest.approx(9.0)
    # pairs results: at most 1,000 partitions x 90,000 doc-partitions x 36 B = 3.24e9 B
    assert q["pairs_results_gib"] == pytest.approx(3.24e9 / 2**30)
    # decisions table read whole by deduplicated_documents: 9e9 rows x 50 B = 4.5e11 B
    assert q["decisions_table_gib"] == pytest.approx(4.5e11 / 2**30)
    # a hot bucket of 1e-3 of 9e9 = 9e6 members: at most 9e6 x 1,000 anchors = 9e9 pairs
    assert q["hot_bucket_docs"] == pytest.approx(9e6) and q["hot_bucket_pairs"] == pytest.approx(9e9)


def test_weekly_refresh():
    p = project([run("local", 1)], cores=100)
    q = {k: v for k, (v, _) in p["q"].items()}
    # 1e8 new documents: 1416.667 core-hours x 1e8 / 1e10 = 14.17; 9e7 reach near dedup -> 900 parts
    assert q["weekly_core_hours"] == pytest.approx(14.16667, rel=1e-5)
    assert q["weekly_keys_segments_per_round"] == 900 * 1000
    # verify: at most 4 / 900 candidate pairs per document x 9e7 = 4e5 segments, under (900 new + 90,000 earlier
    # docs parts) attach tasks x 900 parts = 8.18e7
    assert q["weekly_verify_segments_per_round"] == pytest.approx(4e5)
    # earlier index read every week: buckets 200 + ids 30 B/doc x 1e10 = 2.3 TB; all docs files too: + 20 TB
    assert q["weekly_earlier_min_tb"] == pytest.approx(2.3) and q["weekly_earlier_max_tb"] == pytest.approx(22.3)
    # pairs task: (9e7 x 16 x 90 B + 8e9 x 16 x (20 + 17 + 4) B) / 1,000 = (1.296e11 + 5.248e12) / 1e3 = 5.3776e9 B
    assert q["weekly_pairs_task_gib"] == pytest.approx(5.3776e9 / 2**30)
    # earlier refreshes (the history at the target's size): 9e9 documents reached near dedup -> 90,000 signature
    # parts, each one docs file of the index. Attach and route may have a task per new part and earlier docs file:
    # max(900 + 90,000, 1,000) = 90,900 tasks x 400 B = 3.636e7 B; the layout file: 900 x 100 B + 90,000 x 5 B
    # = 540,000 B
    assert q["weekly_driver_task_list_gb"] == pytest.approx(0.03636)
    assert q["weekly_layout_file_mb"] == pytest.approx(0.54)
    assert q["weekly_decisions_table_gib"] == pytest.approx(9e7 * 50 / 2**30)  # 9e7 rows x 50 B


def test_weekly_refresh_with_the_history_refresh_history_measured(monkeypatch):
    t = plan_mod.Target(**{**TARGET, "cores": 100})
    monkeypatch.setattr(bucket_index, "DOCS_ROW_GROUP_ROWS", 100)
    # bench/refresh_history.py's slope: 90 CPU-s per million earlier accepted documents; its attach stage needed the
    # shingles of 0.1 earlier documents per new one
    history = {"summary": {"cpu_s_per_earlier_doc": 90e-6, "shingle_docs_needed_per_new_doc": 0.1}, "file": "h.json",
               "largest_index": 140_000}
    p = plan_mod.project([run("local", 1)], t, MEASURED, (400.0, 100.0, 5.0), 16, 20, 17, history)
    q = {k: v for k, (v, _) in p["q"].items()}
    # the year's last refresh decides against 8e9 accepted documents: 8e9 x 90e-6 = 720,000 CPU-s = 200 core-hours,
    # on top of its own 14.16667 (test_weekly_refresh): 214.16667; on 100 cores at 80%: 2.6771 h; x $0.05 = $10.708
    assert q["weekly_history_core_hours"] == pytest.approx(200.0)
    assert q["weekly_core_hours"] == pytest.approx(214.16667, rel=1e-5)
    assert q["weekly_wall_hours"] == pytest.approx(214.16667 / 80, rel=1e-5)
    assert q["weekly_compute_usd"] == pytest.approx(10.708333, rel=1e-5)
    assert "h.json, linear from 140,000 indexed" in p["q"]["weekly_history_core_hours"][1]
    # 9e7 new documents x 0.1 = 9e6 earlier ones needed of 8e9, in row groups of 100: 9e6 x 100 / 8e9 = 0.1125 of
    # a row group's documents each; 1 - e^-0.1125 = 1 - 0.893597 = 0.106403 of the 20 TB docs store (2,000 B/doc)
    assert q["weekly_earlier_docs_read_tb"] == pytest.approx(20 * 0.106403, rel=1e-5)
    assert q["weekly_earlier_min_tb"] < q["weekly_earlier_docs_read_tb"] + q["weekly_earlier_min_tb"] \
        < q["weekly_earlier_max_tb"]
    # without the bench the plan says what it leaves out
    assert "give --history" in project([run("local", 1)], cores=100)["q"]["weekly_core_hours"][1]


def test_row_groups_read_share_against_a_simulation():
    """The Poisson share against drawing the needed documents at random and counting the row groups they fall in."""
    rng = np.random.default_rng(0)
    for documents, rows, needed in [(100_000, 128, 500), (100_000, 1000, 500), (50_000, 16, 3000), (10_000, 1, 100)]:
        touched = [np.unique(rng.choice(documents, needed, replace=False) // rows).size * rows / documents
                   for _ in range(20)]
        assert plan_mod.row_groups_read_share(needed, rows, documents) == pytest.approx(np.mean(touched), abs=0.01)
    assert plan_mod.row_groups_read_share(10, 128, 0) == 0.0


def test_without_a_run_folder_only_cpu_and_driver():
    p = project([run("local", 1)], measured=None, cores=100)
    assert "read_tb" not in p["stages"][0] and "files" not in p and "driver_task_list_gb" in p["q"]


def test_command_line_writes_between_the_markers(tmp_path):
    bench = tmp_path / "bench.json"
    bench.write_text(json.dumps({"machine": {"cores": 2, "memory_gib": 8}, "runs": [run("local", 1)]}))
    md = tmp_path / "scale.md"
    md.write_text("# prose before\n<!-- scale_plan:begin -->\nold table\n<!-- scale_plan:end -->\nprose after\n")
    out = subprocess.run([sys.executable, str(ROOT / "bench" / "scale_plan.py"), "--bench", str(bench), "--cores",
                          "100", "--md", str(md)], capture_output=True, text=True, check=True, cwd=ROOT).stdout
    assert "near_dedup" in out and "signer affine32" in out
    # the bench's signature parts: 2 for the 900 documents reaching near dedup; the config's defaults named
    assert "signer affine32 (no scheme field); 2 signature parts of ~450 documents at 1,000." in out
    near = load_config(ROOT / "configs" / "default.yaml").dedup.near
    assert near.partitions is None  # automatic: named as such
    assert (f"signature parts of 100,000 documents (dedup.near.rows_per_part; the config's default is "
            f"{near.rows_per_part:,}), 4,096 key partitions (dedup.near.partitions; automatic in the config)") in out
    text = md.read_text()
    assert text.startswith("# prose before\n<!-- scale_plan:begin -->\nBench:") and text.endswith(
        "<!-- scale_plan:end -->\nprose after\n")
    assert "old table" not in text and "| near_dedup | local:1 @ 1,000 |" in text


def test_a_run_folder_counts_its_outputs_and_the_scratch_its_json_recorded(tmp_path):
    """Outputs are Parquet and the exact-dedup shuffle's files, counted on disk (the layout JSON not); the near-dup
    scratch is dropped during the run, so its folders and the Arrow bytes of a key row come from the run's JSON."""
    run_dir = tmp_path / "run-10-local-1"
    (tmp_path / "corpus-10-0").mkdir()
    (tmp_path / "corpus-10-0" / "a.jsonl").write_bytes(b"x" * 123)
    for folder in ("store/raw", "signatures", "near-out/decisions", "exact-shuffle/scatter", "near-work"):
        (run_dir / folder).mkdir(parents=True)

    def column(name: str, type_: pa.DataType) -> pa.Table:  # not null: no validity bitmap in the Arrow bytes
        return pa.table({name: pa.array(range(10), type_)}, schema=pa.schema([pa.field(name, type_, False)]))

    pq.write_table(column("a", pa.int64()), run_dir / "store/raw/part-00000.parquet")
    pq.write_table(column("s", pa.int64()), run_dir / "signatures/signatures-00000.parquet")
    pq.write_table(column("d", pa.int32()), run_dir / "near-out/decisions/d-0.parquet")
    for name in ("00000", "00001"):  # two writers, each with rows for two of 8 partitions
        write_partitioned(run_dir / "exact-shuffle/scatter", name, column("h", pa.uint64()), np.array([0, 5] * 5), 8)
    (run_dir / "near-work" / "layout-0123456789abcdef.json").write_text("{}")
    (tmp_path / "run-10-local-1.json").write_text(json.dumps({"near_stats": {
        "scratch": {"keys": {"bytes": 400, "files": 2}, "cc": {"bytes": 30, "files": 3}},
        "buckets": {"key_row_bytes": 21.0}}}))
    m = plan_mod.measure_run_dir(run_dir, 10)
    f = m["folders"]
    assert f["corpus"] == [123, 1] and f["raw"][1] == 1 and f["signatures"][1] == 1 and f["decisions"][1] == 1
    shuffle = (run_dir / "exact-shuffle/scatter/00000.shuffle").stat().st_size
    assert f["exact_shuffle"] == [2 * shuffle, 2]
    assert f["work:keys"] == [400, 2] and f["work:cc"] == [30, 3]
    assert set(k for k in f if k.startswith("work:")) == {"work:keys", "work:cc"}
    # Arrow bytes per row: signature 8 B; decision 4 B; a key row as the run measured it
    assert (m["key_row_bytes"], m["signature_doc_bytes"], m["decision_row_bytes"]) == (21.0, 8.0, 4.0)
    with pytest.raises(SystemExit):
        plan_mod.measure_run_dir(run_dir, 11)
