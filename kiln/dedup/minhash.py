"""Shingles, MinHash signatures (datasketch) and the LSH bands x rows choice.

A document becomes the set of hashes of its normalized word n-grams ("shingles"); its MinHash
signature estimates Jaccard similarity between such sets. Signatures and shingle sets are stored as
plain arrays (Parquet lists), never pickled, so any later run (or another machine) can verify a
candidate pair exactly.
"""

from __future__ import annotations

import hashlib
import os
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import LeanMinHash, MinHash

from kiln.config import BoilerplateLines, NearDedup
from kiln.dedup.text import normalized_words
from kiln.engine import SERIAL, Engine
from kiln.storage import resume_part, write_parquet_atomic

SCHEME = "affine32"  # datasketch >= 2.0: 32-bit hash values, collision-free permutations

SIGNATURE_COLUMNS = ["doc_id", "source", "chars", "signature", "shingles"]


def signature_schema(num_perm: int) -> pa.Schema:
    return pa.schema([
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("chars", pa.int64(), nullable=False),
        pa.field("signature", pa.list_(pa.uint32(), num_perm), nullable=False),
        pa.field("shingles", pa.large_list(pa.uint32()), nullable=False),  # sorted, unique
    ])


LINES_SCHEMA = pa.schema([pa.field("line_hash", pa.uint64(), nullable=False),
                          pa.field("documents", pa.int64(), nullable=False)])


def _hash32(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little")


def shingle_hashes(text: str, settings: NearDedup) -> np.ndarray:
    """Sorted unique 32-bit hashes of the document's word n-grams (all its words if it has fewer)."""
    w = normalized_words(text, settings.normalization)
    n = settings.shingle_size
    grams = [" ".join(w[i:i + n]) for i in range(max(len(w) - n + 1, 1))] if w else [""]
    return np.unique(np.fromiter((_hash32(g.encode("utf-8", "surrogatepass")) for g in grams),
                                 dtype=np.uint32, count=len(grams)))


@lru_cache(maxsize=4)
def _template(num_perm: int, seed: int) -> MinHash:
    """Permutations are drawn once per (num_perm, seed); every signature reuses them."""
    return MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME)


def signature(shingles: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    t = _template(num_perm, seed)
    m = MinHash(num_perm=num_perm, seed=seed, hashfunc=int, permutations=t.permutations, scheme=SCHEME)
    m.update_batch(shingles.tolist())
    return m.hashvalues.astype(np.uint32, copy=False)


def lean(sig: np.ndarray, seed: int) -> LeanMinHash:
    return LeanMinHash(seed=seed, hashvalues=sig, scheme=SCHEME)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two sorted unique shingle-hash arrays."""
    inter = np.intersect1d(a, b, assume_unique=True).size
    union = a.size + b.size - inter
    return inter / union if union else 1.0


def estimated_jaccard(sig: np.ndarray, others: np.ndarray) -> np.ndarray:
    """MinHash estimate of Jaccard between one signature and each row of `others` (vectorized)."""
    return (others == sig).mean(axis=1)


# -------------------------------------------------------------------------------------- bands x rows

def candidate_probability(j: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """Probability that a pair with Jaccard `j` shares at least one LSH band (the S-curve)."""
    return 1.0 - (1.0 - np.power(j, rows)) ** bands


def choose_bands(num_perm: int, threshold: float, min_recall: float) -> tuple[int, int]:
    """The bands x rows with the fewest candidates below the threshold among those that find at least
    `min_recall` of pairs *at* the threshold. Candidates are verified exactly, so recall is what
    matters; a plain LSH tuned for threshold 0.8 misses a large share of pairs at J 0.80-0.85."""
    grid = np.linspace(0.0, threshold, 201)
    best, best_fp = None, float("inf")
    for rows in range(1, num_perm + 1):
        for bands in range(2, num_perm // rows + 1):
            if candidate_probability(threshold, bands, rows) < min_recall:
                continue
            fp = float(np.trapezoid(candidate_probability(grid, bands, rows), grid))
            if fp < best_fp - 1e-12:
                best, best_fp = (bands, rows), fp
            break  # more bands only adds candidates for this row count
    if best is None:
        raise ValueError(f"no bands x rows within num_perm={num_perm} reaches recall {min_recall} at Jaccard "
                         f"{threshold}; raise dedup.near.num_perm or lower dedup.near.min_recall")
    return best


def bands_rows(settings: NearDedup) -> tuple[int, int]:
    if settings.bands is not None:
        return settings.bands, settings.rows
    return choose_bands(settings.num_perm, settings.threshold, settings.min_recall)


# ------------------------------------------------------------------------------------ signature stage

def line_hash(stripped_line: str) -> int:
    return int.from_bytes(hashlib.blake2b(stripped_line.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little")


def line_hashes(text: str, settings: BoilerplateLines) -> set[int]:
    """Hashes of the document's distinct non-trivial lines (whitespace-stripped)."""
    return {line_hash(s) for line in text.splitlines() if len(s := line.strip()) >= settings.min_chars}


@dataclass(frozen=True)
class _SignTask:
    input_path: str
    output_path: str
    near: str  # NearDedup as JSON (picklable, exact)
    lines: str | None  # BoilerplateLines as JSON, when line counting is on


def _sign_part(task: _SignTask) -> tuple[int, Counter]:
    done = resume_part(task.output_path, lambda: _sign(task))
    return done["documents"], Counter({int(h): n for h, n in done["lines"].items()})


def _sign(task: _SignTask) -> dict:
    near = NearDedup.model_validate_json(task.near)
    lines = BoilerplateLines.model_validate_json(task.lines) if task.lines else None
    columns = {c: [] for c in SIGNATURE_COLUMNS}
    line_counts: Counter = Counter()
    for batch in pq.ParquetFile(task.input_path).iter_batches(batch_size=500, columns=["doc_id", "source", "text"]):
        for doc_id, source, text in zip(*(batch.column(c).to_pylist() for c in ("doc_id", "source", "text"))):
            sh = shingle_hashes(text, near)
            columns["doc_id"].append(doc_id)
            columns["source"].append(source)
            columns["chars"].append(len(text))
            columns["signature"].append(signature(sh, near.num_perm, near.seed))
            columns["shingles"].append(sh)
            if lines is not None:
                line_counts.update(line_hashes(text, lines))
    schema = signature_schema(near.num_perm)
    table = pa.table({
        "doc_id": pa.array(columns["doc_id"], pa.string()),
        "source": pa.array(columns["source"], pa.string()),
        "chars": pa.array(columns["chars"], pa.int64()),
        "signature": pa.FixedSizeListArray.from_arrays(
            pa.array(np.concatenate(columns["signature"]) if columns["signature"] else np.empty(0, np.uint32)),
            near.num_perm),
        "shingles": _list_array(columns["shingles"]),
    }, schema=schema)
    write_parquet_atomic(Path(task.output_path), table)
    return {"documents": table.num_rows, "lines": {str(h): n for h, n in line_counts.items()}}


def _list_array(arrays: list[np.ndarray]) -> pa.LargeListArray:
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    values = np.concatenate(arrays) if arrays else np.empty(0, np.uint32)
    return pa.LargeListArray.from_arrays(pa.array(offsets), pa.array(values, pa.uint32()))


def compute_signatures(input_parts: list[Path], output_paths: list[Path], near: NearDedup,
                       lines: BoilerplateLines | None = None, engine: Engine = SERIAL, progress: bool = True,
                       label: str = "minhash") -> tuple[int, Counter]:
    """Signature parts, one per input part (the unit of parallel work); returns (documents, line counts)
    where line counts are documents per boilerplate-line hash, when `lines` is given."""
    tasks = [_SignTask(str(i), str(o), near.model_dump_json(), lines.model_dump_json() if lines else None)
             for i, o in zip(input_parts, output_paths)]
    total, line_counts = 0, Counter()
    for n, counts in engine.map_parts(_sign_part, tasks, desc=label, progress=progress,
                                      size=lambda t: os.path.getsize(t.input_path)):
        total += n
        line_counts.update(counts)
    return total, line_counts


def lines_table(counts: Counter) -> pa.Table:
    return pa.table({"line_hash": pa.array(list(counts.keys()), pa.uint64()),
                     "documents": pa.array(list(counts.values()), pa.int64())}, schema=LINES_SCHEMA)
