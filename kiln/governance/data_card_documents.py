"""What the data card reads from the documents themselves: each document's licence and identified language.

No manifest holds these per document, so the card reads two small columns (`license`, `meta`) of the documents the
token shards were built from (the last document stage), part by part, never the text; and the shards' member list,
for which of them are in the training split and with how many tokens (copies x tokens, as the shards hold them).

Both are read a part at a time, never a table of every document: the member list holds one row per input document
in the order the shard writer read them (source by source, each source's parts in refresh order), so a part's
member rows are a run of it, found from the row counts and read forward in part-sized batches (`MemberList`). A
part whose doc ids do not match its run (its stage was re-materialized after the shards) is looked up by doc id,
streaming the list.

A document's licence is `meta.<card.license_fields[source]>` for a source listed there (the licence its package
declares, say), else the `license` column (the source's declared licence). Missing, null, empty or UNKNOWN is
`unknown`, counted and listed by doc id and locator (no text). Its language is `meta.language` as the `language`
step set it; documents of a part whose filter profile has no `language` step are "not identified" (a reader's own
`language` field, the programming language of code say, is not a language identification).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.config import ProjectConfig
from kiln.common.manifest import Manifest
from kiln.governance.catalog import FILTERED, NOT_MATERIALIZED, SHARDS, Catalog, member_lists
from kiln.governance.lineage import DOCUMENT_STAGES

UNKNOWN = "unknown"
NOT_IDENTIFIED = "not identified"
_UNKNOWN_VALUES = {"", "unknown", "none", "null", "n/a"}  # what packaging metadata writes for "no licence given"
MAX_LISTED = 1000  # unknown-licence documents kept in the JSON per source (all are counted)
LANGUAGE_STEP = "language"


def document_license(value: Any) -> str:
    """A recorded licence as the card counts it: the stripped text, or `unknown`."""
    text = "" if value is None else str(value).strip()
    return UNKNOWN if text.lower() in _UNKNOWN_VALUES else text


MEMBER_COLUMNS = ["doc_id", "source", "split", "copies", "tokens"]


class MemberList:
    """The shards' member list, read forward `batch` rows at a time: `rows(start, stop)` holds that run and at most a
    batch more (a smaller start than the last one read starts over)."""

    def __init__(self, paths: list[Path], batch: int):
        self.paths, self.batch = list(paths), max(1, batch)
        self._restart()

    def _restart(self) -> None:
        self._batches = (b for p in self.paths
                         for b in pq.ParquetFile(p).iter_batches(batch_size=self.batch, columns=MEMBER_COLUMNS))
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
            return pa.table({c: [] for c in MEMBER_COLUMNS})
        return pa.Table.from_batches(self._held).slice(start - self._start, stop - start)

    def source_runs(self) -> dict[str, tuple[int, int] | None]:
        """source -> (first row, rows) of its run in the list; None for a source whose rows are not one run."""
        runs: dict[str, tuple[int, int] | None] = {}
        last, pos = None, 0
        for p in self.paths:
            for batch in pq.ParquetFile(p).iter_batches(batch_size=self.batch, columns=["source"]):
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
            for batch in pq.ParquetFile(p).iter_batches(batch_size=self.batch, columns=MEMBER_COLUMNS):
                found |= train_in(pa.Table.from_batches([batch]).filter(pc.is_in(batch.column("doc_id"), wanted)))
        return found


def train_in(members: pa.Table) -> dict[str, tuple[int, int]]:
    """doc_id -> (tokens in the training split, copies there; copies x tokens) of member rows in that split."""
    train = members.filter(pc.equal(members.column("split"), "train"))
    return {d: (c * t, c) for d, c, t in zip(train["doc_id"].to_pylist(), train["copies"].to_pylist(),
                                             train["tokens"].to_pylist())}


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
        if unanswerable or any(catalog.replaced(stage, p) for p in found[name]):
            # Counted over the documents trained on, or not at all: the store holds other versions now.
            licenses[name] = languages[name] = REPLACED
            continue
        field = config.card.license_fields.get(name)
        filtered = {p: f for p in found[name] if (f := catalog.manifest(FILTERED, p)) is not None}
        identified = {p: s for p, f in filtered.items() if (s := _language_settings(f)) is not None}
        by_license: dict[str, dict[str, int]] = {}
        by_language: dict[str, dict[str, int]] = {}
        unknown: list[dict[str, Any]] = []
        offset = 0  # documents of this source before the part, in the order the shard writer read them
        for p in found[name]:
            for path in catalog.snapshot(stage, p).files("documents"):
                part = pq.read_table(path, columns=["doc_id", "license", "meta"])
                train = members.of(name, offset, part.column("doc_id"))
                offset += part.num_rows
                for doc_id, license_, meta in zip(part.column("doc_id").to_pylist(), part.column("license").to_pylist(),
                                                  part.column("meta").to_pylist()):
                    meta = json.loads(meta) if meta else {}
                    lic = document_license(meta.get(field) if field else license_)
                    member = train.get(doc_id)
                    _count(by_license, lic, member)
                    if lic == UNKNOWN and len(unknown) < MAX_LISTED:
                        unknown.append({"doc_id": doc_id, "locator": meta.get("locator"),
                                        "in_train_shards": bool(member and member[1] > 0)})
                    language = meta.get("language") if p in identified else None
                    _count(by_language, str(language) if language else NOT_IDENTIFIED, member)
        licenses[name] = {"field": f"meta.{field}" if field else "license", "licenses": _ordered(by_license),
                          "unknown": by_license.get(UNKNOWN, {}).get("documents", 0), "unknown_listed": unknown}
        profile = next((f.config.get("profile") for f in filtered.values()), None)
        languages[name] = {"identified": bool(identified), "parts_identified": len(identified), "parts": len(found[name]),
                           "settings": next(iter(identified.values()), None), "profile": profile,
                           "languages": _ordered(by_language)}
    return {"stage": stage, "per_source": licenses}, {"stage": stage, "per_source": languages}


__all__ = ["NOT_IDENTIFIED", "REPLACED", "UNKNOWN", "document_license", "MemberList", "licenses_and_languages",
           "train_in"]
