"""Bad-words ratio filter: C4's LDNOOBW rule (Raffel et al. 2020 §2.2), softened to a ratio threshold.

C4 drops a page on any listed word; that also removes medical, legal and news text that merely
mentions one. Here a page is dropped only when listed words/phrases exceed `max_ratio` of its words
(`max_ratio=0.0` reproduces C4's drop-on-any).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar

import pyarrow.compute as pc

from kiln.curation.documents import Document
from kiln.curation.filters import text_stats as ts
from kiln.curation.filters.base import Fraction, Verdict, drop, keep
from kiln.curation.filters.wordlists import cached_while_unchanged, load_wordlist

DEFAULT_WORDS_FILE = Path(__file__).resolve().parent.parent / "data" / "badwords_en.txt"


@dataclass(frozen=True)
class WordList:
    """A loaded list: single words as a set, multi-word phrases grouped by their length in words."""

    single: frozenset[str]
    phrases: dict[int, frozenset[tuple[str, ...]]]
    phrase_starts: frozenset[str]  # first words of the phrases: only there is a phrase lookup needed
    screen: str | None  # RE2 pattern every text with a match matches (None: no screen, every text is counted)

    def __len__(self) -> int:
        return len(self.single) + sum(len(p) for p in self.phrases.values())

    def count_matches(self, ws: list[str]) -> int:
        """Occurrences of listed entries in a lower-cased word sequence (phrases may overlap words)."""
        single, starts = self.single, self.phrase_starts
        hits = 0
        for i, w in enumerate(ws):
            if w in single:
                hits += 1
            if w in starts:
                for n, grams in self.phrases.items():
                    if tuple(ws[i : i + n]) in grams:
                        hits += 1
        return hits


@cached_while_unchanged
def load_word_list(path: str) -> WordList:
    """Read a word list (one word/phrase per line, '#' comments; a missing file is a ValueError), cached per path
    while the file is unchanged.

    Entries are tokenized like document text, so "Two  Girls" and "two girls" are the same phrase and
    matching is on word boundaries ("banana" does not match "bananas").
    """
    single: set[str] = set()
    phrases: dict[int, set[tuple[str, ...]]] = {}
    for entry in load_wordlist(path):
        ws = tuple(ts.words(ts.lower(entry)))
        if len(ws) == 1:
            single.add(ws[0])
        elif ws:
            phrases.setdefault(len(ws), set()).add(ws)
    starts = frozenset(p[0] for group in phrases.values() for p in group)
    return WordList(
        single=frozenset(single),
        phrases={n: frozenset(p) for n, p in sorted(phrases.items())},
        phrase_starts=starts,
        screen=_screen_pattern(single | starts),
    )


def _screen_pattern(first_words: set[str]) -> str | None:
    """An RE2 pattern for "one of these words, case-insensitive, between ASCII word boundaries". A listed word
    (ASCII) is a token of the lowercased text only where it stands in the text in ASCII letters of any case between
    characters that are not word characters (so not ASCII ones either), or with one of the two non-ASCII letters
    that lowercase to ASCII (the Kelvin sign, 'İ'): a text holding one of those is always counted."""
    if not first_words or not all(w.isascii() for w in first_words):
        return None
    return r"(?i)\b(?:" + "|".join(re.escape(w) for w in sorted(first_words)) + r")\b|\x{130}|\x{212A}"


# C4 bad-words rule (Raffel et al. 2020 §2.2, LDNOOBW list) as a ratio: drop if matches / words > max_ratio.
@dataclass
class BadWords:
    name: ClassVar[str] = "badwords"
    list_files: ClassVar[tuple[str, ...]] = ("words_file",)  # what it decides by, beyond its parameters

    max_ratio: Fraction | None = 0.01  # None disables; 0.0 = C4's drop on any match
    words_file: str | None = None  # None: the bundled kiln/curation/pipeline/data/badwords_en.txt

    def batch(self, docs: list[Document]) -> list[Verdict]:
        """The same verdicts as one call per document; one RE2 pass finds the few texts with a listed word in them."""
        if self.max_ratio is None:
            return [keep(d.text) for d in docs]
        screen = load_word_list(str(self.words_file or DEFAULT_WORDS_FILE)).screen
        array = None if screen is None else ts.arrow_texts([d.text for d in docs])
        if array is None:
            return [self(d) for d in docs]
        return [self(d) if hit else keep(d.text) for d, hit in zip(docs, pc.match_substring_regex(array, screen).to_pylist())]

    def __call__(self, doc: Document) -> Verdict:
        text = doc.text
        if self.max_ratio is None:
            return keep(text)
        wordlist = load_word_list(str(self.words_file or DEFAULT_WORDS_FILE))
        ws = ts.words(ts.lower(text))
        if not ws:
            return keep(text)
        if wordlist.count_matches(ws) / len(ws) > self.max_ratio:
            return drop(self.name, "max_ratio", text)
        return keep(text)
