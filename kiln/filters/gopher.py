"""Gopher quality and repetition rules (Rae et al. 2021, "Scaling Language Models", Appendix A / Table A1).

Semantics follow DataTrove's GopherQualityFilter / GopherRepetitionFilter; each rule is disabled by
setting its parameter to None.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import ClassVar

from kiln.documents import Document
from kiln.filters import text_stats as ts
from kiln.filters.base import Verdict, drop, keep


# Gopher quality filter: Rae et al. 2021 (arXiv:2112.11446) App. A.1.1; as DataTrove gopher_quality_filter.py.
@dataclass
class GopherQuality:
    name: ClassVar[str] = "gopher_quality"

    min_doc_words: int | None = 50
    max_doc_words: int | None = 100_000
    min_avg_word_length: float | None = 3
    max_avg_word_length: float | None = 10
    max_symbol_word_ratio: float | None = 0.1  # for "#" and for "..."/"…", each against all tokens
    max_bullet_lines_ratio: float | None = 0.9
    max_ellipsis_lines_ratio: float | None = 0.3
    max_non_alpha_words_ratio: float | None = 0.8  # i.e. at least 80% of tokens must contain a letter
    min_stop_words: int | None = 2

    def __call__(self, doc: Document) -> Verdict:
        text = doc.text
        toks = ts.tokens(text)
        ws = ts.word_tokens(toks)  # tokens that are not pure punctuation/symbols
        n_toks, n_words = len(toks), len(ws)

        if self.min_doc_words is not None and n_words < self.min_doc_words:
            return drop(self.name, "min_doc_words", text)
        if self.max_doc_words is not None and n_words > self.max_doc_words:
            return drop(self.name, "max_doc_words", text)
        if n_words == 0:  # only reachable with min_doc_words=None: nothing below is defined
            return keep(text)

        avg_len = sum(map(len, ws)) / n_words
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
            lines = ts.lines(text)
            n_lines = len(lines) or 1
            if self.max_bullet_lines_ratio is not None:
                bullets = sum(1 for line in lines if line.lstrip().startswith(ts.BULLETS))
                if bullets / n_lines > self.max_bullet_lines_ratio:
                    return drop(self.name, "max_bullet_lines_ratio", text)
            if self.max_ellipsis_lines_ratio is not None:
                ellipses = sum(1 for line in lines if line.rstrip().endswith(ts.ELLIPSES))
                if ellipses / n_lines > self.max_ellipsis_lines_ratio:
                    return drop(self.name, "max_ellipsis_lines_ratio", text)

        if self.max_non_alpha_words_ratio is not None:
            alpha = sum(1 for w in ws if ts.has_alpha(w))  # punctuation tokens never have a letter
            if alpha / n_toks < self.max_non_alpha_words_ratio:
                return drop(self.name, "max_non_alpha_words_ratio", text)

        if self.min_stop_words is not None:
            found = 0
            for w in ws:
                if w.lower() in ts.STOP_WORDS:
                    found += 1
                    if found >= self.min_stop_words:
                        break
            if found < self.min_stop_words:
                return drop(self.name, "min_stop_words", text)

        return keep(text)


def _pairs(value: Iterable[Iterable[float]] | None) -> tuple[tuple[int, float], ...] | None:
    """Normalize ((n, frac), ...) given as lists (from YAML) into a tuple of (int, float) pairs."""
    if value is None:
        return None
    return tuple((int(n), float(frac)) for n, frac in value)


# Gopher repetition filter: Rae et al. 2021 (arXiv:2112.11446) Table A1; as DataTrove gopher_repetition_filter.py.
@dataclass
class GopherRepetition:
    name: ClassVar[str] = "gopher_repetition"

    dup_line_frac: float | None = 0.3
    dup_para_frac: float | None = 0.3
    dup_line_char_frac: float | None = 0.2
    dup_para_char_frac: float | None = 0.2
    # (n, max fraction of characters in the most frequent n-gram); None disables all.
    top_n_grams: tuple[tuple[int, float], ...] | None = ((2, 0.20), (3, 0.18), (4, 0.16))
    # (n, max fraction of characters in repeated n-grams); None disables all.
    dup_n_grams: tuple[tuple[int, float], ...] | None = (
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

        for n, max_frac in self.top_n_grams or ():
            if ts.top_ngram_chars(toks, n) / n_chars > max_frac:
                return drop(self.name, f"top_{n}gram_char_frac", text)

        unique_from: int | None = None  # once no n-gram repeats, no longer n-gram can repeat either
        for n, max_frac in self.dup_n_grams or ():
            if unique_from is not None and n >= unique_from:
                continue
            repeated = ts.duplicated_ngram_chars(toks, n)
            if repeated == 0:
                unique_from = n if unique_from is None else min(unique_from, n)
            elif repeated / n_chars > max_frac:
                return drop(self.name, f"dup_{n}gram_char_frac", text)

        return keep(text)
