"""`kiln forget`: a removal request drops documents from the next shards and flags the checkpoint trained on them."""

import json

import pytest
import yaml

from kiln.audit import membership
from kiln.cli import main
from kiln.forget import RemovalRequest, load_requests
from tests.audit_store import build_audit_store, members


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


def test_forget_a_source_removes_it_from_the_next_shards_and_flags_the_checkpoint(built, capsys, tmp_path):
    store, project = built["store"], built["project"]
    trained_web = [m for m in built["members"].values() if m["source"] == "web" and m["split"] == "train"
                   and m["copies"] > 0]
    assert trained_web
    code, request, _ = forget(built, capsys, "--source", "web", "--reason", "publisher request #12")
    assert code == 0
    [affected] = request["affected"]
    assert affected["checkpoint"] == built["checkpoint"].data_version and affected["documents"] == len(trained_web)
    assert affected["sources"] == ["web"]
    requests, version = load_requests(store)
    assert [r.request_id for r in requests] == [request["request_id"]] and version

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
    # membership says where and why,
    answer = membership(store, built["config"], doc_id=trained_web[0]["doc_id"])
    assert "removal_request" in answer.render()
    # and the data card of the checkpoint trained on them says so.
    assert project.materialize(["data_card"]).success
    card = json.loads((store.dataset_dir("data_card") / "data_card.json").read_text())
    [flag] = card["removal_requests"]
    assert flag["request_id"] == request["request_id"] and flag["affected"]["documents"] == len(trained_web)
    assert "Removal requests affecting this checkpoint" in (store.dataset_dir("data_card") / "data_card.md").read_text()


def test_requests_by_url_pattern_and_doc_ids(built, capsys, tmp_path):
    ids = tmp_path / "ids.txt"
    some = sorted(built["members"])[:2]
    ids.write_text("# ticket 7\n" + "\n".join(some) + "\n\n")
    code, request, _ = forget(built, capsys, "--doc-ids", str(ids))
    assert code == 0 and request["value"] == sorted(some)
    r = RemovalRequest(**request)
    assert r.matches(some[0], "any", None) and not r.matches("other", "web", None)
    by_url = RemovalRequest("x", "t", "url_pattern", r"^https://spam\.example/", "")
    assert by_url.matches("d", "web", "https://spam.example/a") and not by_url.matches("d", "web", None)


@pytest.mark.parametrize("args, message", [
    (["--source", "nope"], "no such source"),
    (["--url-pattern", "(unclosed"], "not a valid regular expression"),
    (["--doc-ids", "/no/such/file"], "no such file"),
])
def test_bad_requests_exit_2_with_the_reason(read_only_built, capsys, args, message):
    code, _, err = forget(read_only_built, capsys, *args)
    assert code == 2 and message in err
    assert load_requests(read_only_built["store"]) == ([], None)  # nothing recorded


def test_a_request_needs_exactly_one_selector():
    with pytest.raises(SystemExit) as exc:
        main(["forget", "--source", "web", "--url-pattern", "x"])
    assert exc.value.code == 2
