"""Removal requests ("forget"): a publisher or data owner asks for documents to be taken out.

`kiln forget` records a request in the store's `removal_requests` dataset (one JSON file, replaced
atomically through the same DatasetWriter as every asset, so it has a manifest and a data version).
A request names a whole source, a URL regex, or a list of doc ids. Two assets apply every request: the next
materialization of `quality_filtered_documents` drops the partition's matching documents into the rejected
table with `stage: removal_request`, and `token_shards`, which reads every refresh so far (also refreshes
nobody filters again), leaves every matching document out (kiln.tokens.shard_writer), so the next shards hold none.

When the request is recorded, the training documents of every checkpoint the store published (the member list of
the token shards its run read, and of the shards it replayed: the current sets', or the store's history's of sets
replaced since) are checked against it: the affected checkpoints are written into the request, and the current
one's data card says so from then on. A later continued run that replays shards written before the
request skips the documents it names (kiln.governance.replay).
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc

from kiln.common.config import ProjectConfig
from kiln.common.manifest import Manifest, applied_requests, now_utc
from kiln.common.storage import Store
# RAW: a URL is whole there
from kiln.governance.catalog import (CHECKPOINT, RAW, SHARDS, Catalog, known_sources, member_batches, member_lists,
                                    run_of_checkpoint)
from kiln.governance.refresh import materialized, trained_refresh

REQUESTS, REQUESTS_FILE = "removal_requests", "removal_requests.json"
STAGE = "removal_request"
KINDS = ("source", "url_pattern", "doc_ids")


class ForgetError(ValueError):
    """A request that cannot be recorded; the message says why and what to do."""


@dataclass
class RemovalRequest:
    request_id: str
    created_at: str
    kind: str  # source | url_pattern | doc_ids
    value: str | list[str]  # the source name, the URL regex, or the doc ids
    reason: str
    affected: list[dict[str, Any]] = field(default_factory=list)  # checkpoints trained on matching documents
    unknown_ids: int = 0  # doc ids (kind doc_ids) no document of the store had when it was recorded
    matched: int | None = None  # url_pattern: documents intake had read whose URL it matched when it was recorded

    @property
    def reject_reason(self) -> str:
        return f"{STAGE}:{self.request_id}"

    def matches(self, doc_id: str, source: str, url: str | None) -> bool:
        if self.kind == "source":
            return source == self.value
        if self.kind == "url_pattern":
            return url is not None and re.search(self.value, url) is not None
        return doc_id in self._ids

    @cached_property
    def _ids(self) -> frozenset[str]:
        return frozenset(self.value) if self.kind == "doc_ids" else frozenset()

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def load_requests(store: Store) -> tuple[list[RemovalRequest], str | None]:
    """Every recorded request and the dataset's data version (None: none recorded yet)."""
    # One pinned version for both: a `kiln forget` committing meanwhile would give its list with the old version.
    snap = store.snapshot_or_none(REQUESTS)
    if snap is None:
        return [], None
    data = json.loads((snap.folder / REQUESTS_FILE).read_text(encoding="utf-8"))
    return [RemovalRequest(**r) for r in data["requests"]], snap.manifest.data_version


@dataclass(frozen=True)
class IntakeMatched:
    """A url_pattern request with the documents whose URL, as intake read it, the pattern matches. A requester writes
    the pattern against the address they know; after raw_documents every stage stores the URL PII-redacted (an IP
    as <IPV4>, an e-mail as <EMAIL>), which such a pattern misses. raw_documents also still holds the documents a
    filter or an earlier request removed, whose URLs the later stages no longer have (a replay needs them)."""

    request: RemovalRequest
    doc_ids: frozenset[str]

    @property
    def reject_reason(self) -> str:
        return self.request.reject_reason

    def matches(self, doc_id: str, source: str, url: str | None) -> bool:
        return doc_id in self.doc_ids or self.request.matches(doc_id, source, url)


def with_intake_urls(store: Store, requests: list[RemovalRequest], partitions: Iterable[str],
                     unseen: set[str] | None = None) -> list[RemovalRequest | IntakeMatched]:
    """`requests`, each url_pattern one matched against the URLs of raw_documents' `partitions` (IntakeMatched);
    the URLs are read here, in memory, and go nowhere else. `unseen`: doc ids to look for; those read are taken out
    of it, so it ends holding those whose raw record (and URL) the store no longer has."""
    patterns = [(r, re.compile(r.value)) for r in requests if r.kind == "url_pattern"]
    if not patterns:
        return list(requests)
    ids: dict[str, set[str]] = {r.request_id: set() for r, _ in patterns}
    for part in partitions:
        for batch in _raw_batches(store, part):
            for doc_id, url in zip(batch.column("doc_id").to_pylist(), batch.column("url").to_pylist()):
                if unseen is not None:
                    unseen.discard(doc_id)
                if url is None:
                    continue
                for request, pattern in patterns:
                    if pattern.search(url):
                        ids[request.request_id].add(doc_id)
    return [IntakeMatched(r, frozenset(ids[r.request_id])) if r.kind == "url_pattern" else r for r in requests]


def _raw_batches(store: Store, part: str):
    try:
        yield from store.iter_batches(RAW, part, columns=["doc_id", "url"])
    except PermissionError as exc:  # the raw layer is access-controlled; a pattern is never matched half-blind
        raise ForgetError(f"a URL pattern is matched against the URLs as read, in {RAW}, which this user cannot read "
                          f"({exc.filename}); run this as a user allowed to read the raw layer") from None


def raw_partitions(store: Store, sources: Iterable[str], refreshes: list | None = None) -> list[str]:
    """raw_documents' partitions of `sources`, in `refreshes` (default: every registered one)."""
    return list(materialized(store, RAW, sorted(set(sources)), refreshes))


def first_match(requests: list[RemovalRequest | IntakeMatched], doc_id: str, source: str,
                url: str | None) -> RemovalRequest | IntakeMatched | None:
    return next((r for r in requests if r.matches(doc_id, source, url)), None)


# The columns `naming_requests` reads: a reader of documents adds them to its own when there are requests.
REQUEST_COLUMNS = ("doc_id", "source", "url")


def naming_requests(requests: Iterable[RemovalRequest | IntakeMatched],
                    rows: pa.Table | pa.RecordBatch) -> list[RemovalRequest | IntakeMatched | None]:
    """For each row of a table of documents (REQUEST_COLUMNS), the first of `requests` that names it, or None."""
    requests = list(requests)
    if not requests:
        return [None] * rows.num_rows
    return [first_match(requests, *row) for row in zip(*(rows.column(c).to_pylist() for c in REQUEST_COLUMNS))]


def validate(store: Store, config: ProjectConfig, kind: str, value: str | list[str]) -> None:
    if kind == "source":
        names = known_sources(store, config)
        if value not in names:
            raise ForgetError(f"--source {value!r}: no such source; sources: {', '.join(names)}")
    elif kind == "url_pattern":
        try:
            re.compile(value)
        except re.error as exc:
            raise ForgetError(f"--url-pattern {value!r} is not a valid regular expression: {exc}") from None
        if not value:
            raise ForgetError("--url-pattern is empty: it would match every URL")
    elif kind == "doc_ids":
        if not value:
            raise ForgetError("--doc-ids: the file lists no doc ids (one per line)")
    else:
        raise ForgetError(f"unknown request kind {kind!r}; expected one of {', '.join(KINDS)}")


def read_doc_ids(path: Path) -> list[str]:
    try:
        lines = Path(path).read_text(encoding="utf-8-sig").splitlines()  # a BOM (Notepad, Excel) is no id's
    except FileNotFoundError:
        raise ForgetError(f"--doc-ids: no such file {str(path)!r}") from None
    except (IsADirectoryError, UnicodeDecodeError):
        raise ForgetError(f"--doc-ids: {str(path)!r} is not a UTF-8 text file of doc ids, one per line") from None
    except OSError as exc:  # no permission to read it, an I/O error
        raise ForgetError(f"--doc-ids: cannot read {str(path)!r} ({exc.strerror or exc})") from None
    return sorted({line.strip() for line in lines if line.strip() and not line.startswith("#")})


def affected_checkpoints(store: Store, request: RemovalRequest, only: str | None = None) -> list[dict[str, Any]]:
    """Each checkpoint the store published (`only`: that one, by data version), newest first (the current one, and
    those a later one replaced: `current` says which), whose token shards (or replayed shards, less what its run
    already left out of the replay) hold documents the request matches, where the store still holds those shards'
    member list as its run read them (the current set's, or the history's of a set replaced since): the documents and
    tokens the shards hold, and `read`, what its run read of them (a run may stop before it reaches a document; None:
    not recorded)."""
    from kiln.governance.exposure import read_of
    from kiln.governance.replay import removed_from_replay, replayed

    catalog = Catalog(store)
    current = getattr(catalog.current_manifest(CHECKPOINT), "data_version", None)
    out = []
    for checkpoint in catalog.published(CHECKPOINT):
        if only is not None and checkpoint.data_version != only:
            continue
        run = run_of_checkpoint(catalog, checkpoint.data_version)
        refresh = trained_refresh(run) if run is not None else None
        # The shards as the run read them: the current set, or the history's member list of a set replaced since.
        shards = catalog.manifest_at(SHARDS, refresh, run.inputs[f"{SHARDS}/{refresh}"]) if refresh else None
        trained = _matching(store, shards, request)
        if trained is None:
            continue  # the store no longer holds the member list of the shards this checkpoint was trained on
        replay, replay_info = [], replayed(run)
        if replay_info and replay_info.get("input") and replay_info["input"] != f"{SHARDS}/{refresh}":
            replay_refresh = replay_info["input"].split("/", 1)[1]
            held = catalog.manifest_at(SHARDS, replay_refresh, replay_info["data_version"])
            skipped = removed_from_replay(store, run) or {}
            # none when the store no longer holds the replayed set's member list
            replay = [m for m in _matching(store, held, request) or [] if m["doc_id"] not in skipped]
        if not trained and not replay:
            continue
        # what its run read of them (None: it recorded no exposure), where the shards hold what it could have read
        read = read_of(store, run, {m["doc_id"] for m in trained + replay})
        out.append({"checkpoint": checkpoint.data_version, "current": checkpoint.data_version == current,
                    "read": read,
                    "token_shards": shards.data_version, "refresh": refresh,
                    "documents": len({m["doc_id"] for m in trained + replay}),
                    "tokens": sum(m["tokens"] * m["copies"] for m in trained),
                    "sources": sorted({m["source"] for m in trained + replay}),
                    **({"replay": {"token_shards": replay_info["data_version"], "refresh": replay_refresh,
                                   "documents": len(replay), "tokens": sum(m["tokens"] * m["copies"] for m in replay)}}
                       if replay else {})})
    return out


def unapplied_requests(store: Store, shards: Manifest) -> list[RemovalRequest]:
    """The requests recorded since a refresh's token shards were written (not among those they applied) that name
    any of their training or validation documents: a run on these shards would read what was asked to be removed."""
    applied = applied_requests(shards)
    # validation documents too: a run reads them (validation loss, its loss probe, the evaluation)
    return [r for r in load_requests(store)[0]
            if r.request_id not in applied and _matching(store, shards, r, splits=("train", "val"))]


def _matching(store: Store, shards: Manifest | None, request: RemovalRequest,
              splits: tuple[str, ...] = ("train",)) -> list[dict[str, Any]] | None:
    """The member rows of a token-shard set (the current one, or one replaced since, by the store's history) the
    request matches, in `splits` (the documents a checkpoint was trained on: its train split); None when the store
    holds no member list of it."""
    if (paths := member_lists(store, shards)) is None:
        return None
    matcher = request
    if request.kind == "url_pattern":  # matched against the URLs intake read of the sources the set holds
        sources = {s for batch in member_batches(paths, splits, ["source"])
                   for s in pc.unique(batch.column("source")).to_pylist()}
        [matcher] = with_intake_urls(store, [request], raw_partitions(store, sources))
    return [m for batch in member_batches(paths, splits, ["doc_id", "source", "split", "copies", "tokens"])
            for m in batch.to_pylist() if matcher.matches(m["doc_id"], m["source"], None)]


def unknown_doc_ids(store: Store, config: ProjectConfig, doc_ids: list[str]) -> list[str] | None:
    """The ids no document intake read has (raw_documents of every source a request may name, every refresh), in the
    given order; None when the raw layer is not readable by this user (then they cannot be checked)."""
    missing = set(doc_ids)
    try:
        for part in raw_partitions(store, known_sources(store, config)):
            for batch in store.iter_batches(RAW, part, columns=["doc_id"]):
                missing.difference_update(batch.column("doc_id").to_pylist())
                if not missing:
                    return []
    except PermissionError:
        return None
    return [d for d in doc_ids if d in missing]


def matched_by_url(store: Store, config: ProjectConfig, request: RemovalRequest) -> int | None:
    """How many documents intake read (every source a request may name, every refresh) a url_pattern request matches
    by their URL as read; None when the raw layer is not readable by this user (then they cannot be counted)."""
    try:
        [intake] = with_intake_urls(store, [request], raw_partitions(store, known_sources(store, config)))
    except ForgetError:
        return None
    return len(intake.doc_ids)


def record_request(store: Store, config: ProjectConfig, kind: str, value: str | list[str],
                   reason: str = "") -> RemovalRequest:
    """Validate, check the current checkpoint, and append the request (the whole list is rewritten atomically). Doc
    ids of which none names a document are refused: a request that can never remove anything reads as done."""
    validate(store, config, kind, value)
    unknown = unknown_doc_ids(store, config, value) if kind == "doc_ids" else None
    if unknown and len(unknown) == len(value):
        raise ForgetError(f"--doc-ids: none of the {len(value)} id(s) names a document of this store (e.g. "
                          f"{', '.join(map(repr, unknown[:3]))}); doc ids are Kiln's, not a source's own: find a "
                          f"document's with `kiln audit membership --text FILE`; nothing recorded")
    request = RemovalRequest(request_id=uuid.uuid4().hex[:12], created_at=now_utc(), kind=kind, value=value,
                             reason=reason, unknown_ids=len(unknown or []))
    request.affected = affected_checkpoints(store, request)
    if kind == "url_pattern":  # a pattern naming nothing (a typo) is recorded, as it may be ahead of the data: counted
        request.matched = matched_by_url(store, config, request)
    with store.registry_lock(REQUESTS):  # read, append, rewrite: one writer at a time, or a concurrent request is lost
        requests, _ = load_requests(store)
        requests.append(request)
        with store.staging(REQUESTS) as writer:
            (writer.dir / REQUESTS_FILE).write_text(json.dumps({"requests": [r.to_dict() for r in requests]},
                                                               indent=2, ensure_ascii=False), encoding="utf-8")
            writer.commit(code_version="kiln.forget", config={}, inputs={}, counts={"requests": len(requests)})
    return request
