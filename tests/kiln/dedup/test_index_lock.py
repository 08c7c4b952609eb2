"""The bucket index takes the store's lock for a commit, whoever writes it: two processes committing refreshes to one
store at once end with the decisions and indexes a sequential run gives (the second decided against the first's
index, not without it), and `kiln dedup migrate-index` waits while the lock is held."""

from __future__ import annotations

import multiprocessing
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from kiln.common.storage import IncompleteDataset, Store
from kiln.dedup.bucket_index import INDEX, index_commit, index_lock, read_index_meta
from kiln.dedup.buckets import decide_distributed
from kiln.dedup.near import KEPT, NEAR_DUPLICATE
from kiln.governance.refresh import LandedFile, register_refresh
from tests.kiln.dedup.test_dedup import edited, signature_table, vocabulary
from tests.kiln.dedup.test_dedup_buckets import NEAR, assert_same, families, family_texts, reference, write_parts
from tests.kiln.dedup.test_dedup_migrate import NEAR as OLD_NEAR
from tests.kiln.dedup.test_dedup_migrate import _config, old_refresh
from tests.kiln.dedup.test_dedup_migrate import corpora as old_corpora
from tests.old_near_dedup import open_index

REPO = Path(__file__).resolve().parents[3]


def corpora():
    """r0: families; r1: a re-sent slice of r0 and new documents; r2: edited copies of r1's new documents, which are
    near-duplicates only for a writer that sees r1's index."""
    first = families(2)
    new = family_texts(4, 10)["web"]
    rng = np.random.default_rng(3)
    vocab = vocabulary(rng, 5_000)
    second = [("web", 2, first[0][2].slice(0, 12)), ("n-web", 2, signature_table("n-web", new))]
    third = [("copies", 1, signature_table("copies", [" ".join(edited(t.split(), 1, rng, vocab)) for t in new[:15]]))]
    return [first, second, third]


def write_refresh(root: str, refresh: str, parts: list[str], sources: dict, marks: str | None = None,
                  hold: bool = False) -> None:
    """What the dedup_index asset does for a refresh: under `index_commit`, decide against the earlier refreshes'
    indexes and commit. `marks`: touch <refresh>-before (about to take the lock) and <refresh>-read (earlier indexes
    read); `hold`: then wait for `go` before deciding."""
    store, marks_dir = Store(Path(root)), Path(marks) if marks else None
    if marks_dir:
        (marks_dir / f"{refresh}-before").touch()
    with index_commit(store, refresh) as (writer, earlier):
        if marks_dir:
            (marks_dir / f"{refresh}-read").touch()
        while hold and not (marks_dir / "go").exists():
            time.sleep(0.05)
        work = writer.scratch("near_dedup")
        stats = decide_distributed([Path(p) for p in parts], sources, [p for _, p in earlier], work, writer.dir, NEAR,
                                   refresh, partitions=3)
        shutil.rmtree(work)
        writer.commit(code_version="test", config={}, counts={"documents": stats["documents"]},
                      inputs={f"{INDEX}/{r}": store.manifest(INDEX, r).data_version for r, _ in earlier},
                      stats={"earlier": [r for r, _ in earlier]})


def _wait_for(path: Path, seconds: float) -> bool:
    deadline = time.monotonic() + seconds
    while not path.exists():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def test_two_writers_at_once_commit_as_one_after_the_other(tmp_path):
    """Writer A (refresh r1) is inside the lock and paused when writer B (refresh r2, another process) starts. B must
    neither read the earlier indexes nor commit until A has committed; then it decides against r1's index too. The
    decisions of every refresh are those of the old single-process near_dedup over r0, r1, r2 in turn."""
    root, marks = tmp_path / "data", tmp_path / "marks"
    marks.mkdir()
    store = Store(root)
    refreshes = corpora()
    parts = {}
    for i, tables in enumerate(refreshes):
        key = f"r{i}"
        register_refresh(store, None if i == 0 else {"web": [LandedFile(key, key, 1, "t")]},
                         "initial" if i == 0 else "cli", key=key)
        paths, sources = write_parts(tmp_path / f"sig-{key}", tables, 7)
        parts[key] = ([str(p) for p in paths], sources)
    write_refresh(str(root), "r0", *parts["r0"])

    spawn = multiprocessing.get_context("spawn")
    a = spawn.Process(target=write_refresh, args=(str(root), "r1", *parts["r1"], str(marks), True))
    b = spawn.Process(target=write_refresh, args=(str(root), "r2", *parts["r2"], str(marks)))
    a.start()
    try:
        assert _wait_for(marks / "r1-read", 120), "writer A never took the lock"
        b.start()
        assert _wait_for(marks / "r2-before", 120), "writer B never started"
        # B is at the lock; without it, B reads the earlier indexes (only r0's) at once and commits r2.
        assert not _wait_for(marks / "r2-read", 3) and b.is_alive()
        assert store.manifest_or_none(INDEX, "r2") is None
        (marks / "go").touch()
        a.join(120)
        b.join(120)
    finally:
        for p in (a, b):
            if p.is_alive():
                p.kill()
    assert a.exitcode == 0 and b.exitcode == 0

    want = reference(tmp_path / "old", refreshes)
    for i, key in enumerate(("r0", "r1", "r2")):
        got = store.read_table(INDEX, key, "decisions")
        assert_same(got, want[i])
        meta = read_index_meta(store.dataset_dir(INDEX, key) / "index")
        assert meta["batch"] == key and meta["documents"] == got.column("status").to_pylist().count(KEPT)
    assert store.manifest(INDEX, "r2").stats["earlier"] == ["r0", "r1"]
    # r2's copies of r1's new documents were found through r1's index: both writers' documents, one index.
    r2 = store.read_table(INDEX, "r2", "decisions").to_pylist()
    assert sum(r["status"] == NEAR_DUPLICATE and r["duplicate_of"].startswith("n-web") for r in r2) >= 10


def test_a_refresh_is_decided_only_after_every_earlier_one(tmp_path):
    """Dagster runs refresh partitions in any order, and a refresh is decided against the earlier ones only: r2
    decided while r1 has no index, then r1, would never compare them, and a document in both would be kept twice.
    r2 is refused, naming r1, and nothing is committed; in order, each one decides against the ones before."""
    store = Store(tmp_path / "data")
    parts = {}
    for i, tables in enumerate(corpora()[:2]):
        key = f"r{i}"
        register_refresh(store, None if i == 0 else {"web": [LandedFile(key, key, 1, "t")]},
                         "initial" if i == 0 else "cli", key=key)
        paths, sources = write_parts(tmp_path / f"sig-{key}", tables, 7)
        parts[key] = ([str(p) for p in paths], sources)
    with pytest.raises(IncompleteDataset, match=r"dedup_index\[r1\] is decided against every earlier refresh, but "
                                                r"dedup_index\[r0\] has not been materialized: materialize it first"):
        write_refresh(str(tmp_path / "data"), "r1", *parts["r1"])
    assert store.manifest_or_none(INDEX, "r1") is None
    write_refresh(str(tmp_path / "data"), "r0", *parts["r0"])  # the first refresh: nothing before it
    write_refresh(str(tmp_path / "data"), "r1", *parts["r1"])
    assert store.manifest(INDEX, "r1").stats["earlier"] == ["r0"]


def test_migrate_index_waits_for_the_lock(tmp_path):
    """The command, while another writer holds the store's index lock: it says it waits, commits nothing, and
    migrates once the lock is released."""
    store = Store(tmp_path / "data")
    first, _, _ = old_corpora()
    with open_index(OLD_NEAR, tmp_path / "dedup_index") as idx:
        old_refresh(store, idx, "r0", first)
    before = store.manifest(INDEX, "r0").data_version
    command = [sys.executable, "-c", "import sys; from kiln.cli import main; sys.exit(main(sys.argv[1:]))", "dedup",
               "migrate-index", "--home", str(tmp_path), "--config", str(_config(tmp_path))]
    with index_lock(store):
        proc = subprocess.Popen(command, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            said = ""
            while "waiting for" not in said and (line := proc.stderr.readline()):  # until it reaches the lock
                said = line
            assert "waiting for" in said and "dedup_index.lock" in said, said
            time.sleep(1)
            assert proc.poll() is None and store.manifest(INDEX, "r0").data_version == before
            assert not (store.dataset_dir(INDEX, "r0") / "index").exists()
        except BaseException:
            proc.kill()
            raise
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 0, err
    assert "dedup_index[r0]: bucket index of" in out
    assert read_index_meta(store.dataset_dir(INDEX, "r0") / "index")["batch"] == "r0"
