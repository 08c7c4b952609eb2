"""Exact dedup's shuffle: one file per task per round, whole or not at all when a writer is SIGKILLed."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.curation import exact_dedup as ed
from kiln.dedup.shuffle import SHUFFLE, is_whole, read_shuffle
from kiln.engine import SERIAL, ProcessPool

PARTS, ROWS, BUCKETS = 6, 40, 8


def _digest(n: int) -> str:
    return hashlib.sha256(str(n).encode()).hexdigest()


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """Two sources (tiers 2 and 1) of 3 parts each; value n repeats across parts and sources."""
    root = tmp_path_factory.mktemp("parts")
    paths = []
    for p in range(PARTS):
        values = [(p * 7 + r * 3) % 90 for r in range(ROWS)]
        path = root / f"p{p}.parquet"
        pq.write_table(pa.table({"doc_id": [f"d{p}-{r}" for r in range(ROWS)],
                                 "content_hash": [_digest(v) for v in values]}), path)
        paths.append(str(path))
    return [ed.HashSource("a", 2, tuple(paths[:3])), ed.HashSource("b", 1, tuple(paths[3:]))]


def _expected(sources) -> list[dict[int, str]]:
    """A second implementation: walk every row in (tier, source, part, row) order; a hash seen before is a
    duplicate of the first doc_id that had it."""
    rows = []
    for i, s in enumerate(sources):
        for j, path in enumerate(s.parts):
            t = pq.read_table(path).to_pylist()
            rows += [(s.tier, i, j, r, d["content_hash"], d["doc_id"]) for r, d in enumerate(t)]
    first: dict[str, str] = {}
    out = [[{} for _ in s.parts] for s in sources]
    for tier, i, j, r, h, doc_id in sorted(rows):
        if h in first:
            out[i][j][r] = first[h]
        else:
            first[h] = doc_id
    return [d for per_source in out for d in per_source]


def _decisions(where, sources) -> list[dict[int, str]]:
    parts = [pq.read_table(path) for s in sources for path in s.parts]
    return [ed.duplicates_in(w, t.column("content_hash").to_pylist(), t.column("doc_id").to_pylist())
            for w, t in zip([w for per_source in where for w in per_source], parts)]


def _files(scratch: Path) -> list[Path]:
    """The files a reader could list (hidden temporary names excluded)."""
    return [p for p in scratch.rglob("*") if p.is_file() and not p.name.startswith(".")]


@pytest.mark.parametrize("engine", [SERIAL, ProcessPool(workers=2)], ids=["serial", "pool2"])
def test_one_shuffle_file_per_task_per_round_and_decisions_of_a_plain_walk(sources, tmp_path, monkeypatch, engine):
    monkeypatch.setattr(ed, "ROWS_PER_BUCKET", PARTS * ROWS // BUCKETS)  # 8 buckets
    where = ed.find_duplicates(sources, tmp_path / "scratch", engine, progress=False)
    decisions = _decisions(where, sources)
    assert decisions == _expected(sources)
    assert sum(map(len, decisions)) > 50  # the case has many duplicates, across parts and sources
    files = _files(tmp_path / "scratch")
    # A file per (part, bucket) would be 48 in round 1 alone; one per task: 6 scatter + 8 decide.
    assert len(files) == PARTS + BUCKETS
    assert sorted(p.parent.name for p in files) == ["decided"] * BUCKETS + ["scatter"] * PARTS
    # A second call finds every decide file whole: it rewrites nothing.
    stamps = {p: p.stat().st_mtime_ns for p in files}
    assert _decisions(ed.find_duplicates(sources, tmp_path / "scratch", engine, progress=False), sources) == decisions
    assert {p: p.stat().st_mtime_ns for p in _files(tmp_path / "scratch")} == stamps


_HELD_WRITER = """
import json, sys, time
from pathlib import Path
import kiln.dedup.shuffle as shuffle
from kiln.curation import exact_dedup as ed
args = json.loads(sys.argv[1])
def hold(src, dst):  # the file is written, not yet renamed: signal the test, then wait to be killed
    Path(args["ready"]).write_text(str(src))
    time.sleep(60)
shuffle.os.replace = hold
ed._scatter(ed._Scatter(args["path"], 0, 2, 0, args["buckets"], args["scratch"], "content_hash"))
"""


def _default_signals():  # an earlier test (pytest-xdist) may leave them ignored
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def test_a_sigkilled_writer_leaves_nothing_a_reader_reads_and_the_retry_decides_the_same(sources, tmp_path,
                                                                                          monkeypatch):
    monkeypatch.setattr(ed, "ROWS_PER_BUCKET", PARTS * ROWS // BUCKETS)
    scratch, ready = tmp_path / "scratch", tmp_path / "ready"
    args = {"ready": str(ready), "path": sources[0].parts[0], "buckets": BUCKETS, "scratch": str(scratch)}
    proc = subprocess.Popen([sys.executable, "-c", _HELD_WRITER, json.dumps(args)], preexec_fn=_default_signals,
                            cwd=Path(__file__).resolve().parents[3])
    try:
        deadline = time.monotonic() + 30
        while not (ready.exists() and ready.read_text()):  # created, then written: not at once
            assert proc.poll() is None, "the writer exited before it wrote"
            assert time.monotonic() < deadline, "the writer never got to its rename"
            time.sleep(0.02)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    tmp = Path(ready.read_text())
    assert tmp.is_file() and tmp.name.startswith(".") and tmp.stat().st_size > 0  # written, under a hidden name
    assert _files(scratch) == []  # nothing a reader lists
    # A decide task now refuses to decide from an incomplete round instead of missing the part's rows.
    with pytest.raises(RuntimeError, match="0 of 6 scatter files"):
        ed._decide(ed._Decide(0, str(scratch), "content_hash", (0, 3, 6), PARTS))
    # The run resumed: the killed task is redone, whole, and the decisions are those of an uninterrupted run.
    where = ed.find_duplicates(sources, scratch, SERIAL, progress=False)
    assert _decisions(where, sources) == _expected(sources)
    assert len(_files(scratch)) == PARTS + BUCKETS
    # The same files, byte for byte, as a run nobody interrupted.
    ed.find_duplicates(sources, tmp_path / "uninterrupted", SERIAL, progress=False)
    assert {p.relative_to(scratch): p.read_bytes() for p in _files(scratch)} == {
        p.relative_to(tmp_path / "uninterrupted"): p.read_bytes() for p in _files(tmp_path / "uninterrupted")}


def test_a_file_cut_short_is_not_whole(tmp_path):
    """What a power loss can leave under a renamed name (the file is not flushed): empty or short, never whole."""
    path = tmp_path / "p.parquet"
    pq.write_table(pa.table({"doc_id": ["x", "y", "z"], "content_hash": [_digest(1), _digest(1), _digest(2)]}), path)
    ed.find_duplicates([ed.HashSource("a", 1, (str(path),))], tmp_path / "s", SERIAL, progress=False)
    (written,) = (tmp_path / "s" / "scatter").glob(f"*{SHUFFLE}")
    data = written.read_bytes()
    assert is_whole(written)
    cut = tmp_path / "cut.shuffle"
    for size in range(len(data)):
        cut.write_bytes(data[:size])
        assert not is_whole(cut), size


def test_the_stale_shuffles_of_a_refresh_are_its_own_not_a_longer_keys(tmp_path):
    """Refresh `week1`'s glob `.shared-exact-dedup-week1-*` also found refresh `week1-fix`'s shuffle, which its run then
    removed (when not in use at that instant): the other refresh's next source made it again."""
    from kiln.curation.exact_dedup import stale_shuffles

    current = tmp_path / ".shared-exact-dedup-week1-0123456789abcdef"
    names = [".shared-exact-dedup-week1-fedcba9876543210",  # week1's, for inputs changed since: stale
             ".shared-exact-dedup-week1-fix-0123456789abcdef", ".shared-exact-dedup-week1-fix-fedcba9876543210",
             ".shared-exact-dedup-week10-0123456789abcdef"]
    for path in [current, *(tmp_path / n for n in names)]:
        path.mkdir()
    (tmp_path / f"{names[0]}.lock").write_text("")
    assert stale_shuffles(current) == [tmp_path / names[0]]


def test_a_text_repeated_in_every_part_sends_one_row_per_part_to_its_bucket(tmp_path):
    """A page copied thousands of times (a template, an error page) is one hash: its bucket's decide task held every
    copy, however many buckets the corpus had. Only each part's first row of a hash is shuffled (6 rows here, of
    60); a part's later copies repeat what its first row repeats, and the decisions are the plain walk's."""
    texts = [["x"] * 18 + ["a", "b"], ["x"] * 20, ["b"] * 5 + ["c"] * 15]
    paths = []
    for p, part in enumerate(texts):
        paths.append(str(tmp_path / f"p{p}.parquet"))
        pq.write_table(pa.table({"doc_id": [f"d{p}-{r}" for r in range(len(part))],
                                 "content_hash": [_digest(ord(t)) for t in part]}), paths[-1])
    sources = [ed.HashSource("a", 2, tuple(paths[:1])), ed.HashSource("b", 1, tuple(paths[1:]))]
    where = ed.find_duplicates(sources, tmp_path / "scratch", SERIAL, progress=False)
    schema = pa.schema([("doc_id", pa.string()), ("content_hash", pa.string()), ("tier", pa.int32()),
                        ("source", pa.int32()), ("part", pa.int32()), ("row", pa.int64())])
    assert read_shuffle(tmp_path / "scratch" / ed.SCATTER, schema).num_rows == 3 + 1 + 2
    decisions = _decisions(where, sources)
    assert decisions == _expected(sources)
    # source b (tier 1) wins: part 1's first x is kept, every other x is its copy; b's first copy is part 2's row 0
    assert decisions[0][0] == "d1-0" and decisions[1][19] == "d1-0" and 0 not in decisions[1]
    assert decisions[0][19] == "d2-0" and decisions[2][4] == "d2-0" and sum(map(len, decisions)) == 60 - 4
