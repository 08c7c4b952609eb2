"""The base of every settings model (the project config's sections, training's settings and run config): unknown
keys refused, frozen, and numbers that are numbers.

Pydantic's lax mode reads `true` as 1 and accepts `.inf` and `.nan` for floats, so `max_steps: true` trained one
step and `schedule.lr: .inf` diverged at the first one. YAML reads yes/no/on/off as booleans too. Here a boolean is
refused wherever the field's type does not admit one (in a mapping's values and a list's items too), and infinities
and NaN are refused for every float. The filter registry applies the same two rules to a step's parameters.

Imports pydantic only: training_jobs.settings, which the project config imports, builds on it.
"""

from __future__ import annotations

import math
import typing
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


def admits_bool(annotation: Any) -> bool:
    """Whether a field of this type may hold true/false (bool itself, Any, a Literal of booleans, or a union,
    container or Annotated type with one of those inside)."""
    if annotation is bool or annotation is Any or annotation is object:
        return True
    if typing.get_origin(annotation) is Literal:
        return any(isinstance(v, bool) for v in typing.get_args(annotation))
    return any(admits_bool(a) for a in typing.get_args(annotation))


def _holds_model(annotation: Any) -> bool:
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return True
    return any(_holds_model(a) for a in typing.get_args(annotation))


def _where(value: Any, test, path: str = "") -> str | None:
    """Where in `value` (itself: "", else a mapping's key or a list's index, at any depth: "web", "[2]") the first
    part that passes `test` is; None if none does."""
    if isinstance(value, dict):
        items = ((f"{path}.{k}" if path else str(k), v) for k, v in value.items())
    elif isinstance(value, list | tuple):
        items = ((f"{path}[{i}]", v) for i, v in enumerate(value))
    else:
        return path if test(value) else None
    return next((found for where, item in items if (found := _where(item, test, where)) is not None), None)


def non_finite_in(value: Any) -> bool:
    """Whether `value` is, or holds, an infinity or NaN (what `allow_inf_nan=False` refuses in a model's fields)."""
    return _where(value, lambda v: isinstance(v, float) and not math.isfinite(v)) is not None


def misplaced_boolean(value: Any, annotation: Any) -> str | None:
    """Where `value` is, or holds (a mapping's values, a list's items: `mixture.weights: {web: yes}`), a boolean a
    field of this type does not admit ("" for the value itself, "web" for a mapping's); None if it does not. A
    section's own fields are its model's to judge."""
    if admits_bool(annotation) or _holds_model(annotation):
        return None
    return _where(value, lambda v: isinstance(v, bool))


NO_BOOLEAN = ("takes no true/false (YAML reads yes/no/on/off as booleans too); write a number, a word it allows (in "
              "quotes where YAML would read it as a boolean: \"no\", Norwegian's language code), or null where it may "
              "be unset")
# A mapping's key YAML read as a boolean or a number (`no:`, Norwegian's language code; `on:`; `1:`): what to write.
BOOLEAN_KEY = "YAML reads an unquoted yes/no/on/off/true/false as a boolean: write the key in quotes (\"no\": ...)"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        if info.field_name is None:
            return value
        if (where := misplaced_boolean(value, cls.model_fields[info.field_name].annotation)) is not None:
            raise ValueError(f"this key {NO_BOOLEAN}" + (f" (at {where})" if where else ""))
        return value
