"""Config section `refresh`: the landing area for new raw data, its schedule, sensor and automation."""

from __future__ import annotations

from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from pydantic import Field, field_validator

from kiln.common.config.base import Strict, kiln_home


class RefreshSchedule(Strict):
    enabled: bool = True  # the schedule runs from the moment the code location loads (else: turn it on in the UI)
    cron: str = "0 3 * * 1"  # default weekly: Mondays 03:00
    timezone: str = "UTC"

    @field_validator("cron")
    @classmethod
    def _five_fields(cls, value):
        if len(value.split()) != 5:
            raise ValueError(f"{value!r} is not a cron expression of 5 fields (minute hour day month weekday), "
                             f"e.g. '0 3 * * 1' for Mondays 03:00")
        return value

    @field_validator("timezone")
    @classmethod
    def _known_timezone(cls, value):
        try:
            ZoneInfo(value)
        except (ZoneInfoNotFoundError, ValueError):
            raise ValueError(f"{value!r} is not an IANA time zone; write one such as 'UTC', 'Europe/Berlin' or "
                             f"'America/New_York'") from None
        return value


class RefreshSensor(Strict):
    enabled: bool = True  # the landing sensor runs from the moment the code location loads
    interval_seconds: int = Field(300, ge=30)  # how often the landing area is scanned
    settle_seconds: int = Field(60, ge=0)  # a file modified more recently may still be written: next scan


class RefreshSettings(Strict):
    """Periodic corpus refreshes. New files under `<landing>/<source>/` become a refresh: a new `refresh`
    partition of every document asset, deduplicated against everything earlier (exact hashes and the
    persistent MinHash index), and a new version of the token shards."""

    landing: str | None = None  # a folder or s3://bucket/prefix of <source>/ folders; None: KILN_HOME/landing
    schedule: RefreshSchedule = RefreshSchedule()  # scans the landing area on a cron
    sensor: RefreshSensor = RefreshSensor()  # scans it every few minutes
    automation: bool = True  # downstream data assets (through the token shards) follow a refresh eagerly
    train: bool = False  # training_run (and what follows) starts on new token shards too; off: only by hand

    def landing_path(self) -> str:
        return self.landing or str(kiln_home() / "landing")
