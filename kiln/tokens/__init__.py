"""Tokens: a sentencepiece tokenizer trained on the mixture (or one brought as a tokenizer.json or .model file),
and documents turned into training-ready shards.

Used by the `tokenizer` and `token_shards` assets; the training loader reads `shard_format`.
Modules: `tokenizer`, `mixture` (tokens per source), `fim`, `shard_format` (the one format), `shard_writer`.
"""
