"""Joins and regroupings of lists too long to hold, spilled to disk a bucket at a time (a grace hash join): rows are
streamed into one Arrow stream file per bucket, then each bucket is read back alone. What a process holds is one
batch while scattering and one bucket while joining, at any list length up to MAX_BUCKETS x the rows per bucket;
past that the buckets grow with the lists. The exposure record and the Parquet export join a token-shard set's
position list (a row per document copy) with its member list (a row per document) this way (docs/scale.md)."""

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
    """Buckets for `rows` rows of `bucket_rows` each: at least 1, at most MAX_BUCKETS."""
    return min(max(-(-rows // bucket_rows), 1), MAX_BUCKETS)


def hash_buckets(keys: pa.Array, buckets: int) -> np.ndarray:
    """Each key's bucket: pandas' hash of the values (vectorized; the same key, the same bucket, in every list a
    process scatters), modulo `buckets`."""
    values = keys.to_numpy(zero_copy_only=False)
    return (pd.util.hash_array(values, categorize=False) % np.uint64(buckets)).astype(np.int64)


def scatter(folder: Path, buckets: int, schema: pa.Schema, batches: Iterable[pa.RecordBatch],
            bucket_of: Callable[[pa.RecordBatch], np.ndarray]) -> list[Path]:
    """Each batch's rows appended, in order, to the stream file of their bucket (`bucket_of(batch)`: one bucket
    number per row) in the new folder `folder`; the files, by bucket."""
    folder.mkdir(parents=True)
    files = [folder / f"{b:05d}.arrow" for b in range(buckets)]
    with contextlib.ExitStack() as stack:
        writers = [stack.enter_context(pa.ipc.new_stream(f, schema)) for f in files]
        for batch in batches:
            bucket = bucket_of(batch)
            order = np.argsort(bucket, kind="stable")
            bounds = np.searchsorted(bucket[order], np.arange(buckets + 1))
            batch = batch.take(pa.array(order))
            for b in np.flatnonzero(np.diff(bounds)).tolist():
                writers[b].write_batch(batch.slice(bounds[b], bounds[b + 1] - bounds[b]))
    return files


def read_bucket(path: Path) -> pa.Table:
    """A bucket's rows; its file is removed, so the disk it held is free again."""
    with pa.ipc.open_stream(path) as reader:
        table = reader.read_all()
    path.unlink()
    return table


def joined_buckets(folder: Path, buckets: int, left: tuple[pa.Schema, Iterable[pa.RecordBatch]],
                   right: tuple[pa.Schema, Iterable[pa.RecordBatch]], key: str = "doc_id"
                   ) -> Iterator[tuple[pa.Table, pa.Table]]:
    """Two lists ((schema, batches) each) scattered by the hash of their `key` column into the new folder `folder`,
    then each bucket's (left rows, right rows): the rows of one key meet in one bucket, to be joined there alone."""
    def by_key(batch: pa.RecordBatch) -> np.ndarray:
        return hash_buckets(batch.column(key), buckets)

    lefts = scatter(folder / "left", buckets, *left, by_key)
    rights = scatter(folder / "right", buckets, *right, by_key)
    for left_file, right_file in zip(lefts, rights):
        yield read_bucket(left_file), read_bucket(right_file)


__all__ = ["BATCH_ROWS", "BUCKET_ROWS", "MAX_BUCKETS", "bucket_count", "hash_buckets", "joined_buckets",
           "read_bucket", "scatter"]
