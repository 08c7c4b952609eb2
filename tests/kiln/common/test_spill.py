"""kiln.common.spill: a bucket read back is exactly the rows scattered to it, in their order, however many buckets
and passes; no more than MAX_BUCKETS files are written at once; a grace hash join meets every key in one bucket."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kiln.common import spill
from kiln.common.spill import Spill, joined_buckets

SCHEMA = pa.schema([("row", pa.int64()), ("bucket", pa.int64()), ("text", pa.string())])


def batches_of(buckets: list[int], cuts: list[int]) -> list[pa.RecordBatch]:
    """Rows numbered in order, each with its bucket, cut into batches at `cuts`."""
    table = pa.table({"row": np.arange(len(buckets)), "bucket": np.array(buckets, np.int64),
                      "text": [f"r{i}" for i in range(len(buckets))]}, schema=SCHEMA)
    edges = sorted({0, len(buckets), *(c % (len(buckets) + 1) for c in cuts)})
    return [table.slice(a, b - a).to_batches()[0] for a, b in zip(edges, edges[1:]) if b > a]


def by_column(batch: pa.RecordBatch) -> np.ndarray:
    return batch.column("bucket").to_numpy()


@given(st.data())
def test_each_bucket_is_its_rows_in_order_through_any_number_of_passes(tmp_path_factory, data):
    """The second implementation is a filter of the input: the rows whose bucket is b, in input order. Files of at
    most 2 to 5 buckets' runs make up to six passes for 60 buckets; buckets are read in any order."""
    buckets = data.draw(st.integers(1, 60), label="buckets")
    fan_out = data.draw(st.integers(2, 5), label="fan_out")
    rows = data.draw(st.lists(st.integers(0, buckets - 1), max_size=200), label="rows")
    cuts = data.draw(st.lists(st.integers(0, 200), max_size=6), label="cuts")
    order = data.draw(st.permutations(range(buckets)), label="order")
    folder = tmp_path_factory.mktemp("spill") / "s"
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(spill, "MAX_BUCKETS", fan_out)
        spilled = Spill(folder, buckets, SCHEMA, batches_of(rows, cuts), by_column)
        for b in order:
            got = spilled.pop(b)
            assert got.schema == SCHEMA
            assert got.column("row").to_pylist() == [i for i, r in enumerate(rows) if r == b]
    assert not [p for p in folder.rglob("*") if p.is_file()]  # every file removed as it was read


def test_no_more_than_max_buckets_files_are_written_at_once_and_a_row_is_written_once_per_pass(tmp_path, monkeypatch):
    """27 buckets, files of at most 3 runs: a pass writes 3 files, so rows are written 3 times (27 = 3^3). Reading
    bucket 0 first scatters its run of 9 buckets, then its run of 3: 3 + 3 + 3 files, then bucket 0 is read. The
    rows come round-robin in 4 batches, scattered as one (a message per file, not 4: a message costs the same
    whatever its rows), and each run as one batch again."""
    monkeypatch.setattr(spill, "MAX_BUCKETS", 3)
    open_now, most, written, messages = 0, 0, 0, 0
    new_stream = pa.ipc.new_stream

    class Counted:
        def __init__(self, sink, schema):
            self.writer = new_stream(sink, schema)

        def __enter__(self):
            nonlocal open_now, most
            open_now += 1
            most = max(most, open_now)
            return self

        def write_batch(self, batch):
            nonlocal written, messages
            written += batch.num_rows
            messages += 1
            self.writer.write_batch(batch)

        def __exit__(self, *exc):
            nonlocal open_now
            open_now -= 1
            self.writer.close()

    monkeypatch.setattr(spill.pa.ipc, "new_stream", Counted)
    rows = [b for _ in range(4) for b in range(27)]  # 4 rows in each bucket: rows b, b + 27, b + 54, b + 81
    spilled = Spill(tmp_path / "s", 27, SCHEMA, batches_of(rows, [27, 54, 81]), by_column)
    assert (most, written, messages) == (3, 108, 3)
    assert spilled.pop(0).column("row").to_pylist() == [0, 27, 54, 81]
    assert (written, messages) == (108 + 36 + 12, 3 + 3 + 3)  # the run of buckets 0-8 (36 rows), then of 0-2
    for b in range(1, 27):
        assert spilled.pop(b).column("row").to_pylist() == [b + 27 * i for i in range(4)]
    assert (most, written) == (3, 3 * 108)
    with pytest.raises(KeyError, match="bucket 5 of this spill was read already"):
        spilled.pop(5)
    with pytest.raises(IndexError, match="bucket 27 of a spill of 27 buckets"):
        spilled.pop(27)


def test_a_row_outside_the_buckets_is_an_error_not_a_lost_row(tmp_path):
    with pytest.raises(ValueError, match=r"bucket 4 outside \[0, 4\)"):
        Spill(tmp_path / "s", 4, SCHEMA, batches_of([0, 4, 1], []), by_column)


def test_the_grace_join_meets_each_key_in_one_bucket_past_max_buckets(tmp_path, monkeypatch):
    """Both lists of a join in 40 buckets, files of at most 4: every key's left and right rows come out together,
    once, as a dict join of the two lists says."""
    monkeypatch.setattr(spill, "MAX_BUCKETS", 4)
    keys = [f"doc-{i}" for i in range(300)]
    left_schema = pa.schema([("doc_id", pa.string()), ("source", pa.string())])
    right_schema = pa.schema([("doc_id", pa.string()), ("copy", pa.int64())])
    left = pa.table({"doc_id": keys, "source": [f"s{i % 3}" for i in range(300)]}, schema=left_schema)
    right_keys = [keys[(7 * i) % 300] for i in range(900)]  # three copies of each document
    right = pa.table({"doc_id": right_keys, "copy": np.arange(900)}, schema=right_schema)
    source = dict(zip(keys, left.column("source").to_pylist()))
    expected = sorted((k, source[k], c) for c, k in enumerate(right_keys))
    got, seen = [], set()
    for lefts, rights in joined_buckets(tmp_path / "j", 40, (left_schema, left.to_batches(max_chunksize=64)),
                                        (right_schema, right.to_batches(max_chunksize=100))):
        here = dict(zip(lefts.column("doc_id").to_pylist(), lefts.column("source").to_pylist()))
        assert not seen & here.keys()
        seen |= here.keys()
        got += [(k, here[k], c) for k, c in zip(rights.column("doc_id").to_pylist(), rights.column("copy").to_pylist())]
    assert sorted(got) == expected and seen == set(keys)
