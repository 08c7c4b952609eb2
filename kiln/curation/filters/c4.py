"""C4 line-level cleanup and page rules (Raffel et al. 2020, JMLR 21(140) §2.2; TFDS c4_utils.clean_page).

The bad-words rule of C4 lives in `kiln.curation.filters.badwords` (as a ratio, not drop-on-any).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from pydantic import NonNegativeInt, PositiveInt

from kiln.common.text_units import plain, weighed_count, whitespace_words
from kiln.curation.documents import Document
from kiln.curation.filters import text_stats as ts
from kiln.curation.filters.base import Verdict, drop, keep

CITATION_RE = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]")
POLICY_SUBSTRINGS: tuple[str, ...] = (
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
)


# C4 "clean_page": Raffel et al. 2020 (arXiv:1910.10683) §2.2, TFDS c4_utils; as DataTrove C4QualityFilter.
@dataclass
class C4:
    name: ClassVar[str] = "c4"

    # line rules (a failing line is removed; the page goes on)
    remove_citations: bool = True  # strip wiki-style "[1]", "[edit]", "[citation needed]"
    filter_no_terminal_punct: bool = True  # keep only lines ending in . ? ! " ' (and not in "..."; ts.ends_sentence)
    min_words_per_line: NonNegativeInt | None = 3  # words weighed as text_units.weighed_count (a Han character 5/8)
    max_word_length: PositiveInt | None = 1000  # remove lines with a whitespace-separated word longer than this
    filter_javascript: bool = True  # remove lines mentioning "javascript"
    filter_policy: bool = True  # remove lines with cookie / privacy-policy / terms-of-use phrases
    # page rules (evaluated on lines that survived the rules above, as in C4)
    filter_lorem_ipsum: bool = True  # drop the page if a line contains "lorem ipsum"
    filter_curly_bracket: bool = True  # drop the page if a line contains "{"
    min_num_sentences: NonNegativeInt | None = 5  # drop the page if fewer sentences remain after cleanup
    drop_empty: bool = True  # drop the page if no line remains

    def __call__(self, doc: Document) -> Verdict:
        kept: list[str] = []
        removed = citations = sentences = 0

        for raw in doc.text.splitlines():
            line = raw.strip()
            if not line:
                continue  # blank separators are not "removed lines"; C4 joins kept lines with "\n"
            split = whitespace_words(line)  # line.split(); a character per word in Chinese, Japanese, Thai ...
            if self.max_word_length is not None and any(len(w) > self.max_word_length for w in split):
                removed += 1
                continue
            n_citations = 0
            if self.remove_citations:
                line, n_citations = CITATION_RE.subn("", line)
            if self.filter_no_terminal_punct and (
                not ts.ends_sentence(line) or line.endswith("...")
            ):
                removed += 1
                continue
            # Words as Gopher's document length counts them: a Chinese or Japanese character 5/8 of one, a Thai,
            # Khmer ... letter 1/4 (text_units); counted one each, a Thai menu line ("หน้าแรก", "home", 6 letters)
            # passed the 3 words, as it ends a sentence with no mark (text_stats.SPACE_ENDED_SCRIPTS).
            if self.min_words_per_line is not None and (
                len(split) if plain(line) else weighed_count(split)
            ) < self.min_words_per_line:
                removed += 1
                continue
            lower = line.lower()
            if self.filter_lorem_ipsum and "lorem ipsum" in lower:
                return drop(self.name, "lorem_ipsum", doc.text)
            if self.filter_javascript and "javascript" in lower:
                removed += 1
                continue
            if self.filter_curly_bracket and "{" in line:
                return drop(self.name, "curly_bracket", doc.text)
            if self.filter_policy and any(p in lower for p in POLICY_SUBSTRINGS):
                removed += 1
                continue
            kept.append(line)
            citations += n_citations  # counted on kept lines only: what the rewrite changed
            sentences += ts.count_sentences(line)

        if self.min_num_sentences is not None and sentences < self.min_num_sentences:
            return drop(self.name, "too_few_sentences", doc.text)
        text = "\n".join(kept).strip()
        if self.drop_empty and not text:
            return drop(self.name, "empty", doc.text)
        return keep(text, lines_removed=removed, citations_removed=citations)
