"""What the data card reads from the documents themselves: each document's licence and identified language.

No manifest holds these per document, so the card reads two small columns (`license`, `meta`) of the documents the
token shards were built from (the last document stage), part by part, never the text; and the shards' member list,
for which of them are in the training split and with how many tokens (copies x tokens, as the shards hold them).

A document's licence is `meta.<card.license_fields[source]>` for a source listed there (the licence its package
declares, say), else the `license` column (the source's declared licence). Missing, null, empty or UNKNOWN is
`unknown`, counted and listed by doc id and locator (no text). Its language is `meta.language` as the `language`
step set it; documents of a part whose filter profile has no `language` step are "not identified" (a reader's own
`language` field, the programming language of code say, is not a language identification).
"""

from __future__ import annotations

import json
from typing import Any

from kiln.common.config import ProjectConfig
from kiln.common.manifest import Manifest
from kiln.common.storage import Store
from kiln.governance.catalog import FILTERED, NOT_MATERIALIZED, SHARDS, Catalog
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


def train_members(store: Store, shards: Manifest | None) -> dict[str, tuple[int, int]]:
    """doc_id -> (tokens in the training split, copies there; copies x tokens); {} without shards."""
    if shards is None or not shards.files_with_role("members"):
        return {}
    table = store.read_table(SHARDS, shards.partition, "members", columns=["doc_id", "split", "copies", "tokens"],
                             filters=[("split", "=", "train")])
    return {d: (c * t, c) for d, c, t in zip(table["doc_id"].to_pylist(), table["copies"].to_pylist(),
                                             table["tokens"].to_pylist())} if len(table) else {}


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


def licenses_and_languages(store: Store, catalog: Catalog, config: ProjectConfig, parts: dict[str, list[str]],
                           shards: Manifest | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(licences, languages) per source over `parts` (each source's partitions in the checkpoint's shards)."""
    stage = DOCUMENT_STAGES[-1]
    members = train_members(store, shards)
    licenses: dict[str, Any] = {}
    languages: dict[str, Any] = {}
    for name, ps in parts.items():
        found = {p: m for p in ps if (m := catalog.manifest(stage, p)) is not None}
        if not found:
            licenses[name] = languages[name] = NOT_MATERIALIZED
            continue
        field = config.card.license_fields.get(name)
        filtered = {p: f for p in found if (f := catalog.manifest(FILTERED, p)) is not None}
        identified = {p: s for p, f in filtered.items() if (s := _language_settings(f)) is not None}
        by_license: dict[str, dict[str, int]] = {}
        by_language: dict[str, dict[str, int]] = {}
        unknown: list[dict[str, Any]] = []
        for p in found:
            for batch in store.iter_batches(stage, p, columns=["doc_id", "license", "meta"]):
                for doc_id, license_, meta in zip(batch.column("doc_id").to_pylist(),
                                                  batch.column("license").to_pylist(),
                                                  batch.column("meta").to_pylist()):
                    meta = json.loads(meta) if meta else {}
                    lic = document_license(meta.get(field) if field else license_)
                    member = members.get(doc_id)
                    _count(by_license, lic, member)
                    if lic == UNKNOWN and len(unknown) < MAX_LISTED:
                        unknown.append({"doc_id": doc_id, "locator": meta.get("locator"),
                                        "in_train_shards": bool(member and member[1] > 0)})
                    language = meta.get("language") if p in identified else None
                    _count(by_language, str(language) if language else NOT_IDENTIFIED, member)
        licenses[name] = {"field": f"meta.{field}" if field else "license", "licenses": _ordered(by_license),
                          "unknown": by_license.get(UNKNOWN, {}).get("documents", 0), "unknown_listed": unknown}
        profile = next((f.config.get("profile") for f in filtered.values()), None)
        languages[name] = {"identified": bool(identified), "parts_identified": len(identified), "parts": len(found),
                           "settings": next(iter(identified.values()), None), "profile": profile,
                           "languages": _ordered(by_language)}
    return {"stage": stage, "per_source": licenses}, {"stage": stage, "per_source": languages}


__all__ = ["NOT_IDENTIFIED", "UNKNOWN", "document_license", "licenses_and_languages", "train_members"]
