"""The word view of a document shared by near-dup shingling and decontamination.

Normalizing before comparing means trivial edits (case, punctuation, re-numbered lists, changed
dates) do not hide a copy. Each word keeps its character span in the original text, so a match can
be cut out of the original (decontamination's redact mode).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from kiln.common.config import ShingleNormalization

_WORD = re.compile(r"\w+")  # letters, digits, underscore, in any script
_NON_SPACE = re.compile(r"\S+")
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
    pattern = _WORD if norm.strip_punctuation else _NON_SPACE
    out, spans = [], []
    for m in pattern.finditer(text):
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
    found = (_WORD if norm.strip_punctuation else _NON_SPACE).findall(text)
    if not found:
        return []
    out = normalize_word(_SEP.join(found), norm).split(_SEP)
    return [w for w in out if w] if norm.digits == "remove" else out
