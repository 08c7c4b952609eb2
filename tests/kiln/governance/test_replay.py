"""Replay honours removal requests: a continued run that replays the base's token shards reads none of a document
forgotten since, records what it replayed and left out, and the audits (membership, affected checkpoints, lineage,
the data card) answer from that."""

import json
import shutil

import pyarrow.parquet as pq
import pytest
import torch
import yaml

from assets.training import replay_removals
from kiln.governance.audit import lineage
from kiln.governance.forget import RemovalRequest, affected_checkpoints, load_requests, record_request
from kiln.governance.membership import membership
from kiln.governance.refresh import trained_refresh
from kiln.governance.render import render
from kiln.governance.replay import ReplayError, plan_replay, removed_from_replay, write_removed
from kiln.tokens.tokenizer import Tokenizer
from tests.audit_store import build_audit_store, members, random_text
from tests.conftest import write_jsonl
from tests.kiln.governance.test_replay_validation import unit
from tests.token_corpus import read_sequences, token_grams
from training_jobs.settings import TrainingSettings
from training_jobs.setup import Dist, open_training


@pytest.fixture(scope="module")
def replayed(tmp_path_factory):
    """The audit store's base (a stand-in checkpoint over refresh 1's shards A); refresh 2 lands and its shards
    are built; a refresh-1 document d trained on in A is forgotten and refresh 2's shards rebuilt (B, without d);
    then a stand-in continued run over B that replays A, recorded as the training_run asset records it."""
    with pytest.MonkeyPatch.context() as monkeypatch:
        built = build_audit_store(tmp_path_factory.mktemp("replay"), monkeypatch)
        store, project, rng, vocab = built["store"], built["project"], built["rng"], built["vocab"]
        first = project.current()
        a_members = built["members"]
        write_jsonl(built["home"] / "landing" / "ref" / "b.jsonl",
                    [{"id": f"s{i}", "text": random_text(rng, vocab)} for i in range(6)])
        second = project.refresh().key
        assert project.materialize_refresh(sources=["web", "ref"])
        d = next(doc for doc, m in sorted(a_members.items()) if m["source"] == "ref" and m["split"] == "train"
                 and m["copies"] > 0)
        request = record_request(store, built["config"], "doc_ids", [d], "owner asked")
        assert project.materialize(["token_shards"]).success  # refresh 2's shards again: d left out
        continued = continued_run(store, first, second)
        yield {**built, **continued, "first": first, "second": second, "d": d, "request": request,
               "a_members": a_members}


def continued_run(store, first: str, second: str) -> dict:
    """A stand-in continued run over refresh 2's shards (B) that replays refresh 1's (A) and its checkpoint,
    recorded as the training_run asset records them."""
    a_dir, b = store.dataset_dir("token_shards", first), store.manifest("token_shards", second)
    replay = {"share": 0.25, "dataset_dir": str(a_dir)}
    # what the asset computes before launch, at the run's own shards' val_fraction
    plan, requests_version = replay_removals(store, replay, b.config["shards"]["val_fraction"])
    with store.staging("training_run") as writer:
        write_removed(writer.dir, plan)
        inputs = {f"token_shards/{second}": b.data_version, "tokenizer": store.manifest("tokenizer").data_version}
        run = writer.commit(code_version="test", config={"replay": replay},
                            inputs=inputs | plan.inputs(requests_version), counts={"steps": 3},
                            stats={"replay": plan.describe(), "mlflow": {"experiment_id": "1", "run_id": "r2"}})
    with store.staging("checkpoint") as writer:
        (writer.dir / "safetensors").mkdir()
        (writer.dir / "safetensors" / "model.safetensors").write_bytes(b"stand-in weights")
        ckpt = writer.commit(code_version="test", config={}, inputs={"training_run": run.data_version},
                             counts={"parameters": 1, "steps": 3}, stats={"mlflow": run.stats["mlflow"]})
    return {"plan": plan, "run": run, "ckpt": ckpt, "a_dir": a_dir, "b": b, "replay": replay}


def _read_replay(built, exclude: bool) -> set[tuple[int, ...]]:
    """The 12-grams of what the continued run's replay loader (as the training process opens it) reads in one
    epoch: within each sequence (inputs and targets), and across the inputs of consecutive sequences read."""
    settings = TrainingSettings(seq_len=16, micro_batch_size=1)
    replay = {**built["replay"], **({"exclude": built["plan"].exclude} if exclude else {})}
    run = settings.to_run_config(dataset_dir=built["store"].dataset_dir("token_shards", built["second"]),
                                 tokenizer_sha256=built["b"].stats["tokenizer_sha256"], output_dir=built["home"] / "o",
                                 replay=replay)
    loader = open_training(run, Dist(0, 1, torch.device("cpu"))).replay
    rows = read_sequences(loader, loader.sequences_per_epoch)
    return set().union(*map(token_grams, rows)) | token_grams([t for r in rows for t in r[:-1]])


def test_the_continued_run_reads_none_of_the_forgotten_documents_tokens(replayed):
    store, d, plan = replayed["store"], replayed["d"], replayed["plan"]
    copies = replayed["a_members"][d]["copies"]
    assert [(r["doc_id"], r["copies"], r["removed_by"]) for r in plan.removed] == \
        [(d, copies, replayed["request"].reject_reason)]
    assert sum(len(ix) for ix in plan.exclude.values()) == copies
    # The forgotten document's content, from its text (not from the shards): every 12-gram of its tokens
    # (shorter ones recur by chance in a 400-token vocabulary).
    tok = Tokenizer.load(store.dataset_dir("tokenizer"))
    text = next(r["text"] for p in store.files("quality_filtered_documents", f"ref/{replayed['first']}", "documents")
                for r in pq.read_table(p, columns=["doc_id", "text"]).to_pylist() if r["doc_id"] == d)
    forgotten = token_grams(tok.encode(text) + [tok.eos_id])
    assert len(forgotten) > 20 and not forgotten & _read_replay(replayed, exclude=True)
    # As replayed before this change: all of it, but for a tail shorter than a sequence that no run reads.
    assert len(forgotten - _read_replay(replayed, exclude=False)) < 16
    # The run records what it replayed and what it left out.
    run = replayed["run"]
    a = store.manifest("token_shards", replayed["first"]).data_version
    assert run.inputs[f"token_shards/{replayed['first']}"] == a
    assert run.inputs["removal_requests"] == load_requests(store)[1]
    assert run.stats["replay"]["removed_documents"] == 1 and removed_from_replay(store, run) == \
        {d: replayed["request"].reject_reason}
    assert trained_refresh(run) == replayed["second"]  # its own shards, not the replayed ones


def test_membership_says_removed_from_replay_and_in_training_via_replay(replayed):
    store, config, ckpt = replayed["store"], replayed["config"], replayed["ckpt"].data_version
    a = store.manifest("token_shards", replayed["first"]).data_version
    answer = membership(store, config, doc_id=replayed["d"])
    assert answer.verdict == "removed" and not answer.reached_training, render(answer)
    assert f"when checkpoint {ckpt} replayed token_shards {a}" in answer.summary
    [record] = [s for s in answer.shards if s.shard_set == a]
    assert record.removed_from_replay == [ckpt] and record.checkpoints == []
    assert "skipped in the replay of checkpoint" in render(answer)
    # A document of the replayed set nobody asked to forget: in the run's own shards and in its replay.
    kept = next(doc for doc, m in sorted(replayed["a_members"].items()) if m["split"] == "train" and m["copies"] > 0
                and doc != replayed["d"] and members(store)[doc]["copies"] > 0)
    answer = membership(store, config, doc_id=kept)
    assert answer.verdict == "in_training", render(answer)
    assert answer.summary.endswith(f"; also replayed by checkpoint {ckpt} from token_shards {a}")
    [record] = [s for s in answer.shards if s.shard_set == a]
    assert record.replayed_by == record.checkpoints == [ckpt] and not record.removed_from_replay
    assert f"checkpoints: {ckpt} (replay)" in render(answer)
    assert membership(store, config, doc_id=kept, checkpoint=ckpt).verdict == "in_training"


def test_a_new_request_flags_the_checkpoint_for_its_replayed_documents(replayed):
    store, d = replayed["store"], replayed["d"]
    b_members = members(store)
    other = next(doc for doc, m in sorted(replayed["a_members"].items()) if m["split"] == "train"
                 and m["copies"] > 0 and doc != d)
    # Checked without recording it (recording would change the shared store): the same call `kiln forget` makes.
    [affected] = affected_checkpoints(store, RemovalRequest("x", "t", "doc_ids", [other], ""))
    assert affected["checkpoint"] == replayed["ckpt"].data_version and affected["documents"] == 1
    assert affected["tokens"] == b_members[other]["tokens"] * b_members[other]["copies"]  # the run's own shards
    assert affected["replay"]["documents"] == 1 and affected["replay"]["tokens"] == \
        replayed["a_members"][other]["tokens"] * replayed["a_members"][other]["copies"]  # and its replay
    # d again: left out of the run's shards and skipped in its replay, so nothing of it reached the checkpoint.
    assert affected_checkpoints(store, RemovalRequest("y", "t", "doc_ids", [d], "")) == []


def test_lineage_and_the_data_card_cover_the_replayed_shards(replayed):
    store, project = replayed["store"], replayed["project"]
    a = store.manifest("token_shards", replayed["first"]).data_version
    chain = lineage(store, "checkpoint")
    node = chain.node(f"token_shards/{replayed['first']}")
    assert node is not None and node.data_version == a and chain.node("removal_requests") is not None
    assert any(n.key == f"raw_documents/ref/{replayed['first']}" for n in chain.nodes)
    assert project.materialize(["data_card"]).success
    card = json.loads((store.dataset_dir("data_card") / "data_card.json").read_text())
    replay = card["training"]["replayed_shards"]
    assert replay["data_version"] == a and replay["removed_documents"] == 1
    assert replay["removal_requests"] == [replayed["request"].request_id]


def test_replay_sets_that_cannot_honour_a_request_are_refused(replayed, tmp_path):
    """A set written before position lists existed cannot say where a forgotten document sits: refused, naming
    the fix; with no request naming any of its documents it replays as before."""
    store = replayed["store"]
    old = tmp_path / "old_shards"
    shutil.copytree(replayed["a_dir"], old)
    manifest = json.loads((old / "_manifest.json").read_text())
    manifest["files"] = [f for f in manifest["files"] if f["role"] != "positions"]
    (old / "_manifest.json").write_text(json.dumps(manifest))
    requests, _ = load_requests(store)
    with pytest.raises(ReplayError, match="no position list .* re-materialize that token_shards partition"):
        plan_replay(store, old, requests)
    plan = plan_replay(store, old, [])
    assert plan.removed == [] and plan.exclude == {} and plan.input_key is None  # not this store's dataset


def test_a_document_the_replay_held_out_as_the_runs_validation_is_said_so(tmp_path, monkeypatch):
    """The continued run's shards (B, refresh 2) are written at a higher val_fraction (0.6) than the replayed set
    (A, refresh 1, 0.2): A's train documents in B's validation split are left out of the replay. They still count
    as replayed (the run continues from the base checkpoint, which trained on them: the verdict stays on the safe
    side, and `kiln forget` still flags the checkpoint), but membership no longer says so without a word: a note
    and the shard line say the replay left them out as the run's validation documents."""
    built = build_audit_store(tmp_path, monkeypatch)
    store, project = built["store"], built["project"]
    first = project.current()
    write_jsonl(built["home"] / "landing" / "ref" / "b.jsonl",
                [{"id": f"s{i}", "text": random_text(built["rng"], built["vocab"])} for i in range(6)])
    config = yaml.safe_load(built["config_path"].read_text())
    config["shards"]["val_fraction"] = 0.6
    built["config_path"].write_text(yaml.safe_dump(config))
    second = project.refresh().key
    assert project.materialize_refresh(sources=["web", "ref"])
    run = continued_run(store, first, second)
    ckpt, a = run["ckpt"].data_version, store.manifest("token_shards", first).data_version
    # Worked from the split's hash written out in the test (unit): A's train documents, by B's split.
    a_train = sorted(doc for doc, m in built["members"].items() if m["split"] == "train" and m["copies"] > 0)
    held, kept = [d for d in a_train if unit(d) < 0.6], [d for d in a_train if unit(d) >= 0.6]
    assert held and kept
    assert sorted(r["doc_id"] for r in run["plan"].held_out) == held
    b_members = members(store)
    note = (f"checkpoint {ckpt} left it out of its replay of token_shards {a}, as one of its run's own validation "
            f"documents; counted as replayed all the same, since that checkpoint continues from the base checkpoint, "
            f"which trained on it")
    for doc in held:
        assert b_members[doc]["split"] == "val"
        answer = membership(store, built["config"], doc_id=doc)
        assert answer.verdict == "in_training", render(answer)
        assert f"replayed by checkpoint {ckpt}" in answer.summary and note in answer.notes
        [record] = [s for s in answer.shards if s.shard_set == a]
        assert (record.checkpoints, record.replayed_by, record.held_out_of_replay) == ([ckpt], [ckpt], [ckpt])
        assert f"left out of the replay of checkpoint {ckpt} as its validation (its base trained on it)" in \
            render(answer)
        [affected] = affected_checkpoints(store, RemovalRequest("x", "t", "doc_ids", [doc], ""))
        assert affected["checkpoint"] == ckpt and affected["replay"]["documents"] == 1
    trained = next(d for d in kept if b_members[d]["copies"] > 0)
    answer = membership(store, built["config"], doc_id=trained)
    assert answer.verdict == "in_training" and not any("validation documents" in n for n in answer.notes)
    assert answer.summary.endswith(f"; also replayed by checkpoint {ckpt} from token_shards {a}")
    [record] = [s for s in answer.shards if s.shard_set == a]
    assert record.held_out_of_replay == []
