"""Governance: what each checkpoint was trained on and how it was filtered, and taking documents out again.

Used by the `data_card` asset and its `lineage_complete` check, the refresh partitions, and `kiln audit|forget`.
Modules: `lineage`, `refresh` (the registry), `catalog`, `audit`, `membership`, `render`, `data_card`, `forget`,
`replay` (removal requests applied to a continued run's replayed shards).
"""
