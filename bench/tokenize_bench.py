"""Tokenizer, token-shard and loader throughput on this machine's own text (the Python standard library).

    .venv/bin/python bench/tokenize_bench.py [--max-mb 32] [--vocab-size 8000] [--sample-mb 10]

Corpus: every stdlib `.py` file (source: code, domain code) plus the stdlib's docs (pydoc topics and
module/class/function docstrings; source: docs), read from `sysconfig.get_paths()['stdlib']`. Trains a
tokenizer on a sample, then prints:
- tokenization MB/s: one process (sentencepiece, one thread), one process with sentencepiece's own
  thread pool, and the parallel path `write_token_shards` uses (a process pool over Parquet parts);
- shard write MB/s (mixing, shuffling and writing the shards, after tokenization);
- loader tokens/s (ShardLoader over every training sequence).
Figures are for the machine printed first; quote them with it.
"""

from __future__ import annotations

import argparse
import ast
import os
import platform
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow as pa  # noqa: E402

from kiln.common.config import Mixture, ShardSettings, TokenizerSettings  # noqa: E402
from kiln.common.storage import write_parquet_atomic  # noqa: E402
from kiln.curation.documents import DOCUMENT_SCHEMA, Document, make_doc_id  # noqa: E402
from kiln.engine import ProcessPool  # noqa: E402
from kiln.tokens.mixture import SourceParts  # noqa: E402
from kiln.tokens.shard_writer import write_token_shards  # noqa: E402
from kiln.tokens.tokenizer import Tokenizer, draw_training_sample, train_tokenizer  # noqa: E402


def stdlib_corpus(max_bytes: int) -> tuple[list[str], list[str]]:
    """(code texts, docs texts) from the standard library, code up to `max_bytes` of UTF-8."""
    root = Path(sysconfig.get_paths()["stdlib"])
    code, docs, size = [], [], 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        if size + len(text.encode()) > max_bytes:
            break
        code.append(text)
        size += len(text.encode())
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        strings = [ast.get_docstring(n, clean=True) for n in ast.walk(tree)
                   if isinstance(n, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)]
        if doc := "\n\n".join(s for s in strings if s):
            docs.append(doc)
    try:
        import pydoc_data.topics
        docs += list(pydoc_data.topics.topics.values())
    except ImportError:
        pass
    return code, docs


def write_source(root: Path, name: str, texts: list[str], rows_per_part: int, language: str,
                 domain: str) -> SourceParts:
    """The texts as Parquet document parts, as the curation stages leave them."""
    (root / name).mkdir(parents=True)
    parts = []
    for k in range(0, len(texts), rows_per_part):
        rows = [Document(make_doc_id(name, str(i)), name, t, meta={"language": language}).to_row()
                for i, t in enumerate(texts[k:k + rows_per_part], start=k)]
        parts.append(root / name / f"part-{len(parts):05d}.parquet")
        write_parquet_atomic(parts[-1], pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA))
    return SourceParts(name, domain, parts)


def mb(texts: list[str]) -> float:
    return sum(len(t.encode("utf-8")) for t in texts) / 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-mb", type=float, default=32, help="stdlib source to read (MB)")
    ap.add_argument("--vocab-size", type=int, default=8000)
    ap.add_argument("--sample-mb", type=float, default=10, help="tokenizer training sample (million characters)")
    ap.add_argument("--seq-len", type=int, default=1024)
    ap.add_argument("--batch-size", type=int, default=16)
    args = ap.parse_args()
    cores = os.cpu_count() or 1
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores, Python {platform.python_version()}, "
          f"{platform.system()} {platform.release()}")

    code, docs = stdlib_corpus(int(args.max_mb * 1e6))
    texts = code + docs
    total_mb = mb(texts)
    print(f"corpus: {len(code):,} stdlib files ({mb(code):.1f} MB) + {len(docs):,} docs ({mb(docs):.1f} MB)\n")

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        sources = [write_source(tmp, "code", code, rows_per_part=100, language="python", domain="code"),
                   write_source(tmp, "docs", docs, rows_per_part=100, language="en", domain="reference")]
        settings = TokenizerSettings(vocab_size=args.vocab_size, sample_chars=int(args.sample_mb * 1e6),
                                     sample_documents=1_000_000)
        t0 = time.perf_counter()
        sample = draw_training_sample(sources, {}, settings)
        t1 = time.perf_counter()
        card = train_tokenizer(sample, settings, tmp / "tok")
        t2 = time.perf_counter()
        print(f"tokenizer: {card.vocab_size} pieces ({card.model_type}), sample {sample.chars / 1e6:.1f}M chars / "
              f"{sample.document_count:,} docs drawn in {t1 - t0:.1f} s, trained in {t2 - t1:.1f} s "
              f"({settings.num_threads or cores} threads)")
        tok = Tokenizer.load(tmp / "tok")

        print(f"\n{'tokenization':<58}{'seconds':>9}{'MB/s':>9}{'Mtok/s':>9}")
        t0 = time.perf_counter()
        ids = tok.encode_batch(texts, num_threads=1)
        single = time.perf_counter() - t0
        n_tokens = sum(map(len, ids))
        del ids
        print(f"{'1 process, 1 thread (Tokenizer.encode_batch)':<58}{single:>9.2f}{total_mb / single:>9.2f}"
              f"{n_tokens / single / 1e6:>9.2f}")
        t0 = time.perf_counter()
        tok.encode_batch(texts, num_threads=cores)
        threaded = time.perf_counter() - t0
        print(f"{f'1 process, {cores} sentencepiece threads':<58}{threaded:>9.2f}{total_mb / threaded:>9.2f}"
              f"{n_tokens / threaded / 1e6:>9.2f}")

        # The pool's first run pays for starting the forkserver (imports, ~1 s); later runs find it warm.
        runs = {}
        for workers, note in [(1, ""), (cores, ", cold pool"), (cores, ", warm pool")][: 3 if cores > 1 else 1]:
            out = tmp / f"shards-{workers}{note.replace(' ', '').replace(',', '-')}"
            shard_settings = ShardSettings(seq_len=args.seq_len, val_fraction=0.01)
            runs[workers] = (write_token_shards(sources, tmp / "tok", shard_settings, Mixture(), out,
                                                ProcessPool(workers=workers), progress=False), out)
            secs = runs[workers][0].seconds["tokenize"]
            label = f"write_token_shards, {workers} process{'es' if workers > 1 else ''}{note} (FIM on code)"
            print(f"{label:<58}{secs:>9.2f}{total_mb / secs:>9.2f}{n_tokens / secs / 1e6:>9.2f}")

        result, out = runs[cores]
        shard_mb = sum((out / s.path).stat().st_size for s in result.shards) / 1e6
        write = result.seconds["write"]
        tokens = result.counts()["train_tokens"] + result.counts()["val_tokens"]
        print(f"\nshard write (mix, shuffle, copy, write): {len(result.shards)} shards, {shard_mb:.1f} MB, {tokens:,} tokens "
              f"in {write:.2f} s = {shard_mb / write:.0f} MB/s ({tokens / write / 1e6:.0f} M tokens/s)")

        # The shards hold no manifest here; write the stats file the loader reads (a DatasetWriter would).
        import json

        from training_jobs.loader import ShardLoader  # here, not at the top: pool workers re-import this script
        (out / "_manifest.json").write_text(json.dumps({"stats": result.manifest_stats()}))
        loader = ShardLoader(out, seq_len=args.seq_len, batch_size=args.batch_size,
                             expected_tokenizer_sha256=tok.sha256)
        t0 = time.perf_counter()
        batches = sum(1 for _ in loader)
        secs = time.perf_counter() - t0
        tokens = batches * args.batch_size * args.seq_len
        print(f"loader: {batches:,} batches of {args.batch_size}x{args.seq_len} = {tokens:,} tokens in {secs:.2f} s = "
              f"{tokens / secs / 1e6:.2f} M tokens/s ({batches / secs:,.0f} batches/s)")


if __name__ == "__main__":
    main()
