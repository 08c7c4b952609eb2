"""The filter stage's intake hashes, bucketed by hash: the layout, the same bytes on every engine, and a question
that opens one file of a partition (kiln.curation.intake_hashes)."""

import hashlib
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.config import parse_config
from kiln.common.storage import Store
from kiln.curation import intake_hashes
from kiln.curation.documents import INTAKE_HASH_SCHEMA
from kiln.curation.pipeline import filter_documents, ingest, profile_steps
from kiln.engine import SERIAL, ProcessPool
from tests.conftest import SERIAL_ENGINE, prose, write_jsonl


def folded(text: str) -> str:
    """Exact dedup's hash of these ASCII texts, by hand: lowercased, whitespace runs as one space, blake2b-128."""
    return hashlib.blake2b(" ".join(text.lower().split()).encode(), digest_size=16).hexdigest()


def filtered_store(tmp_path: Path, name: str, engine) -> Store:
    """40 documents in parts of 7 (6 parts) through a profile that keeps them all, into a store of its own."""
    if not (tmp_path / "src").exists():
        write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": f"d{i}", "text": prose(i)} for i in range(40)])
    config = parse_config({"sources": [{"name": "src", "kind": "jsonl", "path": str(tmp_path / "src"),
                                        "license": "CC0", "domain": "web", "profile": "p"}],
                           "profiles": {"p": []}, "reading": {"rows_per_part": 7}, "engine": SERIAL_ENGINE})
    store = Store(tmp_path / name)
    with store.staging("raw", "src") as w:
        w.commit(code_version="t", config={}, inputs={}, counts={},
                 stats=ingest(config.sources[0], config.reading, w, progress=False).to_dict())
    with store.staging("filtered", "src") as w:
        stats = filter_documents(store.files("raw", "src", "documents"), profile_steps(config, "src"),
                                 config.curation.exact_dedup, w, engine, progress=False)
        w.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())
    return store


def test_the_hashes_are_bucketed_by_their_head_sorted_and_the_same_on_every_engine(tmp_path, monkeypatch):
    """40 rows at 8 a bucket: 5 files, each holding exactly the hashes whose first 8 hex digits are q modulo 5,
    sorted by hash, in row groups of 2 whose min/max do not overlap (what lets a reader skip all but one)."""
    monkeypatch.setattr(intake_hashes, "ROWS_PER_BUCKET", 8)
    monkeypatch.setattr(intake_hashes, "ROW_GROUP", 2)
    stores = [filtered_store(tmp_path, "serial", SERIAL), filtered_store(tmp_path, "pool", ProcessPool(2))]
    expected = {(r["doc_id"], folded(r["text"])) for r in stores[0].read_table("raw", "src").to_pylist()}
    assert len(expected) == 40 and len(stores[0].files("raw", "src", "documents")) == 6
    files = [store.files("filtered", "src", "intake_hashes") for store in stores]
    assert [f.name for f in files[0]] == [f"intake_hashes-{q:05d}-of-00005.parquet" for q in range(5)]
    assert [f.read_bytes() for f in files[0]] == [f.read_bytes() for f in files[1]]  # any engine, the same bytes
    found = set()
    for q, path in enumerate(files[0]):
        rows = [(r["doc_id"], r["content_hash"]) for r in pq.read_table(path).to_pylist()]
        assert all(int(h[:8], 16) % 5 == q for _, h in rows)
        assert rows == sorted(rows, key=lambda r: (r[1], r[0]))
        groups = pq.ParquetFile(path).metadata
        bounds = [(groups.row_group(g).column(1).statistics.min, groups.row_group(g).column(1).statistics.max)
                  for g in range(groups.num_row_groups)]
        assert groups.num_row_groups == -(-len(rows) // 2)
        assert all(high < low for (_, high), (low, _) in zip(bounds, bounds[1:]))
        found |= set(rows)
    assert found == expected
    # The part tasks' rows and the shuffle were scratch: nothing of them is published or left behind.
    assert not [p for p in (stores[0].root / "filtered").rglob("*") if ".intake" in str(p)]


def test_a_question_opens_the_one_file_its_hash_falls_in(tmp_path, monkeypatch):
    monkeypatch.setattr(intake_hashes, "ROWS_PER_BUCKET", 8)
    store = filtered_store(tmp_path, "store", SERIAL)
    files = store.files("filtered", "src", "intake_hashes")
    opened = []
    read_table = pq.read_table
    monkeypatch.setattr(intake_hashes.pq, "read_table",
                        lambda path, **kw: opened.append(path) or read_table(path, **kw))
    wanted = folded(prose(17))
    names = [f.name for f in files]
    assert intake_hashes.to_search(names, wanted) == [names[int(wanted[:8], 16) % 5]]
    [doc] = intake_hashes.search([f for f in files if f.name in intake_hashes.to_search(names, wanted)], wanted)
    assert store.values("raw", "src", "text", {doc})[doc] == prose(17)
    assert set(opened) == {files[int(wanted[:8], 16) % 5]}
    missing = folded("a text no document has")
    assert intake_hashes.search([f for f in files if f.name in intake_hashes.to_search(names, missing)], missing) == []


def test_files_of_the_per_part_layout_are_all_read(tmp_path):
    """Stores filtered before the hashes were bucketed hold one unsorted file per part: no bucket count, every file
    searched."""
    for i, (doc, text) in enumerate([("a", "first text"), ("b", "second text")]):
        pq.write_table(pa.Table.from_pylist([{"doc_id": doc, "content_hash": folded(text)}], schema=INTAKE_HASH_SCHEMA),
                       tmp_path / f"intake_hashes-{i:05d}.parquet")
    files = sorted(tmp_path.glob("intake_hashes-*.parquet"))
    assert intake_hashes.bucket_count([f.name for f in files]) is None
    assert intake_hashes.to_search([f.name for f in files], folded("second text")) == [f.name for f in files]
    assert intake_hashes.search(files, folded("second text")) == ["b"]
    # a bucketed layout missing a file is not taken for whole
    assert intake_hashes.bucket_count(["intake_hashes-00000-of-00002.parquet"]) is None
    assert intake_hashes.bucket_count(["intake_hashes-00001-of-00002.parquet",
                                       "intake_hashes-00000-of-00002.parquet"]) == 2
