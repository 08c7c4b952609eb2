"""`kiln audit membership --text` at two corpus sizes: the exact search of the texts as read, through the filter
stage's intake hashes (bucketed by hash: one file a partition is opened), against reading and hashing every raw text
(the path it replaced, still taken for a raw partition no hashes cover).

    .venv/bin/python bench/membership_bench.py [--documents 5000 20000] [--config configs/default.yaml]

For each size, writes a synthetic corpus (kiln.curation.synthetic: web-like English, some with PII and junk), reads
and filters it with the config's first web profile (the process pool, all cores), then times one question by text
three ways: the whole exact search for a text a filter removed, for a text in no document, and the raw scan of the
same partition alone. Prints per-size figures and how each grows with the corpus; quote them with the machine named.
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


def measure(documents: int, config_path: str) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        config, store, stats, filter_seconds = build(Path(tmp), documents, config_path)
        catalog = Catalog(store)
        raw_docs = store.read_table(RAW, PARTITION, columns=["doc_id", "text"])
        removed = store.read_table(FILTERED, PARTITION, "rejected", columns=["doc_id"]).column("doc_id").to_pylist()
        texts = dict(zip(raw_docs.column("doc_id").to_pylist(), raw_docs.column("text").to_pylist()))
        query = texts[removed[0]] if removed else next(iter(texts.values()))
        found_s, found = timed(lambda: _exact_matches(catalog, config, query), 5)
        assert removed[:1] == [d for d in found[0] if d in removed[:1]], "the removed document was not found"
        absent_s, _ = timed(lambda: _exact_matches(catalog, config, "a text nobody wrote " * 40), 5)
        scan_s, scanned = timed(lambda: _scan_raw(catalog, config, PARTITION, query), 1)
        assert set(scanned) <= set(found[0]), "the scan found a document the hashes did not"
        hash_files = store.files(FILTERED, PARTITION, "intake_hashes")
        raw_files = store.files(RAW, PARTITION, "documents")
        return {"documents": len(texts), "chars": sum(map(len, texts.values())) / len(texts), "kept": stats.docs_out,
                "removed": stats.docs_in - stats.docs_out, "filter_s": filter_seconds, "found_s": found_s,
                "absent_s": absent_s, "scan_s": scan_s, "hash_files": len(hash_files), "parts": len(raw_files),
                "hash_bytes": sum(os.path.getsize(p) for p in hash_files),
                "raw_bytes": sum(os.path.getsize(p) for p in raw_files)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--documents", type=int, nargs="+", default=[5_000, 20_000])
    ap.add_argument("--config", default="configs/default.yaml")
    args = ap.parse_args()
    print(f"machine: {platform.node()} ({os.cpu_count()} cores), {platform.processor() or platform.machine()}")
    runs = [measure(n, args.config) for n in args.documents]
    for r in runs:
        n = r["documents"]
        print(f"{n:,} raw documents ({r['chars']:,.0f} characters each on average, {r['parts']} parts): the filter "
              f"kept {r['kept']:,} and removed {r['removed']:,} in {r['filter_s']:.1f} s ({n / r['filter_s']:,.0f} "
              f"docs/s on {os.cpu_count()} processes, the hashes' buckets included)")
        print(f"  intake hashes: {r['hash_files']} bucket file(s), {r['hash_bytes'] / n:.1f} bytes a document on disk "
              f"({r['hash_bytes'] / r['raw_bytes']:.2%} of the raw documents' Parquet)")
        print(f"  exact search by text: {r['found_s'] * 1e3:,.1f} ms for a removed document's, "
              f"{r['absent_s'] * 1e3:,.1f} ms for a text in no document; the raw scan it replaces "
              f"{r['scan_s'] * 1e3:,.1f} ms ({r['scan_s'] / n * 1e6:.1f} us a document), "
              f"{r['scan_s'] / r['found_s']:,.0f}x")
    if len(runs) > 1:
        first, last = runs[0], runs[-1]
        grew = last["documents"] / first["documents"]
        print(f"{grew:.1f}x the documents: the search {last['found_s'] / first['found_s']:.2f}x "
              f"(one bucket file a partition), the raw scan {last['scan_s'] / first['scan_s']:.2f}x")


if __name__ == "__main__":
    main()
