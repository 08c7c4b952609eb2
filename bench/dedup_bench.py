"""Near-dup dedup throughput and memory on text from this machine, with planted near-copies.

    .venv/bin/python bench/dedup_bench.py [--docs 20000] [--copies 0.3] [--redis redis://127.0.0.1:6379/0]
    .venv/bin/python bench/dedup_bench.py --signers-only [--docs 20000]

Documents are ~2 KB windows of the Python standard library's sources and docs (already on every
machine); a share of them get a lightly edited copy (so the LSH has real candidates to verify). Prints:
signatures/s on one core and on all cores, LSH insert and query rate (local; Redis when --redis is
given or a redis-server binary is on PATH), verification cost per candidate pair, end-to-end docs/s,
and memory per million documents extrapolated linearly from the measured per-document sizes:
bytes of the columnar batch (signature + shingle set), of the in-memory LSH band tables (tracemalloc
over the inserts), and of the local index on disk. Figures are for the machine it runs on.

First, the signers alone (`--signers-only` stops there): MB/s of text -> (signature, shingle set) in this one
process (one core) for today's scheme (blake2b shingles, datasketch affine32 MinHash), the next one
(SCHEME_FAST, vectorized) and datasketch's own MinHash (sha1 per 5-gram of whitespace words) for reference,
on the stdlib corpus and on a non-ASCII variant of it; then their LSH quality on planted pairs of shingle sets
with exact Jaccard: mean and spread of the estimate, per-band and candidate rates against the S-curve.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import socket
import subprocess
import sys
import sysconfig
import tempfile
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.config import DedupIndexSettings, NearDedup  # noqa: E402
from kiln.dedup.index import open_index  # noqa: E402
from kiln.dedup.minhash import (SCHEME, SCHEME_FAST, candidate_probability, choose_bands,  # noqa: E402
                                compute_signatures, jaccard, sign_texts, similarity_sketches)
from kiln.dedup.near import Batch, near_dedup  # noqa: E402
from kiln.documents import DOCUMENT_SCHEMA  # noqa: E402
from kiln.engine import ProcessPool  # noqa: E402


def machine_text(limit_bytes: int) -> str:
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    chunks, total = [], 0
    for path in sorted(stdlib.rglob("*.py")):
        if "test" in path.parts:
            continue
        try:
            t = path.read_text(encoding="utf-8")
        except (UnicodeDecodeError, OSError):
            continue
        chunks.append(t)
        total += len(t)
        if total >= limit_bytes:
            break
    return "\n".join(chunks)


def make_documents(n: int, copies: float, seed: int = 0) -> list[str]:
    text = machine_text(n * 2_000 + 1_000_000)
    rng = np.random.default_rng(seed)
    originals = int(n / (1 + copies))
    docs = [text[i * 2000:(i + 1) * 2000] for i in range(originals)]
    for i in rng.choice(originals, n - originals, replace=True):
        words = docs[i].split(" ")
        for p in rng.choice(len(words), max(1, len(words) // 100), replace=False):  # ~1% of words: J ~0.9
            words[p] = "edited"
        docs.append(" ".join(words))
    return docs


def write_parts(docs: list[str], folder: Path, rows: int = 1000) -> list[Path]:
    paths = []
    for k in range(0, len(docs), rows):
        chunk = docs[k:k + rows]
        table = pa.table({"doc_id": [f"d{k + i}" for i in range(len(chunk))], "source": ["bench"] * len(chunk),
                          "text": pa.array(chunk, pa.large_string()), "url": [None] * len(chunk),
                          "license": [None] * len(chunk), "meta": ["{}"] * len(chunk)}, schema=DOCUMENT_SCHEMA)
        paths.append(folder / f"part-{k // rows:05d}.parquet")
        pq.write_table(table, paths[-1])
    return paths


NON_ASCII_WORDS = ["naïve", "Straße", "ΣΟΦΊΑ", "λόγος", "日本語", "данные", "café", "İstanbul", "ﬁle", "—", "“quoted”"]


def non_ascii_variant(docs: list[str]) -> list[str]:
    """Every seventh word from other scripts: the text path that cannot take str's ASCII shortcuts."""
    out = []
    for d in docs:
        words = d.split(" ")
        words[::7] = [NON_ASCII_WORDS[i % len(NON_ASCII_WORDS)] for i in range(len(words[::7]))]
        out.append(" ".join(words))
    return out


def datasketch_minhash(docs: list[str], num_perm: int) -> None:
    from datasketch import MinHash

    for d in docs:
        w = d.lower().split()
        m = MinHash(num_perm=num_perm)
        m.update_batch([" ".join(w[i:i + 5]).encode() for i in range(max(len(w) - 4, 1))])


def signer_speeds(docs: list[str], near: NearDedup, repeats: int = 3) -> None:
    """MB of text -> (signature, shingle set) per second of this process's CPU time (one core; other work on the
    machine does not count against it) and per second of wall time, best of `repeats` interleaved runs."""
    for corpus, texts in [("stdlib text", docs), ("non-ASCII variant", non_ascii_variant(docs))]:
        mb = sum(len(t.encode("utf-8", "surrogatepass")) for t in texts) / 1e6
        signers = {f"today ({SCHEME})": lambda: sign_texts(texts, near, SCHEME),
                   f"next ({SCHEME_FAST})": lambda: sign_texts(texts, near, SCHEME_FAST),
                   "datasketch MinHash, sha1": lambda: datasketch_minhash(texts, near.num_perm)}
        cpu, wall = {name: [] for name in signers}, {name: [] for name in signers}
        for _ in range(repeats):
            for name, run in signers.items():
                c0, t0 = time.process_time(), time.perf_counter()
                run()
                cpu[name].append(mb / (time.process_time() - c0))
                wall[name].append(mb / (time.perf_counter() - t0))
        print(f"signers on {corpus} ({mb:.1f} MB, one process), MB/s per core (CPU time) and wall, best of {repeats}:")
        for name in signers:
            print(f"  {name:<32} {max(cpu[name]):6.2f} per core  {max(wall[name]):6.2f} wall  "
                  f"({max(cpu[name]) / max(cpu[f'today ({SCHEME})']):.1f}x today)")


def planted_pairs(rng, pairs: int, common: int, only: int) -> tuple[np.ndarray, np.ndarray]:
    """Shingle sets with exactly `common` shared and `only` own values each: Jaccard common / (common + 2 only)."""
    v = rng.integers(0, 2**32, (pairs, common + 2 * only), dtype=np.uint64).astype(np.uint32)
    while len(repeated := np.flatnonzero((np.diff(np.sort(v, axis=1), axis=1) == 0).any(axis=1))):
        v[repeated] = rng.integers(0, 2**32, (len(repeated), v.shape[1]), dtype=np.uint64).astype(np.uint32)
    return v[:, :common + only], np.concatenate([v[:, :common], v[:, common + only:]], axis=1)


def signer_quality(near: NearDedup) -> None:
    from datasketch import MinHash

    bands, rows = choose_bands(near.num_perm, near.threshold, near.min_recall)

    def fast(sets):
        return similarity_sketches(np.repeat(np.arange(len(sets)), sets.shape[1]), sets.reshape(-1), len(sets),
                                   near.num_perm, near.seed)

    def reference(sets):
        out = []
        for s in sets:
            m = MinHash(num_perm=near.num_perm, seed=near.seed, hashfunc=int)
            m.update_batch(s.tolist())
            out.append(m.hashvalues.astype(np.uint32))
        return np.array(out)

    print(f"LSH quality on planted pairs ({bands} bands x {rows} rows): estimate mean (sd); band rate vs j^{rows}; "
          f"candidate rate vs S-curve")
    rng = np.random.default_rng(0)
    for common, only in [(8, 1), (40, 5), (160, 20), (800, 100), (120, 40), (100, 50)]:
        j = common / (common + 2 * only)
        for name, sign, pairs in [(SCHEME_FAST, fast, 20_000), ("datasketch", reference, 2_000)]:
            a, b = planted_pairs(rng, pairs, common, only)
            agree = sign(a) == sign(b)
            est = agree.mean(axis=1)
            band = agree[:, :bands * rows].reshape(pairs, bands, rows).all(axis=2)
            print(f"  J {j:.3f}, {common + only:4d} shingles, {name:<18} {pairs:6,} pairs: estimate {est.mean():.4f} "
                  f"({est.std():.4f}); band {band.mean():.4f} vs {j ** rows:.4f}; candidates "
                  f"{band.any(axis=1).mean():.4f} vs {candidate_probability(j, bands, rows):.4f}")


def redis_server() -> tuple[subprocess.Popen | None, str | None]:
    binary = shutil.which("redis-server")
    if binary is None:
        return None, None
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([binary, "--port", str(port), "--save", "", "--appendonly", "no"], stdout=subprocess.DEVNULL)
    time.sleep(0.5)
    return proc, f"redis://127.0.0.1:{port}/0"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--copies", type=float, default=0.3, help="share of documents that are edited copies")
    ap.add_argument("--redis", default=None, help="a Redis URL; default: start redis-server if installed")
    ap.add_argument("--signers-only", action="store_true", help="only the signers' speed and LSH quality")
    args = ap.parse_args()
    near, cores = NearDedup(), os.cpu_count() or 1
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores, Python {platform.python_version()}")
    docs = make_documents(args.docs, args.copies)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"corpus: {len(docs):,} documents, {mb:.1f} MB (stdlib text, {args.copies:.0%} edited copies)")
    signer_speeds(docs, near)
    signer_quality(near)
    if args.signers_only:
        return

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        parts = write_parts(docs, tmp)
        timings = {}
        for workers in sorted({1, cores}):
            out = [tmp / f"sig-{workers}-{i}.parquet" for i in range(len(parts))]
            t0 = time.perf_counter()
            compute_signatures(parts, out, near, engine=ProcessPool(workers=workers), progress=False)
            timings[workers] = time.perf_counter() - t0
            print(f"signatures, {workers} process(es): {len(docs) / timings[workers]:,.0f} docs/s, "
                  f"{mb / timings[workers]:.2f} MB/s ({len(docs) / timings[workers] / workers:,.0f} docs/s per core)")
        table = pa.concat_tables([pq.read_table(p) for p in out])
        batch = Batch.from_tables([(1, table)])
        batch_bytes = batch.signatures.nbytes + batch.shingle_values.nbytes + batch.shingle_offsets.nbytes

        # LSH insert / query on the local backend, with the band tables' memory measured.
        with open_index(DedupIndexSettings(), near, tmp / "idx-probe") as idx:
            tracemalloc.start()
            t0 = time.perf_counter()
            from kiln.dedup.index import IndexedDoc

            idx.add([IndexedDoc(d, "bench", 1, 0, "probe") for d in batch.doc_ids], batch.signatures,
                     [batch.shingles(i) for i in range(len(batch))])
            insert_s = time.perf_counter() - t0
            lsh_bytes = tracemalloc.get_traced_memory()[0]
            tracemalloc.stop()
            t0 = time.perf_counter()
            found = idx.query_many(batch.signatures)
            query_s = time.perf_counter() - t0
            print(f"LSH (local, {idx.params['bands']} bands x {idx.params['rows']} rows): insert "
                  f"{len(batch) / insert_s:,.0f} docs/s, batched query {len(batch) / query_s:,.0f} docs/s "
                  f"({np.mean([len(f) for f in found]):.2f} candidates per document)")

        # Verification cost: exact Jaccard on shingle sets, over real candidate pairs.
        pairs = [(i, int(j[1:])) for i, f in enumerate(found[:5000]) for j in f if int(j[1:]) != i][:20000]
        t0 = time.perf_counter()
        for i, j in pairs:
            jaccard(batch.shingles(i), batch.shingles(j))
        verify_s = time.perf_counter() - t0
        print(f"verification: {verify_s / max(len(pairs), 1) * 1e6:.1f} µs per candidate pair "
              f"({len(pairs):,} pairs, median shingle set {int(np.median(np.diff(batch.shingle_offsets)))})")

        # End to end: signatures (all cores) + decisions against an empty local index + commit.
        with open_index(DedupIndexSettings(), near, tmp / "idx") as idx:
            t0 = time.perf_counter()
            result = near_dedup(batch, idx, near, "bench", progress=False)
            stats = idx.commit()
            decide_s = time.perf_counter() - t0
        removed = len(result.removed())
        total_s = timings[cores] + decide_s
        print(f"decisions: {len(batch) / decide_s:,.0f} docs/s ({removed:,} near-duplicates removed, "
              f"{result.stats['verification']['candidate_pairs']:,} pairs verified, "
              f"{result.stats['verification']['false_candidate_share']:.0%} false candidates)")
        print(f"end to end ({cores} cores): {len(batch) / total_s:,.0f} docs/s, {mb / total_s:.2f} MB/s")
        per_million = 1e6 / len(batch)
        kept = stats["documents"]
        print("memory per million documents (linear extrapolation of measured per-document sizes):")
        print(f"  decision batch (signatures + shingle sets, in RAM): {batch_bytes * per_million / 2**30:.2f} GiB")
        print(f"  LSH band tables in RAM (tracemalloc over the inserts): {lsh_bytes * per_million / 2**30:.2f} GiB")
        print(f"  local index on disk (per accepted document): {stats['bytes'] / kept * 1e6 / 2**30:.2f} GiB")

        proc, url = (None, args.redis) if args.redis else redis_server()
        if url:
            try:
                settings = DedupIndexSettings(backend="redis", redis_url=url, name=f"bench{os.getpid()}")
                with open_index(settings, near, None) as idx:
                    n = min(len(batch), 5000)
                    sub = slice(0, n)
                    from kiln.dedup.index import IndexedDoc

                    t0 = time.perf_counter()
                    idx.add([IndexedDoc(d, "bench", 1, 0, "probe") for d in batch.doc_ids[sub]], batch.signatures[sub],
                            [batch.shingles(i) for i in range(n)])
                    insert_s = time.perf_counter() - t0
                    t0 = time.perf_counter()
                    idx.query_many(batch.signatures[sub])
                    query_s = time.perf_counter() - t0
                    used = idx.client.info("memory")["used_memory"]
                    print(f"LSH (redis {url}): insert {n / insert_s:,.0f} docs/s, batched query {n / query_s:,.0f} docs/s, "
                          f"server memory {used / n * 1e6 / 2**30:.2f} GiB per million documents")
            finally:
                if proc:
                    proc.terminate()
        else:
            print("redis: skipped (no redis-server on PATH and no --redis URL)")


if __name__ == "__main__":
    main()
