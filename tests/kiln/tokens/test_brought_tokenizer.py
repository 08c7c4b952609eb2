"""`tokenizer.source: <file>`: a Hugging Face tokenizer.json and a SentencePiece model brought as they are, through
the tokenizer's card and reports and `write_token_shards`, checked against the libraries that made them."""

from __future__ import annotations

import hashlib

import pytest
import sentencepiece as spm

from kiln.common.config import ConfigError, Fim, TokenizerSettings, parse_config
from kiln.tokens.fim import FimIds
from kiln.tokens.shard_writer import write_token_shards
from kiln.tokens.tokenizer import (
    Tokenizer,
    TokenizerError,
    bring_tokenizer,
    draw_training_sample,
    round_trip_changes,
    tokenizer_report,
    train_tokenizer,
)
from tests.brought_tokenizers import (
    SP_FIM,
    build_dummy_prefix_sentencepiece,
    build_hf_tokenizer,
    build_prefix_space_hf,
    build_sentencepiece,
    reference_hf,
    restore,
    shard_documents,
    texts_of,
)
from tests.token_corpus import NATURAL, SMALL_TOKENIZER, shard_settings, standard_sources


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("brought")
    sources = standard_sources(root)
    texts = texts_of(sources)
    return root, sources, texts, build_hf_tokenizer(root / "theirs" / "tokenizer.json", texts), \
        build_sentencepiece(root / "theirs" / "spiece.model", texts)


def bring(path, out, sources, **settings):
    tok_settings = TokenizerSettings(source=str(path), **settings)
    return bring_tokenizer(draw_training_sample(sources, {}, tok_settings), tok_settings, out)


def test_a_tokenizer_json_is_kept_byte_for_byte_and_its_special_tokens_found(corpus, tmp_path):
    root, sources, texts, hf_file, _ = corpus
    card = bring(hf_file, tmp_path / "tok", sources)
    ref = reference_hf(hf_file)
    assert (tmp_path / "tok" / "hf_tokenizer.json").read_bytes() == hf_file.read_bytes()
    assert card.sha256 == hashlib.sha256(hf_file.read_bytes()).hexdigest()
    assert (card.kind, card.model_type, card.source) == ("tokenizers", "bpe", str(hf_file))
    assert card.vocab_size == ref.get_vocab_size(with_added_tokens=True) == 600 and card.dtype == "uint16"
    eos = ref.token_to_id("<|endoftext|>")
    assert card.special_tokens["eos"] == {"piece": "<|endoftext|>", "id": eos}
    assert card.special_tokens["pad"] == {"piece": "<pad>", "id": ref.token_to_id("<pad>")}
    assert card.special_tokens["bos"] == {"piece": "<|endoftext|>", "id": eos, "same_as": "eos"}  # GPT-2's way
    assert card.special_tokens["fim_middle"]["id"] == ref.token_to_id("<|fim_middle|>")
    assert "unk" not in card.special_tokens  # byte-level BPE has none
    assert "vocab_size" not in card.settings and card.settings["source"] == str(hf_file)
    # the vocabulary listing is the file's
    vocab = (tmp_path / "tok" / "tokenizer.vocab").read_text(encoding="utf-8").splitlines()
    assert len(vocab) == 600 and vocab[eos].split("\t")[:2] == [str(eos), "<|endoftext|>"]


def test_a_brought_tokenizer_encodes_as_its_library_does_and_keeps_literal_special_text(corpus, tmp_path):
    root, sources, texts, hf_file, _ = corpus
    bring(hf_file, tmp_path / "tok", sources)
    tok, ref = Tokenizer.load(tmp_path / "tok"), reference_hf(hf_file)
    for text in texts[:50] + ["", "  \t\n", "日本語と中文 😀", "\u2581x\u2581"]:
        assert tok.encode(text) == ref.encode(text, add_special_tokens=False).ids
        assert tok.decode(tok.encode(text)) == text
    assert len(tok.encode(texts[0])) > 16  # the file's truncation does not cut documents
    spelled = tok.encode("a <|endoftext|> b")
    assert tok.eos_id not in spelled and tok.decode(spelled) == "a <|endoftext|> b"


def test_reports_of_a_brought_tokenizer_are_the_trained_ones(corpus, tmp_path):
    """Same report function: fertility is tokens per whitespace word, counted here with the reference library."""
    root, sources, texts, hf_file, _ = corpus
    settings = TokenizerSettings(source=str(hf_file))
    sample = draw_training_sample(sources, {}, settings)
    bring_tokenizer(sample, settings, tmp_path / "tok")
    report = tokenizer_report(Tokenizer.load(tmp_path / "tok"), sample.documents)
    ref = reference_hf(hf_file)
    prose = {d.doc_id: d.text for d in sample.documents["prose"]}.values()
    tokens = sum(len(ref.encode(t, add_special_tokens=False).ids) for t in prose)
    words = sum(len(t.split()) for t in prose)
    assert report["sources"]["prose"]["fertility"] == round(tokens / words, 4)
    assert report["sources"]["prose"]["byte_fallback_share"] == 0  # byte-level BPE: no fallback pieces
    assert report["tokenizer_sha256"] == hashlib.sha256(hf_file.read_bytes()).hexdigest()


def test_tokenizer_json_through_token_shards(corpus, tmp_path):
    root, sources, texts, hf_file, _ = corpus
    bring(hf_file, tmp_path / "tok", sources)
    result = write_token_shards(sources, tmp_path / "tok", shard_settings(), NATURAL, tmp_path / "out",
                                progress=False)
    ref = reference_hf(hf_file)
    sha = hashlib.sha256(hf_file.read_bytes()).hexdigest()
    assert result.tokenizer_sha256 == sha and result.eos_id == ref.token_to_id("<|endoftext|>")
    fim = FimIds(*(ref.token_to_id(t) for t in ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>")),
                 ref.token_to_id("<|endoftext|>"))
    docs = shard_documents(tmp_path / "out", result.shards, sha)
    decode = lambda ids: ref.decode(ids, skip_special_tokens=False)  # noqa: E731
    # Natural mixture: every document once, in train or validation; FIM ones put back in order.
    assert sorted(restore(d, decode, fim) for d in docs) == sorted(texts)
    plain = [d for d in docs if d[0] != fim.prefix]
    fimmed = len(docs) - len(plain)
    assert 0 < fimmed < 120 and result.manifest_stats()["sources"]["code"]["fim_documents"] == fimmed
    expected = {tuple(ref.encode(t, add_special_tokens=False).ids + [fim.eos]) for t in texts}
    assert all(tuple(d) in expected for d in plain)


def test_sentencepiece_model_through_token_shards(corpus, tmp_path):
    root, sources, texts, _, sp_file = corpus
    card = bring(sp_file, tmp_path / "tok", sources)
    sp = spm.SentencePieceProcessor(model_file=str(sp_file))
    assert (tmp_path / "tok" / "tokenizer.model").read_bytes() == sp_file.read_bytes()
    assert card.sha256 == hashlib.sha256(sp_file.read_bytes()).hexdigest()
    assert (card.kind, card.model_type) == ("sentencepiece", "unigram")
    assert {k: v["id"] for k, v in card.special_tokens.items()} == {
        "unk": 0, "bos": 1, "eos": 2, "pad": 2,  # SentencePiece's defaults; no pad: eos stands in
        "fim_prefix": sp.piece_to_id("<fim_prefix>"), "fim_suffix": sp.piece_to_id("<fim_suffix>"),
        "fim_middle": sp.piece_to_id("<fim_middle>")}
    result = write_token_shards(sources, tmp_path / "tok", shard_settings(), NATURAL, tmp_path / "out",
                                progress=False)
    fim = FimIds(*(sp.piece_to_id(p) for p in ("<fim_prefix>", "<fim_suffix>", "<fim_middle>")), sp.eos_id())
    docs = shard_documents(tmp_path / "out", result.shards, card.sha256)
    assert sorted(restore(d, sp.decode, fim) for d in docs) == sorted(texts)
    # Text without "▁" (which Kiln writes as bytes so it survives) encodes as sentencepiece encodes it.
    expected = {tuple(sp.encode(t) + [sp.eos_id()]) for t in texts if "\u2581" not in t}
    plain = [d for d in docs if d[0] != fim.prefix and "\u2581" not in sp.decode(d[:-1])]
    assert len(plain) > 300 and all(tuple(d) in expected for d in plain)


def test_missing_special_tokens_fail_with_the_key_and_the_fix(corpus, tmp_path):
    root, sources, texts, _, _ = corpus
    no_eos = build_hf_tokenizer(tmp_path / "a" / "tokenizer.json", texts[:100], specials=["<mine>"], vocab_size=300)
    with pytest.raises(TokenizerError, match=r"tokenizer\.special_tokens\.eos.*add_special_tokens"):
        bring(no_eos, tmp_path / "t1", sources)
    card = bring(no_eos, tmp_path / "t2", sources, special_tokens={"eos": "<mine>"})
    assert card.special_tokens["eos"] == {"piece": "<mine>", "id": reference_hf(no_eos).token_to_id("<mine>")}
    # the card carries the configured name to every later reader (the shard writer's workers, evaluation)
    assert Tokenizer.load(tmp_path / "t2").eos_id == card.special_tokens["eos"]["id"]
    with pytest.raises(TokenizerError, match=r"tokenizer\.special_tokens\.eos = '<nope>' is not a token"):
        bring(no_eos, tmp_path / "t3", sources, special_tokens={"eos": "<nope>"})
    # No FIM symbols: FIM on code sources is refused before any work, FIM off is fine.
    with pytest.raises(TokenizerError, match=r"shards\.fim\.rate 0\.5 on \[.code.\]\) needs special tokens "
                                             r"fim_prefix.*or set shards\.fim\.rate: 0"):
        write_token_shards(sources, tmp_path / "t2", shard_settings(), NATURAL, tmp_path / "o1", progress=False)
    result = write_token_shards(sources, tmp_path / "t2", shard_settings(fim={"rate": 0}), NATURAL, tmp_path / "o2",
                                progress=False)
    assert result.eos_id == card.special_tokens["eos"]["id"]


def test_files_that_are_not_tokenizers_are_refused_naming_the_source(corpus, tmp_path):
    root, sources, _, _, _ = corpus
    kiln_dir = tmp_path / "kiln_tok"
    train_tokenizer(draw_training_sample(sources, {}, SMALL_TOKENIZER), SMALL_TOKENIZER, kiln_dir)
    with pytest.raises(TokenizerError, match="tokenizer.source = .* is a Kiln tokenizer card"):
        bring(kiln_dir / "tokenizer.json", tmp_path / "t", sources)
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"\x00not a model")
    with pytest.raises(TokenizerError, match="tokenizer.source = .* is not a SentencePiece model"):
        bring(junk, tmp_path / "t", sources)
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"model": {"type": "BPE"}}')
    with pytest.raises(TokenizerError, match="tokenizer.source = .* is not a Hugging Face tokenizers file"):
        bring(broken, tmp_path / "t", sources)


def test_a_trained_tokenizer_keeps_its_fixed_ids_through_the_interface(corpus, tmp_path):
    root, sources, _, _, _ = corpus
    card = train_tokenizer(draw_training_sample(sources, {}, SMALL_TOKENIZER), SMALL_TOKENIZER, tmp_path / "tok")
    tok = Tokenizer.load(tmp_path / "tok")
    assert (card.kind, card.source, tok.kind) == ("sentencepiece", "train", "sentencepiece")
    assert {k: v["id"] for k, v in card.special_tokens.items()} == {
        "pad": 0, "bos": 1, "eos": 2, "unk": 3, "fim_prefix": 4, "fim_suffix": 5, "fim_middle": 6}


def config_with(tokenizer: dict):
    return parse_config({"sources": [{"name": "web", "kind": "jsonl", "path": "x", "license": "CC0", "domain": "web",
                                      "profile": "none"}], "profiles": {"none": []}, "tokenizer": tokenizer})


def test_config_names_tokenizer_source_and_refuses_training_keys_with_a_file(corpus, tmp_path):
    _, _, _, hf_file, sp_file = corpus
    with pytest.raises(ConfigError, match=r"tokenizer\.source = .*no such file"):
        config_with({"source": str(tmp_path / "missing.json")})
    with pytest.raises(ConfigError, match=r"tokenizer\.source = .*neither \.json nor \.model"):
        config_with({"source": str(tmp_path)})
    with pytest.raises(ConfigError, match=r"tokenizer\.vocab_size, tokenizer\.sentinel_tokens only shape a "
                                          r"tokenizer trained here"):
        config_with({"source": str(hf_file), "vocab_size": 32000, "sentinel_tokens": 100})
    with pytest.raises(ConfigError, match=r"tokenizer\.special_tokens names the special tokens of a brought"):
        config_with({"special_tokens": {"eos": "</s>"}})
    with pytest.raises(ConfigError, match=r"tokenizer\.special_tokens\.eoss"):
        config_with({"source": str(hf_file), "special_tokens": {"eoss": "</s>"}})
    # keys at their defaults (as default.yaml writes them, or a dumped config holds them) say nothing and pass
    ok = config_with({"source": str(sp_file), "vocab_size": 8000, "model_type": "bpe", "sample_chars": 1000})
    assert ok.tokenizer.applicable() == {"source": str(sp_file), "special_tokens": {}, "sample_documents": 20000,
                                         "sample_chars": 1000, "seed": 0}
    assert parse_config(ok.model_dump(mode="json")).tokenizer == ok.tokenizer


def test_literal_sentinel_and_fim_symbols_of_a_brought_model_are_not_confused(corpus, tmp_path):
    """SentencePiece control symbols: text that spells them stays text, as with Kiln's own."""
    root, sources, _, _, sp_file = corpus
    bring(sp_file, tmp_path / "tok", sources)
    tok = Tokenizer.load(tmp_path / "tok")
    ids = tok.encode("".join(SP_FIM) + "</s>")
    assert not set(ids) & {tok.eos_id, tok.fim_prefix_id, tok.fim_middle_id, tok.fim_suffix_id}
    assert tok.decode(ids) == "".join(SP_FIM) + "</s>"


def test_text_spelling_a_special_token_stays_text_however_the_file_declares_it(corpus, tmp_path):
    """A file may declare Kiln's special tokens as SentencePiece user-defined symbols, or as added tokens not marked
    special (Qwen2.5's FIM tokens): both libraries then read a document that spells one as that token, so code quoting
    "<|fim_middle|>" or "<|endoftext|>" put sentinels and an EOS inside documents. Written as text now: no special
    id, and the text decodes back whole."""
    import io

    import tokenizers
    from tokenizers import AddedToken, decoders, models, pre_tokenizers, trainers

    _, _, texts, _, _ = corpus
    fim = ["<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts[:300]), model_writer=model, vocab_size=400,
                                   model_type="bpe", byte_fallback=True, user_defined_symbols=["<|endoftext|>", *fim],
                                   eos_id=-1, add_dummy_prefix=False, remove_extra_whitespaces=False,
                                   normalization_rule_name="identity", minloglevel=2, num_threads=1)
    (tmp_path / "userdef.model").write_bytes(model.getvalue())
    hf = tokenizers.Tokenizer(models.BPE())
    hf.pre_tokenizer, hf.decoder = pre_tokenizers.ByteLevel(add_prefix_space=False), decoders.ByteLevel()
    hf.train_from_iterator(texts[:300], trainers.BpeTrainer(vocab_size=600, special_tokens=["<|endoftext|>"],
                                                            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                                            show_progress=False))
    hf.add_tokens([AddedToken(t, special=False, normalized=False) for t in fim])
    hf.save(str(tmp_path / "qwenlike.json"))
    text = 'prompt = "<|fim_prefix|>" + pre + "<|fim_suffix|>" + suf + "<|fim_middle|>"  # then <|endoftext|> ▁x'
    own_reading = {"userdef.model": spm.SentencePieceProcessor(model_proto=model.getvalue()).encode,
                   "qwenlike.json": lambda t: hf.encode(t, add_special_tokens=False).ids}
    for path in (tmp_path / "userdef.model", tmp_path / "qwenlike.json"):
        tok = Tokenizer.load(path)
        special = {tok.eos_id, tok.fim_prefix_id, tok.fim_suffix_id, tok.fim_middle_id}
        assert own_reading[path.name]("<|fim_middle|>") == [tok.fim_middle_id], path.name  # the library's reading
        ids = tok.encode(text)
        assert not set(ids) & special and tok.decode(ids) == text, path.name
        assert tok.encode_batch([text, "plain text"]) == [ids, tok.encode("plain text")]


PREFIX_SPACE_KINDS = ("sentencepiece", "metaspace", "prepend")


def prefix_space_tokenizer(kind: str, root, texts):
    if kind == "sentencepiece":
        return build_dummy_prefix_sentencepiece(root / "dummy.model", texts)
    return build_prefix_space_hf(root / f"{kind}.json", texts, kind)


@pytest.mark.parametrize("kind", PREFIX_SPACE_KINDS)
def test_pieces_of_a_text_decode_to_it_with_a_tokenizer_that_prefixes_a_space(corpus, tmp_path, kind):
    """A tokenizer that puts "▁" before the start of every text it encodes (Llama 2's and Mistral's, as a .model or
    a tokenizer.json): FIM's middle and suffix, and text after a literal "▁", each gained a space ('the river town'
    cut after "the ri" and "ver to" came back 'the ri ver to wn'). Pieces after the first non-empty one are encoded
    as continuations now."""
    _, _, texts, _, _ = corpus
    tok = Tokenizer.load(prefix_space_tokenizer(kind, tmp_path, texts))
    assert tok.decode(tok.encode("the river town salt")) == "the river town salt"  # whole texts were exact already
    cases = [["the ri", "ver to", "wn salt"], ["", "river", " town "], ["", "", "salt"], ["x", "", " y"],
             ["if item", " > limit:", "\n\t\ttotal"]]
    if kind == "sentencepiece":  # (Metaspace "first" drops a text's own leading space, whole or in pieces)
        cases += [["    if item", " > limit:", " "], ["", "  two", " spaces"]]
    for pieces in cases:
        assert tok.decode(sum(tok.encode_pieces(pieces), [])) == "".join(pieces), pieces
    if kind == "sentencepiece":  # a literal "▁" is written as bytes; the text after it continues the text
        assert tok.decode(tok.encode("a\u2581b river")) == "a\u2581b river"


@pytest.mark.parametrize("kind", PREFIX_SPACE_KINDS)
def test_fim_documents_of_a_tokenizer_that_prefixes_a_space_decode_to_the_document(corpus, tmp_path, kind):
    root, sources, texts, _, _ = corpus
    path = prefix_space_tokenizer(kind, tmp_path, texts)
    card = bring(path, tmp_path / "tok", sources)
    tok = Tokenizer.load(tmp_path / "tok")
    result = write_token_shards(sources, tmp_path / "tok", shard_settings(fim=Fim(rate=1.0, spm_rate=0.5)), NATURAL,
                                tmp_path / "out", progress=False)
    fim = FimIds(tok.fim_prefix_id, tok.fim_suffix_id, tok.fim_middle_id, tok.eos_id)
    docs = shard_documents(tmp_path / "out", result.shards, card.sha256)
    assert result.manifest_stats()["sources"]["code"]["fim_documents"] > 80
    # Every document back as it was (a tokenizer.json of this kind reads a literal "▁" as a space, whole or in pieces)
    expected = texts if kind == "sentencepiece" else [t.replace("\u2581", " ") for t in texts]
    assert sorted(restore(d, tok.decode, fim) for d in docs) == sorted(expected)


def test_the_round_trip_check_cuts_documents_as_fim_does(corpus, tmp_path):
    """The tokenizer's check counts documents whose FIM pieces do not decode back, as well as whole ones: a
    tokenizer whose whole documents round-trip could still change every FIM middle."""
    root, sources, texts, _, _ = corpus
    docs = draw_training_sample(sources, {}, TokenizerSettings()).documents["code"]
    tok = Tokenizer.load(build_dummy_prefix_sentencepiece(tmp_path / "dummy.model", texts))
    assert round_trip_changes(tok, docs) == {"whole": [], "fim": []}

    class SpaceBeforeEveryPiece:  # what the tokenizer did before: a start-of-text space before every piece
        decode, encode = tok.decode, tok.encode

        def encode_pieces(self, pieces):
            return [tok.encode(p) for p in pieces]

    changed = round_trip_changes(SpaceBeforeEveryPiece(), docs)
    assert changed["whole"] == [] and len(changed["fim"]) > len(docs) // 2
