"""Curation steps by name: the names a config's filter profiles use.

`from kiln.curation.filters.registry import build_step; build_step("gopher_quality", {"min_doc_words": 20})`

Settings per language: a step is judged with the settings of each document's language, the `language` meta key the
language step writes (documents without one get the step's own settings). For a language, a step's parameters are
its published defaults, replaced by the language's defaults (kiln.curation.filters.stopwords: Gopher's stop words
and word lengths per language), by the profile's parameters, then by the profile's `per_language` entry for it.

Every setting is checked when the step is built (at config load): the parameters exist, each value has its field's
type and lies in its range (the bounds its type carries, e.g. a `Fraction` from 0 to 1), and the step's own checks
pass (a minimum not above its maximum).
"""

from __future__ import annotations

import dataclasses
import types
import typing
from collections import defaultdict
from functools import cache
from typing import Annotated, Any

from pydantic import TypeAdapter, ValidationError

from kiln.common.strict import NO_BOOLEAN, misplaced_boolean, non_finite_in
from kiln.curation.documents import Document

from kiln.curation.filters.badwords import BadWords
from kiln.curation.filters.base import Step, Verdict
from kiln.curation.filters.c4 import C4
from kiln.curation.filters.code import CodeQuality
from kiln.curation.filters.fineweb import FineWebQuality
from kiln.curation.filters.garbage import Garbage
from kiln.curation.filters.gopher import GopherQuality, GopherRepetition
from kiln.curation.filters.language import LanguageFilter
from kiln.curation.filters.normalize import UnicodeNormalize
from kiln.curation.filters.stopwords import LANGUAGE_DEFAULTS, UNMEASURED_LANGUAGE
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


def step_params(name: str, params: dict[str, Any] | None, language: str | None,
                per_language: dict[str, dict[str, Any]] | None = None) -> dict[str, Any]:
    """The parameters `name` runs with on documents in `language` (None: documents without one)."""
    if language is None:
        return dict(params or {})
    defaults = LANGUAGE_DEFAULTS.get(name, {}).get(language)
    if defaults is None and language != "en":  # English: the step's published defaults are its own
        defaults = UNMEASURED_LANGUAGE.get(name, {})
    return {**(defaults or {}), **(params or {}), **(per_language or {}).get(language, {})}


@cache
def _checker(cls: type) -> TypeAdapter:
    return TypeAdapter(cls)


_BOUND_WORDS = {"ge": "at least", "gt": "over", "le": "at most", "lt": "under"}


def _allowed(cls: type, loc: tuple) -> str:
    """The range the value at `loc` (a field, then indices into its tuples) must lie in, in words ("at least 0 and at
    most 1", and "or null" where the field may be None), from the bounds its type carries; "" if it has none."""
    hint = typing.get_type_hints(cls, include_extras=True).get(loc[0])
    bounds: dict[str, Any] = {}
    nullable = False
    for depth, index in enumerate((*loc[1:], None)):
        if typing.get_origin(hint) in (typing.Union, types.UnionType):  # X | None
            args = [a for a in typing.get_args(hint) if a is not type(None)]
            nullable = depth == 0 and len(args) < len(typing.get_args(hint))
            hint = args[0] if len(args) == 1 else None
        if typing.get_origin(hint) is Annotated:
            for meta in hint.__metadata__:
                bounds.update({k: getattr(meta, k) for k in _BOUND_WORDS if getattr(meta, k, None) is not None})
            hint = typing.get_args(hint)[0]
        if index is None or not isinstance(index, int):
            break
        bounds, nullable = {}, False  # an element of a tuple or list: its own bounds
        args = typing.get_args(hint)
        hint = args[0] if len(args) == 1 or (len(args) == 2 and args[1] is Ellipsis) else \
            args[index] if index < len(args) else None
    if not bounds:
        return ""
    return " and ".join(f"{_BOUND_WORDS[k]} {v!r}" for k, v in bounds.items()) + (", or null" if nullable else "")


def _problem(cls: type, error: dict[str, Any], defaults: dict[str, Any]) -> str:
    """One of pydantic's errors as the config's reader needs it: the parameter, what is wrong, what was given, the
    range allowed (for a value out of it), the default (a step's own check, in __post_init__, names no parameter:
    its message says it all)."""
    msg = error["msg"].removeprefix("Value error, ")
    if not error["loc"]:
        return msg
    name = error["loc"][0]
    allowed = _allowed(cls, error["loc"]) if error["type"] in ("greater_than", "greater_than_equal", "less_than",
                                                                 "less_than_equal") else ""
    return (f"{'.'.join(map(str, error['loc']))}: {msg} (given {error['input']!r}"
            + (f"; allowed: {allowed}" if allowed else "")
            + (f"; default {defaults[name]!r})" if name in defaults else ")"))


def _instantiate(name: str, params: dict[str, Any]) -> Step:
    allowed = step_parameters(name)
    unknown = sorted(set(params) - set(allowed))
    if unknown:
        raise ValueError(f"step {name!r} has no parameter(s) {unknown}; allowed: {', '.join(sorted(allowed))}")
    # What a model's fields refuse (kiln.common.strict), for a step's: lax validation reads `off` as 0 and lets a
    # threshold of .inf (which judges nothing) through.
    hints = typing.get_type_hints(STEPS[name], include_extras=True)
    booleans = {k for k, v in params.items() if misplaced_boolean(v, hints.get(k, Any)) is not None}
    problems = {k: NO_BOOLEAN if k in booleans else "must be a finite number"
                for k, v in params.items() if k in booleans or non_finite_in(v)}
    if problems:
        raise ValueError("; ".join(f"{k}: {why} (given {params[k]!r}; default {allowed[k]!r})"
                                   for k, why in problems.items()))
    try:  # each value against its field's type, when the config loads rather than at the first document
        _checker(STEPS[name]).validate_python(params)
    except ValidationError as exc:
        raise ValueError("; ".join(_problem(STEPS[name], e, allowed) for e in exc.errors())) from None
    return STEPS[name](**params)  # as given: the check above only refuses


class PerLanguage:
    """A step judging each document with its language's settings: one instance per language met (built when first
    met), a batch split by language and each part given to its instance's batch form."""

    def __init__(self, name: str, params: dict[str, Any], per_language: dict[str, dict[str, Any]]):
        self.name = name
        self._params, self._per_language = params, per_language
        self.base = _instantiate(name, params)  # the profile's parameters: a problem there is theirs
        self._by_language: dict[str, Step] = {}
        for language in sorted({*LANGUAGE_DEFAULTS.get(name, {}), *per_language}):  # every setting checked up front
            try:
                self.for_language(language)
            except ValueError as exc:  # said as where the language's settings come from
                raise ValueError(
                    f"per_language.{language}: {exc}" if language in per_language else
                    f"settings for {language!r} documents (Kiln's defaults for the language, in "
                    f"kiln.curation.filters.stopwords, then the profile's parameters; per_language.{language} can set "
                    f"any of them): {exc}") from None

    def for_language(self, language: str | None) -> Step:
        if language is None:
            return self.base
        if language not in self._by_language:
            params = step_params(self.name, self._params, language, self._per_language)
            self._by_language[language] = self.base if params == self._params else _instantiate(self.name, params)
        return self._by_language[language]

    def __call__(self, doc: Document) -> Verdict:
        return self.batch([doc])[0]

    def batch(self, docs: list[Document]) -> list[Verdict]:
        groups: dict[str | None, list[int]] = defaultdict(list)
        for i, doc in enumerate(docs):
            groups[doc.identified_language].append(i)  # None before a `language` step, or without one
        verdicts: list[Verdict | None] = [None] * len(docs)
        for language, indices in groups.items():
            step = self.for_language(language)
            part = [docs[i] for i in indices]
            batch_form = getattr(step, "batch", None)
            for i, verdict in zip(indices, batch_form(part) if batch_form is not None else map(step, part)):
                verdicts[i] = verdict
        return verdicts


def build_step(name: str, params: dict[str, Any] | None = None,
               per_language: dict[str, dict[str, Any]] | None = None) -> Step:
    """Instantiate a step (per language where it has language defaults or `per_language` settings); unknown names
    or parameters raise ValueError saying what is allowed."""
    if name not in STEPS:
        raise ValueError(f"unknown step {name!r}; allowed: {', '.join(sorted(STEPS))}")
    params = dict(params or {})
    if per_language or name in LANGUAGE_DEFAULTS:
        return PerLanguage(name, params, dict(per_language or {}))
    return _instantiate(name, params)


def unwrapped(step: Step) -> Step:
    """The step itself, for a step built per language: its instance for documents without a language."""
    return getattr(step, "base", step)


__all__ = ["STEPS", "PerLanguage", "build_step", "step_parameters", "step_params", "unwrapped"]
