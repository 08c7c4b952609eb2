"""A checkpoint's lineage after the datasets it was built from are materialized again: the chain describes the
versions its consumers recorded (from the store's history of manifests), not whatever the store holds now."""

from __future__ import annotations

import pyarrow as pa

from kiln.common.storage import Store
from kiln.governance import audit
from kiln.governance.catalog import Catalog, run_of_checkpoint, stages_read
from kiln.governance.render import render


def commit(store: Store, asset: str, partition: str | None, rows: list[int], inputs: dict[str, str],
           config: dict | None = None) -> str:
    with store.staging(asset, partition) as w:
        w.write("documents", pa.table({"x": rows}))
        return w.commit(code_version=f"{asset}-code", config=config or {}, inputs=inputs,
                        counts={"documents": len(rows)}).data_version


def test_the_chain_follows_the_recorded_versions_after_they_are_replaced_and_removed(tmp_path):
    store = Store(tmp_path, keep_replaced_s=0)  # a replaced version's files go at the next commit
    raw1 = commit(store, "raw_documents", "web/r1", [1, 2, 3], {})
    filtered1 = commit(store, "filtered_documents", "web/r1", [1, 2], {"raw_documents/web/r1": raw1},
                       config={"min_words": 50})
    ckpt = commit(store, "checkpoint", None, [0], {"filtered_documents/web/r1": filtered1})
    # Later, both stages are materialized again (new raw data, a looser filter); the checkpoint is not.
    raw2 = commit(store, "raw_documents", "web/r1", [1, 2, 3, 4], {})
    filtered2 = commit(store, "filtered_documents", "web/r1", [1, 2, 3, 4], {"raw_documents/web/r1": raw2},
                       config={"min_words": 5})

    chain = audit.lineage(store, "checkpoint")
    assert chain.nodes[0].data_version == ckpt
    filtered, raw = chain.node("filtered_documents/web/r1"), chain.node("raw_documents/web/r1")
    # What the checkpoint read, as it was: two documents from three raw records, its files' hashes and inputs.
    assert (filtered.status, filtered.data_version, filtered.current_version) == ("replaced", filtered1, filtered2)
    assert filtered.counts == {"documents": 2} and filtered.inputs == {"raw_documents/web/r1": raw1}
    assert (raw.status, raw.data_version, raw.current_version, raw.counts) == ("replaced", raw1, raw2, {"documents": 3})
    assert store.manifest_at("filtered_documents", "web/r1", filtered1).config == {"min_words": 50}
    assert chain.problems == []  # exactly what it was built from: nothing unknown
    text = render(chain)
    assert f"filtered_documents/web/r1  {filtered1}  REPLACED since (now {filtered2})" in text

    # A second consumer that read the new version: one dataset, two versions recorded. The chain cannot be both.
    commit(store, "checkpoint", None, [0], {"filtered_documents/web/r1": filtered1,
                                            "curated_documents/web/r1": commit(
                                                store, "curated_documents", "web/r1", [1],
                                                {"filtered_documents/web/r1": filtered2})})
    chain = audit.lineage(store, "checkpoint")
    filtered = chain.node("filtered_documents/web/r1")
    assert filtered.status == "superseded" and filtered.data_version == filtered1  # the first consumer's
    assert chain.problems == [f"filtered_documents/web/r1: consumers also recorded {filtered2}; the chain below it "
                              f"is {filtered1}'s (from the store's history)"]


def test_a_version_from_before_the_history_is_followed_as_before(tmp_path):
    """A store written before the history was kept: the recorded version is unknown, so the chain says so and
    follows the current version (as it always did), and the audit's check fails on it."""
    store = Store(tmp_path, keep_replaced_s=0)
    raw1 = commit(store, "raw_documents", "web/r1", [1, 2, 3], {})
    commit(store, "checkpoint", None, [0], {"raw_documents/web/r1": raw1})
    raw2 = commit(store, "raw_documents", "web/r1", [1], {})
    (tmp_path / "raw_documents" / "web" / ".r1.history" / f"{raw1}.json").unlink()
    chain = audit.lineage(store, "checkpoint")
    raw = chain.node("raw_documents/web/r1")
    assert (raw.status, raw.data_version, raw.current_version) == ("superseded", raw2, raw2)
    assert chain.problems == [f"raw_documents/web/r1: consumers also recorded {raw1}; the chain below it is {raw2}'s "
                              f"(the store's current version)"]


def test_an_outputs_funnel_adds_up_the_stage_versions_it_was_built_from(tmp_path):
    from assets.results import full_funnel
    from kiln.common.stats import StageStats

    def stage(docs_in: int, docs_out: int, step: str) -> dict:
        stats = StageStats(docs_in, 10 * docs_in, docs_out, 10 * docs_out)
        stats.step(step).dropped[step + ".dropped"] = docs_in - docs_out
        return stats.to_dict()

    store = Store(tmp_path, keep_replaced_s=0)

    def commit_stats(asset: str, stats: dict, inputs: dict[str, str]) -> str:
        with store.staging(asset, "web/r1") as w:
            w.write("documents", pa.table({"x": [stats["docs_out"]]}))
            return w.commit(code_version="c", config={}, inputs=inputs, counts={}, stats=stats).data_version

    raw1 = commit_stats("raw_documents", stage(9, 8, "quarantine"), {})
    filtered1 = commit_stats("filtered_documents", stage(8, 5, "gopher"), {"raw_documents/web/r1": raw1})
    # raw_documents is materialized again (other reading settings), filtered_documents is not.
    commit_stats("raw_documents", stage(12, 12, "quarantine"), {})
    with store.staging("curated_documents", "web/r1") as w:
        w.write("documents", pa.table({"x": [1]}))
        curated = w.commit(code_version="c", config={}, inputs={"filtered_documents/web/r1": filtered1,
                                                                "filtered_documents/ref/r1": "0" * 20}, counts={})
    assert [m.data_version for m in stages_read(store, curated)] == [raw1, filtered1]
    funnel = full_funnel(store, curated, StageStats.from_dict(stage(5, 4, "exact_dedup")), "curated documents")
    text = funnel["full_funnel"].value
    # 9 raw records read, 4 kept in the end; each step's drops, over the versions that fed this output.
    assert text.startswith("From raw records to curated documents:\n\n**9 documents in → 4 kept** (44.4%")
    assert [line.split(" | ")[1:3] for line in text.splitlines() if line.startswith("| ") and "`" in line] == [
        ["`quarantine.dropped`", "1"], ["`gopher.dropped`", "3"], ["`exact_dedup.dropped`", "1"]]


def test_an_earlier_checkpoint_is_audited_after_a_later_one_replaced_it(tmp_path):
    store = Store(tmp_path, keep_replaced_s=0)
    shards1 = commit(store, "token_shards", "r1", [1], {})
    run1 = commit(store, "training_run", None, [1], {"token_shards/r1": shards1})
    ckpt1 = commit(store, "checkpoint", None, [1], {"training_run": run1})
    # The next training: new shards, a new run, a new checkpoint; the first one's datasets are all replaced.
    shards2 = commit(store, "token_shards", "r1", [2], {})
    run2 = commit(store, "training_run", None, [2], {"token_shards/r1": shards2})
    ckpt2 = commit(store, "checkpoint", None, [2], {"training_run": run2})

    first = audit.lineage(store, ckpt1[:8])  # by its data version, as a user types it
    assert first.nodes[0].data_version == ckpt1 and first.problems == []
    assert (first.node("training_run").data_version, first.node("token_shards/r1").data_version) == (run1, shards1)
    assert audit.lineage(store, "checkpoint").nodes[0].data_version == ckpt2
    catalog = Catalog(store)
    assert {m.data_version for m in catalog.published("checkpoint")} == {ckpt1, ckpt2}
    assert run_of_checkpoint(catalog, ckpt1).data_version == run1
