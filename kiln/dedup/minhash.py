"""Shingles, MinHash signatures and the LSH bands x rows choice, under one of two signature schemes
(`dedup.near.scheme`): SCHEME_FAST (the default, see below), which signs whole batches with numpy, and SCHEME
(blake2b shingles + datasketch MinHash), what indexes built before the scheme was configurable hold.

A document becomes the set of hashes of its normalized word n-grams ("shingles"); its MinHash
signature estimates Jaccard similarity between such sets. Signatures and shingle sets are stored as
plain arrays (Parquet lists), never pickled, so any later run (or another machine) can verify a
candidate pair exactly.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from datasketch import LeanMinHash, MinHash

from kiln.common.config import BoilerplateLines, NearDedup, ShingleNormalization
from kiln.dedup.text import normalized_words
from kiln.engine import SERIAL, Engine
from kiln.common.storage import resume_part, write_parquet_atomic

SCHEME = "affine32"  # datasketch >= 2.0: 32-bit hash values, collision-free permutations
SCHEME_FAST = "fss-splitmix64-v1"  # see "the fast signature scheme" below

SIGNATURE_COLUMNS = ["doc_id", "source", "chars", "signature", "shingles"]
HASH_COLUMNS = ("signature", "shingles")  # random 32-bit values: stored plain (write_parquet_atomic)


def signature_schema(num_perm: int) -> pa.Schema:
    return pa.schema([
        pa.field("doc_id", pa.string(), nullable=False),
        pa.field("source", pa.string(), nullable=False),
        pa.field("chars", pa.int64(), nullable=False),
        pa.field("signature", pa.list_(pa.uint32(), num_perm), nullable=False),
        pa.field("shingles", pa.large_list(pa.uint32()), nullable=False),  # sorted, unique
    ])


LINES_SCHEMA = pa.schema([pa.field("line_hash", pa.uint64(), nullable=False),
                          pa.field("documents", pa.int64(), nullable=False)])


def _hash32(data: bytes) -> int:
    return int.from_bytes(hashlib.blake2b(data, digest_size=4).digest(), "little")


def shingle_hashes(text: str, settings: NearDedup) -> np.ndarray:
    """SCHEME's shingle set: sorted unique 32-bit hashes of the document's word n-grams (all its words if it has
    fewer). `sign_texts` gives the shingle sets of the configured scheme."""
    w = normalized_words(text, settings.normalization)
    n = settings.shingle_size
    grams = [" ".join(w[i:i + n]) for i in range(max(len(w) - n + 1, 1))] if w else [""]
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
    """Exact Jaccard similarity of two sorted unique shingle-hash arrays."""
    inter = np.intersect1d(a, b, assume_unique=True).size
    union = a.size + b.size - inter
    return inter / union if union else 1.0


def estimated_jaccard(sig: np.ndarray, others: np.ndarray) -> np.ndarray:
    """MinHash estimate of Jaccard between one signature and each row of `others` (vectorized)."""
    return (others == sig).mean(axis=1)


# -------------------------------------------------------------------------------------- bands x rows

def candidate_probability(j: float | np.ndarray, bands: int, rows: int) -> float | np.ndarray:
    """Probability that a pair with Jaccard `j` shares at least one LSH band (the S-curve)."""
    return 1.0 - (1.0 - np.power(j, rows)) ** bands


def choose_bands(num_perm: int, threshold: float, min_recall: float) -> tuple[int, int]:
    """The bands x rows with the fewest candidates below the threshold among those that find at least
    `min_recall` of pairs *at* the threshold. Candidates are verified exactly, so recall is what
    matters; a plain LSH tuned for threshold 0.8 misses a large share of pairs at J 0.80-0.85."""
    grid = np.linspace(0.0, threshold, 201)
    best, best_fp = None, float("inf")
    for rows in range(1, num_perm + 1):
        for bands in range(2, num_perm // rows + 1):
            if candidate_probability(threshold, bands, rows) < min_recall:
                continue
            fp = float(np.trapezoid(candidate_probability(grid, bands, rows), grid))
            if fp < best_fp - 1e-12:
                best, best_fp = (bands, rows), fp
            break  # more bands only adds candidates for this row count
    if best is None:
        raise ValueError(f"no bands x rows within num_perm={num_perm} reaches recall {min_recall} at Jaccard "
                         f"{threshold}; raise dedup.near.num_perm or lower dedup.near.min_recall")
    return best


def bands_rows(settings: NearDedup) -> tuple[int, int]:
    if settings.bands is not None:
        return settings.bands, settings.rows
    return choose_bands(settings.num_perm, settings.threshold, settings.min_recall)


# ------------------------------------------------------------------------------------ signature stage

def line_hash(stripped_line: str) -> int:
    return int.from_bytes(hashlib.blake2b(stripped_line.encode("utf-8", "surrogatepass"), digest_size=8).digest(),
                          "little")


def line_hashes(text: str, settings: BoilerplateLines) -> set[int]:
    """Hashes of the document's distinct non-trivial lines (whitespace-stripped)."""
    return {line_hash(s) for line in text.splitlines() if len(s := line.strip()) >= settings.min_chars}


_SIGN_ROWS = 2048  # documents per `sign_texts` call (it splits larger batches into ~1 MB numpy passes itself)


@dataclass(frozen=True)
class _SignTask:
    input_paths: tuple[str, ...]  # consecutive curated parts: one signature part
    output_path: str
    near: str  # NearDedup as JSON (picklable, exact)
    lines: str | None  # BoilerplateLines as JSON, when line counting is on


def _sign_part(task: _SignTask) -> tuple[int, Counter, Counter]:
    done = resume_part(task.output_path, lambda: _sign(task))
    return (done["documents"], Counter({int(h): n for h, n in done["lines"].items()}),
            Counter({int(k): n for k, n in done["shingle_counts"].items()}))


def _sign(task: _SignTask) -> dict:
    near = NearDedup.model_validate_json(task.near)
    lines = BoilerplateLines.model_validate_json(task.lines) if task.lines else None
    ids, sources, chars, signatures, shingle_sets = [], [], [], [], []
    line_counts: Counter = Counter()
    batches = (batch for path in task.input_paths
               for batch in pq.ParquetFile(path).iter_batches(batch_size=_SIGN_ROWS, columns=["doc_id", "source", "text"]))
    for batch in batches:
        texts = batch.column("text").to_pylist()
        sigs, values, offsets = sign_texts(texts, near, near.scheme)  # the whole batch at once
        ids.append(batch.column("doc_id"))
        sources.append(batch.column("source"))
        chars.extend(len(t) for t in texts)
        signatures.append(sigs)
        shingle_sets.append((values, offsets))
        if lines is not None:
            for text in texts:
                line_counts.update(line_hashes(text, lines))
    table = pa.table({
        "doc_id": _strings(ids),
        "source": _strings(sources),
        "chars": pa.array(chars, pa.int64()),
        "signature": pa.FixedSizeListArray.from_arrays(
            pa.array(np.concatenate(signatures).reshape(-1) if signatures else np.empty(0, np.uint32), pa.uint32()),
            near.num_perm),
        "shingles": _concat_lists(shingle_sets),
    }, schema=signature_schema(near.num_perm))
    write_parquet_atomic(Path(task.output_path), table, hash_columns=HASH_COLUMNS)
    sizes = np.concatenate([np.diff(offsets) for _, offsets in shingle_sets]) if shingle_sets else np.zeros(0, int)
    return {"documents": table.num_rows, "lines": {str(h): n for h, n in line_counts.items()},
            "shingle_counts": {str(k): int(n) for k, n in zip(*np.unique(sizes, return_counts=True))}}


def _strings(arrays: list[pa.Array]) -> pa.Array:
    return pa.concat_arrays([a.cast(pa.string()) for a in arrays]) if arrays else pa.array([], pa.string())


def _concat_lists(parts: list[tuple[np.ndarray, np.ndarray]]) -> pa.LargeListArray:
    """One large_list<uint32> column from (values, offsets) pairs, each as `sign_texts` returns them."""
    if not parts:
        return pa.LargeListArray.from_arrays(pa.array([0], pa.int64()), pa.array([], pa.uint32()))
    starts = np.cumsum([0] + [v.size for v, _ in parts[:-1]])
    offsets = np.concatenate([parts[0][1][:1]] + [o[1:] + s for (_, o), s in zip(parts, starts)])
    return pa.LargeListArray.from_arrays(pa.array(offsets, pa.int64()),
                                         pa.array(np.concatenate([v for v, _ in parts]), pa.uint32()))


def _list_array(arrays: list[np.ndarray]) -> pa.LargeListArray:
    """The same column from one shingle array per document."""
    offsets = np.zeros(len(arrays) + 1, dtype=np.int64)
    np.cumsum([a.size for a in arrays], out=offsets[1:])
    return _concat_lists([(np.concatenate(arrays) if arrays else np.empty(0, np.uint32), offsets)])


def signature_groups(input_parts: Sequence[Path], rows: int) -> list[tuple[Path, ...]]:
    """Consecutive input parts joined until a group holds at least `rows` documents (the last may hold fewer): one
    signature part each. Signature parts are the unit of every near-dup task after them, and each task's shuffle
    writes a file per partition: curated parts of a few hundred documents made ~30,000 files per 100,000 documents,
    parts of 5,000 a tenth of that, and 4x less CPU to decide the same."""
    groups, current, n = [], [], 0
    for part in input_parts:
        current.append(Path(part))
        n += pq.ParquetFile(part).metadata.num_rows
        if n >= rows:
            groups.append(tuple(current))
            current, n = [], 0
    return groups + [tuple(current)] if current else groups


@dataclass
class Signed:
    documents: int
    line_counts: Counter  # documents per boilerplate-line hash, when line counting is on
    shingle_counts: Counter  # documents per number of distinct shingles

    def median_shingles(self) -> float:
        """Distinct shingles of the median document (the mean of the two middle ones for an even count)."""
        sizes = sorted(self.shingle_counts)
        seen = np.cumsum([self.shingle_counts[k] for k in sizes])
        if not sizes:
            return 0.0
        total = int(seen[-1])
        lo, hi = (sizes[int(np.searchsorted(seen, rank, "right"))] for rank in ((total - 1) // 2, total // 2))
        return (lo + hi) / 2


def compute_signatures(input_groups: Sequence[Sequence[Path]], output_paths: Sequence[Path], near: NearDedup,
                       lines: BoilerplateLines | None = None, engine: Engine = SERIAL, progress: bool = True,
                       label: str = "minhash") -> Signed:
    """One signature part per group of input parts (`signature_groups`; the unit of parallel work)."""
    tasks = [_SignTask(tuple(map(str, group)), str(o), near.model_dump_json(), lines.model_dump_json() if lines else None)
             for group, o in zip(input_groups, output_paths)]
    out = Signed(0, Counter(), Counter())
    for n, line_counts, shingle_counts in engine.map_parts(
            _sign_part, tasks, desc=label, progress=progress,
            size=lambda t: sum(os.path.getsize(p) for p in t.input_paths)):
        out.documents += n
        out.line_counts.update(line_counts)
        out.shingle_counts.update(shingle_counts)
    return out


def lines_table(counts: Counter) -> pa.Table:
    return pa.table({"line_hash": pa.array(list(counts.keys()), pa.uint64()),
                     "documents": pa.array(list(counts.values()), pa.int64())}, schema=LINES_SCHEMA)


# ------------------------------------------------------------------------- the fast signature scheme
#
# SCHEME_FAST (the default dedup.near.scheme) signs a whole batch of documents with a few numpy passes instead of
# Python calls per word or shingle. Same words as `normalized_words`; other hash functions, so its shingle sets and
# signatures are not comparable with SCHEME's:
#   word hash      mix64(sum_k (byte_k + 1) * WORD_BASE^k)  over the word's UTF-8 bytes (surrogatepass)
#   shingle hash   mix64(sum_k word_hash_k * SHINGLE_BASE^k) over n consecutive words (all the words of
#                  a shorter document, none for an empty one), its high 32 bits
#   signature      fast similarity sketching of the shingle set into num_perm bins (`similarity_sketches`):
#                  Pr[two signatures agree in a position] equals the Jaccard similarity of the two shingle
#                  sets, as for num_perm independent permutations, at the cost of about
#                  max(shingles, num_perm ln num_perm) hashes per text instead of shingles x num_perm.
# Sums are mod 2^64, so a polynomial over any range is one difference of prefix sums; mix64 (the
# splitmix64 finalizer) spreads it over all 64 bits.

WORD_BASE = 0x9E3779B97F4A7C15  # odd, so invertible mod 2^64
SHINGLE_BASE = 0xC2B2AE3D27D4EB4F  # odd
_MASK64 = (1 << 64) - 1
_U64 = np.uint64
_SPACE, _NEWLINE = 0x20, 0x0A
_CHUNK_CHARS = 1 << 20  # characters per numpy pass: the working arrays stay in cache-sized memory
_CHUNK_TEXTS = 1 << 13  # and texts: the (texts, num_perm) sketch arrays stay small


def mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over an integer array read as uint64: a bijection whose every output bit depends on
    every input bit."""
    with np.errstate(over="ignore"):
        x = np.asarray(x).astype(np.uint64, copy=False) + _U64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> _U64(30))) * _U64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> _U64(27))) * _U64(0x94D049BB133111EB)
    return x ^ (x >> _U64(31))


def _mix64_int(x: int) -> int:
    return int(mix64(np.array([x & _MASK64], dtype=np.uint64))[0])


@lru_cache(maxsize=4)
def _code_point_map(strip_punctuation: bool, zero_digits: bool) -> np.ndarray:
    """Every code point (surrogates included) to itself if it is part of a word, else to a space; ASCII
    digits to "0" when they are zeroed. The regex of `normalized_words` decides, once, so the two cannot
    disagree; zeroing digits before lowercasing is the same as after (neither changes which is cased)."""
    every = np.arange(0x110000, dtype=np.uint32)
    in_word = np.zeros(every.size, dtype=bool)
    every_text = every.tobytes().decode("utf-32-le", "surrogatepass")
    for m in re.finditer(r"\w+" if strip_punctuation else r"\S+", every_text):
        in_word[m.start():m.end()] = True
    out = np.where(in_word, every, _SPACE).astype(np.uint32)
    if zero_digits:
        out[ord("1"):ord("9") + 1] = ord("0")
    return out


class _Powers:
    """base^i and base^-i mod 2^64 for i < n, grown on demand (a range's polynomial from prefix sums)."""

    def __init__(self, base: int):
        self.base, self.inverse = base, pow(base, -1, 1 << 64)
        self.up = self.down = np.ones(1, dtype=np.uint64)

    def __call__(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        if self.up.size < n:
            size = max(n, 2 * self.up.size)
            self.up = self._series(self.base, size)
            self.down = self._series(self.inverse, size)
        return self.up, self.down

    @staticmethod
    def _series(base: int, size: int) -> np.ndarray:
        out = np.full(size, base, dtype=np.uint64)
        out[0] = 1
        return np.multiply.accumulate(out)


_WORD_POWERS, _SHINGLE_POWERS = _Powers(WORD_BASE), _Powers(SHINGLE_BASE)


def _range_polynomials(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, powers: _Powers) -> np.ndarray:
    """sum_k values[s + k] * base^k over each range [s, e), all ranges at once."""
    up, down = powers(values.size + 1)
    prefix = np.zeros(values.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.cumsum(values * up[:values.size], out=prefix[1:])
        return (prefix[ends] - prefix[starts]) * down[starts]


def _normalized_bytes(texts: list[str], norm: ShingleNormalization) -> np.ndarray:
    """UTF-8 of the texts' normalized words, spaces between words and a newline after each text."""
    codes = np.frombuffer("\n".join(texts).encode("utf-32-le", "surrogatepass") + b"\n\0\0\0", dtype="<u4")
    codes = np.take(_code_point_map(norm.strip_punctuation, norm.digits == "zero"), codes)
    codes[np.cumsum([len(t) + 1 for t in texts]) - 1] = _NEWLINE  # no other newline is left
    # Lowercasing the whole string equals lowercasing each word: str.lower maps per character except for the
    # Greek final sigma, whose context rule stops at a space or newline as at the end of a word.
    text = codes.astype("<u4", copy=False).tobytes().decode("utf-32-le", "surrogatepass")
    if norm.lowercase:
        text = text.lower()
    data = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    if norm.digits == "remove":  # after lowercasing, as in `normalize_word`: a digit can end a final sigma
        data = data[(data < ord("0")) | (data > ord("9"))]  # ASCII digits are whole bytes in UTF-8
    return data


def _shingle_sets(texts: list[str], settings: NearDedup) -> tuple[np.ndarray, np.ndarray]:
    """(document index, shingle hash) of every distinct shingle, sorted by both."""
    data = _normalized_bytes(texts, settings.normalization)
    in_word = np.concatenate(([False], (data != _SPACE) & (data != _NEWLINE), [False]))
    edges = np.flatnonzero(in_word[1:] != in_word[:-1])
    word_starts, word_ends = edges[0::2], edges[1::2]
    word_hashes = mix64(_range_polynomials(data.astype(np.uint64) + _U64(1), word_starts, word_ends, _WORD_POWERS))
    # Words per text: the newline closing text d is the (d+1)-th one.
    text_ends = np.flatnonzero(data == _NEWLINE)
    first_word = np.searchsorted(word_starts, np.concatenate(([0], text_ends[:-1])))
    words_in = np.searchsorted(word_starts, text_ends) - first_word
    n = settings.shingle_size
    shingles_in = np.maximum(words_in - n + 1, 1)  # a text shorter than n words is one shingle of all its words
    text_of = np.repeat(np.arange(len(texts), dtype=np.uint64), shingles_in)
    starts = np.repeat(first_word, shingles_in) + (np.arange(shingles_in.sum()) -
                                                   np.repeat(np.cumsum(shingles_in) - shingles_in, shingles_in))
    ends = starts + np.repeat(np.minimum(words_in, n), shingles_in)
    hashes = mix64(_range_polynomials(word_hashes, starts, ends, _SHINGLE_POWERS)) >> _U64(32)
    keys = _sorted_unique((text_of << _U64(32)) | hashes)
    return (keys >> _U64(32)).astype(np.int64), (keys & _U64(0xFFFFFFFF)).astype(np.uint32)


def _sorted_unique(keys: np.ndarray) -> np.ndarray:
    keys.sort()
    return keys[np.concatenate(([True], keys[1:] != keys[:-1]))]


def _bins(h: np.ndarray, num_perm: int) -> np.ndarray:
    return ((h >> _U64(32)) * _U64(num_perm) >> _U64(32)).astype(np.int64)  # high bits, range-reduced


def similarity_sketches(text_of: np.ndarray, shingles: np.ndarray, texts: int, num_perm: int,
                        seed: int) -> np.ndarray:
    """(texts, num_perm) uint32 signatures by fast similarity sketching (Dahlgaard, Knudsen, Thorup 2017).

    In round r = 0 .. 2 num_perm - 1 every shingle x draws h = mix64((r << 32 | x) ^ mix64(seed)) and lands in
    one bin: the bin of h's high bits while r < num_perm, then, from round num_perm on, the bins in order from
    where round num_perm put it (so each bin is reached within 2 num_perm rounds). A bin keeps the draw with the
    smallest (round, low 32 bits of h) and its value is those low 32 bits. Over the union of two sets that draw
    is equally likely to come from any element, so two signatures agree in a bin with probability equal to
    the Jaccard similarity; unlike one-permutation hashing with densification, the bins a set fills do not
    depend on a fixed bin-to-bin pattern, so the rows of an LSH band stay close to independent.

    Work is about max(shingles, num_perm ln num_perm) hashes per text: a round cannot beat an earlier one, so
    a text stops once all its bins are filled; rounds are taken in blocks sized so one block usually does."""
    empty = np.iinfo(np.uint64).max
    sizes = np.bincount(text_of, minlength=texts)
    best = np.full((texts, num_perm), empty, dtype=np.uint64)  # per bin: round << 32 | value
    rounds_from = np.zeros(texts, dtype=np.int64)
    # A first block of about num_perm ln num_perm draws (coupon collector) fills most texts' bins.
    rounds_to = np.clip(np.ceil(num_perm * np.log(num_perm) / np.maximum(sizes, 1)), 1, 2 * num_perm)
    rounds_to = rounds_to.astype(np.int64)
    pending = sizes > 0
    while pending.any():
        # Texts with the same rounds to draw are one (shingles x rounds) array: no per-draw repeats.
        blocks = rounds_from * (4 * num_perm) + rounds_to
        for block in np.unique(blocks[pending]):
            rounds = np.arange(block // (4 * num_perm), block % (4 * num_perm), dtype=np.uint64)
            mine = (pending & (blocks == block))[text_of]
            _draw(best, text_of[mine], shingles[mine], rounds, num_perm, seed)
        rounds_from[pending] = rounds_to[pending]
        pending &= (best == empty).any(axis=1)
        rounds_to[pending] = np.minimum(2 * num_perm, 2 * rounds_from[pending])
    return (best & _U64(0xFFFFFFFF)).astype(np.uint32)


def _draw(best: np.ndarray, text_of: np.ndarray, shingles: np.ndarray, rounds: np.ndarray, num_perm: int,
          seed: int) -> None:
    """Every shingle's draws in `rounds`, each kept in its bin if it is the smallest (round, value) there."""
    keyed = shingles.astype(np.uint64)[:, None] ^ _U64(_mix64_int(seed))
    h = mix64(keyed ^ (rounds << _U64(32)))
    bins = _bins(h, num_perm)
    walking = rounds >= num_perm
    if walking.any():  # from round num_perm on: the next bin after round num_perm's
        start = _bins(mix64(keyed ^ (_U64(num_perm) << _U64(32))), num_perm)
        bins[:, walking] = (start + (rounds[walking] - _U64(num_perm)).astype(np.int64)) % num_perm
    cells = text_of[:, None] * num_perm + bins
    np.minimum.at(best.reshape(-1), cells.reshape(-1), (rounds << _U64(32) | (h & _U64(0xFFFFFFFF))).reshape(-1))


def sign_batch(texts: list[str], settings: NearDedup) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SCHEME_FAST signatures and shingle sets of many texts: (signatures (n, num_perm) uint32, shingle
    values uint32, shingle offsets int64 (n + 1)); text i's shingle set, sorted and unique, is
    values[offsets[i]:offsets[i + 1]]."""
    signatures, values, counts = [], [], []
    for chunk in _chunks(texts):
        text_of, shingles = _shingle_sets(chunk, settings)
        signatures.append(similarity_sketches(text_of, shingles, len(chunk), settings.num_perm, settings.seed))
        values.append(shingles)
        counts.append(np.bincount(text_of, minlength=len(chunk)))
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    if texts:
        np.cumsum(np.concatenate(counts), out=offsets[1:])
    return (np.concatenate(signatures) if texts else np.empty((0, settings.num_perm), dtype=np.uint32),
            np.concatenate(values) if texts else np.empty(0, dtype=np.uint32), offsets)


def _chunks(texts: list[str]):
    start, size = 0, 0
    for i, t in enumerate(texts):
        size += len(t)
        if size >= _CHUNK_CHARS or i + 1 - start >= _CHUNK_TEXTS:
            yield texts[start:i + 1]
            start, size = i + 1, 0
    if start < len(texts):
        yield texts[start:]


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
