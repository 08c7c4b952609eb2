"""Small corpora built in code for the tokenizer, token-shard and loader tests.

Texts are unique (each carries its index) and full of what a tokenizer can lose: indentation with spaces
and tabs, blank lines, trailing spaces, CRLF, CJK, emoji, control characters and the "▁" character.
"""

from __future__ import annotations

import random
from pathlib import Path

import pyarrow as pa

from kiln.common.config import Fim, Mixture, ShardSettings, TokenizerSettings
from kiln.common.storage import write_parquet_atomic
from kiln.curation.documents import DOCUMENT_SCHEMA, Document, make_doc_id
from kiln.tokens.mixture import SourceParts
from kiln.tokens.tokenizer import draw_training_sample, train_tokenizer

WORDS = ("the river town salt timber merchant ledger barge lock price bread winter council market towpath "
         "museum warehouse iron ring tour morning evening history record trade boat fee width").split()
NAMES = ("load save parse render count merge split index token shard reader writer buffer cursor").split()
UNICODE_BITS = ["日本語のテキスト", "中文字符", "😀🚀", "naïve café", "\u2581", "a\u2581b", "\x00", "\x07", "\r\n",
                "  \t", "Ωμέγα", "\u200b"]


def code_text(i: int, rng: random.Random) -> str:
    name = f"{rng.choice(NAMES)}_{i}"
    lines = [f"def {name}(items, limit={rng.randint(1, 99)}):", f'    """{rng.choice(WORDS).title()} the items."""',
             "    total = 0", "    for item in items:", "        if item > limit:  ", "            continue",
             "\t\ttotal += item  # tab-indented", "", "", "    return total", ""]
    if rng.random() < 0.5:
        lines += [f"class {name.title().replace('_', '')}:", "    pass", "   ", "\n"]
    return "\n".join(lines)


def prose_text(i: int, rng: random.Random) -> str:
    sentences = [" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 14))).capitalize() + "."
                 for _ in range(rng.randint(2, 8))]
    return f"Record {i}. " + " ".join(sentences) + ("\n\n" if rng.random() < 0.3 else "")


def unicode_text(i: int, rng: random.Random) -> str:
    return f"Item {i}: " + " ".join(rng.choice(UNICODE_BITS + WORDS) for _ in range(rng.randint(4, 30)))


MAKERS = {"code": code_text, "prose": prose_text, "unicode": unicode_text}


def make_texts(kind: str, n: int, seed: int = 0) -> list[str]:
    rng = random.Random(f"{kind}-{seed}")
    return [MAKERS[kind](i, rng) for i in range(n)]


def write_source(root: Path, name: str, texts: list[str], rows_per_part: int = 40, language: str | None = "en",
                 domain: str = "web") -> SourceParts:
    """Documents of one source as Parquet parts in DOCUMENT_SCHEMA."""
    folder = root / name
    folder.mkdir(parents=True, exist_ok=True)
    parts = []
    for k in range(0, len(texts), rows_per_part):
        rows = [Document(make_doc_id(name, str(i)), name, t, meta={"language": language} if language else {}).to_row()
                for i, t in enumerate(texts[k:k + rows_per_part], start=k)]
        path = folder / f"part-{k // rows_per_part:05d}.parquet"
        write_parquet_atomic(path, pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA))
        parts.append(path)
    return SourceParts(name, domain, parts)


def standard_sources(root: Path, sizes: dict[str, int] | None = None) -> list[SourceParts]:
    """Three sources: prose (web), code (domain code, so FIM applies), unicode (web, no language)."""
    sizes = {"prose": 300, "code": 120, "unicode": 80, **(sizes or {})}
    return [write_source(root, "prose", make_texts("prose", sizes["prose"])),
            write_source(root, "code", make_texts("code", sizes["code"]), language="python", domain="code"),
            write_source(root, "unicode", make_texts("unicode", sizes["unicode"]), language=None)]


SMALL_TOKENIZER = TokenizerSettings(vocab_size=500, sample_chars=400_000, num_threads=1)


def train_small_tokenizer(root: Path, sources: list[SourceParts]) -> Path:
    out = root / "tokenizer"
    train_tokenizer(draw_training_sample(sources, {}, SMALL_TOKENIZER), SMALL_TOKENIZER, out)
    return out


def shard_settings(**overrides) -> ShardSettings:
    base = dict(seq_len=16, tokens_per_shard=2048, val_fraction=0.1, seed=7,
                fim=Fim(rate=0.5, spm_rate=0.5))
    return ShardSettings(**{**base, **overrides})


NATURAL = Mixture()


def token_grams(tokens, n: int = 12) -> set[tuple[int, ...]]:
    """Every run of n tokens: how tests check by content what a loader read (shorter runs recur by chance in
    their small vocabularies)."""
    tokens = list(tokens)
    return {tuple(tokens[i:i + n]) for i in range(len(tokens) - n + 1)}


def read_sequences(loader, count: int) -> list[list[int]]:
    """The next `count` sequences of a one-sequence-per-batch ShardLoader: the inputs and the last target."""
    return [[*x[0].tolist(), int(y[0, -1])] for x, y in (loader.next_batch() for _ in range(count))]
