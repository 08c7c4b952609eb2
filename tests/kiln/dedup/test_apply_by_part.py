"""deduplicated_documents and the data card read by part (issue 36): no process reads a table of every part.

A store laid out as the asset graph leaves it for one refresh (curated parts, signature parts grouping them two by
two, the index's decisions, one file per signature part, written here by hand: the expected removals are these
decisions), applied on every engine; then the same under a cap on the rows any one read may return (a part's
worth): reading a source's decisions, or the shards' member list, into one table trips it.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from assets.dedup import apply_decisions, pinned_inputs
from kiln.common.config import parse_config
from kiln.common.storage import Store
from kiln.curation.documents import DOCUMENT_SCHEMA, Document
from kiln.dedup.apply import DecisionsMismatch, decisions_by_part, part_removals
from kiln.dedup.minhash import line_hash
from kiln.dedup.near import DECISION_SCHEMA, KEPT, NEAR_DUPLICATE
from kiln.engine import SERIAL, ProcessPool, RayEngine
from kiln.engine import shutdown as ray_shutdown
from kiln.governance.catalog import Catalog
from kiln.governance.data_card_documents import licenses_and_languages
from tests.store_files import leftovers, published_files

REFRESH = "r1"
PART_ROWS = 5
FOOTER = "Copyright Example Corp. All rights reserved."
ITEM = ("the quick brown fox jumps over the lazy dog while seven wizards quietly judge "
        "boxing matches under a pale violet moon tonight")
# web: 7 curated parts of 5; two near-duplicates (rows 3 and 4, of rows 0 and 1) in every part but part 3: 12, more
# than the cap (10, a signature part), so reading the source's near-duplicates into one table trips it.
WEB_PARTS, MIRROR_PARTS = 7, 2
WEB_NEAR = {f"w{p * 5 + r:02d}": f"w{p * 5 + r - 3:02d}" for p in range(WEB_PARTS) if p != 3 for r in (3, 4)}
MIRROR_NEAR = {"m01": "w00", "m03": "w05"}  # mirror part 1 rejects nothing
BOILERPLATE_ONLY, CONTAMINATED = "w02", "w10"
CAP = 2 * PART_ROWS  # the biggest part any dataset here has: a signature part (two curated parts)


def _text(doc_id: str) -> str:
    words = " ".join(f"{doc_id}x{i}" for i in range(40))
    if doc_id == BOILERPLATE_ONLY:
        return FOOTER
    if doc_id == CONTAMINATED:
        return f"{words}\n{ITEM}\n"
    return f"{words}\n{FOOTER}" if doc_id in ("w00", "w01", "m00", "m04") else words


def _ids(prefix: str, parts: int) -> list[list[str]]:
    return [[f"{prefix}{p * PART_ROWS + r:02d}" for r in range(PART_ROWS)] for p in range(parts)]


def _commit(writer) -> None:
    writer.commit(code_version="t", config={}, inputs={}, counts={})


def _config(tmp: Path, **extra):
    bench = tmp / "bench.jsonl"
    bench.write_text(json.dumps({"id": "q1", "text": ITEM}) + "\n", encoding="utf-8")
    return parse_config({
        "sources": [{"name": n, "kind": "jsonl", "path": str(tmp / n), "license": "CC-BY", "domain": "web", "quality_tier": t,
                     "profile": "none"} for n, t in (("web", 1), ("mirror", 2))],
        "profiles": {"none": []},
        "dedup": {"boilerplate_lines": {"enabled": True, "min_documents": 2}},
        "decontamination": {"benchmarks": [{"name": "toy", "path": str(bench)}]},
        **extra})


def build_store(tmp: Path) -> tuple[Store, object]:
    """Curated parts, signature parts (two curated parts each, as `signature_groups` makes them) and the index's
    decisions (one file per signature part) and boilerplate lines, committed as the assets commit them."""
    store, config = Store(tmp / "data"), _config(tmp)
    decisions = []
    for name, parts, near in (("web", WEB_PARTS, WEB_NEAR), ("mirror", MIRROR_PARTS, MIRROR_NEAR)):
        ids = _ids(name[0], parts)
        with store.staging("curated_documents", f"{name}/{REFRESH}") as w:
            for part in ids:
                w.write("documents", pa.Table.from_pylist(
                    [Document(d, name, _text(d), meta={"locator": d}).to_row() for d in part], schema=DOCUMENT_SCHEMA))
            _commit(w)
        groups = [sum(ids[i:i + 2], []) for i in range(0, parts, 2)]
        with store.staging("minhash_signatures", f"{name}/{REFRESH}") as w:
            for g in groups:  # only their row counts matter here
                w.write("signatures", pa.table({"doc_id": g, "source": [name] * len(g)}))
            _commit(w)
        for g in groups:
            decisions.append(pa.Table.from_pylist([
                {"doc_id": d, "source": name, "status": NEAR_DUPLICATE if d in near else KEPT,
                 "cluster_id": near.get(d), "duplicate_of": near.get(d),
                 "duplicate_of_source": "web" if d in near else None, "jaccard": 0.9 if d in near else None,
                 "candidates": 1} for d in g], schema=DECISION_SCHEMA))
    with store.staging("dedup_index", REFRESH) as w:
        for t in decisions:
            w.write("decisions", t)
        w.write("lines", pa.table({"line_hash": pa.array([line_hash(FOOTER)], pa.uint64()), "documents": [0]}))
        _commit(w)
    return store, config


def apply_all(store: Store, config, engine) -> dict[str, bytes]:
    """Every source deduplicated on `engine`; the bytes of every file written, by path."""
    for name in ("web", "mirror"):
        with store.staging("deduplicated_documents", f"{name}/{REFRESH}") as writer:
            stats, report = apply_decisions(pinned_inputs(store, config, name, REFRESH), config, writer, engine,
                                            progress=False)
            writer.commit(code_version="t", config={}, inputs={}, counts={},
                          stats={**stats.to_dict(with_lengths=True), "contamination": report})
    base = store.root / "deduplicated_documents"
    return {str(p.relative_to(base)): p.read_bytes() for p in published_files(base) if p.suffix == ".parquet"} | {
        f"{n}/stats": json.dumps(store.manifest("deduplicated_documents", f"{n}/{REFRESH}").stats, sort_keys=True).encode()
        for n in ("web", "mirror")}


@pytest.fixture(scope="module")
def serial(tmp_path_factory):
    store, config = build_store(tmp_path_factory.mktemp("serial"))
    return store, apply_all(store, config, SERIAL)


def _rows(store: Store, name: str, role: str) -> list[dict]:
    return store.read_table("deduplicated_documents", f"{name}/{REFRESH}", role).to_pylist()


def test_each_part_gets_its_own_decisions_and_the_rejects_are_numbered_in_part_order(serial):
    store, files = serial
    rejected = {r["doc_id"]: r for r in _rows(store, "web", "rejected")}
    near = {d: r["duplicate_of"] for d, r in rejected.items() if r["reason"] == "near_duplicate"}
    assert near == WEB_NEAR
    assert rejected[BOILERPLATE_ONLY]["reason"] == "boilerplate_only"
    assert rejected[CONTAMINATED]["stage"] == "decontamination"
    kept = _rows(store, "web", "documents")
    assert len(kept) == WEB_PARTS * PART_ROWS - len(WEB_NEAR) - 2 and all(FOOTER not in r["text"] for r in kept)
    # One documents part per curated part; rejected parts only for the parts that reject something, in part order:
    # part 3 rejects nothing, so rejected-00003 holds part 4's rejects (w23, w24).
    web = sorted(k for k in files if k.startswith(f"web/{REFRESH}/"))
    assert [k.split("/")[-1] for k in web] == (
        ["contamination-00000.parquet"] + [f"part-{i:05d}.parquet" for i in range(WEB_PARTS)]
        + [f"rejected-{i:05d}.parquet" for i in range(WEB_PARTS - 1)])
    fourth = pq.read_table(store.dataset_dir("deduplicated_documents", f"web/{REFRESH}") / "rejected-00003.parquet")
    assert fourth.column("doc_id").to_pylist() == ["w23", "w24"]
    mirror = {r["doc_id"]: r["duplicate_of"] for r in _rows(store, "mirror", "rejected")}
    assert mirror == MIRROR_NEAR
    assert [k.split("/")[-1] for k in files if k.startswith(f"mirror/{REFRESH}/rejected")] == ["rejected-00000.parquet"]
    # No text of a dropped document is kept (keep_rejected_text defaults to none): not in the rejects, not in the
    # removal examples, and nothing left in the staging scratch (the rejects' temporary parts) is published.
    assert all(r["text"] is None for n in ("web", "mirror") for r in _rows(store, n, "rejected"))
    examples = store.manifest("deduplicated_documents", f"web/{REFRESH}").stats["examples"]
    assert set(examples) == {"near_duplicate", "boilerplate_only", "decontamination.benchmark_overlap"}
    assert all("excerpt" not in e for ex in examples.values() for e in ex)
    assert [leftovers(d) for d in (store.root / "deduplicated_documents").iterdir()] == [[], []]
    contamination = pq.read_table(store.dataset_dir("deduplicated_documents", f"web/{REFRESH}")
                                  / "contamination-00000.parquet").to_pylist()
    assert [(r["benchmark"], r["item_id"], r["doc_id"]) for r in contamination] == [("toy", "q1", CONTAMINATED)]


@pytest.fixture(scope="module")
def ray_stops():
    yield
    ray_shutdown()


@pytest.mark.parametrize("engine", [ProcessPool(workers=2), RayEngine(workers=2)], ids=["pool-2", "ray-2"])
def test_every_engine_writes_the_same_bytes(serial, tmp_path, engine, ray_stops):
    store, config = build_store(tmp_path)
    assert apply_all(store, config, engine) == serial[1]


def test_decisions_of_other_documents_are_refused_naming_the_fix(tmp_path):
    pq.write_table(pa.Table.from_pylist([{"doc_id": "a", "source": "web", "status": KEPT}], schema=DECISION_SCHEMA),
                   tmp_path / "d.parquet")
    with pytest.raises(DecisionsMismatch, match="no decision for 1 of the part's documents.*re-materialize dedup_index"):
        part_removals(str(tmp_path / "d.parquet"), pa.array(["a", "b"]))
    files = [Path("d0"), Path("d1")]
    assert decisions_by_part([3, 0, 4, 5], [7, 5], files, [7, 5], "x") == [Path("d0"), None, Path("d0"), Path("d1")]
    with pytest.raises(DecisionsMismatch, match="one signature part.*re-materialize"):
        decisions_by_part([3, 5, 4], [7, 5], files, [7, 5], "x")  # a part across two signature parts
    with pytest.raises(DecisionsMismatch, match="re-materialize dedup_index"):
        decisions_by_part([7, 5], [7, 5], files, [7, 6], "x")  # the index decided other signature parts


# ------------------------------------------------------------------------- the cap on one read


@pytest.fixture
def capped(monkeypatch):
    """Every read (pyarrow's, and the store's, which concatenates a dataset's files) returning more than CAP rows
    fails: the largest part here has CAP rows, so only a read of several parts at once can."""
    def check(table, what):
        if table.num_rows > CAP:
            raise AssertionError(f"{what} returned {table.num_rows} rows in one table (cap {CAP}: one part)")
        return table

    def wrap(fn, what):
        return lambda *a, **k: check(fn(*a, **k), what)

    def batches(fn):
        def iterate(*a, **k):
            for b in fn(*a, **k):
                yield check(b, "ParquetFile.iter_batches")
        return iterate

    monkeypatch.setattr(pq, "read_table", wrap(pq.read_table, "pq.read_table"))
    monkeypatch.setattr(pq.ParquetFile, "read", wrap(pq.ParquetFile.read, "ParquetFile.read"))
    monkeypatch.setattr(pq.ParquetFile, "read_row_groups", wrap(pq.ParquetFile.read_row_groups, "read_row_groups"))
    monkeypatch.setattr(pq.ParquetFile, "iter_batches", batches(pq.ParquetFile.iter_batches))
    monkeypatch.setattr(Store, "read_table", wrap(Store.read_table, "Store.read_table"))


def test_deduplication_reads_a_part_at_a_time(tmp_path, serial, capped):
    store, config = build_store(tmp_path)
    assert apply_all(store, config, SERIAL) == serial[1]


# web's documents in three parts of the last stage, mirror's in two; the member list in the shard writer's order.
CARD_PARTS = {"web": [[f"c{p}{r}" for r in range(4)] for p in range(3)], "mirror": [["m0", "m1", "m2"], ["m3", "m4"]]}
LICENSES = ["MIT", None, "UNKNOWN", "Apache-2.0", " ", "MIT"]


def _member(i: int, doc_id: str, source: str) -> dict:
    return {"doc_id": doc_id, "source": source, "split": "val" if i % 5 == 4 else "train", "copies": i % 3,
            "tokens": 10 + i, "removed_by": None}


def card_store(tmp: Path, order: str) -> tuple[Store, object, dict]:
    store = Store(tmp / "data")
    config = _config(tmp, card={"license_fields": {"mirror": "pkg"}})
    members = []
    for name, parts in CARD_PARTS.items():
        with store.staging("quality_filtered_documents", f"{name}/{REFRESH}") as w:
            for part in parts:
                w.write("documents", pa.Table.from_pylist([Document(
                    d, name, "text", license=LICENSES[i % 6] if name == "web" else "CC-BY",
                    meta={"locator": f"at/{d}"} | ({"pkg": LICENSES[(i + 1) % 6]} if name == "mirror" else {})).to_row()
                    for i, d in enumerate(part)], schema=DOCUMENT_SCHEMA))
            _commit(w)
        members += [_member(i, d, name) for i, d in enumerate(sum(parts, []))]
    if order == "sources swapped":  # a member list written under another source order: found by its runs
        members = [m for m in members if m["source"] == "mirror"] + [m for m in members if m["source"] == "web"]
    elif order == "reversed":  # nothing where the row counts say: each part looked up by doc id
        members = members[::-1]
    with store.staging("token_shards", REFRESH) as w:
        w.write("members", pa.Table.from_pylist(members))
        shards = w.commit(code_version="t", config={}, inputs={}, counts={})
    return store, config, shards


def expected_card() -> dict:
    """The licence rows per source, worked out from the lists above (a dict of every member: fine in a test)."""
    members = {m["doc_id"]: m for name, parts in CARD_PARTS.items()
               for m in (_member(i, d, name) for i, d in enumerate(sum(parts, [])))}
    out = {}
    for name, parts in CARD_PARTS.items():
        rows: dict[str, Counter] = {}
        for p in parts:
            for i, d in enumerate(p):
                raw = LICENSES[i % 6] if name == "web" else LICENSES[(i + 1) % 6]
                lic = "unknown" if raw is None or raw.strip().lower() in ("", "unknown") else raw
                m = members[d]
                train = m["split"] == "train" and m["copies"] > 0
                row = rows.setdefault(lic, Counter({"documents": 0, "in_train_shards": 0, "train_tokens": 0}))
                row.update({"documents": 1, "in_train_shards": int(train),
                            "train_tokens": m["copies"] * m["tokens"] if train else 0})
        out[name] = {k: dict(v) for k, v in rows.items()}
    return out


@pytest.mark.parametrize("order", ["shard writer order", "sources swapped", "reversed"])
def test_the_card_joins_documents_and_members_a_part_at_a_time(tmp_path, capped, order):
    store, config, shards = card_store(tmp_path, order)
    parts = {n: [f"{n}/{REFRESH}"] for n in CARD_PARTS}
    licenses, languages = licenses_and_languages(Catalog(store), config, parts, shards)
    got = {n: licenses["per_source"][n]["licenses"] for n in CARD_PARTS}
    assert got == expected_card()
    assert sum(len(p) for p in CARD_PARTS["web"]) > CAP  # the member list is bigger than any one read may be
    web = licenses["per_source"]["web"]
    assert [u["doc_id"] for u in web["unknown_listed"]] == [d for p in CARD_PARTS["web"] for i, d in enumerate(p)
                                                            if LICENSES[i % 6] in (None, "UNKNOWN", " ")]
    assert languages["per_source"]["web"]["languages"]["not identified"]["documents"] == 12



def test_a_benchmark_file_edited_between_runs_is_read_again_by_a_live_worker(tmp_path):
    """A worker keeps the benchmark index it built (one per process, not one per task); keyed by the settings alone
    it kept using the old items after the file gained one: a document holding the new item was kept by the same
    process that drops it when started fresh. Keyed by the files' sizes and modification times too."""
    from kiln.common.config import BoilerplateLines, Decontamination, NearDedup
    from kiln.common.storage import write_parquet_atomic
    from kiln.curation.documents import make_doc_id
    from kiln.dedup.apply import deduplicate_source
    from kiln.dedup.buckets import keep_all
    from tests.kiln.dedup.test_dedup import signature_table

    item_a = "the committee shall publish its annual report on the first monday of every march without fail"
    item_b = "a brand new evaluation question about rivers towns barges and the price of salt in winter markets today"
    docs = [Document(make_doc_id("s", str(i)), "s", f"Some intro text here. {t} And a long tail of other words.")
            for i, t in enumerate([item_a, item_b])]
    part = tmp_path / "part-00000.parquet"
    write_parquet_atomic(part, pa.Table.from_pylist([d.to_row() for d in docs], schema=DOCUMENT_SCHEMA))
    sig = tmp_path / "sig.parquet"
    pq.write_table(signature_table("s", [d.text for d in docs], [d.doc_id for d in docs]), sig)
    keep_all([sig], {"s": (1, 0)}, NearDedup(), "r0", tmp_path / "idx")
    decisions = [tmp_path / "idx" / "decisions" / "decisions-00000.parquet"]
    bench = tmp_path / "bench.jsonl"
    decon = Decontamination(benchmarks=[{"name": "b", "path": str(bench)}])
    store = Store(tmp_path / "store")

    def kept(tag: str) -> int:
        with store.staging("dd", tag) as writer:
            stats, _ = deduplicate_source([part], decisions, [], BoilerplateLines(), decon, writer, SERIAL,
                                          progress=False)
            writer.abort()
        return stats.docs_out

    bench.write_text(json.dumps({"id": "a", "text": item_a}) + "\n")
    assert kept("first") == 1  # item a's document dropped
    bench.write_text(json.dumps({"id": "a", "text": item_a}) + "\n" + json.dumps({"id": "b", "text": item_b}) + "\n")
    assert kept("second") == 0  # this process read the file again: item b's document dropped too
