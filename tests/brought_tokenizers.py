"""Tokenizers a team might bring (`tokenizer.source: <file>`), built in the test with their own libraries:
a byte-level BPE `tokenizer.json` trained with Hugging Face `tokenizers`, and a SentencePiece unigram model
with SentencePiece's own special tokens (<unk> <s> </s>, no pad) and StarCoder-style FIM symbols."""

from __future__ import annotations

import io
from collections.abc import Sequence
from pathlib import Path

import pyarrow.parquet as pq
import sentencepiece as spm
import tokenizers
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from kiln.tokens.fim import FimIds, unfim
from kiln.tokens.mixture import SourceParts
from kiln.tokens.shard_format import open_shard

KILN_SPECIALS = ["<|endoftext|>", "<pad>", "<|fim_prefix|>", "<|fim_middle|>", "<|fim_suffix|>"]
SP_FIM = ["<fim_prefix>", "<fim_middle>", "<fim_suffix>"]


def texts_of(sources: Sequence[SourceParts]) -> list[str]:
    return [t for s in sources for part in s.parts for t in pq.read_table(part, columns=["text"])["text"].to_pylist()]


def build_hf_tokenizer(path: Path, texts: Sequence[str], specials: Sequence[str] = KILN_SPECIALS,
                       vocab_size: int = 600, truncate_at: int | None = 16) -> Path:
    """A byte-level BPE (GPT-2's layout) trained on `texts`, saved as a tokenizer.json. The file also asks for
    truncation at `truncate_at` tokens, as files saved by `transformers` often do: Kiln must not cut documents."""
    tok = tokenizers.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=list(specials), initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False))
    if truncate_at:
        tok.enable_truncation(max_length=truncate_at)
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def reference_hf(path: Path) -> tokenizers.Tokenizer:
    """The file read by `tokenizers` alone, encoding whole documents (no truncation, no added special tokens)."""
    tok = tokenizers.Tokenizer.from_file(str(path))
    tok.no_truncation()
    return tok


def build_sentencepiece(path: Path, texts: Sequence[str], control_symbols: Sequence[str] = SP_FIM,
                        vocab_size: int = 400) -> Path:
    """A SentencePiece unigram model with byte fallback and SentencePiece's default ids (unk 0, <s> 1, </s> 2,
    no pad), exact on whitespace (identity normalization, no dummy prefix)."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, model_type="unigram", vocab_size=vocab_size,
        byte_fallback=True, normalization_rule_name="identity", add_dummy_prefix=False,
        remove_extra_whitespaces=False, allow_whitespace_only_pieces=True, control_symbols=list(control_symbols),
        num_threads=1, minloglevel=2, max_sentence_length=1 << 16)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out.getvalue())
    return path


def build_dummy_prefix_sentencepiece(path: Path, texts: Sequence[str], vocab_size: int = 600) -> Path:
    """A SentencePiece BPE model with a dummy prefix, as Llama 2's and Mistral's tokenizer.model (there with NFKC
    too; identity here, so whole documents stay exact): it puts "▁" before every text it encodes."""
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(texts), model_writer=out, model_type="bpe", vocab_size=vocab_size, byte_fallback=True,
        normalization_rule_name="identity", add_dummy_prefix=True, remove_extra_whitespaces=False,
        allow_whitespace_only_pieces=True, control_symbols=["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"],
        eos_piece="<|endoftext|>", num_threads=1, minloglevel=2, max_sentence_length=1 << 16)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(out.getvalue())
    return path


def build_prefix_space_hf(path: Path, texts: Sequence[str], how: str, vocab_size: int = 600) -> Path:
    """A tokenizer.json that puts "▁" before a text's start, the two ways `tokenizers` files do: `metaspace`, a
    Metaspace pre-tokenizer with prepend_scheme "first" (converted SentencePiece models), or `prepend`, a
    Prepend("▁") normalizer with a decoder that strips the first space (Llama 2's and Mistral's tokenizer.json)."""
    tok = tokenizers.Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True, fuse_unk=True))
    if how == "metaspace":
        tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first")
        tok.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="first")
    else:
        tok.normalizer = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
        tok.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(), decoders.Fuse(),
                                         decoders.Strip(" ", 1, 0)])
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=vocab_size, show_progress=False, initial_alphabet=[f"<0x{b:02X}>" for b in range(256)],
        special_tokens=["<unk>", "<s>", "</s>", "<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]))
    path.parent.mkdir(parents=True, exist_ok=True)
    tok.save(str(path))
    return path


def shard_documents(out_dir: Path, shards, sha256: str) -> list[list[int]]:
    """Every document (EOS included) of a shard set, train and validation, checked against `sha256`."""
    docs = []
    for info in shards:
        shard = open_shard(Path(out_dir) / info.path, expected_tokenizer_sha256=sha256)
        docs += [shard.document(i).tolist() for i in range(shard.documents)]
    return docs


def restore(ids: list[int], decode, fim: FimIds) -> str:
    """A shard document's text through `decode` (a reference library's), a FIM document put back in order: its
    prefix, middle and suffix ids decoded as one text, as a model writes them."""
    assert ids[-1] == fim.eos and fim.eos not in ids[:-1]
    if ids[0] != fim.prefix:
        return decode(ids[:-1])
    _, prefix, middle, suffix = unfim(ids, fim)
    return decode(prefix + middle + suffix)
