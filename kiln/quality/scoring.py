"""Scoring a source: every document through the classifier and the reference LM, the scores stored as
columns next to the text (null where a model is off), one output part per input part.

Each part is one engine task that reads its input part and writes its output part itself; a worker loads each
model once and reuses it for every part it scores. The reference LM runs where its device is: on CPU, on the
engine's workers (one torch thread each, so a part's perplexities do not depend on which worker ran it); on a
GPU, in the calling process, which owns the GPU (Ray hides GPUs from tasks that did not ask for one)."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.config import QualityPerplexity
from kiln.common.manifest import sha256_file
from kiln.common.storage import resume_part, write_parquet_atomic
from kiln.curation.documents import DOCUMENT_SCHEMA, SCORED_SCHEMA
from kiln.engine import SERIAL, Engine
from kiln.quality.classifier import ClassifierCard, QualityScorer

if TYPE_CHECKING:  # torch loads only where perplexity is computed
    from kiln.quality.perplexity import ReferenceModel

SCORE, PERPLEXITY = "quality_score", "perplexity"


@lru_cache(maxsize=2)
def _scorer(directory: str, sha256: str) -> QualityScorer:
    """Loaded once per worker process (`load` refuses a model file that does not match its card)."""
    scorer = QualityScorer.load(Path(directory))
    if ClassifierCard.read(Path(directory)).sha256 != sha256:
        raise ValueError(f"{directory}: the quality classifier changed while its scores were being written; "
                         "re-materialize quality_scores")
    return scorer


@lru_cache(maxsize=1)
def _reference(path: str, device: str, identity: tuple[str, str]) -> ReferenceModel:
    """Loaded once per worker process and model: keyed on the model's sha256 too, as the path is often a link that
    moves on to a newer checkpoint (checkpoint/_all) while a warm worker still holds the old one."""
    from kiln.quality.perplexity import ReferenceModel

    if device == "cpu":
        import torch

        torch.set_num_threads(1)  # one CPU per task; the same reduction order on every worker
    model = ReferenceModel.load(path, device)
    if (model.model_sha256, sha256_file(ReferenceModel.files(path)[1])) != identity:
        raise ValueError(f"quality.perplexity.model = {path!r} changed while its scores were being written; "
                         "re-materialize quality_scores")
    return model


@dataclass(frozen=True)
class _ScoreTask:
    input_path: str
    output_path: str
    classifier: tuple[str, str] | None  # (model folder, its sha256)
    reference: str | None  # the reference LM's folder
    reference_identity: tuple[str, str] | None  # its weights' and tokenizer's sha256
    device: str  # where the reference LM runs: cpu or cuda
    max_tokens: int
    batch_size: int


def _score_part(task: _ScoreTask) -> dict[str, int]:
    return resume_part(task.output_path, lambda: _score(task))


def _score(task: _ScoreTask) -> dict[str, int]:
    table = pq.read_table(task.input_path, columns=[f.name for f in DOCUMENT_SCHEMA])
    texts = table.column("text").to_pylist()
    scores = _scorer(*task.classifier).score(texts, table.column("doc_id").to_pylist()) if task.classifier else None
    perplexity = (_reference(task.reference, task.device, task.reference_identity)
                  .perplexities(texts, task.max_tokens, task.batch_size) if task.reference else None)
    table = table.append_column(SCORE, _column(scores, len(texts)))
    table = table.append_column(PERPLEXITY, _column(perplexity, len(texts)))
    write_parquet_atomic(Path(task.output_path), table.cast(SCORED_SCHEMA))
    return {"documents": len(texts), "scored": len(texts) if scores is not None else 0,
            "perplexity_scored": int(np.isfinite(perplexity).sum()) if perplexity is not None else 0}


def score_parts(parts: Sequence[Path], output_paths: Sequence[Path], classifier: Path | None,
                perplexity: QualityPerplexity | None = None, engine: Engine = SERIAL, progress: bool = True,
                label: str = "score") -> dict[str, int]:
    """Every document of `parts` with its `quality_score` (the classifier in folder `classifier`) and
    `perplexity` (under `perplexity.model`), null where that model is off; part i's scores go to
    `output_paths[i]`. Returns counts: documents, scored, perplexity_scored."""
    reference, device = (perplexity.model, perplexity.device) if perplexity and perplexity.model else (None, "cpu")
    identity = None
    if reference:
        from kiln.quality.perplexity import ReferenceModel, resolve_device

        identity = tuple(ReferenceModel.identity(reference).values())
        device = resolve_device(device)
        if device != "cpu":
            engine = SERIAL
    card = (str(classifier), ClassifierCard.read(Path(classifier)).sha256) if classifier else None
    settings = perplexity or QualityPerplexity()
    tasks = [_ScoreTask(str(i), str(o), card, reference, identity, device, settings.max_tokens, settings.batch_size)
             for i, o in zip(parts, output_paths, strict=True)]
    counts = {"documents": 0, "scored": 0, "perplexity_scored": 0}
    for done in engine.map_parts(_score_part, tasks, desc=label, progress=progress,
                                 size=lambda t: os.path.getsize(t.input_path)):
        counts = {k: counts[k] + done[k] for k in counts}
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


def out_of_range(scores: np.ndarray, perplexity: np.ndarray, classified: bool, perplexed: bool) -> int:
    """The documents whose stored scores are not what scoring gives: a classifier score outside [0, 1], a perplexity
    below 1, or NaN ("not scored") where a classifier (`classified`) or a reference model (`perplexed`) scored."""
    bad_score = (scores < 0) | (scores > 1) | (np.isnan(scores) & classified)
    bad_perplexity = (perplexity < 1) | (np.isnan(perplexity) & perplexed)
    return int((bad_score | bad_perplexity).sum())
