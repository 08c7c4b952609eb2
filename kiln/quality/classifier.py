"""The fastText "reference vs web" quality classifier (GPT-3, CCNet, DCLM).

Trained here, offline, on the user's own sources: documents of reference sources are the positives,
documents of web sources the negatives, balanced to the smaller class. Training is cross-fitted (folds
stratified by class, in doc_id-hash order, stable across runs): out-of-fold scores measure precision, recall and
ROC AUC, and are the scores of the sample's own documents, which the final model has seen. The score of a document
is P(reference), in [0, 1].

A fastText line is one example, so a document is flattened: lowercased, split into words and
punctuation marks, its first `max_words` words (a Han character 5/8 of one, a Thai letter 1/4) joined by spaces.
"""

from __future__ import annotations

import heapq
import json
import tempfile
import time
from collections.abc import Iterable, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.config import QualityClassifier
from kiln.common.manifest import sha256_file, write_json_atomic
from kiln.common.storage import write_parquet_atomic
from kiln.common.text_units import WORD_PATTERN, WORD_WEIGHT, Splitter, unit_weights
from kiln.engine import SERIAL, Engine
from kiln.tokens.mixture import hash_unit

MODEL_FILE, CARD_FILE, SAMPLE_FILE = "quality_classifier.bin", "quality_classifier.json", "training_sample.parquet"
POSITIVE, NEGATIVE = "__label__reference", "__label__web"
# Words and punctuation marks; a character of a script written without spaces (Chinese, Japanese, Thai) is a word of
# its own and combining marks stay in their word (kiln.common.text_units), or a Chinese clause would be one feature.
_TOKENS = Splitter(r"\w+|[^\w\s]", rf"{WORD_PATTERN}|[^\w\s]")
_FOLD_SALT = "quality-fold"
T = TypeVar("T")


def fasttext_text(text: str, max_words: int) -> str:
    """One document as one fastText line: lowercase words and punctuation marks, newlines gone, up to `max_words`
    words of text as Kiln weighs them everywhere (text_units: a Han character or kana 5/8 of a word, a Thai letter
    1/4), so the window holds as much text in every script: counted one each, 1,000 tokens were 625 words of
    Chinese and 250 of Thai. A word that starts as fastText's label prefix (a README quoting `__label__reference`)
    loses an underscore, or fastText would read it as a second label of the line and train the document as both
    classes."""
    weight = unit_weights().get
    tokens, budget = [], max_words * WORD_WEIGHT
    for m in _TOKENS.finditer(text.lower()):
        token = m.group()
        tokens.append("_" + token[2:] if token.startswith("__label__") else token)
        budget -= weight(ord(token[0]), WORD_WEIGHT)
        if budget <= 0:
            break
    return " ".join(tokens)


@dataclass(frozen=True)
class Example:
    doc_id: str
    source: str
    text: str


@dataclass
class ClassifierCard:
    """What the model is and how well it separates: written next to the model file."""

    sha256: str
    labels: dict[str, str]
    settings: dict
    sample: dict  # documents per class and per source
    cross_validation: dict  # out-of-fold precision, recall, f1, accuracy at 0.5, ROC AUC, class sizes
    seconds: float

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def read(cls, directory: Path) -> ClassifierCard:
        return cls(**json.loads((Path(directory) / CARD_FILE).read_text(encoding="utf-8")))


def stratified_folds(classes: Sequence[Sequence[str]], folds: int) -> list[list[int]]:
    """The fold of each document of each class (doc ids): a class's documents dealt round-robin over the folds in
    doc_id-hash order, so each fold holds as many of every class as another, give or take one. With two documents or
    more per class, no fold's training set (the other folds) lacks a class: by hash alone a small class could fall
    whole into one fold, whose model could then not be fitted, and its documents took the final model's score, from
    a model that had seen them."""
    out = []
    for ids in classes:
        rank = sorted(range(len(ids)), key=lambda i: (hash_unit(_FOLD_SALT, ids[i]), ids[i]))
        fold = [0] * len(ids)
        for r, i in enumerate(rank):
            fold[i] = r % folds
        out.append(fold)
    return out


def balanced_sample(positives: Iterable[T], negatives: Iterable[T], max_per_class: int) -> tuple[list[T], list[T]]:
    """Both classes cut to the smaller one (at most max_per_class), a deterministic subset by doc_id hash.
    Items are Examples or bare doc ids (so a large source's sample can be chosen before reading texts), in one pass:
    only the max_per_class first by hash are held, not the class (a stream of a corpus's ids stays a stream)."""
    def first(items: Iterable[T]) -> list[T]:  # sorted(items, key)[:max_per_class], ties in input order as sorted's
        return heapq.nsmallest(max_per_class, items, key=lambda x: hash_unit("quality-sample", getattr(x, "doc_id", x)))

    pos, neg = first(positives), first(negatives)
    n = min(len(pos), len(neg))
    return pos[:n], neg[:n]


@dataclass(frozen=True)
class _FitTask:
    """One fastText fit: on every line of the training file but fold `fold`'s, scoring those (fold None: on every
    line, saved to `model_path`). Fits are independent and single-threaded (bit-reproducible), so they run in
    parallel, one per engine task."""

    lines_path: str  # "<label> <fastText text>" per example, in training order
    folds: tuple[int, ...]  # the fold of each line
    fold: int | None
    settings: str  # QualityClassifier as JSON
    model_path: str | None = None


def _fit_task(task: _FitTask) -> list[float] | None:
    import fasttext

    settings = QualityClassifier.model_validate_json(task.settings)
    lines = Path(task.lines_path).read_text(encoding="utf-8").splitlines(keepends=True)
    held_out = [line for line, f in zip(lines, task.folds) if f == task.fold]
    train = [line for line, f in zip(lines, task.folds) if f != task.fold]
    if task.fold is not None and (not held_out or {line.split(" ", 1)[0] for line in train} != {POSITIVE, NEGATIVE}):
        return None  # nothing to score, or a fold that leaves one class out
    workdir = Path(task.lines_path).parent
    with tempfile.NamedTemporaryFile("w", prefix=".fasttext-", suffix=".txt", encoding="utf-8", dir=workdir,
                                     delete=False) as f:
        f.writelines(train)
        path = Path(f.name)
    try:
        model = fasttext.train_supervised(
            str(path), epoch=settings.epochs, lr=settings.lr, wordNgrams=settings.word_ngrams, dim=settings.dim,
            minCount=settings.min_count, thread=settings.threads, seed=settings.seed, verbose=0)
        if settings.quantize_cutoff:  # the fold models too, so cross-validation measures what is shipped
            model.quantize(cutoff=settings.quantize_cutoff)  # fastText's defaults otherwise: measured best here
    finally:
        path.unlink()
    if task.fold is None:
        tmp = Path(task.model_path).with_name(f".{Path(task.model_path).name}.tmp")
        model.save_model(str(tmp))
        tmp.replace(task.model_path)
        return None
    return QualityScorer(model, settings.max_words).score_flat(
        [line.split(" ", 1)[1].rstrip("\n") for line in held_out]).tolist()


def train_classifier(positives: Iterable[Example], negatives: Iterable[Example], settings: QualityClassifier,
                     out_dir: Path, engine: Engine = SERIAL, progress: bool = True) -> ClassifierCard:
    """Cross-fitted training: one model per fold (trained on the other folds) scores that fold's documents,
    so no training document is scored by a model that saw it, and those out-of-fold scores measure the
    classifier; then the model for every other document is trained on the whole sample. The fits run in
    parallel on `engine`. Writes the model, the card and the sample (ids, labels, folds, out-of-fold scores)
    to `out_dir`."""
    pos, neg = balanced_sample(positives, negatives, settings.max_documents_per_class)
    if len(pos) < 2:  # one of a class: the model of its fold would train without the class, and no other could score it
        raise ValueError(f"the quality classifier needs at least two positive and two negative documents to cross-fit, "
                         f"has {len(pos)} of the smaller class; check quality.classifier.positive_sources / "
                         "negative_sources, or set quality.classifier.enabled: false")
    examples = [(e, POSITIVE) for e in pos] + [(e, NEGATIVE) for e in neg]
    folds = [f for fold in stratified_folds([[e.doc_id for e in pos], [e.doc_id for e in neg]], settings.folds)
             for f in fold]
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.perf_counter()
    # fastText reads its training set from a file; shuffled so the SGD does not see one class, then the other.
    order = sorted(range(len(examples)), key=lambda i: hash_unit("quality-order", settings.seed, examples[i][0].doc_id))
    lines_path = out_dir / ".fasttext-lines.txt"
    lines_path.write_text("".join(f"{examples[i][1]} {fasttext_text(examples[i][0].text, settings.max_words)}\n"
                                  for i in order), encoding="utf-8")
    model_path = out_dir / MODEL_FILE
    ordered_folds = tuple(folds[i] for i in order)
    tasks = [_FitTask(str(lines_path), ordered_folds, k, settings.model_dump_json(),
                      str(model_path) if k is None else None) for k in [None, *range(settings.folds)]]
    try:
        results = engine.map_parts(_fit_task, tasks, desc="quality classifier fits", progress=progress)
    finally:
        lines_path.unlink(missing_ok=True)
    out_of_fold = np.full(len(examples), np.nan)
    for task, scores in zip(tasks, results):
        if scores is not None:
            out_of_fold[[i for i in order if folds[i] == task.fold]] = scores
    seconds = time.perf_counter() - started
    truth = np.array([label == POSITIVE for _, label in examples])
    measured = np.isfinite(out_of_fold)
    card = ClassifierCard(
        sha256=sha256_file(model_path), labels={"positive": POSITIVE, "negative": NEGATIVE},
        settings=settings.model_dump(mode="json"),
        sample={"positive": len(pos), "negative": len(neg), "per_source": _source_counts(examples)},
        cross_validation=cross_validation_metrics(truth[measured], out_of_fold[measured]) | {"folds": settings.folds},
        seconds=round(seconds, 3))
    write_parquet_atomic(out_dir / SAMPLE_FILE, pa.table({
        "doc_id": [e.doc_id for e, _ in examples], "source": [e.source for e, _ in examples],
        "label": [label.removeprefix("__label__") for _, label in examples], "fold": pa.array(folds, pa.int32()),
        "out_of_fold_score": pa.array(out_of_fold, pa.float64(), from_pandas=True)}))
    write_json_atomic(out_dir / CARD_FILE, json.dumps(card.to_dict(), indent=2))
    return card


def cross_validation_metrics(truth: np.ndarray, scores: np.ndarray, threshold: float = 0.5) -> dict:
    """Precision, recall, F1 and accuracy at `threshold`, and ROC AUC (None when a class is missing)."""
    from sklearn.metrics import accuracy_score, precision_recall_fscore_support, roc_auc_score

    out = {"positives": int(truth.sum()), "negatives": int((~truth).sum()), "threshold": threshold}
    if len(truth) == 0:
        return out | {"precision": None, "recall": None, "f1": None, "accuracy": None, "auc": None}
    predicted = scores >= threshold
    precision, recall, f1, _ = precision_recall_fscore_support(truth, predicted, average="binary", zero_division=0)
    both = truth.any() and (~truth).any()
    return out | {"precision": round(float(precision), 4), "recall": round(float(recall), 4),
                  "f1": round(float(f1), 4), "accuracy": round(float(accuracy_score(truth, predicted)), 4),
                  "auc": round(float(roc_auc_score(truth, scores)), 4) if both else None}


class QualityScorer:
    """A trained classifier: `score(texts)` gives P(reference) per text; with `doc_ids`, a document of the
    training sample gets its out-of-fold score instead (the final model has seen it)."""

    def __init__(self, model, max_words: int, out_of_fold: dict[str, float] | None = None):
        self.model, self.max_words, self.out_of_fold = model, max_words, out_of_fold or {}

    @classmethod
    def load(cls, directory: Path) -> QualityScorer:
        import fasttext

        card = ClassifierCard.read(directory)
        path = Path(directory) / MODEL_FILE
        if sha256_file(path) != card.sha256:
            raise ValueError(f"{path} does not match its card's sha256: the model file changed after training; "
                             "re-materialize quality_classifier")
        sample = pq.read_table(Path(directory) / SAMPLE_FILE, columns=["doc_id", "out_of_fold_score"]).to_pylist()
        out_of_fold = {r["doc_id"]: r["out_of_fold_score"] for r in sample if r["out_of_fold_score"] is not None}
        return cls(fasttext.load_model(str(path)), card.settings["max_words"], out_of_fold)

    def score(self, texts: Sequence[str], doc_ids: Sequence[str] | None = None) -> np.ndarray:
        scores = self.score_flat([fasttext_text(t, self.max_words) for t in texts])
        if doc_ids is not None and self.out_of_fold:
            for i, doc_id in enumerate(doc_ids):
                scores[i] = self.out_of_fold.get(doc_id, scores[i])
        return scores

    def score_flat(self, lines: Sequence[str]) -> np.ndarray:
        """P(reference) of texts already flattened by `fasttext_text`."""
        if not lines:
            return np.zeros(0)
        labels, probs = self.model.predict(list(lines), k=2)
        scores = np.array([dict(zip(ls, ps)).get(POSITIVE, 0.0) for ls, ps in zip(labels, probs)], dtype=np.float64)
        return np.clip(scores, 0.0, 1.0)  # fastText's softmax can exceed 1 by a rounding error


def _source_counts(examples: list[tuple[Example, str]]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e, _ in examples:
        counts[e.source] = counts.get(e.source, 0) + 1
    return counts
