"""What the data card reads from the documents themselves: each document's licence and identified language.

No manifest holds these per document, so the card reads two small columns (`license`, `meta`) of the documents the
token shards were built from (the last document stage), part by part, never the text; and the shards' member list,
for which of them are in the training split and with how many tokens (copies x tokens, as the shards hold them).

Both are read a part at a time, never a table of every document: the member list holds one row per input document
in the order the shard writer read them (source by source, each source's parts in refresh order), so a part's
member rows are a run of it, found from the row counts and read forward in part-sized batches (`MemberList`). A
part whose doc ids do not match its run (its stage was re-materialized after the shards) is looked up by doc id,
streaming the list.

A document's licence and language follow kiln.governance.document_facts: the licence from
`meta.<card.license_fields[source]>` for a source listed there, else the `license` column; `unknown` ones counted
and listed by doc id and locator (no text); documents of a part whose filter profile has no `language` step are
"not identified".

A source whose documents the store has materialized again since the checkpoint's shards read them is counted from
the member list instead, where the shard writer recorded each document's licence (by the licence field of that
time, which the card names), `meta.language` and, for an unknown licence, its locator: each part's rows found by the
row counts of the versions the shards read. A document a removal request took out of the shards has nothing recorded
but its id: counted as `removed by request`. A member list from before these records: the source is `replaced`.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.config import ProjectConfig
from kiln.common.manifest import Manifest
from kiln.common.storage import parquet_batches
from kiln.governance.catalog import FILTERED, NOT_MATERIALIZED, SHARDS, Catalog, member_lists
from kiln.governance.document_facts import UNKNOWN, document_facts, license_from
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.tokens.shard_format import TRAIN

NOT_IDENTIFIED = "not identified"
REMOVED_BY_REQUEST = "removed by request"
MEMBER_LIST = "member list"  # counted from what the shard writer recorded: the documents are materialized again since
MAX_LISTED = 1000  # unknown-licence documents kept in the JSON per source (all are counted)
LANGUAGE_STEP = "language"

MEMBER_COLUMNS = ["doc_id", "source", "split", "copies", "tokens"]
RECORDED_COLUMNS = ["removed_by", "license", "language", "locator"]  # member lists from before them lack the last 3


class MemberList:
    """The shards' member list, read forward `batch` rows at a time: `rows(start, stop)` holds that run and at most a
    batch more (a smaller start than the last one read starts over). `recorded`: its files hold each document's
    licence and language (RECORDED_COLUMNS), read along."""

    def __init__(self, paths: list[Path], batch: int):
        self.paths, self.batch = list(paths), max(1, batch)
        self.recorded = all(set(RECORDED_COLUMNS) <= set(pq.read_schema(p).names) for p in self.paths)
        self.columns = MEMBER_COLUMNS + (RECORDED_COLUMNS if self.recorded else [])
        self._restart()

    def _restart(self) -> None:
        self._batches = (b for p in self.paths
                         for b in parquet_batches(p, self.batch, self.columns))
        self._held: list[pa.RecordBatch] = []
        self._start = self._end = 0  # rows [_start, _end) of the list are held

    def rows(self, start: int, stop: int) -> pa.Table:
        if start < self._start:
            self._restart()
        while self._held and self._start + len(self._held[0]) <= start:
            self._start += len(self._held.pop(0))
        if not self._held:
            self._start = self._end
        while self._end < stop and (b := next(self._batches, None)) is not None:
            self._end += len(b)
            if self._end <= start:  # wholly before the run: not kept
                self._start = self._end
            else:
                self._held.append(b)
        if not self._held:
            return pa.table({c: [] for c in self.columns})
        return pa.Table.from_batches(self._held).slice(start - self._start, stop - start)

    def source_runs(self) -> dict[str, tuple[int, int] | None]:
        """source -> (first row, rows) of its run in the list; None for a source whose rows are not one run."""
        runs: dict[str, tuple[int, int] | None] = {}
        last, pos = None, 0
        for p in self.paths:
            for batch in parquet_batches(p, self.batch, ["source"]):
                encoded = pc.dictionary_encode(batch.column(0))
                codes, names = encoded.indices.to_numpy(zero_copy_only=False), encoded.dictionary.to_pylist()
                cuts = np.flatnonzero(np.diff(codes)) + 1
                for s, e in zip(np.r_[0, cuts], np.r_[cuts, len(codes)]) if len(codes) else ():
                    name, n = names[codes[s]], int(e - s)
                    if name == last:
                        run = runs[name]
                        runs[name] = (run[0], run[1] + n) if run is not None else None
                    else:  # a source seen before, elsewhere: not one run
                        runs[name] = None if name in runs else (pos + int(s), n)
                        last = name
                pos += len(codes)
        return runs

    def train_of(self, doc_ids: set[str]) -> dict[str, tuple[int, int]]:
        """`train_in` of the rows of `doc_ids`, streaming the whole list (for a part that is not where it was)."""
        found: dict[str, tuple[int, int]] = {}
        wanted = pa.array(sorted(doc_ids), pa.string())
        for p in self.paths:
            for batch in parquet_batches(p, self.batch, MEMBER_COLUMNS):
                found |= train_in(pa.Table.from_batches([batch]).filter(pc.is_in(batch.column("doc_id"), wanted)))
        return found


def train_in(members: pa.Table) -> dict[str, tuple[int, int]]:
    """doc_id -> `_trained` of member rows in the training split."""
    train = members.filter(pc.equal(members.column("split"), "train"))
    return {d: _trained(TRAIN, c, t) for d, c, t in zip(train["doc_id"].to_pylist(), train["copies"].to_pylist(),
                                                        train["tokens"].to_pylist())}


# Per document: doc_id, licence, `meta.language` (None: none), locator (for an unknown licence), member
Facts = Iterator[tuple[str, str, str | None, str | None, tuple[int, int] | None]]


def _facts_of_documents(part: pa.Table, field: str | None, train: dict[str, tuple[int, int]]) -> Facts:
    for doc_id, license_, meta in zip(part.column("doc_id").to_pylist(), part.column("license").to_pylist(),
                                      part.column("meta").to_pylist()):
        yield doc_id, *document_facts(license_, meta, field), train.get(doc_id)


def _trained(split: str, copies: int, tokens: int) -> tuple[int, int] | None:
    """(tokens in the training split, copies there; copies x tokens) of one member row, None outside that split."""
    return (copies * tokens, copies) if split == TRAIN else None


def _facts_recorded(rows: pa.Table) -> Facts:
    for r in rows.to_pylist():
        if r["removed_by"] is not None:  # nothing of it is kept but its id
            yield r["doc_id"], REMOVED_BY_REQUEST, REMOVED_BY_REQUEST, None, None
        else:
            yield r["doc_id"], r["license"], r["language"], r["locator"], _trained(r["split"], r["copies"], r["tokens"])


class _PartMembers:
    """Each document part's member rows, a part at a time: its run of its source's rows in the list, checked by doc
    id, else looked up."""

    def __init__(self, catalog: Catalog, shards: Manifest | None, batch: int):
        paths = member_lists(catalog.store, shards)  # a set replaced since: the store's history's
        self.members = MemberList(paths, batch) if paths else None
        self.runs = self.members.source_runs() if self.members else {}

    def of(self, source: str, offset: int, doc_ids: pa.ChunkedArray) -> dict[str, tuple[int, int]]:
        """The part of `source` whose first document is its `offset`-th in the shard writer's order."""
        if self.members is None:
            return {}
        run = self.runs.get(source)
        if run is not None and offset + len(doc_ids) <= run[1]:
            rows = self.members.rows(run[0] + offset, run[0] + offset + len(doc_ids))
            if rows.column("doc_id").equals(doc_ids):
                return train_in(rows)
        return self.members.train_of(set(doc_ids.to_pylist()))

    def recorded(self, source: str, manifests: dict[str, Manifest]) -> Iterator[tuple[str, Facts]] | None:
        """Each part's member rows, with the licence and language the shard writer recorded, found by the row counts
        of the versions the shards read (`manifests`, in the writer's order); None when the list records none, or the
        counts do not add up to the source's run in it."""
        run = self.runs.get(source)
        sizes = {p: [f.rows for f in m.files_with_role("documents")] for p, m in manifests.items()}
        if self.members is None or not self.members.recorded or run is None or \
                any(n is None for ns in sizes.values() for n in ns) or sum(map(sum, sizes.values())) != run[1]:
            return None

        def parts() -> Iterator[tuple[str, Facts]]:
            start = run[0]
            for p, ns in sizes.items():
                yield p, _facts_recorded(self.members.rows(start, start + sum(ns)))
                start += sum(ns)
        return parts()


def _language_settings(manifest: Manifest) -> dict[str, Any] | None:
    """The `language` step's parameters in a filtered_documents partition's profile, or None when it has none."""
    for step in manifest.config.get("steps") or []:
        if step.get("step") == LANGUAGE_STEP:
            return step.get("params") or {}
    return None


def _count(table: dict[str, dict[str, int]], key: str, member: tuple[int, int] | None) -> None:
    row = table.setdefault(key, {"documents": 0, "in_train_shards": 0, "train_tokens": 0})
    row["documents"] += 1
    if member and member[1] > 0:
        row["in_train_shards"] += 1
        row["train_tokens"] += member[0]


def _ordered(table: dict[str, dict[str, int]]) -> dict[str, dict[str, int]]:
    """Most documents first; ties by name, so the card is the same on every run."""
    return dict(sorted(table.items(), key=lambda kv: (-kv[1]["documents"], kv[0])))


REPLACED = "replaced since the checkpoint's training: the version trained on is no longer read"

def _documents_read(catalog: Catalog, stage: str, source: str, manifests: dict[str, Manifest], field: str | None,
                    members: _PartMembers) -> Iterator[tuple[str, Facts]]:
    """Each part's documents as the stage holds them, with their member rows."""
    offset = 0  # documents of this source before the part, in the order the shard writer read them
    for p, manifest in manifests.items():
        # with S3 storage, the three columns from S3 (ranged reads): the texts stay there
        with catalog.opened(stage, p, [f.path for f in manifest.files_with_role("documents")]) as files:
            for f in files:
                part = pq.read_table(f, columns=["doc_id", "license", "meta"])
                train = members.of(source, offset, part.column("doc_id"))
                offset += part.num_rows
                yield p, _facts_of_documents(part, field, train)


def licenses_and_languages(catalog: Catalog, config: ProjectConfig, parts: dict[str, list[str]],
                           shards: Manifest | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(licences, languages) per source over `parts` (each source's partitions in the checkpoint's shards)."""
    stage = DOCUMENT_STAGES[-1]
    found = {name: {p: m for p in ps if (m := catalog.manifest(stage, p)) is not None} for name, ps in parts.items()}
    # The member list is read in batches of the biggest part (manifests from before row counts: a fixed size).
    biggest = max((f.rows or 0 for ms in found.values() for m in ms.values() for f in m.files_with_role("documents")),
                  default=0) or 65_536
    members = _PartMembers(catalog, shards, biggest)
    # A set replaced since keeps its member list in the store's history (one replaced before that: no answer), and
    # the documents it read are still read where their partitions are the versions it read (older refreshes' are).
    unanswerable = shards is not None and members.members is None and catalog.replaced(SHARDS, shards.partition)
    licenses: dict[str, Any] = {}
    languages: dict[str, Any] = {}
    for name in parts:
        if not found[name]:
            licenses[name] = languages[name] = NOT_MATERIALIZED
            continue
        field = config.card.license_fields.get(name)
        recorded = None
        if unanswerable or any(catalog.replaced(stage, p) for p in found[name]):
            # The documents trained on are not in the store now: counted as the member list recorded them, or not at
            # all (never from another version's).
            recorded = members.recorded(name, found[name])
            if recorded is None:
                licenses[name] = languages[name] = REPLACED
                continue
            field = ((shards.stats.get("sources") or {}).get(name) or {}).get("license_field")
        filtered = {p: f for p in found[name] if (f := catalog.manifest(FILTERED, p)) is not None}
        identified = {p: s for p, f in filtered.items() if (s := _language_settings(f)) is not None}
        by_license: dict[str, dict[str, int]] = {}
        by_language: dict[str, dict[str, int]] = {}
        unknown: list[dict[str, Any]] = []
        for p, facts in recorded or _documents_read(catalog, stage, name, found[name], field, members):
            for doc_id, lic, language, locator, member in facts:
                _count(by_license, lic, member)
                if lic == UNKNOWN and len(unknown) < MAX_LISTED:
                    unknown.append({"doc_id": doc_id, "locator": locator,
                                    "in_train_shards": bool(member and member[1] > 0)})
                if language != REMOVED_BY_REQUEST:
                    language = language if p in identified else None
                _count(by_language, language or NOT_IDENTIFIED, member)
        counted_from = "documents" if recorded is None else MEMBER_LIST
        licenses[name] = {"field": field if recorded is not None else license_from(field),
                          "counted_from": counted_from, "licenses": _ordered(by_license),
                          "unknown": by_license.get(UNKNOWN, {}).get("documents", 0), "unknown_listed": unknown}
        profile = next((f.config.get("profile") for f in filtered.values()), None)
        languages[name] = {"identified": bool(identified), "parts_identified": len(identified), "parts": len(found[name]),
                           "settings": next(iter(identified.values()), None), "profile": profile,
                           "counted_from": counted_from, "languages": _ordered(by_language)}
    return {"stage": stage, "per_source": licenses}, {"stage": stage, "per_source": languages}


__all__ = ["MEMBER_LIST", "NOT_IDENTIFIED", "REMOVED_BY_REQUEST", "REPLACED", "UNKNOWN", "MemberList",
           "licenses_and_languages", "train_in"]
