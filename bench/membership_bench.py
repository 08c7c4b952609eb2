"""`kiln audit membership --text` at two corpus sizes: the exact search of the texts as read, through the filter
stage's intake hashes (bucketed by hash: one file a partition is opened), against reading and hashing every raw text
(the path it replaced, still taken for a raw partition no hashes cover).

    .venv/bin/python bench/membership_bench.py [--documents 5000 20000] [--config configs/default.yaml] [--s3]

For each size, writes a synthetic corpus (kiln.curation.synthetic: web-like English, some with PII and junk), reads
and filters it with the config's first web profile (the process pool, all cores), then times one question by text
three ways: the whole exact search for a text a filter removed, for a text in no document, and the raw scan of the
same partition alone. Prints per-size figures and how each grows with the corpus; quote them with the machine named.

With --s3, the largest size again on S3 storage (moto's server on loopback, a real S3 API): the whole question
(`kiln audit membership --text`: the exact search, then the document traced through each stage) from an auditor's
empty cache, with the bytes and GETs it fetched, against fetching the datasets it reads whole, as it did before
audits read columns by ranged GETs. Loopback has no network latency: on S3 each GET costs tens of milliseconds more,
so the GET counts are printed to scale by.
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


def build(tmp: Path, documents: int, config_path: str, store: Store | None = None, rows_per_part: int | None = None):
    corpus = tmp / "corpus"
    write_corpus(corpus, documents)
    base = load_config(config_path)
    web = next(s for s in base.sources if s.domain == "web")
    reading = base.reading.model_copy(update={"rows_per_part": rows_per_part or base.reading.rows_per_part})
    config = base.model_copy(update={"reading": reading, "sources": [web.model_copy(update={
        "name": "web", "kind": "jsonl", "path": str(corpus / "*.jsonl"), "max_documents": None})]})
    source, store, pool = config.sources[0], store or Store(tmp / "data"), ProcessPool(os.cpu_count() or 1)
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


def measure_s3(documents: int, config_path: str, rows_per_part: int) -> dict:
    from moto.server import ThreadedMotoServer

    from kiln.common.remote import S3Remote
    from kiln.governance.membership import membership

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        import boto3

        host, port = server.get_host_and_port()
        client = boto3.client("s3", endpoint_url=f"http://{host}:{port}", region_name="us-east-1",
                              aws_access_key_id="bench", aws_secret_access_key="bench")
        client.create_bucket(Bucket="bench")
        fetched = {"bytes": 0, "gets": 0}

        def count(parsed, **_):  # every GET's body: what an auditor's machine downloads
            fetched["bytes"] += parsed.get("ContentLength", 0)
            fetched["gets"] += 1

        client.meta.events.register("after-call.s3.GetObject", count)
        remote = S3Remote.connect(client, "bench")
        with tempfile.TemporaryDirectory() as tmp:
            config, store, _, _ = build(Path(tmp), documents, config_path, Store(Path(tmp) / "writer", remote),
                                        rows_per_part)
            part_bytes = [f.bytes for f in store.manifest(RAW, PARTITION).files_with_role("documents")]
            removed = store.read_table(FILTERED, PARTITION, "rejected", columns=["doc_id"]).column("doc_id")
            query = store.values(RAW, PARTITION, "text", {removed[0].as_py()})[removed[0].as_py()]
            runs = []
            for n in range(3):  # a fresh auditor each time: an empty cache
                fetched.update(bytes=0, gets=0)
                started = time.perf_counter()
                answer = membership(Store(Path(tmp) / f"auditor-{n}", remote), config, text=query)
                runs.append((time.perf_counter() - started, dict(fetched)))
                assert removed[0].as_py() in [answer.doc_id, *(m["doc_id"] for m in answer.other_matches)], \
                    answer.summary
            seconds, got = sorted(runs, key=lambda r: r[0])[1]
            fetched.update(bytes=0, gets=0)
            started = time.perf_counter()
            whole = Store(Path(tmp) / "whole", remote)
            for asset in (RAW, FILTERED):  # what the question read before: each dataset it opened, whole
                whole.snapshot(asset, PARTITION)
            return {"documents": documents, "rows_per_part": rows_per_part, "part_bytes": max(part_bytes),
                    "s": seconds, "bytes": got["bytes"], "gets": got["gets"],
                    "whole_s": time.perf_counter() - started, "whole_bytes": fetched["bytes"],
                    "whole_gets": fetched["gets"]}
    finally:
        server.stop()


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
    ap.add_argument("--s3", action="store_true", help="the largest size again on S3 storage (moto's server)")
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
    if args.s3:
        rows = load_config(args.config).reading.rows_per_part
        for r in (measure_s3(max(args.documents), args.config, n) for n in (rows, 10 * rows)):
            print(f"on S3 (moto on loopback), {r['documents']:,} raw documents in parts of {r['rows_per_part']:,} "
                  f"(reading.rows_per_part; up to {r['part_bytes'] / 1e6:.2f} MB), from an empty cache: the whole "
                  f"question by text in {r['s'] * 1e3:,.0f} ms, {r['bytes'] / 1e6:,.2f} MB in {r['gets']} GETs; "
                  f"fetching the datasets it reads whole (before) {r['whole_s'] * 1e3:,.0f} ms, "
                  f"{r['whole_bytes'] / 1e6:,.2f} MB in {r['whole_gets']} GETs: {r['whole_bytes'] / r['bytes']:,.1f}x "
                  f"the bytes")


if __name__ == "__main__":
    main()
