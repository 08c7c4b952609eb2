"""Scoring a source: every document streamed through the classifier and the reference LM, the scores
stored as columns next to the text (null where a model is off), one output part per input part."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from kiln.documents import DOCUMENT_SCHEMA, SCORED_SCHEMA
from kiln.quality.classifier import QualityScorer
from kiln.storage import DatasetWriter

if TYPE_CHECKING:  # torch loads only where perplexity is computed
    from kiln.quality.perplexity import ReferenceModel

SCORE, PERPLEXITY = "quality_score", "perplexity"


def score_parts(parts: Sequence[Path], writer: DatasetWriter, scorer: QualityScorer | None,
                reference: ReferenceModel | None, max_tokens: int = 512, batch_size: int = 16,
                label: str = "score") -> dict[str, int]:
    """Every document of `parts` with its `quality_score` and `perplexity` (null where that model is off),
    one output part per input part."""
    counts = {"documents": 0, "scored": 0, "perplexity_scored": 0}
    columns = [f.name for f in DOCUMENT_SCHEMA]
    total = sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
    with tqdm(total=total, desc=label, unit="doc") as bar:
        for path in parts:
            table = pq.read_table(path, columns=columns)
            texts = table.column("text").to_pylist()
            scores = scorer.score(texts, table.column("doc_id").to_pylist()) if scorer else None
            perplexity = reference.perplexities(texts, max_tokens, batch_size) if reference else None
            table = table.append_column(SCORE, _column(scores, len(texts)))
            table = table.append_column(PERPLEXITY, _column(perplexity, len(texts)))
            writer.write("documents", table.cast(SCORED_SCHEMA))
            counts["documents"] += len(texts)
            counts["scored"] += len(texts) if scores is not None else 0
            counts["perplexity_scored"] += int(np.isfinite(perplexity).sum()) if perplexity is not None else 0
            bar.update(len(texts))
    return counts


def _column(values: np.ndarray | None, n: int) -> pa.Array:
    """Scores as a float column: null where the model is off, and where it gave NaN (a document without tokens)."""
    return pa.array(values, pa.float64(), from_pandas=True) if values is not None else pa.nulls(n, pa.float64())


def read_scores(parts: Sequence[Path]) -> tuple[list[str], np.ndarray, np.ndarray]:
    """A source's doc ids and score columns only (missing scores as NaN): what the rules need."""
    tables = [pq.read_table(p, columns=["doc_id", SCORE, PERPLEXITY]) for p in parts]
    table = pa.concat_tables(tables) if tables else SCORED_SCHEMA.empty_table().select(["doc_id", SCORE, PERPLEXITY])

    def floats(name: str) -> np.ndarray:
        return table.column(name).to_numpy(zero_copy_only=False).astype(np.float64)  # nulls become NaN

    return table.column("doc_id").to_pylist(), floats(SCORE), floats(PERPLEXITY)
