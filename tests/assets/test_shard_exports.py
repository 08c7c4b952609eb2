"""The shard_exports asset through Dagster: it follows the config's `shards.export`, carries the lineage of the
token shards it came from and checks its own files."""

import json

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from kiln.common.storage import write_parquet_atomic
from kiln.tokens.shard_format import ShardInfo, describe_shard_set, write_shard
from kiln.tokens.shard_writer import MEMBERS_SCHEMA, POSITIONS_SCHEMA
from tests.assets.project import load_project
from tests.conftest import SERIAL_ENGINE, prose, write_jsonl

SHA = "ab" * 32
# (split, documents): each document's tokens end with EOS (2)
SHARDS = [("train", [[10, 11, 2], [12, 2]]), ("train", [[13, 14, 15, 2]]), ("val", [[16, 2]])]


def project_with(export, tmp_path, kiln_home, monkeypatch):
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": i, "text": prose(i)} for i in range(3)])
    config = {"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC0",
                           "domain": "web", "profile": "none"}],
              "profiles": {"none": []}, "engine": SERIAL_ENGINE, "shards": {"export": export}}
    return load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)


def commit_token_shards(project, shards=SHARDS, requests=()) -> str:
    """A small token_shards version of the current refresh, as the token_shards asset commits one."""
    with project.store.staging("token_shards", project.current()) as writer:
        infos, positions = [], []
        for k, (split, docs) in enumerate(shards):
            path = writer.next_path("shard", ".bin")
            tokens = np.array([t for d in docs for t in d], np.uint16)
            write_shard(path, tokens, np.cumsum([0] + [len(d) for d in docs]).astype(np.uint64), SHA)
            infos.append(ShardInfo(path.name, split, "main" if split == "train" else "val", 0, len(tokens), len(docs)))
            positions += [(path.name, i, f"doc{k}{i}") for i in range(len(docs))]
        write_parquet_atomic(writer.next_path("positions"), pa.table(
            {"shard": [p[0] for p in positions], "index": [p[1] for p in positions],
             "doc_id": [p[2] for p in positions]}, schema=POSITIONS_SCHEMA))
        write_parquet_atomic(writer.next_path("members"), pa.table(
            {"doc_id": [p[2] for p in positions], "source": ["web"] * len(positions),
             "split": [s for s, docs in shards for _ in docs], "copies": [1] * len(positions),
             "tokens": [len(d) for _, docs in shards for d in docs],
             **{c: [None] * len(positions) for c in ("removed_by", "license", "language", "locator")}},
            schema=MEMBERS_SCHEMA))
        manifest = writer.commit(code_version="t", config={"removal_requests": list(requests)}, inputs={}, counts={},
                                 stats=describe_shard_set(SHA, 500, 2, infos))
    return manifest.data_version


def spec_of(project, key: str):
    return next(s for s in project.definitions.defs.resolve_all_asset_specs() if s.key.to_user_string() == key)


def test_exports_follow_the_shards_with_their_lineage(tmp_path, kiln_home, monkeypatch):
    project = project_with(["megatron", "parquet"], tmp_path, kiln_home, monkeypatch)
    assert spec_of(project, "shard_exports").automation_condition.get_label() == "eager"
    shards_version = commit_token_shards(project)
    result = project.materialize(["shard_exports"])
    assert result.success
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == "matches_shards" and check.passed, check.metadata
    refresh = project.current()
    manifest = project.store.manifest("shard_exports", refresh)
    assert manifest.inputs == {f"token_shards/{refresh}": shards_version}
    assert manifest.stats["source"]["data_version"] == shards_version and manifest.stats["export_version"] == 1
    assert manifest.counts == {"train_documents": 3, "train_tokens": 9, "val_documents": 1, "val_tokens": 2}
    assert sorted(f.path for f in manifest.files) == [
        "export.json", "megatron/train.bin", "megatron/train.idx", "megatron/val.bin", "megatron/val.idx",
        "parquet/train-00000.parquet", "parquet/train-00001.parquet", "parquet/val-00000.parquet"]
    assert {f.path: f.rows for f in manifest.files if f.path.startswith("parquet/")} == {
        "parquet/train-00000.parquet": 2, "parquet/train-00001.parquet": 1, "parquet/val-00000.parquet": 1}
    event = result.asset_materializations_for_node("shard_exports")[0]
    assert event.metadata["data_version"].value == manifest.data_version
    base = project.store.dataset_dir("shard_exports", refresh)
    rows = pa.concat_tables([pq.read_table(base / f"parquet/train-0000{i}.parquet") for i in (0, 1)])
    assert rows.column("input_ids").to_pylist() == [[10, 11, 2], [12, 2], [13, 14, 15, 2]]
    assert rows.column("doc_id").to_pylist() == ["doc00", "doc01", "doc10"]
    assert (base / "megatron" / "train.bin").read_bytes() == np.array([10, 11, 2, 12, 2, 13, 14, 15, 2],
                                                                       "<u2").tobytes()


def test_an_export_is_of_the_shards_version_it_records_when_they_are_replaced_meanwhile(tmp_path, kiln_home,
                                                                                        monkeypatch):
    """token_shards materialized again after shard_exports read their manifest and before it read their files (a
    refresh's takedown, say): the export holds the version it records as its input, not the new files under the
    old version's name."""
    import assets.tokens

    project = project_with(["megatron"], tmp_path, kiln_home, monkeypatch)
    recorded = commit_token_shards(project)
    export = assets.tokens.export_shards

    def replaced_meanwhile(shard_dir, out_dir, formats):
        commit_token_shards(project, [("train", [[20, 21, 2]]), ("val", [[22, 2]])])
        return export(shard_dir, out_dir, formats)

    monkeypatch.setattr(assets.tokens, "export_shards", replaced_meanwhile)
    assert project.materialize(["shard_exports"]).success
    refresh = project.current()
    assert project.store.manifest("token_shards", refresh).data_version != recorded  # it was replaced
    assert project.store.manifest("shard_exports", refresh).inputs == {f"token_shards/{refresh}": recorded}
    base = project.store.dataset_dir("shard_exports", refresh)
    assert (base / "megatron" / "train.bin").read_bytes() == np.array([10, 11, 2, 12, 2, 13, 14, 15, 2],
                                                                       "<u2").tobytes()


def test_no_export_configured_writes_nothing_and_does_not_follow(tmp_path, kiln_home, monkeypatch):
    project = project_with([], tmp_path, kiln_home, monkeypatch)
    assert spec_of(project, "shard_exports").automation_condition is None
    commit_token_shards(project)
    assert project.materialize(["shard_exports"]).success
    manifest = project.store.manifest("shard_exports", project.current())
    assert [f.path for f in manifest.files] == ["export.json"] and manifest.stats["formats"] == []
    export = json.loads((project.store.dataset_dir("shard_exports", project.current()) / "export.json").read_text())
    assert export["splits"]["train"]["documents"] == 3 and "megatron_prefix" not in export["splits"]["train"]



def test_an_export_replaced_after_a_takedown_is_removed_from_disk(tmp_path, kiln_home, monkeypatch):
    """token_shards that apply a new removal request drop the documents it names; the export made of them must not
    leave the export of the shards before on disk for a Megatron or HF run to read (a replaced version is otherwise
    kept for readers for `keep_replaced_minutes`). An export of shards that applied nothing new keeps that grace."""
    project = project_with(["megatron"], tmp_path, kiln_home, monkeypatch)
    refresh = project.current()
    versions = lambda: sorted(p.name for p in project.store.dataset_dir("shard_exports", refresh).parent.glob(  # noqa: E731
        f".{refresh}.v-*") if p.is_dir())
    commit_token_shards(project)
    assert project.materialize(["shard_exports"]).success
    commit_token_shards(project, SHARDS[:2])  # shards written again, no new request: the old export is kept a while
    assert project.materialize(["shard_exports"]).success
    assert len(versions()) == 2
    commit_token_shards(project, [("train", [[10, 11, 2]]), ("val", [[16, 2]])], requests=["req-1"])
    assert project.materialize(["shard_exports"]).success
    assert len(versions()) == 1
    assert project.store.manifest("shard_exports", refresh).config["removal_requests"] == ["req-1"]
    base = project.store.dataset_dir("shard_exports", refresh)
    assert (base / "megatron" / "train.bin").read_bytes() == np.array([10, 11, 2], "<u2").tobytes()


def test_shards_holding_documents_a_request_recorded_since_names_are_not_exported(tmp_path, kiln_home, monkeypatch):
    """As training_run refuses them: a Megatron or HF run reads the export, so shards written before a removal request
    that names one of their documents are not exported (the export would be a new copy of its tokens, made after
    the takedown). Shards that applied it are exported; a request naming none of their documents stops nothing."""
    from kiln.governance.forget import REQUESTS, REQUESTS_FILE

    project = project_with(["megatron"], tmp_path, kiln_home, monkeypatch)
    refresh = project.current()
    commit_token_shards(project)
    with project.store.staging(REQUESTS) as writer:
        requests = [{"request_id": f"req-{d}", "created_at": "t", "kind": "doc_ids", "value": [d], "reason": ""}
                    for d in ("doc00", "elsewhere")]
        (writer.dir / REQUESTS_FILE).write_text(json.dumps({"requests": requests}), encoding="utf-8")
        writer.commit(code_version="kiln.forget", config={}, inputs={}, counts={"requests": 2})
    result = project.materialize(["shard_exports"], raise_on_error=False)
    [failure] = result.get_step_failure_events()
    assert "removal request(s) req-doc00 name, recorded after they were written" in \
        failure.step_failure_data.user_failure_data.description
    assert project.store.manifest_or_none("shard_exports", refresh) is None  # nothing written
    commit_token_shards(project, [("train", [[12, 2]]), ("train", [[13, 14, 15, 2]]), ("val", [[16, 2]])],
                        requests=["req-doc00", "req-elsewhere"])
    assert project.materialize(["shard_exports"]).success
    base = project.store.dataset_dir("shard_exports", refresh)
    assert (base / "megatron" / "train.bin").read_bytes() == np.array([12, 2, 13, 14, 15, 2], "<u2").tobytes()
