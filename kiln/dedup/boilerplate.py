"""Boilerplate lines: lines that recur across many documents (navigation, banners, license headers).

The signature stage counts, per source, in how many documents each distinct line occurs; the counts
are summed across sources, and a line seen in more than `min_documents` documents is removed from the
surviving documents. Lines are compared whitespace-stripped, so indentation does not hide a repeat.
"""

from __future__ import annotations

from collections import Counter

import pyarrow as pa

from kiln.common.config import BoilerplateLines
from kiln.dedup.minhash import line_hash


# The settings a version's line counts depend on (minhash_signatures), and its boilerplate hashes (dedup_index).
COUNTED_WITH = ("enabled", "min_chars")
DECIDED_WITH = ("enabled", "min_documents", "min_chars")


class BoilerplateMismatch(ValueError):
    """Line counts or boilerplate hashes made with other `dedup.boilerplate_lines` settings than the config's."""


def check_lines_settings(name: str, recorded: dict | None, lines: BoilerplateLines, keys: tuple[str, ...],
                         asset: str) -> None:
    """With boilerplate lines on, refuse the version `name` made with other settings (`keys`, as its manifest's
    config recorded them): a version made with them off has no counts, and lines counted or decided by other rules
    would be stripped by them (a config change does not make the version stale in Dagster)."""
    if not lines.enabled:
        return
    made, wanted = {k: (recorded or {}).get(k) for k in keys}, {k: getattr(lines, k) for k in keys}
    if made != wanted:
        differ = ", ".join(f"{k} {made[k]} (config: {wanted[k]})" for k in keys if made[k] != wanted[k])
        raise BoilerplateMismatch(f"{name} was made with other dedup.boilerplate_lines settings than the config's "
                                  f"({differ}): re-materialize {asset} with the config first (or restore those "
                                  f"settings)")


def boilerplate_hashes(tables: list[pa.Table], settings: BoilerplateLines) -> set[int]:
    """Line hashes whose document count, summed over every source's count table, exceeds the limit."""
    total: Counter = Counter()
    for t in tables:
        total.update(dict(zip(t.column("line_hash").to_pylist(), t.column("documents").to_pylist())))
    return {h for h, n in total.items() if n > settings.min_documents}


def strip_boilerplate(text: str, boilerplate: set[int], settings: BoilerplateLines) -> tuple[str, int]:
    """`text` without its boilerplate lines (line endings kept) and how many lines were removed."""
    if not boilerplate:
        return text, 0
    kept, removed = [], 0
    for line in text.splitlines(keepends=True):
        s = line.strip()
        if len(s) >= settings.min_chars and line_hash(s) in boilerplate:
            removed += 1
        else:
            kept.append(line)
    return "".join(kept), removed
