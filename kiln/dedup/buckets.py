"""Near-duplicate decisions without one process holding the corpus: LSH band buckets as Parquet on the store,
candidate pairs, exact verification and connected components as rounds of `Engine.map_parts`, and today's
greedy keep policy (`near_dedup`, the single-process implementation this replaced: tests/old_near_dedup.py) applied
inside each component — the same decisions table.

Stages (every one a map_parts; "→ X/{q}" is a shuffle write, `kiln.dedup.shuffle`: each task writes one file
X/{its own position}.shuffle holding its rows for every partition q, so names never depend on the engine or on
arrival order, and a reader of q takes its segment of each):

  signature parts (one per input part, in source order)        earlier refreshes' index folders
   1 scan      part k: row counts per source ─ ids → ids/{p}   (ids/, buckets/, docs/ per refresh)
   2 already   ids/{p} ⋈ earlier ids (doc_id) → already/{k}          │
   3 keys      part k: the new documents' band keys → keys/{p};      │
               node table → nodes/{k}; (doc, its earlier copy) edges │
   4 pairs     keys/{p} + earlier buckets/{p} grouped by (band, key) ┘ → pairs by the first doc's part
   5 attach    distinct pairs of doc-partition d + d's shingles → by the second doc's part
   6 verify    exact Jaccard with part k's shingles; J >= threshold → component edges + hits
   7 components (kiln.dedup.components: large-star / small-star rounds) → labels by doc-partition
   8 route     members and hits → by component
   9 decide    greedy in keep order inside each component → decided rows by part
  10 count     the `candidates` column: per candidate pair, does its first doc count (old, or kept)?
  11 final     part k: decisions/decisions-k.parquet (the rows of `near_dedup`, in the same order); its kept docs
  12 persist   this refresh's index folder: buckets, ids, docs; `_index.json` last

Nodes. A document of this refresh is its position in the batch (`Batch.from_tables` order: source order, then part,
then row): node = start of its part + row. A document accepted by earlier refresh r (position in `previous`) with
position `ref` in that refresh is node -1 - (r << 40 | ref). A "doc-partition" is one signature part of this
refresh, or one docs file of an earlier refresh: everything per document (shingles, records, decisions) is read or
written by doc-partition, so a task holds one part's worth of documents.

Band keys. Band b of a signature is signature[b*rows:(b+1)*rows], as datasketch's MinHashLSH hashranges, so the
buckets are datasketch's buckets; the key is a 64-bit hash of (b, those values) (splitmix64 chained over the
values). Two different bands colliding in 64 bits add a candidate that verification rejects (about n²/2⁶⁵ per band:
~3e-8 at a million documents per band; a collision can change a decision only if that pair truly is a near-duplicate
that datasketch did not propose). Key partitions are ranges of the key's top 32 bits (`components.partition_of`), so
an earlier refresh written with another `partitions` is read by overlapping ranges.

The bucket index. Each refresh's index folder (written at the end, never rewritten):
  _index.json                  params (as `index_params`), partitions, batch, the doc-part starts, documents
  buckets/buckets-{p}.parquet  (band, key, ref) of its accepted documents, sorted; key-prefix partition p
  ids/ids-{p}.parquet          (h, doc_id, ref), h = blake2b-64 of doc_id, partition of h; sorted by doc_id
  docs/indexed-{k}.parquet     (ref, doc_id, source, quality_tier, chars, batch, shingles): its part k's kept docs
File names carry their store role (`kiln.common.storage.ROLE_PREFIX`), so the folder can be part of a dataset.
Earlier refreshes are the persistent index: a new refresh shuffles only its own signatures against them.

Buckets larger than `max_bucket`. Within a bucket, members are ordered earlier-refresh documents first, then by the
keep policy. The first `max_bucket` members are the bucket's anchors; every member is paired with each anchor
before it. A bucket of m <= max_bucket members gives exactly all m(m-1)/2 pairs (every earlier member is an
anchor); a larger one gives at most m·max_bucket pairs, never quadratic. Above the limit a pair of two non-anchors
that shares no other band is not a candidate: where boilerplate makes a bucket of millions, the documents most likely
to be kept (the first in keep order) are the anchors, and near-copies share more than one band.
Pairs between two earlier-refresh documents are never emitted (both are accepted already).

Why per-component greedy equals `near_dedup`'s global greedy. `near_dedup` walks the new documents in keep order;
document i is removed iff some verified candidate c with J(i, c) >= threshold is accepted when i comes (an
earlier-refresh document, always accepted, or a new one earlier in keep order that was kept). So i's decision
depends only on the decisions of its verified matches (J >= threshold), each earlier in keep order; by induction
it depends only on documents joined to i by a path of verified matches: i's connected component. Replaying the same
order restricted to the component (earlier refreshes' members first, all accepted) gives every member the same
decision, the same hits, hence the same `duplicate_of` (the best hit, max of (jaccard, doc_id, source)) and the same
union-find unions, which only join a document with its hits (inside the component): `cluster_id` is the same.
The unions are applied in near_dedup's order: earlier-refresh hits by doc_id, then this refresh's by batch position.
A document already accepted by an earlier refresh is linked to that earlier node by an edge,
so it shares its component and its cluster_id. `candidates` counts old candidates plus this refresh's candidates
earlier in keep order that were kept; those may lie in other components, so it is counted after the decisions
(stage 10) from the distinct candidate pairs.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import shutil
import time
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.config import NearDedup
from kiln.dedup.components import (LABEL_SCHEMA, connected_components, node_partition, overlapping, partition_of,
                                   write_edges)
from kiln.dedup.shuffle import (SCRATCH, read_partition, read_scratch, read_segments, write_partitioned,
                                write_scratch)
from kiln.dedup.minhash import HASH_COLUMNS, SCHEME, bands_rows, estimated_jaccard, jaccard, mix64
from kiln.dedup.near import ALREADY_INDEXED, DECISION_SCHEMA, KEPT, NEAR_DUPLICATE, UnionFind
from kiln.engine import SERIAL, Engine
from kiln.common.manifest import write_json_atomic
from kiln.common.storage import part_name, write_parquet_atomic

INDEX_FORMAT = "kiln-bucket-index/1"
EXAMPLE_CLUSTERS = 5  # the largest clusters named in the stats (shown with their members by the asset)
_REF_BITS = 40
_REF_MASK = (1 << _REF_BITS) - 1

KEY_SCHEMA = pa.schema([pa.field("band", pa.int32(), nullable=False), pa.field("key", pa.uint64(), nullable=False),
                        pa.field("node", pa.int64(), nullable=False), pa.field("rank", pa.binary(), nullable=False)])
BUCKET_SCHEMA = pa.schema([pa.field("band", pa.int32(), nullable=False), pa.field("key", pa.uint64(), nullable=False),
                           pa.field("ref", pa.int64(), nullable=False)])
IDS_SCHEMA = pa.schema([pa.field("h", pa.uint64(), nullable=False), pa.field("doc_id", pa.string(), nullable=False),
                        pa.field("ref", pa.int64(), nullable=False)])
NEW_IDS_SCHEMA = pa.schema([pa.field("h", pa.uint64(), nullable=False), pa.field("doc_id", pa.string(), nullable=False),
                            pa.field("node", pa.int64(), nullable=False)])
DOCS_SCHEMA = pa.schema([pa.field("ref", pa.int64(), nullable=False), pa.field("doc_id", pa.string(), nullable=False),
                         pa.field("source", pa.string()), pa.field("quality_tier", pa.int32()),
                         pa.field("chars", pa.int64()), pa.field("batch", pa.string()),
                         pa.field("shingles", pa.large_list(pa.uint32()), nullable=False)])
ALREADY_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False),
                            pa.field("old_node", pa.int64(), nullable=False)])
NODES_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False), pa.field("rank", pa.binary()),
                          pa.field("doc_id", pa.string(), nullable=False), pa.field("source", pa.string()),
                          pa.field("old_node", pa.int64())])  # old_node: the earlier copy of an already indexed doc
PAIR_SCHEMA = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.int64(), nullable=False)])
PAIR_A_SCHEMA = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.int64(), nullable=False),
                           pa.field("shingles", pa.large_list(pa.uint32()), nullable=False)])
HIT_SCHEMA = pa.schema([pa.field("comp", pa.int64(), nullable=False), pa.field("a", pa.int64(), nullable=False),
                        pa.field("b", pa.int64(), nullable=False), pa.field("jaccard", pa.float64(), nullable=False)])
MEMBER_SCHEMA = pa.schema([pa.field("comp", pa.int64(), nullable=False), pa.field("node", pa.int64(), nullable=False),
                           pa.field("rank", pa.binary(), nullable=False),
                           pa.field("doc_id", pa.string(), nullable=False),
                           pa.field("source", pa.string()), pa.field("old_node", pa.int64())])
DECIDED_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False), DECISION_SCHEMA.field("status"),
                            DECISION_SCHEMA.field("cluster_id"), DECISION_SCHEMA.field("duplicate_of"),
                            DECISION_SCHEMA.field("duplicate_of_source"), DECISION_SCHEMA.field("jaccard")])
COUNT_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False), pa.field("n", pa.int64(), nullable=False)])


# ------------------------------------------------------------------------------------------ helpers

class IndexMismatch(ValueError):
    """An index on the store was built with other MinHash parameters than the config asks for."""


def index_params(near: NearDedup) -> dict[str, Any]:
    """Everything that must stay fixed for signatures in one index to be comparable."""
    bands, rows = bands_rows(near)
    return {"num_perm": near.num_perm, "seed": near.seed, "bands": bands, "rows": rows,
            "shingle_size": near.shingle_size, "normalization": near.normalization.model_dump(mode="json"),
            "scheme": near.scheme}


def params_differences(stored: dict[str, Any], wanted: dict[str, Any], stored_as: str = "index") -> str:
    """Each index parameter that differs, named by its config key: 'dedup.near.num_perm: index 128, config 64'."""
    def keys(params: dict[str, Any]) -> dict[str, Any]:
        out = {f"dedup.near.{k}": v for k, v in params.items() if k != "normalization"}
        out.update({f"dedup.near.normalization.{k}": v for k, v in (params.get("normalization") or {}).items()})
        return out

    a, b = keys(stored), keys(wanted)
    differ = [k for k in sorted(a.keys() | b.keys()) if a.get(k) != b.get(k)]
    diff = [f"{k}: {stored_as} {a.get(k)!r}, config {b.get(k)!r}" for k in differ]
    if {"dedup.near.bands", "dedup.near.rows"} & set(differ):  # usually changed through these, not set directly
        diff.append("bands and rows follow dedup.near.threshold and min_recall when not set")
    if "dedup.near.scheme" in differ:
        diff.append(f"indexes and signatures written before dedup.near.scheme existed are {SCHEME}")
    return "; ".join(diff)


BACKFILL = ("To use the new settings, backfill: re-materialize minhash_signatures (every source) and then dedup_index "
            "for every refresh partition, from the first refresh to the last, one refresh at a time (each refresh "
            "decides against the indexes of the refreshes before it, so those must be rebuilt first; earlier "
            "refreshes' decisions may change). Or restore the index's settings in dedup.near.")


def check_index_params(path: str | Path, meta: dict[str, Any], near: NearDedup) -> None:
    """Refuse an index folder built with other MinHash parameters than `near`'s, saying which and what to do."""
    wanted = index_params(near)
    if meta["params"] != wanted:
        raise IndexMismatch(f"bucket index {path} (refresh {meta.get('batch')}) was built with other MinHash "
                            f"parameters ({params_differences(meta['params'], wanted)}): signatures would not be "
                            f"comparable. {BACKFILL}")


SIGNED_WITH = ("num_perm", "seed", "shingle_size", "normalization", "scheme")  # what a signature depends on


def signed_with(recorded_near: dict[str, Any]) -> dict[str, Any]:
    """The settings signatures were made with, from the dedup.near config their manifest recorded (a record without
    `scheme` predates the setting: SCHEME, the only one then)."""
    return {k: recorded_near.get(k, SCHEME if k == "scheme" else None) for k in SIGNED_WITH}


def check_signature_params(name: str, recorded_near: dict[str, Any], near: NearDedup) -> None:
    """Refuse signatures made with other settings than `near`'s (e.g. minhash_signatures not re-materialized after
    dedup.near.scheme changed): they would be indexed under parameters they were not made with."""
    made, wanted = signed_with(recorded_near), signed_with(near.model_dump(mode="json"))
    if made != wanted:
        raise IndexMismatch(f"{name} was made with other MinHash settings than the config's "
                            f"({params_differences(made, wanted, 'signatures')}): re-materialize "
                            f"it with the config's dedup.near first (or restore those settings)")


def old_node(r: int | np.ndarray, ref: int | np.ndarray) -> np.ndarray:
    return -1 - ((np.asarray(r, np.int64) << _REF_BITS) | np.asarray(ref, np.int64))


def _decode_old(nodes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    x = -1 - np.asarray(nodes, np.int64)
    return x >> _REF_BITS, x & _REF_MASK


def doc_id_hash(doc_ids: list[str]) -> np.ndarray:
    """A stable 64-bit hash of each doc_id (partitions the id join; stored in the index's ids files)."""
    return np.fromiter((int.from_bytes(hashlib.blake2b(d.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                                       "little") for d in doc_ids), dtype=np.uint64, count=len(doc_ids))


def band_keys(signatures: np.ndarray, bands: int, rows: int) -> np.ndarray:
    """(n, bands) uint64: per band b the hash of (b, signature[b*rows:(b+1)*rows]) — datasketch's band layout."""
    out = np.empty((len(signatures), bands), np.uint64)
    sig = signatures.astype(np.uint64)
    for b in range(bands):
        h = mix64(np.full(len(signatures), b, np.uint64))
        for j in range(b * rows, (b + 1) * rows):
            h = mix64(h ^ sig[:, j])
        out[:, b] = h
    return out


def _sortable(columns: list[np.ndarray], n: int) -> np.ndarray:
    """(n, 8·k) bytes: each int64 column big-endian with its sign bit flipped, so bytes compare as the ints do."""
    if not columns:
        return np.zeros((n, 0), np.uint8)
    mats = [(np.asarray(c, np.int64).view(np.uint64) ^ np.uint64(1 << 63)).astype(">u8").view(np.uint8).reshape(n, 8)
            for c in columns]
    return np.hstack(mats)


def new_ranks(keep: Sequence[str], tiers, source_order, seq, chars, doc_ids: list[str], nodes) -> list[bytes]:
    """Keep-policy sort keys as bytes (compare as `near.keep_order` sorts: the criteria, then doc_id; the batch
    position last, only to make duplicate ids total). 0x01 first: after every earlier-refresh document."""
    n = len(doc_ids)
    columns = {"quality_tier": [tiers], "first_seen": [source_order, seq], "longest": [-np.asarray(chars, np.int64)]}
    fixed = _sortable([c for k in keep for c in columns[k]], n)
    position = _sortable([nodes], n)
    return [b"\x01" + fixed[i].tobytes() + d.encode("utf-8", "surrogatepass") + b"\x00" + position[i].tobytes()
            for i, d in enumerate(doc_ids)]


def old_ranks(r: int, refs: np.ndarray) -> list[bytes]:
    packed = _sortable([np.full(len(refs), r), refs], len(refs))
    return [b"\x00" + row.tobytes() for row in packed]


def _list_array(values: np.ndarray, offsets: np.ndarray) -> pa.LargeListArray:
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()), pa.array(values, pa.uint32()))


def _shingle_arrays(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    offsets = arr.offsets.to_numpy()
    return arr.values.to_numpy(zero_copy_only=False), offsets


def _dir(root: str | Path, *names: str) -> Path:
    return Path(root).joinpath(*names)


_INDEX_ROLES = {"buckets": "index_buckets", "ids": "index_ids", "docs": "index_docs"}


def index_file(index: str | Path, kind: str, i: int) -> Path:
    """File i of an index folder's `kind` (buckets, ids, docs), named by its store role."""
    return Path(index) / kind / part_name(_INDEX_ROLES[kind], i)


def _empty(schema: pa.Schema) -> pa.Table:
    return schema.empty_table()


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

    def docs(self, dp: int, columns: list[str]) -> tuple[np.ndarray, pa.Table]:
        """(nodes, columns) of one doc-partition; `columns` among doc_id, source, shingles."""
        if dp < self.n_parts:
            t = pq.read_table(self.parts[dp], columns=columns)
            return self.starts[dp] + np.arange(t.num_rows, dtype=np.int64), t
        r, j = self.earlier_of(dp)
        t = pq.read_table(index_file(self.earlier[r].path, "docs", j), columns=["ref", *columns])
        return old_node(r, t.column("ref").to_numpy()), t.drop(["ref"])

    def w(self, *names: str) -> Path:
        return _dir(self.work, *names)


def _earlier_partition(layout: Layout, kind: str, p: int, hash_column: str) -> list[tuple[int, pa.Table]]:
    """Rows of each earlier refresh's `kind` files in this run's partition p (read by overlap, then filtered)."""
    out = []
    for r, e in enumerate(layout.earlier):
        tables = [pq.read_table(index_file(e.path, kind, q))
                  for q in overlapping(p, layout.partitions, e.partitions)]
        if not tables:
            continue
        t = pa.concat_tables(tables)
        mine = partition_of(t.column(hash_column).to_numpy(), layout.partitions) == p
        out.append((r, t.filter(pa.array(mine))))
    return out


# ------------------------------------------------------------------------------------- 1-2 scan, already

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

    @property
    def layout(self) -> Layout:
        return self.layout_file.load()


def _scan(task: _Task) -> tuple[int, dict[str, int]]:
    """Rows per source; with earlier refreshes, this part's ids shuffled by id hash for the join."""
    lay, k = task.layout, task.i
    t = pq.read_table(lay.parts[k], columns=["doc_id", "source"])
    counts = Counter(t.column("source").to_pylist())
    if lay.earlier and t.num_rows:
        ids = t.column("doc_id").to_pylist()
        h = doc_id_hash(ids)
        table = pa.table({"h": h, "doc_id": ids, "node": np.arange(t.num_rows, dtype=np.int64)},  # row, for now
                         schema=NEW_IDS_SCHEMA)
        write_partitioned(lay.w("ids"), f"{k:05d}", table, partition_of(h, lay.partitions), lay.partitions)
    return t.num_rows, dict(counts)


def _already(task: _Task) -> int:
    """This partition's ids joined with the earlier refreshes' ids: the documents accepted before."""
    lay, p = task.layout, task.i
    found_node, found_old = [], []
    new_tables = []
    for name, t in read_segments(lay.w("ids"), p):
        k = int(name)
        new_tables.append(t.set_column(2, "node", pa.array(t.column("node").to_numpy() + lay.starts[k])))
    if not new_tables:
        return 0
    new = pa.concat_tables(new_tables)
    for r, old in _earlier_partition(lay, "ids", p, "h"):
        joined = new.select(["doc_id", "node"]).join(old.select(["doc_id", "ref"]), "doc_id", join_type="inner")
        found_node.append(joined.column("node").to_numpy())
        found_old.append(old_node(r, joined.column("ref").to_numpy()))
    if not found_node:
        return 0
    nodes, olds = np.concatenate(found_node), np.concatenate(found_old)
    order = np.argsort(nodes, kind="stable")
    table = pa.table({"node": nodes[order], "old_node": olds[order]}, schema=ALREADY_SCHEMA)
    write_partitioned(lay.w("already"), f"{p:05d}", table, lay.dp_of(table.column("node").to_numpy()), lay.n_parts)
    return int(nodes.size)


# ------------------------------------------------------------------------------------------- 3 keys

def _keys(task: _Task) -> int:
    """Band keys of this part's new documents (shuffled by key prefix), its node table, and an edge from each
    already indexed document to its earlier copy (so both share a component)."""
    lay, k = task.layout, task.i
    t = pq.read_table(lay.parts[k], columns=["doc_id", "source", "chars", "signature"])
    n = t.num_rows
    nodes = lay.starts[k] + np.arange(n, dtype=np.int64)
    already = read_partition(lay.w("already"), k, ALREADY_SCHEMA)
    old_of = np.full(n, -1, np.int64)
    is_already = np.zeros(n, bool)
    if already.num_rows:
        rows = already.column("node").to_numpy() - lay.starts[k]
        old_of[rows] = already.column("old_node").to_numpy()
        is_already[rows] = True
        write_edges(lay.w("cc"), f"a{k:05d}", already.column("node").to_numpy(), already.column("old_node").to_numpy(),
                    lay.partitions)
    doc_ids = t.column("doc_id").to_pylist()
    new = np.flatnonzero(~is_already)
    chars = t.column("chars").to_numpy()
    ranks: list[bytes | None] = [None] * n
    new_ids = [doc_ids[i] for i in new]
    for i, r in zip(new, new_ranks(lay.keep, np.full(new.size, lay.tiers[k]), np.full(new.size, lay.orders[k]),
                                   lay.seq_starts[k] + new, chars[new], new_ids, nodes[new])):
        ranks[i] = r
    write_scratch(lay.w("nodes", f"{k:05d}{SCRATCH}"), pa.table({
        "node": nodes, "rank": pa.array(ranks, pa.binary()), "doc_id": doc_ids, "source": t.column("source"),
        "old_node": pa.array(old_of, mask=~is_already)}, schema=NODES_SCHEMA))
    if new.size:
        sig = t.column("signature").combine_chunks()
        sigs = sig.values.to_numpy(zero_copy_only=False).reshape(n, sig.type.list_size)[new]
        keys = band_keys(sigs, lay.bands, lay.rows)  # (new, bands)
        table = pa.table({"band": np.tile(np.arange(lay.bands, dtype=np.int32), new.size), "key": keys.ravel(),
                          "node": np.repeat(nodes[new], lay.bands),
                          "rank": pa.array([ranks[i] for i in new for _ in range(lay.bands)], pa.binary())},
                         schema=KEY_SCHEMA)
        write_partitioned(lay.w("keys"), f"{k:05d}", table, partition_of(keys.ravel(), lay.partitions), lay.partitions)
    return int(new.size)


# ------------------------------------------------------------------------------------------ 4 pairs

def bucket_pairs(group_starts: np.ndarray, sizes: np.ndarray, is_old: np.ndarray,
                 max_bucket: int) -> tuple[np.ndarray, np.ndarray]:
    """Row pairs (anchor, member) of buckets laid out consecutively (rows sorted by bucket, then old first, then
    keep order): each member with every one of the bucket's first `max_bucket` rows before it, never old with old."""
    pos = np.arange(int(sizes.sum()), dtype=np.int64) - np.repeat(group_starts, sizes)
    start_of = np.repeat(group_starts, sizes)
    firsts, seconds = [], []
    rows = np.flatnonzero(pos > 0)
    d = 0
    while rows.size and d < max_bucket:
        anchor = start_of[rows] + d
        ok = ~is_old[rows]  # the member is new (an old member's anchors are old too)
        firsts.append(anchor[ok])
        seconds.append(rows[ok])
        d += 1
        rows = rows[pos[rows] > d]
    if not firsts:
        return np.empty(0, np.int64), np.empty(0, np.int64)
    return np.concatenate(firsts), np.concatenate(seconds)


def _bucket_sizes(band: np.ndarray, key: np.ndarray) -> np.ndarray:
    """Rows per bucket of band-key rows sorted by (band, key), buckets in that order."""
    if not band.size:
        return np.empty(0, np.int64)
    starts = np.flatnonzero(np.r_[True, (band[1:] != band[:-1]) | (key[1:] != key[:-1])])
    return np.diff(np.r_[starts, band.size])


def _pairs(task: _Task) -> dict[str, Any]:
    """Group this key partition's band keys (this refresh's and the earlier refreshes' buckets) and emit the
    candidate pairs (earlier document first), shuffled by the first document's doc-partition."""
    lay, p = task.layout, task.i
    tables = [read_partition(lay.w("keys"), p, KEY_SCHEMA)]
    if tables[0].num_rows == 0:
        return {"pairs": 0, "buckets": 0, "largest_bucket": 0, "oversized_buckets": 0, "doc_partitions": []}
    for r, old in _earlier_partition(lay, "buckets", p, "key"):
        refs = old.column("ref").to_numpy()
        tables.append(pa.table({"band": old.column("band"), "key": old.column("key"), "node": old_node(r, refs),
                                "rank": pa.array(old_ranks(r, refs), pa.binary())}, schema=KEY_SCHEMA))
    t = pa.concat_tables(tables)
    band, key = t.column("band").to_numpy(), t.column("key").to_numpy()
    order = np.lexsort((key, band))
    sizes = _bucket_sizes(band[order], key[order])
    # Only shared buckets make pairs: the keep-order sort (on bytes, the costly one) is of their rows alone.
    t = t.take(pa.array(order[np.repeat(sizes, sizes) > 1]))
    t = t.sort_by([("band", "ascending"), ("key", "ascending"), ("rank", "ascending")])
    node = t.column("node").to_numpy()
    shared = _bucket_sizes(t.column("band").to_numpy(), t.column("key").to_numpy())
    starts = np.cumsum(shared) - shared
    first, second = bucket_pairs(starts, shared, node < 0, lay.max_bucket)
    a, b = node[first], node[second]
    pairs = np.unique(np.stack([a, b], axis=1), axis=0) if a.size else np.empty((0, 2), np.int64)
    table = pa.table({"a": pairs[:, 0], "b": pairs[:, 1]}, schema=PAIR_SCHEMA)
    touched = write_partitioned(lay.w("pairs"), f"{p:05d}", table, lay.dp_of(pairs[:, 0]), lay.doc_partitions)
    return {"pairs": int(a.size), "buckets": int(shared.size), "largest_bucket": int(sizes.max()),
            "oversized_buckets": int((shared > lay.max_bucket).sum()), "doc_partitions": touched}


# ------------------------------------------------------------------------------------ 5-6 attach, verify

def _attach(task: _Task) -> int:
    """The distinct pairs whose first document is in this doc-partition, with that document's shingles, shuffled
    by the second document's part (always this refresh's)."""
    lay, dp = task.layout, task.i
    t = read_partition(lay.w("pairs"), dp, PAIR_SCHEMA)
    if t.num_rows == 0:
        return 0
    pairs = np.unique(np.stack([t.column("a").to_numpy(), t.column("b").to_numpy()], axis=1), axis=0)
    write_scratch(lay.w("cands", f"{dp:05d}{SCRATCH}"),
                         pa.table({"a": pairs[:, 0], "b": pairs[:, 1]}, schema=PAIR_SCHEMA))
    nodes, docs = lay.docs(dp, ["shingles"])
    if dp < lay.n_parts:
        rows = pairs[:, 0] - lay.starts[dp]
    else:  # an earlier docs file holds only the kept documents (sorted by ref): look the nodes up
        order = np.argsort(nodes, kind="stable")
        rows = order[np.searchsorted(nodes[order], pairs[:, 0])]
    shingles = docs.column("shingles").take(pa.array(rows))
    table = pa.table({"a": pairs[:, 0], "b": pairs[:, 1], "shingles": shingles}, schema=PAIR_A_SCHEMA)
    write_partitioned(lay.w("pairs_a"), f"{dp:05d}", table, lay.dp_of(pairs[:, 1]), lay.n_parts)
    return int(len(pairs))


def _verify(task: _Task) -> tuple[int, int]:
    """Exact Jaccard of each pair whose second document is in part k; J >= threshold: a hit and a component edge."""
    lay, k = task.layout, task.i
    t = read_partition(lay.w("pairs_a"), k, PAIR_A_SCHEMA)
    if t.num_rows == 0:
        return 0, 0
    a, b = t.column("a").to_numpy(), t.column("b").to_numpy()
    a_values, a_offsets = _shingle_arrays(t.column("shingles"))
    b_values, b_offsets = _shingle_arrays(pq.read_table(lay.parts[k], columns=["shingles"]).column("shingles"))
    rows = b - lay.starts[k]
    j = np.array([jaccard(a_values[a_offsets[i]:a_offsets[i + 1]], b_values[b_offsets[r]:b_offsets[r + 1]])
                  for i, r in enumerate(rows)], dtype=np.float64)
    hit = j >= lay.threshold
    write_scratch(lay.w("hits", f"{k:05d}{SCRATCH}"),
                         pa.table({"comp": np.zeros(int(hit.sum()), np.int64), "a": a[hit], "b": b[hit],
                                   "jaccard": j[hit]}, schema=HIT_SCHEMA))
    write_edges(lay.w("cc"), f"v{k:05d}", a[hit], b[hit], lay.partitions)
    return int(a.size), int(hit.sum())


# ---------------------------------------------------------------------------------- 8-9 route, decide

def _route(task: _Task) -> int:
    """Members of components (with what the decisions need) and this part's hits, shuffled by component."""
    lay, dp = task.layout, task.i
    labels = read_partition(lay.w("cc", "labels"), dp, LABEL_SCHEMA)
    if labels.num_rows == 0:
        return 0
    order = np.argsort(labels.column("node").to_numpy(), kind="stable")
    lnode, llabel = labels.column("node").to_numpy()[order], labels.column("label").to_numpy()[order]
    if dp < lay.n_parts:
        nodes_t = read_scratch(lay.w("nodes", f"{dp:05d}{SCRATCH}"))
        members = nodes_t.take(pa.array(lnode - lay.starts[dp]))
        hits = read_scratch(lay.w("hits", f"{dp:05d}{SCRATCH}")) if lay.w("hits", f"{dp:05d}{SCRATCH}").is_file() \
            else _empty(HIT_SCHEMA)
        if hits.num_rows:
            comp = llabel[np.searchsorted(lnode, hits.column("b").to_numpy())]
            hits = hits.set_column(0, "comp", pa.array(comp, pa.int64()))
            write_partitioned(lay.w("hit_c"), f"{dp:05d}", hits, node_partition(comp, lay.partitions), lay.partitions)
    else:
        r, _ = lay.earlier_of(dp)
        nodes, docs = lay.docs(dp, ["doc_id", "source"])
        order = np.argsort(nodes, kind="stable")
        take = order[np.searchsorted(nodes[order], lnode)]
        refs = _decode_old(lnode)[1]
        members = pa.table({"node": lnode, "rank": pa.array(old_ranks(r, refs), pa.binary()),
                            "doc_id": docs.column("doc_id").take(pa.array(take)),
                            "source": docs.column("source").take(pa.array(take)),
                            "old_node": pa.nulls(lnode.size, pa.int64())}, schema=NODES_SCHEMA)
    # An already indexed document has no rank (it is never decided, only clustered): it sorts last.
    rank = pc.fill_null(members.column("rank"), pa.scalar(b"\x02", pa.binary()))
    table = pa.table({"comp": llabel, "node": lnode, "rank": rank, "doc_id": members.column("doc_id"),
                      "source": members.column("source"), "old_node": members.column("old_node")}, schema=MEMBER_SCHEMA)
    write_partitioned(lay.w("members"), f"{dp:05d}", table, node_partition(llabel, lay.partitions), lay.partitions)
    return int(lnode.size)


def _decide(task: _Task) -> dict[str, Any]:
    """near_dedup's greedy, component by component, in keep order."""
    lay, cp = task.layout, task.i
    members = read_partition(lay.w("members"), cp, MEMBER_SCHEMA)
    if members.num_rows == 0:
        return {"cluster_sizes": {}, "clusters": 0, "matched_earlier_refreshes": 0, "components": 0,
                "example_clusters": []}
    members = members.sort_by([("comp", "ascending"), ("rank", "ascending")])
    hits = read_partition(lay.w("hit_c"), cp, HIT_SCHEMA)
    hits_of: dict[int, list[tuple[int, float]]] = {}
    for a, b, j in zip(*(hits.column(c).to_numpy() for c in ("a", "b")), hits.column("jaccard").to_numpy()):
        hits_of.setdefault(int(b), []).append((int(a), float(j)))
    comp = members.column("comp").to_numpy()
    node = members.column("node").to_numpy()
    doc_id, source = members.column("doc_id").to_pylist(), members.column("source").to_pylist()
    old_of = members.column("old_node").to_pylist()
    starts = np.flatnonzero(np.r_[True, comp[1:] != comp[:-1]])
    bounds = np.r_[starts, comp.size]
    out: dict[str, list] = {c: [] for c in DECIDED_SCHEMA.names}
    sizes: Counter = Counter()
    examples: list[tuple[int, str]] = []  # (size, cluster_id) of the largest clusters
    matched_earlier = 0
    for s, e in zip(bounds[:-1], bounds[1:]):
        info = {int(node[i]): (doc_id[i], source[i]) for i in range(s, e)}
        accepted = {int(node[i]) for i in range(s, e) if node[i] < 0}  # earlier refreshes: always accepted
        uf = UnionFind()
        status: dict[int, str] = {}
        best_of: dict[int, tuple[float, str, str]] = {}
        for i in range(s, e):
            x = int(node[i])
            if x < 0 or old_of[i] is not None:
                continue
            found = [(j, *info[a], a) for a, j in hits_of.get(x, ()) if a in accepted]
            if found:
                best = max(found, key=lambda f: f[:3])
                status[x], best_of[x] = NEAR_DUPLICATE, best[:3]
                matched_earlier += int(best[3] < 0)
                for f in sorted(found, key=lambda f: (f[3] >= 0, f[1] if f[3] < 0 else "", f[3])):
                    uf.union(f[3], x)
            else:
                status[x] = KEPT
                accepted.add(x)
        roots: dict[int, list[int]] = {}
        for i in range(s, e):
            x = int(node[i])
            if x < 0:
                continue
            ref = old_of[i] if old_of[i] is not None else x  # an already indexed doc is its earlier copy
            root = uf.find(ref) if ref in uf.parent else None
            if root is not None:
                roots.setdefault(root, []).append(x)
            best = best_of.get(x)
            out["node"].append(x)
            out["status"].append(status.get(x, ALREADY_INDEXED))
            out["cluster_id"].append(info[root][0] if root is not None else None)
            out["duplicate_of"].append(best[1] if best else None)
            out["duplicate_of_source"].append(best[2] if best else None)
            out["jaccard"].append(best[0] if best else None)
        for root, xs in roots.items():
            size = len(xs) + (0 if any(status.get(x) == KEPT for x in xs) else 1)
            sizes[size] += 1
            examples.append((size, info[root][0]))
        examples = sorted(examples, key=lambda e: (-e[0], e[1]))[:EXAMPLE_CLUSTERS]  # bounded per partition
    table = pa.table(out, schema=DECIDED_SCHEMA)
    write_partitioned(lay.w("decided"), f"{cp:05d}", table, lay.dp_of(table.column("node").to_numpy()), lay.n_parts)
    return {"cluster_sizes": dict(sizes), "clusters": sum(sizes.values()), "matched_earlier_refreshes": matched_earlier,
            "components": int(starts.size), "example_clusters": examples}


# --------------------------------------------------------------------------------- 10-12 count, final

def _count(task: _Task) -> int:
    """`candidates`: per distinct candidate pair (a earlier, b later), b counts a if a is an earlier refresh's
    document (always) or was kept (near_dedup counts candidates accepted when b is decided)."""
    lay, dp = task.layout, task.i
    f = lay.w("cands", f"{dp:05d}{SCRATCH}")
    if not f.is_file():
        return 0
    t = read_scratch(f)
    a, b = t.column("a").to_numpy(), t.column("b").to_numpy()
    if dp < lay.n_parts:
        decided = read_partition(lay.w("decided"), dp, DECIDED_SCHEMA, ["node", "status"])
        not_kept = decided.filter(pc.not_equal(decided.column("status"), KEPT)).column("node").to_numpy()
        counted = ~np.isin(a, not_kept)  # not in a component: kept
        b = b[counted]
    nodes, n = np.unique(b, return_counts=True)
    write_partitioned(lay.w("counts"), f"{dp:05d}", pa.table({"node": nodes, "n": n}, schema=COUNT_SCHEMA),
                      lay.dp_of(nodes), lay.n_parts)
    return int(n.sum())


def _final(task: _Task) -> dict[str, Any]:
    """Part k's decision rows (in its row order), and its kept documents for this refresh's index."""
    lay, k = task.layout, task.i
    nodes_t = read_scratch(lay.w("nodes", f"{k:05d}{SCRATCH}"))
    n = nodes_t.num_rows
    start = lay.starts[k]
    already = nodes_t.column("old_node").is_valid().to_numpy(zero_copy_only=False)
    status = np.where(already, ALREADY_INDEXED, KEPT).astype(object)
    cluster = [None] * n
    dup, dup_source = [None] * n, [None] * n
    score = np.full(n, np.nan)
    decided = read_partition(lay.w("decided"), k, DECIDED_SCHEMA)
    for x, st, c, d, ds, j in zip(*(decided.column(name).to_pylist() for name in DECIDED_SCHEMA.names)):
        i = x - start
        status[i], cluster[i], dup[i], dup_source[i] = st, c, d, ds
        score[i] = np.nan if j is None else j
    candidates = np.zeros(n, np.int32)
    counts = read_partition(lay.w("counts"), k, COUNT_SCHEMA)
    np.add.at(candidates, counts.column("node").to_numpy() - start, counts.column("n").to_numpy().astype(np.int32))
    doc_ids, sources = nodes_t.column("doc_id").to_pylist(), nodes_t.column("source").to_pylist()
    decisions = pa.table({"doc_id": doc_ids, "source": sources, "status": status.tolist(), "cluster_id": cluster,
                          "duplicate_of": dup, "duplicate_of_source": dup_source,
                          "jaccard": pa.array(score, mask=np.isnan(score)), "candidates": candidates},
                         schema=DECISION_SCHEMA)
    write_parquet_atomic(Path(lay.decisions) / part_name("decisions", k), decisions)

    # This refresh's index: the kept documents' records and shingles (by part), band keys and ids (by partition).
    kept = np.flatnonzero(status == KEPT)
    sig_t = pq.read_table(lay.parts[k], columns=["chars", "signature", "shingles"])
    refs = start + kept
    write_parquet_atomic(index_file(lay.index, "docs", k), pa.table({
        "ref": refs, "doc_id": [doc_ids[i] for i in kept], "source": [sources[i] for i in kept],
        "quality_tier": np.full(kept.size, lay.tiers[k], np.int32), "chars": sig_t.column("chars").take(pa.array(kept)),
        "batch": [lay.batch] * kept.size, "shingles": sig_t.column("shingles").take(pa.array(kept))},
        schema=DOCS_SCHEMA), hash_columns=HASH_COLUMNS)
    if kept.size:
        sig = sig_t.column("signature").combine_chunks()
        sigs = sig.values.to_numpy(zero_copy_only=False).reshape(n, sig.type.list_size)[kept]
        keys = band_keys(sigs, lay.bands, lay.rows).ravel()
        write_partitioned(lay.w("kept_keys"), f"{k:05d}", pa.table({
            "band": np.tile(np.arange(lay.bands, dtype=np.int32), kept.size), "key": keys,
            "ref": np.repeat(refs, lay.bands)}, schema=BUCKET_SCHEMA), partition_of(keys, lay.partitions),
            lay.partitions)
        ids = [doc_ids[i] for i in kept]
        h = doc_id_hash(ids)
        write_partitioned(lay.w("kept_ids"), f"{k:05d}",
                          pa.table({"h": h, "doc_id": ids, "ref": refs}, schema=IDS_SCHEMA),
                          partition_of(h, lay.partitions), lay.partitions)
    per_source: dict[str, Counter] = {}
    cross: dict[str, Counter] = {}
    for s, st, ds in zip(sources, status, dup_source):
        per_source.setdefault(s, Counter())[st] += 1
        if st == NEAR_DUPLICATE:
            cross.setdefault(s, Counter())[ds] += 1
    return {"per_source": per_source, "cross_source": cross, "kept": int(kept.size)}


def _persist(task: _Task) -> int:
    lay, p = task.layout, task.i
    keys = read_partition(lay.w("kept_keys"), p, BUCKET_SCHEMA)
    order = np.lexsort([keys.column(c).to_numpy() for c in ("ref", "key", "band")])  # by band, key, ref
    write_parquet_atomic(index_file(lay.index, "buckets", p), keys.take(pa.array(order)))
    ids = read_partition(lay.w("kept_ids"), p, IDS_SCHEMA)
    write_parquet_atomic(index_file(lay.index, "ids", p), ids.sort_by("doc_id"))
    return keys.num_rows


# ------------------------------------------------------------------------------------------- driver

def read_index_meta(path: Path) -> dict[str, Any]:
    meta_path = Path(path) / "_index.json"
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path}: not a complete bucket index (no _index.json)")
    return json.loads(meta_path.read_text())


KEY_ROWS_PER_PARTITION = 250_000  # band-key rows one shuffled task holds (~25 MB in Arrow) when partitions are automatic


def auto_partitions(documents: int, bands: int) -> int:
    """Key-prefix partitions for `documents` (this refresh's and the earlier refreshes' accepted ones): about
    KEY_ROWS_PER_PARTITION band-key rows each, at least 8, so a task's memory stays flat as the corpus grows (with 8
    fixed partitions, a pairs task held an eighth of every key row)."""
    return max(8, -(-documents * bands // KEY_ROWS_PER_PARTITION))


def decide_distributed(signature_parts: Sequence[Path], sources: Mapping[str, tuple[int, int]],
                       previous: Sequence[Path], work_dir: Path, out_dir: Path, near: NearDedup, batch_name: str,
                       engine: Engine = SERIAL, partitions: int | None = None, max_bucket: int = 1_000,
                       progress: bool = False) -> dict[str, Any]:
    """Near-duplicate decisions for the documents of `signature_parts` (`minhash.compute_signatures` output, given in
    source order, one source per part) against each other and the earlier refreshes' index folders `previous`.

    `sources`: source name -> (quality tier, source order), as `Batch.from_tables` numbers them. Writes
    out_dir/decisions/decisions-{k}.parquet (DECISION_SCHEMA; concatenated in part order they are `near_dedup`'s table)
    and this refresh's index folder out_dir/index (`_index.json` last). `work_dir` is scratch, emptied first.
    `partitions`: of the key shuffle; None: `auto_partitions` (decisions never depend on it).
    With `near.enabled` false the caller keeps every document (as `near_dedup(enabled=False)`); this always decides."""
    t_start = time.perf_counter()
    timing: dict[str, float] = {}
    work_dir, out_dir = Path(work_dir), Path(out_dir)
    shutil.rmtree(work_dir, ignore_errors=True)  # shuffle folders are read by listing: nothing stale may remain
    work_dir.mkdir(parents=True)
    for sub in ("decisions", "index"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    for sub in ("decisions", "index/docs", "index/buckets", "index/ids"):
        (out_dir / sub).mkdir(parents=True)
    (work_dir / "nodes").mkdir()
    (work_dir / "hits").mkdir()
    (work_dir / "cands").mkdir()
    params = index_params(near)
    bands, rows = bands_rows(near)
    earlier, base = [], len(signature_parts)
    for path in previous:
        meta = read_index_meta(Path(path))
        check_index_params(path, meta, near)
        earlier.append(Earlier(str(path), meta["partitions"], tuple(meta["doc_parts"]), base))
        base += len(meta["doc_parts"]) - 1
    if partitions is None:
        documents = sum(pq.ParquetFile(p).metadata.num_rows for p in signature_parts)
        partitions = auto_partitions(documents + sum(e.starts[-1] for e in earlier), bands)

    def stage(name, fn, layout, items):
        t0 = time.perf_counter()
        layout_file = LayoutFile.write(layout, work_dir)
        out = engine.map_parts(fn, [_Task(layout_file, i) for i in items], desc=f"near-dup {name}",
                               progress=progress)
        timing[name] = round(time.perf_counter() - t0, 3)
        return out

    common = dict(work=str(work_dir), index=str(out_dir / "index"), decisions=str(out_dir / "decisions"),
                  partitions=partitions, parts=tuple(str(p) for p in signature_parts), keep=tuple(near.keep),
                  bands=bands, rows=rows, threshold=near.threshold, max_bucket=max_bucket, batch=batch_name,
                  earlier=tuple(earlier))
    n_parts = len(signature_parts)
    scan_layout = Layout(**common, starts=(0,) * (n_parts + 1), seq_starts=(0,) * n_parts, tiers=(0,) * n_parts,
                         orders=(0,) * n_parts)
    scanned = stage("scan", _scan, scan_layout, range(n_parts))
    starts, seq_starts, tiers, orders, seen = [0], [], [], [], Counter()
    for k, (n, counts) in enumerate(scanned):
        names = [s for s in counts if counts[s]]
        if len(names) > 1:
            raise ValueError(f"{signature_parts[k]}: documents of several sources ({names}); one source per part")
        source = names[0] if names else None
        tier, order = sources[source] if source is not None else (0, orders[-1] if orders else 0)
        if orders and order < orders[-1]:
            raise ValueError(f"{signature_parts[k]}: parts must come in source order (source {source!r} after a later "
                             "source)")
        starts.append(starts[-1] + n)
        seq_starts.append(seen[source])
        seen[source] += n
        tiers.append(tier)
        orders.append(order)
    lay = Layout(**common, starts=tuple(starts), seq_starts=tuple(seq_starts), tiers=tuple(tiers), orders=tuple(orders))
    P = partitions

    already = sum(stage("already", _already, lay, range(P))) if earlier else 0
    new_docs = sum(stage("keys", _keys, lay, range(n_parts)))
    paired = stage("pairs", _pairs, lay, range(P))
    touched = sorted({d for x in paired for d in x["doc_partitions"]})
    distinct = sum(stage("attach", _attach, lay, touched))
    verified = stage("verify", _verify, lay, range(n_parts))
    t0 = time.perf_counter()
    cc = connected_components(work_dir / "cc", P, engine, route=LayoutFile.write(lay, work_dir),
                              label_partitions=lay.doc_partitions, progress=progress)
    timing["components"] = round(time.perf_counter() - t0, 3)
    routed = set(cc["label_partitions"]) | set(range(n_parts))
    stage("route", _route, lay, sorted(routed))
    decided = stage("decide", _decide, lay, range(P))
    stage("count", _count, lay, touched)
    finals = stage("final", _final, lay, range(n_parts))
    stage("persist", _persist, lay, range(P))
    kept = sum(f["kept"] for f in finals)
    write_json_atomic(out_dir / "index" / "_index.json", json.dumps({
        "format": INDEX_FORMAT, "params": params, "partitions": P, "batch": batch_name, "doc_parts": starts,
        "documents": kept}, indent=2))

    per_source: dict[str, Counter] = {}
    cross: dict[str, Counter] = {}
    for f in finals:
        for s, c in f["per_source"].items():
            per_source.setdefault(s, Counter()).update(c)
        for s, c in f["cross_source"].items():
            cross.setdefault(s, Counter()).update(c)
    sizes: Counter = Counter()
    for d in decided:
        sizes.update(d["cluster_sizes"])
    pairs_checked = sum(v[0] for v in verified)
    hits = sum(v[1] for v in verified)
    return {
        "documents": starts[-1], "new_documents": new_docs, "already_indexed": already, "kept": kept,
        "partitions": P, "per_source": {s: {**dict(c), "duplicate_rate": round(c[NEAR_DUPLICATE] / max(sum(c.values()), 1), 4)}
                       for s, c in per_source.items()},
        "cross_source": {s: dict(c) for s, c in cross.items()},
        "cluster_sizes": {int(k): v for k, v in sorted(sizes.items())}, "clusters": sum(sizes.values()),
        "example_clusters": [c for _, c in sorted((e for d in decided for e in d["example_clusters"]),
                                                  key=lambda e: (-e[0], e[1]))[:EXAMPLE_CLUSTERS]],
        "matched_earlier_refreshes": sum(d["matched_earlier_refreshes"] for d in decided),
        "buckets": {"shared": sum(x["buckets"] for x in paired), "largest": max((x["largest_bucket"] for x in paired),
                                                                                default=0),
                    "oversized": sum(x["oversized_buckets"] for x in paired), "max_bucket": max_bucket},
        "verification": {"pairs_emitted": sum(x["pairs"] for x in paired), "candidate_pairs": distinct,
                         "verified": pairs_checked, "matches": hits, "false_candidates": pairs_checked - hits,
                         "false_candidate_share": round((pairs_checked - hits) / max(pairs_checked, 1), 4)},
        "components": {k: v for k, v in cc.items() if k != "label_partitions"},
        "lsh": {"bands": bands, "rows": rows, "num_perm": near.num_perm, "threshold": near.threshold},
        "partitions": P, "engine": engine.describe() if hasattr(engine, "describe") else None,
        "timing": {**timing, "total_seconds": round(time.perf_counter() - t_start, 3)},
    }


def read_decisions(out_dir: Path) -> pa.Table:
    """The decisions parts of a run, concatenated in part order (`near_dedup`'s table)."""
    files = sorted((Path(out_dir) / "decisions").glob("*.parquet"))
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else DECISION_SCHEMA.empty_table()


# ------------------------------------------------------------------------------- index folders, other writers

def write_index(index_dir: Path, near: NearDedup, batch_name: str,
                doc_parts: Iterable[tuple[pa.Table, np.ndarray]], partitions: int = 8) -> int:
    """An index folder (as `decide_distributed` persists one) from accepted documents given directly: per docs part
    (a DOCS_SCHEMA table without `ref`, their signatures). For `migrate` and for a refresh that indexes nothing;
    holds one refresh's band keys (about bands x 20 bytes per document), never its shingles. Returns documents."""
    index_dir = Path(index_dir)
    shutil.rmtree(index_dir, ignore_errors=True)
    for sub in ("docs", "buckets", "ids"):
        (index_dir / sub).mkdir(parents=True)
    bands, rows = bands_rows(near)
    starts, keys, ids = [0], [], []
    for k, (docs, signatures) in enumerate(doc_parts):
        refs = starts[-1] + np.arange(docs.num_rows, dtype=np.int64)
        write_parquet_atomic(index_file(index_dir, "docs", k), pa.table(
            {"ref": refs, **{c: docs.column(c) for c in DOCS_SCHEMA.names[1:]}}, schema=DOCS_SCHEMA),
            hash_columns=HASH_COLUMNS)
        starts.append(starts[-1] + docs.num_rows)
        if docs.num_rows:
            kb = band_keys(np.asarray(signatures, np.uint32), bands, rows).ravel()
            keys.append(pa.table({"band": np.tile(np.arange(bands, dtype=np.int32), docs.num_rows), "key": kb,
                                  "ref": np.repeat(refs, bands)}, schema=BUCKET_SCHEMA))
            doc_ids = docs.column("doc_id").to_pylist()
            ids.append(pa.table({"h": doc_id_hash(doc_ids), "doc_id": doc_ids, "ref": refs}, schema=IDS_SCHEMA))
    all_keys = pa.concat_tables(keys) if keys else _empty(BUCKET_SCHEMA)
    all_ids = pa.concat_tables(ids) if ids else _empty(IDS_SCHEMA)
    key_part = partition_of(all_keys.column("key").to_numpy(), partitions)
    id_part = partition_of(all_ids.column("h").to_numpy(), partitions)
    for p in range(partitions):
        write_parquet_atomic(index_file(index_dir, "buckets", p), all_keys.filter(pa.array(key_part == p)).sort_by(
            [("band", "ascending"), ("key", "ascending"), ("ref", "ascending")]))
        write_parquet_atomic(index_file(index_dir, "ids", p), all_ids.filter(pa.array(id_part == p)).sort_by("doc_id"))
    write_json_atomic(index_dir / "_index.json", json.dumps({
        "format": INDEX_FORMAT, "params": index_params(near), "partitions": partitions, "batch": batch_name,
        "doc_parts": starts, "documents": starts[-1]}, indent=2))
    return starts[-1]


def keep_all(signature_parts: Sequence[Path], out_dir: Path) -> dict[str, Any]:
    """Decisions with near-dedup off: every document kept (`near_dedup(enabled=False)`'s table), part by part."""
    out_dir = Path(out_dir)
    shutil.rmtree(out_dir / "decisions", ignore_errors=True)
    (out_dir / "decisions").mkdir(parents=True)
    per_source: Counter = Counter()
    for k, path in enumerate(signature_parts):
        t = pq.read_table(path, columns=["doc_id", "source"])
        n = t.num_rows
        per_source.update(t.column("source").to_pylist())
        write_parquet_atomic(out_dir / "decisions" / part_name("decisions", k), pa.table({
            "doc_id": t.column("doc_id"), "source": t.column("source"), "status": [KEPT] * n,
            "cluster_id": pa.nulls(n, pa.string()), "duplicate_of": pa.nulls(n, pa.string()),
            "duplicate_of_source": pa.nulls(n, pa.string()), "jaccard": pa.nulls(n, pa.float64()),
            "candidates": np.zeros(n, np.int32)}, schema=DECISION_SCHEMA))
    return {"documents": sum(per_source.values()),
            "per_source": {s: {KEPT: c, "duplicate_rate": 0.0} for s, c in per_source.items()},
            "cross_source": {}, "cluster_sizes": {}, "clusters": 0, "example_clusters": [],
            "matched_earlier_refreshes": 0}


def index_documents(index_dirs: Sequence[Path]) -> int:
    """Accepted documents in these index folders (from their `_index.json`)."""
    return sum(read_index_meta(Path(p))["documents"] for p in index_dirs)


def near_matches(index_dirs: Sequence[Path], shingles: np.ndarray, signature: np.ndarray,
                 near: NearDedup) -> list[tuple[float, str, dict[str, Any]]]:
    """Every indexed document sharing a band with `signature`, as (exact Jaccard, doc_id, its record), best first.
    Reads one buckets file per index folder and only the docs files holding a candidate."""
    bands, rows = bands_rows(near)
    keys = band_keys(np.asarray(signature, np.uint32)[None, :], bands, rows)[0]
    found = []
    for path in index_dirs:
        meta = read_index_meta(Path(path))
        check_index_params(path, meta, near)
        refs: set[int] = set()
        for p in sorted(set(partition_of(keys, meta["partitions"]).tolist())):
            t = pq.read_table(index_file(path, "buckets", p))
            hit = pc.is_in(t.column("key"), pa.array(keys, pa.uint64())).to_numpy(zero_copy_only=False)
            band, key = t.column("band").to_numpy()[hit], t.column("key").to_numpy()[hit]
            refs |= set(t.column("ref").to_numpy()[hit][keys[band] == key].tolist())
        if not refs:
            continue
        doc_parts = np.asarray(meta["doc_parts"])
        wanted = np.array(sorted(refs), np.int64)
        for j in np.unique(np.searchsorted(doc_parts, wanted, "right") - 1):
            t = pq.read_table(index_file(path, "docs", int(j)))
            t = t.filter(pc.is_in(t.column("ref"), pa.array(wanted)))
            values, offsets = _shingle_arrays(t.column("shingles"))
            for i, record in enumerate(t.drop(["ref", "shingles"]).to_pylist()):
                found.append((jaccard(shingles, values[offsets[i]:offsets[i + 1]]), record["doc_id"], record))
    return sorted(found, key=lambda f: (-f[0], f[1]))


def survivor_violations(signature_parts: Sequence[Path], decision_files: Sequence[Path], threshold: float,
                        sample: int, seed: int = 0, margin: float = 0.15) -> tuple[int, list[tuple[str, str, float]]]:
    """Check a sample of surviving documents against every survivor by exact Jaccard, independently of the LSH
    banding (a MinHash estimate >= threshold - margin pre-filters, exact Jaccard decides), one part at a time:
    only the sample's signatures and shingles are held. Parts and decision files correspond one to one.
    Returns (documents sampled, violating pairs)."""
    survivors = [pc.not_equal(pq.read_table(f, columns=["status"]).column("status").combine_chunks(), NEAR_DUPLICATE)
                 for f in decision_files]
    counts = np.array([int(pc.sum(s).as_py() or 0) for s in survivors], np.int64)
    total = int(counts.sum())
    if total < 2 or sample == 0:
        return 0, []
    # The same draw as choosing from the survivors' positions: the k-th survivor in part order.
    picked = np.sort(np.random.default_rng(seed).choice(total, size=min(sample, total), replace=False))
    bounds = np.r_[0, np.cumsum(counts)]
    ids, sigs, shingles = [], [], []
    for k, path in enumerate(signature_parts):
        mine = picked[(picked >= bounds[k]) & (picked < bounds[k + 1])] - bounds[k]
        if mine.size:
            rows = np.flatnonzero(survivors[k].to_numpy(zero_copy_only=False))[mine]
            t = pq.read_table(path, columns=["doc_id", "signature", "shingles"]).take(pa.array(rows))
            ids += t.column("doc_id").to_pylist()
            sigs.append(_signatures(t))
            values, offsets = _shingle_arrays(t.column("shingles"))
            shingles += [values[offsets[i]:offsets[i + 1]] for i in range(t.num_rows)]
    sigs = np.concatenate(sigs)
    violations = []
    for k, path in enumerate(signature_parts):
        t = pq.read_table(path, columns=["doc_id", "signature", "shingles"]).filter(survivors[k])
        if t.num_rows == 0:
            continue
        others, other_ids = _signatures(t), t.column("doc_id").to_pylist()
        values, offsets = _shingle_arrays(t.column("shingles"))
        for i, sig in enumerate(sigs):
            for j in np.flatnonzero(estimated_jaccard(sig, others) >= threshold - margin):
                if other_ids[j] != ids[i]:
                    exact = jaccard(shingles[i], values[offsets[j]:offsets[j + 1]])
                    if exact >= threshold:
                        violations.append((ids[i], other_ids[j], round(exact, 4)))
    return int(picked.size), violations


def _signatures(t: pa.Table) -> np.ndarray:
    sig = t.column("signature").combine_chunks()
    return sig.values.to_numpy(zero_copy_only=False).reshape(t.num_rows, sig.type.list_size)
