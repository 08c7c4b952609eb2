"""Verified near-duplicate decisions across all sources and against everything accepted before.

LSH only proposes candidates. Each candidate pair is verified by exact Jaccard on the shingle sets,
so the LSH can be tuned for recall and false candidates cost only verification time. Decisions are
greedy in keep-policy order: a document is removed when it matches (J >= threshold) a document
already accepted (in an earlier refresh, or earlier in this one); otherwise it is accepted. So every
removed document names a kept one it duplicates, with the measured Jaccard, and no two survivors
match. Union-find over the verified matches groups documents into clusters for reporting.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from datasketch import MinHashLSH
from tqdm import tqdm

from kiln.config import NearDedup
from kiln.dedup.index import DedupIndex, IndexedDoc
from kiln.dedup.minhash import estimated_jaccard, jaccard, lean

KEPT, NEAR_DUPLICATE, ALREADY_INDEXED = "kept", "near_duplicate", "already_indexed"

DECISION_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("status", pa.string(), nullable=False),  # kept | near_duplicate | already_indexed
    pa.field("cluster_id", pa.string()),  # the doc_id of the cluster's kept document; null for singletons
    pa.field("duplicate_of", pa.string()),
    pa.field("duplicate_of_source", pa.string()),
    pa.field("jaccard", pa.float64()),  # exact Jaccard with duplicate_of
    pa.field("candidates", pa.int32()),  # LSH candidates verified for this document
])


@dataclass
class Batch:
    """The documents of one dedup run, columnar: one row per document, in source then document order."""

    doc_ids: list[str]
    sources: list[str]
    tiers: np.ndarray
    source_order: np.ndarray
    seq: np.ndarray
    chars: np.ndarray
    signatures: np.ndarray  # (n, num_perm) uint32
    shingle_values: np.ndarray  # uint32, all documents' shingle sets concatenated
    shingle_offsets: np.ndarray  # int64, n + 1

    def __len__(self) -> int:
        return len(self.doc_ids)

    def shingles(self, i: int) -> np.ndarray:
        return self.shingle_values[self.shingle_offsets[i]:self.shingle_offsets[i + 1]]

    @classmethod
    def from_tables(cls, tables: list[tuple[int, pa.Table]]) -> Batch:
        """(quality tier, signature table) per source, in the config's source order."""
        ids, sources, tiers, order, seq, chars, sigs, values, lengths = [], [], [], [], [], [], [], [], []
        for source_order, (tier, table) in enumerate(tables):
            n = table.num_rows
            if n == 0:
                continue
            ids += table.column("doc_id").to_pylist()
            sources += table.column("source").to_pylist()
            tiers.append(np.full(n, tier))
            order.append(np.full(n, source_order))
            seq.append(np.arange(n))
            chars.append(table.column("chars").to_numpy())
            sig = table.column("signature").combine_chunks()
            sigs.append(sig.values.to_numpy(zero_copy_only=False).reshape(n, sig.type.list_size))
            sh = table.column("shingles").combine_chunks()
            offsets = sh.offsets.to_numpy()
            values.append(sh.values.to_numpy(zero_copy_only=False)[offsets[0]:offsets[-1]])
            lengths.append(np.diff(offsets))

        def cat(xs, dtype):
            return np.concatenate(xs).astype(dtype) if xs else np.empty(0, dtype)

        shingle_offsets = np.zeros(len(ids) + 1, dtype=np.int64)
        np.cumsum(cat(lengths, np.int64), out=shingle_offsets[1:])
        return cls(ids, sources, cat(tiers, np.int32), cat(order, np.int32), cat(seq, np.int64), cat(chars, np.int64),
                   np.concatenate(sigs).astype(np.uint32) if sigs else np.empty((0, 0), np.uint32),
                   cat(values, np.uint32), shingle_offsets)


def keep_order(batch: Batch, idx: np.ndarray, keep: list[str]) -> np.ndarray:
    """`idx` sorted by the keep policy: the first document of a cluster in this order is kept."""
    columns = {"quality_tier": [batch.tiers[idx]], "first_seen": [batch.source_order[idx], batch.seq[idx]],
               "longest": [-batch.chars[idx]]}
    keys = [k for criterion in keep for k in columns[criterion]]
    ids = np.array([batch.doc_ids[i] for i in idx])
    # np.lexsort sorts by the last key first; doc_id last-resort tie-break keeps it deterministic.
    return idx[np.lexsort([ids] + keys[::-1])]


class UnionFind:
    """Union-find over any hashable ids; `union(keeper, other)` roots the merged tree at keeper's root."""

    def __init__(self):
        self.parent: dict = {}

    def find(self, x):
        self.parent.setdefault(x, x)
        while self.parent[x] != x:
            self.parent[x] = self.parent[self.parent[x]]
            x = self.parent[x]
        return x

    def union(self, keeper, other) -> None:
        a, b = self.find(keeper), self.find(other)
        if a != b:
            self.parent[b] = a


@dataclass
class DedupResult:
    decisions: pa.Table
    stats: dict[str, Any] = field(default_factory=dict)

    def removed(self) -> dict[str, dict[str, Any]]:
        """doc_id -> decision row, for the removed documents."""
        rows = self.decisions.filter(pc.equal(self.decisions.column("status"), NEAR_DUPLICATE)).to_pylist()
        return {r["doc_id"]: r for r in rows}


def near_dedup(batch: Batch, index: DedupIndex, near: NearDedup, batch_name: str, progress: bool = True,
               query_chunk: int = 5_000, enabled: bool = True) -> DedupResult:
    """Decide every document of `batch` against the index and against each other; add the kept ones.
    With `enabled` false every document is kept and the index is left as it is."""
    t_start = time.perf_counter()
    n = len(batch)
    already = np.array(index.contains(batch.doc_ids), dtype=bool) if n and enabled else np.zeros(n, bool)
    new = np.flatnonzero(~already) if enabled else np.zeros(0, np.int64)

    # Candidates among earlier refreshes: batched queries against the persistent index.
    t0 = time.perf_counter()
    old_candidates: dict[int, set[str]] = {}
    for start in range(0, len(new), query_chunk):
        chunk = new[start:start + query_chunk]
        for i, found in zip(chunk, index.query_many(batch.signatures[chunk])):
            old_candidates[int(i)] = found
    old_ids = sorted(set().union(*old_candidates.values())) if old_candidates else []
    old_shingles, old_records = index.shingles(old_ids), index.records(old_ids)
    # Candidates within this batch: an in-memory LSH with the same bands x rows.
    lsh = MinHashLSH(num_perm=index.params["num_perm"], params=(index.params["bands"], index.params["rows"]))
    with lsh.insertion_session() as session:
        for i in new:
            session.insert(int(i), lean(batch.signatures[i], index.seed), check_duplication=False)
    query_seconds = time.perf_counter() - t0

    status = np.full(n, ALREADY_INDEXED if enabled else KEPT, dtype=object)
    dup_of: list[str | None] = [None] * n
    dup_source: list[str | None] = [None] * n
    score = np.full(n, np.nan)
    n_candidates = np.zeros(n, dtype=np.int32)
    accepted = np.zeros(n, dtype=bool)
    uf = UnionFind()
    verified = false_candidates = 0
    t0 = time.perf_counter()
    for i in tqdm(keep_order(batch, new, near.keep), desc="near-dup decisions", unit="doc", disable=not progress,
                  mininterval=2):
        mine = batch.shingles(i)
        matches: list[tuple[float, str, str]] = []  # (jaccard, doc_id, source)
        # A fixed order (earlier refreshes' documents by id, then this refresh's by position), not set order:
        # the cluster a removed document joins two clusters under is named by the last match it unions.
        for c in sorted(old_candidates.get(int(i), ())):
            if c in old_shingles and c in old_records:  # a key without a record is an interrupted insert
                j = jaccard(mine, old_shingles[c])
                matches.append((j, c, old_records[c].source))
        for c in sorted(lsh.query(lean(batch.signatures[i], index.seed))):
            if c != i and accepted[c]:
                matches.append((jaccard(mine, batch.shingles(c)), batch.doc_ids[c], batch.sources[c]))
        n_candidates[i] = len(matches)
        verified += len(matches)
        hits = [m for m in matches if m[0] >= near.threshold]
        false_candidates += len(matches) - len(hits)
        if hits:
            best = max(hits)
            status[i], score[i], dup_of[i], dup_source[i] = NEAR_DUPLICATE, best[0], best[1], best[2]
            for _, other, _ in hits:
                uf.union(other, batch.doc_ids[i])
        else:
            status[i] = KEPT
            accepted[i] = True
    verify_seconds = time.perf_counter() - t0

    kept_idx = np.flatnonzero(accepted)
    t0 = time.perf_counter()
    index.add([IndexedDoc(batch.doc_ids[i], batch.sources[i], int(batch.tiers[i]), int(batch.chars[i]), batch_name)
               for i in kept_idx], batch.signatures[kept_idx], [batch.shingles(i) for i in kept_idx])
    insert_seconds = time.perf_counter() - t0

    # A cluster is named after its kept document: the root of its union-find tree is always a keeper.
    members: dict[str, list[int]] = {}
    clustered = {d for d in uf.parent}
    cluster_of = [uf.find(d) if d in clustered else None for d in batch.doc_ids]
    for i, c in enumerate(cluster_of):
        if c is not None:
            members.setdefault(c, []).append(i)
    decisions = pa.table({
        "doc_id": batch.doc_ids, "source": batch.sources, "status": status.tolist(), "cluster_id": cluster_of,
        "duplicate_of": dup_of, "duplicate_of_source": dup_source,
        "jaccard": pa.array(score, mask=np.isnan(score)), "candidates": n_candidates,
    }, schema=DECISION_SCHEMA)
    stats = _stats(batch, status, dup_of, dup_source, score, members, old_records)
    stats["timing"] = {"query_seconds": round(query_seconds, 3), "verify_seconds": round(verify_seconds, 3),
                       "insert_seconds": round(insert_seconds, 3),
                       "total_seconds": round(time.perf_counter() - t_start, 3)}
    stats["verification"] = {"candidate_pairs": verified, "false_candidates": false_candidates,
                             "false_candidate_share": round(false_candidates / max(verified, 1), 4)}
    stats["lsh"] = {"bands": index.params["bands"], "rows": index.params["rows"], "num_perm": index.params["num_perm"],
                    "threshold": near.threshold}
    return DedupResult(decisions, stats)


def _stats(batch: Batch, status: np.ndarray, dup_of: list, dup_source: list, score: np.ndarray,
           members: dict[str, list[int]], old_records: dict[str, IndexedDoc]) -> dict[str, Any]:
    per_source: dict[str, Counter] = {}
    matrix: dict[str, Counter] = {}  # removed document's source -> kept document's source -> count
    for i, s in enumerate(batch.sources):
        per_source.setdefault(s, Counter())[status[i]] += 1
        if status[i] == NEAR_DUPLICATE:
            matrix.setdefault(s, Counter())[dup_source[i]] += 1
    sizes = Counter(len(m) + (0 if any(status[i] == KEPT for i in m) else 1) for m in members.values())
    removed_scores = score[status == NEAR_DUPLICATE]
    return {
        "documents": len(batch),
        "per_source": {s: {**dict(c), "duplicate_rate": round(c[NEAR_DUPLICATE] / max(sum(c.values()), 1), 4)}
                       for s, c in per_source.items()},
        "cross_source": {s: dict(c) for s, c in matrix.items()},
        "cluster_sizes": {int(k): v for k, v in sorted(sizes.items())},
        "clusters": len(members),
        "jaccard_of_removed": {"min": float(removed_scores.min()) if removed_scores.size else None,
                               "median": float(np.median(removed_scores)) if removed_scores.size else None},
        "example_clusters": sorted(members, key=lambda c: -len(members[c]))[:5],
        "matched_earlier_refreshes": sum(1 for d in dup_of if d in old_records),
    }


def survivor_violations(batch: Batch, decisions: pa.Table, threshold: float, sample: int, seed: int = 0,
                        margin: float = 0.15) -> tuple[int, list[tuple[str, str, float]]]:
    """Check a sample of surviving documents against every survivor by exact Jaccard, independently of
    the LSH banding: a MinHash estimate pre-filters pairs (>= threshold - margin), exact Jaccard decides.
    Returns (documents sampled, violating pairs)."""
    status = np.array(decisions.column("status").to_pylist(), dtype=object)
    survivors = np.flatnonzero(status != NEAR_DUPLICATE)
    if survivors.size < 2 or sample == 0:
        return 0, []
    rng = np.random.default_rng(seed)
    picked = rng.choice(survivors, size=min(sample, survivors.size), replace=False)
    sigs = batch.signatures[survivors]
    violations = []
    for i in picked:
        est = estimated_jaccard(batch.signatures[i], sigs)
        for j in survivors[est >= threshold - margin]:
            if j != i:
                exact = jaccard(batch.shingles(i), batch.shingles(j))
                if exact >= threshold:
                    violations.append((batch.doc_ids[i], batch.doc_ids[j], round(exact, 4)))
    return int(picked.size), violations
