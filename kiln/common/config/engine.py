"""Config section `engine`: where the per-document stages run (Ray or a local process pool)."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from kiln.common.config.base import Strict


class EngineSettings(Strict):
    """Where the per-document stages run (kiln.engine): Ray, or a process pool on this machine."""

    backend: Literal["ray", "processes"] = "ray"
    # unset: Ray's own RAY_ADDRESS, else an embedded local Ray; `auto` or `host:port` (the head's GCS address)
    ray_address: str | None = None
    workers: int = Field(0, ge=0)  # concurrent part tasks; 0 = every CPU of the cluster (pool: of this machine)

    @field_validator("ray_address")
    @classmethod
    def _not_empty(cls, value):
        return value or None
