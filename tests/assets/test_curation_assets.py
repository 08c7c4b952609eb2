"""The curation assets through Dagster: partitions, checks, metadata, data versions, lineage."""

import json
from pathlib import Path

import pytest
import yaml

from tests.assets.project import load_project
from tests.conftest import SERIAL_ENGINE, prose, write_jsonl


@pytest.fixture
def project(tmp_path, kiln_home, monkeypatch):
    """A tiny two-source project."""
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": i, "text": prose(i)} for i in range(6)]
                + [{"id": "dup", "text": prose(0)}, {"id": "pii", "text": prose(50) + " Mail bob@corp.com."}, "{bad"])
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": i, "text": prose(i)} for i in range(3, 5)])
    config = {
        "sources": [
            {"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC-BY", "domain": "web",
             "quality_tier": 3, "profile": "prose"},
            {"name": "ref", "kind": "jsonl", "path": str(tmp_path / "ref"), "license": "CC0", "domain": "reference",
             "quality_tier": 1, "profile": "prose"},
        ],
        "profiles": {"prose": ["language", "gopher_repetition", "gopher_quality"]},
        "reading": {"rows_per_part": 3},
        "engine": SERIAL_ENGINE,
    }
    return load_project(config, tmp_path, kiln_home, monkeypatch)


def materialize(project, selection, partition, raise_on_error=True):
    return project.materialize(selection, partition, raise_on_error)


# A change to lineage (a new asset, a dropped dependency, a removed check, another partitioning or automation rule)
# must show up in review. Document datasets are one source in one refresh; eager assets follow a refresh.
DOCS, REFRESH = "refresh x source", "refresh"
GRAPH_SNAPSHOT = {
    "raw_documents": {"group": "curation", "deps": [], "checks": ["conservation", "non_empty", "schema"],
                      "partitions": DOCS, "automation": None},
    "filtered_documents": {"group": "curation", "deps": ["raw_documents"],
                           "checks": ["conservation", "non_empty", "schema"], "partitions": DOCS, "automation": "eager"},
    "curated_documents": {"group": "curation", "deps": ["filtered_documents"],
                          "checks": ["conservation", "non_empty", "residual_pii", "schema"], "partitions": DOCS,
                          "automation": "eager, in refresh order"},
    "minhash_signatures": {"group": "dedup", "deps": ["curated_documents"], "checks": ["complete"], "partitions": DOCS,
                           "automation": "eager"},
    "dedup_index": {"group": "dedup", "deps": ["minhash_signatures"], "checks": ["conservation", "survivors_distinct"],
                    "partitions": REFRESH, "automation": "eager, in refresh order"},
    "deduplicated_documents": {"group": "dedup", "deps": ["curated_documents", "dedup_index"],
                               "checks": ["conservation", "no_benchmark_overlap", "non_empty", "schema"],
                               "partitions": DOCS, "automation": "eager"},
    "quality_classifier": {"group": "quality", "deps": ["deduplicated_documents"], "checks": ["separates"],
                           "partitions": None, "automation": "once"},
    "quality_scores": {"group": "quality", "deps": ["deduplicated_documents", "quality_classifier"],
                       "checks": ["complete"], "partitions": DOCS, "automation": "eager"},
    "quality_filtered_documents": {"group": "quality", "deps": ["quality_scores", "removal_requests"],
                                   "checks": ["conservation", "non_empty", "schema"], "partitions": DOCS,
                                   "automation": "eager, on one classifier fit"},
    "tokenizer": {"group": "tokens", "deps": ["quality_filtered_documents"], "checks": ["round_trip"],
                  "partitions": None, "automation": "once"},
    "token_shards": {"group": "tokens", "deps": ["quality_filtered_documents", "removal_requests", "tokenizer"],
                     "checks": ["mixture_on_target", "shards_verified"], "partitions": REFRESH, "automation": "eager"},
    # Follows the shards only when `shards.export` names a format (this project's config names none).
    "shard_exports": {"group": "tokens", "deps": ["token_shards"], "checks": ["matches_shards"], "partitions": REFRESH,
                      "automation": None},
    # Training starts only by hand unless `refresh.train: true`; what follows a checkpoint follows it.
    "training_run": {"group": "training", "deps": ["token_shards", "tokenizer"], "checks": [], "partitions": None,
                     "automation": None},
    "checkpoint": {"group": "training", "deps": ["training_run"], "checks": ["loads"], "partitions": None,
                   "automation": "eager"},
    "evaluation": {"group": "training", "deps": ["checkpoint", "quality_filtered_documents", "token_shards",
                                                 "tokenizer"], "checks": [], "partitions": None, "automation": "eager"},
    "training_plan": {"group": "planning", "deps": ["token_shards"], "checks": [], "partitions": None,
                      "automation": None},
    "data_card": {"group": "governance",
                  "deps": ["checkpoint", "curated_documents", "deduplicated_documents", "evaluation", "filtered_documents",
                           "quality_filtered_documents", "raw_documents", "removal_requests", "token_shards", "tokenizer",
                           "training_run"],
                  "checks": ["lineage_complete"], "partitions": None, "automation": "eager"},
    # Written by `kiln forget` outside Dagster; removal_requests_sensor reports each new version.
    "removal_requests": {"group": "governance", "deps": [], "checks": [], "partitions": None, "automation": None},
}


def _partitioning(spec) -> str | None:
    p = spec.partitions_def
    if p is None:
        return None
    dims = getattr(p, "partitions_defs", None)
    return " x ".join(d.name for d in dims) if dims else p.name


def test_asset_graph_snapshot(project):
    definitions = project.definitions
    graph = definitions.defs.resolve_asset_graph()
    checks = {}
    for key in graph.asset_check_keys:
        checks.setdefault(key.asset_key.to_user_string(), []).append(key.name)
    actual = {spec.key.to_user_string(): {"group": spec.group_name,
                                          "deps": sorted(d.asset_key.to_user_string() for d in spec.deps),
                                          "checks": sorted(checks.get(spec.key.to_user_string(), [])),
                                          "partitions": _partitioning(spec),
                                          "automation": spec.automation_condition.get_label()
                                          if spec.automation_condition else None}
              for spec in definitions.defs.resolve_all_asset_specs()}
    assert actual == GRAPH_SNAPSHOT


def test_automation_follows_the_refresh_config(project, tmp_path, kiln_home, monkeypatch):
    config = yaml.safe_load(project.config_path.read_text())

    def automation(**refresh) -> dict:
        p = load_project({**config, "refresh": refresh}, tmp_path, kiln_home, monkeypatch)
        return {s.key.to_user_string(): s.automation_condition.get_label() if s.automation_condition else None
                for s in p.definitions.defs.resolve_all_asset_specs()}

    assert automation(train=True)["training_run"] == "eager"  # only when the config asks for it
    assert set(automation(automation=False).values()) == {None}  # everything by hand


def test_materialize_all_sources_checks_pass_and_lineage_is_recorded(project):
    home = project.home
    for source in ("web", "ref"):
        assert materialize(project, ["raw_documents", "filtered_documents"], source).success
    results, shuffles = {}, []
    for source in ("web", "ref"):
        result = results[source] = materialize(project, ["curated_documents"], source)
        assert result.success
        shuffles.append(sorted(p.name for p in (home / "data" / "curated_documents").glob(".shared-*") if p.is_dir()))
        evaluations = result.get_asset_check_evaluations()
        assert {e.check_name for e in evaluations} == {"conservation", "non_empty", "schema", "residual_pii"}
        assert all(e.passed for e in evaluations), [(e.check_name, e.metadata) for e in evaluations if not e.passed]

    # The refresh's shuffle was shared: kept after web (ref still needs it), removed once ref was done too.
    assert len(shuffles[0]) == 1 and shuffles[1] == []
    curated = json.loads((home / "data" / "curated_documents" / project.partition("web") / "_manifest.json").read_text())
    filtered_ref = json.loads((home / "data" / "filtered_documents" / project.partition("ref") / "_manifest.json").read_text())
    assert curated["inputs"][f"filtered_documents/{project.partition('ref')}"] == filtered_ref["data_version"]
    # web's copies of ref documents 3 and 4 and its internal duplicate are exact-dedup rejections
    assert curated["counts"]["rejected"] == 3
    assert all(f["sha256"] and f["rows"] is not None for f in curated["files"])

    mats = results["web"].asset_materializations_for_node("curated_documents")
    metadata = mats[0].metadata
    assert "exact_dedup.duplicate" in metadata["full_funnel"].value
    assert metadata["documents"].value == curated["counts"]["documents"]


def test_same_input_gives_same_data_version(project):
    home = project.home
    versions = []
    for _ in range(2):
        materialize(project, ["raw_documents"], "ref")
        manifest = home / "data" / "raw_documents" / project.partition("ref") / "_manifest.json"
        versions.append(json.loads(manifest.read_text())["data_version"])
    assert versions[0] == versions[1]


def test_a_failing_blocking_check_stops_downstream(project, monkeypatch):
    import assets.curation as curation_module

    real = curation_module.ingest

    def lossy_ingest(*args, **kwargs):  # simulates a reader bug that loses a record silently
        stats = real(*args, **kwargs)
        stats.docs_in += 1
        return stats

    monkeypatch.setattr(curation_module, "ingest", lossy_ingest)
    result = materialize(project, ["raw_documents", "filtered_documents"], "ref", raise_on_error=False)
    conservation = [e for e in result.get_asset_check_evaluations() if e.check_name == "conservation"]
    assert conservation and not conservation[0].passed
    assert not result.asset_materializations_for_node("filtered_documents")


def test_training_plan_asset(project):
    home = project.home
    result = project.materialize(["training_plan"])
    assert result.success
    metadata = result.asset_materializations_for_node("training_plan")[0].metadata
    assert "Kiln training plan" in metadata["plan"].value
    assert (home / "data" / "training_plan" / "_all" / "plan.json").is_file()


def test_a_failed_step_resumes_from_the_parts_it_completed(project):
    """A step that dies half-way (here a raw part that cannot be read) keeps its completed parts; the re-run does
    only the rest (their files are not rewritten) and commits exactly what an uninterrupted run commits."""
    assert materialize(project, ["raw_documents"], "web").success
    raw_parts = sorted((project.home / "data" / "raw_documents" / project.partition("web")).glob("part-*.parquet"))
    assert len(raw_parts) == 3  # 8 documents, 3 per part
    good = raw_parts[1].read_bytes()
    raw_parts[1].write_bytes(b"not parquet")  # the second part fails; the first is done by then (in order)
    assert not materialize(project, ["filtered_documents"], "web", raise_on_error=False).success
    filtered = project.home / "data" / "filtered_documents"
    staged = list(filtered.glob(f"{project.partition('web').split('/')[0]}/.*.staging-*/part-00000.parquet"))
    assert len(staged) == 1  # kept for the next attempt, with its completion marker
    assert (staged[0].parent / ".done" / "part-00000.parquet.json").is_file()
    first_done = staged[0].stat().st_mtime_ns

    raw_parts[1].write_bytes(good)
    assert materialize(project, ["filtered_documents"], "web").success
    final = filtered / project.partition("web")
    assert (final / "part-00000.parquet").stat().st_mtime_ns == first_done  # not redone
    assert not list(final.glob(".*"))  # markers and scratch are not published
    resumed = json.loads((final / "_manifest.json").read_text())

    assert materialize(project, ["filtered_documents"], "web").success  # from zero
    again = json.loads((final / "_manifest.json").read_text())
    assert again["data_version"] == resumed["data_version"] and again["counts"] == resumed["counts"]


def test_the_checks_are_of_the_version_the_asset_committed_when_another_run_commits_next(project, monkeypatch):
    """Two runs of one partition at once (a backfill and a run from the UI): the other commits its version right
    after this one's. The checks and metadata that read this run's output after its commit (schema, residual PII)
    read the version it committed and reports as its data version, not whatever the dataset's link names by then.
    The other version here holds one part of another name, with an unredacted e-mail address, and forgets the
    versions it replaces. Read through the link (before), the schema check found no part-00000 there and the asset
    failed; residual_pii would scan the other's text."""
    from kiln.common.storage import DatasetWriter, remove_replaced_versions

    for source in ("web", "ref"):
        assert materialize(project, ["raw_documents", "filtered_documents"], source).success
    store, web = project.store, project.partition("web")
    commit = DatasetWriter.commit

    def another_run_commits_next(writer, **kwargs):
        manifest = commit(writer, **kwargs)
        if writer.asset == "curated_documents" and writer.partition == web:
            with store.staging("curated_documents", web) as other:
                table = store.snapshot("curated_documents", web).read_table().slice(0, 1)  # this run's, still current
                other.next_path("documents")  # its one part is part-00001: no part-00000 in this version
                other.write("documents", table.set_column(table.schema.get_field_index("text"), "text",
                                                          [["Write to alice.jones@example.org."]]))
                # and forgets the version it replaced (as a commit applying a removal request does): this run's
                # stays while this run's writer, which holds it, lives
                commit(other, code_version="t", config={}, inputs={}, counts={"documents": 1}, stats={},
                       forget_replaced=True)
                assert writer.committed.folder.is_dir()
        return manifest

    monkeypatch.setattr(DatasetWriter, "commit", another_run_commits_next)
    result = materialize(project, ["curated_documents"], "web")
    committed = result.asset_materializations_for_node("curated_documents")[0].metadata["data_version"].value
    assert store.manifest("curated_documents", web).data_version != committed  # the other run's is current
    evaluations = {e.check_name: e for e in result.get_asset_check_evaluations()}
    assert all(e.passed for e in evaluations.values()), {n: e.metadata for n, e in evaluations.items() if not e.passed}
    assert evaluations["residual_pii"].metadata["hits"].value == {}
    # Forgotten while held: the first commit to the store after the run let go removes it (each commit sweeps).
    folder = store.dataset_dir("curated_documents", web)

    def versions() -> list[Path]:
        return sorted(p for p in folder.parent.glob(f".{folder.name}.v-*") if p.is_dir())

    assert len(versions()) == 2
    remove_replaced_versions(store.root, store.keep_replaced_s)  # as any commit does, with the store's 60 minutes
    assert versions() == [folder.resolve()]


def test_a_users_domain_list_is_recorded_and_an_edit_to_it_is_not_resumed_past(tmp_path, kiln_home, monkeypatch):
    """A user's `url_blocklist.domains_file` decides as much as the step's parameters, but only its path was
    recorded: a failed run resumed after the list was edited kept the parts judged by the old list, and the
    manifest could not say which list judged the documents. Its sha256 (computed here by hashlib) is now part of
    the recorded config and of what a run resumes by."""
    import hashlib

    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": i, "text": prose(i), "url": f"https://site{i}.org/page"}
                                               for i in range(8)])
    domains = tmp_path / "blocked.txt"
    domains.write_text("elsewhere.org\n")
    project = load_project({
        "sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC0",
                     "domain": "web", "profile": "prose"}],
        "profiles": {"prose": [{"step": "url_blocklist", "params": {"domains_file": str(domains)}}]},
        "reading": {"rows_per_part": 3}, "engine": SERIAL_ENGINE,
    }, tmp_path, kiln_home, monkeypatch)
    assert materialize(project, ["raw_documents"], "web").success
    raw_parts = sorted((project.home / "data" / "raw_documents" / project.partition("web")).glob("part-*.parquet"))
    good = raw_parts[1].read_bytes()
    raw_parts[1].write_bytes(b"not parquet")  # fails after part 0 (documents 0-2) was judged by the old list
    assert not materialize(project, ["filtered_documents"], "web", raise_on_error=False).success

    domains.write_text("site0.org\n")  # the user blocks document 0's site, then retries
    raw_parts[1].write_bytes(good)
    assert materialize(project, ["filtered_documents"], "web").success
    manifest = json.loads((project.home / "data" / "filtered_documents" / project.partition("web")
                           / "_manifest.json").read_text())
    assert manifest["counts"]["documents"] == 7
    assert manifest["config"]["list_files"] == {str(domains): hashlib.sha256(b"site0.org\n").hexdigest()}


def test_a_refresh_is_curated_only_after_every_earlier_one(tmp_path, kiln_home, monkeypatch):
    """Exact dedup compares a refresh with the refreshes before it, never with later ones: curated_documents of r2
    run while r1 is not curated would keep r2's copy of an r1 document, and r1, curated later, would keep its own.
    It is refused, naming what to materialize first. A source added to the config after a refresh has no dataset
    there and is not waited for."""
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": i, "text": prose(i)} for i in range(3)])
    web = {"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC-BY", "domain": "web",
           "profile": "none"}
    config = {"sources": [web], "profiles": {"none": []}, "engine": SERIAL_ENGINE}
    project = load_project(config, tmp_path, kiln_home, monkeypatch)
    r1 = project.refresh().key
    write_jsonl(kiln_home / "landing" / "web" / "b.jsonl", [{"id": "again", "text": prose(0)}, {"text": prose(9)}])
    r2 = project.refresh().key
    assert project.materialize(["raw_documents", "filtered_documents"], "web", refresh=r2).success
    refused = project.materialize(["curated_documents"], "web", refresh=r2, raise_on_error=False)
    assert not refused.success
    error = str(refused.get_step_failure_events()[0].step_failure_data.error)
    assert f"curated_documents[web/{r1}] has not been materialized: materialize it first" in error

    assert project.materialize(["raw_documents", "filtered_documents", "curated_documents"], "web", refresh=r1).success
    assert project.materialize(["curated_documents"], "web", refresh=r2).success
    assert project.store.manifest("curated_documents", f"web/{r2}").counts["rejected"] == 1  # prose(0), r1's copy

    # `ref` joins the config: r1 and r2 have no dataset of it, and r3 is curated against what they hold.
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": 0, "text": prose(20)}])
    ref = {**web, "name": "ref", "path": str(tmp_path / "ref"), "domain": "reference"}
    project = load_project({**config, "sources": [web, ref]}, tmp_path, kiln_home, monkeypatch)
    write_jsonl(kiln_home / "landing" / "ref" / "c.jsonl", [{"text": prose(9)}])
    r3 = project.refresh().key
    for source in ("web", "ref"):
        assert project.materialize(["raw_documents", "filtered_documents"], source, refresh=r3).success
    assert project.materialize(["curated_documents"], "ref", refresh=r3).success
    curated = project.store.manifest("curated_documents", f"ref/{r3}")
    assert curated.config["earlier_refreshes"] == [r1, r2] and curated.counts["rejected"] == 1  # prose(9), r2's
