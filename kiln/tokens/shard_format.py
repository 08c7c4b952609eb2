"""The one token-shard format: what the token_shards asset writes and the training loader reads.

Imports only the standard library and numpy, because training processes (possibly on other machines)
import this module and little else from Kiln (training_jobs/loader.py).

File layout (little-endian; one file per shard, `shard-NNNNN.bin`):

    offset  size             field
    0       8                magic b"KILNTOK1"
    8       4   uint32       format version (1)
    12      4   uint32       bytes per token: 2 (uint16) or 4 (uint32)
    16      8   uint64       token count T
    24      8   uint64       document count D
    32      32               sha256 of the tokenizer model (raw digest)
    64      T * bytes        tokens; every document ends with the tokenizer's EOS id
    ...     0-7              zero padding to a multiple of 8 bytes
    ...     (D + 1) * 8      uint64 document offsets: doc i is tokens[offsets[i]:offsets[i + 1]],
                             offsets[0] == 0 and offsets[D] == T

The header is 64 bytes, so the token array is aligned and memory-maps without a copy. A file whose size
disagrees with its header is refused (a truncated copy, a half-written file).

A shard set is a dataset folder with `_manifest.json` (written last, by kiln.common.storage); its `stats`
hold `describe_shard_set(...)`: the tokenizer hash, the dtype and every shard with its split, phase,
token and document counts. `read_shard_set` reads that with plain json.
"""

from __future__ import annotations

import json
import os
import struct
import sys
import uuid
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

MAGIC = b"KILNTOK1"
FORMAT_VERSION = 1
HEADER = struct.Struct("<8sIIQQ32s")  # magic, version, bytes per token, tokens, documents, tokenizer sha256
HEADER_SIZE = HEADER.size  # 64
DTYPES = {2: np.dtype("<u2"), 4: np.dtype("<u4")}
MANIFEST_NAME = "_manifest.json"
SHARD_SET_FORMAT = "kiln-token-shards/1"
TRAIN, VAL = "train", "val"


class ShardError(ValueError):
    """A shard or shard set that cannot be used as it is; the message says what is wrong and what to do."""


def token_dtype(vocab_size: int) -> np.dtype:
    """uint16 when every id fits (vocabularies up to 65,536), else uint32."""
    return DTYPES[2] if vocab_size <= 1 << 16 else DTYPES[4]


def _sha_bytes(tokenizer_sha256: str) -> bytes:
    try:
        raw = bytes.fromhex(tokenizer_sha256)
    except ValueError:
        raw = b""
    if len(raw) != 32:
        raise ShardError(f"tokenizer sha256 must be 64 hex characters, got {tokenizer_sha256!r}")
    return raw


def _padding(n_bytes: int) -> int:
    return -n_bytes % 8


def expected_file_size(tokens: int, documents: int, bytes_per_token: int) -> int:
    body = tokens * bytes_per_token
    return HEADER_SIZE + body + _padding(body) + 8 * (documents + 1)


def write_shard(path: Path, tokens: np.ndarray, offsets: np.ndarray, tokenizer_sha256: str) -> None:
    """Write one shard atomically (temporary name, then rename): a reader never sees half a file.

    `tokens` is uint16 or uint32; `offsets` has one entry per document plus the final end (== len(tokens)).
    """
    tokens = np.ascontiguousarray(tokens)
    if tokens.dtype.itemsize not in DTYPES or tokens.dtype.kind != "u":
        raise ShardError(f"tokens must be uint16 or uint32, got {tokens.dtype}")
    tokens = tokens.astype(DTYPES[tokens.dtype.itemsize], copy=False)
    offsets = np.ascontiguousarray(offsets, dtype="<u8")
    if len(offsets) < 1 or offsets[0] != 0 or offsets[-1] != len(tokens) or np.any(np.diff(offsets.astype(np.int64)) < 0):
        raise ShardError(f"offsets must rise from 0 to the token count ({len(tokens)}); got "
                         f"{offsets[:3].tolist()}...{offsets[-3:].tolist()}")
    header = HEADER.pack(MAGIC, FORMAT_VERSION, tokens.dtype.itemsize, len(tokens), len(offsets) - 1,
                         _sha_bytes(tokenizer_sha256))
    path = Path(path)
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "wb") as f:
            f.write(header)
            tokens.tofile(f)
            f.write(b"\0" * _padding(tokens.nbytes))
            offsets.tofile(f)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


@dataclass(frozen=True)
class Shard:
    """An open shard: memory-mapped tokens (read on use) and the document offsets (read into memory:
    8 bytes a document). The map holds a file descriptor until the Shard is dropped."""

    path: Path
    tokens: np.ndarray  # np.memmap, uint16 or uint32
    offsets: np.ndarray  # uint64, documents + 1 entries
    tokenizer_sha256: str

    @property
    def documents(self) -> int:
        return len(self.offsets) - 1

    def document(self, i: int) -> np.ndarray:
        return self.tokens[int(self.offsets[i]):int(self.offsets[i + 1])]


def read_header(path: Path) -> tuple[int, int, int, str]:
    """(bytes per token, tokens, documents, tokenizer sha256) of a shard, after checking it is one."""
    path = Path(path)
    try:
        with open(path, "rb") as f:
            raw = f.read(HEADER_SIZE)
    except FileNotFoundError:
        raise ShardError(f"shard {path} does not exist; re-materialize the token_shards asset") from None
    if len(raw) < HEADER_SIZE or raw[:8] != MAGIC:
        raise ShardError(f"{path} is not a Kiln token shard (magic {raw[:8]!r}, expected {MAGIC!r}); "
                         f"point the loader at a token_shards dataset folder")
    magic, version, width, n_tokens, n_docs, sha = HEADER.unpack(raw)
    if version != FORMAT_VERSION:
        raise ShardError(f"shard {path} has format version {version}; this code reads version {FORMAT_VERSION}: "
                         f"re-materialize token_shards with this code version, or run the matching code")
    if width not in DTYPES:
        raise ShardError(f"shard {path} declares {width} bytes per token; only 2 (uint16) and 4 (uint32) exist: "
                         f"the header is corrupt, re-materialize token_shards")
    size = path.stat().st_size
    expected = expected_file_size(n_tokens, n_docs, width)
    if size != expected:
        raise ShardError(f"shard {path} is {size} bytes but its header ({n_tokens} tokens, {n_docs} documents, "
                         f"{width} bytes per token) implies {expected}: the file is truncated or corrupt; "
                         f"re-materialize token_shards")
    return width, n_tokens, n_docs, sha.hex()


def check_shard(path: Path, expected_tokenizer_sha256: str | None = None) -> tuple[int, int, int, str]:
    """`read_header`'s (bytes per token, tokens, documents, tokenizer sha256) after checking the header, the file's
    size and (if given) the tokenizer the shard was written with: a header and a stat, not the document index."""
    width, n_tokens, n_docs, sha = read_header(path)
    if expected_tokenizer_sha256 is not None and sha != expected_tokenizer_sha256.lower():
        raise ShardError(f"shard {path} was written with tokenizer {sha[:12]}…, the loader expects "
                         f"{expected_tokenizer_sha256[:12]}…; re-materialize token_shards with this tokenizer, "
                         f"or load the tokenizer these shards were made with")
    return width, n_tokens, n_docs, sha


def _check_index_ends(path: Path, first: int, last: int, n_tokens: int) -> None:
    """A document index runs from 0 to the shard's token count."""
    if (first, last) != (0, n_tokens):
        raise ShardError(f"shard {path} has a corrupt document index (first {first}, last {last}, tokens {n_tokens}); "
                         f"re-materialize token_shards")


def _map_tokens(path: Path, width: int, n_tokens: int) -> np.ndarray:
    return (np.memmap(path, dtype=DTYPES[width], mode="r", offset=HEADER_SIZE, shape=(n_tokens,)) if n_tokens
            else np.zeros(0, DTYPES[width]))


def shard_tokens(path: Path, expected_tokenizer_sha256: str | None = None) -> np.ndarray:
    """A shard's tokens, memory-mapped after `check_shard`, for a reader that needs no document boundaries (the
    training loader's reads): the index, 8 bytes a document, is not read."""
    width, n_tokens, _, _ = check_shard(path, expected_tokenizer_sha256)
    return _map_tokens(path, width, n_tokens)


def open_shard(path: Path, expected_tokenizer_sha256: str | None = None) -> Shard:
    """Memory-map a shard's tokens and read its document index after `check_shard`."""
    width, n_tokens, n_docs, sha = check_shard(path, expected_tokenizer_sha256)
    tokens = _map_tokens(path, width, n_tokens)
    body = n_tokens * width
    offsets = np.fromfile(path, dtype="<u8", count=n_docs + 1, offset=HEADER_SIZE + body + _padding(body))
    _check_index_ends(path, int(offsets[0]), int(offsets[-1]), n_tokens)
    return Shard(Path(path), tokens, offsets, sha)


# ------------------------------------------------------------------------------------------- shard sets

@dataclass(frozen=True, slots=True)  # slots: every rank holds one per shard, 250,000 at 10^12 tokens
class ShardInfo:
    path: str  # relative to the dataset folder
    split: str  # "train" | "val"
    phase: str  # curriculum phase ("main" without phases; "val" for validation shards)
    phase_index: int  # phases are read in this order
    tokens: int
    documents: int

    def to_dict(self) -> dict[str, Any]:
        return {"path": self.path, "split": self.split, "phase": self.phase, "phase_index": self.phase_index,
                "tokens": self.tokens, "documents": self.documents}


def describe_shard_set(tokenizer_sha256: str, vocab_size: int, eos_id: int, shards: list[ShardInfo],
                       **extra: Any) -> dict[str, Any]:
    """The manifest `stats` dict of a shard set (pass it to `DatasetWriter.commit(stats=...)`); `extra`
    (mixture report, warnings, ...) is kept alongside and ignored by the reader."""
    return {"format": SHARD_SET_FORMAT, "shard_version": FORMAT_VERSION, "tokenizer_sha256": tokenizer_sha256,
            "vocab_size": vocab_size, "eos_id": eos_id, "dtype": token_dtype(vocab_size).name,
            "shards": [s.to_dict() for s in shards], **extra}


@dataclass(frozen=True)
class ShardSet:
    """A token_shards dataset: its folder, tokenizer hash and shards in reading order."""

    dir: Path
    tokenizer_sha256: str
    vocab_size: int
    eos_id: int
    shards: tuple[ShardInfo, ...]
    stats: dict[str, Any]  # the manifest's stats, but for its list of shards (`shards` above)
    data_version: str | None = None  # the store's version of these files (None for a folder outside a store)

    def split(self, split: str) -> list[ShardInfo]:
        """The shards of one split, phases in order, shards in written order within a phase."""
        chosen = [s for s in self.shards if s.split == split]
        if not chosen:
            raise ShardError(f"{self.dir} has no {split!r} shards (splits present: "
                             f"{sorted({s.split for s in self.shards})})")
        return sorted(chosen, key=lambda s: s.phase_index)  # stable: keeps written order within a phase

    def tokens(self, split: str) -> int:
        return sum(s.tokens for s in self.shards if s.split == split)


def read_shard_set(dataset_dir: Path) -> ShardSet:
    """Read the shard list from a token_shards dataset's `_manifest.json` (plain json, no Kiln import). A store's
    dataset path is a link to its current version's folder: resolved here once, so the list and every shard opened
    later are of one version, even if the dataset is materialized again meanwhile."""
    dataset_dir = Path(os.path.realpath(dataset_dir))
    path = dataset_dir / MANIFEST_NAME
    if not path.is_file():
        raise ShardError(f"{dataset_dir} has no {MANIFEST_NAME}: it is not a complete token_shards dataset "
                         f"(never materialized, or interrupted); materialize token_shards first")
    manifest = json.loads(path.read_text(encoding="utf-8"))
    stats = manifest.get("stats") or {}
    if stats.get("format") != SHARD_SET_FORMAT:
        raise ShardError(f"{path} does not describe token shards (stats.format = {stats.get('format')!r}, "
                         f"expected {SHARD_SET_FORMAT!r}); point the loader at the token_shards dataset folder")
    # Held once, as ShardInfo (not as the parsed dicts too), the few names of splits and phases shared.
    shards = tuple(ShardInfo(s["path"], sys.intern(s["split"]), sys.intern(s["phase"]), s["phase_index"], s["tokens"],
                             s["documents"]) for s in stats.pop("shards"))
    return ShardSet(dataset_dir, stats["tokenizer_sha256"], stats["vocab_size"], stats["eos_id"], shards, stats,
                    manifest.get("data_version") or None)


def check_listed(path: Path, info: ShardInfo, tokens: int, documents: int) -> None:
    """Refuse a shard that does not hold the tokens and documents its manifest entry (`info`) lists."""
    if (tokens, documents) != (info.tokens, info.documents):
        raise ShardError(f"{path} holds {tokens} tokens / {documents} documents but the manifest lists "
                         f"{info.tokens} / {info.documents}: the dataset was altered after it was written; "
                         f"re-materialize token_shards")


def verify_shards(folder: Path, shards: Iterable[ShardInfo], tokenizer_sha256: str) -> Iterator[str]:
    """What is wrong with each listed shard of `folder`, one message per shard at most: its header, size and tokenizer
    (check_shard), its counts against the list, and its document index's ends (0 and its token count: two values
    read, not the index, 8 B a document)."""
    for info in shards:
        path = Path(folder) / info.path
        try:
            width, tokens, documents, _ = check_shard(path, tokenizer_sha256)
            check_listed(path, info, tokens, documents)
            body = tokens * width
            with open(path, "rb") as f:
                f.seek(HEADER_SIZE + body + _padding(body))
                first = int.from_bytes(f.read(8), "little")
                f.seek(8 * (documents - 1), os.SEEK_CUR)
                last = int.from_bytes(f.read(8), "little")
            _check_index_ends(path, first, last, tokens)
        except ShardError as exc:
            yield str(exc)


def hold_folder(folder: Path) -> int:
    """Keep a dataset version's folder on disk while it is read: a shared lock on the folder (flock, released when
    the returned descriptor is closed, or the process dies). The store does not remove a replaced version whose
    folder someone holds (kiln.common.storage `_remove_replaced`); a reader that maps its files over hours, a
    training run's loader, holds it."""
    import fcntl

    fd = os.open(folder, os.O_RDONLY | os.O_DIRECTORY)
    fcntl.flock(fd, fcntl.LOCK_SH)
    return fd


def write_random_shard_set(folder: Path, train_tokens: int, val_tokens: int, vocab_size: int, seed: int,
                           tokenizer_sha256: str = "00" * 32) -> Path:
    """A shard set of uniformly random token ids (3 to vocab_size - 1; one document per split, no tokenizer), for
    benchmarks and tests that need data of a given size: the train shard's tokens are drawn first, then val's."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    dtype = token_dtype(vocab_size)
    infos = []
    for name, split, n in (("shard-00000.bin", TRAIN, train_tokens), ("shard-00001.bin", VAL, val_tokens)):
        write_shard(folder / name, rng.integers(3, vocab_size, n, dtype=dtype), np.array([0, n]), tokenizer_sha256)
        infos.append(ShardInfo(name, split, "main" if split == TRAIN else "val", 0, n, 1))
    (folder / MANIFEST_NAME).write_text(json.dumps({"stats": describe_shard_set(tokenizer_sha256, vocab_size, 2,
                                                                                infos)}))
    return folder


__all__ = ["FORMAT_VERSION", "MAGIC", "Shard", "ShardError", "ShardInfo", "ShardSet", "TRAIN", "VAL",
           "check_listed", "check_shard", "describe_shard_set", "open_shard", "read_header", "read_shard_set",
           "shard_tokens", "token_dtype", "verify_shards", "write_random_shard_set", "write_shard"]
