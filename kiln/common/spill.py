"""Joins and regroupings of lists too long to hold, spilled to disk a bucket at a time (a grace hash join): rows are
streamed into Arrow stream files by bucket, then each bucket is read back alone. What a process holds is one batch
while scattering and one bucket while joining, at any list length: at most MAX_BUCKETS files are written at once, so
with more buckets than that a pass writes runs of consecutive buckets to a file each, and the first bucket read from
a run scatters that file again (the recursive partitioning of a grace hash join: each row is written once per pass,
twice up to MAX_BUCKETS^2 buckets, 2^36 rows of 2^20 each). The exposure record and the Parquet export join a
token-shard set's position list (a row per document copy) with its member list (a row per document) this way
(docs/scale.md)."""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

BUCKET_ROWS = 1 << 20  # rows a bucket is sized for
MAX_BUCKETS = 256  # bucket files open at once while scattering
BATCH_ROWS = 1 << 16  # rows a caller reads from a list at once


def bucket_count(rows: int, bucket_rows: int = BUCKET_ROWS) -> int:
    """Buckets for `rows` rows of `bucket_rows` each: at least 1."""
    return max(-(-rows // bucket_rows), 1)


def hash_buckets(keys: pa.Array, buckets: int) -> np.ndarray:
    """Each key's bucket: pandas' hash of the values (vectorized; the same key, the same bucket, in every list a
    process scatters), modulo `buckets`."""
    values = keys.to_numpy(zero_copy_only=False)
    return (pd.util.hash_array(values, categorize=False) % np.uint64(buckets)).astype(np.int64)


class Spill:
    """The rows of `batches` (all of `schema`) scattered into the new folder `folder` by `bucket_of(batch)` (one
    bucket in [0, buckets) per row), to be read back a bucket at a time by `pop`, each bucket's rows in their order.

    A file holds a run of consecutive buckets (one bucket when there are at most MAX_BUCKETS of them); `pop` of a
    bucket whose file holds several scatters that file again into a folder beside it, with `bucket_of` applied to
    its rows again, so `bucket_of` must give a row the same bucket every time."""

    def __init__(self, folder: Path, buckets: int, schema: pa.Schema, batches: Iterable[pa.RecordBatch],
                 bucket_of: Callable[[pa.RecordBatch], np.ndarray]):
        if buckets < 1:
            raise ValueError(f"a spill needs at least one bucket, not {buckets}")
        self.schema, self.bucket_of = schema, bucket_of
        self._run_start = np.zeros(buckets, np.int64)  # each bucket's run: its first bucket
        self._runs: dict[int, tuple[int, Path]] = {}  # first bucket -> (end, file) of the runs not read yet
        self._scatter(folder, 0, buckets, batches)

    def _scatter(self, folder: Path, lo: int, hi: int, batches: Iterable[pa.RecordBatch]) -> None:
        """Buckets [lo, hi) into min(MAX_BUCKETS, hi - lo) files of runs as even as can be."""
        n, runs = hi - lo, min(MAX_BUCKETS, hi - lo)
        starts = [lo - (-k * n // runs) for k in range(runs + 1)]  # bucket b is in run (b - lo) * runs // n
        folder.mkdir(parents=True)
        files = [folder / f"{k:05d}.arrow" for k in range(runs)]
        with contextlib.ExitStack() as stack:
            writers = [stack.enter_context(pa.ipc.new_stream(f, self.schema)) for f in files]
            for batch in _coalesced(batches):
                bucket = np.asarray(self.bucket_of(batch), np.int64)
                if bucket.size and (bucket.min() < lo or bucket.max() >= hi):
                    raise ValueError(f"spill {folder}: bucket {bucket.min() if bucket.min() < lo else bucket.max()}"
                                     f" outside [{lo}, {hi})")
                run = (bucket - lo) * runs // n
                order = np.argsort(run, kind="stable")
                bounds = np.searchsorted(run[order], np.arange(runs + 1))
                batch = batch.take(pa.array(order))
                for k in np.flatnonzero(np.diff(bounds)).tolist():
                    writers[k].write_batch(batch.slice(bounds[k], bounds[k + 1] - bounds[k]))
        for k, file in enumerate(files):
            self._run_start[starts[k]:starts[k + 1]] = starts[k]
            self._runs[starts[k]] = (starts[k + 1], file)

    def pop(self, bucket: int) -> pa.Table:
        """Bucket `bucket`'s rows, in the order they were scattered; its file is removed, so the disk it held is
        free again. Each bucket is read once."""
        if not 0 <= bucket < len(self._run_start):
            raise IndexError(f"bucket {bucket} of a spill of {len(self._run_start)} buckets")
        start = int(self._run_start[bucket])
        if start not in self._runs:
            raise KeyError(f"bucket {bucket} of this spill was read already")
        end, file = self._runs.pop(start)
        if end - start == 1:
            with pa.ipc.open_stream(file) as reader:
                table = reader.read_all()
            file.unlink()
            return table
        with pa.ipc.open_stream(file) as reader:
            self._scatter(file.with_suffix(""), start, end, reader)
        file.unlink()
        return self.pop(bucket)


def _coalesced(batches: Iterable[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
    """The batches joined into batches of at least BATCH_ROWS rows, the last one excepted: a pass writes each batch
    it scatters as a slice per file, and a message costs the same whatever its rows. Without this, a second pass
    would scatter slices of slices (a 65,536-row batch in 256 x 256 files is a row a message), and a bucket read
    back (a slice of each batch scattered) scattered again a few rows a message."""
    held: list[pa.RecordBatch] = []
    count = 0
    for batch in batches:
        held.append(batch)
        count += batch.num_rows
        if count >= BATCH_ROWS:
            yield held[0] if len(held) == 1 else pa.concat_batches(held)
            held, count = [], 0
    if held:
        yield held[0] if len(held) == 1 else pa.concat_batches(held)


def joined_buckets(folder: Path, buckets: int, left: tuple[pa.Schema, Iterable[pa.RecordBatch]],
                   right: tuple[pa.Schema, Iterable[pa.RecordBatch]], key: str = "doc_id"
                   ) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Two lists ((schema, batches) each) scattered by the hash of their `key` column into the new folder `folder`,
    then each bucket's (left rows, right rows): the rows of one key meet in one bucket, to be joined there alone."""
    def by_key(batch: pa.RecordBatch) -> np.ndarray:
        return hash_buckets(batch.column(key), buckets)

    lefts = Spill(folder / "left", buckets, *left, by_key)
    rights = Spill(folder / "right", buckets, *right, by_key)
    for bucket in range(buckets):
        yield lefts.pop(bucket), rights.pop(bucket)


__all__ = ["BATCH_ROWS", "BUCKET_ROWS", "MAX_BUCKETS", "Spill", "bucket_count", "hash_buckets", "joined_buckets"]
