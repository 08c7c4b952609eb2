"""Near-duplicate removal and benchmark decontamination.

- `text`: the word view of a document both use (normalized words with their character spans);
- `minhash` (+ `fast_minhash`, `signing`): shingles, MinHash signatures and the LSH bands x rows choice (the
  numpy signature scheme; the signature stage over Parquet parts);
- `near`: the decisions table, union-find clusters and the keep policy;
- `buckets` (+ `bucket_rounds`, `bucket_layout`, `components`): the decisions computed as engine rounds over Parquet
  band buckets (the driver; the rounds' tasks; the nodes and layout they share; connected components);
- `bucket_index`: each refresh's bucket index (the persistent index of accepted documents, in its dedup_index dataset);
- `migrate`: moving an older Kiln's single index (LocalIndex folder, its S3 copy, Redis) into those;
- `decontaminate`: n-gram overlap with declared evaluation sets;
- `boilerplate`: lines that recur across many documents.
"""
