"""Near-duplicate removal on planted data: known Jaccard levels, cross-source copies, refreshes, backends."""

import hashlib
import string

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.common.config import BoilerplateLines, ConfigError, NearDedup, ShingleNormalization, parse_config
from kiln.common.storage import Store
from kiln.curation.documents import DOCUMENT_SCHEMA, REJECTED_SCHEMA, Document
from kiln.dedup.apply import deduplicate_source
from kiln.dedup.boilerplate import boilerplate_hashes, strip_boilerplate
from kiln.dedup.bucket_index import IndexMismatch, check_signature_params, write_index
from kiln.dedup.buckets import decide_distributed, read_decisions
from kiln.dedup.lsh import candidate_probability, choose_bands
from kiln.dedup.minhash import jaccard, line_hash, shingle_hashes, sign_texts, signature_schema
from kiln.dedup.near import ALREADY_INDEXED, KEPT, NEAR_DUPLICATE
from kiln.dedup.signing import compute_signatures, shingles_column
from kiln.dedup.text import words
from tests.old_near_dedup import Batch, near_dedup, open_index, survivor_violations

NEAR = NearDedup()
ALPHABET = list(string.ascii_lowercase)


def vocabulary(rng, size=20_000) -> np.ndarray:
    """`size` random 7-letter words, as an array: `rng.choice` on a list converts the whole list on every draw."""
    return np.array(["".join(letters) for letters in rng.choice(ALPHABET, (size, 7)).tolist()])


def edited(words_: list[str], edits: int, rng, vocab) -> list[str]:
    out = list(words_)
    for p in rng.choice(len(out), edits, replace=False):
        out[p] = str(rng.choice(vocab))
    return out


def signature_table(source: str, texts: list[str], ids: list[str] | None = None, near=NEAR) -> pa.Table:
    """Signature rows of `texts` under near.scheme, one document at a time (the stage signs whole batches)."""
    rows = [sign_texts([t], near, near.scheme) for t in texts]
    return pa.table({
        "doc_id": ids or [f"{source}-{i}" for i in range(len(texts))], "source": [source] * len(texts),
        "chars": [len(t) for t in texts],
        "signature": pa.FixedSizeListArray.from_arrays(pa.array(np.concatenate([r[0][0] for r in rows])),
                                                       near.num_perm),
        "shingles": shingles_column([r[1] for r in rows])}, schema=signature_schema(near.num_perm))


@pytest.fixture
def index(tmp_path):
    with open_index(NEAR, tmp_path / "index") as idx:
        yield idx


# ------------------------------------------------------------------------------------------- basics

def test_normalization_hides_trivial_edits():
    a = "The Quick brown fox, version 3.1, jumped over the lazy dog on 2026-11-22."
    b = "the quick  brown fox -- version 4.7 -- jumped over the LAZY dog on 2025-01-01"
    assert jaccard(shingle_hashes(a, NEAR), shingle_hashes(b, NEAR)) == 1.0
    strict = NEAR.model_copy(update={"normalization": ShingleNormalization(lowercase=False, digits="keep")})
    assert jaccard(shingle_hashes(a, strict), shingle_hashes(b, strict)) < 0.5
    assert words("Tab\tsep, x", ShingleNormalization(strip_punctuation=False)).words == ["tab", "sep,", "x"]


def test_band_choice_reaches_recall_at_threshold_and_beats_the_plain_lsh_tuning():
    bands, rows = choose_bands(128, 0.8, 0.99)
    assert bands * rows <= 128
    assert candidate_probability(0.8, bands, rows) >= 0.99
    # datasketch's own optimum for threshold 0.8 (9 bands x 13 rows) finds well under half the pairs at J = 0.8.
    assert candidate_probability(0.8, 9, 13) < 0.5
    with pytest.raises(ValueError, match="num_perm"):
        choose_bands(2, 0.95, 0.999999)


def test_bands_rows_config_errors_name_the_key():
    base = {"sources": [{"name": "a", "kind": "text", "path": "x", "license": "l", "domain": "web", "profile": "p"}],
            "profiles": {"p": []}}
    with pytest.raises(ConfigError, match="exceeds num_perm"):
        parse_config({**base, "dedup": {"near": {"bands": 20, "rows": 8}}})
    with pytest.raises(ConfigError, match="both dedup.near.bands and dedup.near.rows"):
        parse_config({**base, "dedup": {"near": {"bands": 20}}})
    with pytest.raises(ConfigError, match=r"dedup\.near\.threshold"):
        parse_config({**base, "dedup": {"near": {"threshold": 1.5}}})
    # The best recall at J 0.3 within 16 permutations is 16 bands of 1 row: 1 - 0.7**16 = 0.9967, under 0.9999999.
    # Refused when the config loads, not first inside dedup_index.
    with pytest.raises(ConfigError, match=r"dedup\.near: no bands x rows within num_perm=16 reaches recall "
                                          r"0\.9999999 at Jaccard 0\.3; raise dedup\.near\.num_perm or lower "
                                          r"dedup\.near\.min_recall"):
        parse_config({**base, "dedup": {"near": {"num_perm": 16, "threshold": 0.3, "min_recall": 0.9999999}}})
    assert parse_config({**base, "dedup": {"near": {"num_perm": 16, "threshold": 0.3, "min_recall": 0.99}}})


# --------------------------------------------------------------------------------- planted near-dups

def test_planted_near_duplicates_precision_and_recall(index, capsys):
    """Variants of base documents at a spread of Jaccard levels around the threshold, in another source."""
    rng = np.random.default_rng(7)
    vocab = vocabulary(rng)
    bases = [list(rng.choice(vocab, 400)) for _ in range(300)]
    variants, truth, levels = [], set(), []
    for k, base in enumerate(bases):
        text = " ".join(edited(base, int(rng.integers(1, 25)), rng, vocab))
        j = jaccard(shingle_hashes(text, NEAR), shingle_hashes(" ".join(base), NEAR))
        variants.append(text)
        levels.append(j)
        if j >= NEAR.threshold:
            truth.add(f"web-{k}")
    levels = np.array(levels)
    # The planted set really straddles the threshold, including the hard band just above it.
    assert ((levels >= 0.80) & (levels < 0.85)).sum() >= 15 and (levels < 0.8).sum() >= 50

    batch = Batch.from_tables([(1, signature_table("ref", [" ".join(b) for b in bases])),
                               (3, signature_table("web", variants))])
    result = near_dedup(batch, index, NEAR, "refresh-1", progress=False)
    removed = set(result.removed())
    tp = len(removed & truth)
    precision, recall = tp / max(len(removed), 1), tp / len(truth)
    near_band = {f"web-{k}" for k in np.flatnonzero((levels >= 0.8) & (levels < 0.85))}
    recall_near = len(removed & near_band) / len(near_band)
    with capsys.disabled():
        print(f"\n[near-dup planted] {len(truth)} true duplicates, {len(removed)} removed: precision {precision:.3f}, "
              f"recall {recall:.3f} (J in [0.80, 0.85): {recall_near:.3f}); "
              f"{result.stats['verification']['candidate_pairs']} candidate pairs verified")
    assert precision == 1.0  # verification never removes a pair below the threshold
    assert recall >= 0.97 and recall_near >= 0.9
    rows = {r["doc_id"]: r for r in result.decisions.to_pylist()}
    for doc_id in removed:
        r = rows[doc_id]
        assert r["duplicate_of"] == "ref-" + doc_id.split("-")[1] and r["duplicate_of_source"] == "ref"
        assert r["jaccard"] >= NEAR.threshold and r["cluster_id"] == r["duplicate_of"]
    assert all(rows[f"ref-{k}"]["status"] == KEPT for k in range(len(bases)))
    assert result.stats["cross_source"] == {"web": {"ref": len(removed)}}
    sampled, violations = survivor_violations(batch, result.decisions, NEAR.threshold, 200)
    assert sampled == 200 and violations == []


def test_keep_policy_prefers_better_tier_then_earlier_then_longer(index):
    rng = np.random.default_rng(3)
    vocab = vocabulary(rng)
    base = list(rng.choice(vocab, 300))
    longer = " ".join(base + list(rng.choice(vocab, 10)))
    # Same text in a tier-3 source declared first and a tier-1 source declared second: tier wins.
    batch = Batch.from_tables([(3, signature_table("web", [" ".join(base)])),
                               (1, signature_table("ref", [" ".join(base), longer], ids=["ref-a", "ref-long"]))])
    rows = {r["doc_id"]: r for r in near_dedup(batch, index, NEAR, "r", progress=False).decisions.to_pylist()}
    assert rows["ref-a"]["status"] == KEPT  # same tier as ref-long, seen first
    assert rows["web-0"]["duplicate_of"] == "ref-a" and rows["ref-long"]["duplicate_of"] == "ref-a"


def test_longest_first_policy(tmp_path):
    rng = np.random.default_rng(4)
    vocab = vocabulary(rng)
    base = list(rng.choice(vocab, 300))
    near = NEAR.model_copy(update={"keep": ["longest", "first_seen"]})
    with open_index(near, tmp_path) as idx:
        batch = Batch.from_tables([(1, signature_table("a", [" ".join(base), " ".join(base + ["tail", "words"])]))])
        rows = {r["doc_id"]: r for r in near_dedup(batch, idx, near, "r", progress=False).decisions.to_pylist()}
    assert rows["a-1"]["status"] == KEPT and rows["a-0"]["duplicate_of"] == "a-1"


def test_chained_cluster_keeps_both_ends_when_they_differ(index):
    """A ~ B and B ~ C but A !~ C: greedy in keep order keeps A and C, removes B, one cluster of three."""
    rng = np.random.default_rng(5)
    vocab = vocabulary(rng)
    a = list(rng.choice(vocab, 400))
    b = a[:]
    b[370:] = rng.choice(vocab, 30)  # J ~0.86 with a
    c = b[:]
    c[:30] = rng.choice(vocab, 30)  # J ~0.86 with b, ~0.74 with a
    texts = [" ".join(x) for x in (a, b, c)]
    sh = [shingle_hashes(t, NEAR) for t in texts]
    assert jaccard(sh[0], sh[1]) >= 0.8 and jaccard(sh[1], sh[2]) >= 0.8 and jaccard(sh[0], sh[2]) < 0.8
    batch = Batch.from_tables([(1, signature_table("s", [texts[0]], ["a"])), (2, signature_table("t", [texts[2]], ["c"])),
                               (3, signature_table("u", [texts[1]], ["b"]))])
    result = near_dedup(batch, index, NEAR, "r", progress=False)
    rows = {r["doc_id"]: r for r in result.decisions.to_pylist()}
    assert rows["a"]["status"] == rows["c"]["status"] == KEPT and rows["b"]["status"] == NEAR_DUPLICATE
    assert rows["a"]["cluster_id"] == rows["b"]["cluster_id"] == rows["c"]["cluster_id"]
    assert result.stats["cluster_sizes"] == {3: 1}


# ------------------------------------------------------------------------------------------ refreshes

def test_second_refresh_drops_documents_accepted_in_the_first(tmp_path):
    rng = np.random.default_rng(11)
    vocab = vocabulary(rng)
    first = [" ".join(rng.choice(vocab, 200)) for _ in range(50)]
    with open_index(NEAR, tmp_path) as idx:
        r1 = near_dedup(Batch.from_tables([(2, signature_table("crawl", first))]), idx, NEAR, "week-1", progress=False)
        assert set(r1.decisions.column("status").to_pylist()) == {KEPT}
        idx.commit()
    # Next week: 20 copies (lightly edited) of last week's pages plus 30 new ones, and last week's batch again.
    copies = [" ".join(edited(t.split(), 2, rng, vocab)) for t in first[:20]]
    fresh = [" ".join(rng.choice(vocab, 200)) for _ in range(30)]
    with open_index(NEAR, tmp_path) as idx:
        assert len(idx) == 50
        batch = Batch.from_tables([(1, signature_table("crawl", first)),
                                   (1, signature_table("crawl2", copies + fresh))])
        r2 = near_dedup(batch, idx, NEAR, "week-2", progress=False)
        idx.commit()
    rows = {r["doc_id"]: r for r in r2.decisions.to_pylist()}
    assert all(rows[f"crawl-{i}"]["status"] == ALREADY_INDEXED for i in range(50))
    assert all(rows[f"crawl2-{i}"]["status"] == NEAR_DUPLICATE and rows[f"crawl2-{i}"]["duplicate_of"] == f"crawl-{i}"
               for i in range(20))  # earlier refreshes win even against a better tier
    assert all(rows[f"crawl2-{i}"]["status"] == KEPT for i in range(20, 50))
    assert r2.stats["matched_earlier_refreshes"] == 20
    with open_index(NEAR, tmp_path) as idx:
        assert len(idx) == 80
        assert idx.records(["crawl2-25"])["crawl2-25"].batch == "week-2"


@pytest.mark.parametrize("change, named", [
    ({"shingle_size": 7}, ["dedup.near.shingle_size: index 5, config 7"]),
    ({"normalization": ShingleNormalization(digits="keep")},
     ["dedup.near.normalization.digits: index 'zero', config 'keep'"]),
    # 16 x 6 at 0.8 (README); a lower threshold needs other bands, named with where they come from.
    ({"threshold": 0.5}, ["dedup.near.bands: index 16, config ", "follow dedup.near.threshold and min_recall"]),
])
def test_a_bucket_index_with_other_minhash_parameters_is_refused_naming_them_and_the_backfill(tmp_path, change,
                                                                                               named):
    write_index(tmp_path / "old", NEAR, "r0", [])
    near = NEAR.model_copy(update=change)
    pq.write_table(signature_table("a", ["one two three four five six seven"], near=near), tmp_path / "sig.parquet")
    with pytest.raises(IndexMismatch) as refused:
        decide_distributed([tmp_path / "sig.parquet"], {"a": (1, 0)}, [tmp_path / "old"], tmp_path / "work",
                           tmp_path / "out", near, "r1")
    message = str(refused.value)
    for part in [*named, "refresh r0", "other MinHash parameters", "backfill", "minhash_signatures", "dedup_index",
                 "every refresh partition, from the first refresh to the last, one refresh at a time"]:
        assert part in message, part
    assert "num_perm" not in message and "seed" not in message  # unchanged parameters are not named


def test_an_affine32_index_is_refused_under_the_default_scheme_naming_the_key_and_the_way_forward(tmp_path):
    """Every index written before dedup.near.scheme existed is affine32; the default is now fss-splitmix64-v1."""
    old = NearDedup(scheme="affine32")
    write_index(tmp_path / "old", old, "r0", [])
    pq.write_table(signature_table("a", ["one two three four five six seven"]), tmp_path / "sig.parquet")
    with pytest.raises(IndexMismatch) as refused:
        decide_distributed([tmp_path / "sig.parquet"], {"a": (1, 0)}, [tmp_path / "old"], tmp_path / "work",
                           tmp_path / "out", NEAR, "r1")
    message = str(refused.value)
    for part in ["refresh r0", "dedup.near.scheme: index 'affine32', config 'fss-splitmix64-v1'",
                 "written before dedup.near.scheme existed are affine32", "re-materialize minhash_signatures",
                 "every refresh partition, from the first refresh to the last", "restore the index's settings"]:
        assert part in message, part
    assert "num_perm" not in message and "dedup.near.bands" not in message
    # With the index's scheme restored, the same index is used.
    pq.write_table(signature_table("a", ["one two three four five six seven"], near=old), tmp_path / "sig.parquet")
    decide_distributed([tmp_path / "sig.parquet"], {"a": (1, 0)}, [tmp_path / "old"], tmp_path / "work",
                       tmp_path / "out", old, "r1")


def test_signatures_made_with_other_settings_are_refused_before_indexing():
    """dedup_index checks each minhash_signatures manifest's recorded dedup.near (a record without `scheme` predates
    the setting, so it is affine32)."""
    recorded = NEAR.model_dump(mode="json")
    check_signature_params("minhash_signatures/web", recorded, NEAR)
    check_signature_params("minhash_signatures/web", {**recorded, "threshold": 0.5, "keep": ["longest"]}, NEAR)
    before = {k: v for k, v in recorded.items() if k != "scheme"}
    check_signature_params("minhash_signatures/web", before, NearDedup(scheme="affine32"))
    with pytest.raises(IndexMismatch, match=r"minhash_signatures/web .*dedup\.near\.scheme: signatures 'affine32', "
                                            r"config 'fss-splitmix64-v1'.*re-materialize"):
        check_signature_params("minhash_signatures/web", before, NEAR)
    with pytest.raises(IndexMismatch, match=r"dedup\.near\.shingle_size: signatures 5, config 7"):
        check_signature_params("minhash_signatures/web", recorded, NEAR.model_copy(update={"shingle_size": 7}))


def test_the_scheme_setting_names_the_key_and_the_allowed_values():
    assert NEAR.scheme == "fss-splitmix64-v1"
    with pytest.raises(ConfigError, match=r"dedup\.near\.scheme = 'md5': .*'fss-splitmix64-v1'.*'affine32'"):
        parse_config({"sources": [{"name": "a", "kind": "jsonl", "path": "a.jsonl", "license": "x", "domain": "web",
                                   "profile": "none"}], "profiles": {"none": []},
                      "dedup": {"near": {"scheme": "md5"}}})


def test_the_removed_index_setting_fails_naming_the_key_and_the_fix():
    with pytest.raises(ConfigError, match=r"dedup\.near\.index: removed.*dedup_index dataset.*migrate-index"):
        parse_config({"sources": [{"name": "a", "kind": "jsonl", "path": "a.jsonl"}], "profiles": {"none": []},
                      "dedup": {"near": {"index": {"backend": "redis"}}}})


def write_docs(path, docs: list[Document]):
    pq.write_table(pa.Table.from_pylist([d.to_row() for d in docs], schema=DOCUMENT_SCHEMA), path)


@pytest.mark.parametrize("scheme", ["fss-splitmix64-v1", "affine32"])
def test_signature_stage_and_apply_stage_write_explained_rejects(tmp_path, scheme):
    near = NEAR.model_copy(update={"scheme": scheme})
    rng = np.random.default_rng(21)
    vocab = vocabulary(rng)
    base = " ".join(rng.choice(vocab, 300))
    footer = "Copyright Example Corp. All rights reserved."
    docs = [Document(f"d{i}", "web", text) for i, text in enumerate([
        base + "\n" + footer, base.replace(base.split()[5], "changed") + "\n" + footer,
        " ".join(rng.choice(vocab, 300)) + "\n" + footer, footer])]
    write_docs(tmp_path / "in.parquet", docs)
    lines = BoilerplateLines(enabled=True, min_documents=2)
    signed = compute_signatures([[tmp_path / "in.parquet"]], [tmp_path / "sig.parquet"], near, lines,
                                progress=False, lines_paths=[tmp_path / "lines-in.parquet"])
    assert signed.documents == 4
    boilerplate, documents = boilerplate_hashes([tmp_path / "lines-in.parquet"], lines, tmp_path / "sum")
    assert boilerplate.tolist() == [line_hash(footer)] and documents.tolist() == [4]  # the footer, in all four
    with open_index(near, tmp_path / "idx") as idx:
        result = near_dedup(Batch.from_tables([(1, pq.read_table(tmp_path / "sig.parquet"))]), idx, near, "r",
                            progress=False)
    # The bucket pipeline (what dedup_index runs) on the same signature part decides the same.
    decide_distributed([tmp_path / "sig.parquet"], {"web": (1, 0)}, [], tmp_path / "work", tmp_path / "out", near,
                       "r")
    assert read_decisions(tmp_path / "out").sort_by("doc_id").equals(result.decisions.sort_by("doc_id"))
    store = Store(tmp_path / "data")
    with store.staging("deduplicated_documents", "web") as writer:
        from kiln.common.config import Decontamination

        pq.write_table(pa.table({"line_hash": pa.array(sorted(boilerplate), pa.uint64())}), tmp_path / "lines.parquet")
        stats, report = deduplicate_source([tmp_path / "in.parquet"], [tmp_path / "out/decisions/decisions-00000.parquet"],
                                           [tmp_path / "lines.parquet"], lines, Decontamination(benchmarks=[]), writer,
                                           progress=False)
        writer.commit(code_version="t", config={}, inputs={}, counts={})
    kept = store.read_table("deduplicated_documents", "web").to_pylist()
    rejected = {r["doc_id"]: r for r in store.read_table("deduplicated_documents", "web", "rejected").to_pylist()}
    assert store.read_table("deduplicated_documents", "web", "rejected").schema.equals(REJECTED_SCHEMA)
    assert {r["doc_id"] for r in kept} == {"d0", "d2"} and all(footer not in r["text"] for r in kept)
    assert rejected["d1"]["reason"] == "near_duplicate" and rejected["d1"]["duplicate_of"] == "d0"
    assert rejected["d1"]["cluster_id"] == "d0" and 0.8 <= rejected["d1"]["jaccard"] < 1
    assert rejected["d3"]["reason"] == "boilerplate_only" and rejected["d3"]["text"] is None  # no text after intake
    assert rejected["d3"]["text_hash"] == hashlib.blake2b(footer.encode(), digest_size=16).hexdigest()
    assert stats.docs_in == 4 == stats.docs_out + len(rejected)
    assert stats.steps["boilerplate_lines"].counts["lines_removed"] == 2


@pytest.mark.parametrize("engine", ["serial", "pool"])
def test_boilerplate_sums_are_the_same_in_hash_ranges_as_in_one_counter(tmp_path, engine):
    """The refresh's line counts are summed in hash ranges, a task each (no process holds every distinct line):
    the lines over the limit and their sums equal one Counter over every file, here with 7 ranges of ~1,000 rows
    over 6 sorted part files and one unsorted file as signature sets wrote them before. The edges of the hash space
    (0 and 2^64 - 1) and lines exactly at the limit are among them."""
    from collections import Counter

    from kiln.dedup.signing import LINES_SCHEMA, lines_table
    from kiln.engine import SERIAL, ProcessPool

    rng = np.random.default_rng(5)
    common = rng.integers(0, 2**64, 300, dtype=np.uint64)  # lines many files share
    files, expected = [], Counter()
    for k in range(7):
        hashes = np.unique(np.concatenate([rng.choice(common, 200, replace=False),
                                           rng.integers(0, 2**64, 800, dtype=np.uint64),
                                           np.array([0, 2**64 - 1], np.uint64)]))
        counts = rng.integers(1, 4, len(hashes))
        expected.update(dict(zip(hashes.tolist(), counts.tolist())))
        files.append(tmp_path / f"lines-{k:05d}.parquet")
        table = lines_table(hashes, counts)
        if k == 6:  # an old signature set's one file per source: not sorted
            table = table.take(pa.array(rng.permutation(len(hashes))))
        pq.write_table(table.cast(LINES_SCHEMA), files[-1], row_group_size=128)
    settings = BoilerplateLines(enabled=True, min_documents=4)
    hashes, sums = boilerplate_hashes(files, settings, tmp_path / "work", rows_per_task=1000,
                                      engine=ProcessPool(workers=2) if engine == "pool" else SERIAL)
    over = {h: n for h, n in expected.items() if n > 4}
    assert hashes.tolist() == sorted(over) and sums.tolist() == [over[h] for h in sorted(over)]
    assert any(n == 4 for n in expected.values()) and {0, 2**64 - 1} <= set(over)


def test_strip_boilerplate_keeps_line_endings_and_short_lines():
    settings = BoilerplateLines(enabled=True, min_documents=2, min_chars=5)

    text = "def f():\n    return 1\n\n  Generated by tool X  \n}\n"
    out, n = strip_boilerplate(text, {line_hash("Generated by tool X"), line_hash("}")}, settings)
    assert out == "def f():\n    return 1\n\n}\n" and n == 1
