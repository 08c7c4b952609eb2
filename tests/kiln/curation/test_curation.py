"""The curation engine without Dagster: conservation at every stage, cross-source exact dedup, PII."""

import hashlib
import json
from pathlib import Path

import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.common.config import parse_config
from kiln.common.storage import Store
from kiln.curation.exact_dedup import HashSource, exact_dedup
from kiln.curation.pipeline import content_hash, filter_documents, ingest, profile_steps
from kiln.curation.readers import read_source
from kiln.engine import SERIAL, ProcessPool
from tests.conftest import SERIAL_ENGINE, in_fresh_process, prose, write_jsonl
from tests.store_files import leftovers

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture
def corpus(tmp_path):
    """Two sources sharing a document (case/whitespace differ), one with junk, PII and a broken line."""
    shared = prose(100)
    write_jsonl(tmp_path / "wiki" / "a.jsonl", [
        {"id": "w1", "text": prose(1)},
        {"id": "w2", "text": shared.upper().replace(" ", "  ")},   # same text after case/space folding
        {"id": "w3", "text": prose(3) + " Write to jane.doe@example.com or call (415) 555-0134."},
    ])
    write_jsonl(tmp_path / "web" / "a.jsonl", [
        {"id": "x1", "text": shared},
        {"id": "x2", "text": prose(2)},
        {"id": "x3", "text": "Click here to buy the best cheap watches online today.\n" * 40},  # junk
        {"id": "x4", "text": prose(2)},                              # exact copy inside the source
        "{broken json",
    ])
    raw = {
        "sources": [
            {"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC-BY", "domain": "web",
             "quality_tier": 3, "profile": "prose"},
            {"name": "wiki", "kind": "jsonl", "path": str(tmp_path / "wiki"), "license": "CC-BY-SA",
             "domain": "reference", "quality_tier": 1, "profile": "prose"},
        ],
        "profiles": {"prose": ["language", "gopher_repetition", "gopher_quality"]},
        "reading": {"rows_per_part": 2},
        "engine": SERIAL_ENGINE,
    }
    return parse_config(raw), Store(tmp_path / "store")


def run_all(config, store, engine=SERIAL, shared_shuffle=None):
    """Every stage; exact dedup in one shuffle per source (as a library caller may), or in `shared_shuffle`, one
    for all sources (as the curated asset does)."""
    stats = {}
    for s in config.sources:
        with store.staging("raw", s.name) as w:
            r = ingest(s, config.reading, w, progress=False)
            w.commit(code_version="t", config={}, inputs={}, counts={}, stats=r.to_dict())
        with store.staging("filtered", s.name) as w:
            f = filter_documents(store.files("raw", s.name, "documents"), profile_steps(config, s.name),
                                 config.curation.exact_dedup, w, engine, progress=False)
            w.commit(code_version="t", config={}, inputs={}, counts={}, stats=f.to_dict())
        stats[s.name] = (r, f)
    sources = [HashSource(s.name, s.quality_tier, tuple(map(str, store.files("filtered", s.name, "documents"))))
               for s in config.sources]
    dups = {}
    for i, s in enumerate(config.sources):
        with store.staging("curated", s.name) as w:
            c = exact_dedup(sources, i, w, shared_shuffle or w.scratch("shuffle"), engine, progress=False)
            w.commit(code_version="t", config={}, inputs={}, counts={}, stats=c.to_dict())
        stats[s.name] += (c,)
        rejected = store.read_table("curated", s.name, "rejected")
        dups |= dict(zip(rejected.column("doc_id").to_pylist(), rejected.column("duplicate_of").to_pylist())) \
            if rejected.num_rows else {}
    return stats, dups


def rows(store, asset, source, role):
    return sum(pq.ParquetFile(p).metadata.num_rows for p in store.files(asset, source, role))


def test_conservation_holds_on_every_stage(corpus):
    config, store = corpus
    stats, _ = run_all(config, store)
    for s in config.sources:
        raw, filt, cur = stats[s.name]
        assert raw.docs_in == rows(store, "raw", s.name, "documents") + rows(store, "raw", s.name, "quarantine")
        assert filt.docs_in == rows(store, "raw", s.name, "documents")
        assert filt.docs_in == rows(store, "filtered", s.name, "documents") + rows(store, "filtered", s.name, "rejected")
        assert cur.docs_in == rows(store, "curated", s.name, "documents") + rows(store, "curated", s.name, "rejected")
    assert stats["web"][0].steps["read"].dropped == {"malformed_json": 1}


def test_cross_source_exact_dedup_keeps_the_better_tier_and_names_it(corpus):
    config, store = corpus
    _, dups = run_all(config, store)
    web = store.read_table("curated", "web", "rejected").to_pylist()
    wiki_ids = {r["doc_id"]: r for r in store.read_table("curated", "wiki").to_pylist()}
    by_meta = {r["doc_id"]: r for r in store.read_table("raw", "web").to_pylist()}
    rejected = {json_id(by_meta[r["doc_id"]]): r for r in web}
    # x1 is the same text as wiki's w2 (case/whitespace folded): the tier-1 source keeps it.
    assert rejected["x1"]["reason"] == "exact_dedup.duplicate"
    assert rejected["x1"]["duplicate_of"] in wiki_ids
    # x4 repeats x2 inside the web source: the earlier one is kept.
    assert rejected["x4"]["duplicate_of"] == next(d for d, r in by_meta.items() if json_id(r) == "x2")
    assert len(dups) == 2


def test_every_document_read_leaves_the_hash_of_its_text_as_read(corpus):
    """The filter stage keeps, for every document it read, kept or removed, exact dedup's hash of its text as it came
    in (normalized): the junk page the filters dropped and w3 before its PII was redacted included; and, for w3, the
    only text a filter rewrote, the hash of its text as written too. Worked by hand for these ASCII texts: lowercased,
    whitespace runs as one space, blake2b-128. These few rows make one bucket file, sorted by hash."""
    config, store = corpus
    run_all(config, store)

    def folded(text):
        return hashlib.blake2b(" ".join(text.lower().split()).encode(), digest_size=16).hexdigest()

    wiki = {r["doc_id"]: r["text"] for r in store.read_table("raw", "wiki").to_pylist()}
    kept = {r["doc_id"]: r for r in store.read_table("filtered", "wiki").to_pylist()}
    redacted = next(r for r in kept.values() if "<EMAIL>" in r["text"])  # w3: its curated hash is the redacted text's
    assert redacted["content_hash"] == folded(redacted["text"]) != folded(wiki[redacted["doc_id"]])
    for source in ("web", "wiki"):
        raw = {r["doc_id"]: r["text"] for r in store.read_table("raw", source).to_pylist()}
        [path] = store.files("filtered", source, "intake_hashes")
        assert path.name == "intake_hashes-00000-of-00001.parquet"
        rows = [(r["doc_id"], r["content_hash"]) for r in pq.read_table(path).to_pylist()]
        as_written = {(redacted["doc_id"], folded(redacted["text"]))} if source == "wiki" else set()
        assert set(rows) == {(d, folded(t)) for d, t in raw.items()} | as_written
        assert len(rows) == len(raw) + len(as_written) and rows == sorted(rows, key=lambda r: (r[1], r[0]))


def json_id(row):
    import json

    return json.loads(row["meta"])["id"]


def test_filters_drop_with_reasons_and_pii_is_redacted(corpus):
    config, store = corpus
    stats, _ = run_all(config, store)
    rejected = store.read_table("filtered", "web", "rejected").to_pylist()
    assert [r["reason"] for r in rejected] == ["gopher_repetition.dup_line_frac"]
    # No text after intake: the junk document's length and hash (blake2b-128 of its UTF-8 text), never the text.
    junk = "Click here to buy the best cheap watches online today.\n" * 40
    assert rejected[0]["text"] is None and rejected[0]["chars"] == 55 * 40
    assert rejected[0]["text_hash"] == hashlib.blake2b(junk.encode(), digest_size=16).hexdigest()
    assert all(r["stage"] == "filter" for r in rejected)
    texts = " ".join(store.read_table("curated", "wiki").column("text").to_pylist())
    assert "jane.doe@example.com" not in texts and "<EMAIL>" in texts and "<PHONE>" in texts
    assert stats["wiki"][1].steps["pii"].counts == {"email": 1, "phone": 1}


@pytest.mark.parametrize("keep", ["none", "excerpt", "full"])
def test_a_dropped_document_leaves_no_pii_and_only_the_text_the_config_allows(tmp_path, keep):
    """A junk page full of contact details is dropped by the filters, before the PII step: its rejected row and
    the stage's removal examples hold none of its text by default, and only redacted text when asked to."""
    line = "Call Jane at (415) 555-0134 or write to jane.doe@example.com today.\n"
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": "junk", "text": line * 40}, {"id": "ok", "text": prose(1)}])
    config = parse_config({
        "sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC0",
                     "domain": "web", "profile": "prose"}],
        "profiles": {"prose": ["gopher_repetition"]}, "engine": SERIAL_ENGINE,
        "curation": {"keep_rejected_text": keep}})
    store = Store(tmp_path / "store")
    with store.staging("raw", "web") as w:
        w.commit(code_version="t", config={}, inputs={}, counts={},
                 stats=ingest(config.sources[0], config.reading, w, progress=False).to_dict())
    with store.staging("filtered", "web") as w:
        stats = filter_documents(store.files("raw", "web", "documents"), profile_steps(config, "web"),
                                 config.curation.exact_dedup, w, progress=False,
                                 rejected_text=config.curation.keep_rejected_text)
        w.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())
    (row,) = store.read_table("filtered", "web", "rejected").to_pylist()
    assert row["reason"] == "gopher_repetition.dup_line_frac" and row["chars"] == len(line) * 40
    (example,) = stats.examples["gopher_repetition.dup_line_frac"]
    if keep == "none":
        assert row["text"] is None and "excerpt" not in example
    else:
        # 68 characters per line: the 200-character excerpt is the first lines, with placeholders for the PII.
        expected = (line.replace("(415) 555-0134", "<PHONE>").replace("jane.doe@example.com", "<EMAIL>") * 40)
        assert row["text"] == (expected[:200] if keep == "excerpt" else expected)
        assert example["excerpt"] == expected[:200]
    # Everything the stage persisted or reported, Parquet decoded: the kept part (redacted), the rejected table, the
    # manifest (its stats and examples), the stats Dagster metadata is made from.
    folder = store.root / "filtered"
    stored = [json.dumps(pq.read_table(f).to_pylist()) for f in folder.rglob("*.parquet")]
    stored += [f.read_text() for f in folder.rglob("*.json")] + [json.dumps(stats.to_dict())]
    assert len(stored) >= 4 and not [pii for pii in ("555-0134", "jane.doe", "example.com") if pii in "".join(stored)]


def test_parallel_filtering_matches_serial(corpus, tmp_path):
    config, store = corpus
    run_all(config, store)
    serial = store.read_table("filtered", "web").to_pylist()
    parallel_store = Store(tmp_path / "parallel")
    run_all(config, parallel_store, ProcessPool(workers=2))
    assert parallel_store.read_table("filtered", "web").to_pylist() == serial


class CountingEngine:
    """In this process, noting each round's tasks."""

    workers = 1

    def __init__(self):
        self.rounds = []

    def map_parts(self, fn, tasks, *, desc, **kwargs):
        self.rounds.append((desc, len(tasks)))
        return SERIAL.map_parts(fn, tasks, desc=desc, **kwargs)

    def describe(self):
        return {"engine": "counting"}


def test_sources_of_a_refresh_share_one_shuffle_with_the_same_decisions(corpus, tmp_path):
    """The shuffle rounds (scatter, decide) run once for all sources; each source's kept and rejected parts are
    byte for byte those of a shuffle of its own."""
    config, store = corpus
    run_all(config, store)
    shared, engine = Store(tmp_path / "shared"), CountingEngine()
    run_all(config, shared, engine, shared_shuffle=tmp_path / "shuffle")
    filtered_parts = sum(len(shared.files("filtered", s.name, "documents")) for s in config.sources)
    scatter = [n for desc, n in engine.rounds if desc.endswith("hash buckets")]
    assert scatter == [filtered_parts]  # once, over both sources' parts (not once per source)
    assert [desc for desc, _ in engine.rounds].count("exact dedup") == 2  # each source applies its decisions
    for s in config.sources:
        for role in ("documents", "rejected"):
            assert [p.read_bytes() for p in shared.files("curated", s.name, role)] == \
                [p.read_bytes() for p in store.files("curated", s.name, role)]


def test_content_hash_folds_case_and_whitespace_only():
    assert content_hash("Hello   World\n") == content_hash("hello world")
    assert content_hash("hello world.") != content_hash("hello world")
    assert content_hash("Hello", lowercase=False) != content_hash("hello", lowercase=False)


def test_content_hash_leaves_out_bidi_controls_but_not_letters():
    import hashlib

    def blake(t):  # the key worked by hand: the text as it reads, lowercased, whitespace collapsed
        return hashlib.blake2b(t.encode("utf-8"), digest_size=16).hexdigest()

    ar = "يبلغ عدد سكان المدينة (٢٠ مليون) نسمة."
    # the same sentence as a CMS writes it: RLM around the parenthesis, an ALM before the digits, an isolate pair
    marked = "\u2067يبلغ عدد سكان المدينة \u200f(\u061c٢٠ مليون)\u200f نسمة.\u2069"
    assert content_hash(marked) == content_hash(ar) == blake(ar)
    assert content_hash("\u200eHello  World\u200e", lowercase=False) == blake("Hello World")
    # Persian ی and ک are other letters than Arabic ي and ك: not one key
    assert content_hash("کتاب یک") != content_hash("كتاب يك")
    # English: the same key as before
    assert content_hash("Hello   World\n") == blake("hello world")


def test_crash_mid_write_leaves_previous_version_intact(tmp_path):
    import pyarrow as pa

    store = Store(tmp_path)
    with store.staging("a", "p") as w:
        w.write("documents", pa.table({"x": [1]}))
        first = w.commit(code_version="1", config={}, inputs={}, counts={})
    with pytest.raises(RuntimeError):
        with store.staging("a", "p") as w:
            w.write("documents", pa.table({"x": [2, 3]}))
            raise RuntimeError("killed mid-write")
    assert store.manifest("a", "p").data_version == first.data_version
    assert store.read_table("a", "p").column("x").to_pylist() == [1]
    assert leftovers(tmp_path / "a") == []  # no staging or half files left behind


_KILLED_WRITER = """
import os, signal, sys
import pyarrow as pa
from pathlib import Path
from kiln.common.storage import Store
w = Store(Path(sys.argv[1])).staging("a", "p")
w.write("documents", pa.table({"x": [9]}))
os.kill(os.getpid(), signal.SIGKILL)
"""


def test_a_commit_removes_staging_folders_no_live_writer_holds(tmp_path):
    """Failed resumable attempts under inputs since replaced, and SIGKILLed writers, leave staging folders; the
    next commit of that dataset removes them, but never the folder of a writer still at work."""
    import subprocess
    import sys

    import pyarrow as pa

    store = Store(tmp_path)
    with pytest.raises(RuntimeError):
        with store.staging("a", "p", resume="inputs-v1") as w:
            w.write("documents", pa.table({"x": [1]}))
            raise RuntimeError("step failed")  # kept for a re-run with the same inputs
    killed = subprocess.run([sys.executable, "-c", _KILLED_WRITER, str(tmp_path)], cwd=REPO)
    assert killed.returncode == -9
    staging = lambda: sorted(p.name for p in (tmp_path / "a").glob(".p.staging-*") if p.is_dir())  # noqa: E731
    assert len(staging()) == 2 and ".p.staging-inputs-v1" in staging()

    live = store.staging("a", "p", resume="inputs-v3")  # another run, still writing
    live.write("documents", pa.table({"x": [3]}))
    with store.staging("a", "p", resume="inputs-v2") as w:
        w.write("documents", pa.table({"x": [2]}))
        w.commit(code_version="2", config={}, inputs={}, counts={})
    assert staging() == [".p.staging-inputs-v3"]
    # No lock files or old copies left
    assert leftovers(tmp_path / "a") == [".p.staging-inputs-v3", ".p.staging-inputs-v3.lock"]
    with live:
        live.commit(code_version="3", config={}, inputs={}, counts={})
    assert store.read_table("a", "p").column("x").to_pylist() == [3]
    assert leftovers(tmp_path / "a") == []


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.integers(0, 10**7), min_size=1, max_size=300), st.integers(1, 5))
def test_length_histogram_is_small_mergeable_and_close(lengths, parts):
    """Per-part statistics carry a histogram, not every length: merged, it is what one histogram of all gives;
    its log2 buckets are the exact ones, and its median is within an eighth of an octave of numpy's."""
    import math
    from collections import Counter

    from kiln.common.stats import LengthHistogram

    merged = LengthHistogram()
    for k in range(parts):
        part = LengthHistogram()
        part.extend(lengths[k::parts])
        merged.merge(LengthHistogram.from_dict(part.to_dict()))
    whole = LengthHistogram()
    whole.extend(lengths)
    assert merged == whole and len(merged) == len(lengths)
    assert merged.octaves() == Counter(int(math.log2(max(n, 1))) for n in lengths)
    lower_median = sorted(lengths)[(len(lengths) - 1) // 2]
    assert merged.median() <= max(lower_median, 1) and merged.median() >= lower_median / 2 ** (1 / 8) - 1


def test_intake_reads_files_in_parallel_and_keeps_each_doc_id_once(tmp_path):
    """Three files, one task each: an id repeated within a file and across files keeps its first occurrence in
    file order (a.jsonl, b.jsonl, c.jsonl) and quarantines the rest, exactly as one sequential reader would;
    any engine gives the same bytes. Hand-worked: a: 1 2 3 4 5, b: 4 6 {broken} 2 7, c: 7 8 8 1."""
    def record(i, tag):
        return {"id": str(i), "text": f"{tag}: {prose(i)}"}

    write_jsonl(tmp_path / "src" / "a.jsonl", [record(i, "a") for i in (1, 2, 3, 4, 5)])
    write_jsonl(tmp_path / "src" / "b.jsonl", [record(4, "b"), record(6, "b"), "{broken", record(2, "b"), record(7, "b")])
    write_jsonl(tmp_path / "src" / "c.jsonl", [record(7, "c"), record(8, "c"), record(8, "c2"), record(1, "c")])
    config = parse_config({"sources": [{"name": "src", "kind": "jsonl", "path": str(tmp_path / "src"),
                                        "license": "CC-BY", "domain": "web", "profile": "p"}],
                           "profiles": {"p": []}, "reading": {"rows_per_part": 2}, "engine": SERIAL_ENGINE})
    fingerprints = []
    for k, engine in enumerate([SERIAL, ProcessPool(2)]):
        store = Store(tmp_path / f"store-{k}")
        with store.staging("raw", "src") as w:
            stats = ingest(config.sources[0], config.reading, w, engine, progress=False)
            w.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())
        kept = store.read_table("raw", "src").to_pylist()
        assert [(r["text"].split(":")[0], json.loads(r["meta"])["locator"]) for r in kept] == [
            ("a", "id:1"), ("a", "id:2"), ("a", "id:3"), ("a", "id:4"), ("a", "id:5"), ("b", "id:6"), ("b", "id:7"),
            ("c", "id:8")]
        quarantine = store.read_table("raw", "src", "quarantine").to_pylist()
        assert sorted((q["reason"], q["locator"]) for q in quarantine) == sorted(
            [("duplicate_doc_id", f"id:{i}") for i in (4, 2, 7, 8, 1)] + [("malformed_json", "b.jsonl#L3")])
        assert (stats.docs_in, stats.docs_out) == (14, 8)
        assert stats.steps["read"].dropped == {"duplicate_doc_id": 5, "malformed_json": 1}
        assert len(stats.lengths_out) == 8 and stats.chars_out == sum(len(r["text"]) for r in kept)
        fingerprints.append({p.name: p.read_bytes() for p in (store.root / "raw" / "src").rglob("*.parquet")})
    assert fingerprints[0] == fingerprints[1]


def test_a_one_file_source_is_checked_for_repeated_ids_without_holding_them_all(tmp_path):
    """A source of one file was read by one task that kept every doc id in a set (about 110 B a record, growing
    with the file). Its repeated ids are found by the doc-id shuffle as a source of many files' are: the peak is a
    part plus a bucket (ROWS_PER_BUCKET, made small here so that both sizes fill several), whatever the file."""
    code = f"""
import json, tracemalloc
from pathlib import Path
from kiln.common.config import parse_config
from kiln.common.storage import Store
from kiln.curation import exact_dedup
from kiln.curation.pipeline import ingest
from kiln.engine import SERIAL

exact_dedup.ROWS_PER_BUCKET = 1_000
root, peaks = Path({str(tmp_path)!r}), []
for n in (500, 5_000, 30_000):  # the first warms up (the imports a first ingest makes)
    path = root / f"one-{{n}}.jsonl"
    with path.open("w", encoding="utf-8") as f:
        for i in range(n):
            f.write(json.dumps({{"id": f"doc-{{i:012d}}-with-a-fairly-long-native-identifier", "text": f"t{{i}}"}}))
            f.write("\\n")
        f.write(json.dumps({{"id": "doc-000000000007-with-a-fairly-long-native-identifier", "text": "again"}}))
    config = parse_config({{"sources": [{{"name": "s", "kind": "jsonl", "path": str(path), "license": "CC-BY",
                                        "domain": "web", "profile": "p"}}],
                           "profiles": {{"p": []}}, "reading": {{"rows_per_part": 1000}}}})
    store = Store(root / f"store-{{n}}")
    tracemalloc.start()
    with store.staging("raw", "s") as w:
        stats = ingest(config.sources[0], config.reading, w, SERIAL, progress=False)
        w.commit(code_version="t", config={{}}, inputs={{}}, counts={{}}, stats={{}})
    peaks.append(tracemalloc.get_traced_memory()[1] / 2**20)
    tracemalloc.stop()
    excerpts = [q["excerpt"] for q in store.read_table("raw", "s", "quarantine").to_pylist()]
    assert (stats.docs_in, stats.docs_out, dict(stats.steps["read"].dropped), excerpts) == (
        n + 1, n, {{"duplicate_doc_id": 1}}, ["again"]), (n, stats.to_dict(), excerpts)
print(json.dumps(peaks))
"""
    peaks = in_fresh_process(code)
    assert peaks[2] < peaks[1] + 1, peaks  # measured +0.01 MiB; with a set of the ids, +3.3 MiB


def test_a_capped_source_is_read_by_one_task_across_its_files(tmp_path):
    """max_documents counts across files in order: the cap needs one reader, and gets it."""
    write_jsonl(tmp_path / "src" / "a.jsonl", [{"id": str(i), "text": prose(i)} for i in range(3)])
    write_jsonl(tmp_path / "src" / "b.jsonl", [{"id": str(i), "text": prose(i)} for i in range(3, 6)])
    config = parse_config({"sources": [{"name": "src", "kind": "jsonl", "path": str(tmp_path / "src"),
                                        "license": "CC-BY", "domain": "web", "max_documents": 4,
                                        "profile": "p"}], "profiles": {"p": []}})
    store = Store(tmp_path / "store")
    with store.staging("raw", "src") as w:
        stats = ingest(config.sources[0], config.reading, w, ProcessPool(2), progress=False)
        w.commit(code_version="t", config={}, inputs={}, counts={})
    assert stats.docs_out == 4
    assert [json.loads(m)["locator"] for m in store.read_table("raw", "src").column("meta").to_pylist()] == [
        "id:0", "id:1", "id:2", "id:3"]


def test_files_of_one_document_are_read_many_to_a_task(tmp_path):
    """A folder of 7 text files at rows_per_part 3 is 3 read tasks (3 + 3 + 1 files) and 3 parts, not 7; the
    documents, in file order, are those one sequential reader gives, on every engine."""
    for i in range(7):
        (tmp_path / "site").mkdir(exist_ok=True)
        (tmp_path / "site" / f"page-{i}.txt").write_text(f"page {i}: {prose(i)}", encoding="utf-8")
    config = parse_config({"sources": [{"name": "site", "kind": "text", "path": str(tmp_path / "site"),
                                        "license": "CC-BY", "domain": "web", "profile": "p"}],
                           "profiles": {"p": []}, "reading": {"rows_per_part": 3}, "engine": SERIAL_ENGINE})
    sequential = [d.text for d in read_source(config.sources[0], config.reading)]
    for k, engine in enumerate([SERIAL, ProcessPool(2)]):
        store = Store(tmp_path / f"store-{k}")
        with store.staging("raw", "site") as w:
            stats = ingest(config.sources[0], config.reading, w, engine, progress=False)
            w.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())
        assert store.read_table("raw", "site").column("text").to_pylist() == sequential
        assert sorted(p.name for p in (store.root / "raw" / "site").glob("part-*.parquet")) == [
            "part-00000-00000.parquet", "part-00001-00000.parquet", "part-00002-00000.parquet"]
