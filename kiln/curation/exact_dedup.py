"""Exact deduplication as a shuffle: documents whose normalized text hashes alike, across every source of a refresh
and every earlier refresh, keep one copy.

The copy kept is the one from the best quality tier (earlier refreshes are tier 0: they may already be in token
shards), then the source listed first, then the earliest document (part, then row) in that source. No process
holds the corpus's hashes; three rounds of part-sized tasks on the engine:

1. scatter: each input part's first row of each content_hash goes to its hash bucket (one shuffle file per part,
   under `scratch/scatter`; the part's later rows of a hash follow its first, `duplicates_in`);
2. decide: each bucket, sorted by (hash, tier, source, part, row), names the duplicates and the copy kept, shuffled
   back by input part (one file per bucket, under `scratch/decided`);
3. apply: each part of the partition being curated splits into kept documents and rejected duplicates.

The shuffles are `kiln.dedup.shuffle`'s: one file per task (Arrow IPC segments and an offsets footer), written
under a temporary name and renamed, not flushed to disk; parts + buckets files in all, where a file per (part,
bucket) made 10,003 fsynced files at 1M documents. A reader lists only renamed files; a SIGKILLed writer leaves only
a temporary name, which the retried task rewrites. A task's file is its completion mark (every task writes one,
even with no rows): a run resumed after a crash skips the tasks whose file is whole (`is_whole`: its footer
matches its size, which also turns away a file a power loss emptied) and redoes the others.

Rounds 1 and 2 serve every source of the refresh: they run once, in a scratch folder the sources' runs share.
Decisions depend only on the hash and the order above, so the bucket count and the engine never change them.
Rounds 1 and 2 (`find_duplicates`) also find, at intake, the rows of a source that repeat a doc id.
"""

from __future__ import annotations

import math
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from filelock import FileLock

from kiln.common.removals import RejectedText, example_excerpt, rejected_row
from kiln.common.stats import StageStats
from kiln.common.storage import lock_then_remove, resume_part, write_parquet_atomic
from kiln.curation.documents import REJECTED_SCHEMA
from kiln.dedup.shuffle import SHUFFLE, is_whole, partitions_of, read_segments, shuffle_files, write_partitioned
from kiln.engine import SERIAL, Engine

DEDUP_STAGE = "exact_dedup"
DUPLICATE = f"{DEDUP_STAGE}.duplicate"
ROWS_PER_BUCKET = 500_000  # a bucket is sorted in one task: this bounds its memory (~100 MB)
SCATTER, DECIDED = "scatter", "decided"  # the two shuffles' folders under the scratch folder
DUPLICATE_SCHEMA = pa.schema([pa.field("row", pa.int64()), pa.field("duplicate_of", pa.string())])


@dataclass(frozen=True)
class HashSource:
    """One partition whose documents compete for the kept copy: its parts in order, and its quality tier
    (1 best; 0 for an earlier refresh's curated documents, which always win)."""

    name: str
    tier: int
    parts: tuple[str, ...]


@dataclass(frozen=True)
class _Scatter:
    path: str
    source: int  # position in the list of HashSources: the tie-break after the tier
    tier: int
    part: int
    buckets: int
    scratch: str
    key: str  # the column whose equal values are duplicates: a hex digest


@dataclass(frozen=True)
class _Decide:
    bucket: int
    scratch: str
    key: str
    starts: tuple[int, ...]  # each source's first part in the numbering of all parts (the decide shuffle's partitions)
    writers: int  # scatter files expected: one per part


@dataclass(frozen=True)
class DuplicateRows:
    """Where one part's decisions lie: partition `partition` of the decide shuffle, written by `buckets` tasks."""

    folder: str
    partition: int
    buckets: int


@dataclass(frozen=True)
class _Apply:
    input_path: str
    duplicates: DuplicateRows | None  # None: dedup disabled
    kept_path: str
    rejected_path: str
    examples_per_reason: int
    rejected_text: RejectedText


def _part_key(source: int, part: int) -> str:
    return f"{source:05d}-{part:06d}"


def bucket_of_hash(digest: str, buckets: int) -> int:  # hex digests: their head is uniform
    return int(digest[:8], 16) % buckets


def bucket_of(hashes: pa.ChunkedArray, buckets: int) -> np.ndarray:
    return np.array([bucket_of_hash(h, buckets) for h in hashes.to_pylist()], np.int64)


def _first_rows(keys: list) -> list[int]:
    """The row of each distinct key's first occurrence, in row order."""
    first: dict = {}
    for row, key in enumerate(keys):
        first.setdefault(key, row)
    return list(first.values())


def _scatter(task: _Scatter) -> int:
    """Round 1: the (doc_id, key, tier, source, part, row) row of each key's first occurrence in this part, to their
    hash buckets: one shuffle file. A part's later rows of a key are never the copy kept (its first row comes before
    them in every order), so they stay out of the shuffle: `duplicates_in` adds them from the part itself. A key
    repeated in millions of documents then sends a row per part holding it to its bucket, not one per copy."""
    name = _part_key(task.source, task.part)
    if is_whole(Path(task.scratch) / SCATTER / f"{name}{SHUFFLE}"):
        return -1  # an earlier attempt finished it
    table = pq.read_table(task.path, columns=list(dict.fromkeys(["doc_id", task.key])))
    rows = _first_rows(table.column(task.key).to_pylist())
    table = table.take(pa.array(rows, pa.int64()))
    n = table.num_rows
    table = table.append_column("tier", pa.array([task.tier] * n, pa.int32())).append_column(
        "source", pa.array([task.source] * n, pa.int32())).append_column(
        "part", pa.array([task.part] * n, pa.int32())).append_column("row", pa.array(rows, pa.int64()))
    write_partitioned(Path(task.scratch) / SCATTER, name, table, bucket_of(table.column(task.key), task.buckets),
                      task.buckets, keep_empty=True)
    return n


def _decide(task: _Decide) -> int:
    """Round 2: sort one bucket and write its duplicates and the doc_id kept instead, partitioned by input part:
    one shuffle file."""
    scratch = Path(task.scratch)
    if is_whole(scratch / DECIDED / f"{task.bucket:05d}{SHUFFLE}"):
        return -1
    found = len(shuffle_files(scratch / SCATTER))
    if found != task.writers:
        raise RuntimeError(f"exact dedup shuffle {scratch}: {found} of {task.writers} scatter files; "
                           "delete the folder and re-run")
    tables = [t for _, t in read_segments(scratch / SCATTER, task.bucket)]
    dups = _duplicates(pa.concat_tables(tables), task.key) if tables else None
    if dups is None or dups.num_rows == 0:
        dups, part_of = DUPLICATE_SCHEMA.empty_table(), np.empty(0, np.int64)
    else:
        starts = np.array(task.starts, np.int64)
        part_of = starts[dups.column("source").to_numpy()] + dups.column("part").to_numpy()
        dups = dups.select(DUPLICATE_SCHEMA.names).cast(DUPLICATE_SCHEMA)
    write_partitioned(scratch / DECIDED, f"{task.bucket:05d}", dups, part_of, task.starts[-1], keep_empty=True)
    return dups.num_rows


def _duplicates(table: pa.Table, key: str) -> pa.Table:
    """A bucket's rows that repeat an earlier row's key, in (key, tier, source, part, row) order, each with the
    doc_id of its group's first row."""
    table = table.sort_by([(key, "ascending"), ("tier", "ascending"), ("source", "ascending"),
                           ("part", "ascending"), ("row", "ascending")])
    hashes, ids = table.column(key).to_pylist(), table.column("doc_id").to_pylist()
    kept_of, is_dup, previous, first = [], [], None, None
    for h, doc_id in zip(hashes, ids):
        is_dup.append(h == previous)  # every row of a group but its first
        if h != previous:
            previous, first = h, doc_id
        kept_of.append(first)
    return table.append_column("duplicate_of", pa.array(kept_of, pa.string())).filter(pa.array(is_dup, pa.bool_()))


def _layout(sources: list[HashSource], scratch: Path) -> tuple[tuple[int, ...], int]:
    """Each source's first part in the numbering of all parts (and their total, last), and the bucket count: from
    a whole scatter file's footer when an earlier target or attempt wrote one (no need to read every part's
    metadata again), else from the row count."""
    starts = [0]
    for s in sources:
        starts.append(starts[-1] + len(s.parts))
    for path in shuffle_files(scratch / SCATTER):
        if is_whole(path):
            return tuple(starts), partitions_of(path)
    rows = sum(pq.ParquetFile(p).metadata.num_rows for s in sources for p in s.parts)
    return tuple(starts), max(1, math.ceil(rows / ROWS_PER_BUCKET))


def find_duplicates(sources: list[HashSource], scratch: Path, engine: Engine, key: str = "content_hash",
                    progress: bool = True, label: str = "exact dedup") -> list[list[DuplicateRows]]:
    """Rounds 1 and 2 (scatter, decide) over every part of `sources`. Returns, per source and part, where
    `duplicates_in` finds the part's rows that repeat an earlier row's `key` and the doc_id of the row kept.

    Each task writes one shuffle file (`kiln.dedup.shuffle`): parts + buckets files in all, none flushed to disk.
    A task whose file is already whole is done: a run stopped at any point (a SIGKILLed worker, a crashed driver, a
    power loss) resumes where it was, and a shuffle already complete costs only the check of its decide files."""
    scratch = Path(scratch)
    starts, buckets = _layout(sources, scratch)
    where = [[DuplicateRows(str(scratch / DECIDED), starts[i] + j, buckets) for j in range(len(s.parts))]
             for i, s in enumerate(sources)]
    if all(is_whole(scratch / DECIDED / f"{b:05d}{SHUFFLE}") for b in range(buckets)):
        return where
    scatter = [_Scatter(p, i, s.tier, j, buckets, str(scratch), key) for i, s in enumerate(sources)
               for j, p in enumerate(s.parts)]
    engine.map_parts(_scatter, scatter, desc=f"{label}: hash buckets", progress=progress,
                     size=lambda t: os.path.getsize(t.path))
    engine.map_parts(_decide, [_Decide(b, str(scratch), key, starts, len(scatter)) for b in range(buckets)],
                     desc=f"{label}: decide", progress=progress)
    return where


def duplicates_in(where: DuplicateRows | None, keys: list, doc_ids: list[str]) -> dict[int, str]:
    """A part's duplicate rows (from `find_duplicates`; None: no dedup, none): row -> doc_id of the copy kept, given
    the part's `keys` and `doc_ids` (row order). One segment of each decide task's file names the part's first rows
    of a key that repeat an earlier copy; a later row of a key in the part repeats the same copy as its first row
    (which is that copy when the segment does not name it)."""
    if where is None:
        return {}
    found = len(shuffle_files(Path(where.folder)))
    if found != where.buckets:  # a missing file would silently keep its duplicates
        raise RuntimeError(f"exact dedup shuffle {where.folder}: {found} of {where.buckets} decide files; "
                           "delete the folder and re-run")
    duplicates: dict[int, str] = {}
    for _, found in read_segments(Path(where.folder), where.partition):
        duplicates.update(zip(found.column("row").to_pylist(), found.column("duplicate_of").to_pylist()))
    first: dict = {}
    for row, key in enumerate(keys):
        head = first.setdefault(key, row)
        if head != row:
            duplicates[row] = duplicates.get(head, doc_ids[head])
    return duplicates


def _apply(task: _Apply) -> StageStats:
    return StageStats.from_dict(resume_part(task.kept_path, lambda: _apply_part(task).to_dict(with_lengths=True)))


def _apply_part(task: _Apply) -> StageStats:
    table = pq.read_table(task.input_path)
    duplicates = duplicates_in(task.duplicates, table.column("content_hash").to_pylist(),
                               table.column("doc_id").to_pylist()) if task.duplicates else {}
    stats = StageStats()
    step = stats.step(DEDUP_STAGE)
    is_dup = pa.array([row in duplicates for row in range(table.num_rows)], type=pa.bool_())
    copy_of = [duplicates[row] for row in range(table.num_rows) if row in duplicates]
    kept, dropped = table.filter(pc.invert(is_dup)), table.filter(is_dup)
    n_chars = pc.utf8_length(table.column("text")).to_pylist()
    stats.docs_in = step.docs_in = table.num_rows
    stats.chars_in = step.chars_in = sum(n_chars)
    write_parquet_atomic(Path(task.kept_path), kept)
    kept_lengths = pc.utf8_length(kept.column("text")).to_pylist()
    stats.docs_out, stats.chars_out = kept.num_rows, sum(kept_lengths)
    stats.lengths_out.extend(kept_lengths)
    if dropped.num_rows:
        ids = dropped.column("doc_id").to_pylist()
        lengths = pc.utf8_length(dropped.column("text")).to_pylist()
        step.dropped[DUPLICATE] += len(ids)
        step.chars_dropped[DUPLICATE] += sum(lengths)
        stats.lengths_dropped.extend(lengths)
        rows = dropped.to_pylist()
        for row, kept_id in zip(rows[:task.examples_per_reason], copy_of):
            stats.add_example(DUPLICATE, row["doc_id"], task.examples_per_reason, f"(copy of {kept_id})",
                              example_excerpt(row["text"], task.rejected_text))
        rejected = [rejected_row(row, DEDUP_STAGE, DUPLICATE, task.rejected_text, duplicate_of=kept_id)
                    for row, kept_id in zip(rows, copy_of)]
        write_parquet_atomic(Path(task.rejected_path), pa.Table.from_pylist(rejected, schema=REJECTED_SCHEMA))
    return stats


def exact_dedup(sources: list[HashSource], target: int, writer, scratch: Path, engine: Engine = SERIAL,
                enabled: bool = True, examples_per_reason: int = 3, progress: bool = True,
                label: str = "exact dedup", rejected_text: RejectedText = "none") -> StageStats:
    """Deduplicate `sources[target]` against all `sources` (itself included), writing its kept documents and
    rejected duplicates through `writer` (`enabled=False`: keep everything; `rejected_text`: kiln.common.removals).

    `scratch` holds the shuffle, which serves every target of the same `sources`: the partitions of one refresh
    share one (other processes included), so the corpus is shuffled once per refresh, not once per source.
    A file lock lets one process at a time in; the first one shuffles, later ones find it done."""
    scratch = Path(scratch)
    with FileLock(f"{scratch}.lock"):
        scratch.mkdir(parents=True, exist_ok=True)
        # A no-op when an earlier target (or attempt) finished it.
        where = find_duplicates(sources, scratch, engine, progress=progress, label=label) if enabled else None
        apply = [_Apply(p, where[target][j] if where else None, str(writer.next_path("documents")),
                        str(writer.next_path("rejected")), examples_per_reason, rejected_text)
                 for j, p in enumerate(sources[target].parts)]
        total = StageStats()
        for stats in engine.map_parts(_apply, apply, desc=label, progress=progress,
                                      size=lambda t: os.path.getsize(t.input_path)):
            total.merge(stats, examples_per_reason)
    return total


def remove_shuffle(scratch: Path, wait: bool = True) -> bool:
    """Remove a shared shuffle no target needs any more, once no process uses it (`wait=False`: only if none
    does now). Returns whether it was removed."""
    with lock_then_remove(f"{scratch}.lock", wait) as held:
        if held:
            shutil.rmtree(scratch, ignore_errors=True)
        return held


def stale_shuffles(current: Path, key_chars: int = 16) -> list[Path]:
    """The other shuffles of `current`'s refresh (`<prefix><refresh>-<resume key of key_chars>`): made for inputs
    that have changed since. Matched whole: refresh `week1`'s glob also finds refresh `week1-fix`'s, in use or
    about to be reused by its next source."""
    prefix = current.name[:-key_chars]
    return [p for p in current.parent.glob(f"{prefix}*")
            if p.is_dir() and p != current and len(p.name) == len(current.name)]
