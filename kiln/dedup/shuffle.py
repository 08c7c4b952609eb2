"""Scratch files of the near-dup rounds: one task's output, and the shuffle between two rounds.

A shuffle writes one file per writing task, whatever the number of partitions: the table's schema (one Arrow IPC
schema message), then the task's rows sorted by partition, each partition's rows as one IPC record batch message,
then the segments' byte offsets (partitions + 1 little-endian int64; the first is where the schema ends) and their
count. A reader of partition q reads the footer, the schema and its segment from every writer's file. This is the
layout of Spark's sort-based shuffle (a data file and an index per map task): with a file per (writer, partition),
a million documents made ~150,000 files per run and opening, writing and renaming them was about half of the
stage's time. A batch message without a stream around it costs a fifth of an IPC stream per segment to write and
a third to read (a million documents read ~180,000 segments). Files of the previous layout (each segment a whole
IPC stream, the first offset 0) are still read, so a resumed exact dedup can use them.

Scratch is Arrow IPC, not Parquet (no encoding, no compression: read back once, soon) and is not flushed to
disk: it never outlives its run, and a run starts by emptying its work folder, so a power loss costs the run,
never a wrong answer. Every file is written under a temporary name and renamed: a reader lists only renamed
files, so it never sees a half-written one; a SIGKILLed writer leaves only a temporary name (hidden, never listed),
which the retried task rewrites under the same final name. `is_whole` checks a file's footer against its size: a
resumed run (exact dedup's) can tell a file that a power loss emptied or cut short from a whole one.
"""

from __future__ import annotations

import functools
import os
import struct
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import pyarrow as pa

from kiln.common.manifest import temporary_name

SCRATCH = ".arrow"  # one task's output, read whole
SHUFFLE = ".shuffle"  # one task's output for every partition of the next round


def write_scratch(path: Path, table: pa.Table) -> None:
    tmp = temporary_name(path)
    with pa.OSFile(str(tmp), "wb") as sink, pa.ipc.new_file(sink, table.schema) as writer:
        writer.write_table(table)
    os.replace(tmp, path)


def read_scratch(path: Path, columns: list[str] | None = None) -> pa.Table:
    with pa.OSFile(str(path), "rb") as source:
        table = pa.ipc.open_file(source).read_all()
    return table.select(columns) if columns else table


def write_partitioned(root: Path, name: str, table: pa.Table, partition: np.ndarray, partitions: int,
                      keep_empty: bool = False) -> list[int]:
    """Shuffle write: root/{name}.shuffle holds the rows of `table` for each partition q < `partitions` (in
    their order). An empty table writes nothing, unless `keep_empty` (a file of empty segments: its presence then
    says the task ran). Returns the partitions that got rows."""
    if table.num_rows == 0 and not keep_empty:
        return []
    coded = [f.name for f in table.schema if pa.types.is_dictionary(f.type)]
    if coded:  # a batch message carries no dictionary: its reader could not decode the column
        raise TypeError(f"shuffle {root / name}: dictionary-encoded columns {coded}; decode them first "
                        "(table.cast with their value types)")
    partition = np.asarray(partition, np.int64)
    if partition.size < 2 or (partition[1:] >= partition[:-1]).all():  # in partition order already: no copy
        bounds, rows = np.searchsorted(partition, np.arange(partitions + 1)), table
    else:
        # Stable, by radix sort when the partition fits 16 bits (numpy sorts 16-bit keys so): 5x an int64 sort.
        order = np.argsort(partition.astype(np.int16) if partitions <= 2**15 else partition, kind="stable")
        bounds = np.searchsorted(partition[order], np.arange(partitions + 1))
        rows = table.take(pa.array(order))
    written = np.flatnonzero(np.diff(bounds)).tolist()
    batch = rows.combine_chunks().to_batches()[0] if written else None  # one batch: each segment is one slice
    schema = table.schema.serialize()
    ends = np.zeros(partitions + 1, np.int64)
    root.mkdir(parents=True, exist_ok=True)
    path = root / f"{name}{SHUFFLE}"
    tmp = temporary_name(path)
    with open(tmp, "wb") as f:
        f.write(schema)
        ends[0] = schema.size
        for q in written:
            f.write(batch.slice(bounds[q], bounds[q + 1] - bounds[q]).serialize())
            ends[q + 1] = f.tell()
        f.write(np.maximum.accumulate(ends).astype("<i8").tobytes())  # an empty segment starts where the last ended
        f.write(struct.pack("<q", partitions + 1))
    os.replace(tmp, path)
    return written


_TAIL = 4096  # footer bytes read at once: the whole offset table of a shuffle of up to 510 partitions


def _segments(path: str | Path, wanted: int | None = None) -> tuple[pa.Schema | None, list[bytes]]:
    """(the file's schema, the bytes of partition `wanted`'s segment) of one shuffle file (b"" when it has no rows
    for it), or of every partition's (None); one open, the offsets read from its end. The schema is None for a file
    of the previous layout, whose segments are whole IPC streams (and when every segment asked for is empty: it is
    read only to decode one)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        size = os.fstat(fd).st_size
        tail_at = max(size - _TAIL, 0)
        tail = os.pread(fd, size - tail_at, tail_at)
        (count,) = struct.unpack_from("<q", tail, len(tail) - 8)
        index = size - 8 - 8 * count
        if wanted is not None and not 0 <= wanted < count - 1:
            raise IndexError(f"{path}: partition {wanted} of a shuffle written for {count - 1}")

        def offset(i: int) -> int:
            at = index + 8 * i
            return struct.unpack_from("<q", tail, at - tail_at)[0] if at >= tail_at else \
                struct.unpack("<q", os.pread(fd, 8, at))[0]

        head = offset(0)
        bounds = [offset(i) for i in range(count)] if wanted is None else [offset(wanted), offset(wanted + 1)]
        segments = [os.pread(fd, hi - lo, lo) if hi > lo else b"" for lo, hi in zip(bounds, bounds[1:])]
        return (_schema(os.pread(fd, head, 0)) if head and any(segments) else None), segments
    finally:
        os.close(fd)


@functools.lru_cache(maxsize=64)
def _schema(message: bytes) -> pa.Schema:
    """A shuffle file's schema from its head: the same few for every file of a run (parsing one cost a segment's
    read again)."""
    return pa.ipc.read_schema(pa.py_buffer(message))


def _decode(schema: pa.Schema | None, segment: bytes) -> pa.Table:
    if schema is None:  # the previous layout
        return pa.ipc.open_stream(segment).read_all()
    return pa.Table.from_batches([pa.ipc.read_record_batch(pa.py_buffer(segment), schema)])


def is_whole(path: Path) -> bool:
    """Whether `path` is a complete shuffle file: its footer's offsets end where the footer begins."""
    try:
        fd = os.open(path, os.O_RDONLY)
    except FileNotFoundError:
        return False
    try:
        size = os.fstat(fd).st_size
        if size < 16:
            return False
        (count,) = struct.unpack("<q", os.pread(fd, 8, size - 8))
        index = size - 8 - 8 * count
        if count < 1 or index < 0:
            return False
        (last,) = struct.unpack("<q", os.pread(fd, 8, index + 8 * (count - 1)))
        return last == index
    finally:
        os.close(fd)


def partitions_of(path: Path) -> int:
    """The number of partitions a (whole) shuffle file was written for."""
    with open(path, "rb") as f:
        f.seek(-8, os.SEEK_END)
        return struct.unpack("<q", f.read(8))[0] - 1


def shuffle_files(root: Path) -> list[Path]:
    """The shuffle's files renamed into place (a temporary name, `.{name}.tmp-…`, is never listed), in name
    order. Names sorted as strings: every reader of a partition lists the folder, and sorting Paths cost ~2 s per
    million documents."""
    try:
        names = os.listdir(root)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [root / name for name in sorted(names) if name.endswith(SHUFFLE)]


def read_segments(root: Path, q: int, columns: list[str] | None = None,
                  writers: Sequence[str] | None = None) -> list[tuple[str, pa.Table]]:
    """(writer's name, its rows) for partition q, from every writer that has some, in name order. `writers`: the
    names of the only files that hold rows for q (as their `write_partitioned` returned), opened without listing
    the folder: a reader of a sparse shuffle opens its own writers' files, not every file."""
    paths = shuffle_files(root) if writers is None else [root / f"{name}{SHUFFLE}" for name in sorted(writers)]
    out = []
    for path in paths:
        schema, (segment,) = _segments(path, q)
        if segment:
            table = _decode(schema, segment)
            out.append((path.name[:-len(SHUFFLE)], table.select(columns) if columns else table))
    return out


def read_partition(root: Path, q: int, schema: pa.Schema, columns: list[str] | None = None,
                   writers: Sequence[str] | None = None) -> pa.Table:
    """Partition q of a shuffle: every writer's rows for it, in writer-name order (`writers`: as `read_segments`)."""
    tables = [t for _, t in read_segments(root, q, columns, writers)]
    if not tables:
        return pa.schema([schema.field(c) for c in columns or schema.names]).empty_table()
    return pa.concat_tables(tables)


def read_file(path: Path, schema: pa.Schema) -> pa.Table:
    """Every partition of one shuffle file, in partition order (`schema`'s empty table when it has no rows: a task's
    file of empty segments, `keep_empty`, names no schema of its own)."""
    written, segments = _segments(path)
    tables = [_decode(written, segment) for segment in segments if segment]
    return pa.concat_tables(tables) if tables else schema.empty_table()


def read_shuffle(root: Path, schema: pa.Schema) -> pa.Table:
    """Every file of a shuffle, whole (for tests, small outputs and the scale plan)."""
    tables = [read_file(path, schema) for path in shuffle_files(root)]
    return pa.concat_tables(tables) if tables else schema.empty_table()
