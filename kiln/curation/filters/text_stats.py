"""Shared text statistics for the quality steps: one place per concept (words, lines, n-grams, ...).

Everything here is a pure function over `str` / `list[str]`, fast enough to run on every document.
The word tokenizer is a regex approximation of the NLTK/spaCy tokenizers DataTrove uses: word runs
(keeping inner apostrophes and hyphens: "don't", "state-of-the-art") and punctuation marks as
separate tokens ("..." stays one token), so ratios such as "words with a letter" behave the same.
Words come from `kiln.common.text_units`: scripts without spaces (Chinese, Japanese, Thai ...) give a word per character.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence

import numpy as np
import pyarrow as pa

from kiln.common import text_units

_ALPHA_RE = re.compile(r"[^\W\d_]")  # one letter, any script
_LETTER_TO_END_RE = re.compile(r"[^\W\d_][^\0]*")
_PARAGRAPH_RE = re.compile(r"\n{2,}")
_LINE_RUN_RE = re.compile(r"\n+")
# The sentence ends of scripts that do not end sentences with . ! ?: ideographic and fullwidth full stop, fullwidth
# ! ?, Devanagari danda and double danda, Arabic question mark, Urdu full stop, Ethiopic full stop and question mark
# (Amharic, Tigrinya), Myanmar section, Khmer khan and bariyoosan, Armenian full stop, Tibetan shad and nyis shad,
# Mongolian full stop, Syriac end of paragraph, NKo exclamation mark, Canadian syllabics full stop, Lisu full stop. Without
# them every line of those languages "has no sentence end", and C4 and FineWeb dropped whole languages.
OTHER_SENTENCE_ENDS = "。．！？।॥؟۔።፧။។៕։།༎᠃܀߹᙮꓿"
# Thai and Lao have no sentence-end mark: a sentence (or clause) ends with a space, or with the line. A character of
# theirs before a space or a line's end ends a sentence, and a line ending in one ends as a sentence does: without it
# C4 removed every Thai and Lao line and FineWeb dropped every Thai and Lao document.
SPACE_ENDED_SCRIPTS = "\u0e00-\u0eff"  # the Thai and Lao blocks
# A sentence ends in . ! ? or … optionally followed by closing quotes/brackets, then space or end; or in a sentence end
# of another script with its closing quotes, whatever follows (Chinese and Japanese put no space); or as above.
_SENTENCE_END_RE = re.compile(rf"[.!?…]+[\"'”’)\]]*(?=\s|$)|[{OTHER_SENTENCE_ENDS}]+[\"'”’)\]」』）]*"
                              rf"|[{SPACE_ENDED_SCRIPTS}](?=\s|$)")
_SPACE_ENDED_RE = re.compile(f"[{SPACE_ENDED_SCRIPTS}]")
# Another script's sentence end closed by a quotation mark or bracket at a line's end: Chinese dialogue ends 。” or ？”
# (its quotes are “ ”), Japanese 。」. After . ! ? only C4's own marks count, as C4 has it.
_CLOSED_END_RE = re.compile(f"[{OTHER_SENTENCE_ENDS}][\"'”’)\\]」』）］]+\\Z")

# C4 (TFDS c4_utils) and FineWeb: a line "ends in terminal punctuation" if it ends with one of these; after C4's
# five, the sentence ends of other scripts and their closing quotes (corner brackets): without them every Chinese,
# Amharic or Burmese line "has none".
TERMINAL_PUNCTUATION: tuple[str, ...] = (".", "?", "!", '"', "'", "」", "』", *OTHER_SENTENCE_ENDS)


def ends_sentence(line: str) -> bool:
    """C4's and FineWeb's "ends in terminal punctuation": with a TERMINAL_PUNCTUATION mark, another script's sentence
    end closed by quotes or brackets (。” ？” 。）), or a character of Thai or Lao (SPACE_ENDED_SCRIPTS), which end
    sentences with no mark."""
    return (line.endswith(TERMINAL_PUNCTUATION) or _SPACE_ENDED_RE.match(line[-1:]) is not None
            or _CLOSED_END_RE.search(line[-8:]) is not None)


# Gopher: the ellipsis in both spellings.
ELLIPSES: tuple[str, ...] = ("...", "…")
# Gopher (as DataTrove): a bullet line starts with one of these after leading whitespace.
BULLETS: tuple[str, ...] = ("•", "-")
# Gopher (Rae et al. 2021, Table A1): a document must contain at least two of these.
STOP_WORDS: frozenset[str] = frozenset({"the", "be", "to", "of", "and", "that", "have", "with"})


# ---- batches --------------------------------------------------------------------------------


def arrow_texts(texts: list[str]) -> pa.Array | None:
    """The texts as one Arrow array, for a step's RE2 screen over a whole batch (pyarrow.compute), or None
    when one holds a lone surrogate Arrow cannot encode: the step then takes its per-document path."""
    try:
        return pa.array(texts, pa.large_string())
    except UnicodeEncodeError:
        return None


def chunks(items: Iterable, limit: int, size=len) -> Iterator[list]:
    """Consecutive runs of `items` of about `limit` in total `size` (a run ends at the item that reaches it): the
    batch forms work a run at a time, so their numpy temporaries stay bounded whatever the batch."""
    run, total = [], 0
    for item in items:
        run.append(item)
        total += size(item)
        if total >= limit:
            yield run
            run, total = [], 0
    if run:
        yield run


# ---- words -----------------------------------------------------------------------------------


def tokens(text: str) -> list[str]:
    """Words and punctuation marks, in order (the "words" of DataTrove's word_tokenize): a word run or a single
    punctuation/symbol mark ("..." kept whole)."""
    return text_units.TOKENS.findall(text)


def words(text: str) -> list[str]:
    """Word tokens only (no standalone punctuation/symbols): a token with at least one letter, digit or underscore
    (DataTrove: "non-symbol word")."""
    return text_units.TOKEN_WORDS.findall(text)


def lower(word: str) -> str:
    """A word lowercased to look it up in a lowercase word list: `str.lower`, but the Turkish capital dotted I (U+0130)
    gives "i", where Python gives "i" + a combining dot above (U+0307), a spelling no list holds: a sentence's first
    "İlk", "İçin" or "İle", or "İÇİN" in a heading, is the list's "ilk", "için", "ile"."""
    return word.lower() if "\u0130" not in word else word.replace("\u0130", "i").lower()


def word_tokens(toks: list[str]) -> list[str]:
    """`words(text)` from `tokens(text)` without scanning the text again: the tokens that start with a word
    character (a punctuation token never does, a word token always does)."""
    return [t for t in toks if t[0].isalnum() or t[0] == "_"]


def has_alpha(token: str) -> bool:
    """True if the token contains at least one letter (any script)."""
    return token.isalpha() or _ALPHA_RE.search(token) is not None


def count_with_letter(word_list: list[str]) -> int:
    """How many words contain a letter (`has_alpha`), in one regex pass over them joined by NUL (never in a word):
    each match runs from a word's first letter to its end."""
    return len(_LETTER_TO_END_RE.findall("\0".join(word_list)))


# ---- lines, paragraphs, sentences ------------------------------------------------------------


# str.splitlines' line boundaries other than "\n" (rare): folded into "\n" so that MULTILINE ^ and $ see them.
_OTHER_LINE_BREAKS = "\r\x0b\x0c\x1c\x1d\x1e\x85\u2028\u2029"
_TO_NEWLINE = str.maketrans(dict.fromkeys(_OTHER_LINE_BREAKS, "\n"))
# Led by a literal, so `re` jumps between candidates instead of trying a MULTILINE ^ at every character.
_BULLET_LINE_RE = re.compile(r"\n[^\S\n]*[" + "".join(BULLETS) + "]")
_ELLIPSIS_LINE_RE = re.compile(r"(?:" + "|".join(map(re.escape, ELLIPSES)) + r")[^\S\n]*(?:\n|\Z)")


def count_bullet_and_ellipsis_lines(text: str) -> tuple[int, int]:
    """Lines (as `lines` splits them) that start with a bullet after leading whitespace, and lines that end with an
    ellipsis before trailing whitespace: one regex pass each instead of a loop over the lines. ("\r\n" folds into
    two breaks: the empty line between them is neither.)"""
    if any(c in text for c in _OTHER_LINE_BREAKS):
        text = text.translate(_TO_NEWLINE)
    return len(_BULLET_LINE_RE.findall("\n" + text)), len(_ELLIPSIS_LINE_RE.findall(text))


def lines(text: str) -> list[str]:
    """Lines as `str.splitlines` sees them (no trailing empty line)."""
    return text.splitlines()


def nonempty_line_runs(text: str) -> list[str]:
    """Split on runs of newlines (Gopher's line unit: blank lines are separators, not lines)."""
    return _LINE_RUN_RE.split(text)


def paragraphs(text: str) -> list[str]:
    """Split the stripped text on blank lines (two or more newlines)."""
    return _PARAGRAPH_RE.split(text.strip())


def count_sentences(line: str) -> int:
    """Approximate sentence count of a line: sentence-final punctuation marks, at least 1 if non-empty.

    Stands in for the NLTK punkt `sent_tokenize` C4/DataTrove use; abbreviations may over-count.
    """
    if not line.strip():
        return 0
    return max(1, len(_SENTENCE_END_RE.findall(line)))


# ---- duplicates and n-grams ------------------------------------------------------------------


def find_duplicates(items: Iterable[str]) -> tuple[int, int]:
    """(number of items seen before, total characters of those repeats): Gopher's duplicate counts."""
    seen: set[str] = set()
    dup_items = dup_chars = 0
    for item in items:
        if item in seen:
            dup_items += 1
            dup_chars += len(item)
        else:
            seen.add(item)
    return dup_items, dup_chars


def n_grams(ws: Sequence[str], n: int, weights: np.ndarray | None = None) -> list[tuple[str, ...]]:
    """All contiguous n-grams of a word list, as tuples (built in C via zip). With `weights`
    (text_units.word_weights), an n-gram is the shortest run from each word that weighs n words: n spaced words, or
    the characters of Chinese, Japanese, Thai ... that carry as much text (5 words: 8 Han, 20 Thai), as dedup's
    shingles."""
    if weights is None:
        if n <= 0 or len(ws) < n:
            return []
        return list(zip(*(ws[i:] for i in range(n))))
    return [tuple(ws[start:end]) for start, end in enumerate(_gram_ends(weights, n))]


def _gram_ends(weights: np.ndarray, n: int) -> list[int]:
    """For each start word whose run reaches n words' weight before the end, where the shortest such run ends."""
    cum = np.zeros(len(weights) + 1, dtype=np.int64)
    np.cumsum(weights, out=cum[1:])
    ends = np.searchsorted(cum, cum[:-1] + n * text_units.WORD_WEIGHT, side="left")
    return ends[ends <= len(weights)].tolist()  # nondecreasing: the starts that reach it come first


def top_ngram_chars(ws: Sequence[str], n: int, weights: np.ndarray | None = None) -> int:
    """Characters covered by the most frequent n-gram: count x length ("w1 w2", spaces included; none between two
    words of which one is a character of a script without spaces).

    Gopher's "top n-gram character fraction" numerator (as DataTrove's find_top_duplicate). 0 if the
    text has fewer than n words. `weights`: as `n_grams`.
    """
    grams = n_grams(ws, n, weights)
    if not grams:
        return 0
    gram, count = Counter(grams).most_common(1)[0]
    if weights is None:
        return (sum(map(len, gram)) + n - 1) * count
    spaces = sum(not (text_units.is_unit(a) or text_units.is_unit(b)) for a, b in zip(gram, gram[1:]))
    return (sum(map(len, gram)) + spaces) * count


def duplicated_ngram_chars(ws: Sequence[str], n: int, weights: np.ndarray | None = None) -> int:
    """Characters (spaces excluded) in n-grams that repeat an earlier n-gram, without overlap.

    Gopher's "duplicate n-gram character fraction" numerator, as DataTrove's find_all_duplicate:
    scan left to right; on a repeat, count its characters and jump past it so no word counts twice.
    `weights`: as `n_grams`.
    """
    grams = n_grams(ws, n, weights)
    if len(set(grams)) == len(grams):  # fast path: nothing repeats (typical clean prose)
        return 0
    seen: set[tuple[str, ...]] = set()
    repeated = 0
    i, last = 0, len(grams)
    while i < last:
        gram = grams[i]
        if gram in seen:
            repeated += sum(map(len, gram))
            i += len(gram)
        else:
            seen.add(gram)
            i += 1
    return repeated
