"""The PII types, their placeholders, and what every detector module shares: the number-boundary patterns and
the check of a `types` argument."""

from __future__ import annotations

import bisect
import re
import unicodedata
from collections.abc import Iterable

from kiln.common.text_units import NO_SPACE_LETTERS_BMP

PII_TYPES: tuple[str, ...] = ("email", "phone", "ipv4", "ipv6", "us_ssn", "credit_card", "iban", "secret")
PLACEHOLDERS: dict[str, str] = {t: f"<{t.upper()}>" for t in PII_TYPES}


# Speed: Python's `re` jumps quickly to candidate positions only when a pattern starts with a literal
# or a character class; a leading look-behind means a full match attempt at every position (~8x
# slower over a whole corpus). So patterns consume their first character and then look behind it.
#
# Number boundaries: a match never starts or ends inside a longer token. A word character (_WORD) stops
# "x555-123-4567" and a card inside a longer digit run; a digit joined by '.' or '-' stops the middle of
# "12-555-123-4567" or "555-123-4567-89" (order and part numbers).
# Letters of scripts written without spaces between words (Han, kana, Thai, Lao, Khmer, Myanmar ...: text_units'
# list), and Hangul, whose particles attach to the word before, do not make a longer token:
# "電話090-1234-5678までご連絡ください", "010-1234-5678로 연락". BMP only, as text_units' class: one past U+FFFF makes
# `re` test its ranges one by one.
_HANGUL = "\u1100-\u11ff\u3130-\u318f\uac00-\ud7af"  # Jamo, Compatibility Jamo, Syllables
_UNSPACED = NO_SPACE_LETTERS_BMP + _HANGUL
_WORD = "[^\\W" + _UNSPACED + "]"  # \w less those letters
_UNSPACED_LETTER = re.compile("[" + _UNSPACED + "]")
_LEAD = "[0-9](?<!" + _WORD + "[0-9])(?<![0-9][.-][0-9])"  # first digit of a number that starts a token
_NUM_R = "(?!" + _WORD + ")(?![.-][0-9])"


def glued(char: str) -> bool:
    """Whether `char` next to a number makes it part of a longer token (a _WORD character)."""
    return (char.isalnum() or char == "_") and _UNSPACED_LETTER.match(char) is None


def _check_types(types: Iterable[str]) -> tuple[str, ...]:
    wanted = (types,) if isinstance(types, str) else tuple(types)
    bad = [t for t in wanted if t not in PII_TYPES]
    if bad:
        raise ValueError(f"unknown PII type(s) {bad}; allowed: {', '.join(PII_TYPES)}")
    return wanted


# --- what the detectors read ---------------------------------------------------------------------
# Web pages and non-Latin text write the same numbers with other characters: "4111&nbsp;1111..." reaches the text
# as U+00A0, Japanese pages write full-width "０９０－１２３４" and "ｊａｎｅ＠ｅｘａｍｐｌｅ．ｃｏｍ", Arabic pages
# Arabic-Indic digits, typeset pages a non-breaking hyphen in "123‑45‑6789". The detectors read a folded copy of the
# text in which each such character is its ASCII twin, one character for one: any Unicode decimal digit -> its
# ASCII digit, a full-width form (U+FF01-U+FF5E) -> its ASCII character, a space separator (Zs: no-break, thin,
# narrow no-break, ideographic...) -> ' ', a dash written inside numbers (U+2011 non-breaking hyphen, U+2012 figure
# dash, U+2013 en dash, U+2212 minus, U+FE63) -> '-'. Not U+2010, the hyphen man pages break words with
# ("lists.source‐\n forge.net": an e-mail address's domain must not end at a '-'), nor the em dash. Everything else
# is kept.
class _Fold(dict):
    """str.translate table, filled on first sight of each code point (cheap: a text has few distinct ones)."""

    def __missing__(self, code: int) -> int:
        char = chr(code)
        digit = unicodedata.decimal(char, None)
        if digit is not None:
            folded = 48 + digit
        elif 0xFF01 <= code <= 0xFF5E:
            folded = code - 0xFEE0
        elif unicodedata.category(char) == "Zs":
            folded = 32
        elif code in _DASHES:
            folded = 45
        else:
            folded = code
        self[code] = folded
        return folded


_DASHES = frozenset((0x2011, 0x2012, 0x2013, 0x2212, 0xFE63))
_FOLD = _Fold()
# Invisible format characters (Unicode Cf) split an address or a number for a pattern while a reader sees it whole:
# a soft hyphen from a CMS's hyphenation (&shy;), zero-width (non-)joiners and spaces, bidi marks and embeddings in
# Arabic and Hebrew pages (U+061C, U+200E/F, U+202A-E, U+2066-9), word joiners and invisible operators (U+2060-4),
# a byte order mark. The copy leaves them out ("jane\xaddoe@gmail.com" is read as "janedoe@gmail.com"), and a span
# found in it is mapped back to the original's, the invisible characters inside it included (`original_span`).
_INVISIBLE = re.compile("[\u00ad\u061c\u180e\u200b-\u200f\u202a-\u202e\u2060-\u2064\u2066-\u206f\ufeff]")


def detection_text(text: str) -> tuple[str, list[int]]:
    """`text` as the detectors read it (see above), and where invisible characters were left out of it: for each
    (in order) the index in the copy it stood before; []: the same length, the same offsets (ASCII text unchanged)."""
    if text.isascii():
        return text, []
    dropped: list[int] = []
    if _INVISIBLE.search(text) is not None:
        parts, pos = [], 0
        for m in _INVISIBLE.finditer(text):
            parts.append(text[pos : m.start()])
            dropped.append(m.start() - len(dropped))
            pos = m.end()
        parts.append(text[pos:])
        text = "".join(parts)
    return text.translate(_FOLD), dropped


def original_span(dropped: list[int], start: int, end: int) -> tuple[int, int]:
    """The span of the original text that `detection_text`'s copy has at [start, end) (`dropped`: as it returned)."""
    if not dropped:
        return start, end
    return start + bisect.bisect_right(dropped, start), end + bisect.bisect_right(dropped, end - 1)
