"""Governance: what each checkpoint was trained on and how it was filtered, and taking documents out again.

Used by the `data_card` asset and its `lineage_complete` check, the refresh partitions, and `kiln audit|forget`.
Modules: `lineage` (stage order), `refresh` (the refresh registry), `catalog` (reading manifests), `audit`
(lineage, source usage, refreshes), `membership`, `render` (audit answers as text), `data_card`, `forget`.
"""
