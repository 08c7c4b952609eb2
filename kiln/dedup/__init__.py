"""Near-duplicate removal and benchmark decontamination.

- `text`: the word view of a document both use (normalized words with their character spans);
- `minhash`: shingles, MinHash signatures and the LSH bands x rows choice;
- `index`: the persistent, incremental LSH index of accepted documents (local files or Redis);
- `near`: verified near-duplicate decisions with union-find clusters and a keep policy;
- `decontaminate`: n-gram overlap with declared evaluation sets;
- `boilerplate`: lines that recur across many documents.
"""
