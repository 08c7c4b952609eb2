"""Connected components of a graph held as edge shuffles (`kiln.dedup.shuffle`), computed as rounds of
`Engine.map_parts`.

No process holds the graph: edges are hash-partitioned by a node into `partitions`, each round is one
map_parts over those partitions (a task reads its partition of every incoming edge file, reduces, and writes
its output edges as one shuffle file for the next round, named by its own position), and the driver only sees
small per-task results.

The algorithm is large-star / small-star (Kiveris, Lattanzi, Mirrokni, Rastogi, Vassilvitskii, "Connected
Components in MapReduce and Beyond", SoCC 2014), on node ids ordered as integers:

- large-star, at node u with neighbours Γ(u): m = min(Γ(u) ∪ {u}); emit (v, m) for every neighbour v > u.
  (Every larger neighbour is hooked onto the smallest node u can see.)
- small-star, at node u with smaller neighbours N = {v ∈ Γ(u): v < u}: m = min(N); emit (v, m) for every
  v ∈ N ∪ {u}, v ≠ m. (u and its smaller neighbours all hook onto the smallest of them.)

Both keep every component connected and never join two components; alternated, they converge (in
O(log² n) rounds, a handful in practice) to one star per component, centred on its smallest node. The edge
sets are the state: a large-star task keyed by u reads every edge at u (edges are written in both
directions), a small-star task keyed by u reads the edges whose larger end is u. Each task also sums a
64-bit hash of the distinct undirected edges it reads (each edge is read exactly once per round in both
kinds), so the driver knows the round's input edge set by fingerprint. When a large-star + small-star pair
hands the next large-star exactly the edge set it started from, the edges are at the fixed point (the
stars). Every large-star task also labels each node it reads with min(u, Γ(u)), which at the fixed point is the
node's star centre, the min of its component: the labels of the round that finds the fixed point are kept (no
separate labelling round), the others dropped. `write_edges` writes each writer's edges as stars of their own
components already, so components held by one writer need no more than one large/small/large pass.

Memory per task: its partition's edges, plus the degree of a star centre that hashes to it (at the end a
centre has one edge per member of its component, so a giant component lands in one task).
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa

from kiln.common.splitmix import mix64
from kiln.dedup.shuffle import read_partition, read_shuffle, write_partitioned
from kiln.engine import SERIAL, Engine

_M64 = (1 << 64) - 1

EDGE_SCHEMA = pa.schema([pa.field("u", pa.int64(), nullable=False), pa.field("v", pa.int64(), nullable=False)])
LABEL_SCHEMA = pa.schema([pa.field("node", pa.int64(), nullable=False),
                          pa.field("label", pa.int64(), nullable=False)])

MAX_ROUNDS = 200  # far beyond O(log² n) for any graph that fits on a store; a guard, not a tuning knob


def partition_of(hashes: np.ndarray, partitions: int) -> np.ndarray:
    """Range partition of 64-bit hashes by their top 32 bits: partition p holds prefixes
    [ceil(p·2³²/P), ceil((p+1)·2³²/P)), so data written with another P can be read back by overlap."""
    return (((np.asarray(hashes, dtype=np.uint64) >> np.uint64(32)) * np.uint64(partitions))
            >> np.uint64(32)).astype(np.int64)


def _prefixes(p: int, partitions: int) -> tuple[int, int]:
    """Partition p's range of top-32-bit prefixes, [lo, hi) (see partition_of)."""
    return -(-(p << 32) // partitions), -(-((p + 1) << 32) // partitions)


def hash_range(p: int, partitions: int) -> tuple[int, int]:
    """Partition p's range of 64-bit hashes, [lo, hi): a file sorted by the hash holds its rows in one run."""
    lo, hi = _prefixes(p, partitions)
    return lo << 32, hi << 32


def overlapping(p: int, partitions: int, other: int) -> list[int]:
    """The partitions of an `other`-way split whose prefix ranges meet partition p of a `partitions`-way one."""
    lo, hi = _prefixes(p, partitions)
    return [q for q in range(other) if max(lo, _prefixes(q, other)[0]) < min(hi, _prefixes(q, other)[1])]


def node_partition(nodes: np.ndarray, partitions: int) -> np.ndarray:
    """Where the edges keyed by a node live (a hash, so consecutive ids and hubs spread over partitions)."""
    return partition_of(mix64(np.asarray(nodes, dtype=np.int64).view(np.uint64)), partitions)


def edge_hash(lo: np.ndarray, hi: np.ndarray) -> np.ndarray:
    return mix64(mix64(lo.view(np.uint64)) ^ hi.view(np.uint64))


def local_stars(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same components as the edges (u, v), as stars: an edge (node, smallest node of its component among
    these edges) per other node. A writer's edges are often whole components, which are then at the fixed point
    already, so the rounds converge in fewer steps (min-label propagation with pointer jumping, vectorized)."""
    nodes, inverse = np.unique(np.concatenate([u, v]), return_inverse=True)
    iu, iv = inverse[:u.size], inverse[u.size:]
    label = np.arange(nodes.size)
    while True:
        nxt = label.copy()
        np.minimum.at(nxt, iu, label[iv])
        np.minimum.at(nxt, iv, label[iu])
        nxt = nxt[nxt]
        if (nxt == label).all():
            break
        label = nxt
    leaf = label != np.arange(nodes.size)
    return nodes[leaf], nodes[label[leaf]]


def write_edges(cc_dir: Path, name: str, u: np.ndarray, v: np.ndarray, partitions: int) -> None:
    """Round-0 (large-star) input: the undirected edges, as their components' stars (`local_stars`), in both
    directions, keyed by their first node."""
    u, v = np.asarray(u, np.int64), np.asarray(v, np.int64)
    keep = u != v
    u, v = local_stars(u[keep], v[keep]) if keep.any() else (u[keep], v[keep])
    both_u, both_v = np.concatenate([u, v]), np.concatenate([v, u])
    write_partitioned(_round_dir(cc_dir, 0), name, pa.table({"u": both_u, "v": both_v}, schema=EDGE_SCHEMA),
                      node_partition(both_u, partitions), partitions)


def _round_dir(cc_dir: Path, r: int) -> Path:
    return cc_dir / f"round-{r:03d}"


@dataclass(frozen=True)
class _RoundTask:
    cc_dir: str
    round: int
    partition: int
    partitions: int
    route: Callable[[np.ndarray], np.ndarray] | None = None  # node -> label partition (large-star rounds label)
    label_partitions: int = 0


def distinct_pairs(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct pairs (u[i], v[i]), sorted by u then v: np.unique(np.stack([u, v], axis=1), axis=0)'s answer
    from one lexsort (np.unique over rows sorts a structured view, several times slower)."""
    order = np.lexsort((v, u))
    u, v = u[order], v[order]
    first = np.ones(u.size, bool)
    first[1:] = (u[1:] != u[:-1]) | (v[1:] != v[:-1])
    return u[first], v[first]


def _read_edges(task: _RoundTask) -> tuple[np.ndarray, np.ndarray]:
    t = read_partition(_round_dir(Path(task.cc_dir), task.round), task.partition, EDGE_SCHEMA)
    return distinct_pairs(t.column("u").to_numpy(), t.column("v").to_numpy())


def _fingerprint(lo: np.ndarray, hi: np.ndarray) -> tuple[int, int]:
    return int(edge_hash(lo, hi).sum(dtype=np.uint64)) if lo.size else 0, int(lo.size)


def _group_min(u: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For edges sorted by u: (start of each u group, u of each group, min(u, min v) of each group)."""
    starts = np.flatnonzero(np.r_[True, u[1:] != u[:-1]])
    keys = u[starts]
    return starts, keys, np.minimum(keys, np.minimum.reduceat(v, starts))


def _labels_dir(cc_dir: Path, r: int) -> Path:
    return cc_dir / f"labels-{r:03d}"


def _cc_round(task: _RoundTask) -> tuple[int, int, tuple[list[int], int, int]]:
    """One large-star (even rounds) or small-star (odd rounds) step over one partition; returns the
    fingerprint (sum of edge hashes mod 2^64, count) of the distinct undirected edges it read, and what a
    large-star's labels gave (`_write_labels`; empty for a small-star)."""
    u, v = _read_edges(task)
    out = _round_dir(Path(task.cc_dir), task.round + 1)
    name = f"{task.partition:05d}"
    if task.round % 2 == 0:  # large-star: the edges at u, both directions
        fp = _fingerprint(u[v > u], v[v > u])
        if not u.size:
            return (*fp, ([], 0, 0))
        starts, keys, m = _group_min(u, v)
        # If these edges are the fixed point, min(u, Γ(u)) is u's label: written now, so the round that finds the
        # fixed point is also the one that labelled it (kept by the driver only then).
        labelled = _write_labels(_labels_dir(Path(task.cc_dir), task.round), task.partition, keys, m, task.route,
                                 task.label_partitions)
        m_of = np.repeat(m, np.diff(np.r_[starts, u.size]))
        larger = v > u
        a, b = v[larger], m_of[larger]  # (v, m) with m <= u < v: the next (small-star) key is v
        write_partitioned(out, name, pa.table({"u": a, "v": b}, schema=EDGE_SCHEMA), node_partition(a, task.partitions),
                          task.partitions)
        return (*fp, labelled)
    # small-star: the edges whose larger end is u (v < u)
    assert not (v > u).any(), "small-star input holds an edge keyed by its smaller end"
    keep = v < u
    u, v = u[keep], v[keep]
    fp = _fingerprint(v, u)
    if not u.size:
        return (*fp, ([], 0, 0))
    starts, keys, m = _group_min(u, v)
    m_of = np.repeat(m, np.diff(np.r_[starts, u.size]))
    a = np.concatenate([v, keys])  # N ∪ {u}
    b = np.concatenate([m_of, m])
    keep = a != b
    a, b = a[keep], b[keep]
    both_u, both_v = np.concatenate([a, b]), np.concatenate([b, a])  # the next (large-star) reads both ends
    write_partitioned(out, name, pa.table({"u": both_u, "v": both_v}, schema=EDGE_SCHEMA),
                      node_partition(both_u, task.partitions), task.partitions)
    return (*fp, ([], 0, 0))


def _write_labels(labels_dir: Path, partition: int, keys: np.ndarray, m: np.ndarray,
                  route: Callable[[np.ndarray], np.ndarray], label_partitions: int) -> tuple[list[int], int, int]:
    """At the fixed point every node's smallest neighbour (or itself) is its component's minimum: (node, label)
    by route(node). Returns the label partitions written, the nodes and the components (nodes that are labels)."""
    table = pa.table({"node": keys, "label": m}, schema=LABEL_SCHEMA)
    written = write_partitioned(labels_dir, f"{partition:05d}", table, route(keys), label_partitions)
    return written, int(keys.size), int((keys == m).sum())


@dataclass(frozen=True)
class HashRoute:
    """Labels hash-partitioned by node (what the tests and a plain caller use)."""

    partitions: int

    def __call__(self, nodes: np.ndarray) -> np.ndarray:
        return node_partition(nodes, self.partitions)


def connected_components(cc_dir: Path, partitions: int, engine: Engine = SERIAL,
                         route: Callable[[np.ndarray], np.ndarray] | None = None, label_partitions: int | None = None,
                         progress: bool = False) -> dict:
    """Components of the edges written under `cc_dir` by `write_edges` (same `partitions`). Labels (node, label =
    the component's smallest node) for every node with an edge go to the shuffle cc_dir/labels, partition
    route(node) (default: hash of the node into `partitions`). Returns rounds, nodes, components and the label
    partitions written."""
    route = route or HashRoute(partitions)
    label_partitions = label_partitions or partitions
    shutil.rmtree(cc_dir / "labels", ignore_errors=True)
    r, start_fp = 0, None
    while True:
        if r >= MAX_ROUNDS:
            raise RuntimeError(f"connected components did not converge in {MAX_ROUNDS} rounds")
        shutil.rmtree(_round_dir(cc_dir, r + 1), ignore_errors=True)  # a re-run never reads stale edges
        shutil.rmtree(_labels_dir(cc_dir, r), ignore_errors=True)
        tasks = [_RoundTask(str(cc_dir), r, p, partitions, route, label_partitions) for p in range(partitions)]
        results = engine.map_parts(_cc_round, tasks, desc=f"components round {r}", progress=progress)
        fp = (sum(f[0] for f in results) & _M64, sum(f[1] for f in results))
        if r == 0 and fp[1] == 0:  # no edges: no components
            return {"rounds": 1, "edges": 0, "nodes": 0, "components": 0, "label_partitions": []}
        if r % 2 == 0:
            if fp == start_fp:  # a large-star + small-star pair changed nothing: the stars, labelled by this round
                os.replace(_labels_dir(cc_dir, r), cc_dir / "labels")
                break
            shutil.rmtree(_labels_dir(cc_dir, r - 2), ignore_errors=True)  # not the fixed point's
            start_fp = fp
        if r > 0:
            shutil.rmtree(_round_dir(cc_dir, r - 1), ignore_errors=True)  # read by this round only
        r += 1
    shutil.rmtree(_labels_dir(cc_dir, r - 2), ignore_errors=True)
    labelled = [x[2] for x in results]
    return {"rounds": r + 1, "edges": start_fp[1], "nodes": sum(x[1] for x in labelled),
            "components": sum(x[2] for x in labelled),
            "label_partitions": sorted({q for x in labelled for q in x[0]})}


def read_labels(cc_dir: Path) -> dict[int, int]:
    """Every label file, as a dict (for tests and small graphs)."""
    t = read_shuffle(cc_dir / "labels", LABEL_SCHEMA)
    return dict(zip(t.column("node").to_pylist(), t.column("label").to_pylist()))
