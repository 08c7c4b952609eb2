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
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.manifest import MANIFEST_NAME, Manifest
from kiln.common.storage import Store, write_parquet_atomic
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


def measure_exposure(run_config: str | Path, loader_state: dict[str, Any],
                     folders: dict[str, str] | None = None) -> tuple[pa.Table, dict[str, Any]]:
    """(EXPOSURE_SCHEMA rows, the manifest's `stats.exposure`) of the run `run_config` describes, its loader at
    `loader_state` (summary.json's `loader`). A loader state the run's shards and settings do not give is refused
    as on resume (training_jobs.loader). `folders` (role `train` or `replay` -> folder): the version folders the run
    read (`held_versions`), read instead of its dataset links, which name another version once the shards are
    materialized again while it trains (a removal request applied meanwhile); the stats name the links."""
    import torch

    from training_jobs.settings import DEFAULT_MICRO_BATCH, RunConfig
    from training_jobs.setup import Dist, open_training

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
    tables, stats = [], {}
    for role, part in loader.roles().items():
        table, stats[role] = _role_exposure(role, part)
        tables.append(table)
        if role in folders:
            stats[role]["dataset_dir"] = linked.dataset_dir if role == "train" else linked.replay.dataset_dir
    return pa.concat_tables(tables), stats


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


def _role_exposure(role: str, loader) -> tuple[pa.Table, dict[str, Any]]:
    folder = Path(loader.shard_set.dir)
    manifest = Manifest.from_dict(json.loads((folder / MANIFEST_NAME).read_text(encoding="utf-8")))
    counts = loader.exposure()
    shard_info = {s.path: s for s in loader.shard_set.shards}
    phase_of = {path: s.phase for path, s in shard_info.items()}
    sources = manifest.stats.get("sources") or {}
    stats: dict[str, Any] = {"data_version": manifest.data_version, "dataset_dir": str(folder),
                             "cursor": {"epoch": loader.epoch, "position": loader.position},
                             "world_size": loader.world_size, "seq_len": loader.seq_len,
                             "tokens_read": int(sum(int(t.sum()) for _, t in counts.values()))}
    per_phase: dict[str, dict[str, int]] = {}
    for shard, (_, tokens) in counts.items():
        info = shard_info[shard]  # by path: a set of 100B tokens has ~25,000 shards, a search each was quadratic
        phase = per_phase.setdefault(phase_of[shard], {"tokens_read": 0, "tokens": 0})
        phase["tokens_read"] += int(tokens.sum())
        phase["tokens"] += info.tokens
    stats["per_phase"] = per_phase
    positions = [folder / f.path for f in manifest.files_with_role("positions")]
    members = [folder / f.path for f in manifest.files_with_role("members")]
    if not positions or not members:
        stats["unavailable"] = ("the shard set has no position list (written before position lists existed): which "
                                "documents were read cannot be told; re-materialize that token_shards partition")
        return EXPOSURE_SCHEMA.empty_table(), stats
    placed = pa.concat_tables([pq.read_table(p, filters=[("shard", "in", sorted(counts))]) for p in positions])
    placed = placed.sort_by([("shard", "ascending"), ("index", "ascending")])
    reads = np.concatenate([counts[s][0] for s in sorted(counts)]) if counts else np.zeros(0, np.int32)
    tokens_read = np.concatenate([counts[s][1] for s in sorted(counts)]) if counts else np.zeros(0, np.int64)
    if len(placed) != len(reads):
        raise ValueError(f"the position list of {folder} lists {len(placed)} document copies in the shards the run "
                         f"read, their offset indexes hold {len(reads)}: the set was altered after it was written")
    member = pa.concat_tables([pq.read_table(p, columns=["doc_id", "source", "split", "tokens", "copies"])
                               for p in members])
    member = member.filter(pc.equal(member["split"], "train"))
    hit = np.flatnonzero(reads > 0)  # only the copies read: the rest is the position list
    placed = placed.take(pa.array(hit))
    row = pc.index_in(placed["doc_id"], member["doc_id"])
    read = pa.table({"role": pa.array(np.full(len(hit), role, object), pa.string()),
                     "shard_set": pa.array(np.full(len(hit), manifest.data_version, object), pa.string()),
                     "phase": pa.array([phase_of[s] for s in placed["shard"].to_pylist()], pa.string()),
                     "shard": placed["shard"], "index": placed["index"], "doc_id": placed["doc_id"],
                     "source": member["source"].take(row), "tokens": member["tokens"].take(row),
                     "reads": pa.array(reads[hit], pa.int32()), "tokens_read": pa.array(tokens_read[hit], pa.int64())},
                    schema=EXPOSURE_SCHEMA)
    per_source = {}
    for name in sorted(set(member["source"].to_pylist())):
        mine = read.filter(pc.equal(read["source"], name))
        docs = member.filter(pc.and_(pc.equal(member["source"], name), pc.greater(member["copies"], 0)))
        natural = (sources.get(name) or {}).get("natural_train_tokens")
        in_set = (sources.get(name) or {}).get("train_tokens")
        got = int(pc.sum(mine["tokens_read"]).as_py() or 0)
        per_source[name] = {
            "tokens_read": got, "tokens": in_set, "natural_tokens": natural,
            # unrounded (a little read of a big source is not 0): of the source's tokens in the set, and passes
            # over the source's own data
            "share": got / in_set if in_set else None, "passes": got / natural if natural else None,
            "planned_epochs": (sources.get(name) or {}).get("effective_epochs"),
            "documents_read": len(set(mine["doc_id"].to_pylist())), "documents": len(docs)}
    stats["per_source"] = per_source
    stats["copies_read"] = len(read)
    return read, stats


def write_exposure(folder: Path, table: pa.Table, stats: dict[str, Any]) -> dict[str, Any]:
    """exposure.parquet into the run's dataset folder; the `stats.exposure` to record with it."""
    write_parquet_atomic(Path(folder) / EXPOSURE_FILE, table)
    return {"file": EXPOSURE_FILE, "roles": stats}


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


__all__ = ["EXPOSURE_FILE", "EXPOSURE_SCHEMA", "exposure_of", "measure_exposure", "read_of", "write_exposure"]
