"""Replay and a raised shards.val_fraction: a continued run whose shards were written at a higher val_fraction than
the replayed set holds, in its validation split, documents that were train documents of the replayed set. The replay
leaves them out (counted apart from removal requests), the loader never reads their tokens, and the run can say how
many of its validation documents the base checkpoint trained on."""

import hashlib
import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.common.storage import Store
from kiln.governance.data_card_markdown import _held_out
from kiln.governance.replay import ReplayError, plan_replay, trained_validation
from kiln.tokens.shard_format import ShardInfo, describe_shard_set, write_shard
from kiln.tokens.shard_writer import MEMBERS_SCHEMA, POSITIONS_SCHEMA
from tests.token_corpus import read_sequences
from training_jobs.loader import ShardLoader

SHA = "ab" * 32
DOCS = [f"doc-{i}" for i in range(40)]
LENGTH = 12  # tokens per document copy; document i's tokens are 100 * (i + 1) + 0..11, unique to it
TWICE = "doc-3"  # held twice by the train shards (the mixture repeated it)


def unit(doc_id: str) -> float:
    """The split's hash written out (kiln.tokens.shard_writer.is_validation): blake2b-64 of "kiln-val-split" and
    the doc_id joined by \\x1f, read little-endian, as a share of 2**64; validation when below val_fraction."""
    digest = hashlib.blake2b(f"kiln-val-split\x1f{doc_id}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") / 2 ** 64


def tokens_of(doc_id: str) -> list[int]:
    i = DOCS.index(doc_id)
    return list(range(100 * (i + 1), 100 * (i + 1) + LENGTH))


def shard_set(folder: Path, val_fraction: float, *, positions: bool = True) -> Path:
    """A hand-made token_shards folder over DOCS at `val_fraction` (split by `unit`): one train shard (TWICE twice,
    then every other train document once), one validation shard; member and position lists, manifest."""
    folder.mkdir(parents=True)
    train = [d for d in DOCS if unit(d) >= val_fraction]
    val = [d for d in DOCS if unit(d) < val_fraction]
    copies = ([TWICE] if TWICE in train else []) + train
    infos, members, places = [], [], []
    for name, split, docs in (("shard-00000.bin", "train", copies), ("shard-00001.bin", "val", val)):
        toks = np.array([t for d in docs for t in tokens_of(d)], np.uint16)
        write_shard(folder / name, toks, np.arange(len(docs) + 1) * LENGTH, SHA)
        infos.append(ShardInfo(name, split, "main" if split == "train" else "val", 0, len(toks), len(docs)))
        places += [{"shard": name, "index": i, "doc_id": d} for i, d in enumerate(docs)]
        members += [{"doc_id": d, "source": "web", "split": split, "copies": docs.count(d), "tokens": LENGTH,
                     "removed_by": None, "license": None, "language": None, "locator": None} for d in sorted(set(docs))]
    pq.write_table(pa.Table.from_pylist(members, schema=MEMBERS_SCHEMA), folder / "members-00000.parquet")
    files = [{"path": "members-00000.parquet", "role": "members", "sha256": "", "bytes": 0}]
    if positions:
        pq.write_table(pa.Table.from_pylist(places, schema=POSITIONS_SCHEMA), folder / "positions-00000.parquet")
        files.append({"path": "positions-00000.parquet", "role": "positions", "sha256": "", "bytes": 0})
    manifest = {"asset": "token_shards", "partition": "r1", "code_version": "test",
                "config": {"shards": {"val_fraction": val_fraction, "seq_len": 8}}, "inputs": {}, "files": files,
                "counts": {}, "stats": describe_shard_set(SHA, 5000, 2, infos, seq_len=8),
                "data_version": f"v{val_fraction}"}
    (folder / "_manifest.json").write_text(json.dumps(manifest))
    return folder


# Worked from `unit`: which documents fall where at 0.1 and at 0.3 (the test's own hash, not the code's).
BASE_VAL = {d for d in DOCS if unit(d) < 0.1}
RUN_VAL = {d for d in DOCS if unit(d) < 0.3}
HELD_OUT = RUN_VAL - BASE_VAL  # train documents of the base set, validation documents of the run


def test_the_documents_are_spread_as_the_test_needs():
    """The hand-worked split of DOCS: some documents in each band, TWICE among those held out."""
    assert sorted(BASE_VAL) == ["doc-38", "doc-5", "doc-6"]
    assert sorted(HELD_OUT) == ["doc-0", "doc-11", "doc-13", "doc-15", "doc-23", "doc-25", "doc-3", "doc-33", "doc-34",
                                "doc-37", "doc-4"] and TWICE in HELD_OUT


@pytest.fixture
def base(tmp_path) -> Path:
    return shard_set(tmp_path / "base", 0.1)


def test_the_replay_leaves_out_the_runs_validation_documents_and_the_loader_never_reads_them(base, tmp_path):
    store = Store(tmp_path / "store")
    plan = plan_replay(store, base, [], val_fraction=0.3)
    assert plan.removed == []  # no takedown: nothing for replay_removed.parquet
    assert sorted(r["doc_id"] for r in plan.held_out) == sorted(HELD_OUT)
    # Places in the train shard: TWICE at 0 and again at its own place among the train documents, in DOCS order.
    order = [TWICE] + [d for d in DOCS if d not in BASE_VAL]
    assert plan.exclude == {"shard-00000.bin": sorted(i for i, d in enumerate(order) if d in HELD_OUT)}
    assert len(plan.exclude["shard-00000.bin"]) == len(HELD_OUT) + 1
    held = plan.describe()["validation_held_out"]
    assert held == {"documents": 11, "tokens": 12 * LENGTH, "val_fraction": 0.3, "replayed_val_fraction": 0.1}
    assert plan.describe()["removed_documents"] == 0 and plan.describe()["removed_file"] is None
    assert "11 replayed train document(s) (144 tokens) left out as this run's validation documents" in _held_out(
        plan.describe())

    def read(exclude) -> set[int]:  # every token an epoch of the replay loader sees (inputs and targets)
        loader = ShardLoader(base, "train", seq_len=8, batch_size=1, seed=1, exclude=exclude)
        return {t for row in read_sequences(loader, loader.sequences_per_epoch) for t in row}

    forbidden = {t for d in HELD_OUT for t in tokens_of(d)}
    assert read({}) & forbidden  # without the exclusion the replay reads them
    kept = read(plan.exclude)
    assert not kept & forbidden
    assert kept  # and the rest still reads


def test_nothing_is_held_out_unless_the_runs_val_fraction_is_higher(base, tmp_path):
    store = Store(tmp_path / "store")
    for val_fraction in (None, 0.0, 0.05, 0.1):
        plan = plan_replay(store, base, [], val_fraction=val_fraction)
        assert plan.held_out == [] and plan.exclude == {}


def test_a_set_without_position_lists_is_refused_when_validation_documents_must_be_skipped(tmp_path):
    store = Store(tmp_path / "store")
    old = shard_set(tmp_path / "old", 0.1, positions=False)
    with pytest.raises(ReplayError, match=r"11 in this run's validation split .* no position list"):
        plan_replay(store, old, [], val_fraction=0.3)
    assert plan_replay(store, old, [], val_fraction=0.1).exclude == {}


def test_how_many_of_the_runs_validation_documents_the_base_trained_on(base, tmp_path):
    from kiln.governance.replay import read_manifest

    run = shard_set(tmp_path / "run", 0.3)
    assert trained_validation(str(base), run, read_manifest(run)) == {
        "documents": len(HELD_OUT), "val_fraction": 0.3, "base_val_fraction": 0.1, "trained_on": str(base)}
    same = shard_set(tmp_path / "same", 0.1)
    assert trained_validation(str(base), same, read_manifest(same)) is None  # same split: none can be
    assert trained_validation(None, run, read_manifest(run)) is None  # the base does not say
    assert trained_validation(str(tmp_path / "gone"), run, read_manifest(run)) is None


def test_a_replay_plan_reads_the_member_list_a_batch_at_a_time(tmp_path):
    """A member list has a row per document of every refresh: the plan held it whole as Python rows (153 MiB of
    Python objects at 300,000 documents, measured before the fix). It now reads it a batch at a time; what it holds
    is the documents the request names. Checked with tracemalloc (Python objects) at 200,000 documents, where the
    whole list as rows is over 100 MiB."""
    import tracemalloc

    from kiln.common.manifest import Manifest
    from kiln.governance.forget import RemovalRequest
    from kiln.governance.replay import named_places

    n = 200_000
    ids = pa.array([f"{i:024x}" for i in range(n)])
    nulls = pa.nulls(n, pa.string())
    pq.write_table(pa.table([ids, pa.array(["web"] * n), pa.array(["train"] * n), pa.array(np.ones(n, np.int32)),
                             pa.array(np.full(n, 5, np.int64)), nulls, nulls, nulls, nulls], schema=MEMBERS_SCHEMA),
                   tmp_path / "members-00000.parquet")
    pq.write_table(pa.table([pa.array(["shard-00000.bin"] * n), pa.array(np.arange(n, dtype=np.int32)), ids],
                            schema=POSITIONS_SCHEMA), tmp_path / "positions-00000.parquet")
    manifest = Manifest.from_dict({
        "asset": "token_shards", "partition": "r1", "code_version": "test", "config": {}, "inputs": {}, "counts": {},
        "files": [{"path": f"{role}-00000.parquet", "role": role, "sha256": "", "bytes": 0}
                  for role in ("members", "positions")],
        "stats": describe_shard_set(SHA, 5000, 2, [ShardInfo("shard-00000.bin", "train", "main", 0, 5 * n, n)],
                                    seq_len=8),
        "data_version": "v1"})
    request = RemovalRequest("r1", "2026-12-05", "doc_ids", [f"{7:024x}", f"{n - 3:024x}"], "owner asked")
    tracemalloc.start()
    try:
        places = named_places(Store(tmp_path / "store"), tmp_path, manifest, [request], "train", tmp_path, "test",
                              "replayed")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert places.exclude == {"shard-00000.bin": [7, n - 3]}  # document i sits at index i
    assert [r["doc_id"] for r in places.removed] == [f"{7:024x}", f"{n - 3:024x}"]
    assert peak < 40 * 2**20, f"{peak / 2**20:.0f} MiB of Python objects"
