"""Every hash a filtered partition's documents are known by, bucketed by hash: what `kiln audit membership --text`
searches instead of hashing every raw text per question.

A document's rows (`INTAKE_HASH_SCHEMA`: doc_id, content_hash) hold exact dedup's hash of its text as the filter
stage read it (normalized by the `normalize` step), kept or removed, and, where a filter rewrote a kept text (PII
redacted), of the text as written. The filter stage's part tasks write their rows to a scratch file each; two engine
rounds then move them into B files by the hash's head (`kiln.dedup.shuffle`, as exact dedup's buckets), each sorted
by hash in small row groups: `intake_hashes-<q>-of-<B>.parquet`, B = the rows over `ROWS_PER_BUCKET`. A question
opens one file per partition and decodes the one row group whose min/max statistics admit its hash: at a billion
documents in parts of 500 it would otherwise read two million files per question.

Partitions filtered before the rows were bucketed hold one unsorted file per part, without the rewritten texts'
hashes (those are in the documents' `content_hash`): `bucket_count` tells them apart, and `to_search` names them
all.
"""

from __future__ import annotations

import math
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

import pyarrow.parquet as pq

from kiln.common.storage import DatasetWriter, part_name, resume_part, write_parquet_atomic
from kiln.curation.documents import INTAKE_HASH_SCHEMA
from kiln.curation.exact_dedup import bucket_of, bucket_of_hash
from kiln.dedup.shuffle import read_partition, write_partitioned
from kiln.engine import Engine

ROLE = "intake_hashes"
ROWS_PER_BUCKET = 65_536  # about 2 MB a file (32 bytes a row): one task's memory, whatever the corpus
ROW_GROUP = 2_048  # rows a question decodes in its bucket (its hash's row group)
_BUCKETED = re.compile(r"-(\d+)-of-(\d+)\.parquet$")


def bucket_file(bucket: int, buckets: int) -> str:
    return part_name(ROLE, bucket, f"-of-{buckets:05d}.parquet")


def bucket_count(names: list[str]) -> int | None:
    """B when `names` are a whole bucketed layout (every file `…-<q>-of-<B>.parquet`, one per bucket), else None:
    files written one per part, before the rows were bucketed (or no files)."""
    found = [_BUCKETED.search(name) for name in names]
    if not found or not all(found):
        return None
    layouts = {int(m.group(2)) for m in found}
    if len(layouts) != 1:
        return None
    (buckets,) = layouts
    return buckets if sorted(int(m.group(1)) for m in found) == list(range(buckets)) else None


def to_search(names: list[str], wanted: str) -> list[str]:
    """Which of a partition's files (`names`, as its manifest lists them) may hold rows hashed `wanted`: the one bucket
    file it falls in, or every file of any other layout (the per-part one; documents)."""
    buckets = bucket_count([Path(name).name for name in names])
    if buckets is None:
        return names
    bucket = bucket_file(bucket_of_hash(wanted, buckets), buckets)
    return [name for name in names if Path(name).name == bucket]


def search(files: list[Path | BinaryIO], wanted: str) -> list[str]:
    """The doc_ids of the rows of `files` (paths, or files open for reading) whose `content_hash` is `wanted`; in a
    bucket file, only the row group whose min/max statistics admit it is decoded."""
    matches = [pq.read_table(f, columns=["doc_id"], filters=[("content_hash", "=", wanted)]) for f in files]
    return [d for table in matches for d in table.column("doc_id").to_pylist()]


@dataclass(frozen=True)
class _Scatter:
    part: str  # a part task's rows (scratch Parquet)
    scatter: str
    buckets: int


@dataclass(frozen=True)
class _Bucket:
    scatter: str
    bucket: int
    out: str
    row_group: int  # the driver's layout, whatever a worker's module says


def _scatter(task: _Scatter) -> None:
    part = Path(task.part)
    table = pq.read_table(part)
    write_partitioned(Path(task.scatter), part.stem, table, bucket_of(table.column("content_hash"), task.buckets),
                      task.buckets, keep_empty=True)


def _write_bucket(task: _Bucket) -> dict:
    table = read_partition(Path(task.scatter), task.bucket, INTAKE_HASH_SCHEMA)
    table = table.sort_by([("content_hash", "ascending"), ("doc_id", "ascending")]).cast(INTAKE_HASH_SCHEMA)
    write_parquet_atomic(Path(task.out), table, row_group_size=task.row_group)
    return {"rows": table.num_rows}


def _bucket(task: _Bucket) -> dict:
    return resume_part(task.out, lambda: _write_bucket(task))


def part_rows_path(writer: DatasetWriter, part: int) -> Path:
    """Where part task `part` writes its rows: scratch, never published."""
    return writer.scratch("intake_parts") / f"{part:06d}.parquet"


def bucket_rows(parts: list[Path], rows: int, writer: DatasetWriter, engine: Engine, progress: bool = True,
                label: str = "intake hashes") -> None:
    """The part tasks' rows (`parts`, about `rows` in all) into the published bucket files (none for no rows)."""
    if rows == 0:
        return
    buckets = max(1, math.ceil(rows / ROWS_PER_BUCKET))
    scatter = writer.scratch("intake_scatter")
    shutil.rmtree(scatter)  # a failed attempt's files: scattered again, whole
    scatter.mkdir()
    engine.map_parts(_scatter, [_Scatter(str(p), str(scatter), buckets) for p in parts], desc=f"{label} (scatter)",
                     progress=progress)
    engine.map_parts(_bucket, [_Bucket(str(scatter), q, str(writer.dir / bucket_file(q, buckets)), ROW_GROUP)
                               for q in range(buckets)], desc=f"{label} (buckets)", progress=progress)
    shutil.rmtree(scatter)  # the shuffle, as soon as the buckets are written
