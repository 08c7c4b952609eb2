"""Curation steps: each keeps a document (maybe rewriting it) or drops it with a reason.

The names a config's profiles use are registered in `kiln.curation.filters.registry`.
"""
