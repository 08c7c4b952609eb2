"""The demo path end to end: the demo's config (bounded), a real DAGSTER_HOME, runs through the instance, and
every dataset on an S3-compatible server (moto on loopback), as `storage.backend: s3` users run it."""

import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import psutil
import pyarrow.parquet as pq
import pytest
import yaml

from kiln.common.config.loading import merge_config

from tests.s3 import _moto_server, assert_bucket_holds_every_dataset, s3_client, s3_endpoint  # noqa: F401
from tests.store_files import published_files

ROOT = Path(__file__).resolve().parents[2]
SOURCES = ("python_docs", "package_readmes", "package_licenses", "stdlib_code")


# A README-like page for the second refresh: long enough for the technical_docs profile.
PAGE = ("# Lantern tools\n\nLantern tools is a small library for reading the copper wick gauges used in harbour "
        "lanterns. It parses the gauge tables published by the northern guilds, converts between their units, and "
        "checks a wick against the tolerance the guild allows. Install it with pip, then call the reader on a "
        "table file and ask it for the gauge of any wick you have measured. The documentation explains each "
        "table format, the history of the units, and how the tolerance rules changed over the years.\n")


@pytest.fixture
def bounded_env(tmp_path):
    overlay = yaml.safe_load((ROOT / "configs" / "demo.yaml").read_text())  # what `make demo` reads
    assert overlay.pop("extends") == "default.yaml"
    config = merge_config(yaml.safe_load((ROOT / "configs" / "default.yaml").read_text()), overlay)
    for source in config["sources"]:
        source["max_documents"] = 40
    config["reading"]["rows_per_part"] = 20
    config["quality"]["classifier"]["quantize_cutoff"] = 1000  # quantizing 10,000 features: ~4.5 s a fit
    config["training"].update(max_steps=12, checkpoint={"every_steps": 6, "keep_last": 2})  # the path, not quality
    path = tmp_path / "kiln.yaml"
    path.write_text(yaml.safe_dump(config))
    home = tmp_path / "kiln"
    (home / "dagster").mkdir(parents=True)
    (home / "dagster" / "dagster.yaml").write_text("telemetry:\n  enabled: false\n")
    return {**os.environ, "KILN_CONFIG": str(path), "KILN_HOME": str(home), "DAGSTER_HOME": str(home / "dagster")}


@pytest.fixture
def demo_on_s3(bounded_env, s3_endpoint):  # noqa: F811
    """The bounded demo with every dataset stored in a bucket (created by Kiln) behind the local cache."""
    path = Path(bounded_env["KILN_CONFIG"])
    config = yaml.safe_load(path.read_text())
    config["storage"] = {"backend": "s3", "bucket": "kiln-demo", "prefix": "demo", "create_bucket": True}
    path.write_text(yaml.safe_dump(config))
    return {**bounded_env, **{k: v for k, v in os.environ.items() if k.startswith("AWS_")}}


def run_demo(env: dict) -> tuple[subprocess.CompletedProcess, set[int]]:
    """`python -m orchestration.demo`, and the Ray daemons of the session it started still alive after it exits.
    Ray names a session after the pid of the driver that started it; other tests' Ray clusters (pytest-xdist
    runs them at the same time) are not the demo's."""
    proc = subprocess.Popen([sys.executable, "-m", "orchestration.demo"], cwd=ROOT, env=env, text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    stdout, stderr = proc.communicate(timeout=900)
    left = {p.info["pid"] for p in psutil.process_iter(["pid", "exe", "cmdline"])
            if Path(p.info["exe"] or "").name in ("gcs_server", "raylet")
            and any(a.startswith("--session-name=") and a.endswith(f"_{proc.pid}") for a in p.info["cmdline"] or [])}
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr), left


@pytest.mark.slow
def test_demo_materializes_every_source_and_records_runs(demo_on_s3, s3_endpoint, tmp_path):  # noqa: F811
    bounded_env = demo_on_s3
    proc, left = run_demo(bounded_env)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert not left  # the demo's embedded Ray is stopped with it
    assert "package_licenses" in proc.stdout and "outputs:" in proc.stdout
    data = Path(bounded_env["KILN_HOME"]) / "data"
    with dg.DagsterInstance.from_config(bounded_env["DAGSTER_HOME"]) as instance:
        event = instance.get_latest_materialization_event(dg.AssetKey("filtered_documents"))
        engine = event.asset_materialization.metadata["engine"].value
    # the default: the stages ran on the demo's one embedded Ray
    assert engine["engine"] == "ray" and engine["nodes"] == 1 and engine["address"] == "embedded"
    [refresh] = json.loads((data / "refreshes" / "_all" / "refreshes.json").read_text())["refreshes"]
    assert refresh["trigger"] == "initial" and refresh["files"] is None  # the first refresh: the configured sources
    key = refresh["key"]
    for source in SOURCES:
        raw = json.loads((data / "raw_documents" / source / key / "_manifest.json").read_text())
        assert raw["counts"]["records"] == 40  # the bound set above (max_documents), not whatever was read
        manifest = json.loads((data / "curated_documents" / source / key / "_manifest.json").read_text())
        assert manifest["counts"]["documents"] > 0
        assert set(manifest["inputs"]) == {f"filtered_documents/{s}/{key}" for s in SOURCES}
        final = json.loads((data / "deduplicated_documents" / source / key / "_manifest.json").read_text())
        assert final["counts"]["input"] == manifest["counts"]["documents"] and final["counts"]["documents"] > 0
    index = json.loads((data / "dedup_index" / key / "index" / "_index.json").read_text())  # the bucket index
    assert index["documents"] > 0 and index["batch"] == key
    assert "near-dup index:" in proc.stdout and "training: " in proc.stdout and "MLflow run" in proc.stdout
    summary = json.loads((data / "training_run" / "_all" / "summary.json").read_text())
    assert summary["status"] == "completed" and summary["steps"] == 12
    assert json.loads((data / "evaluation" / "_all" / "evaluation.json").read_text())["validation"]["tokens"] > 0
    assert json.loads((data / "token_shards" / key / "_manifest.json").read_text())["config"]["refreshes"] == [key]
    assert_the_card_holds_what_a_reviewer_signs(data)
    # the runs are in the instance, so `make ui` shows them
    runs = list((Path(bounded_env["DAGSTER_HOME"]) / "storage").iterdir())
    assert len(runs) >= 8

    # A second demo with new files in the landing area: they become the next refresh, and only it is processed.
    # The tokenizer's vocabulary changed in the config meanwhile: the demo says so and builds it again.
    landing = Path(bounded_env["KILN_HOME"]) / "landing" / "package_readmes"
    landing.mkdir(parents=True)
    (landing / "notes.jsonl").write_text(json.dumps({"id": "n1", "text": PAGE}) + "\n")
    config = yaml.safe_load(Path(bounded_env["KILN_CONFIG"]).read_text())
    first_tokenizer = json.loads((data / "tokenizer" / "_all" / "_manifest.json").read_text())
    assert first_tokenizer["counts"]["vocab_size"] == config["tokenizer"]["vocab_size"] == 8000
    config["tokenizer"]["vocab_size"] = 4000
    Path(bounded_env["KILN_CONFIG"]).write_text(yaml.safe_dump(config))
    again, left = run_demo(bounded_env)
    assert again.returncode == 0 and not left, again.stderr[-3000:]
    assert "tokenizer: settings changed (tokenizer.vocab_size: 8000 -> 4000)" in again.stdout
    assert "quality_classifier: settings changed" not in again.stdout
    tokenizer = json.loads((data / "tokenizer" / "_all" / "_manifest.json").read_text())
    assert tokenizer["counts"]["vocab_size"] == 4000 and tokenizer["data_version"] != first_tokenizer["data_version"]
    registry = json.loads((data / "refreshes" / "_all" / "refreshes.json").read_text())["refreshes"]
    assert [r["key"] for r in registry][0] == key and len(registry) == 2
    second = registry[1]["key"]
    assert f"materializing {second}" in again.stdout
    raw = json.loads((data / "raw_documents" / "package_readmes" / second / "_manifest.json").read_text())
    assert raw["counts"] == {"records": 1, "documents": 1, "quarantined": 0}
    shards = json.loads((data / "token_shards" / second / "_manifest.json").read_text())
    assert shards["config"]["refreshes"] == [key, second]
    assert shards["inputs"]["tokenizer"] == tokenizer["data_version"]  # the newest shards use the new tokenizer
    run = json.loads((data / "training_run" / "_all" / "_manifest.json").read_text())
    assert f"token_shards/{second}" in run["inputs"]  # training reads the newest refresh's shards

    # Every dataset of both refreshes (the classifier, the index, the checkpoint, the card...) is in the bucket, and
    # a second machine with an empty KILN_HOME on the same bucket reads each one back identical.
    read_back = assert_bucket_holds_every_dataset(s3_client(s3_endpoint), "kiln-demo", "demo", data, tmp_path / "fresh")
    assert read_back >= 2 * 5 * len(SOURCES) + 10


def assert_the_card_holds_what_a_reviewer_signs(data: Path) -> None:
    """The demo's data card: each README's and licence file's own licence (the package metadata's), counted here
    from the documents the shards were built from; languages, the card statements, exposure and the chart."""
    card = json.loads((data / "data_card" / "_all" / "data_card.json").read_text())
    for source in ("package_readmes", "package_licenses"):
        counted: dict[str, int] = {}
        for part in [p for p in published_files(data / "quality_filtered_documents" / source)
                     if p.name.startswith("part-")]:
            for meta in pq.read_table(part, columns=["meta"]).column("meta").to_pylist():
                declared = (json.loads(meta).get("package_license") or "").strip()
                known = declared and declared.upper() not in ("UNKNOWN", "NONE", "NULL", "N/A")
                counted[declared if known else "unknown"] = counted.get(declared if known else "unknown", 0) + 1
        table = card["licenses"]["per_source"][source]
        assert table["field"] == "meta.package_license"
        assert {name: row["documents"] for name, row in table["licenses"].items()} == counted
        assert table["unknown"] == counted.get("unknown", 0) == len(table["unknown_listed"])
    assert card["languages"]["per_source"]["python_docs"]["languages"]["en"]["documents"] > 0
    markdown = (data / "data_card" / "_all" / "data_card.md").read_text()
    for section in ("## Intended use", "## Limitations", "## Licenses of the documents", "## Languages",
                    "## Exposure per source (what the run read)"):
        assert section in markdown
    assert "Not stated" not in markdown.split("## Maintenance")[0]  # the demo states intended use and limitations
    assert "127.0.0.1" not in markdown and "](data_card_funnel.png)" in markdown
    assert (data / "data_card" / "_all" / "data_card_funnel.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


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
