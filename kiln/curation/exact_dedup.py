"""Exact deduplication as a shuffle: documents whose normalized text hashes alike, across every source of a refresh
and every earlier refresh, keep one copy.

The copy kept is the one from the best quality tier (earlier refreshes are tier 0: they may already be in token
shards), then the source listed first, then the earliest document (part, then row) in that source. No process
holds the corpus's hashes; three rounds of part-sized tasks on the engine:

1. scatter: each input part's (doc_id, content_hash) rows go to hash buckets (files under `scratch`);
2. decide: each bucket, sorted by (hash, tier, source, part, row), names the duplicates and the copy kept, written
   back per input part;
3. apply: each part of the partition being curated splits into kept documents and rejected duplicates.

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

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from filelock import FileLock

from kiln.common.removals import RejectedText, example_excerpt, rejected_row
from kiln.common.stats import StageStats
from kiln.common.storage import lock_then_remove, resume_part, write_parquet_atomic
from kiln.curation.documents import REJECTED_SCHEMA
from kiln.engine import SERIAL, Engine

DEDUP_STAGE = "exact_dedup"
DUPLICATE = f"{DEDUP_STAGE}.duplicate"
ROWS_PER_BUCKET = 500_000  # a bucket is sorted in one task: this bounds its memory (~100 MB)


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


@dataclass(frozen=True)
class _Apply:
    input_path: str
    duplicates_dir: str
    kept_path: str
    rejected_path: str
    examples_per_reason: int
    rejected_text: RejectedText


def _part_key(source: int, part: int) -> str:
    return f"{source:05d}-{part:06d}"


def _bucket_of(hashes: pa.ChunkedArray, buckets: int) -> list[int]:  # hex digests: their head is uniform
    return [int(h[:8], 16) % buckets for h in hashes.to_pylist()]


def _scatter(task: _Scatter) -> int:
    marker = Path(task.scratch) / f"scatter-{_part_key(task.source, task.part)}"
    return resume_part(marker, lambda: {"rows": _scatter_part(task)})["rows"]


def _scatter_part(task: _Scatter) -> int:
    table = pq.read_table(task.path, columns=list(dict.fromkeys(["doc_id", task.key])))
    n = table.num_rows
    table = table.append_column("tier", pa.array([task.tier] * n, pa.int32())).append_column(
        "source", pa.array([task.source] * n, pa.int32())).append_column(
        "part", pa.array([task.part] * n, pa.int32())).append_column("row", pa.array(range(n), pa.int64()))
    bucket = pa.array(_bucket_of(table.column(task.key), task.buckets), pa.int32())
    for b in pc.unique(bucket).to_pylist():
        folder = Path(task.scratch) / f"bucket-{b:05d}"
        folder.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(folder / f"{_part_key(task.source, task.part)}.parquet",
                             table.filter(pc.equal(bucket, b)))
    return n


def _decide(task: _Decide) -> int:
    """Sort one bucket and write, per input part, its duplicates and the doc_id kept instead."""
    marker = Path(task.scratch) / f"decide-{task.bucket:05d}"
    return resume_part(marker, lambda: {"duplicates": _decide_bucket(task)})["duplicates"]


def _decide_bucket(task: _Decide) -> int:
    folder = Path(task.scratch) / f"bucket-{task.bucket:05d}"
    if not folder.is_dir():
        return 0
    table = pa.concat_tables([pq.read_table(p) for p in sorted(folder.glob("*.parquet"))])
    table = table.sort_by([(task.key, "ascending"), ("tier", "ascending"), ("source", "ascending"),
                           ("part", "ascending"), ("row", "ascending")])
    hashes, ids = table.column(task.key).to_pylist(), table.column("doc_id").to_pylist()
    kept_of, is_dup, previous, first = [], [], None, None
    for h, doc_id in zip(hashes, ids):
        is_dup.append(h == previous)  # every row of a group but its first
        if h != previous:
            previous, first = h, doc_id
        kept_of.append(first)
    dups = table.append_column("duplicate_of", pa.array(kept_of, pa.string())).filter(pa.array(is_dup, pa.bool_()))
    for source, part in {(s, p) for s, p in zip(dups.column("source").to_pylist(), dups.column("part").to_pylist())}:
        mine = dups.filter(pc.and_(pc.equal(dups.column("source"), source), pc.equal(dups.column("part"), part)))
        folder = Path(task.scratch) / "duplicates" / _part_key(source, part)
        folder.mkdir(parents=True, exist_ok=True)
        write_parquet_atomic(folder / f"bucket-{task.bucket:05d}.parquet", mine.select(["row", "duplicate_of"]))
    return dups.num_rows


def find_duplicates(sources: list[HashSource], scratch: Path, engine: Engine, key: str = "content_hash",
                    progress: bool = True, label: str = "exact dedup") -> None:
    """Rounds 1 and 2 (scatter, decide) over every part of `sources`: afterwards `duplicates_in` names, for each
    part, its rows that repeat an earlier row's `key` and the doc_id of the row kept."""
    rows = sum(pq.ParquetFile(p).metadata.num_rows for s in sources for p in s.parts)
    buckets = max(1, math.ceil(rows / ROWS_PER_BUCKET))
    scatter = [_Scatter(p, i, s.tier, j, buckets, str(scratch), key) for i, s in enumerate(sources)
               for j, p in enumerate(s.parts)]
    engine.map_parts(_scatter, scatter, desc=f"{label}: hash buckets", progress=progress,
                     size=lambda t: os.path.getsize(t.path))
    engine.map_parts(_decide, [_Decide(b, str(scratch), key) for b in range(buckets)], desc=f"{label}: decide",
                     progress=progress)


def duplicates_dir(scratch: Path, source: int, part: int) -> str:
    return str(Path(scratch) / "duplicates" / _part_key(source, part))


def duplicates_in(folder: str) -> dict[int, str]:
    """A part's duplicate rows (from `find_duplicates`): row -> doc_id of the copy kept. A few files, one per bucket."""
    duplicates: dict[int, str] = {}
    for path in sorted(Path(folder).glob("*.parquet")):
        found = pq.read_table(path)
        duplicates.update(zip(found.column("row").to_pylist(), found.column("duplicate_of").to_pylist()))
    return duplicates


def _apply(task: _Apply) -> StageStats:
    return StageStats.from_dict(resume_part(task.kept_path, lambda: _apply_part(task).to_dict(with_lengths=True)))


def _apply_part(task: _Apply) -> StageStats:
    table = pq.read_table(task.input_path)
    duplicates = duplicates_in(task.duplicates_dir)
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
        if enabled:
            resume_part(scratch / "shuffle", lambda: find_duplicates(sources, scratch, engine, progress=progress,
                                                                     label=label) or {})
        apply = [_Apply(p, duplicates_dir(scratch, target, j), str(writer.next_path("documents")),
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
