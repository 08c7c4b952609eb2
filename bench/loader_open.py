"""What one training rank's loader costs to open at many shards, by world size.

    .venv/bin/python bench/loader_open.py [--shards 20000] [--world-sizes 1,8,64]

A shard set of `--shards` one-document shards (64 tokens each) and its manifest as a store writes it (indented, with
a file entry per shard), in a temporary folder. First what reading the manifest (`read_shard_set`, the same on
every rank) holds and peaks at (tracemalloc) and takes; then, for each world size W, rank 0's `ShardLoader` opened
(files in the page cache: each is opened once before the timed ones, median of three): the seconds it takes and how
many shard headers it reads (rank r checks shards r, r + W, ...). Quote the figures with the machine; a network file
system's opens cost more than this page cache's.
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import numpy as np  # noqa: E402

import kiln.tokens.shard_format as shard_format  # noqa: E402
from kiln.common.manifest import sha256_file  # noqa: E402
from kiln.tokens.shard_format import ShardInfo, describe_shard_set, read_shard_set, write_shard  # noqa: E402
from training_jobs.loader import ShardLoader  # noqa: E402

SHA = "ab" * 32
TOKENS = 64


def write_set(folder: Path, shards: int) -> None:
    infos, files = [], []
    for k in range(shards):
        name = f"shard-{k:06d}.bin"
        write_shard(folder / name, np.arange(TOKENS, dtype=np.uint16), np.array([0, TOKENS]), SHA)
        infos.append(ShardInfo(name, "train", "main", 0, TOKENS, 1))
        files.append({"bytes": (folder / name).stat().st_size, "path": name, "role": "shard", "rows": None,
                      "sha256": sha256_file(folder / name)})
    stats = describe_shard_set(SHA, 1000, 0, infos, seq_len=16)
    (folder / "_manifest.json").write_text(json.dumps({"files": files, "stats": stats}, indent=2, sort_keys=True))


def median_seconds(run, times: int = 3) -> float:
    seconds = []
    for _ in range(times):
        t0 = time.perf_counter()
        run()
        seconds.append(time.perf_counter() - t0)
    return statistics.median(seconds)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--shards", type=int, default=20_000)
    ap.add_argument("--world-sizes", default="1,8,64", help="comma-separated; rank 0 of each is opened")
    args = ap.parse_args()
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}")
    headers = []
    read_header = shard_format.read_header
    shard_format.read_header = lambda path: headers.append(path) or read_header(path)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_set(folder, args.shards)
        manifest = median_seconds(lambda: read_shard_set(folder))
        tracemalloc.start()
        shard_set = read_shard_set(folder)
        held, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        del shard_set
        size = (folder / "_manifest.json").stat().st_size
        print(f"{args.shards:,} shards: the manifest ({size / 2**20:.1f} MiB) is read in {manifest:.3f} s, holds "
              f"{held / 2**20:.1f} MiB ({held / args.shards:.0f} B per shard) and peaks at {peak / 2**20:.1f} MiB")
        for world_size in (int(w) for w in args.world_sizes.split(",")):
            def open_rank_0(w=world_size):
                return ShardLoader(folder, seq_len=16, batch_size=1, rank=0, world_size=w)

            open_rank_0()  # every file in the page cache
            headers.clear()
            open_rank_0()
            read = len(headers)
            seconds = median_seconds(open_rank_0)
            print(f"{args.shards:,} shards, world size {world_size:>4}: rank 0 opens in {seconds:.3f} s, reading "
                  f"{read:,} shard headers")


if __name__ == "__main__":
    main()
