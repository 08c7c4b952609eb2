"""Audits over what is on disk: a checkpoint's lineage, a document's membership, a source's usage.

Answers come from the same `Store` and `_manifest.json` files the assets write (and the persistent
MinHash index for near-duplicates), never from a separate database, so an audit says what the data
says. Three questions:

- `lineage(store, "checkpoint")`: every dataset a checkpoint was built from, back to each source's raw
  documents, with data versions, code versions, git commits, counts and file hashes;
- `membership(store, config, text=... | doc_id=...)`: whether a document (exactly, or as a near-duplicate
  via the MinHash index) reached the training set, and if not, where and why it left;
- `source_usage(store, config, name)`: the token-shard sets and checkpoints that used a source.

The store keeps the current version of each dataset. Where a consumer recorded an input version that
the store no longer holds, the chain says "superseded" rather than pretending; every manifest found
under an asset's folder is listed, so kept older versions show up without changes here.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import pyarrow.parquet as pq

from kiln.common.config import ExactDedup, NearDedup, ProjectConfig
from kiln.curation.pipeline import content_hash
from kiln.curation.documents import make_doc_id
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.common.manifest import MANIFEST_NAME, Manifest
from kiln.common.storage import Store

CHECKPOINT, TRAINING_RUN, SHARDS = "checkpoint", "training_run", "token_shards"
FILTERED, INDEX = "filtered_documents", "dedup_index"
RAW = DOCUMENT_STAGES[0]

# Membership verdicts, from "it was trained on" to "never seen".
IN_TRAINING = "in_training"
VALIDATION = "validation_only"
LEFT_OUT = "left_out_by_mixture"
NOT_IN_SHARDS = "not_in_token_shards"
REMOVED = "removed"
QUARANTINED = "quarantined"
UNKNOWN = "unknown"
NEVER_SEEN = "never_seen"
MAX_COPY_CHAIN = 3  # a kept copy may itself be removed later as a duplicate of another: follow at most this far
_RANK = [IN_TRAINING, VALIDATION, LEFT_OUT, NOT_IN_SHARDS, UNKNOWN, REMOVED, QUARANTINED, NEVER_SEEN]

NOT_MATERIALIZED = "not materialized"


class AuditError(ValueError):
    """A question the store cannot answer as asked: unknown checkpoint or source, unreadable input."""


# ------------------------------------------------------------------------------------------- catalog

def node_key(asset: str, partition: str | None) -> str:
    """How manifests name their inputs: "asset/partition", or "asset" when unpartitioned."""
    return f"{asset}/{partition}" if partition else asset


def parse_key(key: str) -> tuple[str, str | None]:
    asset, _, partition = key.partition("/")
    return asset, partition or None


class Catalog:
    """Read-only view of the manifests in a store, memoized for one audit."""

    def __init__(self, store: Store):
        self.store = store
        self._current: dict[tuple[str, str | None], Manifest | None] = {}
        self._versions: dict[str, list[Manifest]] = {}

    def manifest(self, asset: str, partition: str | None = None) -> Manifest | None:
        """The current manifest of a dataset, or None when it has not been materialized."""
        key = (asset, partition)
        if key not in self._current:
            path = self.store.dataset_dir(asset, partition) / MANIFEST_NAME
            self._current[key] = _load(path) if path.is_file() else None
        return self._current[key]

    def versions(self, asset: str) -> list[Manifest]:
        """Every complete manifest found under the asset's folder (every partition, and any older version
        kept below it), newest first, one per (partition, data version)."""
        if asset not in self._versions:
            found: dict[tuple[str | None, str], Manifest] = {}
            base = self.store.root / asset
            for path in sorted(base.rglob(MANIFEST_NAME)) if base.is_dir() else []:
                if any(p.startswith(".") for p in path.relative_to(base).parts):
                    continue  # a staging folder or one being swapped out: incomplete by definition
                m = _load(path)
                found.setdefault((m.partition, m.data_version), m)
            self._versions[asset] = sorted(found.values(), key=lambda m: m.created_at, reverse=True)
        return self._versions[asset]

    def partitions(self, asset: str) -> list[str | None]:
        """Partitions of an asset that have a current manifest: None for an unpartitioned one, `<refresh>` for a
        per-refresh one, `<source>/<refresh>` for a document dataset."""
        base = self.store.root / asset
        found = []
        for d in [base] if base.is_dir() else []:
            for child in sorted(d.iterdir()):
                if not child.is_dir() or child.name.startswith("."):
                    continue
                if (child / MANIFEST_NAME).is_file():
                    found.append(None if child.name == "_all" else child.name)
                else:
                    found += [f"{child.name}/{g.name}" for g in sorted(child.iterdir()) if g.is_dir()
                              and not g.name.startswith(".") and (g / MANIFEST_NAME).is_file()]
        return sorted(found, key=str)

    def source_partitions(self, asset: str, source: str) -> list[str]:
        """The partitions holding one source's documents at a stage, one per refresh."""
        return [p for p in self.partitions(asset) if p and p.split("/")[0] == source and "/" in p]

    def newest(self, asset: str) -> Manifest | None:
        """The most recently written manifest of an asset over all its partitions (e.g. the latest dedup index)."""
        versions = self.versions(asset)
        return versions[0] if versions else None

    def assets(self) -> list[str]:
        root = self.store.root
        return sorted(d.name for d in root.iterdir() if d.is_dir() and not d.name.startswith(".")) \
            if root.is_dir() else []


def _load(path: Path) -> Manifest:
    try:
        return Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))
    except (json.JSONDecodeError, TypeError, KeyError) as exc:
        raise AuditError(f"{path} is not a readable Kiln manifest ({exc})") from None


# ------------------------------------------------------------------------------------------- lineage

@dataclass
class LineageNode:
    """One dataset in a lineage chain, as its manifest describes it."""

    key: str
    asset: str
    partition: str | None
    status: str  # "current" | "superseded" (a consumer used another version) | "not materialized"
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
                out.append(f"{n.key}: consumers recorded {', '.join(older)}; the store now holds {n.data_version} "
                           f"(re-materialized since), so the chain below it is the current version's")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {"target": self.target, "store": self.store, "problems": self.problems,
                "nodes": [asdict(n) for n in self.nodes], "base_checkpoint": self.base}

    def render(self, files_per_node: int = 3) -> str:
        """The chain as an indented tree from the target; a dataset reached twice is shown once."""
        by_key = {n.key: n for n in self.nodes}
        lines = [f"Lineage of {self.target} ({len(self.nodes)} datasets, store {self.store})"]
        shown: set[str] = set()

        def walk(key: str, indent: int) -> None:
            n, pad = by_key[key], "  " * indent
            if key in shown:
                lines.append(f"{pad}{key}  {n.data_version or NOT_MATERIALIZED}  (listed above)")
                return
            shown.add(key)
            if n.status == NOT_MATERIALIZED:
                lines.append(f"{pad}{key}  NOT MATERIALIZED (recorded {', '.join(n.recorded_versions)})")
                return
            flag = "  SUPERSEDED" if n.status == "superseded" else ""
            lines.append(f"{pad}{key}  {n.data_version}{flag}  created {n.created_at}  code {n.code_version}  "
                         f"git {_short_commit(n.git_commit)}")
            if n.counts:
                lines.append(f"{pad}    counts " + ", ".join(f"{k}={v:,}" for k, v in n.counts.items()))
            described = [f"{f['path']} sha256:{f['sha256'][:16]}" for f in n.files[:files_per_node]]
            more = f" +{len(n.files) - files_per_node} more" if len(n.files) > files_per_node else ""
            lines.append(f"{pad}    files {len(n.files)} ({_size(n.bytes)}): " + ", ".join(described) + more)
            for child in sorted(n.inputs):
                walk(child, indent + 1)

        walk(self.nodes[0].key, 0)
        refreshes: dict[str, list[str]] = {}  # source -> the refreshes of its raw documents reached
        for p in self.partitions(RAW):
            if by_key[node_key(RAW, p)].status != NOT_MATERIALIZED:
                source, _, refresh = str(p).partition("/")
                refreshes.setdefault(source, []).append(refresh)
        lines.append("raw sources reached: " + (", ".join(f"{s} ({', '.join(r)})" for s, r in sorted(refreshes.items()))
                                                or "none"))
        lines += [f"warning: {p}" for p in self.problems]
        if self.base:
            b = self.base
            lines.append(f"continued pretraining from base checkpoint {b['kind']} sha256:{b['sha256'][:16]} "
                         f"({b['path']}; tokenizer {str(b['tokenizer_sha256'])[:12]}, trained on {b['trained_on']})")
            chain = (b.get("chain") or {}).get("text")
            lines += ["  " + line for line in chain.splitlines()] if chain else [
                "  its chain is unknown: the base came from outside this store"]
        return "\n".join(lines)


def _short_commit(commit: str | None) -> str:
    if not commit:
        return "unknown"
    return commit[:12] + ("-dirty" if commit.endswith("-dirty") else "")


def _size(n: int) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if n < 1000 or unit == "GB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000
    return f"{n} B"


def resolve_target(store: Store, target: str, catalog: Catalog | None = None) -> Manifest:
    """A checkpoint (or any dataset) from what a user types: the literal `checkpoint` (the current one), an
    asset key such as `token_shards` or `curated_documents/web`, a data version (or a prefix of at least
    6 characters), or a folder: a dataset folder with `_manifest.json`, or a run's DeepSpeed checkpoint."""
    catalog = catalog or Catalog(store)
    asset, partition = parse_key(target)
    if not Path(target).is_absolute() and asset in catalog.assets():
        found = catalog.manifest(asset, partition)
        if found is not None:
            return found
    if target == CHECKPOINT:
        raise AuditError(f"no checkpoint in {store.root}: materialize `checkpoint` first")
    path = Path(target).expanduser()
    if path.is_dir():
        resolved = path.resolve()
        for folder in [resolved, *resolved.parents][:3]:  # the dataset folder, or its hf/ or safetensors/ inside
            if (folder / MANIFEST_NAME).is_file():
                return _load(folder / MANIFEST_NAME)
        for m in catalog.versions(CHECKPOINT):
            ds = m.stats.get("deepspeed_checkpoint")
            if ds and (Path(ds).resolve() == resolved or resolved in Path(ds).resolve().parents):
                return m
        raise AuditError(f"{path} is neither a dataset folder with {MANIFEST_NAME} nor the DeepSpeed checkpoint (or "
                         f"run folder) of a checkpoint in {store.root}")
    if len(target) >= 6 and all(c in "0123456789abcdef" for c in target.lower()):
        hits = {}
        for name in [CHECKPOINT] + [a for a in catalog.assets() if a != CHECKPOINT]:
            for m in catalog.versions(name):
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
        if m is None:
            nodes[key] = LineageNode(key, asset, partition, NOT_MATERIALIZED, [recorded] if recorded else [], depth=depth)
            continue
        replaced = (m.stats.get("migrated_index") or {}).get("replaces")
        node = nodes[key] = LineageNode(
            key, asset, partition, "current", [recorded] if recorded else [], m.data_version, m.code_version,
            m.git_commit, m.created_at, dict(m.counts),
            [{"path": f.path, "role": f.role, "sha256": f.sha256, "bytes": f.bytes, "rows": f.rows} for f in m.files],
            dict(m.inputs), depth, [replaced] if replaced else [])
        _mark(node)
        base = base or m.stats.get("base_checkpoint")
        queue += [(k, v, depth + 1, None) for k, v in sorted(m.inputs.items())]
    return Lineage(node_key(root.asset, root.partition) + f" {root.data_version}", str(store.root), list(nodes.values()),
                   base)


def _mark(node: LineageNode) -> None:
    if node.data_version and any(v not in {node.data_version, *node.same_files_as} for v in node.recorded_versions):
        node.status = "superseded"


# ---------------------------------------------------------------------------------------- membership

@dataclass
class StageRecord:
    """Where one stage left a document."""

    stage: str  # the asset (a DOCUMENT_STAGES entry)
    source: str | None
    status: str  # kept | removed | quarantined | absent | not reached | not materialized
    data_version: str | None = None
    step: str | None = None  # the rejected table's `stage` column: filter, exact_dedup, near_dedup, quality, ...
    reason: str | None = None
    duplicate_of: str | None = None
    jaccard: float | None = None
    cluster_id: str | None = None


@dataclass
class ShardRecord:
    """A document's row in a token-shard set's member list."""

    shard_set: str  # the token_shards data version
    split: str
    copies: int
    tokens: int
    checkpoints: list[str] = field(default_factory=list)  # data versions of checkpoints trained on this set
    removed_by: str | None = None  # `removal_request:<id>`: the set left the document out


@dataclass
class Membership:
    query: dict[str, Any]
    match: str  # doc_id | exact | near_duplicate | none
    verdict: str
    summary: str
    doc_id: str | None = None
    source: str | None = None
    license: str | None = None
    jaccard: float | None = None  # near_duplicate: exact Jaccard between the given text and the matched document
    stages: list[StageRecord] = field(default_factory=list)
    shards: list[ShardRecord] = field(default_factory=list)
    other_matches: list[dict[str, Any]] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    refresh: str | None = None  # the refresh that brought the document in
    # A removed duplicate's kept copy: doc_id, verdict, reached_training, summary, checkpoints trained on it
    kept_copy: dict[str, Any] | None = None

    @property
    def reached_training(self) -> bool:
        return self.verdict == IN_TRAINING

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "reached_training": self.reached_training}

    def render(self) -> str:
        lines = [self.summary]
        if self.match == "near_duplicate":
            lines.append(f"matched as a near-duplicate of {self.doc_id}: exact Jaccard {self.jaccard:.3f} of the "
                         f"shingle sets (found through the MinHash index)")
        elif self.match == "exact":
            lines.append(f"matched exactly (text hash after exact dedup's case and whitespace folding): {self.doc_id}")
        if self.doc_id:
            arrived = f", refresh {self.refresh}" if self.refresh else ""
            lines.append(f"document {self.doc_id} (source {self.source}{arrived}, license {self.license or 'unknown'})")
        if self.stages:
            lines.append("stages:")
            width = max(len(f"{r.stage}[{r.source}]") for r in self.stages)
            for r in self.stages:
                where = f"{r.stage}[{r.source}]" if r.source else r.stage
                detail = ""
                if r.status in ("removed", "quarantined"):
                    detail = f"  step {r.step}, reason {r.reason}" if r.step else f"  reason {r.reason}"
                    if r.duplicate_of:
                        detail += f", duplicate of {r.duplicate_of}"
                    if r.jaccard is not None:
                        detail += f" (Jaccard {r.jaccard:.3f})"
                version = f"  {r.data_version}" if r.data_version else ""
                lines.append(f"  {where:<{width}}  {r.status:<16}{version}{detail}".rstrip())
        for s in self.shards:
            ckpts = ", ".join(s.checkpoints) or "none in the store"
            held = f"left out by {s.removed_by}" if s.removed_by else \
                f"split {s.split}, {s.copies} cop{'y' if s.copies == 1 else 'ies'} x {s.tokens:,} tokens"
            lines.append(f"token_shards {s.shard_set}: {held}; checkpoints: {ckpts}")
        for o in self.other_matches:
            lines.append(f"also the same text: {o['doc_id']} ({o['source']}): {o['verdict']}")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def membership(store: Store, config: ProjectConfig, text: str | None = None, doc_id: str | None = None,
               checkpoint: str | None = None) -> Membership:
    """Whether a document reached training: by `doc_id`, or by `text` (exact normalized-text match, else a
    near-duplicate through the bucket index in the dedup_index datasets). With `checkpoint`, only the token shards
    that checkpoint was trained on count."""
    if (text is None) == (doc_id is None):
        raise AuditError("give exactly one of a text or a doc_id")
    catalog = Catalog(store)
    shard_versions = _checkpoint_shards(catalog, checkpoint) if checkpoint else None
    if doc_id is not None:
        return _trace(catalog, config, doc_id.strip(), {"doc_id": doc_id.strip()}, "doc_id", shard_versions)
    query = {"text_sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), "chars": len(text)}
    exact = _exact_matches(catalog, config, text)
    if exact:
        results = sorted((_trace(catalog, config, d, query, "exact", shard_versions) for d in exact),
                         key=lambda r: (_RANK.index(r.verdict), r.doc_id))
        best = results[0]
        best.other_matches = [{"doc_id": r.doc_id, "source": r.source, "verdict": r.verdict} for r in results[1:]]
        return best
    near, notes = _near_match(catalog, config, text)
    if near is not None:
        matched, score = near
        result = _trace(catalog, config, matched, query, "near_duplicate", shard_versions)
        result.jaccard = score
        result.notes = notes + result.notes
        if result.doc_id is None:  # indexed by an earlier refresh whose datasets the store no longer holds
            result.match, result.doc_id, result.verdict = "near_duplicate", matched, UNKNOWN
            result.summary = (f"UNKNOWN: a near-duplicate of {matched}, which the dedup index accepted in an earlier "
                              f"refresh, but no dataset in the store holds it any more")
        return result
    return Membership(query, "none", NEVER_SEEN, "never seen: no document in the store has this text, exactly or as "
                      "a near-duplicate", notes=notes)


def _trace(catalog: Catalog, config: ProjectConfig, doc_id: str, query: dict, match: str,
           shard_versions: set[str] | None, depth: int = 0) -> Membership:
    """Follow one doc_id through every document stage and the token shards' member lists (and, for a removed
    duplicate, its kept copy: `depth` copies deep)."""
    kept_copy = None
    sources = [s.name for s in config.sources]
    hint: str | None = None
    stages: list[StageRecord] = []
    row: dict[str, Any] = {}
    gone = False
    for stage in DOCUMENT_STAGES:
        if gone:
            stages.append(StageRecord(stage, hint, "not reached"))
            continue
        partitions = [hint] if hint else sorted(set(catalog.partitions(stage)) | set(sources), key=str)
        materialized = [p for p in partitions if catalog.manifest(stage, p) is not None]
        if not materialized:
            stages.append(StageRecord(stage, hint, NOT_MATERIALIZED))
            continue
        record = None
        for p in materialized:
            record, found = _find_in_stage(catalog, stage, p, doc_id)
            if record is not None:
                row = row or found
                hint = p
                break
        if record is None:
            record = StageRecord(stage, hint, "absent", catalog.manifest(stage, hint).data_version if hint else None)
            gone = hint is not None  # seen before and now gone: left without a trace (should not happen)
        else:
            gone = record.status in ("removed", "quarantined")
        stages.append(record)

    shards, notes = [], []
    shards_gone = shard_versions is not None and not any(m.data_version in shard_versions
                                                         for m in catalog.versions(SHARDS))
    for m in catalog.versions(SHARDS):
        if shard_versions is not None and m.data_version not in shard_versions:
            continue
        paths = [catalog.store.dataset_dir(SHARDS, m.partition) / f.path for f in m.files_with_role("members")]
        if not paths:
            notes.append(f"token_shards {m.data_version} has no member list (written before member lists existed); "
                         f"re-materialize token_shards to answer from the shards")
            continue
        checkpoints = _checkpoints_using(catalog, m.data_version)
        for path in paths:
            for r in pq.read_table(path, filters=[("doc_id", "=", doc_id)]).to_pylist():
                shards.append(ShardRecord(m.data_version, r["split"], r["copies"], r["tokens"], checkpoints,
                                          r.get("removed_by")))
                hint = hint or r["source"]
    if shards_gone:
        notes.append(f"the checkpoint was trained on token_shards {', '.join(sorted(shard_versions))}, which is no "
                     f"longer in the store: its member list cannot be read")

    kept = [r for r in stages if r.status == "kept"]
    removed = next((r for r in stages if r.status in ("removed", "quarantined")), None)
    # A shard set that left it out by a removal request (`kiln forget`, applied to every refresh) outranks older
    # sets that still hold it, unless a checkpoint in the store was trained on those.
    requested = next((s for s in shards if s.removed_by), None)
    stale = [s for s in shards if s.copies > 0 and requested and not s.checkpoints]
    shards_left = [s for s in shards if s not in stale and not s.removed_by]
    train = [s for s in shards_left if s.split == "train"]
    where = f"token_shards {', '.join(s.shard_set for s in shards_left)}"
    if stale:
        notes.append(f"token_shards {', '.join(s.shard_set for s in stale)} (no checkpoint in the store trained on "
                     f"it) still hold{'s' if len(stale) == 1 else ''} it: re-materialize token_shards")
    if any(s.copies > 0 for s in train):
        s = next(s for s in train if s.copies > 0)
        verdict = IN_TRAINING
        summary = (f"IN TRAINING: {s.copies} cop{'y' if s.copies == 1 else 'ies'} in the train split of token_shards "
                   f"{s.shard_set}" + (f", used by checkpoint {', '.join(s.checkpoints)}" if s.checkpoints else ""))
        if requested is not None:
            notes.append(f"token_shards {requested.shard_set} has since left it out ({requested.removed_by}); a "
                         f"checkpoint trained on {s.shard_set} still holds what it learned from it")
        elif removed is not None:
            notes.append(f"{removed.stage} has since removed it ({removed.reason}); the token shards predate that: "
                         f"re-materialize token_shards")
    elif requested is not None:
        verdict = REMOVED
        summary = f"NOT TRAINED ON: left out of token_shards {requested.shard_set} by {requested.removed_by}"
    elif any(s.split == "val" for s in shards_left):
        verdict, summary = VALIDATION, f"NOT TRAINED ON: held out for validation (in the val split of {where})"
    elif train:
        verdict, summary = LEFT_OUT, (f"NOT TRAINED ON: left out by the mixture (0 copies in the train split of "
                                      f"{where}: its source was subsampled)")
    elif removed is not None:
        verdict = REMOVED if removed.status == "removed" else QUARANTINED
        summary = f"NOT TRAINED ON: removed at {removed.stage}" + (f" ({removed.step})" if removed.step else "")
        summary += f", reason {removed.reason}"
        if removed.duplicate_of:
            summary += f", duplicate of {removed.duplicate_of}"
        if removed.jaccard is not None:
            summary += f" (Jaccard {removed.jaccard:.3f})"
        if removed.duplicate_of and depth < MAX_COPY_CHAIN:
            # The auditor's real question: a duplicate is removed because its copy was kept; did that copy train?
            copy = _trace(catalog, config, removed.duplicate_of, query, "doc_id", shard_versions, depth + 1)
            kept_copy = {"doc_id": copy.doc_id or removed.duplicate_of, "verdict": copy.verdict,
                         "reached_training": copy.reached_training, "summary": copy.summary,
                         "checkpoints": sorted({c for s in copy.shards if s.copies > 0 and s.split == "train"
                                                for c in s.checkpoints})}
            summary += f"; its kept copy {kept_copy['doc_id']}: {copy.summary}"
    elif shards_gone:
        verdict, summary = UNKNOWN, "UNKNOWN: the checkpoint's token shards are not in the store"
    elif kept:
        verdict = NOT_IN_SHARDS
        summary = (f"NOT TRAINED ON: kept through {kept[-1].stage} but in no token-shard member list (shards not "
                   f"materialized, or built before this document arrived)")
    else:
        verdict, summary = NEVER_SEEN, f"never seen: no dataset in the store holds doc_id {doc_id}"
    source, _, refresh = (hint or "").partition("/")
    return Membership(query, match if (kept or removed or shards) else "none", verdict, summary,
                      doc_id if (kept or removed or shards) else None, source or None, row.get("license"), None, stages,
                      shards, notes=notes, refresh=refresh or None, kept_copy=kept_copy)


def _find_in_stage(catalog: Catalog, stage: str, partition: str, doc_id: str) -> tuple[StageRecord | None, dict]:
    m = catalog.manifest(stage, partition)
    base = catalog.store.dataset_dir(stage, partition)
    for f in m.files_with_role("documents"):
        path = base / f.path
        cols = [c for c in ("doc_id", "source", "license") if c in pq.read_schema(path).names]
        rows = pq.read_table(path, columns=cols, filters=[("doc_id", "=", doc_id)]).to_pylist()
        if rows:
            return StageRecord(stage, partition, "kept", m.data_version), rows[0]
    for f in m.files_with_role("rejected"):
        path = base / f.path
        names = pq.read_schema(path).names
        cols = [c for c in ("doc_id", "source", "license", "stage", "reason", "duplicate_of", "jaccard", "cluster_id")
                if c in names]
        rows = pq.read_table(path, columns=cols, filters=[("doc_id", "=", doc_id)]).to_pylist()
        if rows:
            r = rows[0]
            return StageRecord(stage, partition, "removed", m.data_version, r.get("stage"), r.get("reason"),
                               r.get("duplicate_of"), r.get("jaccard"), r.get("cluster_id")), r
    for f in m.files_with_role("quarantine"):
        table = pq.read_table(base / f.path, columns=["source", "locator", "reason"])
        for r in table.to_pylist():
            if make_doc_id(r["source"], r["locator"]) == doc_id:
                return StageRecord(stage, partition, "quarantined", m.data_version, "read", r["reason"]), r
    return None, {}


def _exact_settings(catalog: Catalog, config: ProjectConfig) -> ExactDedup:
    """The exact-dedup normalization the store was built with (its manifest), else the config's."""
    for p in catalog.partitions(FILTERED):
        recorded = catalog.manifest(FILTERED, p).config.get("exact_dedup")
        if recorded:
            return ExactDedup.model_validate(recorded)
    return config.curation.exact_dedup


def _exact_matches(catalog: Catalog, config: ProjectConfig, text: str) -> list[str]:
    """doc_ids whose text is this text after exact dedup's normalization: the filtered documents' stored
    content hashes first (text as curated, PII placeholders included), else the raw documents' texts
    (text as it came in: also finds documents the filters removed)."""
    settings = _exact_settings(catalog, config)
    wanted = content_hash(text, settings.lowercase, settings.collapse_whitespace)
    found: list[str] = []
    for p in catalog.partitions(FILTERED):
        for path in catalog.store.files(FILTERED, p, "documents"):
            if "content_hash" in pq.read_schema(path).names:
                table = pq.read_table(path, columns=["doc_id"], filters=[("content_hash", "=", wanted)])
                found += table.column("doc_id").to_pylist()
    if found:
        return sorted(set(found))
    for p in catalog.partitions(RAW):
        for batch in catalog.store.iter_batches(RAW, p, columns=["doc_id", "text"]):
            for d, t in zip(batch.column("doc_id").to_pylist(), batch.column("text").to_pylist()):
                if content_hash(t, settings.lowercase, settings.collapse_whitespace) == wanted:
                    found.append(d)
    return sorted(set(found))


def _near_match(catalog: Catalog, config: ProjectConfig, text: str) -> tuple[tuple[str, float] | None, list[str]]:
    """The indexed document most similar to `text` at or above the threshold, by exact Jaccard of the shingle sets
    (the band buckets only propose candidates), over every refresh's bucket index in the store, with the MinHash
    settings the index was built with (its signature scheme included: a record without one is affine32)."""
    from kiln.dedup.buckets import near_matches
    from kiln.dedup.minhash import SCHEME, sign_texts
    from kiln.governance.refresh import load_refreshes

    recorded = catalog.newest(INDEX)
    near = NearDedup.model_validate({"scheme": SCHEME, **recorded.config["near"]}) \
        if recorded and "near" in recorded.config else config.dedup.near
    folders, unmigrated = [], []
    for r in load_refreshes(catalog.store):
        if catalog.manifest(INDEX, r.key) is None:
            continue
        path = catalog.store.dataset_dir(INDEX, r.key) / "index"  # with S3 storage, pulled
        if (path / "_index.json").is_file():
            folders.append(path)
        else:
            unmigrated.append(r.key)
    notes = [f"dedup_index of refresh(es) {', '.join(unmigrated)} holds no bucket index (written before "
             "`kiln dedup migrate-index`): not searched"] if unmigrated else []
    if not folders:
        return None, notes + ["no near-duplicate index in the store: only exact matches were searched"]
    signatures, shingles, _ = sign_texts([text], near, near.scheme)  # as the signature stage made the index's
    try:
        found = near_matches(folders, shingles, signatures[0], near)
    except ValueError as exc:
        return None, notes + [f"near-duplicate search unavailable: {exc}"]
    if found and found[0][0] >= near.threshold:
        return (found[0][1], round(float(found[0][0]), 6)), notes
    if found:
        notes.append(f"closest indexed document {found[0][1]} has Jaccard {found[0][0]:.3f}, below the "
                     f"near-duplicate threshold {near.threshold}")
    return None, notes


# ----------------------------------------------------------------------------------- checkpoints & shards

def _checkpoints_using(catalog: Catalog, shards_version: str) -> list[str]:
    """Data versions of the checkpoints in the store whose training run read this token-shard set."""
    out = []
    for ckpt in catalog.versions(CHECKPOINT):
        if shards_version in _shards_of_checkpoint(catalog, ckpt):
            out.append(ckpt.data_version)
    return out


def _shards_of_checkpoint(catalog: Catalog, ckpt: Manifest) -> set[str]:
    """The token_shards data versions a checkpoint's training run recorded as inputs (via its run's manifest)."""
    versions = set()
    for key, version in ckpt.inputs.items():
        asset, _ = parse_key(key)
        if asset == SHARDS:
            versions.add(version)
        elif asset == TRAINING_RUN:
            for run in catalog.versions(TRAINING_RUN):
                if run.data_version == version:
                    versions |= {v for k, v in run.inputs.items() if parse_key(k)[0] == SHARDS}
    return versions


def _checkpoint_shards(catalog: Catalog, checkpoint: str) -> set[str]:
    ckpt = resolve_target(catalog.store, checkpoint, catalog)
    versions = _shards_of_checkpoint(catalog, ckpt)
    if not versions:
        raise AuditError(f"cannot tell which token shards {node_key(ckpt.asset, ckpt.partition)} {ckpt.data_version} "
                         f"was trained on: its training_run manifest ({ckpt.inputs}) is not in the store")
    return versions


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

    def render(self) -> str:
        lines = [f"Source {self.source} (license {self.license or 'unknown'}, domain {self.domain or 'unknown'})",
                 "documents per stage and refresh:"]
        width = max(len(f"{s['stage']}[{s.get('refresh')}]") for s in self.stages)
        for s in self.stages:
            if s.get("status") == NOT_MATERIALIZED:
                lines.append(f"  {s['stage']:<{width}} {NOT_MATERIALIZED}")
            else:
                lines.append(f"  {s['stage'] + '[' + s['refresh'] + ']':<{width}} {s['documents']:>8,} kept "
                             f"{s['rejected']:>7,} removed  {s['data_version']}")
        if not self.shard_sets:
            lines.append("token shards: none in the store use this source")
        for u in self.shard_sets:
            lines.append(f"token_shards {u.data_version} ({u.created_at}): {u.train_tokens:,} train tokens "
                         f"({u.share_of_train_tokens:.1%} of the set, {u.effective_epochs:.2f} epochs of "
                         f"{u.natural_train_tokens:,}), {u.val_tokens:,} val tokens; documents {u.train_documents:,} "
                         f"train / {u.val_documents:,} val")
            train = [s for s in u.shards if s["split"] == "train"]
            val = [s for s in u.shards if s["split"] == "val"]
            for label, group in (("train", train), ("val", val)):
                if group:
                    shown = ", ".join(f"{s['path']} ({s['tokens']:,})" for s in group[:4])
                    more = f" +{len(group) - 4} more" if len(group) > 4 else ""
                    lines.append(f"  {label} shards with this source: {len(group)}: {shown}{more}")
            for c in u.checkpoints:
                lines.append(f"  checkpoint {c['data_version']} ({c['created_at']}): {c['steps']} steps, MLflow run "
                             f"{c['mlflow_run_id'] or 'unknown'}")
            if not u.checkpoints:
                lines.append("  checkpoints: none in the store trained on this shard set")
        lines += [f"note: {n}" for n in self.notes]
        return "\n".join(lines)


def source_usage(store: Store, config: ProjectConfig, name: str) -> SourceUsage:
    """Which token-shard sets and checkpoints used source `name`, with its tokens and documents in each."""
    catalog = Catalog(store)
    shard_sets = catalog.versions(SHARDS)
    declared = {s.name: s for s in config.sources}
    seen = set(declared) | {p.split("/")[0] for st in DOCUMENT_STAGES for p in catalog.partitions(st) if p} | \
        {n for m in shard_sets for n in (m.stats.get("sources") or {})}
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
        composition = m.stats.get("shard_sources") or {}
        if not composition:
            notes.append(f"token_shards {m.data_version} does not record shards' sources (written before that was "
                         f"recorded): the shard list shows every shard of the set")
        shards = []
        for info in m.stats.get("shards", []):
            if composition:
                c = composition.get(info["path"], {}).get(name)
                if c:
                    shards.append({"path": info["path"], "split": info["split"], **c})
            else:
                shards.append({"path": info["path"], "split": info["split"], "documents": None, "tokens": None})
        total_train = (m.stats.get("totals") or {}).get("train_tokens") or m.counts.get("train_tokens") or 0
        checkpoints = []
        for ckpt in catalog.versions(CHECKPOINT):
            if m.data_version in _shards_of_checkpoint(catalog, ckpt):
                checkpoints.append({"data_version": ckpt.data_version, "created_at": ckpt.created_at,
                                    "steps": ckpt.counts.get("steps"),
                                    "mlflow_run_id": (ckpt.stats.get("mlflow") or {}).get("run_id")})
        usages.append(ShardSetUsage(
            m.data_version, m.created_at, mine["train_tokens"], mine["val_tokens"], mine["train_documents"],
            mine["val_documents"], mine["natural_train_tokens"], mine["effective_epochs"],
            round(mine["train_tokens"] / total_train, 6) if total_train else 0.0, shards, checkpoints))
    return SourceUsage(name, license, domain, stages, usages, notes)


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

    def render(self) -> str:
        lines = [f"{len(self.refreshes)} refresh(es); landing area {self.landing}"]
        for r in self.refreshes:
            files = "the configured sources" if r["landed_files"] is None else \
                "; ".join(f"{s}: {', '.join(fs[:3])}" + (f" +{len(fs) - 3} more" if len(fs) > 3 else "")
                          for s, fs in r["landed_files"].items()) or "no files"
            shards = f"token_shards {r['token_shards']}" if r["token_shards"] else "token_shards not materialized"
            lines.append(f"{r['key']}  registered {r['created_at']} by {r['trigger']}: {files}; {shards}")
            for source, n in r["sources"].items():
                lines.append(f"  {source:<20} {n['raw_records']:>8,} raw records -> {n['documents']:>8,} documents"
                             if n else f"  {source:<20} not materialized")
        for source, files in self.pending.items():
            lines.append(f"pending for {source}: {', '.join(files)} (the next sensor tick or scheduled refresh "
                         f"registers them)")
        lines += [f"warning: landing folder {u!r} names no declared source; its files are left alone"
                  for u in self.unknown_sources]
        return "\n".join(lines)


def refresh_report(store: Store, config: ProjectConfig) -> RefreshReport:
    from kiln.governance.refresh import load_refreshes, partition, pending_files

    catalog, refreshes = Catalog(store), load_refreshes(store)
    rows = []
    for r in refreshes:
        sources = {}
        for s in config.sources:
            raw, final = (catalog.manifest(a, partition(s.name, r.key)) for a in (RAW, DOCUMENT_STAGES[-1]))
            sources[s.name] = {"raw_records": raw.counts.get("records", 0) if raw else 0,
                               "documents": final.counts.get("documents", 0) if final else 0} if raw else None
        shards = catalog.manifest(SHARDS, r.key)
        rows.append({"key": r.key, "created_at": r.created_at, "trigger": r.trigger,
                     "landed_files": None if r.is_initial else {s: [f.relative for f in fs] for s, fs in r.files.items()},
                     "sources": sources, "token_shards": shards.data_version if shards else None})
    landing = config.refresh.landing_path()
    pending = pending_files(landing, [s.name for s in config.sources], refreshes) if refreshes else None
    return RefreshReport(landing, rows, {s: [f.relative for f in fs] for s, fs in pending.files.items()}
                         if pending else {}, pending.unknown_sources if pending else [])


__all__ = ["AuditError", "Catalog", "Lineage", "LineageNode", "Membership", "ShardRecord", "SourceUsage",
           "StageRecord", "RefreshReport", "lineage", "membership", "refresh_report", "resolve_target", "source_usage",
           "DOCUMENT_STAGES"]
