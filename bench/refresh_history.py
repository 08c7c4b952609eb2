"""What a refresh's history costs near dedup: the CPU, reads and memory a refresh spends on the earlier refreshes'
bucket index, measured as the index grows (docs/scale.md's weekly refresh takes its history term from here).

    .venv/bin/python bench/refresh_history.py [--refresh-docs 20000] [--refreshes 8] [--seed 0] [--repeat 2]
        [--whole-files] [--docs-row-group N] [--json OUT]

Corpus: `kiln.curation.synthetic.scale_document` 0 .. refreshes x refresh-docs - 1, cut into consecutive refreshes
(refresh k: documents k x R .. (k + 1) x R - 1). Its planted exact and near copies are of earlier documents anywhere
before them, so a refresh holds copies of documents indexed by the refreshes before it, as a weekly crawl re-finds
pages it saw before. Each refresh's texts are signed once (`signing.compute_signatures`, not timed here: their cost
does not depend on the history).

Then, refresh by refresh, `buckets.decide_distributed` (what `dedup_index` runs, in this process: SERIAL, so its CPU
is this process's) decides refresh k twice, back to back:
  with history  against the index folders of refreshes 0 .. k-1 (it is the index kept as refresh k's, for the next)
  alone         against none (a scratch output)
The difference is what the history cost this refresh: CPU seconds (user + system), bytes read (the process's rchar:
every read(2), page cache included) and the stages' seconds, against the earlier accepted documents in the index.
A least-squares line through the differences gives the history's cost per earlier indexed document (the slope)
and the fixed cost of having any history (the intercept). The two runs of a pair are seconds apart, so a drifting
machine (bench/host_noise.py) moves both alike; `--repeat N` decides each pair N times and keeps each side's least
CPU. Peak memory is each decision's own (a child process per decision, its VmHWM: its ru_maxrss would start at the
parent's RSS). `--whole-files` adds a third side: the decision with history, its earlier buckets and ids files read
whole by every task whose partition meets them (the reads before 5a5b4b1, which sorted them by hash), to show what
reading by hash range saves. The attach stage's earlier shingles are counted: the documents its candidate pairs
need, the rows of the docs files' row groups read to get them, and what row groups would cost if those documents
fell at random (`shingle_rows_expected`); `--docs-row-group N` writes the refreshes' docs files in row groups of N
(default `bucket_index.DOCS_ROW_GROUP_ROWS`) to compare sizes.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path
from queue import Empty

import numpy as np
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from bench.dedup_bench import write_parts  # noqa: E402
from bench.scale_plan import row_groups_read_share  # noqa: E402
from kiln.common.config import NearDedup  # noqa: E402
from kiln.common.memory import peak_rss_bytes  # noqa: E402
from kiln.curation.synthetic import scale_documents  # noqa: E402
from kiln.dedup.bucket_index import DOCS_ROW_GROUP_ROWS  # noqa: E402
from kiln.dedup.buckets import decide_distributed, read_decisions  # noqa: E402
from kiln.dedup.signing import compute_signatures, signature_groups  # noqa: E402

SOURCE = "bench"  # write_parts' source


def write_refresh(folder: Path, seed: int, start: int, stop: int, rows: int) -> tuple[list[Path], float]:
    """Documents start .. stop - 1 of the scale corpus as DOCUMENT_SCHEMA parts of `rows`; and their texts' MB."""
    folder.mkdir(parents=True)
    docs = list(scale_documents(seed, start, stop))
    texts = [d["text"] for d in docs]
    paths = write_parts(texts, folder, rows, ids=[d["id"] for d in docs], urls=[d["url"] for d in docs])
    return paths, sum(len(t.encode()) for t in texts) / 1e6


def _count_shingle_reads() -> dict[str, int]:
    """Counts what the earlier docs files' shingles cost (the attach stage's reads): the documents asked for, and the
    rows and Arrow bytes of the row groups read to get them."""
    from kiln.dedup import bucket_index, bucket_layout

    counts = {"shingle_docs_needed": 0, "shingle_rows_read": 0, "shingle_bytes_read": 0}
    read_refs, read_groups = bucket_layout.read_doc_refs, bucket_index._read_doc_groups

    def refs(path, wanted, columns):
        if "shingles" in columns:
            counts["shingle_docs_needed"] += int(np.unique(wanted).size)
        return read_refs(path, wanted, columns)

    def groups(file, which, columns):
        t = read_groups(file, which, columns)
        if "shingles" in columns:
            counts["shingle_rows_read"] += t.num_rows
            counts["shingle_bytes_read"] += t.nbytes
        return t

    bucket_layout.read_doc_refs, bucket_index._read_doc_groups = refs, groups
    return counts


def _decide(sig_parts: list[str], previous: list[str], work: str, out: str, near_json: str, queue,
            whole_files: bool = False, docs_row_group: int | None = None) -> None:
    """One decision in a child process: its CPU seconds, bytes read and peak RSS are its own. `whole_files`: the
    earlier buckets and ids files read whole by every task that meets them, as before 5a5b4b1. `docs_row_group`:
    the rows per row group of the docs files this decision writes (the index the next refresh reads)."""
    from kiln.dedup import bucket_index, bucket_layout, bucket_rounds

    near = NearDedup.model_validate_json(near_json)
    if whole_files:
        bucket_layout.read_hash_range = lambda source, column, ranges: pq.read_table(source)
    if docs_row_group:
        bucket_index.DOCS_ROW_GROUP_ROWS = bucket_rounds.DOCS_ROW_GROUP_ROWS = docs_row_group
    shingles = _count_shingle_reads()
    before = os.times()
    rchar = _rchar()
    t0 = time.perf_counter()
    stats = decide_distributed([Path(p) for p in sig_parts], {SOURCE: (1, 0)}, [Path(p) for p in previous],
                               Path(work), Path(out), near, SOURCE)
    after = os.times()
    queue.put({"wall_s": time.perf_counter() - t0,
               "cpu_s": (after.user - before.user) + (after.system - before.system),
               "read_bytes": _rchar() - rchar,
               "peak_rss_mib": peak_rss_bytes() / 2**20,
               "stages_s": {k: v for k, v in stats["timing"].items() if k != "total_seconds"},
               "partitions": stats["partitions"], "documents": stats["documents"], "kept": stats["kept"],
               "already_indexed": stats["already_indexed"],
               "matched_earlier_refreshes": stats["matched_earlier_refreshes"], **shingles})


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def decide(sig_parts: list[Path], previous: list[Path], work: Path, out: Path, near: NearDedup,
           whole_files: bool = False, docs_row_group: int | None = None) -> dict:
    context = multiprocessing.get_context("spawn")
    queue = context.Queue()
    child = context.Process(target=_decide, args=([str(p) for p in sig_parts], [str(p) for p in previous],
                                                  str(work), str(out), near.model_dump_json(), queue, whole_files,
                                                  docs_row_group))
    child.start()
    while True:  # a child that dies before reporting (an import error, the OOM killer) ends the bench, not hangs it
        try:
            result = queue.get(timeout=5)
            break
        except Empty:
            if not child.is_alive():
                raise RuntimeError(f"a decision's process exited with {child.exitcode} before reporting") from None
    child.join()
    if child.exitcode:
        raise RuntimeError(f"a decision's process exited with {child.exitcode}")
    shutil.rmtree(work, ignore_errors=True)
    return result


def fit(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """Least-squares (intercept, slope) of ys against xs."""
    slope, intercept = np.polyfit(np.asarray(xs, float), np.asarray(ys, float), 1)
    return float(intercept), float(slope)


def plot(rows: list[dict], cpu0: float, cpu_per_doc: float, path: Path) -> str:
    """Each refresh's CPU with and without its history against the earlier indexed documents, and the fitted line."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    x = [r["earlier_indexed"] for r in rows]
    fig, ax = plt.subplots(figsize=(7, 4.5))
    ax.plot(x, [r["with_history"]["cpu_s"] for r in rows], "o-", label="with its history")
    ax.plot(x, [r["alone"]["cpu_s"] for r in rows], "s--", label="alone (no earlier refresh)")
    ax.plot(x, [r["extra_cpu_s"] for r in rows], "^", label="the difference")
    ax.plot(x, [cpu0 + cpu_per_doc * v for v in x], ":", label=f"fit: {cpu_per_doc * 1e6:.1f} CPU-s per million")
    ax.set_xlabel("earlier accepted documents in the index")
    ax.set_ylabel("CPU seconds to decide the refresh")
    ax.set_title(f"near dedup of a refresh of {rows[0]['documents']:,} documents")
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return f"wrote {path}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--refresh-docs", type=int, default=20_000, help="documents per refresh")
    ap.add_argument("--refreshes", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rows", type=int, default=1_000, help="documents per input part")
    ap.add_argument("--repeat", type=int, default=2, help="decide each (with history, alone) pair N times, in "
                    "alternating order; each side's least CPU is kept")
    ap.add_argument("--whole-files", action="store_true", help="also decide each refresh reading its earlier buckets "
                    "and ids files whole in every task that meets them (as before 5a5b4b1), for comparison")
    ap.add_argument("--docs-row-group", type=int, help="rows per row group of the docs files the refreshes write "
                    f"(default bucket_index.DOCS_ROW_GROUP_ROWS, {DOCS_ROW_GROUP_ROWS:,}), to compare sizes")
    ap.add_argument("--json", type=Path, help="write the figures here")
    args = ap.parse_args()
    if args.refreshes < 3:
        ap.error("--refreshes: at least 3 (two refreshes with a history to fit a line through)")
    if args.docs_row_group is not None and args.docs_row_group < 1:
        ap.error("--docs-row-group: at least 1 row")
    near, R, group = NearDedup(), args.refresh_docs, args.docs_row_group or DOCS_ROW_GROUP_ROWS
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, Python "
          f"{platform.python_version()}, load average {os.getloadavg()[0]:.1f}")
    rows = []
    with tempfile.TemporaryDirectory(prefix="refresh-history-") as tmp:
        tmp = Path(tmp)
        indexes: list[Path] = []
        for k in range(args.refreshes):
            parts, mb = write_refresh(tmp / f"docs-{k}", args.seed, k * R, (k + 1) * R, args.rows)
            groups = signature_groups(parts, near.rows_per_part)
            sig = [tmp / f"sig-{k}" / f"sig-{i:05d}.parquet" for i in range(len(groups))]
            sig[0].parent.mkdir()
            compute_signatures(groups, sig, near, progress=False)
            shutil.rmtree(tmp / f"docs-{k}")
            earlier = sum(json.loads((i / "_index.json").read_text())["documents"] for i in indexes)
            index_bytes = sum(f.stat().st_size for i in indexes for f in i.rglob("*") if f.is_file())
            best: dict[str, dict] = {}
            sides = [("history", indexes), ("alone", [])] + ([("whole_files", indexes)] if args.whole_files else [])
            for r in range(args.repeat):
                for side, previous in sides[::-1] if (k + r) % 2 else sides:  # each side first as often
                    out = tmp / (f"out-{k}" if side == "history" else side)
                    shutil.rmtree(out, ignore_errors=True)
                    got = decide(sig, previous, tmp / "work", out, near, whole_files=side == "whole_files",
                                 docs_row_group=args.docs_row_group)
                    if side not in best or got["cpu_s"] < best[side]["cpu_s"]:
                        best[side] = got
            if args.whole_files and not read_decisions(tmp / "whole_files").equals(read_decisions(tmp / f"out-{k}")):
                raise SystemExit(f"refresh {k}: reading the earlier files whole decided otherwise than by ranges")
            for side in ("alone", "whole_files"):
                shutil.rmtree(tmp / side, ignore_errors=True)
            indexes.append(tmp / f"out-{k}" / "index")
            h, a = best["history"], best["alone"]
            row = {"refresh": k, "documents": R, "text_mb": round(mb, 2), "earlier_indexed": earlier,
                   "earlier_index_mb": round(index_bytes / 1e6, 2), "with_history": h, "alone": a,
                   "extra_cpu_s": round(h["cpu_s"] - a["cpu_s"], 3),
                   "extra_read_mb": round((h["read_bytes"] - a["read_bytes"]) / 1e6, 2),
                   "extra_peak_rss_mib": round(h["peak_rss_mib"] - a["peak_rss_mib"], 1),
                   "extra_stages_s": {s: round(h["stages_s"].get(s, 0) - a["stages_s"].get(s, 0), 3)
                                      for s in h["stages_s"]}}
            rows.append(row)
            print(f"refresh {k}: {R:,} documents ({mb:.1f} MB) on {earlier:,} indexed; with history "
                  f"{h['cpu_s']:.2f} CPU-s, {h['read_bytes'] / 1e6:.1f} MB read, {h['peak_rss_mib']:.0f} MiB, "
                  f"{h['matched_earlier_refreshes']:,} matched earlier refreshes; alone {a['cpu_s']:.2f} CPU-s, "
                  f"{a['read_bytes'] / 1e6:.1f} MB, {a['peak_rss_mib']:.0f} MiB; history {row['extra_cpu_s']:+.2f} "
                  f"CPU-s, {row['extra_read_mb']:+.1f} MB read (the earlier index: {index_bytes / 1e6:.1f} MB), "
                  f"{row['extra_peak_rss_mib']:+.0f} MiB")
            if h["shingle_docs_needed"]:
                # what the row groups of `group` rows should cost if the needed documents fall at random
                row["shingle_rows_expected"] = round(earlier * row_groups_read_share(h["shingle_docs_needed"], group,
                                                                                     earlier))
                print(f"  earlier shingles: {h['shingle_docs_needed']:,} documents needed, {h['shingle_rows_read']:,} "
                      f"read ({h['shingle_rows_read'] / h['shingle_docs_needed']:.1f}x; "
                      f"{h['shingle_rows_read'] / earlier:.0%} of the earlier documents; at random in row groups of "
                      f"{group:,}: {row['shingle_rows_expected']:,}), {h['shingle_bytes_read'] / 1e6:.1f} MB in Arrow")
            if "whole_files" in best:  # the same decision reading earlier files whole: what the ranges saved
                w = row["whole_files"] = best["whole_files"]
                row["ranges_saved_cpu_s"] = round(w["cpu_s"] - h["cpu_s"], 3)
                row["ranges_saved_read_mb"] = round((w["read_bytes"] - h["read_bytes"]) / 1e6, 2)
                print(f"  read whole, as before 5a5b4b1: {w['cpu_s']:.2f} CPU-s ({row['ranges_saved_cpu_s']:+.2f}), "
                      f"{w['read_bytes'] / 1e6:.1f} MB read ({row['ranges_saved_read_mb']:+.1f}), pairs "
                      f"{w['stages_s'].get('pairs', 0):.2f} s against {h['stages_s'].get('pairs', 0):.2f}, already "
                      f"{w['stages_s'].get('already', 0):.2f} s against {h['stages_s'].get('already', 0):.2f}")
    with_history = [r for r in rows if r["earlier_indexed"]]
    xs = [r["earlier_indexed"] for r in with_history]
    cpu0, cpu_per_doc = fit(xs, [r["extra_cpu_s"] for r in with_history])
    read0, read_per_doc = fit(xs, [r["extra_read_mb"] * 1e6 for r in with_history])
    rss0, rss_per_doc = fit(xs, [r["extra_peak_rss_mib"] for r in with_history])
    per_new = np.mean([r["alone"]["cpu_s"] / r["documents"] for r in rows])
    # the history's reads over the index's size: about 1 when a refresh reads the whole index (every earlier docs
    # file's row groups touched by a candidate), toward the buckets and ids' share of it when few are
    read_share = float(np.mean([r["extra_read_mb"] / r["earlier_index_mb"] for r in with_history]))
    summary = {
        "cpu_s_per_earlier_doc": cpu_per_doc, "cpu_s_fixed": cpu0,
        "read_bytes_per_earlier_doc": read_per_doc, "read_bytes_fixed": read0, "read_over_index_bytes": read_share,
        "index_bytes_per_earlier_doc": float(np.mean([r["earlier_index_mb"] * 1e6 / r["earlier_indexed"]
                                                      for r in with_history])),
        "peak_rss_mib_per_million_earlier": rss_per_doc * 1e6, "peak_rss_mib_fixed": rss0,
        "cpu_s_per_new_doc_alone": float(per_new),
        # the attach stage's earlier shingles: documents its candidate pairs need per new document, and the rows of
        # the row groups read to get them per needed document and as a share of the earlier documents
        "shingle_docs_needed_per_new_doc": float(np.mean([r["with_history"]["shingle_docs_needed"] / r["documents"]
                                                          for r in with_history])),
        "shingle_rows_read_per_needed": float(sum(r["with_history"]["shingle_rows_read"] for r in with_history)
                                              / max(1, sum(r["with_history"]["shingle_docs_needed"]
                                                           for r in with_history))),
        "shingle_rows_read_over_earlier": float(np.mean([r["with_history"]["shingle_rows_read"] / r["earlier_indexed"]
                                                         for r in with_history])),
        "docs_row_group": group,
        # refresh 0 has no history: its two sides decide the same thing, so their difference is the noise
        "noise_cpu_s": rows[0]["extra_cpu_s"],
        # an earlier indexed document's CPU in a refresh, as a share of what deciding one of its own documents costs
        "earlier_doc_cpu_share_of_new": float(cpu_per_doc / per_new)}
    print(f"history's cost, a line through refreshes 1..{args.refreshes - 1}: "
          f"{cpu_per_doc * 1e6:.1f} CPU-s per million earlier indexed documents (+{cpu0:.2f} s fixed), "
          f"{read_per_doc:.0f} bytes read per earlier document ({read_share:.2f}x the index's bytes), "
          f"{rss_per_doc * 1e6:.0f} MiB of peak RSS per million; "
          f"deciding a refresh's own documents costs {per_new * 1e6:.1f} CPU-s per million, so each earlier "
          f"document costs {cpu_per_doc / per_new:.3f} of a new one. Noise: refresh 0's two sides (no history "
          f"either) differ by {rows[0]['extra_cpu_s']:+.2f} CPU-s")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        print(plot(rows, cpu0, cpu_per_doc, args.json.with_suffix(".png")))
        args.json.write_text(json.dumps({
            "command": " ".join(["bench/refresh_history.py", *sys.argv[1:]]),
            "machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                        "python": platform.python_version(), "load_average": os.getloadavg()},
            "near": json.loads(near.model_dump_json()), "refresh_docs": R, "refreshes": rows,
            "summary": summary}, indent=2) + "\n")


if __name__ == "__main__":
    main()
