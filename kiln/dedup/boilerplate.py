"""Boilerplate lines: lines that recur across many documents (navigation, banners, license headers).

The signature stage counts, per signature part, in how many documents each distinct line occurs (a lines file,
sorted by hash); `boilerplate_hashes` sums the counts over every part of every source of a refresh, and a line seen
in more than `min_documents` documents is removed from the surviving documents. Lines are compared
whitespace-stripped, so indentation does not hide a repeat.

The sum runs as engine tasks, one per range of the 64-bit hash space: a task reads only its range of each lines
file (the files' row-group statistics skip the rest) and holds about `rows_per_task` rows, whatever the size of the
refresh. A refresh has as many distinct lines as the web has, so no one process may hold them all.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.config import BoilerplateLines
from kiln.common.manifest import write_json_atomic
from kiln.dedup.minhash import line_hash
from kiln.engine import SERIAL, Engine


# The settings a version's line counts depend on (minhash_signatures), and its boilerplate hashes (dedup_index).
COUNTED_WITH = ("enabled", "min_chars")
DECIDED_WITH = ("enabled", "min_documents", "min_chars")


class BoilerplateMismatch(ValueError):
    """Line counts or boilerplate hashes made with other `dedup.boilerplate_lines` settings than the config's."""


def check_lines_settings(name: str, recorded: dict | None, lines: BoilerplateLines, keys: tuple[str, ...],
                         asset: str) -> None:
    """With boilerplate lines on, refuse the version `name` made with other settings (`keys`, as its manifest's
    config recorded them): a version made with them off has no counts, and lines counted or decided by other rules
    would be stripped by them (a config change does not make the version stale in Dagster)."""
    if not lines.enabled:
        return
    made, wanted = {k: (recorded or {}).get(k) for k in keys}, {k: getattr(lines, k) for k in keys}
    if made != wanted:
        differ = ", ".join(f"{k} {made[k]} (config: {wanted[k]})" for k in keys if made[k] != wanted[k])
        raise BoilerplateMismatch(f"{name} was made with other dedup.boilerplate_lines settings than the config's "
                                  f"({differ}): re-materialize {asset} with the config first (or restore those "
                                  f"settings)")


ROWS_PER_TASK = 1 << 22  # line-count rows one summing task reads: ~64 MiB of columns, and as much to sort them


@dataclass(frozen=True)
class _RangeTask:
    files: str  # a JSON list of the lines files: written once, so a task stays a few hundred bytes
    first: int  # the hash range, both ends included
    last: int
    min_documents: int


def _sum_range(task: _RangeTask) -> tuple[np.ndarray, np.ndarray]:
    """The hashes of the range whose document counts, summed over every lines file, exceed min_documents, with
    their sums."""
    in_range = (pc.field("line_hash") >= pa.scalar(task.first, pa.uint64())) & \
        (pc.field("line_hash") <= pa.scalar(task.last, pa.uint64()))
    tables = [pq.read_table(f, columns=["line_hash", "documents"], filters=in_range)
              for f in json.loads(Path(task.files).read_text(encoding="utf-8"))]
    hashes = np.concatenate([t.column("line_hash").to_numpy() for t in tables] or [np.zeros(0, np.uint64)])
    counts = np.concatenate([t.column("documents").to_numpy() for t in tables] or [np.zeros(0, np.int64)])
    order = np.argsort(hashes, kind="stable")
    hashes, counts = hashes[order], counts[order]
    starts = np.flatnonzero(np.r_[True, hashes[1:] != hashes[:-1]]) if len(hashes) else np.zeros(0, np.int64)
    sums = np.add.reduceat(counts, starts) if len(hashes) else np.zeros(0, np.int64)
    over = sums > task.min_documents
    return hashes[starts][over], sums[over]


def boilerplate_hashes(files: list[Path], settings: BoilerplateLines, work: Path, engine: Engine = SERIAL,
                       rows_per_task: int = ROWS_PER_TASK, progress: bool = False) -> tuple[np.ndarray, np.ndarray]:
    """The line hashes whose document count, summed over every lines file (`files`: each source's signature parts'),
    exceeds `settings.min_documents`, sorted, with those sums: one engine task per range of hashes, each reading
    about `rows_per_task` rows. `work`: a scratch folder for the task list's file."""
    rows = sum(pq.ParquetFile(f).metadata.num_rows for f in files)
    ranges = max(1, math.ceil(rows / rows_per_task))
    work.mkdir(parents=True, exist_ok=True)
    listing = work / "lines-files.json"
    write_json_atomic(listing, json.dumps([str(f) for f in files]), flush=False)
    tasks = [_RangeTask(str(listing), (q << 64) // ranges, ((q + 1) << 64) // ranges - 1, settings.min_documents)
             for q in range(ranges)]
    results = engine.map_parts(_sum_range, tasks, desc="boilerplate lines", progress=progress)
    return (np.concatenate([h for h, _ in results] or [np.zeros(0, np.uint64)]).astype(np.uint64, copy=False),
            np.concatenate([n for _, n in results] or [np.zeros(0, np.int64)]).astype(np.int64, copy=False))


def strip_boilerplate(text: str, boilerplate: set[int], settings: BoilerplateLines) -> tuple[str, int]:
    """`text` without its boilerplate lines (line endings kept) and how many lines were removed."""
    if not boilerplate:
        return text, 0
    kept, removed = [], 0
    for line in text.splitlines(keepends=True):
        s = line.strip()
        if len(s) >= settings.min_chars and line_hash(s) in boilerplate:
            removed += 1
        else:
            kept.append(line)
    return "".join(kept), removed
