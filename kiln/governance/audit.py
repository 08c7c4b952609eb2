"""Audits over what is on disk: a checkpoint's lineage, a source's usage, the refreshes.

Read from the store through `kiln.governance.catalog`; a document's membership is `kiln.governance.membership`,
and `kiln.governance.render` turns each answer into text. The questions here:

- `lineage(store, "checkpoint")`: every dataset a checkpoint was built from, back to each source's raw
  documents, with data versions, code versions, git commits, counts and file hashes;
- `source_usage(store, config, name)`: the token-shard sets and checkpoints that used a source;
- `refresh_report(store, config)`: every registered refresh, and what is waiting to land;
- `trained_on(store)`: the current checkpoint with the shards and tokenizer its own run read, where the store still
  holds them (what the evaluation scores it on; `pinned` is the store as a checkpoint read it, for the data card too).

The store keeps the current version of each dataset, and the manifest of every version it published
(`Store.manifest_at`). Where a consumer recorded an input version the store has replaced since, the chain
describes the recorded version from that history ("replaced", naming the version now current), so it stays
what the checkpoint was built from. Only where consumers recorded different versions of one dataset, or the
recorded one predates the history, does it say "superseded" and follow the current version, rather than pretend.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import pyarrow.parquet as pq

from kiln.common.config import ProjectConfig
from kiln.common.manifest import Manifest
from kiln.common.storage import Snapshot, Store
from kiln.governance.catalog import (
    CHECKPOINT,
    NOT_MATERIALIZED,
    RAW,
    SHARDS,
    TOKENIZER,
    TRAINING_RUN,
    AuditError,
    Catalog,
    checkpoints_using,
    known_sources,
    made_from,
    node_key,
    parse_key,
    resolve_target,
    stored_sources,
    trained_shard_sets,
)
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.governance.refresh import trained_refresh


# ------------------------------------------------------------------------------------------- lineage

@dataclass
class LineageNode:
    """One dataset in a lineage chain, as its manifest describes it."""

    key: str
    asset: str
    partition: str | None
    # "current" | "replaced" (the version consumers recorded, from the store's history; the store now holds
    # `current_version`) | "superseded" (consumers recorded versions not described here) | "not materialized"
    status: str
    recorded_versions: list[str]  # the data versions consumers recorded for it (none for the target)
    data_version: str | None = None
    code_version: str | None = None
    git_commit: str | None = None
    created_at: str | None = None
    counts: dict[str, int] = field(default_factory=dict)
    files: list[dict[str, Any]] = field(default_factory=list)  # path, role, sha256, bytes, rows
    inputs: dict[str, str] = field(default_factory=dict)  # key -> data version it recorded
    depth: int = 0
    # Earlier versions whose files are all in this one unchanged (`kiln dedup migrate-index` only added files):
    # a consumer that recorded one of them read what this version holds.
    same_files_as: list[str] = field(default_factory=list)
    current_version: str | None = None  # the version the store holds now (None: it holds none)

    @property
    def bytes(self) -> int:
        return sum(f["bytes"] for f in self.files)


@dataclass
class Lineage:
    """The datasets a target (normally a checkpoint) was built from, breadth first, each dataset once."""

    target: str
    store: str
    nodes: list[LineageNode]
    # A continued run's base checkpoint, as the training run recorded it (training_run stats): its identity and
    # the chain it was built from when the run started.
    base: dict[str, Any] | None = None

    def node(self, key: str) -> LineageNode | None:
        return next((n for n in self.nodes if n.key == key), None)

    def partitions(self, asset: str) -> list[str | None]:
        return [n.partition for n in self.nodes if n.asset == asset]

    @property
    def problems(self) -> list[str]:
        out = []
        for n in self.nodes:
            if n.status == NOT_MATERIALIZED:
                out.append(f"{n.key}: recorded as an input ({', '.join(n.recorded_versions)}) but not in the store")
            elif n.status == "superseded":
                older = sorted(set(n.recorded_versions) - {n.data_version, *n.same_files_as})
                which = "the store's current version" if n.data_version == n.current_version else \
                    "from the store's history"
                out.append(f"{n.key}: consumers also recorded {', '.join(older)}; the chain below it is "
                           f"{n.data_version}'s ({which})")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "store": self.store, "problems": self.problems,
                "nodes": [asdict(n) for n in self.nodes], "base_checkpoint": self.base}


def lineage(store: Store, checkpoint: str = CHECKPOINT) -> Lineage:
    """The chain from `checkpoint` (see `resolve_target`) back to raw sources, following manifest inputs."""
    catalog = Catalog(store)
    root = resolve_target(store, checkpoint, catalog)
    nodes: dict[str, LineageNode] = {}
    base = None
    queue: list[tuple[str, str | None, int, Manifest | None]] = [
        (node_key(root.asset, root.partition), None, 0, root)]
    while queue:
        key, recorded, depth, manifest = queue.pop(0)
        if key in nodes:
            if recorded and recorded not in nodes[key].recorded_versions:
                nodes[key].recorded_versions.append(recorded)
                _mark(nodes[key])
            continue
        asset, partition = parse_key(key)
        m = manifest or catalog.manifest(asset, partition)
        current = m
        if recorded and (m is None or recorded not in {m.data_version, *_same_files_as(m)}):
            m = catalog.manifest_at(asset, partition, recorded) or m  # what the consumer read, replaced since
        if m is None:
            nodes[key] = LineageNode(key, asset, partition, NOT_MATERIALIZED, [recorded] if recorded else [], depth=depth)
            continue
        node = nodes[key] = LineageNode(
            key, asset, partition, "current" if m is current else "replaced", [recorded] if recorded else [],
            m.data_version, m.code_version, m.git_commit, m.created_at, dict(m.counts),
            [{"path": f.path, "role": f.role, "sha256": f.sha256, "bytes": f.bytes, "rows": f.rows} for f in m.files],
            dict(m.inputs), depth, _same_files_as(m),
            current_version=current.data_version if current is not None else None)
        _mark(node)
        base = base or m.stats.get("base_checkpoint")
        queue += [(k, v, depth + 1, None) for k, v in sorted(m.inputs.items())]
    return Lineage(node_key(root.asset, root.partition) + f" {root.data_version}", str(store.root), list(nodes.values()),
                   base)


def pinned(store: Store, checkpoint: str = CHECKPOINT) -> tuple[Lineage, Catalog]:
    """A checkpoint's lineage, and the store as the checkpoint read it: a Catalog pinned to every version in the chain
    (from the store's history where one was materialized again since; its `snapshot` then gives None, the files being
    gone). What describes or reads a checkpoint's inputs (the data card, the evaluation) reads them through this."""
    chain = lineage(store, checkpoint)
    return chain, Catalog(store, pins={n.key: n.data_version for n in chain.nodes if n.data_version})


@dataclass(frozen=True)
class TrainedOn:
    """What a checkpoint was trained on, still readable: its training run (from the store's history where a later
    run replaced it), the refresh and the token shards it read, and a tokenizer with the sha256 it trained with."""

    checkpoint: Snapshot
    run: Manifest
    refresh: str
    shards: Snapshot
    tokenizer: Snapshot


def trained_on(store: Store) -> TrainedOn:
    """The store's current checkpoint with the versions its own training run read (not the store's newest run, which
    may be a later one not exported yet; not a tokenizer or shards materialized again since). AuditError, naming what
    differs and what to do, where the store no longer holds them: scored with another tokenizer, or on another split,
    a checkpoint's loss means nothing."""
    _, catalog = pinned(store)
    ckpt = catalog.snapshot(CHECKPOINT)
    run = catalog.manifest(TRAINING_RUN)
    if ckpt is None:  # the lineage resolved one version, then another was published
        raise AuditError("a new checkpoint was published while its lineage was read: try again")
    name = f"checkpoint {ckpt.manifest.data_version}"
    if run is None or not made_from(ckpt.manifest, run):
        raise AuditError(f"{name}: the store holds no manifest of training_run "
                         f"{ckpt.manifest.inputs.get(TRAINING_RUN)}, which it was exported from (what it was trained "
                         f"on is unknown): train again (materialize training_run, then checkpoint)")
    newest = catalog.current_manifest(TRAINING_RUN)
    later = f"; the store's newest training_run {newest.data_version} has no checkpoint yet: materialize checkpoint, " \
            f"then evaluation" if newest is not None and not made_from(ckpt.manifest, newest) else ""
    refresh = trained_refresh(run)
    if refresh is None:
        raise AuditError(f"{name}: its training_run {run.data_version} recorded no token shards{later}")
    read = run.inputs[node_key(SHARDS, refresh)]
    shards = catalog.snapshot(SHARDS, refresh)
    if shards is None or shards.manifest.data_version != read:  # the lineage's version is the run's but in old stores
        now = catalog.current_manifest(SHARDS, refresh)
        raise AuditError(f"{name} was trained on token_shards[{refresh}] {read}, but the store now holds "
                         f"{now.data_version if now else 'none'} (materialized again since: a removal request, a new "
                         f"tokenizer or shard settings), and its validation split with it: train again on the new "
                         f"shards (materialize training_run, then checkpoint){later}")
    # The tokenizer the run read (its manifest, from the history where replaced), else the one its shards were written
    # with: the run's loader checked every shard against it.
    recorded = catalog.manifest(TOKENIZER)
    trained = (recorded.stats.get("card") or {}).get("sha256") if recorded else None
    trained = trained or shards.manifest.stats.get("tokenizer_sha256")
    tokenizer = store.snapshot_or_none(TOKENIZER)  # the current one, pinned to another version or not
    sha = (tokenizer.manifest.stats.get("card") or {}).get("sha256") if tokenizer else None
    if tokenizer is None or sha != trained:  # a tokenizer with the same sha256 (materialized again) is the same one
        raise AuditError(f"{name} was trained with tokenizer {str(trained)[:12]}…, but the tokenizer asset is now "
                         f"{str(sha)[:12]}… ({tokenizer.manifest.data_version if tokenizer else 'not materialized'}; "
                         f"fitted again since): its ids mean other pieces. Train again with the new tokenizer "
                         f"(materialize token_shards, training_run, then checkpoint){later}")
    return TrainedOn(ckpt, run, refresh, shards, tokenizer)


def _same_files_as(m: Manifest) -> list[str]:
    replaced = (m.stats.get("migrated_index") or {}).get("replaces")
    return [replaced] if replaced else []


def _mark(node: LineageNode) -> None:
    if node.data_version and any(v not in {node.data_version, *node.same_files_as} for v in node.recorded_versions):
        node.status = "superseded"


# ------------------------------------------------------------------------------------------ source usage

@dataclass
class ShardSetUsage:
    data_version: str
    created_at: str
    train_tokens: int
    val_tokens: int
    train_documents: int
    val_documents: int
    natural_train_tokens: int
    effective_epochs: float
    share_of_train_tokens: float
    shards: list[dict[str, Any]]  # path, split, documents and tokens of this source in that shard
    checkpoints: list[dict[str, Any]]  # data_version, created_at, steps, mlflow_run_id
    replaced: bool = False  # replaced in the store since (described by its history): a published checkpoint read it


@dataclass
class SourceUsage:
    source: str
    license: str | None
    domain: str | None
    stages: list[dict[str, Any]]  # stage, data_version, documents, rejected (or "not materialized")
    shard_sets: list[ShardSetUsage]
    notes: list[str] = field(default_factory=list)

    @property
    def checkpoints(self) -> list[str]:
        return sorted({c["data_version"] for s in self.shard_sets for c in s.checkpoints})

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "checkpoints": self.checkpoints}


def source_usage(store: Store, config: ProjectConfig, name: str) -> SourceUsage:
    """Which token-shard sets and checkpoints used source `name`, with its tokens and documents in each: the store's
    current sets, and those a published checkpoint was trained on that the store has replaced since."""
    catalog = Catalog(store)
    shard_sets = trained_shard_sets(catalog)
    current = {m.data_version for m in catalog.versions(SHARDS)}
    declared = {s.name: s for s in config.sources}
    seen = set(declared) | stored_sources(catalog)
    if name not in seen:
        raise AuditError(f"unknown source {name!r}; sources: {', '.join(sorted(seen)) or 'none'}")
    license = domain = None
    if name in declared:
        license, domain = declared[name].license, declared[name].domain
    stages = []
    for stage in DOCUMENT_STAGES:
        partitions = catalog.source_partitions(stage, name)
        if not partitions:
            stages.append({"stage": stage, "status": NOT_MATERIALIZED})
        for p in partitions:
            m = catalog.manifest(stage, p)
            kept = sum(f.rows or 0 for f in m.files_with_role("documents"))
            removed = sum(f.rows or 0 for f in m.files_with_role("rejected") + m.files_with_role("quarantine"))
            stages.append({"stage": stage, "refresh": p.split("/", 1)[1], "status": "current",
                           "data_version": m.data_version, "documents": kept, "rejected": removed,
                           "created_at": m.created_at})
            if name not in declared and isinstance(m.config.get("source"), dict):
                # no longer declared: raw_documents recorded the source as it was configured when read
                license, domain = m.config["source"].get("license"), m.config["source"].get("domain")

    usages, notes = [], []
    for m in shard_sets:
        mine = (m.stats.get("sources") or {}).get(name)
        if not mine or not (mine.get("train_tokens") or mine.get("val_tokens")):
            continue
        shards = _shards_holding(catalog.store, m, name)
        if shards is None:
            why = ("the store no longer holds its composition file" if m.files_with_role("composition") else
                   "written before that was recorded")
            notes.append(f"token_shards {m.data_version} does not record shards' sources ({why}): the shard list "
                         f"shows every shard of the set")
            shards = [{"path": info["path"], "split": info["split"], "documents": None, "tokens": None}
                      for info in m.stats.get("shards", [])]
        total_train = (m.stats.get("totals") or {}).get("train_tokens") or m.counts.get("train_tokens") or 0
        checkpoints = [{"data_version": c.data_version, "created_at": c.created_at, "steps": c.counts.get("steps"),
                        "mlflow_run_id": (c.stats.get("mlflow") or {}).get("run_id")}
                       for c in checkpoints_using(catalog, m.data_version)]
        usages.append(ShardSetUsage(
            m.data_version, m.created_at, mine["train_tokens"], mine["val_tokens"], mine["train_documents"],
            mine["val_documents"], mine["natural_train_tokens"], mine["effective_epochs"],
            round(mine["train_tokens"] / total_train, 6) if total_train else 0.0, shards, checkpoints,
            m.data_version not in current))
    return SourceUsage(name, license, domain, stages, usages, notes)


def _shards_holding(store: Store, shards: Manifest, source: str) -> list[dict[str, Any]] | None:
    """The shards of a token-shard set that hold documents of `source`, in shard order, with its documents and tokens
    in each; None where the store has no record of the shards' sources (a set written before they were recorded)."""
    file = next(iter(shards.files_with_role("composition")), None)
    path = file and store.version_file(SHARDS, shards.partition, shards.data_version, file.path)
    if path is not None:
        rows = pq.read_table(path, columns=["shard", "split", "documents", "tokens"],
                             filters=[("source", "==", source)])
        return [{"path": r["shard"], "split": r["split"], "documents": r["documents"], "tokens": r["tokens"]}
                for r in rows.to_pylist()]
    inline = shards.stats.get("shard_sources")  # sets written before the composition was a file of its own
    if not inline:
        return None
    return [{"path": info["path"], "split": info["split"], **counts} for info in shards.stats.get("shards", [])
            if (counts := inline.get(info["path"], {}).get(source))]


# ------------------------------------------------------------------------------------------------ refreshes

@dataclass
class RefreshReport:
    """Every registered refresh (what arrived, what survived, its token shards) and what is waiting to land."""

    landing: str
    refreshes: list[dict[str, Any]]
    pending: dict[str, list[str]]  # source -> landed files no refresh holds yet
    unknown_sources: list[str]

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def refresh_report(store: Store, config: ProjectConfig) -> RefreshReport:
    from kiln.governance.refresh import load_refreshes, partition, pending_files

    catalog, refreshes = Catalog(store), load_refreshes(store)
    declared, names = {s.name for s in config.sources}, known_sources(store, config)
    rows = []
    for r in refreshes:
        sources = {}
        for name in names:  # a source dropped from the config since: in the refreshes it was read in
            raw, final = (catalog.manifest(a, partition(name, r.key)) for a in (RAW, DOCUMENT_STAGES[-1]))
            if raw is None and name not in declared:
                continue
            sources[name] = {"raw_records": raw.counts.get("records", 0) if raw else 0,
                             "documents": final.counts.get("documents", 0) if final else 0} if raw else None
        shards = catalog.manifest(SHARDS, r.key)
        rows.append({"key": r.key, "created_at": r.created_at, "trigger": r.trigger,
                     "landed_files": None if r.is_initial else {s: [f.relative for f in fs] for s, fs in r.files.items()},
                     "sources": sources, "token_shards": shards.data_version if shards else None})
    landing = config.refresh.landing_path()
    pending = pending_files(landing, [s.name for s in config.sources], refreshes) if refreshes else None
    return RefreshReport(landing, rows, {s: [f.relative for f in fs] for s, fs in pending.files.items()}
                         if pending else {}, pending.unknown_sources if pending else [])


__all__ = ["Lineage", "LineageNode", "RefreshReport", "ShardSetUsage", "SourceUsage", "TrainedOn", "lineage", "pinned",
           "refresh_report", "source_usage", "trained_on"]
