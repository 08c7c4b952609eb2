"""Shingles, MinHash signatures and the LSH bands x rows (chosen by `kiln.dedup.lsh`), under one of two signature
schemes (`dedup.near.scheme`): SCHEME_FAST (the default, `kiln.dedup.fast_minhash`), which signs whole batches with
numpy, and SCHEME (blake2b shingles + datasketch MinHash), what indexes built before the scheme was configurable
hold. The signature stage that signs curated Parquet parts with them is `kiln.dedup.signing`.

A document becomes the set of hashes of its normalized word n-grams ("shingles"; in scripts written without spaces
a word is a character, and a shingle spans n words' worth of them: `kiln.dedup.text.shingle_ranges`); its MinHash
signature estimates Jaccard similarity between such sets. Signatures and shingle sets are stored as
plain arrays (Parquet lists), never pickled, so any later run (or another machine) can verify a
candidate pair exactly.
"""

from __future__ import annotations

import hashlib
from functools import lru_cache

import numpy as np
import pyarrow as pa
from datasketch import LeanMinHash, MinHash

from kiln.common.config import BoilerplateLines, NearDedup
from kiln.common.text_units import plain, word_weights
from kiln.dedup.fast_minhash import _CHUNK_CHARS, _CHUNK_TEXTS, sign_batch, similarity_sketches
from kiln.dedup.lsh import choose_bands
from kiln.dedup.text import normalized_words, shingle_ranges

SCHEME = "affine32"  # datasketch >= 2.0: 32-bit hash values, collision-free permutations
SCHEME_FAST = "fss-splitmix64-v1"  # see kiln.dedup.fast_minhash

SIGNATURE_COLUMNS = ["doc_id", "source", "chars", "signature", "shingles"]
HASH_COLUMNS = ("signature", "shingles")  # random 32-bit values: stored plain (write_parquet_atomic)
# A document's shingle set, sorted and unique, as its uint32 hashes' little-endian bytes. Not large_list<uint32>
# (as before 2026-11-29, still read): Parquet decodes a list value by value through its repetition levels, where
# bytes are copied, so a signature part of 5,000 documents wrote in 9 ms instead of 42 and read in 8 instead of 30.
SHINGLES_TYPE = pa.large_binary()


def signature_schema(num_perm: int) -> pa.Schema:
    return pa.schema([
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("chars", pa.int64(), nullable=False),
        pa.field("signature", pa.list_(pa.uint32(), num_perm), nullable=False),
        pa.field("shingles", SHINGLES_TYPE, nullable=False),
    ])


def pack_shingles(values: np.ndarray, offsets: np.ndarray) -> pa.LargeBinaryArray:
    """The shingles column (SHINGLES_TYPE) of sets values[offsets[i]:offsets[i + 1]]."""
    offsets = np.asarray(offsets, np.int64)
    values = np.ascontiguousarray(np.asarray(values)[offsets[0]:offsets[-1]], "<u4")
    return pa.LargeBinaryArray.from_buffers(SHINGLES_TYPE, offsets.size - 1,
                                            [None, pa.py_buffer((offsets - offsets[0]) * 4), pa.py_buffer(values)])


def shingle_arrays(column: pa.ChunkedArray | pa.Array) -> tuple[np.ndarray, np.ndarray]:
    """(values, offsets) of a shingles column, stored as SHINGLES_TYPE or as the large_list<uint32> of older files:
    set i is values[offsets[i]:offsets[i + 1]] (without copying the values)."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_large_list(arr.type):
        return arr.values.to_numpy(zero_copy_only=False), arr.offsets.to_numpy()
    _, offsets, data = arr.buffers()
    offsets = np.frombuffer(offsets, np.int64, count=len(arr) + 1, offset=8 * arr.offset)
    values = np.frombuffer(data, "<u4", count=int(offsets[-1]) // 4) if data is not None else np.empty(0, "<u4")
    return values, offsets // 4


def packed_shingles(column: pa.ChunkedArray | pa.Array) -> pa.ChunkedArray | pa.Array:
    """A shingles column as SHINGLES_TYPE: itself when it is, converted from an older file's large_list<uint32>."""
    return pack_shingles(*shingle_arrays(column)) if pa.types.is_large_list(column.type) else column


def _hash32(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little")


def shingle_hashes(text: str, settings: NearDedup) -> np.ndarray:
    """SCHEME's shingle set: sorted unique 32-bit hashes of the document's word n-grams (all its words if it has
    fewer; none if it has no words). `sign_texts` gives the shingle sets of the configured scheme."""
    w = normalized_words(text, settings.normalization)
    n = settings.shingle_size
    if plain(text):  # spaced words only: every n consecutive words
        grams = [" ".join(w[i:i + n]) for i in range(max(len(w) - n + 1, 1))] if w else []
    else:  # no-space characters weigh less than a word: a shingle spans n words' worth (text.shingle_ranges)
        _, starts, ends = shingle_ranges(word_weights(w), np.zeros(1, np.int64), np.array([len(w)]), n)
        grams = [" ".join(w[a:b]) for a, b in zip(starts.tolist(), ends.tolist())]
    return np.unique(np.fromiter((_hash32(g.encode("utf-8", "surrogatepass")) for g in grams),
                                 dtype=np.uint32, count=len(grams)))


@lru_cache(maxsize=4)
def _template(num_perm: int, seed: int) -> MinHash:
    """Permutations are drawn once per (num_perm, seed); every signature reuses them."""
    return MinHash(num_perm=num_perm, seed=seed, scheme=SCHEME)


def signature(shingles: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    """SCHEME's signature of a SCHEME shingle set."""
    t = _template(num_perm, seed)
    m = MinHash(num_perm=num_perm, seed=seed, hashfunc=int, permutations=t.permutations, scheme=SCHEME)
    m.update_batch(shingles.tolist())
    return m.hashvalues.astype(np.uint32, copy=False)


def lean(sig: np.ndarray, seed: int) -> LeanMinHash:
    """A stored signature of either scheme as a datasketch LeanMinHash (for datasketch's MinHashLSH, which reads only
    the values; datasketch knows no SCHEME_FAST, so every signature carries SCHEME's label)."""
    return LeanMinHash(seed=seed, hashvalues=sig, scheme=SCHEME)


def jaccard(a: np.ndarray, b: np.ndarray) -> float:
    """Exact Jaccard similarity of two sorted unique shingle-hash arrays; 0 for two empty ones (documents without
    words, "!!! ???" or emoji only, share no text a near-duplicate could be made of)."""
    inter = np.intersect1d(a, b, assume_unique=True).size
    union = a.size + b.size - inter
    return inter / union if union else 0.0


def estimated_jaccard(sig: np.ndarray, others: np.ndarray) -> np.ndarray:
    """MinHash estimate of Jaccard between one signature and each row of `others` (vectorized)."""
    return (others == sig).mean(axis=1)


# -------------------------------------------------------------------------------------- bands x rows

def bands_rows(settings: NearDedup) -> tuple[int, int]:
    """The configured bands x rows, or `lsh.choose_bands`'s for the threshold and min_recall."""
    if settings.bands is not None:
        return settings.bands, settings.rows
    return choose_bands(settings.num_perm, settings.threshold, settings.min_recall)


# ---------------------------------------------------------------------------------------- line hashes

def line_hash(stripped_line: str) -> int:
    return int.from_bytes(hashlib.blake2b(stripped_line.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little")


def line_hashes(text: str, settings: BoilerplateLines) -> set[int]:
    """Hashes of the document's distinct non-trivial lines (whitespace-stripped)."""
    return {line_hash(s) for line in text.splitlines() if len(s := line.strip()) >= settings.min_chars}


def _check_scheme(scheme: str) -> None:
    if scheme not in (SCHEME, SCHEME_FAST):
        raise ValueError(f"unknown signature scheme {scheme!r}; known: {SCHEME!r}, {SCHEME_FAST!r}")


def sign_texts(texts: list[str], settings: NearDedup,
               scheme: str | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Signatures and shingle sets of `texts` under a signature scheme (default `settings.scheme`, as the signature
    stage signs; anything comparing texts with stored signatures or shingle sets must use theirs), as `sign_batch`
    returns them."""
    scheme = settings.scheme if scheme is None else scheme
    _check_scheme(scheme)
    if scheme == SCHEME_FAST:
        return sign_batch(texts, settings)
    shingles = [shingle_hashes(t, settings) for t in texts]
    signatures = np.empty((len(texts), settings.num_perm), dtype=np.uint32)
    for i, sh in enumerate(shingles):
        signatures[i] = signature(sh, settings.num_perm, settings.seed)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    np.cumsum([s.size for s in shingles], out=offsets[1:])
    return signatures, np.concatenate(shingles) if shingles else np.empty(0, dtype=np.uint32), offsets


def sign_shingles(values: np.ndarray, offsets: np.ndarray, settings: NearDedup,
                  scheme: str | None = None) -> np.ndarray:
    """(n, num_perm) signatures of stored shingle sets of `scheme` (set i is values[offsets[i]:offsets[i + 1]]), equal
    to the signatures `sign_texts` gives with them (a signature is a function of the shingle set)."""
    scheme = settings.scheme if scheme is None else scheme
    _check_scheme(scheme)
    n = len(offsets) - 1
    out = np.empty((n, settings.num_perm), dtype=np.uint32)
    if scheme == SCHEME:
        for i in range(n):
            out[i] = signature(np.asarray(values[offsets[i]:offsets[i + 1]]), settings.num_perm, settings.seed)
        return out
    start = 0
    while start < n:  # chunks of about _CHUNK_CHARS shingles: the (shingles, rounds) draws stay small
        end = min(n, start + _CHUNK_TEXTS, max(start + 1, int(np.searchsorted(offsets, offsets[start] + _CHUNK_CHARS))))
        sizes = np.diff(offsets[start:end + 1])
        text_of = np.repeat(np.arange(end - start, dtype=np.int64), sizes)
        out[start:end] = similarity_sketches(text_of, np.asarray(values[offsets[start]:offsets[end]], np.uint32),
                                             end - start, settings.num_perm, settings.seed)
        start = end
    return out
