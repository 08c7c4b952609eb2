"""Crash windows of the store: a writer SIGKILLed at any step of a commit leaves readers the old version or the
new one, never none and never a mix."""

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import kiln.common.storage as storage
from kiln.common.manifest import MANIFEST_NAME, write_file_atomic, write_json_atomic
from kiln.common.storage import Store, part_name, resume_part, write_parquet_atomic

REPO = Path(__file__).resolve().parents[3]

# A writer of version 2 that kills itself (SIGKILL: no cleanup, no atexit) just before its k-th rename; a
# negative k never kills and prints how many renames a commit makes.
_WRITER = """
import os, signal, sys
from pathlib import Path
import pyarrow as pa
from kiln.common.storage import Store
kill_at, renames, real_replace = int(sys.argv[2]), [0], os.replace
def replace(src, dst):
    if renames[0] == kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    renames[0] += 1
    real_replace(src, dst)
os.replace = replace
with Store(Path(sys.argv[1])).staging("a", "p") as w:
    w.write("documents", pa.table({"x": [2, 3]}))
    w.write("documents", pa.table({"x": [4]}))
    w.commit(code_version="2", config={}, inputs={}, counts={})
print(renames[0])
"""


def _commit_v1(root: Path) -> str:
    with Store(root).staging("a", "p") as w:
        w.write("documents", pa.table({"x": [1]}))
        return w.commit(code_version="1", config={}, inputs={}, counts={}).data_version


def _write_v2(root: Path, kill_at: int) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _WRITER, str(root), str(kill_at)], cwd=REPO, capture_output=True,
                          text=True)


def test_a_writer_killed_at_any_rename_leaves_the_old_or_the_new_version(tmp_path):
    _commit_v1(tmp_path / "probe")
    done = _write_v2(tmp_path / "probe", -1)
    assert done.returncode == 0, done.stderr
    renames = int(done.stdout)  # parts, manifest, and the two renames of the swap
    assert renames >= 5
    seen = []
    for k in range(renames + 1):
        root = tmp_path / f"kill-{k}"
        v1 = _commit_v1(root)
        writer = _write_v2(root, k)
        assert writer.returncode == (-9 if k < renames else 0), writer.stderr
        reader = Store(root)  # a fresh reader, in another process than the writer
        manifest = reader.manifest("a", "p")
        rows = reader.read_table("a", "p").column("x").to_pylist()
        assert (manifest.data_version, rows) in [(v1, [1]), (manifest.data_version, [2, 3, 4])]
        seen.append("old" if manifest.data_version == v1 else "new")
        if seen[-1] == "new":
            assert manifest.code_version == "2"
        # What the killed writer left (a version folder never linked, a link file, a staging folder) goes with the
        # next commit; the version it replaced stays for its readers, marked.
        with Store(root).staging("a", "p") as w:
            w.write("documents", pa.table({"x": [5]}))
            w.commit(code_version="3", config={}, inputs={}, counts={})
        assert sorted(_versions_beside(root / "a" / "p").values()) == \
            ["current", "replaced"] + ["replaced"] * (seen[-1] == "new"), _versions_beside(root / "a" / "p")
    # Killed at any rename up to the swap's second (which publishes): the old version (the last case is the one
    # that used to leave none: the old folder renamed aside, the new one not yet in); not killed: the new one.
    assert seen == ["old"] * renames + ["new"], seen


def test_parts_past_the_five_digit_padding_keep_their_write_order(tmp_path):
    """part_name pads to 5 digits: part 100000 is named 'part-100000', which sorts before 'part-99999' as text. A
    dataset's files are its parts in write order, so readers meet part 99999 before part 100000."""
    with Store(tmp_path).staging("a", "p") as w:
        for index in (100000, 99999, 2, 10):
            pq.write_table(pa.table({"x": [index]}), w.dir / part_name("documents", index))
        w.commit(code_version="1", config={}, inputs={}, counts={})
    store = Store(tmp_path)
    assert [p.name for p in store.files("a", "p", "documents")] == [
        "part-00002.parquet", "part-00010.parquet", "part-99999.parquet", "part-100000.parquet"]
    assert store.read_table("a", "p").column("x").to_pylist() == [2, 10, 99999, 100000]


def test_temp_files_of_dead_tasks_are_not_published_at_any_depth(tmp_path):
    """A task killed mid-write leaves '.name.tmp-*' beside its output, in subfolders too (decisions/, index/buckets/):
    the published folder holds only the manifest's files."""
    with Store(tmp_path).staging("a", "p") as w:
        (w.dir / "index" / "buckets").mkdir(parents=True)
        pq.write_table(pa.table({"x": [1]}), w.dir / "index" / "buckets" / "buckets-00000.parquet")
        (w.dir / "index" / "buckets" / ".buckets-00001.parquet.tmp-dead").write_bytes(b"half")
        (w.dir / ".part-00000.parquet.tmp-dead").write_bytes(b"half")
        manifest = w.commit(code_version="1", config={}, inputs={}, counts={})
    published = sorted(p.relative_to(tmp_path / "a" / "p").as_posix() for p in (tmp_path / "a" / "p").rglob("*")
                       if p.is_file())
    assert [f.path for f in manifest.files] == ["index/buckets/buckets-00000.parquet"]
    assert published == ["_manifest.json", "index/buckets/buckets-00000.parquet"]


def test_the_commit_takes_rows_and_sha256_from_the_part_tasks_markers_in_subfolders_too(tmp_path, monkeypatch):
    """Part tasks hashed what they wrote: the driver lists the dataset and reads nothing again. A file no marker
    names (written outside a part task) is read."""
    with Store(tmp_path).staging("a", "p") as w:
        for name in ("part-00000.parquet", "index/buckets/buckets-00000.parquet"):
            out = w.dir / name
            out.parent.mkdir(parents=True, exist_ok=True)
            resume_part(out, lambda out=out: write_parquet_atomic(out, pa.table({"x": [1, 2, 3]})) or {})
        (w.dir / "notes.txt").write_text("by hand")
        expected = {f: hashlib.sha256((w.dir / f).read_bytes()).hexdigest()
                    for f in ("part-00000.parquet", "index/buckets/buckets-00000.parquet", "notes.txt")}
        hashed = []
        real = storage.sha256_file
        monkeypatch.setattr(storage, "sha256_file", lambda path: hashed.append(Path(path).name) or real(path))
        manifest = w.commit(code_version="1", config={}, inputs={}, counts={})
    assert hashed == ["notes.txt"]
    assert {f.path: f.sha256 for f in manifest.files} == expected
    assert {f.path: f.rows for f in manifest.files} == {"part-00000.parquet": 3,
                                                         "index/buckets/buckets-00000.parquet": 3, "notes.txt": None}


def test_a_part_task_is_resumed_only_while_every_file_its_marker_names_is_whole(tmp_path):
    """A part task's files are not flushed one by one, so after a power loss a file its marker names may be cut
    short, zeroed or gone, and the marker itself emptied: each makes the task run again."""
    calls = []
    kept, rejected = tmp_path / "part-00000.parquet", tmp_path / "rejected-00000.parquet"

    def run() -> dict:
        calls.append(1)
        write_parquet_atomic(kept, pa.table({"x": list(range(100))}))
        write_parquet_atomic(rejected, pa.table({"x": [1]}))
        return {"documents": 100}

    assert resume_part(kept, run) == {"documents": 100} and len(calls) == 1
    assert resume_part(kept, run) == {"documents": 100} and len(calls) == 1  # whole: the marker stands
    whole = rejected.read_bytes()
    marker = tmp_path / ".done" / "part-00000.parquet.json"
    damages = [lambda: rejected.write_bytes(whole[:-10]),  # cut short
               lambda: rejected.write_bytes(bytes(len(whole))),  # its size, but zeroes: no footer
               rejected.unlink,
               lambda: marker.write_text('{"result": {"documents": 1')]  # the marker cut short
    for k, damage in enumerate(damages, start=2):
        damage()
        assert resume_part(kept, run) == {"documents": 100} and len(calls) == k
        assert pq.read_table(rejected).column("x").to_pylist() == [1]
    marker.write_text(json.dumps({"documents": 7}))  # an earlier Kiln's marker: its files were flushed one by one
    assert resume_part(kept, run) == {"documents": 7} and len(calls) == len(damages) + 1
    sizes = {kept.name: kept.stat().st_size, rejected.name: rejected.stat().st_size}
    marker.write_text(json.dumps({"result": {"documents": 8}, "files": sizes}))  # one naming sizes alone
    assert resume_part(kept, run) == {"documents": 8} and len(calls) == len(damages) + 1


def test_the_commit_takes_each_part_tasks_rows_and_sha256_from_its_marker(tmp_path, monkeypatch):
    """The task hashed and counted what it wrote, in parallel with the others: the commit reads again only the
    files no marker describes as they are (one written outside a part task, one rewritten since)."""
    store = Store(tmp_path / "store")
    with store.staging("raw", "src") as writer:
        a, b = writer.next_path("documents"), writer.next_path("documents")
        for path, n in ((a, 3), (b, 5)):
            resume_part(path, lambda path=path, n=n: write_parquet_atomic(path, pa.table({"x": list(range(n))})) or {})
        c = writer.write("documents", pa.table({"x": [9]}))
        write_parquet_atomic(b, pa.table({"x": list(range(50))}))  # not what b's task left: another size
        hashed, sha256_file = [], storage.sha256_file
        monkeypatch.setattr(storage, "sha256_file", lambda path: hashed.append(Path(path).name) or sha256_file(path))
        manifest = writer.commit(code_version="test", config={}, inputs={}, counts={})
    assert sorted(hashed) == sorted([b.name, c.name])
    final = store.dataset_dir("raw", "src")
    assert [(f.path, f.rows) for f in manifest.files] == [(a.name, 3), (b.name, 50), (c.name, 1)]
    for f in manifest.files:
        assert f.sha256 == hashlib.sha256((final / f.path).read_bytes()).hexdigest()
        assert f.bytes == (final / f.path).stat().st_size


def test_a_part_tasks_files_reach_the_disk_with_the_commit_before_its_manifest(tmp_path, monkeypatch):
    flushed, committed, started = [], [], []
    monkeypatch.setattr(storage, "fsync_file", lambda path: flushed.append(Path(path).name))
    start_writeback = storage.start_writeback
    monkeypatch.setattr(storage, "start_writeback",
                        lambda path: (started.append(Path(path).name), start_writeback(path)))
    flush_to_disk = storage.flush_to_disk
    monkeypatch.setattr(storage, "flush_to_disk",
                        lambda folder: (committed.append((folder / MANIFEST_NAME).exists()), flush_to_disk(folder)))
    with Store(tmp_path / "store").staging("raw", "src") as writer:
        path = writer.next_path("documents")

        def task() -> dict:
            write_parquet_atomic(path, pa.table({"x": [1]}))
            return {"documents": 1}

        resume_part(path, task)
        assert flushed == []  # a part task's file: left to the commit, its writing to disk started
        assert len(started) == 1 and started[0].startswith(f".{path.name}.tmp-")
        writer.write("documents", pa.table({"x": [2]}))  # outside a part task: flushed at once
        assert len(flushed) == 1
        writer.commit(code_version="test", config={}, inputs={}, counts={"documents": 2})
    assert committed == [False]  # flushed once, before the manifest existed


def test_flush_to_disk_fsyncs_every_file_and_folder_under_it_and_nothing_else(tmp_path, monkeypatch):
    """Only what the folder publishes: a syncfs(2) would also write out the scratch beside it, and hidden entries
    (a stage's scratch folder, completion markers, a dead writer's temporary file) are never published."""
    fsynced = []
    monkeypatch.setattr(storage, "fsync_file", lambda path: fsynced.append(("file", Path(path))))
    monkeypatch.setattr(storage, "fsync_dir", lambda path: fsynced.append(("dir", Path(path))))
    out = tmp_path / "out"
    for name in ("decisions/decisions-00000.parquet", "index/docs/indexed-00000.parquet", "index/_index.json"):
        (out / name).parent.mkdir(parents=True, exist_ok=True)
        (out / name).write_bytes(b"x")
    (tmp_path / "scratch.arrow").write_bytes(b"y")
    for hidden in (".near_dedup/keys/00000.shuffle", ".done/decisions-00000.parquet.json",
                   "decisions/.decisions-00001.parquet.tmp-dead"):
        (out / hidden).parent.mkdir(parents=True, exist_ok=True)
        (out / hidden).write_bytes(b"z")
    storage.flush_to_disk(out)
    assert sorted(fsynced) == sorted([("dir", out), ("dir", out / "decisions"), ("dir", out / "index"),
                                      ("dir", out / "index" / "docs"),
                                      ("file", out / "decisions/decisions-00000.parquet"),
                                      ("file", out / "index/docs/indexed-00000.parquet"),
                                      ("file", out / "index/_index.json")])


def _plain(final: Path) -> None:
    """Make a dataset a plain folder, as stores wrote them before versioned folders."""
    version = storage._version_of(final)
    final.unlink()
    version.rename(final)


def test_a_reader_between_a_swaps_two_renames_waits_for_the_new_version(tmp_path, monkeypatch):
    """A swap over a plain dataset folder (a store from before versioned folders) renames it aside, then the link
    in, holding the swap lock across both. A reader that found the folder, then finds no manifest because the swap
    began in between (it used to read "not materialized"), waits for the lock and reads the new version."""
    import threading
    import time

    root = tmp_path / "store"
    _commit_v1(root)
    final = root / "a" / "p"
    _plain(final)
    with Store(tmp_path / "other").staging("a", "p") as w:  # a second version, staged elsewhere
        w.write("documents", pa.table({"x": [2]}))
        v2 = w.commit(code_version="2", config={}, inputs={}, counts={}).data_version
    staged = final.with_name(".p.staging-test")
    shutil.copytree(tmp_path / "other" / "a" / "p", staged)
    renamed_aside = threading.Event()

    def swap() -> None:  # _swap_in's two renames, with a pause between them
        with storage._swap_lock(final):
            final.rename(final.with_name(".p.old-test"))
            renamed_aside.set()
            time.sleep(0.5)
            staged.rename(final)

    restore, writer = storage._restore_if_swapped_out, threading.Thread(target=swap)

    def found_then_swapped(path):  # the reader finds the folder; the writer's swap starts right after
        restore(path)
        if not writer.is_alive() and not renamed_aside.is_set():
            writer.start()
            renamed_aside.wait()

    monkeypatch.setattr(storage, "_restore_if_swapped_out", found_then_swapped)
    assert Store(root).manifest("a", "p").data_version == v2
    writer.join()


def test_a_cleanup_listing_a_staging_folder_its_writer_then_swaps_in_goes_on(tmp_path, monkeypatch):
    """Two writers of one dataset: the second's cleanup lists the first's staging folder, which the first swaps in
    (and lets go of its lock) before the cleanup takes that lock; the cleanup used to fail on the rename, after the
    second's own version was already in (so an S3 store never got it pushed)."""
    final = tmp_path / "a" / "p"
    staging = final.with_name(".p.staging-first")
    staging.mkdir(parents=True)
    real = storage.lock_then_remove

    def swapped_in_meanwhile(path, wait=True):
        if str(path) == f"{staging}.lock":
            staging.rename(final)  # the first writer's swap, between the listing and the lock
        return real(path, wait)

    monkeypatch.setattr(storage, "lock_then_remove", swapped_in_meanwhile)
    storage._remove_stale_staging(final)
    assert final.is_dir() and not list(final.parent.glob(".p.trash-*"))


def test_after_two_crashes_the_restore_takes_the_newest_whole_copy(tmp_path):
    """A writer killed while removing its old copy leaves one with its manifest but not all its files; a second
    writer killed between its renames leaves its own old copy aside too. The restore takes the newest copy whose
    files are all there, not the half-removed one (whose manifest may even be the newer). (Plain folders: a store
    from before versioned folders, whose swaps renamed the old folder aside.)"""
    root = tmp_path / "store"
    _commit_v1(root)
    final = root / "a" / "p"
    _plain(final)
    whole = final.with_name(".p.old-whole")
    final.rename(whole)
    half = final.with_name(".p.old-half")
    shutil.copytree(whole, half)
    manifest = json.loads((half / MANIFEST_NAME).read_text())
    (half / MANIFEST_NAME).write_text(json.dumps({**manifest, "created_at": "2999-01-01T00:00:00Z"}))
    for entry in manifest["files"]:
        (half / entry["path"]).unlink()  # removed before the kill; the manifest was not
    reader = Store(root)
    assert reader.read_table("a", "p").column("x").to_pylist() == [1]
    assert not whole.exists()


# A writer publishing versions 1..n of a dataset of four parts, every row of version v holding v.
_VERSIONS = """
import sys
from pathlib import Path
import pyarrow as pa
from kiln.common.storage import Store
store = Store(Path(sys.argv[1]), keep_replaced_s=0)
for v in range(1, int(sys.argv[2]) + 1):
    with store.staging("a", "p") as w:
        for _ in range(4):
            w.write("documents", pa.table({"x": [v] * 2000}))
        w.commit(code_version=str(v), config={}, inputs={}, counts={})
"""


def test_a_reader_reads_one_version_whole_while_another_process_replaces_it(tmp_path):
    """A reader lists a dataset's files, then opens them one by one; a writer in another process publishes new
    versions meanwhile. Each read holds one version's rows only (before versioned folders, a read that spanned a
    swap got the first parts of one version and the rest of the next, or a missing file). Replaced versions are
    removed at once here (keep_replaced_s=0), so a read that outlived its version could only fail, never mix."""
    root = tmp_path / "store"
    _commit_v1(root)
    writer = subprocess.Popen([sys.executable, "-c", _VERSIONS, str(root), "60"], cwd=REPO, stderr=subprocess.PIPE,
                              text=True)
    reader, seen, failed = Store(root), set(), 0
    while writer.poll() is None:
        try:
            rows = reader.read_table("a", "p").column("x").to_pylist()
        except FileNotFoundError:  # the version this read pinned was removed before it opened every file
            failed += 1
            continue
        assert len(set(rows)) == 1 and len(rows) in (1, 8000), (sorted(set(rows)), len(rows))
        seen.add(rows[0])
    assert writer.wait() == 0, writer.stderr.read()
    assert len(seen) >= 5, seen  # the reads overlapped the writer's commits
    assert reader.read_table("a", "p").column("x").to_pylist() == [60] * 8000


def _versions_beside(final: Path) -> dict[str, str]:
    """The hidden entries beside a dataset: version folders as current / replaced (with a marker) / orphan (the
    history of manifests is not a version: test_every_version_published_is_described_after_its_files_are_gone)."""
    current = storage._version_of(final)
    out = {}
    for p in final.parent.glob(f".{final.name}.*"):
        if p.name.endswith(".replaced") or p == storage._history_dir(final):
            continue
        out[p.name] = ("current" if p == current else "replaced" if p.with_name(p.name + ".replaced").exists()
                       else "other")
    return out


def test_every_version_published_is_described_after_its_files_are_gone(tmp_path):
    """Consumers record the versions they read; lineage must describe them after they are replaced and removed."""
    store = Store(tmp_path, keep_replaced_s=0)  # a replaced version goes at the next commit
    made = []
    for n in (1, 2, 3):
        with store.staging("a", "p") as w:
            w.write("documents", pa.table({"x": [n]}))
            example = {"doc_id": f"d{n}", "note": "", "excerpt": f"dropped text {n}"}
            made.append(w.commit(code_version=str(n), config={"n": n}, inputs={"up/p": f"{n:020x}"},
                                 counts={"documents": 1},
                                 stats={"docs_in": 1, "examples": {"too_short": [example]},
                                        "per_step": {"len": {"docs_in": 1, "examples": {"x": [example]}}}}))
    assert list(_versions_beside(tmp_path / "a" / "p").values()) == ["current"]  # the first two's files are gone
    for m in made:
        found = store.manifest_at("a", "p", m.data_version)
        assert (found.config, found.inputs, found.files, found.code_version, found.created_at) == \
            (m.config, m.inputs, m.files, m.code_version, m.created_at)
    # The removal examples, the one part of a manifest that may quote a document, are not kept past the version.
    old = store.manifest_at("a", "p", made[0].data_version)
    assert old.stats == {"docs_in": 1, "per_step": {"len": {"docs_in": 1}}}
    assert store.manifest_at("a", "p", made[2].data_version) == made[2]  # the current one: whole
    assert store.manifest_at("a", "p", "0" * 20) is None  # never published
    assert store.manifest_at("a", "p", "../p/_manifest") is None  # not a data version: never a path to open
    assert store.manifest_at("a", "q", made[0].data_version) is None  # another dataset's
    # Oldest first, in the order they were published, though the three came within a second (to the second, their
    # times were equal and their order in the history arbitrary).
    assert made[0].created_at < made[1].created_at < made[2].created_at
    assert [m.data_version for m in store.history("a", "p")] == [m.data_version for m in made]


def test_the_history_keeps_a_versions_record_files_and_nothing_else(tmp_path):
    """A checkpoint stays answerable after its shards are replaced: the history keeps each version's record files
    (member lists, a run's exposure and replay removals: doc ids and counts), never its documents."""
    store = Store(tmp_path, keep_replaced_s=0)
    made = []
    for n in (1, 2):
        with store.staging("a", "p") as w:
            w.write("documents", pa.table({"text": [f"text {n}"]}))
            w.write("members", pa.table({"doc_id": [f"d{n}"], "copies": [n]}))
            pq.write_table(pa.table({"doc_id": [f"d{n}"], "reads": [n]}), w.dir / "exposure.parquet")
            pq.write_table(pa.table({"doc_id": [f"r{n}"]}), w.dir / "replay_removed.parquet")
            made.append(w.commit(code_version=str(n), config={}, inputs={}, counts={}))
            kept = {f.path: tmp_path / "a" / ".p.history" / made[-1].data_version / f.path for f in made[-1].files}
            # While the version is current its record files are hard links to its own: no second copy on disk.
            assert all(os.stat(kept[f]).st_nlink == 2 for f in ("members-00000.parquet", "exposure.parquet"))
    first, second = made
    assert {f.path: f.role for f in first.files} == {
        "part-00000.parquet": "documents", "members-00000.parquet": "members", "exposure.parquet": "exposure",
        "replay_removed.parquet": "replay_removed"}
    assert list(_versions_beside(tmp_path / "a" / "p").values()) == ["current"]  # the first one's files are gone
    sha = {f.path: f.sha256 for f in first.files}
    for path, column, value in (("members-00000.parquet", "doc_id", "d1"), ("exposure.parquet", "reads", 1),
                                ("replay_removed.parquet", "doc_id", "r1")):
        found = store.version_file("a", "p", first.data_version, path)
        assert found.parent.name == first.data_version and hashlib.sha256(found.read_bytes()).hexdigest() == sha[path]
        assert pq.read_table(found).column(column).to_pylist() == [value]
    assert store.version_file("a", "p", first.data_version, "part-00000.parquet") is None  # documents are not kept
    assert store.version_file("a", "p", second.data_version, "part-00000.parquet") == \
        store.snapshot("a", "p").folder / "part-00000.parquet"  # the current version: its own files
    assert store.version_file("a", "p", "0" * 20, "members-00000.parquet") is None  # never published
    assert store.version_file("a", "p", first.data_version, "../../p/_manifest.json") is None  # never outside
    # The same version committed again (same files, same data version) keeps what the history holds.
    with store.staging("a", "p") as w:
        w.write("documents", pa.table({"text": ["text 2"]}))
        w.write("members", pa.table({"doc_id": ["d2"], "copies": [2]}))
        pq.write_table(pa.table({"doc_id": ["d2"], "reads": [2]}), w.dir / "exposure.parquet")
        pq.write_table(pa.table({"doc_id": ["r2"]}), w.dir / "replay_removed.parquet")
        assert w.commit(code_version="2", config={}, inputs={}, counts={}).data_version == second.data_version
    assert sorted(p.name for p in (tmp_path / "a" / ".p.history").iterdir()) == sorted(
        [first.data_version, f"{first.data_version}.json", second.data_version, f"{second.data_version}.json"])


def test_a_replaced_version_is_kept_for_its_readers_then_removed(tmp_path):
    from kiln.common.config.storage import StorageSettings

    root = tmp_path / "store"
    store = Store(root)  # keeps a replaced version an hour, as the config's default says
    assert store.keep_replaced_s == StorageSettings().keep_replaced_minutes * 60 == 3600
    _commit_v1(root)
    pinned = store.snapshot("a", "p")
    with store.staging("a", "p") as w:
        w.write("documents", pa.table({"x": [2]}))
        w.commit(code_version="2", config={}, inputs={}, counts={})
    assert pinned.read_table().column("x").to_pylist() == [1]  # the reader that pinned v1 still reads it
    assert store.read_table("a", "p").column("x").to_pylist() == [2]
    final = root / "a" / "p"
    assert sorted(_versions_beside(final).values()) == ["current", "replaced"]

    # An hour later, any commit to the store (here another dataset's) removes it.
    marker = storage._replaced_marker(pinned.folder)
    os.utime(marker, (marker.stat().st_mtime - 3601,) * 2)
    with store.staging("b", "src/r1") as w:
        w.write("documents", pa.table({"x": [9]}))
        w.commit(code_version="1", config={}, inputs={}, counts={})
    assert list(_versions_beside(final).values()) == ["current"] and not marker.exists()
    assert not pinned.folder.exists()

    # Kept for no time: removed by the commit that replaces it.
    eager = Store(root, keep_replaced_s=0)
    with eager.staging("b", "src/r1") as w:
        w.write("documents", pa.table({"x": [10]}))
        w.commit(code_version="2", config={}, inputs={}, counts={})
    assert list(_versions_beside(root / "b" / "src" / "r1").values()) == ["current"]


def test_a_plain_dataset_folder_from_before_versions_is_replaced_by_a_link(tmp_path):
    root = tmp_path / "store"
    _commit_v1(root)
    final = root / "a" / "p"
    _plain(final)
    assert Store(root).read_table("a", "p").column("x").to_pylist() == [1]  # still read as it is
    with Store(root).staging("a", "p") as w:
        w.write("documents", pa.table({"x": [2]}))
        w.commit(code_version="2", config={}, inputs={}, counts={})
    assert final.is_symlink() and list(_versions_beside(final).values()) == ["current"]
    assert Store(root).read_table("a", "p").column("x").to_pylist() == [2]


def test_a_version_replaced_for_a_removal_request_goes_at_once_unless_held(tmp_path):
    """forget_replaced: the version replaced may hold documents a takedown removed; it is not kept an hour for
    readers, only for one that holds it (a training run), until it lets go."""
    from kiln.tokens.shard_format import hold_folder

    root = tmp_path / "store"
    store = Store(root)  # keeps replaced versions an hour
    _commit_v1(root)
    final, first = root / "a" / "p", store.snapshot("a", "p").folder
    held = hold_folder(first)
    for x in (2, 3):
        with store.staging("a", "p") as w:
            w.write("documents", pa.table({"x": [x]}))
            w.commit(code_version=str(x), config={}, inputs={}, counts={}, forget_replaced=True)
        assert first.is_dir()  # held
        assert sorted(_versions_beside(final).values()) == ["current", "replaced"]  # only the held one kept
    os.close(held)
    with store.staging("a", "p") as w:
        w.write("documents", pa.table({"x": [4]}))
        w.commit(code_version="4", config={}, inputs={}, counts={}, forget_replaced=True)
    assert list(_versions_beside(final).values()) == ["current"] and not first.exists()


def test_a_partition_whose_key_extends_anothers_keeps_its_versions(tmp_path):
    """Refresh keys may hold '.' and '-': `corpus.v-2` and `corpus.staging-1` are keys, and their versions are
    `.corpus.v-2.v-<id>` and `.corpus.staging-1.v-<id>`. Commits of `corpus` took them for its own unpublished
    version and stale staging folder, and removed both: the other partitions read "not materialized"."""
    store = Store(tmp_path)
    for partition, rows in (("corpus.v-2", [1, 2]), ("corpus.staging-1", [3]), ("corpus", [4]), ("corpus", [5])):
        with store.staging("a", partition) as w:
            w.write("documents", pa.table({"x": rows}))
            w.commit(code_version="1", config={}, inputs={}, counts={})
    assert Store(tmp_path).read_table("a", "corpus.v-2").column("x").to_pylist() == [1, 2]
    assert Store(tmp_path).read_table("a", "corpus.staging-1").column("x").to_pylist() == [3]
    assert Store(tmp_path).read_table("a", "corpus").column("x").to_pylist() == [5]
    assert (tmp_path / "a" / ".corpus.v-2.history").is_dir() and (tmp_path / "a" / ".corpus.staging-1.history").is_dir()


def test_a_commits_cleanup_waits_for_another_writers_swap(tmp_path, monkeypatch):
    """Two writers of one dataset: writer A is in its swap (its link made, not yet renamed over the dataset) when
    writer B's post-commit cleanup runs. The cleanup removed A's link, and A's commit failed with FileNotFoundError
    after it had marked the current version replaced. It now takes the swap lock, so it runs after A's swap."""
    import threading
    import time

    root = tmp_path / "store"
    _commit_v1(root)
    final = root / "a" / "p"
    link_made, real_symlink, cleanup = threading.Event(), os.symlink, []

    def symlink_then_pause(src, dst, *args, **kwargs):
        real_symlink(src, dst, *args, **kwargs)
        if ".link-" in str(dst) and threading.current_thread() is threading.main_thread():
            link_made.set()
            time.sleep(0.5)  # B's cleanup runs now, in another thread (it holds no Python lock A needs)

    def other_writers_cleanup():
        link_made.wait(10)
        storage._remove_stale_staging(final)
        cleanup.append("done")

    monkeypatch.setattr(os, "symlink", symlink_then_pause)
    b = threading.Thread(target=other_writers_cleanup)
    b.start()
    with Store(root).staging("a", "p") as w:
        w.write("documents", pa.table({"x": [7]}))
        w.commit(code_version="2", config={}, inputs={}, counts={})
    b.join(10)
    assert cleanup == ["done"]
    assert Store(root).read_table("a", "p").column("x").to_pylist() == [7]
    assert not list(final.parent.glob(".p.link-*"))


def test_a_code_version_follows_the_data_files_its_code_reads(tmp_path):
    """The filter stage's built-in blocklist and bad-words list decide as much as its code: editing one changes its
    code_version (Dagster then shows the stage stale), as editing the code does; the same inputs, the same version."""
    from kiln.common.manifest import code_version

    words = tmp_path / "words.txt"
    words.write_text("alpha\n")
    before = code_version("kiln.common.stats", data=(words,))
    assert code_version("kiln.common.stats", data=(words,)) == before
    assert code_version("kiln.common.stats") != before
    words.write_text("alpha\nbeta\n")
    assert code_version("kiln.common.stats", data=(words,)) != before


@pytest.mark.parametrize("write", [lambda p: write_json_atomic(p, '{"new": 1}'),
                                   lambda p: write_file_atomic(p, lambda f: f.write(b"new"))], ids=["json", "file"])
def test_a_failed_atomic_write_leaves_the_old_file_and_no_temporary_one(tmp_path, monkeypatch, write):
    """A full disk (here: the flush fails) leaves the file as it was and nothing else in its folder."""
    (tmp_path / "x.json").write_text("old")

    def full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(OSError, match="No space left"):
        write(tmp_path / "x.json")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["x.json"] and (tmp_path / "x.json").read_text() == "old"
