"""Model-based quality: a fastText classifier and a reference model's perplexity, stored as score columns, then rules.

Used by the `quality_classifier`, `quality_scores` and `quality_filtered_documents` assets.
Modules: `classifier` (reference vs web), `perplexity` (CCNet style), `scoring` (the columns), `rules` (keep or drop).
"""
