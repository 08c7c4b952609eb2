"""The tokenizer: a sentencepiece model trained on a mixture-weighted sample, or one brought as a file, behind one
small interface, and a report.

- `draw_training_sample`: documents from every source in the proportions of the mixture weights (by
  characters), chosen by doc_id hash so the same inputs always give the same sample;
- `train_tokenizer`: sentencepiece BPE (or unigram) with byte fallback and reserved special tokens,
  written atomically as `tokenizer.model`, `tokenizer.vocab` and the `tokenizer.json` card;
- `bring_tokenizer`: `tokenizer.source: <path>`, a Hugging Face `tokenizers` file (tokenizer.json, read by the
  `tokenizers` library) or a SentencePiece model (.model, read by sentencepiece as a trained one is), copied byte
  for byte so its sha256 is its identity; special tokens resolved by role or a clear error;
- `Tokenizer`: load, encode, decode, special ids, vocab size, dtype, sha256, whichever kind. A trained one:
  decode(encode(text)) == text for any text with the default settings (identity normalization, no dummy prefix,
  whitespace kept, byte fallback); a brought one as exact as its file makes it (the asset's check counts);
- `tokenizer_report`: fertility, bytes per token and byte-fallback share per source and language.

Exactness: sentencepiece writes spaces as U+2581 "▁" internally and turns every "▁" back into a space
on decode, so a literal "▁" in the text would come back as " ". The wrapper therefore encodes a literal
"▁" as its three UTF-8 byte pieces (<0xE2><0x96><0x81>), which sentencepiece decodes to "▁" itself.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import time
from abc import ABC, abstractmethod
from collections import Counter, defaultdict
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import sentencepiece as spm
from sentencepiece import sentencepiece_model_pb2
import tokenizers as hf_tokenizers

from kiln.common.config import TokenizerSettings
from kiln.common.config.tokens import SPECIAL_ROLES
from kiln.common.manifest import write_file_atomic
from kiln.common.text_units import count_words, dominant_script
from kiln.curation.documents import Document
from kiln.governance.forget import REQUEST_COLUMNS, IntakeMatched, RemovalRequest, naming_requests
from kiln.tokens.fim import fim_split
from kiln.tokens.mixture import SourceParts, hash_unit, select_documents, shares, split_budget
from kiln.tokens.shard_format import token_dtype
from training_jobs.tokenizer_files import ASSET_HF_FILE, CARD_FILE, EXPORT_CARD_FILE, model_file
from training_jobs.tokenizer_files import SENTENCEPIECE_FILE as MODEL_FILE

VOCAB_FILE = "tokenizer.vocab"
CARD_FORMAT = "kiln-tokenizer/1"
SENTENCEPIECE, TOKENIZERS = "sentencepiece", "tokenizers"  # the library that reads a model file
BYTE_PIECE = re.compile(r"<0x[0-9A-F]{2}>")  # byte-fallback pieces, in sentencepiece's and tokenizers' spelling
# Fixed ids 0..6, the same in every Kiln tokenizer; the FIM symbols are control symbols: no text maps to them.
SPECIAL_TOKENS = {"pad": "<pad>", "bos": "<s>", "eos": "<|endoftext|>", "unk": "<unk>",
                  "fim_prefix": "<|fim_prefix|>", "fim_suffix": "<|fim_suffix|>", "fim_middle": "<|fim_middle|>"}
FIM_ROLES = ("fim_prefix", "fim_suffix", "fim_middle")  # in kiln.tokens.fim.FimIds order
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
                         settings: TokenizerSettings,
                         requests: Sequence[RemovalRequest | IntakeMatched] = ()) -> TrainingSample:
    """Draw at most `sample_chars` characters / `sample_documents` documents, each source's share of
    characters following `weights` (empty: natural proportions) whichever cap binds. A source smaller than its share
    is repeated, as training will repeat it; the doc_id hash order decides which documents come first. A document a
    removal request in `requests` names is never drawn (older refreshes still hold the documents a request removed
    from the partitions filtered since), as the token shards leave it out.

    Two passes over the parts: lengths and ids first, then only the chosen texts, so the corpus is
    never in memory at once.
    """
    index: dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}  # source -> (part, row, chars) in hash order
    for s in sources:
        parts, rows, chars, keys = [], [], [], []
        for p, part in enumerate(s.parts):
            table = pq.read_table(part, columns=["text", *(REQUEST_COLUMNS if requests else ["doc_id"])])
            ids = table.column("doc_id").to_pylist()
            drawable = np.array([r is None for r in naming_requests(requests, table)], bool)
            n = int(drawable.sum())
            parts.append(np.full(n, p, np.int32))
            rows.append(np.flatnonzero(drawable).astype(np.int64))
            chars.append(pc.utf8_length(table.column("text")).to_numpy(zero_copy_only=False).astype(np.int64)[drawable])
            keys.append(np.fromiter((hash_unit("tokenizer-sample", settings.seed, d)
                                     for d, ok in zip(ids, drawable) if ok), np.uint64, n))
        cat = (lambda xs, dt: np.concatenate(xs) if xs else np.zeros(0, dt))
        key = cat(keys, np.uint64)
        order = np.argsort(key, kind="stable")
        index[s.name] = (cat(parts, np.int32)[order], cat(rows, np.int64)[order], cat(chars, np.int64)[order])

    natural = {name: int(chars.sum()) for name, (_, _, chars) in index.items()}
    target_shares = shares(list(natural), dict(weights), natural)
    total_chars = min(settings.sample_chars, sum(natural.values()))

    def draw(chars_total: int) -> dict[str, np.ndarray]:  # each source's documents for its share of chars_total
        # (largest-remainder shares: rounding each source's up drew a document too many per source)
        targets = split_budget(chars_total, target_shares)
        return {n: select_documents(index[n][2], targets[n])[0] for n in natural}

    def count(drawn: dict[str, np.ndarray]) -> int:
        return sum(len(d) for d in drawn.values())

    drawn = draw(total_chars)
    if count(drawn) > settings.sample_documents:
        # The document cap binds (first on a source of short documents): every source's characters shrink by the
        # same factor, the largest whose documents fit (bisection), so the shares stay the weights. Capping each
        # source at a character share of the documents stopped a source of short documents far below its share.
        fits, too_many = 0, total_chars  # draw(fits) fits under the cap, draw(too_many) does not
        while too_many - fits > 1:
            mid = (fits + too_many) // 2
            if count(draw(mid)) <= settings.sample_documents:
                fits = mid
            else:
                too_many = mid
        drawn = draw(fits)
    documents: dict[str, list[Document]] = {}
    by_source: dict[str, dict[str, Any]] = {}
    for s in sources:
        part_of, row_of, chars = index[s.name]
        share = target_shares[s.name]
        picked = drawn[s.name]
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


# ---------------------------------------------------------------------------------------------- card

@dataclass
class TokenizerCard:
    """What `tokenizer.json` holds: enough to tell which tokenizer made a shard and how it was trained or where it
    was brought from."""

    sha256: str  # of the model file (files["model"]): the tokenizer's identity in shards, runs and cards
    vocab_size: int
    model_type: str
    dtype: str
    special_tokens: dict[str, dict[str, Any]]  # name -> {piece, id} (+ "same_as": "eos" where one stands in)
    settings: dict[str, Any]  # TokenizerSettings.applicable()
    sample: dict[str, Any]  # documents, chars, by_source: what it was trained on, or (brought) what it was measured on
    sentencepiece_version: str | None
    seconds: float
    files: dict[str, str] = field(default_factory=lambda: {"model": MODEL_FILE, "vocab": VOCAB_FILE})
    format: str = CARD_FORMAT
    source: str = "train"  # `train`, or the path of the brought file as the config gave it
    kind: str = SENTENCEPIECE  # which library reads the model file: sentencepiece | tokenizers
    tokenizers_version: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def read(cls, path: Path) -> TokenizerCard:
        path = Path(path)
        return cls(**json.loads((path / CARD_FILE if path.is_dir() else path).read_text(encoding="utf-8")))


def _write_card(tokenizer: Tokenizer, out_dir: Path, settings: TokenizerSettings, sample: TrainingSample,
                model_type: str, seconds: float, model_file: str) -> TokenizerCard:
    """`tokenizer.vocab` and the card, beside the model file `model_file` already in `out_dir`."""
    _write_atomic(out_dir / VOCAB_FILE, tokenizer.vocab_tsv().encode("utf-8"))
    card = TokenizerCard(
        sha256=tokenizer.sha256, vocab_size=tokenizer.vocab_size, model_type=model_type, dtype=tokenizer.dtype.name,
        special_tokens=tokenizer.special_tokens(), settings=settings.applicable(),
        sample={"documents": sample.document_count, "chars": sample.chars, "by_source": sample.by_source},
        sentencepiece_version=spm.__version__ if tokenizer.kind == SENTENCEPIECE else None, seconds=round(seconds, 3),
        files={"model": model_file, "vocab": VOCAB_FILE}, source=settings.source, kind=tokenizer.kind,
        tokenizers_version=hf_tokenizers.__version__ if tokenizer.kind == TOKENIZERS else None)
    _write_atomic(out_dir / CARD_FILE, json.dumps(card.to_dict(), indent=2, ensure_ascii=False).encode("utf-8"))
    return card


# ---------------------------------------------------------------------------------------------- training

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
        if "required_chars" in str(exc):  # Chinese or Japanese text: thousands of characters must each have a piece
            hint = "; raise tokenizer.vocab_size above the characters it names, or lower tokenizer.character_coverage"
        elif "Vocabulary size" in str(exc):
            hint = ("; lower tokenizer.vocab_size or give the tokenizer a larger sample (sample_chars / "
                    "sample_documents, or more data)")
        else:
            hint = ""
        raise TokenizerError(f"sentencepiece training failed: {exc}{hint}") from None
    seconds = time.perf_counter() - t0
    # SentencePiece records its trainer threads in the model; num_threads 0 is one per core, so the sha256 (the
    # tokenizer's identity) changed with the machine. The count is dropped (not set to a made-up value: the model
    # does not depend on it), so the proto reads its default.
    proto = model_proto(model.getvalue())
    proto.trainer_spec.ClearField("num_threads")
    data = proto.SerializeToString()
    _write_atomic(out_dir / MODEL_FILE, data)
    tokenizer = SentencePieceTokenizer(data, sentinels=settings.sentinel_tokens)
    return _write_card(tokenizer, out_dir, settings, sample, settings.model_type, seconds, MODEL_FILE)


def bring_tokenizer(sample: TrainingSample, settings: TokenizerSettings, out_dir: Path) -> TokenizerCard:
    """The tokenizer file `settings.source` copied byte for byte into `out_dir` (its sha256 stays its identity),
    with `tokenizer.vocab` and the card; its special tokens resolved (`settings.special_tokens` first), or a
    `TokenizerError` naming the key to set. `sample` is recorded as what its reports are measured on."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        data = Path(settings.source).expanduser().read_bytes()
    except OSError as exc:
        raise TokenizerError(f"tokenizer.source = {settings.source!r} cannot be read ({exc.strerror}); give the path "
                             f"of a tokenizer.json or SentencePiece .model, or `train`") from None
    tokenizer = Tokenizer.from_bytes(data, dict(settings.special_tokens), origin=f"tokenizer.source = "
                                                                                f"{settings.source!r}")
    name = MODEL_FILE if tokenizer.kind == SENTENCEPIECE else ASSET_HF_FILE
    _write_atomic(out_dir / name, data)
    return _write_card(tokenizer, out_dir, settings, sample, tokenizer.model_type, time.perf_counter() - t0, name)


def _write_atomic(path: Path, data: bytes) -> None:
    write_file_atomic(path, lambda f: f.write(data))


# ---------------------------------------------------------------------------------------------- wrapper

class Tokenizer(ABC):
    """What Kiln needs of a tokenizer, whichever library reads it: exact-as-the-file encode/decode, the special ids
    by role, the vocabulary size and token dtype, and the model file's sha256 (its identity).

    `Tokenizer.load(path)` reads a model file or a folder Kiln wrote (see training_jobs.tokenizer_files); the
    subclasses are the two kinds: `SentencePieceTokenizer` (trained here, or a brought .model) and
    `HFTokenizer` (a brought Hugging Face `tokenizers` file). Special ids: `eos` is required; `bos` and `pad` fall
    back to `eos` (pad only fills positions no loss reads); `unk`, the FIM symbols and sentinels may be absent
    (None / []) and are asked for with `require` where a stage needs them."""

    kind: str
    model_type: str
    sha256: str
    vocab_size: int
    specials: dict[str, tuple[str, int]]  # role -> (piece, id), bos/eos/pad always present
    sentinel_ids: list[int]  # <extra_id_0>, <extra_id_1>, ... while consecutive from 0
    origin: str  # how errors name where the tokenizer came from

    @staticmethod
    def load(path: str | Path, special_tokens: Mapping[str, str] | None = None) -> Tokenizer:
        """From a model file, or a folder holding one (the tokenizer asset's folder, an HF export). The Kiln card
        beside the file, when it describes that file, supplies the special tokens the tokenizer asset resolved
        (tokenizer.special_tokens included), unless `special_tokens` are given."""
        path = Path(path)
        try:
            file = model_file(path)
            data = file.read_bytes()
        except FileNotFoundError:
            raise TokenizerError(f"no tokenizer model at {path}; materialize the tokenizer asset first") from None
        if special_tokens is None:
            cards = [file.parent / EXPORT_CARD_FILE] + ([file.parent / CARD_FILE] if file.name != CARD_FILE else [])
            card = next((json.loads(c.read_text(encoding="utf-8")) for c in cards if c.is_file()), None)
            if card is not None and card.get("sha256") == hashlib.sha256(data).hexdigest():
                special_tokens = {k: v["piece"] for k, v in card.get("special_tokens", {}).items()
                                  if k in SPECIAL_ROLES and "same_as" not in v}
        return Tokenizer.from_bytes(data, special_tokens, origin=str(file))

    @staticmethod
    def from_bytes(data: bytes, special_tokens: Mapping[str, str] | None = None, origin: str = "the tokenizer",
                   sentinels: int | None = None) -> Tokenizer:
        """A JSON file is a `tokenizers` file (or a Kiln card, refused); anything else a SentencePiece model."""
        if data.lstrip()[:1] == b"{":
            return HFTokenizer(data, special_tokens, origin)
        return SentencePieceTokenizer(data, special_tokens, origin, sentinels)

    # -------------------------------------------------------------- what a kind provides
    @abstractmethod
    def encode_batch(self, texts: Sequence[str], num_threads: int = 1,
                     continues: Sequence[bool] | None = None) -> list[list[int]]:
        """Each text's ids, no special token added, nothing cut. `continues[i]`: text i goes on from text before it
        (a FIM middle or suffix), so it is encoded without the space a tokenizer may put before a text's start
        (SentencePiece's add_dummy_prefix, a Metaspace or Prepend "▁", ByteLevel's add_prefix_space): the ids of a
        text's consecutive pieces then decode, joined, to the whole text."""

    @abstractmethod
    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        """The text of `ids`."""

    @abstractmethod
    def id_to_piece(self, i: int) -> str:
        """The vocabulary entry of id `i`."""

    @abstractmethod
    def token_to_id(self, piece: str) -> int | None:
        """The id of `piece` as one whole token, None when the vocabulary lacks it."""

    @abstractmethod
    def byte_mask(self) -> np.ndarray:
        """True at the ids of byte-fallback pieces (<0x00>..<0xFF>)."""

    def score(self, i: int) -> str:
        return ""

    # -------------------------------------------------------------- shared
    def encode(self, text: str) -> list[int]:
        return self.encode_batch([text])[0]

    def encode_pieces(self, pieces: Sequence[str]) -> list[list[int]]:
        """The ids of consecutive pieces of one text (FIM's prefix, middle, suffix), each encoded on its own (no
        token straddles a cut) and together decoding to the joined text: the first non-empty piece is the text's
        start, the others continue it."""
        return self.encode_batch(pieces, continues=continuation_flags(pieces))

    def pieces(self, ids: Iterable[int] | np.ndarray) -> list[str]:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else list(ids)
        return [self.id_to_piece(int(i)) for i in ids]

    @property
    def dtype(self) -> np.dtype:
        return token_dtype(self.vocab_size)

    @property
    def eos_id(self) -> int:
        return self.specials["eos"][1]

    @property
    def bos_id(self) -> int:
        return self.specials["bos"][1]

    @property
    def pad_id(self) -> int:
        return self.specials["pad"][1]

    def optional_id(self, role: str) -> int | None:
        """The id of a special token the tokenizer may lack (unk, the FIM symbols), None when it does."""
        return self.specials[role][1] if role in self.specials else None

    @property
    def unk_id(self) -> int | None:
        return self.optional_id("unk")

    @property
    def fim_prefix_id(self) -> int | None:
        return self.optional_id("fim_prefix")

    @property
    def fim_suffix_id(self) -> int | None:
        return self.optional_id("fim_suffix")

    @property
    def fim_middle_id(self) -> int | None:
        return self.optional_id("fim_middle")

    def require(self, roles: Sequence[str], needed_by: str, otherwise: str = "") -> list[int]:
        """The ids of `roles`, or a TokenizerError naming the missing ones, who needs them and the ways to fix it
        (`otherwise`: one more, e.g. "; or turn it off with ...")."""
        missing = [r for r in roles if r not in self.specials]
        if missing:
            raise TokenizerError(missing_tokens_message(self.origin, missing, needed_by, otherwise))
        return [self.specials[r][1] for r in roles]

    def special_tokens(self) -> dict[str, dict[str, Any]]:
        """The card's form: role -> {piece, id}, sentinels as sentinel_<i>; a stand-in says `same_as`."""
        out: dict[str, dict[str, Any]] = {}
        for role in SPECIAL_ROLES:
            if role in self.specials:
                piece, i = self.specials[role]
                out[role] = {"piece": piece, "id": i}
                if role in self._stand_ins:
                    out[role]["same_as"] = self._stand_ins[role]
        out |= {f"sentinel_{k}": {"piece": SENTINEL_PIECE.format(k), "id": i} for k, i in enumerate(self.sentinel_ids)}
        return out

    def vocab_tsv(self) -> str:
        """id, piece, score per line (score empty where the model has none); backslash, tab, CR and LF in pieces
        are written as \\\\ \\t \\r \\n."""
        esc = str.maketrans({"\\": "\\\\", "\t": "\\t", "\n": "\\n", "\r": "\\r"})
        return "".join(f"{i}\t{self.id_to_piece(i).translate(esc)}\t{self.score(i)}\n" for i in range(self.vocab_size))

    def _resolve(self, special_tokens: Mapping[str, str] | None, native: Mapping[str, int]) -> None:
        """Special ids by role: the configured piece, else the model's own declaration (`native`), else the first
        alias the vocabulary has. eos must be found; bos and pad stand in with eos."""
        special_tokens = dict(special_tokens or {})
        self.specials, self._stand_ins = {}, {}
        for role in SPECIAL_ROLES:
            if role in special_tokens:
                i = self.token_to_id(special_tokens[role])
                if i is None:
                    raise TokenizerError(f"tokenizer.special_tokens.{role} = {special_tokens[role]!r} is not a token "
                                         f"of {self.origin}; give one of its tokens (see tokenizer.vocab), or remove "
                                         f"the key to use {' / '.join(map(repr, ALIASES[role]))}")
            else:
                i = native.get(role)
                if i is None:
                    i = next((j for p in ALIASES[role] if (j := self.token_to_id(p)) is not None), None)
            if i is not None:
                self.specials[role] = (self.id_to_piece(i), i)
        if "eos" not in self.specials:
            raise TokenizerError(missing_tokens_message(self.origin, ["eos"], "Kiln (EOS ends every document in "
                                                                             "the token shards)"))
        for role in ("bos", "pad"):
            if role not in self.specials:
                self.specials[role], self._stand_ins[role] = self.specials["eos"], "eos"
        self.sentinel_ids = []
        while (i := self.token_to_id(SENTINEL_PIECE.format(len(self.sentinel_ids)))) is not None:
            self.sentinel_ids.append(i)

    def special_pieces(self) -> dict[str, int]:
        """Every piece Kiln gives a meaning (its roles', its sentinels'): text that spells one is ordinary text."""
        return {**{piece: i for piece, i in self.specials.values()},
                **{self.id_to_piece(i): i for i in self.sentinel_ids}}


# What other tokenizers call Kiln's special tokens (Kiln's own piece first), tried in order when neither the config
# (tokenizer.special_tokens) nor the model itself names one: GPT-2/Qwen, Llama 2/Mistral/T5, Llama 3, Gemma,
# StarCoder, BERT.
ALIASES = {
    "eos": ("<|endoftext|>", "</s>", "<|end_of_text|>", "<eos>"),
    "bos": ("<s>", "<|begin_of_text|>", "<bos>", "<|startoftext|>"),
    "pad": ("<pad>", "<|pad|>", "[PAD]"),
    "unk": ("<unk>", "[UNK]"),
    "fim_prefix": ("<|fim_prefix|>", "<fim_prefix>"),
    "fim_suffix": ("<|fim_suffix|>", "<fim_suffix>"),
    "fim_middle": ("<|fim_middle|>", "<fim_middle>"),
}


def missing_tokens_message(origin: str, roles: Sequence[str], needed_by: str, otherwise: str = "") -> str:
    looked = "; ".join(f"{r}: none of {' '.join(ALIASES[r])}" for r in roles)
    keys = ", ".join(f"tokenizer.special_tokens.{r}" for r in roles)
    pieces = ", ".join(repr(ALIASES[r][0]) for r in roles)
    return (f"{origin}: {needed_by} needs special tokens {', '.join(roles)}, which it lacks ({looked}). Name the "
            f"tokens it has for them with {keys} in the config, or add them to the tokenizer and materialize "
            f"`tokenizer` again (Hugging Face tokenizers: `tok = Tokenizer.from_file(path); "
            f"tok.add_special_tokens([{pieces}]); tok.save(path)`; SentencePiece: retrain with "
            f"control_symbols=[{pieces}], or eos_piece for eos){otherwise}")


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model. Kiln's trained ones round-trip exactly (see the module docstring); a brought model
    round-trips as its normalization allows (the tokenizer asset's round_trip check counts what it changes)."""

    kind = SENTENCEPIECE

    def __init__(self, model: bytes, special_tokens: Mapping[str, str] | None = None,
                 origin: str = "the tokenizer", sentinels: int | None = None):
        self.sha256, self.origin = hashlib.sha256(model).hexdigest(), origin
        try:
            self.sp = spm.SentencePieceProcessor(model_proto=model, num_threads=1)
        except RuntimeError as exc:
            raise TokenizerError(f"{origin} is not a SentencePiece model ({exc}); give a tokenizer.json or "
                                 f".model file") from None
        # Pieces after a text's start are encoded by the same model without its dummy prefix (Llama 2's, Mistral's):
        # with it, every FIM middle and suffix, and text after a literal "▁", gained a space.
        continued = model_proto(model)
        continued.normalizer_spec.add_dummy_prefix = False
        self.sp_continued = spm.SentencePieceProcessor(model_proto=continued.SerializeToString(), num_threads=1)
        self.model_type = sentencepiece_model_type(model)
        self.vocab_size = self.sp.get_piece_size()
        native = {role: i for role, i in (("bos", self.sp.bos_id()), ("eos", self.sp.eos_id()),
                                          ("pad", self.sp.pad_id()), ("unk", self.sp.unk_id())) if i >= 0}
        self._resolve(special_tokens, native)
        if sentinels is not None:
            self.sentinel_ids = self.sentinel_ids[:sentinels]
        # Written as their UTF-8 byte pieces (see the module docstring): a literal "▁", and a literal special piece a
        # brought model would read as that token (a user-defined symbol: "<|endoftext|>" in a document was an EOS).
        literals = [WHITESPACE_META] + [p for p, i in self.special_pieces().items() if i in self.sp.encode(p)]
        self._literal_ids = {p: self._as_bytes(p) for p in literals}
        self._literal = re.compile("(" + "|".join(map(re.escape, sorted(literals, key=len, reverse=True))) + ")")

    def _as_bytes(self, text: str) -> list[int]:
        byte_ids = [self.sp.piece_to_id(f"<0x{b:02X}>") for b in text.encode("utf-8")]
        return byte_ids if all(self.sp.is_byte(i) for i in byte_ids) else [self.sp.unk_id()]

    def token_to_id(self, piece: str) -> int | None:
        i = self.sp.piece_to_id(piece)
        return i if self.sp.id_to_piece(i) == piece else None

    def id_to_piece(self, i: int) -> str:
        return self.sp.id_to_piece(int(i))

    def score(self, i: int) -> str:
        return f"{self.sp.get_score(i):g}"

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1,
                     continues: Sequence[bool] | None = None) -> list[list[int]]:
        """Encode many texts in one sentencepiece call per kind (text starts, continuations); `num_threads` > 1 uses
        its thread pool."""
        continues = continues or [False] * len(texts)
        if not any(continues) and not any(self._literal.search(t) for t in texts):
            return self.sp.encode(list(texts), num_threads=num_threads)
        pieces = [self._literal.split(t) for t in texts]  # text, literal, text, ... (a literal at odd places)
        # text after a literal continues the text before it
        segments = [(seg, c or j > 0) for segs, c in zip(pieces, continues) for j, seg in enumerate(segs) if j % 2 == 0]
        starts = iter(self.sp.encode([seg for seg, c in segments if not c], num_threads=num_threads))
        later = iter(self.sp_continued.encode([seg for seg, c in segments if c], num_threads=num_threads))
        out = []
        for segs, c in zip(pieces, continues):
            ids = []
            for j, seg in enumerate(segs):
                ids += self._literal_ids[seg] if j % 2 else next(later if c or j else starts)
            out.append(ids)
        return out

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        return self.sp.decode(ids)

    def byte_mask(self) -> np.ndarray:
        return np.array([self.sp.is_byte(i) for i in range(self.vocab_size)], dtype=bool)


def model_proto(model: bytes) -> sentencepiece_model_pb2.ModelProto:
    """A SentencePiece model file as its protobuf message (sentencepiece's own generated module), to read or edit what
    the processor's API does not expose (the model type, the trainer's thread count, the dummy prefix)."""
    return sentencepiece_model_pb2.ModelProto.FromString(model)


def sentencepiece_model_type(model: bytes) -> str:
    """The model's type (unigram, bpe, word, char), from its trainer spec."""
    return {1: "unigram", 2: "bpe", 3: "word", 4: "char"}.get(model_proto(model).trainer_spec.model_type, "unknown")


def continuation_flags(pieces: Sequence[str]) -> list[bool]:
    """For consecutive pieces of one text: whether each continues it (some piece before it is non-empty)."""
    flags, seen = [], False
    for p in pieces:
        flags.append(seen)
        seen = seen or bool(p)
    return flags


class HFTokenizer(Tokenizer):
    """A Hugging Face `tokenizers` file (tokenizer.json), read by the `tokenizers` library itself. Kiln adds no
    special tokens (EOS between documents is its own), turns off any truncation or padding the file sets (a
    document is never cut), and encodes text that spells a special token as ordinary text."""

    kind = TOKENIZERS

    def __init__(self, data: bytes, special_tokens: Mapping[str, str] | None = None, origin: str = "the tokenizer"):
        self.sha256, self.origin = hashlib.sha256(data).hexdigest(), origin
        try:
            spec = json.loads(data)
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            raise TokenizerError(f"{origin} is not valid JSON ({exc}); give a Hugging Face tokenizer.json") from None
        if isinstance(spec, dict) and str(spec.get("format", "")).startswith("kiln-tokenizer"):
            raise TokenizerError(f"{origin} is a Kiln tokenizer card, not a tokenizer: give the tokenizer asset's "
                                 f"folder, or its {spec.get('files', {}).get('model', MODEL_FILE)}")
        try:
            self.hf = hf_tokenizers.Tokenizer.from_str(data.decode("utf-8"))
        except Exception as exc:  # the Rust side raises plain Exception
            raise TokenizerError(f"{origin} is not a Hugging Face tokenizers file ({exc}); give a tokenizer.json "
                                 f"saved by `tokenizers` (Tokenizer.save) or a SentencePiece .model") from None
        # Pieces after a text's start: the same file without its start-of-text space (see encode_batch).
        continued = without_prefix_space(spec)
        self.hf_continued = self.hf if continued is None else hf_tokenizers.Tokenizer.from_str(json.dumps(continued))
        for hf in {id(self.hf): self.hf, id(self.hf_continued): self.hf_continued}.values():
            hf.no_truncation()
            hf.no_padding()
            hf.encode_special_tokens = True
        self.model_type = str(spec.get("model", {}).get("type", "unknown")).lower()
        vocab = self.hf.get_vocab(with_added_tokens=True)
        self.vocab_size = max(vocab.values()) + 1  # ids may leave gaps: the largest id sizes the embedding
        self._pieces = {i: p for p, i in vocab.items()}
        self._resolve(special_tokens, {})
        # encode_special_tokens reads only tokens marked special as text: a file may add Kiln's as plain added tokens
        # (Qwen2.5's FIM tokens), so they are marked special (same ids; decode keeps them).
        for hf in {id(self.hf): self.hf, id(self.hf_continued): self.hf_continued}.values():
            hf.add_special_tokens([hf_tokenizers.AddedToken(p, special=True, normalized=False)
                                   for p in self.special_pieces()])

    def token_to_id(self, piece: str) -> int | None:
        return self.hf.token_to_id(piece)

    def id_to_piece(self, i: int) -> str:
        return self._pieces.get(int(i), "")

    def encode_batch(self, texts: Sequence[str], num_threads: int = 1,
                     continues: Sequence[bool] | None = None) -> list[list[int]]:
        """One thread by default, as sentencepiece's: engine workers are one per core already (and `tokenizers`'
        own batch parallelism measured slower than a loop on 2 busy cores); `num_threads` > 1 uses its pool."""
        if continues and any(continues):
            out: list[list[int] | None] = [None] * len(texts)
            for flag, hf in ((False, self.hf), (True, self.hf_continued)):
                at = [i for i, c in enumerate(continues) if c == flag]
                for i, ids in zip(at, self._encode(hf, [texts[i] for i in at], num_threads)):
                    out[i] = ids
            return out  # type: ignore[return-value]
        return self._encode(self.hf, texts, num_threads)

    @staticmethod
    def _encode(hf: hf_tokenizers.Tokenizer, texts: Sequence[str], num_threads: int) -> list[list[int]]:
        if num_threads > 1:
            return [e.ids for e in hf.encode_batch(list(texts), add_special_tokens=False)]
        return [hf.encode(t, add_special_tokens=False).ids for t in texts]

    def decode(self, ids: Iterable[int] | np.ndarray) -> str:
        ids = ids.tolist() if isinstance(ids, np.ndarray) else [int(i) for i in ids]
        return self.hf.decode(ids, skip_special_tokens=False)

    def byte_mask(self) -> np.ndarray:
        mask = np.zeros(self.vocab_size, dtype=bool)
        for i, p in self._pieces.items():
            mask[i] = BYTE_PIECE.fullmatch(p) is not None
        return mask


def without_prefix_space(spec: Any) -> dict[str, Any] | None:
    """A tokenizer.json spec that puts no space before a text's start, or None when `spec` puts none: its Prepend
    normalizers left out, Metaspace pre-tokenizers set to prepend_scheme "never", ByteLevel ones to
    add_prefix_space false (the ways `tokenizers` has to add one)."""
    changed = False

    def normalizer(n: Any) -> Any:
        nonlocal changed
        if not isinstance(n, dict):
            return n
        if n.get("type") == "Prepend":
            changed = True
            return None
        if n.get("type") == "Sequence":
            return {**n, "normalizers": [m for m in map(normalizer, n.get("normalizers", [])) if m is not None]}
        return n

    def pre_tokenizer(t: Any) -> Any:
        nonlocal changed
        if not isinstance(t, dict):
            return t
        if t.get("type") == "Sequence":
            return {**t, "pretokenizers": [pre_tokenizer(u) for u in t.get("pretokenizers", [])]}
        if t.get("type") == "Metaspace" and (t.get("prepend_scheme", "always") != "never" or t.get("add_prefix_space")):
            changed = True
            return {**t, "prepend_scheme": "never", **({"add_prefix_space": False} if "add_prefix_space" in t else {})}
        if t.get("type") == "ByteLevel" and t.get("add_prefix_space"):
            changed = True
            return {**t, "add_prefix_space": False}
        return t

    if not isinstance(spec, dict):
        return None
    out = {**spec, "normalizer": normalizer(spec.get("normalizer")),
           "pre_tokenizer": pre_tokenizer(spec.get("pre_tokenizer"))}
    return out if changed else None


# ---------------------------------------------------------------------------------------------- check

def round_trip_changes(tokenizer: Tokenizer, documents: Iterable[Document], seed: int = 0) -> dict[str, list[str]]:
    """The doc_ids of documents the tokenizer changes: `whole`, decode(encode(text)) != text; `fim`, cut into prefix,
    middle and suffix at two points drawn per doc_id (as token_shards cuts a FIM document) and encoded piece by piece,
    decode(prefix + middle + suffix) != text."""
    changed: dict[str, list[str]] = {"whole": [], "fim": []}
    for doc in documents:
        if tokenizer.decode(tokenizer.encode(doc.text)) != doc.text:
            changed["whole"].append(doc.doc_id)
        cut = fim_split(doc.text, doc.doc_id, seed, 1.0, 0.0)
        if cut is not None and tokenizer.decode(sum(tokenizer.encode_pieces([cut.prefix, cut.middle, cut.suffix]),
                                                    [])) != doc.text:
            changed["fim"].append(doc.doc_id)
    return changed


# ---------------------------------------------------------------------------------------------- report

def tokenizer_report(tokenizer: Tokenizer, documents_by_source: Mapping[str, Iterable[Document]],
                     examples_per_source: int = 2, example_chars: int = 160) -> dict[str, Any]:
    """How well the tokenizer fits each source, language and script: fertility (tokens per word: whitespace words, a
    character per word in Chinese, Japanese, Thai ... as `text_units.count_words` counts), tokens per character (the
    figure that compares across scripts), UTF-8 bytes per token, the share of byte-fallback tokens, and a few
    documents shown as pieces. A document's script is the one most of its letters are written in."""
    is_byte = tokenizer.byte_mask()
    totals: dict[str, dict[str, Counter]] = {"sources": defaultdict(Counter), "languages": defaultdict(Counter),
                                             "scripts": defaultdict(Counter)}
    examples = []
    for source, docs in documents_by_source.items():
        seen = set()
        batch: list[Document] = []

        def flush() -> None:
            for doc, ids in zip(batch, tokenizer.encode_batch([d.text for d in batch])):
                ids = np.asarray(ids, dtype=np.int64)
                counts = Counter(documents=1, words=count_words(doc.text), tokens=len(ids), chars=len(doc.text),
                                 bytes=len(doc.text.encode("utf-8", "surrogatepass")),
                                 byte_tokens=int(is_byte[ids].sum()) if len(ids) else 0)
                totals["sources"][source].update(counts)
                totals["languages"][str(doc.meta.get("language") or "unknown")].update(counts)
                totals["scripts"][dominant_script(doc.text)].update(counts)
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
                "tokens_per_char": round(c["tokens"] / c["chars"], 4) if c["chars"] else None,
                "bytes_per_token": round(c["bytes"] / c["tokens"], 4) if c["tokens"] else None,
                "byte_fallback_share": round(c["byte_tokens"] / c["tokens"], 6) if c["tokens"] else None}

    everything = sum(totals["sources"].values(), Counter())
    return {"tokenizer_sha256": tokenizer.sha256, "vocab_size": tokenizer.vocab_size, "overall": summary(everything),
            "sources": {k: summary(v) for k, v in totals["sources"].items()},
            "languages": {k: summary(v) for k, v in sorted(totals["languages"].items())},
            "scripts": {k: summary(v) for k, v in sorted(totals["scripts"].items())},
            "examples": examples}


__all__ = ["ALIASES", "FIM_ROLES", "SPECIAL_TOKENS", "HFTokenizer", "SentencePieceTokenizer", "Tokenizer", "TokenizerCard",
           "TokenizerError", "TrainingSample", "bring_tokenizer", "continuation_flags", "draw_training_sample",
           "read_documents", "round_trip_changes", "sentence_chunks", "tokenizer_report", "train_tokenizer"]
