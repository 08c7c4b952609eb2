"""Shared plumbing every stage uses: the project config, datasets on disk or S3, manifests, stats, plots.

Used by every asset through `resources/`; nothing here knows about a particular stage's work.
Modules: `config/`, `storage`, `remote`, `manifest`, `spill`, `splitmix`, `stats`, `plots`, `removals`, `secrets`,
`memory`.
"""
