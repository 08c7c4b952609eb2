"""How the memory of `token_shards`' driver grows with the number of documents.

    .venv/bin/python bench/shard_memory.py [--docs 50000,200000] [--rows-per-part 5000] [--bucket-rows 5000]
                                           [--sources 2]

For each size, in a fresh process: synthetic documents (24-hex doc_ids as curation makes them, ~40 words each, a
licence and a language; two sources, 70% and 30%, or `--sources` of equal shares) in parts of `--rows-per-part`
rows, a small tokenizer trained on them, then `write_token_shards` on the serial engine under tracemalloc (Python
objects and NumPy arrays) with Arrow's pool peak read after it. The serial engine runs every task in the same
process, one part or one shuffle bucket at a time, so a task's work is in the peak too; it is the same at every size
(parts of `--rows-per-part` documents, buckets of `--bucket-rows` copies), as is a shard's buffer (shards of 2^18
tokens, so that every size fills several), and the slope between two sizes is what the driver keeps per document
(docs/scale.md). Prints bytes per document, and the bytes per shard of the shard set's part of the manifest (its
`stats`, which every training rank reads whole); quote the figures with the machine.
"""

from __future__ import annotations

import argparse
import json
import platform
import random
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from kiln.common.config import Mixture, ShardSettings, TokenizerSettings  # noqa: E402
from kiln.common.storage import write_parquet_atomic  # noqa: E402
from kiln.curation.documents import DOCUMENT_SCHEMA, Document, make_doc_id  # noqa: E402
from kiln.engine import SERIAL  # noqa: E402
from kiln.tokens.mixture import SourceParts  # noqa: E402
from kiln.tokens.shard_writer import write_token_shards  # noqa: E402
from kiln.tokens.tokenizer import draw_training_sample, train_tokenizer  # noqa: E402

_WORDS = ("the of and to in is was for on that with as by at from it an be this which or are have not had one "
          "kiln shard token river mountain engine garden window paper silver market winter coffee").split()


def write_sources(root: Path, docs: int, rows_per_part: int, count: int = 2) -> list[SourceParts]:
    rng = random.Random(7)
    sources = []
    shares = (("web", 0.7), ("books", 0.3)) if count == 2 else [(f"source-{k:02d}", 1 / count) for k in range(count)]
    for name, share in shares:
        (root / name).mkdir(parents=True)
        parts, n = [], int(docs * share)
        for k in range(0, n, rows_per_part):
            rows = [Document(make_doc_id(name, str(i)), name, " ".join(rng.choices(_WORDS, k=40)),
                             license="cc-by-4.0", meta={"language": "en"}).to_row()
                    for i in range(k, min(k + rows_per_part, n))]
            parts.append(root / name / f"part-{len(parts):05d}.parquet")
            write_parquet_atomic(parts[-1], pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA))
        sources.append(SourceParts(name, "web", parts))
    return sources


def one(docs: int, rows_per_part: int, bucket_rows: int, count: int) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sources = write_sources(tmp, docs, rows_per_part, count)
        settings = TokenizerSettings(vocab_size=500, sample_chars=2_000_000, sample_documents=50_000)
        train_tokenizer(draw_training_sample(sources, {}, settings), settings, tmp / "tok")
        tracemalloc.start()
        arrow_before = pa.default_memory_pool().max_memory()
        t0 = time.perf_counter()
        result = write_token_shards(sources, tmp / "tok", ShardSettings(seq_len=256, val_fraction=0.01,
                                                                 tokens_per_shard=1 << 18), Mixture(),
                                    tmp / "out", SERIAL, progress=False, bucket_rows=bucket_rows)
        seconds = time.perf_counter() - t0
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        return {"docs": docs, "python_numpy_peak": peak, "arrow_peak": pa.default_memory_pool().max_memory(),
                "arrow_peak_before": arrow_before, "seconds": round(seconds, 1), "shards": len(result.shards),
                "stats_bytes": len(json.dumps(result.manifest_stats()))}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", default="50000,200000", help="comma-separated sizes, each run in a process of its own")
    ap.add_argument("--rows-per-part", type=int, default=5000)
    ap.add_argument("--bucket-rows", type=int, default=5000, help="copies per shuffle bucket")
    ap.add_argument("--sources", type=int, default=2, help="sources (2: 70%% and 30%%; more: equal shares)")
    ap.add_argument("--one", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one:
        print(json.dumps(one(args.one, args.rows_per_part, args.bucket_rows, args.sources)))
        return
    print(f"machine: {platform.processor() or platform.machine()}, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}")
    rows = []
    for n in (int(x) for x in args.docs.split(",")):
        out = subprocess.run([sys.executable, __file__, "--one", str(n), "--rows-per-part", str(args.rows_per_part),
                              "--bucket-rows", str(args.bucket_rows), "--sources", str(args.sources)],
                             check=True, capture_output=True, text=True).stdout
        rows.append(json.loads(out.strip().splitlines()[-1]))
        r = rows[-1]
        print(f"{n:>10,} documents: Python+NumPy peak {r['python_numpy_peak'] / 2**20:8.1f} MiB, Arrow peak "
              f"{r['arrow_peak'] / 2**20:8.1f} MiB, {r['seconds']} s under tracemalloc, {r['shards']} shards, "
              f"manifest stats {r['stats_bytes']:,} B")
    for a, b in zip(rows, rows[1:]):
        span = b["docs"] - a["docs"]
        print(f"{a['docs']:,} -> {b['docs']:,}: the driver keeps "
              f"{(b['python_numpy_peak'] - a['python_numpy_peak']) / span:.0f} B of Python+NumPy and "
              f"{(b['arrow_peak'] - a['arrow_peak']) / span:.0f} B of Arrow per document; the manifest's stats grow "
              f"{(b['stats_bytes'] - a['stats_bytes']) / max(b['shards'] - a['shards'], 1):.0f} B per shard")


if __name__ == "__main__":
    main()
