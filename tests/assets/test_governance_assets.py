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
