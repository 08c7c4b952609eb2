"""The quality assets through Dagster: classifier, stored scores, and rules re-applied without scoring again."""

import json

import pyarrow.parquet as pq
import pytest
import yaml

from tests.assets.project import load_project
from tests.conftest import SERIAL_ENGINE, write_jsonl
from tests.quality_corpus import junk_texts, reference_texts, train_reference_model

UPSTREAM = [["raw_documents", "filtered_documents"], ["curated_documents", "minhash_signatures"]]
SOURCES = ("ref", "web")


def rows(project, asset, source, role="documents"):
    base = project.home / "data" / asset / project.partition(source)
    manifest = json.loads((base / "_manifest.json").read_text())
    return manifest, [r for f in manifest["files"] if f["role"] == role for r in pq.read_table(base / f["path"]).to_pylist()]


def deduplicate(project):
    """Every source through curation and dedup: what the quality assets read."""
    for wave in UPSTREAM:
        for source in SOURCES:
            assert project.materialize(wave, source).success
    assert project.materialize(["dedup_index"]).success
    for source in SOURCES:
        assert project.materialize(["deduplicated_documents"], source).success


def test_classifier_scores_and_rules_from_stored_scores(tmp_path, kiln_home, monkeypatch):
    refs = reference_texts()
    junk = junk_texts(40, seed=1)
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(refs[:80])])
    # The web source: junk pages plus reference-like pages the classifier never trained on as positives.
    web = [{"id": f"junk-{i}", "text": t} for i, t in enumerate(junk)] + \
          [{"id": f"good-{i}", "text": t} for i, t in enumerate(refs[200:240])]
    write_jsonl(tmp_path / "web" / "a.jsonl", web)
    reference_model, _ = train_reference_model(refs[:200], tmp_path / "lm", steps=60)
    config = {
        "sources": [
            {"name": "ref", "kind": "jsonl", "path": str(tmp_path / "ref"), "license": "PSF-2.0",
             "domain": "reference", "quality_tier": 1, "profile": "none"},
            {"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC-BY",
             "domain": "web", "quality_tier": 3, "profile": "none"},
        ],
        "profiles": {"none": []},
        "engine": SERIAL_ENGINE, "decontamination": {"enabled": False},
        "quality": {"classifier": {"folds": 3, "quantize_cutoff": 1000}, "perplexity": {"model": str(reference_model), "max_tokens": 64},
                    "rules": {"web": {"min_score": 0.5}}},
    }
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    deduplicate(project)

    result = project.materialize(["quality_classifier"])
    meta = result.asset_materializations_for_node("quality_classifier")[0].metadata
    # Labels are sources, and half of this web source reads like reference text: AUC against them is modest.
    assert meta["cv_auc"].value >= 0.7 and all(e.passed for e in result.get_asset_check_evaluations())
    classifier = json.loads((kiln_home / "data" / "quality_classifier" / "_all" / "_manifest.json").read_text())
    assert set(classifier["inputs"]) == {f"deduplicated_documents/{project.partition(s)}" for s in ("ref", "web")}
    assert {f["path"] for f in classifier["files"]} >= {"quality_classifier.bin", "training_sample.parquet"}

    for source in SOURCES:
        result = project.materialize(["quality_scores", "quality_filtered_documents"], source)
        assert result.success and all(e.passed for e in result.get_asset_check_evaluations())
    scores_manifest, scored = rows(project, "quality_scores", "web")
    assert len(scored) == 80 and all(0 <= r["quality_score"] <= 1 and r["perplexity"] > 1 for r in scored)
    assert scores_manifest["config"]["reference_model_sha256"]  # which language model scored them
    meta = result.asset_materializations_for_node("quality_filtered_documents")[0].metadata
    assert "quality_score_below_min" in meta["full_funnel"].value

    filtered, kept = rows(project, "quality_filtered_documents", "web")
    _, removed = rows(project, "quality_filtered_documents", "web", "rejected")
    assert len(kept) + len(removed) == 80
    junk_ids = {r["doc_id"] for r in scored if r["text"] in set(junk)}
    assert len(junk_ids) == 40
    # Within the web source, the stored scores rank junk below the reference-like pages ...
    from sklearn.metrics import roc_auc_score

    auc = roc_auc_score([r["doc_id"] not in junk_ids for r in scored], [r["quality_score"] for r in scored])
    removed_junk = sum(r["doc_id"] in junk_ids for r in removed)
    print(f"\n[quality assets] web: junk vs good AUC {auc:.3f}; min_score 0.5 removed {removed_junk}/40 junk and "
          f"{len(removed) - removed_junk}/40 good pages")
    assert auc >= 0.9
    assert removed_junk >= 36  # ... and the threshold removes nearly every junk page
    assert all(r["stage"] == "quality" and r["reason"] == "quality_score_below_min" and r["quality_score"] < 0.5
               for r in removed)

    # A new rule: only quality_filtered_documents runs again, from the stored scores.
    config["quality"]["rules"]["web"] = {"keep_top_fraction": 0.25, "perplexity_buckets": ["head", "middle"]}
    (tmp_path / "kiln.yaml").write_text(yaml.safe_dump(config))
    assert project.materialize(["quality_filtered_documents"], "web").success
    assert rows(project, "quality_scores", "web")[0] == scores_manifest  # not re-scored
    refiltered, kept = rows(project, "quality_filtered_documents", "web")
    _, removed = rows(project, "quality_filtered_documents", "web", "rejected")
    assert len(kept) <= 20 and len(kept) + len(removed) == 80
    assert {r["reason"] for r in removed} <= {"quality_score_bottom_fraction", "perplexity_tail"}
    assert refiltered["config"]["rule"]["keep_top_fraction"] == 0.25
    assert refiltered["inputs"] == filtered["inputs"] == {
        f"quality_scores/{project.partition('web')}": scores_manifest["data_version"]}


def test_a_classifier_fitted_while_off_is_not_used_once_the_config_turns_it_on(tmp_path, kiln_home, monkeypatch):
    """quality_classifier is fitted once (when missing). Fitted while off (no reference source yet), it stayed when the
    config later marked a reference source and filtered the web on the score: quality_scores stored no scores, its
    check passed, and `min_score` dropped every web document. Now the scores refuse, naming the classifier to fit
    again; once it is, the filter keeps the web's good pages."""
    refs = reference_texts()
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(refs[:60])])
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": f"j{i}", "text": t} for i, t in enumerate(junk_texts(20, seed=1))]
                + [{"id": f"g{i}", "text": t} for i, t in enumerate(refs[200:220])])
    sources = [{"name": "ref", "kind": "jsonl", "path": str(tmp_path / "ref"), "license": "PSF-2.0",
                "domain": "books", "quality_tier": 1, "profile": "none"},  # not `reference` yet: the classifier is off
               {"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC-BY",
                "domain": "web", "quality_tier": 3, "profile": "none"}]
    config = {"sources": sources, "profiles": {"none": []}, "engine": SERIAL_ENGINE,
              "decontamination": {"enabled": False}, "quality": {"classifier": {"folds": 3, "quantize_cutoff": 1000}}}
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    deduplicate(project)
    assert project.materialize(["quality_classifier"]).success

    key = project.current()
    sources[0]["domain"] = "reference"
    config["quality"]["rules"] = {"web": {"min_score": 0.5}}
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    project.refresh_key = key
    project._mirror()
    failed = project.materialize(["quality_scores"], "web", raise_on_error=False)
    assert not failed.success
    message = failed.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert "quality_classifier was fitted while the classifier was off" in message and "materialize" in message

    assert project.materialize(["quality_classifier"]).success
    assert project.materialize(["quality_scores", "quality_filtered_documents"], "web").success
    manifest, kept = rows(project, "quality_filtered_documents", "web")
    assert 0 < manifest["counts"]["documents"] < 40 and any(r["doc_id"] for r in kept)


@pytest.mark.slow
def test_a_removal_request_keeps_its_documents_out_of_the_classifier_and_the_score_deciles(tmp_path, kiln_home, monkeypatch):
    """deduplicated_documents still holds a document a removal request names (requests apply in the quality filter and
    the shards). The classifier, fitted after the request, drew its sample from there without looking at the requests:
    11 of the 15 reference documents named were training examples, read into the fastText model. Now, like the
    tokenizer's sample, it never draws them, and its manifest records the requests' version. quality_scores' decile
    examples show no excerpt of a document a request names."""
    from kiln.common.config import load_config
    from kiln.governance.forget import record_request

    refs = reference_texts()
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(refs[:30])])
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": f"j{i}", "text": t} for i, t in enumerate(junk_texts(20, seed=1))])
    sources = [{"name": "ref", "kind": "jsonl", "path": str(tmp_path / "ref"), "license": "PSF-2.0",
                "domain": "reference", "quality_tier": 1, "profile": "none"},
               {"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC-BY",
                "domain": "web", "quality_tier": 3, "profile": "none"}]
    config = {"sources": sources, "profiles": {"none": []}, "engine": SERIAL_ENGINE,
              "curation": {"keep_rejected_text": "excerpt"}, "decontamination": {"enabled": False},
              "quality": {"classifier": {"folds": 3, "quantize_cutoff": 1000}}}
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    deduplicate(project)
    _, ref_docs = rows(project, "deduplicated_documents", "ref")
    named = {r["doc_id"] for r in ref_docs[:15]}
    record_request(project.store, load_config(tmp_path / "kiln.yaml"), "doc_ids", sorted(named), "asked")

    assert project.materialize(["quality_classifier"]).success
    folder = kiln_home / "data" / "quality_classifier" / "_all"
    sample = pq.read_table(folder / "training_sample.parquet").to_pylist()
    # 15 reference documents left to draw from, 20 web pages: 15 + 15, none of them named
    assert len(sample) == 30 and not {r["doc_id"] for r in sample} & named
    manifest = json.loads((folder / "_manifest.json").read_text())
    assert manifest["inputs"]["removal_requests"] == project.store.manifest("removal_requests").data_version

    # quality_scores' decile table shows an excerpt of a document (keep_rejected_text: excerpt), never of one a
    # request names: all 10 rows showed one of the web pages a request names (a takedown keeps none of the text).
    _, web_docs = rows(project, "deduplicated_documents", "web")
    taken_down = {r["doc_id"] for r in web_docs[:10]}
    record_request(project.store, load_config(tmp_path / "kiln.yaml"), "doc_ids", sorted(taken_down), "asked")
    result = project.materialize(["quality_scores"], "web")
    table = result.asset_materializations_for_node("quality_scores")[0].metadata["quality_score_deciles"].value
    lines = table.splitlines()[2:]
    assert len(lines) == 10
    for line in lines:
        doc_id, excerpt = line.split("`")[1], line.split("` |", 1)[1].removesuffix("|").strip()
        assert (excerpt == "") == (doc_id in taken_down), line
    assert any(line.split("`")[1] in taken_down for line in lines)  # the case is exercised


@pytest.mark.slow
def test_a_later_refresh_is_not_cut_against_scores_of_a_classifier_fitted_before(tmp_path, kiln_home, monkeypatch):
    """keep_top_fraction cuts among every refresh's scores. After the classifier was fitted again (on both refreshes),
    refresh 2's web scores were re-made first and filtered against refresh 1's, still the old model's: the filter
    kept 10 of refresh 2's 20 pages where ranked on one model's scores it keeps 4 (6 fates differ). Now it refuses,
    naming refresh 1's scores to re-make; once they are, it keeps exactly the pages of refresh 2 among the top
    ceil(0.3 * 40) = 12 of both refreshes' stored scores."""
    import math

    project, first, junk, refs = _ranked_web_first_refresh(tmp_path, kiln_home, monkeypatch)
    assert project.materialize(["quality_scores", "quality_filtered_documents"], "web").success
    _second_refresh(project, tmp_path, junk, refs)
    assert project.materialize(["quality_classifier"]).success  # fitted again, on both refreshes
    failed = project.materialize(["quality_scores", "quality_filtered_documents"], "web", raise_on_error=False)
    assert not failed.success
    message = failed.get_step_failure_events()[0].step_failure_data.user_failure_data.description
    assert f"quality_scores for web/{first} were made with another quality_classifier" in message

    assert project.materialize(["quality_scores"], "web", refresh=first).success
    assert project.materialize(["quality_filtered_documents"], "web").success
    scored = rows(project, "quality_scores", "web")[1] + \
        [r for f in project.store.files("quality_scores", f"web/{first}", "documents")
         for r in pq.read_table(f).to_pylist()]
    assert len(scored) == 40
    top = {r["doc_id"] for r in sorted(scored, key=lambda r: -r["quality_score"])[:math.ceil(0.3 * 40)]}
    kept = {r["doc_id"] for r in rows(project, "quality_filtered_documents", "web")[1]}
    assert kept == top & {r["doc_id"] for r in rows(project, "quality_scores", "web")[1]}


def _ranked_web_first_refresh(tmp_path, kiln_home, monkeypatch):
    """web's rule keeps the top 30% of every refresh's classifier scores; its first refresh deduplicated and the
    classifier fitted on it."""
    from tests.conftest import web_and_ref_sources

    refs, junk = reference_texts(), junk_texts(20, seed=1)
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(refs[:20])])
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": f"j{i}", "text": t} for i, t in enumerate(junk[:10])]
                + [{"id": f"g{i}", "text": t} for i, t in enumerate(refs[100:110])])
    config = {"sources": web_and_ref_sources(tmp_path), "profiles": {"none": []}, "engine": SERIAL_ENGINE,
              "decontamination": {"enabled": False},
              "quality": {"classifier": {"folds": 3, "quantize_cutoff": 1000},
                          "rules": {"web": {"keep_top_fraction": 0.3}}},
              "refresh": {"landing": str(tmp_path / "landing"), "sensor": {"settle_seconds": 0}}}
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    first = project.current()
    deduplicate(project)
    assert project.materialize(["quality_classifier"]).success
    return project, first, junk, refs


def _second_refresh(project, tmp_path, junk, refs):
    write_jsonl(tmp_path / "landing" / "web" / "b.jsonl", [{"id": f"k{i}", "text": t} for i, t in enumerate(junk[10:])]
                + [{"id": f"h{i}", "text": t} for i, t in enumerate(refs[110:120])])
    write_jsonl(tmp_path / "landing" / "ref" / "b.jsonl", [{"id": f"r{i}", "text": t} for i, t in enumerate(refs[20:40])])
    assert project.refresh() is not None
    deduplicate(project)


@pytest.mark.slow
def test_after_a_refit_automation_filters_a_later_refresh_once_the_earlier_scores_are_redone(tmp_path, kiln_home,
                                                                                              monkeypatch):
    """After the classifier is fitted again, automation re-scores every refresh, one run per partition, finishing in
    any order. Refresh 2's web filter (keep_top_fraction ranks among both refreshes' scores) used to be requested
    with its scores, run before refresh 1's were re-made, be refused, and never be asked for again: its documents
    stayed cut by the old model's scores. It now waits, and is asked for once refresh 1's web scores are re-made."""
    import dagster as dg

    project, first, junk, refs = _ranked_web_first_refresh(tmp_path, kiln_home, monkeypatch)
    for source in SOURCES:
        assert project.materialize(["quality_scores", "quality_filtered_documents"], source).success
    _second_refresh(project, tmp_path, junk, refs)
    second = project.current()
    for source in SOURCES:
        assert project.materialize(["quality_scores", "quality_filtered_documents"], source).success
    cursor, _ = project.automation_tick()
    assert project.materialize(["quality_classifier"]).success  # fitted again by hand

    def quality(requested):
        return {asset: {str(k) for k in keys} for asset, keys in requested.items() if asset.startswith("quality")}

    cursor, requested = project.automation_tick(cursor)
    scores = {f"{r}|{s}" for r in (first, second) for s in SOURCES}
    assert quality(requested) == {"quality_scores": scores,
                                  "quality_filtered_documents": scores - {f"{second}|web"}}
    # the daemon's runs, one per partition key; refresh 2's web run first
    for key in sorted(scores, key=lambda k: k != f"{second}|web"):
        refresh, source = key.split("|")
        assets = [a for a, keys in quality(requested).items() if key in keys]
        assert dg.materialize(project.assets, selection=assets, resources=project.resources, instance=project.instance,
                              partition_key=dg.MultiPartitionKey({"refresh": refresh, "source": source})).success
    cursor, requested = project.automation_tick(cursor)
    assert quality(requested) == {"quality_filtered_documents": {f"{second}|web"}}
    assert not project.run_requested({"quality_filtered_documents": requested["quality_filtered_documents"]})
    filtered = project.store.manifest_or_none("quality_filtered_documents", f"web/{second}")
    assert filtered.inputs[f"quality_scores/web/{first}"] == \
        project.store.manifest_or_none("quality_scores", f"web/{first}").data_version
