"""Reading the one-entry-per-line lists (domains, bad words) that filters take from files."""

from __future__ import annotations

import functools
import os
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

T = TypeVar("T")


def cached_while_unchanged(load: Callable[[str], T]) -> Callable[[str], T]:
    """`load(path)`, cached for as long as the file is unchanged (its inode, size and mtime): a long-lived worker
    reads a user's list again once it is edited, instead of judging by the list it read first."""

    @functools.lru_cache(maxsize=32)
    def load_version(path: str, _stamp: tuple[int, int, int] | None) -> T:
        return load(path)

    @functools.wraps(load)
    def cached(path: str) -> T:
        try:
            st = os.stat(path)
            stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
        except OSError:
            stamp = None  # load raises, naming the path; an error is never cached
        return load_version(path, stamp)

    return cached


def load_wordlist(path: str | Path) -> list[str]:
    """Non-empty lines, '#' comments and surrounding whitespace removed. A missing file is an error."""
    p = Path(path)
    if not p.is_file():
        raise ValueError(f"word list {str(path)!r} does not exist; give a path to a text file, one entry per line")
    entries = []
    for line in p.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].strip()
        if line:
            entries.append(line)
    return entries
