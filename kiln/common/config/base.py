"""What every config section shares: strict, frozen models (`kiln.common.strict`), the one config error, and where
Kiln lives."""

from __future__ import annotations

import os
from pathlib import Path

from kiln.common.strict import Strict

__all__ = ["DEFAULT_CONFIG", "ConfigError", "Strict", "config_path", "kiln_home"]

DEFAULT_CONFIG = "configs/default.yaml"


class ConfigError(ValueError):
    """A config that cannot be used; the message says which key, what was given, and what is allowed."""


def kiln_home() -> Path:
    """Where Kiln keeps data, checkpoints, Dagster and MLflow state (`KILN_HOME`, default ./.kiln; set but empty, as
    `KILN_HOME= cmd` leaves it, counts as unset, not as the current folder)."""
    return Path(os.environ.get("KILN_HOME") or ".kiln").resolve()


def config_path() -> Path:
    return Path(os.environ.get("KILN_CONFIG") or DEFAULT_CONFIG)
