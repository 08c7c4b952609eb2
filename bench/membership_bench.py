"""`kiln audit membership --text` at corpus size: the exact search of the texts as read, through the filter stage's
intake hashes, against reading and hashing every raw text (the path it replaced, still taken for a raw partition no
hashes cover).

    .venv/bin/python bench/membership_bench.py [--documents 20000] [--config configs/default.yaml]

Writes a synthetic corpus (kiln.curation.synthetic: web-like English, some with PII and junk), reads and filters it
with the config's first web profile (the process pool, all cores), then times one question by text three ways: the
whole exact search (curated and intake hashes), the raw scan of the same partition alone, and a question for a text
a filter removed. Prints per-document costs and the ratio; quote them with the machine named.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.common.config import load_config  # noqa: E402
from kiln.common.storage import Store  # noqa: E402
from kiln.curation.pipeline import filter_documents, ingest, profile_steps  # noqa: E402
from kiln.curation.synthetic import write_corpus  # noqa: E402
from kiln.engine import ProcessPool  # noqa: E402
from kiln.governance.catalog import FILTERED, RAW, Catalog  # noqa: E402
from kiln.governance.membership import _exact_matches, _scan_raw  # noqa: E402

PARTITION = "web/2026-01-01"


def timed(fn, repeat: int) -> tuple[float, object]:
    seconds, result = [], None
    for _ in range(repeat):
        started = time.perf_counter()
        result = fn()
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), result


def build(tmp: Path, documents: int, config_path: str):
    corpus = tmp / "corpus"
    write_corpus(corpus, documents)
    base = load_config(config_path)
    web = next(s for s in base.sources if s.domain == "web")
    config = base.model_copy(update={"sources": [web.model_copy(update={
        "name": "web", "kind": "jsonl", "path": str(corpus / "*.jsonl"), "max_documents": None})]})
    source, store, pool = config.sources[0], Store(tmp / "data"), ProcessPool(os.cpu_count() or 1)
    with store.staging(RAW, PARTITION) as w:
        read = ingest(source, config.reading, w, pool, progress=False)
        raw = w.commit(code_version="bench", config={}, inputs={}, counts={"documents": read.docs_out},
                       stats=read.to_dict())
    steps = profile_steps(config, "web")
    with store.staging(FILTERED, PARTITION) as w:
        started = time.perf_counter()
        stats = filter_documents(store.files(RAW, PARTITION, "documents"), steps, config.curation.exact_dedup, w, pool,
                                 progress=False)
        filter_seconds = time.perf_counter() - started
        w.commit(code_version="bench", config={"steps": [s.model_dump() for s in steps],
                                               "exact_dedup": config.curation.exact_dedup.model_dump()},
                 inputs={f"{RAW}/{PARTITION}": raw.data_version}, counts={"documents": stats.docs_out},
                 stats=stats.to_dict())
    return config, store, stats, filter_seconds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, default=20_000)
    ap.add_argument("--config", default="configs/default.yaml")
    args = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        config, store, stats, filter_seconds = build(Path(tmp), args.documents, args.config)
        catalog = Catalog(store)
        raw_docs = store.read_table(RAW, PARTITION, columns=["doc_id", "text"])
        removed = store.read_table(FILTERED, PARTITION, "rejected", columns=["doc_id"]).column("doc_id").to_pylist()
        texts = dict(zip(raw_docs.column("doc_id").to_pylist(), raw_docs.column("text").to_pylist()))
        chars = sum(map(len, texts.values()))
        query = texts[removed[0]] if removed else next(iter(texts.values()))
        indexed, found = timed(lambda: _exact_matches(catalog, config, query), 3)
        assert removed[:1] == [d for d in found[0] if d in removed[:1]], "the removed document was not found"
        absent, _ = timed(lambda: _exact_matches(catalog, config, "a text nobody wrote " * 40), 3)
        scan, scanned = timed(lambda: _scan_raw(catalog, config, PARTITION, query), 1)
        assert set(scanned) <= set(found[0]), "the scan found a document the hashes did not"
        hash_bytes = sum(os.path.getsize(p) for p in store.files(FILTERED, PARTITION, "intake_hashes"))
        raw_bytes = sum(os.path.getsize(p) for p in store.files(RAW, PARTITION, "documents"))
        n = len(texts)
        print(f"machine: {platform.node()} ({os.cpu_count()} cores), {platform.processor() or platform.machine()}")
        print(f"corpus: {n:,} raw documents, {chars / n:,.0f} characters each on average; the filter kept "
              f"{stats.docs_out:,} and removed {stats.docs_in - stats.docs_out:,}, in {filter_seconds:.1f} s "
              f"({n / filter_seconds:,.0f} docs/s on {os.cpu_count()} processes)")
        print(f"intake hashes: {hash_bytes / n:.1f} bytes a document on disk ({hash_bytes / raw_bytes:.2%} of the raw "
              f"documents' Parquet)")
        print(f"exact search by text, a removed document's: {indexed * 1e3:,.1f} ms "
              f"({indexed / n * 1e6:.2f} us a document, curated hashes included)")
        print(f"exact search by text, a text in no document: {absent * 1e3:,.1f} ms")
        print(f"the raw scan it replaces, this partition alone: {scan * 1e3:,.1f} ms ({scan / n * 1e6:.1f} us a "
              f"document); {scan / indexed:,.0f}x the search through the hashes")
        hours = 1e9 / n / 3600  # a question's seconds here, scaled to 1e9 documents, in hours
        print(f"at 1e9 raw documents: {indexed * hours:,.1f} h per question through the hashes, "
              f"{scan * hours:,.0f} h by the raw scan (one process; linear in the corpus both)")


if __name__ == "__main__":
    main()
