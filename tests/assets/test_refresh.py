"""Two refreshes through Dagster: the landing sensor registers the second, declarative automation carries it
downstream, repeats of the first are dropped, new documents reach the second refresh's token shards, and the
lineage of both shard sets stays intact."""

import os
import string

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest

from kiln.cli import main
from kiln.common.config import load_config
from kiln.governance import audit
from kiln.governance.refresh import load_refreshes
from tests.assets.project import load_project
from tests.audit_store import edit, random_text
from tests.conftest import SERIAL_ENGINE, web_and_ref_sources, write_jsonl


@pytest.fixture
def project(tmp_path, kiln_home, monkeypatch):
    return two_sources(tmp_path, kiln_home, monkeypatch)


@pytest.fixture
def quick_project(tmp_path, kiln_home, monkeypatch):
    """Dagster's runs and events in memory: for the tests that run many small runs."""
    return two_sources(tmp_path, kiln_home, monkeypatch, in_memory=True)


def two_sources(tmp_path, kiln_home, monkeypatch, in_memory=False):
    rng = np.random.default_rng(3)
    vocab = ["".join(rng.choice(list(string.ascii_lowercase), 6)) for _ in range(5000)]
    ref = [random_text(rng, vocab) for _ in range(4)]
    web = [random_text(rng, vocab) for _ in range(6)]
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": i, "text": t} for i, t in enumerate(ref)])
    write_jsonl(tmp_path / "web" / "week1.jsonl", [{"id": i, "text": t} for i, t in enumerate(web)])
    config = {
        "sources": web_and_ref_sources(tmp_path),
        "profiles": {"none": []},
        "engine": SERIAL_ENGINE, "decontamination": {"enabled": False},
        "quality": {"classifier": {"enabled": False}},
        "tokenizer": {"vocab_size": 400},
        "shards": {"seq_len": 16, "val_fraction": 0.0},
        "refresh": {"landing": str(tmp_path / "landing"), "sensor": {"settle_seconds": 0}},
    }
    p = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=in_memory)
    p.rng, p.vocab, p.web, p.landing = rng, vocab, web, tmp_path / "landing"
    return p


def rows(project, asset, partition, role="documents"):
    return [r for path in project.store.files(asset, partition, role) for r in pq.read_table(path).to_pylist()]


def members(project, refresh):
    return {r["doc_id"]: r for r in rows(project, "token_shards", refresh, "members")}


def sensor(project):
    from orchestration.refresh import landing_sensor

    with dg.build_sensor_context(instance=project.instance, resources=project.resources) as context:
        return landing_sensor(context)


@pytest.mark.slow
def test_a_second_refresh_drops_repeats_and_versions_the_shards(project, capsys):
    # Refresh 1: the sensor's first tick registers the configured sources and starts their intake.
    first_requests = sensor(project)
    [first] = load_refreshes(project.store)
    assert first.trigger == "sensor" or first.trigger == "initial"
    assert {r.partition_key for r in first_requests} == {
        dg.MultiPartitionKey({"refresh": first.key, "source": s}) for s in ("web", "ref")}
    assert project.instance.get_dynamic_partitions("refresh") == [first.key]
    project.refresh_key = first.key
    assert project.materialize_refresh()
    shards_1 = project.store.manifest("token_shards", first.key)
    kept_1 = {r["doc_id"]: r["text"] for r in rows(project, "curated_documents", f"web/{first.key}")}

    # Nothing landed yet: the next tick skips, and says where it looked.
    skip = sensor(project)
    assert isinstance(skip, dg.SkipReason) and str(project.landing) in skip.skip_message

    # Week 2 lands for web: two pages repeated word for word (the crawl reuses their native ids), one lightly
    # edited, two new; plus a folder naming no source (left alone) and an upload in progress (ignored).
    rng, vocab, web = project.rng, project.vocab, project.web
    new = [random_text(rng, vocab) for _ in range(2)]
    write_jsonl(project.landing / "web" / "week2.jsonl",
                [{"id": 0, "text": web[0]}, {"id": 1, "text": web[1]}, {"id": "e", "text": edit(web[2], rng, vocab, 1)}]
                + [{"id": f"n{i}", "text": t} for i, t in enumerate(new)])
    write_jsonl(project.landing / "wikipedia" / "x.jsonl", [{"text": new[0]}])
    write_jsonl(project.landing / "web" / ".week3.jsonl.part", [{"text": "half"}])
    cursor = dg.evaluate_automation_conditions(defs=project.definitions.defs, instance=project.instance).cursor
    requests = sensor(project)
    second = load_refreshes(project.store)[-1]
    assert second.key != first.key and [f.relative for f in second.files_of("web")] == ["week2.jsonl"]
    assert second.files_of("ref") == [] and "wikipedia" not in (second.files or {})
    assert {(r.partition_key, tuple(k.to_user_string() for k in r.asset_selection)) for r in requests} == {
        (dg.MultiPartitionKey({"refresh": second.key, "source": s}), ("raw_documents", "filtered_documents"))
        for s in ("web", "ref")}
    assert all(r.tags["kiln/refresh"] == second.key and r.run_key for r in requests)

    # The intake runs; declarative automation then asks for the refresh's next steps, and never for training.
    project.refresh_key = second.key
    for source in ("web", "ref"):
        assert project.materialize(["raw_documents", "filtered_documents"], source).success
    evaluation = dg.evaluate_automation_conditions(defs=project.definitions.defs, instance=project.instance,
                                                   cursor=cursor)
    requested = {r.key.to_user_string(): r.true_subset for r in evaluation.results if r.true_subset.size}
    # (signatures follow curation in the same run: eager plans what its requested parents will produce)
    assert set(requested) == {"curated_documents", "minhash_signatures"}
    assert all(subset.size == 2 for subset in requested.values())  # web and ref of the new refresh only

    assert project.materialize_refresh()
    # Exact repeats are removed at curation as copies of the first refresh's documents (new doc ids: the
    # refresh namespaces them even though the native ids repeat) ...
    removed = rows(project, "curated_documents", f"web/{second.key}", "rejected")
    assert len(removed) == 2 and {r["duplicate_of"] for r in removed} <= set(kept_1)
    assert not {r["doc_id"] for r in removed} & set(kept_1)
    curated = project.store.manifest("curated_documents", f"web/{second.key}")
    assert f"curated_documents/web/{first.key}" in curated.inputs and curated.config["earlier_refreshes"] == [first.key]
    # ... the edited one at near-dedup, matched against the persistent index of the first refresh ...
    index = project.store.manifest("dedup_index", second.key)
    assert index.stats["matched_earlier_refreshes"] == 1 and index.counts["near_duplicates"] == 1
    # ... and the two new pages flow into the second refresh's token shards, next to everything of the first.
    shards_2 = project.store.manifest("token_shards", second.key)
    assert shards_2.config["refreshes"] == [first.key, second.key]
    new_ids = {r["doc_id"] for r in rows(project, "quality_filtered_documents", f"web/{second.key}")}
    assert len(new_ids) == 2 and new_ids <= set(members(project, second.key))
    assert set(members(project, first.key)) < set(members(project, second.key))
    # The first shard set is still there, unchanged: each refresh has its own version.
    assert project.store.manifest("token_shards", first.key).data_version == shards_1.data_version
    assert shards_2.data_version != shards_1.data_version

    # Lineage of both shard sets is intact and reaches the raw documents of every refresh they hold.
    for key, raws in ((first.key, {first.key}), (second.key, {first.key, second.key})):
        chain = audit.lineage(project.store, f"token_shards/{key}")
        assert not chain.problems, chain.problems
        assert {p.split("/")[1] for p in chain.partitions("raw_documents")} == raws
    landed = project.store.manifest("raw_documents", f"web/{second.key}").config["refresh"]
    assert [f["relative"] for f in landed["landed_files"]] == ["week2.jsonl"]
    # `kiln audit refreshes` tells the same story from the store, and warns about the stray landing folder.
    report = audit.refresh_report(project.store, load_config(project.config_path))
    assert [(r["key"], r["landed_files"]) for r in report.refreshes] == [(first.key, None),
                                                                       (second.key, {"web": ["week2.jsonl"]})]
    assert report.refreshes[1]["sources"]["web"] == {"raw_records": 5, "documents": 2}
    assert report.refreshes[1]["token_shards"] == shards_2.data_version and report.unknown_sources == ["wikipedia"]
    assert main(["audit", "refreshes", "--home", str(project.home), "--config", str(project.config_path)]) == 0
    assert "week2.jsonl" in capsys.readouterr().out

    # The schedule registers what lands next the same way (trigger recorded); training is never requested.
    write_jsonl(project.landing / "ref" / "more.jsonl", [{"text": random_text(rng, vocab)}])
    from orchestration.refresh import refresh_schedule

    with dg.build_schedule_context(instance=project.instance, resources=project.resources) as context:
        scheduled = refresh_schedule(context)
    third = load_refreshes(project.store)[-1]
    assert third.trigger == "schedule" and len(scheduled) == 2
    assert all("training_run" not in {k.to_user_string() for k in r.asset_selection} for r in scheduled)

    # A refresh partition added by hand in the UI takes what has landed since; with nothing new it says so.
    write_jsonl(project.landing / "web" / "late.jsonl", [{"text": random_text(rng, vocab)}])
    project.instance.add_dynamic_partitions("refresh", ["by-hand", "empty"])
    assert project.materialize(["raw_documents"], "web", refresh="by-hand").success
    by_hand = load_refreshes(project.store)[-1]
    assert (by_hand.key, by_hand.trigger, [f.relative for f in by_hand.files_of("web")]) == \
        ("by-hand", "ui", ["late.jsonl"])
    failed = project.materialize(["raw_documents"], "web", refresh="empty", raise_on_error=False)
    assert not failed.success
    assert "nothing new landed" in str(failed.get_step_failure_events()[0].step_failure_data.error)

    # The token shards of the refresh added by hand hold every refresh up to it; two of them were never curated (the
    # scheduled one's intake never ran, the hand-added one stopped at raw_documents). Their documents would be left
    # out while the set named those refreshes: it refuses instead, naming the partitions to materialize.
    failed = project.materialize(["token_shards"], refresh="by-hand", raise_on_error=False)
    assert not failed.success
    message = str(failed.get_step_failure_events()[0].step_failure_data.user_failure_data.description)
    assert f"for ref/{third.key}, web/by-hand (its intake failed or never ran)" in message


def run_intake(project, requests):
    for r in requests:
        assert dg.materialize(project.assets, selection=r.asset_selection, partition_key=r.partition_key,
                              resources=project.resources, instance=project.instance).success


def test_a_fresh_deployment_reaches_its_token_shards_by_automation_alone(quick_project):
    """The automation sensor starts before anything has landed (its first look sees the fitted-once assets
    missing) and no removal request was ever made: the first refresh still flows, tick after tick, from its intake
    to its token shards, fitting the quality classifier and the tokenizer on the way, and never starts training."""
    project = quick_project
    cursor, requested = project.automation_tick()
    assert requested == {}
    run_intake(project, sensor(project))
    [refresh] = load_refreshes(project.store)
    cursor, ticks = project.automate(cursor)
    requested = {asset for tick in ticks for asset in tick}
    assert {"quality_classifier", "tokenizer", "quality_filtered_documents", "token_shards"} <= requested
    assert "training_run" not in requested
    assert project.store.manifest_or_none("token_shards", refresh.key) is not None

    # `kiln forget` a document: the quality filter of every partition follows the new request, and only then, in
    # a later tick, the token shards follow the re-filtered partitions (requested together, they would run
    # beside the filter, reading the versions it replaces).
    forgotten = next(iter(members(project, refresh.key)))
    ids = project.home / "ids.txt"
    ids.write_text(forgotten + "\n")
    assert main(["forget", "--doc-ids", str(ids), "--home", str(project.home),
                 "--config", str(project.config_path)]) == 0
    from orchestration.refresh import removal_requests_sensor

    with dg.build_sensor_context(instance=project.instance, resources=project.resources) as context:
        for event in removal_requests_sensor(context).asset_events:
            project.instance.report_runless_asset_event(event)
    cursor, requested = project.automation_tick(cursor)
    assert set(requested) == {"quality_filtered_documents"} and len(requested["quality_filtered_documents"]) == 2
    assert not project.run_requested(requested)
    cursor, requested = project.automation_tick(cursor)
    assert requested == {"token_shards": [refresh.key]}
    assert not project.run_requested(requested)
    assert forgotten not in members(project, refresh.key)
    assert project.automation_tick(cursor)[1] == {}


def test_a_refresh_whose_intake_was_never_submitted_is_started_by_the_next_tick(quick_project):
    """An evaluation whose run requests are not submitted (the UI's "Test sensor", a tick that times out or fails to
    submit) has registered the refresh: the next tick, finding nothing new, still asks for that refresh's intake,
    with the run keys the first evaluation gave (Dagster launches a run key once). A refresh with its intake done is
    not asked for again."""
    project = quick_project
    run_intake(project, sensor(project))
    write_jsonl(project.landing / "web" / "week2.jsonl", [{"id": "n", "text": random_text(project.rng, project.vocab)}])
    preview = sensor(project)  # shown, never submitted
    second = load_refreshes(project.store)[-1]
    retried = sensor(project)
    assert not isinstance(retried, dg.SkipReason)
    assert [(r.run_key, r.partition_key, r.asset_selection) for r in retried] == \
        [(r.run_key, r.partition_key, r.asset_selection) for r in preview]
    assert {r.partition_key for r in retried} == {dg.MultiPartitionKey({"refresh": second.key, "source": s})
                                                  for s in ("web", "ref")}
    run_intake(project, retried)
    assert isinstance(sensor(project), dg.SkipReason)


def schedule_tick(project, when):
    from orchestration.refresh import refresh_schedule

    with dg.build_schedule_context(instance=project.instance, resources=project.resources,
                                   scheduled_execution_time=when) as context:
        return refresh_schedule(context)


def started(project, requests, **instigator):
    """What Dagster's daemon does with a tick's requests: a run each, tagged with its run key and its instigator."""
    import uuid

    from dagster._core.storage.dagster_run import DagsterRun, DagsterRunStatus
    from dagster._core.storage.tags import RUN_KEY_TAG

    for r in requests:
        project.instance.add_run(DagsterRun(job_name="__ASSET_JOB", run_id=str(uuid.uuid4()),
                                            status=DagsterRunStatus.STARTED,
                                            tags={**r.tags, RUN_KEY_TAG: r.run_key, **instigator}))


def test_the_sensor_and_the_schedule_never_start_the_same_intake_twice(project):
    """Dagster skips a run key only among the runs of the sensor or the schedule asking for it. The schedule registers
    the first refresh and its intake of `web` starts (the `ref` run was never submitted): the landing sensor, ticking
    while that run goes on, asks for `ref` alone, and neither the sensor later nor the schedule a week later asks
    for `web` again (its run still running, or failed)."""
    import datetime as dt

    from dagster._core.storage.tags import SCHEDULE_NAME_TAG, SCHEDULED_EXECUTION_TIME_TAG, SENSOR_NAME_TAG

    monday = dt.datetime(2026, 12, 7, 3, tzinfo=dt.timezone.utc)
    by_schedule = schedule_tick(project, monday)
    [first] = load_refreshes(project.store)
    assert [r.run_key for r in by_schedule] == [f"refresh-{first.key}-web", f"refresh-{first.key}-ref"]
    started(project, by_schedule[:1], **{SCHEDULE_NAME_TAG: "refresh_schedule",
                                        SCHEDULED_EXECUTION_TIME_TAG: monday.isoformat()})
    by_sensor = sensor(project)
    assert [r.run_key for r in by_sensor] == [f"refresh-{first.key}-ref"]
    started(project, by_sensor, **{SENSOR_NAME_TAG: "landing_sensor"})
    assert isinstance(sensor(project), dg.SkipReason)
    skipped = schedule_tick(project, monday + dt.timedelta(days=7))
    assert isinstance(skipped, dg.SkipReason) and f"refresh {first.key} has already been started" in skipped.skip_message


def test_a_partition_added_by_hand_takes_what_lands_and_holds_no_refresh_for_ever(quick_project):
    """A refresh partition added in the UI before the landing sensor saw the new files: the sensor registers them
    under that key (its own run would have), so the partition reads them and automation curates it; registered
    under a new key, the hand-added one had nothing left to read (its intake refused) and held the new refresh's
    curation for ever (refreshes are decided in Dagster's partition order)."""
    project = quick_project
    cursor, _ = project.automation_tick()
    run_intake(project, sensor(project))
    [first] = load_refreshes(project.store)
    project.instance.add_dynamic_partitions("refresh", ["by-hand"])
    write_jsonl(project.landing / "web" / "week2.jsonl", [{"id": "n", "text": random_text(project.rng, project.vocab)}])
    requests = sensor(project)
    assert [r.key for r in load_refreshes(project.store)] == [first.key, "by-hand"]
    assert project.instance.get_dynamic_partitions("refresh") == [first.key, "by-hand"]
    assert {r.partition_key for r in requests} == {dg.MultiPartitionKey({"refresh": "by-hand", "source": s})
                                                   for s in ("web", "ref")}
    run_intake(project, requests)
    curated = []
    for _ in range(2):
        cursor, requested = project.automation_tick(cursor)
        curated += sorted({str(k).split("|")[0] for k in requested.get("curated_documents", [])})
        assert not project.run_requested(requested)
    assert curated == [first.key, "by-hand"]


def test_partitions_added_by_hand_take_refreshes_in_the_order_they_were_added(quick_project):
    """Partitions A then B added by hand, and B's intake run first: it registered what had landed as B, the sensor
    then registered the next files as A, and the registry (B before A, the order curation and dedup compare in)
    and Dagster's partitions (A before B, the order automation follows) disagreed: A's curation was refused (B not
    curated) and B waited for A, for ever. B's intake is now refused, naming A; A takes what has landed, B the
    next files, and automation curates A, then B."""
    project = quick_project
    cursor, _ = project.automation_tick()
    run_intake(project, sensor(project))
    [first] = load_refreshes(project.store)
    project.instance.add_dynamic_partitions("refresh", ["A", "B"])
    write_jsonl(project.landing / "web" / "w2.jsonl", [{"id": "n2", "text": random_text(project.rng, project.vocab)}])
    refused = dg.materialize(project.assets, selection=["raw_documents"], resources=project.resources,
                             partition_key=dg.MultiPartitionKey({"refresh": "B", "source": "web"}),
                             instance=project.instance, raise_on_error=False)
    assert not refused.success
    error = refused.get_step_failure_events()[0].step_failure_data.error
    message = error.cause.message if error.cause else error.message
    assert "refresh 'B' was added after 'A', which holds no refresh yet" in message
    assert "run the intake (raw_documents) of 'A' first" in message
    assert [r.key for r in load_refreshes(project.store)] == [first.key]
    run_intake(project, sensor(project))  # registers the landed file as A
    write_jsonl(project.landing / "web" / "w3.jsonl", [{"id": "n3", "text": random_text(project.rng, project.vocab)}])
    run_intake(project, sensor(project))
    assert [r.key for r in load_refreshes(project.store)] == [first.key, "A", "B"]
    curated = []
    for _ in range(4):
        cursor, requested = project.automation_tick(cursor)
        curated += sorted({str(k).split("|")[0] for k in requested.get("curated_documents", [])})
        assert not project.run_requested(requested)  # nothing asked for is refused
    assert curated == [first.key, "A", "B"]


def test_the_run_key_tag_is_dagsters():
    from dagster._core.storage.tags import RUN_KEY_TAG

    from orchestration.refresh import RUN_KEY_TAG as OURS

    assert OURS == RUN_KEY_TAG


def test_automation_curates_and_indexes_a_refresh_only_after_the_earlier_ones(quick_project):
    """Two refreshes' intakes are done before automation looks: it asks for the curation (and later the dedup index)
    of the first only; the second's runs would start beside it and be refused (a refresh is decided against every
    earlier one), and nothing would ask again. The second is asked for once the first is done."""
    project = quick_project
    cursor, _ = project.automation_tick()
    run_intake(project, sensor(project))
    write_jsonl(project.landing / "web" / "week2.jsonl", [{"id": "n", "text": random_text(project.rng, project.vocab)}])
    run_intake(project, sensor(project))
    first, second = (r.key for r in load_refreshes(project.store))

    def refreshes(requested, asset):
        return {str(k).split("|")[0] for k in requested.get(asset, [])}

    cursor, requested = project.automation_tick(cursor)
    assert refreshes(requested, "curated_documents") == {first}
    assert not project.run_requested(requested)
    cursor, requested = project.automation_tick(cursor)
    assert refreshes(requested, "curated_documents") == {second}
    assert refreshes(requested, "dedup_index") == {first}
    assert not project.run_requested(requested)
    cursor, requested = project.automation_tick(cursor)
    assert refreshes(requested, "dedup_index") == {second}


def test_a_refresh_whose_intake_failed_holds_the_later_ones_until_it_is_read(quick_project):
    """Refresh 2's files landed but its intake failed (never ran here); refresh 3's intake ran. Refresh 3's curation
    would be refused (refresh 2 is not curated) and never asked for again: automation waits for refresh 2 instead,
    and once its intake is repaired curates 2, then 3."""
    project = quick_project
    cursor, _ = project.automation_tick()
    run_intake(project, sensor(project))
    write_jsonl(project.landing / "web" / "week2.jsonl", [{"id": "n2", "text": random_text(project.rng, project.vocab)}])
    failed_intake = sensor(project)
    write_jsonl(project.landing / "web" / "week3.jsonl", [{"id": "n3", "text": random_text(project.rng, project.vocab)}])
    requests = sensor(project)
    first, second, third = (r.key for r in load_refreshes(project.store))
    run_intake(project, [r for r in requests if r.tags["kiln/refresh"] == third])
    curated = []
    for repaired in (False, True):
        if repaired:
            run_intake(project, failed_intake)
        for _ in range(8):
            cursor, requested = project.automation_tick(cursor)
            curated += sorted({str(k).split("|")[0] for k in requested.get("curated_documents", [])})
            assert not project.run_requested(requested)  # nothing asked for is refused
        assert curated == ([first] if not repaired else [first, second, third])


def test_a_cron_dagster_cannot_run_fails_the_code_location_naming_the_config_key(tmp_path):
    """'99 3 * * 1' has the 5 fields the config checks, but minute 99 is out of range: Dagster refuses the schedule
    when the code location loads, and the message names refresh.schedule.cron, the value and the fix."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    config = tmp_path / "kiln.yaml"
    config.write_text(f"extends: {root / 'configs' / 'default.yaml'}\nrefresh: {{schedule: {{cron: '99 3 * * 1'}}}}\n")
    done = subprocess.run([sys.executable, "-c", "import orchestration.refresh"], cwd=root, capture_output=True,
                          text=True, env={**os.environ, "KILN_CONFIG": str(config), "KILN_HOME": str(tmp_path)})
    assert done.returncode != 0
    assert "ConfigError: refresh.schedule.cron: '99 3 * * 1' is not a schedule Dagster can run" in done.stderr
    assert "e.g. '0 3 * * 1' for Mondays 03:00" in done.stderr


def test_make_demo_registers_what_has_landed_as_the_partition_added_by_hand(quick_project, monkeypatch):
    """`make demo` registered the landed files under a key of its own while a partition added by hand waited, last
    in the registry but first in Dagster's order: the two orders disagreed as in the test above. It now gives
    them to the oldest partition added by hand, as the landing sensor does."""
    from orchestration import demo

    project = quick_project
    first = project.refresh()
    project.instance.add_dynamic_partitions("refresh", ["A"])
    write_jsonl(project.landing / "web" / "w2.jsonl", [{"id": "n2", "text": random_text(project.rng, project.vocab)}])
    asked = []
    monkeypatch.setattr(dg.DagsterInstance, "get", staticmethod(lambda: project.instance))
    monkeypatch.setattr("resources.KilnStorage", lambda: project.resources["storage"])  # its default: an older home
    monkeypatch.setattr(demo, "materialize_refresh", lambda run, store, key, sources, refit: asked.append(key))
    assert demo.run_demo(load_config(project.config_path)) == 1  # stopped at its first refresh's runs
    assert [r.key for r in load_refreshes(project.store)] == [first.key, "A"]
    assert asked == [first.key]
