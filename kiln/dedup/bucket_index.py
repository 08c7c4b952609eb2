"""Each refresh's bucket index on the store (the persistent index of accepted documents, in its dedup_index
dataset): its files, the MinHash parameters it was built with and their checks, band keys and id hashes, reading one
(`read_index_meta`, `index_documents`, `near_matches`) and writing one from accepted documents given directly
(`write_index`; `kiln.dedup.buckets` persists one per refresh at the end of its rounds).

The bucket index. Each refresh's index folder (written at the end, never rewritten):
  _index.json                  params (as `index_params`), partitions, batch, the doc-part starts, documents
  buckets/buckets-{p}.parquet  (band, key, ref) of its accepted documents, sorted by key; key-prefix partition p
  ids/ids-{p}.parquet          (h, doc_id, ref), h = blake2b-64 of doc_id, partition of h; sorted by h
  docs/indexed-{k}.parquet     (ref, doc_id, source, quality_tier, chars, batch, shingles): its part k's kept docs
File names carry their store role (`kiln.common.storage.ROLE_PREFIX`), so the folder can be part of a dataset.
Earlier refreshes are the persistent index: a new refresh shuffles only its own signatures against them.

Band keys. Band b of a signature is signature[b*rows:(b+1)*rows], as datasketch's MinHashLSH hashranges, so the
buckets are datasketch's buckets; the key is a 64-bit hash of (b, those values) (splitmix64 chained over the
values). Two different bands colliding in 64 bits add a candidate that verification rejects (about n²/2⁶⁵ per band:
~3e-8 at a million documents per band; a collision can change a decision only if that pair truly is a near-duplicate
that datasketch did not propose). Key partitions are ranges of the key's top 32 bits (`components.partition_of`), so
an earlier refresh written with another `partitions` is read by overlapping ranges. A buckets or ids file is sorted
by its hash (key, h) in row groups of HASH_ROW_GROUP_ROWS, with that column's statistics (`write_hashed`), so a
reader of a range of it (a later refresh's partition, one of several the earlier one's spans; a lookup of a few keys)
reads the row groups holding the range (`read_hash_range`), not the file: as the automatic partition count grows
with the index, a refresh reads each earlier row about once, not once per partition of its own that the row's file
meets. Files written before (band-major, no key statistics) are read whole.

Writers. A refresh's index is decided against the earlier refreshes' and committed with its dataset; every writer
(the dedup_index asset, `kiln dedup migrate-index`) does that under the store's lock `INDEX` (`index_lock`,
`index_commit`), not only Dagster's `dedup_index` pool: a second Dagster instance or the command on the same store
would otherwise read the earlier indexes while another commit is under way, and decide without it or overwrite it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from filelock import Timeout

from kiln.common.config import NearDedup
from kiln.common.manifest import write_json_atomic
from kiln.common.splitmix import mix64
from kiln.common.storage import (
    DatasetWriter,
    IncompleteDataset,
    Store,
    part_name,
    row_group_stats,
    write_parquet_atomic,
)
from kiln.dedup.components import partition_of
from kiln.dedup.minhash import HASH_COLUMNS, SCHEME, SHINGLES_TYPE, bands_rows, jaccard, shingle_arrays

INDEX_FORMAT = "kiln-bucket-index/1"
INDEX = "dedup_index"  # the datasets holding each refresh's decisions and bucket index; also the name of their lock

BUCKET_SCHEMA = pa.schema([pa.field("band", pa.int32(), nullable=False), pa.field("key", pa.uint64(), nullable=False),
                           pa.field("ref", pa.int64(), nullable=False)])
IDS_SCHEMA = pa.schema([pa.field("h", pa.uint64(), nullable=False), pa.field("doc_id", pa.string(), nullable=False),
                        pa.field("ref", pa.int64(), nullable=False)])
DOCS_SCHEMA = pa.schema([pa.field("ref", pa.int64(), nullable=False), pa.field("doc_id", pa.string(), nullable=False),
                         pa.field("source", pa.string()), pa.field("quality_tier", pa.int32()),
                         pa.field("chars", pa.int64()), pa.field("batch", pa.string()),
                         pa.field("shingles", SHINGLES_TYPE, nullable=False)])
# Rows per row group of a docs file: a later refresh reads the row groups holding the documents its candidate
# pairs touch (`bucket_layout.Layout.doc_rows`), not the whole file. With n of a file's N documents needed, about
# 1 - exp(-n x rows / N) of it is read: at a weekly refresh of the 10B index (n/N ~ 0.24%) 91% with 1,000 rows,
# 27% with 128 (bench/refresh_history.py, docs/scale.md). 128 was tried and measured: a serial decision's peak RSS
# then grew with the history (+30 MiB at 41,000 earlier documents, in the verify stage), not understood yet, and
# attach and route took 0.2-0.7 s more a refresh at 146,000-200,000; so 1,000 until it is. Files written before
# hold one row group.
DOCS_ROW_GROUP_ROWS = 1_000
# Rows a reader of a docs file's row groups reads at once (one group of 1,000; 8 of 128): the memory of a read is
# bounded, and a read costs ~0.3 ms whatever its size (doc_id and source of a few documents from 8 groups of 128
# took half the time in one call as in 8).
DOCS_READ_ROWS = 1_024
# Rows per row group of a buckets or ids file (sorted by its hash): a reader of a hash range reads about that
# range's rows plus a row group at each end (~330 kB of buckets rows a group).
HASH_ROW_GROUP_ROWS = 16_384


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


def doc_id_hash(doc_ids: list[str]) -> np.ndarray:
    """A stable 64-bit hash of each doc_id (partitions the id join; stored in the index's ids files)."""
    digests = b"".join([hashlib.blake2b(d.encode("utf-8", "surrogatepass"), digest_size=8).digest() for d in doc_ids])
    return np.frombuffer(digests, "<u8").astype(np.uint64)  # each digest read as a little-endian integer


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


def keyed(signatures: np.ndarray) -> np.ndarray:
    """Which documents get band keys: all but those without shingles (no words: "!!! ???", emoji only), whose
    signature is every value at its maximum in both schemes. Those all share every band, so each would be a
    candidate of all the others, while their Jaccard with any document is 0 (`minhash.jaccard`)."""
    return ~(np.asarray(signatures, np.uint32) == np.iinfo(np.uint32).max).all(axis=1)


_INDEX_ROLES = {"buckets": "index_buckets", "ids": "index_ids", "docs": "index_docs"}


def index_file(index: str | Path, kind: str, i: int) -> Path:
    """File i of an index folder's `kind` (buckets, ids, docs), named by its store role."""
    return Path(index) / index_name(kind, i)


def index_name(kind: str, i: int) -> str:
    """File i of `kind`'s path in an index folder."""
    return f"{kind}/{part_name(_INDEX_ROLES[kind], i)}"


@dataclass(frozen=True)
class IndexFiles:
    """One index folder's files by their path in it (`_index.json`, `buckets/…`), for a reader of a few of them:
    local paths (`folder`), or files read from S3 (an audit on S3 storage: kiln.governance.membership)."""

    name: str  # what a message calls the index
    open: Callable[[str], Path | BinaryIO]

    @classmethod
    def folder(cls, path: str | Path) -> IndexFiles:
        return cls(str(path), lambda relative: Path(path) / relative)

    def meta(self) -> dict[str, Any]:
        try:
            source = self.open("_index.json")
            return json.loads(source.read_bytes() if isinstance(source, Path) else source.read())
        except (FileNotFoundError, KeyError):
            raise FileNotFoundError(f"{self.name}: not a complete bucket index (no _index.json)") from None


def _read_doc_groups(file: pq.ParquetFile, groups: list[int], columns: list[str]) -> pa.Table:
    """One read of some row groups of a docs file (a function of its own: the tests and benches count what it
    reads)."""
    return file.read_row_groups(groups, columns=columns, use_threads=False)


def read_doc_refs(path: str | Path | BinaryIO, refs: np.ndarray, columns: Sequence[str]) -> pa.Table:
    """The rows of docs file `path` whose `ref` is in `refs` (`ref` and `columns`, in file order): only the row
    groups whose ref range (from the footer's statistics) holds one of them are read, so a few documents cost a
    few row groups, not the file (a file without statistics is read whole). They are read DOCS_READ_ROWS rows at a
    time, only their wanted rows kept, so the memory is those rows and one read, not every row group read."""
    file = pq.ParquetFile(path)
    meta = file.metadata
    refs = np.unique(np.asarray(refs, np.int64))
    groups = []
    for g, stats in enumerate(row_group_stats(meta, "ref")):
        if stats is None or not stats.has_min_max:
            groups.append(g)
            continue
        i = int(np.searchsorted(refs, stats.min))
        if i < refs.size and refs[i] <= stats.max:
            groups.append(g)
    names = ["ref", *columns]
    if not groups:
        return pa.schema([DOCS_SCHEMA.field(c) for c in names]).empty_table()
    wanted, per_read = pa.array(refs), max(1, DOCS_READ_ROWS // max(1, meta.row_group(0).num_rows))
    out = pa.concat_tables([t.filter(pc.is_in(t.column("ref"), wanted)) for t in
                            (_read_doc_groups(file, groups[i:i + per_read], names)
                             for i in range(0, len(groups), per_read))])
    # Freed row groups go back to the OS: mimalloc keeps buffers of ~200 kB (a 128-row group's shingles) cached, and
    # a serial decision on such files held 54 MiB more after its attach stage at 40,959 earlier documents.
    pa.default_memory_pool().release_unused()
    return out


def write_hashed(path: Path, table: pa.Table, column: str, flush: bool = True) -> None:
    """A buckets or ids file: its rows sorted by hash `column` (then the others, so the bytes are the same whatever
    order the rows came in), in row groups of HASH_ROW_GROUP_ROWS with that column's min/max statistics."""
    rows = table.sort_by([(column, "ascending")] + [(c, "ascending") for c in table.column_names if c != column])
    write_parquet_atomic(path, rows, hash_columns=(column,), row_group_size=HASH_ROW_GROUP_ROWS, flush=flush,
                         sorted_by=column)


def _read_hash_groups(file: pq.ParquetFile, groups: list[int]) -> pa.Table:
    """One read of some row groups of a buckets or ids file (a function of its own: the tests count what it reads)."""
    return file.read_row_groups(groups, use_threads=False)


def read_hash_range(source: str | Path | BinaryIO, column: str, ranges: Iterable[tuple[int, int]]) -> pa.Table:
    """The row groups of a buckets or ids file that may hold rows whose hash `column` is in one of `ranges` (each
    [lo, hi], inclusive), by the footer's statistics (every group of a file without them): a superset of those
    rows, for the caller to filter."""
    file = pq.ParquetFile(source)
    ranges = list(ranges)
    groups = [g for g, stats in enumerate(row_group_stats(file.metadata, column))
              if stats is None or not stats.has_min_max
              or any(stats.min <= hi and stats.max >= lo for lo, hi in ranges)]
    return _read_hash_groups(file, groups) if groups else file.schema_arrow.empty_table()


def read_index_meta(path: Path) -> dict[str, Any]:
    return IndexFiles.folder(path).meta()


# ------------------------------------------------------------------------ the writers' lock, what they read

@contextmanager
def index_lock(store: Store, log: Callable[[str], Any] | None = None) -> Iterator[None]:
    """The store's lock for writing the near-dup index (data/.locks/dedup_index.lock): held by whoever reads the
    earlier refreshes' indexes to commit a refresh's. A file lock, as for the refresh registry: it holds across
    processes of one machine or one shared KILN_HOME; with S3 storage, machines with their own KILN_HOME are still
    serialized only by Dagster's pool. Waits as long as the other writer takes (saying so through `log`)."""
    lock = store.lock(INDEX)
    try:
        lock.acquire(timeout=0)
    except Timeout:
        if log is not None:
            log(f"waiting for {lock.lock_file}: another writer of the near-dup index (a dedup_index run, `kiln dedup "
                "migrate-index`) is committing")
        lock.acquire()
    try:
        yield
    finally:
        lock.release()


def earlier_indexes(store: Store, refresh: str) -> list[tuple[str, Path]]:
    """(refresh, its bucket index folder) of every refresh before `refresh`, in order (read through the store: with
    S3 storage they are pulled); refused while one has no dedup_index yet (`require_earlier`). A dataset from
    before the bucket index has none: the store must be migrated first."""
    from kiln.governance.refresh import load_refreshes, require_earlier, upto

    earlier = upto(load_refreshes(store), refresh)[:-1]
    require_earlier(INDEX, refresh, [r.key for r in earlier if store.manifest_or_none(INDEX, r.key) is None])
    out = []
    for r in earlier:
        path = store.dataset_dir(INDEX, r.key) / "index"
        if not (path / "_index.json").is_file():
            raise IncompleteDataset(f"{INDEX}[{r.key}] has no bucket index (written before Kiln kept its near-dup "
                                    f"index in the dedup_index datasets); run `kiln dedup migrate-index` once")
        out.append((r.key, path))
    return out


@contextmanager
def index_commit(store: Store, refresh: str,
                 log: Callable[[str], Any] | None = None) -> Iterator[tuple[DatasetWriter, list[tuple[str, Path]]]]:
    """(a writer for `refresh`'s dedup_index dataset, the earlier refreshes' index folders), under `index_lock`
    from before those are read until the writer's commit is done: what it decides against is what is committed."""
    with index_lock(store, log), store.staging(INDEX, refresh) as writer:
        yield writer, earlier_indexes(store, refresh)


# ------------------------------------------------------------------------------- index folders, other writers

def index_part(index_dir: Path, k: int, docs: pa.Table, signatures: np.ndarray, start: int, bands: int,
               rows: int) -> tuple[pa.Table, pa.Table]:
    """Docs file k of an index folder from accepted documents given directly (a DOCS_SCHEMA table without `ref`, refs
    from `start`, and their signatures); returns their band-key rows (BUCKET_SCHEMA) and id rows (IDS_SCHEMA), for
    the folder's partition files (`write_index_partition`)."""
    refs = start + np.arange(docs.num_rows, dtype=np.int64)
    write_parquet_atomic(index_file(index_dir, "docs", k), pa.table(
        {"ref": refs, **{c: docs.column(c) for c in DOCS_SCHEMA.names[1:]}}, schema=DOCS_SCHEMA),
        hash_columns=HASH_COLUMNS, row_group_size=DOCS_ROW_GROUP_ROWS)
    if not docs.num_rows:
        return BUCKET_SCHEMA.empty_table(), IDS_SCHEMA.empty_table()
    signatures = np.asarray(signatures, np.uint32)
    with_keys = keyed(signatures)
    kb = band_keys(signatures[with_keys], bands, rows).ravel()
    keys = pa.table({"band": np.tile(np.arange(bands, dtype=np.int32), int(with_keys.sum())), "key": kb,
                     "ref": np.repeat(refs[with_keys], bands)}, schema=BUCKET_SCHEMA)
    doc_ids = docs.column("doc_id").to_pylist()
    return keys, pa.table({"h": doc_id_hash(doc_ids), "doc_id": doc_ids, "ref": refs}, schema=IDS_SCHEMA)


def write_index_partition(index_dir: Path, p: int, keys: pa.Table, ids: pa.Table) -> None:
    """Partition p's buckets and ids files of an index folder from its band-key and id rows (in part order)."""
    write_hashed(index_file(index_dir, "buckets", p), keys, "key")
    write_hashed(index_file(index_dir, "ids", p), ids, "h")


def write_index_meta(index_dir: Path, near: NearDedup, batch_name: str, partitions: int, starts: list[int]) -> None:
    """An index folder's `_index.json`, written last: what names the folder complete."""
    write_json_atomic(Path(index_dir) / "_index.json", json.dumps({
        "format": INDEX_FORMAT, "params": index_params(near), "partitions": partitions, "batch": batch_name,
        "doc_parts": starts, "documents": starts[-1]}, indent=2))


def write_index(index_dir: Path, near: NearDedup, batch_name: str,
                doc_parts: Iterable[tuple[pa.Table, np.ndarray]], partitions: int = 8) -> int:
    """An index folder (as `decide_distributed` persists one) from accepted documents given directly: per docs part
    (a DOCS_SCHEMA table without `ref`, their signatures), in this process. For `migrate`, whose documents come from
    an old index; holds one refresh's band keys (about bands x 20 bytes per document), never its shingles (a
    refresh decided with near-dedup off is indexed on the engine: `buckets.keep_all`). Returns documents."""
    index_dir = Path(index_dir)
    shutil.rmtree(index_dir, ignore_errors=True)
    for sub in ("docs", "buckets", "ids"):
        (index_dir / sub).mkdir(parents=True)
    bands, rows = bands_rows(near)
    starts, keys, ids = [0], [], []
    for k, (docs, signatures) in enumerate(doc_parts):
        part_keys, part_ids = index_part(index_dir, k, docs, signatures, starts[-1], bands, rows)
        starts.append(starts[-1] + docs.num_rows)
        if docs.num_rows:
            keys.append(part_keys)
            ids.append(part_ids)
    all_keys = pa.concat_tables(keys) if keys else BUCKET_SCHEMA.empty_table()
    all_ids = pa.concat_tables(ids) if ids else IDS_SCHEMA.empty_table()
    key_part = partition_of(all_keys.column("key").to_numpy(), partitions)
    id_part = partition_of(all_ids.column("h").to_numpy(), partitions)
    for p in range(partitions):
        write_index_partition(index_dir, p, all_keys.filter(pa.array(key_part == p)),
                              all_ids.filter(pa.array(id_part == p)))
    write_index_meta(index_dir, near, batch_name, partitions, starts)
    return starts[-1]


def index_documents(index_dirs: Sequence[Path]) -> int:
    """Accepted documents in these index folders (from their `_index.json`)."""
    return sum(read_index_meta(Path(p))["documents"] for p in index_dirs)


def near_matches(indexes: Sequence[IndexFiles], shingles: np.ndarray, signature: np.ndarray,
                 near: NearDedup) -> list[tuple[float, str, dict[str, Any]]]:
    """Every indexed document sharing a band with `signature`, as (exact Jaccard, doc_id, its record), best first.
    Reads the buckets files its band keys fall in and only the docs files (their row groups) holding a candidate."""
    bands, rows = bands_rows(near)
    keys = band_keys(np.asarray(signature, np.uint32)[None, :], bands, rows)[0]
    found = []
    for index in indexes:
        meta = index.meta()
        check_index_params(index.name, meta, near)
        refs: set[int] = set()
        for p in sorted(set(partition_of(keys, meta["partitions"]).tolist())):
            t = read_hash_range(index.open(index_name("buckets", p)), "key", ((int(k), int(k)) for k in keys))
            hit = pc.is_in(t.column("key"), pa.array(keys, pa.uint64())).to_numpy(zero_copy_only=False)
            band, key = t.column("band").to_numpy()[hit], t.column("key").to_numpy()[hit]
            refs |= set(t.column("ref").to_numpy()[hit][keys[band] == key].tolist())
        if not refs:
            continue
        doc_parts = np.asarray(meta["doc_parts"])
        wanted = np.array(sorted(refs), np.int64)
        for j in np.unique(np.searchsorted(doc_parts, wanted, "right") - 1):
            t = read_doc_refs(index.open(index_name("docs", int(j))), wanted, DOCS_SCHEMA.names[1:])
            values, offsets = shingle_arrays(t.column("shingles"))
            for i, record in enumerate(t.drop(["ref", "shingles"]).to_pylist()):
                found.append((jaccard(shingles, values[offsets[i]:offsets[i + 1]]), record["doc_id"], record))
    return sorted(found, key=lambda f: (-f[0], f[1]))
