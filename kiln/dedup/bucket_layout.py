"""What the tasks of a near-dup run (`kiln.dedup.buckets`) share: how documents are numbered (nodes) and ordered
(keep-policy ranks as bytes), doc-partitions, and the Layout every task reads its inputs by, carried as a LayoutFile.

Nodes. A document of this refresh is its position in the batch (`Batch.from_tables` order: source order, then part,
then row): node = start of its part + row. A document accepted by earlier refresh r (position in `previous`) with
position `ref` in that refresh is node -1 - (r << 40 | ref). A "doc-partition" is one signature part of this
refresh, or one docs file of an earlier refresh: everything per document (shingles, records, decisions) is read or
written by doc-partition, so a task holds one part's worth of documents.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.manifest import write_json_atomic
from kiln.dedup.bucket_index import index_file, read_doc_refs, read_hash_range
from kiln.dedup.components import hash_range, overlapping, partition_of

_REF_BITS = 40
_REF_MASK = (1 << _REF_BITS) - 1


def old_node(r: int | np.ndarray, ref: int | np.ndarray) -> np.ndarray:
    return -1 - ((np.asarray(r, np.int64) << _REF_BITS) | np.asarray(ref, np.int64))


def _decode_old(nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = -1 - np.asarray(nodes, np.int64)
    return x >> _REF_BITS, x & _REF_MASK


def _sortable(columns: list[np.ndarray], n: int) -> np.ndarray:
    """(n, 8·k) bytes: each int64 column big-endian with its sign bit flipped, so bytes compare as the ints do."""
    if not columns:
        return np.zeros((n, 0), np.uint8)
    mats = [(np.asarray(c, np.int64).view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8").view(np.uint8).reshape(n, 8)
            for c in columns]
    return np.hstack(mats)


def _fixed_binary(rows: np.ndarray) -> pa.Array:
    """(n, w) uint8 rows as a binary array of n values of w bytes each."""
    n, w = rows.shape
    fixed = pa.FixedSizeBinaryArray.from_buffers(pa.binary(w), n, [None, pa.py_buffer(np.ascontiguousarray(rows))])
    return fixed.cast(pa.binary())


def new_ranks(keep: Sequence[str], tiers, source_order, seq, chars, doc_ids: pa.Array | pa.ChunkedArray,
              nodes) -> pa.Array:
    """Keep-policy sort keys as bytes (compare as `near.keep_order` sorts: the criteria, then doc_id; the batch
    position last, only to make duplicate ids total). 0x01 first: after every earlier-refresh document.
    Built column-wise in Arrow (a bytes object per document cost more than the rest of the keys round)."""
    n = len(doc_ids)
    columns = {"quality_tier": [tiers], "first_seen": [source_order, seq], "longest": [-np.asarray(chars, np.int64)]}
    head = np.hstack([np.ones((n, 1), np.uint8), _sortable([c for k in keep for c in columns[k]], n)])
    tail = np.hstack([np.zeros((n, 1), np.uint8), _sortable([nodes], n)])
    ids = doc_ids.combine_chunks() if isinstance(doc_ids, pa.ChunkedArray) else doc_ids
    # Arrow strings are UTF-8 already: their bytes are what encode("utf-8", "surrogatepass") gave.
    return pc.binary_join_element_wise(_fixed_binary(head), ids.cast(pa.binary()), _fixed_binary(tail), b"")


def old_ranks(r: int, refs: np.ndarray) -> pa.Array:
    """Earlier refresh r's documents' sort keys: 0x00 first, before every document of this refresh."""
    n = len(refs)
    return _fixed_binary(np.hstack([np.zeros((n, 1), np.uint8), _sortable([np.full(n, r), refs], n)]))


def _dir(root: str | Path, *names: str) -> Path:
    return Path(root).joinpath(*names)


# ------------------------------------------------------------------------------------------- layout

@dataclass(frozen=True)
class Earlier:
    """An earlier refresh's index folder, as the tasks need it."""

    path: str
    partitions: int
    starts: tuple[int, ...]  # its doc-part starts (positions), len parts + 1
    dp_base: int  # the doc-partition number of its docs/indexed-00000


@dataclass(frozen=True)
class Layout:
    """Everything a task needs to find its inputs (small: a few ints per part)."""

    work: str
    index: str  # this refresh's index folder
    decisions: str
    partitions: int
    parts: tuple[str, ...]
    starts: tuple[int, ...]  # batch position of each part's first row, len N + 1
    seq_starts: tuple[int, ...]  # row of each part's first row within its source
    tiers: tuple[int, ...]  # per part
    orders: tuple[int, ...]  # source order per part
    keep: tuple[str, ...]
    bands: int
    rows: int
    threshold: float
    max_bucket: int
    batch: str
    earlier: tuple[Earlier, ...]

    @property
    def n_parts(self) -> int:
        return len(self.parts)

    @property
    def doc_partitions(self) -> int:
        return self.n_parts + sum(len(e.starts) - 1 for e in self.earlier)

    def dp_of(self, nodes: np.ndarray) -> np.ndarray:
        """The doc-partition of each node: its signature part, or its earlier refresh's docs file."""
        nodes = np.asarray(nodes, np.int64)
        out = np.empty(nodes.size, np.int64)
        new = nodes >= 0
        out[new] = np.searchsorted(np.asarray(self.starts), nodes[new], "right") - 1
        if not new.all():
            r, ref = _decode_old(nodes[~new])
            res = np.empty(r.size, np.int64)
            for i, e in enumerate(self.earlier):
                sel = r == i
                res[sel] = e.dp_base + np.searchsorted(np.asarray(e.starts), ref[sel], "right") - 1
            out[~new] = res
        return out

    __call__ = dp_of  # the route of component labels

    def earlier_of(self, dp: int) -> tuple[int, int]:
        """(refresh number, its docs part) of an earlier doc-partition."""
        for r, e in enumerate(self.earlier):
            if e.dp_base <= dp < e.dp_base + len(e.starts) - 1:
                return r, dp - e.dp_base
        raise IndexError(dp)

    def doc_rows(self, dp: int, nodes: np.ndarray, columns: list[str]) -> pa.Table:
        """`columns` (among doc_id, source, shingles) of these nodes of doc-partition dp, in their order. An earlier
        refresh's docs file is read by row group (`read_doc_refs`): a refresh that touches a few of its documents
        reads a few row groups, not the whole shingle store."""
        nodes = np.asarray(nodes, np.int64)
        if dp < self.n_parts:
            return pq.read_table(self.parts[dp], columns=columns).take(pa.array(nodes - self.starts[dp]))
        r, j = self.earlier_of(dp)
        refs = _decode_old(nodes)[1]
        t = read_doc_refs(index_file(self.earlier[r].path, "docs", j), refs, columns)
        found = t.column("ref").to_numpy()  # sorted: a docs file is in ref order
        return t.drop(["ref"]).take(pa.array(np.searchsorted(found, refs)))

    def w(self, *names: str) -> Path:
        return _dir(self.work, *names)


def _earlier_partition(layout: Layout, kind: str, p: int, hash_column: str) -> list[tuple[int, pa.Table]]:
    """Rows of each earlier refresh's `kind` files in this run's partition p: the row groups of its hash range in
    the files it overlaps (`read_hash_range`), then filtered."""
    out = []
    lo, hi = hash_range(p, layout.partitions)
    for r, e in enumerate(layout.earlier):
        tables = [read_hash_range(index_file(e.path, kind, q), hash_column, [(lo, hi - 1)])
                  for q in overlapping(p, layout.partitions, e.partitions)]
        if not tables:
            continue
        t = pa.concat_tables(tables)
        mine = partition_of(t.column(hash_column).to_numpy(), layout.partitions) == p
        out.append((r, t.filter(pa.array(mine))))
    return out


@dataclass(frozen=True)
class LayoutFile:
    """A Layout as tasks carry it: written once to the run's work folder, named by its digest. The Layout is a few
    ints per part, so tasks carrying it would make the task list (pickled per task, through Ray's object store)
    grow with parts squared; a path and a digest stay a few bytes. Callable as the Layout's route."""

    path: str
    sha: str

    @classmethod
    def write(cls, layout: Layout, folder: Path) -> LayoutFile:
        data = json.dumps(dataclasses.asdict(layout), sort_keys=True).encode()
        sha = hashlib.sha256(data).hexdigest()
        path = Path(folder) / f"layout-{sha[:16]}.json"
        if not path.exists():
            write_json_atomic(path, data.decode())
        return cls(str(path), sha)

    def load(self) -> Layout:
        return _load_layout(self.path, self.sha)

    def __call__(self, nodes: np.ndarray) -> np.ndarray:
        return self.load().dp_of(nodes)


@lru_cache(maxsize=4)
def _load_layout(path: str, sha: str) -> Layout:
    """One read per worker process and layout (the digest keys the cache: a reused work folder is never stale)."""
    data = Path(path).read_bytes()
    if hashlib.sha256(data).hexdigest() != sha:
        raise RuntimeError(f"{path}: layout file changed under a running near-dup stage")
    fields = json.loads(data)
    fields["earlier"] = [Earlier(**{k: tuple(v) if isinstance(v, list) else v for k, v in e.items()})
                         for e in fields["earlier"]]
    return Layout(**{k: tuple(v) if isinstance(v, list) else v for k, v in fields.items()})


@dataclass(frozen=True)
class _Task:
    layout_file: LayoutFile
    i: int
    writers: tuple[str, ...] | None = None  # the shuffle files that hold rows for i (None: list the folder)

    @property
    def layout(self) -> Layout:
        return self.layout_file.load()
