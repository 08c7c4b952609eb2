"""The whole data chain through Dagster with `storage.backend: s3`, against moto's server on loopback:
every artifact lands in the bucket, and with the local cache deleted the chain comes back from S3."""

import hashlib
import json
import shutil
import string
from pathlib import Path

import numpy as np
import pytest
import yaml

from kiln.common.manifest import MANIFEST_NAME
from kiln.common.remote import S3Remote
from kiln.common.storage import Store
from tests.assets.project import load_project
from tests.audit_store import edit, random_text
from tests.conftest import SERIAL_ENGINE, web_and_ref_sources, write_jsonl
from tests.run_folders import make_run
from tests.s3 import _moto_server, s3_client, s3_endpoint  # noqa: F401 (fixtures)

BUCKET, PREFIX = "kiln-chain", "team/kiln"
SOURCES = ("web", "ref")
PER_SOURCE = ["raw_documents", "filtered_documents", "curated_documents", "minhash_signatures",
              "deduplicated_documents", "quality_scores", "quality_filtered_documents"]
PER_REFRESH = ["dedup_index", "token_shards"]
SINGLE = ["quality_classifier", "tokenizer", "refreshes"]


@pytest.fixture
def project(tmp_path, kiln_home, monkeypatch, s3_endpoint):  # noqa: F811
    rng = np.random.default_rng(0)
    vocab = ["".join(rng.choice(list(string.ascii_lowercase), 6)) for _ in range(5000)]
    ref = [random_text(rng, vocab) for _ in range(8)]
    web = [edit(t, rng, vocab) for t in ref[:3]] + [random_text(rng, vocab) for _ in range(6)]
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(ref)])
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": f"w-{i}", "text": t} for i, t in enumerate(web)])
    config = {
        "sources": web_and_ref_sources(tmp_path),
        "profiles": {"none": []},
        "engine": SERIAL_ENGINE, "decontamination": {"enabled": False},
        "quality": {"classifier": {"folds": 2, "epochs": 5, "quantize_cutoff": 1000}},
        "tokenizer": {"vocab_size": 400},
        "shards": {"seq_len": 16, "val_fraction": 0.2},
        "training": {"model": {"preset": "tiny"}, "micro_batch_size": 2, "max_steps": 4, "log_every_steps": 2,
                     "checkpoint": {"every_steps": 2, "keep_last": 1}},
        "storage": {"backend": "s3", "bucket": BUCKET, "prefix": PREFIX, "create_bucket": True},
    }
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    project.ref_texts = ref
    return project


def materialize(project, selection, partition=None):
    result = project.materialize(selection, partition)
    assert result.success
    failed = [(e.asset_key.to_user_string(), e.check_name) for e in result.get_asset_check_evaluations()
              if not e.passed and e.check_name != "separates"]  # a 17-document classifier need not separate well
    assert not failed, failed
    return result


def datasets(refresh: str) -> list[tuple[str, str]]:
    return [(a, f"{s}/{refresh}") for a in PER_SOURCE for s in SOURCES] + [(a, refresh) for a in PER_REFRESH] + \
        [(a, "_all") for a in SINGLE]


@pytest.mark.slow
def test_the_whole_data_chain_round_trips_through_s3(project, s3_endpoint, tmp_path, capsys):  # noqa: F811
    home, client = project.home, s3_client(s3_endpoint)
    for wave in (["raw_documents", "filtered_documents"], ["curated_documents", "minhash_signatures"]):
        for source in SOURCES:
            materialize(project, wave, source)
    materialize(project, ["dedup_index"])
    for source in SOURCES:
        materialize(project, ["deduplicated_documents"], source)
    materialize(project, ["quality_classifier"])
    for source in SOURCES:
        materialize(project, ["quality_scores", "quality_filtered_documents"], source)
    materialize(project, ["tokenizer"])
    materialize(project, ["token_shards"])
    refresh = project.current()

    # Every dataset's manifest on S3 is the local one, and every file it lists is there with its sha256.
    keys = {o["Key"] for page in client.get_paginator("list_objects_v2").paginate(Bucket=BUCKET)
            for o in page.get("Contents", [])}
    for asset, partition in datasets(refresh):
        remote_dir = f"{PREFIX}/{asset}/{partition}"
        data = client.get_object(Bucket=BUCKET, Key=f"{remote_dir}/{MANIFEST_NAME}")["Body"].read()
        assert data == (home / "data" / asset / partition / MANIFEST_NAME).read_bytes(), (asset, partition)
        manifest = json.loads(data)
        assert manifest["files"], (asset, partition)
        for f in manifest["files"]:
            body = client.get_object(Bucket=BUCKET, Key=f"{remote_dir}/{manifest['data_version']}/{f['path']}")
            assert hashlib.sha256(body["Body"].read()).hexdigest() == f["sha256"], (asset, partition, f["path"])
    assert {k for k in keys if k.endswith(MANIFEST_NAME)} == \
        {f"{PREFIX}/{a}/{p}/{MANIFEST_NAME}" for a, p in datasets(refresh)}
    assert not any(k.startswith(f"{PREFIX}/_dedup_index/") for k in keys)  # the index is in the datasets
    index_files = {f["path"] for f in json.loads((home / "data" / "dedup_index" / refresh / MANIFEST_NAME).read_text())
                   ["files"]}
    assert "index/_index.json" in index_files and any(p.startswith("index/buckets/") for p in index_files)
    tokenizer = json.loads((home / "data" / "tokenizer" / "_all" / MANIFEST_NAME).read_text())
    assert {"tokenizer.model"} <= {f["path"] for f in tokenizer["files"]}
    shards = json.loads((home / "data" / "token_shards" / refresh / MANIFEST_NAME).read_text())

    # A fresh Store with an empty cache reads every dataset back, byte for byte.
    fresh = Store(tmp_path / "fresh", S3Remote.connect(client, BUCKET, PREFIX))
    for asset, partition in datasets(refresh):
        local = fresh.dataset_dir(asset, None if partition == "_all" else partition)
        original = home / "data" / asset / partition
        for f in fresh.manifest(asset, None if partition == "_all" else partition).files:
            assert (local / f.path).read_bytes() == (original / f.path).read_bytes(), (asset, partition, f.path)

    # Lose the whole local cache: token_shards is rebuilt from S3 alone, identically.
    shutil.rmtree(home / "data")
    materialize(project, ["token_shards"])
    again = json.loads((home / "data" / "token_shards" / refresh / MANIFEST_NAME).read_text())
    assert again["data_version"] == shards["data_version"] and again["inputs"] == shards["inputs"]
    assert (home / "data" / "tokenizer" / "_all" / "tokenizer.model").is_file()  # pulled from S3 to read it

    from training_jobs.loader import ShardLoader

    loader = ShardLoader(home / "data" / "token_shards" / refresh, batch_size=2,
                         expected_tokenizer_sha256=tokenizer["stats"]["card"]["sha256"])
    assert loader.next_batch()[0].shape == (2, 16)

    # dedup_index again without its local cache: the same decisions and index, byte for byte (a refresh decides
    # against the earlier refreshes' indexes only, so re-running one is idempotent).
    first = json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/dedup_index/{refresh}/{MANIFEST_NAME}")
                       ["Body"].read())
    shutil.rmtree(home / "data")
    result = materialize(project, ["dedup_index"])
    meta = result.asset_materializations_for_node("dedup_index")[0].metadata
    per_source = meta["decisions_per_source"].value
    assert {s: per_source[s]["kept"] for s in SOURCES} == {"ref": 8, "web": 6}
    assert per_source["web"]["near_duplicate"] == 3 and meta["index_documents"].value == 14
    again = json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/dedup_index/{refresh}/{MANIFEST_NAME}")
                       ["Body"].read())
    assert again["data_version"] == first["data_version"]

    # `kiln audit` reads the same store: with the local cache gone, a document's fate comes back from S3.
    from kiln.cli import main

    shutil.rmtree(home / "data")
    ref_text = project.ref_texts[0]
    (tmp_path / "doc.txt").write_text(ref_text)
    assert main(["audit", "membership", "--text", str(tmp_path / "doc.txt"), "--home", str(home),
                 "--config", str(tmp_path / "kiln.yaml"), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["match"] == "exact" and answer["source"] == "ref"
    assert answer["verdict"] in ("in_training", "validation_only"), answer["summary"]
    # ... reading columns from S3 (the intake hashes' bucket, each stage's doc_ids) and the shards' member list
    # alone: no dataset came down but the refreshes' registry (a few kB), not the texts, not the token shards.
    def fetched() -> set[str]:
        return {p.relative_to(home / "data").parts[0] for p in (home / "data").rglob(MANIFEST_NAME)}

    assert fetched() == {"refreshes"}
    # A near-duplicate (a few words changed) is found through the bucket index, a few of its files read from S3.
    (tmp_path / "near.txt").write_text(edit(ref_text, np.random.default_rng(7), ["zebra"], k=2))
    assert main(["audit", "membership", "--text", str(tmp_path / "near.txt"), "--home", str(home),
                 "--config", str(tmp_path / "kiln.yaml"), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["match"] == "near_duplicate" and answer["source"] == "ref", answer["summary"]
    assert fetched() == {"refreshes"}
    assert sorted(p.name for p in (home / "data" / "token_shards").rglob("*.parquet")) == \
        sorted(Path(f["path"]).name for f in shards["files"] if f["role"] == "members")

    # Old runs the store has not named, with storage.keep_old_run_checkpoints 0: one trained here, one trained on
    # another machine (only its copy is on S3).
    from kiln.common.run_mirror import RunMirror

    remote = S3Remote.connect(client, BUCKET, PREFIX)
    for folder in (make_run(home / "runs", "old-here", [2, 4], 100), make_run(tmp_path / "other" / "runs", "old-s3",
                                                                             [3], 100)):
        assert RunMirror(remote, folder).push()
    config = yaml.safe_load((tmp_path / "kiln.yaml").read_text())
    config["storage"]["keep_old_run_checkpoints"] = 0
    (tmp_path / "kiln.yaml").write_text(yaml.safe_dump(config))

    # Training on S3 storage: the run's checkpoint goes up to the bucket beside the datasets (storage.mirror_runs),
    # and a machine without the run folder (KILN_HOME/runs gone: another pod) resumes from it, in the same MLflow run.
    trained = materialize(project, ["training_run"])
    run = json.loads((home / "data" / "training_run" / "_all" / MANIFEST_NAME).read_text())
    run_dir = Path(run["stats"]["run_dir"])
    # the old runs' checkpoints went, here and on S3, once the store took this run; what they did stays
    pruned = trained.asset_materializations_for_node("training_run")[0].metadata["pruned_runs"].value
    assert pruned["runs"] == {"old-here": {"checkpoints": ["step_00000002", "step_00000004"],
                                           "on_s3": ["step_00000002", "step_00000004"]},
                              "old-s3": {"checkpoints": [], "on_s3": ["step_00000003"]}}
    assert pruned["freed_bytes"] >= 200_000  # two checkpoints of 100 kB
    assert not remote.list_keys(f"{PREFIX}/_runs/old-here/checkpoints") + \
        remote.list_keys(f"{PREFIX}/_runs/old-s3/checkpoints")
    assert not (home / "runs" / "old-here" / "checkpoints").exists()
    assert (home / "runs" / "old-here" / "summary.json").is_file()
    assert remote.get_bytes(f"{PREFIX}/_runs/old-s3/run/metrics.jsonl") is not None
    mirrored = f"{PREFIX}/_runs/{run_dir.name}/checkpoints"
    assert trained.asset_materializations_for_node("training_run")[0].metadata["run_copy"].value == \
        f"s3://{BUCKET}/{PREFIX}/_runs/{run_dir.name}"
    on_s3 = {k.removeprefix(mirrored + "/") for page in client.get_paginator("list_objects_v2").paginate(
        Bucket=BUCKET, Prefix=mirrored) for k in (o["Key"] for o in page.get("Contents", []))}
    final = run_dir / "checkpoints" / "step_00000004"
    assert on_s3 == {f"step_00000004/{p.relative_to(final).as_posix()}" for p in final.rglob("*") if p.is_file()}
    assert client.get_object(Bucket=BUCKET, Key=f"{mirrored}/step_00000004/manifest.json")["Body"].read() == \
        (final / "manifest.json").read_bytes()
    shutil.rmtree(home / "runs")
    with RunMirror(remote, tmp_path / "machine-b" / run_dir.name).holding():
        failed = project.materialize(["training_run"], raise_on_error=False)  # while machine b trains it
    message = next(e for e in failed.all_events if e.event_type_value == "STEP_FAILURE").step_failure_data.error.message
    assert "launch.lock is held by a process on" in message and "another machine is training this run" in message
    assert not (home / "runs" / run_dir.name / "checkpoints").exists()  # refused before anything was pulled
    materialize(project, ["training_run"])
    again = json.loads((home / "data" / "training_run" / "_all" / MANIFEST_NAME).read_text())
    assert again["stats"]["summary"]["resumed_from"] == str(final) and again["stats"]["summary"]["steps_this_run"] == 0
    assert again["stats"]["mlflow"]["run_id"] == run["stats"]["mlflow"]["run_id"]

    # The checkpoint asset on a third machine (no run folder at all): the run's exports come down from the bucket.
    shutil.rmtree(home / "runs")
    result = materialize(project, ["checkpoint"])
    assert all(e.passed for e in result.get_asset_check_evaluations())  # `loads`: the export gives the probe's loss
    assert (home / "runs" / run_dir.name / "export" / "safetensors" / "model.safetensors").is_file()

    # On a fresh machine `kiln audit lineage` answers from S3's manifests: no dataset's files are fetched (not the
    # documents, not the checkpoint's weights).
    shutil.rmtree(home / "data")
    capsys.readouterr()
    assert main(["audit", "lineage", "checkpoint", "--home", str(home), "--config", str(tmp_path / "kiln.yaml"),
                 "--json"]) == 0
    nodes = {n["key"] for n in json.loads(capsys.readouterr().out)["nodes"]}
    assert {"checkpoint", "training_run", f"token_shards/{refresh}", f"raw_documents/web/{refresh}"} <= nodes
    assert not (home / "data").exists()  # nothing written to the cache at all
    # ... and its data card reads the licence and language columns of the documents from S3, nothing whole
    assert main(["audit", "card", "--home", str(home), "--config", str(tmp_path / "kiln.yaml"), "--json"]) == 0
    card = json.loads(capsys.readouterr().out)
    assert card["checkpoint"]["path"] == f"s3://{BUCKET}/{PREFIX}/checkpoint/_all"  # where it is kept, not a cache
    counted = card["licenses"]["per_source"]
    assert {n: v["counted_from"] for n, v in counted.items()} == {s: "documents" for s in SOURCES}, counted
    assert all(sum(row["documents"] for row in v["licenses"].values()) > 0 for v in counted.values()), counted
    assert fetched() <= {"refreshes", "removal_requests"}  # the registries

    # A cache bounded far below one dataset (storage.cache_max_gb), with no grace (keep_replaced_minutes 0): every
    # download evicts what earlier steps read, never what the running step has read, and the datasets come out the
    # same. Without that (the running steps' lists of what they read), dedup_index lost its inputs to its own later
    # downloads.
    config = yaml.safe_load((tmp_path / "kiln.yaml").read_text())
    config["storage"] |= {"cache_max_gb": 0.00001, "keep_replaced_minutes": 0}
    (tmp_path / "kiln.yaml").write_text(yaml.safe_dump(config))
    capsys.readouterr()
    materialize(project, ["dedup_index"])
    materialize(project, ["token_shards"])
    assert "over storage.cache_max_gb (1e-05 GB): removed " in capsys.readouterr().err
    for asset, version in (("dedup_index", first["data_version"]), ("token_shards", shards["data_version"])):
        assert json.loads(client.get_object(Bucket=BUCKET, Key=f"{PREFIX}/{asset}/{refresh}/{MANIFEST_NAME}")
                          ["Body"].read())["data_version"] == version
