"""The fast signature scheme, `minhash.SCHEME_FAST` (`minhash.sign_texts` dispatches between the two schemes).

SCHEME_FAST (the default dedup.near.scheme) signs a whole batch of documents with a few numpy passes instead of
Python calls per word or shingle. Same words and shingles as `normalized_words` and `text.shingle_ranges` (a character
of a script written without spaces is a word of its own); other hash functions, so its shingle sets and
signatures are not comparable with SCHEME's:
  word hash      mix64(sum_k (byte_k + 1) * WORD_BASE^k)  over the word's UTF-8 bytes (surrogatepass)
  shingle hash   mix64(sum_k word_hash_k * SHINGLE_BASE^k) over n consecutive words (n words' worth of no-space
                 characters, `text.shingle_ranges`; all the words of a shorter document, none for an empty one),
                 its high 32 bits
  signature      fast similarity sketching of the shingle set into num_perm bins (`similarity_sketches`):
                 Pr[two signatures agree in a position] equals the Jaccard similarity of the two shingle
                 sets, as for num_perm independent permutations, at the cost of about
                 max(shingles, num_perm ln num_perm) hashes per text instead of shingles x num_perm.
Sums are mod 2^64, so a polynomial over any range is one difference of prefix sums; mix64 (the
splitmix64 finalizer) spreads it over all 64 bits.
"""

from __future__ import annotations

import re
from functools import lru_cache

import numpy as np

from kiln.common.config import NearDedup, ShingleNormalization
from kiln.common.text_units import UNIT_WEIGHT, WORD_WEIGHT, mark_code_points, unit_code_points
from kiln.dedup.text import shingle_ranges

WORD_BASE = 0x9E3779B97F4A7C15  # odd, so invertible mod 2^64
SHINGLE_BASE = 0xC2B2AE3D27D4EB4F  # odd
_MASK64 = (1 << 64) - 1
_U64, _U32 = np.uint64, np.uint32
_SPACE, _NEWLINE = 0x20, 0x0A
_CHUNK_CHARS = 1 << 20  # characters per numpy pass: the working arrays stay in cache-sized memory
_CHUNK_TEXTS = 1 << 13  # and texts: the (texts, num_perm) sketch arrays stay small
# Flags the code point map adds (code points need 21 bits): a character of a no-space script, a combining mark.
_UNIT_FLAG, _MARK_FLAG = 1 << 30, 1 << 29
_CODE_BITS = (1 << 29) - 1


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
    out[sorted(unit_code_points())] |= _UNIT_FLAG  # text_units: these split words (`_split_units`)
    out[sorted(mark_code_points())] |= _MARK_FLAG
    return out


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
    members = np.union1d(units, unit_marks)  # a no-space character or one of its marks
    after = members + 1
    breaks = np.union1d(units, after[~np.isin(after, unit_marks)])
    return np.insert(base, breaks, _SPACE), units.size > 0


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


def _normalized_bytes(texts: list[str], norm: ShingleNormalization) -> tuple[np.ndarray, bool]:
    """UTF-8 of the texts' normalized words, spaces between words and a newline after each text; and whether any
    word is a no-space character (a chunk without any takes the plain path: the same bytes as before text_units)."""
    original = np.frombuffer("\n".join(texts).encode("utf-32-le", "surrogatepass") + b"\n\0\0\0", dtype="<u4")
    codes = np.take(_code_point_map(norm.strip_punctuation, norm.digits == "zero"), original)
    codes[np.cumsum([len(t) + 1 for t in texts]) - 1] = _NEWLINE  # no other newline is left
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
        data = data[(data < ord("0")) | (data > ord("9"))]  # ASCII digits are whole bytes in UTF-8
    return data, units


def _unit_words(data: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Which of the words starting at `starts` are a no-space character (all are 3 or 4 bytes long in UTF-8)."""
    out = np.zeros(starts.size, dtype=bool)
    wide = np.flatnonzero(data[starts] >= 0xE0)  # only these can be: decode them alone
    at = starts[wide]
    d = np.concatenate((data, np.zeros(3, dtype=np.uint8))).astype(np.uint32)
    lead, b1, b2, b3 = d[at], d[at + 1] & 0x3F, d[at + 2] & 0x3F, d[at + 3] & 0x3F
    cp = np.where(lead >= 0xF0, (lead & 0x07) << 18 | b1 << 12 | b2 << 6 | b3, (lead & 0x0F) << 12 | b1 << 6 | b2)
    out[wide] = (_code_point_map(True, False)[cp] & _UNIT_FLAG) != 0
    return out


def _shingle_sets(texts: list[str], settings: NearDedup) -> tuple[np.ndarray, np.ndarray]:
    """(document index, shingle hash) of every distinct shingle, sorted by both."""
    data, units = _normalized_bytes(texts, settings.normalization)
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
    weighted = None
    if units:  # texts with a no-space character: its characters weigh less than a word (text.shingle_ranges)
        unit = _unit_words(data, word_starts)
        weighted = np.zeros(len(texts), dtype=bool)
        weighted[np.searchsorted(first_word, np.flatnonzero(unit), side="right") - 1] = True
        # (first_word is non-decreasing; a word's text is the last one starting at or before it with words)
        weighted &= words_in > 0
        shingles_in[weighted] = 0
    text_of = np.repeat(np.arange(len(texts), dtype=np.uint64), shingles_in)
    starts = np.repeat(first_word, shingles_in) + (np.arange(shingles_in.sum()) -
                                                   np.repeat(np.cumsum(shingles_in) - shingles_in, shingles_in))
    ends = starts + np.repeat(np.minimum(words_in, n), shingles_in)
    if weighted is not None and weighted.any():
        which = np.flatnonzero(weighted)
        sub_of, sub_starts, sub_ends = shingle_ranges(np.where(unit, UNIT_WEIGHT, WORD_WEIGHT), first_word[which],
                                                      words_in[which], n)
        text_of = np.concatenate((text_of, which[sub_of].astype(np.uint64)))  # keys are sorted below
        starts, ends = np.concatenate((starts, sub_starts)), np.concatenate((ends, sub_ends))
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
