"""The document stages in pipeline order: the one list audits, data cards and funnels walk.

Every stage is a per-source dataset of kept `documents` parts plus `rejected` (and, for raw documents,
`quarantine`) parts. A stage may not be materialized (yet): readers say so instead of failing.
"""

from __future__ import annotations

DOCUMENT_STAGES = ["raw_documents", "filtered_documents", "curated_documents", "deduplicated_documents",
                   "quality_filtered_documents"]

# Where a document that left a stage is recorded, besides the kept `documents` parts.
REMOVAL_ROLES = ("rejected", "quarantine")

__all__ = ["DOCUMENT_STAGES", "REMOVAL_ROLES"]
