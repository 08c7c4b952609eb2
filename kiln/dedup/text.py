"""The word view of a document shared by near-dup shingling and decontamination.

Normalizing before comparing means trivial edits (case, punctuation, re-numbered lists, changed
dates) do not hide a copy. Each word keeps its character span in the original text, so a match can
be cut out of the original (decontamination's redact mode). Words are `kiln.common.text_units`' units: in scripts
written without spaces (Chinese, Japanese, Thai ...) each character is a word.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kiln.common.config import ShingleNormalization
from kiln.common.text_units import NON_SPACE, WORD_WEIGHT, WORDS

_DIGITS = str.maketrans("0123456789", "0000000000")
_NO_DIGITS = str.maketrans("", "", "0123456789")
_SEP = " "  # never inside a word (neither \w nor \S), and neutral for str.lower's final-sigma rule


@dataclass(frozen=True)
class Words:
    words: list[str]  # normalized
    spans: list[tuple[int, int]]  # (start, end) of each word in the original text


def normalize_word(word: str, norm: ShingleNormalization) -> str:
    if norm.lowercase:
        word = word.lower()
    if norm.digits == "zero":
        word = word.translate(_DIGITS)
    elif norm.digits == "remove":
        word = word.translate(_NO_DIGITS)
    return word


def words(text: str, norm: ShingleNormalization = ShingleNormalization(), with_spans: bool = False) -> Words:
    """Normalized words of `text` (empty words, e.g. a number when digits are removed, are skipped)."""
    splitter = WORDS if norm.strip_punctuation else NON_SPACE  # \w+ runs (letters, digits, _) or \S+ runs
    out, spans = [], []
    for m in splitter.finditer(text):
        w = normalize_word(m.group(), norm)
        if w:
            out.append(w)
            if with_spans:
                spans.append(m.span())
    return Words(out, spans)


def normalized_words(text: str, norm: ShingleNormalization = ShingleNormalization()) -> list[str]:
    """The same words as `words(text, norm).words`, without spans, at C speed: the words are normalized
    joined. Lowercasing the joined words equals lowercasing each one: str.lower maps per character
    except for Greek final sigma, whose context rule stops at the separator as at the end of a word."""
    found = (WORDS if norm.strip_punctuation else NON_SPACE).findall(text)
    if not found:
        return []
    out = normalize_word(_SEP.join(found), norm).split(_SEP)
    return [w for w in out if w] if norm.digits == "remove" else out


def shingle_ranges(weights: np.ndarray, first: np.ndarray, count: np.ndarray,
                   n: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The shingles of many texts' words as (text index, first word, end word) arrays, in text order.

    A shingle is the run of consecutive words from a start word that first reaches n words' weight (`weights`:
    text_units.WORD_WEIGHT for a spaced word, UNIT_WEIGHT for one no-space character, so 5 words or 8 Chinese
    characters), from every start that can reach it; a text that never reaches it is one shingle of all its words (a
    text without words has none: two such texts share nothing a near-duplicate could be made of). With only spaced words
    that is every n consecutive words. Text d's words are weights[first[d]:first[d] + count[d]]."""
    need = n * WORD_WEIGHT
    cum = np.zeros(len(weights) + 1, dtype=np.int64)
    np.cumsum(weights, out=cum[1:])
    last = first + count
    # Starts that can reach `need` before the text's end: s with cum[last] - cum[s] >= need.
    full = np.clip(np.searchsorted(cum, cum[last] - need, side="right") - first, 0, count)
    per_text = np.where(count > 0, np.maximum(full, 1), 0)
    text_of = np.repeat(np.arange(len(first), dtype=np.int64), per_text)
    starts = np.repeat(first, per_text) + (np.arange(per_text.sum()) - np.repeat(np.cumsum(per_text) - per_text,
                                                                                   per_text))
    ends = np.where(np.repeat(full > 0, per_text), np.searchsorted(cum, cum[starts] + need, side="left"),
                    np.repeat(last, per_text))
    return text_of, starts, ends
