"""The dedup assets through Dagster: cross-source near-dups, decontamination, and a second refresh."""

import json
import string

import numpy as np
import pytest

from tests.assets.project import load_project
from tests.audit_store import BENCHMARK_ITEM, edit, random_text
from tests.conftest import SERIAL_ENGINE, web_and_ref_sources, write_jsonl

CURATION = ["raw_documents", "filtered_documents"]


@pytest.fixture
def project(tmp_path, kiln_home, monkeypatch):
    config, rng, vocab, web = _corpus(tmp_path)
    p = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    p.rng, p.vocab, p.web_texts, p.web_dir = rng, vocab, web, tmp_path / "web"
    return p


def _corpus(tmp_path):
    """ref and web sources (web holds near-copies of ref documents and a benchmark item) and their config."""
    rng = np.random.default_rng(0)
    vocab = ["".join(rng.choice(list(string.ascii_lowercase), 6)) for _ in range(5000)]
    ref = [random_text(rng, vocab) for _ in range(8)]
    web = ([edit(t, rng, vocab) for t in ref[:3]]  # near-copies of reference documents (J ~0.9)
           + [random_text(rng, vocab) for _ in range(5)]
           + [random_text(rng, vocab, 40) + " " + BENCHMARK_ITEM + " " + random_text(rng, vocab, 40)])
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(ref)])
    write_jsonl(tmp_path / "web" / "week1.jsonl", [{"id": f"w1-{i}", "text": t} for i, t in enumerate(web)])
    write_jsonl(tmp_path / "bench.jsonl", [{"id": "q1", "question": "Who standardized the wick gauge?",
                                            "answer": BENCHMARK_ITEM}])
    config = {
        "sources": web_and_ref_sources(tmp_path),
        "profiles": {"none": []},
        "engine": SERIAL_ENGINE,
        "tokenizer": {"vocab_size": 400},
        "shards": {"seq_len": 16, "val_fraction": 0.2},
        "quality": {"classifier": {"quantize_cutoff": 1000}},  # quantizing 10,000 features: ~4.5 s a fit
        "decontamination": {"benchmarks": [{"name": "lanterns", "path": str(tmp_path / "bench.jsonl"),
                                            "text_fields": ["question", "answer"]}]},
    }
    return config, rng, vocab, web


def run_all(project):
    """The demo's waves: per-source curation and signatures, the index once, then per-source application."""
    results = {}
    for source in ("web", "ref"):
        assert project.materialize(CURATION, source).success
    for source in ("web", "ref"):
        assert project.materialize(["curated_documents", "minhash_signatures"], source).success
    results["index"] = project.materialize(["dedup_index"])
    for source in ("web", "ref"):
        results[source] = project.materialize(["deduplicated_documents"], source)
    for r in results.values():
        assert r.success
        failed = [(e.check_name, e.metadata) for e in r.get_asset_check_evaluations() if not e.passed]
        assert not failed, failed
    return results


def rejected(project, source):
    import pyarrow.parquet as pq

    base = project.home / "data" / "deduplicated_documents" / project.partition(source)
    manifest = json.loads((base / "_manifest.json").read_text())
    rows = []
    for f in manifest["files"]:
        if f["role"] == "rejected":
            rows += pq.read_table(base / f["path"]).to_pylist()
    return manifest, rows


def test_cross_source_near_dups_and_decontamination_then_a_refresh(project):
    home = project.home
    results = run_all(project)

    index_meta = results["index"].asset_materializations_for_node("dedup_index")[0].metadata
    assert index_meta["near_duplicates"].value == 3
    assert "| web | 3 |" in index_meta["cross_source_duplicates"].value
    # The clusters table names the members and their Jaccard; the removed copies' text is not shown by default.
    clusters = index_meta["example_clusters"].value
    assert "near_duplicate" in clusters and "excerpt" not in clusters and project.web_texts[0][:40] not in clusters
    manifest, rows = rejected(project, "web")
    near = [r for r in rows if r["reason"] == "near_duplicate"]
    assert len(near) == 3 and all(r["jaccard"] >= 0.8 and r["duplicate_of"] for r in near)
    ref_ids = {r["doc_id"] for r in json_rows(project, "deduplicated_documents", "ref")}
    assert {r["duplicate_of"] for r in near} <= ref_ids  # the better tier's copy was kept
    bench = [r for r in rows if r["stage"] == "decontamination"]
    assert len(bench) == 1 and bench[0]["text"] is None  # no text after intake (kiln.common.removals)
    assert bench[0]["chars"] == len(BENCHMARK_ITEM) + 2 * (40 * 7 - 1) + 2  # fillers: 40 six-letter words, spaced
    assert manifest["counts"] == {"input": 9, "documents": 5, "rejected": 4}
    assert manifest["stats"]["contamination"]["per_benchmark"]["lanterns"]["items_contaminated"] == 1
    assert set(manifest["inputs"]) == {f"curated_documents/{project.partition('web')}",
                                       f"dedup_index/{project.current()}"}
    web_meta = results["web"].asset_materializations_for_node("deduplicated_documents")[0].metadata
    assert "near_duplicate" in web_meta["full_funnel"].value and "q1" in web_meta["contaminated_items"].value

    # Quality scoring (no rule: everything kept), then the tokenizer and the shards.
    assert project.materialize(["quality_classifier"]).success
    for source in ("web", "ref"):
        assert project.materialize(["quality_scores", "quality_filtered_documents"], source).success
    for asset in ("tokenizer", "token_shards"):
        tokens = project.materialize([asset])
        assert tokens.success and all(e.passed for e in tokens.get_asset_check_evaluations())
    shards = json.loads((home / "data" / "token_shards" / project.current() / "_manifest.json").read_text())
    card = json.loads((home / "data" / "tokenizer" / "_all" / "_manifest.json").read_text())["stats"]["card"]
    assert shards["stats"]["tokenizer_sha256"] == card["sha256"]
    assert shards["inputs"]["tokenizer"] and set(shards["stats"]["sources"]) == {"web", "ref"}
    from training_jobs.loader import ShardLoader

    loader = ShardLoader(home / "data" / "token_shards" / project.current(), batch_size=2,
                         expected_tokenizer_sha256=card["sha256"])
    inputs, targets = loader.next_batch()
    assert inputs.shape == (2, 16) and (inputs[:, 1:] == targets[:, :-1]).all()

    # The run plan's data sufficiency now comes from the shards' per-source token counts.
    assert project.materialize(["training_plan"]).success
    plan = json.loads((home / "data" / "training_plan" / "_all" / "_manifest.json").read_text())
    assert plan["inputs"] == {f"token_shards/{project.current()}": shards["data_version"]}
    assert plan["config"]["planning"]["available_tokens"] == {
        name: s["natural_train_tokens"] for name, s in shards["stats"]["sources"].items()}

    # Week 2, a new refresh: the web crawl lands last week's pages, lightly edited, next to new ones.
    first = project.current()
    kept_web = [r["text"] for r in json_rows(project, "deduplicated_documents", "web")]
    rng, vocab = project.rng, project.vocab
    week2 = [edit(t, rng, vocab, 1) for t in kept_web[:2]] + [random_text(rng, vocab) for _ in range(2)]
    write_jsonl(project.home / "landing" / "web" / "week2.jsonl", [{"id": f"w2-{i}", "text": t}
                                                                   for i, t in enumerate(week2)])
    assert project.refresh().key != first
    results = run_all(project)
    index_meta = results["index"].asset_materializations_for_node("dedup_index")[0].metadata
    # Only the new refresh is decided: its 2 edited copies match documents the first refresh accepted.
    per_source = index_meta["decisions_per_source"].value
    assert per_source["web"]["kept"] == 2 and per_source["web"]["near_duplicate"] == 2
    assert index_meta["matched_earlier_refreshes"].value == 2 and per_source.get("ref", {}).get("kept", 0) == 0
    assert index_meta["index_documents"].value == 8 + 6 + 2


def json_rows(project, asset, source):
    import pyarrow.parquet as pq

    base = project.home / "data" / asset / project.partition(source)
    manifest = json.loads((base / "_manifest.json").read_text())
    return [r for f in manifest["files"] if f["role"] == "documents" for r in pq.read_table(base / f["path"]).to_pylist()]


def test_affine32_end_to_end_then_the_default_scheme_needs_new_signatures(tmp_path, kiln_home, monkeypatch):
    """dedup.near.scheme: affine32 (the older signer) runs the dedup waves as before; switching the config to the
    default scheme makes dedup_index refuse the affine32 signatures until minhash_signatures is re-materialized.
    The bucket shuffle's partitions come from the config too (3, then the default 8)."""
    import yaml

    from kiln.dedup.bucket_index import read_index_meta

    config, _, _, _ = _corpus(tmp_path)
    config["dedup"] = {"near": {"scheme": "affine32", "partitions": 3}}
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    results = run_all(project)
    index_meta = results["index"].asset_materializations_for_node("dedup_index")[0].metadata
    assert index_meta["near_duplicates"].value == 3
    index_dir = project.home / "data" / "dedup_index" / project.current() / "index"
    assert read_index_meta(index_dir)["params"]["scheme"] == "affine32"
    assert read_index_meta(index_dir)["partitions"] == 3

    del config["dedup"]
    project.config_path.write_text(yaml.safe_dump(config))
    refused = project.materialize(["dedup_index"], raise_on_error=False)
    assert not refused.success
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE")
    message = str(failure.event_specific_data.error)
    assert "minhash_signatures/" in message and "re-materialize" in message
    assert "dedup.near.scheme: signatures 'affine32', config 'fss-splitmix64-v1'" in message
    for source in ("web", "ref"):
        assert project.materialize(["minhash_signatures"], source).success
    again = project.materialize(["dedup_index"])
    assert again.asset_materializations_for_node("dedup_index")[0].metadata["near_duplicates"].value == 3
    assert read_index_meta(index_dir)["params"]["scheme"] == "fss-splitmix64-v1"
    assert read_index_meta(index_dir)["partitions"] == 8


def test_dedup_apply_reads_the_versions_it_records_when_an_input_is_replaced_meanwhile(project, monkeypatch):
    """deduplicated_documents matches the index's decisions to curated parts by row counts. curated_documents
    materialized again after the asset pinned its inputs and before it read their files: it still reads the version
    it records (before, the new parts met the old decisions: refused for a row-count mismatch, or, with equal counts,
    the wrong documents dropped)."""
    import assets.dedup

    for assets_ in (CURATION, ["curated_documents", "minhash_signatures"]):
        for source in ("web", "ref"):
            assert project.materialize(assets_, source).success
    assert project.materialize(["dedup_index"]).success
    store, web = project.store, project.partition("web")
    recorded = store.manifest("curated_documents", web)
    apply = assets.dedup.apply_decisions

    def replaced_meanwhile(*args, **kwargs):
        current = store.snapshot("curated_documents", web)
        with store.staging("curated_documents", web) as writer:
            writer.write("documents", current.read_table().slice(0, 2))
            writer.commit(code_version="t", config={}, inputs={}, counts={"documents": 2},
                          stats=current.manifest.stats)
        return apply(*args, **kwargs)

    monkeypatch.setattr(assets.dedup, "apply_decisions", replaced_meanwhile)
    assert project.materialize(["deduplicated_documents"], "web").success
    assert store.manifest("curated_documents", web).counts["documents"] == 2  # replaced meanwhile
    deduplicated = store.manifest("deduplicated_documents", web)
    assert deduplicated.inputs[f"curated_documents/{web}"] == recorded.data_version
    assert deduplicated.counts["input"] == recorded.counts["documents"] > 2


def test_boilerplate_lines_turned_on_need_new_signatures_and_a_new_index(project):
    """dedup.boilerplate_lines is config, which Dagster does not mark stale: turned on after the signatures were made
    without line counts, dedup_index failed on a KeyError (no `line_hash` column); an index decided under other line
    settings was applied by them. Both are refused, naming the asset to re-materialize."""
    import yaml

    run_all(project)
    config = yaml.safe_load(project.config_path.read_text())
    config.setdefault("dedup", {})["boilerplate_lines"] = {"enabled": True, "min_documents": 2}
    project.config_path.write_text(yaml.safe_dump(config))

    def failure(result) -> str:
        assert not result.success
        return str(next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE").event_specific_data.error)

    message = failure(project.materialize(["dedup_index"], raise_on_error=False))
    assert "minhash_signatures/" in message and "enabled False (config: True)" in message
    assert "re-materialize minhash_signatures" in message
    for source in ("web", "ref"):
        assert project.materialize(["minhash_signatures"], source).success
    assert project.materialize(["dedup_index"]).success
    config["dedup"]["boilerplate_lines"]["min_documents"] = 3
    project.config_path.write_text(yaml.safe_dump(config))
    message = failure(project.materialize(["deduplicated_documents"], "web", raise_on_error=False))
    assert "dedup_index/" in message and "min_documents 2 (config: 3)" in message
    assert "re-materialize dedup_index" in message
