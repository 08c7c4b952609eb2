"""Token shards exported for other trainers (kiln.tokens.interchange), read back with the other trainers' own
readers: megatron-core's IndexedDataset and Hugging Face `datasets`, each compared with Kiln's shard reader."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

from kiln.common import spill
from kiln.common.config import Mixture, Phase
from kiln.common.manifest import FileEntry, data_version_of, sha256_file
from kiln.common.storage import DatasetWriter
from kiln.tokens import interchange
from kiln.tokens.interchange import export_shards, megatron_dtype, verify_export
from kiln.tokens.shard_format import ShardError, ShardInfo, describe_shard_set, open_shard, read_shard_set, write_shard
from kiln.tokens.shard_writer import write_token_shards
from kiln.tokens.tokenizer import Tokenizer
from tests.kiln.tokens.test_token_shards import restore, texts_by_id
from tests.token_corpus import shard_settings, standard_sources, train_small_tokenizer

# Importing megatron.core on a CPU-only machine warns about its optional GPU kernels and its own deprecations.
pytestmark = [pytest.mark.filterwarnings("ignore:Transformer Engine and Apex are not installed:UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning:megatron"),
              pytest.mark.filterwarnings("ignore:`torch.jit.script_method` is deprecated:DeprecationWarning")]

# Two phases; `code` is drawn past its natural size in the second, so the shards repeat documents.
PHASES = Mixture(phases=[Phase(name="broad", tokens=12_000, weights={"prose": 0.6, "code": 0.2, "unicode": 0.2}),
                         Phase(name="anneal", tokens=9_000, weights={"prose": 0.1, "code": 0.8, "unicode": 0.1})])


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("interchange")
    sources = standard_sources(root, {"prose": 120, "code": 40, "unicode": 40})
    tok_dir = train_small_tokenizer(root, sources)
    writer = DatasetWriter(root / "store" / "token_shards" / "r1", "token_shards", "r1")
    result = write_token_shards(sources, tok_dir, shard_settings(tokens_per_shard=3000), PHASES, writer,
                                progress=False)
    writer.commit(code_version="test", config={}, inputs={"tokenizer": "tokv"}, counts=result.counts(),
                  stats=result.manifest_stats())
    shard_dir = root / "store" / "token_shards" / "r1"
    stats = export_shards(shard_dir, root / "export", ["parquet", "megatron"])
    return root, sources, Tokenizer.load(tok_dir), shard_dir, stats


def kiln_documents(shard_dir: Path, split: str) -> list[list[int]]:
    """Kiln's own reader: the shard set's split in reading order, document by document."""
    shard_set = read_shard_set(shard_dir)
    out = []
    for info in shard_set.split(split):
        shard = open_shard(shard_dir / info.path, shard_set.tokenizer_sha256)
        out += [shard.document(i).tolist() for i in range(shard.documents)]
    return out


def test_the_fixture_has_phases_repeats_and_both_splits(built):
    _, _, _, shard_dir, stats = built
    shard_set = read_shard_set(shard_dir)
    assert [p["name"] for p in stats["splits"]["train"]["phases"]] == ["broad", "anneal"]
    assert len(shard_set.split("train")) > 3 and shard_set.split("val")
    train = kiln_documents(shard_dir, "train")
    assert len({tuple(d) for d in train}) < len(train)  # some documents are there more than once


def test_megatron_files_read_back_with_megatron_core_token_for_token(built):
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset

    root, _, tok, shard_dir, stats = built
    for split in ("train", "val"):
        expected = kiln_documents(shard_dir, split)
        dataset = IndexedDataset(str(root / "export" / "megatron" / split))
        assert len(dataset) == len(expected) == stats["splits"][split]["documents"]
        assert [dataset[i].tolist() for i in range(len(dataset))] == expected
        # one Megatron document per Kiln document: boundaries survive, each ends with EOS
        assert dataset.document_indices.tolist() == list(range(len(expected) + 1))
        assert dataset.index.dtype == DType.optimal_dtype(tok.vocab_size) == np.uint16
        assert all(dataset[i][-1] == tok.eos_id for i in range(len(dataset)))
    phases = stats["splits"]["train"]["phases"]
    assert phases[1]["first_document"] == phases[0]["documents"]
    assert sum(p["tokens"] for p in phases) == stats["splits"]["train"]["tokens"]


def test_parquet_loads_with_datasets_offline_token_for_token(built, tmp_path, monkeypatch):
    monkeypatch.setenv("HF_DATASETS_OFFLINE", "1")
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    import datasets

    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", True)
    root, sources, tok, shard_dir, _ = built
    loaded = datasets.load_dataset("parquet", data_dir=str(root / "export" / "parquet"), cache_dir=str(tmp_path))
    assert set(loaded) == {"train", "validation"}  # split names from the file names
    originals = texts_by_id(sources)
    by_text = {text: (doc_id, source) for doc_id, (source, text) in originals.items()}
    for split, hf_split in (("train", "train"), ("val", "validation")):
        rows = loaded[hf_split]
        expected = kiln_documents(shard_dir, split)
        assert rows["input_ids"] == expected
        assert rows.features["input_ids"].feature.dtype == "int32"
        # doc_id and source agree with the original documents, found by decoding the tokens (FIM put back)
        assert [(r["doc_id"], r["source"]) for r in rows] == [by_text[restore(ids, tok)] for ids in expected]
    assert set(loaded["train"]["phase"]) == {"broad", "anneal"}
    assert set(loaded["validation"]["phase"]) == {"val"}


def test_small_row_groups_and_copy_chunks_give_the_same_documents(built, tmp_path, monkeypatch):
    """Large shards are written in pieces (Parquet row groups of whole documents, .bin copies in chunks); with
    pieces of a few dozen tokens the files hold the same documents, and the .bin the same bytes."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    root, _, _, shard_dir, _ = built
    monkeypatch.setattr(interchange, "_ROW_GROUP_TOKENS", 40)
    monkeypatch.setattr(interchange, "_COPY_TOKENS", 7)
    stats = export_shards(shard_dir, tmp_path / "out", ["megatron", "parquet"])
    expected = kiln_documents(shard_dir, "train")
    files = [tmp_path / "out" / f for f in stats["splits"]["train"]["parquet_files"]]
    assert sum(pq.ParquetFile(f).metadata.num_row_groups for f in files) > len(files) * 5
    assert [ids for f in files for ids in pq.read_table(f).column("input_ids").to_pylist()] == expected
    dataset = IndexedDataset(str(tmp_path / "out" / "megatron" / "train"))
    assert [dataset[i].tolist() for i in range(len(dataset))] == expected
    assert (tmp_path / "out" / "megatron" / "train.bin").read_bytes() == \
        (root / "export" / "megatron" / "train.bin").read_bytes()
    assert verify_export(tmp_path / "out", stats) == []


def test_the_export_opens_the_shards_one_after_another(built, tmp_path, monkeypatch):
    """At most two shards are open at once (the one being copied and the next), however many the set has: the export
    held every shard of a split open, a file descriptor and a memory map each (Linux allows 65,530 maps a process by
    default) and every document's offset, and failed past that many shards."""
    import weakref

    from kiln.tokens import interchange

    _, _, _, shard_dir, _ = built
    live, most, opened = [0], [0], [0]
    real = interchange.open_shard

    def counting(path, expected_tokenizer_sha256=None):
        shard = real(path, expected_tokenizer_sha256)
        live[0], opened[0] = live[0] + 1, opened[0] + 1
        most[0] = max(most[0], live[0])
        weakref.finalize(shard, lambda: live.__setitem__(0, live[0] - 1))
        return shard

    monkeypatch.setattr(interchange, "open_shard", counting)
    export_shards(shard_dir, tmp_path / "out", ["megatron", "parquet"])
    shards = len(read_shard_set(shard_dir).shards)
    assert shards > 4 and opened[0] >= shards and most[0] <= 2, (shards, opened, most)


def test_export_carries_the_shards_lineage_and_checks_itself(built):
    root, _, tok, shard_dir, stats = built
    source = json.loads((shard_dir / "_manifest.json").read_text())
    assert stats["source"] == {"asset": "token_shards", "partition": "r1", "data_version": source["data_version"],
                               "code_version": "test"}
    assert stats["tokenizer_sha256"] == tok.sha256 and stats["eos_id"] == tok.eos_id
    assert json.loads((root / "export" / "export.json").read_text()) == stats
    assert verify_export(root / "export", stats) == []
    assert not [p for p in (root / "export").rglob(".*")]  # no temporary files left
    # a damaged copy is caught: a .bin cut short, a Parquet file of another split
    damaged = root / "damaged"
    export_shards(shard_dir, damaged, ["megatron", "parquet"])
    with open(damaged / "megatron" / "val.bin", "r+b") as f:
        f.truncate(10)
    (damaged / "parquet" / "train-00000.parquet").write_bytes((damaged / "parquet" / "val-00000.parquet").read_bytes())
    problems = verify_export(damaged, stats)
    assert any(p.startswith("megatron/val.bin: 10 bytes") for p in problems)
    assert any(p.startswith("parquet train:") for p in problems)


def test_same_shards_same_bytes_and_the_export_version_is_in_the_data_version(built, tmp_path, monkeypatch):
    root, _, _, shard_dir, _ = built

    def version(out: Path) -> str:  # what DatasetWriter.commit makes the data version of: the files' hashes
        return data_version_of([FileEntry(p.relative_to(out).as_posix(), "artifact", sha256_file(p), p.stat().st_size)
                                for p in out.rglob("*") if p.is_file()])

    export_shards(shard_dir, tmp_path / "again", ["megatron", "parquet"])
    assert version(tmp_path / "again") == version(root / "export")
    monkeypatch.setattr(interchange, "EXPORT_VERSION", 2)
    export_shards(shard_dir, tmp_path / "v2", ["megatron", "parquet"])
    assert version(tmp_path / "v2") != version(root / "export")


def hand_built_set(root: Path, vocab_size: int, docs: list[list[int]], monkeypatch) -> Path:
    """A one-shard, train-only set with these documents (ids may exceed 65,535 for a uint32 set)."""
    monkeypatch.setattr("kiln.common.storage.git_commit", lambda: None)
    writer = DatasetWriter(root / "token_shards" / "_all", "token_shards", None)
    dtype = np.uint16 if vocab_size <= 1 << 16 else np.uint32
    tokens = np.array([t for d in docs for t in d], dtype)
    offsets = np.cumsum([0] + [len(d) for d in docs]).astype(np.uint64)
    write_shard(writer.dir / "shard-00000.bin", tokens, offsets, "ab" * 32)
    info = ShardInfo("shard-00000.bin", "train", "main", 0, len(tokens), len(docs))
    writer.commit(code_version="t", config={}, inputs={}, counts={},
                  stats=describe_shard_set("ab" * 32, vocab_size, 2, [info]))
    return root / "token_shards" / "_all"


@pytest.mark.parametrize("vocab_size, kiln_bytes, megatron", [(65_520, 2, np.int32), (70_000, 4, np.int32),
                                                               (65_499, 2, np.uint16)])
def test_megatron_dtype_follows_megatron_not_kiln(vocab_size, kiln_bytes, megatron, tmp_path, monkeypatch):
    """Megatron switches to int32 at 65,500 ids, Kiln's shards at 65,536: 65,520 is uint16 here, int32 there."""
    from megatron.core.datasets.indexed_dataset import DType, IndexedDataset

    assert megatron_dtype(vocab_size) == DType.optimal_dtype(vocab_size) == megatron
    docs = [[vocab_size - 1, 3, 2], [2], [7, 65_499, 11, 2]]
    shard_dir = hand_built_set(tmp_path, vocab_size, docs, monkeypatch)
    assert open_shard(shard_dir / "shard-00000.bin").tokens.dtype.itemsize == kiln_bytes
    stats = export_shards(shard_dir, tmp_path / "out", ["megatron"])
    dataset = IndexedDataset(str(tmp_path / "out" / "megatron" / "train"))
    assert dataset.index.dtype == megatron and [dataset[i].tolist() for i in range(3)] == docs
    assert (tmp_path / "out" / "megatron" / "train.bin").stat().st_size == 8 * np.dtype(megatron).itemsize
    # no validation shards: no val files, and the split says so
    assert stats["splits"]["val"] == {"documents": 0, "tokens": 0, "phases": []}
    assert not (tmp_path / "out" / "megatron" / "val.idx").exists() and not (tmp_path / "out" / "parquet").exists()


def test_bad_formats_and_old_shard_sets_are_refused_with_the_fix(tmp_path, monkeypatch):
    shard_dir = hand_built_set(tmp_path, 500, [[5, 2]], monkeypatch)
    with pytest.raises(ShardError, match=r"shards.export: unknown format 'nemo'; choose from \['megatron', 'parquet'\]"):
        export_shards(shard_dir, tmp_path / "out", ["nemo"])
    # no positions / member list: Parquet needs the doc_ids, so it says to re-materialize
    with pytest.raises(ShardError, match="no positions or member list.*re-materialize token_shards"):
        export_shards(shard_dir, tmp_path / "out", ["parquet"])
    with pytest.raises(ShardError, match="materialize token_shards first"):
        export_shards(tmp_path / "nowhere", tmp_path / "out", ["megatron"])


def test_a_failed_write_leaves_no_file_under_its_name(built, tmp_path, monkeypatch):
    _, _, _, shard_dir, _ = built

    def broken(*args, **kwargs):
        raise OSError("disk full")

    monkeypatch.setattr(pq, "ParquetWriter", broken)
    with pytest.raises(OSError, match="disk full"):
        export_shards(shard_dir, tmp_path / "out", ["parquet"])
    assert [p.name for p in (tmp_path / "out").rglob("*") if p.is_file()] == []


def test_config_key_and_default(tmp_path):
    from kiln.common.config import ConfigError, load_config, parse_config

    raw = {"sources": [{"name": "web", "kind": "text", "path": "x", "license": "MIT", "domain": "web", "profile": "p"}],
           "profiles": {"p": []}}
    assert parse_config(raw).shards.export == []
    with pytest.raises(ConfigError, match=r"shards.export\[0\] = 'nemo': Input should be 'megatron' or 'parquet'"):
        parse_config({**raw, "shards": {"export": ["nemo"]}})
    assert load_config(Path(__file__).parents[3] / "configs" / "default.yaml").shards.export == ["megatron", "parquet"]



def test_exporting_again_into_the_same_folder_leaves_nothing_of_the_earlier_export(built, tmp_path, monkeypatch):
    """export_shards into a folder that holds an export of another shard set (e.g. the set before a takedown):
    no file of the earlier one stays to be read beside the new one, by `load_dataset(data_dir=...)` (a shard the new
    set no longer has, a split it no longer has) or by Megatron (the earlier val prefix)."""
    from megatron.core.datasets.indexed_dataset import IndexedDataset

    _, _, _, shard_dir, _ = built
    out = tmp_path / "out"
    first = export_shards(shard_dir, out, ["megatron", "parquet"])
    assert len(first["splits"]["train"]["parquet_files"]) > 1 and (out / "megatron" / "val.idx").is_file()
    (out / "notes.txt").write_text("mine")  # not an export's file: left alone
    smaller = hand_built_set(tmp_path / "smaller", 500, [[7, 8, 2], [9, 2]], monkeypatch)  # one shard, train only
    stats = export_shards(smaller, out, ["megatron"])
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == \
        ["export.json", "megatron/train.bin", "megatron/train.idx", "notes.txt"]
    dataset = IndexedDataset(str(out / "megatron" / "train"))
    assert [dataset[i].tolist() for i in range(len(dataset))] == [[7, 8, 2], [9, 2]]
    assert verify_export(out, stats) == []


def test_a_crash_while_exporting_again_leaves_no_earlier_idx_beside_a_new_bin(built, tmp_path, monkeypatch):
    """A crash between a split's .bin and its .idx, exporting into a folder with an earlier export: Megatron must not
    find the new .bin under the earlier .idx (whose pointers describe other documents), nor export.json claim it."""
    _, _, _, shard_dir, _ = built
    out = tmp_path / "out"
    export_shards(shard_dir, out, ["megatron"])
    smaller = hand_built_set(tmp_path / "smaller", 500, [[7, 8, 2], [9, 2]], monkeypatch)
    write = interchange.write_file_atomic

    def crash_at_idx(path, fn, *args, **kwargs):
        if path.suffix == ".idx":
            raise OSError("killed")
        return write(path, fn, *args, **kwargs)

    monkeypatch.setattr(interchange, "write_file_atomic", crash_at_idx)
    with pytest.raises(OSError, match="killed"):
        export_shards(smaller, out, ["megatron"])
    assert (out / "megatron" / "train.bin").read_bytes() == np.array([7, 8, 2, 9, 2], "<u2").tobytes()
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()) == ["megatron/train.bin"]


@pytest.mark.parametrize("bucket_rows", [interchange._JOIN_BUCKET_ROWS, 7])
def test_the_member_list_is_looked_up_once_per_bucket_not_once_per_shard(built, tmp_path, monkeypatch, bucket_rows):
    """Each Parquet row's source comes from the member list; hashing every member again for each shard made an
    export take shards x members (2M members, 500 shards: ~200 s of lookups instead of under 1 s). The lists are
    joined a doc_id bucket at a time: once for the fixture's lists at the default size, and with buckets of 7 rows
    (dozens of buckets, the shards in several groups, spilled to files of at most 4 buckets and scattered again, as
    past 256 x 2^20 rows) the same files, sources included, and no scratch file left."""
    _, _, _, shard_dir, stats = built
    calls = []
    index_in = interchange.pc.index_in

    def counted(values, value_set, **kwargs):
        calls.append(len(value_set))
        return index_in(values, value_set=value_set, **kwargs)

    monkeypatch.setattr(interchange.pc, "index_in", counted)
    monkeypatch.setattr(interchange, "_JOIN_BUCKET_ROWS", bucket_rows)
    monkeypatch.setattr(spill, "MAX_BUCKETS", 4)
    again = export_shards(shard_dir, tmp_path / "out", ["parquet"])
    assert len(again["splits"]["train"]["parquet_files"]) + len(again["splits"]["val"]["parquet_files"]) > 4
    members = sum(pq.ParquetFile(p).metadata.num_rows for p in shard_dir.glob("members-*.parquet"))
    positions = sum(pq.ParquetFile(p).metadata.num_rows for p in shard_dir.glob("positions-*.parquet"))
    assert len(calls) == -(-max(members, positions) // bucket_rows)  # a lookup per bucket
    assert (len(calls) > 10) == (bucket_rows == 7)
    for split in ("train", "val"):  # the same rows, sources included, as the fixture's export
        for name in stats["splits"][split]["parquet_files"]:
            assert pq.read_table(tmp_path / "out" / name).equals(pq.read_table(built[0] / "export" / name))
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


@pytest.mark.parametrize("alteration", ["a document left out of the member list", "a shard the set does not hold"])
def test_lists_that_do_not_match_the_set_are_refused_naming_the_fix(built, tmp_path, alteration):
    import shutil

    _, _, _, shard_dir, _ = built
    copy = tmp_path / "shards"
    shutil.copytree(shard_dir, copy)
    [members] = copy.glob("members-*.parquet")
    [positions] = copy.glob("positions-*.parquet")
    if alteration.startswith("a document"):
        table = pq.read_table(members)
        placed = pq.read_table(positions).column("doc_id")[0].as_py()
        pq.write_table(table.filter(pc.not_equal(table["doc_id"], placed)), members)
    else:
        table = pq.read_table(positions)
        renamed = pc.if_else(pc.equal(table["index"], 0), pa.scalar("shard-99999.bin"), table["shard"])
        pq.write_table(table.set_column(0, "shard", renamed), positions)
    why = "member list does not hold" if alteration.startswith("a document") else "shards the set does not hold"
    with pytest.raises(ShardError, match=f"{why}.*re-materialize token_shards"):
        export_shards(copy, tmp_path / "out", ["parquet"])
    assert not [p for p in (tmp_path / "out").iterdir() if p.name.startswith(".")]


def test_megatron_reads_a_re_made_export_through_its_version_folder_with_a_shared_cache(tmp_path, monkeypatch):
    """Megatron's GPTDataset keys its sample-index cache (--data-cache-path) by the prefix string, not the data: given
    the store's link (the same path for every version), a run after the export is made again (a takedown) reuses the
    indices of the earlier export over the new files. The prefix under the version folder (realpath of the link, as
    docs/tokens.md says to pass) changes with each version, so the next run builds its indices afresh."""
    import os

    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig
    from megatron.core.datasets.indexed_dataset import IndexedDataset
    from megatron.core.datasets.utils import Split

    class Tok:
        eod, pad, vocab_size, unique_identifiers = 2, 0, 500, {"class": "Tok"}

    def samples(prefix: str, cache: Path) -> list[list[int]]:
        config = GPTDatasetConfig(random_seed=1, sequence_length=16, path_to_cache=str(cache), tokenizer=Tok(),
                                  reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False)
        dataset = IndexedDataset(prefix)
        gpt = GPTDataset(dataset, prefix, np.arange(len(dataset), dtype=np.int32), 40, Split.train, config)
        return [gpt[i]["tokens"].tolist() for i in range(len(gpt))]

    rng = np.random.default_rng(0)
    docs = [[int(t) for t in rng.integers(3, 500, int(rng.integers(5, 40)))] + [2] for _ in range(60)]
    prefixes = []
    for k, kept in enumerate((docs, docs[:20] + docs[21:])):  # then document 20 is taken down
        shard_dir = hand_built_set(tmp_path / f"s{k}", 500, kept, monkeypatch)
        writer = DatasetWriter(tmp_path / "shard_exports" / "r1", "shard_exports", "r1")
        export_shards(shard_dir, writer.dir, ["megatron"])
        writer.commit(code_version="t", config={}, inputs={}, counts={}, stats={})
        link = tmp_path / "shard_exports" / "r1"
        prefixes.append(os.path.realpath(link) + "/megatron/train")
        shared = samples(prefixes[-1], tmp_path / "cache")  # one cache folder for every run, as in the docs
    assert prefixes[0] != prefixes[1]
    assert shared == samples(prefixes[1], tmp_path / "fresh")  # as a run with no cache of the first export reads
    assert not any(docs[20][:5] == s[j:j + 5] for s in shared for j in range(len(s) - 4))
