"""Audits (kiln.governance.audit and `kiln audit`) on a small store built by materializing the data assets
(tests/audit_store.py: two sources, near-copies, a filtered, a decontaminated and an unreadable record, a
mixture that repeats one source and subsamples the other, and a stand-in checkpoint)."""

from __future__ import annotations

import json

import pyarrow as pa
import pytest

from kiln.cli import main
from kiln.curation.documents import make_doc_id
from kiln.dedup.minhash import jaccard, shingle_hashes
from kiln.governance import audit
from kiln.governance.catalog import AuditError, Catalog
from kiln.governance.data_card import build_data_card
from kiln.governance.data_card_markdown import data_card_markdown
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.governance.membership import IN_TRAINING, LEFT_OUT, NEVER_SEEN, QUARANTINED, REMOVED, VALIDATION, membership
from kiln.governance.render import render
from tests.audit_store import SHORT, build_audit_store, edit, later_training_on_other_data, random_text


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    mp = pytest.MonkeyPatch()
    try:
        yield build_audit_store(tmp_path_factory.mktemp("audit"), mp)
    finally:
        mp.undo()


def doc_texts(built, source: str) -> dict[str, str]:
    return {r["doc_id"]: r["text"] for r in built["store"].read_table(
        "deduplicated_documents", built["project"].partition(source), columns=["doc_id", "text"]).to_pylist()}


# ------------------------------------------------------------------------------------------ membership

def test_a_kept_document_reached_training_by_doc_id_and_by_exact_text(built):
    store, config = built["store"], built["config"]
    texts = doc_texts(built, "web")
    doc_id = next(d for d, m in built["members"].items() if m["source"] == "web" and m["copies"] > 0
                  and m["split"] == "train")
    by_id = membership(store, config, doc_id=doc_id)
    assert by_id.verdict == IN_TRAINING and by_id.reached_training and by_id.match == "doc_id"
    assert by_id.source == "web" and by_id.license == "CC-BY-4.0"
    [shard] = by_id.shards
    assert shard.copies == built["members"][doc_id]["copies"] >= 1 and shard.split == "train"
    assert shard.shard_set == store.manifest("token_shards", built["project"].current()).data_version
    assert shard.checkpoints == [built["checkpoint"].data_version]
    assert [(r.stage, r.status) for r in by_id.stages] == [(stage, "kept") for stage in DOCUMENT_STAGES]
    # The text, exactly as stored, and with case and whitespace changed (exact dedup folds both).
    for text in (texts[doc_id], "  " + texts[doc_id].upper().replace(" ", "\n ")):
        by_text = membership(store, config, text=text)
        assert by_text.match == "exact" and by_text.doc_id == doc_id and by_text.verdict == IN_TRAINING
        assert "IN TRAINING" in render(by_text)


def test_a_near_duplicate_of_a_kept_document_is_found_through_the_minhash_index(built):
    store, config = built["store"], built["config"]
    texts = doc_texts(built, "ref")
    kept = next(d for d, m in built["members"].items() if m["source"] == "ref" and m["copies"] > 0
                and m["split"] == "train")
    variant = edit(texts[kept], built["rng"], built["vocab"], k=2)
    result = membership(store, config, text=variant)
    assert result.match == "near_duplicate" and result.doc_id == kept
    near = config.dedup.near
    expected = jaccard(shingle_hashes(variant, near), shingle_hashes(texts[kept], near))
    assert result.jaccard == pytest.approx(expected, abs=1e-6) and near.threshold <= result.jaccard < 1
    assert result.verdict == IN_TRAINING and f"near-duplicate of {kept}: exact Jaccard" in render(result)


def test_a_filtered_document_says_where_and_why_it_was_removed(built):
    store, config = built["store"], built["config"]
    by_text = membership(store, config, text=SHORT)  # only the raw documents hold this text
    by_id = membership(store, config, doc_id=make_doc_id("web", "id:short"))
    for result in (by_text, by_id):
        assert result.verdict == REMOVED and not result.reached_training
        removed = next(r for r in result.stages if r.status == "removed")
        assert (removed.stage, removed.step, removed.reason) == ("filtered_documents", "filter",
                                                                 "gopher_quality.min_doc_words")
        assert [r.status for r in result.stages[2:]] == ["not reached"] * 3 and not result.shards
        assert "removed at filtered_documents (filter), reason gopher_quality.min_doc_words" in result.summary
    assert by_text.match == "exact" and by_text.doc_id == by_id.doc_id


def test_near_duplicate_and_benchmark_removals_name_the_kept_copy_and_the_reason(built):
    store, config = built["store"], built["config"]
    copy = membership(store, config, doc_id=make_doc_id("web", "id:w0"))  # an edited copy of ref r0
    assert copy.verdict == REMOVED
    removed = next(r for r in copy.stages if r.status == "removed")
    assert (removed.stage, removed.step, removed.reason) == ("deduplicated_documents", "near_dedup", "near_duplicate")
    assert removed.duplicate_of == make_doc_id("ref", "id:r0") and removed.jaccard >= 0.8
    assert f"duplicate of {removed.duplicate_of} (Jaccard" in copy.summary
    # ...and whether that kept copy reached training, from the token shards' member lists the fixture read.
    member = built["members"][removed.duplicate_of]
    trained = member["split"] == "train" and member["copies"] > 0
    assert copy.kept_copy["doc_id"] == removed.duplicate_of and copy.kept_copy["reached_training"] == trained
    assert copy.kept_copy["checkpoints"] == ([built["checkpoint"].data_version] if trained else [])
    assert f"its kept copy {removed.duplicate_of}: " + ("IN TRAINING" if trained else "NOT TRAINED ON") in copy.summary
    assert copy.to_dict()["kept_copy"]["verdict"] == (IN_TRAINING if trained else copy.kept_copy["verdict"])
    bench = membership(store, config, doc_id=make_doc_id("web", "id:w9"))
    assert bench.verdict == REMOVED and "decontamination.benchmark_overlap" in bench.summary


def test_left_out_validation_quarantined_and_never_seen(built):
    store, config = built["store"], built["config"]
    left_out = next(d for d, m in built["members"].items() if m["split"] == "train" and m["copies"] == 0)
    assert membership(store, config, doc_id=left_out).verdict == LEFT_OUT
    val = next(d for d, m in built["members"].items() if m["split"] == "val")
    result = membership(store, config, doc_id=val)
    assert result.verdict == VALIDATION and result.shards[0].split == "val"
    quarantine = store.read_table("raw_documents", built["project"].partition("web"), "quarantine").to_pylist()
    bad = membership(store, config, doc_id=make_doc_id("web", quarantine[0]["locator"]))
    assert bad.verdict == QUARANTINED and bad.stages[0].reason == "malformed_json"
    unseen = membership(store, config, text=random_text(built["rng"], built["vocab"]))
    assert unseen.verdict == NEVER_SEEN and unseen.match == "none" and unseen.doc_id is None
    assert membership(store, config, doc_id="0" * 24).verdict == NEVER_SEEN


def test_membership_for_a_named_checkpoint(built):
    store, config = built["store"], built["config"]
    doc_id = next(d for d, m in built["members"].items() if m["copies"] > 0)
    result = membership(store, config, doc_id=doc_id, checkpoint=built["checkpoint"].data_version[:8])
    assert result.verdict == IN_TRAINING
    with pytest.raises(AuditError, match="no checkpoint 'ffffffffff'"):
        membership(store, config, doc_id=doc_id, checkpoint="ffffffffff")



def test_membership_answers_from_what_it_can_read_where_the_raw_layer_is_closed(built, monkeypatch):
    """An auditor may not be allowed to read the raw layer (docs/governance.md): a kept document is still answered
    from the later stages and the shards, and a text a filter removed from the hashes the filter stage kept of what
    it read; a record only the raw layer holds, or (in a store filtered before those hashes were kept) a text a
    filter removed, is UNKNOWN rather than never seen; each answer says what it could not read."""
    import pyarrow.parquet as pq

    from kiln.common.manifest import Manifest
    from kiln.common.storage import Store
    from kiln.governance.membership import UNKNOWN

    store, config = built["store"], built["config"]
    quarantine = store.read_table("raw_documents", built["project"].partition("web"), "quarantine").to_pylist()
    raw = str(store.root / "raw_documents")

    def closed(real):
        def read(path, *args, **kwargs):
            if str(path).startswith(raw):
                raise PermissionError(13, "Permission denied", str(path))
            return real(path, *args, **kwargs)
        return read

    for name in ("read_table", "read_schema", "ParquetFile"):
        monkeypatch.setattr(pq, name, closed(getattr(pq, name)))
    batches = Store.iter_batches

    def closed_batches(self, asset, *args, **kwargs):
        if asset == "raw_documents":
            raise PermissionError(13, "Permission denied", raw)
        yield from batches(self, asset, *args, **kwargs)

    monkeypatch.setattr(Store, "iter_batches", closed_batches)
    kept = next(d for d, m in built["members"].items() if m["copies"] > 0 and m["split"] == "train")
    answer = membership(store, config, doc_id=kept)
    assert answer.verdict == IN_TRAINING and answer.stages[0].status == "unreadable", render(answer)
    assert [r.status for r in answer.stages[1:]] == ["kept"] * (len(DOCUMENT_STAGES) - 1)
    assert any(n.startswith("raw_documents is not readable by this user (") for n in answer.notes)
    bad = membership(store, config, doc_id=make_doc_id("web", quarantine[0]["locator"]))  # only raw names it
    assert bad.verdict == UNKNOWN and "raw_documents may" in bad.summary, render(bad)
    by_text = membership(store, config, text=SHORT)  # a filter removed it: the filter's intake hashes name it
    assert by_text.verdict == REMOVED and by_text.stages[0].status == "unreadable", render(by_text)
    assert by_text.stages[1].reason == "gopher_quality.min_doc_words", render(by_text)  # SHORT: 5 words
    partitions = Catalog.partitions  # a closed folder cannot even be listed: the answer says what it searched

    def unlisted(self, asset):
        if asset == "raw_documents":
            raise PermissionError(13, "Permission denied", raw)
        return partitions(self, asset)

    monkeypatch.setattr(Catalog, "partitions", unlisted)
    by_text = membership(store, config, text=SHORT)
    assert by_text.verdict == REMOVED, render(by_text)
    assert any("the texts filters removed were searched by the hashes filtered_documents keeps" in n
               for n in by_text.notes), by_text.notes
    monkeypatch.setattr(Catalog, "partitions", partitions)

    files = Manifest.files_with_role  # a store filtered before the intake hashes were kept: only the raw texts hold it
    monkeypatch.setattr(Manifest, "files_with_role",
                        lambda self, role: [] if role == "intake_hashes" else files(self, role))
    by_text = membership(store, config, text=SHORT)
    assert by_text.verdict == UNKNOWN and "raw_documents" in by_text.summary, render(by_text)
    assert any("the texts filters removed were not searched" in n for n in by_text.notes)


def test_membership_of_a_checkpoint_a_later_one_replaced(built, tmp_path):
    """A later training (on other data: its run reads no shard set of this store) replaces the checkpoint. The
    document is still answered for the earlier checkpoint by name, and noted without it."""
    import shutil

    from kiln.common.storage import Store

    shutil.copytree(built["store"].root, tmp_path / "data", symlinks=True)
    store, config = Store(tmp_path / "data"), built["config"]
    later_training_on_other_data(store)
    earlier = built["checkpoint"].data_version
    doc_id = next(d for d, m in built["members"].items() if m["copies"] > 0 and m["split"] == "train")
    named = membership(store, config, doc_id=doc_id, checkpoint=earlier[:8])
    assert named.verdict == IN_TRAINING and named.shards[0].checkpoints == [earlier]
    assert f"used by checkpoint {earlier}" in named.summary
    current = membership(store, config, doc_id=doc_id)
    assert current.shards[0].checkpoints == []  # the store's checkpoint was not trained on these shards
    assert any(n.startswith(f"checkpoint {earlier}, replaced in the store since, was trained on token_shards "
                            f"{current.shards[0].shard_set}") for n in current.notes), current.notes
    assert audit.lineage(store, earlier[:8]).nodes[0].data_version == earlier
    # A removal request of the document names the replaced checkpoint that was trained on it, as replaced.
    from kiln.governance.forget import RemovalRequest, affected_checkpoints

    request = RemovalRequest("x", "t", "doc_ids", [doc_id], "")
    copies, tokens = built["members"][doc_id]["copies"], built["members"][doc_id]["tokens"]
    assert [(a["checkpoint"], a["current"], a["documents"], a["tokens"]) for a in affected_checkpoints(
        store, request)] == [(earlier, False, 1, copies * tokens)]
    assert [(a["checkpoint"], a["current"]) for a in affected_checkpoints(built["store"], request)] == [
        (earlier, True)]

# --------------------------------------------------------------------------------------- lineage, sources

def test_lineage_reaches_raw_documents_for_every_source_with_hashes(built):
    store = built["store"]
    chain = audit.lineage(store, "checkpoint")
    assert chain.nodes[0].asset == "checkpoint" and not chain.problems
    refresh = built["project"].current()
    assert sorted(chain.partitions("raw_documents")) == [f"ref/{refresh}", f"web/{refresh}"]
    every_stage = [f"{stage}/{source}/{refresh}" for stage in DOCUMENT_STAGES for source in ("web", "ref")]
    for key in ["training_run", f"token_shards/{refresh}", "tokenizer", f"dedup_index/{refresh}",
                f"minhash_signatures/ref/{refresh}", *every_stage]:
        node = chain.node(key)
        manifest = store.manifest(node.asset, node.partition)
        assert node.status == "current" and node.data_version == manifest.data_version
        assert node.files and all(len(f["sha256"]) == 64 for f in node.files) and node.git_commit == manifest.git_commit
        assert all(chain.node(k).data_version == v for k, v in node.inputs.items())
    text = render(chain)
    assert f"raw sources reached: ref ({refresh}), web ({refresh})" in text and "(listed above)" in text
    # The same chain from a data version prefix or the checkpoint folder; unknown targets say so.
    version = built["checkpoint"].data_version
    assert audit.lineage(store, version[:8]).nodes[0].data_version == version
    assert audit.lineage(store, str(store.dataset_dir("checkpoint"))).nodes[0].data_version == version
    with pytest.raises(AuditError, match="no checkpoint 'nope'"):
        audit.lineage(store, "nope")


def test_a_partitioned_asset_named_without_its_partition_is_told_which_to_give(built):
    """`kiln audit lineage token_shards` answered "no checkpoint 'token_shards' ...", though asset keys are what
    the command takes for datasets other than the checkpoint; token_shards is one dataset per refresh."""
    store, refresh = built["store"], built["project"].current()
    with pytest.raises(AuditError) as err:
        audit.lineage(store, "token_shards")
    assert str(err.value) == ("'token_shards' names no one dataset: token_shards has one per partition; give its "
                              f"partition, e.g. token_shards/{refresh}")
    with pytest.raises(AuditError) as err:
        audit.lineage(store, "curated_documents/web")
    assert str(err.value) == ("'curated_documents/web' names no one dataset: curated_documents has one per "
                              f"partition; give its partition, e.g. curated_documents/web/{refresh}")
    assert audit.lineage(store, f"token_shards/{refresh}").nodes[0].key == f"token_shards/{refresh}"


def test_source_usage_lists_shard_sets_shards_and_checkpoints(built):
    store, config = built["store"], built["config"]
    usage = audit.source_usage(store, config, "ref")
    assert usage.license == "CC0-1.0" and usage.checkpoints == [built["checkpoint"].data_version]
    [shard_set] = usage.shard_sets
    stats = store.manifest("token_shards", built["project"].current()).stats["sources"]["ref"]
    assert shard_set.train_tokens == stats["train_tokens"] and shard_set.effective_epochs < 1
    assert sum(s["tokens"] for s in shard_set.shards) == stats["train_tokens"] + stats["val_tokens"]
    assert [s["stage"] for s in usage.stages] == DOCUMENT_STAGES
    assert usage.stages[0]["documents"] == 10 and usage.stages[-1]["documents"] == stats["train_documents"] + \
        stats["val_documents"]
    assert "abc123" in render(usage)
    with pytest.raises(AuditError, match="unknown source 'nope'; sources: ref, web"):
        audit.source_usage(store, config, "nope")


def test_a_shard_set_that_kept_its_composition_in_the_manifest_is_still_described(built):
    """Sets written before the composition was a file of its own kept it in the manifest's stats (`shard_sources`:
    shard -> source -> counts): they read the same; a set with neither says so (None: the caller notes it)."""
    from dataclasses import replace

    import pyarrow.parquet as pq

    from kiln.governance.audit import _shards_holding

    store = built["store"]
    current = store.manifest("token_shards", built["project"].current())
    [entry] = current.files_with_role("composition")
    inline = {}
    for row in pq.read_table(store.dataset_dir("token_shards", built["project"].current()) / entry.path).to_pylist():
        inline.setdefault(row["shard"], {})[row["source"]] = {"documents": row["documents"], "tokens": row["tokens"]}
    files = [f for f in current.files if f.role != "composition"]
    before = replace(current, files=files, stats={**current.stats, "shard_sources": inline})
    for source in ("ref", "web"):
        assert _shards_holding(store, before, source) == _shards_holding(store, current, source) != []
    assert _shards_holding(store, replace(current, files=files), "ref") is None


# --------------------------------------------------------------------------------------------------- CLI

def kiln(built, *argv):
    return main(["audit", *argv, "--home", str(built["home"]), "--config", str(built["config_path"])])


def test_cli_answers_in_text_and_json(built, capsys, tmp_path):
    assert kiln(built, "lineage", "checkpoint") == 0
    refresh = built["project"].current()
    assert f"raw sources reached: ref ({refresh}), web ({refresh})" in capsys.readouterr().out
    (tmp_path / "doc.txt").write_text(SHORT)
    assert kiln(built, "membership", "--text", str(tmp_path / "doc.txt"), "--json") == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["verdict"] == "removed" and answer["reached_training"] is False
    assert kiln(built, "source", "web") == 0
    assert "token_shards" in capsys.readouterr().out


@pytest.mark.parametrize("argv, message", [
    (["source", "nope"], "unknown source 'nope'"),
    (["lineage", "0123456789"], "no checkpoint '0123456789'"),
    (["membership", "--text", "/no/such/file.txt"], "--text: no such file"),
    (["membership", "--doc-id", " "], "--doc-id is empty"),
])
def test_cli_domain_errors_exit_2_with_a_message(built, capsys, argv, message):
    assert kiln(built, *argv) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err.startswith("kiln audit: ") and message in captured.err


def test_cli_argument_errors_exit_2(built, capsys, tmp_path):
    for argv in (["membership"], ["membership", "--doc-id", "x", "--text", "f"], ["lineage"], ["frobnicate"]):
        with pytest.raises(SystemExit) as info:
            kiln(built, *argv)
        assert info.value.code == 2
    capsys.readouterr()
    assert main(["audit", "lineage", "checkpoint", "--home", str(tmp_path)]) == 2
    assert "no Kiln store at" in capsys.readouterr().err


# ---------------------------------------------------------------------------------------------- rejected

def test_the_card_describes_what_the_checkpoint_was_built_from_after_its_inputs_are_materialized_again(
        built, tmp_path):
    """filtered_documents, the last document stage and the token shards of web are materialized again after the
    checkpoint (here: committed with one row of the old version's first part). The card must still be the card of
    the data trained on."""
    import shutil

    import pyarrow.parquet as pq

    from kiln.common.storage import Store
    from kiln.governance.data_card_documents import REPLACED

    before = build_data_card(built["store"], built["config"])
    shutil.copytree(built["store"].root, tmp_path / "data", symlinks=True)
    store = Store(tmp_path / "data")
    web = built["project"].partition("web")
    again = {}
    for asset, partition in (("filtered_documents", web), (DOCUMENT_STAGES[-1], web),
                             ("token_shards", built["project"].current())):
        old = store.snapshot(asset, partition)
        with store.staging(asset, partition) as w:
            role = "members" if asset == "token_shards" else "documents"
            w.write(role, pq.read_table(old.files(role)[0]).slice(0, 1))
            again[asset] = w.commit(code_version="new", config={"changed": True}, inputs=old.manifest.inputs,
                                    counts={"documents": 1}, stats={})
    card = build_data_card(store, built["config"])
    for asset in ("filtered_documents", DOCUMENT_STAGES[-1]):
        was = next(s for s in before["sources"] if s["name"] == "web")["stages"][asset]
        now = next(s for s in card["sources"] if s["name"] == "web")["stages"][asset]
        assert now == was and now["data_versions"] != {web.split("/")[1]: again[asset].data_version}
    assert card["funnel"] == before["funnel"] and card["shards"] == before["shards"]
    assert card["mixture"] == before["mixture"] and card["decontamination"] == before["decontamination"]
    # web's documents trained on are not in the store now: counted as the shards' member list recorded them (the
    # card before, which read the documents themselves, is the second implementation), never from another version.
    # ref's are the versions the shards read: counted as before, their membership from the history's member list.
    for table in ("licenses", "languages"):
        assert card[table]["per_source"]["web"] == {**before[table]["per_source"]["web"], "counted_from": "member list"}
        assert card[table]["per_source"]["ref"] == before[table]["per_source"]["ref"]
    assert any(n["in_train_shards"] for n in card["licenses"]["per_source"]["ref"]["licenses"].values())
    # A member list from before it recorded licences and languages: web's are not known now, ref's still are.
    history = sorted((tmp_path / "data" / "token_shards").glob(".*.history/*/members-*.parquet"))
    for kept in history:
        pq.write_table(pq.read_table(kept).drop_columns(["license", "language", "locator"]), kept)
    older = build_data_card(store, built["config"])
    assert older["licenses"]["per_source"]["web"] == REPLACED == older["languages"]["per_source"]["web"]
    assert older["licenses"]["per_source"]["ref"] == before["licenses"]["per_source"]["ref"]
    # A set replaced before the history kept member lists: which of ref's documents it held is not known.
    for kept in history:
        kept.unlink()
    assert build_data_card(store, built["config"])["licenses"]["per_source"]["ref"] == REPLACED
    nodes = {n["key"]: n for n in card["lineage"]["nodes"]}
    assert nodes[f"filtered_documents/{web}"]["status"] == "replaced" and card["lineage"]["problems"] == []
    assert f"replaced (now `{again['filtered_documents'].data_version}`)" in data_card_markdown(card)

def test_the_card_of_a_checkpoint_a_later_training_replaced(built, tmp_path, capsys):
    """`kiln audit card <version>`: the card of a checkpoint a later training (on other data) replaced, built from
    the store's history: every figure as on its card while it was current, the later checkpoint named, and no path
    to weights that are gone."""
    import shutil

    from kiln.common.storage import Store

    before = build_data_card(built["store"], built["config"])
    shutil.copytree(built["store"].root, tmp_path / "data", symlinks=True)
    store = Store(tmp_path / "data")
    earlier = built["checkpoint"].data_version

    def evaluate(checkpoint: str, loss: float):
        with store.staging("evaluation") as w:
            (w.dir / "evaluation.json").write_text(json.dumps({"loss": loss}))
            return w.commit(code_version="test", config={}, inputs={"checkpoint": checkpoint}, counts={},
                            stats={"validation": {"loss": loss}})

    evaluation = evaluate(earlier, 5.5)
    later_training_on_other_data(store)
    later = store.manifest("checkpoint").data_version
    evaluate(later, 4.25)  # the store's evaluation is now of the later checkpoint
    card = build_data_card(store, built["config"], earlier[:8])
    for key in ("sources", "licenses", "languages", "funnel", "dedup", "decontamination", "quality", "tokenizer",
                "mixture", "shards", "training", "removal_requests"):
        assert card[key] == before[key], key
    assert before["evaluation"] is None  # the fixture evaluated nothing
    assert {k: card["evaluation"][k] for k in ("data_version", "validation", "evaluated_checkpoint")} == \
        {"data_version": evaluation.data_version, "validation": {"loss": 5.5}, "evaluated_checkpoint": earlier}
    assert before["checkpoint"]["replaced_by"] is None and before["checkpoint"]["path"] is not None
    assert (card["checkpoint"]["data_version"], card["checkpoint"]["replaced_by"], card["checkpoint"]["path"]) == \
        (earlier, later, None)

    argv = ["--home", str(tmp_path), "--config", str(built["config_path"])]
    assert main(["audit", "card", earlier[:8], *argv]) == 0
    assert f"This checkpoint was replaced in the store since (now `{later}`)" in capsys.readouterr().out
    out = tmp_path / "card"
    assert main(["audit", "card", earlier, "--out", str(out), *argv]) == 0
    assert f"data card of checkpoint {earlier}: {out / 'data_card.md'}" in capsys.readouterr().out
    written = json.loads((out / "data_card.json").read_text())
    assert written["checkpoint"]["replaced_by"] == later and written["funnel"]["chart"] == "data_card_funnel.png"
    assert "](data_card_funnel.png)" in (out / "data_card.md").read_text()
    assert (out / "data_card_funnel.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert sorted(p.name for p in out.iterdir()) == ["data_card.json", "data_card.md", "data_card_funnel.png"]
    assert main(["audit", "card", earlier, "--out", str(out), "--json", *argv]) == 0  # --json: what went where
    assert json.loads(capsys.readouterr().out) == {
        "checkpoint": earlier, "markdown": str(out / "data_card.md"), "json": str(out / "data_card.json"),
        "chart": str(out / "data_card_funnel.png")}
    assert main(["audit", "card", "ffffffffff", *argv]) == 2
    assert "no checkpoint 'ffffffffff'" in capsys.readouterr().err
    (tmp_path / "a-file").write_text("kept")  # --out naming a file: a clear error, and the file left as it was
    assert main(["audit", "card", earlier, "--out", str(tmp_path / "a-file"), *argv]) == 2
    assert f"--out '{tmp_path / 'a-file'}': cannot write the card there" in capsys.readouterr().err
    assert (tmp_path / "a-file").read_text() == "kept"


def test_rejected_shows_what_a_rule_removed_with_redacted_raw_excerpts(built, capsys):
    """The web source's one short document fell to the filter profile's min_doc_words; the three near-copies of ref
    documents (w0-w2) to near-dedup. Their texts are known here, so each excerpt is checked against them."""
    assert kiln(built, "rejected", "--stage", "filtered_documents", "--reason", "gopher_quality", "--json") == 0
    answer = json.loads(capsys.readouterr().out)
    assert answer["removed"] == {"web": 1} and answer["withheld"] == 0
    [row] = answer["shown"]
    assert row["doc_id"] == make_doc_id("web", "id:short") and row["reason"] == "gopher_quality.min_doc_words"
    assert row["excerpt"] == SHORT  # 32 characters, no PII: the whole text, unchanged by redaction
    assert kiln(built, "rejected", "--stage", "deduplicated_documents", "--reason", "near_duplicate",
                "--sample", "2") == 0
    out = capsys.readouterr().out
    assert out.startswith("deduplicated_documents, reason near_duplicate: 3 documents removed (web 3); 2 shown")
    shown = [t[:200] for t in built["web"][:3] if t[:200] in out]  # an excerpt is a text's first 200 characters
    assert len(shown) == 2 and "decontamination.benchmark_overlap (1)" in out  # the stage's other reason


def test_a_rejected_reason_prefix_asks_for_a_steps_rules_and_every_takedown():
    from kiln.governance.rejected import matches

    assert matches("gopher_quality.min_stop_words", "gopher_quality")
    assert matches("removal_request:3f2a9c1b0d4e", "removal_request")  # quality_filtered_documents' takedowns
    assert matches("removal_request:3f2a9c1b0d4e", "removal_request:3f2a9c1b0d4e")
    assert not matches("gopher_quality_v2.min_stop_words", "gopher_quality")
    assert not matches("removal_request:3f2a9c1b0d4e", "removal_request:3f2a")


def test_rejected_redacts_pii_and_never_shows_a_taken_down_document(built, capsys, monkeypatch):
    from kiln.common.storage import Store
    from kiln.governance import rejected
    from kiln.governance.forget import RemovalRequest

    real_values = Store.values

    def with_pii(self, asset, partition, column, doc_ids=None):  # the raw text as if it held an address
        return {k: f"mail jane.doe@example.com {v}" for k, v in real_values(self, asset, partition, column,
                                                                              doc_ids).items()}

    monkeypatch.setattr(Store, "values", with_pii)
    answer = rejected.rejected_sample(built["store"], "filtered_documents", "gopher_quality.min_doc_words", 5, ["web"])
    [row] = answer.shown
    assert "jane.doe@example.com" not in row["excerpt"] and row["excerpt"].endswith(SHORT)
    taken_down = RemovalRequest("r1", "2026-11-28T00:00:00Z", "doc_ids", [row["doc_id"]], "owner asked")
    monkeypatch.setattr(rejected, "load_requests", lambda store: ([taken_down], "v1"))
    answer = rejected.rejected_sample(built["store"], "filtered_documents", "gopher_quality", 5, ["web"])
    assert answer.shown == [] and answer.withheld == 1 and answer.removed == {"web": 1}
    assert SHORT not in render(answer)


# A removed document's text, a data card statement: a window title (OSC), a cleared screen and a colour (ESC CSI), a
# C1 CSI, a bidi override, a carriage return; as a terminal must show them (the \uXXXX escapes, as text).
HOSTILE = "\x1b]0;PWNED\x07\x1b[2J\x9b31m\u202eTIM\rover"
HOSTILE_SHOWN = "\\u001b]0;PWNED\\u0007\\u001b[2J\\u009b31m\\u202eTIM\\u000dover"
UNSEEN = "\x1b\x07\x9b\u202e\r"


def test_audit_text_shows_control_characters_from_the_data_as_escapes(built, capsys, monkeypatch):
    """`kiln audit` prints data (a removed document's excerpt and URL, a card): a control sequence in it would act on
    the auditor's terminal (retitle it, clear it, colour it) and a bidi override reorder what they read. Text and
    JSON show each as its escape; the JSON still parses to the data as it is."""
    from kiln.common.storage import Store

    real_values, real_read = Store.values, Store.read_table

    def hostile_text(self, asset, partition, column, doc_ids=None):
        return {k: HOSTILE + v for k, v in real_values(self, asset, partition, column, doc_ids).items()}

    def hostile_url(self, asset, partition, role="documents", columns=None, filters=None):
        table = real_read(self, asset, partition, role, columns, filters)
        if role == "rejected" and "url" in table.column_names:
            table = table.set_column(table.column_names.index("url"), "url",
                                     pa.array([f"https://ex.org/{HOSTILE}"] * table.num_rows))
        return table

    monkeypatch.setattr(Store, "values", hostile_text)
    monkeypatch.setattr(Store, "read_table", hostile_url)
    assert kiln(built, "rejected", "--stage", "filtered_documents", "--reason", "gopher_quality") == 0
    out = capsys.readouterr().out
    assert not set(UNSEEN) & set(out)
    assert f"  https://ex.org/{HOSTILE_SHOWN}" in out and f"\n  {HOSTILE_SHOWN}{SHORT}" in out
    assert kiln(built, "rejected", "--stage", "filtered_documents", "--reason", "gopher_quality", "--json") == 0
    out = capsys.readouterr().out
    assert not set(UNSEEN) & set(out)
    assert json.loads(out)["shown"][0]["excerpt"] == HOSTILE + SHORT
    # The card, as markdown and as JSON: a statement of the config is printed as it is, but for these.
    from kiln.governance import data_card

    real_card = data_card.build_data_card
    monkeypatch.setattr(data_card, "build_data_card", lambda *a, **k: {
        **(card := real_card(*a, **k)), "statements": {**card["statements"], "summary": HOSTILE}})
    for argv in ([], ["--json"]):
        assert kiln(built, "card", *argv) == 0
        out = capsys.readouterr().out
        assert not set(UNSEEN) & set(out)
        assert HOSTILE_SHOWN in out if not argv else json.loads(out)["statements"]["summary"] == HOSTILE


def test_rejected_answers_for_a_source_dropped_from_the_config(built, capsys, tmp_path):
    """A source dropped from the config keeps its documents, and what rules removed of them, in the store (and in
    checkpoints trained on it; `kiln audit source` and `kiln forget` take it). `rejected` looked only at the config's
    sources: "removed no document for it; its reasons: none" for web's three near-duplicates, and --source web was
    refused as "no such source in the config"."""
    import yaml

    project = yaml.safe_load(built["config_path"].read_text())
    project["sources"] = [s for s in project["sources"] if s["name"] == "ref"]
    project["mixture"]["weights"] = {"ref": 1.0}
    config = tmp_path / "without-web.yaml"
    config.write_text(yaml.safe_dump(project))
    for argv in ([], ["--source", "web"]):
        assert main(["audit", "rejected", "--stage", "deduplicated_documents", "--reason", "near_duplicate", "--json",
                     "--home", str(built["home"]), "--config", str(config), *argv]) == 0
        assert json.loads(capsys.readouterr().out)["removed"] == {"web": 3}
    assert main(["audit", "rejected", "--stage", "deduplicated_documents", "--reason", "near_duplicate", "--source",
                 "nope", "--home", str(built["home"]), "--config", str(config)]) == 2
    assert capsys.readouterr().err == ("kiln audit: --source nope: no such source in the config or the store; "
                                       "sources: ref, web\n")


def test_refreshes_count_a_source_dropped_from_the_config(built, capsys, tmp_path):
    """`kiln audit refreshes` listed only the config's sources: the refresh's web records (12 lines: w0-w9, the short
    one and one that is not JSON) and the 6 documents left of them (less the short one, the near-copies w0-w2 and
    the benchmark quote w9) went unmentioned once web was dropped from the config."""
    import yaml

    project = yaml.safe_load(built["config_path"].read_text())
    project["sources"] = [s for s in project["sources"] if s["name"] == "ref"]
    project["mixture"]["weights"] = {"ref": 1.0}
    config = tmp_path / "without-web.yaml"
    config.write_text(yaml.safe_dump(project))
    assert main(["audit", "refreshes", "--json", "--home", str(built["home"]), "--config", str(config)]) == 0
    [refresh] = json.loads(capsys.readouterr().out)["refreshes"]
    assert refresh["sources"] == {"ref": {"raw_records": 10, "documents": 10},
                                  "web": {"raw_records": 12, "documents": 6}}


@pytest.mark.parametrize("argv, message", [
    (["--stage", "raw_documents", "--reason", "x"], "documents are removed at filtered_documents"),
    (["--stage", "filtered_documents", "--reason", "nope"], "its reasons: gopher_quality.min_doc_words (1)"),
    (["--stage", "filtered_documents", "--reason", "x", "--source", "nope"], "--source nope: no such source"),
    (["--stage", "filtered_documents", "--reason", "x", "--sample", "0"], "--sample 0: give at least 1"),
])
def test_rejected_bad_questions_exit_2_with_a_message(built, capsys, argv, message):
    assert kiln(built, "rejected", *argv) == 2
    assert message in capsys.readouterr().err


# --------------------------------------------------------------------------------------------- data card

def test_data_card_holds_sources_stages_funnel_and_lineage(built):
    store, config = built["store"], built["config"]
    card = build_data_card(store, config, run_url=lambda e, r: f"http://mlflow.example/#/runs/{r}")
    json.dumps(card)  # the JSON file is this dict
    assert card["checkpoint"]["data_version"] == built["checkpoint"].data_version
    sources = {s["name"]: s for s in card["sources"]}
    assert sources["web"]["license"] == "CC-BY-4.0" and sources["ref"]["license"] == "CC0-1.0"
    assert list(sources["web"]["stages"]) == DOCUMENT_STAGES
    assert sources["web"]["stages"]["raw_documents"]["documents_in"] == 12  # 10 texts + short + unreadable
    assert sources["web"]["tokens"]["effective_epochs"] > 1 > sources["ref"]["tokens"]["effective_epochs"]
    reasons = {r["reason"] for r in card["funnel"]["total"]["rows"]}
    assert {"malformed_json", "gopher_quality.min_doc_words", "near_duplicate",
            "decontamination.benchmark_overlap"} <= reasons
    assert card["dedup"]["per_source"]["web"]["near_duplicates"] == 3
    assert card["decontamination"]["per_source"]["web"]["per_benchmark"]["lanterns"]["documents_dropped"] == 1
    assert card["pii"]["web"] == {} and card["mixture"]["per_source"]["web"]["share"] > 0.7
    assert card["shards"]["member_list"]["sha256"] == store.manifest("token_shards", built["project"].current()).files_with_role("members")[0].sha256
    assert card["mlflow"]["run_id"] == "abc123" and card["mlflow"]["url"].startswith("http://mlflow.example")
    refresh = built["project"].current()
    assert {n["key"] for n in card["lineage"]["nodes"]} >= {f"raw_documents/web/{refresh}",
                                                             f"raw_documents/ref/{refresh}", "tokenizer"}
    markdown = data_card_markdown(card)
    for needle in ("## Sources and licenses", "| web | CC-BY-4.0 |", "## Filter funnel", "near_duplicate",
                   "| lanterns | 1 | 1 | 1 | 0 |", "## Mixture and effective epochs", f"`raw_documents/ref/{refresh}`",
                   "http://mlflow.example/#/runs/abc123"):
        assert needle in markdown
