"""Near-dup dedup throughput and memory on text from this machine, with planted near-copies.

    .venv/bin/python bench/dedup_bench.py [--docs 20000] [--copies 0.3]
    .venv/bin/python bench/dedup_bench.py --signers-only [--docs 20000]

Documents are ~2 KB windows of the Python standard library's sources and docs (already on every
machine); a share of them get a lightly edited copy (so the LSH has real candidates to verify). One refresh
of them goes through `signing.compute_signatures` and `buckets.decide_distributed` (what `dedup_index` runs) on
SERIAL (this process) and on a ProcessPool of every core. Prints, per engine: docs/s and MB/s from signature
parts to decisions and from text to decisions, per core both as wall rate / workers and as MB per CPU-second
(this process and its workers: fair on a loaded machine), the decide stages' seconds, verification cost per
candidate pair, and the bucket index's bytes on disk per accepted document; and whether both engines decided
the same. Figures are for the machine it runs on.

First, the signers alone (`--signers-only` stops there): MB/s of text -> (signature, shingle set) in this one
process (one core) for the default scheme (SCHEME_FAST, vectorized), the older affine32 (SCHEME: blake2b shingles,
datasketch MinHash; still selectable with dedup.near.scheme) and datasketch's own MinHash (sha1 per 5-gram of
whitespace words) for reference, on the stdlib corpus and on a non-ASCII variant of it; then their LSH quality on planted pairs of shingle sets
with exact Jaccard: mean and spread of the estimate, per-band and candidate rates against the S-curve.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import platform
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

import numpy as np
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.common.config import NearDedup  # noqa: E402
from kiln.curation.documents import DOCUMENT_SCHEMA  # noqa: E402
from kiln.dedup.buckets import decide_distributed, read_decisions  # noqa: E402
from kiln.dedup.fast_minhash import similarity_sketches  # noqa: E402
from kiln.dedup.lsh import candidate_probability, choose_bands  # noqa: E402
from kiln.dedup.minhash import SCHEME, SCHEME_FAST, sign_texts  # noqa: E402
from kiln.dedup.signing import compute_signatures, signature_groups  # noqa: E402
from kiln.engine import SERIAL, ProcessPool  # noqa: E402


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


def write_parts(docs: list[str], folder: Path, rows: int = 1000, ids: list[str] | None = None,
                urls: list[str] | None = None) -> list[Path]:
    """The texts `docs` as DOCUMENT_SCHEMA parts of `rows` under `folder`; doc_ids `ids` (default d0, d1, ...)."""
    ids = ids or [f"d{i}" for i in range(len(docs))]
    urls = urls or [None] * len(docs)
    paths = []
    for k in range(0, len(docs), rows):
        n = len(docs[k:k + rows])
        table = pa.table({"doc_id": ids[k:k + rows], "source": ["bench"] * n,
                          "text": pa.array(docs[k:k + rows], pa.large_string()), "url": urls[k:k + rows],
                          "license": [None] * n, "meta": ["{}"] * n}, schema=DOCUMENT_SCHEMA)
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
        signers = {f"{SCHEME}": lambda: sign_texts(texts, near, SCHEME),
                   f"{SCHEME_FAST} (default)": lambda: sign_texts(texts, near, SCHEME_FAST),
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
                  f"({max(cpu[name]) / max(cpu[SCHEME]):.1f}x {SCHEME})")


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


def cpu_seconds() -> float:
    """CPU seconds of this process and all its descendants alive now (the pool's forkserver and workers persist)."""
    me = psutil.Process()
    procs = [me, *me.children(recursive=True)]
    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:
            pass
    return total


def index_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=20_000)
    ap.add_argument("--copies", type=float, default=0.3, help="share of documents that are edited copies")
    ap.add_argument("--signers-only", action="store_true", help="only the signers' speed and LSH quality")
    args = ap.parse_args()
    near, cores = NearDedup(), os.cpu_count() or 1
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores, Python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.1f}")
    docs = make_documents(args.docs, args.copies)
    mb = sum(len(d.encode()) for d in docs) / 1e6
    print(f"corpus: {len(docs):,} documents, {mb:.1f} MB (stdlib text, {args.copies:.0%} edited copies)")
    signer_speeds(docs, near)
    signer_quality(near)
    if args.signers_only:
        return

    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        groups = signature_groups(write_parts(docs, tmp), near.rows_per_part)  # as minhash_signatures joins parts
        digests = set()
        for workers in sorted({1, cores}):
            # Fresh outputs per engine: compute_signatures resumes (skips) parts already written.
            sig_parts = [tmp / f"sig-{workers}-{i:05d}.parquet" for i in range(len(groups))]
            engine = SERIAL if workers == 1 else ProcessPool(workers=workers)
            engine.map_parts(len, [[0], [1]], desc="warm", progress=False)  # the pool's start is not the stage's
            c0, t0 = cpu_seconds(), time.perf_counter()
            compute_signatures(groups, sig_parts, near, engine=engine, progress=False)
            sign_s, sign_cpu = time.perf_counter() - t0, cpu_seconds() - c0
            out = tmp / f"out-{workers}"
            c0, t0 = cpu_seconds(), time.perf_counter()
            stats = decide_distributed(sig_parts, {"bench": (1, 0)}, [], tmp / "work", out, near, "bench",
                                       engine=engine)
            decide_s, decide_cpu = time.perf_counter() - t0, cpu_seconds() - c0
            decisions = read_decisions(out)
            digests.add(hashlib.sha256(str(decisions.to_pylist()).encode()).hexdigest())
            name = "SERIAL (this process)" if workers == 1 else f"ProcessPool({workers})"
            v = stats["verification"]
            print(f"{name}: {stats['documents']:,} documents, {stats['kept']:,} kept, "
                  f"{len(docs) - stats['kept']:,} near-duplicates removed; {v['candidate_pairs']:,} candidate pairs "
                  f"verified, {v['false_candidate_share']:.0%} false")
            for label, secs, cpu in [("signature parts -> decisions", decide_s, decide_cpu),
                                     ("text -> signatures -> decisions", sign_s + decide_s, sign_cpu + decide_cpu)]:
                print(f"  {label:<32} {len(docs) / secs:7,.0f} docs/s, {mb / secs:5.2f} MB/s wall; per core "
                      f"{len(docs) / secs / workers:7,.0f} docs/s, {mb / secs / workers:5.2f} MB/s (wall / {workers}), "
                      f"{mb / cpu:5.2f} MB per CPU-second")
            timing = stats["timing"]
            print("  decide_distributed stages, seconds (wall): " + ", ".join(
                f"{k} {v:.2f}" for k, v in timing.items() if k != "total_seconds") + f"; total {timing['total_seconds']:.2f}")
            print(f"  verification: {timing['verify'] / max(v['verified'], 1) * 1e6:.1f} µs per candidate pair "
                  f"(the verify stage's wall time, reading included)")
            size = index_bytes(out / "index")
            print(f"  bucket index on disk: {size / 1e6:.1f} MB for {stats['kept']:,} accepted documents, "
                  f"{size / max(stats['kept'], 1):,.0f} bytes per document "
                  f"({size / max(stats['kept'], 1) * 1e6 / 2**30:.2f} GiB per million; shingle sets included)")
        print(f"decisions identical on every engine: {len(digests) == 1}")


if __name__ == "__main__":
    main()
