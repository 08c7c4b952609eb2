"""Applying the dedup decisions to one source: near-duplicates, boilerplate lines, benchmark overlap.

Every removed document goes to the rejected table with its stage and reason; near-duplicates also
carry the kept document, the cluster and the measured Jaccard. Rewrites (boilerplate lines cut,
benchmark spans redacted) are counted per step like the curation filters' rewrites.

One engine task per input part: it reads its part and only the decision rows of that part's documents, so no
process holds a source's (or a refresh's) decisions. Those rows are found without an index: signature part k is a
run of consecutive curated parts (`signing.signature_groups`) and `decisions-k` holds exactly its documents
(`buckets.decide_distributed`), so the row counts of the parts and of the signature parts, which the manifests
record, name each part's decisions file (`decisions_by_part`); the task checks that the file decided every one of
its documents.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.config import BoilerplateLines, Decontamination
from kiln.common.removals import RejectedText, example_excerpt, rejected_row
from kiln.common.stats import StageStats
from kiln.common.storage import DatasetWriter, write_parquet_atomic
from kiln.curation.documents import DOCUMENT_SCHEMA, REJECTED_SCHEMA
from kiln.dedup.boilerplate import strip_boilerplate
from kiln.dedup.decontaminate import (
    BenchmarkIndex,
    contamination_counts,
    decontaminate,
    load_benchmarks,
    report_rows,
    report_table,
)
from kiln.dedup.near import NEAR_DUPLICATE
from kiln.engine import SERIAL, Engine

NEAR_STAGE, BOILERPLATE_STAGE, DECONTAMINATION_STAGE = "near_dedup", "boilerplate_lines", "decontamination"
NEAR_REASON, BOILERPLATE_ONLY = "near_duplicate", "boilerplate_only"
_DECISION_COLUMNS = ["doc_id", "status", "cluster_id", "duplicate_of", "jaccard"]


class DecisionsMismatch(ValueError):
    """The near-dup decisions do not cover the documents being deduplicated: the index is older than them."""


def decisions_by_part(part_rows: list[int], signature_rows: list[int], decision_files: list[Path],
                      decision_rows: list[int], where: str) -> list[Path | None]:
    """The decisions file of each input part (None for an empty part): signature part k groups consecutive input
    parts (`signing.signature_groups`) and `decision_files[k]` decides exactly its documents. `where` names the
    datasets in an error."""
    if len(signature_rows) != len(decision_files) or list(signature_rows) != list(decision_rows):
        raise DecisionsMismatch(f"{where}: the decisions files ({len(decision_files)}, rows {list(decision_rows)[:5]}…) "
                                f"do not match the signature parts ({len(signature_rows)}, rows "
                                f"{list(signature_rows)[:5]}…); re-materialize dedup_index for this refresh")
    out: list[Path | None] = []
    k, group_end, start = -1, 0, 0
    for rows in part_rows:
        while rows and start >= group_end and k + 1 < len(signature_rows):  # the signature part holding `start`
            k += 1
            group_end += signature_rows[k]
        if rows and not (start < group_end and start + rows <= group_end):
            raise DecisionsMismatch(f"{where}: input rows {start}..{start + rows} do not lie in one signature part "
                                    f"(the signatures are of other documents than these); re-materialize "
                                    f"minhash_signatures and dedup_index")
        out.append(decision_files[k] if rows else None)
        start += rows
    if start != sum(signature_rows):
        raise DecisionsMismatch(f"{where}: {start} input documents, {sum(signature_rows)} signed; re-materialize "
                                f"minhash_signatures and dedup_index")
    return out


@dataclass(frozen=True)
class _ApplyTask:
    input_path: str
    decisions_path: str | None  # None: an empty part
    kept_path: str
    rejected_path: str  # in the staging scratch: the driver names the rejected parts in part order
    contamination_path: str  # in the staging scratch
    boilerplate: tuple[str, ...]  # the index's `lines` files: read once per worker
    lines: str  # BoilerplateLines as JSON
    decon: str | None  # Decontamination as JSON (benchmark paths absolute) when benchmarks are checked
    benchmark_files: str  # the benchmark files' sizes and modification times: a file edited since is read again
    examples_per_reason: int
    rejected_text: RejectedText


@lru_cache(maxsize=2)
def _boilerplate(files: tuple[str, ...]) -> frozenset[int]:
    return frozenset(h for f in files for h in pq.read_table(f, columns=["line_hash"]).column(0).to_pylist())


@lru_cache(maxsize=2)
def _benchmarks(decon: str, files: str) -> BenchmarkIndex:  # built once per worker, not pickled into every task
    return load_benchmarks(Decontamination.model_validate_json(decon))


def _file_states(paths: list[str]) -> str:
    """Each file's size and modification time (a missing one: load_benchmarks names it)."""
    def state(path: str) -> str:
        try:
            st = os.stat(path)
        except OSError:
            return "missing"
        return f"{st.st_size}:{st.st_mtime_ns}"
    return ";".join(state(p) for p in paths)


def part_removals(decisions_path: str | None, doc_ids: pa.ChunkedArray | pa.Array) -> dict[str, dict[str, Any]]:
    """The near-duplicate decisions of one part's documents (doc_id -> decision row), read from its decisions file
    alone; raises when the file does not decide every one of them."""
    if decisions_path is None:
        if len(doc_ids):
            raise DecisionsMismatch(f"{len(doc_ids)} documents without a decisions file; re-materialize dedup_index")
        return {}
    table = pq.read_table(decisions_path, columns=_DECISION_COLUMNS)
    decided = pc.is_in(doc_ids, value_set=table.column("doc_id"))
    if not pc.all(decided).as_py() and len(doc_ids):
        missing = pc.filter(doc_ids, pc.invert(decided))
        raise DecisionsMismatch(f"{decisions_path}: no decision for {len(missing)} of the part's documents (e.g. "
                                f"{missing[0]}); the index is older than the documents: re-materialize dedup_index")
    near = table.filter(pc.and_(pc.equal(table.column("status"), NEAR_DUPLICATE),
                                pc.is_in(table.column("doc_id"), value_set=doc_ids)))
    return {r["doc_id"]: r for r in near.to_pylist()}


def _apply(task: _ApplyTask) -> StageStats:
    lines = BoilerplateLines.model_validate_json(task.lines)
    boilerplate = _boilerplate(task.boilerplate) if task.boilerplate else frozenset()
    benchmarks = _benchmarks(task.decon, task.benchmark_files) if task.decon else None
    decon = Decontamination.model_validate_json(task.decon) if task.decon else None
    source = pq.ParquetFile(task.input_path)
    removed = part_removals(task.decisions_path, source.read(columns=["doc_id"]).column("doc_id"))
    stats = StageStats()
    contamination: list[dict[str, str]] = []
    kept, rejected = [], []
    for batch in source.iter_batches(batch_size=1000, columns=[f.name for f in DOCUMENT_SCHEMA]):
        for row in batch.to_pylist():
            stats.docs_in += 1
            stats.chars_in += len(row["text"])
            verdict = _decide(row, removed, boilerplate, lines, benchmarks, decon, stats, contamination,
                              task.examples_per_reason, task.rejected_text)
            if verdict is None:
                kept.append(row)
                stats.docs_out += 1
                stats.chars_out += len(row["text"])
                stats.lengths_out.add(len(row["text"]))
            else:
                rejected.append(verdict)
                stats.lengths_dropped.add(verdict["chars"])
    write_parquet_atomic(Path(task.kept_path), pa.Table.from_pylist(kept, schema=DOCUMENT_SCHEMA))
    if rejected:
        write_parquet_atomic(Path(task.rejected_path), pa.Table.from_pylist(rejected, schema=REJECTED_SCHEMA))
    if contamination:
        write_parquet_atomic(Path(task.contamination_path), report_table(contamination))
    return stats


def deduplicate_source(input_parts: list[Path], decisions: list[Path | None], boilerplate: list[Path],
                       lines: BoilerplateLines, decon: Decontamination, writer: DatasetWriter, engine: Engine = SERIAL,
                       examples_per_reason: int = 3, rejected_text: RejectedText = "none", progress: bool = True,
                       label: str = "dedup apply") -> tuple[StageStats, dict[str, Any]]:
    """Write one source's survivors and rejects (their text only as `rejected_text` says: kiln.common.removals), one
    engine task per input part; return the stage stats and the contamination report.

    `decisions`: each part's decisions file (`decisions_by_part`); `boilerplate`: the files of the boilerplate line
    hashes (`lines` enabled); benchmarks are checked as `decon` declares them. The parts written are the ones one
    process writing them in order would write: documents-i per input part i, rejected parts numbered in part order
    over the parts that reject something, one contamination table."""
    if len(decisions) != len(input_parts):
        raise ValueError(f"{len(input_parts)} input parts, {len(decisions)} decisions files")
    checked = decon.enabled and bool(decon.benchmarks)
    # Absolute paths: a worker need not share the driver's working directory.
    paths = [str(Path(b.path).resolve()) for b in decon.benchmarks]
    frozen_decon = decon.model_copy(update={"benchmarks": [
        b.model_copy(update={"path": p}) for b, p in zip(decon.benchmarks, paths)]}).model_dump_json() \
        if checked else None
    files = _file_states(paths) if checked else ""
    scratch = writer.scratch("apply")
    tasks = [_ApplyTask(str(p), str(d) if d is not None else None, str(writer.next_path("documents")),
                        str(scratch / f"rejected-{i:06d}.parquet"), str(scratch / f"contamination-{i:06d}.parquet"),
                        tuple(map(str, boilerplate)) if lines.enabled else (), lines.model_dump_json(), frozen_decon,
                        files, examples_per_reason, rejected_text)
             for i, (p, d) in enumerate(zip(input_parts, decisions))]
    stats = StageStats()
    for part in engine.map_parts(_apply, tasks, desc=label, progress=progress,
                                 size=lambda t: os.path.getsize(t.input_path)):
        stats.merge(part, examples_per_reason)
    contamination: list[dict[str, str]] = []
    for t in tasks:  # part order, whatever order the tasks ran in
        if Path(t.rejected_path).is_file():
            os.replace(t.rejected_path, writer.next_path("rejected"))
        if Path(t.contamination_path).is_file():  # a row per benchmark item found: few, unlike documents
            contamination.extend(pq.read_table(t.contamination_path).to_pylist())
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
