"""Unicode normalization: the first step for every document, so later rules see canonical text."""

from __future__ import annotations

import re
import unicodedata
from dataclasses import dataclass
from typing import ClassVar, Literal

import ftfy

from kiln.curation.documents import Document
from kiln.curation.filters.base import Verdict, drop, keep

# Control characters other than tab/newline/carriage return carry no text and break tokenizers, and so do a soft
# hyphen (U+00AD: a CMS's hyphenation, `&shy;`, in every long word of a page; resiliparse keeps it, trafilatura drops
# it) and a word joiner (U+2060), invisible both, which cut the word they sit in for every word-based stage (filters,
# shingles, bad words), and a zero-width space, except between two letters of the scripts that write it between
# words (Thai, Lao, Myanmar, Khmer: the only word boundary their text has).
_SEPARATED_BY_ZWSP = "\u0e00-\u0eff\u1000-\u109f\u1780-\u17ff"
_CONTROL = re.compile(rf"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f\u00ad\u2060\ufeff]|(?<![{_SEPARATED_BY_ZWSP}])\u200b"
                      rf"|\u200b(?![{_SEPARATED_BY_ZWSP}])")


def _fix_mojibake(line: str) -> str:
    # Only mojibake repair: no cosmetic rewrites (curly quotes, ligatures, widths) that would change code and
    # reference text, and no HTML entities decoded (ftfy's default does, on the lines it sees: only those with a
    # non-ASCII character, so `&amp;` in code changed where a comment held an accent). ASCII lines have no mojibake.
    if line.isascii():
        return line
    return ftfy.fix_text(line, uncurl_quotes=False, fix_latin_ligatures=False, fix_character_width=False,
                         normalization=None, unescape_html=False)


@dataclass
class UnicodeNormalize:
    name: ClassVar[str] = "normalize"
    form: Literal["NFC", "NFKC", "NFD", "NFKD"] = "NFC"
    fix_mojibake: bool = True  # ftfy repairs text that was decoded with the wrong codec upstream
    strip_control: bool = True
    newlines: bool = True  # \r\n and \r become \n

    def __call__(self, doc: Document) -> Verdict:
        text = self.normalized(doc.text)
        if not text.strip():
            return drop(self.name, "empty_after_normalization", text)
        return keep(text, chars_changed=int(text != doc.text))

    def normalized(self, text: str) -> str:
        """The text as this step writes it: what a text compared with curated documents (a takedown's, a membership
        question's) goes through first, so that it matches in any form the step folds (NFD, soft hyphens, mojibake)."""
        if not text.isascii():  # ASCII has no mojibake and is already in every normal form: skip the slow part
            if self.fix_mojibake:
                # ftfy works line by line; ASCII lines (most lines of most documents) have nothing to repair, so
                # it sees only the others, as whole-ASCII documents already skip it.
                text = "\n".join(map(_fix_mojibake, text.split("\n")))
            text = unicodedata.normalize(self.form, text)
        if self.newlines:
            text = text.replace("\r\n", "\n").replace("\r", "\n")
        if self.strip_control:
            text = _CONTROL.sub("", text)
        return text
