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
