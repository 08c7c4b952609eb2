"""A document's licence and language as the data card counts them: one rule, used where the card reads the documents
(kiln.governance.data_card_documents) and where the shard writer records them in its member list
(kiln.tokens.shard_writer), so the card of a checkpoint still counts them once their stage is materialized again.

A document's licence is `meta.<field>` for a source with a licence field (`card.license_fields`: the licence its
package declares, say), else its `license` column (the source's declared licence); missing, null, empty or UNKNOWN is
`unknown`. Its language is `meta.language` as found; only a part whose filter profile has a `language` step counts it
(a reader's own `language` field, the programming language of code say, is not a language identification).
"""

from __future__ import annotations

import json
from typing import Any

UNKNOWN = "unknown"
_UNKNOWN_VALUES = {"", "unknown", "none", "null", "n/a"}  # what packaging metadata writes for "no licence given"


def document_license(value: Any) -> str:
    """A recorded licence as the card counts it: the stripped text, or `unknown`."""
    text = "" if value is None else str(value).strip()
    return UNKNOWN if text.lower() in _UNKNOWN_VALUES else text


def license_from(field: str | None) -> str:
    """Where a source's licences are read from, as the card names it."""
    return f"meta.{field}" if field else "license"


def document_facts(license_: str | None, meta: str | None, field: str | None) -> tuple[str, str | None, str | None]:
    """(licence, `meta.language`, locator) of one document from its `license` and `meta` columns; the locator only
    for a document of unknown licence (the card lists those by it)."""
    meta = json.loads(meta) if meta else {}
    lic = document_license(meta.get(field) if field else license_)
    language = meta.get("language")
    locator = meta.get("locator") if lic == UNKNOWN else None
    return lic, str(language) if language else None, None if locator is None else str(locator)


__all__ = ["UNKNOWN", "document_facts", "document_license", "license_from"]
