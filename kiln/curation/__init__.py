"""Curation: raw files become documents (readers), pass a filter profile with PII redaction, and lose exact copies.

Used by the `raw_documents`, `filtered_documents` and `curated_documents` assets and the `residual_pii` check.
Modules: `readers/`, `filters/`, `pii/`, `residual_pii` (its own detector), `pipeline`, `exact_dedup`, `documents`.
"""
