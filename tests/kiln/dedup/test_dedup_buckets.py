"""Distributed near-dedup (kiln/dedup/buckets.py and its bucket_* modules): the same decisions table as
`near_dedup` on planted corpora, whatever the engine and the number of partitions; connected components against a
union-find; big buckets bounded."""

import pickle
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln import engine as engine_module
from kiln.common.config import NearDedup
from kiln.dedup import bucket_index, bucket_rounds, buckets, components, shuffle
from kiln.dedup.bucket_index import BUCKET_SCHEMA, band_keys, read_index_meta
from kiln.dedup.bucket_rounds import bucket_pairs, pair_jaccard
from kiln.dedup.buckets import decide_distributed, read_decisions
from kiln.dedup.components import connected_components, distinct_pairs, read_labels, write_edges
from kiln.dedup.minhash import bands_rows, jaccard, shingle_hashes, signature_schema
from kiln.dedup.near import KEPT, NEAR_DUPLICATE
from kiln.dedup.signing import shingles_column
from kiln.engine import SERIAL, ProcessPool, RayEngine
from tests.kiln.dedup.test_dedup import edited, signature_table, vocabulary
from tests.old_near_dedup import Batch, near_dedup, open_index

NEAR = NearDedup()


# ------------------------------------------------------------------------------------------- helpers

def write_parts(root: Path, tables: list[tuple[str, int, pa.Table]], part_rows: int) -> tuple[list[Path], dict]:
    """Each source's signature table cut into parts of `part_rows` rows (several parts per source), in source order."""
    root.mkdir(parents=True, exist_ok=True)
    parts = []
    for s, (name, _, table) in enumerate(tables):
        for j, off in enumerate(range(0, max(table.num_rows, 1), part_rows)):
            path = root / f"sig-{s}-{j:03d}.parquet"
            pq.write_table(table.slice(off, part_rows), path)
            parts.append(path)
    return parts, {name: (tier, s) for s, (name, tier, _) in enumerate(tables)}


def reference(tmp: Path, refreshes: list[list[tuple[str, int, pa.Table]]], near=NEAR) -> list[pa.Table]:
    """near_dedup over the refreshes in turn against one LocalIndex (committed after each)."""
    out = []
    with open_index(near, tmp) as idx:
        for r, tables in enumerate(refreshes):
            batch = Batch.from_tables([(tier, t) for _, tier, t in tables])
            out.append(near_dedup(batch, idx, near, f"r{r}", progress=False).decisions)
            idx.commit()
    return out


def distributed(tmp: Path, refreshes: list[list[tuple[str, int, pa.Table]]], near=NEAR, engine=SERIAL, partitions=3,
                part_rows=7, max_bucket=1000) -> tuple[list[pa.Table], list[dict]]:
    previous, out, stats = [], [], []
    for r, tables in enumerate(refreshes):
        parts, sources = write_parts(tmp / f"sig-{r}", tables, part_rows)
        stats.append(decide_distributed(parts, sources, previous, tmp / "work", tmp / f"out-{r}", near, f"r{r}",
                                        engine=engine, partitions=partitions, max_bucket=max_bucket))
        out.append(read_decisions(tmp / f"out-{r}"))
        previous.append(tmp / f"out-{r}" / "index")
    return out, stats


def assert_same(got: pa.Table, want: pa.Table) -> None:
    assert got.schema.equals(want.schema)
    if not got.equals(want):
        diff = [(g, w) for g, w in zip(got.to_pylist(), want.to_pylist()) if g != w]
        raise AssertionError(f"{len(diff)} rows differ, e.g. {diff[:3]}")


def family_texts(seed: int, n_bases=25, words=120) -> dict[str, list[str]]:
    """Three sources holding bases, edited copies, copies of copies (chains), exact copies and unrelated
    documents: clusters of every shape, J on both sides of the threshold."""
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng, 5_000)
    bases = [list(rng.choice(vocab, words)) for _ in range(n_bases)]
    texts: dict[str, list[str]] = {"web": [], "ref": [], "forum": []}
    for b in bases:
        texts["web"].append(" ".join(b))
        one = edited(b, int(rng.integers(1, 4)), rng, vocab)
        texts["ref" if rng.random() < 0.5 else "forum"].append(" ".join(one))
        if rng.random() < 0.6:  # a copy of the copy: a chain
            texts["forum"].append(" ".join(edited(one, int(rng.integers(1, 4)), rng, vocab)))
        if rng.random() < 0.3:
            texts["ref"].append(" ".join(b))  # an exact copy in a better tier
        if rng.random() < 0.3:
            texts["web"].append(" ".join(rng.choice(vocab, words)))
    return {s: [t[i] for i in rng.permutation(len(t))] for s, t in texts.items()}


def families(seed: int, n_bases=25) -> list[tuple[str, int, pa.Table]]:
    """family_texts as signature tables: web (tier 2), ref (tier 1), forum (tier 2), in that source order."""
    texts = family_texts(seed, n_bases)
    return [(s, tier, signature_table(s, texts[s])) for s, tier in (("web", 2), ("ref", 1), ("forum", 2))]


# --------------------------------------------------------------------------------- same as near_dedup

def test_planted_families_same_decisions_as_near_dedup(tmp_path):
    tables = families(1)
    want = reference(tmp_path / "idx", [tables])[0]
    statuses = want.column("status").to_pylist()
    assert statuses.count(NEAR_DUPLICATE) >= 20 and statuses.count(KEPT) >= 40  # not a vacuous comparison
    assert len({c for c in want.column("cluster_id").to_pylist() if c}) >= 15
    for partitions in (1, 3, 8):
        got, stats = distributed(tmp_path / f"p{partitions}", [tables], partitions=partitions, part_rows=15)
        assert_same(got[0], want)  # all columns, cluster names too
    assert stats[0]["verification"]["matches"] >= statuses.count(NEAR_DUPLICATE)
    assert stats[0]["per_source"]["web"][KEPT] == sum(1 for r in want.to_pylist()
                                                      if r["source"] == "web" and r["status"] == KEPT)


@pytest.mark.parametrize("scheme", ["fss-splitmix64-v1", "affine32"])
def test_documents_without_words_are_never_near_duplicates_of_each_other(tmp_path, scheme):
    """Punctuation, symbols and emoji leave no words after normalization, so no shingles: two such documents share
    nothing a copy is made of (Jaccard of two empty sets: 0 here; they all used to be one cluster, J = 1.0, and all
    but one dropped). A word-less document next to a real pair leaves the pair's decision as it was. Their
    signatures are all alike (every value the maximum) and shared every band: the 4 made C(4, 2) = 6 candidate pairs,
    verified for nothing (3,000 of them made 1.5M); they get no band keys, so the one candidate pair is the real
    one. The old near_dedup decides the same; it counted those useless candidates (0, 1, 2, 3), now 0."""
    near = NEAR.model_copy(update={"scheme": scheme})
    rng = np.random.default_rng(7)
    base = " ".join(rng.choice(vocabulary(rng), 120))
    texts = ["!!! ??? ...", "--- *** +++ ///", "\U0001f600\U0001f600 \U0001f389", "==== #### @@@@", base, base + " end"]
    sig = signature_table("s", texts, near=near)
    assert [len(s) for s in sig.column("shingles").to_pylist()[:4]] == [0, 0, 0, 0]
    assert jaccard(np.empty(0, np.uint32), np.empty(0, np.uint32)) == 0.0
    got, stats = distributed(tmp_path, [[("s", 1, sig)]], near=near)
    status = dict(zip(got[0].column("doc_id").to_pylist(), got[0].column("status").to_pylist()))
    assert status == {"s-0": KEPT, "s-1": KEPT, "s-2": KEPT, "s-3": KEPT, "s-4": KEPT, "s-5": NEAR_DUPLICATE}
    assert stats[0]["verification"]["candidate_pairs"] == stats[0]["verification"]["matches"] == 1
    want = reference(tmp_path / "idx", [[("s", 1, sig)]], near=near)[0]
    assert want.column("candidates").to_pylist() == [0, 1, 2, 3, 0, 1]
    assert got[0].column("candidates").to_pylist() == [0, 0, 0, 0, 0, 1]
    assert_same(got[0].drop(["candidates"]), want.drop(["candidates"]))
    # Indexed without band keys too: a later refresh's word-less documents are no candidates of them either.
    again = signature_table("t", texts[:4], near=near)
    got, stats = distributed(tmp_path / "later", [[("s", 1, sig)], [("t", 1, again)]], near=near)
    assert set(got[1].column("status").to_pylist()) == {KEPT} and stats[1]["verification"]["candidate_pairs"] == 0


def test_the_output_is_flushed_once_before_the_index_names_it(tmp_path, monkeypatch):
    """The final and persist rounds' Parquet files skip a flush each (a power loss only costs the run: its output
    folder is emptied first and `_index.json` comes last); the folder is flushed once, before `_index.json`."""
    from kiln.common import storage

    fsynced, flushed = [], []
    monkeypatch.setattr(storage, "fsync_file", lambda path: fsynced.append(Path(path).name))
    monkeypatch.setattr(buckets, "flush_to_disk", lambda folder: flushed.append(
        (Path(folder), (Path(folder) / "index" / "_index.json").exists(),
         len(list(Path(folder).rglob("*.parquet"))))))
    distributed(tmp_path, [families(1, n_bases=8)], part_rows=15)
    assert [f for f in fsynced if ".parquet" in f] == []
    parquet_files = len(list((tmp_path / "out-0").rglob("*.parquet")))
    assert parquet_files >= 4  # decisions, index docs, buckets and ids
    assert flushed == [(tmp_path / "out-0", False, parquet_files)]  # once, every file written, no _index.json yet


def _chain_texts(seed: int) -> tuple[list[str], list[np.ndarray]]:
    rng = np.random.default_rng(seed)
    vocab = vocabulary(rng)
    a = list(rng.choice(vocab, 400))
    b = a[:]
    b[370:] = rng.choice(vocab, 30)
    c = b[:]
    c[:30] = rng.choice(vocab, 30)
    texts = [" ".join(x) for x in (a, b, c)]
    return texts, [shingle_hashes(t, NEAR) for t in texts]


@pytest.mark.parametrize("order", ["acb", "abc", "bac"])
def test_chain_a_b_c_where_a_and_c_differ(tmp_path, order):
    """A ~ B, B ~ C, A !~ C, in three keep orders (the source order, all tier 1)."""
    texts, sh = _chain_texts(5)
    j_ab, j_bc, j_ac = jaccard(sh[0], sh[1]), jaccard(sh[1], sh[2]), jaccard(sh[0], sh[2])
    print(f"J(A,B) = {j_ab:.3f}, J(B,C) = {j_bc:.3f}, J(A,C) = {j_ac:.3f}")
    assert j_ab >= 0.8 and j_bc >= 0.8 and j_ac < 0.8  # 0.868, 0.868, 0.754
    by_name = dict(zip("abc", texts))
    tables = [(f"s{x}", 1, signature_table(f"s{x}", [by_name[x]], [x])) for x in order]
    want = reference(tmp_path / "idx", [tables])[0]
    got, _ = distributed(tmp_path, [tables], partitions=3)
    assert_same(got[0], want)
    rows = {r["doc_id"]: r for r in want.to_pylist()}
    if order == "acb":  # B, last, bridges A and C: both kept, one cluster of three
        assert [rows[x]["status"] for x in "abc"] == [KEPT, NEAR_DUPLICATE, KEPT]
        assert rows["a"]["cluster_id"] == rows["b"]["cluster_id"] == rows["c"]["cluster_id"]
    elif order == "abc":  # B removed as A's copy; C never meets an accepted match: kept, unclustered
        assert [rows[x]["status"] for x in "abc"] == [KEPT, NEAR_DUPLICATE, KEPT] and rows["c"]["cluster_id"] is None
    else:  # B first: A and C both removed as B's copies
        assert [rows[x]["status"] for x in "abc"] == [NEAR_DUPLICATE, KEPT, NEAR_DUPLICATE]
        assert rows["a"]["duplicate_of"] == rows["c"]["duplicate_of"] == "b"


@pytest.mark.parametrize("keep", [["quality_tier", "first_seen", "longest"], ["longest", "first_seen"],
                                  ["longest", "quality_tier"]])
def test_keep_policy_ties_and_cross_source_tiers(tmp_path, keep):
    """Identical texts in sources of different and equal tiers, equal lengths (the doc_id decides the last tie)."""
    rng = np.random.default_rng(3)
    vocab = vocabulary(rng)
    base = list(rng.choice(vocab, 200))
    same = " ".join(base)
    longer = " ".join(base + ["tail"])
    near = NEAR.model_copy(update={"keep": keep})
    tables = [("web", 3, signature_table("web", [same, longer, same], ["w-2", "w-1", "w-0"])),
              ("ref", 1, signature_table("ref", [same, same], ["r-b", "r-a"])),
              ("books", 1, signature_table("books", [longer, same], ["b-0", "b-1"]))]
    want = reference(tmp_path / "idx", [tables], near)[0]
    got, _ = distributed(tmp_path, [tables], near, partitions=3, part_rows=2)
    assert_same(got[0], want)
    assert sum(r["status"] == KEPT for r in want.to_pylist()) == 1


def test_second_refresh_against_the_first_refreshs_buckets(tmp_path):
    """Refresh 2 re-sends refresh 1's documents (already indexed), near-copies of its kept ones, copies of its
    removed ones, and new families; against the persisted bucket index, as near_dedup against one LocalIndex."""
    first = families(2)
    rng = np.random.default_rng(9)
    vocab = vocabulary(rng, 5_000)
    first_texts = family_texts(2)
    texts = [" ".join(edited(t.split(), 1, rng, vocab)) for s in ("web", "forum") for t in first_texts[s][:15]]
    second = [("web", 2, first[0][2].slice(0, 12)),  # re-sent: already indexed
              ("copies", 1, signature_table("copies", texts)),
              *[(f"n-{s}", tier, signature_table(f"n-{s}", family_texts(4, 10)[s]))
                for s, tier in (("web", 2), ("ref", 1))]]
    want = reference(tmp_path / "idx", [first, second])
    got, stats = distributed(tmp_path / "d", [first, second], partitions=3, part_rows=12)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])
    statuses = want[1].column("status").to_pylist()
    kept_before = sum(r["status"] == KEPT for r in want[0].to_pylist()[:12])  # removed ones are decided anew
    assert statuses.count("already_indexed") == kept_before >= 8 and stats[1]["already_indexed"] == kept_before
    assert stats[1]["matched_earlier_refreshes"] >= 15
    # An already indexed document shares the cluster of its earlier copy when a new copy of it was removed.
    assert any(r["status"] == "already_indexed" and r["cluster_id"] for r in want[1].to_pylist())
    meta = read_index_meta(tmp_path / "d" / "out-1" / "index")
    assert meta["batch"] == "r1" and meta["documents"] == statuses.count(KEPT)
    # A third refresh with another number of partitions reads both earlier ones by overlapping key ranges.
    third = [("again", 1, signature_table("again", texts[:10], [f"x{i}" for i in range(10)]))]
    want3 = reference(tmp_path / "idx2", [first, second, third])[2]
    parts, sources = write_parts(tmp_path / "sig-3", third, 4)
    decide_distributed(parts, sources, [tmp_path / "d" / "out-0" / "index", tmp_path / "d" / "out-1" / "index"],
                       tmp_path / "work3", tmp_path / "out-3", NEAR, "r2", partitions=5)
    assert_same(read_decisions(tmp_path / "out-3"), want3)
    assert set(want3.column("status").to_pylist()) == {NEAR_DUPLICATE}


def test_a_refresh_decided_with_near_dedup_off_is_indexed_all_the_same(tmp_path):
    """r0 decided with dedup.near.enabled false keeps every document, and they all go into training: its index must
    hold them, or r1, decided with it on, keeps its near-copies of them. r0 holds no near-copies of its own, so
    keeping all is what near-dedup decides there too: r1's decisions are the old near_dedup's over r0 and r1 with
    near-dedup on."""
    from kiln.dedup.buckets import keep_all

    texts = family_texts(5, 12)
    first = [("web", 2, signature_table("web", texts["web"]))]
    rng = np.random.default_rng(4)
    vocab = vocabulary(rng, 5_000)
    copies = [" ".join(edited(t.split(), 1, rng, vocab)) for t in texts["web"][:8]]
    second = [("copies", 1, signature_table("copies", copies)), ("new", 2, signature_table("new", texts["ref"]))]
    want = reference(tmp_path / "idx", [first, second])
    assert set(want[0].column("status").to_pylist()) == {KEPT}
    parts, sources = write_parts(tmp_path / "sig-0", first, 7)
    stats = keep_all(parts, sources, NEAR.model_copy(update={"enabled": False}), "r0", tmp_path / "out-0")
    assert_same(read_decisions(tmp_path / "out-0"), want[0])
    assert stats["kept"] == read_index_meta(tmp_path / "out-0" / "index")["documents"] == first[0][2].num_rows
    parts, sources = write_parts(tmp_path / "sig-1", second, 7)
    decide_distributed(parts, sources, [tmp_path / "out-0" / "index"], tmp_path / "work", tmp_path / "out-1", NEAR,
                       "r1", partitions=3)
    got = read_decisions(tmp_path / "out-1")
    assert_same(got, want[1])
    assert got.column("status").to_pylist()[:8] == [NEAR_DUPLICATE] * 8  # each copy, of r0's document


def test_a_refresh_with_near_dedup_off_is_indexed_on_the_engine_the_same_bytes(tmp_path, monkeypatch):
    """keep_all reads the signature parts in engine tasks only (the caller's process held every band key and id of
    the refresh, ~0.7 KB a document, reading every part itself), and a pool of 3 writes the decisions and the index
    byte for byte as this process does."""
    from kiln.dedup.buckets import keep_all

    texts = family_texts(5, 12)
    parts, sources = write_parts(tmp_path / "sig", [("web", 2, signature_table("web", texts["web"]))], 4)
    off = NEAR.model_copy(update={"enabled": False, "partitions": 3})
    engine, in_caller = _MarksTasks(), []
    real = pq.read_table
    monkeypatch.setattr(buckets.pq, "read_table", lambda path, *a, **k: (
        in_caller.append(path) if Path(path) in parts and not engine.in_task else None) or real(path, *a, **k))
    serial = keep_all(parts, sources, off, "r0", tmp_path / "serial", engine)
    monkeypatch.setattr(buckets.pq, "read_table", real)
    assert in_caller == [] and len(parts) > 3
    pool = keep_all(parts, sources, off, "r0", tmp_path / "pool", ProcessPool(workers=3))
    assert pool == serial and serial["kept"] == sum(pq.ParquetFile(p).metadata.num_rows for p in parts)
    files = sorted(f.relative_to(tmp_path / "serial") for f in (tmp_path / "serial").rglob("*") if f.is_file())
    assert files == sorted(f.relative_to(tmp_path / "pool") for f in (tmp_path / "pool").rglob("*") if f.is_file())
    assert len([f for f in files if f.parts[:2] == ("index", "buckets")]) == 3
    assert all((tmp_path / "serial" / f).read_bytes() == (tmp_path / "pool" / f).read_bytes() for f in files)


def test_decisions_past_the_five_digit_padding_are_read_in_part_order(tmp_path):
    """part_name pads to 5 digits: from part 100,000 on, the decisions files' names do not sort as text in part order
    (decisions-100000 < decisions-99999), and read as text they would no longer pair with the signature parts. Three
    parts, their files renamed as parts 99,999 to 100,001 of a larger run are named: read in the same order."""
    import os

    from kiln.common.storage import part_name

    tables = families(3, n_bases=6)
    got, _ = distributed(tmp_path, [tables], part_rows=20)
    folder = tmp_path / "out-0" / "decisions"
    files = [folder / part_name("decisions", k) for k in range(3)]
    assert sorted(folder.glob("*.parquet")) == files
    for k, f in zip((99_999, 100_000, 100_001), files):
        os.replace(f, folder / part_name("decisions", k))
    assert sorted(p.name for p in folder.glob("*.parquet"))[0] == "decisions-100000.parquet"  # text order
    assert_same(read_decisions(tmp_path / "out-0"), got[0])


def as_lists(path: Path) -> None:
    """Rewrite a Parquet file's shingles column as large_list<uint32>, as Kiln stored it before 2026-11-29."""
    t = pq.read_table(path)
    sets = [np.frombuffer(b, "<u4").tolist() for b in t.column("shingles").to_pylist()]
    field = pa.field("shingles", pa.large_list(pa.uint32()), nullable=False)
    pq.write_table(t.set_column(t.schema.get_field_index("shingles"), field, pa.array(sets, field.type)), path)


def test_signature_parts_and_an_index_of_shingle_lists_decide_the_same(tmp_path):
    """Files from before the shingles column was stored as bytes (minhash.SHINGLES_TYPE): signature parts and an
    earlier refresh's index docs with large_list<uint32> shingles decide as near_dedup does."""
    first = families(2)
    rng = np.random.default_rng(9)
    vocab = vocabulary(rng, 5_000)
    copies = [" ".join(edited(t.split(), 1, rng, vocab)) for t in family_texts(2)["web"][:15]]
    second = [("copies", 1, signature_table("copies", copies))]
    want = reference(tmp_path / "idx", [first, second])
    parts, sources = write_parts(tmp_path / "sig-0", first, 12)
    for path in parts:
        as_lists(path)
    decide_distributed(parts, sources, [], tmp_path / "work", tmp_path / "out-0", NEAR, "r0", partitions=3)
    assert_same(read_decisions(tmp_path / "out-0"), want[0])
    docs = sorted((tmp_path / "out-0" / "index" / "docs").glob("*.parquet"))
    for path in docs:
        as_lists(path)
    parts, sources = write_parts(tmp_path / "sig-1", second, 12)
    stats = decide_distributed(parts, sources, [tmp_path / "out-0" / "index"], tmp_path / "work", tmp_path / "out-1",
                               NEAR, "r1", partitions=3)
    assert_same(read_decisions(tmp_path / "out-1"), want[1])
    assert stats["matched_earlier_refreshes"] >= 10  # verified against the old docs' shingle lists
    assert pq.read_schema(docs[0]).field("shingles").type == pa.large_list(pa.uint32())
    new_docs = sorted((tmp_path / "out-1" / "index" / "docs").glob("*.parquet"))
    assert pq.read_schema(new_docs[0]).field("shingles").type == pa.large_binary()


def copies_of_earlier(tmp_path: Path, unrelated: int) -> tuple[list, list, list[pa.Table]]:
    """Two refreshes: planted families, then near-copies of 3 of the first's kept documents and `unrelated` new
    bases' families; and near_dedup's decisions of both."""
    first = families(2)
    first_texts = family_texts(2)
    rng = np.random.default_rng(5)
    vocab = vocabulary(rng, 5_000)
    kept = [r["doc_id"] for r in reference(tmp_path / "idx0", [first])[0].to_pylist()
            if r["source"] == "web" and r["status"] == KEPT][:3]
    copies = [" ".join(edited(first_texts["web"][int(d.split("-")[1])].split(), 1, rng, vocab)) for d in kept]
    second = [("copies", 1, signature_table("copies", copies)),
              ("n-web", 2, signature_table("n-web", family_texts(4, unrelated)["web"]))]
    return first, second, reference(tmp_path / "idx", [first, second])


def test_a_later_refresh_reads_only_the_row_groups_of_earlier_docs_it_needs(tmp_path, monkeypatch):
    """Attach (shingles) and route (records) read an earlier refresh's docs file by row group, only those holding a
    document some candidate pair touches: never the whole file, so what a task reads does not grow with the earlier
    refreshes (issue 36). Refresh 1 is written with 4-row groups; refresh 2 re-sends near-copies of 3 of its
    documents and decides as near_dedup does."""
    monkeypatch.setattr(bucket_rounds, "DOCS_ROW_GROUP_ROWS", 4)
    first, second, want = copies_of_earlier(tmp_path, unrelated=4)
    whole, groups = [], []  # whole-file reads of refresh 1's docs files; (rows in the file, rows read) by row group
    read_table, read_groups = pq.read_table, bucket_index._read_doc_groups

    def spy_read_table(path, *args, **kwargs):
        if "out-0/index/docs" in Path(path).as_posix():
            whole.append(path)
        return read_table(path, *args, **kwargs)

    def spy_read_groups(file, which, columns):
        t = read_groups(file, which, columns)
        groups.append((file.metadata.num_rows, t.num_rows))
        return t

    monkeypatch.setattr(pq, "read_table", spy_read_table)
    monkeypatch.setattr(bucket_index, "_read_doc_groups", spy_read_groups)
    got, stats = distributed(tmp_path / "d", [first, second], part_rows=40)
    assert_same(got[0], want[0])
    assert_same(got[1], want[1])
    assert stats[1]["matched_earlier_refreshes"] == 3  # the copies really were decided against refresh 1's docs
    docs = sorted((tmp_path / "d" / "out-0" / "index" / "docs").glob("*.parquet"))
    assert max(pq.ParquetFile(f).metadata.num_row_groups for f in docs) >= 5  # files of many row groups
    assert whole == [] and groups  # read, and only by row group
    # 3 copies touch at most 3 row groups of 4 rows, for attach and for route each
    assert all(read < rows for rows, read in groups)
    assert sum(read for _, read in groups) <= 2 * 3 * 4, groups


@given(st.integers(1, 5000), st.data())
@settings(max_examples=200, deadline=None)
def test_hash_range_holds_exactly_the_hashes_partition_of_puts_in_the_partition(partitions, data):
    """Against partition_of (the second implementation): [lo, hi) of partition p holds a hash iff partition_of
    gives it p; checked at the range's ends and on random hashes, the extremes 0 and 2^64 - 1 included."""
    p = data.draw(st.integers(0, partitions - 1))
    lo, hi = components.hash_range(p, partitions)
    probes = [lo, hi - 1, max(lo - 1, 0), min(hi, 2**64 - 1), 0, 2**64 - 1,
              *data.draw(st.lists(st.integers(0, 2**64 - 1), max_size=20))]
    got = components.partition_of(np.array(probes, np.uint64), partitions)
    assert [(lo <= h < hi) for h in probes] == [q == p for q in got.tolist()]


def test_a_refresh_with_more_partitions_reads_its_hash_range_of_earlier_buckets_and_ids(tmp_path, monkeypatch):
    """The automatic partition count grows with the index, so a later refresh splits the hashes finer than an
    earlier one did: here 8 partitions against files written with 2, each file meeting 4 of them. A buckets or ids
    file is sorted by its hash in row groups (of 4 rows here), and a task reads the row groups of its own range:
    all the tasks together read each earlier row about once, plus at most a row group at each end of a range, where
    reading the file whole in each task read every row 4 times. Decisions as near_dedup's."""
    monkeypatch.setattr(bucket_index, "HASH_ROW_GROUP_ROWS", 4)
    first, second, want = copies_of_earlier(tmp_path, unrelated=8)
    parts, sources = write_parts(tmp_path / "sig-0", first, 40)
    decide_distributed(parts, sources, [], tmp_path / "work", tmp_path / "out-0", NEAR, "r0", partitions=2)
    earlier = {kind: sorted((tmp_path / "out-0" / "index" / kind).glob("*.parquet")) for kind in ("buckets", "ids")}
    assert all(pq.ParquetFile(f).metadata.num_row_groups >= 4 for f in earlier["buckets"] + earlier["ids"])
    rows = {kind: sum(pq.ParquetFile(f).metadata.num_rows for f in files) for kind, files in earlier.items()}

    reads = {"buckets": [], "ids": []}  # (rows in the file, rows read) per read
    real = bucket_index._read_hash_groups

    def spy(file, groups):
        t = real(file, groups)
        reads["buckets" if "band" in t.column_names else "ids"].append((file.metadata.num_rows, t.num_rows))
        return t

    monkeypatch.setattr(bucket_index, "_read_hash_groups", spy)
    parts, sources = write_parts(tmp_path / "sig-1", second, 40)
    stats = decide_distributed(parts, sources, [tmp_path / "out-0" / "index"], tmp_path / "work", tmp_path / "out-1",
                               NEAR, "r1", partitions=8)
    assert_same(read_decisions(tmp_path / "out-0"), want[0])
    assert_same(read_decisions(tmp_path / "out-1"), want[1])
    assert stats["matched_earlier_refreshes"] == 3  # decided against the earlier rows the tasks read
    for kind in ("buckets", "ids"):
        assert 6 <= len(reads[kind]) <= 8  # a task per partition with rows of its own (pairs; already)
        read = sum(r for _, r in reads[kind])
        assert read <= rows[kind] + len(reads[kind]) * 2 * 4, (kind, read, rows[kind])
        assert all(r < n for n, r in reads[kind])  # no file read whole


def test_a_near_duplicate_lookup_reads_the_row_groups_of_its_band_keys(tmp_path, monkeypatch):
    """near_matches (kiln audit membership) reads, of each buckets file its band keys fall in, the row groups whose
    key range holds one: at most one 4-row group per band here, not the file. Looked up: a kept document's own
    text, found with Jaccard 1."""
    monkeypatch.setattr(bucket_index, "HASH_ROW_GROUP_ROWS", 4)
    tables = families(3)
    parts, sources = write_parts(tmp_path / "sig", tables, 40)
    decide_distributed(parts, sources, [], tmp_path / "work", tmp_path / "out", NEAR, "r0", partitions=2)
    decisions = read_decisions(tmp_path / "out").to_pylist()
    doc = next(r["doc_id"] for r in decisions if r["status"] == KEPT)
    row = next(r for r in tables[0][2].to_pylist() if r["doc_id"] == doc)
    reads = []
    real = bucket_index._read_hash_groups
    monkeypatch.setattr(bucket_index, "_read_hash_groups",
                        lambda file, groups: reads.append((file.metadata.num_rows, len(groups))) or real(file, groups))
    found = bucket_index.near_matches([bucket_index.IndexFiles.folder(tmp_path / "out" / "index")],
                                      np.frombuffer(row["shingles"], "<u4"), np.asarray(row["signature"], np.uint32),
                                      NEAR)
    assert (found[0][0], found[0][1]) == (1.0, doc)
    bands = bands_rows(NEAR)[0]
    assert reads and sum(g for _, g in reads) <= bands and all(g * 4 < n for n, g in reads)


@pytest.mark.parametrize("earlier", [False, True], ids=["footers", "scan-round"])
def test_a_part_of_several_sources_or_out_of_source_order_is_refused(tmp_path, earlier):
    """Rows per source come from the parts' footers (no earlier refresh; a footer showing two sources sends the run
    to the scan round) or from the scan round: either way a part holding two sources, or parts out of source order,
    stop the run with the rule broken."""
    a, b = signature_table("a", ["one two three four five six"]), signature_table("b", ["seven eight nine ten"])
    previous = []
    if earlier:
        parts, sources = write_parts(tmp_path / "first", [("a", 1, a)], 5)
        decide_distributed(parts, sources, [], tmp_path / "w0", tmp_path / "o0", NEAR, "r0", partitions=2)
        previous = [tmp_path / "o0" / "index"]
    mixed = tmp_path / "mixed.parquet"
    pq.write_table(pa.concat_tables([a, b]), mixed)
    with pytest.raises(ValueError, match="one source per part"):
        decide_distributed([mixed], {"a": (1, 0), "b": (1, 1)}, previous, tmp_path / "w", tmp_path / "o", NEAR, "r1",
                           partitions=2)
    pq.write_table(a, tmp_path / "a.parquet")
    pq.write_table(b, tmp_path / "b.parquet")
    with pytest.raises(ValueError, match="parts must come in source order"):
        decide_distributed([tmp_path / "b.parquet", tmp_path / "a.parquet"], {"a": (1, 0), "b": (1, 1)}, previous,
                           tmp_path / "w", tmp_path / "o", NEAR, "r1", partitions=2)


def test_distinct_pairs_are_numpys_unique_rows():
    """Against np.unique over rows (the code it replaced): negative nodes (earlier refreshes') sort first, repeats
    go, and a pair and its reverse are two pairs."""
    rng = np.random.default_rng(5)
    u, v = rng.integers(-50, 50, 2000), rng.integers(-50, 50, 2000)
    u, v = np.r_[u, v[:40], u[:300]], np.r_[v, u[:40], v[:300]]
    want = np.unique(np.stack([u, v], axis=1), axis=0)
    got = distinct_pairs(u, v)
    assert got[0].tolist() == want[:, 0].tolist() and got[1].tolist() == want[:, 1].tolist()
    assert len(want) < len(u) and (want[:, 0] < 0).any()  # not vacuous: repeats and negative nodes were there
    empty = distinct_pairs(np.empty(0, np.int64), np.empty(0, np.int64))
    assert empty[0].size == empty[1].size == 0 and empty[0].dtype == np.int64


def test_pair_jaccard_all_pairs_at_once_equals_minhash_jaccard_pair_by_pair():
    """verify's batched Jaccard against `minhash.jaccard` (intersect1d, one pair at a time): equal floats, also for
    empty sets (0 when both are: documents without words), identical sets and a b list read from a sliced Arrow column
    (offsets not at 0)."""
    rng = np.random.default_rng(3)
    sets = [np.unique(rng.integers(0, 400, rng.integers(0, 50))).astype(np.uint32) for _ in range(120)]
    sets[:3] = [np.empty(0, np.uint32), np.empty(0, np.uint32), sets[5]]
    column = pa.array([None, *sets], pa.large_list(pa.uint32())).slice(1)  # offsets start past 0
    b_values, b_offsets = column.values.to_numpy(), column.offsets.to_numpy()
    a_idx = np.r_[0, 2, rng.integers(0, 120, 500)]
    b_idx = np.r_[1, 5, rng.integers(0, 120, 500)]
    a_values = np.concatenate([sets[i] for i in a_idx])
    a_offsets = np.r_[0, np.cumsum([len(sets[i]) for i in a_idx])]
    got = pair_jaccard(a_values, a_offsets, b_values, b_offsets, b_idx)
    want = np.array([jaccard(sets[a], sets[b]) for a, b in zip(a_idx, b_idx)])
    assert got[0] == 0.0 and got[1] == 1.0  # two empty sets; a set and itself
    assert got.tolist() == want.tolist()
    assert (want == 0).sum() > 10 and ((want > 0) & (want < 1)).sum() > 100  # not a vacuous comparison
    # Sets out of order cannot be merged: they take the search, with the same answer.
    shuffled = np.concatenate([rng.permutation(sets[i]) for i in a_idx])
    assert not np.array_equal(shuffled, a_values)
    assert pair_jaccard(shuffled, a_offsets, b_values, b_offsets, b_idx).tolist() == want.tolist()
    reversed_b = pa.array([None, *[s[::-1] for s in sets]], pa.large_list(pa.uint32())).slice(1)
    assert pair_jaccard(a_values, a_offsets, reversed_b.values.to_numpy(), reversed_b.offsets.to_numpy(),
                        b_idx).tolist() == want.tolist()


def test_verify_opens_only_the_attach_files_holding_its_pairs(tmp_path, monkeypatch):
    """Not every attach file per verify task (parts x parts opens at scale): only those whose rows it reads, so every
    segment a verify task opens holds rows, and the decisions are still near_dedup's."""
    tables = families(11, n_bases=280)
    want = reference(tmp_path / "idx", [tables])[0]
    opened: list[tuple[str, int]] = []
    segments = shuffle._segments

    def recording(path, wanted=None):
        schema, found = segments(path, wanted)
        if Path(path).parent.name == "pairs_a":
            opened.append((path.name, len(found[0])))
        return schema, found

    monkeypatch.setattr(shuffle, "_segments", recording)
    got, stats = distributed(tmp_path, [tables], partitions=4, part_rows=60)
    assert_same(got[0], want)
    attach_files = stats[0]["scratch"]["pairs_a"]["files"]  # the folder itself is dropped after verify
    parts = len(list((tmp_path / "sig-0").glob("*.parquet")))
    assert attach_files >= 10 and parts >= 10  # a shuffle where listing would open many empty segments
    assert opened and all(size > 0 for _, size in opened)
    assert len(opened) < attach_files * parts


def test_each_scratch_folder_is_dropped_after_the_last_round_that_reads_it(tmp_path, monkeypatch):
    """Scratch is deleted as the run goes (`buckets.LAST_READER`), not at its end: the rounds that read each folder
    are observed here, from the shuffle and scratch readers; each folder must outlive its last reader (a reader of a
    deleted folder would find no rows, silently), and nothing is left but the layout files. The sizes reported are
    the folders' own."""
    round_now = [None]
    reads: dict[str, list[str]] = {}
    work = tmp_path / "work"

    def seen(path):
        rel = Path(path).relative_to(work).parts if Path(path).is_relative_to(work) else ()
        if rel and not rel[0].startswith("layout-"):
            reads.setdefault(rel[0], []).append(round_now[0])

    listing, segments, scratch = shuffle.shuffle_files, shuffle._segments, bucket_rounds.read_scratch
    monkeypatch.setattr(shuffle, "shuffle_files", lambda root: (seen(root), listing(root))[1])
    monkeypatch.setattr(shuffle, "_segments", lambda path, wanted=None: (seen(path), segments(path, wanted))[1])
    monkeypatch.setattr(bucket_rounds, "read_scratch",
                        lambda path, columns=None: (seen(path), scratch(path, columns))[1])
    sizes: dict[tuple[str, str], list[int]] = {}  # (folder, round) -> its bytes and files as the round ended

    class Observed:  # names the round whose tasks run (in this process), and sizes every folder as each round ends
        workers = 1

        def map_parts(self, fn, tasks, *, desc, **kwargs):
            round_now[0] = desc.removeprefix("near-dup ")
            out = SERIAL.map_parts(fn, tasks, desc=desc, **kwargs)
            for d in work.iterdir():
                try:
                    files = [f for f in d.rglob("*") if f.is_file()] if d.is_dir() else None
                    if files is not None:
                        sizes[d.name, round_now[0]] = [sum(f.stat().st_size for f in files), len(files)]
                except FileNotFoundError:  # a folder that an earlier round's drop is deleting
                    pass
            return out

    first = families(2, n_bases=8)
    second = [("web", 2, first[0][2].slice(0, 12)),  # re-sent: the already round finds them
              *[(f"n-{s}", tier, signature_table(f"n-{s}", family_texts(4, 8)[s]))
                for s, tier in (("web", 2), ("ref", 1))]]
    _, stats = distributed(tmp_path, [first, second], engine=Observed(), partitions=3, part_rows=9)
    last_reader = {folder: rounds[-1] for folder, rounds in reads.items()}
    assert {"ids", "already", "keys", "pairs_a", "nodes", "cc", "members", "kept_keys"} <= last_reader.keys()
    declared = {folder: r for r, folders in buckets.LAST_READER.items() for folder in folders}
    assert {f: declared.get(f) for f in last_reader} == last_reader
    assert [f for f in work.rglob("*") if f.is_file() and not f.name.startswith("layout-")] == []
    dropped = stats[-1]["scratch"]
    assert dropped["keys"]["bytes"] > 0 and dropped["already"]["bytes"] > 0 and dropped["pairs_a"]["files"] > 0
    # as each folder was when its last reader ended (its drop is handed to the thread only after that)
    assert {f: [v["bytes"], v["files"]] for f, v in dropped.items()} == {f: sizes[f, last_reader[f]] for f in dropped}


def test_a_larger_corpus_same_decisions_as_near_dedup(tmp_path):
    """~900 documents, where removed documents join clusters of several kept ones (their cluster is named by the
    last match unioned: near_dedup and bucket_rounds.py both take matches in a fixed order)."""
    tables = families(11, n_bases=280)
    want = reference(tmp_path / "idx", [tables])[0]
    got, _ = distributed(tmp_path, [tables], partitions=4, part_rows=150)
    assert_same(got[0], want)


# ------------------------------------------------------------------------------------------ engines

@pytest.fixture(scope="module")
def ray_stops():
    yield
    engine_module.shutdown()


@pytest.mark.parametrize("engine", [ProcessPool(workers=2), RayEngine(workers=2)], ids=["pool-2", "ray-2"])
def test_every_engine_writes_the_same_bytes(tmp_path, engine, ray_stops):
    tables = families(6, n_bases=15)
    _, _ = distributed(tmp_path / "serial", [tables], partitions=2, part_rows=12)
    _, _ = distributed(tmp_path / "other", [tables], engine=engine, partitions=2, part_rows=12)
    for sub in ("out-0/decisions", "out-0/index/buckets", "out-0/index/ids", "out-0/index/docs"):
        a = sorted((tmp_path / "serial" / sub).glob("*.parquet"))
        b = sorted((tmp_path / "other" / sub).glob("*.parquet"))
        assert [f.name for f in a] == [f.name for f in b] and a
        assert [f.read_bytes() for f in a] == [f.read_bytes() for f in b]


class _TaskSizes(ProcessPool):
    """SERIAL that records every task's pickled size (what a pool or Ray ships per task)."""

    def __init__(self):
        super().__init__(workers=1)
        self.sizes: list[int] = []

    def map_parts(self, fn, tasks, **kwargs):
        self.sizes.extend(len(pickle.dumps(t)) for t in tasks)
        return super().map_parts(fn, tasks, **kwargs)


def test_a_task_stays_the_same_size_whatever_the_number_of_parts(tmp_path):
    """Tasks carry the layout as a file name, not the per-part layout itself: with it, 10x the parts made every task
    ~10x larger and the task list ~100x (parts squared in the driver and in Ray's object store)."""
    tables = families(6, n_bases=15)
    few, many = _TaskSizes(), _TaskSizes()
    few_out, _ = distributed(tmp_path / "few", [tables], engine=few, part_rows=60)
    many_out, _ = distributed(tmp_path / "many", [tables], engine=many, part_rows=6)
    assert_same(many_out[0], few_out[0])
    assert len(many.sizes) > 1.5 * len(few.sizes)  # the many-parts run really has many more part tasks
    assert max(many.sizes) <= max(few.sizes) + 8 < 1_000  # (+8: the folder name "many" is one letter longer)


# ------------------------------------------------------------------------------------- big buckets

def test_bucket_pairs_all_pairs_below_the_limit_and_anchors_above():
    sizes = np.array([1, 4, 7])
    starts = np.r_[0, np.cumsum(sizes)[:-1]]
    a, b = bucket_pairs(starts, sizes, np.zeros(sizes.sum(), bool), max_bucket=7)
    assert len(a) == 0 + 6 + 21 and len(set(zip(a, b))) == len(a)
    a, b = bucket_pairs(starts, sizes, np.zeros(sizes.sum(), bool), max_bucket=2)
    assert set(zip(a.tolist(), b.tolist())) >= {(5, 6), (5, 11), (6, 11)} and len(a) == 0 + (1 + 2 + 2) + (1 + 2 * 5)
    old = np.array([False, True, True, False, False, False, False, False, False, False, False, False])
    a, b = bucket_pairs(starts, sizes, old, max_bucket=7)  # the old pair (1, 2) is never emitted
    assert (1, 2) not in set(zip(a.tolist(), b.tolist())) and len(a) == 6 - 1 + 21


def test_a_bucket_of_5000_identical_band_keys_stays_bounded(tmp_path):
    """5,000 documents share band 0 (one bucket), unrelated otherwise; 20 of them have an exact copy. Pairs stay
    within 5000 x max_bucket, and the 20 copies are still removed."""
    near = NEAR
    bands, rows = bands_rows(near)
    rng = np.random.default_rng(0)
    n, copies, max_bucket = 5_000, 20, 20
    sigs = rng.integers(0, 2**32, (n, near.num_perm), dtype=np.uint64).astype(np.uint32)
    sigs[:, :rows] = 7  # band 0: one key for all
    shingles = [np.unique(rng.integers(0, 2**32, 60, dtype=np.uint64).astype(np.uint32)) for _ in range(n)]
    picked = rng.choice(n, copies, replace=False)
    sigs = np.concatenate([sigs, sigs[picked]])
    shingles += [shingles[i] for i in picked]
    m = n + copies
    table = pa.table({"doc_id": [f"d{i:05d}" for i in range(m)], "source": ["s"] * m, "chars": np.full(m, 100),
                      "signature": pa.FixedSizeListArray.from_arrays(pa.array(sigs.ravel()), near.num_perm),
                      "shingles": shingles_column(shingles)}, schema=signature_schema(near.num_perm))
    parts, sources = write_parts(tmp_path / "sig", [("s", 1, table)], 1_000)
    stats = decide_distributed(parts, sources, [], tmp_path / "work", tmp_path / "out", near, "r", partitions=4,
                               max_bucket=max_bucket)
    assert stats["buckets"]["largest"] == m and stats["buckets"]["oversized"] == 1
    bound = m * max_bucket + copies * bands  # the big bucket's anchors + each copy with its original in every band
    assert stats["verification"]["pairs_emitted"] <= bound
    decisions = read_decisions(tmp_path / "out").to_pylist()
    removed = {r["doc_id"]: r["duplicate_of"] for r in decisions if r["status"] == NEAR_DUPLICATE}
    assert removed == {f"d{n + j:05d}": f"d{i:05d}" for j, i in enumerate(picked)}
    assert pq.read_table(next((tmp_path / "out" / "index" / "buckets").glob("*.parquet"))).schema.equals(BUCKET_SCHEMA)
    assert band_keys(sigs[:2], bands, rows)[0, 0] == band_keys(sigs[:2], bands, rows)[1, 0]


# ------------------------------------------------------------------------------- connected components

def union_find(edges: list[tuple[int, int]]) -> dict[int, int]:
    parent: dict[int, int] = {}

    def find(x):
        parent.setdefault(x, x)
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for u, v in edges:
        if u != v:
            a, b = find(u), find(v)
            if a != b:
                parent[max(a, b)] = min(a, b)
    return {x: find(x) for x in parent if any(x in e and e[0] != e[1] for e in edges)}


def components_of(tmp: Path, edges: list[tuple[int, int]], partitions: int, chunks: int = 2) -> dict[int, int]:
    import shutil

    shutil.rmtree(tmp, ignore_errors=True)
    arr = np.array(edges, dtype=np.int64).reshape(-1, 2)
    for i, chunk in enumerate(np.array_split(arr, chunks)):
        write_edges(tmp, f"c{i}", chunk[:, 0], chunk[:, 1], partitions)
    connected_components(tmp, partitions)
    return read_labels(tmp)


graphs = st.one_of(
    st.lists(st.tuples(st.integers(-30, 30), st.integers(-30, 30)), max_size=60),  # dense, with self-loops
    st.lists(st.tuples(st.integers(-2**62, 2**62), st.integers(-2**62, 2**62)), max_size=30),  # many small
    st.permutations(list(range(40))).map(lambda p: list(zip(p[:-1], p[1:]))),  # a long path, any labels
    # a star and a path with consecutive labels
    st.integers(2, 60).map(lambda n: [(0, i) for i in range(1, n)] + [(n + i, n + i + 1) for i in range(n)]),
)


@settings(max_examples=25, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(edges=graphs, partitions=st.integers(1, 4))
def test_connected_components_match_union_find(tmp_path, edges, partitions):
    got = components_of(tmp_path / "cc", edges, partitions)
    assert got == union_find(edges)  # the same partition, each labelled by its smallest node


def test_components_of_long_sorted_and_shuffled_paths(tmp_path):
    rng = np.random.default_rng(0)
    for labels in (np.arange(1_000), rng.permutation(1_000) * 1_000_003 - 10**9):
        edges = list(zip(labels[:-1].tolist(), labels[1:].tolist())) + [(5_000_000, 5_000_001)]
        got = components_of(tmp_path / "cc", edges, 4)
        assert got == union_find(edges) and len(set(got.values())) == 2


@pytest.mark.parametrize("sample", [7, 100])
def test_the_part_by_part_survivor_check_finds_what_the_whole_batch_check_finds(tmp_path, sample):
    """buckets.survivor_violations (one part at a time) against the old whole-Batch check: the same sampled
    documents (the same draw) and the same violating pairs, on a corpus where every planted copy survived."""
    from kiln.dedup.buckets import keep_all, survivor_violations
    from tests.old_near_dedup import survivor_violations as whole_batch

    rng = np.random.default_rng(3)
    vocab = vocabulary(rng, 2_000)
    bases = [list(rng.choice(vocab, 60)) for _ in range(12)]
    texts = [" ".join(b) for b in bases] + [" ".join(edited(b, 1, rng, vocab)) for b in bases[:6]]
    table = signature_table("s", texts)
    parts, sources = write_parts(tmp_path / "sig", [("s", 1, table)], 5)
    keep_all(parts, sources, NEAR, "r0", tmp_path / "out")  # every document survives: the copies are violations
    files = sorted((tmp_path / "out" / "decisions").glob("*.parquet"))
    got = survivor_violations(parts, files, NEAR.threshold, sample, tmp_path / "check")
    want = whole_batch(Batch.from_tables([(1, table)]), read_decisions(tmp_path / "out"), NEAR.threshold, sample)
    assert got[0] == want[0] and sorted(got[1]) == sorted(want[1])
    if sample == 100:
        assert len(want[1]) == 12  # each planted pair, both ways


class _MarksTasks(ProcessPool):
    """SERIAL that says whether a task is running (what a pool or Ray would run in a worker)."""

    def __init__(self):
        super().__init__(workers=1)
        self.in_task = False

    def map_parts(self, fn, tasks, **kwargs):
        def marked(task):
            self.in_task = True
            try:
                return fn(task)
            finally:
                self.in_task = False
        return super().map_parts(marked, tasks, **kwargs)


def test_the_survivor_check_scans_the_parts_on_the_engine_not_in_the_asset_s_process(tmp_path, monkeypatch):
    """The caller's process reads only the signature parts holding a sampled survivor; every part's scan (signatures,
    and shingle sets) is an engine task. It read every part of the refresh itself, shingles included. The same
    sample and violations as the whole-Batch check."""
    from kiln.dedup.buckets import keep_all, survivor_violations
    from tests.old_near_dedup import survivor_violations as whole_batch

    rng = np.random.default_rng(3)
    vocab = vocabulary(rng, 2_000)
    bases = [list(rng.choice(vocab, 60)) for _ in range(12)]
    texts = [" ".join(b) for b in bases] + [" ".join(edited(b, 1, rng, vocab)) for b in bases[:6]]
    table = signature_table("s", texts)
    parts, sources = write_parts(tmp_path / "sig", [("s", 1, table)], 3)  # 6 parts
    keep_all(parts, sources, NEAR, "r0", tmp_path / "out")
    files = sorted((tmp_path / "out" / "decisions").glob("*.parquet"))
    engine, in_caller, in_tasks = _MarksTasks(), [], []
    real = pq.read_table

    def read(path, *args, **kwargs):
        if Path(path) in parts:
            (in_tasks if engine.in_task else in_caller).append(Path(path))
        return real(path, *args, **kwargs)

    monkeypatch.setattr(buckets.pq, "read_table", read)
    got = survivor_violations(parts, files, NEAR.threshold, 2, tmp_path / "check", engine)
    monkeypatch.setattr(buckets.pq, "read_table", real)
    want = whole_batch(Batch.from_tables([(1, table)]), read_decisions(tmp_path / "out"), NEAR.threshold, 2)
    assert got[0] == want[0] == 2 and sorted(got[1]) == sorted(want[1])
    assert len(set(in_caller)) <= 2 < len(parts) and set(in_tasks) == set(parts)
    assert not (tmp_path / "check").exists()


def test_automatic_partitions_follow_the_corpus_and_decide_the_same(tmp_path, monkeypatch):
    """auto_partitions keeps ~KEY_ROWS_PER_PARTITION band-key rows per task, at least 8: 100,000 documents x 16 bands
    = 1.6M rows -> 7 -> 8; 300,000 -> 4.8M / 250k = 19.2 -> 20; 1,000,000 -> 64. With a tiny row budget the planted
    corpus gets many partitions, recorded in the index, and the same decisions as 3 partitions."""
    assert [buckets.auto_partitions(n, 16) for n in (100_000, 300_000, 1_000_000)] == [8, 20, 64]
    tables = families(6, n_bases=15)
    fixed, _ = distributed(tmp_path / "fixed", [tables], partitions=3)
    monkeypatch.setattr(buckets, "KEY_ROWS_PER_PARTITION", 40)
    auto, stats = distributed(tmp_path / "auto", [tables], partitions=None)
    documents = sum(t.num_rows for _, _, t in tables)
    assert stats[0]["partitions"] == -(-documents * bands_rows(NEAR)[0] // 40) > 8
    assert read_index_meta(tmp_path / "auto" / "out-0" / "index")["partitions"] == stats[0]["partitions"]
    assert_same(auto[0], fixed[0])


# ------------------------------------------------------------------------------- conservation's distinct ids

@pytest.mark.parametrize("engine", [SERIAL, ProcessPool(workers=3)], ids=["serial", "pool-3"])
def test_distinct_doc_ids_read_each_decisions_file_once_whatever_the_refresh_size(tmp_path, monkeypatch, engine):
    """dedup_index's conservation check counts distinct doc_ids over the decisions files: an id repeated within a
    file or across files counts once, an empty file adds nothing (a b c | c d | e e f | - | g a: 7). With a budget
    of 4 ids per task that is 5 hash ranges, and still one read of each file: one process reading every file once
    per range of the hash did a refresh's reads times its size over 2M (quadratic)."""
    ids = [["a", "b", "c"], ["c", "d"], ["e", "e", "f"], [], ["g", "a"]]
    files = []
    for k, part in enumerate(ids):
        files.append(tmp_path / f"decisions-{k:05d}.parquet")
        pq.write_table(pa.table({"doc_id": pa.array(part, pa.string()), "status": [KEPT] * len(part)}), files[-1])
    reads = []
    real = pq.read_table
    monkeypatch.setattr(buckets.pq, "read_table", lambda path, *a, **k: reads.append(Path(path)) or real(path, *a, **k))
    assert buckets.distinct_doc_ids(files, tmp_path / "work", engine, ids_per_task=4) == 7
    assert not (tmp_path / "work").exists()  # its shuffle removed
    if engine is SERIAL:  # (the pool's workers read them in their own processes)
        assert sorted(reads) == files


@given(st.sets(st.integers(0, 99), max_size=40), st.sampled_from([1, 4, 7, 100]), st.sampled_from([1, 8, 1024]))
@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
def test_read_doc_refs_reads_the_wanted_rows_a_bounded_read_at_a_time(tmp_path, monkeypatch, wanted, group, per_read):
    """Against a filter of the whole file (the second implementation): the same rows, in file order, whatever the
    row group size and rows per read; no read covers more row groups than DOCS_READ_ROWS allows (at least one), nor
    a row group without a wanted document."""
    path = tmp_path / f"docs-{group}.parquet"
    if not path.exists():
        n = 100
        table = pa.table({"ref": np.arange(1000, 1000 + n, dtype=np.int64), "doc_id": [f"d{i}" for i in range(n)],
                          "source": ["s"] * n, "quality_tier": np.ones(n, np.int32), "chars": np.arange(n),
                          "batch": ["b"] * n, "shingles": [bytes([i]) * 8 for i in range(n)]},
                         schema=bucket_index.DOCS_SCHEMA)
        pq.write_table(table, path, row_group_size=group)
    monkeypatch.setattr(bucket_index, "DOCS_READ_ROWS", per_read)
    reads, read_groups = [], bucket_index._read_doc_groups
    monkeypatch.setattr(bucket_index, "_read_doc_groups",
                        lambda file, which, columns: reads.append(which) or read_groups(file, which, columns))
    refs = np.array(sorted(wanted), np.int64) + 1000
    got = bucket_index.read_doc_refs(path, refs[::-1], ["doc_id", "shingles"])  # any order asked, file order given
    whole = pq.read_table(path, columns=["ref", "doc_id", "shingles"])
    assert got.to_pylist() == [r for r in whole.to_pylist() if r["ref"] in set(refs.tolist())]
    assert all(len(which) <= max(1, per_read // group) for which in reads)
    assert all(any(g * group <= w < (g + 1) * group for w in wanted) for which in reads for g in which)
    assert sum(len(which) for which in reads) == len({w // group for w in wanted})
