"""The tasks of a near-dup run's engine rounds (`kiln.dedup.buckets` runs them: stages 1-6 and 8-11 there; 7 is
`kiln.dedup.components`) and the schemas of the shuffles between them.

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
earlier in keep order that were kept; those may lie in other components, so it is counted from the distinct
candidate pairs: verify counts each second document's, route sends the pairs whose first document is in a component
(a document not kept always is) to that component, and decide subtracts those whose first document it did not keep.
"""

from __future__ import annotations

from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.storage import part_name, write_parquet_atomic
from kiln.dedup.bucket_index import (
    BUCKET_SCHEMA,
    DOCS_ROW_GROUP_ROWS,
    DOCS_SCHEMA,
    IDS_SCHEMA,
    band_keys,
    doc_id_hash,
    index_file,
    keyed,
    write_hashed,
)
from kiln.dedup.bucket_layout import _decode_old, _earlier_partition, _Task, new_ranks, old_node, old_ranks
from kiln.dedup.components import LABEL_SCHEMA, distinct_pairs, node_partition, partition_of, write_edges
from kiln.dedup.fast_minhash import compiled_kernels
from kiln.dedup.minhash import HASH_COLUMNS, SHINGLES_TYPE, packed_shingles, shingle_arrays
from kiln.dedup.near import ALREADY_INDEXED, DECISION_SCHEMA, KEPT, NEAR_DUPLICATE, UnionFind
from kiln.dedup.shuffle import SCRATCH, read_partition, read_scratch, read_segments, write_partitioned, write_scratch

EXAMPLE_CLUSTERS = 5  # the largest clusters named in the stats (shown with their members by the asset)

KEY_SCHEMA = pa.schema([pa.field("band", pa.int32(), nullable=False), pa.field("key", pa.uint64(), nullable=False),
                        pa.field("node", pa.int64(), nullable=False), pa.field("rank", pa.binary(), nullable=False)])
NEW_IDS_SCHEMA = pa.schema([pa.field("h", pa.uint64(), nullable=False), pa.field("doc_id", pa.string(), nullable=False),
                            pa.field("node", pa.int64(), nullable=False)])
ALREADY_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False),
                            pa.field("old_node", pa.int64(), nullable=False)])
NODES_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False), pa.field("rank", pa.binary()),
                          pa.field("doc_id", pa.string(), nullable=False), pa.field("source", pa.string()),
                          pa.field("old_node", pa.int64())])  # old_node: the earlier copy of an already indexed doc
PAIR_SCHEMA = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.int64(), nullable=False)])
PAIR_A_SCHEMA = pa.schema([pa.field("a", pa.int64(), nullable=False), pa.field("b", pa.int64(), nullable=False),
                           pa.field("shingles", SHINGLES_TYPE, nullable=False)])
B_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False)])
SECOND_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False),
                           pa.field("shingles", SHINGLES_TYPE, nullable=False)])
HIT_SCHEMA = pa.schema([pa.field("comp", pa.int64(), nullable=False), pa.field("a", pa.int64(), nullable=False),
                        pa.field("b", pa.int64(), nullable=False), pa.field("jaccard", pa.float64(), nullable=False)])
MEMBER_SCHEMA = pa.schema([pa.field("comp", pa.int64(), nullable=False), pa.field("node", pa.int64(), nullable=False),
                           pa.field("rank", pa.binary(), nullable=False),
                           pa.field("doc_id", pa.string(), nullable=False),
                           pa.field("source", pa.string()), pa.field("old_node", pa.int64())])
DECIDED_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False), DECISION_SCHEMA.field("status"),
                            DECISION_SCHEMA.field("cluster_id"), DECISION_SCHEMA.field("duplicate_of"),
                            DECISION_SCHEMA.field("duplicate_of_source"), DECISION_SCHEMA.field("jaccard")])
CAND_C_SCHEMA = pa.schema([pa.field("comp", pa.int64(), nullable=False), pa.field("a", pa.int64(), nullable=False),
                           pa.field("b", pa.int64(), nullable=False)])
COUNT_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False), pa.field("n", pa.int64(), nullable=False)])


# ------------------------------------------------------------------------------------- 1-2 scan, already

def _scan(task: _Task) -> tuple[int, dict[str, int]]:
    """Rows per source; with earlier refreshes, this part's ids shuffled by id hash for the join."""
    lay, k = task.layout, task.i
    t = pq.read_table(lay.parts[k], columns=["doc_id", "source"] if lay.earlier else ["source"])
    counts = {c["values"]: c["counts"] for c in pc.value_counts(t.column("source")).to_pylist()}
    if lay.earlier and t.num_rows:
        ids = t.column("doc_id").to_pylist()
        h = doc_id_hash(ids)
        table = pa.table({"h": h, "doc_id": ids, "node": np.arange(t.num_rows, dtype=np.int64)},  # row, for now
                         schema=NEW_IDS_SCHEMA)
        write_partitioned(lay.w("ids"), f"{k:05d}", table, partition_of(h, lay.partitions), lay.partitions)
    return t.num_rows, counts


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
    """Band keys of this part's new documents (shuffled by key prefix; none for a document without shingles,
    `keyed`), its node table, and an edge from each already indexed document to its earlier copy (so both share a
    component)."""
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
    new = np.flatnonzero(~is_already)
    chars = t.column("chars").to_numpy()
    new_rank = new_ranks(lay.keep, np.full(new.size, lay.tiers[k]), np.full(new.size, lay.orders[k]),
                         lay.seq_starts[k] + new, chars[new], t.column("doc_id").take(pa.array(new)), nodes[new])
    of_row = np.full(n, -1, np.int64)  # row -> its position among the new documents (-1: already indexed)
    of_row[new] = np.arange(new.size)
    write_scratch(lay.w("nodes", f"{k:05d}{SCRATCH}"), pa.table({
        "node": nodes, "rank": new_rank.take(pa.array(of_row, mask=of_row < 0)), "doc_id": t.column("doc_id"),
        "source": t.column("source"), "old_node": pa.array(old_of, mask=~is_already)}, schema=NODES_SCHEMA))
    if new.size:
        sig = t.column("signature").combine_chunks()
        sigs = sig.values.to_numpy(zero_copy_only=False).reshape(n, sig.type.list_size)[new]
        keys = band_keys(sigs, lay.bands, lay.rows)  # (new, bands)
        write_scratch(lay.w("band_keys", f"{k:05d}{SCRATCH}"), pa.table({"key": keys.ravel()}))  # for final
        with_keys = np.flatnonzero(keyed(sigs))  # positions among the new documents
        shuffled = keys[with_keys].ravel()
        table = pa.table({"band": np.tile(np.arange(lay.bands, dtype=np.int32), with_keys.size), "key": shuffled,
                          "node": np.repeat(nodes[new][with_keys], lay.bands),
                          "rank": new_rank.take(pa.array(np.repeat(with_keys, lay.bands)))}, schema=KEY_SCHEMA)
        write_partitioned(lay.w("keys"), f"{k:05d}", table, partition_of(shuffled, lay.partitions), lay.partitions)
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
        return {"pairs": 0, "buckets": 0, "largest_bucket": 0, "oversized_buckets": 0, "doc_partitions": [],
                "b_parts": [], "key_rows": 0, "key_bytes": 0}
    for r, old in _earlier_partition(lay, "buckets", p, "key"):
        refs = old.column("ref").to_numpy()
        tables.append(pa.table({"band": old.column("band"), "key": old.column("key"), "node": old_node(r, refs),
                                "rank": old_ranks(r, refs)}, schema=KEY_SCHEMA))
    key_rows, key_bytes = tables[0].num_rows, tables[0].nbytes  # this refresh's band-key rows, in Arrow
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
    emitted = first.size
    a, b = distinct_pairs(node[first], node[second])
    table = pa.table({"a": a, "b": b}, schema=PAIR_SCHEMA)
    touched = write_partitioned(lay.w("pairs"), f"{p:05d}", table, lay.dp_of(a), lay.doc_partitions)
    # The second documents, by their part: the attach task of that part sets their shingles aside for verify.
    seconds = np.unique(b)
    b_parts = write_partitioned(lay.w("pairs_b"), f"{p:05d}", pa.table({"node": seconds}, schema=B_SCHEMA),
                                lay.dp_of(seconds), lay.n_parts)
    return {"pairs": int(emitted), "buckets": int(shared.size), "largest_bucket": int(sizes.max()),
            "oversized_buckets": int((shared > lay.max_bucket).sum()), "doc_partitions": touched,
            "b_parts": b_parts, "key_rows": key_rows, "key_bytes": key_bytes}


# ------------------------------------------------------------------------------------ 5-6 attach, verify

def _attach(task: _Task) -> tuple[int, list[int]]:
    """The distinct pairs whose first document is in this doc-partition, with that document's shingles, shuffled
    by the second document's part (always this refresh's); and, of a part of this refresh, the shingles of its
    documents that are some pair's second (a scratch file verify reads instead of the whole part again).
    Returns the distinct pairs and the parts they went to (verify opens only their writers' files)."""
    lay, dp = task.layout, task.i
    t = read_partition(lay.w("pairs"), dp, PAIR_SCHEMA)
    seconds = read_partition(lay.w("pairs_b"), dp, B_SCHEMA).column("node").to_numpy() if dp < lay.n_parts \
        else np.empty(0, np.int64)
    if t.num_rows == 0 and seconds.size == 0:
        return 0, []
    part = packed_shingles(pq.read_table(lay.parts[dp], columns=["shingles"]).column("shingles")) \
        if dp < lay.n_parts else None
    if seconds.size:
        seconds = np.unique(seconds)
        write_scratch(lay.w("seconds", f"{dp:05d}{SCRATCH}"), pa.table(
            {"node": seconds, "shingles": part.take(pa.array(seconds - lay.starts[dp]))}, schema=SECOND_SCHEMA))
    if t.num_rows == 0:
        return 0, []
    a, b = distinct_pairs(t.column("a").to_numpy(), t.column("b").to_numpy())
    write_scratch(lay.w("cands", f"{dp:05d}{SCRATCH}"), pa.table({"a": a, "b": b}, schema=PAIR_SCHEMA))
    shingles = part.take(pa.array(a - lay.starts[dp])) if part is not None \
        else packed_shingles(lay.doc_rows(dp, a, ["shingles"]).column("shingles"))
    table = pa.table({"a": a, "b": b, "shingles": shingles}, schema=PAIR_A_SCHEMA)
    return int(a.size), write_partitioned(lay.w("pairs_a"), attach_writer(dp), table, lay.dp_of(b), lay.n_parts)


def attach_writer(dp: int) -> str:
    """The name of doc-partition dp's attach file in the pairs_a shuffle."""
    return f"{dp:05d}"


def _segment_keys(values: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Sets values[starts[i]:starts[i] + lengths[i]] concatenated, each value tagged with its set's number i in
    the high 32 bits (uint64), so the concatenation is sorted when every set is."""
    total = int(lengths.sum())
    pair = np.repeat(np.arange(lengths.size, dtype=np.uint64), lengths)
    first = np.repeat(starts - (np.cumsum(lengths) - lengths), lengths)  # value index minus output index
    return (pair << np.uint64(32)) | values[first + np.arange(total, dtype=np.int64)].astype(np.uint64)


def pair_jaccard(a_values: np.ndarray, a_offsets: np.ndarray, b_values: np.ndarray, b_offsets: np.ndarray,
                 b_rows: np.ndarray) -> np.ndarray:
    """Exact Jaccard (as `minhash.jaccard`) of pair i: set i of the a list (a_offsets[i]:a_offsets[i + 1]) and set
    b_rows[i] of the b list. Sets sorted and unique, as Kiln writes the shingles column: one compiled merge of the
    two sets per pair (a tenth of the CPU of a binary search of every a shingle among the b shingles, which at 1M
    documents was most of the verify round); other sets take that search."""
    n = len(b_rows)
    a_offsets, b_rows = np.asarray(a_offsets[:n + 1], np.int64), np.asarray(b_rows, np.int64)
    b_offsets = np.asarray(b_offsets, np.int64)
    a_len = np.diff(a_offsets)
    b_len = b_offsets[b_rows + 1] - b_offsets[b_rows]
    kernels = compiled_kernels()
    if kernels.sets_sorted(a_values, a_offsets) and kernels.sets_sorted(b_values, b_offsets):
        inter = kernels.pair_intersections(a_values, a_offsets, b_values, b_offsets, b_rows)
    else:
        inter = _searched_intersections(a_values, a_offsets, a_len, b_values, b_offsets[b_rows], b_len)
    union = a_len + b_len - inter
    return inter / np.maximum(union, 1)  # two documents without words (no shingles) are no evidence of a copy: 0


def _searched_intersections(a_values: np.ndarray, a_offsets: np.ndarray, a_len: np.ndarray, b_values: np.ndarray,
                            b_start: np.ndarray, b_len: np.ndarray) -> np.ndarray:
    """|A_i & B_i| for sets in any order: both sides as (pair, shingle) keys, one binary search of a's in b's."""
    n = a_len.size
    a_keys = _segment_keys(a_values, a_offsets[:n], a_len)
    b_keys = np.sort(_segment_keys(b_values, b_start, b_len))
    inter = np.zeros(n, np.int64)
    if a_keys.size and b_keys.size:
        at = np.minimum(np.searchsorted(b_keys, a_keys), b_keys.size - 1)
        found = b_keys[at] == a_keys
        inter = np.bincount((a_keys[found] >> np.uint64(32)).astype(np.int64), minlength=n)
    return inter


def _verify(task: _Task) -> tuple[int, int]:
    """Exact Jaccard of each pair whose second document is in part k; J >= threshold: a hit and a component edge."""
    lay, k = task.layout, task.i
    t = read_partition(lay.w("pairs_a"), k, PAIR_A_SCHEMA, writers=task.writers)
    if t.num_rows == 0:
        return 0, 0
    a, b = t.column("a").to_numpy(), t.column("b").to_numpy()
    a_values, a_offsets = shingle_arrays(t.column("shingles"))
    seconds = read_scratch(lay.w("seconds", f"{k:05d}{SCRATCH}"))  # every b of this part, sorted, with shingles
    b_values, b_offsets = shingle_arrays(seconds.column("shingles"))
    j = pair_jaccard(a_values, a_offsets, b_values, b_offsets,
                     np.searchsorted(seconds.column("node").to_numpy(), b))
    hit = j >= lay.threshold
    write_scratch(lay.w("hits", f"{k:05d}{SCRATCH}"),
                         pa.table({"comp": np.zeros(int(hit.sum()), np.int64), "a": a[hit], "b": b[hit],
                                   "jaccard": j[hit]}, schema=HIT_SCHEMA))
    write_edges(lay.w("cc"), f"v{k:05d}", a[hit], b[hit], lay.partitions)
    nodes, n = np.unique(b, return_counts=True)  # b's distinct candidate pairs (those of a not kept: decide's)
    write_scratch(lay.w("cand_n", f"{k:05d}{SCRATCH}"), pa.table({"node": nodes, "n": n}, schema=COUNT_SCHEMA))
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
            else HIT_SCHEMA.empty_table()
        if hits.num_rows:
            comp = llabel[np.searchsorted(lnode, hits.column("b").to_numpy())]
            hits = hits.set_column(0, "comp", pa.array(comp, pa.int64()))
            write_partitioned(lay.w("hit_c"), f"{dp:05d}", hits, node_partition(comp, lay.partitions), lay.partitions)
        cands = lay.w("cands", f"{dp:05d}{SCRATCH}")
        if cands.is_file():  # pairs whose first document may not be kept: decide says (the `candidates` column)
            t = read_scratch(cands)
            a, b = t.column("a").to_numpy(), t.column("b").to_numpy()
            at = np.minimum(np.searchsorted(lnode, a), lnode.size - 1)
            mine = lnode[at] == a  # a is in a component (a document that is not kept always is)
            comp = llabel[at[mine]]
            write_partitioned(lay.w("cand_c"), f"{dp:05d}",
                              pa.table({"comp": comp, "a": a[mine], "b": b[mine]}, schema=CAND_C_SCHEMA),
                              node_partition(comp, lay.partitions), lay.partitions)
    else:
        r, _ = lay.earlier_of(dp)
        docs = lay.doc_rows(dp, lnode, ["doc_id", "source"])
        refs = _decode_old(lnode)[1]
        members = pa.table({"node": lnode, "rank": old_ranks(r, refs),
                            "doc_id": docs.column("doc_id"), "source": docs.column("source"),
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
    # `candidates`: b counts a unless a is of this refresh and not kept; those a are decided here.
    cands = read_partition(lay.w("cand_c"), cp, CAND_C_SCHEMA)
    if cands.num_rows:
        decided_nodes = table.column("node").to_numpy()
        not_kept = decided_nodes[pc.not_equal(table.column("status"), KEPT).to_numpy(zero_copy_only=False)]
        a, b = cands.column("a").to_numpy(), cands.column("b").to_numpy()
        nodes, n = np.unique(b[np.isin(a, not_kept)], return_counts=True)
        write_partitioned(lay.w("uncounted"), f"{cp:05d}", pa.table({"node": nodes, "n": n}, schema=COUNT_SCHEMA),
                          lay.dp_of(nodes), lay.n_parts)
    return {"cluster_sizes": dict(sizes), "clusters": sum(sizes.values()), "matched_earlier_refreshes": matched_earlier,
            "components": int(starts.size), "example_clusters": examples}


# --------------------------------------------------------------------------------------- 10-11 final

def _final(task: _Task) -> dict[str, Any]:
    """Part k's decision rows (in its row order), and its kept documents for this refresh's index."""
    lay, k = task.layout, task.i
    nodes_t = read_scratch(lay.w("nodes", f"{k:05d}{SCRATCH}"))
    n = nodes_t.num_rows
    start = lay.starts[k]
    already = nodes_t.column("old_node").is_valid().to_numpy(zero_copy_only=False)
    decided = read_partition(lay.w("decided"), k, DECIDED_SCHEMA)
    row = np.full(n, -1, np.int64)  # row -> its decided row (-1: in no component)
    row[decided.column("node").to_numpy() - start] = np.arange(decided.num_rows)
    of_row = pa.array(row, mask=row < 0)
    status = np.where(already, ALREADY_INDEXED, KEPT).astype(object)
    status[row >= 0] = np.asarray(decided.column("status").to_pylist(), object)[row[row >= 0]]
    candidates = np.zeros(n, np.int64)
    if lay.w("cand_n", f"{k:05d}{SCRATCH}").is_file():
        counts = read_scratch(lay.w("cand_n", f"{k:05d}{SCRATCH}"))
        candidates[counts.column("node").to_numpy() - start] = counts.column("n").to_numpy()
    uncounted = read_partition(lay.w("uncounted"), k, COUNT_SCHEMA)
    np.subtract.at(candidates, uncounted.column("node").to_numpy() - start, uncounted.column("n").to_numpy())
    candidates = candidates.astype(np.int32)
    doc_ids, sources = nodes_t.column("doc_id"), nodes_t.column("source")
    dup_source = decided.column("duplicate_of_source").take(of_row)
    decisions = pa.table({"doc_id": doc_ids, "source": sources, "status": status.tolist(),
                          "cluster_id": decided.column("cluster_id").take(of_row),
                          "duplicate_of": decided.column("duplicate_of").take(of_row),
                          "duplicate_of_source": dup_source, "jaccard": decided.column("jaccard").take(of_row),
                          "candidates": candidates}, schema=DECISION_SCHEMA)
    # Not flushed one by one: `decide_distributed` flushes the output folder once, before `_index.json` names it.
    write_parquet_atomic(Path(lay.decisions) / part_name("decisions", k), decisions, flush=False)

    # This refresh's index: the kept documents' records and shingles (by part), band keys and ids (by partition).
    kept = np.flatnonzero(status == KEPT)
    sig_t = pq.read_table(lay.parts[k], columns=["chars", "signature", "shingles"])
    refs = start + kept
    kept_ids = doc_ids.take(pa.array(kept))
    write_parquet_atomic(index_file(lay.index, "docs", k), pa.table({
        "ref": refs, "doc_id": kept_ids, "source": sources.take(pa.array(kept)),
        "quality_tier": np.full(kept.size, lay.tiers[k], np.int32), "chars": sig_t.column("chars").take(pa.array(kept)),
        "batch": pa.array([lay.batch] * kept.size, pa.string()),
        "shingles": packed_shingles(sig_t.column("shingles")).take(pa.array(kept))},
        schema=DOCS_SCHEMA), hash_columns=HASH_COLUMNS, row_group_size=DOCS_ROW_GROUP_ROWS, flush=False)
    if kept.size:
        # The keys round's band keys of the new documents (a kept document is new), of those that have any.
        new_keys = read_scratch(lay.w("band_keys", f"{k:05d}{SCRATCH}")).column("key").to_numpy()
        sig = sig_t.column("signature").combine_chunks()
        with_keys = keyed(sig.values.to_numpy(zero_copy_only=False).reshape(-1, sig.type.list_size)[kept])
        keys = new_keys.reshape(-1, lay.bands)[(np.cumsum(~already) - 1)[kept[with_keys]]].ravel()
        write_partitioned(lay.w("kept_keys"), f"{k:05d}", pa.table({
            "band": np.tile(np.arange(lay.bands, dtype=np.int32), int(with_keys.sum())), "key": keys,
            "ref": np.repeat(refs[with_keys], lay.bands)}, schema=BUCKET_SCHEMA), partition_of(keys, lay.partitions),
            lay.partitions)
        h = doc_id_hash(kept_ids.to_pylist())
        write_partitioned(lay.w("kept_ids"), f"{k:05d}",
                          pa.table({"h": h, "doc_id": kept_ids, "ref": refs}, schema=IDS_SCHEMA),
                          partition_of(h, lay.partitions), lay.partitions)
    per_source: dict[str, Counter] = {}
    cross: dict[str, Counter] = {}
    by = pa.table({"s": sources, "st": status.tolist(), "ds": dup_source})
    for g in by.group_by(["s", "st"]).aggregate([([], "count_all")]).to_pylist():
        per_source.setdefault(g["s"], Counter())[g["st"]] += g["count_all"]
    dups = by.filter(pc.equal(by.column("st"), NEAR_DUPLICATE))
    for g in dups.group_by(["s", "ds"]).aggregate([([], "count_all")]).to_pylist():
        cross.setdefault(g["s"], Counter())[g["ds"]] += g["count_all"]
    return {"per_source": per_source, "cross_source": cross, "kept": int(kept.size)}


def _persist(task: _Task) -> int:
    lay, p = task.layout, task.i
    keys = read_partition(lay.w("kept_keys"), p, BUCKET_SCHEMA)
    write_hashed(index_file(lay.index, "buckets", p), keys, "key", flush=False)
    write_hashed(index_file(lay.index, "ids", p), read_partition(lay.w("kept_ids"), p, IDS_SCHEMA), "h", flush=False)
    return keys.num_rows
