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
4. shuffle the chosen copies of each phase by a hash of (doc_id, seed, phase, copy) and write shards of
   ~tokens_per_shard tokens, documents never split across shards; validation: every validation document once,
   shuffled the same way;
5. the member list (`members-*.parquet`): every input document with its split, how many copies of it the
   shards hold and its tokens, so an audit can say exactly whether a document was trained on, and its licence and
   language as the data card counts them (kiln.governance.document_facts), so the card of a checkpoint still
   counts them once the documents' stage is materialized again;
6. the position list (`positions-*.parquet`): which document of which shard each copy is, so a later run that
   replays these shards can skip the documents a removal request names since (kiln.governance.replay). Its rows
   are grouped by input part, not by shard: readers sort or filter by (shard, index).

Removal requests (`kiln forget`) are applied here too, to every refresh's documents: a document one names is not
tokenized, and its member row says which request removed it (the quality filter applies them only to the
refreshes it re-runs, and the shards read every refresh so far).

Texts and token ids are streamed part by part. Each tokenize task also writes its documents' ids, licences,
languages and removal requests to a scratch file, and the member and position lists are written from those a part
at a time, so the driver holds no string per document: only fixed-size NumPy columns (length, split, order key,
where its tokens are: about 100 B per document, `bench/shard_memory.py`, docs/scale.md).
"""

from __future__ import annotations

import os
import shutil
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import lru_cache
from itertools import chain
from pathlib import Path
from typing import Any, Protocol

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm import tqdm

from kiln.common.config import Mixture, ShardSettings
from kiln.common.manifest import write_file_atomic
from kiln.common.storage import part_name
from kiln.engine import SERIAL, Engine
from kiln.governance.document_facts import document_facts, license_from
from kiln.governance.forget import REQUEST_COLUMNS, IntakeMatched, RemovalRequest, naming_requests
from kiln.tokens.fim import FimIds, fim_split, fim_tokens
from kiln.tokens.draw import Cut, Documents, cell_documents, draw, merge, needed_cells, summarize
from kiln.tokens.draw import copies as cut_copies
from kiln.tokens.mixture import MixtureError, SourceParts, epoch_warnings, hash_unit, plan_phases
from kiln.tokens.shard_format import TRAIN, VAL, ShardInfo, describe_shard_set, write_shard
from kiln.tokens.tokenizer import FIM_ROLES, Tokenizer, TokenizerError, continuation_flags

VAL_PHASE = "val"
_VAL_SALT = "kiln-val-split"
_VAL_SHUFFLE = 1 << 31  # the validation shards' shuffle salt (a training phase's is its index)
_ENCODE_BATCH = 256  # documents per sentencepiece call
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
class _PartTask:
    source_index: int
    input_path: str
    tokens_path: str
    tokenizer_path: str
    tokenizer_sha256: str
    fim: tuple[float, float] | None  # (rate, spm_rate) for FIM sources
    val_fraction: float
    seed: int
    requests: tuple[RemovalRequest | IntakeMatched, ...] = ()  # documents they name are left out
    license_field: str | None = None  # `meta` key of each document's own licence (card.license_fields)

    @property
    def rows_path(self) -> str:
        """The scratch file of the part's member-list columns that only the part knows (_ROWS_SCHEMA)."""
        return self.tokens_path.removesuffix(".tok") + ".rows.parquet"


@dataclass
class _PartTokens:
    """What a worker sends back: per document, its token count (EOS included), split and order key."""

    lengths: np.ndarray  # int64
    is_val: np.ndarray  # bool
    order_key: np.ndarray  # uint64: selection order for repetition / subsets
    removed: np.ndarray  # bool: named by a removal request (no tokens)
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
    """One Parquet part → a raw token file (documents back to back, each ending in EOS) + per-doc arrays."""
    tok = _tokenizer(task.tokenizer_path, task.tokenizer_sha256)
    eos = tok.eos_id
    # Only a part that may be rearranged needs the FIM symbols (a brought tokenizer may lack them).
    ids = FimIds(*tok.require(FIM_ROLES, "fill-in-the-middle (shards.fim)"), eos) if task.fim and task.fim[0] else None
    lengths, is_val, keys, doc_ids, removed_by, facts = [], [], [], [], [], []
    fim_docs = chars = n_bytes = 0
    parquet = pq.ParquetFile(task.input_path)
    columns = ["text", "license", "meta", *(REQUEST_COLUMNS if task.requests else ["doc_id"])]
    with open(task.tokens_path, "wb") as out:
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
                   task.rows_path)
    return _PartTokens(np.asarray(lengths, np.int64), np.asarray(is_val, bool), np.asarray(keys, np.uint64),
                       np.asarray([r is not None for r in removed_by], bool), fim_docs, chars, n_bytes)




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
    shard_sources: dict[str, dict[str, dict[str, int]]] = field(default_factory=dict)  # shard -> source -> counts

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
                                  members=self.members, shard_sources=self.shard_sources)


# ---------------------------------------------------------------------------------------------- writing

class _TokenFiles:
    """Random access to the scratch token files, with a bounded number of open maps."""

    def __init__(self, paths: list[Path], dtype: np.dtype):
        self.paths, self.dtype = paths, dtype
        self.open = lru_cache(maxsize=128)(self._open)

    def _open(self, i: int) -> np.ndarray:
        path = self.paths[i]
        return np.memmap(path, dtype=self.dtype, mode="r") if path.stat().st_size else np.zeros(0, self.dtype)


@dataclass
class _Docs:
    """Every document of the run, one row each, in task order."""

    file: np.ndarray  # int32: which scratch token file
    start: np.ndarray  # int64: first token within that file
    length: np.ndarray  # int64: tokens, EOS included
    source: np.ndarray  # int32: index into sources
    is_val: np.ndarray  # bool
    order_key: np.ndarray  # uint64
    removed: np.ndarray  # bool: named by a removal request (no tokens)


def _doc_table(results: list[_PartTokens], tasks: list[_PartTask]) -> _Docs:
    def cat(arrays, dtype):
        return np.concatenate(arrays).astype(dtype, copy=False) if arrays else np.zeros(0, dtype)

    counts = [len(r.lengths) for r in results]
    length = cat([r.lengths for r in results], np.int64)
    part_start = np.cumsum([0] + [int(r.lengths.sum()) for r in results], dtype=np.int64)[:-1]  # as if in one file
    return _Docs(file=np.repeat(np.arange(len(results), dtype=np.int32), counts),
                 start=np.cumsum(length) - length - np.repeat(part_start, counts), length=length,
                 source=np.repeat(np.asarray([t.source_index for t in tasks], np.int32), counts),
                 is_val=cat([r.is_val for r in results], bool), order_key=cat([r.order_key for r in results], np.uint64),
                 removed=cat([r.removed for r in results], bool))


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer (Steele et al. 2014): a bijection of uint64 whose outputs look independent."""
    x = x ^ (x >> np.uint64(30))
    x = x * np.uint64(0xBF58476D1CE4E5B9)
    x = x ^ (x >> np.uint64(27))
    x = x * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))


def _shuffled(chosen: np.ndarray, order_key: np.ndarray, salt: int) -> np.ndarray:
    """The order to write `chosen` (document indices, ascending, a document's copies together) in: by a hash of each
    copy's order_key (itself a hash of the seed and the doc_id), the phase's salt and the copy's number. A uniform
    shuffle that depends neither on the parts' order nor on the process that computes it (ties, which only the same
    doc_id twice in a source makes, by place)."""
    if not len(chosen):
        return np.zeros(0, np.int64)
    starts = np.flatnonzero(np.concatenate([[True], chosen[1:] != chosen[:-1]]))
    copy = np.arange(len(chosen), dtype=np.uint64)
    copy -= np.repeat(starts.astype(np.uint64), np.diff(np.append(starts, len(chosen))))
    mixed = _mix64(order_key[chosen] ^ _mix64(np.uint64((salt + 1) * 0x9E3779B97F4A7C15 % 2 ** 64) + copy))
    del copy
    return np.argsort(mixed, kind="stable")


def _write_split(chosen: np.ndarray, docs: _Docs, files: _TokenFiles, new_path, tokens_per_shard: int,
                 tokenizer_sha256: str, split: str, phase: str, phase_index: int, out_dir: Path,
                 progress: bool, names: list[str], composition: dict,
                 placed: list[tuple[str, np.ndarray]]) -> list[ShardInfo]:
    """Write `chosen` documents (global indices, in this order) into shards of ~tokens_per_shard tokens;
    each shard's documents and tokens per source go into `composition`, its documents in order into `placed`."""
    cum = np.cumsum(docs.length[chosen])
    shards, i, n = [], 0, len(chosen)
    bar = tqdm(total=int(cum[-1]) if n else 0, desc=f"write {split}/{phase}", unit="tok", unit_scale=True,
               disable=not progress)
    while i < n:
        base = int(cum[i - 1]) if i else 0
        end = min(int(np.searchsorted(cum, base + tokens_per_shard, side="left")) + 1, n)
        offsets = np.zeros(end - i + 1, np.uint64)
        offsets[1:] = cum[i:end] - base
        buf = np.empty(int(offsets[-1]), files.dtype)
        pos = 0
        for d in chosen[i:end].tolist():
            length = int(docs.length[d])
            start = int(docs.start[d])
            buf[pos:pos + length] = files.open(int(docs.file[d]))[start:start + length]
            pos += length
        path = new_path()
        write_shard(path, buf, offsets, tokenizer_sha256)
        shards.append(ShardInfo(str(path.relative_to(out_dir)), split, phase, phase_index, len(buf), end - i))
        placed.append((shards[-1].path, chosen[i:end]))
        in_shard = docs.source[chosen[i:end]]
        n_docs = np.bincount(in_shard, minlength=len(names))
        n_tokens = np.bincount(in_shard, weights=docs.length[chosen[i:end]], minlength=len(names))
        composition[shards[-1].path] = {n: {"documents": int(n_docs[k]), "tokens": int(n_tokens[k])}
                                        for k, n in enumerate(names) if n_docs[k]}
        bar.update(len(buf))
        i = end
    bar.close()
    return shards


def write_token_shards(sources: list[SourceParts], tokenizer_path: str | Path, settings: ShardSettings,
                       mixture: Mixture, output: _Writer | Path, engine: Engine = SERIAL,
                       progress: bool = True, requests: Sequence[RemovalRequest | IntakeMatched] = (),
                       license_fields: Mapping[str, str] | None = None) -> ShardSetResult:
    """Tokenize the sources and write train/validation shards into `output` (a DatasetWriter: shards go to
    `writer.next_path("shard", ".bin")`; or a folder), leaving out every document a removal request in
    `requests` names. `license_fields` (source -> `meta` key, `card.license_fields`) says where the member list
    reads each document's licence. The caller commits the manifest with `stats=result.manifest_stats()` and
    `counts=result.counts()`."""
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
    scratch = out_dir / f".tokenize-{uuid.uuid4().hex[:8]}"
    scratch.mkdir()
    try:
        tasks = [_PartTask(i, str(part), str(scratch / f"{i:04d}-{j:06d}.tok"), str(tokenizer_path), tok.sha256,
                           (settings.fim.rate, settings.fim.spm_rate) if s.name in fim_names else None,
                           settings.val_fraction, settings.seed, tuple(requests), license_fields.get(s.name))
                 for i, s in enumerate(sources) for j, part in enumerate(s.parts)]
        results = engine.map_parts(tokenize_part, tasks, desc="tokenize", progress=progress,
                                   size=lambda t: os.path.getsize(t.input_path))
        t_tokenized = time.perf_counter()
        docs = _doc_table(results, tasks)
        part_counts = {n: {"chars": 0, "utf8_bytes": 0, "fim_documents": 0} for n in names}
        for r, t in zip(results, tasks):
            counts = part_counts[names[t.source_index]]
            for key in counts:
                counts[key] += getattr(r, key)
        del results  # their per-document arrays are in `docs` now
        files = _TokenFiles([Path(t.tokens_path) for t in tasks], tok.dtype)

        train = ~docs.is_val & ~docs.removed

        def natural_at_least(floor: int) -> dict[str, int]:
            """Each source's training tokens in documents of at least `floor` tokens (what a phase can draw)."""
            return {n: int(docs.length[train & (docs.length >= floor) & (docs.source == i)].sum())
                    for i, n in enumerate(names)}

        natural = natural_at_least(0)
        try:
            plans = plan_phases(natural, mixture.weights, mixture.token_budget,
                                [(p.name, p.tokens, p.weights,
                                  p.min_document_tokens and natural_at_least(p.min_document_tokens))
                                 for p in mixture.phases])
        except MixtureError as exc:  # say so when the validation split took a source's every document
            all_val = [n for i, n in enumerate(names) if not (train & (docs.source == i)).any()
                       and (docs.is_val & ~docs.removed & (docs.source == i)).any()]
            if not all_val:
                raise
            raise MixtureError(f"{all_val}: no training documents, every one fell into the validation split "
                               f"(shards.val_fraction {settings.val_fraction}): lower shards.val_fraction ({exc})") \
                from None
        minimum = {p.name: p.min_document_tokens for p in mixture.phases}
        # Each phase's draw from each source, as a cut every part applies to its own documents (kiln.tokens.draw):
        # the same documents as sorting each source in its selection order, without holding that order.
        bounds = np.concatenate([[0], np.cumsum(np.bincount(docs.file, minlength=len(tasks)))]).tolist()
        parts = {n: [(lo, hi) for t, lo, hi in zip(tasks, bounds[:-1], bounds[1:]) if t.source_index == i]
                 for i, n in enumerate(names)}

        def training_documents(lo: int, hi: int) -> Documents:
            keep = np.flatnonzero(train[lo:hi]) + lo
            return Documents(docs.order_key[keep], keep, docs.length[keep])

        cuts: dict[str, list[Cut]] = {n: [] for n in names}
        resume: dict[str, tuple[int, int] | None] = dict.fromkeys(names)
        shards: list[ShardInfo] = []
        composition: dict[str, dict[str, dict[str, int]]] = {}
        placed: list[tuple[str, np.ndarray]] = []  # (shard, the global indices of its documents in order)
        copies = docs.is_val.astype(np.int64)  # validation: every document once
        for plan in plans:
            picked = []
            floor = minimum.get(plan.name) or 0
            for n in names:
                held = [training_documents(lo, hi) for lo, hi in parts[n]]
                summary = merge([summarize(d, cuts[n], floor, resume[n]) for d in held])
                cells = needed_cells(plan.draws[n].target_tokens, summary)
                drawn = draw(plan.draws[n].target_tokens, floor, resume[n], summary,
                             [cell_documents(d, cuts[n], floor, resume[n], cells) for d in held])
                cuts[n].append(drawn.cut)
                resume[n] = drawn.resume
                plan.draws[n].tokens, plan.draws[n].documents = drawn.tokens, drawn.documents
                for d in held:
                    picked.append(np.repeat(d.place, cut_copies(d, cuts[n])[-1]))
                del held
            chosen = np.concatenate(picked) if picked else np.zeros(0, np.int64)
            del picked
            copies += np.bincount(chosen, minlength=len(copies))
            chosen = chosen[_shuffled(chosen, docs.order_key, plan.index)]
            shards += _write_split(chosen, docs, files, new_path, settings.tokens_per_shard, tok.sha256, TRAIN,
                                   plan.name, plan.index, out_dir, progress, names, composition, placed)
        val_ids = np.flatnonzero(docs.is_val)
        val_ids = val_ids[_shuffled(val_ids, docs.order_key, _VAL_SHUFFLE)]
        shards += _write_split(val_ids, docs, files, new_path, settings.tokens_per_shard, tok.sha256, VAL,
                               VAL_PHASE, 0, out_dir, progress, names, composition, placed)
        members_path, positions_path = (output.next_path(role) if not isinstance(output, Path | str) else
                                        out_dir / part_name(role, 0) for role in ("members", "positions"))
        _write_lists(members_path, positions_path, tasks, docs, copies, names, placed)
        t_written = time.perf_counter()
    finally:
        shutil.rmtree(scratch, ignore_errors=True)

    warnings = epoch_warnings(plans, natural, mixture.max_epochs_warning)
    if settings.val_fraction > 0 and not len(val_ids):
        warnings.append(f"no document fell into validation (val_fraction {settings.val_fraction}, "
                        f"{len(docs.length)} documents); raise val_fraction or add data")
    per_source = {}
    for i, (n, s) in enumerate(zip(names, sources)):
        mine = (docs.source == i) & ~docs.removed
        used = sum(p.draws[n].tokens for p in plans)
        per_source[n] = {
            "domain": s.domain, "fim": n in fim_names, "parts": len(s.parts),
            "license_field": license_from(license_fields.get(n)),  # the member list's licences
            "documents": int(mine.sum()), "removed_by_request": int(((docs.source == i) & docs.removed).sum()),
            **part_counts[n],
            "train_documents": int((mine & train).sum()), "val_documents": int((mine & docs.is_val).sum()),
            "natural_train_tokens": natural[n], "val_tokens": int(docs.length[mine & docs.is_val].sum()),
            "target_tokens": sum(p.draws[n].target_tokens for p in plans), "train_tokens": used,
            "effective_epochs": round(used / natural[n], 4) if natural[n] else 0.0}
    return ShardSetResult(
        tokenizer_sha256=tok.sha256, vocab_size=tok.vocab_size, eos_id=tok.eos_id, seq_len=settings.seq_len,
        shards=shards, sources=per_source, warnings=warnings,
        phases=[{**p.to_dict(), "min_document_tokens": minimum.get(p.name)} for p in plans],
        seconds={"tokenize": round(t_tokenized - t_start, 3), "write": round(t_written - t_tokenized, 3)},
        members=str(members_path.relative_to(out_dir)), shard_sources=composition)


def _write_lists(members_path: Path, positions_path: Path, tasks: list[_PartTask], docs: _Docs, copies: np.ndarray,
                 names: list[str], placed: list[tuple[str, np.ndarray]]) -> None:
    """The member list (every document, in task order) and the position list (every copy in a shard, grouped by the
    part of its document), written a part at a time: a part's ids and facts from its scratch file, the rest from
    the driver's columns. The copies are sorted by document once, 16 B each, to find a part's."""
    shard_names = pa.array([path for path, _ in placed], pa.string())
    copies_in_shards = sum(len(ids) for _, ids in placed)
    copy_doc = np.empty(copies_in_shards, np.int64)
    copy_shard = np.empty(copies_in_shards, np.int32)
    copy_index = np.empty(copies_in_shards, np.int32)
    k = 0
    for shard, (_, ids) in enumerate(placed):
        end = k + len(ids)
        copy_doc[k:end], copy_shard[k:end], copy_index[k:end] = ids, shard, np.arange(len(ids))
        k = end
    by_doc = np.argsort(copy_doc, kind="stable")
    copy_doc = copy_doc[by_doc]
    copy_shard = copy_shard[by_doc]
    copy_index = copy_index[by_doc]
    del by_doc
    bounds = np.concatenate([[0], np.cumsum(np.bincount(docs.file, minlength=len(tasks)))])

    def write(members_file, positions_file) -> None:
        with pq.ParquetWriter(members_file, MEMBERS_SCHEMA, compression="zstd") as members, \
                pq.ParquetWriter(positions_file, POSITIONS_SCHEMA, compression="zstd") as positions:
            for task, lo, hi in zip(tasks, bounds[:-1].tolist(), bounds[1:].tolist()):
                rows = pq.read_table(task.rows_path, schema=_ROWS_SCHEMA)
                members.write_table(pa.table({
                    "doc_id": rows["doc_id"], "source": pa.array([names[task.source_index]] * (hi - lo), pa.string()),
                    "split": pa.array(np.where(docs.is_val[lo:hi], VAL, TRAIN).astype(object), pa.string()),
                    "copies": pa.array(copies[lo:hi], pa.int32()), "tokens": pa.array(docs.length[lo:hi], pa.int64()),
                    **{c: rows[c] for c in ("removed_by", *_FACTS)}}, schema=MEMBERS_SCHEMA))
                a, b = np.searchsorted(copy_doc, [lo, hi]).tolist()
                positions.write_table(pa.table({
                    "shard": shard_names.take(pa.array(copy_shard[a:b])), "index": pa.array(copy_index[a:b]),
                    "doc_id": rows["doc_id"].take(pa.array(copy_doc[a:b] - lo))}, schema=POSITIONS_SCHEMA))

    # Each file is renamed into place once both are whole: no half list after a crash.
    write_file_atomic(members_path, lambda m: write_file_atomic(positions_path, lambda p: write(m, p)))


__all__ = ["MEMBERS_SCHEMA", "POSITIONS_SCHEMA", "ShardSetResult", "fim_sources", "is_validation", "tokenize_part",
           "write_token_shards"]
