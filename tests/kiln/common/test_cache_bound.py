"""The local cache of an S3 store bounded by `storage.cache_max_gb`, against moto's server on loopback: past the
bound the least recently used datasets leave the cache and come back, identical, when read; what a reader may still
need (used within the grace, held, the dataset just written, one not on S3) stays."""

import gc
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from pydantic import ValidationError

from kiln.common.config.storage import StorageSettings
from kiln.common.manifest import MANIFEST_NAME
from kiln.common import storage
from kiln.common.remote import S3Remote
from kiln.common.storage import Store, disk_bytes
from kiln.tokens.shard_format import hold_folder
from tests.s3 import _moto_server, s3_client, s3_endpoint  # noqa: F401 (fixtures)

BUCKET = "kiln-cache"
MB = 1_000_000


@pytest.fixture
def remote(s3_endpoint):  # noqa: F811
    client = s3_client(s3_endpoint)
    client.create_bucket(Bucket=BUCKET)
    return S3Remote.connect(client, BUCKET, "kiln")


def store_at(root, remote, cap_mb: float | None = None, keep_s: float = 0.0) -> Store:
    return Store(root, remote, keep_replaced_s=keep_s, cache_max_bytes=None if cap_mb is None else int(cap_mb * MB))


def table(name: str) -> pa.Table:
    return pa.table({"doc_id": [f"{name}-{i}" for i in range(20)], "text": [f"text of {name} {i}" for i in range(20)]})


def write(store: Store, name: str) -> None:
    """Dataset `documents/<name>`: one small Parquet part and 1 MB of random bytes (what makes its size)."""
    with store.staging("documents", name) as writer:
        writer.write("documents", table(name))
        (writer.dir / "blob.bin").write_bytes(np.random.default_rng(len(name)).bytes(MB))
        writer.commit(code_version="test", config={}, inputs={}, counts={"documents": 20})


def last_used(store: Store, name: str, seconds_ago: float) -> None:
    os.utime(store.root / "documents" / name, (time.time() - seconds_ago,) * 2, follow_symlinks=False)


def cached(store: Store) -> set[str]:
    return {p.name for p in (store.root / "documents").iterdir() if not p.name.startswith(".")}


def test_past_the_bound_the_least_recently_used_leave_the_cache_and_come_back_identical(remote, tmp_path, capsys):
    # Hand-worked: four datasets of ~1 MB under a 2.5 MB bound must lose two. By last use b (300 s ago) would go
    # first, but a step still running read it: c (120 s) and a (60 s) go; d, just written, is never a candidate.
    store = store_at(tmp_path / "cache", remote, cap_mb=2.5, keep_s=30)
    for name in "abc":
        write(store, name)
    assert cached(store) == {"a", "b", "c"}  # 3 MB: over, but each was used in the last 30 s (the grace)
    step = store_at(tmp_path / "cache", remote, cap_mb=2.5)  # another process's step, which has read b
    assert step.dataset_dir("documents", "b").is_dir()
    for name, ago in (("a", 60), ("b", 300), ("c", 120)):
        last_used(store, name, ago)
    write(store, "d")
    assert cached(store) == {"b", "d"}
    assert disk_bytes(store.root) <= 2.5 * MB
    assert not list((store.root / "documents").glob(".c.v-*"))  # the version folder went with its link
    assert "removed documents[c], documents[a]" in capsys.readouterr().err

    del step  # its step ended: b is a candidate again, and the least recently used
    gc.collect()
    last_used(store, "d", 60)
    write(store, "e")
    assert cached(store) == {"d", "e"} and not list((store.root / ".readers").iterdir())

    # Read again (by the process that removed them and by a new one; by path and by snapshot): fetched from S3,
    # identical to what was written.
    assert (store.dataset_dir("documents", "b") / "blob.bin").read_bytes() == np.random.default_rng(1).bytes(MB)
    for reader in (store, store_at(tmp_path / "cache", remote, cap_mb=2.5)):
        assert reader.read_table("documents", "a").equals(table("a"))
        assert reader.snapshot("documents", "c").read_table().equals(table("c"))


def test_a_step_killed_while_reading_protects_nothing_once_it_is_gone(remote, tmp_path, s3_endpoint):  # noqa: F811
    store = store_at(tmp_path / "cache", remote, cap_mb=1.5)
    write(store, "a")
    child = subprocess.Popen([sys.executable, "-c", f"""
import sys, time
from pathlib import Path
import boto3
from kiln.common.remote import S3Remote
from kiln.common.storage import Store
store = Store(Path(sys.argv[1]), S3Remote.connect(boto3.client("s3"), "{BUCKET}", "kiln"), keep_replaced_s=0,
              cache_max_bytes=1500000)
store.dataset_dir("documents", "a")
print("read", flush=True)
time.sleep(600)
""", str(tmp_path / "cache")], stdout=subprocess.PIPE, text=True, cwd=Path(__file__).parents[3])
    try:
        assert child.stdout.readline() == "read\n"
        write(store, "b")  # over the bound: a, read by the live child, stays
        assert cached(store) == {"a", "b"}
    finally:
        child.kill()  # SIGKILL: its list of what it read stays behind, its lock does not
        child.wait()
    write(store, "c")
    assert cached(store) == {"c"} and not list((store.root / ".readers").iterdir())


def test_a_dataset_removed_from_under_a_store_is_fetched_again(remote, tmp_path):
    store = store_at(tmp_path / "cache", remote, cap_mb=100)
    write(store, "a")
    assert store.dataset_dir("documents", "a").is_dir()
    (store.root / "documents" / "a").unlink()  # by hand, or by a Kiln before this one, while this store lives
    assert (store.dataset_dir("documents", "a") / "blob.bin").read_bytes() == np.random.default_rng(1).bytes(MB)


def test_what_a_reader_may_need_stays_and_the_overshoot_is_said(remote, tmp_path, capsys):
    store = store_at(tmp_path / "cache", remote, cap_mb=1.5, keep_s=3600)
    for name in ("a", "bb", "ccc"):
        write(store, name)
    # Each used within the grace (keep_replaced_minutes: a reader may still be reading its files): all stay.
    assert cached(store) == {"a", "bb", "ccc"}
    assert "over storage.cache_max_gb (0.0015 GB): the rest was read in the last" in capsys.readouterr().err

    # Past the grace: held by a reader (a training run's loader), or not on S3 (here its manifest deleted, as if the
    # upload had failed), stays; the other goes.
    for name in ("a", "bb", "ccc"):
        last_used(store, name, 7200)
    remote.delete_keys([remote.key("documents", "bb", MANIFEST_NAME)])
    held = hold_folder(store.root / "documents" / "a")
    try:
        write(store, "dddd")
        assert cached(store) == {"a", "bb", "dddd"}
    finally:
        os.close(held)
    write(store, "eeeee")  # a is let go: it goes now (dddd, written just now, is within the grace)
    assert cached(store) == {"bb", "dddd", "eeeee"}


def test_the_dataset_just_written_stays_even_alone_over_the_bound(remote, tmp_path, capsys):
    store = store_at(tmp_path / "cache", remote, cap_mb=0.5)
    write(store, "a")
    assert cached(store) == {"a"} and store.read_table("documents", "a").equals(table("a"))
    assert re.search(r"holds 0\.001\d* GB, over storage.cache_max_gb \(0.0005 GB\)", capsys.readouterr().err)
    store = store_at(tmp_path / "another machine", remote, cap_mb=0.5)
    store.dataset_dir("documents", "a")  # a download bounds the cache too, never evicting what it fetched
    assert cached(store) == {"a"} and store.read_table("documents", "a").equals(table("a"))


def test_without_a_bound_or_a_remote_nothing_is_evicted(remote, tmp_path):
    for store in (store_at(tmp_path / "unbounded", remote), Store(tmp_path / "local", cache_max_bytes=MB)):
        for name in "abc":
            write(store, name)
            last_used(store, name, 7200)
        write(store, "d")
        assert cached(store) == {"a", "b", "c", "d"}


def test_the_bound_is_a_storage_key_and_a_bad_one_names_the_fix():
    assert StorageSettings(backend="s3", bucket="b1b", cache_max_gb=2.5).cache_max_bytes == 2_500_000_000
    assert StorageSettings(backend="s3", bucket="b1b").cache_max_bytes is None
    with pytest.raises(ValidationError, match="storage.backend is 'local'.*remove storage.cache_max_gb or use "
                                              "storage.backend: s3"):
        StorageSettings(cache_max_gb=10)
    with pytest.raises(ValidationError, match="greater than 0"):
        StorageSettings(backend="s3", bucket="b1b", cache_max_gb=0)


def test_a_dataset_removed_between_a_readers_sync_and_its_read_is_fetched_again(remote, tmp_path, monkeypatch):
    store = store_at(tmp_path / "cache", remote, cap_mb=100)
    write(store, "a")
    synced = Store._sync

    def then_removed(self, asset, partition):  # another process's eviction, right after this one's sync
        data = synced(self, asset, partition)
        assert storage._evict(self.root / asset / partition, json.loads(data)["data_version"], time.time()) > MB
        return data

    monkeypatch.setattr(Store, "_sync", then_removed)
    assert store_at(tmp_path / "cache", remote, cap_mb=100).read_table("documents", "a").equals(table("a"))


def test_the_steps_store_takes_the_bound_from_the_projects_config(remote, tmp_path):
    from resources.config import KilnConfig
    from resources.storage import KilnStorage

    config = tmp_path / "kiln.yaml"
    config.write_text(f"extends: {Path(__file__).parents[3] / 'configs' / 'default.yaml'}\nstorage:\n  backend: s3\n  bucket: {BUCKET}\n  cache_max_gb: 0.0025\n"
                      f"  keep_replaced_minutes: 0.5\n")
    store = KilnStorage(root=str(tmp_path / "cache"), kiln_config=KilnConfig(path=str(config))).store()
    assert (store.cache_max_bytes, store.keep_replaced_s) == (2.5 * MB, 30)
    for name in "abc":
        write(store, name)
        last_used(store, name, 60)
    write(store, "d")
    assert cached(store) == {"c", "d"}  # 4 MB under a 2.5 MB bound: a and b (used longest ago) went
