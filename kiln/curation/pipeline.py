"""Curation: reading a source into documents, running its filter profile, and exact deduplication.

Dagster-free, writing through a `DatasetWriter`:
- `ingest`: source files → document parts + quarantine (unreadable records, with reasons, hashes and PII-redacted
  excerpts);
- `filter_documents`: each document part through normalize → the source's profile → PII redaction (of the text,
  then of `url` and `meta`: kiln.curation.pii.fields), one engine task per part; every drop goes to the rejected
  table with its reason; kept documents carry the `content_hash` that exact deduplication
  (`kiln.curation.exact_dedup`) compares, and every document read, kept or removed, leaves its text's hash as it
  came in, bucketed by hash (`kiln.curation.intake_hashes`: what `kiln audit membership` searches by text instead
  of hashing every raw text).
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
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.config import ExactDedup, ProjectConfig, Reading, Source, StepSpec
from kiln.common.manifest import sha256_file
from kiln.common.removals import RejectedText, example_excerpt, kept_text, rejected_row
from kiln.common.stats import StageStats
from kiln.common.storage import DatasetWriter, part_name, resume_part, write_parquet_atomic
from kiln.curation.documents import (CURATED_SCHEMA, DOCUMENT_SCHEMA, INTAKE_HASH_SCHEMA, QUARANTINE_SCHEMA,
                                     REJECTED_SCHEMA, Document)
from kiln.curation.exact_dedup import DuplicateRows, HashSource, duplicates_in, find_duplicates
from kiln.curation.filters.base import Step
from kiln.curation.filters.normalize import UnicodeNormalize
from kiln.curation.filters.registry import STEPS, build_step, unwrapped
from kiln.curation.intake_hashes import bucket_rows, part_rows_path
from kiln.curation.pii.fields import redact_fields, step_redactor
from kiln.curation.pii.redaction import PiiRedaction
from kiln.curation.readers import Quarantined, SourceFile, one_document_per_file, quarantine, read_source
from kiln.curation.readers.paths import expand
from kiln.engine import SERIAL, Engine

FILTER_STAGE = "filter"


# ---------------------------------------------------------------------------------------------- ingest

DUPLICATE_DOC_ID = "duplicate_doc_id"


@dataclass(frozen=True)
class _ReadTask:
    source: str  # Source as JSON
    reading: str  # Reading as JSON
    files: tuple[SourceFile, ...] | None  # None: what the source itself names (a builtin corpus, its path)
    namespace: str
    unit: int
    out_dir: str
    examples_per_reason: int
    rejected_text: RejectedText


@dataclass(frozen=True)
class _FirstIdTask:
    input_path: str
    duplicates: DuplicateRows
    kept_path: str
    quarantine_path: str
    source: str
    examples_per_reason: int
    rejected_text: RejectedText


def _unit_part(out_dir: str, role: str, unit: int, index: int | None = None) -> Path:
    tail = "" if index is None else f"-{index:05d}"
    return Path(out_dir) / part_name(role, unit, f"{tail}.parquet")


def _quarantine_example(stats: StageStats, record: Quarantined, limit: int, policy: RejectedText) -> None:
    """A quarantined record as a removal example in the metadata (Dagster's event log, outside the raw layer's
    access control): its locator redacted (a native id may be an e-mail address), its redacted excerpt only where
    removed documents may show one (`curation.keep_rejected_text`)."""
    stats.add_example(f"read.{record.reason}", kept_text(record.locator, "full"), limit,
                      excerpt=None if policy == "none" else record.excerpt)


def _read_unit(task: _ReadTask) -> dict:
    return resume_part(Path(task.out_dir) / f"read-{task.unit:05d}", lambda: _read(task))


def _read(task: _ReadTask) -> dict:
    source, reading = Source.model_validate_json(task.source), Reading.model_validate_json(task.reading)
    files = None if task.files is None else list(task.files)
    stats = StageStats()
    step = stats.step("read")
    rows, quarantined, parts = [], [], 0

    def flush() -> None:
        nonlocal rows, parts
        write_parquet_atomic(_unit_part(task.out_dir, "documents", task.unit, parts),
                             pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA))
        rows, parts = [], parts + 1

    for record in read_source(source, reading, files, task.namespace):
        stats.docs_in += 1
        if isinstance(record, Quarantined):
            quarantined.append(record.to_row())
            step.dropped[record.reason] += 1
            _quarantine_example(stats, record, task.examples_per_reason, task.rejected_text)
            continue
        rows.append(record.to_row())  # the first-id pass counts what it keeps
        if len(rows) >= reading.rows_per_part:
            flush()
    if rows:
        flush()
    if quarantined:
        write_parquet_atomic(_unit_part(task.out_dir, "quarantine", task.unit),
                             pa.Table.from_pylist(quarantined, schema=QUARANTINE_SCHEMA))
    return {"parts": parts, "stats": stats.to_dict(with_lengths=True)}


def _keep_first_ids(task: _FirstIdTask) -> StageStats:
    return StageStats.from_dict(resume_part(task.kept_path, lambda: _first_ids(task).to_dict(with_lengths=True)))


def _first_ids(task: _FirstIdTask) -> StageStats:
    """A read part without the rows whose doc id an earlier row (in file order) already has: those go to quarantine."""
    table = pq.read_table(task.input_path)
    ids = table.column("doc_id").to_pylist()
    repeated = duplicates_in(task.duplicates, ids, ids)
    is_repeat = pa.array([row in repeated for row in range(table.num_rows)], pa.bool_())
    kept = table.filter(pc.invert(is_repeat))
    if kept.num_rows:  # a part of nothing but repeats leaves no empty part behind
        write_parquet_atomic(Path(task.kept_path), kept)
    stats = StageStats()
    lengths = pc.utf8_length(kept.column("text")).to_pylist()
    stats.docs_out, stats.chars_out = kept.num_rows, sum(lengths)
    stats.lengths_out.extend(lengths)
    if repeated:
        docs = [Document.from_row(r) for r in table.filter(is_repeat).to_pylist()]
        quarantined = [quarantine(task.source, d.meta.get("locator", d.doc_id), DUPLICATE_DOC_ID, d.text) for d in docs]
        write_parquet_atomic(Path(task.quarantine_path),
                             pa.Table.from_pylist([q.to_row() for q in quarantined], schema=QUARANTINE_SCHEMA))
        stats.step("read").dropped[DUPLICATE_DOC_ID] += len(quarantined)
        for q in quarantined:
            _quarantine_example(stats, q, task.examples_per_reason, task.rejected_text)
    return stats


def _read_units(source: Source, files: list[SourceFile], files_per_unit: int) -> list[tuple[SourceFile, ...]]:
    """Files in order, one per unit, except runs of one-document files (text, html): `files_per_unit` per unit."""
    units: list[tuple[SourceFile, ...]] = []
    run: list[SourceFile] = []
    for f in files:
        if one_document_per_file(source, f):
            run.append(f)
            if len(run) == files_per_unit:
                units.append(tuple(run))
                run = []
            continue
        if run:
            units.append(tuple(run))
            run = []
        units.append((f,))
    if run:
        units.append(tuple(run))
    return units


def ingest(source: Source, reading: Reading, writer: DatasetWriter, engine: Engine = SERIAL, progress: bool = True,
           examples_per_reason: int = 3, files: list[SourceFile] | None = None, namespace: str = "",
           rejected_text: RejectedText = "none") -> StageStats:
    """Read a source (or, for a later refresh, its landed `files`: see `read_source`) into document parts of
    `reading.rows_per_part` rows; quarantine what is unreadable, and every repeat of a doc id (the first in file
    order stays).

    One engine task per file, writing parts named by (task, part); a doc id repeated anywhere is then found by the
    exact-dedup shuffle on doc ids, never by one process holding every id. Files of one document (`text`, `html`)
    go `reading.rows_per_part` consecutive files to a task: a site of 100,000 pages is 200 tasks and parts at 500,
    not 100,000 tiny ones. A builtin corpus, and a source capped by `max_documents` (the cap counts across its
    files in order), are read by one task; a single task's ids go through the shuffle too (a set of them in the
    task grew with the file, about 110 B a record), so a part's repeats are dropped after it was cut.

    A quarantined record keeps a PII-redacted excerpt and its hash (`quarantine`); its removal example shows an
    excerpt only as `rejected_text` allows (kiln.common.removals)."""
    if files is None and source.kind != "builtin":
        files = expand(source.path) or None  # none matched: read_source quarantines the pattern
    units: list[tuple[SourceFile, ...] | None]
    if files is None or source.max_documents is not None or len(files) <= 1:
        units = [None if files is None else tuple(files)]
    else:
        units = _read_units(source, files, reading.rows_per_part)
    out_dir = writer.scratch("read")
    tasks = [_ReadTask(source.model_dump_json(), reading.model_dump_json(), unit, namespace, i, str(out_dir),
                       examples_per_reason, rejected_text) for i, unit in enumerate(units)]
    stats = StageStats()
    read = engine.map_parts(_read_unit, tasks, desc=f"read {source.name}", progress=progress)
    for r in read:
        stats.merge(StageStats.from_dict(r["stats"]), examples_per_reason)
    parts = [(u, j) for u, r in enumerate(read) for j in range(r["parts"])]
    paths = [str(_unit_part(str(out_dir), "documents", u, j)) for u, j in parts]
    scratch = writer.scratch("doc-ids")
    (where,) = find_duplicates([HashSource(source.name, 1, tuple(paths))], scratch, engine, key="doc_id",
                               progress=progress, label=f"read {source.name}: doc ids")
    first_ids = [_FirstIdTask(path, where[k], str(_unit_part(str(writer.dir), "documents", u, j)),
                              str(_unit_part(str(writer.dir), "quarantine", u, j)), source.name,
                              examples_per_reason, rejected_text)
                 for k, (path, (u, j)) in enumerate(zip(paths, parts))]
    for kept in engine.map_parts(_keep_first_ids, first_ids, desc=f"read {source.name}: first ids",
                                 progress=progress):
        stats.merge(kept, examples_per_reason)
    for part in Path(out_dir).glob("quarantine-*.parquet"):  # read-time quarantine, published as read
        part.replace(Path(writer.dir) / part.name)
    step = stats.step("read")
    stats.chars_in = stats.chars_out
    step.docs_in = stats.docs_in
    return stats


# ----------------------------------------------------------------------------------------------- filter

def profile_steps(config: ProjectConfig, source: str) -> list[StepSpec]:
    """normalize first, the source's profile, PII redaction last: what `filter_documents` runs."""
    return [StepSpec(step="normalize", params=config.curation.normalize), *config.profile_for(source),
            StepSpec(step="pii", params=config.curation.pii)]


def list_file_digests(specs: list[StepSpec]) -> dict[str, str]:
    """The sha256 of each word or domain list a user's path names in the steps (`url_blocklist.domains_file`,
    `badwords.words_file`, per language too): the list decides as much as the parameters, so editing it changes what
    a run records and resumes by. Kiln's built-in lists are in the asset's code version."""
    digests = {}
    for spec in specs:
        for field in getattr(STEPS.get(spec.step), "list_files", ()):
            for params in (spec.params, *spec.per_language.values()):
                if isinstance(path := params.get(field), str):
                    digests[path] = sha256_file(Path(path))
    return dict(sorted(digests.items()))


@dataclass(frozen=True)
class _PartTask:
    input_path: str
    kept_path: str
    rejected_path: str
    hashes_path: str
    steps: tuple[tuple[str, str, str], ...]  # (step name, params, per_language as JSON): built once per worker
    dedup: tuple[bool, bool]
    examples_per_reason: int
    rejected_text: RejectedText


def build_steps(specs: list[StepSpec]) -> list[Step]:
    """The steps of a profile as `filter_documents` runs them (per language where they have settings per language:
    kiln.curation.filters.registry)."""
    return [build_step(s.step, s.params, s.per_language) for s in specs]


@lru_cache(maxsize=8)
def _pipeline(steps: tuple[tuple[str, str, str], ...]) -> list[Step]:
    """Steps built once per worker process; params travel as JSON (hashable, picklable, exact)."""
    return [build_step(name, json.loads(params), json.loads(per_language)) for name, params, per_language in steps]


def run_steps(docs: list[Document], steps: list[Step], stats: StageStats, examples: int,
              rejected_text: RejectedText = "none") -> list[str | None]:
    """Run a batch of documents through the steps, step by step, rewriting their texts in place; return each
    one's drop reason, or None (a removal example shows an excerpt only as `rejected_text` allows). A step with a batch form (`step.batch(docs)`) gets every surviving document at
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
                stats.add_example(verdict.drop, doc.doc_id, examples, excerpt=example_excerpt(doc.text, rejected_text))
                reasons[i] = verdict.drop
                continue
            s.chars_rewritten += max(0, len(doc.text) - len(verdict.text))
            s.counts.update(verdict.counts)
            doc.text = verdict.text
            survivors.append(i)
        alive = survivors
    return reasons


# Unicode's bidi controls (Bidi_Control: the Arabic letter mark, left-to-right and right-to-left marks, embeddings,
# overrides and isolates): invisible, they only steer the display direction, and editors, CMSs and copy-paste add or
# drop them (an RLM after each parenthesis or comma of an Arabic or Hebrew page), so copies differing only in them
# are the same text. Left out of the exact-dedup key, never out of the stored text; letters are never folded (Persian
# ی/ک and Arabic ي/ك are different letters).
_BIDI_CONTROLS = dict.fromkeys(map(ord, "\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069"))


def content_hash(text: str, lowercase: bool = True, collapse_whitespace: bool = True) -> str:
    """Hash of the text as exact dedup compares it (bidi controls left out; case and whitespace folded as
    configured)."""
    if not text.isascii():
        text = text.translate(_BIDI_CONTROLS)
    if lowercase:
        text = text.lower()
    if collapse_whitespace:
        text = " ".join(text.split())
    return hashlib.blake2b(text.encode("utf-8", errors="surrogatepass"), digest_size=16).hexdigest()


def _filter_part(task: _PartTask) -> StageStats:
    return StageStats.from_dict(resume_part(task.kept_path, lambda: _filter(task).to_dict(with_lengths=True)))


def _filter(task: _PartTask) -> StageStats:
    steps = _pipeline(task.steps)
    # url and meta pass the pii step's redaction too (the default one if a caller's steps have none), after the
    # steps: the URL blocklist decides on the URL as it was read.
    redact_texts = step_redactor(next((s for s in map(unwrapped, steps) if isinstance(s, PiiRedaction)), None)
                                 or PiiRedaction())
    stats = StageStats()
    kept, rejected, hashes = [], [], []
    for batch in pq.ParquetFile(task.input_path).iter_batches(batch_size=1000):
        docs = [Document.from_row(row) for row in batch.to_pylist()]
        originals = [doc.text for doc in docs]
        reasons, normalized = _run_noting_normalized(docs, steps, stats, task.examples_per_reason, task.rejected_text)
        # kept and rejected rows alike; their placeholders count with the text's, as the pii step's
        stats.step("pii").counts.update(redact_fields(docs, redact_texts))
        for doc, original, as_read, reason in zip(docs, originals, normalized, reasons):
            stats.docs_in += 1
            intake_hash = content_hash(as_read, *task.dedup)
            hashes.append({"doc_id": doc.doc_id, "content_hash": intake_hash})
            stats.chars_in += len(original)
            # Per identified language: the documents that reached the language step, and those kept.
            language = doc.identified_language
            if language is not None:
                stats.languages_in[language] += 1
                stats.languages_out[language] += reason is None
            if reason is None:
                curated = intake_hash if doc.text == as_read else content_hash(doc.text, *task.dedup)
                if curated != intake_hash:  # a filter rewrote it: found by its text as written too
                    hashes.append({"doc_id": doc.doc_id, "content_hash": curated})
                kept.append({**doc.to_row(), "content_hash": curated})
                stats.docs_out += 1
                stats.chars_out += len(doc.text)
                stats.lengths_out.add(len(doc.text))
            else:
                rejected.append(rejected_row(doc.to_row(), FILTER_STAGE, reason, task.rejected_text, original))
                stats.lengths_dropped.add(len(original))
    write_parquet_atomic(Path(task.kept_path), pa.Table.from_pylist(kept, schema=CURATED_SCHEMA))
    if rejected:
        write_parquet_atomic(Path(task.rejected_path), pa.Table.from_pylist(rejected, schema=REJECTED_SCHEMA))
    write_parquet_atomic(Path(task.hashes_path), pa.Table.from_pylist(hashes, schema=INTAKE_HASH_SCHEMA))
    return stats


def _run_noting_normalized(docs: list[Document], steps: list[Step], stats: StageStats, examples: int,
                           rejected_text: RejectedText) -> tuple[list[str | None], list[str]]:
    """`run_steps`, and each document's text as read after the `normalize` step alone (what its intake hash is
    of). Where that step runs first, its own output is kept, so no text is normalized twice; built per language, it
    may write another text than the membership question goes through, so it is then run again on its own."""
    normalizer = next((s for s in map(unwrapped, steps) if isinstance(s, UnicodeNormalize)), None)
    if normalizer is None or steps[0] is not normalizer:
        normalized = [normalizer.normalized(doc.text) if normalizer is not None else doc.text for doc in docs]
        return run_steps(docs, steps, stats, examples, rejected_text), normalized
    reasons = run_steps(docs, steps[:1], stats, examples, rejected_text)
    normalized = [doc.text if reason is None else normalizer.normalized(doc.text) for doc, reason in zip(docs, reasons)]
    alive = [i for i, reason in enumerate(reasons) if reason is None]
    for i, reason in zip(alive, run_steps([docs[i] for i in alive], steps[1:], stats, examples, rejected_text)):
        reasons[i] = reason
    return reasons, normalized


def filter_documents(input_parts: list[Path], steps: list[StepSpec], dedup: ExactDedup, writer: DatasetWriter,
                     engine: Engine = SERIAL, examples_per_reason: int = 3, progress: bool = True,
                     label: str = "filter", rejected_text: RejectedText = "none") -> StageStats:
    """Run every part through the steps on `engine`; parts are the unit of parallelism (one task each). A dropped
    document's row in the rejected table holds its text only as `rejected_text` says (kiln.common.removals)."""
    frozen = tuple((s.step, json.dumps(s.params, sort_keys=True), json.dumps(s.per_language, sort_keys=True))
                   for s in steps)
    tasks = [_PartTask(str(p), str(writer.next_path("documents")), str(writer.next_path("rejected")),
                       str(part_rows_path(writer, i)), frozen,
                       (dedup.lowercase, dedup.collapse_whitespace), examples_per_reason, rejected_text)
             for i, p in enumerate(input_parts)]
    total = StageStats()
    for r in engine.map_parts(_filter_part, tasks, desc=label, progress=progress,
                              size=lambda t: os.path.getsize(t.input_path)):
        total.merge(r, examples_per_reason)
    bucket_rows([Path(t.hashes_path) for t in tasks], total.docs_in, writer, engine, progress, f"{label}: hashes")
    return total
