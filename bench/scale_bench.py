"""Scale benchmark: a deterministic synthetic corpus through curation, exact dedup and distributed near dedup.

    .venv/bin/python bench/scale_bench.py --docs 10000,30000 [--engine local,ray] [--workers 1,2] [--json OUT]
    .venv/bin/python bench/scale_bench.py --docs 10000 --runs local:1,local:2,ray:2 --json OUT
    .venv/bin/python bench/scale_bench.py --docs 1000000 --runs local:2,ray:2 --repeat 2 --json OUT  # both orders

Corpus (`kiln.curation.synthetic.scale_document`, document i depends only on (seed, i), written as JSONL files of
`--file-docs` documents, one slice per file): Zipf words from kiln/curation/synthetic.py's vocabulary, log-normal length
(median 300 words), planted exact copies (3%), near copies at Jaccard 0.95 / 0.9 / 0.85 on word 5-gram shingles
(6%), and hard negatives that must stay: shared blocks (a block of the previous document, J 0.5-0.65 with it) and
site templates (64 templates shared by 1% of documents, J < 2/3 between two of them).

Pipeline per run, library calls only (no Dagster); each stage of each run (engine, workers) in a fresh process of its
own, stage by stage across the runs (`--order stages`, `schedule`; `--order runs`: each run whole in one process):
  ingest       kiln.curation.pipeline.ingest of the JSONL files into a kiln.common.storage.Store (one task per file)
  filter       kiln.curation.pipeline.filter_documents with `--profile`: light = normalize + pii only (the profile is empty),
               prose = the default config's prose profile (its steps, then pii)
  exact_dedup  kiln.curation.exact_dedup.exact_dedup (the curated documents)
  signatures   kiln.dedup.signing.compute_signatures with --config's dedup.near (default configs/default.yaml:
               scheme fss-splitmix64-v1; a config with scheme: affine32 measures the older signer), then the
               flush to disk that the asset's commit does
  near_dedup   kiln.dedup.buckets.decide_distributed on the engine (`--partitions`, `--max-bucket`)
Engines: local = kiln.engine.ProcessPool(workers) (1 worker runs in the driver process itself), ray =
kiln.engine.RayEngine(workers=...) on an embedded Ray started by the run's process. The engine is started before
the timed stage (Ray's start-up and the pool's fork server are not in any stage), and each stage's input files are
read once before its clock, as a pipeline's stage finds them in the page cache (`warm_inputs`; per stage `inputs`).

Per run the JSON holds per stage wall_s, docs_per_s, docs_per_s_per_core and mb_per_s_per_core (cores = workers;
MB = UTF-8 bytes of the texts entering the stage, in 10^6), peak RSS of the driver and of the largest worker
process (psutil, sampled every `--sample-s` in a thread: the driver and all its descendants — the pool's
processes, or the embedded Ray's raylet, GCS and workers; Ray's own daemons are reported apart as ray_infra),
recall per planted Jaccard level and per measured-J bucket (measured with `minhash.shingle_hashes`: affine32's
shingling, the same word 5-grams as either scheme, blake2b-hashed; a planted pair counts as caught when the copy or
its original was removed naming a document of its planted group), precision from the corpus's planted truth
(`kiln.curation.synthetic.scale_plan` records which earlier document each exact and near copy was made from: a
removed document is correct when the document it names as its duplicate is a copy of the same original, or that
original; every removed document is checked — not a re-check with the Jaccard the pipeline already verified),
an all-pairs check by a second implementation (`--pairs-sample` first documents, a prefix that holds every planted
copy's original: exact Jaccard of plain-Python word 5-gram sets for every pair, through an inverted index; the
pairs at J >= threshold that the decisions left apart, and those the planted truth does not explain), hard
negatives removed, and decisions_sha256 (sha256 over the lines "doc_id\\tstatus\\tduplicate_of" of every input
document sorted by doc_id; status is the filter's reason, exact_duplicate, or near dedup's status). With several
--docs values, a log-log plot of wall time and peak memory against N goes next to the JSON (matplotlib). The
sampler also sums CPU seconds per stage over the same processes (`cpu_s`, `mb_per_cpu_s`): a rate that other load
on the machine disturbs less than wall time does; the sampler's own CPU is kept out of it (`bench_sampler_cpu_s`).
Every round and task is timed too (`stages.*.tasks`, `round_figures`), and the goals split two workers' speed-up
into idle workers, waiting tasks and extra CPU (`speedup_factors`). Per stage, `machine` holds the whole machine's
CPU seconds by kind (user, system, iowait, steal, idle: what the runs' own processes do not account for), page
reclaim counters and the page cache at the end. Before and after the series, `machine.host_noise` holds the
machine's own drift (bench/host_noise.py: the same fixed work's CPU seconds, 20 times): above its QUIET_CV, two
runs compared minutes apart differ by as much as the goals' margins for reasons no engine controls.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable
from contextlib import contextmanager
from functools import lru_cache
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import psutil  # noqa: E402

from bench import host_noise as host_probe  # noqa: E402
from kiln.common.manifest import write_json_atomic  # noqa: E402
from kiln.curation.synthetic import scale_document, scale_plan, write_scale_corpus  # noqa: E402

SOURCE = "scale"
MIB = 2**20
RAY_INFRA = ("raylet", "gcs_server", "dashboard", "log_monitor", "monitor.py", "runtime_env", "agent",
             "ray_client_server", "plasma")
J_BUCKETS = [(0.0, 0.75), (0.75, 0.8), (0.8, 0.85), (0.85, 0.9), (0.9, 0.95), (0.95, 1.0001)]


# ------------------------------------------------------------------------------------------- memory

class RssSampler(threading.Thread):
    """Peak RSS of this process and of each descendant, per stage (the stage is whatever `stage` names now)."""

    def __init__(self, interval: float):
        super().__init__(daemon=True)
        self.interval, self.stage, self.halt = interval, "setup", threading.Event()
        self.peaks: dict[str, dict[str, float]] = defaultdict(lambda: defaultdict(float))
        self.worst: dict[str, str] = {}
        self._class: dict[int, str] = {}
        self._cpu: dict[int, float] = {}
        # The sampler's own CPU (psutil on every process, 5 times a second: ~2% of a core on Ray's dozen
        # processes, near nothing on one process) is the instrument's, not the engine's: kept out of `driver`.
        self.own_cpu_s = 0.0

    def _classify(self, p: psutil.Process) -> str:
        if p.pid not in self._class:
            try:
                cmd = " ".join(p.cmdline()) or p.name()
                parent = p.ppid()
            except (psutil.Error, OSError):
                cmd, parent = "", None
            if any(k in cmd for k in RAY_INFRA) and "default_worker" not in cmd:
                self._class[p.pid] = "ray_infra"
            elif "resource_tracker" in cmd or ("forkserver" in cmd and parent == os.getpid()):
                self._class[p.pid] = "pool_infra"  # the fork server itself; its forked children are the workers
            else:
                self._class[p.pid] = "worker"
        return self._class[p.pid]

    def cpu_seconds(self) -> dict[str, float]:
        """CPU seconds (user + system) used so far by this process and every descendant seen (a process that
        ended counts with its last sample), by kind of process: driver (less the sampler's own CPU), worker,
        ray_infra, pool_infra."""
        own = time.thread_time()
        me = psutil.Process()
        for p in [me, *me.children(recursive=True)]:
            try:
                t = p.cpu_times()
                self._cpu[p.pid] = t.user + t.system
            except psutil.Error:
                continue
            if p.pid != me.pid:
                self._classify(p)
        by_class: dict[str, float] = defaultdict(float)
        for pid, seconds in self._cpu.items():
            by_class["driver" if pid == me.pid else self._class.get(pid, "worker")] += seconds
        self.own_cpu_s += time.thread_time() - own
        by_class["driver"] -= self.own_cpu_s
        return by_class

    def sample(self) -> None:
        own = time.thread_time()
        try:
            self._sample()
        finally:
            self.own_cpu_s += time.thread_time() - own

    def _sample(self) -> None:
        me = psutil.Process()
        driver = me.memory_info().rss
        by_class: dict[str, float] = defaultdict(float)
        total = driver
        worst_worker, worst_cmd = 0, ""
        for child in me.children(recursive=True):
            try:
                rss = child.memory_info().rss
                t = child.cpu_times()
                self._cpu[child.pid] = t.user + t.system
            except psutil.Error:
                continue
            cls = self._classify(child)
            total += rss
            by_class[cls] = max(by_class[cls], rss)
            if cls == "worker" and rss > worst_worker:
                worst_worker = rss
                try:
                    worst_cmd = child.name()
                except psutil.Error:
                    pass
        peaks = self.peaks[self.stage]
        peaks["driver"] = max(peaks["driver"], driver / MIB)
        peaks["all_processes"] = max(peaks["all_processes"], total / MIB)
        for cls, rss in by_class.items():
            peaks[cls] = max(peaks[cls], rss / MIB)
        if worst_worker / MIB >= peaks["worker"] - 1e-9 and worst_worker:
            self.worst[self.stage] = worst_cmd

    def run(self) -> None:
        while not self.halt.is_set():
            try:
                self.sample()
            except (psutil.Error, OSError):
                pass
            self.halt.wait(self.interval)


# ---------------------------------------------------------------------------------------- evaluation

_WORD = re.compile(r"\w+")
_DIGITS = str.maketrans("0123456789", "0000000000")


# ------------------------------------------------------------------------------------------- rounds

class TimedTask:
    """A part task that appends its round, start, end and CPU seconds to its process's file in `folder`. Ray
    pickles this class by value; the pool's workers import this script as their __main__."""

    def __init__(self, fn: Callable, round: int, folder: str):
        self.fn, self.round, self.folder = fn, round, folder

    def __call__(self, task):
        cpu, own, start = time.process_time(), time.thread_time(), time.time()
        try:
            return self.fn(task)
        finally:
            line = (f"{self.round}\t{start:.4f}\t{time.time():.4f}\t{time.process_time() - cpu:.4f}"
                    f"\t{time.thread_time() - own:.4f}\n")
            with open(Path(self.folder) / f"{os.getpid()}.tsv", "a", encoding="utf-8") as f:
                f.write(line)


class TimedEngine:
    """The run's engine, each round's wall time recorded under the current stage and each task timed (`TimedTask`):
    where a stage's worker time goes (`round_figures`)."""

    def __init__(self, engine, folder: Path):
        self.engine, self.folder, self.rounds, self.stage = engine, folder, [], None

    def map_parts(self, fn, tasks, *, desc, **kwargs):
        k, start = len(self.rounds), time.time()
        self.rounds.append({"stage": self.stage, "round": desc, "tasks": len(tasks)})
        try:
            return self.engine.map_parts(TimedTask(fn, k, str(self.folder)), tasks, desc=desc, **kwargs)
        finally:
            self.rounds[k]["wall_s"] = time.time() - start

    def describe(self):
        return self.engine.describe()


VMSTAT = ("pgscan_kswapd", "pgscan_direct", "pgsteal_kswapd", "pgsteal_direct", "allocstall_normal",
          "allocstall_movable", "pgmajfault")


def machine_counters() -> dict[str, float]:
    """The whole machine's CPU seconds by kind (/proc/stat: what other processes, the kernel's writeback and reclaim,
    and the hypervisor took), page reclaim counters (/proc/vmstat) and page cache (/proc/meminfo). Linux only: {}
    elsewhere."""
    try:
        cpu = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
        vm = dict(line.split() for line in Path("/proc/vmstat").read_text().splitlines())
        mem = {k: v.split()[0] for k, v in (line.split(":", 1) for line in Path("/proc/meminfo").read_text().splitlines())}
    except OSError:
        return {}
    tick = os.sysconf("SC_CLK_TCK")
    kinds = ("user", "nice", "system", "idle", "iowait", "irq", "softirq", "steal")
    out = {f"cpu_{k}_s": int(v) / tick for k, v in zip(kinds, cpu)}
    out |= {k: int(vm.get(k, 0)) for k in VMSTAT}
    out |= {"cached_gib": int(mem["Cached"]) / 2**20, "dirty_gib": int(mem["Dirty"]) / 2**20,
            "available_gib": int(mem["MemAvailable"]) / 2**20}
    return out


def machine_delta(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    """Counters as differences over a stage; page cache figures as they were at its end."""
    return {k: round(after[k] - before[k] if k.startswith(("cpu_",) + VMSTAT) else after[k], 2) for k in after}


def warm_inputs(paths: list[Path], budget_bytes: float) -> dict:
    """Read a stage's input files once, before its clock: in a pipeline a stage finds its inputs where the stage
    before it just left them, in the page cache. Stage by stage, three other runs' stages come in between (at 1M
    documents their files, 26 GB, outgrow a 24 GiB machine's cache), and a run read cold whatever the others had
    pushed out: two workers waited on one disk (near dedup's attach round: 2.1 of 8 core-seconds in iowait) where a
    pipeline does not. Inputs larger than `budget_bytes` are left as they are (a corpus that outgrows the cache is
    read cold in a pipeline too). Returns their bytes, whether they were read, and the seconds (not in any stage)."""
    size = sum(p.stat().st_size for p in paths)
    warmed, t0 = size <= budget_bytes, time.perf_counter()
    if warmed:
        for path in paths:
            with open(path, "rb", buffering=0) as f:
                while f.read(1 << 24):
                    pass
    return {"bytes": size, "warmed": warmed, "read_s": round(time.perf_counter() - t0, 2)}


def round_figures(rounds: list[dict], folder: Path, workers: int, stage: str, stage_wall_s: float) -> dict:
    """One stage's rounds of tasks: per round its wall seconds, the seconds its tasks ran (task_wall_s) and their
    CPU seconds, and idle_worker_s = workers x wall - task_wall_s (a round's start, its tail, any gap between
    tasks); per stage `busy` = task seconds / (workers x stage wall), what share of the task seconds was CPU
    (the rest: waiting on the disk, or on a core another process held) and the seconds outside any round (the
    driver alone). task_thread_cpu_s: the CPU seconds of the thread that ran the task alone (task_cpu_s is its
    whole process's over the task: with an engine's own threads, e.g. a Ray worker's, and Arrow's pool).
    `processes`: how many processes ran the stage's tasks (each one's first task pays its imports: more processes
    than workers means cold ones joined mid-stage)."""
    timed = defaultdict(lambda: [0.0, 0.0, 0.0])  # round -> [task wall, task CPU, task thread's CPU]
    ran = defaultdict(set)  # round -> the processes that ran its tasks
    for path in folder.glob("*.tsv"):
        for line in path.read_text(encoding="utf-8").splitlines():
            k, start, end, cpu, own = line.split("\t")
            ran[int(k)].add(path.stem)
            timed[int(k)][0] += float(end) - float(start)
            timed[int(k)][1] += float(cpu)
            timed[int(k)][2] += float(own)
    out = [{"round": r["round"], "tasks": r["tasks"], "wall_s": round(r["wall_s"], 3),
            "task_wall_s": round(timed[k][0], 3), "task_cpu_s": round(timed[k][1], 3),
            "task_thread_cpu_s": round(timed[k][2], 3), "idle_worker_s": round(workers * r["wall_s"] - timed[k][0], 3)}
           for k, r in enumerate(rounds) if r["stage"] == stage]
    task_wall, task_cpu = sum(r["task_wall_s"] for r in out), sum(r["task_cpu_s"] for r in out)
    processes = set().union(*(ran[k] for k, r in enumerate(rounds) if r["stage"] == stage))
    return {"busy": round(task_wall / (workers * stage_wall_s), 3), "processes": len(processes),
            "task_cpu_over_wall": round(task_cpu / task_wall, 3) if task_wall else None,
            "outside_rounds_s": round(stage_wall_s - sum(r["wall_s"] for r in out), 3), "rounds": out}


def plain_shingles(text: str, n: int = 5) -> set[tuple[str, ...]]:
    """Word n-grams as Python tuples: the near-dedup normalization (lowercase, \\w+ words, digits as 0) written
    independently of kiln (no hashing, so no collisions)."""
    w = _WORD.findall(text.lower().translate(_DIGITS))
    return {tuple(w[k:k + n]) for k in range(max(len(w) - n + 1, 1))} if w else {()}


def plain_jaccard(a: str, b: str, n: int = 5) -> float:
    """One pair, directly (the tests' reference for `similar_pairs`)."""
    x, y = plain_shingles(a, n), plain_shingles(b, n)
    return len(x & y) / len(x | y)


def decisions_of(store, out_dir: Path) -> dict[str, tuple[str, str | None]]:
    """doc_id -> (status, duplicate_of) for every ingested document."""
    from kiln.dedup.buckets import read_decisions

    status: dict[str, tuple[str, str | None]] = {}
    for d in store.read_table("raw", SOURCE, "documents", columns=["doc_id"]).column("doc_id").to_pylist():
        status[d] = ("unknown", None)
    rejected = store.read_table("filtered", SOURCE, "rejected", columns=["doc_id", "reason"])
    if rejected.num_rows:
        for d, r in zip(rejected.column("doc_id").to_pylist(), rejected.column("reason").to_pylist()):
            status[d] = (f"filtered:{r}", None)
    exact = store.read_table("curated", SOURCE, "rejected", columns=["doc_id", "duplicate_of"])
    if exact.num_rows:
        for d, o in zip(exact.column("doc_id").to_pylist(), exact.column("duplicate_of").to_pylist()):
            status[d] = ("exact_duplicate", o)
    near = read_decisions(out_dir)
    for d, s, o in zip(near.column("doc_id").to_pylist(), near.column("status").to_pylist(),
                       near.column("duplicate_of").to_pylist()):
        status[d] = (s, o)
    return status


def decisions_sha256(status: dict[str, tuple[str, str | None]]) -> str:
    h = hashlib.sha256()
    for d in sorted(status):
        s, o = status[d]
        h.update(f"{d}\t{s}\t{o or ''}\n".encode())
    return h.hexdigest()


REMOVED = ("exact_duplicate", "near_duplicate")


def planted_root(plan) -> int:
    """The generator's record of which documents are copies of one another: an exact or near copy belongs to the
    document it was made from (always a plain one), every other document to itself."""
    return plan.of if plan.kind in ("exact_copy", "near_copy") else plan.i


def planted_precision(status: dict[str, tuple[str, str | None]], ids: list[str], plans: list) -> dict:
    """Precision of the removals against the planted truth: a removed document (exact or near duplicate) is
    correct when the document it names is in its planted group (`planted_root`: the same original, or the
    original itself; either may be the one kept). Independent of the Jaccard the pipeline verifies: a hard
    negative removed, a document pointed at the wrong original, or a chance match counts against it."""
    index = {d: i for i, d in enumerate(ids)}
    removed = wrong = 0
    examples = []
    for d, (s, other) in status.items():
        if s not in REMOVED:
            continue
        i, k = index[d], index.get(other)
        removed += 1
        if k is None or planted_root(plans[i]) != planted_root(plans[k]):
            wrong += 1
            if len(examples) < 5:
                examples.append({"doc": i, "duplicate_of": k, "status": s, "kind": plans[i].kind,
                                 "duplicate_of_kind": plans[k].kind if k is not None else None})
    return {"precision": round((removed - wrong) / removed, 5) if removed else None, "removed": removed,
            "wrong": wrong, "wrong_examples": examples, "truth": "planted (kiln.curation.synthetic.scale_plan)"}


def pipeline_groups(status: dict[str, tuple[str, str | None]], ids: list[str]) -> list[int]:
    """Per document, a group number: documents a removal joined (removed -> the document it names, transitively)
    share one."""
    index = {d: i for i, d in enumerate(ids)}
    parent = list(range(len(ids)))

    def find(x: int) -> int:
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for d, (s, other) in status.items():
        if s in REMOVED and other in index:
            parent[find(index[d])] = find(index[other])
    return [find(i) for i in range(len(ids))]


def similar_pairs(texts: list[str], threshold: float, n: int = 5) -> dict[tuple[int, int], float]:
    """Every pair of `texts` with exact Jaccard >= threshold on plain_shingles, by an inverted index (shingle ->
    the texts holding it): a second implementation, no MinHash, no banding, no sampling of pairs."""
    sets = [plain_shingles(t, n) for t in texts]
    postings: dict[tuple, list[int]] = defaultdict(list)
    for k, shingles in enumerate(sets):
        for g in shingles:
            postings[g].append(k)
    shared: Counter = Counter()
    for holders in postings.values():
        for x in range(len(holders)):
            for y in range(x + 1, len(holders)):
                shared[holders[x], holders[y]] += 1
    out = {}
    for (a, b), c in shared.items():
        j = c / (len(sets[a]) + len(sets[b]) - c)
        if j >= threshold:
            out[a, b] = j
    return out


def all_pairs_check(seed: int, status: dict[str, tuple[str, str | None]], ids: list[str], plans: list,
                    threshold: float, sample: int) -> dict:
    """The first `sample` documents (a prefix: every planted copy's original comes before it, so its planted groups
    are whole), every pair at exact Jaccard >= threshold found by `similar_pairs`: how many the decisions joined
    (recall of the pipeline on pairs, whatever was planted), and how many are not one planted group (chance
    duplicates the planted truth would miss: 0 means it is complete for this prefix). Documents a filter dropped
    are left out."""
    m = min(sample, len(ids)) if sample else len(ids)
    keep = [i for i in range(m) if not status[ids[i]][0].startswith("filtered")]
    pairs = similar_pairs([scale_document(seed, i)["text"] for i in keep], threshold)
    groups = pipeline_groups(status, ids)
    joined = sum(groups[keep[a]] == groups[keep[b]] for a, b in pairs)
    unplanted = [(keep[a], keep[b]) for a, b in pairs if planted_root(plans[keep[a]]) != planted_root(plans[keep[b]])]
    return {"documents": len(keep), "pairs_j_ge_threshold": len(pairs), "joined": joined,
            "recall": round(joined / len(pairs), 5) if pairs else None, "unplanted_pairs": len(unplanted),
            "unplanted_examples": unplanted[:5]}


def evaluate(seed: int, n_docs: int, status: dict[str, tuple[str, str | None]], near, sample: int) -> dict:
    from kiln.curation.documents import make_doc_id
    from kiln.dedup.minhash import jaccard, shingle_hashes

    t0 = time.perf_counter()
    ids = [make_doc_id(SOURCE, f"id:scale-{seed}-{i}") for i in range(n_docs)]
    index = {d: i for i, d in enumerate(ids)}
    missing = sum(d not in status for d in ids)
    if missing:
        raise RuntimeError(f"{missing} generated documents have no decision: doc ids are not what the bench expects")

    @lru_cache(maxsize=4096)
    def text(i: int) -> str:
        return scale_document(seed, i)["text"]

    def st(i: int) -> str:
        return status[ids[i]][0]

    plans = [scale_plan(seed, i) for i in range(n_docs)]

    def resolved(i: int) -> bool:
        """Document i was removed as a duplicate of a document of its own planted group."""
        s, other = status[ids[i]]
        return s in REMOVED and other in index and planted_root(plans[index[other]]) == planted_root(plans[i])

    kinds = Counter(p.kind for p in plans)
    by_target: dict[str, list[int]] = defaultdict(lambda: [0, 0])  # target -> [caught, planted]
    by_bucket: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    exact_copies = [0, 0]
    excluded_filtered = 0
    hn = {"shared_block": [0, 0], "template": [0, 0]}  # removed, total
    shared_j = []
    for p in plans:
        if p.kind in ("near_copy", "exact_copy"):
            if st(p.i).startswith("filtered") or st(p.of).startswith("filtered"):
                excluded_filtered += 1
                continue
            caught = resolved(p.i) or resolved(p.of)  # the copy or its original gone, for the right reason
            if p.kind == "exact_copy":
                exact_copies[0] += caught
                exact_copies[1] += 1
                continue
            j = jaccard(shingle_hashes(text(p.i), near), shingle_hashes(text(p.of), near))
            by_target[f"{p.target:.2f}"][0] += caught
            by_target[f"{p.target:.2f}"][1] += 1
            lo, hi = next(b for b in J_BUCKETS if b[0] <= j < b[1])
            key = f"[{lo:.2f},{min(hi, 1.0):.2f}{']' if hi > 1 else ')'}"
            by_bucket[key][0] += caught
            by_bucket[key][1] += 1
        elif p.kind in hn:
            hn[p.kind][1] += 1
            hn[p.kind][0] += st(p.i) in REMOVED
            if p.kind == "shared_block":
                shared_j.append(jaccard(shingle_hashes(text(p.i), near), shingle_hashes(text(p.of), near)))

    def rate(x):
        return round(x[0] / x[1], 4) if x[1] else None

    counts = Counter(s for s, _ in status.values())
    return {
        "kinds": dict(kinds),
        "statuses": dict(counts),
        "recall_by_target_j": {t: {"recall": rate(v), "caught": v[0], "planted": v[1]}
                               for t, v in sorted(by_target.items(), reverse=True)},
        "recall_by_measured_j": {b: {"recall": rate(v), "caught": v[0], "planted": v[1]}
                                 for b, v in sorted(by_bucket.items(), reverse=True)},
        "recall_exact_copies": {"recall": rate(exact_copies), "caught": exact_copies[0], "planted": exact_copies[1]},
        "recall_j_ge_085": rate([sum(v[0] for b, v in by_bucket.items() if float(b[1:5]) >= 0.85),
                                 sum(v[1] for b, v in by_bucket.items() if float(b[1:5]) >= 0.85)]),
        "planted_excluded_filtered": excluded_filtered,
        "precision": planted_precision(status, ids, plans),
        "all_pairs": all_pairs_check(seed, status, ids, plans, near.threshold, sample),
        "hard_negatives_removed": hn["shared_block"][0] + hn["template"][0],
        "hard_negatives": {k: {"removed": v[0], "total": v[1]} for k, v in hn.items()},
        "shared_block_max_j": round(max(shared_j), 4) if shared_j else None,
        "eval_s": round(time.perf_counter() - t0, 1),
    }


# -------------------------------------------------------------------------------------------- one run

def file_counts(root: Path) -> dict[str, int]:
    """Files per top-level folder of a work dir (the small-file count a shuffle leaves)."""
    out: Counter = Counter()
    for dirpath, _, files in os.walk(root):
        rel = Path(dirpath).relative_to(root).parts
        out[rel[0] if rel else "."] += len(files)
    return dict(out)


STAGES = ("ingest", "filter", "exact_dedup", "signatures", "near_dedup")
STATE = "bench-run.json"  # a run's stage records and what later stages need, between its processes


def run_one(args, stages: tuple[str, ...] = STAGES) -> dict | None:
    """Run `stages` of one run (engine, workers) in this process, on an engine started here (untimed), and return
    the run's figures once its last stage has run (else None). A run split over several processes (one per stage:
    `schedule`) carries its stage records and what later stages read in `run_dir/bench-run.json`."""
    from kiln.common.config import ExactDedup, Reading, Source, load_config
    from kiln.common.storage import Store, flush_to_disk
    from kiln.curation.exact_dedup import HashSource, exact_dedup
    from kiln.curation.pipeline import filter_documents, ingest, profile_steps
    from kiln.dedup.buckets import decide_distributed
    from kiln.dedup.signing import compute_signatures, signature_groups
    from kiln.engine import ProcessPool, RayEngine
    from kiln.engine.base import warm_worker

    sampler = RssSampler(args.sample_s)
    sampler.start()
    run_dir = Path(args.run_dir)
    if stages[0] == STAGES[0]:
        shutil.rmtree(run_dir, ignore_errors=True)
        run_dir.mkdir(parents=True)
        write_json_atomic(run_dir / STATE, json.dumps({"stages": {}, "engine_start_s": {}}))
    state = json.loads((run_dir / STATE).read_text())
    corpus = Path(args.corpus)
    meta = json.loads((corpus / "corpus.json").read_text())
    config = load_config(args.config)
    profiles = {**config.profiles, "light": []}
    source = Source(name=SOURCE, kind="jsonl", path=str(corpus / "*.jsonl"), license="CC0-1.0", domain="web",
                    quality_tier=1, profile=args.profile)
    config = config.model_copy(update={"sources": [source], "profiles": profiles})
    reading = Reading(rows_per_part=args.rows_per_part)
    near = config.dedup.near
    engine = ProcessPool(args.workers) if args.engine == "local" else RayEngine(workers=args.workers)
    one_process = args.engine == "local" and args.workers == 1  # a child seen then is a helper (1 MiB), no worker
    t0 = time.perf_counter()
    # pool / Ray started, its workers' modules imported (the pool's forkserver preloads them; Ray's import on use)
    engine.map_parts(warm_worker, list(range(2 * args.workers)), desc="warm", progress=False)
    state["engine_start_s"][stages[0]] = round(time.perf_counter() - t0, 2)
    engine = TimedEngine(engine, Path(tempfile.mkdtemp(prefix="kiln-task-times-")))
    store = Store(run_dir / "store")
    records: dict[str, dict] = state["stages"]

    @contextmanager
    def stage(name: str, inputs: list[Path]):
        budget = machine_counters().get("available_gib", 0) * 2**30 / 2
        rec = {"inputs": warm_inputs(inputs, budget)}
        sampler.stage = engine.stage = name
        load = os.getloadavg()
        rec["load_avg_1m_start"] = round(load[0], 2)
        cpu0, machine0, sampler0 = sampler.cpu_seconds(), machine_counters(), sampler.own_cpu_s
        start = time.perf_counter()
        yield rec
        rec["wall_s"] = round(time.perf_counter() - start, 3)
        rec["machine"] = machine_delta(machine0, machine_counters())
        sampler.sample()
        cpu1 = sampler.cpu_seconds()
        rec["cpu_s_by_process"] = {kind: round(cpu1[kind] - cpu0.get(kind, 0.0), 2) for kind in sorted(cpu1)}
        rec["cpu_s"] = round(sum(rec["cpu_s_by_process"].values()), 2)
        rec["bench_sampler_cpu_s"] = round(sampler.own_cpu_s - sampler0, 2)  # not in cpu_s
        rec["mb_per_cpu_s"] = round(rec["mb"] / max(rec["cpu_s"], 1e-9), 3)
        rec["load_avg_1m_end"] = round(os.getloadavg()[0], 2)
        cores = args.workers
        rec["docs_per_s"] = round(rec["docs"] / rec["wall_s"], 1)
        rec["docs_per_s_per_core"] = round(rec["docs"] / rec["wall_s"] / cores, 1)
        rec["mb_per_s_per_core"] = round(rec["mb"] / rec["wall_s"] / cores, 3)
        rec["tasks"] = round_figures(engine.rounds, engine.folder, args.workers, name, rec["wall_s"])
        p = sampler.peaks[name]
        worker = None if one_process else round(p.get("worker", 0)) or None
        rec["peak_rss_mib"] = {"driver": round(p.get("driver", 0)), "worker": worker,
                               "all_processes": round(p.get("all_processes", 0)),
                               **({"ray_infra": round(p.get("ray_infra", 0))} if args.engine == "ray" else {})}
        records[name] = rec
        sampler.stage = "between"

    commit = dict(code_version="bench", config={}, inputs={}, counts={})
    sig_dir = run_dir / "signatures"
    result: dict = {}
    for name in stages:
        if name == "ingest":
            with stage(name, sorted(corpus.glob("*.jsonl"))) as rec:
                with store.staging("raw", SOURCE) as w:
                    s = ingest(source, reading, w, engine, progress=False)
                    w.commit(**commit)
                rec.update(docs=meta["documents"], mb=meta["text_bytes"] / 1e6, docs_out=s.docs_out)
        elif name == "filter":
            raw = store.files("raw", SOURCE, "documents")
            with stage(name, raw) as rec:
                with store.staging("filtered", SOURCE) as w:
                    s = filter_documents(raw, profile_steps(config, SOURCE), ExactDedup(), w, engine, progress=False)
                    w.commit(**commit)
                rec.update(docs=s.docs_in, mb=s.chars_in / 1e6, docs_out=s.docs_out)
        elif name == "exact_dedup":
            filtered = store.files("filtered", SOURCE, "documents")
            with stage(name, filtered) as rec:
                with store.staging("curated", SOURCE) as w:
                    hs = [HashSource(SOURCE, 1, tuple(map(str, filtered)))]
                    s = exact_dedup(hs, 0, w, run_dir / "exact-shuffle", engine, progress=False)
                    w.commit(**commit)
                rec.update(docs=s.docs_in, mb=s.chars_in / 1e6, docs_out=s.docs_out)
            state["curated_mb"] = s.chars_out / 1e6
        elif name == "signatures":
            curated = store.files("curated", SOURCE, "documents")
            shutil.rmtree(sig_dir, ignore_errors=True)
            sig_dir.mkdir()
            groups = signature_groups(curated, near.rows_per_part)  # as minhash_signatures joins curated parts
            sig_parts = [sig_dir / f"signatures-{k:05d}.parquet" for k in range(len(groups))]
            with stage(name, curated) as rec:
                n = compute_signatures(groups, sig_parts, near, engine=engine, progress=False).documents
                flush_to_disk(sig_dir)  # as the minhash_signatures asset's commit does: its tasks leave the flush to it
                rec.update(docs=n, mb=state["curated_mb"])
            state["signature_parts"] = [str(p) for p in sig_parts]
        elif name == "near_dedup":
            sig_parts = list(map(Path, state["signature_parts"]))
            with stage(name, sig_parts) as rec:
                result = decide_distributed(sig_parts, {SOURCE: (1, 0)}, [],
                                            run_dir / "near-work", run_dir / "near-out", near, "bench",
                                            engine=engine, partitions=args.partitions, max_bucket=args.max_bucket)
                rec.update(docs=records["signatures"]["docs"], mb=state["curated_mb"], substages_s=result["timing"])
        else:
            raise ValueError(f"unknown stage {name!r}: one of {', '.join(STAGES)}")
    write_json_atomic(run_dir / STATE, json.dumps(state))
    shutil.rmtree(engine.folder, ignore_errors=True)

    def stop() -> None:  # the sampler, and the embedded Ray this process started
        sampler.halt.set()
        sampler.join()
        if args.engine == "ray":
            from kiln.engine import shutdown
            shutdown()

    if STAGES[-1] not in stages:
        stop()
        return None

    n, curated_mb = records["signatures"]["docs"], state["curated_mb"]
    files = {"near_work": {name: v["files"] for name, v in result["scratch"].items()},  # dropped during the run
             "near_out": file_counts(run_dir / "near-out"),
             "exact_shuffle": sum(file_counts(run_dir / "exact-shuffle").values()),
             "signature_parts": len(state["signature_parts"]),
             "raw_parts": len(store.files("raw", SOURCE, "documents"))}
    disk = sum(f.stat().st_size for f in run_dir.rglob("*") if f.is_file())
    sampler.stage = "evaluation"
    status = decisions_of(store, run_dir / "near-out")
    sha = decisions_sha256(status)
    # The quality figures are a function of the decisions: a run deciding as an earlier one (same sha) reuses them.
    cached = corpus / f"quality-{sha[:16]}-{args.pairs_sample}.json"
    if cached.is_file():
        quality = {**json.loads(cached.read_text()), "quality_of": "an earlier run with the same decisions_sha256"}
    else:
        quality = evaluate(meta["seed"], meta["documents"], status, near, args.pairs_sample)
        write_json_atomic(cached, json.dumps(quality))
    stop()
    stages_run = {name: records[name] for name in STAGES}
    pipeline = [s["peak_rss_mib"] for s in stages_run.values()]
    total_wall = sum(r["wall_s"] for r in stages_run.values())
    mb = meta["text_bytes"] / 1e6
    e2e = stages_run["signatures"]["wall_s"] + stages_run["near_dedup"]["wall_s"]
    out = {
        "engine": args.engine, "workers": args.workers, "docs": meta["documents"], "seed": meta["seed"],
        "text_mb": round(mb, 1), "profile": args.profile, "scheme": near.scheme, "rows_per_part": args.rows_per_part,
        "partitions": result["partitions"], "max_bucket": args.max_bucket,
        "engine_start_s": max(state["engine_start_s"].values()),
        "stages": stages_run,
        "total": {"wall_s": round(total_wall, 2), "docs_per_s": round(meta["documents"] / total_wall, 1),
                  "docs_per_s_per_core": round(meta["documents"] / total_wall / args.workers, 1),
                  "mb_per_s_per_core": round(mb / total_wall / args.workers, 3)},
        "near_dedup_end_to_end": {"wall_s": round(e2e, 2), "what": "signatures + near_dedup, from curated text",
                                  "mb_per_s_per_core": round(curated_mb / e2e / args.workers, 3),
                                  "docs_per_s_per_core": round(n / e2e / args.workers, 1)},
        "peak_rss_mib": {"driver": max(p["driver"] for p in pipeline),
                         "worker": max(p["worker"] or 0 for p in pipeline) or None,
                         "all_processes": max(p["all_processes"] for p in pipeline),
                         **({"ray_infra": max(p["ray_infra"] for p in pipeline)} if args.engine == "ray" else {}),
                         "evaluation_driver": round(sampler.peaks["evaluation"]["driver"]),
                         "note": "worker = largest single worker process; local with 1 worker runs every stage in "
                                 "the driver (no worker processes)" if one_process
                         else "worker = largest single worker process"},
        **quality,
        "decisions_sha256": sha,
        "near_stats": {k: result[k] for k in ("documents", "kept", "buckets", "verification", "components",
                                              "cluster_sizes", "scratch") if k in result},
        "files": files, "disk_mib": round(disk / MIB),
    }
    if not args.keep:
        shutil.rmtree(run_dir, ignore_errors=True)
    return out


# ------------------------------------------------------------------------------------------------ main

def prepare_corpus(corpus: Path, n: int, seed: int, file_docs: int, workers: int) -> Path:
    """The JSONL files of the corpus and corpus.json (documents, seed, files, text bytes), unless already there."""
    if not (corpus / "corpus.json").is_file():
        t0 = time.perf_counter()
        files, text_bytes = write_scale_corpus(corpus, n, seed, file_docs, workers=workers)
        (corpus / "corpus.json").write_text(json.dumps({"documents": n, "seed": seed, "files": len(files),
                                                        "text_bytes": text_bytes,
                                                        "generate_s": round(time.perf_counter() - t0, 1)}))
    return corpus


def run_args(**overrides) -> argparse.Namespace:
    """The arguments of one run with the command line's defaults (for tests and notebooks)."""
    return argparse.Namespace(**{**dict(engine="local", workers=1, profile="light", config="configs/default.yaml",
                                        rows_per_part=500, partitions=None, max_bucket=1000, pairs_sample=3000,
                                        sample_s=0.2, keep=False), **overrides})


def goals(runs: list[dict]) -> dict:
    """`goals_of` the runs; with --repeat, each figure as [min, max] over the repetitions (a spread, where a shared
    machine makes one run's CPU seconds vary by tens of percent), every repetition's own under `by_repeat`, and the
    figures of the repetitions pooled under `pooled` (`pool_repetitions`)."""
    repeats = sorted({r.get("repeat", 0) for r in runs})
    if len(repeats) == 1:
        return goals_of(runs)
    each = [goals_of([r for r in runs if r.get("repeat", 0) == k]) for k in repeats]
    return {**spread(each), "by_repeat": each, "pooled": goals_of(pool_repetitions(runs))}


def pool_repetitions(runs: list[dict]) -> list[dict]:
    """One run per (engine, workers, docs) whose seconds and MB are the sums over its repetitions (a ratio of two
    pooled runs is summed seconds over summed seconds) and whose peak memory is the largest; no task figures."""
    by: dict[tuple, list[dict]] = defaultdict(list)
    for r in runs:
        by[(r["engine"], r["workers"], r["docs"])].append(r)
    pooled = []
    for (engine, workers, docs), reps in by.items():
        stages = {}
        for name in reps[0]["stages"]:
            mb, wall, cpu = (sum(r["stages"][name][k] for r in reps) for k in ("mb", "wall_s", "cpu_s"))
            stages[name] = {"mb": mb, "wall_s": wall, "cpu_s": cpu, "mb_per_cpu_s": mb / cpu}
        peak = {kind: max(r["peak_rss_mib"][kind] or 0 for r in reps) for kind in ("driver", "worker")}
        pooled.append({"engine": engine, "workers": workers, "docs": docs, "stages": stages,
                       "total": {"wall_s": sum(r["total"]["wall_s"] for r in reps)}, "peak_rss_mib": peak})
    return pooled


def spread(figures: list[dict]) -> dict:
    """The same nested dict of numbers from several repetitions -> [min, max] per number."""
    out: dict = {}
    for key, value in figures[0].items():
        values = [f[key] for f in figures if key in f]
        out[key] = spread(values) if isinstance(value, dict) else [min(values), max(values)]
    return out


def goals_of(runs: list[dict]) -> dict:
    """Issue 36's figures from the runs: Ray's CPU per MB over the pool's for each stage at the same workers and N,
    two workers' speed-up over one (stage wall seconds) per engine and N, near dedup's text -> decisions MB per
    second per core (curated MB / (signatures + near_dedup wall seconds) / workers), and each run's peak RSS at the
    largest N over the smallest (driver and largest worker)."""
    by = {(r["engine"], r["workers"], r["docs"]): r for r in runs}
    out: dict = {"ray_cpu_per_mb_over_pool": {}, "speedup_2_over_1": {}, "speedup_2_over_1_factors": {},
                 "near_text_to_decisions_mb_s_core": {}, "peak_rss_largest_over_smallest_n": {}}
    for (engine, workers, docs), r in sorted(by.items()):
        key = f"{engine}:{workers}@{docs}"
        sig, near = r["stages"]["signatures"], r["stages"]["near_dedup"]
        out["near_text_to_decisions_mb_s_core"][key] = round(sig["mb"] / (sig["wall_s"] + near["wall_s"]) / workers, 2)
        pool = by.get(("local", workers, docs))
        if engine == "ray" and pool:
            out["ray_cpu_per_mb_over_pool"][key] = {
                stage: round(pool["stages"][stage]["mb_per_cpu_s"] / s["mb_per_cpu_s"], 3) for stage, s in r["stages"].items()}
        one = by.get((engine, 1, docs))
        if workers == 2 and one:
            out["speedup_2_over_1"][f"{engine}@{docs}"] = {
                **{stage: round(one["stages"][stage]["wall_s"] / s["wall_s"], 2) for stage, s in r["stages"].items()},
                "total": round(one["total"]["wall_s"] / r["total"]["wall_s"], 2)}
            factors = {stage: speedup_factors(one["stages"][stage]["tasks"], s["tasks"])
                       for stage, s in r["stages"].items() if "tasks" in s and "tasks" in one["stages"][stage]}
            if factors:
                out["speedup_2_over_1_factors"][f"{engine}@{docs}"] = factors
    sizes = sorted({d for _, _, d in by})
    for engine, workers in sorted({(e, w) for e, w, _ in by}):
        small, large = by.get((engine, workers, sizes[0])), by.get((engine, workers, sizes[-1]))
        if small and large and small is not large:
            out["peak_rss_largest_over_smallest_n"][f"{engine}:{workers}"] = {
                kind: round(large["peak_rss_mib"][kind] / small["peak_rss_mib"][kind], 3)
                for kind in ("driver", "worker") if small["peak_rss_mib"].get(kind) and large["peak_rss_mib"].get(kind)}
    return out


def speedup_factors(one: dict, two: dict) -> dict:
    """Where a stage's two-worker speed-up goes, from the `round_figures` of its one- and two-worker runs. A stage's
    wall time is its task CPU seconds / (task_cpu_over_wall x busy x workers), so the speed-up is exactly
    2 x busy x cpu_share x cpu: `busy` the two-worker run's busy over the one-worker run's (workers idle between or
    at the ends of rounds), `cpu_share` the same for task_cpu_over_wall (tasks waiting on the disk or for a core),
    `cpu` one worker's task CPU seconds over two workers' (the same work costing more CPU when two run at once)."""
    cpu = lambda t: sum(r["task_cpu_s"] for r in t["rounds"])  # noqa: E731
    return {"busy": round(two["busy"] / one["busy"], 3),
            "cpu_share": round(two["task_cpu_over_wall"] / one["task_cpu_over_wall"], 3),
            "cpu": round(cpu(one) / cpu(two), 3)}


Run = tuple[str, int]  # (engine, workers)


def schedule(runs: list[Run], repeat: int, order: str) -> list[tuple[int, Run, tuple[str, ...]]]:
    """The processes of a series, as (repetition, run, its stages), in the order they run. The list of runs is
    reversed every other repetition; with order "stages", every other stage too, so on each stage two neighbours
    of the list run back to back and each run is as often first as last. A shared machine's speed drifts by tens
    of percent within the hour: comparing two runs of a stage minutes apart, not a whole run apart, keeps most of
    that drift out of Ray-over-pool and two-over-one."""
    out = []
    for k in range(repeat):
        listed = runs if k % 2 == 0 else runs[::-1]
        if order == "runs":
            out += [(k, run, STAGES) for run in listed]
        else:
            out += [(k, run, (stage,)) for i, stage in enumerate(STAGES)
                    for run in (listed if i % 2 == 0 else listed[::-1])]
    return out


def parse_runs(args) -> list[Run]:
    if args.runs:
        return [(e, int(w)) for e, w in (r.split(":") for r in args.runs.split(","))]
    return [(e, int(w)) for e in args.engine.split(",") for w in args.workers.split(",")]


def print_table(runs: list[dict]) -> None:
    print(f"\n{'docs':>8} {'engine':>6} {'w':>2} {'stage':<12}{'wall_s':>9}{'docs/s':>10}{'docs/s/core':>12}"
          f"{'MB/s/core':>10}{'MB/cpu-s':>9}{'drv MiB':>9}{'wrk MiB':>9}{'load':>6}{'busy':>6}{'cpu/wall':>9}")
    for r in runs:
        for name, s in r["stages"].items():
            p, t = s["peak_rss_mib"], s.get("tasks", {})
            print(f"{r['docs']:>8,} {r['engine']:>6} {r['workers']:>2} {name:<12}{s['wall_s']:>9.1f}"
                  f"{s['docs_per_s']:>10,.0f}{s['docs_per_s_per_core']:>12,.0f}{s['mb_per_s_per_core']:>10.2f}"
                  f"{s['mb_per_cpu_s']:>9.2f}{p['driver']:>9}{p['worker'] or '-':>9}{s['load_avg_1m_start']:>6.1f}"
                  f"{t.get('busy', '-'):>6}{t.get('task_cpu_over_wall') or '-':>9}")
        t = r["total"]
        print(f"{r['docs']:>8,} {r['engine']:>6} {r['workers']:>2} {'TOTAL':<12}{t['wall_s']:>9.1f}"
              f"{t['docs_per_s']:>10,.0f}{t['docs_per_s_per_core']:>12,.0f}{t['mb_per_s_per_core']:>10.2f}{'':>9}"
              f"{r['peak_rss_mib']['driver']:>9}{r['peak_rss_mib']['worker'] or '-':>9}")
        rec = ", ".join(f"J{t}: {v['recall']}" for t, v in r["recall_by_target_j"].items())
        print(f"{'':>20}recall {rec}; exact {r['recall_exact_copies']['recall']}; measured J>=.85 "
              f"{r['recall_j_ge_085']}; precision (planted truth) {r['precision']['precision']} of "
              f"{r['precision']['removed']:,} removed; all pairs at J >= threshold in the first "
              f"{r['all_pairs']['documents']:,}: {r['all_pairs']['joined']}/{r['all_pairs']['pairs_j_ge_threshold']} "
              f"joined, {r['all_pairs']['unplanted_pairs']} unplanted; hard negatives removed "
              f"{r['hard_negatives_removed']}; sha {r['decisions_sha256'][:12]}")


def plot(runs: list[dict], path: Path) -> str:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "matplotlib not installed: no plot"
    fig, (a, b) = plt.subplots(1, 2, figsize=(11, 4.5))
    repeated = len({r.get("repeat", 0) for r in runs}) > 1
    for key in sorted({(r["engine"], r["workers"], r.get("repeat", 0)) for r in runs}):
        rs = sorted((r for r in runs if (r["engine"], r["workers"], r.get("repeat", 0)) == key),
                    key=lambda r: r["docs"])
        x = [r["docs"] for r in rs]
        label = f"{key[0]} x{key[1]}" + (f" #{key[2]}" if repeated else "")
        a.plot(x, [r["total"]["wall_s"] for r in rs], "o-", label=f"{label} total")
        a.plot(x, [r["stages"]["near_dedup"]["wall_s"] for r in rs], "s--", label=f"{label} near_dedup")
        b.plot(x, [r["peak_rss_mib"]["driver"] for r in rs], "o-", label=f"{label} driver")
        if any(r["peak_rss_mib"]["worker"] for r in rs):
            b.plot(x, [r["peak_rss_mib"]["worker"] or float("nan") for r in rs], "s--", label=f"{label} worker")
    for ax, title, ylabel in [(a, "wall time", "seconds"), (b, "peak RSS", "MiB")]:
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("documents")
        ax.set_ylabel(ylabel)
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    return str(path)


def report_host_noise(when: str) -> dict:
    """The machine's own drift (bench/host_noise.py, ~15 s), next to the ratios it can move."""
    noise = host_probe.measure()
    print(f"host noise {when}: {host_probe.describe(noise)}", flush=True)
    return noise


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", default="10000", help="comma-separated corpus sizes")
    ap.add_argument("--engine", default="local", help="comma-separated: local, ray")
    ap.add_argument("--workers", default="1,2", help="comma-separated worker counts")
    ap.add_argument("--runs", default=None, help="explicit engine:workers list, instead of --engine x --workers")
    ap.add_argument("--repeat", type=int, default=1,
                    help="run the list this many times, reversed every other time, so that each engine runs first "
                         "and last; the goals give each figure's [min, max] over the repetitions")
    ap.add_argument("--order", choices=("stages", "runs"), default="stages",
                    help="stages: each stage on every run before the next stage, each (run, stage) in a process of "
                         "its own, so the runs compared on a stage ran it minutes apart; runs: each run whole")
    ap.add_argument("--json", default=None, help="write the runs here (and the plot next to it)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", default="light", help="light (normalize + pii) or a profile of the config: prose")
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--rows-per-part", type=int, default=500, help="documents per part (default config: 500)")
    ap.add_argument("--file-docs", type=int, default=10_000, help="documents per input JSONL file")
    ap.add_argument("--partitions", type=int, default=None, help="key partitions (default: automatic)")
    ap.add_argument("--max-bucket", type=int, default=1000)
    ap.add_argument("--pairs-sample", "--precision-sample", dest="pairs_sample", type=int, default=3000,
                    help="first documents of the corpus in the all-pairs exact Jaccard check (0: all); "
                         "precision checks every removed document against the planted truth")
    ap.add_argument("--sample-s", type=float, default=0.2, help="RSS sampling interval")
    ap.add_argument("--work-dir", default=None, help="default: a temporary folder")
    ap.add_argument("--keep", action="store_true", help="keep the run folders")
    ap.add_argument("--keep-runs", default="", help="keep only these runs' folders (engine:workers, comma-separated; "
                                                    "for scale_plan.py --run-dir)")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--corpus", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--run-dir", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--out", default=None, help=argparse.SUPPRESS)
    ap.add_argument("--stages", default=",".join(STAGES), help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")

    if args.one:
        args.engine, args.workers = args.engine, int(args.workers)
        out = run_one(args, tuple(args.stages.split(",")))
        if out is not None:
            Path(args.out).write_text(json.dumps(out, indent=1))
        return

    runs_spec = parse_runs(args)
    work = Path(args.work_dir) if args.work_dir else Path(tempfile.mkdtemp(prefix="kiln-scale-"))
    work.mkdir(parents=True, exist_ok=True)
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"{psutil.virtual_memory().total / 2**30:.0f} GiB, Python {platform.python_version()}; work dir {work}")
    host_noise = {"before": report_host_noise("before the series")}
    results = []
    for n in [int(x) for x in args.docs.split(",")]:
        corpus = prepare_corpus(work / f"corpus-{n}-{args.seed}", n, args.seed, args.file_docs,
                                max(w for _, w in runs_spec))
        meta = json.loads((corpus / "corpus.json").read_text())
        print(f"corpus: {n:,} documents, {meta['text_bytes'] / 1e6:.1f} MB in {meta['files']} files "
              f"(generated in {meta['generate_s']} s)", flush=True)
        started: dict[str, tuple[float, tuple[float, ...]]] = {}  # run name -> process seconds, load at its start
        for k, (engine, workers), stages in schedule(runs_spec, args.repeat, args.order):
            repetition = f"-r{k}" if args.repeat > 1 else ""
            name = f"run-{n}-{engine}-{workers}{repetition}"
            out = work / f"{name}.json"
            cmd = [sys.executable, __file__, "--one", "--engine", engine, "--workers", str(workers), "--corpus",
                   str(corpus), "--run-dir", str(work / name), "--out", str(out), "--stages", ",".join(stages),
                   "--profile", args.profile, "--config", args.config, "--rows-per-part", str(args.rows_per_part),
                   *(["--partitions", str(args.partitions)] if args.partitions else []), "--max-bucket", str(args.max_bucket),
                   "--pairs-sample", str(args.pairs_sample), "--sample-s", str(args.sample_s)]
            cmd += ["--keep"] if args.keep or f"{engine}:{workers}" in args.keep_runs.split(",") else []
            seconds, load = started.get(name, (0.0, os.getloadavg()))
            t0 = time.perf_counter()
            subprocess.run(cmd, check=True)
            started[name] = (seconds + time.perf_counter() - t0, load)
            if STAGES[-1] not in stages:
                continue
            r = json.loads(out.read_text())
            r["load_avg_before"] = [round(x, 2) for x in load]
            r["load_avg_after"] = [round(x, 2) for x in os.getloadavg()]
            r["process_wall_s"] = round(started[name][0], 1)
            r["repeat"] = k
            results.append(r)
            print(f"  {engine} x{workers}{repetition}: {r['total']['wall_s']:.1f} s in stages, "
                  f"sha {r['decisions_sha256'][:12]}, "
                  f"load {load[0]:.1f} -> {r['load_avg_after'][0]:.1f}", flush=True)
            if args.json:  # written after every run: a long series keeps what it has
                Path(args.json).write_text(json.dumps({"runs": results}, indent=1))
    host_noise["after"] = report_host_noise("after the series")
    print_table(results)
    sha_equal = {str(n): len({r["decisions_sha256"] for r in results if r["docs"] == n}) == 1
                 for n in sorted({r["docs"] for r in results})}
    print(f"\ndecisions_sha256 equal across runs of the same N: {sha_equal}")
    summary = goals(results)
    for name, values in summary.items():
        if name == "by_repeat":
            continue
        print(f"{name}:")
        for key, value in values.items():
            print(f"  {key}: {value}")
    report = {"machine": {"cpu": platform.processor() or platform.machine(), "cores": os.cpu_count(),
                          "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "host_noise": host_noise},
              "argv": sys.argv[1:], "runs": results, "sha_equal_by_docs": sha_equal, "goals": summary}
    if len({r["docs"] for r in results}) > 1:
        target = Path(args.json).with_suffix(".png") if args.json else work / "scale_bench.png"
        report["plot"] = plot(results, target)
        print(f"plot: {report['plot']}")
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
        print(f"wrote {args.json}")
    if not args.work_dir and not args.keep:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
