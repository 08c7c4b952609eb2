"""The one manifest format every asset output carries (`_manifest.json`, written last).

It names the files (with sha256), the counts, the config and code that produced them and the data
versions of the inputs. The output's data version is derived from the file hashes, so the same bytes
always get the same version and any change to them gets a new one.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
import os
import subprocess
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from functools import lru_cache
from pathlib import Path
from typing import Any, BinaryIO

from kiln import __version__

MANIFEST_NAME = "_manifest.json"
FORMAT_VERSION = 1


@dataclass
class FileEntry:
    path: str  # relative to the dataset directory
    role: str  # documents | rejected | quarantine | artifact
    sha256: str
    bytes: int
    rows: int | None = None


@dataclass
class Manifest:
    asset: str
    partition: str | None
    code_version: str
    config: dict[str, Any]
    inputs: dict[str, str]  # "asset/partition" -> data version
    files: list[FileEntry]
    counts: dict[str, int]
    stats: dict[str, Any] = field(default_factory=dict)
    format_version: int = FORMAT_VERSION
    kiln_version: str = __version__
    git_commit: str | None = None
    created_at: str = ""
    data_version: str = ""

    def files_with_role(self, role: str) -> list[FileEntry]:
        return [f for f in self.files if f.role == role]

    def to_json(self) -> str:
        # The file entries as plain dicts directly: asdict's deep copy of thousands of them cost more than the dump.
        data = asdict(replace(self, files=[])) | {"files": [vars(f) for f in self.files]}
        return json.dumps(data, indent=2, sort_keys=True, ensure_ascii=False, default=str)

    def for_history(self) -> Manifest:
        """The manifest as a store's history keeps it after its version is gone: all of it but the removal examples,
        the one part that may quote a document (an opt-in excerpt), which a removal request must be able to erase."""
        return replace(self, stats=_without_examples(self.stats))

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Manifest:
        data = dict(data)
        data["files"] = [FileEntry(**f) for f in data["files"]]
        return cls(**data)


def applied_requests(version: Manifest | None) -> set[str]:
    """The ids of the removal requests a dataset version applied (token shards, their exports, quality-filtered
    documents): a version that applies one the version it replaces did not leaves that one on no disk, the writer's
    or a reader's (kiln.common.storage)."""
    return set(version.config.get("removal_requests") or []) if version is not None else set()


def _without_examples(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: _without_examples(v) for k, v in value.items() if k != "examples"}
    if isinstance(value, list):
        return [_without_examples(v) for v in value]
    return value


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def data_version_of(files: list[FileEntry]) -> str:
    h = hashlib.sha256()
    for f in sorted(files, key=lambda f: f.path):
        h.update(f"{f.path}\0{f.sha256}\n".encode())
    return h.hexdigest()[:20]


@lru_cache(maxsize=1)
def git_commit() -> str | None:
    """The commit of the code that ran (with '-dirty' when the tree has changes), or None outside git."""
    root = Path(__file__).resolve().parents[2]
    try:
        commit = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                                timeout=10, check=True).stdout.strip()
        dirty = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return None
    return commit + ("-dirty" if dirty else "")


def code_version(*modules: str, data: tuple[str | Path, ...] = ()) -> str:
    """A hash of the source of the named modules (packages: every .py below them) and of the `data` files they read
    (a built-in word list): it changes exactly when what produces an output changes, with no version string to
    forget to bump."""
    import importlib.util

    h = hashlib.sha256()
    for name in sorted(modules):
        origin = Path(importlib.util.find_spec(name).origin)
        files = sorted(origin.parent.rglob("*.py")) if origin.name == "__init__.py" else [origin]
        for f in files:
            h.update(f.read_bytes())
    for f in sorted(map(Path, data)):
        h.update(f.read_bytes())
    return h.hexdigest()[:12]


def temporary_name(path: Path) -> Path:
    """Where to write `path` before renaming it into place: a hidden sibling, unique per writer, so readers that
    list a folder skip it and a dataset commit removes what a dead writer left (`kiln.common.storage`)."""
    return path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:12]}")


def read_json_or_empty(path: Path) -> dict:
    """A JSON file's object, or {} when it is missing or not JSON (a run folder's summary.json before a launch wrote
    it, or one a killed launch left cut short)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (FileNotFoundError, json.JSONDecodeError):
        return {}


def write_json_atomic(path: Path, text: str, flush: bool = True) -> None:
    """write_file_atomic of `text` (UTF-8), then, with `flush`, the folder flushed too: after a crash the file is
    the old one or the new one, whole. `flush=False` skips both flushes: after a power loss the file may be the old
    one, the new one or cut short, never half of one after a process crash."""
    write_file_atomic(path, lambda f: f.write(text.encode("utf-8")), flush=flush)
    if flush:
        fsync_dir(path.parent)


def write_file_atomic(path: Path, write: Callable[[BinaryIO], object], flush: bool = True) -> None:
    """`write(f)` into a temporary sibling (binary), flushed to disk (unless `flush=False`), then renamed over
    `path`: a reader sees the old file or the new one, whole, never half of one; a failed write (a full disk)
    leaves the old file and no temporary one."""
    tmp = temporary_name(path)
    try:
        with open(tmp, "wb") as f:
            write(f)
            if flush:
                f.flush()
                os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(path: Path) -> None:
    """Make a rename or a new file in `path` durable (POSIX: the folder's entry is data of the folder)."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def now_utc() -> str:
    """The time in UTC, ISO 8601 to the microsecond: versions, refreshes and requests sort by it as text (a store's
    history, the newest evaluation of a checkpoint), and two commits of one asset within a second are common. Records
    written to the second before this (`...:05+00:00`) still sort before any written since: '+' < '.'."""
    return dt.datetime.now(dt.timezone.utc).isoformat(timespec="microseconds")


def to_the_second(iso: str | None) -> str | None:
    """A recorded time as people read it (audits, data cards): `now_utc`'s microseconds dropped."""
    try:
        return dt.datetime.fromisoformat(iso).isoformat(timespec="seconds") if iso else iso
    except ValueError:
        return iso
