"""The base of every settings model (the project config's sections, training's settings and run config): unknown
keys refused, frozen, and numbers that are numbers.

Pydantic's lax mode reads `true` as 1 and accepts `.inf` and `.nan` for floats, so `max_steps: true` trained one
step and `schedule.lr: .inf` diverged at the first one. YAML reads yes/no/on/off as booleans too. Here a boolean is
refused wherever the field's type does not admit one, and infinities and NaN are refused for every float.

Imports pydantic only: training_jobs.settings, which the project config imports, builds on it.
"""

from __future__ import annotations

import types
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
    return any(admits_bool(a) for a in typing.get_args(annotation) if isinstance(a, (type, types.GenericAlias))
               or typing.get_origin(a) is not None or a is Any)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    @field_validator("*", mode="before")
    @classmethod
    def _numbers_are_not_booleans(cls, value: Any, info: ValidationInfo) -> Any:
        if isinstance(value, bool) and info.field_name is not None and not admits_bool(
                cls.model_fields[info.field_name].annotation):
            raise ValueError("this key takes no true/false (YAML reads yes/no/on/off as booleans too); write its "
                             "value as a number or a word it allows")
        return value
