"""Token shards: the binary format, mixture math, FIM layout, and documents → shards → exact text."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from kiln.common.config import Fim, Mixture, Phase
from kiln.common.storage import DatasetWriter
from kiln.engine import SERIAL, ProcessPool
from kiln.tokens.fim import PSM, SPM, FimIds, FimSplit, fim_split, fim_tokens, unfim
from kiln.tokens.mixture import (MixtureError, SourceParts, epoch_warnings, plan_phases, select_documents, shares,
                                 split_budget)
from kiln.tokens.shard_format import (
    HEADER_SIZE,
    ShardError,
    ShardInfo,
    check_shard,
    describe_shard_set,
    open_shard,
    read_shard_set,
    shard_tokens,
    token_dtype,
    verify_shards,
    write_shard,
)
from kiln.tokens.shard_writer import (COMPOSITION_SCHEMA, MEMBERS_SCHEMA, POSITIONS_SCHEMA, is_validation,
                                     write_token_shards)
from kiln.tokens.tokenizer import Tokenizer
from tests.token_corpus import (
    NATURAL,
    make_texts,
    shard_settings,
    standard_sources,
    train_small_tokenizer,
    write_source,
)

SHA_A, SHA_B = "ab" * 32, "cd" * 32


# ------------------------------------------------------------------------------------------ shard format

def test_shard_round_trip_memory_maps_tokens_and_offsets(tmp_path):
    tokens = np.array([5, 6, 2, 7, 2, 9, 9, 9, 2], np.uint16)
    write_shard(tmp_path / "s.bin", tokens, np.array([0, 3, 5, 9]), SHA_A)
    shard = open_shard(tmp_path / "s.bin", expected_tokenizer_sha256=SHA_A)
    assert isinstance(shard.tokens, np.memmap) and shard.tokens.dtype == np.uint16
    assert shard.tokens.tolist() == tokens.tolist() and shard.documents == 3
    assert shard.document(1).tolist() == [7, 2] and shard.tokenizer_sha256 == SHA_A
    assert (tmp_path / "s.bin").stat().st_size == HEADER_SIZE + 18 + 6 + 8 * 4  # padded to 8 bytes
    assert [p.name for p in tmp_path.iterdir()] == ["s.bin"]


def test_uint32_shards_for_large_vocabularies(tmp_path):
    assert token_dtype(65_536) == np.uint16 and token_dtype(65_537) == np.uint32
    write_shard(tmp_path / "s.bin", np.array([70_000, 2], np.uint32), np.array([0, 2]), SHA_A)
    assert open_shard(tmp_path / "s.bin").tokens.tolist() == [70_000, 2]


def test_wrong_tokenizer_is_refused_naming_both_hashes(tmp_path):
    write_shard(tmp_path / "s.bin", np.array([1, 2], np.uint16), np.array([0, 2]), SHA_A)
    with pytest.raises(ShardError, match=r"written with tokenizer abababababab…, the loader expects cdcdcdcdcdcd…"):
        open_shard(tmp_path / "s.bin", expected_tokenizer_sha256=SHA_B)


@pytest.mark.parametrize("damage, message", [
    (lambda b: b"NOTASHRD" + b[8:], "not a Kiln token shard"),
    (lambda b: b[:8] + (99).to_bytes(4, "little") + b[12:], "format version 99"),
    (lambda b: b[:12] + (3).to_bytes(4, "little") + b[16:], "3 bytes per token"),
    (lambda b: b[:16] + (1000).to_bytes(8, "little") + b[24:], "truncated or corrupt"),
    (lambda b: b[:-8], "truncated or corrupt"),
    (lambda b: b[:10], "not a Kiln token shard"),
])
@pytest.mark.parametrize("reader", [open_shard, check_shard, shard_tokens])
def test_corrupt_shards_are_refused(tmp_path, damage, message, reader):
    """By every reader, the ones that read no document index included."""
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(10, dtype=np.uint16), np.array([0, 4, 10]), SHA_A)
    path.write_bytes(damage(path.read_bytes()))
    with pytest.raises(ShardError, match=message):
        reader(path)


def test_the_readers_without_the_index_give_the_shards_header_and_tokens(tmp_path):
    path = tmp_path / "s.bin"
    write_shard(path, np.arange(10, dtype=np.uint16), np.array([0, 4, 10]), SHA_A)
    assert check_shard(path, SHA_A) == (2, 10, 2, SHA_A)
    assert np.array_equal(shard_tokens(path, SHA_A), np.arange(10)) and shard_tokens(path).dtype == np.uint16
    with pytest.raises(ShardError, match=r"written with tokenizer abababababab…, the loader expects cdcdcdcdcdcd…"):
        shard_tokens(path, expected_tokenizer_sha256=SHA_B)


def test_verifying_a_shard_set_names_each_shard_that_does_not_add_up(tmp_path):
    """The shards_verified check's verdicts, worked by hand on four shards of 10 tokens in documents of 4 and 6: one
    whole, one truncated, one the manifest lists with 9 tokens, one whose index's last entry was overwritten (the
    last 8 bytes of the file: 10 -> 11); and a shard of another tokenizer."""
    infos = [ShardInfo(f"s{k}.bin", "train", "main", 0, 10, 2) for k in range(4)]
    for info in infos:
        write_shard(tmp_path / info.path, np.arange(10, dtype=np.uint16), np.array([0, 4, 10]), SHA_A)
    assert list(verify_shards(tmp_path, infos, SHA_A)) == []
    (tmp_path / "s1.bin").write_bytes((tmp_path / "s1.bin").read_bytes()[:-8])
    listed = [infos[0], infos[1], ShardInfo("s2.bin", "train", "main", 0, 9, 2), infos[3]]
    (tmp_path / "s3.bin").write_bytes((tmp_path / "s3.bin").read_bytes()[:-8] + (11).to_bytes(8, "little"))
    found = list(verify_shards(tmp_path, listed, SHA_A))
    # 64 B of header, 20 of tokens, 4 of padding and 3 offsets of 8: 112 B, less the 8 cut off
    assert HEADER_SIZE == 64 and len(found) == 3 and "s1.bin is 104 bytes but its header (10 tokens, 2 documents, 2 " \
        "bytes per token) implies 112" in found[0]
    assert found[1:] == [f"{tmp_path / 's2.bin'} holds 10 tokens / 2 documents but the manifest lists 9 / 2: the "
                         "dataset was altered after it was written; re-materialize token_shards",
                         f"shard {tmp_path / 's3.bin'} has a corrupt document index (first 0, last 11, tokens 10); "
                         "re-materialize token_shards"]
    assert [m[:60] for m in verify_shards(tmp_path, infos[:1], SHA_B)] == \
        [f"shard {tmp_path / 's0.bin'} was written with tokenizer abababababab…"[:60]]


def test_bad_offsets_are_refused_at_write_time(tmp_path):
    with pytest.raises(ShardError, match="offsets must rise"):
        write_shard(tmp_path / "s.bin", np.arange(4, dtype=np.uint16), np.array([0, 3, 2, 4]), SHA_A)


def test_shard_set_without_manifest_says_to_materialize(tmp_path):
    with pytest.raises(ShardError, match="materialize token_shards first"):
        read_shard_set(tmp_path)


# -------------------------------------------------------------------------------------------- mixture

def test_split_budget_sums_exactly():
    thirds = split_budget(10, {"a": 1 / 3, "b": 1 / 3, "c": 1 / 3})
    assert sum(thirds.values()) == 10 and sorted(thirds.values()) == [3, 3, 4]
    assert sum(split_budget(1_000_003, {"a": 0.123, "b": 0.877}).values()) == 1_000_003


def test_shares_natural_and_weighted():
    natural = {"a": 300, "b": 100}
    assert shares(["a", "b"], {}, natural) == {"a": 0.75, "b": 0.25}
    assert shares(["a", "b"], {"a": 1, "b": 3}, natural) == {"a": 0.25, "b": 0.75}
    with pytest.raises(MixtureError, match="source 'b' has weight 1 but no tokens"):
        shares(["a", "b"], {"a": 1, "b": 1}, {"a": 5, "b": 0})


def test_select_documents_cycles_whole_passes_plus_a_subset():
    lengths = np.array([10, 20, 30, 40])  # 100 tokens a pass
    picked, cursor = select_documents(lengths, 250)
    assert picked.tolist() == [0, 1, 2, 3, 0, 1, 2, 3, 0, 1, 2] and cursor == 11  # 2 passes + 60 tokens ≈ 50
    more, cursor2 = select_documents(lengths, 70, cursor)  # the next draw continues where this one stopped
    assert more.tolist() == [3, 0, 1] and cursor2 == 14
    few, _ = select_documents(lengths, 35)
    assert lengths[few].sum() in (30, 60) and few.tolist() in ([0, 1], [0, 1, 2])
    assert select_documents(lengths, 0, 5)[0].size == 0


def test_select_documents_misses_by_at_most_half_a_document():
    rng = np.random.default_rng(0)
    lengths = rng.integers(1, 200, 500)
    for target in rng.integers(1, 300_000, 50):
        picked, _ = select_documents(lengths, int(target))
        assert abs(int(lengths[picked].sum()) - int(target)) <= lengths.max() / 2 + 1


def test_phases_and_epoch_warnings():
    plans = plan_phases({"a": 1000, "b": 100}, {}, None, [("warmup", 500, {"a": 1, "b": 1}), ("main", 2000, {})])
    assert [p.name for p in plans] == ["warmup", "main"]
    assert plans[0].draws["b"].target_tokens == 250 and plans[1].draws["a"].target_tokens == 1818
    for p in plans:
        for d in p.draws.values():
            d.tokens = d.target_tokens
    warnings = epoch_warnings(plans, {"a": 1000, "b": 100}, max_epochs=3.0)  # a: 2.1 passes, b: 4.3
    assert len(warnings) == 1 and "'b' is repeated 4.3 times" in warnings[0]


def test_epoch_warnings_count_a_source_against_all_its_documents_whatever_the_first_phases_floor():
    """A first phase of long documents only (min_document_tokens) counts, per source, the tokens of those past its
    floor: the warning read its natural tokens from there, so a source with no long document (natural 0 there) was
    never warned of, and the others were measured against too small a figure. Worked by hand: "short" has 100
    natural tokens, none in documents of 50 or more, and is drawn 500 in "main" (5 passes, over 3); "long" has 1,000,
    of which 800 past the floor, and is drawn 40 + 1,500 = 1,540 (1.5 passes: no warning; against 800, 1.9)."""
    natural = {"long": 1000, "short": 100}
    plans = plan_phases(natural, {}, None, [("long", 40, {"long": 1, "short": 0}, {"long": 800, "short": 0}),
                                            ("main", 2000, {"long": 0.75, "short": 0.25})])
    for p in plans:
        for d in p.draws.values():
            d.tokens = d.target_tokens
    assert (plans[0].draws["long"].tokens, plans[1].draws["long"].tokens, plans[1].draws["short"].tokens) == \
        (40, 1500, 500)
    warnings = epoch_warnings(plans, natural, max_epochs=3.0)
    assert len(warnings) == 1 and "'short' is repeated 5.0 times" in warnings[0]


def test_a_phase_that_cannot_be_planned_names_its_key_and_its_length_floor():
    """A source with a weight and no documents long enough for a long-context phase: the error names the phase's
    key and the setting that emptied it, not only "check its upstream dataset" (which is not empty)."""
    with pytest.raises(MixtureError, match=r"^mixture\.phases\[1\] \('long', counting only its documents of at least "
                                           r"min_document_tokens tokens\): source 'short' has weight 1 but no tokens.*"
                                           r"or lower mixture\.phases\[1\]\.min_document_tokens$"):
        plan_phases({"long": 100, "short": 50}, {}, None,
                    [("warm", 50, {}, None), ("long", 40, {"long": 1, "short": 1}, {"long": 100, "short": 0})])
    with pytest.raises(MixtureError, match=r"^mixture\.phases\[0\] \('warm'\): every weight is 0"):
        plan_phases({"a": 100}, {}, None, [("warm", 50, {"a": 0})])
    with pytest.raises(MixtureError, match=r"^no source has any tokens"):  # no phases configured: no phase to name
        plan_phases({"a": 0}, {}, None, [])


def test_a_source_whose_every_document_fell_into_validation_names_val_fraction(built, tmp_path):
    """Three documents and val_fraction 0.9: all three hash into validation (by hand: is_validation of each id), so
    training has no tokens. The error says so, where it said to check that the upstream dataset is not empty."""
    from kiln.curation.documents import make_doc_id
    from kiln.tokens.shard_writer import is_validation

    tok_dir = built[0] / "tokenizer"
    src = write_source(tmp_path, "prose", make_texts("prose", 3))
    assert all(is_validation(make_doc_id("prose", str(i)), 0.9) for i in range(3))
    with pytest.raises(MixtureError, match=r"\['prose'\]: no training documents, every one fell into the validation "
                                           r"split \(shards.val_fraction 0.9\): lower shards.val_fraction"):
        write_token_shards([src], tok_dir, shard_settings(val_fraction=0.9), Mixture(), tmp_path / "out",
                           progress=False)


# ------------------------------------------------------------------------------------------------ fim

IDS = FimIds(prefix=4, suffix=5, middle=6, eos=2)


def test_fim_split_is_deterministic_and_keeps_every_character():
    text = "def add(a, b):\n    return a + b\n"
    cuts = [fim_split(text, f"doc{i}", seed=1, rate=1.0, spm_rate=0.5) for i in range(200)]
    assert all(c.prefix + c.middle + c.suffix == text for c in cuts)
    assert cuts == [fim_split(text, f"doc{i}", seed=1, rate=1.0, spm_rate=0.5) for i in range(200)]
    assert 60 < sum(c.mode == SPM for c in cuts) < 140
    assert fim_split(text, "x", 1, rate=0.0, spm_rate=0.5) is None and fim_split("", "x", 1, 1.0, 0.5) is None
    chosen = sum(fim_split(text, f"d{i}", 3, rate=0.3, spm_rate=0.5) is not None for i in range(2000))
    assert 500 < chosen < 700


def test_fim_token_layouts():
    psm = fim_tokens(FimSplit(PSM, "p", "m", "s"), [10, 11], [20], [30, 31], IDS)
    assert psm == [4, 10, 11, 5, 30, 31, 6, 20, 2]
    spm = fim_tokens(FimSplit(SPM, "p", "m", "s"), [10, 11], [20], [30, 31], IDS)
    assert spm == [4, 5, 30, 31, 6, 10, 11, 20, 2]
    assert unfim(psm, IDS) == (PSM, [10, 11], [20], [30, 31])
    assert unfim(spm, IDS) == (SPM, [], [10, 11, 20], [30, 31])


# ------------------------------------------------------------------------------------- documents → shards

@pytest.fixture(scope="module")
def built(tmp_path_factory):
    root = tmp_path_factory.mktemp("shards")
    sources = standard_sources(root)
    tok_dir = train_small_tokenizer(root, sources)
    result = write_token_shards(sources, tok_dir, shard_settings(), NATURAL, root / "out", progress=False)
    return root, sources, Tokenizer.load(tok_dir), result


def texts_by_id(sources) -> dict[str, tuple[str, str]]:
    import pyarrow.parquet as pq
    out = {}
    for s in sources:
        for part in s.parts:
            for row in pq.read_table(part, columns=["doc_id", "text"]).to_pylist():
                out[row["doc_id"]] = (s.name, row["text"])
    return out


def decoded_documents(out_dir: Path, result, tok: Tokenizer, split: str) -> list[list[int]]:
    docs = []
    for info in result.shards:
        if info.split == split:
            shard = open_shard(out_dir / info.path, expected_tokenizer_sha256=tok.sha256)
            docs += [shard.document(i).tolist() for i in range(shard.documents)]
    return docs


def restore(ids: list[int], tok: Tokenizer) -> str:
    """The original text of a shard document: plain, or FIM put back in order."""
    assert ids[-1] == tok.eos_id and tok.eos_id not in ids[:-1]
    if ids[0] != tok.fim_prefix_id:
        return tok.decode(ids[:-1])
    mode, prefix, middle, suffix = unfim(ids, FimIds(tok.fim_prefix_id, tok.fim_suffix_id, tok.fim_middle_id, tok.eos_id))
    return tok.decode(prefix) + tok.decode(middle) + tok.decode(suffix)


def test_documents_round_trip_exactly_through_shards(built):
    root, sources, tok, result = built
    originals = texts_by_id(sources)
    by_text = {text: doc_id for doc_id, (_, text) in originals.items()}
    train = [restore(d, tok) for d in decoded_documents(root / "out", result, tok, "train")]
    val = [restore(d, tok) for d in decoded_documents(root / "out", result, tok, "val")]
    # natural mixture: every document exactly once, whitespace, tabs, CRLF, "▁" and emoji intact
    assert Counter(train + val) == Counter(text for _, text in originals.values())
    assert set(train).isdisjoint(val)
    assert all(is_validation(by_text[t], 0.1) for t in val)
    assert not any(is_validation(by_text[t], 0.1) for t in train)
    assert 0.05 < len(val) / len(originals) < 0.16


def test_fim_documents_have_the_documented_layout(built):
    root, sources, tok, result = built
    code = {text for name, text in texts_by_id(sources).values() if name == "code"}
    fim_docs = [d for d in decoded_documents(root / "out", result, tok, "train") if d[0] == tok.fim_prefix_id]
    assert len(fim_docs) == result.sources["code"]["fim_documents"] > 20
    modes = Counter()
    for ids in fim_docs:
        assert ids.count(tok.fim_prefix_id) == ids.count(tok.fim_suffix_id) == ids.count(tok.fim_middle_id) == 1
        mode = "spm" if ids[1] == tok.fim_suffix_id else "psm"
        modes[mode] += 1
        if mode == "psm":  # <pre> prefix <suf> suffix <mid> middle <eos>
            s, m = ids.index(tok.fim_suffix_id), ids.index(tok.fim_middle_id)
            prefix, suffix, middle = tok.decode(ids[1:s]), tok.decode(ids[s + 1:m]), tok.decode(ids[m + 1:-1])
        else:  # <pre> <suf> suffix <mid> prefix middle <eos>
            m = ids.index(tok.fim_middle_id)
            suffix, prefix, middle = tok.decode(ids[2:m]), "", tok.decode(ids[m + 1:-1])
        assert prefix + middle + suffix in code
    assert modes["psm"] > 5 and modes["spm"] > 5
    assert result.sources["prose"]["fim_documents"] == 0  # FIM applies to code sources only


def test_result_counts_add_up(built):
    _, _, _, result = built
    stats = result.manifest_stats()
    json.dumps(stats)
    assert stats["tokenizer_sha256"] == result.tokenizer_sha256 and stats["dtype"] == "uint16"
    assert sum(s["train_tokens"] for s in result.sources.values()) == result.tokens("train")
    assert sum(s["val_tokens"] for s in result.sources.values()) == result.tokens("val")
    assert all(s["effective_epochs"] == 1.0 for s in result.sources.values())
    assert result.counts()["shards"] == len(result.shards) > 4
    sizes = [s.tokens for s in result.shards if s.split == "train"]
    assert all(t >= 2048 for t in sizes[:-1])  # ~tokens_per_shard each; documents are never split


def test_same_inputs_give_identical_shards_with_one_or_two_workers(built, tmp_path):
    root, sources, _, result = built
    again = write_token_shards(sources, root / "tokenizer", shard_settings(), NATURAL, tmp_path, ProcessPool(workers=2),
                               progress=False)
    assert [s.to_dict() for s in again.shards] == [s.to_dict() for s in result.shards]
    for s in result.shards:
        assert (tmp_path / s.path).read_bytes() == (root / "out" / s.path).read_bytes()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".")]  # scratch removed


def test_many_buckets_give_identical_shards_with_one_or_two_workers(built, tmp_path):
    """Buckets of 64 copies (about 16 for the training phase): the scatter and the bucket writes as process-pool
    tasks give the serial engine's bytes, lists included."""
    root, sources, _, _ = built
    serial, pool = (write_token_shards(sources, root / "tokenizer", shard_settings(), NATURAL, tmp_path / name, engine,
                                       progress=False, bucket_rows=64)
                    for name, engine in (("serial", SERIAL), ("pool", ProcessPool(workers=2))))
    assert len([s for s in serial.shards if s.split == "train"]) > 8
    assert [s.to_dict() for s in pool.shards] == [s.to_dict() for s in serial.shards]
    for path in [s.path for s in serial.shards] + ["members-00000.parquet", "positions-00000.parquet"]:
        assert (tmp_path / "pool" / path).read_bytes() == (tmp_path / "serial" / path).read_bytes(), path


def test_the_same_documents_in_parts_of_another_order_give_identical_shards(built, tmp_path):
    """Validation documents were once shuffled in the order of their parts (training ones in doc_id-hash order); now
    both are shuffled by a hash of each copy's doc_id, whatever their part. Listing a source's parts otherwise (a store that names them anew, an S3 listing) changed the validation
    shards, so evaluations on a prefix of them and sequence cut points moved."""
    root, sources, _, result = built
    assert all(len(s.parts) > 1 for s in sources)
    reordered = [SourceParts(s.name, s.domain, list(reversed(s.parts))) for s in sources]
    again = write_token_shards(reordered, root / "tokenizer", shard_settings(), NATURAL, tmp_path, progress=False)
    assert {s.split for s in result.shards} == {"train", "val"}
    for s in result.shards:
        assert (tmp_path / s.path).read_bytes() == (root / "out" / s.path).read_bytes(), s.path
    assert [s.to_dict() for s in again.shards] == [s.to_dict() for s in result.shards]


def _train_order(out_dir: Path, result) -> list[str]:
    """The training documents' doc_ids in the order the shards hold them (the position list, by shard and index)."""
    import pyarrow.parquet as pq
    rows = pq.read_table(out_dir / result.members.replace("members", "positions")).to_pylist()
    rank = {s.path: k for k, s in enumerate(result.shards) if s.split == "train"}
    return [r["doc_id"] for r in sorted((r for r in rows if r["shard"] in rank),
                                        key=lambda r: (rank[r["shard"]], r["index"]))]


def test_training_documents_are_shuffled_across_sources_and_parts_and_by_seed(built, tmp_path):
    root, sources, _, result = built
    order = _train_order(root / "out", result)
    listed = [doc_id for doc_id in texts_by_id(sources) if doc_id in set(order)]  # sources, parts, rows in order
    assert sorted(order) == sorted(listed)
    n = len(order)
    # Spearman's rho between the shard order and the listing order: about N(0, 1/sqrt(n)) for a uniform shuffle
    # (0.05 for these ~450 documents); sorted or by source it would be near 1.
    place = {d: k for k, d in enumerate(listed)}
    rho = np.corrcoef(np.arange(n), [place[d] for d in order])[0, 1]
    assert abs(rho) < 0.2, rho
    # Neighbours from different sources: 2 * sum over pairs of sources of p_i * p_j of all neighbours, for a shuffle.
    source = {d: s for d, (s, _) in texts_by_id(sources).items()}
    shares = Counter(source[d] for d in order)
    expected = (1 - sum((c / n) ** 2 for c in shares.values())) * (n - 1)
    changes = sum(source[a] != source[b] for a, b in zip(order, order[1:]))
    assert 0.8 * expected < changes < 1.2 * expected, (changes, expected)
    reseeded = write_token_shards(sources, root / "tokenizer", shard_settings(seed=8), NATURAL, tmp_path,
                                  progress=False)
    other = _train_order(tmp_path, reseeded)
    assert sorted(other) == sorted(order) and other != order
    rho = np.corrcoef([place[d] for d in order], [place[d] for d in other])[0, 1]
    assert abs(rho) < 0.2, rho


def test_mixture_weights_are_hit_within_one_percent(tmp_path):
    sources = [write_source(tmp_path, "big", make_texts("prose", 900, seed=3)),
               write_source(tmp_path, "small", make_texts("code", 150, seed=4), domain="code"),
               write_source(tmp_path, "mid", make_texts("unicode", 300, seed=5))]
    tok_dir = train_small_tokenizer(tmp_path, sources)
    weights = {"big": 0.2, "small": 0.5, "mid": 0.3}
    mixture = Mixture(weights=weights, token_budget=120_000, max_epochs_warning=3.0)
    result = write_token_shards(sources, tok_dir, shard_settings(fim={"rate": 0.0}), mixture, tmp_path / "out",
                                progress=False)
    tok = Tokenizer.load(tok_dir)
    source_of = {text: name for name, text in texts_by_id(sources).values()}
    tokens = Counter()
    for ids in decoded_documents(tmp_path / "out", result, tok, "train"):
        tokens[source_of[tok.decode(ids[:-1])]] += len(ids)
    total = sum(tokens.values())
    assert total == pytest.approx(120_000, rel=0.01)
    for name, w in weights.items():
        assert tokens[name] / total == pytest.approx(w, abs=0.01)
        assert result.phases[0]["sources"][name]["tokens"] == tokens[name]
    small = result.sources["small"]
    assert small["effective_epochs"] > 3 and any("'small' is repeated" in w for w in result.warnings)
    assert result.sources["big"]["effective_epochs"] < 1  # subsampled


def test_curriculum_phases_are_tagged_and_read_in_order(tmp_path, monkeypatch):
    sources = [write_source(tmp_path, "web", make_texts("prose", 300, seed=6)),
               write_source(tmp_path, "code", make_texts("code", 100, seed=7), domain="code")]
    tok_dir = train_small_tokenizer(tmp_path, sources)
    mixture = Mixture(phases=[Phase(name="broad", tokens=20_000, weights={"web": 0.9, "code": 0.1}),
                              Phase(name="anneal", tokens=8_000, weights={"web": 0.2, "code": 0.8})])
    writer = DatasetWriter(tmp_path / "store" / "token_shards" / "_all", "token_shards", None)
    result = write_token_shards(sources, tok_dir, shard_settings(tokens_per_shard=4096), mixture, writer,
                                progress=False)
    monkeypatch.setattr("kiln.common.storage.git_commit", lambda: None)  # no git in unit tests
    writer.commit(code_version="test", config={}, inputs={}, counts=result.counts(), stats=result.manifest_stats())
    shard_set = read_shard_set(tmp_path / "store" / "token_shards" / "_all")
    train = shard_set.split("train")
    assert [s.phase for s in train] == sorted([s.phase for s in train], key=["broad", "anneal"].index)
    assert {s.phase for s in train} == {"broad", "anneal"}
    assert shard_set.split("val")[0].phase == "val"
    assert [p["name"] for p in result.phases] == ["broad", "anneal"]
    for phase, budget, code_share in [(0, 20_000, 0.1), (1, 8_000, 0.8)]:
        p = result.phases[phase]
        assert p["tokens"] == pytest.approx(budget, rel=0.02)
        assert p["sources"]["code"]["share"] == pytest.approx(code_share, abs=0.02)
    files = json.loads((tmp_path / "store" / "token_shards" / "_all" / "_manifest.json").read_text())["files"]
    assert {f["role"] for f in files} == {"shard", "members", "positions", "composition"}
    assert len(files) == len(shard_set.shards) + 3


def test_a_long_context_phase_draws_the_long_documents_no_phase_drew_first(built, tmp_path):
    """A phase of long documents (min_document_tokens) started its own cycle through them: it drew the ones the phase
    before had drawn while long ones nobody had drawn waited (the audit's run: 34 of 34 picks repeats, 98 never
    drawn). Phases draw the least drawn documents they may first, from where the last one stopped."""
    import pyarrow.parquet as pq

    root, sources, _, _ = built
    floor = 60
    mixture = Mixture(phases=[Phase(name="a", tokens=6000, weights={"prose": 1, "code": 0, "unicode": 0}),
                              Phase(name="long", tokens=3000, weights={"prose": 1, "code": 0, "unicode": 0},
                                    min_document_tokens=floor)])
    result = write_token_shards(sources, root / "tokenizer", shard_settings(), mixture, tmp_path, progress=False)
    phase = {s.path: s.phase for s in result.shards}
    drawn: dict[str, list[str]] = {"a": [], "long": []}
    for row in pq.read_table(tmp_path / "positions-00000.parquet").to_pylist():
        if phase[row["shard"]] in drawn:
            drawn[phase[row["shard"]]].append(row["doc_id"])
    members = pq.read_table(tmp_path / "members-00000.parquet").to_pylist()
    long_docs = {m["doc_id"] for m in members if m["source"] == "prose" and m["split"] == "train"
                 and m["tokens"] >= floor}
    never_in_a = long_docs - set(drawn["a"])
    assert set(drawn["long"]) <= long_docs and len(drawn["long"]) <= len(never_in_a)
    assert not set(drawn["long"]) & set(drawn["a"])  # no repeat while an undrawn long document is left
    assert len(drawn["long"]) == len(set(drawn["long"])) > 0


def test_member_list_says_exactly_which_documents_the_shards_hold(built, tmp_path, monkeypatch):
    """Every input document once, with its split and how many copies of it the shards hold: repeated,
    subsampled (0 copies: left out by the mixture) and validation documents, checked against the shards."""
    import pyarrow.parquet as pq

    from kiln.common.manifest import sha256_file

    root, sources, tok, _ = built
    mixture = Mixture(weights={"prose": 0.2, "code": 0.3, "unicode": 0.5})
    writer = DatasetWriter(tmp_path / "token_shards" / "_all", "token_shards", None)
    result = write_token_shards(sources, root / "tokenizer", shard_settings(), mixture, writer, progress=False)
    monkeypatch.setattr("kiln.common.storage.git_commit", lambda: None)
    manifest = writer.commit(code_version="test", config={}, inputs={}, counts=result.counts(),
                             stats=result.manifest_stats())
    out = tmp_path / "token_shards" / "_all"
    [entry] = manifest.files_with_role("members")
    assert entry.path == result.members == manifest.stats["members"] and entry.sha256 == sha256_file(out / entry.path)
    members = pq.read_table(out / entry.path).to_pylist()
    originals = texts_by_id(sources)
    assert len(members) == entry.rows == len(originals) and {m["doc_id"] for m in members} == set(originals)
    for m in members:
        assert m["source"] == originals[m["doc_id"]][0]
        assert m["split"] == ("val" if is_validation(m["doc_id"], 0.1) else "train")
        assert m["copies"] == 1 if m["split"] == "val" else m["copies"] >= 0
        # As the data card counts them: no licence given, `meta.language` as written (tests/token_corpus.py).
        assert (m["license"], m["language"]) == ("unknown", {"prose": "en", "code": "python"}.get(m["source"]))
    assert {s["license_field"] for s in result.sources.values()} == {"license"}
    for name, s in result.sources.items():
        mine = [m for m in members if m["source"] == name]
        assert sum(m["copies"] * m["tokens"] for m in mine if m["split"] == "train") == s["train_tokens"]
        assert sum(m["tokens"] for m in mine if m["split"] == "val") == s["val_tokens"]
    [entry] = manifest.files_with_role("composition")
    assert entry.path == result.composition == manifest.stats["composition"] and "shard_sources" not in manifest.stats
    composition = pq.read_table(out / entry.path).to_pylist()
    for name, s in result.sources.items():
        assert sum(c["tokens"] for c in composition if c["source"] == name) == s["train_tokens"] + s["val_tokens"]
    train = {m["doc_id"]: m["copies"] for m in members if m["split"] == "train"}
    assert result.sources["prose"]["effective_epochs"] < 1 and result.sources["unicode"]["effective_epochs"] > 1
    assert any(train[d] == 0 for d in train if originals[d][0] == "prose")  # left out by the mixture
    assert any(train[d] >= 2 for d in train if originals[d][0] == "unicode")  # repeated
    # Exact: the shards hold each document as many times as its row says.
    decoded = Counter(restore(d, tok) for d in decoded_documents(out, result, tok, "train"))
    expected = Counter({originals[d][1]: c for d, c in train.items() if c})
    assert decoded == expected


def test_the_position_list_names_every_copy_and_both_lists_are_written_a_part_or_a_bucket_at_a_time(built, tmp_path,
                                                                                                    monkeypatch):
    """Each (shard, index) of the position list holds the document it names, every copy in every shard once; and
    no process makes either list whole in memory (docs/scale.md): the member list is written a part at a time and
    the position list a shuffle bucket at a time, so no table written has more rows than the largest input part or
    bucket. Buckets of 64 copies: several per phase, each sorted alone, and the phase's documents come out in the
    same order as from one bucket (the buckets split the shuffle-key range)."""
    import pyarrow.parquet as pq

    root, sources, tok, _ = built
    written = []
    write_table = pq.ParquetWriter.write_table

    def counting(self, table, *args, **kwargs):
        if table.schema in (MEMBERS_SCHEMA, POSITIONS_SCHEMA, COMPOSITION_SCHEMA):
            written.append((table.schema, table.num_rows))
        return write_table(self, table, *args, **kwargs)

    monkeypatch.setattr(pq.ParquetWriter, "write_table", counting)
    mixture = Mixture(weights={"prose": 0.2, "code": 0.3, "unicode": 0.5})  # repeats and leaves out documents
    result = write_token_shards(sources, root / "tokenizer", shard_settings(), mixture, tmp_path, progress=False,
                                bucket_rows=64)
    members = pq.read_table(tmp_path / "members-00000.parquet").to_pylist()
    positions = pq.read_table(tmp_path / "positions-00000.parquet").to_pylist()
    largest_part = max(pq.ParquetFile(p).metadata.num_rows for s in sources for p in s.parts)
    member_tables = [rows for schema, rows in written if schema == MEMBERS_SCHEMA]
    position_tables = [rows for schema, rows in written if schema == POSITIONS_SCHEMA]
    assert sum(member_tables) == len(members) and max(member_tables) <= largest_part
    assert len(member_tables) == sum(len(s.parts) for s in sources) > 1
    # ~588 training copies in 16 buckets and ~50 validation ones in 1: about 37 copies each, none of them all.
    assert sum(position_tables) == len(positions) and len(position_tables) > 10 and max(position_tables) <= 2 * 64
    originals = texts_by_id(sources)
    held = {(info.path, i): restore(open_shard(tmp_path / info.path).document(i).tolist(), tok)
            for info in result.shards for i in range(info.documents)}
    assert sorted((p["shard"], p["index"]) for p in positions) == sorted(held)  # every copy, once
    assert all(held[p["shard"], p["index"]] == originals[p["doc_id"]][1] for p in positions)
    copies = {m["doc_id"]: m["copies"] for m in members}
    assert Counter(p["doc_id"] for p in positions) == Counter({d: c for d, c in copies.items() if c})
    # The composition, a row per shard and source, against the shards themselves: each copy's source from the member
    # list, its tokens from the shard's document index; written a bucket at a time too, in shard order.
    source_of = {m["doc_id"]: m["source"] for m in members}
    split_of = {info.path: info.split for info in result.shards}
    shards = {info.path: open_shard(tmp_path / info.path) for info in result.shards}
    expected = Counter()
    for p in positions:
        key = (p["shard"], split_of[p["shard"]], source_of[p["doc_id"]])
        expected[key + ("documents",)] += 1
        expected[key + ("tokens",)] += len(shards[p["shard"]].document(p["index"]))
    composition = pq.read_table(tmp_path / result.composition).to_pylist()
    assert {(c["shard"], c["split"], c["source"], k): c[k] for c in composition for k in ("documents", "tokens")} \
        == dict(expected)
    assert len(composition) == len({(c["shard"], c["source"]) for c in composition})  # one row each
    order = [info.path for info in result.shards]
    assert [c["shard"] for c in composition] == sorted((c["shard"] for c in composition), key=order.index)
    composition_tables = [rows for schema, rows in written if schema == COMPOSITION_SCHEMA]
    assert sum(composition_tables) == len(composition) and len(composition_tables) == len(position_tables)
    one_bucket = write_token_shards(sources, root / "tokenizer", shard_settings(), mixture, tmp_path / "one",
                                    progress=False)
    assert _train_order(tmp_path / "one", one_bucket) == _train_order(tmp_path, result)
    assert len(result.shards) > len(one_bucket.shards)  # a shorter shard at the end of each bucket


def test_buckets_of_one_copy_many_of_them_empty_hold_the_documents_in_the_same_order(built, tmp_path):
    """Buckets sized for one copy: the power of two at or above the phase's copies, so many get none, and each of
    the others ends a shard. The shards hold the same documents in the same order as from one bucket."""
    root, sources, _, result = built
    tiny = write_token_shards(sources, root / "tokenizer", shard_settings(), NATURAL, tmp_path, progress=False,
                              bucket_rows=1)
    assert _train_order(tmp_path, tiny) == _train_order(root / "out", result)
    train = [s for s in tiny.shards if s.split == "train"]
    copies = result.documents("train")
    buckets = 1 << (copies - 1).bit_length()  # 512 for the 453 copies of this natural mixture
    assert sum(s.documents for s in train) == copies
    assert tiny.counts() == {**result.counts(), "shards": len(tiny.shards)}
    # Each nonempty bucket writes a shard (here one: a few short documents each), so fewer shards than buckets means
    # empty buckets were written too.
    assert len([s for s in result.shards if s.split == "train"]) < len(train) < buckets


def test_describe_and_read_shard_set_agree(tmp_path):
    infos = [ShardInfo("shard-00001.bin", "train", "b", 1, 10, 2), ShardInfo("shard-00000.bin", "train", "a", 0, 5, 1),
             ShardInfo("shard-00002.bin", "val", "val", 0, 3, 1)]
    stats = describe_shard_set(SHA_A, 500, 2, infos, seq_len=16)
    (tmp_path / "_manifest.json").write_text(json.dumps({"stats": stats}))
    shard_set = read_shard_set(tmp_path)
    assert [s.phase for s in shard_set.split("train")] == ["a", "b"] and shard_set.tokens("train") == 15
    with pytest.raises(ShardError, match="no 'test' shards"):
        shard_set.split("test")


# --------------------------------------------------------------------------------------------- config

def _config(**sections):
    from kiln.common.config import parse_config
    raw = {"sources": [{"name": n, "kind": "text", "path": "x", "license": "MIT", "domain": d, "profile": "p"}
                       for n, d in [("web", "web"), ("code", "code")]],
           "profiles": {"p": []}, **sections}
    return parse_config(raw)


@pytest.mark.parametrize("sections, message", [
    ({"mixture": {"weights": {"web": 1, "x": 1}}}, r"mixture.weights names unknown source 'x'; sources: \['web', 'code'\]"),
    ({"mixture": {"weights": {"web": 1}}}, r"mixture.weights gives no weight to source\(s\) \['code'\]"),
    ({"mixture": {"weights": {"web": 0, "code": 0}}}, "every weight is 0"),
    ({"mixture": {"weights": {"web": -1, "code": 1}}}, "must be finite and >= 0"),
    ({"mixture": {"phases": [{"name": "a", "tokens": 5, "weights": {"wbe": 1, "code": 1}}]}},
     r"mixture.phases\[0\].weights names unknown source 'wbe'"),
    ({"mixture": {"token_budget": 10, "phases": [{"name": "a", "tokens": 5}]}}, "set either mixture.token_budget"),
    ({"shards": {"fim": {"sources": ["cod"]}}}, "shards.fim.sources names unknown source 'cod'"),
    ({"tokenizer": {"vocab_size": 299}}, "greater than or equal to 300"),
    ({"tokenizer": {"model_type": "wordpiece"}}, "tokenizer.model_type"),
])
def test_config_errors_name_the_key_and_the_fix(sections, message):
    from kiln.common.config import ConfigError
    with pytest.raises(ConfigError, match=message):
        _config(**sections)


def test_config_defaults_and_a_full_mixture():
    cfg = _config(mixture={"weights": {"web": 0.7, "code": 0.3}, "phases": [{"name": "anneal", "tokens": 1000}]},
                  shards={"seq_len": 1024, "fim": {"rate": 0.9}})
    assert cfg.tokenizer.vocab_size == 8000 and cfg.tokenizer.normalization == "identity"
    assert cfg.mixture.phases[0].weights == {} and cfg.shards.fim.sources is None and cfg.shards.seq_len == 1024


def test_a_long_context_phase_holds_only_documents_that_fill_its_window(tmp_path, monkeypatch):
    """mixture.phases[*].min_document_tokens: the phase draws only documents at least that long (every document in
    its shards, read back from the shard offsets), and a loader reading that phase alone (training.phases) finds
    all its tokens in long documents; the other phase keeps the short ones."""
    from training_jobs.loader import ShardLoader

    sources = [write_source(tmp_path, "web", make_texts("prose", 300, seed=6)),
               write_source(tmp_path, "code", make_texts("code", 100, seed=7), domain="code")]
    tok_dir = train_small_tokenizer(tmp_path, sources)
    mixture = Mixture(phases=[Phase(name="main", tokens=20_000),
                              Phase(name="long", tokens=8_000, min_document_tokens=64)])
    writer = DatasetWriter(tmp_path / "store" / "token_shards" / "_all", "token_shards", None)
    result = write_token_shards(sources, tok_dir, shard_settings(tokens_per_shard=4096, fim=Fim(rate=0.0)), mixture,
                                writer, progress=False)
    monkeypatch.setattr("kiln.common.storage.git_commit", lambda: None)
    writer.commit(code_version="test", config={}, inputs={}, counts=result.counts(), stats=result.manifest_stats())
    folder = tmp_path / "store" / "token_shards" / "_all"
    shard_set = read_shard_set(folder)
    sizes = {phase: np.concatenate([np.diff(open_shard(folder / s.path).offsets.astype(np.int64))
                                    for s in shard_set.split("train") if s.phase == phase]) for phase in ("main", "long")}
    assert sizes["long"].min() >= 64 and (sizes["main"] < 64).any()
    assert result.phases[1]["min_document_tokens"] == 64 and result.phases[1]["tokens"] == pytest.approx(8_000, rel=0.05)
    long_only = ShardLoader(folder, "train", seq_len=64, batch_size=2, phases=["long"])
    assert [p.name for p in long_only.phases] == ["long"] and long_only.long_document_share(64) == 1.0
    everything = ShardLoader(folder, "train", seq_len=64, batch_size=2)
    assert everything.long_document_share(64) < 1.0
    with pytest.raises(ShardError, match=r"has no phase \['annealing'\] \(phases: \['long', 'main'\]\)"):
        ShardLoader(folder, "train", seq_len=64, batch_size=2, phases=["annealing"])
