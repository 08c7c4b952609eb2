"""The persistent, incremental MinHash LSH index of every accepted document.

A refresh queries its new documents against everything accepted before and then inserts only the
ones it kept, so a document seen last month cannot come back this month. Both backends keep the LSH
band tables in datasketch's `MinHashLSH` storage and, beside them, what verification and the keep
policy need: each document's shingle set and its `IndexedDoc` record.

- `LocalIndex`: append-only segments under one folder (`index.json` written last lists the complete
  ones, so a crash mid-commit leaves the previous index intact). Arrays are `.npy` files opened
  memory-mapped; the band tables are rebuilt from the stored signatures when opened.
  With S3 storage (`remote`), the folder is a cache of `<prefix>/_dedup_index/<name>/` on S3: opening
  pulls the segments S3 lists (sha256-verified) and its `index.json`; `commit` uploads new segments, then
  `index.json` last, so a crash mid-upload leaves the previous index on S3 intact. Segment names are unique
  (a number and a random suffix), never reused.
- `RedisIndex`: datasketch's Redis storage, so many workers share one index; records and shingles
  live in two Redis hashes beside the band tables. Inserts are visible at once (no commit step).

One writer at a time, from open to close, on either backend: a run decides against what the index holds when it
queries, so two runs interleaved could each accept a near-duplicate of the other's documents (and, locally, the
second commit would rewrite the first's index.json). The local index holds a file lock (`.writer.lock` in its
folder; the OS drops it if the holder dies); the Redis index holds a Redis lock (SET NX with a lease that every
call renews, so a dead holder's lock expires). A second writer waits for the first to close.

Both refuse to open an index built with other MinHash parameters: signatures would not be comparable.
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import uuid
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import MinHashLSH
from filelock import FileLock, Timeout

from kiln.config import DedupIndexSettings, NearDedup
from kiln.dedup.minhash import bands_rows, lean
from kiln.manifest import sha256_file, write_json_atomic
from kiln.remote import S3Remote
from kiln.secrets import redact, redact_url


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


class IndexMismatch(ValueError):
    """The index on disk was built with other MinHash parameters than the config asks for."""


def _waiting(where: str) -> None:
    print(f"dedup index {where}: another run is writing it; waiting for it to finish", file=sys.stderr, flush=True)


def index_params(near: NearDedup) -> dict[str, Any]:
    """Everything that must stay fixed for signatures in one index to be comparable."""
    bands, rows = bands_rows(near)
    return {"num_perm": near.num_perm, "seed": near.seed, "bands": bands, "rows": rows,
            "shingle_size": near.shingle_size, "normalization": near.normalization.model_dump(mode="json"),
            "scheme": "affine32"}


def _check_params(stored: dict[str, Any], wanted: dict[str, Any], where: str) -> None:
    if stored != wanted:
        diff = {k: (stored.get(k), wanted.get(k)) for k in wanted if stored.get(k) != wanted.get(k)}
        raise IndexMismatch(
            f"dedup index {where} was built with other MinHash parameters ({', '.join(f'{k}: index {a!r} vs config {b!r}' for k, (a, b) in diff.items())}); "
            f"signatures would not be comparable. Restore those settings in dedup.near, or start a new index "
            f"with a new dedup.near.index.name")


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

    def __init__(self, path: Path, params: dict[str, Any], remote: S3Remote | None = None):
        self.path = path
        path.mkdir(parents=True, exist_ok=True)
        self._lock: FileLock | None = FileLock(path / ".writer.lock")
        try:
            self._lock.acquire(timeout=0)
        except Timeout:
            _waiting(str(path))
            self._lock.acquire()
        try:
            self._open(params, remote)
        except BaseException:
            self.close()
            raise

    def _open(self, params: dict[str, Any], remote: S3Remote | None) -> None:
        path = self.path
        self.mirror = _S3Mirror(remote, path) if remote is not None else None
        if self.mirror is not None:
            self.mirror.pull()
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
        if self.mirror is not None:
            self.mirror.push(self.segments)
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


class _S3Mirror:
    """Keeps a LocalIndex folder and its copy on S3 in step (segments are immutable once listed)."""

    def __init__(self, remote: S3Remote, path: Path):
        self.remote, self.path = remote, path
        self.base = remote.key("_dedup_index", path.name)
        self.remote_segments: dict[str, dict[str, Any]] = {}  # name -> entry of what S3's index.json lists

    def pull(self) -> None:
        """Make the local folder the index on S3. Nothing on S3 yet: a local index is kept, and uploaded
        by the next commit."""
        data = self.remote.get_bytes(f"{self.base}/index.json")
        if data is None:
            return
        meta = json.loads(data)
        local_path = self.path / "index.json"
        local = {s["name"]: s for s in json.loads(local_path.read_text())["segments"]} if local_path.is_file() else {}
        self.path.mkdir(parents=True, exist_ok=True)
        for seg in meta["segments"]:
            d = self.path / seg["name"]
            if local.get(seg["name"]) == seg and all((d / f).is_file() for f in seg["files"]):
                continue
            staging = self.path / f".{seg['name']}.pull-{uuid.uuid4().hex[:8]}"
            staging.mkdir()
            try:
                self.remote.download_files([(f"{self.base}/{seg['name']}/{f}", staging / f, sha)
                                            for f, sha in seg["files"].items()])
                if d.exists():  # a local segment of the same name that S3 never listed (an unfinished commit)
                    shutil.rmtree(d)
                os.replace(staging, d)
            finally:
                shutil.rmtree(staging, ignore_errors=True)
        write_json_atomic(local_path, data.decode("utf-8"))
        self.remote_segments = {s["name"]: s for s in meta["segments"]}

    def push(self, segments: list[dict[str, Any]]) -> None:
        """Upload the segments S3 does not have, then `index.json` (last)."""
        if not segments or self.remote_segments == {s["name"]: s for s in segments}:
            return
        self.remote.upload_files([(self.path / seg["name"] / f, f"{self.base}/{seg['name']}/{f}")
                                  for seg in segments if self.remote_segments.get(seg["name"]) != seg
                                  for f in seg["files"]])
        self.remote.put_bytes(f"{self.base}/index.json", (self.path / "index.json").read_bytes())
        self.remote_segments = {s["name"]: s for s in segments}


# ------------------------------------------------------------------------------------------- redis

class RedisIndex(DedupIndex):
    """datasketch's Redis storage for the band tables; records and shingles in two Redis hashes."""

    def __init__(self, url: str, name: str, params: dict[str, Any]):
        import redis

        self.client = redis.Redis.from_url(url)
        try:
            self.client.ping()
        except redis.exceptions.ConnectionError as exc:
            raise ConnectionError(f"dedup index: cannot reach Redis at {redact_url(url)} ({redact(str(exc))}); start "
                                  "redis-server or set dedup.near.index.redis_url / KILN_REDIS_URL (or use backend: "
                                  "local)") from None
        self.prefix = f"kiln:dedup:{name}"
        # The writer's lock: Redis's own SET NX PX (redis-py's Lock), renewed by every call, released at close.
        self._lock = self.client.lock(f"{self.prefix}:writer", timeout=self.LEASE_SECONDS, thread_local=False)
        if not self._lock.acquire(blocking=False):
            _waiting(f"{redact_url(url)} {self.prefix}")
            self._lock.acquire(blocking=True)
        try:
            self._open(url, params)
        except BaseException:
            self.close()
            raise

    LEASE_SECONDS = 900  # a writer that dies holds the index this long at most

    def _open(self, url: str, params: dict[str, Any]) -> None:
        stored = self.client.get(f"{self.prefix}:params")
        if stored is None:
            self.client.set(f"{self.prefix}:params", json.dumps(params, sort_keys=True), nx=True)
            stored = self.client.get(f"{self.prefix}:params")
        _check_params(json.loads(stored), params, f"{redact_url(url)} {self.prefix}")
        conn = self.client.connection_pool.connection_kwargs
        storage = {"type": "redis", "basename": f"{self.prefix}:lsh".encode(),
                   "redis": {k: conn[k] for k in ("host", "port", "db", "password") if conn.get(k) is not None}}
        super().__init__(params, _new_lsh(params, storage))

    def _renew(self) -> None:
        self._lock.extend(self.LEASE_SECONDS, replace_ttl=True)  # LockNotOwnedError if the lease ran out

    def query_many(self, signatures: np.ndarray) -> list[set[str]]:
        self._renew()
        return super().query_many(signatures)

    def add(self, docs, signatures, shingles) -> None:
        self._renew()
        super().add(docs, signatures, shingles)

    def commit(self) -> dict[str, Any]:
        self._renew()
        return super().commit()

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
        import redis

        if self._lock is not None:
            try:
                self._lock.release()
            except redis.exceptions.LockError:
                pass  # the lease ran out (nothing to release)
            self._lock = None
        self.client.close()


def open_index(settings: DedupIndexSettings, near: NearDedup, local_root: Path,
               remote: S3Remote | None = None) -> DedupIndex:
    """The index named in config, on the configured backend (local files under `local_root`, kept in step with
    S3 when `remote` is given, or Redis)."""
    params = index_params(near)
    if settings.backend == "redis":
        return RedisIndex(settings.redis_url, settings.name, params)
    return LocalIndex(local_root / settings.name, params, remote)
