"""Documents → training-ready token shards (the format lives in kiln.tokens.shard_format).

`write_token_shards` does, in order:
1. split: a document is validation when hash(doc_id) < val_fraction (salted independently of the seed,
   so changing the shuffle seed never moves a document between train and validation);
2. tokenize every Parquet part in a process pool into a scratch token file (EOS after every document);
   training documents of FIM sources are first rearranged by kiln.tokens.fim (validation stays plain text, so
   validation loss is comparable across FIM settings);
3. mixture: per phase, each source's token target from the weights (kiln.tokens.mixture), met by whole passes
   plus a deterministic subset of its documents in doc_id-hash order; later phases continue that order;
4. shuffle the chosen documents of each phase (seed, phase) and write shards of ~tokens_per_shard tokens,
   documents never split across shards; validation: every validation document once, shuffled;
5. the member list (`members-*.parquet`): every input document with its split, how many copies of it the
   shards hold and its tokens, so an audit can say exactly whether a document was trained on, and its licence and
   language as the data card counts them (kiln.governance.document_facts), so the card of a checkpoint still
   counts them once the documents' stage is materialized again;
6. the position list (`positions-*.parquet`): which document of which shard each copy is, so a later run that
   replays these shards can skip the documents a removal request names since (kiln.governance.replay).

Removal requests (`kiln forget`) are applied here too, to every refresh's documents: a document one names is not
tokenized, and its member row says which request removed it (the quality filter applies them only to the
refreshes it re-runs, and the shards read every refresh so far).

Texts and token ids are streamed part by part; the driver keeps a row per document (its length, split, order
key, licence, language, and the doc_id once the member list is built), not a part at a time (docs/scale.md).
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
from kiln.common.storage import part_name, write_parquet_atomic
from kiln.engine import SERIAL, Engine
from kiln.governance.document_facts import document_facts, license_from
from kiln.governance.forget import REQUEST_COLUMNS, IntakeMatched, RemovalRequest, naming_requests
from kiln.tokens.fim import FimIds, fim_split, fim_tokens
from kiln.tokens.mixture import MixtureError, SourceParts, epoch_warnings, hash_unit, plan_phases, select_documents
from kiln.tokens.shard_format import TRAIN, VAL, ShardInfo, describe_shard_set, write_shard
from kiln.tokens.tokenizer import FIM_ROLES, Tokenizer, TokenizerError, continuation_flags

VAL_PHASE = "val"
_VAL_SALT = "kiln-val-split"
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


@dataclass
class _PartTokens:
    """What a worker sends back: per document, its token count (EOS included), split and order key."""

    lengths: np.ndarray  # int64
    is_val: np.ndarray  # bool
    order_key: np.ndarray  # uint64: selection order for repetition / subsets
    fim_documents: int
    chars: int
    utf8_bytes: int
    removed_by: dict[int, str] = field(default_factory=dict)  # row -> the removal request's reason
    facts: pa.Table | None = None  # per document: _FACTS (MEMBERS_SCHEMA), null where removed


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
    lengths, is_val, keys, removed_by, facts = [], [], [], {}, []
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
                if request is not None:
                    removed_by[len(is_val)] = request.reject_reason  # no tokens, never chosen
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
    return _PartTokens(np.asarray(lengths, np.int64), np.asarray(is_val, bool), np.asarray(keys, np.uint64),
                       fim_docs, chars, n_bytes, removed_by,
                       pa.table({c: pa.array(list(v), pa.string()) for c, v in zip(_FACTS, facts_by_column)}))




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

    starts = [np.concatenate([[0], np.cumsum(r.lengths)[:-1]]) if len(r.lengths) else np.zeros(0, np.int64)
              for r in results]
    return _Docs(file=cat([np.full(len(r.lengths), i) for i, r in enumerate(results)], np.int32),
                 start=cat(starts, np.int64), length=cat([r.lengths for r in results], np.int64),
                 source=cat([np.full(len(r.lengths), t.source_index) for r, t in zip(results, tasks)], np.int32),
                 is_val=cat([r.is_val for r in results], bool), order_key=cat([r.order_key for r in results], np.uint64),
                 removed=cat([np.isin(np.arange(len(r.lengths)), list(r.removed_by)) for r in results], bool))


def _write_split(chosen: np.ndarray, docs: _Docs, files: _TokenFiles, new_path, tokens_per_shard: int,
                 tokenizer_sha256: str, split: str, phase: str, phase_index: int, out_dir: Path,
                 progress: bool, names: list[str], composition: dict,
                 placed: list[tuple[str, np.ndarray]]) -> list[ShardInfo]:
    """Write `chosen` documents (global indices, in this order) into shards of ~tokens_per_shard tokens;
    each shard's documents and tokens per source go into `composition`, its documents in order into `placed`."""
    lengths = docs.length[chosen]
    cum = np.cumsum(lengths)
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
        # Each source's training documents in their fixed selection order (doc_id hash), as global indices.
        orders = {}
        for i, n in enumerate(names):
            members = np.flatnonzero(train & (docs.source == i))
            orders[n] = members[np.argsort(docs.order_key[members], kind="stable")]
        # Per source: how often each document (by its place in `orders`) was drawn, and where the last phase stopped.
        # A phase draws the least drawn documents it may (long enough for its floor) first, from where the last one
        # stopped: it repeats a document only after every other one it may draw was drawn as often.
        uses = {n: np.zeros(len(orders[n]), np.int64) for n in names}
        resume_at = dict.fromkeys(names, 0)
        shards: list[ShardInfo] = []
        composition: dict[str, dict[str, dict[str, int]]] = {}
        placed: list[tuple[str, np.ndarray]] = []  # (shard, the global indices of its documents in order)
        copies = docs.is_val.astype(np.int64)  # validation: every document once
        for plan in plans:
            picked = []
            floor = minimum.get(plan.name) or 0
            for n in names:
                draw, order, used = plan.draws[n], orders[n], uses[n]
                eligible = np.flatnonzero(docs.length[order] >= floor) if floor else np.arange(len(order))
                sequence = eligible[np.lexsort(((eligible - resume_at[n]) % max(len(order), 1), used[eligible]))]
                chosen, _ = select_documents(docs.length[order[sequence]], draw.target_tokens)
                drawn = sequence[chosen]
                np.add.at(used, drawn, 1)
                if len(drawn):
                    resume_at[n] = (int(drawn[-1]) + 1) % len(order)
                ids = order[drawn]
                draw.tokens, draw.documents = int(docs.length[ids].sum()), len(ids)
                picked.append(ids)
            chosen = np.concatenate(picked) if picked else np.zeros(0, np.int64)
            copies += np.bincount(chosen, minlength=len(copies))
            chosen = chosen[np.random.default_rng([settings.seed, plan.index]).permutation(len(chosen))]
            shards += _write_split(chosen, docs, files, new_path, settings.tokens_per_shard, tok.sha256, TRAIN,
                                   plan.name, plan.index, out_dir, progress, names, composition, placed)
        val_ids = np.flatnonzero(docs.is_val)  # in doc_id-hash order, as training's: the same whatever the parts' order
        val_ids = val_ids[np.argsort(docs.order_key[val_ids], kind="stable")]
        val_ids = val_ids[np.random.default_rng([settings.seed, 1 << 31]).permutation(len(val_ids))]
        shards += _write_split(val_ids, docs, files, new_path, settings.tokens_per_shard, tok.sha256, VAL,
                               VAL_PHASE, 0, out_dir, progress, names, composition, placed)
        members_path, positions_path = (output.next_path(role) if not isinstance(output, Path | str) else
                                        out_dir / part_name(role, 0) for role in ("members", "positions"))
        doc_ids = _doc_ids(tasks, docs)
        write_parquet_atomic(members_path, _members_table(doc_ids, results, docs, copies, names))
        write_parquet_atomic(positions_path, _positions_table(doc_ids, placed))
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
        part_results = [r for r, t in zip(results, tasks) if t.source_index == i]
        used = sum(p.draws[n].tokens for p in plans)
        per_source[n] = {
            "domain": s.domain, "fim": n in fim_names, "parts": len(s.parts),
            "license_field": license_from(license_fields.get(n)),  # the member list's licences
            "documents": int(mine.sum()), "removed_by_request": int(((docs.source == i) & docs.removed).sum()),
            "chars": sum(r.chars for r in part_results),
            "utf8_bytes": sum(r.utf8_bytes for r in part_results),
            "fim_documents": sum(r.fim_documents for r in part_results),
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


def _doc_ids(tasks: list[_PartTask], docs: _Docs) -> pa.Array:
    """Every document's doc_id in task order (the order of `docs`), read back from the input parts."""
    doc_ids = [chunk for t in tasks for chunk in pq.read_table(t.input_path, columns=["doc_id"]).column(0).chunks]
    doc_ids = pa.chunked_array(doc_ids, pa.string()).combine_chunks()
    if len(doc_ids) != len(docs.length):
        raise RuntimeError(f"member list: {len(doc_ids)} doc_ids read back, {len(docs.length)} documents tokenized; "
                           f"an input part changed while token shards were written; re-run token_shards")
    return doc_ids


def _positions_table(doc_ids: pa.Array, placed: list[tuple[str, np.ndarray]]) -> pa.Table:
    """Every document copy in every shard: the shard, its index there, its doc_id."""
    sizes = [len(ids) for _, ids in placed]
    order = np.concatenate([ids for _, ids in placed]) if placed else np.zeros(0, np.int64)
    return pa.table({"shard": pa.array([p for p, ids in placed for _ in range(len(ids))], pa.string()),
                     "index": pa.array(np.concatenate([np.arange(n) for n in sizes]) if sizes else [], pa.int32()),
                     "doc_id": doc_ids.take(pa.array(order, pa.int64()))}, schema=POSITIONS_SCHEMA)


def _members_table(doc_ids: pa.Array, results: list[_PartTokens], docs: _Docs, copies: np.ndarray,
                   names: list[str]) -> pa.Table:
    """Every document of the run in task order (the order of `docs`), with its split, copies and tokens, or the
    removal request that left it out, and its licence and language."""
    facts = pa.concat_tables([r.facts for r in results]) if results else None  # in task order, as `docs`
    return pa.table({"doc_id": doc_ids,
                     "source": pa.array(np.asarray(names, dtype=object)[docs.source], pa.string()),
                     "split": pa.array(np.where(docs.is_val, VAL, TRAIN).astype(object), pa.string()),
                     "copies": pa.array(copies, pa.int32()), "tokens": pa.array(docs.length, pa.int64()),
                     "removed_by": pa.array([r.removed_by.get(row) for r in results for row in range(len(r.lengths))],
                                            pa.string()),
                     **{c: facts.column(c) if facts is not None else pa.array([], pa.string()) for c in _FACTS}},
                    schema=MEMBERS_SCHEMA)


__all__ = ["MEMBERS_SCHEMA", "POSITIONS_SCHEMA", "ShardSetResult", "fim_sources", "is_validation", "tokenize_part",
           "write_token_shards"]
