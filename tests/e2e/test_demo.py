"""The demo path end to end: the default config (bounded), a real DAGSTER_HOME, the multiprocess executor."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def bounded_env(tmp_path):
    config = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    for source in config["sources"]:
        source["max_documents"] = 40
    config["reading"]["rows_per_part"] = 20
    config["training"].update(max_steps=30, checkpoint={"every_steps": 10, "keep_last": 2})  # the path, not quality
    path = tmp_path / "kiln.yaml"
    path.write_text(yaml.safe_dump(config))
    home = tmp_path / "kiln"
    (home / "dagster").mkdir(parents=True)
    (home / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return {**os.environ, "KILN_CONFIG": str(path), "KILN_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}


@pytest.mark.slow
def test_demo_materializes_every_source_and_records_runs(bounded_env):
    proc = subprocess.run([sys.executable, "-m", "orchestration.demo"], cwd=ROOT, env=bounded_env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "package_licenses" in proc.stdout and "outputs:" in proc.stdout
    data = Path(bounded_env["KILN_HOME"]) / "data"
    for source in ("python_docs", "package_readmes", "package_licenses", "stdlib_code"):
        manifest = json.loads((data / "curated_documents" / source / "_manifest.json").read_text())
        assert manifest["counts"]["documents"] > 0
        assert set(manifest["inputs"]) == {f"filtered_documents/{s}" for s in
                                           ("python_docs", "package_readmes", "package_licenses", "stdlib_code")}
        final = json.loads((data / "deduplicated_documents" / source / "_manifest.json").read_text())
        assert final["counts"]["input"] == manifest["counts"]["documents"] and final["counts"]["documents"] > 0
    index = json.loads((Path(bounded_env["KILN_HOME"]) / "dedup_index" / "kiln" / "index.json").read_text())
    assert sum(seg["documents"] for seg in index["segments"]) > 0
    assert "near-dup index:" in proc.stdout and "training: " in proc.stdout and "MLflow run" in proc.stdout
    summary = json.loads((data / "training_run" / "_all" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 30
    assert json.loads((data / "evaluation" / "_all" / "evaluation.json").read_text())["validation"]["tokens"] > 0
    # the runs are in the instance, so `make ui` shows them
    runs = list((Path(bounded_env["DAGSTER_HOME"]) / "storage").iterdir())
    assert len(runs) >= 8


@pytest.mark.slow
def test_workspace_loads_in_dagster(bounded_env):
    proc = subprocess.run([str(Path(sys.executable).parent / "dagster"), "definitions", "validate", "-w",
                           "workspace.yaml"], cwd=ROOT, env=bounded_env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]


def test_demo_with_a_bad_config_says_which_key_and_exits_2(bounded_env, tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("sources:\n  - name: web\n    kind: jsonx\n")
    proc = subprocess.run([sys.executable, "-m", "orchestration.demo"], cwd=ROOT,
                          env={**bounded_env, "KILN_CONFIG": str(bad)}, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2
    assert "sources[0].kind = 'jsonx'" in proc.stderr and "Traceback" not in proc.stderr
