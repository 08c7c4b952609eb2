"""Moving a store's near-dup index from the old single index (a `LocalIndex` folder of segments, on S3 under
`_dedup_index/<name>/`, or a Redis index) into per-refresh bucket indexes inside the dedup_index datasets.

The old index holds, per accepted document, its record (`batch` = the refresh that accepted it), its shingle set
and (locally) its signature; Redis keeps no signatures, so they are recomputed from the shingle sets, which is
exactly how they were made (`minhash.sign_shingles` under the index's scheme). Old indexes are all affine32
(`minhash.SCHEME`, recorded in their params): with the default dedup.near.scheme (fss-splitmix64-v1) the migration
is refused like any other parameter change; set `dedup.near.scheme: affine32` to migrate and keep deciding against
them, or skip the migration and backfill. Each refresh's dataset is rewritten through the store's
staging (its files as they were, plus `index/`), so a crash leaves it as it was and S3 gets it like any commit.
That gives it a new data version; its manifest names the one it replaces, which consumers recorded and which
`kiln audit lineage` and the data card accept as the same decisions.
A command rather than an upgrade inside `dedup_index`: that asset writes one refresh partition and must not
rewrite the others, and where the old index lives (a folder, S3, a Redis URL with a password) is only known
to whoever runs the deployment. Refreshes that already have a bucket index are left alone: re-running is safe.
It holds the store's index lock (`bucket_index.index_lock`) throughout, so a dedup_index run on the same store
neither commits between its reading a dataset and its rewriting it nor reads an index half migrated.
"""

from __future__ import annotations

import json
import shutil
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.config import NearDedup
from kiln.common.storage import Store
from kiln.dedup.bucket_index import DOCS_SCHEMA, INDEX, index_lock, index_params, params_differences, write_index
from kiln.dedup.minhash import pack_shingles, sign_shingles
from kiln.governance.refresh import load_refreshes

RECORD_COLUMNS = ["doc_id", "source", "quality_tier", "chars", "batch"]


class MigrationError(ValueError):
    """The old index cannot be moved as asked; the message says why and what to do."""


# ------------------------------------------------------------------------------------------- readers

class OldLocalIndex:
    """The segments of an old `LocalIndex` folder (`index.json` lists the complete ones)."""

    def __init__(self, folder: Path):
        self.folder = Path(folder)
        meta = self.folder / "index.json"
        if not meta.is_file():
            raise MigrationError(f"no old near-dup index at {self.folder} (no index.json)")
        data = json.loads(meta.read_text())
        self.params, self.segments = data["params"], [s["name"] for s in data["segments"]]

    def batches(self) -> set[str]:
        return {b for s in self.segments
                for b in pq.read_table(self.folder / s / "records.parquet", columns=["batch"]).column("batch").to_pylist()}

    def parts(self, batch: str, near: NearDedup) -> Iterator[tuple[pa.Table, np.ndarray]]:
        """The documents `batch` accepted, one docs part per segment holding any."""
        for s in self.segments:
            d = self.folder / s
            records = pq.read_table(d / "records.parquet")
            rows = np.flatnonzero(np.array(records.column("batch").to_pylist(), dtype=object) == batch)
            if not rows.size:
                continue
            values, offsets = np.load(d / "shingles.npy", mmap_mode="r"), np.load(d / "offsets.npy", mmap_mode="r")
            lengths = offsets[rows + 1] - offsets[rows]
            flat = np.concatenate([values[offsets[i]:offsets[i + 1]] for i in rows]) if rows.size else []
            shingles = pack_shingles(np.asarray(flat, np.uint32), np.r_[0, np.cumsum(lengths)])
            yield _docs(records.take(pa.array(rows)), shingles), np.asarray(np.load(d / "signatures.npy",
                                                                                   mmap_mode="r")[rows], np.uint32)


class OldRedisIndex:
    """An old Redis index: records and shingle sets in two hashes (signatures recomputed from the shingles)."""

    def __init__(self, url: str, name: str):
        try:
            import redis
        except ImportError:  # a plain install: the client comes with the production extra
            raise MigrationError("--redis: the Redis client is not installed; install it with Kiln's production extra "
                                 "(pip install 'kiln-pretrain[production]', or pip install 'redis>=5')") from None

        from kiln.common.secrets import redact_url

        self.client, self.prefix = redis.Redis.from_url(url), f"kiln:dedup:{name}"
        try:
            stored = self.client.get(f"{self.prefix}:params")
        except redis.exceptions.ConnectionError as exc:
            raise MigrationError(f"cannot reach Redis at {redact_url(url)} ({type(exc).__name__})") from None
        if stored is None:
            raise MigrationError(f"no old near-dup index {self.prefix} in Redis at {redact_url(url)}")
        self.params = json.loads(stored)
        self._records = {k.decode(): json.loads(v) for k, v in
                         self.client.hscan_iter(f"{self.prefix}:records", count=10_000)}

    def batches(self) -> set[str]:
        return {r["batch"] for r in self._records.values()}

    def parts(self, batch: str, near: NearDedup, chunk: int = 50_000) -> Iterator[tuple[pa.Table, np.ndarray]]:
        ids = sorted(d for d, r in self._records.items() if r["batch"] == batch)
        for start in range(0, len(ids), chunk):
            part = ids[start:start + chunk]
            sets = [np.frombuffer(v, dtype="<u4").astype(np.uint32)
                    for v in self.client.hmget(f"{self.prefix}:shingles", part)]
            records = pa.Table.from_pylist([{c: self._records[d][c] for c in RECORD_COLUMNS} for d in part])
            offsets = np.r_[0, np.cumsum([s.size for s in sets])].astype(np.int64)
            values = np.concatenate(sets) if sets else np.empty(0, np.uint32)
            shingles = pack_shingles(values, offsets)
            # The scheme the shingle sets were hashed with (migrate_index checked it is the config's).
            yield _docs(records, shingles), sign_shingles(values, offsets, near, self.params["scheme"])


def pull_from_s3(store: Store, name: str, into: Path) -> Path:
    """The old index's folder as S3 holds it (`<prefix>/_dedup_index/<name>/`), downloaded (sha256-checked)."""
    base = store.remote.key("_dedup_index", name)
    data = store.remote.get_bytes(f"{base}/index.json")
    if data is None:
        raise MigrationError(f"no old near-dup index on S3 at {store.remote.url(base)}")
    meta = json.loads(data)
    into.mkdir(parents=True, exist_ok=True)
    store.remote.download_files([(f"{base}/{s['name']}/{f}", into / s["name"] / f, sha)
                                 for s in meta["segments"] for f, sha in s["files"].items()])
    (into / "index.json").write_bytes(data)
    return into


def _docs(records: pa.Table, shingles: pa.Array) -> pa.Table:
    return pa.table({"doc_id": records.column("doc_id"), "source": records.column("source"),
                     "quality_tier": records.column("quality_tier").cast(pa.int32()),
                     "chars": records.column("chars").cast(pa.int64()), "batch": records.column("batch"),
                     "shingles": shingles}, schema=pa.schema(list(DOCS_SCHEMA)[1:]))


# ------------------------------------------------------------------------------------------- migrate

def migrate_index(store: Store, old: OldLocalIndex | OldRedisIndex, near: NearDedup,
                  log: Callable[[str], Any] | None = None) -> dict[str, Any]:
    """Give every refresh's dedup_index dataset that has none a bucket index of the documents the old index says
    that refresh accepted, under the store's index lock (`log` says when it waits for it). Returns {refresh:
    documents} of those rewritten, and those already migrated."""
    with index_lock(store, log or (lambda message: print(message, file=sys.stderr, flush=True))):
        return _migrate(store, old, near)


def _migrate(store: Store, old: OldLocalIndex | OldRedisIndex, near: NearDedup) -> dict[str, Any]:
    if old.params != index_params(near):
        raise MigrationError(f"the old index was built with other MinHash parameters than the config's "
                             f"({params_differences(old.params, index_params(near))}): restore those settings in "
                             "dedup.near to migrate it. Or skip the migration and backfill with the new settings: "
                             "re-materialize minhash_signatures (every source) and then dedup_index for every "
                             "refresh partition, from the first refresh to the last, one refresh at a time")
    refreshes = [r.key for r in load_refreshes(store) if store.manifest_or_none(INDEX, r.key) is not None]
    orphans = sorted(old.batches() - set(refreshes))
    if orphans:
        raise MigrationError(f"the old index holds documents accepted by {orphans}, which are not refreshes with a "
                             f"dedup_index dataset in {store.root}; nothing was changed")
    done, skipped = {}, []
    for r in refreshes:
        source = store.dataset_dir(INDEX, r)
        if (source / "index" / "_index.json").is_file():
            skipped.append(r)
            continue
        manifest = store.manifest(INDEX, r)
        with store.staging(INDEX, r) as writer:
            for f in manifest.files:
                (writer.dir / f.path).parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(source / f.path, writer.dir / f.path)
            done[r] = write_index(writer.dir / "index", near, r, old.parts(r, near))
            # A new data version (the file list grew), but the files consumers read are the same bytes: lineage
            # takes a consumer's record of `replaces` as current (kiln.governance.audit.lineage).
            stats = {**manifest.stats, "migrated_index": {"documents": done[r], "replaces": manifest.data_version}}
            writer.commit(code_version=manifest.code_version, config=manifest.config, inputs=manifest.inputs,
                          counts=manifest.counts, stats=stats)
    return {"migrated": done, "already_migrated": skipped}


def migrate_local(store: Store, near: NearDedup, folder: Path | None, name: str = "kiln") -> dict[str, Any]:
    """From an old local index folder; with S3 storage and no folder, from the copy on S3."""
    if folder is not None or store.remote is None:
        return migrate_index(store, OldLocalIndex(folder), near)
    with tempfile.TemporaryDirectory(dir=store.root) as tmp:
        return migrate_index(store, OldLocalIndex(pull_from_s3(store, name, Path(tmp) / name)), near)
