"""A store as its readers see it, for tests: files by their stable paths, and what a commit should have cleaned."""

import os
from pathlib import Path


def published_files(base: Path) -> list[Path]:
    """Every file under `base` a reader sees, by its stable path: through each dataset's link to its current
    version; hidden entries (other versions, staging folders, temporary files) left out."""
    found = []
    for root, dirs, names in os.walk(base, followlinks=True):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        found += [Path(root, name) for name in sorted(names) if not name.startswith(".")]
    return found


def leftovers(folder: Path) -> list[str]:
    """The hidden entries of `folder` (beside its datasets' links) that no reader needs: neither a dataset's current
    version, nor a replaced version kept for its readers, nor that version's `.replaced` marker, nor the dataset's
    history of manifests."""
    names = {p.name for p in folder.iterdir()}
    links = [p for p in folder.iterdir() if p.is_symlink()]
    current = {os.readlink(p) for p in links} | {f".{p.name}.history" for p in links}
    kept = {n.removesuffix(".replaced") for n in names if n.endswith(".replaced")} & names
    return sorted(n for n in names if n.startswith(".") and n not in current | kept
                  and n.removesuffix(".replaced") not in kept)
