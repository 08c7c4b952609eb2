"""The data_card asset through Dagster, on the audit test store (tests/audit_store.py: a stand-in
checkpoint, no training; test_training_assets.py materializes it after a real run)."""

import json

import pytest

from tests.audit_store import build_audit_store


@pytest.fixture
def built(tmp_path, monkeypatch):
    return build_audit_store(tmp_path, monkeypatch)


def test_data_card_asset_writes_markdown_and_json_with_lineage(built):
    store = built["store"]
    result = built["project"].materialize(["data_card"])
    assert result.success
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == "lineage_complete" and check.passed, check.metadata
    metadata = result.asset_materializations_for_node("data_card")[0].metadata
    base = store.dataset_dir("data_card")
    markdown = (base / "data_card.md").read_text()
    assert "# Data card: checkpoint" in markdown
    # The UI's copy is the page with the funnel chart inlined (the file links the PNG beside it).
    assert metadata["data_card"].value.split("![")[0] == markdown.split("![")[0]
    assert "](data_card_funnel.png)" in markdown and "](data:image/png;base64," in metadata["data_card"].value
    assert metadata["checkpoint"].value == built["checkpoint"].data_version
    assert "abc123" in metadata["mlflow_run"].value  # the local store's run, as MlflowTracking names it
    card = json.loads((base / "data_card.json").read_text())
    manifest = store.manifest("data_card")
    assert metadata["data_version"].value == manifest.data_version
    assert {f.path for f in manifest.files} == {"data_card.md", "data_card.json", "data_card_funnel.png"}
    assert manifest.inputs["checkpoint"] == built["checkpoint"].data_version
    web = built["project"].partition("web")
    assert manifest.inputs[f"raw_documents/{web}"] == store.manifest("raw_documents", web).data_version
    assert "evaluation" not in manifest.inputs and card["evaluation"] is None  # not materialized: said, not a crash
    assert [s["name"] for s in card["sources"]] == ["web", "ref"]


def test_the_cards_inputs_are_the_versions_its_checkpoint_read(built):
    """After the training, a removal request; web's quality filter and the token shards are materialized again, then
    the card. The card describes the checkpoint's own (now replaced) versions, and its manifest must record those as
    its inputs, not the versions materialized since that the checkpoint never read; the removal requests, which the
    card shows as they are now, at the store's current version."""
    from kiln.governance.forget import record_request

    store, project = built["store"], built["project"]
    web, refresh = project.partition("web"), project.current()
    trained = {f"quality_filtered_documents/{web}": store.manifest("quality_filtered_documents", web).data_version,
               f"token_shards/{refresh}": store.manifest("token_shards", refresh).data_version}
    doc = next(d for d, r in built["members"].items() if r["source"] == "web" and r["split"] == "train")
    record_request(store, built["config"], "doc_ids", [doc], "asked")
    assert project.materialize(["quality_filtered_documents"], partition="web").success
    assert project.materialize(["token_shards"]).success
    for key, version in trained.items():
        assert store.manifest(*key.split("/", 1)).data_version != version  # both replaced since
    assert project.materialize(["data_card"]).success
    inputs = store.manifest("data_card").inputs
    assert {k: inputs[k] for k in trained} == trained
    assert inputs["checkpoint"] == built["checkpoint"].data_version
    assert inputs["removal_requests"] == store.manifest("removal_requests").data_version


def test_the_card_links_its_own_checkpoints_mlflow_run(built):
    """A newer training run (its own MLflow run) is in the store, its checkpoint not exported yet: the card of the
    current checkpoint links that checkpoint's run on the tracking server, not the newer one."""
    store, project = built["store"], built["project"]
    old = store.manifest("training_run")
    with store.staging("training_run") as w:
        (w.dir / "summary.json").write_text("{}")
        w.commit(code_version="test", config={}, inputs=old.inputs, counts={"steps": 9},
                 stats={"mlflow": {"experiment_id": "7", "run_id": "NEWRUN999"}})
    project.resources["mlflow_tracking"] = project.definitions.MlflowTracking(
        tracking_uri="https://mlflow.example.org")
    result = project.materialize(["data_card"])
    assert result.success
    page = "https://mlflow.example.org/#/experiments/1/runs/abc123"  # stand_in_checkpoint's experiment 1, run abc123
    card = json.loads((store.dataset_dir("data_card") / "data_card.json").read_text())
    assert card["mlflow"]["run_id"] == "abc123" and card["mlflow"]["url"] == page
    assert f"MLflow run `abc123` (experiment 1): {page}." in (store.dataset_dir("data_card") / "data_card.md").read_text()
    assert result.asset_materializations_for_node("data_card")[0].metadata["mlflow_run"].value == page
