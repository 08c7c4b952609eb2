"""Membership and the data card answer from what the run read: a stand-in run over the audit store's real token
shards, two ranks stopped partway through the first epoch, records its exposure as the training_run asset does
(from the loader's final cursor); the expected figures are worked from the shards' offsets and the loader's
documented file order (epoch 0: sequence j·world_size + r is rank r's j-th; sequence g reads tokens 16g..16g+16)."""

import json

import numpy as np
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest
import torch

from kiln.governance.data_card import build_data_card
from kiln.governance.data_card_markdown import data_card_markdown
from kiln.governance.membership import membership
from kiln.governance.refresh import latest
from kiln.governance.render import render
from kiln.tokens.shard_format import open_shard
from tests.audit_store import build_audit_store, later_training_on_other_data, stand_in_checkpoint
from training_jobs.settings import RunConfig, TrainingSettings
from training_jobs.setup import Dist, open_training

SEQ, WORLD, BATCH = 16, 2, 2


@pytest.fixture(scope="module")
def partway(tmp_path_factory):
    with pytest.MonkeyPatch.context() as monkeypatch:
        built = build_audit_store(tmp_path_factory.mktemp("exposure"), monkeypatch)
        store = built["store"]
        refresh, shards = latest(store, "token_shards")
        folder = store.dataset_dir("token_shards", refresh)
        run_config = TrainingSettings(seq_len=SEQ, micro_batch_size=BATCH).to_run_config(
            dataset_dir=folder, tokenizer_sha256=shards.stats["tokenizer_sha256"],
            output_dir=built["home"] / "run").write(built["home"] / "run" / "run_config.json")
        # Both ranks as the training process opens them, each stopped at the same cursor (2/5 of an epoch).
        loaders = [open_training(RunConfig.read(run_config), Dist(r, WORLD, torch.device("cpu"))) for r in range(WORLD)]
        steps = 2 * loaders[0].batches_per_epoch // 5
        for loader in loaders:
            for _ in range(steps):
                loader.next_batch()
        ckpt = stand_in_checkpoint(store, run_config, loaders[0].state_dict())
        yield {**built, "ckpt": ckpt.data_version, "expected": expected_reads(folder, steps * BATCH * WORLD * SEQ),
               "shards": shards}


def expected_reads(folder, end: int) -> dict[str, list[tuple[int, int]]]:
    """doc_id -> (reads, input tokens read) per train copy, for a run whose ranks together read stream tokens
    [0, end) as inputs and token `end` as the last target: a copy at [a, b) is read when a <= end."""
    positions = {(r["shard"], r["index"]): r["doc_id"] for p in folder.glob("positions-*.parquet")
                 for r in pq.read_table(p).to_pylist()}
    shards = [s for s in json.loads((folder / "_manifest.json").read_text())["stats"]["shards"] if s["split"] == "train"]
    out: dict[str, list[tuple[int, int]]] = {}
    start = 0
    for s in sorted(shards, key=lambda s: s["phase_index"]):
        offsets = open_shard(folder / s["path"]).offsets.astype(np.int64) + start
        for i, (a, b) in enumerate(zip(offsets[:-1].tolist(), offsets[1:].tolist())):
            out.setdefault(positions[s["path"], i], []).append((int(a <= end), max(0, min(b, end) - a)))
        start += s["tokens"]
    return out


def test_the_run_records_what_it_read(partway):
    store, expected = partway["store"], partway["expected"]
    run = store.manifest("training_run")
    rows = pq.read_table(store.dataset_dir("training_run") / run.stats["exposure"]["file"]).to_pylist()
    got: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        assert r["role"] == "train" and r["shard_set"] == partway["shards"].data_version
        got.setdefault(r["doc_id"], []).append((r["reads"], r["tokens_read"]))
    assert {d: sorted(c) for d, c in got.items()} == \
        {d: sorted(c for c in copies if c[0]) for d, copies in expected.items() if any(r for r, _ in copies)}
    train = run.stats["exposure"]["roles"]["train"]
    total = sum(t for copies in expected.values() for _, t in copies)
    assert train["tokens_read"] == total == train["cursor"]["position"] * WORLD * SEQ  # position: sequences a rank read
    # Per source: what its documents' copies read, against its tokens in the set and its natural tokens.
    members = {m["doc_id"]: m for p in store.dataset_dir("token_shards", latest(store, "token_shards")[0])
               .glob("members-*.parquet") for m in pq.read_table(p).to_pylist()}
    sources = partway["shards"].stats["sources"]
    for name, v in train["per_source"].items():
        read = sum(t for d, copies in expected.items() if members[d]["source"] == name for _, t in copies)
        assert v["tokens_read"] == read and v["tokens"] == sources[name]["train_tokens"]
        # unrounded: a source read a little of (400k tokens of 10B) is not a share of 0 (the card shows "<0.0001")
        assert v["passes"] == read / sources[name]["natural_train_tokens"]
        assert v["share"] == read / sources[name]["train_tokens"]
        assert v["documents_read"] == sum(1 for d, c in expected.items() if members[d]["source"] == name
                                          and any(r for r, _ in c))
    assert 0 < total < sum(s["train_tokens"] for s in sources.values()) / 2  # partway: most was not read


def test_membership_says_trained_not_reached_or_not_in_the_shards(partway):
    store, config, ckpt, expected = partway["store"], partway["config"], partway["ckpt"], partway["expected"]
    unread = next(d for d, copies in sorted(expected.items()) if not any(r for r, _ in copies))
    answer = membership(store, config, doc_id=unread)
    assert answer.verdict == "in_shards_not_reached" and not answer.reached_training, render(answer)
    assert answer.summary.startswith("NOT TRAINED ON: in the shards but not reached")
    assert f"checkpoint {ckpt} did not reach it" in answer.summary
    [record] = [s for s in answer.shards if s.split == "train"]
    assert record.not_reached_by == [ckpt] and record.reached_by == [] and record.reads == {
        ckpt: [0] * len(expected[unread])}
    assert "not reached: its run read" in render(answer)
    assert membership(store, config, doc_id=unread, checkpoint=ckpt).verdict == "in_shards_not_reached"

    read = next(d for d, copies in sorted(expected.items()) if all(r for r, _ in copies))
    answer = membership(store, config, doc_id=read)
    assert answer.verdict == "in_training", render(answer)
    times = len(expected[read])
    assert f"used by checkpoint {ckpt} (read {times} time" in answer.summary
    [record] = [s for s in answer.shards if s.split == "train"]
    assert record.reads == {ckpt: [1] * times} and record.reached_by == [ckpt]

    # A document of several copies, some read, some not: read once by copy, and the rest 0.
    mixed = [d for d, copies in sorted(expected.items()) if len({r for r, _ in copies}) == 2]
    for d in mixed[:1]:
        answer = membership(store, config, doc_id=d)
        n = sum(r for r, _ in expected[d])
        assert answer.verdict == "in_training"
        assert answer.shards[0].reads[ckpt] == sorted((r for r, _ in expected[d]), reverse=True)
        assert f"(read {n} time{'' if n == 1 else 's'}: " in answer.summary

    # Not in the shards at all: the mixture left it out (0 copies), as before.
    left_out = next(d for d, m in sorted(partway["members"].items()) if m["split"] == "train" and m["copies"] == 0)
    assert membership(store, config, doc_id=left_out).verdict == "left_out_by_mixture"


def test_the_data_card_reports_what_the_run_read_beside_the_plan(partway):
    store, config = partway["store"], partway["config"]
    card = build_data_card(store, config)
    roles = store.manifest("training_run").stats["exposure"]["roles"]
    for s in card["sources"]:
        assert s["exposure"] == roles["train"]["per_source"][s["name"]]
        assert s["exposure"]["planned_epochs"] == s["tokens"]["effective_epochs"]
    exposure = card["training"]["exposure"]
    assert exposure["file"] == "exposure.parquet" and len(exposure["sha256"]) == 64
    markdown = data_card_markdown(card)
    assert "| planned epochs | tokens read | epochs read |" in markdown
    assert "What the run read" in markdown
    web = roles["train"]["per_source"]["web"]
    assert f"| train | web | {web['tokens_read']:,} | {web['tokens']:,} |" in markdown


def test_a_run_config_that_left_the_micro_batch_to_the_layout_gives_the_same_exposure(partway, tmp_path):
    """The default config says micro_batch_size: auto (the trainer's layout resolves it, summary.json's `layout` says
    to what): the exposure is read from the cursor, which counts sequences, so any micro-batch gives the same rows."""
    from kiln.governance.exposure import measure_exposure

    given = partway["home"] / "run" / "run_config.json"
    state = json.loads((partway["store"].dataset_dir("training_run") / "summary.json").read_text())["loader"]
    run = RunConfig.read(given)
    expected = measure_exposure(given, state, tmp_path / "given.parquet")
    for micro_batch in ("auto", 16):  # left to the layout, or another micro-batch than the run's
        changed = run.model_copy(update={"training": run.training.model_copy(update={"micro_batch_size": micro_batch})})
        changed_config = changed.write(tmp_path / f"{micro_batch}.json")
        stats = measure_exposure(changed_config, state, tmp_path / "changed.parquet")
        assert stats == expected | {"file": "changed.parquet"}
        assert pq.read_table(tmp_path / "changed.parquet").equals(pq.read_table(tmp_path / "given.parquet"))


def test_the_join_a_bucket_at_a_time_gives_the_copies_read_whatever_the_bucket_size(partway, tmp_path, monkeypatch):
    """Buckets of 3 rows (the audit store's ~100 copies read in dozens of buckets, each joined alone), spilled to
    files of at most 4 buckets (so bucket files are scattered again, as past 256 x 2^20 rows), give the rows the
    shards' offsets and the loader's order give (`expected_reads`), and the stats of one bucket."""
    from kiln.common import spill
    from kiln.governance.exposure import measure_exposure

    given = partway["home"] / "run" / "run_config.json"
    state = json.loads((partway["store"].dataset_dir("training_run") / "summary.json").read_text())["loader"]
    whole = measure_exposure(given, state, tmp_path / "whole.parquet")
    monkeypatch.setattr(spill, "MAX_BUCKETS", 4)
    small = measure_exposure(given, state, tmp_path / "small.parquet", bucket_rows=3)
    assert small == whole | {"file": "small.parquet"}
    rows = pq.read_table(tmp_path / "small.parquet").to_pylist()
    got: dict[str, list[tuple[int, int]]] = {}
    for r in rows:
        got.setdefault(r["doc_id"], []).append((r["reads"], r["tokens_read"]))
    expected = partway["expected"]
    assert {d: sorted(c) for d, c in got.items()} == \
        {d: sorted(c for c in copies if c[0]) for d, copies in expected.items() if any(r for r, _ in copies)}
    assert sorted(rows, key=lambda r: (r["shard"], r["index"])) == \
        sorted(pq.read_table(tmp_path / "whole.parquet").to_pylist(), key=lambda r: (r["shard"], r["index"]))
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # no bucket file or half file left


def test_a_set_without_a_position_list_is_counted_by_phase_and_named_unavailable(partway, tmp_path, monkeypatch):
    """A set written before position lists existed: which documents were read cannot be told, so no row is written
    and nothing is spilled for a join (the spill is made to fail), while the tokens read per phase are the same as
    the full measurement's."""
    import shutil

    from kiln.governance import exposure

    given = RunConfig.read(partway["home"] / "run" / "run_config.json")
    state = json.loads((partway["store"].dataset_dir("training_run") / "summary.json").read_text())["loader"]
    full = exposure.measure_exposure(given.write(tmp_path / "given.json"), state, tmp_path / "full.parquet")
    old = tmp_path / "old_shards"
    shutil.copytree(given.dataset_dir, old)
    manifest = json.loads((old / "_manifest.json").read_text())
    manifest["files"] = [f for f in manifest["files"] if f["role"] != "positions"]
    (old / "_manifest.json").write_text(json.dumps(manifest))
    run_config = given.model_copy(update={"dataset_dir": str(old)}).write(tmp_path / "run_config.json")

    def no_spill(*args, **kwargs):
        raise AssertionError("a set without a position list spilled its counts")

    monkeypatch.setattr(exposure, "Spill", no_spill)
    stats = exposure.measure_exposure(run_config, state, tmp_path / "old.parquet")["roles"]["train"]
    assert "no position list" in stats["unavailable"] and "per_source" not in stats
    assert stats["per_phase"] == full["roles"]["train"]["per_phase"] and stats["tokens_read"] > 0
    assert pq.read_table(tmp_path / "old.parquet").num_rows == 0


@pytest.mark.parametrize("alteration", ["a copy left out of the position list", "a read document left out of the "
                                        "member list"])
def test_a_shard_set_altered_after_it_was_written_is_refused_and_nothing_is_written(partway, tmp_path, alteration):
    import shutil

    from kiln.governance.exposure import measure_exposure

    given = RunConfig.read(partway["home"] / "run" / "run_config.json")
    state = json.loads((partway["store"].dataset_dir("training_run") / "summary.json").read_text())["loader"]
    copy = tmp_path / "shards"
    shutil.copytree(given.dataset_dir, copy)
    read = next(d for d, copies in sorted(partway["expected"].items()) if all(r for r, _ in copies))
    role = "positions" if alteration.startswith("a copy") else "members"
    [path] = copy.glob(f"{role}-*.parquet")
    table = pq.read_table(path)
    pq.write_table(table.filter(pc.not_equal(table["doc_id"], read)), path)
    run_config = given.model_copy(update={"dataset_dir": str(copy)}).write(tmp_path / "run_config.json")
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match="altered after it was written.*re-materialize"):
        measure_exposure(run_config, state, tmp_path / "out" / "exposure.parquet")
    assert not list((tmp_path / "out").iterdir())


def test_a_checkpoint_is_answered_for_after_its_shards_and_its_run_are_replaced(partway, tmp_path, capsys):
    """The shard set is materialized again and a later run (on other data) replaces the run and the checkpoint, and
    the old versions' files are removed: membership and removal requests still answer for the checkpoint, from the
    member list and the exposure the store's history kept."""
    import shutil

    import pyarrow as pa

    from kiln.cli import main
    from kiln.common.storage import Store
    from kiln.governance.forget import RemovalRequest, affected_checkpoints
    from kiln.tokens.shard_writer import MEMBERS_SCHEMA

    shutil.copytree(partway["store"].root, tmp_path / "data", symlinks=True)
    store = Store(tmp_path / "data", keep_replaced_s=0)  # a replaced version's files go at the next commit
    config, ckpt, expected, old = partway["config"], partway["ckpt"], partway["expected"], partway["shards"]
    read = next(d for d, copies in sorted(expected.items()) if all(r for r, _ in copies))
    unread = next(d for d, copies in sorted(expected.items()) if not any(r for r, _ in copies))
    with store.staging("token_shards", old.partition) as w:
        w.write("members", pa.Table.from_pylist([{"doc_id": "another", "source": "web", "split": "train",
                                                  "copies": 1, "tokens": 5, "removed_by": None}],
                                                schema=MEMBERS_SCHEMA))
        w.commit(code_version="test", config={}, inputs={}, counts={})
    later_training_on_other_data(store)
    for asset in ("token_shards", "training_run", "checkpoint"):  # only the new versions' folders are left
        versions = [p for p in (tmp_path / "data" / asset).glob(".*.v-*") if p.is_dir()]
        assert len(versions) == 1 and ckpt not in str(versions[0]) and old.data_version not in str(versions[0])

    times = len(expected[read])  # every copy read once: partway through the first epoch
    named = membership(store, config, doc_id=read, checkpoint=ckpt)
    assert named.verdict == "in_training", render(named)
    assert named.shards[0].shard_set == old.data_version and named.shards[0].reads == {ckpt: [1] * times}
    assert f"used by checkpoint {ckpt} (read {times} time" in named.summary
    assert membership(store, config, doc_id=unread, checkpoint=ckpt).verdict == "in_shards_not_reached"

    # Without naming it, the verdict is about the store's checkpoint (trained on other data); the earlier one is noted.
    copies = f"{times} cop{'y' if times == 1 else 'ies'}"
    note = (f"checkpoint {ckpt}, replaced in the store since, was trained on token_shards {old.data_version}, which "
            f"holds {copies} of it in its train split")
    answer = membership(store, config, doc_id=read)
    assert answer.verdict == "not_in_token_shards" and not answer.shards, render(answer)
    assert f"{note}, and read it (read {times} time" in " ".join(answer.notes), answer.notes
    unread_copies = len(expected[unread])
    assert (f"{note.replace(copies, f'''{unread_copies} cop{'y' if unread_copies == 1 else 'ies'}''')}, but did not "
            f"reach it (its run stopped after reading") in " ".join(membership(store, config, doc_id=unread).notes)

    # A removal request of the document names the checkpoint, replaced, with the copies and tokens it held.
    member = partway["members"][read]
    [affected] = affected_checkpoints(store, RemovalRequest("x", "t", "doc_ids", [read], ""))
    assert (affected["checkpoint"], affected["current"], affected["token_shards"], affected["documents"],
            affected["tokens"]) == (ckpt, False, old.data_version, 1, member["copies"] * member["tokens"])
    # ... and what its run read of it: every copy, the input tokens the offsets walk gives
    assert affected["read"] == {"documents": 1, "tokens": sum(t for _, t in expected[read])}
    [unreached] = affected_checkpoints(store, RemovalRequest("y", "t", "doc_ids", [unread], ""))
    assert unreached["documents"] == 1 and unreached["read"] == {"documents": 0, "tokens": 0}
    (tmp_path / "ids.txt").write_text(f"{read}\n")
    assert main(["forget", "--doc-ids", str(tmp_path / "ids.txt"), "--home", str(tmp_path), "--config",
                 str(partway["config_path"])]) == 0
    assert (f"affected checkpoint {ckpt}: its training set held 1 matching document "
            f"({member['copies'] * member['tokens']:,} tokens) from {member['source']}, its run read 1 of them "
            f"({sum(t for _, t in expected[read]):,} tokens read); replaced in the store since (a model that may "
            f"still be in use)") in capsys.readouterr().out

    # Which models used the source: the checkpoint, from the replaced set it was trained on.
    from kiln.governance import audit

    usage = audit.source_usage(store, config, "web")
    [used] = [u for u in usage.shard_sets if u.data_version == old.data_version]
    assert used.replaced and [c["data_version"] for c in used.checkpoints] == [ckpt] and ckpt in usage.checkpoints
    assert used.train_tokens == old.stats["sources"]["web"]["train_tokens"] > 0
    assert f"token_shards {old.data_version} ({old.created_at[:19]}+00:00, replaced in the store since)" in render(usage)


def test_what_a_run_read_is_measured_on_its_version_after_a_request_made_the_shards_again(tmp_path, monkeypatch):
    """A removal request during a run: the quality filter and token shards apply it (under automation within a
    minute) and the dataset link names the new version, while the run's loader holds the one it reads. When the run
    ends, training_run measures what it read: from that version (held from launch, so the first commit after the
    ranks let go does not remove it), not the link's, whose loader refuses another version (the run would fail after
    training). The figures are worked from the version's offsets as for `partway`; once measured, it goes."""
    import contextlib
    import gc
    import os
    from pathlib import Path

    from kiln.governance.exposure import held_versions, measure_exposure
    from kiln.governance.forget import record_request

    built = build_audit_store(tmp_path, monkeypatch)
    store, project = built["store"], built["project"]
    refresh, shards = latest(store, "token_shards")
    link = store.dataset_dir("token_shards", refresh)
    run_config = TrainingSettings(seq_len=SEQ, micro_batch_size=BATCH).to_run_config(
        dataset_dir=link, tokenizer_sha256=shards.stats["tokenizer_sha256"], output_dir=built["home"] / "run",
        dataset_data_version=shards.data_version).write(built["home"] / "run" / "run_config.json")
    holds = contextlib.ExitStack()
    folders = held_versions(run_config, holds)  # at launch, as training_run does
    version = Path(os.path.realpath(link))
    assert folders == {"train": str(version)}
    loader = open_training(RunConfig.read(run_config), Dist(0, 1, torch.device("cpu")))
    for _ in range(3):
        loader.next_batch()
    state, expected = loader.state_dict(), expected_reads(version, 3 * BATCH * SEQ)
    doc = next(d for d, m in sorted(built["members"].items()) if m["split"] == "train" and m["copies"] > 0)
    record_request(store, built["config"], "doc_ids", [doc], "")
    assert project.materialize(["token_shards"]).success  # the link names the version without it now
    assert latest(store, "token_shards")[1].data_version != shards.data_version
    del loader  # the run ends: its ranks let go
    gc.collect()
    later_training_on_other_data(store)  # a commit: it removes a forgotten version nobody holds
    with holds:
        stats = measure_exposure(run_config, state, tmp_path / "exposure.parquet", folders)["roles"]
    got: dict[str, list[tuple[int, int]]] = {}
    for r in pq.read_table(tmp_path / "exposure.parquet").to_pylist():
        assert r["shard_set"] == shards.data_version
        got.setdefault(r["doc_id"], []).append((r["reads"], r["tokens_read"]))
    assert {d: sorted(c) for d, c in got.items()} == \
        {d: sorted(c for c in copies if c[0]) for d, copies in expected.items() if any(r for r, _ in copies)}
    assert stats["train"]["data_version"] == shards.data_version and stats["train"]["dataset_dir"] == str(link)
    assert stats["train"]["tokens_read"] == 3 * BATCH * SEQ
    later_training_on_other_data(store)  # measured and let go: the next commit removes it
    assert not version.exists()
