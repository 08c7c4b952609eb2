"""Near-duplicates and benchmark decontamination: MinHash signatures, LSH band buckets as engine rounds, decisions.

Used by the `minhash_signatures`, `dedup_index` and `deduplicated_documents` assets and `kiln dedup migrate-index`.
Modules: `signing` (`minhash`, `fast_minhash`, `lsh`), `buckets` (+ `bucket_*`, `components`), `near`, `apply`,
`migrate`.
"""
