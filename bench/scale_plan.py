"""Kiln at 10 billion documents, on paper: cores, hours, bytes, files and dollars per stage, projected from what
bench/scale_bench.py measured (docs/scale.md is the narrative around this script's output).

    .venv/bin/python bench/scale_plan.py --bench docs/bench/scale_100k_1m.json [--run-dir WORK/run-1000000-local-1]
        [--docs 10e9] [--text-tb 30] [--cores 2000 | --hours 24] [--core-hour-usd 0.05]
        [--near-rows-per-part 100000] [--partitions 4096] [--history docs/bench/refresh_history.json]
        [--md docs/scale.md]

CPU: MB of text entering a stage per CPU-second (user + system of the run's processes), not per wall second: the
bench VM was shared and loaded, so its wall time also counts waiting for a core. Each stage takes the lowest rate of
the runs at the largest measured N (--run pins one engine:workers); wall = core-hours / (cores x utilization).
Bytes and files: per document from a run folder kept by `scale_bench.py --keep` (--run-dir: the same seed and config
as the JSON's run, so the same files); text-bearing folders scale with text, the others with documents. A shuffle
writes one file per writing task (kiln/dedup/shuffle.py), so its files scale with the parts or with the partitions,
as its writers do; its readers read parts x partitions segments. A "part" here is a
signature part (dedup.near.rows_per_part documents: curated parts joined), the unit of every near-dup task; the
reading stages' parts (reading.rows_per_part) only set ingest/filter task sizes and are not projected.
"""

from __future__ import annotations

import argparse
import json
import math
import pickle
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

STAGES = ["ingest", "filter", "exact_dedup", "signatures", "near_dedup"]
TEXT_FOLDERS = {"corpus", "raw", "filtered", "curated", "signatures", "index_docs", "work:pairs_a",
                "work:seconds"}  # text, shingles
# work folders written by a task per key partition; the others by a task per signature part
PER_PARTITION = {"already", "pairs", "pairs_b", "decided", "uncounted", "cc"}
FOLDERS = {"raw": "store/raw", "filtered": "store/filtered", "curated": "store/curated",
           "exact_shuffle": "exact-shuffle", "signatures": "signatures", "decisions": "near-out/decisions",
           "index_buckets": "near-out/index/buckets", "index_ids": "near-out/index/ids",
           "index_docs": "near-out/index/docs"}
PERSISTED = ["raw", "filtered", "curated", "signatures", "decisions", "index_buckets", "index_ids", "index_docs"]
READING_PARTS, KEY_PARTITIONS = {"raw", "filtered", "curated"}, {"index_buckets", "index_ids"}  # persisted files: the
# others are one per signature part
IO = {"ingest": (["corpus"], ["raw"]), "filter": (["raw"], ["filtered"]),
      "exact_dedup": (["filtered", "exact_shuffle"], ["exact_shuffle", "curated"]),
      "signatures": (["curated"], ["signatures"]),
      "near_dedup": (["signatures", "work"], ["work", "decisions", "index_buckets", "index_ids", "index_docs"])}
TB, GIB = 1e12, 2**30


@dataclass
class Target:
    docs: float = 10e9
    text_tb: float = 30.0
    cores: int | None = None
    hours: float = 24.0
    utilization: float = 0.8  # busy share of the cluster's cores (stragglers, I/O waits): an assumption
    core_hour_usd: float = 0.05  # on-demand, per vCPU-hour (~$0.04-0.05 for general-purpose instances)
    storage_usd_per_tb_month: float = 23.0  # S3 standard
    put_usd_per_1k: float = 0.005  # S3 PUT; GET is 0.0004
    get_usd_per_1k: float = 0.0004
    near_rows_per_part: int = 100_000  # documents per signature part: dedup.near.rows_per_part (config default 5,000)
    partitions: int = 4096  # key partitions: dedup.near.partitions (config default 8)
    refresh_docs: float | None = None  # a weekly refresh (default docs / 52: a year of refreshes makes `docs`)
    hot_bucket_share: float = 1e-3  # share of the documents in one band bucket (templated pages): an example


def largest_runs(bench: dict, pin: str | None = None) -> list[dict]:
    """The runs of the largest N (of `pin`, engine:workers, only); of a `--repeat` bench, its first repetition's."""
    runs = [r for r in bench["runs"] if r.get("repeat", 0) == 0 and (not pin or f"{r['engine']}:{r['workers']}" == pin)] \
        or sys.exit(f"no {pin}")
    return [r for r in runs if r["docs"] == max(r["docs"] for r in runs)]


def label(run: dict) -> str:
    return f"{run['engine']}:{run['workers']} @ {run['docs']:,}"


def worker_mib(run: dict, peaks: dict) -> int:
    """The largest worker's peak RSS in `peaks` (a run's or a stage's); the driver's for local:1, whose driver runs
    every task (a short-lived helper child seen there is no worker)."""
    one_process = run["engine"] == "local" and run["workers"] == 1
    return peaks["driver"] if one_process else peaks["worker"] or peaks["driver"]


def worker_rss_by_docs(bench: dict) -> str:
    """Peak RSS of the largest worker (the driver for local:1) per engine:workers and N: flat in N or not."""
    by: dict[str, list[str]] = {}
    repeated = len({r.get("repeat", 0) for r in bench["runs"]}) > 1
    for r in sorted(bench["runs"], key=lambda r: (r["docs"], r.get("repeat", 0))):
        rss = worker_mib(r, r["peak_rss_mib"])
        which = f" (repetition {r.get('repeat', 0) + 1})" if repeated else ""
        by.setdefault(f"{r['engine']}:{r['workers']}", []).append(f"{r['docs']:,} docs{which} {rss} MiB")
    return "; ".join(f"{k}: {', '.join(v)}" for k, v in by.items())


def measure_run_dir(run_dir: Path, docs: int) -> dict:
    """Bytes and files per folder of a kept scale_bench run of `docs` documents (run-{docs}-ENGINE-WORKERS, beside its
    corpus-{docs}-SEED and its JSON), and Arrow bytes of a key row, of a signature-part row and of a decisions row.
    Data files are Parquet (outputs) or shuffle files (`.shuffle`, `.arrow`); the near-dup scratch, dropped during
    the run, is as the run's JSON recorded it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    if not run_dir.name.startswith(f"run-{docs}-"):
        raise SystemExit(f"{run_dir}: not a run of {docs:,} documents (the bench's largest N)")

    def data_files(path: Path) -> list[Path]:
        return [f for f in path.rglob("*") if f.suffix in (".parquet", ".arrow", ".shuffle") and f.is_file()] \
            if path.is_dir() else []

    def du(path: Path) -> list[int]:
        files = data_files(path)
        return [sum(f.stat().st_size for f in files), len(files)]

    folders = {name: du(run_dir / rel) for name, rel in FOLDERS.items()}
    corpus = list(run_dir.parent.glob(f"corpus-{docs}-*/*.jsonl"))
    folders["corpus"] = [sum(f.stat().st_size for f in corpus), len(corpus)]
    # The near-dup scratch is dropped as the run goes (`buckets.LAST_READER`): the run's JSON, beside its folder,
    # holds each folder's bytes and files as they were when dropped, and the Arrow bytes of its band-key rows.
    near = json.loads((run_dir.parent / f"{run_dir.name}.json").read_text())["near_stats"]
    folders.update({f"work:{name}": [v["bytes"], v["files"]] for name, v in near["scratch"].items()})
    sig = pq.read_table(min(data_files(run_dir / "signatures")))
    dec = pa.concat_tables(pq.read_table(f) for f in sorted(data_files(run_dir / "near-out" / "decisions")))
    return {"folders": folders, "key_row_bytes": near["buckets"]["key_row_bytes"],
            "signature_doc_bytes": sig.nbytes / sig.num_rows, "decision_row_bytes": dec.nbytes / dec.num_rows}


def task_and_layout_bytes() -> tuple[float, float, float]:
    """What the driver ships per near-dup task, and what the layout file holds. Tasks carry the Layout as a file
    (LayoutFile: path + sha256, kiln/dedup/bucket_layout.py), so a task's pickle is a constant: the larger of a stage
    task (_Task) and a components-round task (_RoundTask, whose route for the labels is the LayoutFile), with a
    store path as long as a real one. The layout file (JSON, written once per stage, read once per worker process)
    grows by the bytes per signature part and per earlier refresh's docs part returned second and third."""
    import dataclasses

    from kiln.dedup.bucket_layout import Earlier, Layout, LayoutFile, _Task
    from kiln.dedup.components import _RoundTask

    work = f"/mnt/kiln/store/dedup_index/.2025-w02.staging-{'f' * 16}/.near_dedup"  # DatasetWriter.scratch
    layout_file = LayoutFile(f"{work}/layout-{'0' * 16}.json", "0" * 64)
    task = max(len(pickle.dumps(_Task(layout_file, 99_999))),
               len(pickle.dumps(_RoundTask(f"{work}/cc", 40, 4095, 4096, layout_file, 200_000))))

    def size(parts: int, earlier: int) -> int:
        paths = tuple(f"/mnt/kiln/store/minhash_signatures/web|2025-w02/signatures-{k:05d}.parquet"
                      for k in range(parts))
        ints = tuple(range(0, 100_000 * parts, 100_000))
        old = Earlier("/mnt/kiln/store/dedup_index/2025-w01/index", 4096,
                      tuple(range(0, 100_000 * earlier, 100_000)), parts)
        lay = Layout(work=work, index="/i", decisions="/d", partitions=4096, parts=paths, starts=ints + (0,),
                     seq_starts=ints, tiers=(1,) * parts, orders=(0,) * parts, keep=("quality_tier",), bands=16,
                     rows=6, threshold=0.8, max_bucket=1000, batch="b", earlier=(old,))
        return len(json.dumps(dataclasses.asdict(lay), sort_keys=True).encode())  # as LayoutFile.write
    return float(task), (size(1000, 0) - size(0, 0)) / 1000, (size(0, 1000) - size(0, 0)) / 1000


def weekly_cpu(own_core_h: float, accepted: float, cores: int, t: Target, history: dict | None) -> dict:
    """A weekly refresh's CPU: its own documents' (the stages' rate) and, with a refresh_history bench, what deciding
    them against the earlier refreshes' index costs near dedup (its slope, per earlier accepted document: the
    pairs stage merges their bucket rows, the already stage their ids, attach and route read their row groups)."""
    q = {}
    core_h, how = own_core_h, "core-hours x refresh / docs"
    if history is not None:
        per_doc = history["summary"]["cpu_s_per_earlier_doc"]
        q["weekly_history_core_hours"] = (
            accepted * per_doc / 3600,
            f"{accepted:,.0f} earlier accepted x {per_doc * 1e6:.1f} CPU-s per million ({history['file']}, linear "
            f"from {history['largest_index']:,} indexed): the year's last refresh; half that on average")
        core_h += q["weekly_history_core_hours"][0]
        how += " + weekly_history_core_hours"
    else:
        how += " (the earlier refreshes' index not counted: give --history)"
    return {"weekly_core_hours": (core_h, how), **q,
            "weekly_wall_hours": (core_h / (cores * t.utilization), "on the same cores"),
            "weekly_compute_usd": (core_h * t.core_hour_usd, "weekly core-hours x price")}


def row_groups_read_share(needed: float, rows_per_group: int, documents: float) -> float:
    """The share of a docs store read to get `needed` of its `documents`, which fall at random in it: a row group of
    `rows_per_group` is read when it holds one, about 1 - exp(-needed x rows_per_group / documents) of them."""
    return -math.expm1(-needed * rows_per_group / documents) if documents else 0.0


def weekly_docs_read(history: dict | None, r_new: float, accepted: float, docs_tb: float) -> dict:
    """What the attach stage of a weekly refresh reads of the earlier docs files (their shingles): the row groups
    holding the earlier documents its candidate pairs need, at the rate refresh_history measured per new document."""
    if history is None or "shingle_docs_needed_per_new_doc" not in history["summary"]:
        return {}
    from kiln.dedup.bucket_index import DOCS_ROW_GROUP_ROWS

    rate = history["summary"]["shingle_docs_needed_per_new_doc"]
    needed = r_new * rate
    share = row_groups_read_share(needed, DOCS_ROW_GROUP_ROWS, accepted)
    return {"weekly_earlier_docs_read_tb": (
        share * docs_tb, f"{needed:,.0f} earlier documents needed ({r_new:,.0f} new x {rate:.4f}, {history['file']}) "
                         f"in row groups of {DOCS_ROW_GROUP_ROWS:,}: 1 - exp(-needed x {DOCS_ROW_GROUP_ROWS:,} / "
                         f"{accepted:,.0f}) = {share:.1%} of the docs files")}


PY_INT_IN_LIST = 36  # bytes: a Python int past the small-int cache (28, sys.getsizeof) + its list slot (8)


def project(runs: list[dict], t: Target, measured: dict | None, layout: tuple[float, float, float], bands: int,
            bucket_row: int, old_rank: int, history: dict | None = None) -> dict:
    """Per stage rows and named quantities (value, how it was computed) for the target. `layout`: bytes of one
    pickled task, and layout-file bytes per signature part and per earlier docs part (task_and_layout_bytes).
    `history`: a bench/refresh_history.py JSON (its `file`), for the CPU a weekly refresh spends on the index."""
    ref = runs[0]  # every run at this N has the same corpus, counts and files
    docs_x, text_x = t.docs / ref["docs"], t.text_tb * TB / (ref["stages"]["ingest"]["mb"] * 1e6)
    rows = []
    for s in STAGES:
        run = min(runs, key=lambda r: r["stages"][s]["mb_per_cpu_s"])
        st = run["stages"][s]
        text = st["mb"] * 1e6 * text_x  # bytes of text entering the stage at the target
        rows.append({"stage": s, "run": label(run), "mb_per_cpu_s": st["mb_per_cpu_s"], "text_tb": text / TB,
                     "core_hours": text / (st["mb_per_cpu_s"] * 1e6) / 3600,
                     "worker_mib": worker_mib(run, st["peak_rss_mib"])})
    core_h = sum(r["core_hours"] for r in rows)
    cores = t.cores or math.ceil(core_h / (t.hours * t.utilization))
    for r in rows:
        r["wall_hours"], r["usd"] = r["core_hours"] / (cores * t.utilization), r["core_hours"] * t.core_hour_usd
    near, refresh = ref["near_stats"], t.refresh_docs or t.docs / 52
    new_docs, accepted = t.docs * near["documents"] / ref["docs"], t.docs * near["kept"] / ref["docs"]
    r_new = refresh * near["documents"] / ref["docs"]  # the refresh's documents reaching near dedup
    # signature parts: of the target (one refresh), of the weekly refresh, and of the earlier refreshes a weekly
    # refresh at the target's size sits on (each earlier refresh's index has one docs file per signature part)
    rpp = t.near_rows_per_part
    parts, r_parts, e_parts = (math.ceil(n / rpp) for n in (new_docs, r_new, new_docs))
    P, (task_b, lay, lay_e) = t.partitions, layout
    pairs_per_doc = near["verification"]["candidate_pairs"] / near["documents"]
    pairs = new_docs * pairs_per_doc
    q = {"cores": (cores, f"{core_h:,.0f} core-hours / ({t.hours} h x {t.utilization})" if not t.cores else "--cores"),
         "core_hours": (core_h, "sum of the stages"), "compute_usd": (core_h * t.core_hour_usd, "core-hours x price"),
         "parts": (parts, f"{new_docs:,.0f} documents reaching near dedup / {rpp:,} per signature part"),
         "bucket_index_raw_tb": (accepted * bands * bucket_row / TB,
                                 f"{accepted:,.0f} accepted x {bands} bands x {bucket_row} B (band 4 + key 8 + ref 8)"),
         "driver_task_list_gb": (max(parts, P) * task_b / 1e9,
                                 f"max({parts:,} parts, {P:,} partitions) tasks x {task_b:.0f} B (a task carries "
                                 "its layout as path + sha256)"),
         "layout_file_mb": (parts * lay / 1e6, f"{parts:,} parts x {lay:.0f} B (JSON, once per stage; read once per "
                                               "worker process)"),
         "pairs_results_gib": (P * parts * PY_INT_IN_LIST / GIB,
                               f"at most {P:,} partitions x {parts:,} doc-partitions written, as Python ints "
                               f"({PY_INT_IN_LIST} B) in the driver"),
         "candidate_pairs": (pairs, f"{new_docs:,.0f} x {pairs_per_doc:.4f} distinct candidate pairs per document "
                                    "(the bench's)"),
         "verify_segments_per_round": (min(parts * parts, pairs),
                                       f"min({parts:,} doc partitions x {parts:,} parts, {pairs:,.0f} candidate "
                                       "pairs): a verify task opens only the attach files holding its pairs"),
         "weekly_docs": (refresh, "--refresh-docs (default: docs / 52)"),
         **weekly_cpu(core_h * refresh / t.docs, accepted, cores, t, history),
         "weekly_driver_task_list_gb": (max(r_parts + e_parts, P) * task_b / 1e9,
                                        f"max({r_parts:,} + {e_parts:,} earlier docs parts, {P:,}) tasks x "
                                        f"{task_b:.0f} B"),
         "weekly_verify_segments_per_round": (min((r_parts + e_parts) * r_parts, r_new * pairs_per_doc),
                                              f"min(({r_parts:,} + {e_parts:,} earlier docs parts) x {r_parts:,} "
                                              f"parts, {r_new * pairs_per_doc:,.0f} candidate pairs)"),
         "weekly_layout_file_mb": ((r_parts * lay + e_parts * lay_e) / 1e6,
                                   f"{r_parts:,} x {lay:.0f} B + {e_parts:,} earlier parts x {lay_e:.1f} B")}
    plan = {"stages": rows, "q": q, "runs": [label(r) for r in runs]}
    if measured is None:
        return plan
    f = measured["folders"]
    per_doc = {k: b / ref["docs"] * (text_x / docs_x if k in TEXT_FOLDERS else 1) for k, (b, _) in f.items()}
    work = [k for k in f if k.startswith("work:")]
    per_doc["work"] = sum(per_doc[k] for k in work)
    for r in rows:
        r["read_tb"], r["write_tb"] = (sum(per_doc[k] for k in ks) * t.docs / TB for ks in IO[r["stage"]])
    b_parts = ref["files"]["signature_parts"]

    def writers(kind: str, n: int, p: int) -> int:
        return p if kind in PER_PARTITION else n

    files = {k[5:]: f[k][1] * writers(k[5:], parts, P) / writers(k[5:], b_parts, ref["partitions"]) for k in work}
    key_row, old_row, sig_doc = measured["key_row_bytes"], bucket_row + old_rank + 4, \
        measured["signature_doc_bytes"] * text_x / docs_x
    persisted_tb, shuffle_files = sum(per_doc[k] for k in PERSISTED) * t.docs / TB, sum(files.values())
    # files per dataset: reading parts keep the bench's size (the plan does not change reading.rows_per_part), the
    # index's buckets and ids are per key partition, the rest per signature part
    persisted_files = sum(f[k][1] * (docs_x if k in READING_PARTS else P / ref["partitions"] if k in KEY_PARTITIONS
                                     else parts / b_parts) for k in PERSISTED)
    earlier_tb = (per_doc["index_buckets"] + per_doc["index_ids"]) * t.docs / TB
    hot, mb, dec_row = new_docs * t.hot_bucket_share, ref["max_bucket"], measured["decision_row_bytes"]
    q.update({
        "persisted_tb": (persisted_tb, "raw, filtered, curated, signatures, decisions, bucket index (per document)"),
        "storage_usd_month": (persisted_tb * t.storage_usd_per_tb_month, "persisted TB x price"),
        "persisted_put_usd": (persisted_files * t.put_usd_per_1k / 1000,
                              f"{persisted_files:,.0f} files x PUT price (reading parts of the bench's size)"),
        "shuffle_scratch_tb": (per_doc["work"] * t.docs / TB, "near-work folders per document (shared KILN_HOME)"),
        "keys_rows": (new_docs * bands, f"{new_docs:,.0f} documents x {bands} bands"),
        "keys_arrow_tb": (new_docs * bands * key_row / TB, f"rows x {key_row:.0f} B (band, key, node, rank: Arrow)"),
        "keys_disk_tb": (per_doc["work:keys"] * t.docs / TB, "keys folder per document (measured; Arrow IPC)"),
        "bucket_index_parquet_tb": (per_doc["index_buckets"] * t.docs / TB, "buckets folder per document (measured)"),
        "keys_task_gib": (rpp * (sig_doc + bands * key_row) / GIB,
                          f"{rpp:,} x ({sig_doc:,.0f} B signature row + {bands} x {key_row:.0f} B)"),
        "pairs_task_gib": (new_docs * bands * key_row / P / GIB, f"key rows in Arrow / {P:,} partitions"),
        "keys_files_per_round": (parts, f"one per writing task: {parts:,} parts"),
        "keys_segments_per_round": (parts * P, f"{parts:,} parts x {P:,} partitions, each read by one pread"),
        "keys_segment_kib": (per_doc["work:keys"] * t.docs / (parts * P) / 1024, "keys on disk / segments"),
        "shuffle_files": (shuffle_files, "every near-work folder, by its writers (table below)"),
        "shuffle_files_as_s3_usd": (shuffle_files * (t.put_usd_per_1k + t.get_usd_per_1k) / 1000,
                                    "if they were S3 objects: files x (PUT + GET)"),
        "weekly_own_io_tb": (sum(r["read_tb"] + r["write_tb"] for r in rows) * refresh / t.docs,
                             "every stage's reads + writes x refresh / docs"),
        "weekly_earlier_min_tb": (earlier_tb, "every earlier bucket and id partition (pairs, already stages)"),
        "weekly_earlier_max_tb": (earlier_tb + per_doc["index_docs"] * t.docs / TB,
                                  "+ every earlier docs file (shingles), when candidate pairs touch them all"),
        **weekly_docs_read(history, r_new, accepted, per_doc["index_docs"] * t.docs / TB),
        "weekly_pairs_task_gib": ((r_new * bands * key_row + accepted * bands * old_row) / P / GIB,
                                  f"(new x {bands} x {key_row:.0f} B + {accepted:,.0f} earlier x {bands} x {old_row} B)"
                                  f" / {P:,}"),
        "weekly_keys_segments_per_round": (r_parts * P, f"{r_parts:,} parts x {P:,} partitions"),
        "decisions_table_gib": (new_docs * dec_row / GIB,
                                f"{new_docs:,.0f} rows x {dec_row:.0f} B (Arrow): the refresh's table; "
                                "deduplicated_documents reads one signature part's decisions per task"),
        "weekly_decisions_table_gib": (r_new * dec_row / GIB, f"{r_new:,.0f} rows x {dec_row:.0f} B"),
        "hot_bucket_docs": (hot, f"{t.hot_bucket_share:g} of the documents share one (band, key)"),
        "hot_bucket_pairs": (hot * mb, f"at most members x max_bucket {mb:,} (not members^2 = {hot ** 2:,.0f})"),
        "hot_bucket_task_gib": ((hot * key_row + hot * mb * 16) / GIB, f"one pairs task: members x {key_row:.0f} B "
                                                                      "+ pairs x 16 B (a, b), before np.unique")})
    plan["files"] = files
    return plan


def render(plan: dict, t: Target, md: bool, config: dict | None = None) -> str:
    """The plan as text or markdown; `config`: the default config's dedup.near.rows_per_part and partitions, named
    next to the plan's own."""
    def table(header: list[str], rows: list[list]) -> list[str]:
        cells = [header] + [[c if isinstance(c, str) else f"{c:,.2f}" if abs(c) < 10 else f"{c:,.0f}" for c in r]
                            for r in rows]
        if md:
            return [f"| {' | '.join(r)} |" for r in cells[:1]] + ["|" + "---|" * len(header)] + \
                   [f"| {' | '.join(r)} |" for r in cells[1:]]
        w = [max(len(r[i]) for r in cells) for i in range(len(header))]
        return ["  ".join(c.rjust(w[i]) if i else c.ljust(w[i]) for i, c in enumerate(r)) for r in cells]

    io = "read_tb" in plan["stages"][0]
    out = [f"Target: {t.docs:,.0f} documents, {t.text_tb:g} TB of text, {plan['q']['cores'][0]:,} cores at "
           f"{t.utilization:.0%} utilization; ${t.core_hour_usd}/core-hour, ${t.storage_usd_per_tb_month}/TB-month, "
           f"${t.put_usd_per_1k}/1k PUT; signature parts of {t.near_rows_per_part:,} documents "
           f"(dedup.near.rows_per_part{_default(config, 'rows_per_part')}), {t.partitions:,} key partitions "
           f"(dedup.near.partitions{_default(config, 'partitions')}); rates from the runs {', '.join(plan['runs'])}.",
           ""]
    out += table(["stage", "rate from", "MB/CPU-s", "text in TB", "core-hours", "wall h", "worker MiB", "USD"]
                 + (["read TB", "written TB"] if io else []),
                 [[r["stage"], r["run"], r["mb_per_cpu_s"], r["text_tb"], r["core_hours"], r["wall_hours"],
                   r["worker_mib"], r["usd"]] + ([r["read_tb"], r["write_tb"]] if io else []) for r in plan["stages"]])
    out += [""] + table(["quantity", "value", "how"], [[k, v, how] for k, (v, how) in plan["q"].items()])
    if io:
        out += [""] + table(["shuffle folder", "files"], [[k, v] for k, v in plan["files"].items()])
    return "\n".join(out + ([] if io else ["", "(bytes, files and the shuffle need --run-dir)"]))


def _bench_parts(run: dict) -> str:
    """The bench's signature parts (and so the fan-out the shuffle files are projected from)."""
    n, docs = run.get("files", {}).get("signature_parts"), run.get("near_stats", {}).get("documents")
    return f"; {n:,} signature parts of ~{docs / n:,.0f} documents at {run['docs']:,}" if n and docs else ""


def _default(config: dict | None, key: str) -> str:
    if not config or key not in config:
        return ""
    return f"; the config's default is {config[key]:,}" if config[key] is not None else "; automatic in the config"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--bench", required=True, help="a JSON written by bench/scale_bench.py")
    ap.add_argument("--run-dir", help="a run folder kept by scale_bench.py --keep (bytes and files per document)")
    ap.add_argument("--run", help="engine:workers to take every rate from (default: the lowest per stage)")
    d = Target()
    for name in ("docs", "text_tb", "utilization", "core_hour_usd", "storage_usd_per_tb_month", "put_usd_per_1k",
                 "get_usd_per_1k", "refresh_docs", "hot_bucket_share", "near_rows_per_part", "partitions"):
        ap.add_argument(f"--{name.replace('_', '-')}", type=int if name in ("near_rows_per_part", "partitions")
                        else float, default=getattr(d, name))
    size = ap.add_mutually_exclusive_group()
    size.add_argument("--cores", type=int, help="cluster size (vCPUs); default: what --hours needs")
    size.add_argument("--hours", type=float, default=d.hours, help="wall hours for the whole pipeline")
    ap.add_argument("--history", help="a JSON written by bench/refresh_history.py: the CPU a weekly refresh spends "
                    "on the earlier refreshes' index")
    ap.add_argument("--md", help="write the markdown here (between the scale_plan markers when the file has them)")
    args = ap.parse_args()
    t = Target(**{k: v for k, v in vars(args).items() if k in Target.__dataclass_fields__})
    import numpy as np

    from kiln.common.config import load_config
    from kiln.dedup.bucket_index import BUCKET_SCHEMA
    from kiln.dedup.bucket_layout import old_ranks
    from kiln.dedup.minhash import bands_rows

    bench = json.loads(Path(args.bench).read_text())
    runs = largest_runs(bench, args.run)
    measured = measure_run_dir(Path(args.run_dir), runs[0]["docs"]) if args.run_dir else None
    near = load_config(ROOT / "configs" / "default.yaml").dedup.near
    bands = bands_rows(near)[0]
    old_rank = len(old_ranks(0, np.zeros(1, np.int64))[0].as_py())
    history = None
    if args.history:
        history = json.loads(Path(args.history).read_text())
        history.update(file=args.history, largest_index=max(r["earlier_indexed"] for r in history["refreshes"]))
    plan = project(runs, t, measured, task_and_layout_bytes(), bands,
                   sum(f.type.bit_width // 8 for f in BUCKET_SCHEMA), old_rank, history)
    m, loads = bench.get("machine", {}), [st["load_avg_1m_start"] for r in runs for st in r["stages"].values()]
    head = (f"Bench: {args.bench}, {m.get('cores')} cores, {m.get('memory_gib')} GiB, 1-minute load average "
            f"{min(loads)}-{max(loads)} during the stages; signer {runs[0].get('scheme', 'affine32 (no scheme field)')}"
            f"{_bench_parts(runs[0])}{'; bytes and files from ' + args.run_dir if args.run_dir else ''}.\n\n")
    tail = f"\n\nPeak worker RSS by N (local:1: the driver, which runs every stage): {worker_rss_by_docs(bench)}."
    config = {"rows_per_part": near.rows_per_part, "partitions": near.partitions}
    print(head + render(plan, t, md=False, config=config) + tail)
    if args.md:
        text, path = head + render(plan, t, md=True, config=config) + tail, Path(args.md)
        begin, end = "<!-- scale_plan:begin -->", "<!-- scale_plan:end -->"
        old = path.read_text() if path.is_file() else ""
        if begin in old and end in old:
            text = old[:old.index(begin) + len(begin)] + "\n" + text + "\n" + old[old.index(end):]
        path.write_text(text if begin in old else text + "\n")
        print(f"wrote {path}")


if __name__ == "__main__":
    main()
