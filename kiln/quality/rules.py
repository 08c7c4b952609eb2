"""Quality filtering from stored scores: a source's rule turns its score columns into keep / drop-with-reason.

Only the stored columns are read (`quality_score`, `perplexity`), so changing a threshold re-runs this
step alone, never the classifier or the language model. Rules that depend on the whole source
(top fraction, CCNet perplexity buckets) compute their cut-offs from that source's scores, in every refresh so far,
and report them.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.config import QualityRule
from kiln.common.removals import RejectedText, example_excerpt, rejected_row
from kiln.common.stats import StageStats
from kiln.common.storage import DatasetWriter
from kiln.curation.documents import QUALITY_REJECTED_SCHEMA, SCORED_SCHEMA
from kiln.quality.scoring import PERPLEXITY, SCORE
from kiln.tokens.mixture import hash_unit

STAGE, REQUEST_STAGE = "quality", "removal_request"
BELOW_MIN, BOTTOM_FRACTION = "quality_score_below_min", "quality_score_bottom_fraction"
ABOVE_MAX_PERPLEXITY = "perplexity_above_max"
BUCKETS = ("head", "middle", "tail")


class RuleError(ValueError):
    """A source's quality rule cannot be applied to the scores stored for it; the message says what to do."""


@dataclass
class Decision:
    removed: dict[int, str] = field(default_factory=dict)  # row index -> reason (the first rule it fails)
    cutoffs: dict[str, float | list[float] | None] = field(default_factory=dict)  # what the rule resolved to
    buckets: np.ndarray | None = None  # CCNet bucket per row, when perplexities exist

    def keep_mask(self, n: int) -> np.ndarray:
        mask = np.ones(n, dtype=bool)
        mask[list(self.removed)] = False
        return mask


def perplexity_buckets(perplexity: np.ndarray, quantiles: tuple[float, float],
                       population: np.ndarray | None = None) -> tuple[np.ndarray, list[float]]:
    """CCNet's head / middle / tail split at the source's own perplexity quantiles (those of `population`, every
    perplexity of the source, when given; unscored rows: tail)."""
    population = perplexity if population is None else population
    finite = population[np.isfinite(population)]
    if not finite.size:
        return np.full(len(perplexity), "tail", dtype=object), []
    edges = [float(e) for e in np.quantile(finite, quantiles)]
    buckets = np.where(perplexity <= edges[0], "head", np.where(perplexity <= edges[1], "middle", "tail"))
    buckets[~np.isfinite(perplexity)] = "tail"
    return buckets.astype(object), edges


def decide(doc_ids: list[str], scores: np.ndarray, perplexity: np.ndarray, rule: QualityRule | None,
           earlier: tuple[list[str], np.ndarray, np.ndarray] | None = None) -> Decision:
    """Which rows a source's rule removes, and why. Rules apply in a fixed order: min_score,
    keep_top_fraction, max_perplexity, perplexity_buckets; a row gets the reason of the first it fails.

    `earlier`: the same source's doc ids and scores in the refreshes before this one. The rules that depend on the
    whole source (top fraction, perplexity buckets) cut among all of them and these rows, so a document's fate does
    not depend on the refresh it arrived in (a 3-document refresh kept all of a 90% top fraction)."""
    decision = Decision()
    n = len(doc_ids)
    all_ids, all_scores, all_perplexity = (doc_ids, scores, perplexity) if earlier is None else (
        earlier[0] + doc_ids, np.concatenate([earlier[1], scores]), np.concatenate([earlier[2], perplexity]))
    if np.isfinite(perplexity).any() or (rule and rule.uses_perplexity):
        quantiles = rule.bucket_quantiles if rule else QualityRule().bucket_quantiles
        decision.buckets, decision.cutoffs["bucket_edges"] = perplexity_buckets(perplexity, quantiles, all_perplexity)
    if rule is None or n == 0:
        return decision
    # Scores or perplexities all missing: made without the classifier or the reference model (one fitted while
    # off, and not fitted again since). Judged by them, every document would be dropped.
    for used, values, what, fix in (
            (rule.uses_score, scores, "scores", "materialize quality_classifier again if the config enables it now"),
            (rule.uses_perplexity, perplexity, "perplexities", "set quality.perplexity.model")):
        if used and not np.isfinite(values).any():
            raise RuleError(f"this source's quality rule needs {what}, but its quality_scores hold none (made "
                            f"without {'quality_classifier' if what == 'scores' else 'a reference model'}); {fix}, "
                            f"then materialize quality_scores, or remove the rule")

    def drop(mask: np.ndarray, reason: str) -> None:
        for i in np.flatnonzero(mask):
            decision.removed.setdefault(int(i), reason)

    if rule.min_score is not None:
        decision.cutoffs["min_score"] = rule.min_score
        drop(~(scores >= rule.min_score), BELOW_MIN)
    if rule.keep_top_fraction is not None:
        total = len(all_ids)
        keep = math.ceil(round(rule.keep_top_fraction * total, 9))  # 0.07 * 100 is 7.000000000000001 in floats: 7
        # Highest score first (unscored last); equal scores in doc_id-hash order, so every run cuts the same.
        ranked = np.where(np.isfinite(all_scores), all_scores, -np.inf)
        order = sorted(range(total), key=lambda i: (-ranked[i], hash_unit("quality-ties", all_ids[i])))
        bottom = np.zeros(total, dtype=bool)
        bottom[order[keep:]] = True
        decision.cutoffs["top_fraction_min_score"] = float(all_scores[order[keep - 1]]) if keep else None
        drop(bottom[total - n:], BOTTOM_FRACTION)  # these rows are the last n
    if rule.max_perplexity is not None:
        decision.cutoffs["max_perplexity"] = rule.max_perplexity
        drop(~(perplexity <= rule.max_perplexity), ABOVE_MAX_PERPLEXITY)
    if rule.perplexity_buckets is not None:
        decision.cutoffs["keep_buckets"] = list(rule.perplexity_buckets)
        for bucket in BUCKETS:
            if bucket not in rule.perplexity_buckets:
                drop(decision.buckets == bucket, f"perplexity_{bucket}")
    return decision


def threshold_effect(scores: np.ndarray, thresholds=(0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9)) -> list[dict]:
    """What a min_score threshold would keep: the share of documents at or above each threshold."""
    n = max(len(scores), 1)
    return [{"min_score": t, "kept": int((scores >= t).sum()), "kept_share": round(float((scores >= t).sum()) / n, 4)}
            for t in thresholds]


def decile_rows(values: np.ndarray) -> list[tuple[int, int]]:
    """For each decile of `values` (ascending), the row whose value is that decile's median: (decile, row)."""
    finite = np.flatnonzero(np.isfinite(values))
    if not finite.size:
        return []
    order = finite[np.argsort(values[finite], kind="stable")]
    picks = []
    for d in range(10):
        lo, hi = d * len(order) // 10, (d + 1) * len(order) // 10
        if hi > lo:
            picks.append((d + 1, int(order[(lo + hi - 1) // 2])))
    return picks


def filter_parts(parts: Sequence[Path], doc_ids: list[str], decision: Decision, writer: DatasetWriter,
                 examples_per_reason: int = 3, requested: dict[str, str] | None = None,
                 rejected_text: RejectedText = "none") -> StageStats:
    """Write kept documents (with their scores) and rejects (stage `quality`, reason, scores; text only as
    `rejected_text` says: kiln.common.removals) per part.
    `requested` (doc_id -> reason) removes documents by removal request first (stage `removal_request`)."""
    removed = {doc_ids[i]: (STAGE, reason) for i, reason in decision.removed.items()}
    removed |= {doc_id: (REQUEST_STAGE, reason) for doc_id, reason in (requested or {}).items()}
    stats = StageStats()
    steps = ([stats.step(REQUEST_STAGE)] if requested else []) + [stats.step(STAGE)]  # in the order they apply
    for path in parts:
        kept, rejected = [], []
        for row in pq.read_table(path).to_pylist():
            n = len(row["text"])
            stats.docs_in += 1
            stats.chars_in += n
            stage, reason = removed.get(row["doc_id"], (None, None))
            for step in steps:  # a step sees the documents the steps before it kept
                step.docs_in += 1
                step.chars_in += n
                if step is stats.steps.get(stage):
                    break
            if reason is None:
                kept.append(row)
                stats.docs_out += 1
                stats.chars_out += n
                stats.lengths_out.add(n)
            else:
                kept_text = "none" if stage == REQUEST_STAGE else rejected_text  # a takedown keeps none of the text
                rejected.append(rejected_row(row, stage, reason, kept_text, **{SCORE: row[SCORE],
                                                                               PERPLEXITY: row[PERPLEXITY]}))
                step = stats.steps[stage]
                step.dropped[reason] += 1
                step.chars_dropped[reason] += n
                stats.lengths_dropped.add(n)
                stats.add_example(reason, row["doc_id"], examples_per_reason,
                                  f"(score={_fmt(row[SCORE])}, perplexity={_fmt(row[PERPLEXITY])})",
                                  example_excerpt(row["text"], kept_text))
        writer.write("documents", pa.Table.from_pylist(kept, schema=SCORED_SCHEMA))
        if rejected:
            writer.write("rejected", pa.Table.from_pylist(rejected, schema=QUALITY_REJECTED_SCHEMA))
    return stats


def _fmt(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.3g}"
