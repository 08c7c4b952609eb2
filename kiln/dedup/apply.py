"""Applying the dedup decisions to one source: near-duplicates, boilerplate lines, benchmark overlap.

Every removed document goes to the rejected table with its stage and reason; near-duplicates also
carry the kept document, the cluster and the measured Jaccard. Rewrites (boilerplate lines cut,
benchmark spans redacted) are counted per step like the curation filters' rewrites.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.config import BoilerplateLines, Decontamination
from kiln.common.removals import RejectedText, example_excerpt, rejected_row
from kiln.common.stats import StageStats
from kiln.common.storage import DatasetWriter
from kiln.curation.documents import DOCUMENT_SCHEMA, REJECTED_SCHEMA
from kiln.dedup.boilerplate import strip_boilerplate
from kiln.dedup.decontaminate import BenchmarkIndex, contamination_counts, decontaminate, report_rows, report_table

NEAR_STAGE, BOILERPLATE_STAGE, DECONTAMINATION_STAGE = "near_dedup", "boilerplate_lines", "decontamination"
NEAR_REASON, BOILERPLATE_ONLY = "near_duplicate", "boilerplate_only"


def deduplicate_source(input_parts: list[Path], removed: dict[str, dict[str, Any]], boilerplate: set[int],
                       lines: BoilerplateLines, benchmarks: BenchmarkIndex | None, decon: Decontamination,
                       writer: DatasetWriter, examples_per_reason: int = 3,
                       rejected_text: RejectedText = "none") -> tuple[StageStats, dict[str, Any]]:
    """Write one source's survivors and rejects (their text only as `rejected_text` says: kiln.common.removals); return
    the stage stats and the contamination report."""
    stats = StageStats()
    contamination: list[dict[str, str]] = []
    columns = [f.name for f in DOCUMENT_SCHEMA]
    for path in input_parts:
        kept, rejected = [], []
        for batch in pq.ParquetFile(path).iter_batches(batch_size=1000, columns=columns):
            for row in batch.to_pylist():
                stats.docs_in += 1
                stats.chars_in += len(row["text"])
                verdict = _decide(row, removed, boilerplate, lines, benchmarks, decon, stats, contamination,
                                  examples_per_reason, rejected_text)
                if verdict is None:
                    kept.append(row)
                    stats.docs_out += 1
                    stats.chars_out += len(row["text"])
                    stats.lengths_out.add(len(row["text"]))
                else:
                    rejected.append(verdict)
                    stats.lengths_dropped.add(verdict["chars"])
        writer.write("documents", pa.Table.from_pylist(kept, schema=DOCUMENT_SCHEMA))
        if rejected:
            writer.write("rejected", pa.Table.from_pylist(rejected, schema=REJECTED_SCHEMA))
    if contamination:
        writer.write("contamination", report_table(contamination))
    per_benchmark = contamination_counts(contamination)
    return stats, {"per_benchmark": per_benchmark, "rows": len(contamination),
                   "markdown": contamination_markdown(contamination)}


def _decide(row: dict[str, Any], removed, boilerplate, lines, benchmarks, decon, stats: StageStats,
            contamination: list, examples: int, rejected_text: RejectedText) -> dict[str, Any] | None:
    """None when the document survives (its row possibly rewritten), else its rejected row."""
    original = row["text"]
    near = stats.step(NEAR_STAGE)
    near.docs_in += 1
    near.chars_in += len(original)
    if row["doc_id"] in removed:
        d = removed[row["doc_id"]]
        near.dropped[NEAR_REASON] += 1
        near.chars_dropped[NEAR_REASON] += len(original)
        stats.add_example(NEAR_REASON, row["doc_id"], examples, f"(J={d['jaccard']:.2f} with {d['duplicate_of']})",
                          example_excerpt(original, rejected_text))
        return rejected_row(row, NEAR_STAGE, NEAR_REASON, rejected_text, duplicate_of=d["duplicate_of"],
                            cluster_id=d["cluster_id"], jaccard=d["jaccard"])
    if boilerplate:
        step = stats.step(BOILERPLATE_STAGE)
        step.docs_in += 1
        step.chars_in += len(row["text"])
        text, n_lines = strip_boilerplate(row["text"], boilerplate, lines)
        if not text.strip():
            step.dropped[BOILERPLATE_ONLY] += 1
            step.chars_dropped[BOILERPLATE_ONLY] += len(original)
            stats.add_example(BOILERPLATE_ONLY, row["doc_id"], examples, excerpt=example_excerpt(original, rejected_text))
            return rejected_row(row, BOILERPLATE_STAGE, BOILERPLATE_ONLY, rejected_text, original)
        if n_lines:
            step.counts["lines_removed"] += n_lines
            step.chars_rewritten += len(row["text"]) - len(text)
            row["text"] = text
    if benchmarks is not None:
        step = stats.step(DECONTAMINATION_STAGE)
        step.docs_in += 1
        step.chars_in += len(row["text"])
        outcome = decontaminate(row["text"], benchmarks, decon)
        contamination.extend(report_rows(row["doc_id"], row["source"], outcome))
        if not outcome.kept:
            step.dropped[outcome.reason] += 1
            step.chars_dropped[outcome.reason] += len(original)
            items = ", ".join(sorted({f"{m.benchmark}/{m.item_id}" for m in outcome.matches}))
            stats.add_example(outcome.reason, row["doc_id"], examples, f"({items})",
                              example_excerpt(original, rejected_text))
            return rejected_row(row, DECONTAMINATION_STAGE, outcome.reason, rejected_text, original)
        if outcome.matches:
            step.counts["documents_redacted"] += 1
            step.chars_rewritten += len(row["text"]) - len(outcome.text)
            row["text"] = outcome.text
    return None


def contamination_markdown(rows: list[dict[str, str]], limit: int = 30) -> str:
    """Which benchmark items were found in which documents."""
    if not rows:
        return "no benchmark item found in this source"
    lines = ["| benchmark | item | document | action |", "|---|---|---|---|"]
    for r in rows[:limit]:
        lines.append(f"| {r['benchmark']} | `{r['item_id']}` | `{r['doc_id']}` | {r['action']} |")
    if len(rows) > limit:
        lines.append(f"\n… and {len(rows) - limit} more rows in contamination-*.parquet")
    return "\n".join(lines)
