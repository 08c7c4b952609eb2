"""Reading a config: YAML files (with `extends`), validation, and errors that name the key and the fix."""

from __future__ import annotations

import difflib
import os
import re
import types
import typing
from pathlib import Path
from typing import Annotated, Any, Union

import yaml
from pydantic import BaseModel, ValidationError

from kiln.common.config.base import DEFAULT_CONFIG, ConfigError, config_path
from kiln.common.config.project import ProjectConfig
from kiln.common.strict import BOOLEAN_KEY

# Keys that moved; an old config fails with where they live now.
MOVED_KEYS = {("curation", "workers"): "engine.workers", ("dedup", "workers"): "engine.workers",
              ("shards", "workers"): "engine.workers"}
# Keys that are gone; an old config fails with what to do instead.
REMOVED_KEYS = {("dedup", "near", "index"): "removed: the near-dup index is now part of each refresh's dedup_index "
                                            "dataset (on the store, local or S3; no Redis). Delete dedup.near.index "
                                            "from the config, and run `kiln dedup migrate-index` once if this store "
                                            "was indexed before"}
# Keys that say one thing two ways, of which a config sets one: a file (or change) that sets one replaces the others
# of the config it extends, as it would replace the same key (a file extending default.yaml, max_steps: 300, with
# token_budget: 1e9 trains on the budget).
ALTERNATIVE_KEYS = {("training",): ({"max_steps", "token_budget"},)}


class _UniqueKeys(yaml.SafeLoader):
    """YAML's safe loader, refusing a key given twice in one mapping (plain YAML keeps the last one silently: a second
    `storage:` block dropped the first's `backend: s3`). Keys a `<<` merge brings in may be overridden, as YAML means."""

    def construct_mapping(self, node, deep=False):
        if isinstance(node, yaml.MappingNode):
            first: dict[Any, int] = {}
            for key_node, _ in node.value:
                if key_node.tag == "tag:yaml.org,2002:merge":
                    continue
                key = self.construct_object(key_node, deep=deep)
                try:
                    line = first.setdefault(key, key_node.start_mark.line)
                except TypeError:  # an unhashable key: the base loader names it
                    continue
                if line != key_node.start_mark.line:
                    raise yaml.constructor.ConstructorError(
                        None, None, f"key {key!r} is given twice (lines {line + 1} and "
                        f"{key_node.start_mark.line + 1}); YAML would keep only the second: merge them into one",
                        key_node.start_mark)
        return super().construct_mapping(node, deep)


def load_config(path: str | Path | None = None) -> ProjectConfig:
    """The project config at `path` (default: $KILN_CONFIG). A file may start from another with
    `extends: other.yaml` (relative to itself): its keys are merged over the other's, mappings key by key,
    anything else (lists and empty mappings included) replaced, and a key of ALTERNATIVE_KEYS replaces its
    alternatives."""
    path = Path(path) if path is not None else config_path()
    return parse_config(_read_yaml(path), origin=str(path))


def _read_yaml(path: Path, seen: tuple[Path, ...] = ()) -> dict[str, Any]:
    try:
        raw = yaml.load(path.read_text(encoding="utf-8"), Loader=_UniqueKeys) or {}  # noqa: S506 (a safe loader)
    except FileNotFoundError:
        raise ConfigError(f"config file {str(path)!r} not found; {_not_found_hint(path, seen)}") from None
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not valid YAML: {exc}") from None
    except UnicodeDecodeError as exc:
        raise ConfigError(f"{path}: not UTF-8 text (byte {exc.start}: {exc.reason}); save the config as UTF-8") \
            from None
    except IsADirectoryError:
        where = f"extends {path.name!r} in {seen[-1]}" if seen else "KILN_CONFIG or the path given"
        raise ConfigError(f"{path}: a directory, not a config file; point {where} at a YAML file") from None
    except OSError as exc:  # no permission to read it, an I/O error: said, not a traceback
        raise ConfigError(f"{path}: cannot read the config file ({exc.strerror or exc}); give this user read "
                          f"access to it, or point {'extends' if seen else 'KILN_CONFIG or --config'} at a readable "
                          f"copy") from None
    if not isinstance(raw, dict):
        raise ConfigError(f"{path}: a config is a mapping of keys (sources, training, ...), got {type(raw).__name__}")
    parent = raw.pop("extends", None)
    if parent is None:
        return raw
    parent_path = (path.parent / str(parent)).resolve()
    if parent_path in seen or parent_path == path.resolve():
        raise ConfigError(f"{path}: extends {parent!r} makes a cycle ({' -> '.join(map(str, seen + (path,)))})")
    return merge_config(_read_yaml(parent_path, seen + (path.resolve(),)), raw)


def _not_found_hint(path: Path, seen: tuple[Path, ...]) -> str:
    """What to change for a config file that is not there: the file extending it, KILN_CONFIG, or the path given (a
    command's --config: KILN_CONFIG and configs/default.yaml are not what it read)."""
    if seen:
        return f"(extended by {seen[-1]})"
    if os.environ.get("KILN_CONFIG") and path == Path(os.environ["KILN_CONFIG"]):
        return f"KILN_CONFIG names it ({path.absolute()}); point KILN_CONFIG at the project's YAML file"
    if path == Path(DEFAULT_CONFIG):
        return f"set KILN_CONFIG or create {DEFAULT_CONFIG} (relative to the current folder, {Path.cwd()})"
    return f"no file at {path.absolute()}; check the path given (--config)"


def merge_config(base: dict[str, Any], override: dict[str, Any], _at: tuple[str, ...] = ()) -> dict[str, Any]:
    """`override` over `base`: mappings merge key by key; any other value, and an empty mapping, replaces; a key of
    ALTERNATIVE_KEYS set (not null) in `override` drops its alternatives from `base`."""
    out = dict(base)
    for group in ALTERNATIVE_KEYS.get(_at, ()):
        if any(override.get(key) is not None for key in group):
            for key in group - override.keys():
                out.pop(key, None)
    for key, value in override.items():
        out[key] = merge_config(out[key], value, (*_at, key)) if value and isinstance(value, dict) and \
            isinstance(out.get(key), dict) else value
    return out


def parse_config(raw: dict[str, Any], origin: str = "<config>") -> ProjectConfig:
    try:
        return ProjectConfig.model_validate(raw)
    except ValidationError as exc:
        raise ConfigError(f"{origin}: invalid config\n" + "\n".join(_describe_all(exc.errors()))) from None


def _describe_all(errors: list[dict[str, Any]]) -> list[str]:
    """One line per bad key. A key of several types (`enabled: true | auto`) gets one line saying each type it may
    take: pydantic reports each type it tried as an error of its own, its name in the path (`enabled.bool`)."""
    lines: list[str] = []
    merged: dict[str, int] = {}  # a union's key -> its line
    for error in errors:
        key, _, in_union = _locate(error["loc"])
        if in_union and key in merged:
            first = lines[merged[key]]
            lines[merged[key]] = f"{first} or {_union_msg(error).removeprefix('Input should be ')}"
            continue
        if in_union:
            merged[key] = len(lines)
            given = error.get("input")
            lines.append(f"  {key}{'' if isinstance(given, dict) else f' = {given!r}'}: {_union_msg(error)}")
            continue
        lines.append(_describe(error))
    return lines


def _union_msg(error: dict[str, Any]) -> str:
    """What one of a union's types says, without pydantic's how (", unable to parse string as an integer")."""
    return error["msg"].removeprefix("Value error, ").split(", unable to ")[0]


def _describe(error: dict[str, Any]) -> str:
    key, _, _ = _locate(error["loc"])
    key = key or "(top level)"
    msg = error["msg"].removeprefix("Value error, ")
    if error["type"] == "extra_forbidden" and tuple(error["loc"]) in MOVED_KEYS:
        return f"  {key}: moved to {MOVED_KEYS[tuple(error['loc'])]} (one setting for every stage); move it there"
    if error["type"] == "extra_forbidden" and tuple(error["loc"]) in REMOVED_KEYS:
        return f"  {key}: {REMOVED_KEYS[tuple(error['loc'])]}"
    if error["type"] == "extra_forbidden":
        parent_fields = _fields_at(error["loc"][:-1])
        close = difflib.get_close_matches(str(error["loc"][-1]), parent_fields, n=1)
        hint = f"; did you mean {close[0]!r}?" if close else (f"; allowed keys: {', '.join(parent_fields)}" if parent_fields else "")
        return f"  {key}: unknown key{hint}"
    if error["type"] == "invalid_key" or (error["loc"] and error["loc"][-1] == "[key]" and
                                          isinstance(error.get("input"), bool | int | float)):
        # a key YAML read as a boolean or a number (`on:`, `no:`, `1:`); pydantic's path has it as a number
        at = _locate(error["loc"][:-2 if error["loc"][-1] == "[key]" else -1])[0] or "(top level)"
        given = error.get("input")
        why = BOOLEAN_KEY if isinstance(given, bool) else f"keys are words: write it in quotes ('{given}': ...)"
        return f"  {at}: the key {given!r} is not a string; {why}"
    if error["loc"] and error["loc"][-1] == "[key]":  # a mapping whose keys are a fixed set: `special_tokens.bso`
        allowed = re.findall(r"'([^']*)'", str((error.get("ctx") or {}).get("expected", "")))
        close = difflib.get_close_matches(str(error.get("input")), allowed, n=1)
        hint = f"did you mean {close[0]!r}? " if close else ""
        return f"  {key}: unknown key; {hint}(allowed keys: {msg.removeprefix('Input should be ')})"
    given = error.get("input")
    shown = "" if isinstance(given, dict) else f" = {given!r}"
    return f"  {key}{shown}: {msg}"


def _choices(annotation: Any) -> list[Any]:
    """The types a value of this annotation may have: itself, or a union's members (Annotated and None aside)."""
    while typing.get_origin(annotation) is Annotated:
        annotation = typing.get_args(annotation)[0]
    if typing.get_origin(annotation) in (Union, types.UnionType):
        return [c for a in typing.get_args(annotation) if a is not type(None) for c in _choices(a)]
    return [annotation]


def _model_field(model: type[BaseModel], part: Any) -> tuple[str, Any] | None:
    """The field `part` names in `model` (by its name or, as YAML writes it, its alias): (key as written, type)."""
    for name, field in model.model_fields.items():
        if part in (name, field.alias):
            return field.alias or name, field.annotation
    return None


def _locate(loc: tuple) -> tuple[str, Any, bool]:
    """Where a pydantic error is, as the config writes it: `sources[0].license`, a field by its YAML name (its alias),
    without the type names pydantic adds for a key of several types (`training.compile.bool`) or after a mapping's
    key (`[key]`); the type found there (None where not known); and whether the error is one of a union's types."""
    key, annotation, in_union = "", ProjectConfig, False
    for part in loc:
        choices = _choices(annotation) if annotation is not None else [None]
        if len(choices) > 1:  # `part` names the member pydantic tried, not a key
            in_union = True
            annotation = next((c for c in choices if getattr(c, "__name__", None) == part), None)
            continue
        annotation = choices[0]
        origin, args = typing.get_origin(annotation), typing.get_args(annotation)
        found = _model_field(annotation, part) if isinstance(annotation, type) and issubclass(annotation, BaseModel) \
            else None
        if found:
            written, annotation = found
            key += f".{written}"
        elif isinstance(part, int):
            key += f"[{part}]"
            annotation = (args[part] if origin is tuple and part < len(args) and Ellipsis not in args
                          else args[0] if args else None)
        elif part == "[key]":  # pydantic's mark after a mapping's key that is not one it takes
            annotation = None
        elif origin is dict:
            key += f".{part}"
            annotation = args[1] if len(args) == 2 else None
        else:
            key += f".{part}"
            annotation = None
    return key.lstrip("."), annotation, in_union


def _fields_at(loc: tuple) -> list[str]:
    """The allowed keys (as YAML writes them) of the model found at `loc` (for 'did you mean' hints)."""
    _, found, _ = _locate(loc)
    choices = _choices(found) if found is not None else []
    model = next((c for c in choices if isinstance(c, type) and issubclass(c, BaseModel)), None)
    return sorted(f.alias or name for name, f in model.model_fields.items()) if model else []
