"""Curation steps by name: the names a config's filter profiles use.

`from kiln.curation.filters.registry import build_step; build_step("gopher_quality", {"min_doc_words": 20})`
"""

from __future__ import annotations

import dataclasses
from typing import Any

from kiln.curation.filters.badwords import BadWords
from kiln.curation.filters.base import Step
from kiln.curation.filters.c4 import C4
from kiln.curation.filters.code import CodeQuality
from kiln.curation.filters.fineweb import FineWebQuality
from kiln.curation.filters.garbage import Garbage
from kiln.curation.filters.gopher import GopherQuality, GopherRepetition
from kiln.curation.filters.language import LanguageFilter
from kiln.curation.filters.normalize import UnicodeNormalize
from kiln.curation.filters.url import UrlBlocklist
from kiln.curation.pii import PiiRedaction

STEPS: dict[str, type] = {
    cls.name: cls
    for cls in (
        UnicodeNormalize,
        UrlBlocklist,
        LanguageFilter,
        GopherQuality,
        GopherRepetition,
        C4,
        FineWebQuality,
        Garbage,
        BadWords,
        CodeQuality,
        PiiRedaction,
    )
}


def step_parameters(name: str) -> dict[str, Any]:
    """The parameters a step takes, with their defaults (the published thresholds)."""
    out = {}
    for f in dataclasses.fields(STEPS[name]):
        if f.default is not dataclasses.MISSING:
            out[f.name] = f.default
        elif f.default_factory is not dataclasses.MISSING:
            out[f.name] = f.default_factory()
    return out


def build_step(name: str, params: dict[str, Any] | None = None) -> Step:
    """Instantiate a step; unknown names or parameters raise ValueError saying what is allowed."""
    if name not in STEPS:
        raise ValueError(f"unknown step {name!r}; allowed: {', '.join(sorted(STEPS))}")
    params = dict(params or {})
    allowed = step_parameters(name)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"step {name!r} has no parameter(s) {unknown}; allowed: {', '.join(sorted(allowed))}")
    return STEPS[name](**params)


__all__ = ["STEPS", "build_step", "step_parameters"]
