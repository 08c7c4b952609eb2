"""`kiln forget`: a removal request drops documents from the next shards and flags the checkpoint trained on them."""

import json
import os
import re

import pyarrow.parquet as pq
import pytest
import yaml

from kiln.cli import main
from kiln.common.config import load_config
from kiln.governance import audit
from kiln.governance.data_card import build_data_card
from kiln.governance.data_card_documents import REMOVED_BY_REQUEST
from kiln.common.storage import Store
from kiln.governance.forget import REQUESTS, REQUESTS_FILE, RemovalRequest, load_requests, read_doc_ids
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.governance.membership import membership
from kiln.governance.render import render
from kiln.tokens.shard_format import open_shard
from kiln.tokens.tokenizer import Tokenizer
from tests.audit_store import build_audit_store, members, random_text, stand_in_checkpoint
from tests.conftest import write_jsonl


@pytest.fixture
def built(tmp_path, monkeypatch):
    return build_audit_store(tmp_path, monkeypatch)


@pytest.fixture(scope="module")
def read_only_built(tmp_path_factory):
    """One store for the tests that must leave it as it was (a refused request records nothing): built once."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        yield build_audit_store(tmp_path_factory.mktemp("audit"), monkeypatch)


def forget(built, capsys, *args):
    code = main(["forget", *args, "--home", str(built["home"]), "--config", str(built["config_path"]), "--json"])
    out, err = capsys.readouterr()
    return code, (json.loads(out) if code == 0 else None), err


def test_the_requests_and_their_data_version_are_one_versions(tmp_path, monkeypatch):
    """A `kiln forget` committing a new list while load_requests reads it (here: right after it has looked the
    dataset up): the list and the data version it returns are both of the version it looked up."""
    store = Store(tmp_path)

    def commit(n: int) -> str:  # as record_request writes the list
        requests = [{"request_id": f"r{i}", "created_at": "t", "kind": "source", "value": "web", "reason": ""}
                    for i in range(n)]
        with store.staging(REQUESTS) as writer:
            (writer.dir / REQUESTS_FILE).write_text(json.dumps({"requests": requests}), encoding="utf-8")
            writer.commit(code_version="kiln.forget", config={}, inputs={}, counts={"requests": n})
        return store.manifest(REQUESTS).data_version

    first = commit(1)
    looked_up = Store.snapshot

    def then_a_commit(self, asset, partition=None):
        snap = looked_up(self, asset, partition)
        monkeypatch.setattr(Store, "snapshot", looked_up)
        commit(2)
        return snap

    monkeypatch.setattr(Store, "snapshot", then_a_commit)
    requests, version = load_requests(store)
    assert ([r.request_id for r in requests], version) == (["r0"], first)
    assert len(load_requests(store)[0]) == 2


def test_forget_a_source_removes_it_from_the_next_shards_and_flags_the_checkpoint(built, capsys, tmp_path):
    store, project = built["store"], built["project"]
    trained_web = [m for m in built["members"].values() if m["source"] == "web" and m["split"] == "train"
                   and m["copies"] > 0]
    assert trained_web
    code, request, _ = forget(built, capsys, "--source", "web", "--reason",
                              "publisher request #12, from quinn.harlow@fastmail.fm")
    assert code == 0
    [affected] = request["affected"]
    assert affected["checkpoint"] == built["checkpoint"].data_version and affected["documents"] == len(trained_web)
    assert affected["sources"] == ["web"] and affected["read"] is None  # the stand-in run recorded no exposure
    requests, version = load_requests(store)
    assert [r.request_id for r in requests] == [request["request_id"]] and version
    # Until the shards are made again the document is in training, and membership says a request names it
    pending = render(membership(store, built["config"], doc_id=trained_web[0]["doc_id"]))
    assert "IN TRAINING" in pending and f"removal request {request['request_id']} (source)" in pending

    # The next materialization: the source's documents go to the rejected table with the request's id ...
    config = yaml.safe_load(built["config_path"].read_text())
    config["mixture"] = {"weights": {}}  # the mixture named the forgotten source; natural proportions now
    built["config_path"].write_text(yaml.safe_dump(config))
    for source in ("web", "ref"):
        assert project.materialize(["quality_filtered_documents"], source).success
    filtered = store.manifest("quality_filtered_documents", project.partition("web"))
    assert filtered.counts["documents"] == 0 and filtered.inputs["removal_requests"] == version
    rejected = store.read_table("quality_filtered_documents", project.partition("web"), "rejected").to_pylist()
    assert {(r["stage"], r["reason"]) for r in rejected} == {("removal_request", f"removal_request:{request['request_id']}")}
    assert store.manifest("quality_filtered_documents", project.partition("ref")).counts["rejected"] == 0
    # ... so the next shards hold none of them,
    assert project.materialize(["token_shards"]).success
    assert all(m["source"] == "ref" for m in members(store).values())
    # the set the checkpoint read is still described shard by shard, its composition from the store's history,
    [old] = audit.source_usage(store, built["config"], "web").shard_sets
    assert old.replaced and old.shards and all(s["documents"] > 0 for s in old.shards)
    assert sum(s["tokens"] for s in old.shards) == old.train_tokens + old.val_tokens
    # membership says where and why,
    answer = membership(store, built["config"], doc_id=trained_web[0]["doc_id"])
    assert "removal_request" in render(answer)
    # and the data card of the checkpoint trained on them says so.
    assert project.materialize(["data_card"]).success
    card = json.loads((store.dataset_dir("data_card") / "data_card.json").read_text())
    [flag] = card["removal_requests"]
    assert flag["request_id"] == request["request_id"] and flag["affected"]["documents"] == len(trained_web)
    markdown = (store.dataset_dir("data_card") / "data_card.md").read_text()
    assert "Removal requests affecting this checkpoint" in markdown
    assert f"| {len(trained_web)} | {flag['affected']['tokens']:,} | not recorded | not recorded |" in markdown
    # the card is published: the reason's e-mail address is redacted there (the request keeps it, for the record)
    assert flag["reason"] == "publisher request #12, from <EMAIL>" and "quinn.harlow" not in markdown
    assert load_requests(store)[0][0].reason.endswith("quinn.harlow@fastmail.fm")


def test_a_request_recorded_while_a_run_trains_is_on_the_card_of_the_checkpoint_it_publishes(built):
    """A run launched before a request (its shards named nothing pending then) trains on through it: the request lists
    only the checkpoints published when it was recorded, but the checkpoint that run publishes afterwards was trained
    on the document too, and its card says so; a later checkpoint on shards that applied the request is not flagged."""
    from kiln.governance.forget import record_request

    store, config = built["store"], built["config"]
    trained = sorted(d for d, m in built["members"].items() if m["split"] == "train" and m["copies"] > 0)[:1]
    tokens = built["members"][trained[0]]["tokens"] * built["members"][trained[0]]["copies"]
    request = record_request(store, config, "doc_ids", trained, "ticket 9")  # the run is training meanwhile
    assert [a["checkpoint"] for a in request.affected] == [built["checkpoint"].data_version]
    published = stand_in_checkpoint(store, name="in flight")  # it ends: its checkpoint, over the shards it read
    assert published.data_version != built["checkpoint"].data_version
    [flag] = build_data_card(store, config)["removal_requests"]
    assert flag["request_id"] == request.request_id and flag["affected"]["checkpoint"] == published.data_version
    assert (flag["affected"]["documents"], flag["affected"]["tokens"], flag["affected"]["current"]) == (1, tokens, True)
    assert flag["value"] == "1 doc ids" and flag["reason"] == "ticket 9"
    assert built["project"].materialize(["token_shards"]).success  # applies it
    stand_in_checkpoint(store, name="after")
    assert build_data_card(store, config)["removal_requests"] == []


def test_the_evaluation_reads_no_validation_document_a_request_recorded_since_names(built, monkeypatch):
    """A checkpoint whose run was training when a request came is evaluated on the validation split of the shards it
    read, which still hold the document (as training_run refuses such shards, the evaluation may not read it): its
    tokens are cut from the validation stream and it is not among the source's validation documents."""
    from types import SimpleNamespace

    import numpy as np
    import torch

    import training_jobs.evaluate as evaluate
    import training_jobs.export as export
    from kiln.governance.forget import record_request

    store, config, project = built["store"], built["config"], built["project"]
    [val] = sorted(d for d, m in built["members"].items() if m["split"] == "val" and m["copies"] > 0)[:1]
    source = built["members"][val]["source"]
    [text] = [r["text"] for r in store.read_table("quality_filtered_documents", project.partition(source),
                                                   "documents").to_pylist() if r["doc_id"] == val]
    tok = Tokenizer.load(store.dataset_dir("tokenizer"))
    document = tok.encode(text) + [tok.eos_id]  # as the shards hold a validation document (never FIM-cut)

    class Uniform(torch.nn.Module):  # the checkpoint's model: only what the evaluation reads matters here
        cfg = SimpleNamespace(max_seq_len=16)

        def forward(self, x):
            return torch.zeros(*x.shape, 400)

    streams, loss = [], evaluate.stream_loss
    monkeypatch.setattr(export, "load_model", lambda path: Uniform())
    monkeypatch.setattr(evaluate, "stream_loss", lambda model, tokens, *a, **k: streams.append(
        np.asarray(tokens, np.int64)) or loss(model, tokens, *a, **k))
    assert project.materialize(["evaluation"]).success
    whole = streams[0]  # the validation split as the shards hold it, before any request
    assert _holds(whole, document) and any(_holds(s, document) for s in streams[1:] if len(s) >= len(document))
    streams.clear()
    request = record_request(store, config, "doc_ids", [val], "")
    assert project.materialize(["evaluation"]).success
    at = next(i for i in range(len(whole)) if whole[i:i + len(document)].tolist() == document)
    assert streams[0].tolist() == whole[:at].tolist() + whole[at + len(document):].tolist()
    assert not any(_holds(s, document) for s in streams if len(s) >= len(document))  # nor a source's, nor a probe
    evaluation = store.manifest("evaluation")
    assert evaluation.stats["removed_by_request"] == {"documents": 1, "tokens": len(document)}
    assert evaluation.inputs["removal_requests"] == load_requests(store)[1]
    assert load_requests(store)[0][-1].request_id == request.request_id


def _holds(tokens, needle) -> bool:
    """Whether `needle` (token ids) occurs contiguously in `tokens`: a second, direct look at the shard files."""
    import numpy as np

    windows = np.lib.stride_tricks.sliding_window_view(tokens, len(needle))
    return bool((windows == np.asarray(needle, tokens.dtype)).all(axis=1).any())


def _run_requests_sensor(project) -> None:
    """One tick of removal_requests_sensor, its events recorded as the daemon records them; a second tick finds
    nothing new."""
    import dagster as dg

    sensor = project.definitions.defs.get_sensor_def("removal_requests_sensor")
    resources = {"storage": project.resources["storage"]}
    with dg.build_sensor_context(instance=project.instance, resources=resources) as context:
        result = sensor(context)
    [event] = result.asset_events
    assert event.tags["dagster/data_version"] == load_requests(project.store)[1]
    project.instance.report_runless_asset_event(event)
    with dg.build_sensor_context(instance=project.instance, resources=resources, cursor=result.cursor) as context:
        assert isinstance(sensor(context), dg.SkipReason)


def _shards_status(project, refresh: str) -> str:
    """token_shards' staleness as the UI computes it (Dagster's own resolver)."""
    import dagster as dg
    from dagster._utils.test.data_versions import get_stale_status_resolver

    assets = [a if isinstance(a, dg.AssetsDefinition) else dg.AssetsDefinition(specs=[a]) for a in project.assets]
    return get_stale_status_resolver(project.instance, assets).get_status(dg.AssetKey("token_shards"), refresh).name


def test_forget_reaches_every_refresh_in_the_next_shards(built, capsys):
    """Refresh 2 lands and is trained into shards; then a whole source and one doc id of refresh 1 are forgotten.
    Re-materializing refresh 2's shards (which read refresh 1's documents too, never re-filtered) leaves out every
    token of them — looked up in the shard files themselves — and the data card and membership audit say so."""
    store, project, rng, vocab = built["store"], built["project"], built["rng"], built["vocab"]
    first = project.current()
    landing = built["home"] / "landing"
    write_jsonl(landing / "web" / "week2.jsonl", [{"id": f"v{i}", "text": random_text(rng, vocab)} for i in range(6)])
    write_jsonl(landing / "ref" / "b.jsonl", [{"id": f"s{i}", "text": random_text(rng, vocab)} for i in range(6)])
    second = project.refresh().key
    assert second != first and project.materialize_refresh(sources=["web", "ref"])
    before = members(store)
    trained = lambda m, source: m["source"] == source and m["split"] == "train" and m["copies"] > 0  # noqa: E731
    ref_id = next(d for d, m in sorted(before.items()) if trained(m, "ref") and d in built["members"])  # refresh 1
    web_ids = [d for d, m in before.items() if m["source"] == "web"]
    assert any(d in built["members"] for d in web_ids) and any(d not in built["members"] for d in web_ids)

    _, by_source, _ = forget(built, capsys, "--source", "web")
    (ids := built["home"] / "ids.txt").write_text(ref_id + "\n")
    _, by_id, _ = forget(built, capsys, "--doc-ids", str(ids))
    config = yaml.safe_load(built["config_path"].read_text())
    config["mixture"] = {"weights": {}}  # the mixture named the forgotten source; natural proportions now
    built["config_path"].write_text(yaml.safe_dump(config))
    # Dagster hears of the requests from the sensor: the shards (which apply them) are stale until rebuilt.
    assert _shards_status(project, second) == "FRESH"
    _run_requests_sensor(project)
    assert _shards_status(project, second) == "STALE"
    assert project.materialize(["token_shards"]).success  # refresh 2's shards again, nothing upstream
    assert _shards_status(project, second) == "FRESH"
    # The shards they replaced, which held the forgotten documents, are gone from disk at once (not kept an hour)
    shard_dir = store.root / "token_shards"
    assert [p.name for p in shard_dir.glob(f".{second}.v-*")] == [os.readlink(shard_dir / second)]

    after = members(store)
    gone = set(web_ids) | {ref_id}
    assert {after[d]["removed_by"] for d in web_ids} == {f"removal_request:{by_source['request_id']}"}
    assert after[ref_id]["removed_by"] == f"removal_request:{by_id['request_id']}"
    assert all(after[d]["copies"] == 0 and after[d]["tokens"] == 0 for d in gone)
    # Nothing of a removed document but its id and the request: no licence, language or locator recorded.
    assert all(after[d][k] is None for d in gone for k in ("license", "language", "locator"))
    assert {after[d]["license"] for d in after if d not in gone} == {"CC0-1.0"}  # ref's, what is left
    assert any(trained(m, "ref") for m in after.values())
    # The shard files: no forgotten document's tokens (its first 12), while a kept one's are found.
    shards = store.manifest("token_shards", second)
    tokens = [open_shard(store.dataset_dir("token_shards", second) / f.path).tokens
              for f in shards.files_with_role("shard")]
    tok = Tokenizer.load(store.dataset_dir("tokenizer"))
    texts = {r["doc_id"]: r["text"] for p in ("web", "ref") for key in (first, second)
             for r in store.read_table("raw_documents", f"{p}/{key}", columns=["doc_id", "text"]).to_pylist()}
    kept = next(d for d, m in sorted(after.items()) if trained(m, "ref"))
    assert any(_holds(t, tok.encode(texts[kept])[:12]) for t in tokens)
    assert not any(_holds(t, tok.encode(texts[d])[:12]) for d in gone for t in tokens)
    assert shards.inputs["removal_requests"] == load_requests(store)[1]

    # A checkpoint trained on these shards: its card lists the requests and what they took out; membership agrees.
    stand_in_checkpoint(store)
    assert project.materialize(["data_card"]).success
    card = json.loads((store.dataset_dir("data_card") / "data_card.json").read_text())
    assert card["shards"]["removal_requests"] == [by_source["request_id"], by_id["request_id"]]
    assert card["shards"]["removed_by_request"] == {"web": len(web_ids), "ref": 1}
    assert "Removal requests honoured by these shards" in (store.dataset_dir("data_card") / "data_card.md").read_text()
    answer = membership(store, built["config"], doc_id=ref_id)
    assert answer.verdict == "removed" and by_id["request_id"] in answer.summary, render(answer)
    assert any("re-materialize token_shards" in n for n in answer.notes)  # refresh 1's shards still hold it

    # ref's refresh-1 documents materialized again since (one row of them): the card counts ref's licences as the
    # member list recorded them, where the removed document is nothing but its id. Hand-worked from the card above,
    # which read the documents: that one document moves from CC0-1.0 to `removed by request`, with no train tokens.
    final = DOCUMENT_STAGES[-1]
    old = store.snapshot(final, f"ref/{first}")
    with store.staging(final, f"ref/{first}") as w:
        w.write("documents", pq.read_table(old.files("documents")[0]).slice(0, 1))
        w.commit(code_version="new", config={"changed": True}, inputs=old.manifest.inputs, counts={"documents": 1},
                 stats={})
    live = card["licenses"]["per_source"]["ref"]["licenses"]
    again = build_data_card(store, load_config(built["config_path"]))["licenses"]["per_source"]["ref"]["licenses"]
    assert again == {"CC0-1.0": {**live["CC0-1.0"], "documents": live["CC0-1.0"]["documents"] - 1},
                     REMOVED_BY_REQUEST: {"documents": 1, "in_train_shards": 0, "train_tokens": 0}}


def test_a_document_the_quality_filter_took_out_for_a_request_is_not_in_training(built, capsys):
    """The automation's order: the quality filter of every partition rejects the forgotten document (stage
    removal_request) before the newest shards are rebuilt, so they have no row for it at all. Refresh 1's shards,
    which a replaced checkpoint read, still hold it but are no training set: the newest refresh's holds every
    refresh. So: trained on by the checkpoint that read refresh 1's shards, left out since; then, with a checkpoint
    on the rebuilt shards, not trained on."""
    store, project, rng, vocab = built["store"], built["project"], built["rng"], built["vocab"]
    first, old_set = project.current(), store.manifest("token_shards", project.current()).data_version
    landing = built["home"] / "landing"
    write_jsonl(landing / "web" / "week2.jsonl", [{"id": f"v{i}", "text": random_text(rng, vocab)} for i in range(6)])
    write_jsonl(landing / "ref" / "b.jsonl", [{"id": f"s{i}", "text": random_text(rng, vocab)} for i in range(6)])
    second = project.refresh().key
    assert project.materialize_refresh(sources=["web", "ref"])
    ref_id = next(d for d, m in sorted(members(store).items()) if d in built["members"] and m["source"] == "ref"
                  and m["split"] == "train" and m["copies"] > 0)  # refresh 1's, trained on by the checkpoint
    (ids := built["home"] / "ids.txt").write_text(ref_id + "\n")
    _, request, _ = forget(built, capsys, "--doc-ids", str(ids))
    for refresh in (first, second):
        for source in ("web", "ref"):
            assert project.materialize(["quality_filtered_documents"], source, refresh=refresh).success
    assert project.materialize(["token_shards"], refresh=second).success
    new_set = store.manifest("token_shards", second).data_version
    assert ref_id not in members(store)  # no removed_by to go by: the quality filter had already taken it out
    by = f"removal_request:{request['request_id']}"

    answer = membership(store, built["config"], doc_id=ref_id)  # the store's checkpoint read refresh 1's shards
    assert answer.verdict == "in_training" and answer.shards[0].shard_set == old_set, render(answer)
    assert f"token_shards {new_set} has since left it out ({by})" in answer.notes[-1]
    assert not any("predate" in n for n in answer.notes)  # they were rebuilt

    stand_in_checkpoint(store)  # trained on refresh 2's shards; refresh 1's are no checkpoint's now
    answer = membership(store, built["config"], doc_id=ref_id)
    named = membership(store, built["config"], doc_id=ref_id, checkpoint="checkpoint")  # the same answer
    for asked in (answer, named):
        assert asked.verdict == "removed" and asked.summary == f"NOT TRAINED ON: left out of token_shards {new_set} " \
            f"by {by}", render(asked)
    assert any(n.startswith(f"token_shards {old_set} (no checkpoint in the store trained on it) still holds it")
               for n in answer.notes)


def test_requests_by_url_pattern_and_doc_ids_and_training_refuses_shards_written_before_them(built, capsys,
                                                                                              tmp_path):
    """Until token_shards is materialized again after a request, its shards still hold the documents it names,
    and a run started then would read them: training_run refuses those shards, naming the request, for a training
    or a validation document alike. A request that names none of their documents does not stop it."""
    from kiln.governance.forget import raw_partitions, unapplied_requests
    from kiln.governance.refresh import latest

    store, project = built["store"], built["project"]
    ids = tmp_path / "ids.txt"
    intake = {d for part in raw_partitions(store, ["web", "ref"])
              for d in store.read_table("raw_documents", part, columns=["doc_id"]).column("doc_id").to_pylist()}
    outside = sorted(intake - set(built["members"]))[:1]  # read at intake, in no shard (a filter dropped it)
    assert outside
    ids.write_text("\n".join(outside) + "\n")
    code, _, _ = forget(built, capsys, "--doc-ids", str(ids))
    assert code == 0 and unapplied_requests(store, latest(store, "token_shards")[1]) == []
    trained = sorted(d for d, m in built["members"].items() if m["split"] == "train" and m["copies"] > 0)[:2]
    ids.write_text("# ticket 7\n" + "\n".join(trained) + "\n\n")
    code, request, _ = forget(built, capsys, "--doc-ids", str(ids))
    assert code == 0 and request["value"] == trained
    r = RemovalRequest(**request)
    assert r.matches(trained[0], "any", None) and not r.matches("other", "web", None)
    by_url = RemovalRequest("x", "t", "url_pattern", r"^https://spam\.example/", "")
    assert by_url.matches("d", "web", "https://spam.example/a") and not by_url.matches("d", "web", None)

    pending = unapplied_requests(store, latest(store, "token_shards")[1])
    assert [u.request_id for u in pending] == [request["request_id"]]
    result = project.materialize(["training_run"], raise_on_error=False)
    [failure] = result.get_step_failure_events()
    assert f"removal request(s) {request['request_id']} name, recorded after they were written" in \
        failure.step_failure_data.user_failure_data.description
    assert project.materialize(["shard_exports"]).success  # shards.export is []: an export with no tokens in it
    result = project.materialize(["token_shards"])  # it leaves the documents out, and records both requests
    assert result.success and unapplied_requests(store, latest(store, "token_shards")[1]) == []
    # nothing to warn of: that export holds no tokens of the removed documents (it was warned of, falsely)
    assert "re-exports it" not in _logged(project, result)
    # a validation document too: a run reads it (validation loss, the loss probe's token ids, the evaluation)
    # An export that holds tokens, made before the request while shards.export named a format, and nothing to
    # re-export it now: the shards that apply the request warn of it, naming it.
    config = yaml.safe_load(built["config_path"].read_text())
    config["shards"]["export"] = ["megatron"]
    built["config_path"].write_text(yaml.safe_dump(config))
    assert project.materialize(["shard_exports"]).success
    [val] = sorted(d for d, m in built["members"].items() if m["split"] == "val" and m["copies"] > 0)[:1]
    ids.write_text(val + "\n")
    _, on_val, _ = forget(built, capsys, "--doc-ids", str(ids))
    assert [u.request_id for u in unapplied_requests(store, latest(store, "token_shards")[1])] == [on_val["request_id"]]
    assert not project.materialize(["shard_exports"], raise_on_error=False).success  # not exported again meanwhile
    config["shards"]["export"] = []
    built["config_path"].write_text(yaml.safe_dump(config))
    result = project.materialize(["token_shards"])
    assert result.success and f"removed since ({on_val['request_id']}), and shards.export is [], so nothing " \
        "re-exports it" in _logged(project, result)
    # An export that would follow the shards, but refresh.automation is false: nothing re-exports it either.
    config["shards"]["export"] = ["megatron"]
    config.setdefault("refresh", {})["automation"] = False
    built["config_path"].write_text(yaml.safe_dump(config))
    assert project.materialize(["shard_exports"]).success
    [train] = sorted(d for d, m in built["members"].items() if m["split"] == "train" and m["copies"] > 0)[2:3]
    ids.write_text(train + "\n")
    _, on_train, _ = forget(built, capsys, "--doc-ids", str(ids))
    result = project.materialize(["token_shards"])
    assert result.success and f"removed since ({on_train['request_id']}), and refresh.automation is false, so " \
        "nothing re-exports it" in _logged(project, result)


def _logged(project, result) -> str:
    return "\n".join(e.user_message for e in project.instance.all_logs(result.run_id))


@pytest.mark.parametrize("args, message", [
    (["--source", "nope"], "no such source"),
    (["--url-pattern", "(unclosed"], "not a valid regular expression"),
    (["--doc-ids", "/no/such/file"], "no such file"),
])
def test_bad_requests_exit_2_with_the_reason(read_only_built, capsys, args, message):
    code, _, err = forget(read_only_built, capsys, *args)
    assert code == 2 and message in err
    assert load_requests(read_only_built["store"]) == ([], None)  # nothing recorded


def test_doc_ids_that_name_no_document_are_refused_and_some_are_named_in_a_warning(read_only_built, built, capsys,
                                                                                  tmp_path):
    """A source's own ids (or e-mails) instead of Kiln's doc ids: the request could never remove anything, yet read
    as recorded and applied (exit 0). Refused when none names a document; a warning when some do not."""
    ids = tmp_path / "ids.txt"
    ids.write_text("r0\nsome.publisher@example.org\n")
    code, _, err = forget(read_only_built, capsys, "--doc-ids", str(ids))
    assert code == 2 and "none of the 2 id(s) names a document of this store" in err
    assert "kiln audit membership --text FILE" in err and "nothing recorded" in err
    assert load_requests(read_only_built["store"]) == ([], None)

    known = sorted(built["members"])[0]
    ids.write_text(f"{known}\nr0\n")
    code = main(["forget", "--doc-ids", str(ids), "--home", str(built["home"]), "--config", str(built["config_path"])])
    out = capsys.readouterr().out
    assert code == 0 and "warning: 1 of the 2 doc ids name no document of this store" in out
    [request] = load_requests(built["store"])[0]
    assert request.unknown_ids == 1 and request.value == sorted([known, "r0"])


def test_a_source_dropped_from_the_config_can_still_be_forgotten(built, capsys, tmp_path):
    """Its documents are still in the store and in the checkpoint's shards (and in what a continued run replays):
    a request by its name or by its doc ids is recorded, and flags the checkpoint."""
    config = yaml.safe_load(built["config_path"].read_text())
    config["sources"] = [s for s in config["sources"] if s["name"] != "ref"]
    config["mixture"] = {"weights": {}}
    built["config_path"].write_text(yaml.safe_dump(config))
    trained_ref = sorted(d for d, m in built["members"].items() if m["source"] == "ref" and m["split"] == "train"
                         and m["copies"] > 0)
    code, by_source, err = forget(built, capsys, "--source", "ref")
    assert code == 0, err
    [affected] = by_source["affected"]
    assert affected["sources"] == ["ref"] and affected["documents"] == len(trained_ref)
    (ids := tmp_path / "ids.txt").write_text("\n".join(trained_ref[:2]) + "\n")
    code, by_ids, err = forget(built, capsys, "--doc-ids", str(ids))
    assert code == 0 and by_ids["unknown_ids"] == 0 and by_ids["affected"][0]["documents"] == 2, err
    code, _, err = forget(built, capsys, "--source", "nope")
    assert code == 2 and "no such source; sources: web, ref" in err


def test_a_doc_ids_file_saved_with_a_byte_order_mark_names_its_first_id(tmp_path):
    """Notepad and Excel save UTF-8 with a BOM (EF BB BF) and CRLF line ends; the BOM is not part of the first id."""
    ids = tmp_path / "ids.txt"
    ids.write_bytes(b"\xef\xbb\xbfa1b2\r\nc3d4\r\n")
    assert read_doc_ids(ids) == ["a1b2", "c3d4"]


def test_a_request_needs_exactly_one_selector():
    with pytest.raises(SystemExit) as exc:
        main(["forget", "--source", "web", "--url-pattern", "x"])
    assert exc.value.code == 2


def test_a_url_pattern_reaches_documents_by_their_url_as_read_though_stored_redacted(tmp_path, monkeypatch, capsys):
    """A requester writes the pattern against the address they know; after intake the URL is stored PII-redacted
    (http://83.149.21.7/... as http://<IPV4>/...), and a document the quality filter removed for a request is gone
    from the later stages. The pattern is matched against raw_documents' URLs: the checkpoint is flagged, the
    quality filter and the next shards leave the document out, and a replay of shards written before the request
    skips every document it names (here, those of a publisher the quality filter already applied)."""
    import shutil
    import string

    import numpy as np
    import pyarrow.parquet as pq

    from assets.training import replay_removals
    from kiln.common.config import load_config
    from kiln.governance.replay import read_manifest
    from kiln.common.storage import Store
    from kiln.governance.forget import record_request
    from tests.assets.project import load_project
    from tests.conftest import SERIAL_ENGINE, web_and_ref_sources

    home = tmp_path / "kiln"
    monkeypatch.setenv("KILN_HOME", str(home))
    rng = np.random.default_rng(7)
    vocab = ["".join(rng.choice(list(string.ascii_lowercase), 6)) for _ in range(5000)]
    urls = ["http://83.149.21.7/personal-blog/p0"] + [f"https://victim.example.net/p{i}" for i in range(1, 6)] + \
        [f"https://other.example.org/p{i}" for i in range(6, 10)]
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": f"r{i}", "text": random_text(rng, vocab), "url": url}
                                               for i, url in enumerate(urls)])
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": f"w{i}", "text": random_text(rng, vocab)} for i in range(6)])
    config = {"sources": web_and_ref_sources(tmp_path), "profiles": {"none": []}, "engine": SERIAL_ENGINE,
              "tokenizer": {"vocab_size": 400}, "mixture": {"weights": {"web": 0.5, "ref": 0.5}},
              "shards": {"seq_len": 16, "val_fraction": 0.1}, "quality": {"classifier": {"enabled": False}}}
    project = load_project(config, tmp_path, home, monkeypatch, in_memory=True)
    assert project.materialize_refresh(sources=["web", "ref"])
    store, first = Store(home / "data"), project.current()
    stand_in_checkpoint(store)
    base = tmp_path / "base_shards"  # the shard set a run trained on, as a later continued run replays it
    shutil.copytree(store.dataset_dir("token_shards", first), base)
    raw = store.read_table("raw_documents", f"ref/{first}", columns=["doc_id", "meta"]).to_pylist()
    doc = {json.loads(r["meta"])["id"]: r["doc_id"] for r in raw}  # the input's ids -> Kiln's doc ids
    stored = store.values("quality_filtered_documents", f"ref/{first}", "url")
    assert stored[doc["r0"]] == "http://<IPV4>/personal-blog/p0"  # what every stage after intake holds

    config = load_config(tmp_path / "kiln.yaml")
    by_ip = record_request(store, config, "url_pattern", r"83\.149\.21\.7", "the blog's owner")
    assert [a["documents"] for a in by_ip.affected] == [1]  # the stand-in checkpoint trained on r0
    assert by_ip.matched == 1  # r0's URL, as read; stored as http://<IPV4>/..., which the pattern does not match
    assert project.materialize(["quality_filtered_documents"], partition="ref").success
    assert project.materialize(["token_shards"]).success
    rejected = {r["doc_id"]: r["reason"] for r in
                store.read_table("quality_filtered_documents", f"ref/{first}", "rejected").to_pylist()}
    assert rejected == {doc["r0"]: f"removal_request:{by_ip.request_id}"}
    assert doc["r0"] not in {d for d, m in members(store).items() if m["copies"] > 0}

    publisher = record_request(store, config, "url_pattern", r"victim\.example\.net", "takedown | ticket GOV-17")
    assert publisher.matched == 5  # r1-r5
    assert project.materialize(["quality_filtered_documents"], partition="ref").success  # gone from later stages
    base_train = {r["doc_id"] for f in read_manifest(base).files_with_role("members")
                  for r in pq.read_table(base / f.path).to_pylist() if r["split"] == "train" and r["copies"] > 0}
    named = {doc[f"r{i}"] for i in range(6)} & base_train  # r0 (the IP) and r1-r5 (the publisher), where trained
    assert len(named) >= 3
    plan, _ = replay_removals(store, {"share": 0.25, "dataset_dir": str(base)}, 0.1)  # shards.val_fraction as above
    assert {r["doc_id"] for r in plan.removed} == named and plan.unknown_urls == 0
    assert {r["removed_by"] for r in plan.removed if r["doc_id"] != doc["r0"]} == \
        {f"removal_request:{publisher.request_id}"}

    # The data card is published: a URL pattern names the requester's own address (escaped as a regex, which the PII
    # redactor does not read), so the card does not show it (the request in the store keeps it); and the '|' of a
    # reason stays in its cell (it split the row, and every later column read the next one's number).
    assert project.materialize(["data_card"]).success
    markdown = (store.dataset_dir("data_card") / "data_card.md").read_text()
    published = markdown + (store.dataset_dir("data_card") / "data_card.json").read_text()
    assert "83\\.149" not in published and "83.149" not in published and "victim" not in published
    rows = {r.request_id: next(line for line in markdown.splitlines() if line.startswith(f"| `{r.request_id}`"))
            for r in (by_ip, publisher)}
    cells = re.split(r"(?<!\\)\|", rows[publisher.request_id])[1:-1]  # the '|' not escaped
    assert len(cells) == 9 and cells[4].strip() == "takedown \\| ticket GOV-17"
    assert cells[3].strip() == "a URL pattern (kept in the store's request)"

    # A typo names no document: recorded (a pattern may be ahead of the data), with a warning.
    capsys.readouterr()
    assert main(["forget", "--url-pattern", r"victim\.exmaple\.net", "--home", str(home), "--config",
                 str(tmp_path / "kiln.yaml")]) == 0
    assert "warning: the pattern matches no document's URL as intake read it" in capsys.readouterr().out
    assert load_requests(store)[0][-1].matched == 0


def test_a_url_pattern_is_never_matched_half_blind_where_the_raw_layer_is_unreadable(tmp_path, monkeypatch):
    """The raw layer may be closed to this user: a URL pattern then fails, saying why, instead of matching only the
    redacted URLs; a request of another kind needs no URL and goes through."""
    from kiln.common.storage import Store
    from kiln.governance.forget import ForgetError, with_intake_urls

    store = Store(tmp_path / "data")

    def closed(*args, **kwargs):
        raise PermissionError(13, "Permission denied", str(tmp_path / "data" / "raw_documents"))
        yield  # a generator, as iter_batches is

    monkeypatch.setattr(Store, "iter_batches", closed)
    by_url = RemovalRequest("x", "t", "url_pattern", r"83\.149\.21\.7", "")
    by_ids = RemovalRequest("y", "t", "doc_ids", ["d1"], "")
    with pytest.raises(ForgetError, match=r"raw_documents, which this user cannot read .*raw_documents\); run this as"):
        with_intake_urls(store, [by_url, by_ids], ["web/r1"])
    assert with_intake_urls(store, [by_ids], ["web/r1"]) == [by_ids]
