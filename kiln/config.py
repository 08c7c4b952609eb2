"""The one project config model: sources, filter profiles, reading and curation settings.

Loaded from YAML (`KILN_CONFIG`, default `configs/default.yaml`) and validated with pydantic; a bad
value fails with `ConfigError` naming the key, the value given and what is allowed.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from kiln.filters.registry import build_step, step_parameters
from kiln.planning.plan import PlanRequest

DEFAULT_CONFIG = "configs/default.yaml"

SourceKind = Literal["jsonl", "parquet", "text", "warc", "wet", "builtin"]
Domain = Literal["web", "code", "reference", "docs", "books", "academic", "legal", "conversational", "other"]
BuiltinCorpus = Literal["python_docs", "package_readmes", "package_licenses", "stdlib_code"]


class ConfigError(ValueError):
    """A config that cannot be used; the message says which key, what was given, and what is allowed."""


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class StepSpec(_Strict):
    """One curation step in a profile: a registered step name plus parameter overrides."""

    step: str
    params: dict[str, Any] = Field(default_factory=dict)


class Source(_Strict):
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

    @model_validator(mode="after")
    def _path_or_corpus(self):
        if self.kind == "builtin" and self.corpus is None:
            raise ValueError(f"source {self.name!r} has kind 'builtin' but no 'corpus'; set corpus to one of "
                             f"{', '.join(BuiltinCorpus.__args__)}")
        if self.kind != "builtin" and not self.path:
            raise ValueError(f"source {self.name!r} has kind {self.kind!r} but no 'path' (a file, directory or glob)")
        return self


class Reading(_Strict):
    max_document_bytes: int = Field(5_000_000, gt=0)  # larger records are quarantined as too_large
    rows_per_part: int = Field(2_000, gt=0)  # documents per Parquet part: the unit of parallel work


class ExactDedup(_Strict):
    enabled: bool = True
    lowercase: bool = True
    collapse_whitespace: bool = True


class Curation(_Strict):
    normalize: dict[str, Any] = Field(default_factory=dict)  # parameters of the `normalize` step
    pii: dict[str, Any] = Field(default_factory=dict)  # parameters of the `pii` step (runs last)
    exact_dedup: ExactDedup = ExactDedup()
    workers: int = Field(0, ge=0)  # processes per partition; 0 means one per core
    examples_per_reason: int = Field(3, ge=0, le=20)

    @field_validator("normalize", "pii")
    @classmethod
    def _valid_step_params(cls, value, info):
        build_step(info.field_name, value)
        return value


class ProjectConfig(_Strict):
    sources: list[Source] = Field(min_length=1)
    profiles: dict[str, list[StepSpec]]
    reading: Reading = Reading()
    curation: Curation = Curation()
    planning: PlanRequest = PlanRequest()  # `kiln plan` and the training_plan asset start from these

    @field_validator("profiles", mode="before")
    @classmethod
    def _parse_profiles(cls, value):
        """Accept `- gopher_quality` or `- gopher_quality: {min_doc_words: 20}` and check each step."""
        if not isinstance(value, dict):
            return value
        parsed = {}
        for profile, steps in value.items():
            if not isinstance(steps, list):
                raise ValueError(f"profile {profile!r} must be a list of steps, got {steps!r}")
            specs = []
            for i, item in enumerate(steps):
                if isinstance(item, str):
                    name, params = item, {}
                elif isinstance(item, dict) and len(item) == 1:
                    (name, params), = item.items()
                    params = params or {}
                else:
                    raise ValueError(f"profiles.{profile}[{i}]: expected a step name or {{name: {{params}}}}, got {item!r}")
                try:
                    build_step(name, params)
                except (TypeError, ValueError) as exc:
                    raise ValueError(f"profiles.{profile}[{i}] ({name}): {exc}") from None
                specs.append({"step": name, "params": params})
            parsed[profile] = specs
        return parsed

    @model_validator(mode="after")
    def _consistent(self):
        names = [s.name for s in self.sources]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"source names must be unique; repeated: {dupes}")
        for s in self.sources:
            if s.profile not in self.profiles:
                raise ValueError(f"source {s.name!r} uses profile {s.profile!r}, which is not defined; "
                                 f"defined profiles: {sorted(self.profiles)}")
        return self

    def source(self, name: str) -> Source:
        for s in self.sources:
            if s.name == name:
                return s
        raise KeyError(f"no source named {name!r}; sources: {[s.name for s in self.sources]}")

    def profile_for(self, source: str) -> list[StepSpec]:
        return self.profiles[self.source(source).profile]


def kiln_home() -> Path:
    """Where Kiln keeps data, checkpoints, Dagster and MLflow state (`KILN_HOME`, default ./.kiln)."""
    return Path(os.environ.get("KILN_HOME", ".kiln")).resolve()


def config_path() -> Path:
    return Path(os.environ.get("KILN_CONFIG", DEFAULT_CONFIG))


def load_config(path: str | Path | None = None) -> ProjectConfig:
    path = Path(path) if path is not None else config_path()
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found; set KILN_CONFIG or create {DEFAULT_CONFIG}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    return parse_config(raw or {}, origin=str(path))


def parse_config(raw: dict[str, Any], origin: str = "<config>") -> ProjectConfig:
    try:
        return ProjectConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: invalid config\n" + "\n".join(_describe(e) for e in exc.errors())) from None


def _describe(error: dict[str, Any]) -> str:
    key = "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in error["loc"]).lstrip(".") or "(top level)"
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden":
        parent_fields = _fields_at(error["loc"][:-1])
        close = difflib.get_close_matches(str(error["loc"][-1]), parent_fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; allowed keys: {', '.join(parent_fields)}" if parent_fields else "")
        return f"  {key}: unknown key{hint}"
    given = error.get("input")
    shown = "" if isinstance(given, dict) else f" = {given!r}"
    return f"  {key}{shown}: {msg}"


def _fields_at(loc: tuple) -> list[str]:
    """The allowed keys of the model found at `loc` (for 'did you mean' hints)."""
    model: type[BaseModel] | None = ProjectConfig
    for part in loc:
        if model is None or isinstance(part, int):
            continue
        field = model.model_fields.get(part)
        if field is None:
            return []
        ann = field.annotation
        inner = getattr(ann, "__args__", (ann,))
        model = next((a for a in inner if isinstance(a, type) and issubclass(a, BaseModel)), None)
    return sorted(model.model_fields) if model else []


__all__ = ["ConfigError", "ProjectConfig", "Source", "StepSpec", "kiln_home", "load_config",
           "parse_config", "step_parameters"]
