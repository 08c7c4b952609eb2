"""Reading the one-entry-per-line lists (domains, bad words) that filters take from files."""

from __future__ import annotations

from pathlib import Path


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
