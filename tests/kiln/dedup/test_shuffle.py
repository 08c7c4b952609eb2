"""The near-dup rounds' shuffle files (kiln/dedup/shuffle.py): one file per writer, and a reader of partition q gets
exactly the rows a plain filter gives, in writer-name order then row order."""

import struct
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.dedup.shuffle import SHUFFLE, read_partition, read_segments, read_shuffle, write_partitioned

SCHEMA = pa.schema([pa.field("x", pa.int64()), pa.field("s", pa.string()), pa.field("l", pa.large_list(pa.uint32()))])


def table_of(rows: list[tuple[int, str, list[int]]]) -> pa.Table:
    return pa.table({"x": [r[0] for r in rows], "s": [r[1] for r in rows], "l": [r[2] for r in rows]}, schema=SCHEMA)


rows_st = st.lists(st.tuples(st.integers(-2**40, 2**40), st.text(max_size=5),
                             st.lists(st.integers(0, 2**32 - 1), max_size=4)), max_size=30)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(writers=st.lists(rows_st, min_size=1, max_size=4), partitions=st.integers(1, 7), seed=st.integers(0, 2**16))
def test_each_partition_reads_what_a_plain_filter_gives(tmp_path_factory, writers, partitions, seed):
    root = tmp_path_factory.mktemp("shuffle")
    rng = np.random.default_rng(seed)
    expected: dict[int, list] = {q: [] for q in range(partitions)}
    for w, rows in enumerate(writers):
        partition = rng.integers(0, partitions, len(rows))
        written = write_partitioned(root, f"w{w:02d}", table_of(rows), partition, partitions)
        assert written == sorted({int(q) for q in partition})
        for row, q in zip(rows, partition):  # the second implementation: a filter, writer by writer
            expected[int(q)].append(row)
    for q in range(partitions):
        got = read_partition(root, q, SCHEMA)
        assert got.schema == SCHEMA
        assert list(zip(*(got.column(c).to_pylist() for c in SCHEMA.names))) == [tuple(r) for r in expected[q]]
    assert read_shuffle(root, SCHEMA).num_rows == sum(map(len, writers))


def test_one_file_per_writer_whatever_the_partitions(tmp_path):
    t = table_of([(i, str(i), [i]) for i in range(1000)])
    write_partitioned(tmp_path, "00000", t, np.arange(1000) % 500, 500)
    write_partitioned(tmp_path, "00001", t, np.zeros(1000, np.int64), 500)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"00000{SHUFFLE}", f"00001{SHUFFLE}"]
    assert read_partition(tmp_path, 7, SCHEMA).column("x").to_pylist() == [7, 507]
    assert [name for name, _ in read_segments(tmp_path, 0)] == ["00000", "00001"]
    assert read_partition(tmp_path, 0, SCHEMA).num_rows == 2 + 1000
    assert read_partition(tmp_path, 499, SCHEMA, ["s"]).column_names == ["s"]


def test_a_reader_given_its_writers_opens_only_their_files(tmp_path):
    t = table_of([(i, str(i), [i]) for i in range(6)])
    assert write_partitioned(tmp_path, "a", t, np.array([0, 0, 1, 1, 2, 2]), 4) == [0, 1, 2]
    assert write_partitioned(tmp_path, "b", t, np.array([3, 3, 3, 1, 1, 1]), 4) == [1, 3]
    assert write_partitioned(tmp_path, "c", t, np.full(6, 2), 4) == [2]
    (tmp_path / f"c{SHUFFLE}").write_bytes(b"not a shuffle file")  # opened, it would fail to parse
    # partition 1: rows 2, 3 of a, then 3, 4, 5 of b (name order, whatever order the writers are given in)
    assert read_partition(tmp_path, 1, SCHEMA, writers=["b", "a"]).column("x").to_pylist() == [2, 3, 3, 4, 5]
    assert read_partition(tmp_path, 3, SCHEMA, writers=["b"]).column("x").to_pylist() == [0, 1, 2]
    assert read_partition(tmp_path, 0, SCHEMA, writers=[]).num_rows == 0


def test_empty_writes_nothing_and_reads_empty(tmp_path):
    assert write_partitioned(tmp_path / "a", "w", SCHEMA.empty_table(), np.empty(0, np.int64), 4) == []
    assert not (tmp_path / "a").exists()
    got = read_partition(tmp_path / "a", 2, SCHEMA, ["x"])
    assert got.num_rows == 0 and got.column_names == ["x"]


def test_a_dead_writers_temporary_file_is_never_read_and_a_rewrite_replaces(tmp_path):
    t = table_of([(1, "a", [1]), (2, "b", [2])])
    write_partitioned(tmp_path, "w", t, np.array([0, 1]), 2)
    (tmp_path / f".w{SHUFFLE}.tmp-deadbeef").write_bytes(b"half a file")  # a writer SIGKILLed before its rename
    write_partitioned(tmp_path, "w", t, np.array([1, 1]), 2)  # the retried task rewrites the same name
    assert read_partition(tmp_path, 0, SCHEMA).num_rows == 0
    assert read_partition(tmp_path, 1, SCHEMA).column("x").to_pylist() == [1, 2]


def test_a_partition_beyond_the_writers_count_is_an_error(tmp_path):
    write_partitioned(tmp_path, "w", table_of([(1, "a", [])]), np.array([0]), 3)
    with pytest.raises(IndexError, match="partition 3 of a shuffle written for 3"):
        read_partition(Path(tmp_path), 3, SCHEMA)


def test_an_offset_table_longer_than_the_footer_read_at_once(tmp_path):
    partitions = 3_000  # 24 kB of offsets: read beyond the first read of the file's tail
    t = table_of([(i, str(i), [i]) for i in range(10)])
    write_partitioned(tmp_path, "w", t, np.array([0, 1, 2, 600, 1500, 2998, 2999, 2999, 2999, 2999]), partitions)
    assert read_partition(tmp_path, 0, SCHEMA).column("x").to_pylist() == [0]
    assert read_partition(tmp_path, 1500, SCHEMA).column("x").to_pylist() == [4]
    assert read_partition(tmp_path, 2999, SCHEMA).column("x").to_pylist() == [6, 7, 8, 9]
    assert read_partition(tmp_path, 1000, SCHEMA).num_rows == 0
    assert read_shuffle(tmp_path, SCHEMA).column("x").to_pylist() == list(range(10))


def test_a_file_of_the_previous_layout_reads_the_same(tmp_path):
    """Before: each segment a whole IPC stream (schema and batch), no schema at the head, so the first offset is 0.
    A resumed exact dedup may meet such a file. Written here by hand, as that layout was."""
    t = table_of([(1, "a", [1]), (2, "b", [2]), (3, "c", [])])
    ends = [0]
    with open(tmp_path / f"w{SHUFFLE}", "wb") as f:
        for rows in (t.slice(0, 2), t.slice(0, 0), t.slice(2, 1)):  # partitions 0, 1 (empty) and 2
            if rows.num_rows:
                sink = pa.BufferOutputStream()
                with pa.ipc.new_stream(sink, SCHEMA) as writer:
                    writer.write_table(rows)
                f.write(sink.getvalue())
            ends.append(f.tell())
        f.write(np.array(ends, "<i8").tobytes() + struct.pack("<q", len(ends)))
    assert read_partition(tmp_path, 0, SCHEMA).column("x").to_pylist() == [1, 2]
    assert read_partition(tmp_path, 1, SCHEMA).num_rows == 0
    assert read_partition(tmp_path, 2, SCHEMA).column("l").to_pylist() == [[]]
    assert read_shuffle(tmp_path, SCHEMA).column("s").to_pylist() == ["a", "b", "c"]


def test_a_dictionary_encoded_column_is_refused_with_the_fix(tmp_path):
    t = pa.table({"s": pa.array(["a", "b", "a"]).dictionary_encode()})
    with pytest.raises(TypeError, match=r"dictionary-encoded columns \['s'\]; decode them first"):
        write_partitioned(tmp_path, "w", t, np.array([0, 1, 0]), 2)
    assert not list(tmp_path.iterdir())


def test_a_file_of_empty_segments_reads_as_no_rows(tmp_path):
    """A task's file written with `keep_empty` and no rows (exact dedup's mark that the task ran) is read as no rows,
    beside another writer's rows: its reader used the schema the file does not carry (None) and failed."""
    write_partitioned(tmp_path / "only", "a", SCHEMA.empty_table(), np.empty(0, np.int64), 3, keep_empty=True)
    assert read_shuffle(tmp_path / "only", SCHEMA).num_rows == 0
    write_partitioned(tmp_path / "both", "a", SCHEMA.empty_table(), np.empty(0, np.int64), 3, keep_empty=True)
    write_partitioned(tmp_path / "both", "b", table_of([(1, "x", [1]), (2, "y", [])]), np.array([0, 2]), 3)
    assert read_shuffle(tmp_path / "both", SCHEMA).column("x").to_pylist() == [1, 2]
