"""Kiln's Dagster-free library, one package per stage in data-flow order: curation, dedup, quality, tokens,
governance, planning; the engine they run on and the shared plumbing (common); the `kiln` command (cli).
Nothing here imports Dagster; the asset layer (`assets/`) is a thin shell over it.
"""

__version__ = "0.1.0"
