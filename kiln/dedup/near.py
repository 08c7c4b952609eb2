"""Verified near-duplicate decisions across all sources and against everything accepted before: the policy, and
the table every implementation writes (kiln.dedup.buckets computes it distributedly; tests/old_near_dedup.py
holds the single-process implementation it replaced, as the second implementation the tests compare with).

LSH only proposes candidates. Each candidate pair is verified by exact Jaccard on the shingle sets,
so the LSH can be tuned for recall and false candidates cost only verification time. Decisions are
greedy in keep-policy order: a document is removed when it matches (J >= threshold) a document
already accepted (in an earlier refresh, or earlier in this one); otherwise it is accepted. So every
removed document names a kept one it duplicates, with the measured Jaccard, and no two survivors
match. Union-find over the verified matches groups documents into clusters for reporting.
"""

from __future__ import annotations

import pyarrow as pa

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
