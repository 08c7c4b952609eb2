"""The near-dup path Kiln ran before the bucket index (kiln.dedup.bucket_index): `near_dedup` deciding a whole refresh
in one process against one `LocalIndex` (datasketch MinHashLSH band tables rebuilt from segment files).

Kept in the tests only, as the second implementation the bucket pipeline's decisions are compared with, and to
build stores in the old format for `kiln dedup migrate-index`'s tests. The segment layout (index.json listing
segments of records.parquet, signatures.npy, shingles.npy, offsets.npy) and the Redis layout (`RedisIndex`) are
what kiln.dedup.migrate reads.

It takes signature rows of either scheme (`dedup.near.scheme`): datasketch's MinHashLSH reads only the signature
values (`minhash.lean`), and verification is exact Jaccard of the stored shingle sets. The index params it records
and checks are `bucket_index.index_params`, the scheme included (the real old indexes are all affine32: the migration
tests build theirs with NearDedup(scheme="affine32")).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
import uuid
from abc import ABC, abstractmethod
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from datasketch import MinHashLSH
from filelock import FileLock, Timeout
from tqdm import tqdm

from kiln.common.config import NearDedup
from kiln.common.manifest import sha256_file, write_json_atomic
from kiln.dedup.bucket_index import IndexMismatch, index_params
from kiln.dedup.minhash import estimated_jaccard, jaccard, lean, shingle_arrays
from kiln.dedup.near import ALREADY_INDEXED, DECISION_SCHEMA, KEPT, NEAR_DUPLICATE, UnionFind


def _waiting(where: str) -> None:
    print(f"dedup index {where}: another run is writing it; waiting for it to finish", file=sys.stderr, flush=True)


def _check_params(stored: dict[str, Any], wanted: dict[str, Any], where: str) -> None:
    if stored != wanted:
        diff = {k: (stored.get(k), wanted.get(k)) for k in wanted if stored.get(k) != wanted.get(k)}
        raise IndexMismatch(f"dedup index {where} was built with other MinHash parameters ("
                            + ", ".join(f"{k}: index {a!r} vs config {b!r}" for k, (a, b) in diff.items()) + ")")


def open_index(near: NearDedup, root: Path, name: str = "kiln") -> LocalIndex:
    """The old default: a LocalIndex at root/name."""
    return LocalIndex(Path(root) / name, index_params(near))


@dataclass(frozen=True)
class IndexedDoc:
    """What the index remembers of an accepted document (for the keep policy and for audits)."""

    doc_id: str
    source: str
    quality_tier: int
    chars: int
    batch: str  # the materialization (refresh) that accepted it


RECORD_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False), pa.field("source", pa.string()),
                           pa.field("quality_tier", pa.int32()), pa.field("chars", pa.int64()),
                           pa.field("batch", pa.string())])


class DedupIndex(ABC):
    """Query and grow the set of accepted documents."""

    def __init__(self, params: dict[str, Any], lsh: MinHashLSH):
        self.params, self.lsh = params, lsh
        self.seed = params["seed"]

    @abstractmethod
    def __len__(self) -> int: ...

    @abstractmethod
    def contains(self, doc_ids: list[str]) -> list[bool]: ...

    @abstractmethod
    def records(self, doc_ids: list[str]) -> dict[str, IndexedDoc]: ...

    @abstractmethod
    def shingles(self, doc_ids: list[str]) -> dict[str, np.ndarray]: ...

    @abstractmethod
    def _store(self, docs: list[IndexedDoc], signatures: np.ndarray, shingles: list[np.ndarray]) -> None: ...

    def query_many(self, signatures: np.ndarray) -> list[set[str]]:
        """Candidate doc_ids for each signature row: one storage round trip per band, not per document."""
        found: list[set[str]] = [set() for _ in range(len(signatures))]
        if len(signatures) == 0:
            return found
        values = [lean(sig, self.seed).hashvalues for sig in signatures]
        for (start, end), table in zip(self.lsh.hashranges, self.lsh.hashtables):
            keys = [self.lsh._H(v[start:end]) for v in values]  # the band key exactly as `insert` computes it
            for i, hits in enumerate(table.getmany(*keys)):
                found[i].update(h.decode() if isinstance(h, bytes) else h for h in hits)
        return found

    def add(self, docs: list[IndexedDoc], signatures: np.ndarray, shingles: list[np.ndarray]) -> None:
        """Insert accepted documents (visible to queries at once; `commit` makes them durable).

        Band tables first, records last: a crash in between leaves keys that queries return but that
        have no record, which verification ignores and the next run inserts again."""
        with self.lsh.insertion_session(buffer_size=10_000) as session:
            for doc, sig in zip(docs, signatures):
                session.insert(doc.doc_id.encode(), lean(sig, self.seed), check_duplication=False)
        self._store(docs, signatures, shingles)

    def commit(self) -> dict[str, Any]:
        return {"documents": len(self)}

    def close(self) -> None:
        pass

    def __enter__(self) -> DedupIndex:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _new_lsh(params: dict[str, Any], storage_config: dict | None = None) -> MinHashLSH:
    return MinHashLSH(num_perm=params["num_perm"], params=(params["bands"], params["rows"]),
                      storage_config=storage_config or {"type": "dict"}, prepickle=False)


# ------------------------------------------------------------------------------------------- local

class LocalIndex(DedupIndex):
    """Segments of `records.parquet`, `signatures.npy`, `shingles.npy` + `offsets.npy` under one folder."""

    def __init__(self, path: Path, params: dict[str, Any]):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._lock: FileLock | None = FileLock(path / ".writer.lock")
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            _waiting(str(path))
            self._lock.acquire()
        try:
            self._open(params)
        except BaseException:
            self.close()
            raise

    def _open(self, params: dict[str, Any]) -> None:
        path = self.path
        meta_path = path / "index.json"
        meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {"params": params, "segments": []}
        _check_params(meta["params"], params, str(path))
        super().__init__(params, _new_lsh(params))
        self.segments = meta["segments"]
        listed = {seg["name"] for seg in self.segments}
        for leftover in path.glob("*segment-*"):  # a commit that died before index.json named its segment
            if leftover.is_dir() and leftover.name not in listed:
                shutil.rmtree(leftover, ignore_errors=True)
        self._where: dict[str, tuple[int, int]] = {}  # doc_id -> (segment number, row)
        self._records: list[pa.Table] = []
        self._shingles: list[tuple[np.ndarray, np.ndarray]] = []  # (values, offsets) per segment
        self._pending: list[tuple[list[IndexedDoc], np.ndarray, list[np.ndarray]]] = []
        self._pending_where: dict[str, tuple[int, int]] = {}
        for seg in self.segments:
            self._load_segment(seg)

    def _load_segment(self, seg: dict[str, Any]) -> None:
        d = self.path / seg["name"]
        records = pq.read_table(d / "records.parquet")
        signatures = np.load(d / "signatures.npy", mmap_mode="r")
        n = len(self._records)
        self._records.append(records)
        self._shingles.append((np.load(d / "shingles.npy", mmap_mode="r"), np.load(d / "offsets.npy", mmap_mode="r")))
        ids = records.column("doc_id").to_pylist()
        with self.lsh.insertion_session(buffer_size=50_000) as session:
            for row, (doc_id, sig) in enumerate(zip(ids, signatures)):
                self._where[doc_id] = (n, row)
                session.insert(doc_id.encode(), lean(np.asarray(sig), self.seed), check_duplication=False)

    def __len__(self) -> int:
        return len(self._where) + len(self._pending_where)

    def contains(self, doc_ids: list[str]) -> list[bool]:
        return [d in self._where or d in self._pending_where for d in doc_ids]

    def records(self, doc_ids: list[str]) -> dict[str, IndexedDoc]:
        out = {}
        for d in doc_ids:
            if (where := self._position(d)) is not None:
                pending, i, row = where
                out[d] = (self._pending[i][0][row] if pending else
                          IndexedDoc(**{k: v[0] for k, v in self._records[i].slice(row, 1).to_pydict().items()}))
        return out

    def shingles(self, doc_ids: list[str]) -> dict[str, np.ndarray]:
        out = {}
        for d in doc_ids:
            if (where := self._position(d)) is not None:
                pending, i, row = where
                if pending:
                    out[d] = self._pending[i][2][row]
                else:
                    values, offsets = self._shingles[i]
                    out[d] = np.asarray(values[offsets[row]:offsets[row + 1]])
        return out

    def _position(self, doc_id: str) -> tuple[bool, int, int] | None:
        """(uncommitted?, batch or segment number, row) of an indexed document, or None."""
        if doc_id in self._pending_where:
            return (True, *self._pending_where[doc_id])
        if doc_id in self._where:
            return (False, *self._where[doc_id])
        return None

    def _store(self, docs, signatures, shingles) -> None:
        batch = len(self._pending)
        self._pending.append((docs, np.asarray(signatures, dtype=np.uint32), shingles))
        for row, doc in enumerate(docs):
            self._pending_where[doc.doc_id] = (batch, row)

    def commit(self) -> dict[str, Any]:
        """Write pending documents as one new segment, then `index.json` (last, atomically)."""
        if self._pending:
            docs = [d for batch in self._pending for d in batch[0]]
            signatures = np.concatenate([b[1] for b in self._pending])
            shingles = [s for batch in self._pending for s in batch[2]]
            name = f"segment-{len(self.segments):05d}-{uuid.uuid4().hex[:8]}"  # never an existing folder's name
            staging = self.path / f".{name}.staging-{uuid.uuid4().hex[:8]}"
            staging.mkdir(parents=True)
            pq.write_table(pa.Table.from_pylist([asdict(d) for d in docs], schema=RECORD_SCHEMA),
                           staging / "records.parquet")
            np.save(staging / "signatures.npy", signatures)
            offsets = np.zeros(len(shingles) + 1, dtype=np.int64)
            np.cumsum([s.size for s in shingles], out=offsets[1:])
            np.save(staging / "shingles.npy", np.concatenate(shingles) if shingles else np.empty(0, np.uint32))
            np.save(staging / "offsets.npy", offsets)
            files = {f.name: sha256_file(f) for f in sorted(staging.iterdir())}
            os.replace(staging, self.path / name)
            seg = {"name": name, "documents": len(docs), "files": files}
            self.segments.append(seg)
            write_json_atomic(self.path / "index.json",
                              json.dumps({"params": self.params, "segments": self.segments}, indent=2))
            self._pending, self._pending_where = [], {}
            self._load_segment_records_only(seg)
        return {"documents": len(self), "segments": len(self.segments),
                "bytes": sum(f.stat().st_size for f in self.path.rglob("*") if f.is_file())}

    def close(self) -> None:
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def _load_segment_records_only(self, seg: dict[str, Any]) -> None:
        """After a commit the band tables already hold the documents; only the lookups move to disk."""
        d = self.path / seg["name"]
        n = len(self._records)
        records = pq.read_table(d / "records.parquet")
        self._records.append(records)
        self._shingles.append((np.load(d / "shingles.npy", mmap_mode="r"), np.load(d / "offsets.npy", mmap_mode="r")))
        for row, doc_id in enumerate(records.column("doc_id").to_pylist()):
            self._where[doc_id] = (n, row)



# ------------------------------------------------------------------------------------------- redis

class RedisIndex(DedupIndex):
    """The old Redis backend's layout (git f74afd7, kiln/dedup/index.py), which `migrate.OldRedisIndex` reads:
    `kiln:dedup:<name>:params` (JSON), datasketch's Redis storage for the band tables under
    `kiln:dedup:<name>:lsh`, and two hashes by doc_id: `:records` (IndexedDoc as JSON) and `:shingles` (<u4
    bytes). The old writer's lock is left out: these tests have one writer."""

    def __init__(self, url: str, name: str, params: dict[str, Any]):
        import redis

        self.client, self.prefix = redis.Redis.from_url(url), f"kiln:dedup:{name}"
        stored = self.client.get(f"{self.prefix}:params")
        if stored is None:
            self.client.set(f"{self.prefix}:params", json.dumps(params, sort_keys=True), nx=True)
            stored = self.client.get(f"{self.prefix}:params")
        _check_params(json.loads(stored), params, self.prefix)
        conn = self.client.connection_pool.connection_kwargs
        storage = {"type": "redis", "basename": f"{self.prefix}:lsh".encode(),
                   "redis": {k: conn[k] for k in ("host", "port", "db", "password") if conn.get(k) is not None}}
        super().__init__(params, _new_lsh(params, storage))

    def __len__(self) -> int:
        return self.client.hlen(f"{self.prefix}:records")

    def contains(self, doc_ids: list[str]) -> list[bool]:
        if not doc_ids:
            return []
        return [v is not None for v in self.client.hmget(f"{self.prefix}:records", doc_ids)]

    def records(self, doc_ids: list[str]) -> dict[str, IndexedDoc]:
        if not doc_ids:
            return {}
        values = self.client.hmget(f"{self.prefix}:records", doc_ids)
        return {d: IndexedDoc(**json.loads(v)) for d, v in zip(doc_ids, values) if v is not None}

    def shingles(self, doc_ids: list[str]) -> dict[str, np.ndarray]:
        if not doc_ids:
            return {}
        values = self.client.hmget(f"{self.prefix}:shingles", doc_ids)
        return {d: np.frombuffer(v, dtype="<u4") for d, v in zip(doc_ids, values) if v is not None}

    def _store(self, docs, signatures, shingles) -> None:
        pipe = self.client.pipeline(transaction=False)
        for doc, sh in zip(docs, shingles):
            pipe.hset(f"{self.prefix}:records", doc.doc_id, json.dumps(asdict(doc)))
            pipe.hset(f"{self.prefix}:shingles", doc.doc_id, np.asarray(sh, dtype="<u4").tobytes())
        pipe.execute()

    def close(self) -> None:
        self.client.close()


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
            sh_values, offsets = shingle_arrays(table.column("shingles"))
            values.append(sh_values[offsets[0]:offsets[-1]])
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

