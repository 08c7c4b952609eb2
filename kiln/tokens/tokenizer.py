"""The tokenizer: a sentencepiece model trained on a mixture-weighted sample, a small exact wrapper, a report.

- `draw_training_sample`: documents from every source in the proportions of the mixture weights (by
  characters), chosen by doc_id hash so the same inputs always give the same sample;
- `train_tokenizer`: sentencepiece BPE (or unigram) with byte fallback and reserved special tokens,
  written atomically as `tokenizer.model`, `tokenizer.vocab` and the `tokenizer.json` card;
- `Tokenizer`: load, encode, decode, ids, dtype. decode(encode(text)) == text for any text with the
  default settings (identity normalization, no dummy prefix, whitespace kept, byte fallback);
- `tokenizer_report`: fertility, bytes per token and byte-fallback share per source and language.

Exactness: sentencepiece writes spaces as U+2581 "▁" internally and turns every "▁" back into a space
on decode, so a literal "▁" in the text would come back as " ". The wrapper therefore encodes a literal
"▁" as its three UTF-8 byte pieces (<0xE2><0x96><0x81>), which sentencepiece decodes to "▁" itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import math
import os
import time
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sentencepiece as spm

from kiln.common.config import TokenizerSettings
from kiln.common.manifest import temporary_name
from kiln.curation.documents import Document
from kiln.tokens.mixture import SourceParts, hash_unit, select_documents, shares
from kiln.tokens.shard_format import token_dtype

MODEL_FILE, VOCAB_FILE, CARD_FILE = "tokenizer.model", "tokenizer.vocab", "tokenizer.json"
CARD_FORMAT = "kiln-tokenizer/1"
# Fixed ids 0..6, the same in every Kiln tokenizer; the FIM symbols are control symbols: no text maps to them.
SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "<|endoftext|>", "unk": "<unk>",
                  "fim_prefix": "<|fim_prefix|>", "fim_suffix": "<|fim_suffix|>", "fim_middle": "<|fim_middle|>"}
SENTINEL_PIECE = "<extra_id_{}>"  # T5's sentinels (span corruption), control symbols after the fixed ids
WHITESPACE_META = "\u2581"  # "▁": sentencepiece's space symbol


class TokenizerError(RuntimeError):
    """Training or loading failed; the message says why and what to change."""


# ---------------------------------------------------------------------------------------------- sample

@dataclass
class TrainingSample:
    """The documents a tokenizer is trained on, per source, in draw order (a repeated document appears
    repeatedly, which is how an up-weighted source counts for more)."""

    documents: dict[str, list[Document]]
    by_source: dict[str, dict[str, Any]]  # documents, unique_documents, chars, natural_*, target/actual share

    @property
    def chars(self) -> int:
        return sum(s["chars"] for s in self.by_source.values())

    @property
    def document_count(self) -> int:
        return sum(s["documents"] for s in self.by_source.values())


def read_documents(parts: Iterable[Path], limit: int | None = None, batch_size: int = 1000) -> Iterator[Document]:
    """Documents from Parquet parts in DOCUMENT_SCHEMA, streamed batch by batch."""
    n = 0
    for part in parts:
        for batch in pq.ParquetFile(part).iter_batches(batch_size=batch_size,
                                                       columns=["doc_id", "source", "text", "meta"]):
            for row in batch.to_pylist():
                if limit is not None and n >= limit:
                    return
                yield Document.from_row(row)
                n += 1


def draw_training_sample(sources: Sequence[SourceParts], weights: Mapping[str, float],
                         settings: TokenizerSettings) -> TrainingSample:
    """Draw at most `sample_chars` characters / `sample_documents` documents, each source's share of
    characters following `weights` (empty: natural proportions). A source smaller than its share is
    repeated, as training will repeat it; the doc_id hash order decides which documents come first.

    Two passes over the parts: lengths and ids first, then only the chosen texts, so the corpus is
    never in memory at once.
    """
    index: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # source -> (part, row, chars) in hash order
    for s in sources:
        parts, rows, chars, keys = [], [], [], []
        for p, part in enumerate(s.parts):
            table = pq.read_table(part, columns=["doc_id", "text"])
            n = table.num_rows
            parts.append(np.full(n, p, np.int32))
            rows.append(np.arange(n, dtype=np.int64))
            chars.append(pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64))
            keys.append(np.fromiter((hash_unit("tokenizer-sample", settings.seed, d)
                                     for d in table.column("doc_id").to_pylist()), np.uint64, n))
        cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
        key = cat(keys, np.uint64)
        order = np.argsort(key, kind="stable")
        index[s.name] = (cat(parts, np.int32)[order], cat(rows, np.int64)[order], cat(chars, np.int64)[order])

    natural = {name: int(chars.sum()) for name, (_, _, chars) in index.items()}
    target_shares = shares(list(natural), dict(weights), natural)
    total_chars = min(settings.sample_chars, sum(natural.values()))

    documents: dict[str, list[Document]] = {}
    by_source: dict[str, dict[str, Any]] = {}
    for s in sources:
        part_of, row_of, chars = index[s.name]
        share = target_shares[s.name]
        picked, _ = select_documents(chars, round(share * total_chars))
        picked = picked[: math.ceil(share * settings.sample_documents)]
        texts = _read_rows(s.parts, part_of, row_of, np.unique(picked))
        docs = [texts[int(i)] for i in picked]
        documents[s.name] = docs
        by_source[s.name] = {
            "natural_documents": len(chars), "natural_chars": natural[s.name],
            "documents": len(docs), "unique_documents": len(np.unique(picked)),
            "chars": int(chars[picked].sum()) if len(picked) else 0, "target_share": round(share, 6)}
    total = sum(b["chars"] for b in by_source.values()) or 1
    for b in by_source.values():
        b["share"] = round(b["chars"] / total, 6)
    return TrainingSample(documents, by_source)


def _read_rows(parts: Sequence[Path], part_of: np.ndarray, row_of: np.ndarray, wanted: np.ndarray) -> dict[int, Document]:
    """The documents at positions `wanted` (indices into the hash-ordered arrays), read part by part."""
    found: dict[int, Document] = {}
    by_part: dict[int, list[int]] = defaultdict(list)
    for i in wanted.tolist():
        by_part[int(part_of[i])].append(i)
    for p, positions in by_part.items():
        table = pq.read_table(parts[p], columns=["doc_id", "source", "text", "meta"])
        rows = table.take(np.asarray([row_of[i] for i in positions])).to_pylist()
        found.update({i: Document.from_row(r) for i, r in zip(positions, rows)})
    return found


def sentence_chunks(text: str, max_chars: int) -> Iterator[str]:
    """Cut a document into training "sentences" of at most `max_chars` characters, at line ends where
    possible: sentencepiece skips longer sentences outright, which would hide long documents."""
    start, n = 0, len(text)
    while start < n:
        end = min(start + max_chars, n)
        if end < n:
            cut = text.rfind("\n", start, end)
            if cut >= start + max_chars // 4:
                end = cut + 1
        yield text[start:end]
        start = end


# ---------------------------------------------------------------------------------------------- training

@dataclass
class TokenizerCard:
    """What `tokenizer.json` holds: enough to tell which tokenizer made a shard and how it was trained."""

    sha256: str
    vocab_size: int
    model_type: str
    dtype: str
    special_tokens: dict[str, dict[str, Any]]  # name -> {piece, id}
    settings: dict[str, Any]
    sample: dict[str, Any]  # documents, chars, by_source
    sentencepiece_version: str
    seconds: float
    files: dict[str, str] = field(default_factory=lambda: {"model": MODEL_FILE, "vocab": VOCAB_FILE})
    format: str = CARD_FORMAT

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def read(cls, path: Path) -> TokenizerCard:
        path = Path(path)
        return cls(**json.loads((path / CARD_FILE if path.is_dir() else path).read_text(encoding="utf-8")))


def sentinel_pieces(count: int) -> list[str]:
    return [SENTINEL_PIECE.format(i) for i in range(count)]


def trainer_options(settings: TokenizerSettings) -> dict[str, Any]:
    """The sentencepiece trainer arguments a `TokenizerSettings` stands for."""
    return dict(
        vocab_size=settings.vocab_size, model_type=settings.model_type, byte_fallback=settings.byte_fallback,
        split_digits=settings.split_digits, character_coverage=settings.character_coverage,
        max_sentencepiece_length=settings.max_piece_length,
        normalization_rule_name="identity" if settings.normalization == "identity" else "nfkc",
        add_dummy_prefix=settings.add_dummy_prefix, remove_extra_whitespaces=settings.remove_extra_whitespaces,
        allow_whitespace_only_pieces=True, split_by_whitespace=True,
        max_sentence_length=4 * settings.max_sentence_chars + 16,  # bytes; chunks are cut by characters
        pad_id=0, bos_id=1, eos_id=2, unk_id=3, pad_piece=SPECIAL_TOKENS["pad"], bos_piece=SPECIAL_TOKENS["bos"],
        eos_piece=SPECIAL_TOKENS["eos"], unk_piece=SPECIAL_TOKENS["unk"],
        control_symbols=[SPECIAL_TOKENS["fim_prefix"], SPECIAL_TOKENS["fim_suffix"], SPECIAL_TOKENS["fim_middle"],
                         *sentinel_pieces(settings.sentinel_tokens)],
        num_threads=settings.num_threads or os.cpu_count() or 1, minloglevel=2,
    )


def train_tokenizer(sample: TrainingSample, settings: TokenizerSettings, out_dir: Path) -> TokenizerCard:
    """Train sentencepiece on the sample and write `tokenizer.model`, `tokenizer.vocab`, `tokenizer.json`
    into `out_dir` (each atomically). Same sample and settings give the same model bytes."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    if sample.chars == 0:
        raise TokenizerError("the tokenizer training sample is empty: every source is empty or weighted 0; "
                             "check the upstream datasets and mixture.weights")

    def sentences() -> Iterator[str]:
        for docs in sample.documents.values():
            for doc in docs:
                yield from sentence_chunks(doc.text, settings.max_sentence_chars)

    model = io.BytesIO()
    spm.set_random_generator_seed(settings.seed)
    t0 = time.perf_counter()
    try:
        spm.SentencePieceTrainer.train(sentence_iterator=sentences(), model_writer=model, **trainer_options(settings))
    except RuntimeError as exc:
        hint = ("; lower tokenizer.vocab_size or give the tokenizer a larger sample (sample_chars / "
                "sample_documents, or more data)") if "Vocabulary size" in str(exc) else ""
        raise TokenizerError(f"sentencepiece training failed: {exc}{hint}") from None
    seconds = time.perf_counter() - t0
    data = model.getvalue()
    _write_atomic(out_dir / MODEL_FILE, data)
    tokenizer = Tokenizer(data)
    _write_atomic(out_dir / VOCAB_FILE, tokenizer.vocab_tsv().encode("utf-8"))
    card = TokenizerCard(
        sha256=tokenizer.sha256, vocab_size=tokenizer.vocab_size, model_type=settings.model_type,
        dtype=tokenizer.dtype.name,
        special_tokens={name: {"piece": piece, "id": tokenizer.piece_to_id(piece)} for name, piece in
                        [*SPECIAL_TOKENS.items(), *((f"sentinel_{i}", p) for i, p in
                                                    enumerate(sentinel_pieces(settings.sentinel_tokens)))]},
        settings=settings.model_dump(),
        sample={"documents": sample.document_count, "chars": sample.chars, "by_source": sample.by_source},
        sentencepiece_version=spm.__version__, seconds=round(seconds, 3))
    _write_atomic(out_dir / CARD_FILE, json.dumps(card.to_dict(), indent=2, ensure_ascii=False).encode("utf-8"))
    return card


def _write_atomic(path: Path, data: bytes) -> None:
    tmp = temporary_name(path)
    try:
        tmp.write_bytes(data)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


# ---------------------------------------------------------------------------------------------- wrapper

class Tokenizer:
    """A trained Kiln tokenizer: exact encode/decode, special ids, the token dtype for shards."""

    def __init__(self, model: bytes):
        self.sha256 = hashlib.sha256(model).hexdigest()
        self.sp = spm.SentencePieceProcessor(model_proto=model, num_threads=1)
        self.vocab_size = self.sp.get_piece_size()
        self.pad_id, self.bos_id, self.eos_id, self.unk_id = (self.sp.pad_id(), self.sp.bos_id(), self.sp.eos_id(),
                                                              self.sp.unk_id())
        self.fim_prefix_id, self.fim_suffix_id, self.fim_middle_id = (
            self.piece_to_id(SPECIAL_TOKENS[k]) for k in ("fim_prefix", "fim_suffix", "fim_middle"))
        # A literal "▁" is written as its UTF-8 byte pieces (see the module docstring).
        byte_ids = [self.sp.piece_to_id(f"<0x{b:02X}>") for b in WHITESPACE_META.encode("utf-8")]
        self._meta_ids = byte_ids if all(self.sp.is_byte(i) for i in byte_ids) else [self.unk_id]

    @classmethod
    def load(cls, path: str | Path) -> Tokenizer:
        """From `tokenizer.model` or the folder holding it."""
        path = Path(path)
        if path.is_dir():
            path = path / MODEL_FILE
        try:
            return cls(path.read_bytes())
        except FileNotFoundError:
            raise TokenizerError(f"no tokenizer model at {path}; materialize the tokenizer asset first") from None

    def piece_to_id(self, piece: str) -> int:
        i = self.sp.piece_to_id(piece)
        if i == self.unk_id and piece != SPECIAL_TOKENS["unk"]:
            raise TokenizerError(f"the tokenizer has no piece {piece!r}: it was not trained by kiln.tokens.tokenizer")
        return i

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1) -> list[list[int]]:
        """Encode many texts in one sentencepiece call (`num_threads` > 1 uses its thread pool)."""
        if not any(WHITESPACE_META in t for t in texts):
            return self.sp.encode(list(texts), num_threads=num_threads)
        pieces = [t.split(WHITESPACE_META) for t in texts]
        flat = self.sp.encode([seg for segs in pieces for seg in segs], num_threads=num_threads)
        out, k = [], 0
        for segs in pieces:
            ids = list(flat[k])
            for seg_ids in flat[k + 1:k + len(segs)]:
                ids += self._meta_ids
                ids += seg_ids
            out.append(ids)
            k += len(segs)
        return out

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        return self.sp.decode(ids)

    def pieces(self, ids: Iterable[int] | np.ndarray) -> list[str]:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        return [self.sp.id_to_piece(int(i)) for i in ids]

    def byte_mask(self) -> np.ndarray:
        """True at the ids of byte-fallback pieces."""
        return np.array([self.sp.is_byte(i) for i in range(self.vocab_size)], dtype=bool)

    def vocab_tsv(self) -> str:
        """id, piece, score per line; backslash, tab, CR and LF in pieces are written as \\\\ \\t \\r \\n."""
        esc = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
        return "".join(f"{i}\t{self.sp.id_to_piece(i).translate(esc)}\t{self.sp.get_score(i):g}\n"
                       for i in range(self.vocab_size))


# ---------------------------------------------------------------------------------------------- report

def tokenizer_report(tokenizer: Tokenizer, documents_by_source: Mapping[str, Iterable[Document]],
                     examples_per_source: int = 2, example_chars: int = 160) -> dict[str, Any]:
    """How well the tokenizer fits each source and language: fertility (tokens per whitespace word),
    UTF-8 bytes per token, the share of byte-fallback tokens, and a few documents shown as pieces."""
    is_byte = tokenizer.byte_mask()
    totals: dict[str, dict[str, Counter]] = {"sources": defaultdict(Counter), "languages": defaultdict(Counter)}
    examples = []
    for source, docs in documents_by_source.items():
        seen = set()
        batch: list[Document] = []

        def flush() -> None:
            for doc, ids in zip(batch, tokenizer.encode_batch([d.text for d in batch])):
                ids = np.asarray(ids, dtype=np.int64)
                counts = Counter(documents=1, words=len(doc.text.split()), tokens=len(ids),
                                 bytes=len(doc.text.encode("utf-8", "surrogatepass")),
                                 byte_tokens=int(is_byte[ids].sum()) if len(ids) else 0)
                totals["sources"][source].update(counts)
                totals["languages"][str(doc.meta.get("language") or "unknown")].update(counts)
            batch.clear()

        for doc in docs:
            if doc.doc_id in seen:  # a training sample repeats up-weighted documents
                continue
            seen.add(doc.doc_id)
            if len([e for e in examples if e["source"] == source]) < examples_per_source:
                ids = tokenizer.encode(doc.text[:example_chars])
                examples.append({"source": source, "doc_id": doc.doc_id, "text": doc.text[:example_chars],
                                 "tokens": len(ids), "pieces": tokenizer.pieces(ids)})
            batch.append(doc)
            if len(batch) >= 256:
                flush()
        flush()

    def summary(c: Counter) -> dict[str, Any]:
        return {"documents": c["documents"], "words": c["words"], "tokens": c["tokens"], "bytes": c["bytes"],
                "fertility": round(c["tokens"] / c["words"], 4) if c["words"] else None,
                "bytes_per_token": round(c["bytes"] / c["tokens"], 4) if c["tokens"] else None,
                "byte_fallback_share": round(c["byte_tokens"] / c["tokens"], 6) if c["tokens"] else None}

    everything = sum(totals["sources"].values(), Counter())
    return {"tokenizer_sha256": tokenizer.sha256, "vocab_size": tokenizer.vocab_size, "overall": summary(everything),
            "sources": {k: summary(v) for k, v in totals["sources"].items()},
            "languages": {k: summary(v) for k, v in sorted(totals["languages"].items())},
            "examples": examples}


__all__ = ["SPECIAL_TOKENS", "Tokenizer", "TokenizerCard", "TokenizerError", "TrainingSample",
           "draw_training_sample", "read_documents", "sentence_chunks", "tokenizer_report", "train_tokenizer"]
