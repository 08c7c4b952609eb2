"""The refresh registry and the landing scan (kiln.governance.refresh), without Dagster."""

import datetime as dt
import os
from pathlib import Path

import pytest

from kiln.common.config import ConfigError, parse_config
from kiln.common.storage import Store
from kiln.curation.readers import read_source
from kiln.curation.readers.paths import SourceFile
from kiln.governance.refresh import (
    LandedFile,
    RefreshError,
    get_refresh,
    load_refreshes,
    new_key,
    partition,
    pending_files,
    register_refresh,
    upto,
)
from tests.conftest import prose, write_jsonl
from tests.s3 import _moto_server, s3_client, s3_endpoint  # noqa: F401 (fixtures)

SOURCES = ["web", "ref"]


def test_the_first_refresh_is_the_configured_sources_then_landed_files(tmp_path):
    store = Store(tmp_path / "data")
    assert load_refreshes(store) == []
    with pytest.raises(RefreshError, match="no first refresh yet"):
        register_refresh(store, {"web": [LandedFile("/x", "x", 1, "t")]}, "sensor")
    first = register_refresh(store, None, "initial", key="week1")
    assert first.is_initial and first.files_of("web") == []
    with pytest.raises(RefreshError, match="already registered"):
        register_refresh(store, None, "initial")
    with pytest.raises(RefreshError, match="at least one landed file"):
        register_refresh(store, {"web": []}, "sensor")
    with pytest.raises(RefreshError, match="refresh key 'a/b'"):
        register_refresh(store, {"web": [LandedFile("/x", "x", 1, "t")]}, "cli", key="a/b")
    second = register_refresh(store, {"web": [LandedFile("/x", "x", 1, "t")]}, "sensor", key="week2")
    # The registry is a dataset like any other: atomic, with a manifest, read back in order.
    assert [r.key for r in load_refreshes(store)] == ["week1", "week2"]
    assert store.manifest("refreshes").counts == {"refreshes": 2, "landed_files": 1}
    assert get_refresh(store, "week2") == second and [r.key for r in upto(load_refreshes(store), "week1")] == ["week1"]
    with pytest.raises(RefreshError, match="no refresh 'week9'.*week1, week2"):
        get_refresh(store, "week9")
    assert partition("web", "week2") == "web/week2"


def test_the_registry_is_read_from_the_version_looked_up(tmp_path, monkeypatch):
    """A registration committing while load_refreshes reads (here: right after it has looked the registry up): the
    refreshes returned are the version looked up, not a mix of two lookups."""
    store = Store(tmp_path / "data")
    register_refresh(store, None, "initial", key="week1")
    looked_up = Store.snapshot

    def then_a_registration(self, asset, partition=None):
        snap = looked_up(self, asset, partition)
        monkeypatch.setattr(Store, "snapshot", looked_up)
        register_refresh(store, {"web": [LandedFile("/x", "x", 1, "t")]}, "sensor", key="week2")
        return snap

    monkeypatch.setattr(Store, "snapshot", then_a_registration)
    assert [r.key for r in load_refreshes(store)] == ["week1"]
    assert [r.key for r in load_refreshes(store)] == ["week1", "week2"]


def test_new_keys_are_dates_made_unique_within_a_day(tmp_path):
    store = Store(tmp_path / "data")
    day = dt.date(2026, 11, 23)
    assert new_key([], day) == "2026-11-23"
    register_refresh(store, None, "initial", key="2026-11-23")
    register_refresh(store, {"web": [LandedFile("/x", "x", 1, "t")]}, "sensor", key=new_key(load_refreshes(store), day))
    assert new_key(load_refreshes(store), day) == "2026-11-23.3"


def test_pending_files_skips_seen_hidden_settling_and_unknown_folders(tmp_path):
    landing = tmp_path / "landing"
    write_jsonl(landing / "web" / "week2.jsonl", [{"text": prose(1)}])
    write_jsonl(landing / "web" / "sub" / "more.jsonl", [{"text": prose(2)}])
    write_jsonl(landing / "web" / ".upload.jsonl.tmp", [{"text": prose(3)}])  # an upload in progress
    (landing / "web" / "_SUCCESS").write_text("")
    write_jsonl(landing / "wikipedia" / "a.jsonl", [{"text": prose(4)}])  # not a declared source
    (landing / "stray.txt").write_text("x")
    store = Store(tmp_path / "data")
    register_refresh(store, None, "initial")
    found = pending_files(str(landing), SOURCES, load_refreshes(store))
    assert [f.relative for f in found.files["web"]] == ["sub/more.jsonl", "week2.jsonl"] and "ref" not in found.files
    assert found.unknown_sources == ["stray.txt", "wikipedia"] and found.count == 2
    register_refresh(store, found.files, "sensor")
    assert pending_files(str(landing), SOURCES, load_refreshes(store)).count == 0  # registered: not pending again
    # A file replaced in place lands again; one written a moment ago waits until it has settled.
    write_jsonl(landing / "web" / "week2.jsonl", [{"text": prose(1)}, {"text": prose(5)}])
    now = dt.datetime.now(dt.timezone.utc)
    assert pending_files(str(landing), SOURCES, load_refreshes(store), settle_seconds=600, now=now).settling == 1
    assert [f.relative for f in pending_files(str(landing), SOURCES, load_refreshes(store)).files["web"]] == \
        ["week2.jsonl"]
    assert pending_files(str(tmp_path / "nothing-yet"), SOURCES, []).count == 0
    (tmp_path / "file").write_text("")
    with pytest.raises(RefreshError, match="not a folder"):
        pending_files(str(tmp_path / "file"), SOURCES, [])


def test_records_of_a_later_refresh_get_their_own_doc_ids(tmp_path):
    """Native ids repeat across crawl snapshots: a refresh's namespace keeps doc ids unique, and a builtin
    source reads landed files by their extension (unknown extensions are quarantined, not guessed)."""
    config = parse_config({"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "a.jsonl"),
                                        "license": "x", "domain": "web", "profile": "none"},
                                       {"name": "docs", "kind": "builtin", "corpus": "python_docs", "license": "x",
                                        "domain": "docs", "profile": "none"}], "profiles": {"none": []}})
    path = write_jsonl(tmp_path / "a.jsonl", [{"id": 7, "text": prose(1)}, "{bad"])
    files = [SourceFile(str(path), "a.jsonl")]
    first = list(read_source(config.source("web"), config.reading, files))
    later = list(read_source(config.source("web"), config.reading, files, namespace="week2"))
    assert first[0].doc_id != later[0].doc_id and later[0].meta["locator"] == "week2/id:7"
    assert later[1].locator == "week2/a.jsonl#L2" and later[1].reason == "malformed_json"
    (tmp_path / "page.pdf").write_bytes(b"%PDF-1.7")
    records = list(read_source(config.source("docs"), config.reading,
                               [SourceFile(str(path), "a.jsonl"), SourceFile(str(tmp_path / "page.pdf"), "page.pdf")]))
    assert records[0].text == prose(1) and records[-1].reason == "unsupported_format"


def test_refresh_config_is_validated_with_the_key_named():
    base = {"sources": [{"name": "web", "kind": "jsonl", "path": "x", "license": "x", "domain": "web",
                         "profile": "none"}], "profiles": {"none": []}}
    config = parse_config(base)
    assert config.refresh.schedule.cron == "0 3 * * 1" and not config.refresh.train
    assert config.refresh.landing_path().endswith(os.path.join("landing"))
    with pytest.raises(ConfigError, match=r"refresh.schedule.cron = 'weekly'.*5 fields"):
        parse_config({**base, "refresh": {"schedule": {"cron": "weekly"}}})
    with pytest.raises(ConfigError, match=r"refresh.sensor.interval_seconds"):
        parse_config({**base, "refresh": {"sensor": {"interval_seconds": 1}}})


def test_pending_files_on_an_s3_prefix(s3_endpoint, tmp_path):  # noqa: F811
    """The landing area may be an S3 prefix (moto's server on loopback): the same scan, s3:// URIs that the
    readers open."""
    client = s3_client(s3_endpoint)
    client.create_bucket(Bucket="landing")
    client.put_object(Bucket="landing", Key="crawl/web/2026-11-30.jsonl", Body=b'{"text": "hello"}\n')
    client.put_object(Bucket="landing", Key="crawl/web/_SUCCESS", Body=b"")
    client.put_object(Bucket="landing", Key="crawl/news/a.jsonl", Body=b"{}\n")
    store = Store(tmp_path / "data")
    register_refresh(store, None, "initial")
    found = pending_files("s3://landing/crawl", SOURCES, load_refreshes(store))
    [f] = found.files["web"]
    assert (f.uri, f.relative, f.bytes) == ("s3://landing/crawl/web/2026-11-30.jsonl", "2026-11-30.jsonl", 18)
    assert found.unknown_sources == ["news"]
    register_refresh(store, found.files, "sensor")
    assert pending_files("s3://landing/crawl/", SOURCES, load_refreshes(store)).count == 0


WRITERS, APPENDS = 4, 6


def _append_refreshes(root: str, writer: int, start) -> None:
    start.wait()  # every writer at once
    store = Store(Path(root))
    for i in range(APPENDS):
        register_refresh(store, {"web": [LandedFile(f"/w{writer}-{i}", "x", 1, "t")]}, "cli", key=f"w{writer}-{i}")


def _append_requests(root: str, writer: int, start) -> None:
    from kiln.governance.forget import record_request

    start.wait()
    store = Store(Path(root))
    for i in range(APPENDS):
        # URL patterns: doc ids are checked against the raw documents, which this store has none of
        record_request(store, None, "url_pattern", f"^https://site-{writer}-{i}/", reason=f"writer {writer}")


@pytest.mark.parametrize("append", [_append_refreshes, _append_requests], ids=["refreshes", "removal_requests"])
def test_concurrent_writers_of_a_registry_lose_no_entry(append, tmp_path):
    """Registries are read, appended and rewritten: four processes appending at once must leave every entry
    (without the registry's lock, a writer rewrites the list without the entries another added meanwhile)."""
    import multiprocessing

    from kiln.governance.forget import load_requests

    store = Store(tmp_path / "data")
    register_refresh(store, None, "initial", key="first")
    context = multiprocessing.get_context("spawn")
    start = context.Barrier(WRITERS)
    writers = [context.Process(target=append, args=(str(store.root), w, start)) for w in range(WRITERS)]
    for p in writers:
        p.start()
    for p in writers:
        p.join(timeout=120)
    assert [p.exitcode for p in writers] == [0] * WRITERS
    if append is _append_refreshes:
        keys = [r.key for r in load_refreshes(store)]
        assert len(keys) == 1 + WRITERS * APPENDS and set(keys) == {"first"} | {
            f"w{w}-{i}" for w in range(WRITERS) for i in range(APPENDS)}
    else:
        requests, _ = load_requests(store)
        assert sorted(r.value for r in requests) == sorted(
            f"^https://site-{w}-{i}/" for w in range(WRITERS) for i in range(APPENDS))


def test_the_first_refresh_is_pinned_to_the_files_it_read(tmp_path):
    """Re-reading the first refresh after its configured files changed would give other data under the same key:
    the files are recorded at registration (size, time, sha256) and any change is an error naming the file."""
    from kiln.governance.refresh import check_unchanged, next_refresh

    write_jsonl(tmp_path / "web" / "a.jsonl", [{"text": prose(1)}])
    write_jsonl(tmp_path / "web" / "b.jsonl", [{"text": prose(2)}])
    config = parse_config({"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"),
                                        "license": "x", "domain": "web", "profile": "p"}],
                           "profiles": {"p": []}, "refresh": {"landing": str(tmp_path / "landing")}})
    store = Store(tmp_path / "data")
    first, _ = next_refresh(store, config, "cli")
    [pinned] = load_refreshes(store)
    assert [f.relative for f in pinned.pinned["web"]] == ["a.jsonl", "b.jsonl"]
    assert pinned.pinned["web"][0].sha256 == __import__("hashlib").sha256(
        (tmp_path / "web" / "a.jsonl").read_bytes()).hexdigest()
    source = config.source("web")
    check_unchanged(pinned, source)  # unchanged: fine
    os.utime(tmp_path / "web" / "a.jsonl", (1, 1))  # touched, same content: fine
    check_unchanged(pinned, source)

    original = (tmp_path / "web" / "a.jsonl").read_text()
    (tmp_path / "web" / "a.jsonl").write_text(original.replace("a", "b", 1))  # same size, other content
    with pytest.raises(RefreshError, match=r"a\.jsonl: content changed.*Restore them"):
        check_unchanged(pinned, source)
    (tmp_path / "web" / "a.jsonl").write_text(original)
    write_jsonl(tmp_path / "web" / "c.jsonl", [{"text": prose(3)}])
    (tmp_path / "web" / "b.jsonl").unlink()
    with pytest.raises(RefreshError, match=r"b\.jsonl: gone; .*c\.jsonl: new"):
        check_unchanged(pinned, source)


def test_a_later_refresh_re_read_must_find_its_landed_files_as_they_landed(tmp_path):
    """Only the first refresh was checked: re-materializing a later refresh's raw_documents read whatever its
    landed files held now. A file replaced in place (which the landing sensor registers as the next refresh) gave
    the old refresh the new content, and a landing area cleaned up gave it 0 documents, both without a word."""
    from kiln.governance.refresh import check_unchanged, next_refresh

    landing = tmp_path / "landing"
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"text": prose(1)}])
    config = parse_config({"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"),
                                        "license": "x", "domain": "web", "profile": "p"}],
                           "profiles": {"p": []}, "refresh": {"landing": str(landing)}})
    store = Store(tmp_path / "data")
    next_refresh(store, config, "cli")
    week = landing / "web" / "week2.jsonl"
    write_jsonl(week, [{"text": prose(2)}])
    second, _ = next_refresh(store, config, "cli")
    source = config.source("web")
    check_unchanged(second, source)  # as it landed: fine

    stamp = week.stat()
    write_jsonl(week, [{"text": prose(3)}])  # replaced in place, same size or not
    os.utime(week, ns=(stamp.st_atime_ns, stamp.st_mtime_ns + 1_000_000))
    with pytest.raises(RefreshError, match=r"the files refresh '.+' landed for source 'web' changed since: "
                                           r".*week2\.jsonl: .* bytes modified .*landed as .*Restore them"):
        check_unchanged(second, source)
    week.unlink()
    with pytest.raises(RefreshError, match=r"week2\.jsonl: gone"):
        check_unchanged(second, source)


def test_unmaterialized_names_the_partitions_a_refresh_should_hold(tmp_path):
    """Expected by hand: the first refresh pinned web and ref; the second landed files for web only. A source with
    nothing in a refresh, or no longer configured, is not expected."""
    from kiln.governance.refresh import unmaterialized

    store = Store(tmp_path / "data")
    first = register_refresh(store, None, "initial", key="r1", pinned={"web": [], "ref": []})
    second = register_refresh(store, {"web": [LandedFile("/x", "x", 1, "t")]}, "cli", key="r2")

    def commit(part):
        with store.staging("quality_filtered_documents", part) as writer:
            writer.commit(code_version="t", config={}, inputs={}, counts={})

    commit("web/r1")
    assert unmaterialized(store, "quality_filtered_documents", ["web", "ref"], [first, second]) == ["ref/r1", "web/r2"]
    assert unmaterialized(store, "quality_filtered_documents", ["web"], [first, second]) == ["web/r2"]
    commit("ref/r1")
    commit("web/r2")
    assert unmaterialized(store, "quality_filtered_documents", ["web", "ref", "new"], [first, second]) == []


def test_machines_with_their_own_caches_lose_no_registry_entry(s3_endpoint, tmp_path):  # noqa: F811
    """With S3 storage each machine (pod) has its own KILN_HOME cache, so the registries' file lock serialized
    nothing: a machine that pulled the list before another appended to it rewrote S3 from its stale copy, and the
    other's removal request (or refresh) was gone, both commands having reported success."""
    from kiln.common.remote import S3Remote
    from kiln.governance.forget import load_requests, record_request

    client = s3_client(s3_endpoint)
    client.create_bucket(Bucket="kiln-test")

    def machine(name):
        return Store(tmp_path / name, S3Remote.connect(client, "kiln-test", "kiln"))

    record_request(machine("ops"), None, "url_pattern", "^https://old/", reason="first")
    register_refresh(machine("ops"), None, "initial", key="r1")
    a, b = machine("pod-a"), machine("pod-b")
    for pod in (a, b):  # both read the lists before either appends
        assert len(load_requests(pod)[0]) == 1 and len(load_refreshes(pod)) == 1
    record_request(a, None, "url_pattern", "^https://jane/", reason="erasure")
    record_request(b, None, "url_pattern", "^https://acme/", reason="dmca")
    register_refresh(a, {"web": [LandedFile("/a", "a", 1, "t")]}, "cli", key="r2")
    register_refresh(b, {"web": [LandedFile("/b", "b", 1, "t")]}, "cli", key="r3")
    fresh = machine("fresh")
    assert [r.reason for r in load_requests(fresh)[0]] == ["first", "erasure", "dmca"]
    assert [r.key for r in load_refreshes(fresh)] == ["r1", "r2", "r3"]
