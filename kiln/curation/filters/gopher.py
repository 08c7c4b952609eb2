"""Gopher quality and repetition rules (Rae et al. 2021, "Scaling Language Models", Appendix A / Table A1).

Semantics follow DataTrove's GopherQualityFilter / GopherRepetitionFilter; each rule is disabled by
setting its parameter to None.
"""

from __future__ import annotations

import functools
import re
import sys
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
from annotated_types import Ge, MinLen
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveInt

from kiln.common.text_units import EMOJI_TAILS, JOINERS, plain, weighed_count, word_weights
from kiln.curation.documents import Document
from kiln.curation.filters import text_stats as ts
from kiln.curation.filters.base import Fraction, Verdict, drop, keep, ordered


# Gopher quality filter: Rae et al. 2021 (arXiv:2112.11446) App. A.1.1; as DataTrove gopher_quality_filter.py.
@dataclass
class GopherQuality:
    name: ClassVar[str] = "gopher_quality"

    min_doc_words: NonNegativeInt | None = 50
    max_doc_words: PositiveInt | None = 100_000  # at least min_doc_words
    min_avg_word_length: NonNegativeFloat | None = 3
    max_avg_word_length: Annotated[float, Ge(1)] | None = 10  # a word has a character; at least min_avg_word_length
    max_symbol_word_ratio: Fraction | None = 0.1  # for "#" and for "..."/"…", each against all tokens
    max_bullet_lines_ratio: Fraction | None = 0.9
    max_ellipsis_lines_ratio: Fraction | None = 0.3
    max_non_alpha_words_ratio: Fraction | None = 0.8  # i.e. at least 80% of tokens must contain a letter
    min_stop_words: NonNegativeInt | None = 2
    # Not Gopher's: the share of words that are stop words. Where words are characters (Chinese, Japanese), two stop
    # words are no sign of running text: random characters of the language hold 1-2.5% of its stop characters,
    # its pages 5-30% (bench/multilingual_filter_eval.py), so the language defaults set it there.
    min_stop_word_ratio: Fraction | None = None
    # None: Gopher's eight English words. Another language's (kiln.curation.filters.stopwords) reach the step
    # through its per-language settings (kiln.curation.filters.registry).
    stop_words: Annotated[list[str], MinLen(1)] | None = None
    # Endings that make a word count as a stop word, where the language writes its particles onto the word before
    # (Korean: "서울시는", "정책을"), so they are never words of their own.
    stop_word_endings: list[Annotated[str, MinLen(1)]] | None = None

    def __post_init__(self) -> None:
        ordered(self, "min_doc_words", "max_doc_words")
        ordered(self, "min_avg_word_length", "max_avg_word_length")
        given = self.stop_words is not None
        self._stops = frozenset(unicodedata.normalize("NFC", ts.lower(w)) for w in self.stop_words) if given \
            else ts.STOP_WORDS
        self._endings = tuple(unicodedata.normalize("NFC", ts.lower(e)) for e in self.stop_word_endings or ())
        # the batch form keys exactly these (_STOP_KEYS)
        self._numpy_stops = self._stops == ts.STOP_WORDS and not self._endings

    def __call__(self, doc: Document) -> Verdict:
        return self._verdict(doc.text, _WordCounts(doc.text, self.min_stop_words or 0, self._stops, self._endings))

    def batch(self, docs: list[Document]) -> list[Verdict]:
        """The same verdicts as one call per document, with the words of the whole batch counted at once in numpy
        (other stop words than Gopher's: counted per document, when the rule is reached)."""
        counts = _batch_counts([d.text for d in docs])
        if not self._numpy_stops:
            counts = [_OtherStops(c, d.text, self.min_stop_words or 0, self._stops, self._endings)
                      for d, c in zip(docs, counts)]
        return [self._verdict(d.text, c) for d, c in zip(docs, counts)]

    def _verdict(self, text: str, c: _WordCounts | _BatchCounts | _OtherStops) -> Verdict:
        n_toks, n_words = c.tokens, c.words
        # The document's length in words: a character of a script without spaces weighs 5/8 of one, a Thai letter 1/4
        # (text_units), as in the n-gram rules and dedup's shingles. The other rules are shares of tokens, and the mean
        # word length is characters per token, as the per-language limits were set (stopwords).
        if self.min_doc_words is not None and c.doc_words < self.min_doc_words:
            return drop(self.name, "min_doc_words", text)
        if self.max_doc_words is not None and c.doc_words > self.max_doc_words:
            return drop(self.name, "max_doc_words", text)
        if n_words == 0:  # only reachable with min_doc_words=None: nothing below is defined
            return keep(text)

        avg_len = c.word_chars / n_words
        if self.min_avg_word_length is not None and avg_len < self.min_avg_word_length:
            return drop(self.name, "min_avg_word_length", text)
        if self.max_avg_word_length is not None and avg_len > self.max_avg_word_length:
            return drop(self.name, "max_avg_word_length", text)

        if self.max_symbol_word_ratio is not None:
            if text.count("#") / n_toks > self.max_symbol_word_ratio:
                return drop(self.name, "hash_word_ratio", text)
            if (text.count("...") + text.count("…")) / n_toks > self.max_symbol_word_ratio:
                return drop(self.name, "ellipsis_word_ratio", text)

        if self.max_bullet_lines_ratio is not None or self.max_ellipsis_lines_ratio is not None:
            n_lines = len(ts.lines(text)) or 1
            bullets, ellipses = ts.count_bullet_and_ellipsis_lines(text)
            if self.max_bullet_lines_ratio is not None and bullets / n_lines > self.max_bullet_lines_ratio:
                return drop(self.name, "max_bullet_lines_ratio", text)
            if self.max_ellipsis_lines_ratio is not None and ellipses / n_lines > self.max_ellipsis_lines_ratio:
                return drop(self.name, "max_ellipsis_lines_ratio", text)

        if self.max_non_alpha_words_ratio is not None:
            if c.alpha_words / n_toks < self.max_non_alpha_words_ratio:  # punctuation tokens never have a letter
                return drop(self.name, "max_non_alpha_words_ratio", text)

        if self.min_stop_words is not None and c.stop_words < self.min_stop_words:
            return drop(self.name, "min_stop_words", text)
        if self.min_stop_word_ratio is not None and c.stop_word_share < self.min_stop_word_ratio:
            return drop(self.name, "min_stop_word_ratio", text)

        return keep(text)


class _WordCounts:
    """The counts the rules use, from the text's tokens (each computed when a rule first needs it)."""

    def __init__(self, text: str, stop_words_needed: int, stops: frozenset[str] = ts.STOP_WORDS,
                 endings: tuple[str, ...] = ()):
        toks = ts.tokens(text)
        self._words = ts.word_tokens(toks)  # tokens that are not pure punctuation/symbols
        self._plain = plain(text)
        self._needed = stop_words_needed
        self._stops, self._endings = stops, endings
        self.tokens, self.words = len(toks), len(self._words)

    @property
    def word_chars(self) -> int:
        return sum(map(len, self._words))

    @property
    def doc_words(self) -> float:
        """Words as the document-length rules count them: a character of a script without spaces weighs
        text_units.UNIT_WEIGHT / WORD_WEIGHT (5/8) of a word (a Thai, Khmer ... letter ABUGIDA_WEIGHT: 1/4), any other
        word one."""
        return self.words if self._plain else weighed_count(self._words)

    @property
    def alpha_words(self) -> int:
        return ts.count_with_letter(self._words)

    @property
    def stop_words(self) -> int:
        return _count_stops(self._words, self._stops, self._needed, self._endings)

    @property
    def stop_word_share(self) -> float:
        return _count_stops(self._words, self._stops, sys.maxsize, self._endings) / max(self.words, 1)


def _count_stops(words: list[str], stops: frozenset[str], needed: int, endings: tuple[str, ...] = ()) -> int:
    """Stop words among the words (a word that is one, or longer than and ending in one of `endings`), counted up to
    what the rule needs."""
    found = 0
    for w in words:
        w = ts.lower(w)
        if w in stops or (endings and w.endswith(endings) and len(w) > 1):
            found += 1
            if found >= needed:
                break
    return found


@dataclass(frozen=True)
class _BatchCounts:
    tokens: int
    words: int
    word_chars: int
    alpha_words: int
    stop_words: int  # all of them (Gopher's English stop words)
    doc_words: float  # words weighted as _WordCounts.doc_words

    @property
    def stop_word_share(self) -> float:
        return self.stop_words / max(self.words, 1)


class _OtherStops:
    """A document's batch counts, its stop words counted from its words (only if the stop-word rule is reached)."""

    def __init__(self, counts: _BatchCounts, text: str, needed: int, stops: frozenset[str],
                 endings: tuple[str, ...] = ()):
        self.tokens, self.words, self.word_chars, self.alpha_words, self.doc_words = (
            counts.tokens, counts.words, counts.word_chars, counts.alpha_words, counts.doc_words)
        self._text, self._needed, self._stops, self._endings = text, needed, stops, endings

    @property
    def stop_words(self) -> int:
        return _count_stops(ts.words(self._text), self._stops, self._needed, self._endings)

    @property
    def stop_word_share(self) -> float:
        return _count_stops(ts.words(self._text), self._stops, sys.maxsize, self._endings) / max(self.words, 1)


# text_stats.tokens as classes of code points: a word character, a joiner (' ’ - and the zero-width (non-)joiner:
# inside a word between two word characters), a dot ("..." is one token), space, and any other mark (a token of its
# own, but for an emoji's tails and the emoji a zero-width joiner glues to it).
_MARK, _WORD, _JOINER, _DOT, _SPACE = range(5)
_ZWJ = 0x200D


def _stop_keys(codes: np.ndarray, start: np.ndarray, length: np.ndarray) -> np.ndarray:
    """For words of at most 4 code points: their ASCII letters lowercased, 7 bits each, as one integer; -1 for a word
    with anything else."""
    head = codes[np.minimum(start[:, None] + np.arange(4), len(codes) - 1)].astype(np.int64) | 32
    inside = np.arange(4) < length[:, None]
    letters = ((head >= ord("a")) & (head <= ord("z"))) | ~inside
    keys = (np.where(inside, head & 127, 0) << (7 * np.arange(4))).sum(axis=1)
    return np.where(letters.all(axis=1), keys, -1)


_STOP_KEYS = np.array([sum(ord(c) << 7 * i for i, c in enumerate(w)) for w in sorted(ts.STOP_WORDS)], dtype=np.int64)


@functools.cache
def _code_point_tables() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(class, is-letter, is-emoji-tail) of every code point, read off Python's own `re` (\\w, \\s, [^\\W\\d_], the
    tokenizer's tail class): exact by construction."""
    every = "".join(map(chr, range(sys.maxunicode + 1)))
    classes = np.full(sys.maxunicode + 1, _MARK, dtype=np.uint8)
    letter = np.zeros(sys.maxunicode + 1, dtype=bool)
    tail = np.zeros(sys.maxunicode + 1, dtype=bool)
    for pattern, table, value in ((r"\s+", classes, _SPACE), (r"\w+", classes, _WORD), (r"[^\W\d_]+", letter, True),
                                  (f"[{EMOJI_TAILS}]+", tail, True)):
        for m in re.finditer(pattern, every):
            table[m.start():m.end()] = value
    classes[[ord(c) for c in JOINERS]] = _JOINER
    classes[ord(".")] = _DOT
    return classes, letter, tail


def _shift(a: np.ndarray, by: int) -> np.ndarray:
    """a[i - by] at i (False where that is outside)."""
    out = np.zeros_like(a)
    if by > 0:
        out[by:] = a[:-by]
    else:
        out[:by] = a[-by:]
    return out


def _batch_counts(texts: list[str], chunk_chars: int = 1 << 22) -> list[_BatchCounts]:
    """_WordCounts of every text, in numpy over code points, a chunk of about `chunk_chars` characters at a time."""
    counts = [counts for chunk in ts.chunks(texts, chunk_chars) for counts in _count_chunk(chunk)]
    # A text with no-space-script characters or combining marks: text_units splits it otherwise, count its tokens.
    return [c if plain(t) else _per_document_counts(t) for t, c in zip(texts, counts)]


def _per_document_counts(text: str) -> _BatchCounts:
    counted = _WordCounts(text, sys.maxsize)  # once: each field reads the same tokens
    return _BatchCounts(*(getattr(counted, k) for k in _BatchCounts.__annotations__))


def _count_chunk(texts: list[str]) -> list[_BatchCounts]:
    """text_units.TOKENS over code point classes: a joiner between two word characters is inside a word; any other
    joiner or mark is a token, but for an emoji tail after a mark and a zero-width joiner between two marks (not a
    dot, not the joiner itself) with the mark after it, which continue the token before; a run of k dots is
    k // 3 + k % 3 tokens."""
    classes, letter, tail = _code_point_tables()
    # One space between texts: no token, word or dot run crosses it.
    codes = np.frombuffer(" ".join(texts).encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
    starts = np.cumsum([0] + [len(t) + 1 for t in texts[:-1]])
    cls = classes[codes]
    word = cls == _WORD
    joiner = cls == _JOINER
    joined = joiner & _shift(word, 1) & _shift(word, -1)
    in_word = word | joined
    word_start = in_word & ~_shift(in_word, 1)
    dot = cls == _DOT
    dot_start = np.flatnonzero(dot & ~_shift(dot, 1))
    dot_run = np.flatnonzero(dot & ~_shift(dot, -1)) + 1 - dot_start
    marks = (cls == _MARK) | (joiner & ~joined)
    zwj = codes == _ZWJ
    symbol = marks & ~zwj  # what may start a token of marks, or follow a zero-width joiner in one
    glue = zwj & _shift(symbol, 1) & _shift(symbol, -1)
    marks &= ~((tail[codes] & _shift(symbol, 1)) | glue | _shift(glue, 1))  # the first mark of each token
    # A word bears a letter if it has one: count each word's first letter.
    first = np.flatnonzero(word_start)
    letters = np.flatnonzero(letter[codes] & in_word)
    word_of = np.cumsum(word_start, dtype=np.int32)[letters]
    first_letter = letters[np.r_[True, word_of[1:] != word_of[:-1]]] if len(letters) else letters
    # A stop word is 2-4 ASCII letters, and only ASCII letters lowercase to ASCII letters (but the Kelvin sign, to
    # 'k', in none of them): key each word of 2-4 ASCII letters by its lowercased letters and look the key up.
    length = np.flatnonzero(in_word & ~_shift(in_word, -1)) + 1 - first
    short = np.flatnonzero((length >= 2) & (length <= 4))
    stops = first[short[np.isin(_stop_keys(codes, first[short], length[short]), _STOP_KEYS)]]

    bounds = np.r_[starts, len(codes)]

    def per_text(positions: np.ndarray, weights: np.ndarray | None = None) -> list[int]:
        """How many of the (sorted) positions fall in each text, or the sum of their weights."""
        cut = np.searchsorted(positions, bounds)
        if weights is None:
            return np.diff(cut).tolist()
        return np.diff(np.r_[0, np.cumsum(weights)][cut]).tolist()

    words, n_marks = per_text(first), per_text(np.flatnonzero(marks))
    n_dots = per_text(dot_start, dot_run // 3 + dot_run % 3)  # "..." is tried first at each dot
    # doc_words: the words themselves; a text with no-space characters is counted again (_batch_counts)
    return [_BatchCounts(w + m + d, w, c, a, n, w) for w, m, d, c, a, n in zip(
        words, n_marks, n_dots, per_text(np.flatnonzero(in_word)), per_text(first_letter), per_text(stops))]


def _pairs(value: Iterable[Iterable[float]] | None) -> tuple[tuple[int, float], ...] | None:
    """Normalize ((n, frac), ...) given as lists (from YAML) into a tuple of (int, float) pairs."""
    if value is None:
        return None
    return tuple((int(n), float(frac)) for n, frac in value)


# Gopher repetition filter: Rae et al. 2021 (arXiv:2112.11446) Table A1; as DataTrove gopher_repetition_filter.py.
@dataclass
class GopherRepetition:
    name: ClassVar[str] = "gopher_repetition"

    dup_line_frac: Fraction | None = 0.3
    dup_para_frac: Fraction | None = 0.3
    dup_line_char_frac: Fraction | None = 0.2
    dup_para_char_frac: Fraction | None = 0.2
    # (n, max fraction of characters in the most frequent n-gram); None disables all.
    top_n_grams: tuple[tuple[PositiveInt, Fraction], ...] | None = ((2, 0.20), (3, 0.18), (4, 0.16))
    # (n, max fraction of characters in repeated n-grams); None disables all.
    dup_n_grams: tuple[tuple[PositiveInt, Fraction], ...] | None = (
        (5, 0.15),
        (6, 0.14),
        (7, 0.13),
        (8, 0.12),
        (9, 0.11),
        (10, 0.10),
    )

    def __post_init__(self) -> None:
        self.top_n_grams = _pairs(self.top_n_grams)
        self.dup_n_grams = _pairs(self.dup_n_grams)

    def __call__(self, doc: Document) -> Verdict:
        text = doc.text
        n_chars = len(text)
        if not text.strip():
            return keep(text)  # nothing can repeat; emptiness is other steps' business

        if self.dup_para_frac is not None or self.dup_para_char_frac is not None:
            paras = ts.paragraphs(text)
            dup_paras, dup_chars = ts.find_duplicates(paras)
            if self.dup_para_frac is not None and dup_paras / len(paras) > self.dup_para_frac:
                return drop(self.name, "dup_para_frac", text)
            if self.dup_para_char_frac is not None and dup_chars / n_chars > self.dup_para_char_frac:
                return drop(self.name, "dup_para_char_frac", text)

        if self.dup_line_frac is not None or self.dup_line_char_frac is not None:
            lines = ts.nonempty_line_runs(text)
            dup_lines, dup_chars = ts.find_duplicates(lines)
            if self.dup_line_frac is not None and dup_lines / len(lines) > self.dup_line_frac:
                return drop(self.name, "dup_line_frac", text)
            if self.dup_line_char_frac is not None and dup_chars / n_chars > self.dup_line_char_frac:
                return drop(self.name, "dup_line_char_frac", text)

        if not self.top_n_grams and not self.dup_n_grams:
            return keep(text)
        toks = ts.tokens(text)
        # Where words are characters (Chinese, Japanese, Thai ...), n words are the characters that weigh as much.
        weights = None if plain(text) else word_weights(toks)

        for n, max_frac in self.top_n_grams or ():
            if ts.top_ngram_chars(toks, n, weights) / n_chars > max_frac:
                return drop(self.name, f"top_{n}gram_char_frac", text)

        unique_from: int | None = None  # once no n-gram repeats, no longer n-gram can repeat either
        for n, max_frac in self.dup_n_grams or ():
            if unique_from is not None and n >= unique_from:
                continue
            repeated = ts.duplicated_ngram_chars(toks, n, weights)
            if repeated == 0:
                unique_from = n if unique_from is None else min(unique_from, n)
            elif repeated / n_chars > max_frac:
                return drop(self.name, f"dup_{n}gram_char_frac", text)

        return keep(text)
