"""FineWeb's extra quality rules (Penedo et al. 2024, "The FineWeb Datasets", §3.5).

Exactly DataTrove's FineWebQualityFilter: the rule names are its drop reasons.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Annotated, ClassVar

from annotated_types import Interval
from pydantic import NonNegativeFloat, NonNegativeInt

from kiln.common.text_units import plain, weighed_count
from kiln.curation.documents import Document
from kiln.curation.filters import text_stats as ts
from kiln.curation.filters.base import Verdict, drop, keep


# FineWeb custom filters: Penedo et al. 2024 (arXiv:2406.17557) §3.5; as DataTrove fineweb_quality_filter.py.
@dataclass
class FineWebQuality:
    name: ClassVar[str] = "fineweb_quality"

    # A fraction, under 1 (at 1 every page is dropped): drop if <= this fraction of lines end in . ' " ! ?
    line_punct_thr: Annotated[float, Interval(ge=0, lt=1)] | None = 0.12
    line_punct_exclude_zero: bool = False  # True: a page with no such line at all is not dropped by it
    # Fractions over 0 (at 0 every page is dropped):
    short_line_thr: Annotated[float, Interval(gt=0, le=1)] | None = 0.67  # drop if >= this fraction of lines are short
    short_line_length: NonNegativeInt = 30  # "short" means at most this many characters
    # drop if >= this fraction of chars are in repeated lines
    char_duplicates_ratio: Annotated[float, Interval(gt=0, le=1)] | None = 0.01
    # drop if newlines / words > this (list-like pages; may exceed 1; words weighed as text_units.weighed_count)
    new_line_ratio: NonNegativeFloat | None = 0.3

    def __call__(self, doc: Document) -> Verdict:
        text = doc.text
        lines = text.split("\n")  # raw lines, not stripped, as DataTrove
        n_lines = len(lines)

        if self.line_punct_thr is not None:
            ratio = sum(1 for line in lines if ts.ends_sentence(line)) / n_lines
            if ratio <= self.line_punct_thr and not (ratio == 0 and self.line_punct_exclude_zero):
                return drop(self.name, "line_punct_ratio", text)

        if self.short_line_thr is not None:
            ratio = sum(1 for line in lines if len(line) <= self.short_line_length) / n_lines
            if ratio >= self.short_line_thr:
                return drop(self.name, "short_line_ratio", text)

        if self.char_duplicates_ratio is not None:
            n_chars = len(text) - text.count("\n")
            _, dup_chars = ts.find_duplicates(line for line in lines if line.strip())
            if n_chars and dup_chars / n_chars >= self.char_duplicates_ratio:
                return drop(self.name, "char_dup_ratio", text)

        if self.new_line_ratio is not None:
            # Tokens weighed as Gopher's length (text_units): a Chinese character 5/8 of one, a Thai letter 1/4. One
            # each, a navigation list of Chinese or Thai items had 1.6-4 times the tokens of the same list in English
            # and passed.
            toks = ts.tokens(text)
            n_tokens = len(toks) if plain(text) else weighed_count(toks)
            if text.count("\n") / max(n_tokens, 1) > self.new_line_ratio:
                return drop(self.name, "list_ratio", text)

        return keep(text)
