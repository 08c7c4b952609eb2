"""Datasets on S3, against moto's server on loopback: uploads with the manifest last,
read-back into an empty cache, tampered objects refused, a crash mid-upload, and the bucket check."""

import json
import os
import threading
import time

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.common.manifest import MANIFEST_NAME, Manifest, sha256_file
from kiln.common.remote import CorruptRemoteFile, LostLock, MissingBucket, S3Remote, StorageError
from kiln.common.storage import COMMIT_LOCK, IncompleteDataset, Store
from tests.s3 import _moto_server, s3_client, s3_endpoint  # noqa: F401 (fixtures)

BUCKET = "kiln-test"


class Recording:
    """A boto3 client that logs each call (when it completes) and can crash after `fail_after` uploads (the commit
    lock's objects and its conditional-write probe are not counted: `names` leaves them out)."""

    def __init__(self, client, fail_after: int | None = None):
        self._client, self.fail_after, self.calls, self._lock = client, fail_after, [], threading.Lock()

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if not callable(attr):
            return attr

        def call(*args, **kwargs):
            key = kwargs.get("Key") or (args[2] if name == "upload_file" else None)
            if name in ("upload_file", "put_object") and self.fail_after is not None and not _of_the_lock(key):
                with self._lock:
                    uploads = len(self.names("upload_file", "put_object"))
                    if uploads >= self.fail_after:
                        raise ConnectionError("simulated crash: connection lost mid-upload")
                    self.calls.append((name, key))  # reserve the slot, so parallel uploads count too
                return attr(*args, **kwargs)
            result = attr(*args, **kwargs)
            with self._lock:
                self.calls.append((name, key))
            return result

        return call

    def names(self, *wanted: str) -> list[str]:
        return [key for n, key in self.calls if n in wanted and not _of_the_lock(key or "")]


def _of_the_lock(key: str) -> bool:
    return key.endswith(COMMIT_LOCK) or "/.kiln-probe-" in key


@pytest.fixture
def s3(s3_endpoint):  # noqa: F811
    client = s3_client(s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    return client


def remote(client, prefix="kiln") -> S3Remote:
    return S3Remote.connect(client, BUCKET, prefix)


def write_version(store: Store, seed: int, rows: int = 50):
    """A dataset with two Parquet parts and a binary artifact in a subfolder (like a checkpoint export)."""
    rng = np.random.default_rng(seed)
    with store.staging("curated_documents", "web") as writer:
        for part in range(2):
            writer.write("documents", pa.table({"doc_id": [f"d{seed}-{part}-{i}" for i in range(rows)],
                                                "text": [f"text {seed} {part} {i}" for i in range(rows)]}))
        (writer.dir / "model").mkdir()
        (writer.dir / "model" / "weights.bin").write_bytes(rng.bytes(300_000 + seed))
        return writer.commit(code_version="test", config={"seed": seed}, inputs={}, counts={"documents": 2 * rows})


def object_bytes(client, key: str) -> bytes:
    return client.get_object(Bucket=BUCKET, Key=key)["Body"].read()


def test_commit_uploads_every_file_then_the_manifest_last(s3, tmp_path):
    client = Recording(s3)
    manifest = write_version(Store(tmp_path / "a", remote(client)), seed=1)
    uploads = client.names("upload_file", "put_object")
    base = "kiln/curated_documents/web"
    # The files, then the version's entry in the history of manifests, then the manifest that publishes it.
    assert uploads[-1] == f"{base}/{MANIFEST_NAME}" and len(uploads) == len(manifest.files) + 2
    assert uploads[-2] == f"{base}/_history/{manifest.data_version}.json"
    assert sorted(uploads[:-2]) == sorted(f"{base}/{manifest.data_version}/{f.path}" for f in manifest.files)
    assert Manifest.from_dict(json.loads(object_bytes(s3, uploads[-2]))) == manifest  # no examples to leave out
    assert {f.path for f in manifest.files} == {"part-00000.parquet", "part-00001.parquet", "model/weights.bin"}
    local = tmp_path / "a" / "curated_documents" / "web"
    assert object_bytes(s3, f"{base}/{MANIFEST_NAME}") == (local / MANIFEST_NAME).read_bytes()
    for f in manifest.files:
        assert object_bytes(s3, f"{base}/{manifest.data_version}/{f.path}") == (local / f.path).read_bytes()


def test_a_fresh_store_with_an_empty_cache_reads_the_dataset_back_byte_identical(s3, tmp_path):
    written = write_version(Store(tmp_path / "writer", remote(s3)), seed=2)
    original = tmp_path / "writer" / "curated_documents" / "web"
    client = Recording(s3)
    reader = Store(tmp_path / "reader", remote(client))
    assert reader.manifest("curated_documents", "web") == written
    table = reader.read_table("curated_documents", "web")
    assert table.num_rows == 100 and table.column("doc_id")[0].as_py() == "d2-0-0"
    local = reader.dataset_dir("curated_documents", "web")
    assert local == tmp_path / "reader" / "curated_documents" / "web"
    for f in written.files:
        assert (local / f.path).read_bytes() == (original / f.path).read_bytes()
    assert (local / MANIFEST_NAME).read_bytes() == (original / MANIFEST_NAME).read_bytes()
    # One remote manifest fetch and one download per file, however often this Store is asked.
    reader.files("curated_documents", "web", "documents")
    assert len(client.names("get_object")) == 1 + len(written.files)
    # No staging folder left: only the version the link names.
    assert [p.name for p in local.parent.glob(".*")] == [os.readlink(local)]

    # A new version written elsewhere: this Store keeps what it synced; a new Store sees the new version,
    # and one whose cache already holds it downloads nothing.
    newer = write_version(Store(tmp_path / "writer", remote(s3)), seed=3)
    assert reader.manifest("curated_documents", "web").data_version == written.data_version
    assert Store(tmp_path / "reader", remote(s3)).manifest("curated_documents", "web") == newer
    again = Recording(s3)
    assert Store(tmp_path / "reader", remote(again)).manifest("curated_documents", "web") == newer
    assert len(again.names("get_object")) == 1


def test_the_writer_does_not_download_the_version_it_replaces(s3, tmp_path):
    first = write_version(Store(tmp_path / "first", remote(s3)), seed=4)
    client = Recording(s3)
    newer = write_version(Store(tmp_path / "second", remote(client)), seed=5)
    assert client.names("get_object") == []  # staging and commit never read the old version
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}  # and its keys are gone
    base = "kiln/curated_documents/web"
    assert keys == {f"{base}/{MANIFEST_NAME}"} | {f"{base}/{newer.data_version}/{f.path}" for f in newer.files} | \
        {f"{base}/_history/{m.data_version}.json" for m in (first, newer)}  # but not its manifest
    # A third machine, whose cache never saw the first version, describes it from S3's history.
    third = Store(tmp_path / "third", remote(s3))
    assert third.manifest_at("curated_documents", "web", first.data_version) == first
    assert {m.data_version for m in third.history("curated_documents", "web")} == {first.data_version,
                                                                                   newer.data_version}


def test_a_replaced_versions_member_list_stays_on_s3_for_a_machine_that_never_saw_it(s3, tmp_path):
    """Membership answers for a checkpoint whose shards were replaced from their member list in S3's history."""
    client = Recording(s3)
    made = []
    for n in (1, 2):
        with Store(tmp_path / "writer", remote(client)).staging("token_shards", "r1") as writer:
            writer.write("documents", pa.table({"text": [f"text {n}"]}))
            writer.write("members", pa.table({"doc_id": [f"d{n}"], "copies": [n]}))
            made.append(writer.commit(code_version="test", config={}, inputs={}, counts={}))
    first, newer = made
    base = "kiln/token_shards/r1"
    uploads = client.names("upload_file", "put_object")
    # The first version's record file goes up with its files, before the history entry that names it.
    assert uploads.index(f"{base}/_history/{first.data_version}/members-00000.parquet") < \
        uploads.index(f"{base}/_history/{first.data_version}.json")
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert {k for k in keys if first.data_version in k} == {
        f"{base}/_history/{first.data_version}.json", f"{base}/_history/{first.data_version}/members-00000.parquet"}
    third = Store(tmp_path / "third", remote(s3))
    kept = third.version_file("token_shards", "r1", first.data_version, "members-00000.parquet")
    assert kept.is_relative_to(tmp_path / "third") and pq.read_table(kept).to_pylist() == [{"doc_id": "d1",
                                                                                            "copies": 1}]
    assert third.version_file("token_shards", "r1", first.data_version, "part-00000.parquet") is None
    assert [p.name for p in kept.parent.iterdir()] == ["members-00000.parquet"]  # no download left half-done
    assert {m.data_version for m in third.history("token_shards", "r1")} == {first.data_version, newer.data_version}


def test_a_reading_machine_drops_the_versions_it_pulled_past_as_the_writer_does(s3, tmp_path):
    """Only the writer's machine removed a replaced version. A machine that only reads (a training node, a pod that
    ran `kiln audit`) kept every version it ever pulled: a version a removal request replaced, the taken-down text in
    it, with no end; and with `keep_replaced_minutes: 0` one version folder more per pull."""
    def commit(store, texts, requests):
        with store.staging("quality_filtered_documents", "web/r1") as w:
            w.write("documents", pa.table({"doc_id": [f"d{i}" for i in range(len(texts))], "text": texts}))
            return w.commit(code_version="t", config={"removal_requests": requests}, inputs={}, counts={},
                            forget_replaced=bool(requests))

    def versions(store):
        return sorted(p for p in (store.root / "quality_filtered_documents" / "web").glob(".r1.v-*") if p.is_dir())

    writer, reader = Store(tmp_path / "writer", remote(s3)), Store(tmp_path / "reader", remote(s3))
    commit(writer, ["ordinary text", "Jane Roe's letter"], [])  # the reader pulls each version (snapshot)
    assert reader.snapshot("quality_filtered_documents", "web/r1").read_table().num_rows == 2
    commit(writer, ["ordinary text"], ["request-1"])  # the request applied: the writer keeps no copy of the letter
    reader = Store(tmp_path / "reader", remote(s3))  # the next step on the reading machine
    assert reader.snapshot("quality_filtered_documents", "web/r1").read_table().column("text").to_pylist() == ["ordinary text"]
    assert len(versions(writer)) == len(versions(reader)) == 1
    assert not [p for p in (tmp_path / "reader").rglob("*.parquet") if b"Jane Roe" in p.read_bytes()]

    writer = Store(tmp_path / "writer", remote(s3), keep_replaced_s=0)
    for n in range(3):  # no request: each pulled version is kept as long as the writer keeps it, here not at all
        commit(writer, [f"text {n}"], ["request-1"])
        reader = Store(tmp_path / "reader", remote(s3), keep_replaced_s=0)
        assert reader.snapshot("quality_filtered_documents", "web/r1").read_table().column("text").to_pylist() == [f"text {n}"]
    assert len(versions(reader)) == 1


def test_a_machine_with_an_empty_cache_sees_every_partition_in_the_bucket(s3, tmp_path):
    """A machine's cache holds only what it has read, and the store's partitions were listed from it: on a fresh pod,
    an audit or a takedown did not see the datasets of a source the config no longer names (never pulled there)."""
    writer = Store(tmp_path / "writer", remote(s3))
    for asset, part in [("curated_documents", "web/r1"), ("curated_documents", "dropped/r1"),
                        ("curated_documents", "web/r2"), ("token_shards", "r1"), ("tokenizer", None)]:
        with writer.staging(asset, part) as w:
            w.write("documents", pa.table({"doc_id": [f"{asset}-{part}"]}))
            w.commit(code_version="t", config={}, inputs={}, counts={})
    fresh = Store(tmp_path / "fresh", remote(s3))
    for asset in ("curated_documents", "token_shards", "tokenizer", "never_written"):
        assert fresh.partitions(asset) == writer.partitions(asset), asset
    assert fresh.partitions("curated_documents") == ["dropped/r1", "web/r1", "web/r2"]
    assert fresh.partitions("tokenizer") == [None] and fresh.partitions("never_written") == []


def test_a_pull_that_ends_after_a_newer_local_commit_does_not_leave_the_committer_reading_the_old(s3, tmp_path):
    """Two steps share one cache (Dagster's multiprocess executor). R pulls v1 while W commits v2; R's download ends
    after W's commit and swaps v1 in over v2. W, which committed v2 and knows S3 holds it, then read v1."""
    def commit(store, tag):
        with store.staging("tokenizer") as w:
            w.write("documents", pa.table({"doc_id": [tag]}))
            return w.commit(code_version="t", config={}, inputs={}, counts={})

    commit(Store(tmp_path / "elsewhere", remote(s3)), "v1")  # another machine published v1
    writer, reader = Store(tmp_path / "cache", remote(s3)), Store(tmp_path / "cache", remote(s3))
    download = reader.remote.download_files

    def download_while_the_writer_commits(items):
        download(items)
        commit(writer, "v2")

    object.__setattr__(reader.remote, "download_files", download_while_the_writer_commits)
    reader.manifest("tokenizer")  # v1, swapped in over the writer's v2
    assert writer.read_table("tokenizer", None).column("doc_id").to_pylist() == ["v2"]
    assert Store(tmp_path / "cache", remote(s3)).read_table("tokenizer", None).column("doc_id").to_pylist() == ["v2"]


def test_a_tampered_remote_file_is_refused_with_the_key(s3, tmp_path):
    written = write_version(Store(tmp_path / "writer", remote(s3)), seed=6)
    key = f"kiln/curated_documents/web/{written.data_version}/model/weights.bin"
    s3.put_object(Bucket=BUCKET, Key=key, Body=object_bytes(s3, key)[:-1] + b"\0")
    reader = Store(tmp_path / "reader", remote(s3))
    with pytest.raises(CorruptRemoteFile, match=f"s3://{BUCKET}/{key}: sha256 .* does not match"):
        reader.files("curated_documents", "web", "documents")
    # Nothing half-downloaded is left where a reader would look.
    assert not (tmp_path / "reader" / "curated_documents" / "web").exists()
    assert not list((tmp_path / "reader" / "curated_documents").glob(".*"))


def test_a_crash_mid_upload_leaves_the_previous_version_readable(s3, tmp_path):
    first = write_version(Store(tmp_path / "writer", remote(s3)), seed=7)
    crashing = Recording(s3, fail_after=1)
    with pytest.raises(ConnectionError, match="simulated crash"):
        write_version(Store(tmp_path / "writer", remote(crashing)), seed=8)
    assert not any(key.endswith(MANIFEST_NAME) for key in crashing.names("put_object"))
    reader = Store(tmp_path / "reader", remote(s3))
    assert reader.manifest("curated_documents", "web") == first
    local = reader.dataset_dir("curated_documents", "web")
    assert all(sha256_file(local / f.path) == f.sha256 for f in first.files)
    # The writer's own cache holds the version S3 never got: a new Store puts S3's version back.
    assert Store(tmp_path / "writer", remote(s3)).manifest("curated_documents", "web") == first
    # The next successful commit removes the first version and the crashed attempt's orphan objects.
    final = write_version(Store(tmp_path / "writer", remote(s3)), seed=9)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert all(final.data_version in k or k.endswith(MANIFEST_NAME) for k in keys - _history(keys))
    assert _history(keys) == {f"kiln/curated_documents/web/_history/{m.data_version}.json" for m in (first, final)}


def test_a_dataset_missing_on_s3_is_not_materialized_even_with_a_local_copy(s3, tmp_path):
    write_version(Store(tmp_path / "data"), seed=10)  # written with backend local
    store = Store(tmp_path / "data", remote(s3))
    with pytest.raises(IncompleteDataset, match=r"no s3://kiln-test/kiln/curated_documents/web/_manifest.json; "
                                                r"the local copy .* is not on S3"):
        store.manifest("curated_documents", "web")
    assert store.dataset_dir("tokenizer") == tmp_path / "data" / "tokenizer" / "_all"  # a path, as before


def test_a_store_that_found_nothing_sees_a_dataset_another_process_commits_later(s3, tmp_path):
    # The demo's long-lived store asks whether the classifier exists, a run's own store commits it, then the
    # demo reads it back: the first "not on S3" must not be remembered (it once failed `make demo` on S3).
    reader = Store(tmp_path / "data", remote(s3))
    assert reader.manifest_or_none("curated_documents", "web") is None
    written = write_version(Store(tmp_path / "data", remote(s3)), seed=11)
    assert reader.manifest("curated_documents", "web").data_version == written.data_version


def test_a_missing_bucket_is_a_clear_error_when_storage_is_opened(s3_endpoint, tmp_path):  # noqa: F811
    from resources import KilnConfig, KilnStorage

    config = {"sources": [{"name": "web", "kind": "jsonl", "path": "x", "license": "CC0", "domain": "web",
                           "profile": "none"}], "profiles": {"none": []},
              "storage": {"backend": "s3", "bucket": "no-such-bucket"}}
    path = tmp_path / "kiln.yaml"
    path.write_text(json.dumps(config))
    storage = KilnStorage(root=str(tmp_path / "data"), kiln_config=KilnConfig(path=str(path)))
    with pytest.raises(MissingBucket, match=r"S3 bucket 'no-such-bucket' does not exist at http://127.0.0.1:\d+\. "
                                            r"Create it .* or set `storage.create_bucket: true`"):
        storage.store()

    config["storage"] |= {"create_bucket": True, "keep_replaced_minutes": 5}
    path.write_text(json.dumps(config))
    store = storage.store()
    assert store.remote.bucket == "no-such-bucket" and store.remote.prefix == "kiln"
    assert store.keep_replaced_s == 300  # 5 minutes
    buckets = [b["Name"] for b in s3_client(s3_endpoint).list_buckets()["Buckets"]]
    assert "no-such-bucket" in buckets
    write_version(store, seed=11)
    assert Store(tmp_path / "other", store.remote).read_table("curated_documents", "web").num_rows == 100

    # backend local (the default) touches no bucket at all
    config["storage"] = {"backend": "local"}
    path.write_text(json.dumps(config))
    assert storage.store().remote is None


def test_a_missing_bucket_is_the_commands_error_not_a_traceback(s3_endpoint, tmp_path, monkeypatch, capsys):  # noqa: F811
    """`kiln audit`, `kiln forget` and `make demo` caught only a bad config: a bucket that cannot be used (here one
    that does not exist) came out as a traceback and exit 1, its message at the bottom."""
    from kiln.cli import main
    from orchestration import demo

    path = tmp_path / "kiln.yaml"
    path.write_text(json.dumps({"sources": [{"name": "web", "kind": "jsonl", "path": "x", "license": "CC0",
                                             "domain": "web", "profile": "none"}], "profiles": {"none": []},
                                "engine": {"backend": "processes", "workers": 1},
                                "storage": {"backend": "s3", "bucket": "no-such-bucket"}}))
    for command in (["audit", "refreshes"], ["forget", "--source", "web"]):
        assert main([*command, "--config", str(path), "--home", str(tmp_path)]) == 2
        assert capsys.readouterr().err.startswith(f"kiln {command[0]}: storage: S3 bucket 'no-such-bucket' does not exist")
    monkeypatch.setenv("KILN_CONFIG", str(path))
    assert demo.main() == 2
    assert "[kiln demo] storage: S3 bucket 'no-such-bucket' does not exist" in capsys.readouterr().err


def test_steps_share_one_client_per_settings_and_aws_environment(s3_endpoint, monkeypatch):  # noqa: F811
    from dagster_aws.s3 import S3Resource

    from resources.storage import s3_client as storage_client

    first = storage_client(S3Resource())
    assert storage_client(S3Resource()) is first  # every step's store(): one client, built once
    assert first.meta.endpoint_url == s3_endpoint
    other = storage_client(S3Resource(endpoint_url="http://127.0.0.1:9"))  # other settings: their own client
    assert other is not first and other.meta.endpoint_url == "http://127.0.0.1:9"
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # the environment boto3 reads changed
    moved = storage_client(S3Resource())
    assert moved is not first and moved.meta.endpoint_url == "http://127.0.0.1:9"


class Slowed:
    """A boto3 client whose uploads return `after_upload` seconds late (the object already on S3) and whose manifest
    puts start `before_manifest` seconds late: two writers' commits made to overlap."""

    def __init__(self, client, after_upload: float = 0.0, before_manifest: float = 0.0):
        self._client, self.after_upload, self.before_manifest = client, after_upload, before_manifest

    def __getattr__(self, name):
        attr = getattr(self._client, name)
        if name == "upload_file":
            def upload(*args, **kwargs):
                attr(*args, **kwargs)
                time.sleep(self.after_upload)
            return upload
        if name == "put_object":
            def put(**kwargs):
                if kwargs["Key"].endswith(MANIFEST_NAME):
                    time.sleep(self.before_manifest)
                return attr(**kwargs)
            return put
        return attr


def test_two_machines_committing_one_dataset_at_once_leave_s3_whole(s3, tmp_path):
    """Writer A names its version in the manifest 0.3 s in, writer B's uploads are on S3 by then but its commit goes
    on for a second. Unserialized, A's cleanup deleted B's files before B's manifest named them: S3's dataset lost
    files. With the commit lock one waits for the other, and S3 holds one whole version (the last published)."""
    a = Store(tmp_path / "a", remote(Slowed(s3, before_manifest=0.3)))
    b = Store(tmp_path / "b", remote(Slowed(s3, after_upload=1.0)))
    written = {}
    threads = [threading.Thread(target=lambda s=s, n=n: written.setdefault(n, write_version(s, seed=n)))
               for n, s in ((1, a), (2, b))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    reader = Store(tmp_path / "reader", remote(s3))
    manifest = reader.manifest("curated_documents", "web")
    assert manifest in (written[1], written[2])
    local = reader.dataset_dir("curated_documents", "web")
    assert all(sha256_file(local / f.path) == f.sha256 for f in manifest.files)  # every file there, intact
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    # Nothing else left, no lock; both versions in the history of manifests.
    assert all(manifest.data_version in k or k.endswith(MANIFEST_NAME) for k in keys - _history(keys))
    assert _history(keys) == {f"kiln/curated_documents/web/_history/{m.data_version}.json" for m in written.values()}


def _history(keys: set[str]) -> set[str]:
    return {k for k in keys if "/_history/" in k}


def test_the_commit_lock_waits_for_a_live_holder_and_takes_over_a_dead_ones(s3, capsys):
    lock = remote(s3).key("curated_documents", "web", COMMIT_LOCK)
    events = []

    def hold(seconds: float) -> None:
        with remote(s3).lock(lock, lease_s=2):  # renewed every 0.5 s: never stale while held
            events.append("first in")
            time.sleep(seconds)
            events.append("first out")

    holder = threading.Thread(target=hold, args=(3.5,))
    holder.start()
    while not events:
        time.sleep(0.05)
    with remote(s3).lock(lock, lease_s=2):
        events.append("second in")
    holder.join()
    assert events == ["first in", "first out", "second in"]  # held past its 2 s lease, and still waited for
    assert f"waiting for s3://{BUCKET}/{lock}: another process is publishing" in capsys.readouterr().err
    assert remote(s3).get_bytes(lock) is None  # released

    s3.put_object(Bucket=BUCKET, Key=lock, Body=b'{"owner": "a process that died"}')  # never renewed, never released
    started = time.monotonic()
    with remote(s3).lock(lock, lease_s=2) as still_held:
        still_held()
    assert 2 <= time.monotonic() - started < 10


def test_a_holder_that_lost_its_lease_is_told_and_leaves_the_new_holders_lock(s3):
    lock = remote(s3).key("curated_documents", "web", COMMIT_LOCK)
    with pytest.raises(LostLock, match="hold on the lock lapsed .* 2 s lease"):
        with remote(s3).lock(lock, lease_s=2) as still_held:
            s3.put_object(Bucket=BUCKET, Key=lock, Body=b'{"owner": "the process that took it over"}')
            for _ in range(50):  # the holder's next renewal (every 0.5 s) finds the lock is not its own; at the
                time.sleep(0.1)  # latest, 1.5 s without a renewal says the same on a host too busy to renew
                still_held()
    assert remote(s3).get_bytes(lock) == b'{"owner": "the process that took it over"}'


def test_a_writer_whose_lease_lapsed_after_its_manifest_deletes_no_other_writers_files(s3, tmp_path, monkeypatch,
                                                                                          capsys):
    """The deletion of stale keys is a write the commit lock guards too: a writer that stalled past its lease right
    after putting its manifest up must not delete what the writer now holding the lock has uploaded and not yet
    named in a manifest. Its own version is published; the stale keys are left for the next commit to delete."""
    store = Store(tmp_path / "w", remote(s3))
    first = write_version(store, seed=1)
    held_for = S3Remote.lock
    monkeypatch.setattr(S3Remote, "lock", lambda self, key, lease_s=2.0: held_for(self, key, lease_s=2.0))
    dataset = remote(s3).key("curated_documents", "web")
    others = remote(s3).key("curated_documents", "web", "f" * 20, "documents", "part-00000.parquet")
    listed = S3Remote.list_keys

    def after_a_stall(self, prefix):
        if prefix == dataset:  # the stale-key listing, right after the manifest went up
            s3.put_object(Bucket=BUCKET, Key=remote(s3).key("curated_documents", "web", COMMIT_LOCK),
                          Body=b'{"owner": "the writer that took the lock over"}')
            s3.put_object(Bucket=BUCKET, Key=others, Body=b"uploaded, not yet named")
            time.sleep(1.6)  # past three quarters of the 2 s lease: the hold has lapsed
        return listed(self, prefix)

    monkeypatch.setattr(S3Remote, "list_keys", after_a_stall)
    second = write_version(store, seed=2)
    keys = {o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET)["Contents"]}
    assert others in keys
    assert json.loads(s3.get_object(Bucket=BUCKET, Key=f"{dataset}/{MANIFEST_NAME}")["Body"].read())[
        "data_version"] == second.data_version
    assert any(f"/{first.data_version}/" in k for k in keys - _history(keys))  # stale, left for the next commit
    assert "left for the next commit" in capsys.readouterr().err


def test_a_store_that_ignores_conditional_writes_is_refused_before_anything_is_written(s3, tmp_path):
    class Unconditional:  # an S3-compatible endpoint that drops If-None-Match / If-Match
        def __getattr__(self, name):
            attr = getattr(s3, name)
            if name != "put_object":
                return attr
            return lambda **kw: attr(**{k: v for k, v in kw.items() if k not in ("IfNoneMatch", "IfMatch")})

    from kiln.common import remote as remote_module

    remote_module._CONDITIONAL_WRITES.clear()  # this process has seen moto honour them
    with pytest.raises(StorageError, match="ignores conditional writes .* commit lock"):
        write_version(Store(tmp_path / "w", remote(Unconditional())), seed=3)
    assert not [k for k in (o["Key"] for o in s3.list_objects_v2(Bucket=BUCKET).get("Contents", []))
                if k.endswith(MANIFEST_NAME) or "/curated_documents/" in k]


def test_a_holder_cut_off_from_s3_stops_before_its_lease_could_have_passed_to_another(s3):
    """Renewals that fail on the network are tried again, but once the last renewal is three quarters of a lease
    old the holder no longer counts on the lock (another process may take it over at the lease's end)."""
    from botocore.exceptions import EndpointConnectionError

    class CutOff:
        cut = False

        def __getattr__(self, name):
            attr = getattr(s3, name)
            if name != "put_object":
                return attr

            def put(**kwargs):
                if self.cut and "IfMatch" in kwargs:
                    raise EndpointConnectionError(endpoint_url="http://s3.example")
                return attr(**kwargs)
            return put

    client = CutOff()
    lock = remote(s3).key("curated_documents", "web", COMMIT_LOCK)
    with pytest.raises(LostLock):
        with remote(client).lock(lock, lease_s=2) as still_held:
            client.cut = True
            time.sleep(0.8)
            still_held()  # renewed at 0.5 s? no: that one failed, but the hold is still young
            time.sleep(1.0)
            still_held()


def test_an_audit_reads_manifests_from_s3_and_fetches_files_only_to_read_them(s3, tmp_path):
    """The audit's Catalog on a fresh machine: a manifest is S3's (no file fetched); the files come when read, of the
    version judged; a version published between the two is refused ("ask again"), never read as the judged one."""
    from kiln.governance.catalog import AuditError, Catalog

    first = write_version(Store(tmp_path / "writer", remote(s3)), seed=1)
    client = Recording(s3)
    catalog = Catalog(Store(tmp_path / "auditor", remote(client)))
    assert catalog.assets() == ["curated_documents"]  # the bucket's, with nothing in this machine's cache
    assert catalog.manifest("curated_documents", "web") == first
    assert catalog.partitions("curated_documents") == ["web"]

    def fetched() -> list[str]:
        return [k for k in client.names("get_object") if not k.endswith(MANIFEST_NAME)]

    assert not fetched() and not (tmp_path / "auditor").exists()
    assert catalog.snapshot("curated_documents", "web").read_table().num_rows == 100  # fetched now, that version
    assert sorted(fetched()) == sorted(f"kiln/curated_documents/web/{first.data_version}/{f.path}" for f in first.files)

    second = Catalog(Store(tmp_path / "auditor-2", remote(s3)))
    assert second.manifest("curated_documents", "web") == first
    write_version(Store(tmp_path / "writer", remote(s3)), seed=2)  # materialized again meanwhile
    with pytest.raises(AuditError, match=r"curated_documents/web was materialized again while this audit read it "
                                         rf"\(version {first.data_version} when its manifest was read, "):
        second.snapshot("curated_documents", "web")


def test_an_audit_reads_a_few_columns_from_s3_by_ranged_reads_and_fetches_no_dataset(s3, tmp_path):
    """`Catalog.opened`: a doc_id lookup on a machine without the dataset reads the footers and the doc_id column
    from S3 (ranged GETs), not the texts, and caches nothing; the machine that holds the version reads its own copy."""
    from kiln.governance.catalog import AuditError, Catalog

    rng = np.random.default_rng(0)
    writer = Store(tmp_path / "writer", remote(s3))
    with writer.staging("curated_documents", "web") as staging:
        for part in range(2):  # 2,000 documents a part, in no order (no row group told apart by its statistics)
            staging.write("documents", pa.table({"doc_id": [f"d-{part}-{i:05d}" for i in rng.permutation(2000)],
                                                 "text": [rng.bytes(3000).hex() for _ in range(2000)]}))
        written = staging.commit(code_version="test", config={}, inputs={}, counts={"documents": 4000})
    paths = [f.path for f in written.files_with_role("documents")]
    client = Recording(s3)
    catalog = Catalog(Store(tmp_path / "auditor", remote(client)))
    with catalog.opened("curated_documents", "web", paths) as files:
        found = [pq.read_table(f, columns=["doc_id"], filters=[("doc_id", "=", "d-1-01234")]).num_rows
                 for f in files]
        fetched = sum(f.fetched for f in files)
    assert found == [0, 1]
    # The doc_id columns are 2 x 2,000 x 9 characters (36 kB; with each footer's 64 kB read, about 170 kB in all);
    # the files hold 4,000 texts of 3,000 random bytes (as hex, which compresses to about those bytes): 12 MB, which
    # must stay on S3.
    total = sum(f.bytes for f in written.files)
    assert total > 12_000_000 and fetched < 250_000, (fetched, total)
    assert not (tmp_path / "auditor").exists()  # nothing cached
    assert all(k.startswith(f"kiln/curated_documents/web/{written.data_version}/")
               for k in client.names("get_object") if not k.endswith(MANIFEST_NAME))

    # A store's reader of a few columns (a takedown's doc ids and URLs) reads them the same way.
    before = len(client.names("get_object"))
    ids = [d for b in Store(tmp_path / "auditor", remote(client)).iter_batches("curated_documents", "web",
                                                                              columns=["doc_id"]) for d in b[0].to_pylist()]
    assert sorted(ids) == sorted(f"d-{part}-{i:05d}" for part in range(2) for i in range(2000))
    assert len(client.names("get_object")) - before <= 1 + 2 * 2  # the manifest, then a footer and a column a file
    table = Store(tmp_path / "auditor", remote(s3)).read_table("curated_documents", "web", columns=["doc_id"],
                                                               filters=[("doc_id", "in", ["d-0-00003", "d-1-00004"])])
    assert sorted(table.column("doc_id").to_pylist()) == ["d-0-00003", "d-1-00004"]
    assert not (tmp_path / "auditor").exists()

    # Tracing two copies of a text: each file is read once for both (`expect`), not once a copy.
    tracing = Recording(s3)
    twice = Catalog(Store(tmp_path / "auditor", remote(tracing)))
    twice.expect(["d-0-00007", "d-1-00042"])
    assert twice.find_row("curated_documents", "web", "documents", "d-1-00042", ("doc_id",)) == {"doc_id": "d-1-00042"}
    reads = len(tracing.names("get_object"))
    assert twice.find_row("curated_documents", "web", "documents", "d-0-00007", ("doc_id",)) == {"doc_id": "d-0-00007"}
    assert twice.find_row("curated_documents", "web", "documents", "d-9", ("doc_id",)) is None  # not expected: read
    assert len(tracing.names("get_object")) > reads and reads == len(tracing.names("get_object")) - 4  # 2 a file

    # The writer's machine holds the version: its own files, no GET.
    local = Recording(s3)
    mine = Catalog(Store(tmp_path / "writer", remote(local)))
    with mine.opened("curated_documents", "web", paths) as files:
        assert [f.name for f in files] == paths and all(f.is_file() for f in files)
    assert [k for k in local.names("get_object") if not k.endswith(MANIFEST_NAME)] == []

    # An object shorter than its manifest says is refused with its key, not read as a file that ends early.
    key = f"kiln/curated_documents/web/{written.data_version}/{paths[0]}"
    whole = object_bytes(s3, key)
    s3.put_object(Bucket=BUCKET, Key=key, Body=whole[:-100])
    with pytest.raises(CorruptRemoteFile, match=f"s3://{BUCKET}/{key} is not the {len(whole)} bytes its manifest"):
        with Catalog(Store(tmp_path / "auditor", remote(s3))).opened("curated_documents", "web", paths) as files:
            pq.read_schema(files[0])
    s3.put_object(Bucket=BUCKET, Key=key, Body=whole)

    # Materialized again between the audit's manifest and its read: the judged version's files are gone.
    judged = Catalog(Store(tmp_path / "auditor", remote(s3)))
    assert judged.manifest("curated_documents", "web") == written
    write_version(writer, seed=5)
    with pytest.raises(AuditError, match="curated_documents/web was materialized again while this audit read it"):
        with judged.opened("curated_documents", "web", paths) as files:
            pq.read_schema(files[0])


def test_in_order_yields_in_the_items_order_and_stops_reading_a_window_past_where_its_reader_stopped():
    import threading

    from kiln.common.remote import in_order

    started, lock = [], threading.Lock()

    def slow_square(n: int) -> int:
        with lock:
            started.append(n)
        time.sleep(0.02 * (5 - n % 5))  # later items finish first
        return n * n

    assert list(in_order(slow_square, range(10), threads=3)) == [n * n for n in range(10)]
    started.clear()
    found = in_order(slow_square, range(100), threads=3)
    assert [next(found) for _ in range(2)] == [0, 1]
    found.close()
    assert sorted(started) == list(range(len(started))) and len(started) <= 2 + 3


def test_a_takedown_matches_urls_as_read_from_s3_without_fetching_the_raw_texts(s3, tmp_path):
    """A url_pattern request is matched against raw_documents' URLs as read (kiln.governance.forget): on a machine
    without the raw layer, the doc_id and url columns come from S3, not the texts, and nothing is cached."""
    from kiln.governance.forget import RemovalRequest, with_intake_urls

    rng = np.random.default_rng(1)
    urls = [f"https://{'jane' if i % 7 == 0 else 'site'}.example/{i}" for i in range(3000)]
    with Store(tmp_path / "writer", remote(s3)).staging("raw_documents", "web/2026-01-01") as staging:
        staging.write("documents", pa.table({"doc_id": [f"d{i}" for i in range(3000)], "url": urls,
                                             "text": [rng.bytes(1500).hex() for _ in range(3000)]}))
        written = staging.commit(code_version="test", config={}, inputs={}, counts={"documents": 3000})
    client = Recording(s3)
    request = RemovalRequest("r1", "2026-01-01T00:00:00Z", "url_pattern", r"^https://jane\.", "erasure")
    [matched] = with_intake_urls(Store(tmp_path / "auditor", remote(client)), [request], ["web/2026-01-01"])
    assert sorted(matched.doc_ids) == sorted(f"d{i}" for i in range(0, 3000, 7))  # every 7th URL, by construction
    assert sum(f.bytes for f in written.files) > 4_000_000 and not (tmp_path / "auditor").exists()
    assert len([k for k in client.names("get_object") if not k.endswith(MANIFEST_NAME)]) <= 3


def test_a_small_file_read_for_its_columns_comes_whole_and_a_changed_one_is_refused_on_every_read(s3, tmp_path):
    """At most RangedObject.WHOLE_BYTES, a file comes in one GET with its sha256 checked: an object rewritten to the
    same size (which a size check passes) is refused, and a second read does not serve it either."""
    from kiln.governance.catalog import Catalog

    written = write_version(Store(tmp_path / "writer", remote(s3)), seed=8)
    [path, _] = [f.path for f in written.files_with_role("documents")]
    key = f"kiln/curated_documents/web/{written.data_version}/{path}"
    original = object_bytes(s3, key)
    assert len(original) < 256 * 1024
    s3.put_object(Bucket=BUCKET, Key=key, Body=original[:100] + bytes([original[100] ^ 1]) + original[101:])
    with Catalog(Store(tmp_path / "auditor", remote(s3))).opened("curated_documents", "web", [path]) as [file]:
        for _ in range(2):
            with pytest.raises(CorruptRemoteFile, match=f"s3://{BUCKET}/{key}: sha256 .* does not match"):
                file.seek(0)
                file.read()
