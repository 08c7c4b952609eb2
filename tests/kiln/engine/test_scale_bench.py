"""The scale bench's corpus (kiln.curation.synthetic.scale_*), its quality figures (precision from the planted truth,
the all-pairs Jaccard check) on decisions made right and made wrong, and a tiny end-to-end run of
bench/scale_bench.py."""

import importlib.util
import itertools
import re
import subprocess
import sys
from pathlib import Path

import pytest

from kiln.curation.synthetic import (
    NEAR_TARGETS,
    SHARED_BLOCK_TARGETS,
    scale_document,
    scale_documents,
    scale_plan,
    scale_words,
)

ROOT = Path(__file__).resolve().parents[3]
N = 1200
TOLERANCE = 0.02  # |measured J - target| for near copies of documents of at least 100 words


def shingles(text: str, n: int = 5) -> set:
    """Plain Python word 5-grams with near-dedup's normalization (lowercase, \\w+ words): no kiln code."""
    w = re.findall(r"\w+", text.lower())
    return {tuple(w[k:k + n]) for k in range(max(len(w) - n + 1, 1))}


def jaccard(a: str, b: str) -> float:
    x, y = shingles(a), shingles(b)
    return len(x & y) / len(x | y)


@pytest.fixture(scope="module")
def corpus() -> list[dict]:
    return list(scale_documents(7, 0, N))


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("scale_bench", ROOT / "bench" / "scale_bench.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def planted_decisions(plans, ids) -> dict:
    """What a perfect dedup decides: every planted copy removed, naming the document it was made from."""
    status = {d: ("kept", None) for d in ids}
    for p in plans:
        if p.kind in ("exact_copy", "near_copy"):
            status[ids[p.i]] = ("exact_duplicate" if p.kind == "exact_copy" else "near_duplicate", ids[p.of])
    return status


def test_a_document_is_the_same_alone_or_in_any_slice(corpus):
    for i in [0, 1, 2, 57, 300, 811, N - 1]:
        assert scale_document(7, i) == corpus[i]
    assert list(scale_documents(7, 640, 700)) == corpus[640:700]
    assert list(reversed(list(scale_documents(7, 100, 130)))) == [scale_document(7, i) for i in range(129, 99, -1)]
    assert scale_document(8, 5) != corpus[5]  # another seed, another corpus


def test_planted_copies_hit_their_jaccard_and_hard_negatives_stay_below_07(corpus):
    plans = [scale_plan(7, i) for i in range(N)]
    kinds = {k: [p for p in plans if p.kind == k] for k in ("exact_copy", "near_copy", "shared_block", "template")}
    assert all(len(v) >= 5 for v in kinds.values()), {k: len(v) for k, v in kinds.items()}
    for p in kinds["exact_copy"]:
        assert " ".join(corpus[p.i]["text"].lower().split()) == " ".join(corpus[p.of]["text"].lower().split())
        assert corpus[p.i]["text"] != corpus[p.of]["text"]  # case or spacing differs
    checked = 0
    for p in kinds["near_copy"]:
        assert p.target in NEAR_TARGETS and scale_plan(7, p.of).kind == "plain"
        j = jaccard(corpus[p.i]["text"], corpus[p.of]["text"])
        assert scale_words(7, p.i) == re.findall(r"\w+", corpus[p.i]["text"].lower())
        if len(scale_words(7, p.of)) >= 100:
            assert abs(j - p.target) <= TOLERANCE, (p, j)
            checked += 1
        assert j < 1.0
    assert checked >= 30
    for p in kinds["shared_block"]:
        assert p.target in SHARED_BLOCK_TARGETS and p.of == p.i - 1
        j = jaccard(corpus[p.i]["text"], corpus[p.of]["text"])
        assert 0.3 < j <= p.target + 1e-9 and j < 0.7, (p, j)
    same = [(a, b) for a, b in itertools.combinations(kinds["template"], 2) if a.template == b.template]
    assert same  # documents of one template: hard negatives sharing most of their words, J in (0.45, 0.7)
    for a, b in same:
        assert 0.45 < jaccard(corpus[a.i]["text"], corpus[b.i]["text"]) < 0.7


def test_precision_comes_from_the_planted_truth_and_falls_with_each_wrong_removal(bench):
    plans = [scale_plan(7, i) for i in range(N)]
    ids = [f"doc-{i}" for i in range(N)]
    status = planted_decisions(plans, ids)
    copies = sum(p.kind in ("exact_copy", "near_copy") for p in plans)
    assert bench.planted_precision(status, ids, plans) | {"wrong_examples": None} == {
        "precision": 1.0, "removed": copies, "wrong": 0, "wrong_examples": None,
        "truth": "planted (kiln.curation.synthetic.scale_plan)"}
    # Kept the copy, removed its original instead (naming the copy): still right.
    near = next(p for p in plans if p.kind == "near_copy")
    status[ids[near.i]], status[ids[near.of]] = ("kept", None), ("near_duplicate", ids[near.i])
    assert bench.planted_precision(status, ids, plans)["precision"] == 1.0
    # Three wrong removals: a shared block taken for a copy of its anchor, the second of two pages of one template,
    # a copy pointed at another original.
    block = next(p for p in plans if p.kind == "shared_block")
    status[ids[block.i]] = ("near_duplicate", ids[block.of])
    first, second = next((a, b) for a, b in itertools.combinations([p for p in plans if p.kind == "template"], 2)
                         if a.template == b.template)
    status[ids[second.i]] = ("near_duplicate", ids[first.i])
    copy = next(p for p in plans if p.kind == "exact_copy")
    other = next(p.i for p in plans if p.kind == "plain" and p.i != copy.of)
    status[ids[copy.i]] = ("exact_duplicate", ids[other])
    measured = bench.planted_precision(status, ids, plans)
    assert (measured["removed"], measured["wrong"]) == (copies + 2, 3)
    assert measured["precision"] == round((copies - 1) / (copies + 2), 5)
    assert {(e["doc"], e["duplicate_of"]) for e in measured["wrong_examples"]} == {
        (block.i, block.of), (second.i, first.i), (copy.i, other)}
    # A removal naming a document the corpus does not have is wrong too.
    status[ids[near.of]] = ("near_duplicate", "not-a-document")
    assert bench.planted_precision(status, ids, plans)["wrong"] == 4


def test_all_pairs_check_finds_every_similar_pair_and_the_ones_decisions_left_apart(bench, corpus):
    texts = [d["text"] for d in corpus[:200]]
    # Hand-worked: 10 words, one changed at the end: 6 shingles each, 5 shared, J = 5/7.
    words = "a b c d e f g h i j".split()
    assert bench.plain_jaccard(" ".join(words), " ".join(words[:-1] + ["z"])) == pytest.approx(5 / 7)
    # The inverted index against every pair compared directly.
    sets = [bench.plain_shingles(t) for t in texts]
    brute = {(a, b): len(sets[a] & sets[b]) / len(sets[a] | sets[b]) for a, b in itertools.combinations(range(200), 2)}
    assert bench.similar_pairs(texts, 0.8) == pytest.approx({k: j for k, j in brute.items() if j >= 0.8})
    assert bench.similar_pairs(texts, 0.3) == pytest.approx({k: j for k, j in brute.items() if j >= 0.3})

    plans = [scale_plan(7, i) for i in range(N)]
    ids = [f"doc-{i}" for i in range(N)]
    status = planted_decisions(plans, ids)
    similar = {k for k, j in brute.items() if j >= 0.8}
    assert similar and all(bench.planted_root(plans[a]) == bench.planted_root(plans[b]) for a, b in similar)
    perfect = bench.all_pairs_check(7, status, ids, plans, 0.8, 200)
    assert perfect | {"unplanted_examples": None} == {
        "documents": 200, "pairs_j_ge_threshold": len(similar), "joined": len(similar), "recall": 1.0,
        "unplanted_pairs": 0, "unplanted_examples": None}
    # A missed copy: its pairs (with its original, and with the original's other copies) are left apart.
    a, b = next(iter(sorted(similar)))
    missed = b if plans[b].kind != "plain" else a
    status[ids[missed]] = ("kept", None)
    apart = sum(missed in pair for pair in similar)
    measured = bench.all_pairs_check(7, status, ids, plans, 0.8, 200)
    assert measured["joined"] == len(similar) - apart and measured["recall"] == round(1 - apart / len(similar), 5)


@pytest.mark.slow
def test_tiny_end_to_end_run_catches_planted_copies_and_keeps_hard_negatives(bench, tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    corpus = bench.prepare_corpus(tmp_path / "corpus", 300, 3, 100, 1)
    out = bench.run_one(bench.run_args(corpus=str(corpus), run_dir=str(tmp_path / "run"), rows_per_part=50,
                                       partitions=3, sample_s=0.5, keep=True))
    assert out["docs"] == 300 and out["engine"] == "local" and out["workers"] == 1
    for level in ("0.95", "0.90"):
        assert out["recall_by_target_j"][level]["planted"] > 0
        assert out["recall_by_target_j"][level]["recall"] == 1.0
    assert out["recall_exact_copies"]["recall"] == 1.0
    assert out["hard_negatives_removed"] == 0
    assert out["hard_negatives"]["shared_block"]["total"] > 0
    # Every removal named a document of its planted group; every pair at J >= 0.8 (all 300 documents) was joined.
    precision = out["precision"]
    assert precision["removed"] == out["statuses"]["exact_duplicate"] + out["statuses"]["near_duplicate"] > 0
    assert precision["wrong"] == 0 and precision["precision"] == 1.0
    pairs = out["all_pairs"]
    assert pairs["documents"] == 300 and pairs["pairs_j_ge_threshold"] > 0
    assert pairs["joined"] == pairs["pairs_j_ge_threshold"] and pairs["unplanted_pairs"] == 0
    assert len(out["decisions_sha256"]) == 64
    for stage in ("ingest", "filter", "exact_dedup", "signatures", "near_dedup"):
        s = out["stages"][stage]
        assert s["wall_s"] > 0 and s["docs_per_s_per_core"] > 0 and s["peak_rss_mib"]["driver"] > 0
        # One worker: its tasks cannot run longer than the stage. Their CPU is the process's (time.process_time):
        # one worker runs them in the driver, so Arrow's reader threads and the bench's RSS sampler thread count
        # too, and on tasks of a few milliseconds that reached 1.074 in CI. A task counted twice would read ~2.
        assert 0 < s["tasks"]["busy"] <= 1 and 0 < s["tasks"]["task_cpu_over_wall"] <= 1.5
        assert s["inputs"]["warmed"] and s["inputs"]["bytes"] > 0  # read before the clock
    rounds = out["stages"]["exact_dedup"]["tasks"]["rounds"]
    assert [r["round"] for r in rounds] == ["exact dedup: hash buckets", "exact dedup: decide", "exact dedup"]
    assert rounds[0]["tasks"] == rounds[2]["tasks"] == out["files"]["raw_parts"]  # a task per part, 50 rows each
    # bench/near_profile.py profiles the signature and decide stages again over the kept run's curated parts.
    profiled = subprocess.run([sys.executable, str(ROOT / "bench" / "near_profile.py"), "--run-dir",
                               str(tmp_path / "run"), "--top", "3"], capture_output=True, text=True, check=True).stdout
    documents = out["stages"]["signatures"]["docs"]
    assert f"signatures: {documents:,} documents" in profiled and re.search(r"decide: [\d.]+ s wall", profiled)
    assert "keys" in profiled and "final" in profiled and "persist" in profiled  # every round's seconds
    # The same run split into a process per stage (as --order stages runs it), here one call per stage: each call
    # continues from the run folder, and the run decides the same and reports every stage.
    split = bench.run_args(corpus=str(corpus), run_dir=str(tmp_path / "split"), rows_per_part=50, partitions=3,
                           sample_s=0.5)
    assert [bench.run_one(split, (stage,)) for stage in bench.STAGES[:-1]] == [None] * 4
    last = bench.run_one(split, bench.STAGES[-1:])
    assert last["decisions_sha256"] == out["decisions_sha256"] and list(last["stages"]) == list(bench.STAGES)
    assert [s["docs"] for s in last["stages"].values()] == [s["docs"] for s in out["stages"].values()]
    assert not (tmp_path / "split").exists()  # not kept: dropped after its last stage


def test_schedule_runs_neighbours_back_to_back_on_each_stage_and_each_run_as_often_first_as_last(bench):
    """Hand-worked for local:1 and ray:1, twice: the list, then the list reversed; by stage, every other stage
    reversed too."""
    l1, r1 = ("local", 1), ("ray", 1)
    ingest, filter_, exact, signatures, near = ((s,) for s in bench.STAGES)
    assert bench.schedule([l1, r1], 2, "stages") == [
        (0, l1, ingest), (0, r1, ingest), (0, r1, filter_), (0, l1, filter_), (0, l1, exact), (0, r1, exact),
        (0, r1, signatures), (0, l1, signatures), (0, l1, near), (0, r1, near),
        (1, r1, ingest), (1, l1, ingest), (1, l1, filter_), (1, r1, filter_), (1, r1, exact), (1, l1, exact),
        (1, l1, signatures), (1, r1, signatures), (1, r1, near), (1, l1, near)]
    assert bench.schedule([l1, r1], 2, "runs") == [(0, l1, bench.STAGES), (0, r1, bench.STAGES),
                                                   (1, r1, bench.STAGES), (1, l1, bench.STAGES)]


def test_repeated_runs_give_each_goal_as_its_spread_over_the_repetitions(bench):
    """Two repetitions of local:2 and ray:2, hand-made: Ray's CPU per MB over the pool's is the pool's MB per
    CPU-second over Ray's, 10 / 8 = 1.25 in the first and 10 / 11 = 0.909 in the second, so the spread is
    [0.909, 1.25]; each repetition's own figures stay under by_repeat. Pooled, Ray's CPU seconds are 100 / 8 +
    100 / 11 = 21.59 against the pool's 20: 1.08."""
    def run(engine: str, mb_per_cpu_s: float, repeat: int) -> dict:
        stage = {"mb": 100.0, "wall_s": 10.0, "cpu_s": 100.0 / mb_per_cpu_s, "mb_per_cpu_s": mb_per_cpu_s}
        return {"engine": engine, "workers": 2, "docs": 1000, "repeat": repeat, "total": {"wall_s": 20.0},
                "peak_rss_mib": {"driver": 100, "worker": 200},
                "stages": {"signatures": stage, "near_dedup": stage}}

    runs = [run("local", 10.0, 0), run("ray", 8.0, 0), run("ray", 11.0, 1), run("local", 10.0, 1)]
    goals = bench.goals(runs)
    assert goals["ray_cpu_per_mb_over_pool"]["ray:2@1000"]["near_dedup"] == [0.909, 1.25]
    assert [g["ray_cpu_per_mb_over_pool"]["ray:2@1000"]["signatures"] for g in goals["by_repeat"]] == [1.25, 0.909]
    # 100 MB / (10 + 10) s / 2 workers = 2.5 MB/s per core, the same in both repetitions
    assert goals["near_text_to_decisions_mb_s_core"]["local:2@1000"] == [2.5, 2.5]
    assert goals["pooled"]["ray_cpu_per_mb_over_pool"]["ray:2@1000"]["near_dedup"] == 1.08
    assert goals["pooled"]["near_text_to_decisions_mb_s_core"]["local:2@1000"] == 2.5  # 200 MB / 40 s / 2
    assert bench.goals(runs[:2]) == bench.goals_of(runs[:2])  # one repetition: the figures themselves


def test_round_figures_split_a_two_worker_speed_up_into_idle_workers_waiting_tasks_and_extra_cpu(bench, tmp_path):
    """Hand-worked. One worker: a 10 s stage, one 9 s round of 3 tasks of 3 s wall and 2.4 s CPU each, so busy =
    9 / 10 = 0.9 and CPU / wall = 7.2 / 9 = 0.8. Two workers: a 6 s stage, one 5.5 s round of the same 3 tasks at
    3.5 s wall and 2.8 s CPU each (two processes), so busy = 10.5 / (2 x 6) = 0.875, CPU / wall = 8.4 / 10.5 = 0.8
    and 2 x 5.5 - 10.5 = 0.5 idle worker-seconds. Speed-up 10 / 6 = 1.667 = 2 x (0.875 / 0.9) x (0.8 / 0.8) x
    (7.2 / 8.4)."""
    def figures(folder, stage_wall, round_wall, workers, tasks_by_pid):
        folder.mkdir()
        for pid, tasks in tasks_by_pid.items():
            (folder / f"{pid}.tsv").write_text("".join(f"0\t{start}\t{start + wall}\t{cpu}\t{cpu - 0.4}\n"
                                                       for start, wall, cpu in tasks))  # 0.4 s a task off its thread
        rounds = [{"stage": "signatures", "round": "minhash", "tasks": 3, "wall_s": round_wall},
                  {"stage": "near_dedup", "round": "keys", "tasks": 1, "wall_s": 1.0}]  # another stage's
        return bench.round_figures(rounds, folder, workers, "signatures", stage_wall)

    one = figures(tmp_path / "one", 10.0, 9.0, 1, {11: [(0.5, 3.0, 2.4), (3.5, 3.0, 2.4), (6.5, 3.0, 2.4)]})
    two = figures(tmp_path / "two", 6.0, 5.5, 2, {21: [(0.2, 3.5, 2.8), (3.7, 3.5, 2.8)], 22: [(0.2, 3.5, 2.8)]})
    assert one == {"busy": 0.9, "processes": 1, "task_cpu_over_wall": 0.8, "outside_rounds_s": 1.0, "rounds": [
        {"round": "minhash", "tasks": 3, "wall_s": 9.0, "task_wall_s": 9.0, "task_cpu_s": 7.2, "task_thread_cpu_s": 6.0,
         "idle_worker_s": 0.0}]}
    assert two["busy"] == 0.875 and two["task_cpu_over_wall"] == 0.8 and two["outside_rounds_s"] == 0.5
    assert two["processes"] == 2
    assert two["rounds"][0]["idle_worker_s"] == 0.5
    factors = bench.speedup_factors(one, two)
    assert factors == {"busy": 0.972, "cpu_share": 1.0, "cpu": 0.857}
    assert 2 * factors["busy"] * factors["cpu_share"] * factors["cpu"] == pytest.approx(10 / 6, abs=0.002)


def test_a_stages_inputs_are_read_before_its_clock_unless_they_outgrow_the_budget(bench, tmp_path):
    files = [tmp_path / "a", tmp_path / "b"]
    files[0].write_bytes(b"abc")
    files[1].write_bytes(b"defgh")
    assert {k: v for k, v in bench.warm_inputs(files, 8).items() if k != "read_s"} == {"bytes": 8, "warmed": True}
    assert {k: v for k, v in bench.warm_inputs(files, 7).items() if k != "read_s"} == {"bytes": 8, "warmed": False}


def test_the_samplers_own_cpu_is_kept_out_of_the_drivers(bench):
    """500 samples of this process: the driver's CPU seconds over them are about none (a loop's), the sampler's
    its own (counted apart), not the sum. The sampler's thread counts the same way (time.thread_time)."""
    sampler = bench.RssSampler(1.0)
    before, own_before = sampler.cpu_seconds()["driver"], sampler.own_cpu_s
    for _ in range(500):
        sampler.sample()
    driver, own = sampler.cpu_seconds()["driver"] - before, sampler.own_cpu_s - own_before
    assert own > 0.02  # psutil on this process, 500 times
    assert driver < own / 4


def test_host_noise_is_the_spread_of_the_same_works_cpu_seconds(bench):
    """Hand-worked: 0.2, 0.2, 0.3, 0.3 s: mean 0.25, population sd 0.05, cv 0.2, max / min 1.5, not quiet; ten
    equal timings: cv 0, quiet. `measure` times the real fixed work (scale_bench.py records it around a series)."""
    from bench.host_noise import measure, spread

    assert spread([0.2, 0.2, 0.3, 0.3]) == {"samples": 4, "median_s": 0.25, "min_s": 0.2, "max_s": 0.3,
                                            "max_over_min": 1.5, "cv": 0.2, "quiet": False}
    assert spread([0.25] * 10)["cv"] == 0 and spread([0.25] * 10)["quiet"]
    measured = measure(samples=2, pause_s=0)
    assert measured["samples"] == 2 and 0 < measured["min_s"] <= measured["max_s"]
