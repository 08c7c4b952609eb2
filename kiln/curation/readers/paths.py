"""Local and s3:// paths, directories and globs, through one interface (pyarrow's filesystems)."""

from __future__ import annotations

import fnmatch
import glob
import io
import os
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

from pyarrow import fs as pafs


@dataclass(frozen=True)
class SourceFile:
    uri: str  # what the user would recognise: a local path or s3://bucket/key
    relative: str  # stable locator used in doc ids: the path below the source's root

    @property
    def bare_name(self) -> str:
        """The file's name in lower case without a compression suffix (.gz, .zst): its format's extension ends it."""
        return self.uri.rsplit("/", 1)[-1].lower().removesuffix(".gz").removesuffix(".zst")

    def open(self) -> BinaryIO:
        if self.uri.startswith("s3://"):
            filesystem, path = s3_filesystem(self.uri)
            # compression=None: decompression is the reader's job, by extension, for local and S3 alike.
            return io.BufferedReader(filesystem.open_input_stream(path, compression=None), buffer_size=1 << 20)
        return open(self.uri, "rb")

    def open_seekable(self) -> BinaryIO:
        """The file for random access (a Parquet reader reads its footer, then one row group at a time): on S3 by
        ranged reads, never downloaded whole."""
        if self.uri.startswith("s3://"):
            filesystem, path = s3_filesystem(self.uri)
            return filesystem.open_input_file(path)
        return open(self.uri, "rb")


def s3_filesystem(uri: str) -> tuple[pafs.FileSystem, str]:
    # AWS_ENDPOINT_URL points at S3-compatible stores (MinIO, moto) the same way boto3 honours it.
    endpoint = os.environ.get("AWS_ENDPOINT_URL_S3") or os.environ.get("AWS_ENDPOINT_URL")
    filesystem = pafs.S3FileSystem(endpoint_override=endpoint, region=os.environ.get("AWS_DEFAULT_REGION", "us-east-1"),
                                   scheme="http" if endpoint and endpoint.startswith("http://") else "https")
    return filesystem, uri.removeprefix("s3://")


def expand(pattern: str) -> list[SourceFile]:
    """Files named by a path, a directory (recursively) or a glob, sorted so reading order is stable."""
    if pattern.startswith("s3://"):
        return _expand_s3(pattern)
    if any(c in pattern for c in "*?["):
        root = _glob_root(pattern)
        paths = [Path(p) for p in glob.glob(pattern, recursive=True)]
    else:
        root = Path(pattern) if Path(pattern).is_dir() else Path(pattern).parent
        paths = [p for p in Path(pattern).rglob("*")] if Path(pattern).is_dir() else [Path(pattern)]
    files = sorted(p for p in paths if p.is_file() and not p.name.startswith("."))
    return [SourceFile(str(p), str(p.relative_to(root)) if p.is_relative_to(root) else p.name) for p in files]


def _glob_root(pattern: str) -> Path:
    parts = []
    for part in Path(pattern).parts:
        if any(c in part for c in "*?["):
            break
        parts.append(part)
    return Path(*parts) if parts else Path(".")


def _expand_s3(pattern: str) -> list[SourceFile]:
    """What `expand` gives for the same layout on local disk: a glob is matched segment by segment (`*` never crosses
    a `/`; `**` is any number of folders), listed from the folders before its first wildcard, and hidden names are
    left out."""
    filesystem, path = s3_filesystem(pattern)
    parts = path.rstrip("/").split("/")
    wild = next((i for i, part in enumerate(parts) if any(c in part for c in "*?[")), None)
    root = "/".join(parts if wild is None else parts[:wild])
    info = filesystem.get_file_info(root)
    if info.type == pafs.FileType.File and wild is None:
        infos = [info]
    elif info.type == pafs.FileType.Directory:
        infos = filesystem.get_file_info(pafs.FileSelector(root, recursive=True))
    else:
        return []
    out = []
    for i in sorted(infos, key=lambda i: i.path):
        below = i.path[len(root):].lstrip("/")
        if i.type != pafs.FileType.File or i.base_name.startswith(".") or \
                (wild is not None and not _glob_matches(parts[wild:], below.split("/"))):
            continue
        out.append(SourceFile(f"s3://{i.path}", below or i.base_name))
    return out


def _glob_matches(pattern: list[str], names: list[str]) -> bool:
    """Whether a path's names match a glob's segments as `glob.glob(recursive=True)` matches them: `**` stands for
    any number of folders, and a wildcard does not match a name starting with '.'."""
    if not pattern:
        return not names
    if pattern[0] == "**":
        return any(_glob_matches(pattern[1:], names[i:]) for i in range(len(names) + 1)
                   if not any(n.startswith(".") for n in names[:i]))
    return bool(names) and (pattern[0].startswith(".") or not names[0].startswith(".")) and \
        fnmatch.fnmatchcase(names[0], pattern[0]) and _glob_matches(pattern[1:], names[1:])
