"""Datasets on disk: a folder of Parquet parts plus `_manifest.json`, written so a crash leaves no half file.

Parts are written to a temporary name and renamed; a whole dataset is staged in a sibling folder and
swapped in only after its manifest is written, so readers see either the old complete version or the
new complete one. A folder without a manifest is incomplete and is never read.
"""

from __future__ import annotations

import json
import os
import shutil
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.manifest import MANIFEST_NAME, FileEntry, Manifest, data_version_of, git_commit, now_utc, sha256_file, write_json_atomic

# A file's role is its name's prefix, so any reader can tell documents from rejects, signatures or shards.
ROLE_PREFIX = {"documents": "part", "rejected": "rejected", "quarantine": "quarantine", "signatures": "signatures",
               "decisions": "decisions", "contamination": "contamination", "lines": "lines", "shard": "shard"}


def write_parquet_atomic(path: Path, table: pa.Table) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    pq.write_table(table, tmp, compression="zstd")
    os.replace(tmp, path)


def part_name(role: str, index: int, suffix: str = ".parquet") -> str:
    return f"{ROLE_PREFIX[role]}-{index:05d}{suffix}"


class IncompleteDataset(FileNotFoundError):
    pass


@dataclass(frozen=True)
class Store:
    """Where Kiln keeps its datasets: `<root>/<asset>/<partition>/`."""

    root: Path

    def dataset_dir(self, asset: str, partition: str | None = None) -> Path:
        return self.root / asset / (partition or "_all")

    def manifest(self, asset: str, partition: str | None = None) -> Manifest:
        path = self.dataset_dir(asset, partition) / MANIFEST_NAME
        if not path.is_file():
            raise IncompleteDataset(f"{asset}[{partition}] has not been materialized (no {path}); materialize it first")
        return Manifest.from_dict(json.loads(path.read_text(encoding="utf-8")))

    def files(self, asset: str, partition: str | None, role: str) -> list[Path]:
        base = self.dataset_dir(asset, partition)
        return [base / f.path for f in self.manifest(asset, partition).files_with_role(role)]

    def read_table(self, asset: str, partition: str | None, role: str = "documents",
                   columns: list[str] | None = None) -> pa.Table:
        paths = self.files(asset, partition, role)
        if not paths:
            return pa.table({})
        return pa.concat_tables([pq.read_table(p, columns=columns) for p in paths])

    def iter_batches(self, asset: str, partition: str | None, role: str = "documents",
                     batch_size: int = 1000, columns: list[str] | None = None) -> Iterator[pa.RecordBatch]:
        for path in self.files(asset, partition, role):
            yield from pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=columns)

    def staging(self, asset: str, partition: str | None = None) -> DatasetWriter:
        return DatasetWriter(self.dataset_dir(asset, partition), asset, partition)


class DatasetWriter:
    """Collects parts in a staging folder; `commit` writes the manifest and swaps the folder in."""

    def __init__(self, final_dir: Path, asset: str, partition: str | None):
        self.final_dir, self.asset, self.partition = final_dir, asset, partition
        final_dir.parent.mkdir(parents=True, exist_ok=True)
        self.dir = final_dir.with_name(f".{final_dir.name}.staging-{uuid.uuid4().hex[:8]}")
        self.dir.mkdir()
        self._counters: dict[str, int] = {}

    def next_path(self, role: str, suffix: str = ".parquet") -> Path:
        i = self._counters.get(role, 0)
        self._counters[role] = i + 1
        return self.dir / part_name(role, i, suffix)

    def write(self, role: str, table: pa.Table) -> Path:
        path = self.next_path(role)
        write_parquet_atomic(path, table)
        return path

    def commit(self, *, code_version: str, config: dict, inputs: dict[str, str], counts: dict[str, int],
               stats: dict | None = None) -> Manifest:
        entries = []
        for path in sorted(p for p in self.dir.rglob("*") if p.is_file()):
            relative = path.relative_to(self.dir)
            if any(part.startswith(".") for part in relative.parts) or relative.as_posix() == MANIFEST_NAME:
                continue
            role = next((r for r, p in ROLE_PREFIX.items() if path.name.startswith(p + "-")), "artifact")
            rows = pq.ParquetFile(path).metadata.num_rows if path.suffix == ".parquet" else None
            entries.append(FileEntry(path=relative.as_posix(), role=role, sha256=sha256_file(path),
                                     bytes=path.stat().st_size, rows=rows))
        manifest = Manifest(asset=self.asset, partition=self.partition, code_version=code_version, config=config,
                            inputs=inputs, files=entries, counts=counts, stats=stats or {},
                            git_commit=git_commit(), created_at=now_utc(), data_version=data_version_of(entries))
        write_json_atomic(self.dir / MANIFEST_NAME, manifest.to_json())
        self._swap()
        return manifest

    def abort(self) -> None:
        shutil.rmtree(self.dir, ignore_errors=True)

    def _swap(self) -> None:
        old = None
        if self.final_dir.exists():
            old = self.final_dir.with_name(f".{self.final_dir.name}.old-{uuid.uuid4().hex[:8]}")
            os.replace(self.final_dir, old)
        os.replace(self.dir, self.final_dir)
        if old is not None:
            shutil.rmtree(old, ignore_errors=True)

    def __enter__(self) -> DatasetWriter:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        if exc_type is not None or self.dir.exists():
            self.abort()
