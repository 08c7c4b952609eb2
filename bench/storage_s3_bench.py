"""S3 storage throughput: commit (write + upload) and read-back into an empty cache (download + sha256), and a
training run's checkpoint copied up and down by its mirror (kiln/common/run_mirror.py), and what a bounded cache
(`storage.cache_max_gb`) adds to each commit and download while under its bound (one walk of the cache), against
moto's S3 server
started here on loopback. NOT a figure for AWS: moto keeps objects in the memory of
this process and shares its CPU, so it measures Kiln's overhead and the client path, not a network.

    .venv/bin/python bench/storage_s3_bench.py [--files 8] [--mb-per-file 16] [--cache-files 20000]
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import socket
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.common.remote import S3Remote  # noqa: E402
from kiln.common.storage import Store  # noqa: E402
from training_jobs.checkpoint import tag_for, write_manifest  # noqa: E402
from kiln.common.run_mirror import RunMirror  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--files", type=int, default=8)
    parser.add_argument("--mb-per-file", type=int, default=16)
    parser.add_argument("--cache-files", type=int, default=20000, help="files in the cache whose walk is timed")
    args = parser.parse_args()

    import boto3
    from moto.server import ThreadedMotoServer

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    logging.getLogger("werkzeug").setLevel(logging.ERROR)  # one line per request otherwise
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    os.environ.update({"AWS_ACCESS_KEY_ID": "bench", "AWS_SECRET_ACCESS_KEY": "bench",
                       "AWS_DEFAULT_REGION": "us-east-1"})
    client = boto3.client("s3", endpoint_url=f"http://127.0.0.1:{port}")
    remote = S3Remote.connect(client, "kiln-bench", "kiln", create_bucket=True)
    total_mb = args.files * args.mb_per_file
    try:
        with tempfile.TemporaryDirectory() as tmp:
            timings = {}
            for label, store in (("local only", Store(Path(tmp) / "local")), ("s3", Store(Path(tmp) / "s3", remote))):
                start = time.perf_counter()
                with store.staging("token_shards") as writer:
                    for i in range(args.files):
                        (writer.dir / f"shard-{i:05d}.bin").write_bytes(os.urandom(args.mb_per_file << 20))
                    writer.commit(code_version="bench", config={}, inputs={}, counts={})
                timings[label] = time.perf_counter() - start
            start = time.perf_counter()
            Store(Path(tmp) / "fresh", remote).dataset_dir("token_shards")
            pull = time.perf_counter() - start
            # A checkpoint of the same files, up from one machine's run folder and down into another's
            ckpt = Path(tmp) / "machine-a" / "run-key" / "checkpoints" / tag_for(1)
            ckpt.mkdir(parents=True)
            for i in range(args.files):
                (ckpt / f"zero_pp_rank_{i}_mp_rank_00_optim_states.pt").write_bytes(os.urandom(args.mb_per_file << 20))
            write_manifest(ckpt, 1, {})
            start = time.perf_counter()
            assert RunMirror(remote, ckpt.parents[1]).push() == [ckpt.name]
            mirror_push = time.perf_counter() - start
            start = time.perf_counter()
            assert RunMirror(remote, Path(tmp) / "machine-b" / "run-key").pull(print) == ckpt.name
            mirror_pull = time.perf_counter() - start
            # A cache of `--cache-files` files, 100 to a dataset folder, under its bound: each commit and download
            # walks it once (the second walk is timed: the first warms the OS's inode cache, as steps do).
            cache = Path(tmp) / "cache"
            for i in range(args.cache_files):
                folder = cache / "documents" / f"source-{i // 100}"
                folder.mkdir(parents=True, exist_ok=True)
                (folder / f"part-{i % 100:05d}.parquet").write_bytes(b"x" * 1000)
            bounded = Store(cache, remote, cache_max_bytes=1 << 50)
            bounded._bound_cache(spare=cache)
            start = time.perf_counter()
            bounded._bound_cache(spare=cache)
            walk = time.perf_counter() - start
    finally:
        server.stop()
    upload = timings["s3"] - timings["local only"]
    print(f"machine: {platform.node()} ({os.cpu_count()} cores), moto S3 server on loopback (in this process)")
    print(f"dataset: {args.files} files x {args.mb_per_file} MB = {total_mb} MB")
    print(f"commit, local only:            {timings['local only']:.2f} s (write + sha256)")
    print(f"commit with S3:                {timings['s3']:.2f} s -> upload adds {upload:.2f} s "
          f"({total_mb / max(upload, 1e-9):.0f} MB/s)")
    print(f"read into an empty cache:      {pull:.2f} s ({total_mb / pull:.0f} MB/s, download + sha256 verify)")
    print(f"run mirror, checkpoint up:     {mirror_push:.2f} s ({total_mb / mirror_push:.0f} MB/s)")
    print(f"run mirror, checkpoint down:   {mirror_pull:.2f} s ({total_mb / mirror_pull:.0f} MB/s, download + sha256 "
          f"verify)")
    print(f"bounded cache, under its bound: {walk * 1000:.0f} ms per commit or download for {args.cache_files} files "
          f"in the cache")


if __name__ == "__main__":
    main()
