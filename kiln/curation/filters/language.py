"""Language identification with py3langid, whose model ships inside the wheel (works offline)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import Annotated, ClassVar

import numpy as np
from annotated_types import MinLen
from py3langid.langid import MODEL_FILE, LanguageIdentifier
from pydantic import PositiveInt

from kiln.curation.documents import Document
from kiln.curation.filters.base import Fraction, Verdict, drop, keep
from kiln.curation.filters.text_stats import chunks

_SEPARATOR = 0xFF  # never in UTF-8, and no feature contains it: the automaton returns to its root on it


class BatchIdentifier(LanguageIdentifier):
    """py3langid's identifier, with its byte automaton run over a whole batch of texts in numpy.

    py3langid walks its Aho-Corasick automaton of byte n-gram features one byte at a time in Python
    (~70% of its time). The automaton's state after byte i is the longest suffix of the text so far that
    is a prefix of a feature, so it depends only on the last `depth` bytes (the longest feature): every
    position's state is the walk from the root over its own `depth`-byte window, which numpy does for all
    positions of all texts at once, `depth` gathers in all. Features are counted in order of first
    occurrence, as py3langid's Counter does, so the scores are bit-identical to its own walk (tested).
    """

    __slots__ = ("_depth", "_next", "_out", "_ptc32", "_row", "_visits")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._next = np.asarray(self.tk_nextmove, dtype=np.int32)
        self._row = np.asarray(self._rowbase, dtype=np.int32)
        self._out = np.asarray(self.tk_output, dtype=np.int32)
        # float32 @ float16 takes numpy's slow mixed-type path; the cast is exact, so the product is the same.
        self._ptc32 = np.asarray(self.nb_ptc, dtype=np.float32)
        self._depth = self._automaton_depth()
        self._visits: dict[bytes, tuple[np.ndarray, np.ndarray] | None] = {}
        if self._next[self._row + _SEPARATOR].any():
            raise ValueError("py3langid model: byte 0xFF does not return the automaton to its root")

    def _automaton_depth(self) -> int:
        """Length of the longest feature: the largest breadth-first distance of a state from the root."""
        seen = np.zeros(len(self._row), dtype=bool)
        seen[0] = True
        frontier, depth = np.array([0], dtype=np.int32), 0
        while len(frontier):
            reached = self._next[(self._row[frontier][:, None] + np.arange(256, dtype=np.int32)).ravel()]
            reached = reached[~seen[reached]]  # most transitions fall back to known states: drop them before sorting
            frontier = np.unique(reached)
            seen[frontier] = True
            depth += len(frontier) > 0
        return depth

    def _visit_counts_many(self, encoded: list[bytes]) -> list[tuple[np.ndarray, np.ndarray] | None]:
        """py3langid's `visit_counts` for every text, as (feature ids, counts) in first-occurrence order, or None."""
        sep = bytes([_SEPARATOR]) * self._depth
        data = np.frombuffer(sep.join(encoded), dtype=np.uint8).astype(np.int32)
        starts = np.cumsum([0] + [len(e) + len(sep) for e in encoded[:-1]])
        state = np.zeros(len(data), dtype=np.int32)
        byte = np.empty_like(data)
        for back in range(self._depth - 1, -1, -1):  # walk each window from its oldest byte to its newest
            byte[:back] = _SEPARATOR
            byte[back:] = data[: max(0, len(data) - back)]
            state = self._next[self._row[state] + byte]
        features = self._out[state]
        where = np.flatnonzero(features >= 0)
        n_features = len(self._ptc32)
        keys = (np.searchsorted(starts, where, side="right") - 1).astype(np.int64) * n_features + features[where]
        unique, first, counts = np.unique(keys, return_index=True, return_counts=True)
        order = np.argsort(first, kind="stable")  # by document, then first occurrence
        unique, counts = unique[order], counts[order].astype(np.float32)
        bounds = np.searchsorted(unique // n_features, np.arange(len(encoded) + 1))
        feature_ids = (unique % n_features).astype(np.intp)
        return [(feature_ids[a:z], counts[a:z]) if z > a else None for a, z in zip(bounds, bounds[1:])]

    def classify_many(self, texts: list[str], chunk_bytes: int = 1 << 20) -> list[tuple[str, float]]:
        """`classify` for each text, the automaton walked once per chunk of about `chunk_bytes` of text
        (numpy's temporaries take ~30 bytes per byte of text)."""
        results: list[tuple[str, float]] = []
        for chunk in chunks(map(self._encode, texts), chunk_bytes):
            self._visits = dict(zip(chunk, self._visit_counts_many(chunk)))
            try:
                results.extend(self.classify(e) for e in chunk)
            finally:
                self._visits = {}
        return results

    def _raw_score(self, text):
        visits = self._visits.get(text)
        if visits is None:  # not in this batch, or featureless: py3langid's own walk and fill value
            return super()._raw_score(text)
        features, counts = visits
        return np.log1p(counts) @ self._ptc32[features] + self.nb_pc  # py3langid's _sparse_score


@lru_cache(maxsize=1)
def _identifier() -> BatchIdentifier:
    return BatchIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


# The codes py3langid's model answers (its `nb_classes`), listed here so that parsing a config, which checks the
# codes it names, does not load the model (1.1 s a process); a test keeps the list equal to the model's.
LANGUAGES = frozenset(
    "ace af am an ar ary arz as az ba bcl be bg bn br bs ca crh cs cy da de dz el en eo es et eu ext fa fi fo fr fuv fy "
    "ga gcf gcr gd gl gom grc gu gug guw ha hbo he hi hr ht hu hy id ig is it ja jv ka kab kik kk km kn ko ku ky la lb "
    "lg lij ln lo lt ltg lv mg mk ml mn mr ms mt my ne nl nn no nso oc om or pa pcm pl ps pt qu ro ru rw sa sdh se si "
    "sk sl sn so sq sr st sv sw ta te tg th tk tl tr tt ug uk ur uz uzs vec vi vo wa wuu xh yo yue zh zu zxx".split())


def identify(text: str, max_chars: int = 4000) -> tuple[str, float]:
    """(ISO 639-1 code, probability). The head of a long document is enough and keeps this fast."""
    return identify_many([text], max_chars)[0]


def identify_many(texts: list[str], max_chars: int = 4000) -> list[tuple[str, float]]:
    return [(lang, float(prob)) for lang, prob in _identifier().classify_many([t[:max_chars] for t in texts])]


@dataclass
class LanguageFilter:
    name: ClassVar[str] = "language"
    languages: Annotated[list[str], MinLen(1)] = field(default_factory=lambda: ["en"])  # none would drop everything
    min_score: Fraction = 0.65  # a probability; FineWeb keeps English with fastText score >= 0.65
    max_chars: PositiveInt = 4000

    def __post_init__(self):
        unknown = [lang for lang in self.languages if lang not in LANGUAGES]
        if unknown:
            raise ValueError(f"unknown language code(s) {unknown}; py3langid knows ISO 639-1 codes such as en, de, fr, zh")

    def __call__(self, doc: Document) -> Verdict:
        return self.batch([doc])[0]

    def batch(self, docs: list[Document]) -> list[Verdict]:
        verdicts = []
        for doc, (lang, prob) in zip(docs, identify_many([d.text for d in docs], self.max_chars)):
            doc.meta["language"], doc.meta["language_score"] = lang, round(prob, 4)
            doc.identified_language = lang
            if lang not in self.languages:
                verdicts.append(drop(self.name, "other_language", doc.text))
            elif prob < self.min_score:
                verdicts.append(drop(self.name, "low_confidence", doc.text))
            else:
                verdicts.append(keep(doc.text))
        return verdicts
