"""`kiln dedup migrate-index`: a store whose near-dup index is the old single index (built here by the old code
path: near_dedup committing to a LocalIndex or a Redis index, the dedup_index datasets holding only decisions) gets
per-refresh bucket indexes, and the next refresh decides exactly as near_dedup against the old index would have."""

import numpy as np
import pyarrow as pa
import pytest
import yaml

from kiln.cli import main
from kiln.common.config import NearDedup
from kiln.common.storage import Store
from kiln.dedup.bucket_index import index_params, read_index_meta
from kiln.dedup.buckets import decide_distributed, read_decisions
from kiln.dedup.migrate import MigrationError, OldLocalIndex, migrate_index
from kiln.governance.audit import lineage
from kiln.governance.refresh import LandedFile, register_refresh
from tests.conftest import web_and_ref_sources
from tests.kiln.dedup.test_dedup import edited, signature_table, vocabulary
from tests.kiln.dedup.test_dedup_buckets import assert_same, family_texts, write_parts
from tests.old_near_dedup import Batch, RedisIndex, near_dedup, open_index
from tests.redis_server import PASSWORD, redis_server
from tests.s3 import _moto_server, s3_endpoint  # noqa: F401 (fixtures)

NEAR = NearDedup(scheme="affine32")  # every old index was built with affine32 (its params say so)
INDEX = "dedup_index"


def table(source: str, texts: list[str], ids: list[str] | None = None) -> pa.Table:
    return signature_table(source, texts, ids, near=NEAR)


def families(seed: int) -> list[tuple[str, int, pa.Table]]:
    texts = family_texts(seed)
    return [(s, tier, table(s, texts[s])) for s, tier in (("web", 2), ("ref", 1), ("forum", 2))]


def old_refresh(store: Store, idx, key: str, tables) -> pa.Table:
    """One refresh as the old dedup_index asset ran it: near_dedup against the index, commit, decisions only."""
    register_refresh(store, None if key == "r0" else {"web": [LandedFile(key, key, 1, "t")]},
                     "initial" if key == "r0" else "cli", key=key)
    batch = Batch.from_tables([(tier, t) for _, tier, t in tables])
    result = near_dedup(batch, idx, NEAR, key, progress=False)
    idx.commit()
    with store.staging(INDEX, key) as writer:
        writer.write("decisions", result.decisions)
        writer.commit(code_version="old", config={"near": NEAR.model_dump(mode="json")}, inputs={},
                      counts={"documents": len(batch)}, stats={"per_source": result.stats["per_source"]})
    return result.decisions


def corpora():
    """Three refreshes: families, then re-sent and edited copies of them and new families, then more copies."""
    first = families(2)
    rng = np.random.default_rng(9)
    vocab = vocabulary(rng, 5_000)
    texts = [" ".join(edited(t.split(), 1, rng, vocab)) for s in ("web", "forum") for t in family_texts(2)[s][:15]]
    second = [("web", 2, first[0][2].slice(0, 12)), ("copies", 1, table("copies", texts[:20])),
              ("n-web", 2, table("n-web", family_texts(4, 10)["web"]))]
    third = [("web", 2, first[0][2].slice(5, 10)),  # accepted by r0: already indexed
             ("again", 1, table("again", texts[10:], [f"x{i}" for i in range(len(texts) - 10)])),
             ("n-ref", 1, table("n-ref", family_texts(5, 10)["ref"]))]
    return first, second, third


def test_an_old_local_index_migrates_and_the_next_refresh_decides_as_the_old_index_would(tmp_path):
    store = Store(tmp_path / "data")
    first, second, third = corpora()
    with open_index(NEAR, tmp_path / "dedup_index") as idx:
        old = [old_refresh(store, idx, key, tables) for key, tables in (("r0", first), ("r1", second))]
    before = {r: store.manifest(INDEX, r) for r in ("r0", "r1")}
    # A consumer of the old decisions (as deduplicated_documents records them).
    with store.staging("deduplicated_documents", "web/r1") as writer:
        writer.write("documents", pa.table({"doc_id": ["web-0"]}))
        writer.commit(code_version="old", config={}, inputs={f"{INDEX}/r1": before["r1"].data_version}, counts={})

    assert main(["dedup", "migrate-index", "--home", str(tmp_path), "--config", str(_config(tmp_path))]) == 0
    for r, decisions in zip(("r0", "r1"), old):
        manifest = store.manifest(INDEX, r)
        assert store.read_table(INDEX, r, "decisions").equals(decisions)  # the decisions are untouched
        assert manifest.counts == before[r].counts and manifest.data_version != before[r].data_version
        meta = read_index_meta(store.dataset_dir(INDEX, r) / "index")
        assert meta["batch"] == r and meta["documents"] == decisions.column("status").to_pylist().count("kept")
        assert {"index_buckets", "index_ids", "index_docs"} <= {f.role for f in manifest.files}
    # A new data version (the file list grew), yet the consumer read these very decisions: not superseded.
    chain = lineage(store, "deduplicated_documents/web/r1")
    assert chain.node(f"{INDEX}/r1").status == "current" and chain.problems == []
    # Run again: nothing left to do, nothing rewritten.
    again = migrate_index(store, OldLocalIndex(tmp_path / "dedup_index" / "kiln"), NEAR)
    assert again == {"migrated": {}, "already_migrated": ["r0", "r1"]}
    assert store.manifest(INDEX, "r1").data_version != before["r1"].data_version

    # The next refresh: the old index (the second implementation) against the migrated bucket indexes.
    with open_index(NEAR, tmp_path / "dedup_index") as idx:
        want = near_dedup(Batch.from_tables([(tier, t) for _, tier, t in third]), idx, NEAR, "r2",
                          progress=False).decisions
    parts, sources = write_parts(tmp_path / "sig", third, 6)
    decide_distributed(parts, sources, [store.dataset_dir(INDEX, r) / "index" for r in ("r0", "r1")],
                       tmp_path / "work", tmp_path / "out", NEAR, "r2", partitions=3)
    got = read_decisions(tmp_path / "out")
    assert_same(got, want)
    statuses = want.column("status").to_pylist()
    assert statuses.count("already_indexed") >= 3 and statuses.count("near_duplicate") >= 10


def test_an_old_redis_index_migrates_and_the_next_refresh_decides_as_the_old_index_would(tmp_path, monkeypatch,
                                                                                            capsys):
    """Redis kept no signatures: the migration recomputes them from the shingle sets. The URL (with a password)
    comes from KILN_REDIS_URL, and the password shows nowhere."""
    store = Store(tmp_path / "data")
    first, second, third = corpora()
    with redis_server(tmp_path) as url:
        with RedisIndex(url, "kiln", index_params(NEAR)) as idx:
            old = [old_refresh(store, idx, key, tables) for key, tables in (("r0", first), ("r1", second))]
        monkeypatch.setenv("KILN_REDIS_URL", url)
        assert main(["dedup", "migrate-index", "--redis", "env", "--home", str(tmp_path),
                     "--config", str(_config(tmp_path))]) == 0
        # The next refresh on the old path: near_dedup against the Redis index.
        with RedisIndex(url, "kiln", index_params(NEAR)) as idx:
            want = near_dedup(Batch.from_tables([(tier, t) for _, tier, t in third]), idx, NEAR, "r2",
                              progress=False).decisions
    printed = capsys.readouterr()
    assert "bucket index of" in printed.out and PASSWORD not in printed.out + printed.err
    assert not any(PASSWORD.encode() in f.read_bytes() for f in (tmp_path / "data").rglob("*") if f.is_file())
    for r, decisions in zip(("r0", "r1"), old):
        assert store.read_table(INDEX, r, "decisions").equals(decisions)
        meta = read_index_meta(store.dataset_dir(INDEX, r) / "index")
        assert meta["batch"] == r and meta["documents"] == decisions.column("status").to_pylist().count("kept")

    parts, sources = write_parts(tmp_path / "sig", third, 6)
    decide_distributed(parts, sources, [store.dataset_dir(INDEX, r) / "index" for r in ("r0", "r1")],
                       tmp_path / "work", tmp_path / "out", NEAR, "r2", partitions=3)
    assert_same(read_decisions(tmp_path / "out"), want)
    statuses = want.column("status").to_pylist()
    assert statuses.count("already_indexed") >= 3 and statuses.count("near_duplicate") >= 10


def test_an_unreachable_redis_exits_2_without_the_password(tmp_path, capsys):
    register_refresh(Store(tmp_path / "data"), None, "initial", key="r0")
    with redis_server(tmp_path) as url:
        pass  # stopped: nothing listens on its port now
    assert main(["dedup", "migrate-index", "--redis", url, "--home", str(tmp_path),
                 "--config", str(_config(tmp_path))]) == 2
    printed = capsys.readouterr()
    assert "cannot reach Redis" in printed.err and PASSWORD not in printed.out + printed.err


def test_redis_env_without_kiln_redis_url_exits_2_naming_the_variable(tmp_path, capsys, monkeypatch):
    monkeypatch.delenv("KILN_REDIS_URL", raising=False)
    register_refresh(Store(tmp_path / "data"), None, "initial", key="r0")
    assert main(["dedup", "migrate-index", "--redis", "env", "--home", str(tmp_path),
                 "--config", str(_config(tmp_path))]) == 2
    assert "--redis env: KILN_REDIS_URL is not set; export it" in capsys.readouterr().err


def test_documents_of_an_unknown_refresh_stop_the_migration(tmp_path):
    store = Store(tmp_path / "data")
    first, _, _ = corpora()
    with open_index(NEAR, tmp_path / "idx") as idx:
        old_refresh(store, idx, "r0", first)
        near_dedup(Batch.from_tables([(1, table("x", ["some words here and there for a text"]))]), idx,
                   NEAR, "elsewhere", progress=False)
        idx.commit()
    with pytest.raises(MigrationError, match="elsewhere"):
        migrate_index(store, OldLocalIndex(tmp_path / "idx" / "kiln"), NEAR)
    assert not (store.dataset_dir(INDEX, "r0") / "index").exists()
    with pytest.raises(MigrationError, match=r"dedup\.near\.num_perm: index 128, config 64.*restore.*backfill"):
        migrate_index(store, OldLocalIndex(tmp_path / "idx" / "kiln"), NEAR.model_copy(update={"num_perm": 64}))


def test_an_old_index_is_refused_under_the_default_scheme_naming_it_and_the_ways_forward(tmp_path, capsys):
    store = Store(tmp_path / "data")
    first, _, _ = corpora()
    with open_index(NEAR, tmp_path / "dedup_index") as idx:
        old_refresh(store, idx, "r0", first)
    with pytest.raises(MigrationError) as refused:
        migrate_index(store, OldLocalIndex(tmp_path / "dedup_index" / "kiln"), NearDedup())
    message = str(refused.value)
    for part in ["dedup.near.scheme: index 'affine32', config 'fss-splitmix64-v1'", "restore those settings",
                 "skip the migration and backfill", "re-materialize minhash_signatures"]:
        assert part in message, part
    assert "num_perm" not in message
    assert not (store.dataset_dir(INDEX, "r0") / "index").exists()
    # The command: exit 2 with the same explanation; then with the scheme restored it migrates.
    assert main(["dedup", "migrate-index", "--home", str(tmp_path), "--config", str(_config(tmp_path, None))]) == 2
    assert "dedup.near.scheme: index 'affine32'" in capsys.readouterr().err
    assert main(["dedup", "migrate-index", "--home", str(tmp_path), "--config", str(_config(tmp_path))]) == 0
    assert read_index_meta(store.dataset_dir(INDEX, "r0") / "index")["params"]["scheme"] == "affine32"


def _config(tmp_path, scheme: str | None = "affine32"):
    path = tmp_path / "kiln.yaml"
    dedup = {"dedup": {"near": {"scheme": scheme}}} if scheme else {}
    path.write_text(yaml.safe_dump({"sources": web_and_ref_sources(tmp_path), "profiles": {"none": []}, **dedup}))
    return path


def test_an_old_index_kept_on_s3_migrates(s3_endpoint, tmp_path):  # noqa: F811
    """With `storage.backend: s3` and no `--from`, the old index is pulled from `<prefix>/_dedup_index/<name>/`: each
    segment's files went to a folder nobody created, so the documented upgrade path of an S3 store always failed
    (FileNotFoundError)."""
    from kiln.common.remote import S3Remote
    from tests.s3 import s3_client

    client = s3_client(s3_endpoint)
    client.create_bucket(Bucket="kiln-test")
    store = Store(tmp_path / "data", S3Remote.connect(client, "kiln-test", "kiln"))
    first, second, _ = corpora()
    with open_index(NEAR, tmp_path / "old" / "dedup_index") as idx:
        old = [old_refresh(store, idx, key, tables) for key, tables in (("r0", first), ("r1", second))]
    folder = tmp_path / "old" / "dedup_index" / "kiln"
    for path in folder.rglob("*"):
        if path.is_file():
            client.upload_file(str(path), "kiln-test", f"kiln/_dedup_index/kiln/{path.relative_to(folder).as_posix()}")
    config = _config(tmp_path)
    config.write_text(config.read_text() + "storage: {backend: s3, bucket: kiln-test, prefix: kiln}\n")

    assert main(["dedup", "migrate-index", "--home", str(tmp_path), "--config", str(config)]) == 0
    for r, decisions in zip(("r0", "r1"), old):
        meta = read_index_meta(store.dataset_dir(INDEX, r) / "index")
        assert meta["batch"] == r and meta["documents"] == decisions.column("status").to_pylist().count("kept")
