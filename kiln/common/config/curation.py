"""Config sections `sources`, `profiles` (their steps), `reading` and `curation`: what is read and how it is curated."""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_validator, model_validator

from kiln.common.config.base import Strict
from kiln.common.removals import RejectedText
from kiln.curation.filters.registry import build_step

SourceKind = Literal["jsonl", "parquet", "text", "warc", "wet", "html", "builtin"]
# How HTML becomes text (kiln.curation.readers.html): main content by trafilatura or resiliparse, or every visible
# string (`visible_text`, the reader before main-content extraction)
HtmlExtractor = Literal["trafilatura", "resiliparse", "visible_text"]
Domain = Literal["web", "code", "reference", "docs", "books", "academic", "legal", "conversational", "other"]
BuiltinCorpus = Literal["python_docs", "package_readmes", "package_licenses", "stdlib_code", "multilingual"]


class StepSpec(Strict):
    """One curation step in a profile: a registered step name plus parameter overrides."""

    step: str
    params: dict[str, Any] = Field(default_factory=dict)
    # language code -> parameters for documents the language step identified as that language
    per_language: dict[str, dict[str, Any]] = Field(default_factory=dict)


class Source(Strict):
    name: str = Field(pattern=r"^[a-z][a-z0-9_]{0,62}$")
    kind: SourceKind
    path: str | None = None  # file, directory or glob; local or s3://bucket/prefix
    corpus: BuiltinCorpus | None = None  # which embedded corpus, for kind: builtin
    license: str
    domain: Domain
    quality_tier: int = Field(2, ge=1, le=5)  # 1 is the best; decides which copy of a duplicate is kept
    profile: str
    text_field: str = "text"
    id_field: str | None = "id"
    url_field: str | None = "url"
    max_documents: int | None = Field(None, gt=0)
    html_field: str | None = None  # jsonl / parquet: the field holding a page's HTML, extracted into the text
    html_extractor: HtmlExtractor | None = None  # this source's HTML extractor instead of reading.html.extractor

    @model_validator(mode="after")
    def _path_or_corpus(self):
        if self.kind == "builtin" and self.corpus is None:
            raise ValueError(f"source {self.name!r} has kind 'builtin' but no 'corpus'; set corpus to one of "
                             f"{', '.join(BuiltinCorpus.__args__)}")
        if self.kind != "builtin" and not self.path:
            raise ValueError(f"source {self.name!r} has kind {self.kind!r} but no 'path' (a file, directory or glob)")
        if self.html_field and self.kind not in ("jsonl", "parquet"):
            raise ValueError(f"source {self.name!r}: html_field is for kind jsonl or parquet (records with a field of "
                             f"HTML), not {self.kind!r}; for files of HTML use kind: html")
        return self


class HtmlReading(Strict):
    # what reads HTML pages (WARC responses, kind: html, html_field); a source's html_extractor overrides it.
    # resiliparse: the only one at precision >= 0.95 and recall >= 0.90 on 4,930 pages of 12 generators, and ~9x
    # trafilatura's speed (bench/extraction_bench.py, docs/bench/extraction_bench.txt)
    extractor: HtmlExtractor = "resiliparse"


class Reading(Strict):
    max_document_bytes: int = Field(5_000_000, gt=0)  # larger records are quarantined as too_large
    rows_per_part: int = Field(2_000, gt=0)  # documents per Parquet part: the unit of parallel work
    # A record whose strings are not valid Unicode (JSON may escape a lone UTF-16 surrogate, "\ud800"): quarantined
    # as invalid_unicode, or kept with each such code point replaced by U+FFFD (`replace`)
    unicode_errors: Literal["quarantine", "replace"] = "quarantine"
    html: HtmlReading = HtmlReading()


class ExactDedup(Strict):
    enabled: bool = True
    lowercase: bool = True
    collapse_whitespace: bool = True


class Curation(Strict):
    normalize: dict[str, Any] = Field(default_factory=dict)  # parameters of the `normalize` step
    pii: dict[str, Any] = Field(default_factory=dict)  # parameters of the `pii` step (runs last)
    exact_dedup: ExactDedup = ExactDedup()
    examples_per_reason: int = Field(3, ge=0, le=20)
    # What a document removed after intake keeps of its text, in the rejected tables and removal examples
    # (kiln.common.removals): none (default), a PII-redacted `excerpt`, or the `full` text, PII-redacted; true = full
    keep_rejected_text: RejectedText = "none"

    @field_validator("keep_rejected_text", mode="before")
    @classmethod
    def _boolean_rejected_text(cls, value):
        return {True: "full", False: "none"}.get(value, value) if isinstance(value, bool) else value

    @field_validator("normalize", "pii")
    @classmethod
    def _valid_step_params(cls, value, info):
        build_step(info.field_name, value)
        return value
