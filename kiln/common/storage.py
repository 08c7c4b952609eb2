"""Datasets on disk: a folder of Parquet parts plus `_manifest.json`, written so a crash leaves no half file.

Parts are written to a temporary name and renamed; a whole dataset is staged in a sibling folder and
published only after its manifest is written. A dataset `<asset>/<partition>` is a symbolic link to its current
version's hidden folder `.<partition>.v-<id>` beside it, and publishing replaces the link (a rename: atomic). A
reader resolves the link once per read (`Store.snapshot`), so it reads one version whole even while a writer
replaces it: a replaced version is kept `Store.keep_replaced_s` (`storage.keep_replaced_minutes`) before it is
removed. A folder without a manifest is incomplete and is never read. Every version's manifest also stays in
`.<partition>.history/<data_version>.json` beside it (`Store.manifest_at`), so the versions consumers recorded can
be described after they are replaced, with its record files (HISTORY_ROLES: member lists, exposure) in
`.<partition>.history/<data_version>/`, hard links to the version's own (`Store.version_file`).

With a remote (`storage.backend: s3`), S3 is the durable store and `root` is a local cache kept in sync,
so every caller still gets local paths (sentencepiece, memmapped shards, safetensors, training processes):

- a commit swaps the dataset in locally, uploads its files under
  `<prefix>/<asset>/<partition>/<data_version>/`, then `<prefix>/<asset>/<partition>/_manifest.json`
  LAST, then deletes the keys the new manifest does not list. A manifest on S3 therefore always names
  complete files: a crash mid-upload leaves the previous manifest, and its files (another version's
  folder, deleted only after the new manifest is up), readable; the history entry goes up before the manifest,
  to `<prefix>/<asset>/<partition>/_history/<data_version>.json` (its record files below
  `_history/<data_version>/`, before it), and stays;
- a read fetches the remote manifest once per Store (a new Store sees new versions); when the local copy
  is missing or holds another version it downloads the files, verifying each sha256 against the
  manifest, into a staging folder and swaps it in, then serves local paths; a reader of some columns
  (`read_table`, `iter_batches`, `values`, an audit's `opened`: a doc_id lookup, a takedown's URLs) of a version
  this machine has no copy of reads them from S3 by ranged GETs instead, and caches nothing;
- with `Store.cache_max_bytes` (`storage.cache_max_gb`), the cache is bounded: each read dates the dataset's link
  (its last use) and lists the version among what its store has read (`_Reading`), and after a commit or a download
  past the bound the least recently used datasets no live store has read are removed from the cache
  (`Store._bound_cache`), and fetched again by their next read.
"""

from __future__ import annotations

import contextlib
import ctypes
import functools
import glob
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
import uuid
import weakref
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from filelock import FileLock, Timeout

from kiln.common.manifest import (
    MANIFEST_NAME,
    FileEntry,
    Manifest,
    applied_requests,
    data_version_of,
    fsync_dir,
    fsync_file,
    git_commit,
    now_utc,
    sha256_file,
    temporary_name,
    write_json_atomic,
)
from kiln.common.remote import CorruptRemoteFile, LostLock, MissingRemoteFile, RangedObject, S3Remote
from kiln.common.secrets import redact
from kiln.tokens.shard_format import hold_folder

# A file's role is its name's prefix, so any reader can tell documents from rejects, signatures or shards.
ROLE_PREFIX = {"documents": "part", "rejected": "rejected", "quarantine": "quarantine", "signatures": "signatures",
               "decisions": "decisions", "contamination": "contamination", "lines": "lines", "shard": "shard",
               "members": "members", "positions": "positions", "index_buckets": "buckets", "index_ids": "ids",
               "index_docs": "indexed", "exposure": "exposure", "replay_removed": "replay_removed",
               "composition": "composition", "intake_hashes": "intake_hashes"}
# Files that record what a version was made of, by doc id and count (never text): a token-shard set's member list and
# composition (its shards' counts per source), a training run's exposure and replay removals. The store's history
# keeps them with the manifest, so membership, removal requests and `kiln audit source` still answer for a checkpoint
# after the shards it read are replaced (`Store.version_file`).
HISTORY_ROLES = frozenset({"members", "composition", "exposure", "replay_removed"})


def row_group_stats(meta: pq.FileMetaData, column: str) -> list:
    """Each row group's footer statistics of top-level `column` (None where the writer kept none), in row-group
    order; [] when the file has no such column."""
    leaf = next((i for i in range(meta.num_columns) if meta.schema.column(i).path == column), None)
    return [] if leaf is None else [meta.row_group(g).column(leaf).statistics for g in range(meta.num_row_groups)]


def parquet_batches(path: str | Path, batch_size: int, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
    """A Parquet file's rows, `batch_size` at a time, holding about a row group of it at once. ParquetFile's default
    pre-buffering reads the chosen columns of every row group before the first batch (apache/arrow#37139): a token
    shard set's member list, one file of a row per document, would be held whole."""
    yield from pq.ParquetFile(path, pre_buffer=False).iter_batches(batch_size=batch_size, columns=columns)


_FLUSH_THREADS = 8  # fsyncs in flight in `flush_to_disk`

# The files the part task running in this thread has written (`resume_part`), None outside a part task.
_part_task = threading.local()


def write_parquet_atomic(path: Path, table: pa.Table, hash_columns: tuple[str, ...] = (),
                         row_group_size: int | None = None, flush: bool = True, sorted_by: str | None = None) -> None:
    """Temporary name, flushed to disk, renamed: never a half file under `path`, also after a power loss. Inside a
    part task (`resume_part`) the flush waits for the dataset's commit instead, which flushes every part at once;
    `flush=False` leaves it to a caller that flushes the folder itself (`flush_to_disk`) before anything names
    the file. Columns are dictionary-encoded and zstd-compressed, except `hash_columns` (random values: dictionary
    encoding and zstd only cost time there, ~3x to write a signature part and ~2.5x to read it, and made it
    larger; nor have they min/max statistics, which no reader could use, but for `sorted_by`: the hash column the
    rows are sorted by, whose row groups' ranges a reader of a range of it selects by). `row_group_size`: rows per
    row group (None: Parquet's default), for files read a few rows at a time."""
    tmp = temporary_name(path)
    if hash_columns:
        plain = [c for c in table.column_names if c not in hash_columns]
        pq.write_table(table, tmp, compression={c: "zstd" if c in plain else "none" for c in table.column_names},
                       use_dictionary=plain, write_statistics=plain + ([sorted_by] if sorted_by else []),
                       row_group_size=row_group_size)
    else:
        pq.write_table(table, tmp, compression="zstd", row_group_size=row_group_size)
    part_files = getattr(_part_task, "files", None)
    if flush and part_files is None:
        fsync_file(tmp)
    else:  # flushed later, by the dataset's commit or the caller: the disk can start on it now
        start_writeback(tmp)
        if part_files is not None:  # what the commit's manifest says of it, found here, in parallel
            part_files.append((Path(path), table.num_rows, sha256_file(tmp)))
    os.replace(tmp, path)


def resume_part(output: str | Path, run: Callable[[], dict]) -> dict:
    """A part task's result (a JSON-able dict): from its completion marker when an earlier attempt already
    finished this part, else `run()`, then the marker — written after the part's outputs. Markers live in the
    staging folder's hidden `.done/` and are never published.

    The task's Parquet files are not flushed to disk one by one: with two workers, each waiting on the other's
    journal commits cost a fifth of the tasks' time (docs/dedup.md). The marker names each file with its size
    instead, and is trusted only while every file it names is whole (that size, a readable footer): a power
    loss that emptied or cut a file, or the marker, makes the task run again. `DatasetWriter.commit` flushes
    the whole dataset before its manifest names it, and takes each file's rows and SHA-256 from the marker
    (the task hashed what it wrote), so the driver does not read every part again alone."""
    output = Path(output)
    marker = output.parent / ".done" / f"{output.name}.json"
    done = _completed(marker)
    if done is not None:
        return done
    _part_task.files = []
    try:
        result = run()
        files = {os.path.relpath(f, output.parent): {"bytes": f.stat().st_size, "rows": rows, "sha256": sha256}
                 for f, rows, sha256 in _part_task.files}
    finally:
        _part_task.files = None
    marker.parent.mkdir(exist_ok=True)
    # Not flushed either: a marker a power loss took or cut means the task runs again.
    write_json_atomic(marker, json.dumps({"result": result, "files": files}), flush=False)
    return result


def _recorded_files(folder: Path) -> dict[str, dict]:
    """What the completion markers under `folder` record of each file their tasks wrote: path relative to `folder`
    (posix) -> bytes, rows, sha256 (a marker cut short, or from before Kiln recorded them, records nothing)."""
    recorded = {}
    for root, _, names in os.walk(folder):
        if os.path.basename(root) != ".done":
            continue
        base = Path(os.path.relpath(os.path.dirname(root), folder))
        for name in names:
            try:
                files = json.loads(Path(root, name).read_text(encoding="utf-8")).get("files", {})
            except (OSError, ValueError, AttributeError):
                continue
            recorded |= {(base / f).as_posix(): facts for f, facts in files.items() if isinstance(facts, dict)}
    return recorded


def _staged_files(folder: Path) -> tuple[list[str], list[Path]]:
    """A staging folder's files to publish (relative posix paths, in part order; not the manifest) and its hidden
    entries (tasks' markers and temp files, at any depth, not inside another hidden one). One walk, plain strings:
    a dataset of thousands of parts is listed while the workers wait."""
    published, hidden = [], []
    for root, dirs, names in os.walk(folder):
        rel = os.path.relpath(root, folder)
        prefix = "" if rel == "." else Path(rel).as_posix() + "/"
        hidden += [Path(root, d) for d in dirs if d.startswith(".")]
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        for name in names:
            if name.startswith("."):
                hidden.append(Path(root, name))
            elif prefix + name != MANIFEST_NAME:
                published.append(prefix + name)
    return sorted(published, key=_in_part_order), hidden


def _completed(marker: Path) -> dict | None:
    """The result a completion marker records, if it and every file it names are whole; else None."""
    try:
        done = json.loads(marker.read_text(encoding="utf-8"))
    except (FileNotFoundError, ValueError):
        return None
    if set(done) != {"result", "files"}:
        return done  # an earlier Kiln's marker, written after its files were flushed one by one
    for name, facts in done["files"].items():
        path = marker.parent.parent / name
        try:
            if path.stat().st_size != (facts["bytes"] if isinstance(facts, dict) else facts):  # or the size alone
                return None
            pq.read_metadata(path)
        except (OSError, pa.ArrowInvalid):
            return None
    return done["result"]


@functools.cache
def _sync_file_range() -> Callable[..., int] | None:
    """libc's sync_file_range(2) (Linux), else None."""
    libc = ctypes.CDLL(None, use_errno=True) if sys.platform.startswith("linux") else None
    call = getattr(libc, "sync_file_range", None)
    if call is not None:
        call.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    return call


_SYNC_FILE_RANGE_WRITE = 2  # start writing the dirty pages out; do not wait


def start_writeback(path: Path) -> None:
    """Start writing `path`'s data to disk without waiting for it (as PostgreSQL's `*_flush_after` and RocksDB's
    `bytes_per_sync` do), so that a later fsync finds it written; a no-op where sync_file_range(2) is missing."""
    call = _sync_file_range()
    if call is None:
        return
    fd = os.open(path, os.O_RDONLY)
    try:
        call(fd, 0, 0, _SYNC_FILE_RANGE_WRITE)
    finally:
        os.close(fd)


def flush_to_disk(folder: Path) -> None:
    """Everything published under `folder` on disk: an fsync of each file and folder, several at once so that the
    filesystem's journal commits them together. Not syncfs(2): that also writes out every other dirty file of the
    filesystem, a run's scratch included (twice the time for near dedup's output at 200k documents, docs/dedup.md).
    Hidden entries are skipped: a commit never publishes them (scratch, completion markers, temporary files)."""
    folders, files = [folder], []
    for root, dirs, names in os.walk(folder):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        folders += [os.path.join(root, d) for d in dirs]
        files += [os.path.join(root, name) for name in names if not name.startswith(".")]
    # A slice of the files per thread, not a future per file: thousands of parts are flushed while the workers wait.
    with ThreadPoolExecutor(_FLUSH_THREADS) as pool:  # fsync releases the GIL
        slices = [files[i::_FLUSH_THREADS] for i in range(_FLUSH_THREADS)]
        list(pool.map(lambda some: [fsync_file(f) for f in some], slices))
        list(pool.map(fsync_dir, folders))


def resume_key(**identity) -> str:
    """What makes a staged dataset the same one (code version, config, input data versions): a failed step
    re-run with the same key resumes in the same staging folder."""
    return hashlib.sha256(json.dumps(identity, sort_keys=True, default=str).encode()).hexdigest()[:16]


def part_name(role: str, index: int, suffix: str = ".parquet") -> str:
    return f"{ROLE_PREFIX[role]}-{index:05d}{suffix}"


def _in_part_order(relative: str) -> tuple:
    """A file's place in a dataset (its posix path relative to the dataset): numbers compared as numbers, so
    part-100000 follows part-99999 (the padding of `part_name` runs out there) and five-digit names keep the order
    they always had."""
    return tuple((0, int(run), "") if run.isdigit() else (1, 0, run) for run in re.split(r"(\d+)", relative) if run)


def part_files(folder: Path, pattern: str = "*.parquet") -> list[Path]:
    """A folder's files matching `pattern`, in part order (`_in_part_order`; string order puts part 100000 before
    part 20000)."""
    return sorted(Path(folder).glob(pattern), key=lambda path: _in_part_order(path.name))


class IncompleteDataset(FileNotFoundError):
    pass


@dataclass(frozen=True)
class Snapshot:
    """One version of a dataset as a reader sees it: its manifest and the folder of that version's files. Every path
    it gives is that version's, whatever a writer publishes meanwhile (it is kept `Store.keep_replaced_s` after
    being replaced)."""

    folder: Path
    manifest: Manifest

    def files(self, role: str) -> list[Path]:
        return [self.folder / f.path for f in self.manifest.files_with_role(role)]

    def read_table(self, role: str = "documents", columns: list[str] | None = None,
                   filters: list[tuple] | None = None) -> pa.Table:
        """This version's files of one role as one table; `filters` (pyarrow's, e.g. [("source", "=", "web")])
        skip row groups by their statistics before decoding and keep only the matching rows."""
        return _read_table(self.files(role), columns, filters)

    def iter_batches(self, role: str = "documents", batch_size: int = 1000,
                     columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        for path in self.files(role):
            yield from parquet_batches(path, batch_size, columns)

    def values(self, column: str, doc_ids: set[str] | None = None) -> dict[str, object]:
        """doc_id -> `column` of this version's documents (only `doc_ids` when given), reading two columns."""
        return _values(self.iter_batches("documents", columns=["doc_id", column]), column, doc_ids)


def _values(batches: Iterator[pa.RecordBatch], column: str, doc_ids: set[str] | None) -> dict[str, object]:
    found = {}
    for batch in batches:
        for doc_id, value in zip(batch.column("doc_id").to_pylist(), batch.column(column).to_pylist()):
            if doc_ids is None or doc_id in doc_ids:
                found[doc_id] = value
    return found


def _read_table(files: list[Path | RangedObject], columns: list[str] | None, filters: list[tuple] | None) -> pa.Table:
    if not files:
        return pa.table({})
    return pa.concat_tables([pq.read_table(f, columns=columns, filters=filters) for f in files])


COMMIT_LOCK = "_commit.lock"  # beside a dataset's manifest on S3, while a writer publishes it
# beside a dataset's manifest on S3: `<data_version>.json` for every version published, its record files in
# `<data_version>/`
HISTORY = "_history"

# How long a replaced version stays for the readers that resolved it before the replace (storage.keep_replaced_minutes).
KEEP_REPLACED_S = 3600.0


@dataclass(frozen=True)
class Store:
    """Where Kiln keeps its datasets: `<root>/<asset>/<partition>/`, each a link to its current version's folder;
    with a `remote`, durably on S3 and `root` is the local cache (see the module docstring)."""

    root: Path
    remote: S3Remote | None = None
    keep_replaced_s: float = KEEP_REPLACED_S
    cache_max_bytes: int | None = None  # with a remote: the most the local cache may hold (None: unbounded)
    # (asset, partition) -> the remote manifest's bytes (None: not on S3) once this Store has synced it
    _synced: dict[tuple[str, str | None], bytes | None] = field(default_factory=dict, init=False, repr=False,
                                                                compare=False)
    # with a bounded cache: the versions this store has read, which no process evicts while it lives
    _reading: _Reading | None = field(default=None, init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        if self.remote is not None and self.cache_max_bytes is not None:
            object.__setattr__(self, "_reading", _Reading(self.root))  # frozen: set once, here

    @classmethod
    def configured(cls, root: Path, settings, remote: S3Remote | None = None) -> Store:
        """The store the project's `storage:` section (StorageSettings) describes, at `root`; `remote`: the bucket's,
        with `backend: s3`."""
        return cls(Path(root), remote, keep_replaced_s=settings.keep_replaced_s,
                   cache_max_bytes=settings.cache_max_bytes)

    def dataset_dir(self, asset: str, partition: str | None = None) -> Path:
        """The dataset's local path (the link to its current version; with a remote, brought up to date with S3
        first). A path under it is resolved when it is opened: a reader of several files takes a `snapshot`."""
        if self.remote is not None:
            self._sync(asset, partition)
        return self._local_dir(asset, partition)

    def location(self, asset: str, partition: str | None = None) -> str:
        """Where the dataset is kept for good, named without fetching it: its folder in the bucket with S3 storage,
        else its local folder."""
        if self.remote is not None:
            return self.remote.url(self._remote_dir(asset, partition))
        return str(self._local_dir(asset, partition))

    def _local_dir(self, asset: str, partition: str | None = None) -> Path:
        path = self.root / asset / (partition or "_all")
        _restore_if_swapped_out(path)
        return path

    def snapshot(self, asset: str, partition: str | None = None) -> Snapshot:
        """The dataset's current version, pinned: its manifest and its folder, both of one version."""
        final = self._local_dir(asset, partition)
        if self.remote is not None and self._sync(asset, partition) is None:
            stale = f"; the local copy {final} is not on S3 (an upload that did not finish, or data from before " \
                    f"storage.backend: s3)" if (final / MANIFEST_NAME).is_file() else ""
            raise IncompleteDataset(f"{asset}[{partition}] has not been materialized (no "
                                    f"{self.remote.url(self._remote_dir(asset, partition))}/{MANIFEST_NAME}"
                                    f"{stale}); materialize it first")
        for last in (False, True):
            folder = _version_of(final)
            try:
                data = (folder / MANIFEST_NAME).read_bytes()
            except FileNotFoundError:
                if self.remote is not None and not last and not os.path.lexists(final):
                    # evicted from the cache by another process since the sync: fetched again
                    self._synced[(asset, partition or None)] = self._pull(asset, partition)
                    continue
            else:
                manifest = Manifest.from_dict(json.loads(data))
                synced = self._synced.get((asset, partition or None)) if self.remote is not None else None
                if synced is None or data == synced or last or \
                        manifest.data_version == json.loads(synced).get("data_version"):
                    return Snapshot(folder, manifest)
                # Another process on this machine swapped in another version (a pull of an older one that finished
                # after this process committed a newer): bring the copy back to the version S3 holds.
                self._synced[(asset, partition or None)] = self._pull(asset, partition)
                continue
            if last or not final.parent.is_dir():
                break
            # Between a swap's two renames (a plain folder made a link) there is no folder: wait for the swap.
            with _swap_lock(final):
                pass
            _restore_if_swapped_out(final)
        raise IncompleteDataset(f"{asset}[{partition}] has not been materialized (no {final / MANIFEST_NAME}); "
                                f"materialize it first")

    def manifest(self, asset: str, partition: str | None = None) -> Manifest:
        return self.snapshot(asset, partition).manifest

    def manifest_at(self, asset: str, partition: str | None, data_version: str) -> Manifest | None:
        """The manifest of one version of a dataset: the current version's, else the store's history's (every version
        it has published, without the removal examples), or None when the store never published it (or did before
        it kept a history). With S3 storage, S3's manifests: no dataset is fetched to answer."""
        return self._manifest_at(asset, partition, data_version, self.published_manifest(asset, partition))

    def _manifest_at(self, asset: str, partition: str | None, data_version: str,
                     current: Manifest | None) -> Manifest | None:
        if current is not None and current.data_version == data_version:
            return current
        if not re.fullmatch(r"[0-9a-f]{1,64}", data_version):
            return None  # not a data version: never a path to open
        name = f"{data_version}.json"
        with contextlib.suppress(FileNotFoundError):
            return Manifest.from_dict(json.loads((_history_dir(self._local_dir(asset, partition)) / name).read_text(
                encoding="utf-8")))
        if self.remote is not None:
            key = f"{self._remote_dir(asset, partition)}/{HISTORY}/{name}"
            if (data := self.remote.get_bytes(key)) is not None:
                return _remote_manifest(data, self.remote.url(key))
        return None

    def version_file(self, asset: str, partition: str | None, data_version: str, path: str) -> Path | None:
        """A record file (HISTORY_ROLES: a member list, an exposure) of one version of a dataset, by its path in the
        version, without fetching the rest of the version (with S3 storage, a member list is not the token shards):
        this machine's copy of that version, else the history's copy; with S3 storage, S3's, downloaded alone into
        the history and checked against its sha256. None when the store holds no such file of that version (not a
        record file, or a version from before the history kept them)."""
        if not re.fullmatch(r"[0-9a-f]{1,64}", data_version) or Path(path).is_absolute() or ".." in Path(path).parts:
            return None  # never a path outside the dataset to open
        final = self._local_dir(asset, partition)
        folder = _version_of(final)
        if _data_version_in(folder) == data_version:
            self._used(final)
            return folder / path
        kept = _history_dir(final) / data_version / path
        if kept.is_file():
            return kept
        if self.remote is None:
            return None
        manifest = self.manifest_at(asset, partition, data_version)
        entry = next((f for f in manifest.files if f.path == path), None) if manifest else None
        if entry is None or entry.role not in HISTORY_ROLES:
            return None
        remote_dir = self._remote_dir(asset, partition)
        kept.parent.mkdir(parents=True, exist_ok=True)
        # S3's history copy; else the version's own (a current version published before the history kept records)
        for key in (f"{remote_dir}/{HISTORY}/{data_version}/{path}", f"{remote_dir}/{data_version}/{path}"):
            pulled = kept.with_name(f".{kept.name}.pull-{uuid.uuid4().hex[:8]}")
            try:
                self.remote.download_files([(key, pulled, entry.sha256)])
                os.replace(pulled, kept)
                return kept
            except MissingRemoteFile:
                continue
            finally:
                pulled.unlink(missing_ok=True)
        return None

    @contextmanager
    def opened(self, manifest: Manifest, paths: list[str]) -> Iterator[list[Path | RangedObject]]:
        """Files of the version `manifest` describes (the current one; `paths` as it lists them) for a reader of a few
        of their columns: the local copy's when this machine holds that version, else, with S3 storage, each opened on
        S3 for ranged reads (`RangedObject`), so the columns not read never leave S3 and nothing is cached. Without S3,
        a version the store no longer holds is IncompleteDataset."""
        final = self._local_dir(manifest.asset, manifest.partition)
        folder = _version_of(final)
        if _data_version_in(folder) == manifest.data_version:
            self._used(final)
            yield [folder / p for p in paths]
            return
        if self.remote is None:
            raise IncompleteDataset(f"{manifest.asset}[{manifest.partition}] version {manifest.data_version} is no "
                                    f"longer in {final}: it was replaced while it was read")
        entries = {f.path: f for f in manifest.files}
        version_dir = f"{self._remote_dir(manifest.asset, manifest.partition)}/{manifest.data_version}"
        files = [self.remote.open_ranged(f"{version_dir}/{p}", entries[p].bytes, entries[p].sha256) for p in paths]
        try:
            yield files
        finally:
            for f in files:
                f.close()

    def history(self, asset: str, partition: str | None = None) -> list[Manifest]:
        """Every version of a dataset the store has published (as `manifest_at` gives it), oldest first."""
        folder = _history_dir(self._local_dir(asset, partition))
        names = {p.name for p in folder.glob("*.json")} if folder.is_dir() else set()
        if self.remote is not None:
            prefix = f"{self._remote_dir(asset, partition)}/{HISTORY}/"
            names |= {k.removeprefix(prefix) for k in self.remote.list_keys(prefix)}  # with the record files' keys
        current = self.published_manifest(asset, partition)
        found = (self._manifest_at(asset, partition, name.removesuffix(".json"), current) for name in names
                 if name.endswith(".json") and "/" not in name)
        return sorted((m for m in found if m is not None), key=lambda m: m.created_at)

    def published_manifest(self, asset: str, partition: str | None = None) -> Manifest | None:
        """The current version's manifest without fetching its files (with a remote, S3's: a question about the
        store, not a read of its data), or None when the dataset has not been materialized."""
        if self.remote is None:
            return self.manifest_or_none(asset, partition)
        key = f"{self._remote_dir(asset, partition)}/{MANIFEST_NAME}"
        data = self.remote.get_bytes(key)
        return None if data is None else _remote_manifest(data, self.remote.url(key))

    def manifest_or_none(self, asset: str, partition: str | None = None) -> Manifest | None:
        """The manifest, or None when the dataset has not been materialized."""
        found = self.snapshot_or_none(asset, partition)
        return None if found is None else found.manifest

    def snapshot_or_none(self, asset: str, partition: str | None = None) -> Snapshot | None:
        """The pinned current version, or None when the dataset has not been materialized."""
        try:
            return self.snapshot(asset, partition)
        except IncompleteDataset:
            return None

    def files(self, asset: str, partition: str | None, role: str) -> list[Path]:
        return self.snapshot(asset, partition).files(role)

    def read_table(self, asset: str, partition: str | None, role: str = "documents",
                   columns: list[str] | None = None, filters: list[tuple] | None = None) -> pa.Table:
        """The current version's rows of `role` as one table (`Snapshot.read_table`), read as `iter_batches` reads
        them: with S3 storage, its columns from S3, the dataset not fetched."""
        with self._role_files(asset, partition, role) as files:
            return _read_table(files, columns, filters)

    def iter_batches(self, asset: str, partition: str | None, role: str = "documents",
                     batch_size: int = 1000, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        """The current version's rows of `role`, `columns` of them, a batch at a time. With S3 storage the dataset is
        not fetched for it: unless this machine holds that version, the columns are read from S3 (`opened`), so a
        reader of doc ids and URLs (a takedown's) leaves the texts there."""
        with self._role_files(asset, partition, role) as files:
            for f in files:
                yield from parquet_batches(f, batch_size, columns)

    @contextmanager
    def _role_files(self, asset: str, partition: str | None, role: str) -> Iterator[list[Path | RangedObject]]:
        """The current version's files of `role` for a reader of some of their columns: its local paths (with S3
        storage, where this store has synced it already), else the files opened on S3 (`opened`: the local copy when
        this machine holds the version S3 does)."""
        if self.remote is None or self._synced.get((asset, partition or None)) is not None:
            yield self.snapshot(asset, partition).files(role)
            return
        manifest = self.published_manifest(asset, partition)
        if manifest is None:
            raise IncompleteDataset(f"{asset}[{partition}] has not been materialized (no "
                                    f"{self.remote.url(self._remote_dir(asset, partition))}/{MANIFEST_NAME}); "
                                    f"materialize it first")
        try:
            with self.opened(manifest, [f.path for f in manifest.files_with_role(role)]) as files:
                yield files
        except MissingRemoteFile:  # its files are deleted once a newer version is up
            raise IncompleteDataset(f"{asset}[{partition}] was materialized again while it was read (version "
                                    f"{manifest.data_version}); read it again") from None

    def values(self, asset: str, partition: str | None, column: str,
               doc_ids: set[str] | None = None) -> dict[str, object]:
        """doc_id -> `column` of a dataset's current documents (only `doc_ids` when given), read as `iter_batches`
        reads them."""
        return _values(self.iter_batches(asset, partition, columns=["doc_id", column]), column, doc_ids)

    def partitions(self, asset: str) -> list[str | None]:
        """The partitions of an asset with a current version: None for an unpartitioned one, `<refresh>` for a
        per-refresh one, `<source>/<refresh>` for a document dataset. With S3 storage, those in the bucket too: a
        machine's cache holds only what it has read, and a question about the store (an audit, a takedown of a
        source the config no longer names) must see every one."""
        found = {partition for _, partition in _local_datasets(self.root / asset)}
        if self.remote is not None:
            for child in self.remote.listing(self.remote.key(asset))[1]:
                files, below = self.remote.listing(self.remote.key(asset, child))
                if MANIFEST_NAME in files:
                    found.add(None if child == "_all" else child)
                else:  # a source's folder: its refreshes below
                    found |= {f"{child}/{g}" for g in below
                              if MANIFEST_NAME in self.remote.listing(self.remote.key(asset, child, g))[0]}
        return sorted(found, key=str)

    def lock(self, name: str) -> FileLock:
        """A file lock named `name` in the store: it holds across processes of one machine (or one shared
        KILN_HOME), and the OS drops it when its holder dies."""
        folder = self.root / ".locks"
        folder.mkdir(parents=True, exist_ok=True)
        return FileLock(folder / f"{name}.lock")

    @contextmanager
    def registry_lock(self, name: str) -> Iterator[None]:
        """Held for a read-modify-write of a registry (the refreshes, the removal requests): two processes appending
        at once would otherwise each rewrite the list without the other's entry. With S3 storage every machine has
        its own cache, so the lock is also one in the bucket, and the registry is read from S3 again under it: a
        copy pulled before may lack another machine's entry."""
        with self.lock(name):
            if self.remote is None:
                yield
                return
            with self.remote.lock(self.remote.key(".locks", name)):
                self._synced.pop((name, None), None)
                yield

    def shared_scratch(self, asset: str, name: str) -> Path:
        """A folder that several partitions' runs of `asset` share for intermediate work (a refresh's exact-dedup
        shuffle): hidden beside the datasets, never published; on a cluster, on the shared KILN_HOME like them."""
        return self.root / asset / f".shared-{name}"

    def staging(self, asset: str, partition: str | None = None, resume: str | None = None) -> DatasetWriter:
        """A writer for a new version; with `resume` (a `resume_key`), a failed attempt's staging folder is kept
        and the next attempt with the same key picks up the parts it completed."""
        return DatasetWriter(self._local_dir(asset, partition), asset, partition, store=self, resume=resume)

    # ----------------------------------------------------------------------------------- S3 sync

    def _remote_dir(self, asset: str, partition: str | None) -> str:
        return self.remote.key(asset, partition or "_all")

    def _sync(self, asset: str, partition: str | None) -> bytes | None:
        key, final = (asset, partition or None), self._local_dir(asset, partition)
        # "Not on S3" is never remembered: another process (a step of the same run) may commit it next. Nor is a
        # local copy: the cache may have evicted it since.
        if self._synced.get(key) is None or not os.path.lexists(final):
            self._synced[key] = self._pull(asset, partition)
        self._used(final)
        return self._synced[key]

    def _used(self, final: Path) -> None:
        """Note that this store reads the cached dataset `final`: its last use, which the cache's eviction goes by
        (the link's own time), and, with a bounded cache, a version no process evicts while this store lives."""
        with contextlib.suppress(OSError):
            os.utime(final, follow_symlinks=False)
        if self._reading is not None and final.is_symlink():
            self._reading.add(_version_of(final))

    def _pull(self, asset: str, partition: str | None) -> bytes | None:
        """Make the local copy the version on S3; the remote manifest's bytes, or None when S3 has none."""
        remote_dir, local = self._remote_dir(asset, partition), self._local_dir(asset, partition)
        data = self.remote.get_bytes(f"{remote_dir}/{MANIFEST_NAME}")
        while data is not None:
            manifest = _remote_manifest(data, self.remote.url(f"{remote_dir}/{MANIFEST_NAME}"))
            if _local_copy_is(local, data, manifest):
                return data
            try:
                self._download(local, f"{remote_dir}/{manifest.data_version}", manifest, data)
                return data
            except MissingRemoteFile:
                # A newer version replaced this one (and deleted its files) while we read: start over with it.
                newer = self.remote.get_bytes(f"{remote_dir}/{MANIFEST_NAME}")
                if newer == data:
                    raise
                data = newer
        return None

    def _download(self, local: Path, version_dir: str, manifest: Manifest, data: bytes) -> None:
        local.parent.mkdir(parents=True, exist_ok=True)
        staging = local.with_name(f".{local.name}.pull-{uuid.uuid4().hex[:8]}")
        try:
            for f in manifest.files:
                (staging / f.path).parent.mkdir(parents=True, exist_ok=True)
            staging.mkdir(exist_ok=True)
            self.remote.download_files([(f"{version_dir}/{f.path}", staging / f.path, f.sha256)
                                        for f in manifest.files])
            (staging / MANIFEST_NAME).write_bytes(data)  # last, as a writer does
            if _local_copy_is(local, data, manifest):  # another process (another step) fetched it meanwhile
                return
            replaced = _whole(_version_of(local)) if local.exists() else None
            try:
                _swap_in(staging, local)
            except OSError:  # ... or just now: fine if it is this version
                if not _local_copy_is(local, data, manifest):
                    raise
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        # The version pulled replaces this machine's copy as a commit replaces the writer's: kept for its readers as
        # long, and not at all when the new one applies a removal request the old did not (its documents may be in
        # it), or every machine that ever read a dataset would keep each version of it, forgotten documents included.
        forgotten = bool(applied_requests(manifest) - applied_requests(replaced))
        _remove_replaced(local, 0 if forgotten else self.keep_replaced_s)
        remove_replaced_versions(self.root, self.keep_replaced_s)
        self._bound_cache(spare=local)

    def _push(self, asset: str, partition: str | None, manifest: Manifest, folder: Path) -> None:
        """Upload a just-committed local dataset (its version's `folder`): files, then the manifest, then delete
        stale keys."""
        key = (asset, partition or None)
        self._synced.pop(key, None)  # until the manifest is up, S3 still holds the previous version
        remote_dir = self._remote_dir(asset, partition)
        version_dir = f"{remote_dir}/{manifest.data_version}"
        data = (folder / MANIFEST_NAME).read_bytes()
        lock = f"{remote_dir}/{COMMIT_LOCK}"
        # One writer at a time per dataset, on every machine: another's stale-key deletion would take files this
        # one has uploaded but not yet named in the manifest.
        with self.remote.lock(lock) as still_held:
            self.remote.upload_files([(folder / f.path, f"{version_dir}/{f.path}") for f in manifest.files] +
                                     [(folder / f.path, f"{remote_dir}/{HISTORY}/{manifest.data_version}/{f.path}")
                                      for f in manifest.files if f.role in HISTORY_ROLES])
            self.remote.put_bytes(f"{remote_dir}/{HISTORY}/{manifest.data_version}.json",
                                  manifest.for_history().to_json().encode())
            still_held()
            self.remote.put_bytes(f"{remote_dir}/{MANIFEST_NAME}", data)
            self._synced[key] = data
            keep = {f"{remote_dir}/{MANIFEST_NAME}", lock} | {f"{version_dir}/{f.path}" for f in manifest.files}
            stale = [k for k in self.remote.list_keys(remote_dir)
                     if k not in keep and not k.startswith(f"{remote_dir}/{HISTORY}/")]
            try:  # guarded too: past a lapsed lease, stale-looking keys may be the next holder's unnamed uploads
                self.remote.delete_keys(stale, before_each=still_held)
            except LostLock:  # this version is published; any later commit deletes what is stale
                print(f"kiln: {self.remote.url(lock)}: the commit lock lapsed after this version was published; "
                      f"its stale objects are left for the next commit to delete", file=sys.stderr, flush=True)
        self._bound_cache(spare=self._local_dir(asset, partition))

    def _bound_cache(self, spare: Path) -> None:
        """With `cache_max_bytes`: while the cache holds more, remove from it the current version of the dataset used
        least recently (its link's time, `_sync`), one at a time, never `spare` (the dataset just committed or
        pulled). Only a version S3 holds (its manifest there names the same data version), that no live store has
        read (`_Reading`: a step may still be at work on its files), not used for `keep_replaced_s` (for readers
        outside a store: the grace a replaced version gets), and not held (`_held`: a training run's loader). One
        process bounds the cache at a time; the others skip it."""
        if self.remote is None or self.cache_max_bytes is None:
            return
        lock = self.lock("cache")
        try:
            lock.acquire(timeout=0)
        except Timeout:
            return
        try:
            used = disk_bytes(self.root)
            if used <= self.cache_max_bytes:
                return
            evicted, now, read = [], time.time(), _read_by_live_stores(self.root)
            for last_use, final, asset, partition in sorted(_cached_datasets(self.root)):
                if used <= self.cache_max_bytes or now - last_use < self.keep_replaced_s:
                    break  # the rest were used more recently
                if final == spare or _version_of(final).relative_to(self.root).as_posix() in read:
                    continue
                remote = self.remote.get_bytes(f"{self._remote_dir(asset, partition)}/{MANIFEST_NAME}")
                if remote is None:
                    continue
                freed = _evict(final, json.loads(remote).get("data_version"), last_use)
                if freed is not None:
                    used -= freed
                    evicted.append(f"{asset}[{partition}]")
                    self._synced.pop((asset, partition), None)
            bound = f"storage.cache_max_gb ({self.cache_max_bytes / 1e9:.3g} GB)"
            if evicted:
                print(f"kiln: the cache {self.root} was over {bound}: removed {', '.join(evicted)} (on S3; fetched "
                      f"again when read)", file=sys.stderr, flush=True)
            if used > self.cache_max_bytes:
                print(f"kiln: the cache {self.root} holds {used / 1e9:.3g} GB, over {bound}: the rest was read in the last "
                      f"storage.keep_replaced_minutes or by a step still running, is held by a reader, or is not on S3",
                      file=sys.stderr, flush=True)
        finally:
            lock.release()


READERS = ".readers"  # in a bounded cache's root: what each live store has read (`_Reading`)


class _Reading:
    """The versions one Store has read from a bounded cache (a Store serves one step), listed in
    `<root>/.readers/<id>.json` beside `<id>.lock`, which the Store holds (flock) while it lives: a version a live
    store has read is never evicted, however long ago it read it (a step that reads its inputs first and works on
    them for hours, or hands their paths to engine tasks). One descriptor per store, whatever it reads."""

    def __init__(self, root: Path):
        self.folder, self.name, self.versions, self._lock = root / READERS, uuid.uuid4().hex, set(), threading.Lock()
        self.root, self._fd = root, None

    def add(self, version: Path) -> None:
        relative = version.relative_to(self.root).as_posix()
        with self._lock:
            if relative in self.versions:
                return
            if self._fd is None:  # the lock before the list: a list is only ever seen with its lock held
                import fcntl

                self.folder.mkdir(parents=True, exist_ok=True)
                self._fd = os.open(self.folder / f"{self.name}.lock", os.O_RDWR | os.O_CREAT, 0o644)
                fcntl.flock(self._fd, fcntl.LOCK_EX)
                weakref.finalize(self, _let_go, self._fd, self.folder, self.name)
            self.versions.add(relative)
            write_json_atomic(self.folder / f"{self.name}.json", json.dumps(sorted(self.versions)), flush=False)


def _let_go(fd: int, folder: Path, name: str) -> None:
    for suffix in (".json", ".lock"):
        (folder / f"{name}{suffix}").unlink(missing_ok=True)
    os.close(fd)


def _read_by_live_stores(root: Path) -> set[str]:
    """The versions (relative to `root`) that live stores have read; the lists of stores that died are removed."""
    import fcntl

    read = set()
    for listing in (root / READERS).glob("*.json"):
        try:
            fd = os.open(listing.with_suffix(".lock"), os.O_RDWR)
        except FileNotFoundError:  # its store let go between the glob and here
            continue
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:  # held: its store lives
            with contextlib.suppress(FileNotFoundError, ValueError):
                read |= set(json.loads(listing.read_text(encoding="utf-8")))
        else:  # its store died without letting go (SIGKILL)
            listing.unlink(missing_ok=True)
            listing.with_suffix(".lock").unlink(missing_ok=True)
        finally:
            os.close(fd)
    return read


def disk_bytes(root: Path) -> int:
    """The bytes of the files under `root`, each file once (a history's record files are hard links to a version's)."""
    seen, total = set(), 0
    for folder, _, names in os.walk(root):
        for name in names:
            with contextlib.suppress(FileNotFoundError):
                st = os.lstat(os.path.join(folder, name))
                if (st.st_dev, st.st_ino) not in seen:
                    seen.add((st.st_dev, st.st_ino))
                    total += st.st_size
    return total


def _local_datasets(base: Path) -> Iterator[tuple[Path, str | None]]:
    """(path, partition) of every dataset with a current version in one asset's folder `base`. Partitions are `_all`
    (None), `<refresh>` or `<source>/<refresh>`: a dataset in the asset's folder or one below."""
    for child in sorted(base.iterdir()) if base.is_dir() else []:
        if not child.is_dir() or child.name.startswith("."):
            continue
        if (child / MANIFEST_NAME).is_file():
            yield child, None if child.name == "_all" else child.name
        else:
            yield from ((g, f"{child.name}/{g.name}") for g in sorted(child.iterdir())
                        if g.is_dir() and not g.name.startswith(".") and (g / MANIFEST_NAME).is_file())


def _cached_datasets(root: Path) -> Iterator[tuple[float, Path, str, str | None]]:
    """(last use, link, asset, partition) of every dataset in the store at `root` whose current version is a
    versioned folder (its path a link)."""
    for asset in [a for a in root.iterdir() if a.is_dir() and not a.name.startswith(".")] if root.is_dir() else []:
        for final, partition in _local_datasets(asset):
            if final.is_symlink():
                with contextlib.suppress(FileNotFoundError):
                    yield final.lstat().st_mtime, final, asset.name, partition


def _evict(final: Path, remote_version: str | None, last_use: float) -> int | None:
    """Remove `final`'s current version from the cache if it is still the one S3 holds (`remote_version`), unused
    since `last_use` and not held: its link first (a reader then fetches it again), then its folder. Under the
    swap lock, so no writer or download is between its renames. The bytes freed, or None when it stays."""
    with _swap_lock(final):
        version = _version_of(final)
        try:
            local = json.loads((version / MANIFEST_NAME).read_bytes()).get("data_version")
            unused = final.lstat().st_mtime <= last_use
        except (OSError, ValueError):
            return None
        if version == final or local != remote_version or not unused or _held(version):
            return None
        freed = sum(p.stat().st_size for p in version.rglob("*") if p.is_file() and p.stat().st_nlink == 1)
        trash = final.with_name(f".{final.name}.trash-{uuid.uuid4().hex[:8]}")
        final.unlink()
        os.replace(version, trash)
        fsync_dir(final.parent)
    shutil.rmtree(trash, ignore_errors=True)
    return freed


def _remote_manifest(data: bytes, where: str) -> Manifest:
    try:
        manifest = Manifest.from_dict(json.loads(data))
    except (ValueError, TypeError, KeyError) as exc:
        raise CorruptRemoteFile(f"{where} is not a readable Kiln manifest ({exc})") from None
    unsafe = [f.path for f in manifest.files if Path(f.path).is_absolute() or ".." in Path(f.path).parts]
    if unsafe or data_version_of(manifest.files) != manifest.data_version:
        raise CorruptRemoteFile(f"{where}: its file list does not match its data version {manifest.data_version}"
                                + (f" (unsafe paths {unsafe[:3]})" if unsafe else "") + "; the manifest was altered")
    return manifest


def _local_copy_is(local: Path, data: bytes, manifest: Manifest) -> bool:
    """Whether the local folder holds this version (files present with their sizes; the manifest bytes are
    refreshed in place when only its metadata changed, e.g. the same data re-materialized elsewhere)."""
    local = _version_of(local)
    path = local / MANIFEST_NAME
    if not path.is_file():
        return False
    for f in manifest.files:
        p = local / f.path
        if not p.is_file() or p.stat().st_size != f.bytes:
            return False
    current = path.read_bytes()
    if current == data:
        return True
    try:
        same = Manifest.from_dict(json.loads(current)).data_version == manifest.data_version
    except (ValueError, TypeError, KeyError):
        return False
    if same:
        write_json_atomic(path, data.decode("utf-8"))
    return same


@contextmanager
def lock_then_remove(lock_path: str | Path, wait: bool = True) -> Iterator[bool]:
    """Hold the file lock at `lock_path` (waiting for it, or not at all when `wait` is false); yields whether it
    is held. Its file is removed on the way out, still held, so no lock file outlives what it guarded (filelock
    copes with a lock file unlinked under a waiting process)."""
    lock = FileLock(lock_path)
    try:
        lock.acquire(timeout=-1 if wait else 0)
    except Timeout:
        yield False
        return
    try:
        yield True
    finally:
        Path(lock.lock_file).unlink(missing_ok=True)
        lock.release()


# How long a new writer waits for its staging folder's lock before it calls the folder busy: a live writer holds it
# for its whole run, another writer's cleanup (`_remove_stale_staging`) for a rename.
_STAGING_LOCK_WAIT_S = 1.0


def _siblings(final: Path, kind: str, suffix: str = "") -> list[Path]:
    """`final`'s hidden siblings of one kind, `.<name>.<kind>-<id><suffix>`, with an id without dots: a refresh key
    may hold '.' and '-', so a glob of `.corpus.v-*` alone also lists `.corpus.v-2.v-<id>`, a version of the
    partition named `corpus.v-2`."""
    whole = re.compile(rf"\.{re.escape(final.name)}\.{kind}-[^./]+{re.escape(suffix)}")
    return [p for p in final.parent.glob(f".{glob.escape(final.name)}.{kind}-*{suffix}") if whole.fullmatch(p.name)]


def _remove_stale_staging(final: Path) -> None:
    """Staging folders of `final`'s dataset that no live writer holds — a failed attempt under inputs since
    replaced, a killed run — and what a killed swap left (an old copy, a link never put in place): removed after a
    commit, so they do not pile up. A live writer holds its folder's lock, so its folder is skipped. What a swap
    leaves is removed under the swap lock: another writer's link, made under that lock, is only ever seen in place."""
    with _swap_lock(final):
        stale = [*_siblings(final, "old"), *_siblings(final, "trash"), *_siblings(final, "link")]
        aside = [final.with_name(f".{final.name}.trash-{uuid.uuid4().hex[:8]}") for _ in stale]
        for path, trash in zip(stale, aside):
            with contextlib.suppress(FileNotFoundError):
                os.replace(path, trash)  # a rename under the lock; the removal, which may take long, after it
    for trash in aside:
        shutil.rmtree(trash, ignore_errors=True) if trash.is_dir() and not trash.is_symlink() else \
            trash.unlink(missing_ok=True)
    for folder in [p for p in _siblings(final, "staging") if p.is_dir()]:
        trash = final.with_name(f".{final.name}.trash-{uuid.uuid4().hex[:8]}")
        with lock_then_remove(f"{folder}.lock", wait=False) as held:
            if not held:
                continue  # a live writer
            try:
                os.replace(folder, trash)  # moved aside under the lock (a rename: held for microseconds), removed after
            except FileNotFoundError:
                continue  # its writer swapped it in (and let go of its lock) since it was listed
        shutil.rmtree(trash, ignore_errors=True)
    for lock in _siblings(final, "staging", ".lock"):  # of a writer killed after its folder went in
        if not lock.with_suffix("").exists():
            with lock_then_remove(lock, wait=False):
                pass


def _swap_lock(final: Path):
    """The dataset's swap lock (no lock file stays beside the dataset)."""
    return lock_then_remove(final.with_name(f".{final.name}.swap.lock"))


def _version_of(final: Path) -> Path:
    """The folder of the version of `final` a reader reads now: the one its link names (resolved once, so every
    file a reader opens comes from one version), else `final` itself (a folder written before versioned folders,
    or nothing)."""
    try:
        return final.parent / os.readlink(final)
    except OSError:  # not a link, or nothing there
        return final


def _data_version_in(version: Path) -> str | None:
    """The data version of a version's folder, as its manifest names it (None: no whole version there)."""
    try:
        return json.loads((version / MANIFEST_NAME).read_bytes()).get("data_version")
    except (OSError, ValueError, AttributeError):
        return None


def _history_dir(final: Path) -> Path:
    """Where the manifest of every version `final` has published stays (`Manifest.for_history`), after the version's
    files are removed: consumers record the versions they read, and lineage follows them there."""
    return final.with_name(f".{final.name}.history")


def _keep_records(history: Path, manifest: Manifest, folder: Path) -> None:
    """The version's record files (HISTORY_ROLES) into `history/<data_version>/`, whole or not at all: hard links to
    the version's own, so they cost no space until the version is removed."""
    records = [f for f in manifest.files if f.role in HISTORY_ROLES]
    kept = history / manifest.data_version
    if not records or kept.is_dir():  # kept already: the same version again, the same files (its data version says)
        return
    staging = history / f".{manifest.data_version}.staging-{uuid.uuid4().hex[:8]}"
    try:
        for f in records:
            (staging / f.path).parent.mkdir(parents=True, exist_ok=True)
            try:
                os.link(folder / f.path, staging / f.path)
            except OSError:  # a file system without hard links
                shutil.copyfile(folder / f.path, staging / f.path)
                fsync_file(staging / f.path)
        fsync_dir(staging)
        with contextlib.suppress(OSError):  # a writer of the same version got there first: the same files
            os.rename(staging, kept)
            fsync_dir(history)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _replaced_marker(version: Path) -> Path:
    """A file beside a version folder whose time is when the version was replaced (`_remove_replaced`)."""
    return version.with_name(f"{version.name}.replaced")


def _swap_in(staging: Path, final: Path, flushed: bool = False) -> Path:
    """Publish the complete folder `staging` as `final`'s new version; returns the version's folder. The folder is
    renamed to a new version folder `.<name>.v-<id>` and a link to it replaces `final` (a rename: atomic), under
    the dataset's swap lock; the replaced version is marked with the time and kept for its readers
    (`_remove_replaced`). A writer killed at any step leaves `final` on the old version, complete. Every file is on
    disk before the link makes it visible: flushed here, unless the caller did (`flushed`).

    A plain folder at `final` (a store written before versioned folders) is renamed aside first, as swaps used to
    do: a writer killed before the link is in leaves it aside, complete, and the next reader puts it back
    (`_restore_if_swapped_out`)."""
    if not flushed:
        staging_files = [p for p in staging.rglob("*") if p.is_file()]
        for path in staging_files:
            fsync_file(path)
        for folder in {p.parent for p in staging_files} | {staging}:
            fsync_dir(folder)
    version = final.with_name(f".{final.name}.v-{uuid.uuid4().hex[:12]}")
    link = final.with_name(f".{final.name}.link-{uuid.uuid4().hex[:8]}")
    plain = None
    with _swap_lock(final):
        os.replace(staging, version)
        os.symlink(version.name, link)  # relative: the store may be moved or mounted elsewhere
        if final.is_symlink():
            _replaced_marker(_version_of(final)).touch()  # before the link moves: a replaced version always has one
        elif final.exists():
            plain = final.with_name(f".{final.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(final, plain)
        os.replace(link, final)
        fsync_dir(final.parent)
    if plain is not None:
        shutil.rmtree(plain, ignore_errors=True)
    return version


def _remove_replaced(final: Path, keep_s: float) -> None:
    """Remove the version folders of `final` no reader can need: those replaced more than `keep_s` ago, and those
    never published (a writer killed before its link went in: no marker). Under the swap lock, so a writer between
    its version's rename and its link is never cut short. A version someone holds stays; with `keep_s` 0 (forgotten:
    a removal request) its marker is dated back, so the first commit to the store after it is let go removes it."""
    versions = [p for p in _siblings(final, "v") if p.is_dir() and not p.is_symlink()]
    markers = _siblings(final, "v", ".replaced")
    if not versions and not markers:
        return
    now, doomed = time.time(), []
    with _swap_lock(final):
        current = _version_of(final)
        for version in versions:
            marker = _replaced_marker(version)
            try:
                replaced_at = marker.stat().st_mtime
            except FileNotFoundError:
                replaced_at = None
            if version == current or (replaced_at is not None and now - replaced_at < keep_s):
                continue
            if _held(version):
                if keep_s == 0 and replaced_at is not None:  # forgotten: due at the first commit after it is let go
                    os.utime(marker, (0, 0))
                continue
            doomed.append(final.with_name(f".{final.name}.trash-{uuid.uuid4().hex[:8]}"))
            os.replace(version, doomed[-1])
            marker.unlink(missing_ok=True)
        for marker in markers:  # of a version already gone
            if not marker.with_name(marker.name.removesuffix(".replaced")).exists():
                marker.unlink(missing_ok=True)
    for trash in doomed:
        shutil.rmtree(trash, ignore_errors=True)


def _held(folder: Path) -> bool:
    """Whether a reader holds the version folder (a shared lock on it: kiln.tokens.shard_format.hold_folder; the
    writer that committed it, while it lives)."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return True
    finally:
        os.close(fd)  # and with it the lock, if taken
    return False


def remove_replaced_versions(root: Path, keep_s: float) -> None:
    """`_remove_replaced` for every dataset of the store at `root` with a version replaced more than `keep_s` ago
    (each commit does it, so a dataset never written again does not keep its old version)."""
    now = time.time()
    homes = [a for a in root.iterdir() if a.is_dir() and not a.is_symlink() and not a.name.startswith(".")] \
        if root.is_dir() else []
    # Partitions are `<refresh>`, `_all` or `<source>/<refresh>`: markers sit in an asset's folder or one below.
    homes += [d for a in list(homes) for d in a.iterdir()
              if d.is_dir() and not d.is_symlink() and not d.name.startswith(".") and not (d / MANIFEST_NAME).exists()]
    due = set()
    for home in homes:
        for marker in home.glob(".*.v-*.replaced"):
            with contextlib.suppress(FileNotFoundError):
                if now - marker.stat().st_mtime > keep_s:
                    due.add(home / marker.name[1:].rsplit(".v-", 1)[0])
    for final in sorted(due):
        _remove_replaced(final, keep_s)


def _restore_if_swapped_out(final: Path) -> None:
    """A dataset folder missing while the previous version sits aside (`.<name>.old-*`, complete: it was renamed
    there whole) means its writer died between the two renames of `_swap_in`: rename it back. Under the swap
    lock, so a live swap (which holds it across both renames) is never undone."""
    if final.exists() or not final.parent.is_dir():
        return
    if not _siblings(final, "old"):
        return
    with _swap_lock(final):
        if final.exists():
            return
        aside = [(m.created_at, p.name, p) for p in _siblings(final, "old")
                 if (m := _whole(p)) is not None]
        if aside:  # the newest whole one (one whose removal a second crash cut short has lost files)
            os.replace(max(aside)[2], final)
            fsync_dir(final.parent)


def _whole(folder: Path) -> Manifest | None:
    """The manifest of a dataset folder whose files are all there, else None."""
    try:
        manifest = Manifest.from_dict(json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8")))
    except (OSError, ValueError, KeyError, TypeError):
        return None
    return manifest if all((folder / f.path).is_file() for f in manifest.files) else None


class StagingBusy(RuntimeError):
    """Another process is writing the same version of the same dataset."""


class DatasetWriter:
    """Collects parts in a staging folder; `commit` writes the manifest and swaps the folder in (and, with a
    remote, uploads it: files, then the manifest; a failed upload fails the commit, leaving S3 at the
    previous version).

    With `resume`, the staging folder is named by the key and survives a failure, so per-part completion markers
    (`resume_part`) let a re-run skip what is done; a file lock keeps two processes out of one such folder."""

    def __init__(self, final_dir: Path, asset: str, partition: str | None, store: Store | None = None,
                 resume: str | None = None):
        self.final_dir, self.asset, self.partition, self.store = final_dir, asset, partition, store
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        self.resume = resume
        self.dir = final_dir.with_name(f".{final_dir.name}.staging-{resume or uuid.uuid4().hex[:8]}")
        # Held while this writer lives: it keeps another run out of a resumable folder, and tells a committing
        # writer of the same dataset which staging folders are live (see _remove_stale_staging).
        self._lock: FileLock | None = FileLock(f"{self.dir}.lock")
        try:
            self._lock.acquire(timeout=_STAGING_LOCK_WAIT_S)
        except Timeout:
            raise StagingBusy(f"{asset}[{partition}] is being written by another run with the same inputs "
                              f"(lock {self._lock.lock_file}); wait for it to finish") from None
        self.dir.mkdir(exist_ok=bool(resume))
        self._counters: dict[str, int] = {}
        self.committed: Snapshot | None = None  # the version commit() published

    def next_path(self, role: str, suffix: str = ".parquet") -> Path:
        i = self._counters.get(role, 0)
        self._counters[role] = i + 1
        return self.dir / part_name(role, i, suffix)

    def scratch(self, name: str) -> Path:
        """A folder for a stage's intermediate files (a shuffle's buckets), beside the parts and never published."""
        path = self.dir / f".{name}"
        path.mkdir(exist_ok=True)
        return path

    def write(self, role: str, table: pa.Table) -> Path:
        path = self.next_path(role)
        write_parquet_atomic(path, table)
        return path

    def commit(self, *, code_version: str, config: dict, inputs: dict[str, str], counts: dict[str, int],
               stats: dict | None = None, forget_replaced: bool = False) -> Manifest:
        """Publish the staged version; afterwards `committed` is it (a Snapshot): the asset's checks and metadata read
        their own output there, not through the dataset's link, which another run may have moved on meanwhile.
        `forget_replaced`: the version replaced may hold documents a removal request took out of this one, so it is
        removed now rather than kept for readers (a reader holding it, a training run, keeps it until it lets go)."""
        entries = []
        recorded = _recorded_files(self.dir)
        published, hidden = _staged_files(self.dir)
        for relative in published:
            path = self.dir / relative
            name = relative.rsplit("/", 1)[-1]
            role = next((r for r, p in ROLE_PREFIX.items() if name.startswith(p + "-") or name.partition(".")[0] == p),
                        "artifact")
            size = os.stat(path).st_size
            facts = recorded.get(relative)
            if facts is None or facts["bytes"] != size:  # not a part task's, or not as it left it: read it
                facts = {"sha256": sha256_file(path),
                         "rows": pq.ParquetFile(path).metadata.num_rows if path.suffix == ".parquet" else None}
            entries.append(FileEntry(path=relative, role=role, sha256=facts["sha256"], bytes=size,
                                     rows=facts["rows"]))
        manifest = Manifest(asset=self.asset, partition=self.partition, code_version=code_version,
                            config=redact(config), inputs=inputs, files=entries, counts=counts, stats=redact(stats or {}),
                            git_commit=git_commit(), created_at=now_utc(), data_version=data_version_of(entries))
        flush_to_disk(self.dir)  # the parts' tasks did not (`resume_part`): on disk before the manifest names them
        write_json_atomic(self.dir / MANIFEST_NAME, manifest.to_json())
        history = _history_dir(self.final_dir)
        history.mkdir(exist_ok=True)
        _keep_records(history, manifest, self.dir)  # before the entry that names them
        write_json_atomic(history / f"{manifest.data_version}.json", manifest.for_history().to_json())
        # Scratch folders and temp files of tasks that died, at any depth: never published.
        for path in hidden:
            shutil.rmtree(path) if path.is_dir() else path.unlink()
        # What the caller checks and describes after committing is this version, whatever is committed next; held
        # while this writer lives (a shared lock, which follows the folder through its rename), so that a next commit
        # that forgets the versions it replaces leaves it until then.
        held = hold_folder(self.dir)
        weakref.finalize(self, os.close, held)
        version = _swap_in(self.dir, self.final_dir, flushed=True)  # flushed above, then the manifest
        self.committed = Snapshot(version, manifest)
        self._release(remove=True)
        _remove_stale_staging(self.final_dir)
        keep_s = KEEP_REPLACED_S if self.store is None else self.store.keep_replaced_s
        _remove_replaced(self.final_dir, 0 if forget_replaced else keep_s)
        if self.store is not None:
            remove_replaced_versions(self.store.root, keep_s)
        if self.store is not None and self.store.remote is not None:
            self.store._push(self.asset, self.partition, manifest, version)
        return manifest

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)
        self._release(remove=True)

    def _release(self, remove: bool = False) -> None:
        """Release the lock; with `remove`, its file too (the folder is gone; filelock copes with a lock file
        unlinked under a waiting process)."""
        if self._lock is not None:
            if remove:
                Path(self._lock.lock_file).unlink(missing_ok=True)
            self._lock.release()
            self._lock = None

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None and self.resume:
            self._release()  # keep the completed parts for the next attempt
        elif exc_type is not None or self.dir.exists():
            self.abort()
        self._release()
