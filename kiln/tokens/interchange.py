"""Token shards in the formats other trainers read: Megatron-LM's indexed dataset and Parquet for Hugging Face.

`export_shards(shard_dir, out_dir, formats)` reads a token_shards dataset (kiln.tokens.shard_format) and writes,
per split (`train`, `val`), in the order Kiln's own loader reads the shards (phases in order, shards in written
order, documents in shard order):

- `megatron/<split>.bin` + `megatron/<split>.idx`: Megatron-LM / NeMo's MMapIndexedDataset (`IndexedDataset` in
  megatron.core.datasets.indexed_dataset), one Megatron sequence and one document per Kiln document, so document
  boundaries survive; token dtype chosen from the vocabulary size as Megatron's preprocessing does
  (`DType.optimal_dtype`: uint16 below 65,500 ids, else int32);
- `parquet/<split>-NNNNN.parquet`: one file per Kiln shard, one row per document: `doc_id`, `source`, `phase`,
  `input_ids` (list<int32>), which `datasets.load_dataset("parquet", data_dir=<out>/parquet)` loads as the
  `train` and `validation` splits;
- `export.json`: the shard set it came from (asset, partition, data version, tokenizer sha256, EOS id) and the
  export format version. It is one of the hashed files, so the export's data version changes with either.

Tokens are copied exactly: every document keeps the tokenizer's EOS at its end (Megatron's `--append-eod`), FIM
documents keep their sentinels, a document the mixture repeats appears as often as the shards hold it.

Megatron's published .idx layout (little-endian), written here without importing megatron-core:

    9 bytes  b"MMIDIDX\\x00\\x00"        8  uint64 version (1)          1  uint8 dtype code (uint16: 8, int32: 4)
    8  uint64 sequence count S         8  uint64 document-index count (documents + 1)
    S * 4  int32 sequence lengths      S * 8  int64 sequence byte offsets into .bin
    (D + 1) * 8  int64 document indices: document d is sequences [idx[d], idx[d + 1])

Every file is written under a temporary name and renamed, so a reader never sees half of one. Exporting into a
folder that holds an earlier export first removes that export's files (`export.json` first, then each `.idx`
before its `.bin`): no file of the earlier export is read beside the new one (a Parquet file of a shard the new
set no longer has, a split it no longer has, an old `.idx` beside a new `.bin` after a crash).
"""

from __future__ import annotations

import json
import struct
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.manifest import MANIFEST_NAME, write_file_atomic, write_json_atomic
from kiln.common.spill import BATCH_ROWS, BUCKET_ROWS, Spill, bucket_count, joined_buckets
from kiln.common.storage import parquet_batches
from kiln.tokens.shard_format import (TRAIN, VAL, Shard, ShardError, ShardInfo, ShardSet, check_listed, open_shard,
                                      read_shard_set)
from kiln.tokens.shard_writer import MEMBERS_SCHEMA, POSITIONS_SCHEMA

EXPORT_FORMAT = "kiln-shard-export/1"
EXPORT_VERSION = 1  # bump when the bytes an export writes change: it is part of the export's data version
FORMATS = ("megatron", "parquet")
EXPORT_JSON = "export.json"
MEGATRON_DIR, PARQUET_DIR = "megatron", "parquet"

MEGATRON_MAGIC = b"MMIDIDX\x00\x00"
MEGATRON_DTYPE_CODES = {np.dtype("uint16"): 8, np.dtype("int32"): 4}  # megatron.core DType enum values
MEGATRON_HEADER_SIZE = 9 + 8 + 1 + 8 + 8  # magic, version, dtype code, sequence count, document-index count

PARQUET_SCHEMA = pa.schema([pa.field("doc_id", pa.string()), pa.field("source", pa.string()),
                            pa.field("phase", pa.string(), nullable=False),
                            pa.field("input_ids", pa.list_(pa.field("item", pa.int32(), nullable=False)),
                                     nullable=False)])
_ROW_GROUP_TOKENS = 1 << 23  # ~32 MB of int32 ids per Parquet row group: bounded memory to write and to read
_COPY_TOKENS = 1 << 24  # tokens per write when streaming a shard into a .bin
_INDEX_ROWS = 1 << 20  # document indices per write into an .idx (8 MB)
_JOIN_BUCKET_ROWS = BUCKET_ROWS  # rows of the position and member lists joined at once
_MEMBER_SCHEMA = pa.schema([MEMBERS_SCHEMA.field(c) for c in ("doc_id", "source")])
_ROWS_SCHEMA = pa.schema([*POSITIONS_SCHEMA, MEMBERS_SCHEMA.field("source")])  # a copy, named


def megatron_dtype(vocab_size: int) -> np.dtype:
    """Megatron's own choice (`DType.optimal_dtype(vocab_size)` in preprocess_data.py): uint16 when the vocabulary
    has fewer than 65,500 ids, else int32. Kiln's shards switch at 65,536, so 65,500..65,536 is widened here."""
    return np.dtype("uint16") if vocab_size < 65_500 else np.dtype("int32")


def megatron_idx_size(documents: int) -> int:
    """The size of a one-sequence-per-document .idx file (how a reader can tell a whole one)."""
    return MEGATRON_HEADER_SIZE + documents * (4 + 8) + (documents + 1) * 8


def _check_formats(formats: Sequence[str]) -> list[str]:
    unknown = [f for f in formats if f not in FORMATS]
    if unknown:
        raise ShardError(f"shards.export: unknown format {unknown[0]!r}; choose from {list(FORMATS)} "
                         f"(or [] for no export)")
    return [f for f in FORMATS if f in formats]  # fixed order, duplicates dropped


def _source_manifest(shard_dir: Path) -> dict[str, Any]:
    return json.loads((shard_dir / MANIFEST_NAME).read_text(encoding="utf-8"))


def _split_shards(shard_set: ShardSet, split: str) -> list[ShardInfo]:
    """The shards of one split in reading order; none when the split has no shards."""
    return shard_set.split(split) if any(s.split == split for s in shard_set.shards) else []


def _opened(shard_set: ShardSet, infos: list[ShardInfo]) -> Iterator[tuple[ShardInfo, Shard]]:
    """Each shard opened in turn, as the manifest lists it: one or two open at a time, whatever the shards. Every
    shard of a split open at once held a file descriptor and a memory map per shard (Linux allows 65,530 maps a
    process by default; 250,000 shards are 10^12 tokens) and every document's offset (8 B a document)."""
    for info in infos:
        shard = open_shard(shard_set.dir / info.path, shard_set.tokenizer_sha256)
        check_listed(shard.path, info, len(shard.tokens), shard.documents)
        yield info, shard


def write_megatron(shard_set: ShardSet, infos: list[ShardInfo], prefix: Path) -> dict[str, Any]:
    """`<prefix>.bin` and `<prefix>.idx` from a split's shards (`infos`, in reading order), one sequence (and
    document) per document. Both are streamed a shard at a time: the .idx's lengths, then its byte offsets, each in
    a pass over the shards' indexes, so nothing per document of the split is held."""
    dtype = megatron_dtype(shard_set.vocab_size)
    documents = sum(info.documents for info in infos)

    def lengths() -> Iterator[np.ndarray]:
        for _, shard in _opened(shard_set, infos):
            yield np.diff(shard.offsets.astype(np.int64))

    def write_bin(f) -> None:
        for _, shard in _opened(shard_set, infos):
            longest = int(np.diff(shard.offsets.astype(np.int64)).max(initial=0))
            if longest >= 1 << 31:  # checked before its tokens are written: no .bin is left (written atomically)
                raise ShardError(f"a document of {longest} tokens does not fit Megatron's int32 sequence length")
            for start in range(0, len(shard.tokens), _COPY_TOKENS):
                np.asarray(shard.tokens[start:start + _COPY_TOKENS]).astype(dtype, copy=False).tofile(f)

    def write_idx(f) -> None:
        f.write(MEGATRON_MAGIC)
        f.write(struct.pack("<QBQQ", 1, MEGATRON_DTYPE_CODES[dtype], documents, documents + 1))
        for run in lengths():
            f.write(run.astype("<i4").tobytes())
        before = 0  # tokens of the documents before this shard's
        for run in lengths():
            ends = np.cumsum(run) + before
            f.write(((ends - run) * dtype.itemsize).astype("<i8").tobytes())
            before += int(run.sum())
        for start in range(0, documents + 1, _INDEX_ROWS):  # one sequence per document
            f.write(np.arange(start, min(start + _INDEX_ROWS, documents + 1), dtype="<i8").tobytes())

    prefix.parent.mkdir(parents=True, exist_ok=True)
    # .bin first: a reader that finds the .idx finds its data
    write_file_atomic(prefix.with_name(prefix.name + ".bin"), write_bin)
    write_file_atomic(prefix.with_name(prefix.name + ".idx"), write_idx)
    return {"documents": documents, "tokens": sum(info.tokens for info in infos), "dtype": dtype.name}


class _ShardRows:
    """Each shard's doc_ids (from the position list) and sources (from the member list), in document order, a group of
    shards at a time. The two lists are joined a doc_id hash bucket at a time (kiln.common.spill), each bucket's rows
    scattered to the group of their shard: groups are runs of consecutive shards in `order`, the order the export asks
    for them, so each group is read once and one is held at a time. A lookup per shard hashed every member again for
    each shard; holding both lists whole grew with the set."""

    def __init__(self, shard_dir: Path, manifest: dict[str, Any], order: list[str], scratch: Path):
        files = {role: [shard_dir / f["path"] for f in manifest["files"] if f["role"] == role]
                 for role in ("positions", "members")}
        if not files["positions"] or not files["members"]:
            raise ShardError(f"{shard_dir} has no positions or member list (written by an older Kiln); "
                             f"re-materialize token_shards before exporting it to Parquet")
        self.shard_dir = shard_dir
        rows = max(sum(pq.ParquetFile(p).metadata.num_rows for p in paths) for paths in files.values())
        buckets = bucket_count(rows, _JOIN_BUCKET_ROWS)
        pairs = joined_buckets(scratch / "join", buckets, _batches(files["members"], _MEMBER_SCHEMA),
                               _batches(files["positions"], POSITIONS_SCHEMA))
        groups = min(buckets, max(len(order), 1))
        self.number = {name: k for k, name in enumerate(order)}
        self.group_of = np.array([k * groups // len(order) for k in range(len(order))] or [0], np.int64)

        def by_group(batch: pa.RecordBatch) -> np.ndarray:
            encoded = pc.dictionary_encode(batch.column("shard"))
            names = encoded.dictionary.to_pylist()
            if unknown := [n for n in names if n not in self.number]:
                raise ShardError(f"{shard_dir}: the positions list names shards the set does not hold ({unknown[:3]}); "
                                 f"re-materialize token_shards")
            number = np.array([self.number[n] for n in names] or [0], np.int64)
            return self.group_of[number[encoded.indices.to_numpy(zero_copy_only=False)]]

        self.groups = Spill(scratch / "shards", groups, _ROWS_SCHEMA,
                            (b for m, p in pairs for b in self._join(m, p).to_batches()), by_group)
        self.group, self.rows = -1, {}

    def _join(self, member: pa.Table, placed: pa.Table) -> pa.Table:
        row = pc.index_in(placed.column("doc_id"), value_set=member.column("doc_id"))
        if row.null_count:
            raise ShardError(f"{self.shard_dir}: the positions list names {row.null_count} document copies its "
                             f"member list does not hold; re-materialize token_shards")
        return pa.table([placed.column("shard"), placed.column("index"), placed.column("doc_id"),
                         member.column("source").take(row)], schema=_ROWS_SCHEMA)

    def get(self, path: str) -> tuple[pa.Array | None, pa.Array | None]:
        """(doc_ids, sources) of shard `path`, in document order; (None, None) when the positions list names none."""
        group = int(self.group_of[self.number[path]]) if path in self.number else -1
        if group != self.group and group >= 0:
            table = self.groups.pop(group).sort_by([("shard", "ascending"), ("index", "ascending")])
            names, starts = np.unique(table.column("shard").to_numpy(zero_copy_only=False), return_index=True)
            ends = [*starts[1:].tolist(), table.num_rows]
            self.group, self.rows = group, {
                str(n): (table.column("doc_id").slice(a, b - a).combine_chunks(),
                         table.column("source").slice(a, b - a).combine_chunks())
                for n, a, b in zip(names, starts.tolist(), ends)}
        return self.rows.get(path, (None, None))


def _batches(paths: list[Path], schema: pa.Schema) -> tuple[pa.Schema, Iterator[pa.RecordBatch]]:
    """(schema, the files' `schema` columns a batch at a time), as kiln.common.spill joins them."""
    return schema, (b.cast(schema) for p in paths for b in parquet_batches(p, BATCH_ROWS, schema.names))


def write_parquet(shard_set: ShardSet, infos: list[ShardInfo], split: str, folder: Path,
                  rows: _ShardRows) -> dict[str, Any]:
    """`<folder>/<split>-NNNNN.parquet`, one per shard of `infos` (a split's, in reading order): one row per document
    with its doc_id, source and phase (`rows`: each shard's doc_ids and sources in document order)."""
    folder.mkdir(parents=True, exist_ok=True)
    files, documents, tokens = [], 0, 0
    for k, (info, shard) in enumerate(_opened(shard_set, infos)):
        ids, sources = rows.get(info.path)
        if ids is None or len(ids) != shard.documents:
            raise ShardError(f"{info.path}: the positions list names {0 if ids is None else len(ids)} documents, "
                             f"the shard holds {shard.documents}; re-materialize token_shards")
        offsets = shard.offsets.astype(np.int64)
        path = folder / f"{split}-{k:05d}.parquet"

        def write(f, ids=ids, sources=sources, offsets=offsets, shard=shard, phase=info.phase) -> None:
            with pq.ParquetWriter(f, PARQUET_SCHEMA, compression="zstd") as writer:
                first = 0
                while first < shard.documents:
                    # documents [first, last): whole documents up to ~_ROW_GROUP_TOKENS (at least one)
                    last = max(first + 1, int(np.searchsorted(offsets, offsets[first] + _ROW_GROUP_TOKENS,
                                                              side="right")) - 1)
                    last = min(last, shard.documents)
                    base = offsets[first]
                    values = np.asarray(shard.tokens[base:offsets[last]]).astype(np.int32)
                    lists = pa.ListArray.from_arrays(pa.array((offsets[first:last + 1] - base).astype(np.int32)),
                                                     pa.array(values, pa.int32()),
                                                     type=PARQUET_SCHEMA.field("input_ids").type)
                    writer.write_batch(pa.record_batch(
                        [ids.slice(first, last - first), sources.slice(first, last - first),
                         pa.array([phase] * (last - first), pa.string()), lists], schema=PARQUET_SCHEMA))
                    first = last

        write_file_atomic(path, write)
        files.append(path.relative_to(folder.parent).as_posix())
        documents += shard.documents
        tokens += len(shard.tokens)
    return {"files": files, "documents": documents, "tokens": tokens}


def _remove_earlier_export(out_dir: Path) -> None:
    """Remove every file an export writes from `out_dir`: `export.json` first (the folder no longer claims a whole
    export), then each split's `.idx` before its `.bin` (a reader that opens a prefix finds both files or neither
    index), then the Parquet files. Other files are left alone."""
    (out_dir / EXPORT_JSON).unlink(missing_ok=True)
    for split in (TRAIN, VAL):
        for suffix in (".idx", ".bin"):
            (out_dir / MEGATRON_DIR / f"{split}{suffix}").unlink(missing_ok=True)
    for split in (TRAIN, VAL):
        for path in sorted((out_dir / PARQUET_DIR).glob(f"{split}-[0-9][0-9][0-9][0-9][0-9]*.parquet")):
            path.unlink(missing_ok=True)


def export_shards(shard_dir: Path, out_dir: Path, formats: Sequence[str]) -> dict[str, Any]:
    """Export the token_shards dataset at `shard_dir` into `out_dir` (a staging folder or any folder; an earlier
    export there is replaced, file by file) in `formats` (see FORMATS); returns what `export.json` holds (for the
    export's manifest `stats`)."""
    shard_dir, out_dir = Path(shard_dir), Path(out_dir)
    formats = _check_formats(formats)
    shard_set = read_shard_set(shard_dir)
    manifest = _source_manifest(shard_set.dir)  # the version read_shard_set resolved: one version's files throughout
    out_dir.mkdir(parents=True, exist_ok=True)
    _remove_earlier_export(out_dir)  # none of its files is read beside this export's
    with tempfile.TemporaryDirectory(dir=out_dir, prefix=".export-scratch-") as scratch:
        return _export(shard_set, manifest, out_dir, formats, Path(scratch))


def _export(shard_set: ShardSet, manifest: dict[str, Any], out_dir: Path, formats: list[str],
            scratch: Path) -> dict[str, Any]:
    in_order = {split: _split_shards(shard_set, split) for split in (TRAIN, VAL)}
    rows = _ShardRows(shard_set.dir, manifest, [info.path for split in (TRAIN, VAL) for info in in_order[split]],
                      scratch) if "parquet" in formats else None
    splits: dict[str, Any] = {}
    for split in (TRAIN, VAL):
        infos = in_order[split]  # as the manifest lists them; each shard is checked against it when opened
        phases, first = [], 0
        for info in infos:  # phases are contiguous in reading order
            if phases and phases[-1]["name"] == info.phase:
                phases[-1]["documents"] += info.documents
                phases[-1]["tokens"] += info.tokens
            else:
                phases.append({"name": info.phase, "first_document": first, "documents": info.documents,
                               "tokens": info.tokens})
            first += info.documents
        entry: dict[str, Any] = {"documents": sum(i.documents for i in infos),
                                 "tokens": sum(i.tokens for i in infos), "phases": phases}
        if infos and "megatron" in formats:
            write_megatron(shard_set, infos, out_dir / MEGATRON_DIR / split)
            entry["megatron_prefix"] = f"{MEGATRON_DIR}/{split}"
        if infos and "parquet" in formats:
            entry["parquet_files"] = write_parquet(shard_set, infos, split, out_dir / PARQUET_DIR, rows)["files"]
        splits[split] = entry
    stats = {
        "format": EXPORT_FORMAT, "export_version": EXPORT_VERSION, "formats": formats,
        "source": {"asset": manifest.get("asset"), "partition": manifest.get("partition"),
                   "data_version": manifest.get("data_version"), "code_version": manifest.get("code_version")},
        "tokenizer_sha256": shard_set.tokenizer_sha256, "vocab_size": shard_set.vocab_size,
        "eos_id": shard_set.eos_id, "seq_len": shard_set.stats.get("seq_len"),
        "megatron_dtype": megatron_dtype(shard_set.vocab_size).name if "megatron" in formats else None,
        "splits": splits,
    }
    write_json_atomic(out_dir / EXPORT_JSON, json.dumps(stats, indent=2, sort_keys=True))
    return stats


def verify_export(out_dir: Path, stats: dict[str, Any]) -> list[str]:
    """What does not add up between the written files and `stats` (empty when all do): Megatron file sizes from
    the published layout, Parquet row and token-id counts from the file footers."""
    out_dir, problems = Path(out_dir), []
    dtype = np.dtype(stats["megatron_dtype"]) if stats.get("megatron_dtype") else None
    for split, entry in stats["splits"].items():
        if "megatron_prefix" in entry:
            prefix = out_dir / entry["megatron_prefix"]
            sizes = {s: (prefix.with_name(prefix.name + s).stat().st_size
                         if prefix.with_name(prefix.name + s).is_file() else None) for s in (".bin", ".idx")}
            want = {".bin": entry["tokens"] * dtype.itemsize, ".idx": megatron_idx_size(entry["documents"])}
            problems += [f"{entry['megatron_prefix']}{s}: {sizes[s]} bytes, expected {want[s]}"
                         for s in sizes if sizes[s] != want[s]]
        if "parquet_files" in entry:
            rows = values = 0
            for name in entry["parquet_files"]:
                meta = pq.ParquetFile(out_dir / name).metadata
                rows += meta.num_rows
                column = next(i for i in range(meta.num_columns)
                              if meta.schema.column(i).path.split(".")[0] == "input_ids")  # the ids' leaf column
                values += sum(meta.row_group(g).column(column).num_values for g in range(meta.num_row_groups))
            if (rows, values) != (entry["documents"], entry["tokens"]):
                problems.append(f"parquet {split}: {rows} rows / {values} token ids, expected "
                                f"{entry['documents']} / {entry['tokens']}")
    return problems


__all__ = ["EXPORT_FORMAT", "EXPORT_VERSION", "FORMATS", "PARQUET_SCHEMA", "export_shards", "megatron_dtype",
           "megatron_idx_size", "verify_export", "write_megatron", "write_parquet"]
