"""Word units for every script: the one place that splits text into words (filters, shingles, decontamination n-grams,
exact-dedup normalization, word counts all come here).

- Scripts written with spaces (Latin, Cyrillic, Greek, Arabic, Hebrew, Devanagari, Hangul ...): a word is a run of word
  characters, as the `\\w+` regexes Kiln used before; combining marks (Unicode M*) stay inside the word they follow, so
  Devanagari, Bengali or decomposed Latin are no longer cut at every vowel sign.
- Scripts written without spaces (Han, Hiragana, Katakana, Thai, Lao, Khmer, Myanmar, Tibetan, Yi, Tai scripts ...):
  every character (with its combining marks) is a unit of its own, as character shingling in Chinese/Japanese dedup
  practice does (Data-Juicer's `tokenization: character`); no segmenter dictionary to ship, and millions of documents
  per hour stay cheap. Mixed text keeps Latin words whole: "iPhone 15を買った" -> iPhone, 15, を, 買, っ, た.

Speed: a text with neither a no-space-script character nor a combining mark (all English, most European text) is split
by the old regex itself (`plain`: pure ASCII short-circuits, else one precompiled character-class search), so English
results are identical by construction and cost one extra scan at most. Each splitter exists in both forms and returns
`re.Match` objects on request, so spans into the original text are kept (decontamination's redact mode).
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence
from functools import cache

import numpy as np

# Unicode blocks of scripts written without spaces between words (Unicode 15 block ranges). Hangul is absent: Korean
# separates words with spaces.
NO_SPACE_BLOCKS: tuple[tuple[int, int, str], ...] = (
    (0x0E00, 0x0E7F, "Thai"),
    (0x0E80, 0x0EFF, "Lao"),
    (0x0F00, 0x0FFF, "Tibetan"),
    (0x1000, 0x109F, "Myanmar"),
    (0x1780, 0x17FF, "Khmer"),
    (0x1950, 0x197F, "Tai Le"),
    (0x1980, 0x19DF, "New Tai Lue"),
    (0x19E0, 0x19FF, "Khmer Symbols"),
    (0x1A20, 0x1AAF, "Tai Tham"),
    (0x2E80, 0x2EFF, "CJK Radicals Supplement"),
    (0x2F00, 0x2FDF, "Kangxi Radicals"),
    (0x3005, 0x3007, "CJK iteration mark, closing mark, ideographic zero"),
    (0x3021, 0x3029, "Hangzhou numerals"),
    (0x3031, 0x3035, "kana repeat marks"),
    (0x3038, 0x303C, "Hangzhou numerals, masu mark"),
    (0x3040, 0x309F, "Hiragana"),
    (0x30A0, 0x30FF, "Katakana"),
    (0x3190, 0x319F, "Kanbun"),
    (0x31C0, 0x31EF, "CJK Strokes"),
    (0x31F0, 0x31FF, "Katakana Phonetic Extensions"),
    (0x3400, 0x4DBF, "CJK Unified Ideographs Extension A"),
    (0x4E00, 0x9FFF, "CJK Unified Ideographs"),
    (0xA000, 0xA4CF, "Yi"),
    (0xA9E0, 0xA9FF, "Myanmar Extended-B"),
    (0xAA60, 0xAA7F, "Myanmar Extended-A"),
    (0xAA80, 0xAADF, "Tai Viet"),
    (0xF900, 0xFAFF, "CJK Compatibility Ideographs"),
    (0xFF66, 0xFF9F, "Halfwidth Katakana"),
    (0x16FE0, 0x16FFF, "Ideographic Symbols"),
    (0x17000, 0x18D7F, "Tangut"),
    (0x1AFF0, 0x1B16F, "Kana Extended / Supplement / Small Kana"),
    (0x1B170, 0x1B2FF, "Nushu"),
    (0x20000, 0x323AF, "CJK Unified Ideographs Extensions B-H, Compatibility Supplement"),
)


def _class_body(code_points: list[int]) -> str:
    """A regex character-class body ("a-zé...") for sorted code points, as ranges."""
    out, i = [], 0
    while i < len(code_points):
        j = i
        while j + 1 < len(code_points) and code_points[j + 1] == code_points[j] + 1:
            j += 1
        a, b = code_points[i], code_points[j]
        out.append(re.escape(chr(a)) if a == b else f"{re.escape(chr(a))}-{re.escape(chr(b))}")
        i = j + 1
    return "".join(out)


def _unit_chars() -> list[int]:
    """The word characters (`\\w`) of the no-space blocks: each starts a unit of its own."""
    w = re.compile(r"\w")
    return [c for a, b, _ in NO_SPACE_BLOCKS for c in range(a, b + 1) if w.match(chr(c))]


def _marks() -> list[int]:
    """The combining marks (general category Mn, Mc, Me) of the Basic Multilingual Plane: every living script's. (The
    marks of historic scripts beyond it still split words, as before: a character class reaching past U+FFFF makes
    `re` test its ranges one by one, 30 times slower.)"""
    return [c for c in range(0x10000) if unicodedata.category(chr(c))[0] == "M"]


_UNITS = _unit_chars()
_N = _class_body([c for c in _UNITS if c <= 0xFFFF])  # BMP classes: `re` tests them with one table lookup
NO_SPACE_LETTERS_BMP = _N  # the class body, for other stages' own patterns (PII number boundaries)
_N_ASTRAL = _class_body([c for c in _UNITS if c > 0xFFFF])  # a few ranges (CJK extensions B-H, Tangut, kana ...)
_MARKS = _marks()  # listed once: 65,536 unicodedata lookups
MARKS_BMP = _class_body(_MARKS)  # combining marks (M*) of the BMP, as a regex class body
_UNIT = rf"(?:[{_N}]|[{_N_ASTRAL}])[{MARKS_BMP}]*"  # one character of a no-space script, with its marks
_W = rf"(?![{_N_ASTRAL}])[^\W{_N}][{MARKS_BMP}]*"  # a word character of a spaced script, with its marks
# Anything that can make the aware split differ from the old regex: a no-space-script character or a combining mark.
_SPECIAL = re.compile(rf"[{_N}{MARKS_BMP}]")
_SPECIAL_ASTRAL = re.compile(rf"[{_N_ASTRAL}]")
# Neither can be below U+0300 or among the general punctuation (curly quotes, dashes, ellipsis): English and most
# European text is ruled out by one scan of a two-range class, ~15x faster than a scan for `_SPECIAL`.
_BEYOND_LATIN = re.compile("[^\x00-\u02ff\u2000-\u206f]")
_ASTRAL = re.compile("[\U00010000-\U0010FFFF]")
_UNIT_START = re.compile(rf"[{_N}]|[{_N_ASTRAL}]")


def plain(text: str) -> bool:
    """True when the old `\\w`/whitespace regexes already give the units: no character of a no-space script and no
    combining mark (pure ASCII answers at once, Latin text after one fast scan)."""
    if text.isascii() or (beyond := _BEYOND_LATIN.search(text)) is None:
        return True
    start = beyond.start()
    if _SPECIAL.search(text, start) is not None:
        return False
    astral = _ASTRAL.search(text, start)
    return astral is None or _SPECIAL_ASTRAL.search(text, astral.start()) is None


def is_unit(word: str) -> bool:
    """True for a unit that is one character of a no-space script (a split word is either that or a spaced word)."""
    return _UNIT_START.match(word) is not None


class Splitter:
    """One notion of "word" in two compiled forms: the old regex for plain text, the script-aware one otherwise.
    `findall`/`finditer` mirror `re.Pattern`'s (matches carry spans into the text)."""

    def __init__(self, old: str, aware: str):
        self.old, self.aware = re.compile(old), re.compile(aware)

    def pattern(self, text: str) -> re.Pattern:
        return self.old if plain(text) else self.aware

    def findall(self, text: str) -> list[str]:
        return self.pattern(text).findall(text)

    def finditer(self, text: str):
        return self.pattern(text).finditer(text)


# `\w+`: dedup's words (shingles, decontamination n-grams).
WORD_PATTERN = rf"{_UNIT}|(?:{_W})+"  # the aware form, for patterns built around a word
WORDS = Splitter(r"\w+", WORD_PATTERN)
# `\S+`: whitespace words (C4's line words, dedup with strip_punctuation off, word counts); marks after a unit stay
# with it, any other non-space run is one word.
NON_SPACE = Splitter(r"\S+", rf"{_UNIT}|(?:(?![{_N_ASTRAL}])[^\s{_N}])+")
# DataTrove-style word tokens: word runs keeping inner apostrophes, hyphens ("don't", "state-of-the-art") and
# zero-width (non-)joiners (Persian "می‌خواهم", "کتاب‌ها"; Indic conjuncts) ...
JOINERS = "'’-\u200c\u200d"
_JOIN = f"[{re.escape(JOINERS)}]"
_TOKEN_WORD_OLD = rf"\w+(?:{_JOIN}\w+)*"
_TOKEN_WORD = rf"{_UNIT}|(?:{_W})+(?:{_JOIN}(?:{_W})+)*"
TOKEN_WORDS = Splitter(_TOKEN_WORD_OLD, _TOKEN_WORD)
# ... and punctuation/symbol marks as tokens of their own ("..." kept whole), an emoji with its skin tone or
# presentation selector (EMOJI_TAILS) and the emoji a zero-width joiner glues to it (a family, a person at a laptop)
# as one: a symbol other than "." or the joiner itself, its tails, then joiner + symbol + tails, repeated.
EMOJI_TAILS = "\ufe0e\ufe0f\U0001F3FB-\U0001F3FF"
_SYMBOL = rf"[^\w\s.\u200d][{EMOJI_TAILS}]*(?:\u200d[^\w\s.\u200d][{EMOJI_TAILS}]*)*|[^\w\s]"
TOKENS = Splitter(rf"{_TOKEN_WORD_OLD}|\.\.\.|{_SYMBOL}", rf"{_TOKEN_WORD}|\.\.\.|{_SYMBOL}")


def words(text: str) -> list[str]:
    """The text's words (`\\w+` runs) with no-space scripts split into characters."""
    return WORDS.findall(text)


def whitespace_words(text: str) -> list[str]:
    """`text.split()` with no-space scripts split into characters (word counts, C4's words per line)."""
    return text.split() if plain(text) else NON_SPACE.aware.findall(text)


def count_words(text: str) -> int:
    """len(whitespace_words(text)): the word count reports use."""
    return len(whitespace_words(text))


# ---- shingles: how many units make "n words" ---------------------------------------------------------------------
# A shingle of n words spans n spaced words, or the no-space characters that carry as much text: a Han character or
# kana weighs UNIT_WEIGHT / WORD_WEIGHT = 5/8 of a word, so a shingle of 5 words is 8 Chinese or Japanese characters.
# Running Chinese text averages 1.6-1.7 characters per word (DeFrancis 1943, Zheng 1957, as cited by Hannas 1997;
# Chen, Liang & Liu 2015, PLOS ONE 10(9):e0138567): with 8-character shingles an edit of a fraction of the words moves
# the Jaccard about as much as in English with 5-word shingles, so dedup.near.threshold means the same in every script.
# Yi, Tangut and Nushu (a character a syllable or a morpheme) weigh as Han does.
WORD_WEIGHT, UNIT_WEIGHT = 8, 5
# The alphabets of South-East Asia and Tibet (Thai, Lao, Khmer, Myanmar, Tibetan, the Tai scripts): there a unit is a
# letter with its marks, a part of a syllable, and carries far less than a Han character. Thai news prose segmented by
# hand, as the word lists of Thai dictionaries cut it, is 3.85 units a word (185 units in 48 words, 4.6 code points a
# word; its English translation has 37 words, 5.0 units each): ABUGIDA_WEIGHT / WORD_WEIGHT = 1/4 of a word, 4 units
# a word, so 50 words (Gopher's minimum) are 200 Thai units, a 5-word shingle 20 and a 13-word n-gram 52. Weighed as
# Han (5/8), 13 Thai units, a four-word phrase, made the 8 words an eval item needs, and a 2-sentence paragraph of 48
# words was 115 "words". Segmentation-free: no dictionary to ship; the others' figure is Thai's, as their units are
# alike (a consonant with its vowel signs, a syllable 1-3 units).
ABUGIDA_WEIGHT = 2
ABUGIDA_BLOCKS = frozenset({"Thai", "Lao", "Tibetan", "Myanmar", "Khmer", "Tai Le", "New Tai Lue", "Khmer Symbols",
                            "Tai Tham", "Myanmar Extended-B", "Myanmar Extended-A", "Tai Viet"})


@cache
def unit_weights() -> dict[int, int]:
    """Code point -> weight of a unit it starts (UNIT_WEIGHT or ABUGIDA_WEIGHT), for every unit code point."""
    abugida = [(a, b) for a, b, name in NO_SPACE_BLOCKS if name in ABUGIDA_BLOCKS]
    return {c: ABUGIDA_WEIGHT if any(a <= c <= b for a, b in abugida) else UNIT_WEIGHT for c in _UNITS}


def word_weights(ws: Sequence[str]) -> np.ndarray:
    """Each word's weight: UNIT_WEIGHT for a Han character or kana, ABUGIDA_WEIGHT for a letter of Thai, Khmer,
    Myanmar ..., WORD_WEIGHT for any other word (or mark): a run of words is "n words" once it weighs n * WORD_WEIGHT
    (dedup's shingles, Gopher's n-grams). (A word starting with a unit code point is that unit: units split words.)"""
    weight = unit_weights().get
    return np.fromiter((weight(ord(w[0]) if w else -1, WORD_WEIGHT) for w in ws), dtype=np.int64, count=len(ws))


def weighed_count(ws: Sequence[str]) -> float:
    """How many words `ws` (words of a text that is not `plain`) make in word_weights' terms: a Han character 5/8, a
    Thai letter 1/4, any other word 1 (Gopher's document length, C4's words per line)."""
    return int(word_weights(ws).sum()) / WORD_WEIGHT


def unit_code_points() -> frozenset[int]:
    """Code points that start a unit of their own (for numpy paths that classify code points, e.g. fast MinHash)."""
    return frozenset(_UNITS)


@cache
def mark_code_points() -> frozenset[int]:
    return frozenset(_MARKS)


# ---- scripts -----------------------------------------------------------------------------------------------------

@cache
def _script_of(char: str) -> str | None:
    """The script of one letter, from its Unicode name ("CYRILLIC SMALL LETTER A" -> "Cyrillic"), None for a
    non-letter. Hiragana and Katakana are one script here, "Kana": Japanese mixes both with Han."""
    if not char.isalpha():
        return None
    name = unicodedata.name(char, "")
    first = name.split(" ", 1)[0]
    if first in ("HIRAGANA", "KATAKANA") or name.startswith("HALFWIDTH KATAKANA"):
        return "Kana"
    if first == "CJK":
        return "Han"
    return first.capitalize() if first else None


def dominant_script(text: str, max_chars: int = 2000) -> str:
    """The script most of the first `max_chars` characters' letters are written in ("Latin", "Cyrillic", "Han",
    "Kana", "Thai", "Hangul" ...), "none" when there is no letter: the tokenizer report's per-script unit."""
    head = text[:max_chars]
    if head.isascii():
        return "Latin" if any(c.isalpha() for c in head) else "none"
    counts: dict[str, int] = {}
    for char in head:
        script = _script_of(char)
        if script is not None:
            counts[script] = counts.get(script, 0) + 1
    return max(counts, key=counts.get) if counts else "none"
