"""Kiln's Dagster-free library: documents, readers, filters, PII, dedup, manifests.

Nothing in this package imports Dagster; the asset layer (`assets/`) is a thin shell over it.
"""

__version__ = "0.1.0"
