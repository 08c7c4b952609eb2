"""Reading the store for audits: the manifests of its datasets, and the dataset a user names.

Audits answer from the same `Store` and `_manifest.json` files the assets write, never from a separate database,
so an audit says what the data says. `Catalog` is a memoized, read-only view of those manifests; `resolve_target`
turns what a user types (`checkpoint`, an asset key, a data version, a folder) into one of them.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import closing, contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.manifest import MANIFEST_NAME, Manifest
from kiln.common.remote import MissingRemoteFile, in_order
from kiln.common.storage import IncompleteDataset, Snapshot, Store, parquet_batches
from kiln.governance.lineage import DOCUMENT_STAGES

CHECKPOINT, TRAINING_RUN, SHARDS = "checkpoint", "training_run", "token_shards"
FILTERED, INDEX, TOKENIZER = "filtered_documents", "dedup_index", "tokenizer"
RAW = DOCUMENT_STAGES[0]

NOT_MATERIALIZED = "not materialized"


class AuditError(ValueError):
    """A question the store cannot answer as asked: unknown checkpoint or source, unreadable input."""


def node_key(asset: str, partition: str | None) -> str:
    """How manifests name their inputs: "asset/partition", or "asset" when unpartitioned."""
    return f"{asset}/{partition}" if partition else asset


def parse_key(key: str) -> tuple[str, str | None]:
    asset, _, partition = key.partition("/")
    return asset, partition or None


class Catalog:
    """Read-only view of the manifests in a store, memoized for one audit. With `pins` (node key -> data version:
    a checkpoint's lineage), a pinned dataset is that version, from the store's history when replaced since.

    With S3 storage a question about manifests (lineage, which checkpoint read which shards) reads S3's manifests
    alone; a dataset's files come into the local cache only when the audit reads them (`snapshot`, `folder`), so an
    audit on a fresh machine fetches what it reads, not the store; a reader of a few columns (`opened`, `find_row`)
    reads them from S3 and fetches no dataset."""

    def __init__(self, store: Store, pins: dict[str, str] | None = None):
        self.store = store
        self.pins = pins or {}
        self._manifests: dict[tuple[str, str | None], Manifest | None] = {}  # with S3: the bucket's, files not fetched
        self._current: dict[tuple[str, str | None], Snapshot | None] = {}
        self._versions: dict[str, list[Manifest]] = {}
        self._history: dict[tuple[str, str | None, str], Manifest | None] = {}
        self._published: dict[str, list[Manifest]] = {}
        self._partitions: dict[str, list[str | None]] = {}
        self._wanted: set[str] = set()  # the doc_ids `find_row` looks for in each file it reads
        self._rows: dict[tuple[str, str | None, str], tuple[frozenset[str], dict[str, dict]]] = {}

    def snapshot(self, asset: str, partition: str | None = None) -> Snapshot | None:
        """The current version of a dataset, pinned for the whole audit (its files are read from the version
        whose manifest the audit judged), or None when it has not been materialized or is pinned to another
        version (whose files are not read)."""
        return None if self.replaced(asset, partition) else self._current_snapshot(asset, partition)

    def replaced(self, asset: str, partition: str | None = None) -> bool:
        """Whether the dataset is pinned to a version the store no longer holds as current (told by the manifests:
        the files are not fetched to answer)."""
        pinned, current = self.pins.get(node_key(asset, partition)), self.current_manifest(asset, partition)
        return pinned is not None and (current is None or current.data_version != pinned)

    def _current_snapshot(self, asset: str, partition: str | None) -> Snapshot | None:
        key = (asset, partition)
        if key not in self._current:
            try:
                self._current[key] = self.store.snapshot(asset, partition)
            except IncompleteDataset:
                self._current[key] = None
            except (json.JSONDecodeError, TypeError, KeyError) as exc:
                raise AuditError(f"{self.store.dataset_dir(asset, partition) / MANIFEST_NAME} is not a readable "
                                 f"Kiln manifest ({exc})") from None
            if key in self._manifests:  # judged from S3's manifest before its files were fetched: the same version
                judged, found = (m.data_version if m else None for m in (
                    self._manifests[key], self._current[key] and self._current[key].manifest))
                if judged != found:
                    raise AuditError(f"{node_key(asset, partition)} was materialized again while this audit read it "
                                     f"(version {judged} when its manifest was read, {found} when its files were); "
                                     f"ask again")
        return self._current[key]

    def manifest(self, asset: str, partition: str | None = None) -> Manifest | None:
        """The current manifest of a dataset (the pinned version's, when pinned), or None when it has not been
        materialized."""
        pinned = self.pins.get(node_key(asset, partition))
        return self.manifest_at(asset, partition, pinned) if pinned else self.current_manifest(asset, partition)

    def current_manifest(self, asset: str, partition: str | None = None) -> Manifest | None:
        """The store's current manifest of a dataset, pinned or not: the first one this audit read."""
        key = (asset, partition)
        if key not in self._manifests:
            if self.store.remote is None or key in self._current:
                snapshot = self._current_snapshot(asset, partition)
                self._manifests[key] = snapshot.manifest if snapshot is not None else None
            else:  # a manifest S3 cannot vouch for is refused as when it is fetched (CorruptRemoteFile)
                self._manifests[key] = self.store.published_manifest(asset, partition)
        return self._manifests[key]

    def manifest_at(self, asset: str, partition: str | None, data_version: str) -> Manifest | None:
        """One version's manifest: the current one's, else the store's history's (`Store.manifest_at`)."""
        current = self.current_manifest(asset, partition)
        if current is not None and current.data_version == data_version:
            return current
        key = (asset, partition, data_version)
        if key not in self._history:
            self._history[key] = self.store.manifest_at(asset, partition, data_version)
        return self._history[key]

    @contextmanager
    def opened(self, asset: str, partition: str | None, paths: list[str]) -> Iterator[list[Path | BinaryIO]]:
        """Files of the dataset's version this audit judged (`paths` as its manifest lists them), for reading a few
        of their columns without fetching the dataset: with S3 storage, unless this machine holds that version,
        read from S3 by ranged GETs (`Store.opened`), so a doc_id lookup fetches the doc_id column, not the texts."""
        judged = self.manifest(asset, partition)
        current = self._current.get((asset, partition))
        if current is not None and current.manifest.data_version == judged.data_version:  # fetched whole already
            yield [current.folder / path for path in paths]
            return
        try:
            with self.store.opened(judged, paths) as files:
                yield files
        except (MissingRemoteFile, IncompleteDataset):  # its files were deleted: only a newer version does that
            raise AuditError(f"{node_key(asset, partition)} was materialized again while this audit read it "
                             f"(version {judged.data_version} when its manifest was read); ask again") from None

    def expect(self, doc_ids: list[str]) -> None:
        """Doc ids `find_row` will be asked for: each file it reads is searched for all of them at once."""
        self._wanted.update(doc_ids)

    def find_row(self, asset: str, partition: str | None, role: str, doc_id: str,
                 columns: tuple[str, ...]) -> dict[str, Any] | None:
        """The first row of `doc_id` in the dataset's files of `role`, with those of `columns` each file has (doc_id
        among them), read through `opened`: with S3 storage, those columns from S3. A file is read once for every
        doc_id this audit looks for (`expect`), so tracing many copies of one text through a stage reads it once."""
        paths = [f.path for f in self.manifest(asset, partition).files_with_role(role)]
        self._wanted.add(doc_id)
        wanted = frozenset(self._wanted)

        def rows_in(item: tuple[str, Path | BinaryIO]) -> dict[str, dict]:
            path, file = item
            read_for, rows = self._rows.get((asset, partition, path), (frozenset(), {}))
            if doc_id not in read_for:
                parquet = pq.ParquetFile(file, pre_buffer=True)  # a row group's column chunks in few reads
                table = parquet.read(columns=[c for c in columns if c in parquet.schema_arrow.names])
                read_for, rows = wanted, {}
                for row in table.filter(pc.is_in(table.column("doc_id"), pa.array(sorted(wanted)))).to_pylist():
                    rows.setdefault(row["doc_id"], row)
                self._rows[(asset, partition, path)] = (read_for, rows)
            return rows

        # several files read at once (on S3, each read is a GET's latency), searched in order; the reads left behind
        # end before the files close
        with self.opened(asset, partition, paths) as files, closing(in_order(rows_in, zip(paths, files))) as found:
            for rows in found:
                if doc_id in rows:
                    return rows[doc_id]
        return None

    def folder(self, asset: str, partition: str | None = None) -> Path:
        """The folder of the version `manifest` gives (the dataset must have one)."""
        return self.snapshot(asset, partition).folder

    def versions(self, asset: str) -> list[Manifest]:
        """The current manifest of every partition of the asset, newest first."""
        if asset not in self._versions:
            found = [m for p in self.partitions(asset) if (m := self.manifest(asset, p)) is not None]
            self._versions[asset] = sorted(found, key=lambda m: m.created_at, reverse=True)
        return self._versions[asset]

    def published(self, asset: str) -> list[Manifest]:
        """Every version of every partition of the asset the store has published (its history of manifests, with
        the current ones), newest first: a checkpoint or training run a later one replaced is still one."""
        if asset not in self._published:
            found = {m.data_version: m for p in self.partitions(asset) for m in self.store.history(asset, p)}
            found |= {m.data_version: m for m in self.versions(asset)}  # current: whole, and in stores before history
            self._published[asset] = sorted(found.values(), key=lambda m: m.created_at, reverse=True)
        return self._published[asset]

    def partitions(self, asset: str) -> list[str | None]:
        """Partitions of an asset that have a current version (`Store.partitions`: with S3 storage, the bucket's,
        listed once per audit)."""
        if asset not in self._partitions:
            self._partitions[asset] = self.store.partitions(asset)
        return self._partitions[asset]

    def source_partitions(self, asset: str, source: str) -> list[str]:
        """The partitions holding one source's documents at a stage, one per refresh."""
        return [p for p in self.partitions(asset) if p and p.split("/")[0] == source and "/" in p]

    def newest(self, asset: str) -> Manifest | None:
        """The most recently written manifest of an asset over all its partitions (e.g. the latest dedup index)."""
        versions = self.versions(asset)
        return versions[0] if versions else None

    def assets(self) -> list[str]:
        """The assets the store holds datasets of (with S3 storage, the bucket's too)."""
        root = self.store.root
        found = {d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")} if root.is_dir() else set()
        if self.store.remote is not None:
            found |= {name for name in self.store.remote.listing(self.store.remote.key())[1]
                      if not name.startswith((".", "_"))}  # not the locks, not the runs' copies (`_runs`)
        return sorted(found)


def _load(path: Path) -> Manifest:
    try:
        return Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise AuditError(f"{path} is not a readable Kiln manifest ({exc})") from None


def resolve_target(store: Store, target: str, catalog: Catalog | None = None) -> Manifest:
    """A checkpoint (or any dataset) from what a user types: the literal `checkpoint` (the current one), an
    asset key such as `tokenizer`, `token_shards/<refresh>` or `curated_documents/web/<refresh>`, a data version (or
    a prefix of at least 6 characters; any checkpoint the store published, a replaced one too), or a folder: a
    dataset folder with `_manifest.json`, or a run's DeepSpeed checkpoint."""
    catalog = catalog or Catalog(store)
    asset, partition = parse_key(target)
    if not Path(target).is_absolute() and asset in catalog.assets():
        found = catalog.manifest(asset, partition)
        if found is not None:
            return found
        under = [p for p in catalog.partitions(asset) if p and (partition is None or p.startswith(partition + "/"))]
        if under:  # a partitioned asset named without (all of) its partition: `token_shards`, `curated_documents/web`
            shown = ", ".join(node_key(asset, p) for p in under[:5]) + (f" (+{len(under) - 5} more)" * (len(under) > 5))
            raise AuditError(f"{target!r} names no one dataset: {asset} has one per partition; give its partition, "
                             f"e.g. {shown}")
    if target == CHECKPOINT:
        raise AuditError(f"no checkpoint in {store.root}: materialize `checkpoint` first")
    path = Path(target).expanduser()
    if path.is_dir():
        resolved = path.resolve()
        for folder in [resolved, *resolved.parents][:3]:  # the dataset folder, or its hf/ or safetensors/ inside
            if (folder / MANIFEST_NAME).is_file():
                return _load(folder / MANIFEST_NAME)
        for m in catalog.published(CHECKPOINT):
            ds = m.stats.get("deepspeed_checkpoint")
            if ds and (Path(ds).resolve() == resolved or resolved in Path(ds).resolve().parents):
                return m
        raise AuditError(f"{path} is neither a dataset folder with {MANIFEST_NAME} nor the DeepSpeed checkpoint (or "
                         f"run folder) of a checkpoint in {store.root}")
    if len(target) >= 6 and all(c in "0123456789abcdef" for c in target.lower()):
        hits = {}
        for name in [CHECKPOINT] + [a for a in catalog.assets() if a != CHECKPOINT]:
            for m in catalog.published(name) if name == CHECKPOINT else catalog.versions(name):
                if m.data_version.startswith(target.lower()):
                    hits[(m.asset, m.partition, m.data_version)] = m
            if hits and name == CHECKPOINT:
                break  # a checkpoint's version wins over a prefix that also matches some other dataset
        if len(hits) == 1:
            return next(iter(hits.values()))
        if len(hits) > 1:
            raise AuditError(f"data version {target!r} is ambiguous: " + ", ".join(
                f"{node_key(a, p)} {v}" for a, p, v in sorted(hits)) + "; give more characters")
    current = catalog.manifest(CHECKPOINT)
    example = f" (the current one is {current.data_version})" if current else ""
    raise AuditError(f"no checkpoint {target!r} in {store.root}: give `checkpoint` for the current one, a data "
                     f"version{example}, or a checkpoint folder")


def stages_read(store: Store, manifest: Manifest) -> list[Manifest]:
    """The document stages one partition's output was built from, raw first, each at the version the next one
    recorded (from the store's history where replaced since): a funnel over them adds up what fed this output. It
    starts later where a version is not found (recorded before the store kept a history)."""
    found, m = [], manifest
    while (read := next(((*parse_key(k), v) for k, v in sorted(m.inputs.items())
                         if parse_key(k)[1] == manifest.partition), None)) is not None:
        if (m := store.manifest_at(*read)) is None:
            break
        if m.asset in DOCUMENT_STAGES:
            found.append(m)
    return found[::-1]


def run_file(store: Store, run: Manifest | None, path: str | None) -> Path | None:
    """A file a training run wrote beside its manifest (its exposure, its replay removals): the current run's, else
    the store's history's copy (a later run replaced it); None when the store holds it no more (a run from before the
    history kept such files)."""
    if run is None or not path:
        return None
    return store.version_file(TRAINING_RUN, run.partition, run.data_version, path)


def made_from(checkpoint: Manifest, run: Manifest) -> bool:
    """Whether a checkpoint was exported from this training run: the run version it recorded, or the same run
    recorded again (materializing training_run over a finished run finds it and writes a new manifest for the same
    training; the run's MLflow run is its identity)."""
    run_id = checkpoint.stats.get("mlflow", {}).get("run_id")
    return checkpoint.inputs.get(TRAINING_RUN) == run.data_version or \
        (run_id is not None and run_id == run.stats.get("mlflow", {}).get("run_id"))


def run_of_checkpoint(catalog: Catalog, checkpoint: str) -> Manifest | None:
    """The training_run manifest a checkpoint (by data version) was made from: the current one, else from the store's
    history; None when neither holds it."""
    ckpt = next((m for m in catalog.published(CHECKPOINT) if m.data_version == checkpoint), None)
    if ckpt is None:
        return None
    # The version it recorded; else the same training recorded again (the store's current run first).
    runs = [*catalog.versions(TRAINING_RUN), *catalog.published(TRAINING_RUN)]
    return next((r for r in runs if r.data_version == ckpt.inputs.get(TRAINING_RUN)), None) or \
        next((r for r in runs if made_from(ckpt, r)), None)


def _shards_of_checkpoint(catalog: Catalog, ckpt: Manifest) -> dict[str, str | None]:
    """The token_shards data versions a checkpoint's training run recorded as inputs (via its run's manifest), each
    with its partition."""
    versions: dict[str, str | None] = {}
    for key, version in ckpt.inputs.items():
        asset, partition = parse_key(key)
        if asset == SHARDS:
            versions[version] = partition
        elif asset == TRAINING_RUN:
            for run in catalog.published(TRAINING_RUN):
                if run.data_version == version:
                    versions |= {v: parse_key(k)[1] for k, v in run.inputs.items() if parse_key(k)[0] == SHARDS}
    return versions


def member_lists(store: Store, shards: Manifest | None) -> list[Path] | None:
    """The member list files of a token-shard set: the current set's, or the store's history's of a set replaced
    since; None when there is no set, or the store holds no (whole) member list of it (a set written before member
    lists existed, or replaced before the history kept them)."""
    if shards is None:
        return None
    paths = [store.version_file(SHARDS, shards.partition, shards.data_version, f.path)
             for f in shards.files_with_role("members")]
    return paths if paths and None not in paths else None


def member_batches(paths: list[Path], splits: tuple[str, ...], columns: list[str],
                   batch_size: int = 65_536) -> Iterator[pa.RecordBatch]:
    """`columns` of the documents of `splits` that a token-shard set's member lists (`paths`) say its shards hold
    (one copy or more), a batch at a time: a member list has a row per document of every refresh, too many to hold
    as Python rows."""
    for path in paths:
        for batch in parquet_batches(path, batch_size, list(dict.fromkeys(["split", "copies", *columns]))):
            held = pc.and_(pc.is_in(batch.column("split"), pa.array(splits, pa.string())),
                           pc.greater(batch.column("copies"), 0))
            yield batch.filter(held).select(columns)


def checkpoints_using(catalog: Catalog, shards_version: str) -> list[Manifest]:
    """The checkpoints the store published (those a later one replaced too), newest first, whose training run read
    this token-shard set."""
    return [c for c in catalog.published(CHECKPOINT) if shards_version in _shards_of_checkpoint(catalog, c)]


def trained_shard_sets(catalog: Catalog) -> list[Manifest]:
    """The token-shard sets a question about training looks in: the store's current ones, newest first, then each set
    a checkpoint the store published was trained on and a later set has replaced since (its manifest from the store's
    history), newest first."""
    found = {m.data_version: m for m in catalog.versions(SHARDS)}
    replaced = {}
    for ckpt in catalog.published(CHECKPOINT):
        for version, partition in _shards_of_checkpoint(catalog, ckpt).items():
            if version not in found and (m := catalog.manifest_at(SHARDS, partition, version)) is not None:
                replaced[version] = m
    return [*found.values(), *sorted(replaced.values(), key=lambda m: m.created_at, reverse=True)]


def stored_sources(catalog: Catalog) -> set[str]:
    """The sources the store holds documents of, declared in the config or not (one dropped from it since): those
    of a document stage's partitions, and those a token-shard set a question about training looks in counted."""
    return {p.split("/")[0] for st in DOCUMENT_STAGES for p in catalog.partitions(st) if p} | \
        {n for m in trained_shard_sets(catalog) for n in (m.stats.get("sources") or {})}


def known_sources(store: Store, config) -> list[str]:
    """The sources a question or a removal request may name: the config's (a ProjectConfig, or None), then those only
    the store holds (dropped from the config since: their documents are still in the store, in checkpoints trained
    on them and in what a continued run replays)."""
    names = [s.name for s in config.sources] if config is not None else []
    return names + sorted(stored_sources(Catalog(store)) - set(names))


__all__ = ["AuditError", "Catalog", "checkpoints_using", "known_sources", "made_from", "member_batches", "member_lists",
           "node_key",
           "parse_key", "resolve_target", "run_file", "run_of_checkpoint", "stages_read", "stored_sources",
           "trained_shard_sets"]
