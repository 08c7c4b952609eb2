"""The tokenizer: a weighted training sample, exact round trips (incl. "▁"), the card, the report."""

from __future__ import annotations

import hashlib
import json

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sentencepiece import sentencepiece_model_pb2

from kiln.common.config import TokenizerSettings
from kiln.tokens.tokenizer import (
    SPECIAL_TOKENS,
    Tokenizer,
    TokenizerCard,
    TokenizerError,
    draw_training_sample,
    sentence_chunks,
    tokenizer_report,
    train_tokenizer,
)
from tests.token_corpus import SMALL_TOKENIZER, UNICODE_BITS, make_texts, standard_sources, write_source


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("tokenizer")
    sources = standard_sources(root)
    sample = draw_training_sample(sources, {}, SMALL_TOKENIZER)
    card = train_tokenizer(sample, SMALL_TOKENIZER, root / "tok")
    return root, sources, sample, card, Tokenizer.load(root / "tok")


EDGE_CASES = [
    "", " ", "  ", "\n", "\n\n\n", "\t", "x", " leading", "trailing  ", "a  b", "a\u2581b", "\u2581", "\u2581\u2581",
    " \u2581 ", "\u2581leading", "trailing\u2581", "def f():\n    return 1\n\n\n\tif x:  \n\t\tpass\n",
    "line one\r\nline two\r\n", "😀 emoji 🚀🚀", "日本語と中文", "\x00\x01\x07\x1b[0m\x7f", "\u200b\ufeff",
    "<|endoftext|><|fim_prefix|><|fim_suffix|><|fim_middle|><s></s><pad><unk>", "12345678901234567890",
    "    " * 20 + "deep", "\\n is not a newline", "tab\there", "\u00a0non-breaking\u3000ideographic space",
]


@pytest.mark.parametrize("text", EDGE_CASES)
def test_round_trip_is_exact_on_edge_cases(corpus, text):
    tok = corpus[-1]
    assert tok.decode(tok.encode(text)) == text


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=200)
       | st.lists(st.sampled_from(UNICODE_BITS + [" ", "  ", "\n", "\t", "x", "def", "\u2581"]), max_size=40).map("".join))
def test_round_trip_is_exact_on_arbitrary_text(corpus, text):
    tok = corpus[-1]
    assert tok.decode(tok.encode(text)) == text


def test_batch_encoding_matches_single_encoding(corpus):
    tok = corpus[-1]
    texts = EDGE_CASES + make_texts("unicode", 30)
    assert tok.encode_batch(texts) == [tok.encode(t) for t in texts]
    assert tok.encode_batch(texts, num_threads=2) == [tok.encode(t) for t in texts]


def test_literal_special_token_text_never_becomes_a_special_token(corpus):
    tok = corpus[-1]
    ids = tok.encode("".join(SPECIAL_TOKENS.values()))
    assert min(ids) >= len(SPECIAL_TOKENS)


def test_special_ids_are_fixed_and_dtype_fits(corpus):
    tok = corpus[-1]
    assert (tok.pad_id, tok.bos_id, tok.eos_id, tok.unk_id) == (0, 1, 2, 3)
    assert (tok.fim_prefix_id, tok.fim_suffix_id, tok.fim_middle_id) == (4, 5, 6)
    assert tok.vocab_size == 500 and tok.dtype.name == "uint16"


def test_card_describes_the_model_it_sits_next_to(corpus):
    root, sources, sample, card, tok = corpus
    model = (root / "tok" / "tokenizer.model").read_bytes()
    assert card.sha256 == hashlib.sha256(model).hexdigest() == tok.sha256
    on_disk = TokenizerCard.read(root / "tok")
    assert on_disk == card
    assert on_disk.special_tokens["eos"] == {"piece": "<|endoftext|>", "id": 2}
    assert on_disk.settings["vocab_size"] == 500 and on_disk.vocab_size == 500
    assert set(on_disk.sample["by_source"]) == {"prose", "code", "unicode"}
    assert on_disk.sample["chars"] == sample.chars > 0
    vocab = (root / "tok" / "tokenizer.vocab").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == 500 and vocab[2].split("\t")[:2] == ["2", "<|endoftext|>"]
    assert not [p for p in (root / "tok").iterdir() if p.name.startswith(".")]  # no temp files left
    json.loads((root / "tok" / "tokenizer.json").read_text())


def test_training_is_deterministic(corpus, tmp_path):
    _, _, sample, card, _ = corpus
    assert train_tokenizer(sample, SMALL_TOKENIZER, tmp_path).sha256 == card.sha256


def test_the_model_file_does_not_depend_on_the_training_machine(corpus, tmp_path):
    """SentencePiece writes its trainer threads into the model (trainer_spec.num_threads), and num_threads 0 means
    one per core: the tokenizer's sha256, its identity in shards, runs and checkpoints, changed with the machine.
    The same sample and settings on 1 or 2 threads give the same bytes, and the file records no thread count."""
    _, _, sample, card, _ = corpus
    assert SMALL_TOKENIZER.num_threads == 1
    two = train_tokenizer(sample, SMALL_TOKENIZER.model_copy(update={"num_threads": 2}), tmp_path / "two")
    assert two.sha256 == card.sha256
    model = (tmp_path / "two" / "tokenizer.model").read_bytes()
    proto = sentencepiece_model_pb2.ModelProto.FromString(model)
    assert not proto.trainer_spec.HasField("num_threads")
    assert proto.trainer_spec.vocab_size == 500  # the rest of what it was trained with stays


def test_sample_follows_mixture_weights(tmp_path):
    big = write_source(tmp_path, "big", make_texts("prose", 400, seed=1))
    small = write_source(tmp_path, "small", make_texts("code", 40, seed=2))
    settings_ = TokenizerSettings(vocab_size=400, sample_chars=60_000)
    sample = draw_training_sample([big, small], {"big": 0.3, "small": 0.7}, settings_)
    shares = {n: s["share"] for n, s in sample.by_source.items()}
    assert shares["small"] == pytest.approx(0.7, abs=0.02)
    assert sample.chars == pytest.approx(60_000, rel=0.02)
    # small holds fewer characters than 70% of the sample: it is repeated, as training will repeat it
    assert sample.by_source["small"]["documents"] > sample.by_source["small"]["unique_documents"]
    again = draw_training_sample([big, small], {"big": 0.3, "small": 0.7}, settings_)
    assert [d.doc_id for d in again.documents["big"]] == [d.doc_id for d in sample.documents["big"]]


def test_sample_respects_the_document_cap(tmp_path):
    src = write_source(tmp_path, "p", make_texts("prose", 200))
    sample = draw_training_sample([src], {}, TokenizerSettings(sample_documents=25))
    assert sample.document_count == 25


def test_the_document_cap_holds_across_sources(tmp_path):
    """Three sources of equal weight and a cap of 10: each source's share is 3.33 documents, which was rounded up
    to 4 each (12 documents). The cap holds: 10 documents, as evenly spread as whole documents allow."""
    sources = [write_source(tmp_path, name, make_texts("prose", 60, seed=i)) for i, name in enumerate("abc")]
    sample = draw_training_sample(sources, {"a": 1, "b": 1, "c": 1}, TokenizerSettings(sample_documents=10))
    assert sample.document_count == 10
    assert sorted(s["documents"] for s in sample.by_source.values()) == [3, 3, 4]


def test_the_document_cap_keeps_the_weights_when_one_source_has_short_documents(tmp_path):
    """forum: 200 documents of exactly 100 characters; wiki: 200 of 1,000; weights 0.5 / 0.5; 100,000 characters
    and 110 documents at most. By characters each source gets 50,000: 500 forum documents (2.5 passes) and 50 wiki
    ones, 550 in all, five times the cap. Worked by hand: every source's characters shrink by 110 / 550 = 0.2, to
    10,000 each: 100 forum documents and 10 wiki ones. The cap was split by character shares (55 each), so forum
    stopped at 5,500 characters while wiki took 50,000: shares 0.099 / 0.901 for weights 0.5 / 0.5."""
    forum = write_source(tmp_path, "forum", [f"{i:04d} " + "x" * 95 for i in range(200)])
    wiki = write_source(tmp_path, "wiki", [f"{i:04d} " + "y" * 995 for i in range(200)])
    sample = draw_training_sample([forum, wiki], {"forum": 0.5, "wiki": 0.5},
                                  TokenizerSettings(sample_chars=100_000, sample_documents=110))
    got = {n: (s["documents"], s["chars"], s["share"]) for n, s in sample.by_source.items()}
    assert got == {"forum": (100, 10_000, 0.5), "wiki": (10, 10_000, 0.5)}
    assert sample.document_count == 110


def test_sentence_chunks_cut_at_line_ends_and_lose_nothing():
    text = "\n".join(f"line {i} " * (i % 7) for i in range(300))
    chunks = list(sentence_chunks(text, 100))
    assert "".join(chunks) == text
    assert all(len(c) <= 100 for c in chunks)
    assert sum(c.endswith("\n") for c in chunks) >= len(chunks) - 2
    assert list(sentence_chunks("x" * 250, 100)) == ["x" * 100, "x" * 100, "x" * 50]


def test_vocab_too_large_for_the_sample_fails_with_a_fix(tmp_path):
    src = write_source(tmp_path, "tiny", ["a b c a b c"] * 5)
    settings_ = TokenizerSettings(vocab_size=5000)
    with pytest.raises(TokenizerError, match="lower tokenizer.vocab_size"):
        train_tokenizer(draw_training_sample([src], {}, settings_), settings_, tmp_path / "tok")


def test_report_has_fertility_per_source_and_language(corpus):
    _, _, sample, _, tok = corpus
    report = tokenizer_report(tok, sample.documents)
    assert set(report["sources"]) == {"prose", "code", "unicode"}
    assert set(report["languages"]) == {"en", "python", "unknown"}
    prose = report["sources"]["prose"]
    assert 1 <= prose["fertility"] < 3 and prose["bytes_per_token"] > 1
    # CJK and emoji are rare in the sample: they fall back to bytes, prose does not
    assert report["sources"]["unicode"]["byte_fallback_share"] > prose["byte_fallback_share"]
    assert report["sources"]["prose"]["documents"] == sample.by_source["prose"]["unique_documents"]
    example = report["examples"][0]
    assert "".join(example["pieces"]).replace("\u2581", " ") .startswith(example["text"][:5].replace("\u2581", " "))
    json.dumps(report)


def test_sentinels_are_reserved_after_the_fixed_ids_and_leave_text_alone(corpus, tmp_path):
    """With tokenizer.sentinel_tokens the T5 sentinels take ids 7.. (control symbols: no text maps to them);
    round trips stay exact, a tokenizer without them is the same model as before (same bytes for the same
    sample), and one with them encodes text that spells them as ordinary pieces."""
    _, _, sample, card, plain = corpus
    with_sentinels = SMALL_TOKENIZER.model_copy(update={"sentinel_tokens": 5})
    card5 = train_tokenizer(sample, with_sentinels, tmp_path / "s")
    tok = Tokenizer.load(tmp_path / "s")
    assert {k: v["id"] for k, v in card5.special_tokens.items() if k.startswith("sentinel_")} == \
        {f"sentinel_{i}": 7 + i for i in range(5)}
    assert [tok.sp.id_to_piece(7 + i) for i in range(5)] == [f"<extra_id_{i}>" for i in range(5)]
    for text in EDGE_CASES + ["<extra_id_0> spelled out <extra_id_4>"]:
        ids = tok.encode(text)
        assert tok.decode(ids) == text and not set(ids) & set(range(7, 12))
    assert not any(k.startswith("sentinel_") for k in card.special_tokens)  # the default reserves none
    assert plain.sp.id_to_piece(7) != "<extra_id_0>"


def test_default_settings_round_trip_chinese_and_japanese_and_report_per_script(tmp_path):
    """Trained on real Chinese, Japanese and English text (translated manual pages) with the default character
    coverage and byte fallback, the tokenizer gives back every text exactly, characters it never saw included; the
    report has a row per script, with tokens per character for the scripts whose words are characters."""
    from tests.man_pages import man_pages
    from tests.token_corpus import write_source

    texts = {"zh": man_pages("zh_CN", 12), "ja": man_pages("ja", 12), "en": make_texts("prose", 60)}
    sources = [write_source(tmp_path, lang, t, language=lang) for lang, t in texts.items()]
    settings = TokenizerSettings(vocab_size=3000, sample_chars=400_000, num_threads=1)
    sample = draw_training_sample(sources, {}, settings)
    train_tokenizer(sample, settings, tmp_path / "tok")
    tok = Tokenizer.load(tmp_path / "tok")
    unseen = "龘靐齉 𠀋𪚥 ゟ"  # rare Han (one beyond the BMP) and a kana ligature: in no page, so byte fallback
    for text in [*texts["zh"][:3], *texts["ja"][:3], unseen]:
        assert tok.decode(tok.encode(text)) == text
    assert sum(p.startswith("<0x") for p in tok.pieces(tok.encode(unseen))) == 3 * 3 + 2 * 4 + 3  # UTF-8 bytes
    report = tokenizer_report(tok, sample.documents)
    assert {"Han", "Kana", "Latin"} <= set(report["scripts"])
    # Frequent characters have pieces of their own and merge: fewer tokens than characters.
    assert 0 < report["scripts"]["Han"]["tokens_per_char"] < 1 and 0 < report["scripts"]["Kana"]["tokens_per_char"] < 1


def test_a_document_a_removal_request_names_is_never_in_the_tokenizer_sample(tmp_path):
    """Older refreshes still hold what a request removed from the partitions filtered since: the sample (and so the
    tokenizer's training text and its stored examples) leaves those documents out, as token_shards does. The sample
    is otherwise the same draw: the other documents keep their hash order."""
    from kiln.curation.documents import make_doc_id
    from kiln.governance.forget import RemovalRequest

    secret = "Jane Roe asked us to remove this page about her home at 12 Elm Street"
    texts = [secret] + make_texts("prose", 30)
    src = write_source(tmp_path, "web", texts, rows_per_part=7)
    everything = draw_training_sample([src], {}, SMALL_TOKENIZER)
    assert secret in [d.text for d in everything.documents["web"]]  # drawn when nobody asked to remove it
    request = RemovalRequest("req-1", "2026-12-03", "doc_ids", [make_doc_id("web", "0")], "takedown")
    sample = draw_training_sample([src], {}, SMALL_TOKENIZER, [request])
    drawn = [d.text for d in sample.documents["web"]]
    assert secret not in drawn
    assert drawn == [d.text for d in everything.documents["web"] if d.text != secret]
    by_source = RemovalRequest("req-2", "2026-12-03", "source", "web", "all of it")
    from kiln.tokens.mixture import MixtureError

    with pytest.raises(MixtureError, match="no source has any tokens"):  # nothing left to draw from
        draw_training_sample([src], {}, SMALL_TOKENIZER, [by_source])
