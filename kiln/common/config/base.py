"""What every config section shares: strict, frozen models, the one config error, and where Kiln lives."""

from __future__ import annotations

import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict

DEFAULT_CONFIG = "configs/default.yaml"


class ConfigError(ValueError):
    """A config that cannot be used; the message says which key, what was given, and what is allowed."""


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def kiln_home() -> Path:
    """Where Kiln keeps data, checkpoints, Dagster and MLflow state (`KILN_HOME`, default ./.kiln)."""
    return Path(os.environ.get("KILN_HOME", ".kiln")).resolve()


def config_path() -> Path:
    return Path(os.environ.get("KILN_CONFIG", DEFAULT_CONFIG))
