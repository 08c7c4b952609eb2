"""What a training run read: every document copy of its shards, and of the shards it replayed, with how many times
it was read, derived after the run from the loader's final cursor.

The training loader's order is a function of its seed, world size, settings and cursor (training_jobs.loader), so
the run logs nothing per document: it records its cursor (summary.json `loader`, the same state its last checkpoint
holds), and `measure_exposure` opens the loader as the run did (`training_jobs.setup.open_training`, on the run's own
run config), puts it at that cursor and lets it count (`ShardLoader.exposure`): one implementation of the order. The
shards' position lists (`positions-*.parquet`) turn (shard, place) into doc_ids, the member lists add each copy's
source. A document copy is read in an epoch when a sequence read then held one of its tokens; its tokens read are
the ones that were inputs. Steps a rollback discarded count as read: their data went through the model.

The training_run asset writes `exposure.parquet` (EXPOSURE_SCHEMA: one row per copy read at least once) into its
dataset and `stats.exposure` (per role, `train` and `replay`: the set, the cursor, tokens read per phase and per
source against the source's tokens in the set and its natural tokens). Membership and the data card read them back.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.manifest import MANIFEST_NAME, Manifest, write_file_atomic
from kiln.common.spill import BATCH_ROWS, BUCKET_ROWS, Spill, bucket_count, joined_buckets
from kiln.common.storage import Store, parquet_batches
from kiln.governance.catalog import run_file

EXPOSURE_FILE = "exposure.parquet"
EXPOSURE_SCHEMA = pa.schema([pa.field("role", pa.string(), nullable=False),  # train | replay
                             pa.field("shard_set", pa.string(), nullable=False),  # the token_shards data version
                             pa.field("phase", pa.string(), nullable=False),
                             pa.field("shard", pa.string(), nullable=False),  # as in the position list
                             pa.field("index", pa.int32(), nullable=False),  # place in the shard's offset index
                             pa.field("doc_id", pa.string(), nullable=False),
                             pa.field("source", pa.string(), nullable=False),
                             pa.field("tokens", pa.int64(), nullable=False),  # the copy's tokens
                             pa.field("reads", pa.int32(), nullable=False),  # epochs in which it was read
                             pa.field("tokens_read", pa.int64(), nullable=False)])  # its input tokens, all epochs

# The read copies are joined with the member list a doc_id hash bucket at a time (kiln.common.spill): a process holds
# one bucket.
_MEMBER_SCHEMA = pa.schema([EXPOSURE_SCHEMA.field(c) for c in ("doc_id", "source", "tokens")])
_READ_SCHEMA = pa.schema([EXPOSURE_SCHEMA.field(c)
                          for c in ("phase", "shard", "index", "doc_id", "reads", "tokens_read")])


def measure_exposure(run_config: str | Path, loader_state: dict[str, Any], path: str | Path,
                     folders: dict[str, str] | None = None, bucket_rows: int = BUCKET_ROWS) -> dict[str, Any]:
    """Writes what the run `run_config` describes read, its loader at `loader_state` (summary.json's `loader`), to
    `path` (EXPOSURE_SCHEMA rows, written whole or not at all) and returns the manifest's `stats.exposure` (the
    file's name and, per role, its stats). A loader state the run's shards and settings do not give is refused as on
    resume (training_jobs.loader). `folders` (role `train` or `replay` -> folder): the version folders the run read
    (`held_versions`), read instead of its dataset links, which name another version once the shards are
    materialized again while it trains (a removal request applied meanwhile); the stats name the links.
    `bucket_rows`: rows of the member and position lists joined at once (`_join`)."""
    import torch

    from training_jobs.settings import DEFAULT_MICRO_BATCH, RunConfig
    from training_jobs.setup import Dist, open_training

    path = Path(path)
    run = linked = RunConfig.read(run_config)
    folders = folders or {}
    if folders:
        run = run.model_copy(update={
            "dataset_dir": folders.get("train", run.dataset_dir),
            "replay": run.replay and run.replay.model_copy(
                update={"dataset_dir": folders.get("replay", run.replay.dataset_dir)})})
    # `auto`: the trainer's layout chose it. Any micro-batch reads the same sequences (the cursor counts sequences).
    if run.training.micro_batch_size == "auto":
        training = run.training.model_copy(update={"micro_batch_size": DEFAULT_MICRO_BATCH})
        run = run.model_copy(update={"training": training})
    world_size = int(loader_state.get("main", loader_state)["world_size"])  # data-parallel ranks
    loader = open_training(run, Dist(0, world_size, torch.device("cpu")))
    loader.load_state_dict(loader_state)
    stats: dict[str, Any] = {}

    def write(f) -> None:
        with pq.ParquetWriter(f, EXPOSURE_SCHEMA, compression="zstd") as out, \
                tempfile.TemporaryDirectory(dir=path.parent, prefix=f".{path.name}.scratch-") as scratch:
            for role, part in loader.roles().items():
                stats[role] = _role_exposure(role, part, out, Path(scratch) / role, bucket_rows)
                if role in folders:
                    stats[role]["dataset_dir"] = linked.dataset_dir if role == "train" else linked.replay.dataset_dir

    write_file_atomic(path, write)
    return {"file": path.name, "roles": stats}


def held_versions(run_config: str | Path, holds: contextlib.ExitStack) -> dict[str, str]:
    """The version folders of the shard sets a run is set up to read (its dataset and replay links, at the versions
    the run config pins), by role (`train`, `replay`), each held (kiln.tokens.shard_format.hold_folder) until `holds`
    closes: a version replaced while the run trains, by a removal request applied meanwhile say, stays on disk until
    what the run read of it is measured (`measure_exposure`). A link that names another version already is left
    out: the run's loaders refuse it."""
    from kiln.tokens.shard_format import ShardError, hold_folder, read_shard_set
    from training_jobs.settings import RunConfig

    run = RunConfig.read(run_config)
    sets = [("train", run.dataset_dir, run.dataset_data_version)]
    if run.replay is not None:
        sets.append(("replay", run.replay.dataset_dir, run.replay.data_version))
    out = {}
    for role, link, version in sets:
        folder = Path(os.path.realpath(link))
        try:
            holds.callback(os.close, hold_folder(folder))
            if version is None or read_shard_set(folder).data_version == version:
                out[role] = str(folder)
        except (OSError, ShardError):  # no shard set there: the run refuses it
            continue
    return out


def _role_exposure(role: str, loader, out: pq.ParquetWriter, scratch: Path, bucket_rows: int) -> dict[str, Any]:
    """One role's rows into `out`; its stats."""
    folder = Path(loader.shard_set.dir)
    manifest = Manifest.from_dict(json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8")))
    shard_info = {s.path: s for s in loader.shard_set.shards}
    sources = manifest.stats.get("sources") or {}
    stats: dict[str, Any] = {"data_version": manifest.data_version, "dataset_dir": str(folder),
                             "cursor": {"epoch": loader.epoch, "position": loader.position},
                             "world_size": loader.world_size, "seq_len": loader.seq_len}
    positions = [folder / f.path for f in manifest.files_with_role("positions")]
    members = [folder / f.path for f in manifest.files_with_role("members")]
    listed = bool(positions and members)
    reads = _ReadCopies(loader.exposure(), shard_info, scratch / "counts", bucket_rows, keep=listed)
    stats["tokens_read"] = sum(phase["tokens_read"] for phase in reads.per_phase.values())
    stats["per_phase"] = reads.per_phase
    if not listed:
        stats["unavailable"] = ("the shard set has no position list (written before position lists existed): which "
                                "documents were read cannot be told; re-materialize that token_shards partition")
        return stats
    buckets = bucket_count(max(reads.copies_read, sum(pq.ParquetFile(p).metadata.num_rows for p in members)),
                           bucket_rows)
    member_sources: set[str] = set()
    documents: Counter[str] = Counter()
    pairs = joined_buckets(scratch, buckets, (_MEMBER_SCHEMA, _train_members(members, member_sources, documents)),
                           (_READ_SCHEMA, reads.batches(positions, folder)))
    read_by_source: dict[str, list[int]] = {}  # tokens read, documents read
    copies = 0
    for member, read in pairs:
        table = _join(role, manifest.data_version, member, read, folder)
        out.write_table(table)
        copies += table.num_rows
        # A document's copies share its bucket: distinct doc_ids per bucket add up to distinct doc_ids.
        by_source = table.group_by("source").aggregate([("tokens_read", "sum"), ("doc_id", "count_distinct")])
        for r in by_source.to_pylist():
            got = read_by_source.setdefault(r["source"], [0, 0])
            got[0] += r["tokens_read_sum"]
            got[1] += r["doc_id_count_distinct"]
    per_source = {}
    for name in sorted(member_sources | set(read_by_source)):
        natural = (sources.get(name) or {}).get("natural_train_tokens")
        in_set = (sources.get(name) or {}).get("train_tokens")
        got, documents_read = read_by_source.get(name, (0, 0))
        per_source[name] = {
            "tokens_read": got, "tokens": in_set, "natural_tokens": natural,
            # unrounded (a little read of a big source is not 0): of the source's tokens in the set, and passes
            # over the source's own data
            "share": got / in_set if in_set else None, "passes": got / natural if natural else None,
            "planned_epochs": (sources.get(name) or {}).get("effective_epochs"),
            "documents_read": documents_read, "documents": documents[name]}
    stats["per_source"] = per_source
    stats["copies_read"] = copies
    return stats


_COUNT_SCHEMA = pa.schema([("copy", pa.int64()), ("reads", pa.int32()), ("tokens_read", pa.int64())])
_PLACED_SCHEMA = pa.schema([("copy", pa.int64()), ("number", pa.int32()), ("shard", pa.string()),
                            ("index", pa.int32()), ("doc_id", pa.string())])


class _ReadCopies:
    """The loader's counts (`exposure`: shard, reads, tokens, a shard at a time) joined with the position list, to the
    copies read with their doc_ids. Both are numbered by copy (the shards in the order the loader counts them, each
    shard's copies in order) and spilled by ranges of copy numbers (kiln.common.spill), so a process holds one shard's
    counts, then one range of both at a time; holding the counts of every copy in the set was 12 B per copy."""

    def __init__(self, counts: Iterator[tuple[str, np.ndarray, np.ndarray]], shard_info: dict[str, Any],
                 scratch: Path, bucket_rows: int, keep: bool = True):
        """`keep`: spill the copies read for `batches`; without it (a set without a position list) only count."""
        self.scratch, self.shard_info = scratch, shard_info
        self.names: list[str] = []
        self.sizes: list[int] = []
        self.starts: list[int] = []
        self.per_phase: dict[str, dict[str, int]] = {}
        self.copies_read = 0
        # Copy numbers run over the shards the loader counts, at most every shard of the set: buckets by range.
        self.total = max(sum(info.documents for info in shard_info.values()), 1)
        self.buckets = bucket_count(self.total, bucket_rows)
        if keep:
            self.counts = Spill(scratch / "counts", self.buckets, _COUNT_SCHEMA, self._counted(counts), self._range)
        else:
            for _ in self._counted(counts):
                pass

    def _range(self, batch: pa.RecordBatch) -> np.ndarray:
        return batch.column("copy").to_numpy() * self.buckets // self.total

    def _counted(self, counts: Iterator[tuple[str, np.ndarray, np.ndarray]]) -> Iterator[pa.RecordBatch]:
        """_COUNT_SCHEMA batches of the copies read at least once, a shard at a time; the stats by phase as it goes."""
        start = 0
        for name, reads, tokens in counts:
            info = self.shard_info[name]  # by path: a set of 100B tokens has ~25,000 shards, a search each was quadratic
            if start + len(reads) > self.total:
                raise ValueError(f"the loader counts more copies than the shard set's manifest holds ({name})")
            phase = self.per_phase.setdefault(info.phase, {"tokens_read": 0, "tokens": 0})
            phase["tokens_read"] += int(tokens.sum())
            phase["tokens"] += info.tokens
            self.names.append(name)
            self.sizes.append(len(reads))
            self.starts.append(start)
            read = np.flatnonzero(reads > 0)
            self.copies_read += len(read)
            if len(read):
                yield pa.record_batch([pa.array(start + read), pa.array(reads[read], pa.int32()),
                                       pa.array(tokens[read], pa.int64())], schema=_COUNT_SCHEMA)
            start += len(reads)

    def batches(self, positions: list[Path], folder: Path) -> Iterator[pa.RecordBatch]:
        """_READ_SCHEMA batches: the copies of the position list the run read at least once, a range of copies at a
        time."""
        number = {name: k for k, name in enumerate(self.names)}
        sizes, starts = np.array(self.sizes, np.int64), np.array(self.starts, np.int64)
        listed = np.zeros(len(self.names), np.int64)  # copies the position list names, per shard the run read

        def placed() -> Iterator[pa.RecordBatch]:
            for p in positions:
                for batch in parquet_batches(p, BATCH_ROWS, ["shard", "index", "doc_id"]):
                    encoded = pc.dictionary_encode(batch.column("shard"))
                    known = np.array([number.get(s, -1) for s in encoded.dictionary.to_pylist()] or [-1], np.int64)
                    shard = known[encoded.indices.to_numpy(zero_copy_only=False)]
                    index = batch.column("index").to_numpy(zero_copy_only=False).astype(np.int64)
                    mine = np.flatnonzero(shard >= 0)  # the validation shards, say, the run did not read
                    shard, index = shard[mine], index[mine]
                    if ((index < 0) | (index >= sizes[shard])).any():
                        raise _altered(folder, "places a copy past the end of its shard's offset index")
                    listed[:] += np.bincount(shard, minlength=len(self.names))
                    rows = pa.array(mine)
                    yield pa.record_batch([pa.array(starts[shard] + index), pa.array(shard, pa.int32()),
                                           batch.column("shard").take(rows), pa.array(index, pa.int32()),
                                           batch.column("doc_id").take(rows)], schema=_PLACED_SCHEMA)

        places = Spill(self.scratch / "positions", self.buckets, _PLACED_SCHEMA, placed(), self._range)
        if (listed != sizes).any():
            raise _altered(folder, f"lists {int(listed.sum())} document copies in the shards the run read, their "
                                   f"offset indexes hold {int(sizes.sum())}")
        phases = np.array([self.shard_info[name].phase for name in self.names] or [""], object)
        for bucket in range(self.buckets):
            place, count = places.pop(bucket), self.counts.pop(bucket)
            row = pc.index_in(count.column("copy"), value_set=place.column("copy"))
            if row.null_count:  # as many copies listed as the shards hold, but one twice and another not at all
                raise _altered(folder, f"does not list {row.null_count} copies the run read")
            place = place.take(row)
            yield from pa.table([pa.array(phases[place.column("number").to_numpy()], pa.string()),
                                 place.column("shard"), place.column("index"), place.column("doc_id"),
                                 count.column("reads"), count.column("tokens_read")], schema=_READ_SCHEMA).to_batches()


def _train_members(members: list[Path], sources: set[str], documents: Counter[str]) -> Iterator[pa.RecordBatch]:
    """_MEMBER_SCHEMA batches of the member list's train documents; adds each source to `sources`, and to
    `documents` its documents with a copy in the set."""
    for p in members:
        for batch in parquet_batches(p, BATCH_ROWS, ["doc_id", "source", "split", "tokens", "copies"]):
            batch = batch.filter(pc.equal(batch.column("split"), "train"))
            sources.update(pc.unique(batch.column("source")).to_pylist())
            placed = batch.filter(pc.greater(batch.column("copies"), 0)).column("source")
            documents.update({r["values"]: r["counts"] for r in pc.value_counts(placed).to_pylist()})
            yield batch.select(_MEMBER_SCHEMA.names).cast(_MEMBER_SCHEMA)


def _join(role: str, shard_set: str, member: pa.Table, read: pa.Table, folder: Path) -> pa.Table:
    """One bucket's read copies with their documents' source and tokens, as EXPOSURE_SCHEMA rows."""
    row = pc.index_in(read.column("doc_id"), value_set=member.column("doc_id"))
    if row.null_count:
        raise _altered(folder, f"names {row.null_count} copies of documents its member list does not hold as train "
                               "documents")
    n = read.num_rows
    return pa.table({"role": pa.array(np.full(n, role, object), pa.string()),
                     "shard_set": pa.array(np.full(n, shard_set, object), pa.string()),
                     "phase": read.column("phase"), "shard": read.column("shard"), "index": read.column("index"),
                     "doc_id": read.column("doc_id"), "source": member.column("source").take(row),
                     "tokens": member.column("tokens").take(row), "reads": read.column("reads"),
                     "tokens_read": read.column("tokens_read")}, schema=EXPOSURE_SCHEMA)


def _altered(folder: Path, what: str) -> ValueError:
    return ValueError(f"the position list of {folder} {what}: the set was altered after it was written; "
                      "re-materialize that token_shards partition")


def _exposure_file(store: Store, run: Manifest | None) -> Path | None:
    """The run's exposure file (the current run's, or the store's history's copy), or None when it recorded none or
    the store holds it no more."""
    return run_file(store, run, ((run.stats.get("exposure") if run else None) or {}).get("file"))


def exposure_of(store: Store, run: Manifest | None, doc_id: str) -> dict[str, list[dict[str, Any]]] | None:
    """A document's copies that `run` read, by shard set data version (only copies read at least once); None when the
    run recorded no exposure (a run from before exposure was recorded, or its shards had no position list) or the
    store no longer holds it (a run a later one replaced, from before the store's history kept exposure), so it
    cannot be told."""
    if (path := _exposure_file(store, run)) is None:
        return None
    known = {r["data_version"] for r in run.stats["exposure"]["roles"].values() if not r.get("unavailable")}
    out: dict[str, list[dict[str, Any]]] = {v: [] for v in known}
    for r in pq.read_table(path, filters=[("doc_id", "=", doc_id)]).to_pylist():
        out.setdefault(r["shard_set"], []).append(r)
    return out


def read_of(store: Store, run: Manifest | None, doc_ids: set[str]) -> dict[str, int] | None:
    """How much of these documents `run` read: the documents with a copy read at least once, and their input tokens
    read over all epochs; None when the run recorded no exposure (or the store holds it no more), so it cannot be
    told."""
    if (path := _exposure_file(store, run)) is None:
        return None
    table = pq.read_table(path, columns=["doc_id", "reads", "tokens_read"],
                          filters=[("doc_id", "in", sorted(doc_ids)), ("reads", ">", 0)]) if doc_ids else None
    if table is None or table.num_rows == 0:
        return {"documents": 0, "tokens": 0}
    return {"documents": len(pc.unique(table.column("doc_id"))),
            "tokens": int(pc.sum(table.column("tokens_read")).as_py())}


__all__ = ["EXPOSURE_FILE", "EXPOSURE_SCHEMA", "exposure_of", "measure_exposure", "read_of"]
