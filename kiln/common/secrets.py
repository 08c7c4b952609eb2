"""Credentials stay in the environment: whatever Kiln records (manifests, Dagster metadata, logs, errors) shows
an address without its `user:password@`. Secrets are read from the environment (Dagster's `dg.EnvVar` on the
resources, Ray's and AWS's own variables), and a URL that carries one anyway is redacted before it is written."""

from __future__ import annotations

import re
from typing import Any

# The userinfo ends at the authority's last '@' (RFC 3986 ends the authority at '/', '?' or '#'): urllib, and so
# MLflow, requests and redis, read an unencoded '@' in a password as part of it.
_URL_USERINFO = re.compile(r"(?P<scheme>\b[a-zA-Z][a-zA-Z0-9+.-]*://)[^/?#\s]*@")
_BARE_USERINFO = re.compile(r"^[^/?#\s]*@")


def redact_url(url: str | None) -> str | None:
    """An address as it may be shown: `scheme://user:password@host` → `scheme://host`; a bare `user@host:port`
    → `host:port`."""
    if url is None:
        return None
    return _BARE_USERINFO.sub("", url) if "://" not in url else _URL_USERINFO.sub(r"\g<scheme>", url)


def redact(value: Any) -> Any:
    """`value` (dicts, lists, strings: a config or stats as recorded) with the credentials of every URL inside
    removed."""
    if isinstance(value, str):
        return _URL_USERINFO.sub(r"\g<scheme>", value) if "@" in value and "://" in value else value
    if isinstance(value, dict):
        return {k: redact(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact(v) for v in value]
    return value
