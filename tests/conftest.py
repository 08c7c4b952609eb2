"""Shared fixtures: tiny configs and corpora built in code, an isolated KILN_HOME per test."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

CLEAN_PROSE = (
    "The river town was built on the trade of salt and timber, and for two centuries its merchants "
    "kept careful ledgers of every barge that passed the lock. Historians have used those ledgers to "
    "reconstruct the prices of ordinary goods, which show that the cost of bread rose sharply in years "
    "when the river froze early. The town council met in a hall beside the market square, and its "
    "minutes record long debates about the width of the towpath and the fees charged to foreign boats. "
    "Today the old warehouses have become a museum, and visitors can still see the iron rings to which "
    "the barges were tied. The museum is open every day except Monday, and guided tours start at ten."
)


def prose(i: int) -> str:
    """A distinct clean prose document (the i makes each one a different text)."""
    return f"Chapter {i}. " + CLEAN_PROSE.replace("two centuries", f"{i + 2} centuries")


@pytest.fixture
def kiln_home(tmp_path, monkeypatch) -> Path:
    home = tmp_path / "kiln"
    monkeypatch.setenv("KILN_HOME", str(home))
    return home


def write_jsonl(path: Path, records: list) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        for r in records:
            f.write((r if isinstance(r, str) else json.dumps(r)) + "\n")
    return path
