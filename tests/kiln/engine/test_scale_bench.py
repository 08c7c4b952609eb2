"""The scale bench's corpus (kiln.curation.synthetic.scale_*) and a tiny end-to-end run of bench/scale_bench.py."""

import importlib.util
import itertools
import re
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


@pytest.mark.slow
def test_tiny_end_to_end_run_catches_planted_copies_and_keeps_hard_negatives(tmp_path, monkeypatch):
    monkeypatch.chdir(ROOT)
    spec = importlib.util.spec_from_file_location("scale_bench", ROOT / "bench" / "scale_bench.py")
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    corpus = bench.prepare_corpus(tmp_path / "corpus", 300, 3, 100, 1)
    out = bench.run_one(bench.run_args(corpus=str(corpus), run_dir=str(tmp_path / "run"), rows_per_part=50,
                                       partitions=3, sample_s=0.5))
    assert out["docs"] == 300 and out["engine"] == "local" and out["workers"] == 1
    for level in ("0.95", "0.90"):
        assert out["recall_by_target_j"][level]["planted"] > 0
        assert out["recall_by_target_j"][level]["recall"] == 1.0
    assert out["recall_exact_copies"]["recall"] == 1.0
    assert out["hard_negatives_removed"] == 0
    assert out["hard_negatives"]["shared_block"]["total"] > 0
    assert out["precision"]["precision"] == 1.0 and out["precision"]["checked"] > 0
    assert len(out["decisions_sha256"]) == 64
    for stage in ("ingest", "filter", "exact_dedup", "signatures", "near_dedup"):
        s = out["stages"][stage]
        assert s["wall_s"] > 0 and s["docs_per_s_per_core"] > 0 and s["peak_rss_mib"]["driver"] > 0
