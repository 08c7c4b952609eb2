"""The fast signature scheme, `minhash.SCHEME_FAST` (`minhash.sign_texts` dispatches between the two schemes).

SCHEME_FAST (the default dedup.near.scheme) signs a whole batch of documents with a few numpy passes (code points,
scripts, normalization) and compiled loops (`kiln.dedup._kernels`: word and shingle hashes, each text's sorted unique
shingle set, the sketches) instead of Python calls per word or shingle. Same words and shingles as
`normalized_words` and `text.shingle_ranges` (a character of a script written without spaces is a word of its own);
other hash functions, so its shingle sets and signatures are not comparable with SCHEME's:
  word hash      mix64(sum_k (byte_k + 1) * WORD_BASE^k)  over the word's UTF-8 bytes (surrogatepass)
  shingle hash   mix64(sum_k word_hash_k * SHINGLE_BASE^k) over n consecutive words (n words' worth of no-space
                 characters, `text.shingle_ranges`; all the words of a shorter document, none for an empty one),
                 its high 32 bits
  signature      fast similarity sketching of the shingle set into num_perm bins (`similarity_sketches`):
                 Pr[two signatures agree in a position] equals the Jaccard similarity of the two shingle
                 sets, as for num_perm independent permutations, at the cost of about
                 max(shingles, num_perm ln num_perm) hashes per text instead of shingles x num_perm.
Sums are mod 2^64, so a polynomial over any range is one difference of prefix sums; mix64 (the
splitmix64 step, `kiln.common.splitmix`) spreads it over all 64 bits.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from kiln.common.config import NearDedup, ShingleNormalization
from kiln.common.splitmix import mix64, mix64_int
from kiln.common.text_units import WORD_WEIGHT, mark_code_points, unit_code_points, unit_weights
from kiln.dedup.text import shingle_ranges

WORD_BASE = 0x9E3779B97F4A7C15  # odd, so invertible mod 2^64
SHINGLE_BASE = 0xC2B2AE3D27D4EB4F  # odd
_U64, _U32 = np.uint64, np.uint32
_SPACE, _NEWLINE = 0x20, 0x0A
_CHUNK_CHARS = 1 << 20  # characters per numpy pass: the working arrays stay in cache-sized memory
_CHUNK_TEXTS = 1 << 13  # and texts: the (texts, num_perm) sketch arrays stay small
# Flags the code point map adds (code points need 21 bits): a character of a no-space script, a combining mark.
_UNIT_FLAG, _MARK_FLAG = 1 << 30, 1 << 29
_CODE_BITS = (1 << 29) - 1


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
    out[sorted(unit_code_points())] |= _UNIT_FLAG  # text_units: these split words (`_split_units`)
    out[sorted(mark_code_points())] |= _MARK_FLAG
    return out


@lru_cache(maxsize=8)
def _ascii_map(strip_punctuation: bool, zero_digits: bool, lowercase: bool) -> np.ndarray:
    """`_code_point_map` of the ASCII code points, then str.lower (A-Z to a-z: ASCII lowercases within ASCII), as
    bytes: the UTF-8 that the general path gives an ASCII text."""
    mapped = _code_point_map(strip_punctuation, zero_digits)[:128] & _U32(_CODE_BITS)  # no ASCII flag is set
    text = mapped.astype("<u4").tobytes().decode("utf-32-le")
    return np.frombuffer((text.lower() if lowercase else text).encode("ascii"), dtype=np.uint8).copy()


def _split_units(codes: np.ndarray, mapped: np.ndarray) -> tuple[np.ndarray, bool]:
    """The mapped code points of a chunk with no-space characters or combining marks, as `text_units.WORDS` /
    `NON_SPACE` split them, and whether it has a no-space character: a combining mark stays in the word of the
    character before it (its own word in \\S mode, as the map says), and a space goes before every no-space character
    and after it (and its marks). Works on the flagged positions only, so a few marks in a long chunk cost little."""
    flags = mapped >> _U32(29)  # bit 0: mark, bit 1: no-space character
    base = mapped & _U32(_CODE_BITS)
    marks = np.flatnonzero(flags & _U32(1))
    units = np.flatnonzero(flags & _U32(2))
    # Each mark's nearest character before it that is not a mark (-1: none), runs of marks sharing one.
    run_start = np.ones(marks.size, dtype=bool)
    run_start[1:] = marks[1:] != marks[:-1] + 1
    prev = np.maximum.accumulate(np.where(run_start, marks - 1, -1)) if marks.size else marks
    has_prev = prev >= 0
    before = base[np.maximum(prev, 0)]
    attached = marks[has_prev & (before != _SPACE) & (before != _NEWLINE)]
    base[attached] = codes[attached]  # \w mode maps marks to a space: a mark inside a word keeps its code point
    unit_marks = marks[has_prev & ((flags[np.maximum(prev, 0)] & _U32(2)) != 0)]
    # Boolean masks over the positions, not np.union1d / np.isin (hash tables of every element: 30x slower here).
    member = np.zeros(base.size + 1, dtype=bool)
    member[units] = True
    is_unit_mark = np.zeros(base.size + 1, dtype=bool)
    is_unit_mark[unit_marks] = True
    member |= is_unit_mark  # a no-space character or one of its marks
    after = np.flatnonzero(member[:base.size]) + 1
    breaks = np.zeros(base.size + 1, dtype=bool)
    breaks[units] = True
    breaks[after[~is_unit_mark[after]]] = True
    return np.insert(base, np.flatnonzero(breaks), _SPACE), units.size > 0


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


_SHINGLE_POWERS = _Powers(SHINGLE_BASE)


def _range_polynomials(values: np.ndarray, starts: np.ndarray, ends: np.ndarray, powers: _Powers) -> np.ndarray:
    """sum_k values[s + k] * base^k over each range [s, e), all ranges at once."""
    up, down = powers(values.size + 1)
    prefix = np.zeros(values.size + 1, dtype=np.uint64)
    with np.errstate(over="ignore"):
        np.cumsum(values * up[:values.size], out=prefix[1:])
        return (prefix[ends] - prefix[starts]) * down[starts]


def _normalized_bytes(texts: list[str], norm: ShingleNormalization,
                      lengths: np.ndarray | None = None) -> tuple[np.ndarray, bool]:
    """UTF-8 of the texts' normalized words, spaces between words and a newline after each text; and whether any
    word is a no-space character (a chunk without any takes the plain path: the same bytes as before text_units).
    `lengths`: the texts' lengths, when the caller has them."""
    joined = "\n".join(texts)
    ends = np.cumsum((_lengths(texts) if lengths is None else lengths) + 1) - 1
    if joined.isascii():  # (a flag of the str, no scan) one byte per character, mapped and lowercased by one table
        data = np.take(_ascii_map(norm.strip_punctuation, norm.digits == "zero", norm.lowercase),
                       np.frombuffer(joined.encode("ascii") + b"\n", dtype=np.uint8))
        data[ends] = _NEWLINE
        return _digits_removed(data) if norm.digits == "remove" else data, False
    original = np.frombuffer(joined.encode("utf-32-le", "surrogatepass") + b"\n\0\0\0", dtype="<u4")
    codes = np.take(_code_point_map(norm.strip_punctuation, norm.digits == "zero"), original)
    codes[ends] = _NEWLINE  # no other newline is left
    units = False
    if codes.max() > _CODE_BITS:  # a flagged character: the script-aware split
        codes, units = _split_units(original, codes)
    # Lowercasing the whole string equals lowercasing each word: str.lower maps per character except for the
    # Greek final sigma, whose context rule stops at a space or newline as at the end of a word.
    text = codes.astype("<u4", copy=False).tobytes().decode("utf-32-le", "surrogatepass")
    if norm.lowercase:
        text = text.lower()
    data = np.frombuffer(text.encode("utf-8", "surrogatepass"), dtype=np.uint8)
    if norm.digits == "remove":  # after lowercasing, as in `normalize_word`: a digit can end a final sigma
        data = _digits_removed(data)
    return data, units


def _digits_removed(data: np.ndarray) -> np.ndarray:
    return data[(data < ord("0")) | (data > ord("9"))]  # ASCII digits are whole bytes in UTF-8


def _unit_words(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """The weight of each word starting at `starts` (text_units.word_weights): a no-space character's (all are 3 or 4
    bytes long in UTF-8), WORD_WEIGHT for any other word."""
    out = np.full(starts.size, WORD_WEIGHT, dtype=np.int64)
    wide = np.flatnonzero(data[starts] >= 0xE0)  # only these can be: decode them alone
    at = starts[wide]
    d = np.concatenate((data, np.zeros(3, dtype=np.uint8))).astype(np.uint32)
    lead, b1, b2, b3 = d[at], d[at + 1] & 0x3F, d[at + 2] & 0x3F, d[at + 3] & 0x3F
    cp = np.where(lead >= 0xF0, (lead & 0x07) << 18 | b1 << 12 | b2 << 6 | b3, (lead & 0x0F) << 12 | b1 << 6 | b2)
    out[wide] = _weight_table()[cp]
    return out


@lru_cache(maxsize=1)
def _weight_table() -> np.ndarray:
    """Code point -> the weight of a word it starts (text_units.unit_weights, else WORD_WEIGHT)."""
    table = np.full(0x110000, WORD_WEIGHT, dtype=np.int8)  # 1.1 MB
    weights = unit_weights()
    table[np.fromiter(weights, dtype=np.int64)] = np.fromiter(weights.values(), dtype=np.int8)
    return table


def _shingle_sets(texts: list[str], settings: NearDedup, lengths: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every text's distinct shingle hashes, sorted, text after text (uint32), and how many each text has."""
    norm = settings.normalization
    if norm.digits != "remove" and all(map(str.isascii, texts)):  # (a flag of each str, no scan)
        # ASCII, the common case: the kernel reads the texts' own bytes through `_ascii_map` (what
        # `_normalized_bytes` makes a mapped copy of), each text closed where the join put its newline.
        raw = np.frombuffer("\n".join(texts).encode("ascii") + b"\n", dtype=np.uint8)
        byte_map = _ascii_map(norm.strip_punctuation, norm.digits == "zero", norm.lowercase)
        return _spaced_shingle_sets(raw, np.cumsum(lengths + 1) - 1, byte_map, settings)
    data, units = _normalized_bytes(texts, norm, lengths)
    if not units:  # spaced words only: every n consecutive words, in one compiled pass
        return _spaced_shingle_sets(data, np.flatnonzero(data == _NEWLINE), _IDENTITY, settings)
    in_word = np.concatenate(([False], (data != _SPACE) & (data != _NEWLINE), [False]))
    edges = np.flatnonzero(in_word[1:] != in_word[:-1])
    word_starts, word_ends = edges[0::2], edges[1::2]
    word_hashes = compiled_kernels().word_hashes(data, word_starts, word_ends, _U64(WORD_BASE))
    # Words per text: the newline closing text d is the (d+1)-th one.
    text_ends = np.flatnonzero(data == _NEWLINE)
    first_word = np.searchsorted(word_starts, np.concatenate(([0], text_ends[:-1])))
    words_in = np.searchsorted(word_starts, text_ends) - first_word
    n = settings.shingle_size
    # a text shorter than n words is one shingle of all its words; one without words has none
    shingles_in = np.where(words_in > 0, np.maximum(words_in - n + 1, 1), 0)
    weighted = None
    if units:  # texts with a no-space character: its characters weigh less than a word (text.shingle_ranges)
        word_weight = _unit_words(data, word_starts)
        unit = word_weight != WORD_WEIGHT
        weighted = np.zeros(len(texts), dtype=bool)
        weighted[np.searchsorted(first_word, np.flatnonzero(unit), side="right") - 1] = True
        # (first_word is non-decreasing; a word's text is the last one starting at or before it with words)
        weighted &= words_in > 0
        shingles_in[weighted] = 0
    text_of = np.repeat(np.arange(len(texts), dtype=np.int64), shingles_in)
    starts = np.repeat(first_word, shingles_in) + (np.arange(shingles_in.sum()) -
                                                   np.repeat(np.cumsum(shingles_in) - shingles_in, shingles_in))
    ends = starts + np.repeat(np.minimum(words_in, n), shingles_in)
    if weighted is not None and weighted.any():
        which = np.flatnonzero(weighted)
        sub_of, sub_starts, sub_ends = shingle_ranges(word_weight, first_word[which],
                                                      words_in[which], n)
        text_of = np.concatenate((text_of, which[sub_of]))
        starts, ends = np.concatenate((starts, sub_starts)), np.concatenate((ends, sub_ends))
        order = np.argsort(text_of, kind="stable")  # each text's shingles as one run, for the kernels
        text_of, starts, ends = text_of[order], starts[order], ends[order]
    hashes = (mix64(_range_polynomials(word_hashes, starts, ends, _SHINGLE_POWERS)) >> _U64(32)).astype(np.uint32)
    return compiled_kernels().sorted_unique_sets(_bounds(np.bincount(text_of, minlength=len(texts))), hashes)


_IDENTITY = np.arange(256, dtype=np.uint8)  # the byte map of bytes normalized already


def _spaced_shingle_sets(data: np.ndarray, ends: np.ndarray, byte_map: np.ndarray,
                         settings: NearDedup) -> tuple[np.ndarray, np.ndarray]:
    """`_shingle_sets` of a chunk of spaced words only, given as bytes read through `byte_map`, text t closed by
    the byte at ends[t]."""
    hashes, counts = compiled_kernels().spaced_shingles(data, ends, byte_map, settings.shingle_size, _U64(WORD_BASE),
                                                _U64(SHINGLE_BASE))
    return compiled_kernels().sorted_unique_sets(_bounds(counts), hashes)


def similarity_sketches(text_of: np.ndarray, shingles: np.ndarray, texts: int, num_perm: int,
                        seed: int) -> np.ndarray:
    """(texts, num_perm) uint32 signatures by fast similarity sketching (Dahlgaard, Knudsen, Thorup 2017) of the
    shingles of each text (shingle i belongs to text text_of[i]).

    In round r = 0 .. 2 num_perm - 1 every shingle x draws h = mix64((r << 32 | x) ^ mix64(seed)) and lands in
    one bin: the bin of h's high bits while r < num_perm, then, from round num_perm on, the bins in order from
    where round num_perm put it (so each bin is reached within 2 num_perm rounds). A bin keeps the draw with the
    smallest (round, low 32 bits of h) and its value is those low 32 bits. Over the union of two sets that draw
    is equally likely to come from any element, so two signatures agree in a bin with probability equal to
    the Jaccard similarity; unlike one-permutation hashing with densification, the bins a set fills do not
    depend on a fixed bin-to-bin pattern, so the rows of an LSH band stay close to independent.

    Work is about max(shingles, num_perm ln num_perm) hashes per text: a round cannot beat an earlier one, so
    a text stops once all its bins are filled (`_kernels.sketches`)."""
    text_of = np.asarray(text_of, dtype=np.int64)
    shingles = np.asarray(shingles, dtype=np.uint32)
    if text_of.size and np.any(text_of[1:] < text_of[:-1]):  # the kernel reads each text's shingles as one run
        order = np.argsort(text_of, kind="stable")
        text_of, shingles = text_of[order], shingles[order]
    return _sketches(_bounds(np.bincount(text_of, minlength=texts)), shingles, num_perm, seed)


def _bounds(counts: np.ndarray) -> np.ndarray:
    out = np.zeros(counts.size + 1, dtype=np.int64)
    np.cumsum(counts, out=out[1:])
    return out


def _sketches(bounds: np.ndarray, shingles: np.ndarray, num_perm: int, seed: int) -> np.ndarray:
    return compiled_kernels().sketches(bounds, shingles, num_perm, _U64(mix64_int(seed)))


def compiled_kernels():
    """The compiled loops, imported on first use (numba's import and cached code load cost ~0.3 s a process)."""
    from kiln.dedup import _kernels

    return _kernels


def sign_batch(texts: list[str], settings: NearDedup) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """SCHEME_FAST signatures and shingle sets of many texts: (signatures (n, num_perm) uint32, shingle
    values uint32, shingle offsets int64 (n + 1)); text i's shingle set, sorted and unique, is
    values[offsets[i]:offsets[i + 1]]."""
    signatures, values, counts = [], [], []
    lengths = _lengths(texts)
    for start, end in _chunks(lengths):
        shingles, count = _shingle_sets(texts[start:end], settings, lengths[start:end])
        signatures.append(_sketches(_bounds(count), shingles, settings.num_perm, settings.seed))
        values.append(shingles)
        counts.append(count)
    offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    if texts:
        np.cumsum(np.concatenate(counts), out=offsets[1:])
    return (np.concatenate(signatures) if texts else np.empty((0, settings.num_perm), dtype=np.uint32),
            np.concatenate(values) if texts else np.empty(0, dtype=np.uint32), offsets)


def _lengths(texts: list[str]) -> np.ndarray:
    return np.fromiter(map(len, texts), dtype=np.int64, count=len(texts))


def _chunks(lengths: np.ndarray):
    """(start, end) of consecutive texts: up to and including the text that brings a chunk to _CHUNK_CHARS
    characters or _CHUNK_TEXTS texts."""
    ends = np.cumsum(lengths)
    start = 0
    while start < lengths.size:
        before = int(ends[start - 1]) if start else 0
        last = min(int(np.searchsorted(ends, before + _CHUNK_CHARS, side="left")), start + _CHUNK_TEXTS - 1)
        end = min(last + 1, lengths.size)
        yield start, end
        start = end
