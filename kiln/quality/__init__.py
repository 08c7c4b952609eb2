"""Model-based quality signals, stored as columns next to the documents, and filtering on them.

- `classifier`: the fastText "reference vs web" classifier, trained here on the user's own sources.
- `perplexity`: perplexity under a reference language model (a Kiln checkpoint), CCNet style.
- `scoring`: a source's parts streamed through both, the scores stored as columns.
- `rules`: keep / drop-with-reason from the stored scores, per source, and the filtered output.
"""
