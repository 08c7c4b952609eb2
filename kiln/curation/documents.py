"""The one document schema every stage reads and writes."""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

# Kept documents. `meta` is a JSON object serialized as a string so the schema never drifts.
DOCUMENT_SCHEMA = pa.schema(
    [
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("text", pa.large_string(), nullable=False),
        pa.field("url", pa.string()),
        pa.field("license", pa.string()),
        pa.field("meta", pa.string()),
    ]
)

# Filtered and curated documents also carry the hash exact dedup compares (normalized text).
CURATED_SCHEMA = DOCUMENT_SCHEMA.append(pa.field("content_hash", pa.string(), nullable=False))

# Every document the filter stage read, kept or removed: the `content_hash` of its text as it came in (normalized by the
# `normalize` step, as exact dedup folds it), and a second row for a kept text a filter rewrote (PII redacted), of the
# text as written. A hash, never the text: `kiln audit membership` finds a text by it without reading and hashing every
# raw text per question (kiln.curation.intake_hashes: the files, bucketed by hash).
INTAKE_HASH_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False),
                                pa.field("content_hash", pa.string(), nullable=False)])

# Removed documents (kiln.common.removals): where, why, and (for duplicates) what was kept instead; near duplicates also
# carry their cluster and the measured Jaccard similarity with the kept document. No text after intake: its length,
# its hash, and the text itself (PII-redacted, an excerpt or whole) only where `curation.keep_rejected_text` says.
REJECTED_SCHEMA = pa.schema([
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("url", pa.string()),
    pa.field("license", pa.string()),
    pa.field("stage", pa.string(), nullable=False),
    pa.field("reason", pa.string(), nullable=False),
    pa.field("duplicate_of", pa.string()),
    pa.field("cluster_id", pa.string()),
    pa.field("jaccard", pa.float64()),
    pa.field("chars", pa.int64(), nullable=False),
    pa.field("text_hash", pa.string(), nullable=False),
    pa.field("text", pa.large_string()),
])

# Quality-scored documents: the classifier's P(reference) and the reference LM's perplexity, kept next to the
# text (null where not computed) so thresholds can change later without scoring again. Quality rejects
# carry them too.
QUALITY_FIELDS = [pa.field("quality_score", pa.float64()), pa.field("perplexity", pa.float64())]
SCORED_SCHEMA = pa.schema([*DOCUMENT_SCHEMA, *QUALITY_FIELDS])
QUALITY_REJECTED_SCHEMA = pa.schema([*REJECTED_SCHEMA, *QUALITY_FIELDS])

# Records that could not even be read as documents (kiln.curation.readers.quarantine): where, why, a PII-redacted
# excerpt, and the record's hash.
QUARANTINE_SCHEMA = pa.schema(
    [
        pa.field("source", pa.string(), nullable=False),
        pa.field("locator", pa.string(), nullable=False),
        pa.field("reason", pa.string(), nullable=False),
        pa.field("excerpt", pa.string()),
        pa.field("record_hash", pa.string()),
    ]
)


@dataclass
class Document:
    doc_id: str
    source: str
    text: str
    url: str | None = None
    license: str | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    # What the `language` step identified in this pass (never stored): the steps after it take that language's
    # settings. Not `meta.language`, which may be the record's own field (CCNet and RedPajama records carry one).
    identified_language: str | None = field(default=None, compare=False, repr=False)

    def to_row(self) -> dict[str, Any]:
        return {
            "doc_id": self.doc_id,
            "source": self.source,
            "text": self.text,
            "url": self.url,
            "license": self.license,
            "meta": json.dumps(self.meta, sort_keys=True, ensure_ascii=False),
        }

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> Document:
        return cls(
            doc_id=row["doc_id"],
            source=row["source"],
            text=row["text"],
            url=row.get("url"),
            license=row.get("license"),
            meta=json.loads(row["meta"]) if row.get("meta") else {},
        )


def make_doc_id(source: str, locator: str) -> str:
    """Stable id from where the record lives (source + file/record locator), not from run order."""
    return hashlib.blake2b(f"{source}\x00{locator}".encode(), digest_size=12).hexdigest()
