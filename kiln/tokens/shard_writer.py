"""Documents → training-ready token shards (the format lives in kiln.tokens.shard_format).

`write_token_shards` does, in order:
1. split: a document is validation when hash(doc_id) < val_fraction (salted independently of the seed,
   so changing the shuffle seed never moves a document between train and validation);
2. tokenize every Parquet part in a process pool into a scratch token file (EOS after every document);
   training documents of FIM sources are first rearranged by kiln.tokens.fim (validation stays plain text, so
   validation loss is comparable across FIM settings);
3. mixture: per phase, each source's token target from the weights (kiln.tokens.mixture), met by whole passes
   plus a deterministic subset of its documents in doc_id-hash order; later phases continue that order. Each draw
   is found from small per-part summaries, a cut that every part applies to its own documents (kiln.tokens.draw),
   not by sorting the source;
4. shuffle: each copy of a phase gets a key, a hash of (doc_id, seed, phase, copy), and goes to the bucket of the
   phase its key's top bits name (one bucket per BUCKET_ROWS copies, a power of two); each bucket is sorted by key
   and written as shards of ~tokens_per_shard tokens, documents never split across shards (a phase of several
   buckets has one shorter shard at the end of each); validation: every validation document once, shuffled the
   same way;
5. the member list (`members-*.parquet`): every input document with its split, how many copies of it the
   shards hold and its tokens, so an audit can say exactly whether a document was trained on, and its licence and
   language as the data card counts them (kiln.governance.document_facts), so the card of a checkpoint still
   counts them once the documents' stage is materialized again;
6. the position list (`positions-*.parquet`): which document of which shard each copy is, so a later run that
   replays these shards can skip the documents a removal request names since (kiln.governance.replay). Its rows
   are in shard order;
7. the composition (`composition-*.parquet`): each shard's documents and tokens per source, a row per shard and
   source it holds, for `kiln audit source` (a table beside the manifest, not in it: shards x sources entries
   made every reader of the manifest, each training rank among them, parse them all).

Removal requests (`kiln forget`) are applied here too, to every refresh's documents: a document one names is not
tokenized, and its member row says which request removed it (the quality filter applies them only to the
refreshes it re-runs, and the shards read every refresh so far).

Every step is engine tasks over parts (tokenize, the draw's summaries, the scatter) or buckets (the writes), on
any engine, and what a task holds is one part or one bucket: texts and token ids are streamed part by part into
scratch files beside the output, with each part's per-document columns and member-list rows. The driver holds
counts per part and per shard and the draw's summaries, never a value per document (`bench/shard_memory.py`,
docs/scale.md).
"""

from __future__ import annotations

import math
import os
import shutil
import time
import uuid
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.config import Mixture, ShardSettings
from kiln.common.manifest import write_file_atomic
from kiln.common.splitmix import GOLDEN, finalize
from kiln.common.storage import part_name
from kiln.dedup.shuffle import read_partition, read_scratch, write_partitioned, write_scratch
from kiln.engine import SERIAL, Engine
from kiln.governance.document_facts import document_facts, license_from
from kiln.governance.forget import REQUEST_COLUMNS, IntakeMatched, RemovalRequest, naming_requests
from kiln.tokens.fim import FimIds, fim_split, fim_tokens
from kiln.tokens.draw import Cells, Cut, Documents, Summary, Totals, cell_documents, draw, needed_cells, summarize
from kiln.tokens.draw import copies as cut_copies
from kiln.tokens.mixture import MixtureError, PhasePlan, SourceParts, epoch_warnings, hash_unit, plan_phases
from kiln.tokens.shard_format import TRAIN, VAL, ShardInfo, describe_shard_set, write_shard
from kiln.tokens.tokenizer import FIM_ROLES, Tokenizer, TokenizerError, continuation_flags

VAL_PHASE = "val"
_VAL_SALT = "kiln-val-split"
_VAL_SHUFFLE = 1 << 31  # the validation shards' shuffle salt (a training phase's is its index)
_ENCODE_BATCH = 256  # documents per sentencepiece call
# Copies a shuffle bucket is sized for, as kiln.common.spill's buckets are. Here, unlike there, it decides the output
# (where a phase's shards end), so it lives in a module token_shards' code_version hashes.
BUCKET_ROWS = 1 << 20
_REMOVED = object()  # a document's place in a batch when a removal request names it

# One row per input document: `copies` is how many times the shards of its split hold it (train: 0 when the
# mixture left it out, more than 1 when it repeats the source; val: 1); `tokens` per copy, EOS (and FIM
# sentinels) included, so sum(copies * tokens) per source and split is that source's shard tokens.
MEMBERS_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False),
                            pa.field("source", pa.string(), nullable=False),
                            pa.field("split", pa.string(), nullable=False),
                            pa.field("copies", pa.int32(), nullable=False),
                            pa.field("tokens", pa.int64(), nullable=False),
                            pa.field("removed_by", pa.string()),  # `removal_request:<id>`: 0 copies, 0 tokens
                            # As kiln.governance.document_facts reads them (the source's licence field: the shard
                            # set's `sources.<name>.license_field`); null for a removed document, of which nothing
                            # but its id is kept; the locator only for a document of unknown licence.
                            pa.field("license", pa.string()),
                            pa.field("language", pa.string()),
                            pa.field("locator", pa.string())])
_FACTS = ("license", "language", "locator")  # document_facts' order
# What a tokenize task writes per document for the member and position lists, in the part's order.
_ROWS_SCHEMA = pa.schema([MEMBERS_SCHEMA.field(c) for c in ("doc_id", "removed_by", *_FACTS)])

# One row per document copy in a shard: `index` is its place in the shard's document-offset index.
POSITIONS_SCHEMA = pa.schema([pa.field("shard", pa.string(), nullable=False),
                              pa.field("index", pa.int32(), nullable=False),
                              pa.field("doc_id", pa.string(), nullable=False)])
# A row per shard and source it holds, in shard order: that source's documents and tokens in the shard.
COMPOSITION_SCHEMA = pa.schema([pa.field("shard", pa.string(), nullable=False),
                                pa.field("split", pa.string(), nullable=False),
                                pa.field("source", pa.string(), nullable=False),
                                pa.field("documents", pa.int64(), nullable=False),
                                pa.field("tokens", pa.int64(), nullable=False)])


class _Writer(Protocol):  # kiln.common.storage.DatasetWriter, without importing it here
    dir: Path

    def next_path(self, role: str, suffix: str = ".parquet") -> Path: ...


def is_validation(doc_id: str, val_fraction: float) -> bool:
    """Whether a document is held out: a pure function of its id, the same in every run and phase."""
    return hash_unit(_VAL_SALT, doc_id) < val_fraction * 2.0 ** 64


def fim_sources(sources: list[SourceParts], configured: list[str] | None) -> set[str]:
    """The sources FIM applies to: the configured list, or every source whose domain is code."""
    return set(configured) if configured is not None else {s.name for s in sources if s.domain == "code"}


# --------------------------------------------------------------------------------------------- tokenize

@dataclass(frozen=True)
class _PartFiles:
    """A part's scratch files, in the run's scratch folder, named by the part's number in the run."""

    scratch: str
    index: int
    source_index: int

    def _file(self, suffix: str) -> str:
        return _scratch_file(self.scratch, self.index, suffix)

    @property
    def tokens(self) -> str:
        """Token ids, documents back to back, each ending in EOS."""
        return self._file(".tok")

    @property
    def rows(self) -> str:
        """The member-list columns that only the part knows (_ROWS_SCHEMA)."""
        return self._file(".rows.parquet")

    @property
    def columns(self) -> str:
        """Per-document columns (_COLUMNS_SCHEMA), which the draw and the scatter read."""
        return self._file(".columns.arrow")

    @property
    def members(self) -> str:
        """The part's rows of the member list, as the scatter writes them."""
        return self._file(".members.arrow")

    @property
    def summary(self) -> str:
        """The part's first summary for the draw of the phase at hand (kiln.tokens.draw)."""
        return self._file(".summary.arrow")


def _scratch_file(scratch: str, index: int, suffix: str) -> str:
    return f"{scratch}/{index:07d}{suffix}"


@dataclass(frozen=True)
class _PartTask:
    files: _PartFiles
    input_path: str
    tokenizer_path: str
    tokenizer_sha256: str
    fim: tuple[float, float] | None  # (rate, spm_rate) for FIM sources
    val_fraction: float
    seed: int
    requests: tuple[RemovalRequest | IntakeMatched, ...] = ()  # documents they name are left out
    license_field: str | None = None  # `meta` key of each document's own licence (card.license_fields)
    floors: tuple[int, ...] = (0,)  # count the training tokens in documents of at least each many tokens


# Per document, in the part's order: tokens (EOS included), split, selection order key, named by a removal request.
_COLUMNS_SCHEMA = pa.schema([pa.field("length", pa.int64()), pa.field("is_val", pa.bool_()),
                             pa.field("order_key", pa.uint64()), pa.field("removed", pa.bool_())])


@dataclass
class _PartTokens:
    """What a tokenize task sends back: its part's counts (the documents' columns are in its scratch file)."""

    documents: int
    removed: int
    train_documents: int
    val_documents: int
    val_tokens: int
    train_tokens: dict[int, int]  # floor -> training tokens in documents of at least `floor` tokens
    fim_documents: int
    chars: int
    utf8_bytes: int


@lru_cache(maxsize=2)
def _tokenizer(path: str, sha256: str) -> Tokenizer:
    """Loaded once per worker process; refuses a model file that changed since the run started."""
    tok = Tokenizer.load(path)
    if tok.sha256 != sha256:
        raise TokenizerError(f"{path} changed while token shards were being written (sha256 {tok.sha256[:12]}…, "
                             f"expected {sha256[:12]}…); re-run token_shards")
    return tok


def tokenize_part(task: _PartTask) -> _PartTokens:
    """One Parquet part → a raw token file (documents back to back, each ending in EOS), the documents' columns and
    member-list rows as scratch files, and the part's counts."""
    tok = _tokenizer(task.tokenizer_path, task.tokenizer_sha256)
    eos = tok.eos_id
    # Only a part that may be rearranged needs the FIM symbols (a brought tokenizer may lack them).
    ids = FimIds(*tok.require(FIM_ROLES, "fill-in-the-middle (shards.fim)"), eos) if task.fim and task.fim[0] else None
    lengths, is_val, keys, doc_ids, removed_by, facts = [], [], [], [], [], []
    fim_docs = chars = n_bytes = 0
    parquet = pq.ParquetFile(task.input_path)
    columns = ["text", "license", "meta", *(REQUEST_COLUMNS if task.requests else ["doc_id"])]
    with open(task.files.tokens, "wb") as out:
        for batch in parquet.iter_batches(batch_size=_ENCODE_BATCH, columns=columns):
            segments, continues, layout = [], [], []
            for doc_id, text, license_, meta, request in zip(
                    batch.column("doc_id").to_pylist(), batch.column("text").to_pylist(),
                    batch.column("license").to_pylist(), batch.column("meta").to_pylist(),
                    naming_requests(task.requests, batch)):
                doc_ids.append(doc_id)
                removed_by.append(None if request is None else request.reject_reason)
                if request is not None:  # no tokens, never chosen
                    layout.append(_REMOVED)
                    is_val.append(False)
                    keys.append(0)
                    facts.append((None, None, None))
                    continue
                facts.append(document_facts(license_, meta, task.license_field))
                val = is_validation(doc_id, task.val_fraction)
                cut = None if val or task.fim is None else fim_split(text, doc_id, task.seed, *task.fim)
                pieces = [text] if cut is None else [cut.prefix, cut.middle, cut.suffix]
                segments += pieces
                continues += continuation_flags(pieces)  # a FIM middle or suffix gets no start-of-text space
                layout.append(cut)
                is_val.append(val)
                keys.append(hash_unit("order", task.seed, doc_id))
                chars += len(text)
                n_bytes += len(text.encode("utf-8", "surrogatepass"))
            encoded = tok.encode_batch(segments, continues=continues)
            docs, k = [], 0
            for cut in layout:
                if cut is _REMOVED:
                    docs.append([])
                elif cut is None:
                    docs.append(encoded[k] + [eos])
                    k += 1
                else:
                    docs.append(fim_tokens(cut, encoded[k], encoded[k + 1], encoded[k + 2], ids))
                    fim_docs += 1
                    k += 3
            sizes = [len(d) for d in docs]
            np.fromiter(chain.from_iterable(docs), tok.dtype, count=sum(sizes)).tofile(out)
            lengths += sizes
    facts_by_column = list(zip(*facts)) or [()] * len(_FACTS)
    pq.write_table(pa.table([doc_ids, removed_by, *(list(v) for v in facts_by_column)], schema=_ROWS_SCHEMA),
                   task.files.rows)
    length, val = np.asarray(lengths, np.int64), np.asarray(is_val, bool)
    removed = np.asarray([r is not None for r in removed_by], bool)
    write_scratch(Path(task.files.columns), pa.table([length, val, np.asarray(keys, np.uint64), removed],
                                                    schema=_COLUMNS_SCHEMA))
    train = length[~val & ~removed]
    return _PartTokens(len(length), int(removed.sum()), len(train), int(val.sum()), int(length[val].sum()),
                       {f: int(train[train >= f].sum()) for f in task.floors}, fim_docs, chars, n_bytes)


@dataclass(frozen=True)
class _Columns:
    """A part's documents as the draw and the scatter read them back."""

    length: np.ndarray
    is_val: np.ndarray
    order_key: np.ndarray
    removed: np.ndarray
    place: np.ndarray  # int64: each document's place in the run (unique; parts in task order)

    @classmethod
    def read(cls, part: _PartFiles, first_place: int) -> _Columns:
        table = read_scratch(Path(part.columns))
        columns = [table.column(c).to_numpy() for c in _COLUMNS_SCHEMA.names]
        return cls(*columns, first_place + np.arange(len(columns[0]), dtype=np.int64))

    @property
    def training(self) -> np.ndarray:
        return np.flatnonzero(~self.is_val & ~self.removed)

    def documents(self, rows: np.ndarray) -> Documents:
        return Documents(self.order_key[rows], self.place[rows], self.length[rows])


# ------------------------------------------------------------------------------------------------- draw

@dataclass(frozen=True)
class _DrawTask:
    """One part's summary for a phase's draw from its source: the first (cells None) or its `cells`' documents."""

    part: _PartFiles
    first_place: int
    cuts: tuple[Cut, ...]  # the source's earlier phases
    floor: int
    resume: tuple[int, int] | None
    cells: np.ndarray | None = None


_SUMMARY_SCHEMA = pa.schema([pa.field("codes", pa.uint64()), pa.field("tokens", pa.int64()),
                             pa.field("documents", pa.int64())])


def _summarize_part(task: _DrawTask) -> Cells | None:
    """The first summary (`task.cells` None), written to the part's scratch file: one per part would hold as many
    cells as documents in the driver, which adds them up a file at a time. Or the documents of `task.cells`."""
    columns = _Columns.read(task.part, task.first_place)
    docs = columns.documents(columns.training)
    if task.cells is not None:
        return cell_documents(docs, task.cuts, task.floor, task.resume, task.cells)
    summary = summarize(docs, task.cuts, task.floor, task.resume)
    write_scratch(Path(task.part.summary), pa.table([summary.codes, summary.tokens, summary.documents],
                                                    schema=_SUMMARY_SCHEMA))
    return None


def _draw_phase(engine: Engine, plan: PhasePlan, floor: int, parts: list[_PartFiles], first_place: list[int],
                names: list[str], cuts: dict[str, list[Cut]], resume: dict[str, tuple[int, int] | None],
                progress: bool) -> None:
    """Each source's draw for the phase of `plan`: two engine rounds over the parts of the sources it draws from
    (summaries, then the documents of the cells each cut needs); appends each source's cut to `cuts` and records
    what it took in `plan.draws`."""
    drawing = [(names[p.source_index], p, first) for p, first in zip(parts, first_place)
               if plan.draws[names[p.source_index]].target_tokens > 0]
    engine.map_parts(_summarize_part, [_DrawTask(p, first, tuple(cuts[n]), floor, resume[n])
                                       for n, p, first in drawing], desc=f"draw {plan.name}", progress=progress)
    totals = {n: Totals() for n in names}
    for n, p, _ in drawing:
        table = read_scratch(Path(p.summary))
        totals[n].add(Summary(*(table.column(c).to_numpy() for c in _SUMMARY_SCHEMA.names)))
    summaries = {n: t.summary() for n, t in totals.items()}
    cells = {n: needed_cells(plan.draws[n].target_tokens, summaries[n]) for n in names}
    asked = [(n, p, first) for n, p, first in drawing if len(cells[n])]
    found = engine.map_parts(_summarize_part, [_DrawTask(p, first, tuple(cuts[n]), floor, resume[n], cells[n])
                                               for n, p, first in asked], desc=f"draw {plan.name} (cut)",
                             progress=progress)
    for n in names:
        drawn = draw(plan.draws[n].target_tokens, floor, resume[n], summaries[n],
                     [f for (m, _, _), f in zip(asked, found) if m == n])
        cuts[n].append(drawn.cut)
        resume[n] = drawn.resume
        plan.draws[n].tokens, plan.draws[n].documents = drawn.tokens, drawn.documents


# ------------------------------------------------------------------------------------------ the shuffle

# Each copy in a shard, scattered to the bucket of its phase that its shuffle key falls in.
_COPIES_SCHEMA = pa.schema([pa.field("shuffle_key", pa.uint64()), pa.field("place", pa.int64()),
                            pa.field("part", pa.int32()), pa.field("start", pa.int64()),
                            pa.field("length", pa.int64()), pa.field("source", pa.int32()),
                            pa.field("doc_id", pa.string())])


def _shuffle_keys(order_key: np.ndarray, copies: np.ndarray, salt: int) -> np.ndarray:
    """A key for each copy of each document (`copies` of it, its copies together): a hash of its order_key (itself a
    hash of the seed and the doc_id), the phase's salt and the copy's number. Sorting by it is a uniform shuffle
    that depends neither on the parts' order nor on the process that computes it."""
    counts = copies.astype(np.int64)
    number = np.arange(int(counts.sum()), dtype=np.uint64)
    number -= np.repeat((np.cumsum(counts) - counts).astype(np.uint64), counts)
    salted = finalize(np.uint64((salt + 1) * GOLDEN % 2 ** 64) + number)
    return finalize(np.repeat(order_key, counts) ^ salted)


@dataclass(frozen=True)
class _Phase:
    """Where a phase's copies go: its shuffle salt, and buckets first_bucket .. first_bucket + 2^bits - 1 (by the
    top bits of the shuffle key, so the buckets in order hold the phase in shuffle-key order)."""

    name: str
    index: int
    split: str
    salt: int
    copies: int
    first_bucket: int
    bits: int

    @property
    def buckets(self) -> range:
        return range(self.first_bucket, self.first_bucket + (1 << self.bits))


def _phases_of(plans: list[PhasePlan], val_documents: int, bucket_rows: int) -> list[_Phase]:
    phases, first = [], 0
    for name, index, split, salt, copies in (
            *((p.name, p.index, TRAIN, p.index, sum(d.documents for d in p.draws.values())) for p in plans),
            (VAL_PHASE, 0, VAL, _VAL_SHUFFLE, val_documents)):
        bits = max(0, math.ceil(math.log2(max(copies, 1) / bucket_rows)))
        phases.append(_Phase(name, index, split, salt, copies, first, bits))
        first += 1 << bits
    return phases


@dataclass(frozen=True)
class _ScatterTask:
    part: _PartFiles
    first_place: int
    source: str
    cuts: tuple[Cut, ...]  # the source's, one per training phase
    phases: tuple[_Phase, ...]  # the training phases, then validation
    copies_dir: str


def _scatter_part(task: _ScatterTask) -> list[int]:
    """A part's member-list rows, and each copy its documents have in the shards, written to the bucket of its phase
    that its shuffle key falls in (one shuffle file per part, kiln.dedup.shuffle). Returns its copies per phase."""
    columns = _Columns.read(task.part, task.first_place)
    training = columns.training
    drawn = cut_copies(columns.documents(training), task.cuts)  # (training phases, training documents)
    copies = columns.is_val.astype(np.int64)
    copies[training] += drawn.sum(axis=0)
    rows = pq.read_table(task.part.rows, schema=_ROWS_SCHEMA)
    n = len(copies)
    members = pa.table({
        "doc_id": rows["doc_id"], "source": pa.array([task.source] * n, pa.string()),
        "split": pa.array(np.where(columns.is_val, VAL, TRAIN).astype(object), pa.string()),
        "copies": pa.array(copies, pa.int32()), "tokens": pa.array(columns.length, pa.int64()),
        **{c: rows[c] for c in ("removed_by", *_FACTS)}}, schema=MEMBERS_SCHEMA)
    write_scratch(Path(task.part.members), members)
    start = np.cumsum(columns.length) - columns.length
    val = np.flatnonzero(columns.is_val)
    tables, buckets = [], []
    for phase, (held, count) in zip(task.phases, [*((training, c) for c in drawn), (val, np.ones(len(val), np.int64))]):
        keep = count > 0
        held, count = held[keep], count[keep]
        key = _shuffle_keys(columns.order_key[held], count, phase.salt)
        at = np.repeat(held, count)
        tables.append(pa.table({"shuffle_key": key, "place": columns.place[at],
                                "part": np.full(len(at), task.part.index, np.int32), "start": start[at],
                                "length": columns.length[at], "source": np.full(len(at), task.part.source_index,
                                                                                np.int32),
                                "doc_id": rows["doc_id"].take(pa.array(at))}, schema=_COPIES_SCHEMA))
        buckets.append(phase.first_bucket + (key >> np.uint64(64 - phase.bits)).astype(np.int64) if phase.bits
                       else np.full(len(at), phase.first_bucket, np.int64))
    write_partitioned(Path(task.copies_dir), f"{task.part.index:07d}", pa.concat_tables(tables),
                      np.concatenate(buckets), task.phases[-1].buckets.stop)
    return [t.num_rows for t in tables]


# ------------------------------------------------------------------------------------------------ write

@dataclass(frozen=True)
class _BucketTask:
    copies_dir: str
    bucket: int
    scratch: str  # where the parts' token files are
    out_dir: str  # where the bucket's shards go, named by bucket and number
    dtype: str
    tokenizer_sha256: str
    tokens_per_shard: int
    sources: int


@dataclass(frozen=True)
class _Written:
    """One shard a bucket task wrote: its scratch path, tokens and documents (its sources: in the bucket's
    composition scratch file, so the driver holds nothing per shard and source)."""

    path: str
    tokens: int
    documents: int


def _token_files(scratch: str, dtype: np.dtype) -> Callable[[int], np.ndarray]:
    """Part number -> its token ids, memory-mapped, with a bounded number of maps open (a plain function: no cycle
    keeps the maps open after the task)."""
    @lru_cache(maxsize=128)
    def tokens(part: int) -> np.ndarray:
        path = Path(_scratch_file(scratch, part, ".tok"))
        return np.memmap(path, dtype=dtype, mode="r") if path.stat().st_size else np.zeros(0, dtype)

    return tokens


def _write_bucket(task: _BucketTask) -> list[_Written]:
    """A bucket's copies, in shuffle-key order, into shards of ~tokens_per_shard tokens (documents never split), and
    its rows of the position list (shard number within the bucket, index, doc_id) beside them."""
    table = read_partition(Path(task.copies_dir), task.bucket, _COPIES_SCHEMA)
    order = np.lexsort((table["place"].to_numpy(), table["shuffle_key"].to_numpy()))
    part, start, length, source = (table[c].to_numpy()[order] for c in ("part", "start", "length", "source"))
    tokens = _token_files(task.scratch, np.dtype(task.dtype))
    cum = np.cumsum(length)
    written, shard_of, index_in = [], np.zeros(len(order), np.int32), np.zeros(len(order), np.int32)
    i = 0
    while i < len(order):
        base = int(cum[i - 1]) if i else 0
        end = min(int(np.searchsorted(cum, base + task.tokens_per_shard, side="left")) + 1, len(order))
        offsets = np.zeros(end - i + 1, np.uint64)
        offsets[1:] = cum[i:end] - base
        buf = np.empty(int(offsets[-1]), task.dtype)
        for d, (p, s, n) in enumerate(zip(part[i:end].tolist(), start[i:end].tolist(), length[i:end].tolist())):
            buf[int(offsets[d]):int(offsets[d]) + n] = tokens(p)[s:s + n]
        path = Path(task.out_dir) / f"{task.bucket:06d}-{len(written):05d}.bin"
        write_shard(path, buf, offsets, task.tokenizer_sha256)
        written.append(_Written(str(path), len(buf), end - i))
        shard_of[i:end], index_in[i:end] = len(written) - 1, np.arange(end - i)
        i = end
    write_scratch(Path(task.out_dir) / f"{task.bucket:06d}.positions.arrow",
                  pa.table({"shard": shard_of, "index": index_in, "doc_id": table["doc_id"].take(pa.array(order))}))
    # Each shard's documents and tokens per source: one cell per (shard, source) the bucket holds.
    cell = shard_of.astype(np.int64) * task.sources + source
    cells, documents = np.unique(cell, return_counts=True)
    tokens_in = np.bincount(np.searchsorted(cells, cell), weights=length, minlength=len(cells)).astype(np.int64)
    write_scratch(Path(task.out_dir) / f"{task.bucket:06d}.composition.arrow",
                  pa.table({"shard": (cells // task.sources).astype(np.int32),
                            "source": (cells % task.sources).astype(np.int32),
                            "documents": documents.astype(np.int64), "tokens": tokens_in}))
    return written


# ---------------------------------------------------------------------------------------------- result

@dataclass
class ShardSetResult:
    """What `write_token_shards` made: shards, per-source and per-phase counts, warnings."""

    tokenizer_sha256: str
    vocab_size: int
    eos_id: int
    seq_len: int
    shards: list[ShardInfo]
    sources: dict[str, dict[str, Any]]
    phases: list[dict[str, Any]]
    warnings: list[str] = field(default_factory=list)
    seconds: dict[str, float] = field(default_factory=dict)
    members: str | None = None  # the member list's path, relative to the output folder
    composition: str | None = None  # the composition's path (COMPOSITION_SCHEMA), relative to the output folder

    def tokens(self, split: str) -> int:
        return sum(s.tokens for s in self.shards if s.split == split)

    def documents(self, split: str) -> int:
        return sum(s.documents for s in self.shards if s.split == split)

    def counts(self) -> dict[str, int]:
        """For the manifest's `counts`."""
        return {"train_tokens": self.tokens(TRAIN), "val_tokens": self.tokens(VAL),
                "train_documents": self.documents(TRAIN), "val_documents": self.documents(VAL),
                "shards": len(self.shards)}

    def manifest_stats(self) -> dict[str, Any]:
        """For the manifest's `stats`: what `kiln.tokens.shard_format.read_shard_set` (and so the loader) reads."""
        return describe_shard_set(self.tokenizer_sha256, self.vocab_size, self.eos_id, self.shards,
                                  seq_len=self.seq_len, sources=self.sources, phases=self.phases,
                                  warnings=self.warnings, seconds=self.seconds, totals=self.counts(),
                                  members=self.members, composition=self.composition)


# ---------------------------------------------------------------------------------------------- writing

def write_token_shards(sources: list[SourceParts], tokenizer_path: str | Path, settings: ShardSettings,
                       mixture: Mixture, output: _Writer | Path, engine: Engine = SERIAL,
                       progress: bool = True, requests: Sequence[RemovalRequest | IntakeMatched] = (),
                       license_fields: Mapping[str, str] | None = None,
                       bucket_rows: int = BUCKET_ROWS) -> ShardSetResult:
    """Tokenize the sources and write train/validation shards into `output` (a DatasetWriter: shards go to
    `writer.next_path("shard", ".bin")`; or a folder), leaving out every document a removal request in
    `requests` names. `license_fields` (source -> `meta` key, `card.license_fields`) says where the member list
    reads each document's licence. `bucket_rows`: the copies a shuffle bucket is sized for. The caller commits the
    manifest with `stats=result.manifest_stats()` and `counts=result.counts()`.

    Every round is engine tasks over parts or buckets, and the driver holds counts per part and per shard, never a
    value per document: tokenize; per phase, the draw's two summaries (kiln.tokens.draw); scatter each part's copies
    to its phase's buckets by shuffle key, writing its member-list rows; write each bucket's shards and position-list
    rows; then the two lists are put together a part and a bucket at a time."""
    t_start = time.perf_counter()
    tok = Tokenizer.load(tokenizer_path)
    if isinstance(output, Path | str):
        out_dir = Path(output)
        out_dir.mkdir(parents=True, exist_ok=True)
        counter = iter(range(1 << 30))
        new_path = lambda: out_dir / f"shard-{next(counter):05d}.bin"  # noqa: E731
    else:
        out_dir = Path(output.dir)
        new_path = lambda: output.next_path("shard", ".bin")  # noqa: E731
    names = [s.name for s in sources]
    license_fields = dict(license_fields or {})
    fim_names = fim_sources(sources, settings.fim.sources)
    if fim_names and settings.fim.rate > 0:  # before any work: a brought tokenizer may lack the FIM symbols
        tok.require(FIM_ROLES, f"fill-in-the-middle (shards.fim.rate {settings.fim.rate} on {sorted(fim_names)})",
                    "; or set shards.fim.rate: 0")
    minimum = {p.name: p.min_document_tokens for p in mixture.phases}
    floors = tuple(sorted({0, *(f for f in minimum.values() if f)}))
    scratch = out_dir / f".tokenize-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        tasks = [_PartTask(_PartFiles(str(scratch), k, i), str(part), str(tokenizer_path), tok.sha256,
                           (settings.fim.rate, settings.fim.spm_rate) if s.name in fim_names else None,
                           settings.val_fraction, settings.seed, tuple(requests), license_fields.get(s.name), floors)
                 for k, (i, s, part) in enumerate((i, s, part) for i, s in enumerate(sources) for part in s.parts)]
        results = engine.map_parts(tokenize_part, tasks, desc="tokenize", progress=progress,
                                   size=lambda t: os.path.getsize(t.input_path))
        t_tokenized = time.perf_counter()
        parts = [t.files for t in tasks]
        first_place = np.cumsum([0] + [r.documents for r in results])[:-1].tolist()
        counts = {n: dict.fromkeys(("documents", "removed", "train_documents", "val_documents", "val_tokens",
                                    "fim_documents", "chars", "utf8_bytes"), 0) for n in names}
        train_tokens = {n: dict.fromkeys(floors, 0) for n in names}
        for r, t in zip(results, tasks):
            n = names[t.files.source_index]
            for key in counts[n]:
                counts[n][key] += getattr(r, key)
            for f, v in r.train_tokens.items():
                train_tokens[n][f] += v

        def natural_at_least(floor: int) -> dict[str, int]:
            """Each source's training tokens in documents of at least `floor` tokens (what a phase can draw)."""
            return {n: train_tokens[n][floor] for n in names}

        natural = natural_at_least(0)
        try:
            plans = plan_phases(natural, mixture.weights, mixture.token_budget,
                                [(p.name, p.tokens, p.weights,
                                  p.min_document_tokens and natural_at_least(p.min_document_tokens))
                                 for p in mixture.phases])
        except MixtureError as exc:  # say so when the validation split took a source's every document
            all_val = [n for n in names if not counts[n]["train_documents"] and counts[n]["val_documents"]]
            if not all_val:
                raise
            raise MixtureError(f"{all_val}: no training documents, every one fell into the validation split "
                               f"(shards.val_fraction {settings.val_fraction}): lower shards.val_fraction ({exc})") \
                from None
        cuts: dict[str, list[Cut]] = {n: [] for n in names}
        resume: dict[str, tuple[int, int] | None] = dict.fromkeys(names)
        for plan in plans:
            _draw_phase(engine, plan, minimum.get(plan.name) or 0, parts, first_place, names, cuts, resume, progress)
        val_documents = sum(c["val_documents"] for c in counts.values())
        phases = _phases_of(plans, val_documents, bucket_rows)
        copies_dir, shards_dir = scratch / "copies", scratch / "shards"
        shards_dir.mkdir()
        written = engine.map_parts(_scatter_part, [
            _ScatterTask(p, first, names[p.source_index], tuple(cuts[names[p.source_index]]), tuple(phases),
                         str(copies_dir)) for p, first in zip(parts, first_place)], desc="shuffle", progress=progress)
        for k, phase in enumerate(phases):  # what the parts placed against what the draw chose
            placed = sum(w[k] for w in written)
            if placed != phase.copies:
                raise RuntimeError(f"token_shards: the parts placed {placed} copies in phase {phase.name!r} and the "
                                   f"draw chose {phase.copies}: a scratch file in {scratch} changed while the run "
                                   "went on; re-run token_shards")
        # Every bucket of a phase with copies is written, empty or not (each expects over bucket_rows / 2 copies), so
        # the driver keeps no list of the buckets each part wrote.
        buckets = [b for phase in phases if phase.copies for b in phase.buckets]
        bucket_shards = engine.map_parts(_write_bucket, [
            _BucketTask(str(copies_dir), b, str(scratch), str(shards_dir), np.dtype(tok.dtype).str, tok.sha256,
                        settings.tokens_per_shard, len(names)) for b in buckets],
            desc="write shards", progress=progress)
        shards, names_by_bucket = [], {}
        phase_of = {b: p for p in phases for b in p.buckets}
        for b, made in zip(buckets, bucket_shards):
            phase = phase_of[b]
            shard_names: list[str] = []
            names_by_bucket[b] = phase.split, shard_names
            for w in made:
                path = new_path()
                os.replace(w.path, path)
                shards.append(ShardInfo(str(path.relative_to(out_dir)), phase.split, phase.name, phase.index,
                                        w.tokens, w.documents))
                shard_names.append(shards[-1].path)
        members_path, positions_path, composition_path = (
            output.next_path(role) if not isinstance(output, Path | str) else out_dir / part_name(role, 0)
            for role in ("members", "positions", "composition"))
        _write_lists(members_path, positions_path, composition_path, parts, shards_dir, names_by_bucket, names)
        t_written = time.perf_counter()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    warnings = epoch_warnings(plans, natural, mixture.max_epochs_warning)
    if settings.val_fraction > 0 and not val_documents:
        warnings.append(f"no document fell into validation (val_fraction {settings.val_fraction}, "
                        f"{sum(r.documents for r in results)} documents); raise val_fraction or add data")
    per_source = {}
    for n, s in zip(names, sources):
        c = counts[n]
        used = sum(p.draws[n].tokens for p in plans)
        per_source[n] = {
            "domain": s.domain, "fim": n in fim_names, "parts": len(s.parts),
            "license_field": license_from(license_fields.get(n)),  # the member list's licences
            "documents": c["documents"] - c["removed"], "removed_by_request": c["removed"],
            **{k: c[k] for k in ("chars", "utf8_bytes", "fim_documents")},
            "train_documents": c["train_documents"], "val_documents": c["val_documents"],
            "natural_train_tokens": natural[n], "val_tokens": c["val_tokens"],
            "target_tokens": sum(p.draws[n].target_tokens for p in plans), "train_tokens": used,
            "effective_epochs": round(used / natural[n], 4) if natural[n] else 0.0}
    return ShardSetResult(
        tokenizer_sha256=tok.sha256, vocab_size=tok.vocab_size, eos_id=tok.eos_id, seq_len=settings.seq_len,
        shards=shards, sources=per_source, warnings=warnings,
        phases=[{**p.to_dict(), "min_document_tokens": minimum.get(p.name)} for p in plans],
        seconds={"tokenize": round(t_tokenized - t_start, 3), "write": round(t_written - t_tokenized, 3)},
        members=str(members_path.relative_to(out_dir)), composition=str(composition_path.relative_to(out_dir)))


def _write_lists(members_path: Path, positions_path: Path, composition_path: Path, parts: list[_PartFiles],
                 shards_dir: Path, names_by_bucket: dict[int, tuple[str, list[str]]], sources: list[str]) -> None:
    """The member list (every document, in task order: each part's rows as its scatter task wrote them), the position
    list (every copy in a shard, in shard order: each bucket's rows as its write task wrote them, the shard named)
    and the composition (each shard's counts per source, in shard order), read and written a part or a bucket at a
    time. `names_by_bucket`: each bucket's split and its shards' names."""
    source_names = pa.array(sources, pa.string())

    def write(members_file, positions_file, composition_file) -> None:
        with pq.ParquetWriter(members_file, MEMBERS_SCHEMA, compression="zstd") as members, \
                pq.ParquetWriter(positions_file, POSITIONS_SCHEMA, compression="zstd") as positions, \
                pq.ParquetWriter(composition_file, COMPOSITION_SCHEMA, compression="zstd") as composition:
            for part in parts:
                members.write_table(read_scratch(Path(part.members)))
            for bucket, (split, shard_names) in names_by_bucket.items():
                names = pa.array(shard_names, pa.string())
                rows = read_scratch(shards_dir / f"{bucket:06d}.positions.arrow")
                positions.write_table(pa.table({
                    "shard": names.take(rows["shard"].combine_chunks()), "index": rows["index"],
                    "doc_id": rows["doc_id"]}, schema=POSITIONS_SCHEMA))
                cells = read_scratch(shards_dir / f"{bucket:06d}.composition.arrow")
                composition.write_table(pa.table({
                    "shard": names.take(cells["shard"].combine_chunks()), "split": [split] * cells.num_rows,
                    "source": source_names.take(cells["source"].combine_chunks()), "documents": cells["documents"],
                    "tokens": cells["tokens"]}, schema=COMPOSITION_SCHEMA))

    # Each file is renamed into place once all are whole: no half list after a crash.
    write_file_atomic(members_path, lambda m: write_file_atomic(
        positions_path, lambda p: write_file_atomic(composition_path, lambda c: write(m, p, c))))


__all__ = ["COMPOSITION_SCHEMA", "MEMBERS_SCHEMA", "POSITIONS_SCHEMA", "ShardSetResult", "fim_sources", "is_validation",
           "tokenize_part", "write_token_shards"]
