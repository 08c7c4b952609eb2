"""Curation: reading a source into documents, running its filter profile, and exact deduplication.

Dagster-free, writing through a `DatasetWriter`:
- `ingest`: source files → document parts + quarantine (unreadable records, with reasons);
- `filter_documents`: each document part through normalize → the source's profile → PII redaction, one engine
  task per part; every drop goes to the rejected table with its reason; kept documents carry the
  `content_hash` that exact deduplication (`kiln.dedup.exact`) compares.
"""

from __future__ import annotations

import hashlib
import json
import os
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from kiln.config import ExactDedup, ProjectConfig, Reading, Source, StepSpec
from kiln.documents import CURATED_SCHEMA, DOCUMENT_SCHEMA, QUARANTINE_SCHEMA, REJECTED_SCHEMA, Document
from kiln.filters.base import Step
from kiln.filters.registry import build_step
from kiln.engine import SERIAL, Engine
from kiln.readers import Quarantined, SourceFile, read_source
from kiln.stats import StageStats
from kiln.storage import DatasetWriter, resume_part, write_parquet_atomic

FILTER_STAGE = "filter"


# ---------------------------------------------------------------------------------------------- ingest

def ingest(source: Source, reading: Reading, writer: DatasetWriter, progress: bool = True,
           examples_per_reason: int = 3, files: list[SourceFile] | None = None, namespace: str = "") -> StageStats:
    """Read a source (or, for a later refresh, its landed `files`: see `read_source`) into document parts of
    `reading.rows_per_part` rows; quarantine what is unreadable."""
    stats = StageStats()
    step = stats.step("read")
    rows, quarantined, seen_ids = [], [], set()
    for record in tqdm(read_source(source, reading, files, namespace), desc=f"read {source.name}", unit="doc", disable=not progress,
                       mininterval=2):
        stats.docs_in += 1
        if isinstance(record, Document) and record.doc_id in seen_ids:
            record = Quarantined(source.name, record.meta.get("locator", record.doc_id), "duplicate_doc_id",
                                 record.text[:200])
        if isinstance(record, Quarantined):
            quarantined.append(record.to_row())
            step.dropped[record.reason] += 1
            stats.add_example(f"read.{record.reason}", record.locator, record.excerpt or "", examples_per_reason)
            continue
        seen_ids.add(record.doc_id)
        rows.append(record.to_row())
        stats.docs_out += 1
        stats.chars_out += len(record.text)
        stats.lengths_out.add(len(record.text))
        if len(rows) >= reading.rows_per_part:
            writer.write("documents", pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA))
            rows = []
    if rows:
        writer.write("documents", pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA))
    if quarantined:
        writer.write("quarantine", pa.Table.from_pylist(quarantined, schema=QUARANTINE_SCHEMA))
    stats.chars_in = stats.chars_out
    step.docs_in = stats.docs_in
    return stats


# ----------------------------------------------------------------------------------------------- filter

def profile_steps(config: ProjectConfig, source: str) -> list[StepSpec]:
    """normalize first, the source's profile, PII redaction last: what `filter_documents` runs."""
    return [StepSpec(step="normalize", params=config.curation.normalize), *config.profile_for(source),
            StepSpec(step="pii", params=config.curation.pii)]


@dataclass(frozen=True)
class _PartTask:
    input_path: str
    kept_path: str
    rejected_path: str
    steps: tuple[tuple[str, str], ...]  # (step name, params as JSON): each worker builds its pipeline once
    dedup: tuple[bool, bool]
    examples_per_reason: int


@lru_cache(maxsize=8)
def _pipeline(steps: tuple[tuple[str, str], ...]) -> list[Step]:
    """Steps built once per worker process; params travel as JSON (hashable, picklable, exact)."""
    return [build_step(name, json.loads(params)) for name, params in steps]


def run_steps(docs: list[Document], steps: list[Step], stats: StageStats, examples: int) -> list[str | None]:
    """Run a batch of documents through the steps, step by step, rewriting their texts in place; return each
    one's drop reason, or None. A step with a batch form (`step.batch(docs)`) gets every surviving document at
    once, so it can screen them with one vectorized pass; others are called per document."""
    reasons: list[str | None] = [None] * len(docs)
    alive = list(range(len(docs)))
    for step in steps:
        s = stats.step(step.name)
        batch = [docs[i] for i in alive]
        s.docs_in += len(batch)
        s.chars_in += sum(len(doc.text) for doc in batch)
        t0 = time.perf_counter()
        batch_form = getattr(step, "batch", None)
        verdicts = batch_form(batch) if batch_form is not None else [step(doc) for doc in batch]
        s.seconds += time.perf_counter() - t0
        survivors = []
        for i, doc, verdict in zip(alive, batch, verdicts):
            if not verdict.kept:
                s.dropped[verdict.drop] += 1
                s.chars_dropped[verdict.drop] += len(doc.text)
                stats.add_example(verdict.drop, doc.doc_id, doc.text, examples)
                reasons[i] = verdict.drop
                continue
            s.chars_rewritten += max(0, len(doc.text) - len(verdict.text))
            s.counts.update(verdict.counts)
            doc.text = verdict.text
            survivors.append(i)
        alive = survivors
    return reasons


def content_hash(text: str, lowercase: bool = True, collapse_whitespace: bool = True) -> str:
    """Hash of the text as exact dedup compares it (case and whitespace folded as configured)."""
    if lowercase:
        text = text.lower()
    if collapse_whitespace:
        text = " ".join(text.split())
    return hashlib.blake2b(text.encode("utf-8", errors="surrogatepass"), digest_size=16).hexdigest()


def _filter_part(task: _PartTask) -> StageStats:
    return StageStats.from_dict(resume_part(task.kept_path, lambda: _filter(task).to_dict(with_lengths=True)))


def _filter(task: _PartTask) -> StageStats:
    steps = _pipeline(task.steps)
    stats = StageStats()
    kept, rejected = [], []
    for batch in pq.ParquetFile(task.input_path).iter_batches(batch_size=1000):
        docs = [Document.from_row(row) for row in batch.to_pylist()]
        originals = [doc.text for doc in docs]
        reasons = run_steps(docs, steps, stats, task.examples_per_reason)
        for doc, original, reason in zip(docs, originals, reasons):
            stats.docs_in += 1
            stats.chars_in += len(original)
            if reason is None:
                kept.append({**doc.to_row(), "content_hash": content_hash(doc.text, *task.dedup)})
                stats.docs_out += 1
                stats.chars_out += len(doc.text)
                stats.lengths_out.add(len(doc.text))
            else:
                # The rejected table keeps the document as it came in, so a reviewer sees what was removed.
                rejected.append({**doc.to_row(), "text": original, "stage": FILTER_STAGE, "reason": reason,
                                 "duplicate_of": None})
                stats.lengths_dropped.add(len(original))
    write_parquet_atomic(Path(task.kept_path), pa.Table.from_pylist(kept, schema=CURATED_SCHEMA))
    if rejected:
        write_parquet_atomic(Path(task.rejected_path), pa.Table.from_pylist(rejected, schema=REJECTED_SCHEMA))
    return stats


def filter_documents(input_parts: list[Path], steps: list[StepSpec], dedup: ExactDedup, writer: DatasetWriter,
                     engine: Engine = SERIAL, examples_per_reason: int = 3, progress: bool = True,
                     label: str = "filter") -> StageStats:
    """Run every part through the steps on `engine`; parts are the unit of parallelism (one task each)."""
    frozen = tuple((s.step, json.dumps(s.params, sort_keys=True)) for s in steps)
    tasks = [_PartTask(str(p), str(writer.next_path("documents")), str(writer.next_path("rejected")), frozen,
                       (dedup.lowercase, dedup.collapse_whitespace), examples_per_reason) for p in input_parts]
    total = StageStats()
    for r in engine.map_parts(_filter_part, tasks, desc=label, progress=progress,
                              size=lambda t: os.path.getsize(t.input_path)):
        total.merge(r, examples_per_reason)
    return total
