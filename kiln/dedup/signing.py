"""The signature stage: curated Parquet parts signed as engine tasks (`kiln.dedup.minhash.sign_texts`), one
signature part per group of consecutive input parts, with the shingle counts gathered on the way and, when
boilerplate lines are on, a lines file per signature part: in how many of its documents each distinct line occurs
(summed over a refresh's every part by kiln.dedup.boilerplate, in hash ranges).
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.config import BoilerplateLines, NearDedup
from kiln.common.storage import resume_part, write_parquet_atomic
from kiln.dedup.minhash import HASH_COLUMNS, line_hashes, pack_shingles, sign_texts, signature_schema
from kiln.engine import SERIAL, Engine

LINES_SCHEMA = pa.schema([pa.field("line_hash", pa.uint64(), nullable=False),
                          pa.field("documents", pa.int64(), nullable=False)])
# A lines file is sorted by line_hash in row groups of this many rows, whose min/max statistics let a reader of one
# hash range skip the rest of the file.
LINES_ROW_GROUP = 65_536


_SIGN_ROWS = 2048  # documents per `sign_texts` call (it splits larger batches into ~1 MB numpy passes itself)


@dataclass(frozen=True)
class _SignTask:
    input_paths: tuple[str, ...]  # consecutive curated parts: one signature part
    output_path: str
    near: str  # NearDedup as JSON (picklable, exact)
    lines: str | None  # BoilerplateLines as JSON, when line counting is on
    lines_path: str | None  # where the part's line counts go, when it is


def _sign_part(task: _SignTask) -> tuple[int, Counter]:
    done = resume_part(task.output_path, lambda: _sign(task))
    return done["documents"], Counter({int(k): n for k, n in done["shingle_counts"].items()})


def _sign(task: _SignTask) -> dict:
    near = NearDedup.model_validate_json(task.near)
    lines = BoilerplateLines.model_validate_json(task.lines) if task.lines else None
    ids, sources, chars, signatures, shingle_sets = [], [], [], [], []
    line_counts: Counter = Counter()
    batches = (batch for path in task.input_paths
               for batch in pq.ParquetFile(path).iter_batches(batch_size=_SIGN_ROWS, columns=["doc_id", "source", "text"],
                                                             use_threads=False))
    for batch in batches:
        texts = batch.column("text").to_pylist()
        sigs, values, offsets = sign_texts(texts, near, near.scheme)  # the whole batch at once
        ids.append(batch.column("doc_id"))
        sources.append(batch.column("source"))
        chars.append(pc.utf8_length(batch.column("text")).to_numpy())  # code points, as len(str)
        signatures.append(sigs)
        shingle_sets.append((values, offsets))
        if lines is not None:
            for text in texts:
                line_counts.update(line_hashes(text, lines))
    table = pa.table({
        "doc_id": _strings(ids),
        "source": _strings(sources),
        "chars": pa.array(np.concatenate(chars) if chars else np.empty(0, np.int64), pa.int64()),
        "signature": pa.FixedSizeListArray.from_arrays(
            pa.array(np.concatenate(signatures).reshape(-1) if signatures else np.empty(0, np.uint32), pa.uint32()),
            near.num_perm),
        "shingles": _concat_shingles(shingle_sets),
    }, schema=signature_schema(near.num_perm))
    write_parquet_atomic(Path(task.output_path), table, hash_columns=HASH_COLUMNS)
    if lines is not None:
        write_parquet_atomic(Path(task.lines_path), lines_table(np.fromiter(line_counts.keys(), np.uint64),
                                                                np.fromiter(line_counts.values(), np.int64)),
                             row_group_size=LINES_ROW_GROUP)
    sizes = np.concatenate([np.diff(offsets) for _, offsets in shingle_sets]) if shingle_sets else np.zeros(0, int)
    return {"documents": table.num_rows,
            "shingle_counts": {str(k): int(n) for k, n in zip(*np.unique(sizes, return_counts=True))}}


def _strings(arrays: list[pa.Array]) -> pa.Array:
    return pa.concat_arrays([a.cast(pa.string()) for a in arrays]) if arrays else pa.array([], pa.string())


def _concat_shingles(parts: list[tuple[np.ndarray, np.ndarray]]) -> pa.LargeBinaryArray:
    """One shingles column from (values, offsets) pairs, each as `sign_texts` returns them."""
    if not parts:
        return pack_shingles(np.empty(0, np.uint32), np.zeros(1, np.int64))
    starts = np.cumsum([0] + [v.size for v, _ in parts[:-1]])
    offsets = np.concatenate([parts[0][1][:1]] + [o[1:] + s for (_, o), s in zip(parts, starts)])
    return pack_shingles(np.concatenate([v for v, _ in parts]), offsets)


def shingles_column(arrays: list[np.ndarray]) -> pa.LargeBinaryArray:
    """The same column from one shingle array per document."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    return pack_shingles(np.concatenate(arrays) if arrays else np.empty(0, np.uint32), offsets)


def signature_groups(input_parts: Sequence[Path], rows: int) -> list[tuple[Path, ...]]:
    """Consecutive input parts joined until a group holds at least `rows` documents (the last may hold fewer): one
    signature part each. Signature parts are the unit of every near-dup task after them, and each task's shuffle
    writes a file per partition: curated parts of a few hundred documents made ~30,000 files per 100,000 documents,
    parts of 5,000 a tenth of that, and 4x less CPU to decide the same."""
    groups, current, n = [], [], 0
    for part in input_parts:
        current.append(Path(part))
        n += pq.ParquetFile(part).metadata.num_rows
        if n >= rows:
            groups.append(tuple(current))
            current, n = [], 0
    return groups + [tuple(current)] if current else groups


@dataclass
class Signed:
    documents: int
    shingle_counts: Counter  # documents per number of distinct shingles

    def median_shingles(self) -> float:
        """Distinct shingles of the median document (the mean of the two middle ones for an even count)."""
        sizes = sorted(self.shingle_counts)
        seen = np.cumsum([self.shingle_counts[k] for k in sizes])
        if not sizes:
            return 0.0
        total = int(seen[-1])
        lo, hi = (sizes[int(np.searchsorted(seen, rank, "right"))] for rank in ((total - 1) // 2, total // 2))
        return (lo + hi) / 2


def compute_signatures(input_groups: Sequence[Sequence[Path]], output_paths: Sequence[Path], near: NearDedup,
                       lines: BoilerplateLines | None = None, engine: Engine = SERIAL, progress: bool = True,
                       label: str = "minhash", lines_paths: Sequence[Path] | None = None) -> Signed:
    """One signature part per group of input parts (`signature_groups`; the unit of parallel work), and with
    `lines`, the part's line counts at the same place of `lines_paths`."""
    if lines is not None and (lines_paths is None or len(lines_paths) != len(output_paths)):
        raise ValueError("compute_signatures: boilerplate lines are on: give a lines path per signature part")
    tasks = [_SignTask(tuple(map(str, group)), str(o), near.model_dump_json(), lines.model_dump_json() if lines else None,
                       str(lines_paths[k]) if lines else None)
             for k, (group, o) in enumerate(zip(input_groups, output_paths))]
    out = Signed(0, Counter())
    for n, shingle_counts in engine.map_parts(_sign_part, tasks, desc=label, progress=progress,
                                              size=lambda t: sum(os.path.getsize(p) for p in t.input_paths)):
        out.documents += n
        out.shingle_counts.update(shingle_counts)
    return out


def lines_table(hashes: np.ndarray, documents: np.ndarray) -> pa.Table:
    """Line hashes and their document counts, sorted by hash (LINES_SCHEMA)."""
    order = np.argsort(hashes, kind="stable")
    return pa.table({"line_hash": pa.array(hashes[order], pa.uint64()),
                     "documents": pa.array(documents[order], pa.int64())}, schema=LINES_SCHEMA)
