"""How the memory of the end-of-run exposure record grows with the number of document copies read.

    .venv/bin/python bench/exposure_memory.py [--copies 100000,400000] [--bucket-rows 50000] [--max-buckets 256]
    .venv/bin/python bench/exposure_memory.py --loader-only --copies 3200000,12800000,25600000 [--excluded 10]

For each size: a synthetic shard set's member and position lists (24-hex doc_ids as curation makes them, two
sources, 100 shards, one copy per document, row groups of a curated part), then, in a fresh process, a stand-in
loader's counts for them (every copy read, a shard at a time) and the join (`_role_exposure` in
kiln/governance/exposure.py, writing exposure.parquet) under tracemalloc (Python objects and NumPy arrays) with
Arrow's pool peak read after it. Then, each in a
process of its own, Arrow's pool peak while the member list is streamed through pyarrow's ParquetFile as it comes
(pre-buffering every row group) and through `parquet_batches`, which every streaming reader of the lists uses; and
tracemalloc's peak while the real `ShardLoader.exposure` counts a shard set of as many documents (5 tokens each,
sequences of 64, its cursor halfway through epoch 1; "a shard's counts": the largest shard's); and both peaks while
the Parquet export names every shard's documents from the same lists (`_ShardRows` in kiln/tokens/interchange.py,
buckets of `--bucket-rows`). `--bucket-rows` below the sizes makes every size join several buckets, so the slope
between two sizes is what the join keeps per copy beyond one bucket (docs/scale.md).
`--max-buckets` below the buckets of a size makes both joins spill in two passes, as past 256 x 2^20 rows
(kiln/common/spill.py). `--excluded N` (with `--loader-only`) leaves out the first document of N shards, as
removal requests on a replayed set do. The peak while the loader opens, what it holds open and how long the
opening took (a second opening, the shards in the page cache) are printed too, and the peak while the same set is
exported for Megatron-LM (`export_shards`, .bin and .idx). Prints bytes per copy; quote the figures with the
machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path
from types import SimpleNamespace

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402
import pyarrow as pa  # noqa: E402
import pyarrow.parquet as pq  # noqa: E402

from kiln.common.manifest import MANIFEST_NAME  # noqa: E402
from kiln.common import spill  # noqa: E402
from kiln.common.spill import bucket_count  # noqa: E402
from kiln.common.storage import parquet_batches  # noqa: E402
from kiln.governance import exposure  # noqa: E402
from kiln.tokens import interchange  # noqa: E402
from kiln.tokens.shard_format import ShardInfo, describe_shard_set, write_shard  # noqa: E402
from kiln.tokens.shard_writer import MEMBERS_SCHEMA, POSITIONS_SCHEMA  # noqa: E402
from training_jobs.loader import ShardLoader  # noqa: E402

SHARDS, TOKENS = 100, 5  # shards of the set; tokens per document
LOADER_SEQ, SHA = 64, "12" * 32  # the set the real loader counts: its sequence length and tokenizer hash
PART_ROWS = 20_000  # rows per row group: token_shards writes the lists a curated part at a time
LOADER_ONLY_SHARD = 32_000  # documents per shard with --loader-only (160,000 tokens)


def write_lists(folder: Path, n: int) -> None:
    """The member and position lists of `n` documents, and the set's manifest."""
    ids = pa.array([f"{i:024x}" for i in range(n)])
    nulls = pa.nulls(n, pa.string())
    source = pa.array(np.where(np.arange(n) % 3, "web", "code").astype(object), pa.string())
    pq.write_table(pa.table([ids, source, pa.array(["train"] * n), pa.array(np.ones(n, np.int32)),
                             pa.array(np.full(n, TOKENS, np.int64)), nulls, nulls, nulls, nulls],
                            schema=MEMBERS_SCHEMA), folder / "members-00000.parquet", row_group_size=PART_ROWS)
    shard_of = np.arange(n) % SHARDS
    pq.write_table(pa.table([pa.array(np.array(_names(), object)[shard_of], pa.string()),
                             pa.array((np.arange(n) // SHARDS).astype(np.int32)), ids], schema=POSITIONS_SCHEMA),
                   folder / "positions-00000.parquet", row_group_size=PART_ROWS)
    files = [{"path": f"{role}-00000.parquet", "role": role, "sha256": "", "bytes": 0}
             for role in ("members", "positions")]
    sources = {s: {"train_tokens": TOKENS * n, "natural_train_tokens": TOKENS * n} for s in ("web", "code")}
    (folder / MANIFEST_NAME).write_text(json.dumps({
        "asset": "token_shards", "partition": "bench", "code_version": "bench", "config": {}, "inputs": {},
        "files": files, "counts": {}, "stats": {"sources": sources}, "data_version": "bench"}))


def _names(shards: int = SHARDS) -> list[str]:
    return [f"shard-{s:05d}.bin" for s in range(shards)]


def stand_in_loader(folder: Path, n: int) -> SimpleNamespace:
    """A loader over those lists whose counts, a shard at a time as ShardLoader.exposure gives them, read every copy
    once."""
    per = np.bincount(np.arange(n) % SHARDS, minlength=SHARDS).tolist()

    def counts():
        for name, k in zip(_names(), per):
            yield name, np.ones(k, np.int32), np.full(k, TOKENS - 1, np.int64)

    shards = [ShardInfo(name, "train", "main", 0, TOKENS * k, k) for name, k in zip(_names(), per)]
    return SimpleNamespace(shard_set=SimpleNamespace(dir=str(folder), shards=shards), exposure=counts,
                           epoch=0, position=1, world_size=1, seq_len=8)


def one(folder: Path, n: int, bucket_rows: int) -> dict:
    loader = stand_in_loader(folder, n)
    join = getattr(exposure, "_role_exposure")
    tracemalloc.start()
    arrow_before = pa.default_memory_pool().max_memory()
    t0 = time.perf_counter()
    with pq.ParquetWriter(folder / exposure.EXPOSURE_FILE, exposure.EXPOSURE_SCHEMA) as out:
        stats = join("train", loader, out, folder / "scratch", bucket_rows)
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    if stats["copies_read"] != n:
        raise SystemExit(f"the join wrote {stats['copies_read']} copies of {n}")
    return {"copies": n, "python_numpy_peak": peak, "arrow_peak": pa.default_memory_pool().max_memory(),
            "arrow_peak_before": arrow_before, "seconds": round(seconds, 2),
            "buckets": bucket_count(n, bucket_rows)}


def stream(folder: Path, reader: str) -> dict:
    """Arrow's pool peak while the member list is iterated 65,536 rows at a time: through `parquet_batches`, or
    through pyarrow's ParquetFile as it comes (pre-buffering)."""
    path, columns = folder / "members-00000.parquet", ["doc_id", "source", "split", "copies"]
    batches = parquet_batches(path, 65_536, columns) if reader == "parquet_batches" else \
        pq.ParquetFile(path).iter_batches(batch_size=65_536, columns=columns)
    rows = sum(len(b) for b in batches)
    return {"rows": rows, "arrow_peak": pa.default_memory_pool().max_memory()}


def write_shards(folder: Path, n: int, shards: int = SHARDS) -> None:
    """A shard set of `n` documents of TOKENS tokens in `shards` shards (one phase) for the real loader to count."""
    per = np.bincount(np.arange(n) % shards, minlength=shards).tolist()
    names = _names(shards)
    for name, k in zip(names, per):
        write_shard(folder / name, np.zeros(k * TOKENS, np.uint16), np.arange(k + 1) * TOKENS, SHA)
    infos = [ShardInfo(name, "train", "main", 0, TOKENS * k, k) for name, k in zip(names, per)]
    stats = describe_shard_set(SHA, 1000, 0, infos, seq_len=LOADER_SEQ)
    (folder / MANIFEST_NAME).write_text(json.dumps({"stats": stats}))


def count(folder: Path, excluded: int = 0) -> dict:
    """tracemalloc's peak (NumPy) while `ShardLoader.exposure` counts, its cursor halfway through epoch 1 (a
    shuffled epoch after a whole one); with `excluded`, the first document of that many shards left out (removal
    requests on a replayed set), and the peak while the loader opens and what it holds open, too."""
    exclude = {path.name: [0] for path in sorted(folder.glob("shard-*.bin"))[:excluded]}
    t0 = time.perf_counter()
    ShardLoader(folder, seq_len=LOADER_SEQ, batch_size=1, expected_tokenizer_sha256=SHA, exclude=exclude)
    open_seconds = time.perf_counter() - t0  # files cached: the ShardLoader below opens them warm too
    tracemalloc.start()
    loader = ShardLoader(folder, seq_len=LOADER_SEQ, batch_size=1, expected_tokenizer_sha256=SHA, exclude=exclude)
    held, open_peak = tracemalloc.get_traced_memory()
    loader.load_state_dict({**loader.state_dict(), "epoch": 1, "position": loader.batches_per_epoch // 2})
    tracemalloc.reset_peak()
    t0 = time.perf_counter()
    kept = max(r.nbytes + t.nbytes for _, r, t in loader.exposure())  # the largest shard's counts
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    return {"python_numpy_peak": peak, "kept": kept, "seconds": round(seconds, 2), "open_peak": open_peak,
            "open_held": held, "open_seconds": round(open_seconds, 3)}


def megatron_export(folder: Path) -> dict:
    """tracemalloc's peak (NumPy) while the shard set is exported for Megatron-LM (.bin and .idx of its one split)."""
    with tempfile.TemporaryDirectory(dir=folder) as out:
        tracemalloc.start()
        t0 = time.perf_counter()
        interchange.export_shards(folder, Path(out), ["megatron"])
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
    return {"megatron_peak": peak, "megatron_seconds": round(seconds, 2)}


def export_rows(folder: Path, bucket_rows: int) -> dict:
    """tracemalloc's and Arrow's peaks while the Parquet export names every shard's documents (`_ShardRows` in
    kiln/tokens/interchange.py: the lists joined, then each shard's doc_ids and sources asked for in order)."""
    manifest = json.loads((folder / MANIFEST_NAME).read_text())
    interchange._JOIN_BUCKET_ROWS = bucket_rows
    tracemalloc.start()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(dir=folder) as scratch:
        rows = getattr(interchange, "_ShardRows")(folder, manifest, _names(), Path(scratch))
        named = sum(len(rows.get(name)[0]) for name in _names())
    seconds = time.perf_counter() - t0
    _, peak = tracemalloc.get_traced_memory()
    return {"named": named, "python_numpy_peak": peak, "arrow_peak": pa.default_memory_pool().max_memory(),
            "seconds": round(seconds, 2)}


def _child(*args: str) -> dict:
    out = subprocess.run([sys.executable, __file__, *args], check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", default="100000,400000", help="comma-separated sizes, each run in a process of its own")
    ap.add_argument("--bucket-rows", type=int, default=50_000)
    ap.add_argument("--max-buckets", type=int, default=spill.MAX_BUCKETS, help="bucket files written at once")
    ap.add_argument("--loader-only", action="store_true",
                    help="only ShardLoader.exposure's peak, at each size, in shards of 32,000 documents")
    ap.add_argument("--excluded", type=int, default=0,
                    help="with --loader-only: documents excluded, the first of that many shards")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--folder", type=Path, help=argparse.SUPPRESS)
    ap.add_argument("--stream", choices=["parquet_batches", "ParquetFile"], help=argparse.SUPPRESS)
    ap.add_argument("--count", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--export", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--megatron", action="store_true", help=argparse.SUPPRESS)
    args = ap.parse_args()
    spill.MAX_BUCKETS = args.max_buckets
    if args.export:
        print(json.dumps(export_rows(args.folder, args.bucket_rows)))
        return
    if args.count:
        print(json.dumps(count(args.folder, args.excluded)))
        return
    if args.megatron:
        print(json.dumps(megatron_export(args.folder)))
        return
    if args.stream:
        print(json.dumps(stream(args.folder, args.stream)))
        return
    if args.one:
        print(json.dumps(one(args.folder, args.one, args.bucket_rows)))
        return
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}")
    if args.loader_only:
        counted = []
        for n in (int(x) for x in args.copies.split(",")):
            with tempfile.TemporaryDirectory() as tmp:
                write_shards(Path(tmp), n, max(n // LOADER_ONLY_SHARD, 1))  # shards of a size, as real ones
                counted.append({"copies": n, **_child("--count", "--folder", tmp, "--excluded", str(args.excluded)),
                                **_child("--megatron", "--folder", tmp)})
            c = counted[-1]
            print(f"{n:>10,} copies ({n * TOKENS // LOADER_SEQ:,} sequences, {args.excluded} excluded): opening "
                  f"ShardLoader ({c['open_seconds']} s, files in the page cache): NumPy peak "
                  f"{c['open_peak'] / 2**20:.1f} MiB, held {c['open_held'] / 2**20:.1f} MiB; "
                  f"ShardLoader.exposure NumPy peak {c['python_numpy_peak'] / 2**20:.1f} MiB, {c['seconds']} s under "
                  f"tracemalloc; the Megatron export: NumPy peak {c['megatron_peak'] / 2**20:.1f} MiB, "
                  f"{c['megatron_seconds']} s")
        for a, b in zip(counted, counted[1:]):
            per_copy = {k: (b[k] - a[k]) / (b["copies"] - a["copies"]) for k in ("open_peak", "open_held",
                                                                                 "python_numpy_peak", "megatron_peak")}
            print(f"{a['copies']:,} -> {b['copies']:,} per copy: opening peaks at {per_copy['open_peak']:.2f} B and "
                  f"holds {per_copy['open_held']:.2f} B; ShardLoader.exposure peaks at "
                  f"{per_copy['python_numpy_peak']:.2f} B; the Megatron export at {per_copy['megatron_peak']:.2f} B")
        return
    rows = []
    for n in (int(x) for x in args.copies.split(",")):
        with tempfile.TemporaryDirectory() as tmp:
            write_lists(Path(tmp), n)  # here: the measuring processes only read them
            sizes = ("--bucket-rows", str(args.bucket_rows), "--max-buckets", str(args.max_buckets))
            rows.append(_child("--one", str(n), "--folder", tmp, *sizes))
            rows[-1]["streamed"] = streamed = {r: _child("--stream", r, "--folder", tmp)["arrow_peak"]
                                               for r in ("ParquetFile", "parquet_batches")}
            rows[-1]["export"] = exported = _child("--export", "--folder", tmp, *sizes)
        with tempfile.TemporaryDirectory() as tmp:
            write_shards(Path(tmp), n)
            rows[-1]["count"] = counted = _child("--count", "--folder", tmp)
        r = rows[-1]
        print(f"{n:>10,} copies read: Python+NumPy peak {r['python_numpy_peak'] / 2**20:8.1f} MiB, Arrow peak "
              f"{r['arrow_peak'] / 2**20:8.1f} MiB, {r['buckets']} buckets, {r['seconds']} s under tracemalloc; "
              f"the member list streamed: Arrow peak {streamed['ParquetFile'] / 2**20:.1f} MiB through pyarrow's "
              f"ParquetFile as it comes, {streamed['parquet_batches'] / 2**20:.1f} MiB through parquet_batches; "
              f"ShardLoader.exposure: NumPy peak {counted['python_numpy_peak'] / 2**20:.1f} MiB, a shard's counts "
              f"{counted['kept'] / 2**20:.1f} MiB, {counted['seconds']} s under tracemalloc; the Parquet export's "
              f"naming: Python+NumPy peak {exported['python_numpy_peak'] / 2**20:.1f} MiB, Arrow peak "
              f"{exported['arrow_peak'] / 2**20:.1f} MiB, {exported['seconds']} s")
    for a, b in zip(rows, rows[1:]):
        span = b["copies"] - a["copies"]
        print(f"{a['copies']:,} -> {b['copies']:,}: the join keeps "
              f"{(b['python_numpy_peak'] - a['python_numpy_peak']) / span:.1f} B of Python+NumPy and "
              f"{(b['arrow_peak'] - a['arrow_peak']) / span:.1f} B of Arrow per copy read; streaming the member list "
              f"holds {(b['streamed']['ParquetFile'] - a['streamed']['ParquetFile']) / span:.1f} B of Arrow per "
              f"document through ParquetFile as it comes, "
              f"{(b['streamed']['parquet_batches'] - a['streamed']['parquet_batches']) / span:.1f} B through "
              f"parquet_batches; ShardLoader.exposure peaks at "
              f"{(b['count']['python_numpy_peak'] - a['count']['python_numpy_peak']) / span:.1f} B of NumPy per "
              f"copy, a shard's counts {(b['count']['kept'] - a['count']['kept']) / span:.1f} B; "
              f"the Parquet export's naming "
              f"{(b['export']['python_numpy_peak'] - a['export']['python_numpy_peak']) / span:.1f} B of "
              f"Python+NumPy and {(b['export']['arrow_peak'] - a['export']['arrow_peak']) / span:.1f} B of Arrow")


if __name__ == "__main__":
    main()
