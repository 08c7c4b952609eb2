"""Language identification with py3langid, whose model ships inside the wheel (works offline)."""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache
from typing import ClassVar

from kiln.documents import Document
from kiln.filters.base import Verdict, drop, keep


@lru_cache(maxsize=1)
def _identifier():
    from py3langid.langid import MODEL_FILE, LanguageIdentifier

    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


def identify(text: str, max_chars: int = 4000) -> tuple[str, float]:
    """(ISO 639-1 code, probability). The head of a long document is enough and keeps this fast."""
    lang, prob = _identifier().classify(text[:max_chars])
    return lang, float(prob)


@dataclass
class LanguageFilter:
    name: ClassVar[str] = "language"
    languages: list[str] = field(default_factory=lambda: ["en"])
    min_score: float = 0.65  # FineWeb keeps English with fastText score >= 0.65
    max_chars: int = 4000

    def __post_init__(self):
        known = set(_identifier().nb_classes)
        unknown = [lang for lang in self.languages if lang not in known]
        if unknown:
            raise ValueError(f"unknown language code(s) {unknown}; py3langid knows ISO 639-1 codes such as en, de, fr, zh")

    def __call__(self, doc: Document) -> Verdict:
        lang, prob = identify(doc.text, self.max_chars)
        doc.meta["language"], doc.meta["language_score"] = lang, round(prob, 4)
        if lang not in self.languages:
            return drop(self.name, "other_language", doc.text)
        if prob < self.min_score:
            return drop(self.name, "low_confidence", doc.text)
        return keep(doc.text)
