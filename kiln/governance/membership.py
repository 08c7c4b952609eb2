"""Whether a document reached training: `membership(store, config, text=... | doc_id=...)`.

A document is found by doc_id, or by its text: exactly (curation's `normalize` step, then exact dedup's
folding, on the question as on the documents), else as a near-duplicate
through the MinHash bucket index in the dedup_index datasets. It is then traced through every document stage and
the token shards' member lists: in the training set, or where and why it left (and, for a removed duplicate,
whether its kept copy was trained on). A shard set a continued run replayed counts as that checkpoint's training
data, except for the documents the run left out of its replay for a removal request (kiln.governance.replay).
A shard set no checkpoint trained on yet counts as the training set only when it is the newest refresh's (the set
the next run reads; it holds every refresh): an older refresh's is noted as stale where the document was removed.
Whether a checkpoint read a document of its shards, and how many times each copy, comes from what its run recorded
it read (kiln.governance.exposure): a run that stopped before reaching a document did not train on it. A run that
recorded no exposure (from before it was recorded, or replaced before the store's history kept it) counts as having
read every document of its shards, as the member list says, with a note. The shard sets and runs of checkpoints a
later one replaced are read from the store's history (their member lists and exposure: `Store.version_file`).
"""

from __future__ import annotations

import hashlib
from contextlib import ExitStack
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pyarrow.parquet as pq

from kiln.common.config import ExactDedup, NearDedup, ProjectConfig
from kiln.common.manifest import Manifest
from kiln.common.remote import in_order
from kiln.common.storage import IncompleteDataset, Store
from kiln.curation.documents import make_doc_id
from kiln.curation.intake_hashes import ROLE as INTAKE_ROLE, bucket_count, search, to_search
from kiln.curation.pipeline import content_hash
from kiln.governance.catalog import (
    CHECKPOINT,
    FILTERED,
    INDEX,
    NOT_MATERIALIZED,
    RAW,
    SHARDS,
    AuditError,
    Catalog,
    _shards_of_checkpoint,
    checkpoints_using,
    member_lists,
    node_key,
    resolve_target,
    run_of_checkpoint,
    trained_shard_sets,
)
from kiln.governance.exposure import exposure_of
from kiln.governance.forget import first_match, load_requests
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.governance.refresh import latest

if TYPE_CHECKING:
    from kiln.governance.replay import HoldOut

# Membership verdicts, from "it was trained on" to "never seen".
IN_TRAINING = "in_training"
NOT_REACHED = "in_shards_not_reached"  # in the train split of a checkpoint's shards, but its run stopped before it
VALIDATION = "validation_only"
LEFT_OUT = "left_out_by_mixture"
NOT_IN_SHARDS = "not_in_token_shards"
REMOVED = "removed"
QUARANTINED = "quarantined"
UNKNOWN = "unknown"
NEVER_SEEN = "never_seen"
MAX_COPY_CHAIN = 3  # a kept copy may itself be removed later as a duplicate of another: follow at most this far
_RANK = [IN_TRAINING, NOT_REACHED, VALIDATION, LEFT_OUT, NOT_IN_SHARDS, UNKNOWN, REMOVED, QUARANTINED, NEVER_SEEN]
UNREADABLE = "unreadable"  # a stage's status where this user may not read it (an access-controlled raw layer)


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
    replayed_by: list[str] = field(default_factory=list)  # of `checkpoints`: those that read this set as replay
    # checkpoints that replayed this set but skipped the document for a removal request, and that request
    removed_from_replay: list[str] = field(default_factory=list)
    removed_from_replay_by: str | None = None
    # checkpoints that replayed this set but left the document out as one of their run's validation documents
    held_out_of_replay: list[str] = field(default_factory=list)
    # of `checkpoints`, those whose run recorded what it read: the times it read each copy (most read first)
    reads: dict[str, list[int]] = field(default_factory=dict)
    # of `checkpoints`: those that read the document (or recorded nothing to say otherwise), and those that did not
    reached_by: list[str] = field(default_factory=list)
    not_reached_by: list[str] = field(default_factory=list)
    read_share: dict[str, float] = field(default_factory=dict)  # per checkpoint: the share of the set's tokens read

    def times(self, checkpoint: str) -> str:
        """` (read N times: a, b by copy)` for a checkpoint whose run recorded its reads, else nothing."""
        if checkpoint not in self.reads:
            return ""
        reads = self.reads[checkpoint]
        total = sum(reads)
        by_copy = f": {', '.join(map(str, reads))} by copy" if len(reads) > 1 else ""
        return f" (read {total} time{'' if total == 1 else 's'}{by_copy})"


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


def membership(store: Store, config: ProjectConfig, text: str | None = None, doc_id: str | None = None,
               checkpoint: str | None = None) -> Membership:
    """Whether a document reached training: by `doc_id`, or by `text` (exact normalized-text match, else a
    near-duplicate through the bucket index in the dedup_index datasets). With `checkpoint`, only the token shards
    that checkpoint was trained on count."""
    if (text is None) == (doc_id is None):
        raise AuditError("give exactly one of a text or a doc_id")
    catalog = Catalog(store)
    only, shard_versions = _checkpoint_shards(catalog, checkpoint) if checkpoint else (None, None)
    if doc_id is not None:
        return _trace(catalog, config, doc_id.strip(), {"doc_id": doc_id.strip()}, "doc_id", shard_versions, only)
    query = {"text_sha256": hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest(), "chars": len(text)}
    exact, unread = _exact_matches(catalog, config, text)
    catalog.expect(exact)  # every copy is traced: each stage's files read once for all of them
    if exact:
        results = sorted((_trace(catalog, config, d, query, "exact", shard_versions, only) for d in exact),
                         key=lambda r: (_RANK.index(r.verdict), r.doc_id))
        best = results[0]
        best.other_matches = [{"doc_id": r.doc_id, "source": r.source, "verdict": r.verdict} for r in results[1:]]
        best.notes = unread + best.notes  # a copy only the raw layer holds may be missing from other_matches
        return best
    near, notes = _near_match(catalog, config, text)
    notes = unread + notes
    if near is not None:
        matched, score = near
        result = _trace(catalog, config, matched, query, "near_duplicate", shard_versions, only)
        result.jaccard = score
        result.notes = notes + result.notes
        if result.doc_id is None:  # indexed by an earlier refresh whose datasets the store no longer holds
            result.match, result.doc_id, result.verdict = "near_duplicate", matched, UNKNOWN
            result.summary = (f"UNKNOWN: a near-duplicate of {matched}, which the dedup index accepted in an earlier "
                              f"refresh, but no dataset in the store holds it any more")
        return result
    if unread:
        return Membership(query, "none", UNKNOWN, "UNKNOWN: no document this user can read has this text, exactly or "
                          "as a near-duplicate; raw_documents, which a filter may have removed it from, is not "
                          "readable by this user", notes=notes)
    return Membership(query, "none", NEVER_SEEN, "never seen: no document in the store has this text, exactly or as "
                      "a near-duplicate", notes=notes)


def _trace(catalog: Catalog, config: ProjectConfig, doc_id: str, query: dict, match: str,
           shard_versions: set[str] | None, only: str | None = None, depth: int = 0) -> Membership:
    """Follow one doc_id through every document stage and the token shards' member lists (and, for a removed
    duplicate, its kept copy: `depth` copies deep); with `only` (a checkpoint's data version), that checkpoint's
    reading alone counts."""
    kept_copy = None
    sources = [s.name for s in config.sources]
    hint: str | None = None
    stages: list[StageRecord] = []
    row: dict[str, Any] = {}
    notes: list[str] = []
    gone = False
    for stage in DOCUMENT_STAGES:
        if gone:
            stages.append(StageRecord(stage, hint, "not reached"))
            continue
        try:
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
        except PermissionError as exc:  # the raw layer may be closed to an auditor: answer from what is readable
            stages.append(StageRecord(stage, hint, UNREADABLE))
            notes.append(_unreadable(stage, exc))
            continue
        if record is None:
            record = StageRecord(stage, hint, "absent", catalog.manifest(stage, hint).data_version if hint else None)
            gone = hint is not None  # seen before and now gone: left without a trace (should not happen)
        else:
            gone = record.status in ("removed", "quarantined")
        stages.append(record)

    shards = []
    exposures: dict[str, Any] = {}  # checkpoint -> this document's copies its run read (None: not recorded)
    current = {c.data_version for c in catalog.versions(CHECKPOINT)}
    held = {m.data_version for m in catalog.versions(SHARDS)}
    read: set[str] = set()  # the shard sets whose member lists were read
    for m in trained_shard_sets(catalog):
        if shard_versions is not None and m.data_version not in shard_versions:
            continue
        # The verdict is about the store's current checkpoints (or the one asked about, a replaced one too).
        every = [c.data_version for c in checkpoints_using(catalog, m.data_version)]
        checkpoints = [c for c in every if (c == only if only else c in current)]
        earlier = [] if only else [c for c in every if c not in current]
        replaced = m.data_version not in held  # read from the history: a checkpoint was trained on it
        paths = member_lists(catalog.store, m)
        if paths is None:
            notes.append(f"token_shards {m.data_version} has no member list (written before member lists existed); "
                         f"re-materialize token_shards to answer from the shards" if not replaced else
                         f"token_shards {m.data_version}, replaced in the store since, kept no member list (replaced "
                         f"before the store's history kept member lists): checkpoint {', '.join(every)} cannot be "
                         f"answered for")
            continue
        read.add(m.data_version)
        replays = {c: _replay_of(catalog, c) for c in checkpoints}
        replays = {c: r for c, r in replays.items() if r is not None and r[0] == m.data_version}
        for path in paths:
            for r in pq.read_table(path, filters=[("doc_id", "=", doc_id)]).to_pylist():
                # A checkpoint that replayed this set and left the document out for a removal request did not
                # train on it from here. One that left it out as one of its own validation documents still counts
                # as replaying it: it continues from the base checkpoint, which trained on it (said in a note).
                skipped = {c: removed[doc_id] for c, (_, removed, main, _) in replays.items()
                           if not main and removed is not None and doc_id in removed}
                held_out = sorted(c for c, (_, _, main, hold) in replays.items() if not main and c not in skipped
                                  and r["split"] == "train" and hold is not None and hold.test(doc_id))
                record = ShardRecord(m.data_version, r["split"], r["copies"], r["tokens"],
                                     [c for c in checkpoints if c not in skipped], r.get("removed_by"),
                                     [c for c, (_, _, main, _) in replays.items() if not main and c not in skipped],
                                     sorted(skipped), next(iter(skipped.values()), None), held_out)
                if r["split"] == "train" and r["copies"] > 0:
                    _add_reads(catalog, record, doc_id, exposures)
                    # not the checkpoints the verdict is about, but models that may still be in use
                    notes += [_earlier_note(catalog, m.data_version, r, c, doc_id, exposures) for c in earlier]
                hint = hint or r["source"]
                if not replaced or checkpoints:  # a replaced set only replaced checkpoints read: noted, not judged
                    shards.append(record)
    shards_gone = shard_versions is not None and not read & set(shard_versions)
    if shards_gone:
        notes.append(f"the checkpoint was trained on token_shards {', '.join(sorted(shard_versions))}, whose member "
                     f"list the store no longer holds")

    kept = [r for r in stages if r.status == "kept"]
    removed = next((r for r in stages if r.status in ("removed", "quarantined")), None)
    # The set the next run trains on: the newest refresh's, which holds every refresh. Built from the stage version
    # that removed the document, it has no row for it.
    training_set = _training_set(catalog)
    newest = training_set.data_version if training_set else None
    rebuilt = removed is not None and training_set is not None and \
        training_set.inputs.get(node_key(removed.stage, removed.source)) == removed.data_version
    # A shard set that left it out by a removal request (`kiln forget`, applied to every refresh) outranks older
    # sets that still hold it, unless a checkpoint in the store was trained on those: (that set, the request).
    requested = next(((s.shard_set, s.removed_by) for s in shards if s.removed_by), None)
    if requested is None and rebuilt and removed.step == "removal_request":  # the quality filter took it out first
        requested = newest, removed.reason
    # A set whose every checkpoint replayed it without the document: skipped by a removal request.
    unreplayed = [s for s in shards if s.removed_from_replay and not s.checkpoints]
    # A set no checkpoint in the store trained on is the training set only while nothing took the document out of
    # it, and only the newest refresh's: an older refresh's is superseded.
    stale = [s for s in shards if s.copies > 0 and not s.checkpoints and s not in unreplayed
             and (requested or s.shard_set != newest)]
    shards_left = [s for s in shards if s not in stale and s not in unreplayed and not s.removed_by]
    train = [s for s in shards_left if s.split == "train"]
    where = f"token_shards {', '.join(s.shard_set for s in shards_left)}"
    if stale and (requested or removed is not None):
        notes.append(f"token_shards {', '.join(s.shard_set for s in stale)} (no checkpoint in the store trained on "
                     f"it) still hold{'s' if len(stale) == 1 else ''} it: re-materialize token_shards")
    skipped = "; ".join(f"skipped by {s.removed_from_replay_by} when checkpoint {', '.join(s.removed_from_replay)} "
                        f"replayed token_shards {s.shard_set}" for s in shards if s.removed_from_replay)
    for s in shards:
        if s.held_out_of_replay:
            notes.append(f"checkpoint {', '.join(s.held_out_of_replay)} left it out of its replay of token_shards "
                         f"{s.shard_set}, as one of its run's own validation documents; counted as replayed all the "
                         f"same, since that checkpoint continues from the base checkpoint, which trained on it")
    held = [s for s in train if s.copies > 0]
    # A request recorded since that no shard set has applied yet: the auditor checking a takedown must see it
    pending = None if requested is not None or not held else \
        first_match(load_requests(catalog.store)[0], doc_id, (hint or "").partition("/")[0], row.get("url"))
    if pending is not None:
        notes.append(f"removal request {pending.request_id} ({pending.kind}), recorded {pending.created_at[:10]}, "
                     f"names it: the next token_shards leave it out, and training_run refuses these until then")
    unread = [f"checkpoint {c} did not reach it in token_shards {s.shard_set}" + _share(s, c)
              for s in held for c in s.not_reached_by]
    # Trained on: a checkpoint read it, or it waits in shards no checkpoint has trained on yet (the training set).
    if any(s.reached_by or not s.checkpoints for s in held):
        s = next((s for s in held if s.reached_by), None) or next(s for s in held if not s.checkpoints)
        verdict = IN_TRAINING
        direct = [c + s.times(c) for c in s.reached_by if c not in s.replayed_by]
        again = [c + s.times(c) for c in s.reached_by if c in s.replayed_by]
        used = ([f"used by checkpoint {', '.join(direct)}"] if direct else []) + \
            ([f"replayed by checkpoint {', '.join(again)}"] if again else [])
        summary = (f"IN TRAINING: {s.copies} cop{'y' if s.copies == 1 else 'ies'} in the train split of token_shards "
                   f"{s.shard_set}" + (f", {' and '.join(used)}" if used else ""))
        for r in held:
            replays = [c + r.times(c) for c in r.reached_by if c in r.replayed_by]
            if r is not s and replays:
                summary += f"; also replayed by checkpoint {', '.join(replays)} from token_shards {r.shard_set}"
        notes += unread
        if skipped:
            notes.append(f"the document was {skipped}")
        if requested is not None:
            notes.append(f"token_shards {requested[0]} has since left it out ({requested[1]}); a checkpoint trained "
                         f"on {s.shard_set} still holds what it learned from it")
        elif removed is not None:
            notes.append(f"{removed.stage} has since removed it ({removed.reason}); " +
                         (f"token_shards {newest}, built since, left it out" if rebuilt else
                          "the token shards predate that: re-materialize token_shards"))
    elif held:
        verdict = NOT_REACHED
        s = held[0]
        summary = (f"NOT TRAINED ON: in the shards but not reached: {s.copies} cop{'y' if s.copies == 1 else 'ies'} in "
                   f"the train split of token_shards {s.shard_set}, but " + "; ".join(unread))
        if skipped:
            notes.append(f"the document was {skipped}")
        if requested is not None:
            notes.append(f"token_shards {requested[0]} has since left it out ({requested[1]})")
    elif requested is not None or unreplayed:
        verdict = REMOVED
        summary = "NOT TRAINED ON: " + "; ".join(
            ([f"left out of token_shards {requested[0]} by {requested[1]}"] if requested else [])
            + ([skipped] if skipped else []))
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
            copy = _trace(catalog, config, removed.duplicate_of, query, "doc_id", shard_versions, only, depth + 1)
            kept_copy = {"doc_id": copy.doc_id or removed.duplicate_of, "verdict": copy.verdict,
                         "reached_training": copy.reached_training, "summary": copy.summary,
                         "checkpoints": sorted({c for s in copy.shards if s.copies > 0 and s.split == "train"
                                                for c in s.reached_by})}
            summary += f"; its kept copy {kept_copy['doc_id']}: {copy.summary}"
    elif shards_gone:
        verdict = UNKNOWN
        summary = "UNKNOWN: the store no longer holds the member list of the checkpoint's token shards"
    elif kept:
        verdict = NOT_IN_SHARDS
        summary = (f"NOT TRAINED ON: kept through {kept[-1].stage} but in no token-shard member list (shards not "
                   f"materialized, or built before this document arrived)")
    elif any(r.status == UNREADABLE for r in stages):
        verdict = UNKNOWN
        summary = (f"UNKNOWN: no dataset this user can read holds doc_id {doc_id}; "
                   f"{', '.join(r.stage for r in stages if r.status == UNREADABLE)} may")
    else:
        verdict, summary = NEVER_SEEN, f"never seen: no dataset in the store holds doc_id {doc_id}"
    source, _, refresh = (hint or "").partition("/")
    return Membership(query, match if (kept or removed or shards) else "none", verdict, summary,
                      doc_id if (kept or removed or shards) else None, source or None, row.get("license"), None, stages,
                      shards, notes=notes, refresh=refresh or None, kept_copy=kept_copy)


def _training_set(catalog: Catalog) -> Manifest | None:
    """The token shards a training run reads (the newest refresh's: `latest`), or None before any."""
    try:
        return latest(catalog.store, SHARDS, manifest_of=catalog.manifest)[1]
    except IncompleteDataset:
        return None


def _find_in_stage(catalog: Catalog, stage: str, partition: str, doc_id: str) -> tuple[StageRecord | None, dict]:
    """Where the stage's dataset has the document: kept, removed or quarantined. Only a few columns of its files are
    read (`Catalog.find_row`: with S3 storage, from S3, never the texts)."""
    m = catalog.manifest(stage, partition)
    if (row := catalog.find_row(stage, partition, "documents", doc_id, ("doc_id", "source", "license"))) is not None:
        return StageRecord(stage, partition, "kept", m.data_version), row
    r = catalog.find_row(stage, partition, "rejected", doc_id, ("doc_id", "source", "license", "stage", "reason",
                                                                "duplicate_of", "jaccard", "cluster_id"))
    if r is not None:
        return StageRecord(stage, partition, "removed", m.data_version, r.get("stage"), r.get("reason"),
                           r.get("duplicate_of"), r.get("jaccard"), r.get("cluster_id")), r
    with catalog.opened(stage, partition, [f.path for f in m.files_with_role("quarantine")]) as files:
        for f in files:
            for r in pq.read_table(f, columns=["source", "locator", "reason"]).to_pylist():
                if make_doc_id(r["source"], r["locator"]) == doc_id:
                    return StageRecord(stage, partition, "quarantined", m.data_version, "read", r["reason"]), r
    return None, {}


def _unreadable(stage: str, exc: PermissionError) -> str:
    return f"{stage} is not readable by this user ({exc.filename}); ask its owner for access"


def _curation_of(catalog: Catalog, config: ProjectConfig, partition: str | None = None) -> tuple[Any, ExactDedup]:
    """The `normalize` step and exact-dedup folding a partition's documents were curated with (its filtered_documents
    manifest; partition None: the first one recorded), else the config's. The normalizer is None where the recorded
    steps had no `normalize`."""
    from kiln.curation.filters.registry import build_step

    recorded: dict[str, Any] = {}
    for p in catalog.partitions(FILTERED) if partition is None else [partition]:
        if (manifest := catalog.manifest(FILTERED, p)) is not None and manifest.config.get("exact_dedup"):
            recorded = manifest.config
            break
    if recorded.get("steps") is not None:
        params = next((s.get("params") or {} for s in recorded["steps"] if s.get("step") == "normalize"), None)
    else:
        params = config.curation.normalize
    exact = ExactDedup.model_validate(recorded["exact_dedup"]) if recorded else config.curation.exact_dedup
    return (build_step("normalize", params) if params is not None else None), exact


def _curated_hash(text: str, normalizer: Any, exact: ExactDedup) -> str:
    """A text's hash as exact dedup stored it for a document curated so: normalized by the `normalize` step first
    (NFC, soft hyphens and zero-width characters out, mojibake fixed), then folded as exact dedup folds."""
    return content_hash(normalizer.normalized(text) if normalizer is not None else text, exact.lowercase,
                        exact.collapse_whitespace)


def _exact_matches(catalog: Catalog, config: ProjectConfig, text: str) -> tuple[list[str], list[str]]:
    """doc_ids whose text is this text after curation's normalization and exact dedup's: the filtered documents'
    stored content hashes (text as curated, PII placeholders included) and the hashes of the texts as they came in
    (text as read: also finds documents the filters removed, and a copy in another source whose curated text a
    filter rewrote, which a takedown built from this answer must reach too); with a note where the raw texts were
    not readable. Each partition is compared as it was curated (its manifest's settings).

    Both are searched through the hashes the filter stage kept of every document it read (`intake_hashes`: a
    doc_id and a 32-hex-digit hash a row, bucketed by hash, so one file a partition is opened: see
    kiln.curation.intake_hashes; with S3 storage, one row group of it is read from S3, not the dataset fetched); a
    partition filtered before they were bucketed has the curated texts' hashes in its documents only. A raw partition no such hashes cover (filtered before they were kept, or raw documents
    materialized again since) is read and hashed text by text (`_scan_raw`)."""
    def searched(p: str) -> tuple[list[str], bool, str | None]:
        """A filtered partition's matches, whether it has intake hashes, and the raw data version they cover."""
        filtered, found = catalog.manifest(FILTERED, p), []
        wanted = _curated_hash(text, *_curation_of(catalog, config, p))
        hashes = [f.path for f in filtered.files_with_role(INTAKE_ROLE)]  # none: filtered before they were kept
        if bucket_count([Path(path).name for path in hashes]) is None:  # not bucketed: no rewritten texts' hashes
            with catalog.opened(FILTERED, p, [f.path for f in filtered.files_with_role("documents")]) as documents:
                found += search([f for f in documents if "content_hash" in pq.read_schema(f).names], wanted)
        if not hashes:
            return found, False, None
        with catalog.opened(FILTERED, p, to_search(hashes, wanted)) as files:
            return found + search(files, wanted), True, filtered.inputs.get(f"{RAW}/{p}")

    found: list[str] = []
    covered: dict[str, str] = {}  # raw partition -> the raw data version its filtered documents' intake hashes cover
    partitions = catalog.partitions(FILTERED)
    # several partitions at once: on S3 each is a few GETs' latency (a manifest, a footer, a row group)
    for p, (matches, hashed, raw_version) in zip(partitions, in_order(searched, partitions)):
        found += matches
        if hashed:
            covered[p] = raw_version
    try:
        for p in catalog.partitions(RAW):
            if covered.get(p) != catalog.manifest(RAW, p).data_version:
                found += _scan_raw(catalog, config, p, text)
    except PermissionError as exc:
        searched = ("the texts filters removed were searched by the hashes filtered_documents keeps" if covered else
                    "the texts filters removed were not searched")
        return sorted(set(found)), [_unreadable(RAW, exc) + f": {searched}"]
    return sorted(set(found)), []


def _scan_raw(catalog: Catalog, config: ProjectConfig, partition: str, text: str) -> list[str]:
    """doc_ids of a raw partition whose text hashes as `text` does, each text normalized and hashed here: about a
    millisecond a document of 9,000 characters (bench/membership_bench.py), the slow path `intake_hashes` replaces."""
    curation = _curation_of(catalog, config, partition)
    wanted = _curated_hash(text, *curation)
    found = []
    for batch in catalog.store.iter_batches(RAW, partition, columns=["doc_id", "text"]):
        for d, t in zip(batch.column("doc_id").to_pylist(), batch.column("text").to_pylist()):
            if _curated_hash(t, *curation) == wanted:
                found.append(d)
    return found


def _near_match(catalog: Catalog, config: ProjectConfig, text: str) -> tuple[tuple[str, float] | None, list[str]]:
    """The indexed document most similar to `text` at or above the threshold, by exact Jaccard of the shingle sets
    (the band buckets only propose candidates), over every refresh's bucket index in the store, with the MinHash
    settings the index was built with (its signature scheme included: a record without one is affine32)."""
    from kiln.dedup.bucket_index import IndexFiles, near_matches
    from kiln.dedup.minhash import SCHEME, sign_texts
    from kiln.governance.refresh import load_refreshes

    recorded = catalog.newest(INDEX)
    near = NearDedup.model_validate({"scheme": SCHEME, **recorded.config["near"]}) \
        if recorded and "near" in recorded.config else config.dedup.near
    with ExitStack() as opened:
        indexes, unmigrated = [], []
        for r in load_refreshes(catalog.store):
            if (manifest := catalog.manifest(INDEX, r.key)) is None:
                continue
            paths = [f.path for f in manifest.files if f.path.startswith("index/")]
            if "index/_index.json" not in paths:
                unmigrated.append(r.key)
                continue
            # opened, not fetched: with S3 storage the search reads a few of its files from S3, not the whole index
            files = dict(zip(paths, opened.enter_context(catalog.opened(INDEX, r.key, paths))))
            indexes.append(IndexFiles(f"{INDEX}[{r.key}]", lambda relative, files=files: files[f"index/{relative}"]))
        notes = [f"dedup_index of refresh(es) {', '.join(unmigrated)} holds no bucket index (written before "
                 "`kiln dedup migrate-index`): not searched"] if unmigrated else []
        if not indexes:
            return None, notes + ["no near-duplicate index in the store: only exact matches were searched"]
        normalizer = _curation_of(catalog, config)[0]  # the index holds curated texts: the query normalized so
        if normalizer is not None:
            text = normalizer.normalized(text)
        signatures, shingles, _ = sign_texts([text], near, near.scheme)  # as the signature stage made the index's
        try:
            found = near_matches(indexes, shingles, signatures[0], near)
        except ValueError as exc:
            return None, notes + [f"near-duplicate search unavailable: {exc}"]
    if found and found[0][0] >= near.threshold:
        return (found[0][1], round(float(found[0][0]), 6)), notes
    if found:
        notes.append(f"closest indexed document {found[0][1]} has Jaccard {found[0][0]:.3f}, below the "
                     f"near-duplicate threshold {near.threshold}")
    return None, notes


# ----------------------------------------------------------------------------------- checkpoints & shards

def _replay_of(catalog: Catalog, checkpoint: str) -> tuple[str, dict[str, str] | None, bool, HoldOut | None] | None:
    """What a checkpoint's run replayed: (the replayed set's data version, doc_id -> request for the documents it
    left out (None: the run's dataset is gone, so unknown), whether that set is also its main training set, the
    replayed documents it left out as its own validation documents); None for a run without replay."""
    from kiln.governance.refresh import trained_refresh
    from kiln.governance.replay import held_out_of_replay, removed_from_replay, replayed

    run = run_of_checkpoint(catalog, checkpoint)
    info = replayed(run)
    if info is None:
        return None
    refresh = trained_refresh(run)
    main = refresh is not None and run.inputs.get(f"{SHARDS}/{refresh}") == info["data_version"]
    return info["data_version"], removed_from_replay(catalog.store, run), main, held_out_of_replay(run)


def _add_reads(catalog: Catalog, record: ShardRecord, doc_id: str, exposures: dict[str, Any]) -> None:
    """Which of the record's checkpoints read the document, and how often each copy, from what their runs recorded
    (kiln.governance.exposure); a checkpoint whose run recorded nothing for this set counts as having read it."""
    for c in record.checkpoints:
        if c not in exposures:
            run = run_of_checkpoint(catalog, c)
            exposures[c] = (exposure_of(catalog.store, run, doc_id), run)
        found, run = exposures[c]
        if found is None or record.shard_set not in found:
            record.reached_by.append(c)
            continue
        per_copy: dict[tuple[str, int], int] = {}  # a set a run both trains on and replays: both roles' reads
        for row in found[record.shard_set]:
            per_copy[row["shard"], row["index"]] = per_copy.get((row["shard"], row["index"]), 0) + row["reads"]
        reads = sorted(per_copy.values(), reverse=True)
        record.reads[c] = reads + [0] * max(record.copies - len(reads), 0)
        (record.reached_by if reads else record.not_reached_by).append(c)
        roles = [r for r in run.stats["exposure"]["roles"].values() if r["data_version"] == record.shard_set]
        tokens = sum(p["tokens"] for r in roles[:1] for p in r["per_phase"].values())
        if tokens:
            record.read_share[c] = round(sum(r["tokens_read"] for r in roles) / tokens, 4)


def _earlier_note(catalog: Catalog, shard_set: str, row: dict[str, Any], checkpoint: str, doc_id: str,
                  exposures: dict[str, Any]) -> str:
    """What a checkpoint the store has replaced since read of the document, from the member list row of a set it
    was trained on and what its run recorded reading."""
    record = ShardRecord(shard_set, row["split"], row["copies"], row["tokens"], [checkpoint])
    _add_reads(catalog, record, doc_id, exposures)
    copies = f"{row['copies']} cop{'y' if row['copies'] == 1 else 'ies'}"
    reading = (f", and read it{record.times(checkpoint)}" if record.reached_by else
               f", but did not reach it{_share(record, checkpoint)}") if checkpoint in record.reads else ""
    return (f"checkpoint {checkpoint}, replaced in the store since, was trained on token_shards {shard_set}, which "
            f"holds {copies} of it in its train split{reading}")


def _share(record: ShardRecord, checkpoint: str) -> str:
    share = record.read_share.get(checkpoint)
    return f" (its run stopped after reading {share:.1%} of that set's train tokens)" if share is not None else \
        " (its run stopped before it)"


def _checkpoint_shards(catalog: Catalog, checkpoint: str) -> tuple[str, set[str]]:
    """A checkpoint's data version and the token_shards versions it was trained on."""
    ckpt = resolve_target(catalog.store, checkpoint, catalog)
    versions = _shards_of_checkpoint(catalog, ckpt)
    if not versions:
        raise AuditError(f"cannot tell which token shards {node_key(ckpt.asset, ckpt.partition)} {ckpt.data_version} "
                         f"was trained on: its training_run manifest ({ckpt.inputs}) is not in the store")
    return ckpt.data_version, versions


__all__ = ["Membership", "ShardRecord", "StageRecord", "membership"]
