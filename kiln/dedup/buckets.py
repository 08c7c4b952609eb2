"""Near-duplicate decisions without one process holding the corpus: LSH band buckets as Parquet on the store,
candidate pairs, exact verification and connected components as rounds of `Engine.map_parts`, and today's
greedy keep policy (`near_dedup`, the single-process implementation this replaced: tests/old_near_dedup.py) applied
inside each component — the same decisions table.

Stages (every one a map_parts; "→ X/{q}" is a shuffle write, `kiln.dedup.shuffle`: each task writes one file
X/{its own position}.shuffle holding its rows for every partition q, so names never depend on the engine or on
arrival order, and a reader of q takes its segment of each):

  signature parts (one per input part, in source order)        earlier refreshes' index folders
   1 scan      part k: row counts per source ─ ids → ids/{p}   (ids/, buckets/, docs/ per refresh)
   2 already   ids/{p} ⋈ earlier ids (doc_id) → already/{k}          │
   3 keys      part k: the new documents' band keys → keys/{p};      │
               node table → nodes/{k}; (doc, its earlier copy) edges │  (its band keys also kept for 11)
   4 pairs     keys/{p} + earlier buckets/{p} grouped by (band, key) ┘ → pairs by the first doc's part, the
               second docs by theirs
   5 attach    distinct pairs of doc-partition d + d's shingles → by the second doc's part; of a part of this
               refresh, its second docs' shingles set aside (read by row group from an earlier docs file)
   6 verify    exact Jaccard of every pair at once with those shingles; J >= threshold → component edges + hits
   7 components (kiln.dedup.components: large-star / small-star rounds; the last one labels) → labels by
               doc-partition
   8 route     members, hits and the candidate pairs of their first docs → by component
   9 decide    greedy in keep order inside each component → decided rows by part; per second doc, its pairs
               whose first doc was not kept (the `candidates` column is verify's count less these)
  10 final     part k: decisions/decisions-k.parquet (the rows of `near_dedup`, in the same order); its kept docs
  11 persist   this refresh's index folder: buckets, ids, docs; `_index.json` last

With no earlier refresh that is 8 rounds (scan is read from the parts' footers when their statistics show one
source each) and the components' (3 when every component's edges come from one writer: `components.local_stars`);
two more (scan, already) against earlier refreshes.

The rounds' tasks are in `kiln.dedup.bucket_rounds`; the nodes, doc-partitions and Layout they find their inputs
by, in `kiln.dedup.bucket_layout`; the index folders they read and write, in `kiln.dedup.bucket_index`. This module:
the driver (`decide_distributed`), decisions with near-dedup off (`keep_all`), reading a run's decisions, and the
sampled survivor check.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Mapping, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kiln.common.config import NearDedup
from kiln.common.manifest import write_json_atomic
from kiln.common.storage import flush_to_disk, part_files, part_name, row_group_stats, write_parquet_atomic
from kiln.dedup.bucket_index import (
    BUCKET_SCHEMA,
    IDS_SCHEMA,
    INDEX_FORMAT,
    check_index_params,
    doc_id_hash,
    index_params,
    index_part,
    read_index_meta,
    write_index_meta,
    write_index_partition,
)
from kiln.dedup.bucket_layout import Earlier, Layout, LayoutFile, _Task
from kiln.dedup.bucket_rounds import (
    EXAMPLE_CLUSTERS,
    _already,
    _attach,
    _decide,
    _final,
    _keys,
    _pairs,
    _persist,
    _route,
    _scan,
    _verify,
    attach_writer,
)
from kiln.dedup.components import connected_components, partition_of
from kiln.dedup.minhash import bands_rows, estimated_jaccard, jaccard, packed_shingles, shingle_arrays
from kiln.dedup.near import DECISION_SCHEMA, KEPT, NEAR_DUPLICATE
from kiln.dedup.shuffle import read_partition, read_scratch, write_partitioned, write_scratch
from kiln.engine import SERIAL, Engine

# ------------------------------------------------------------------------------------------- driver

KEY_ROWS_PER_PARTITION = 250_000  # band-key rows one shuffled task holds (~25 MB in Arrow) when partitions are automatic


def auto_partitions(documents: int, bands: int) -> int:
    """Key-prefix partitions for `documents` (this refresh's and the earlier refreshes' accepted ones): about
    KEY_ROWS_PER_PARTITION band-key rows each, at least 8, so a task's memory stays flat as the corpus grows (with 8
    fixed partitions, a pairs task held an eighth of every key row)."""
    return max(8, -(-documents * bands // KEY_ROWS_PER_PARTITION))


# Each scratch folder by the round that reads it last: dropped as that round ends (`_Scratch`).
LAST_READER = {"already": ("ids",), "keys": ("already",), "pairs": ("keys",), "attach": ("pairs", "pairs_b"),
               "verify": ("pairs_a", "seconds"), "route": ("cc", "hits", "cands"),
               "decide": ("members", "hit_c", "cand_c"),
               "final": ("nodes", "band_keys", "cand_n", "decided", "uncounted"), "persist": ("kept_keys", "kept_ids")}


class _Scratch:
    """Drops a run's scratch folders once no later round reads them, so the kernel can discard their pages before
    writing them: kept to the end, the keys (1.4 GB at 1M documents) and pairs_a pushed the final round's writes
    past the dirty-page limit, and its workers waited on the disk (2 of 10 core-seconds with two workers). The store
    also holds less scratch at once. One background thread unlinks (~0.3 s of kernel time at 1M, overlapped with the
    next round) after recording each folder's bytes and files, which the run's stats report."""

    def __init__(self, root: Path):
        self.root, self.sizes = root, {}
        self._thread = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-scratch")
        self._pending: list[Future] = []

    def drop(self, names: Sequence[str]) -> None:
        self._pending += [self._thread.submit(self._drop, name) for name in names]

    def _drop(self, name: str) -> None:
        path = self.root / name
        if path.is_dir():
            files = [f for f in path.rglob("*") if f.is_file()]
            self.sizes[name] = {"bytes": sum(f.stat().st_size for f in files), "files": len(files)}
            shutil.rmtree(path)

    def close(self) -> dict[str, dict[str, int]]:
        """Waits for the drops (raising what one raised); the dropped folders' sizes, by name."""
        self._thread.shutdown(wait=True)
        for future in self._pending:
            future.result()
        return dict(sorted(self.sizes.items()))


def _footer_scan(path: Path) -> tuple[int, dict[str, int]] | None:
    """(rows, {source: rows}) of a signature part from its Parquet footer alone, when the `source` statistics of
    every row group show one value and no nulls; None when they do not say (short of exact, equal min and max)."""
    meta = pq.ParquetFile(path).metadata
    if meta.num_rows == 0:
        return 0, {}
    values = set()
    for stats in row_group_stats(meta, "source"):
        if stats is None or not stats.has_min_max or stats.null_count != 0 or stats.min != stats.max:
            return None
        values.add(stats.min)
    if len(values) != 1 or not isinstance(next(iter(values)), str):
        return None
    return meta.num_rows, {values.pop(): meta.num_rows}


def decide_distributed(signature_parts: Sequence[Path], sources: Mapping[str, tuple[int, int]],
                       previous: Sequence[Path], work_dir: Path, out_dir: Path, near: NearDedup, batch_name: str,
                       engine: Engine = SERIAL, partitions: int | None = None, max_bucket: int = 1_000,
                       progress: bool = False) -> dict[str, Any]:
    """Near-duplicate decisions for the documents of `signature_parts` (`signing.compute_signatures` output, given in
    source order, one source per part) against each other and the earlier refreshes' index folders `previous`.

    `sources`: source name -> (quality tier, source order), as `Batch.from_tables` numbers them. Writes
    out_dir/decisions/decisions-{k}.parquet (DECISION_SCHEMA; concatenated in part order they are `near_dedup`'s table)
    and this refresh's index folder out_dir/index (`_index.json` last). `work_dir` is scratch, emptied first; each
    folder in it is deleted once no later round reads it (`_Scratch`).
    `partitions`: of the key shuffle; None: `auto_partitions` (decisions never depend on it).
    With `near.enabled` false the caller keeps (and indexes) every document with `keep_all`; this always decides.
    A caller committing `out_dir` to a store reads `previous` and commits under `bucket_index.index_commit`."""
    t_start = time.perf_counter()
    timing: dict[str, float] = {}
    work_dir, out_dir = Path(work_dir), Path(out_dir)
    shutil.rmtree(work_dir, ignore_errors=True)  # shuffle folders are read by listing: nothing stale may remain
    work_dir.mkdir(parents=True)
    for sub in ("decisions", "index"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    for sub in ("decisions", "index/docs", "index/buckets", "index/ids"):
        (out_dir / sub).mkdir(parents=True)
    for sub in ("nodes", "hits", "cands", "seconds", "band_keys", "cand_n"):
        (work_dir / sub).mkdir()
    params = index_params(near)
    bands, rows = bands_rows(near)
    earlier, base = [], len(signature_parts)
    for path in previous:
        meta = read_index_meta(Path(path))
        check_index_params(path, meta, near)
        earlier.append(Earlier(str(path), meta["partitions"], tuple(meta["doc_parts"]), base))
        base += len(meta["doc_parts"]) - 1
    if partitions is None:
        documents = sum(pq.ParquetFile(p).metadata.num_rows for p in signature_parts)
        partitions = auto_partitions(documents + sum(e.starts[-1] for e in earlier), bands)

    scratch = _Scratch(work_dir)

    def stage(name, fn, layout, items, writers=None):
        t0 = time.perf_counter()
        layout_file = LayoutFile.write(layout, work_dir)
        tasks = [_Task(layout_file, i, None if writers is None else tuple(writers[i])) for i in items]
        out = engine.map_parts(fn, tasks, desc=f"near-dup {name}", progress=progress)
        scratch.drop(LAST_READER.get(name, ()))
        timing[name] = round(time.perf_counter() - t0, 3)
        return out

    common = dict(work=str(work_dir), index=str(out_dir / "index"), decisions=str(out_dir / "decisions"),
                  partitions=partitions, parts=tuple(str(p) for p in signature_parts), keep=tuple(near.keep),
                  bands=bands, rows=rows, threshold=near.threshold, max_bucket=max_bucket, batch=batch_name,
                  earlier=tuple(earlier))
    n_parts = len(signature_parts)
    scan_layout = Layout(**common, starts=(0,) * (n_parts + 1), seq_starts=(0,) * n_parts, tiers=(0,) * n_parts,
                         orders=(0,) * n_parts)
    # Without earlier refreshes the scan only counts rows per source: a part's footer says as much when its
    # statistics show one source (else, or with earlier refreshes, whose ids the scan shuffles, it is a round).
    footers = [] if earlier else [_footer_scan(p) for p in signature_parts]
    scanned = footers if footers and None not in footers else stage("scan", _scan, scan_layout, range(n_parts))
    starts, seq_starts, tiers, orders, seen = [0], [], [], [], Counter()
    for k, (n, counts) in enumerate(scanned):
        names = [s for s in counts if counts[s]]
        if len(names) > 1:
            raise ValueError(f"{signature_parts[k]}: documents of several sources ({names}); one source per part")
        source = names[0] if names else None
        tier, order = sources[source] if source is not None else (0, orders[-1] if orders else 0)
        if orders and order < orders[-1]:
            raise ValueError(f"{signature_parts[k]}: parts must come in source order (source {source!r} after a later "
                             "source)")
        starts.append(starts[-1] + n)
        seq_starts.append(seen[source])
        seen[source] += n
        tiers.append(tier)
        orders.append(order)
    lay = Layout(**common, starts=tuple(starts), seq_starts=tuple(seq_starts), tiers=tuple(tiers), orders=tuple(orders))
    P = partitions

    try:
        already = sum(stage("already", _already, lay, range(P))) if earlier else 0
        new_docs = sum(stage("keys", _keys, lay, range(n_parts)))
        paired = stage("pairs", _pairs, lay, range(P))
        touched = sorted({d for x in paired for d in x["doc_partitions"]})
        attach_parts = sorted(set(touched) | {d for x in paired for d in x["b_parts"]})
        attached = stage("attach", _attach, lay, attach_parts)
        # Each verify task opens the attach files that hold its rows, not all of them (parts x parts opens at scale).
        attach_writers: list[list[str]] = [[] for _ in range(n_parts)]
        for dp, (_, parts) in zip(attach_parts, attached):
            for k in parts:
                attach_writers[k].append(attach_writer(dp))
        distinct = sum(n for n, _ in attached)
        verified = stage("verify", _verify, lay, range(n_parts), writers=attach_writers)
        t0 = time.perf_counter()
        cc = connected_components(work_dir / "cc", P, engine, route=LayoutFile.write(lay, work_dir),
                                  label_partitions=lay.doc_partitions, progress=progress)
        timing["components"] = round(time.perf_counter() - t0, 3)
        routed = set(cc["label_partitions"]) | set(range(n_parts))
        stage("route", _route, lay, sorted(routed))
        decided = stage("decide", _decide, lay, range(P))
        finals = stage("final", _final, lay, range(n_parts))
        stage("persist", _persist, lay, range(P))
    finally:
        dropped = scratch.close()
    kept = sum(f["kept"] for f in finals)
    flush_to_disk(out_dir)  # the final and persist rounds' files, at once (they skip a flush per file)
    write_json_atomic(out_dir / "index" / "_index.json", json.dumps({
        "format": INDEX_FORMAT, "params": params, "partitions": P, "batch": batch_name, "doc_parts": starts,
        "documents": kept}, indent=2))

    per_source: dict[str, Counter] = {}
    cross: dict[str, Counter] = {}
    for f in finals:
        for s, c in f["per_source"].items():
            per_source.setdefault(s, Counter()).update(c)
        for s, c in f["cross_source"].items():
            cross.setdefault(s, Counter()).update(c)
    sizes: Counter = Counter()
    for d in decided:
        sizes.update(d["cluster_sizes"])
    pairs_checked = sum(v[0] for v in verified)
    key_rows = sum(x["key_rows"] for x in paired)
    key_row_bytes = round(sum(x["key_bytes"] for x in paired) / max(key_rows, 1), 1)
    hits = sum(v[1] for v in verified)
    return {
        "documents": starts[-1], "new_documents": new_docs, "already_indexed": already, "kept": kept,
        "partitions": P, "per_source": {s: {**dict(c), "duplicate_rate": round(c[NEAR_DUPLICATE] / max(sum(c.values()), 1), 4)}
                       for s, c in per_source.items()},
        "cross_source": {s: dict(c) for s, c in cross.items()},
        "cluster_sizes": {int(k): v for k, v in sorted(sizes.items())}, "clusters": sum(sizes.values()),
        "example_clusters": [c for _, c in sorted((e for d in decided for e in d["example_clusters"]),
                                                  key=lambda e: (-e[0], e[1]))[:EXAMPLE_CLUSTERS]],
        "matched_earlier_refreshes": sum(d["matched_earlier_refreshes"] for d in decided),
        "buckets": {"shared": sum(x["buckets"] for x in paired), "largest": max((x["largest_bucket"] for x in paired),
                                                                                default=0),
                    "oversized": sum(x["oversized_buckets"] for x in paired), "max_bucket": max_bucket,
                    "key_rows": key_rows, "key_row_bytes": key_row_bytes},
        "verification": {"pairs_emitted": sum(x["pairs"] for x in paired), "candidate_pairs": distinct,
                         "verified": pairs_checked, "matches": hits, "false_candidates": pairs_checked - hits,
                         "false_candidate_share": round((pairs_checked - hits) / max(pairs_checked, 1), 4)},
        "components": {k: v for k, v in cc.items() if k != "label_partitions"},
        "lsh": {"bands": bands, "rows": rows, "num_perm": near.num_perm, "threshold": near.threshold},
        "partitions": P, "engine": engine.describe() if hasattr(engine, "describe") else None,
        "scratch": dropped,  # bytes and files of each scratch folder (`_Scratch`)
        "timing": {**timing, "total_seconds": round(time.perf_counter() - t_start, 3)},
    }


def read_decisions(out_dir: Path) -> pa.Table:
    """The decisions parts of a run, concatenated in part order (`near_dedup`'s table)."""
    files = part_files(Path(out_dir) / "decisions")
    return pa.concat_tables([pq.read_table(f) for f in files]) if files else DECISION_SCHEMA.empty_table()


IDS_PER_TASK = 2_000_000  # doc ids one task of `distinct_doc_ids` holds (about 150 MB of Python strings at most)
_ID_SCHEMA = pa.schema([pa.field("doc_id", pa.string(), nullable=False)])


@dataclass(frozen=True)
class _IdTask:
    work: str
    i: int  # the decisions file (scatter) or the id partition (count)
    partitions: int
    path: str = ""


def _scatter_ids(task: _IdTask) -> int:
    """One decisions file's doc ids, by id hash: one shuffle file."""
    ids = pq.read_table(task.path, columns=["doc_id"]).column("doc_id").combine_chunks().cast(pa.string())
    write_partitioned(Path(task.work), f"{task.i:06d}", pa.table({"doc_id": ids}, schema=_ID_SCHEMA),
                      partition_of(doc_id_hash(ids.to_pylist()), task.partitions), task.partitions)
    return len(ids)


def _count_ids(task: _IdTask) -> int:
    """Distinct doc ids of one id-hash partition (an id's every copy lands in the same one)."""
    ids = read_partition(Path(task.work), task.i, _ID_SCHEMA).column("doc_id")
    return int(pc.count_distinct(ids).as_py()) if len(ids) else 0


def distinct_doc_ids(decision_files: Sequence[Path], work_dir: Path, engine: Engine = SERIAL,
                     ids_per_task: int = IDS_PER_TASK, progress: bool = False) -> int:
    """Distinct doc_ids over a run's decisions files (`dedup_index`'s conservation check), as two engine rounds: each
    file's ids shuffled once by id hash, then each hash range counted alone (about `ids_per_task` ids). One process
    reading every file once per range of the hash, as before, did work growing with the square of the refresh (a
    pass per 2M documents: 51 passes over 100M ids, ~1.3 hours in the asset's process). `work_dir`: scratch, removed
    afterwards."""
    work_dir = Path(work_dir)
    shutil.rmtree(work_dir, ignore_errors=True)  # shuffle files are read by listing: nothing stale may remain
    documents = sum(pq.ParquetFile(f).metadata.num_rows for f in decision_files)
    partitions = documents // ids_per_task + 1
    try:
        engine.map_parts(_scatter_ids, [_IdTask(str(work_dir), k, partitions, str(f))
                                        for k, f in enumerate(decision_files)], desc="distinct doc ids: scatter",
                         progress=progress, size=lambda t: os.path.getsize(t.path))
        return sum(engine.map_parts(_count_ids, [_IdTask(str(work_dir), q, partitions) for q in range(partitions)],
                                    desc="distinct doc ids: count", progress=progress))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)


@dataclass(frozen=True)
class _KeepTask:
    out: str
    work: str
    i: int  # the signature part (keep) or the partition (index)
    partitions: int
    path: str = ""
    start: int = 0  # the part's first ref
    tiers: tuple[tuple[str, int], ...] = ()  # source -> quality tier
    batch: str = ""
    bands: int = 0
    rows: int = 0


def _keep_part(task: _KeepTask) -> dict[str, int]:
    """One signature part with near-dedup off: its decisions file (every document kept), its docs file in the index,
    its band keys and ids shuffled by partition. Returns its documents per source."""
    t = pq.read_table(task.path)
    n = t.num_rows
    names = t.column("source").to_pylist()
    out = Path(task.out)
    write_parquet_atomic(out / "decisions" / part_name("decisions", task.i), pa.table({
        "doc_id": t.column("doc_id"), "source": t.column("source"), "status": [KEPT] * n,
        "cluster_id": pa.nulls(n, pa.string()), "duplicate_of": pa.nulls(n, pa.string()),
        "duplicate_of_source": pa.nulls(n, pa.string()), "jaccard": pa.nulls(n, pa.float64()),
        "candidates": np.zeros(n, np.int32)}, schema=DECISION_SCHEMA))
    tiers = dict(task.tiers)
    docs = pa.table({"doc_id": t.column("doc_id"), "source": t.column("source"),
                     "quality_tier": pa.array([tiers[s] for s in names], pa.int32()),
                     "chars": t.column("chars"), "batch": pa.array([task.batch] * n, pa.string()),
                     "shingles": packed_shingles(t.column("shingles"))})
    keys, ids = index_part(out / "index", task.i, docs, _signatures(t), task.start, task.bands, task.rows)
    work = Path(task.work)
    write_partitioned(work / "keys", f"{task.i:06d}", keys, partition_of(keys.column("key").to_numpy(),
                                                                         task.partitions), task.partitions)
    write_partitioned(work / "ids", f"{task.i:06d}", ids, partition_of(ids.column("h").to_numpy(), task.partitions),
                      task.partitions)
    return dict(Counter(names))


def _keep_partition(task: _KeepTask) -> None:
    work = Path(task.work)
    write_index_partition(Path(task.out) / "index", task.i, read_partition(work / "keys", task.i, BUCKET_SCHEMA),
                          read_partition(work / "ids", task.i, IDS_SCHEMA))


def keep_all(signature_parts: Sequence[Path], sources: Mapping[str, tuple[int, int]], near: NearDedup,
             batch_name: str, out_dir: Path, engine: Engine = SERIAL, progress: bool = False) -> dict[str, Any]:
    """Decisions with near-dedup off: every document kept (`near_dedup(enabled=False)`'s table), part by part; and
    this refresh's index folder out_dir/index holding all of them, as `decide_distributed` persists its kept ones:
    they go into training all the same, so a later refresh deciding with near-dedup on must find its copies of them.
    `sources`: as for `decide_distributed`. Two rounds on `engine`: a task per signature part (its decisions and docs
    files; its band keys and ids shuffled by partition, under out_dir/.keep-work, removed afterwards), then a task
    per partition (its buckets and ids files); the caller's process reads the parts' row counts only (it held every
    band key of the refresh, ~0.7 KB per document, before)."""
    out_dir = Path(out_dir)
    for sub in ("decisions", "index", ".keep-work"):
        shutil.rmtree(out_dir / sub, ignore_errors=True)
    for sub in ("decisions", "index/docs", "index/buckets", "index/ids"):
        (out_dir / sub).mkdir(parents=True)
    counts = [pq.ParquetFile(p).metadata.num_rows for p in signature_parts]
    starts = [0, *np.cumsum(counts, dtype=np.int64).tolist()]
    documents = starts[-1]
    partitions = near.partitions or auto_partitions(documents, bands_rows(near)[0])
    bands, rows = bands_rows(near)
    work = out_dir / ".keep-work"
    tiers = tuple(sorted((s, tier) for s, (tier, _) in sources.items()))
    try:
        per_part = engine.map_parts(
            _keep_part, [_KeepTask(str(out_dir), str(work), k, partitions, str(p), starts[k], tiers, batch_name, bands,
                                   rows) for k, p in enumerate(signature_parts)],
            desc="near-dup off: index", progress=progress, size=lambda t: os.path.getsize(t.path))
        engine.map_parts(_keep_partition, [_KeepTask(str(out_dir), str(work), p, partitions)
                                           for p in range(partitions)], desc="near-dup off: buckets", progress=progress)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    write_index_meta(out_dir / "index", near, batch_name, partitions, starts)
    per_source: Counter = Counter()
    for c in per_part:
        per_source.update(c)
    return {"documents": documents, "kept": documents,
            "per_source": {s: {KEPT: c, "duplicate_rate": 0.0} for s, c in per_source.items()},
            "cross_source": {}, "cluster_sizes": {}, "clusters": 0, "example_clusters": [],
            "matched_earlier_refreshes": 0}


_SAMPLE_FILE = "survivor-sample.arrow"


@dataclass(frozen=True)
class _SurvivorTask:
    signatures: str
    decisions: str
    sample: str  # the sampled survivors (doc_id, signature, shingles), a scratch file every task reads
    threshold: float
    margin: float


def _survivors(decisions: str | Path) -> pa.BooleanArray:
    return pc.not_equal(pq.read_table(decisions, columns=["status"]).column("status").combine_chunks(), NEAR_DUPLICATE)


def _count_survivors(task: _SurvivorTask) -> int:
    return int(pc.sum(_survivors(task.decisions)).as_py() or 0)


def _survivor_part(task: _SurvivorTask) -> list[tuple[str, str, float]]:
    """The sampled survivors' violations with the survivors of one signature part, in (sample, row) order."""
    kept = _survivors(task.decisions)
    t = pq.read_table(task.signatures, columns=["doc_id", "signature"]).filter(kept)
    if t.num_rows == 0:
        return []
    sample = read_scratch(Path(task.sample))
    ids, sigs = sample.column("doc_id").to_pylist(), _signatures(sample)
    others, other_ids = _signatures(t), t.column("doc_id").to_pylist()
    found = [(i, j) for i, sig in enumerate(sigs)
             for j in np.flatnonzero(estimated_jaccard(sig, others) >= task.threshold - task.margin)
             if other_ids[j] != ids[i]]
    if not found:
        return []
    # Shingle sets only of the rows some sampled survivor may match (a part's shingles are most of its bytes).
    rows = np.unique([j for _, j in found])
    shingles = pq.read_table(task.signatures, columns=["shingles"]).filter(kept).column("shingles").take(pa.array(rows))
    values, offsets = shingle_arrays(shingles)
    s_values, s_offsets = shingle_arrays(sample.column("shingles"))
    violations = []
    for i, j in found:
        r = int(np.searchsorted(rows, j))
        exact = jaccard(s_values[s_offsets[i]:s_offsets[i + 1]], values[offsets[r]:offsets[r + 1]])
        if exact >= task.threshold:
            violations.append((ids[i], other_ids[j], round(exact, 4)))
    return violations


def survivor_violations(signature_parts: Sequence[Path], decision_files: Sequence[Path], threshold: float,
                        sample: int, work_dir: Path, engine: Engine = SERIAL, seed: int = 0, margin: float = 0.15,
                        progress: bool = False) -> tuple[int, list[tuple[str, str, float]]]:
    """Check a sample of surviving documents against every survivor by exact Jaccard, independently of the LSH
    banding (a MinHash estimate >= threshold - margin pre-filters, exact Jaccard decides). Parts and decision files
    correspond one to one. The parts are scanned on `engine`, one task per part, each reading the sample (written to
    `work_dir`, scratch removed afterwards) and its part's survivors' signatures, and the shingle sets of only the rows
    an estimate points at: the asset's process reads the decisions' row counts and the sampled rows, never the
    refresh (which took it ~50 CPU-seconds per million documents, reading every shingle set, at the default sample).
    Returns (documents sampled, violating pairs)."""
    work_dir = Path(work_dir)
    tasks = [_SurvivorTask(str(p), str(d), str(work_dir / _SAMPLE_FILE), threshold, margin)
             for p, d in zip(signature_parts, decision_files)]
    counts = np.array(engine.map_parts(_count_survivors, tasks, desc="survivor check: counts", progress=progress),
                      np.int64)
    total = int(counts.sum())
    if total < 2 or sample == 0:
        return 0, []
    # The same draw as choosing from the survivors' positions: the k-th survivor in part order.
    picked = np.sort(np.random.default_rng(seed).choice(total, size=min(sample, total), replace=False))
    bounds = np.r_[0, np.cumsum(counts)]
    chosen = []
    for k, path in enumerate(signature_parts):
        mine = picked[(picked >= bounds[k]) & (picked < bounds[k + 1])] - bounds[k]
        if mine.size:
            rows = np.flatnonzero(_survivors(decision_files[k]).to_numpy(zero_copy_only=False))[mine]
            t = pq.read_table(path, columns=["doc_id", "signature", "shingles"]).take(pa.array(rows))
            chosen.append(t.set_column(2, "shingles", packed_shingles(t.column("shingles"))))
    shutil.rmtree(work_dir, ignore_errors=True)
    work_dir.mkdir(parents=True)
    try:
        write_scratch(work_dir / _SAMPLE_FILE, pa.concat_tables(chosen))
        found = engine.map_parts(_survivor_part, tasks, desc="survivor check", progress=progress,
                                 size=lambda t: os.path.getsize(t.signatures))
    finally:
        shutil.rmtree(work_dir, ignore_errors=True)
    return int(picked.size), [v for part in found for v in part]


def _signatures(t: pa.Table) -> np.ndarray:
    sig = t.column("signature").combine_chunks()
    return sig.values.to_numpy(zero_copy_only=False).reshape(t.num_rows, sig.type.list_size)
