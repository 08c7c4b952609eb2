"""Exports from a state dict (no DeepSpeed here; the consolidated path runs in test_train_cpu.py): Kiln's
safetensors and Hugging Face Llama, whose logits must match Kiln's."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from training_jobs.export import load_model, save_hf, save_safetensors
from training_jobs.model import ModelConfig, Transformer

transformers = pytest.importorskip("transformers")

# A large init makes attention sharp, so a wrong RoPE layout or a swapped matrix shows in the logits.
BASE = dict(vocab_size=192, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden=160, max_seq_len=32,
            init_std=0.2)
CONFIGS = {
    "tied": ModelConfig(**BASE),
    "untied-gqa-theta": ModelConfig(**{**BASE, "tied_embeddings": False, "n_kv_heads": 2, "rope_theta": 500_000.0,
                                       "norm_eps": 1e-6}),
    # A long-context extension: a larger base and position interpolation, read at 4x the base's length.
    "long-context": ModelConfig(**{**BASE, "max_seq_len": 128, "rope_theta": 1_000_000.0, "rope_scaling_factor": 4.0}),
}


def hf_logits(path, tokens):
    model = transformers.AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_hf_export_logits_match(name, tmp_path, token_dataset):
    cfg = CONFIGS[name]
    model = Transformer(cfg, seed=7).eval()
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    with torch.no_grad():
        ours = model(tokens)
    out = save_hf(model.state_dict(), cfg, tmp_path / "hf", tokenizer_dir=token_dataset.tokenizer_dir)
    theirs = hf_logits(out, tokens)
    assert ours.abs().max() > 1.0  # logits with something to compare
    torch.testing.assert_close(theirs, ours, atol=1e-4, rtol=0)

    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"] and config["tie_word_embeddings"] == cfg.tied_embeddings
    assert (config["num_key_value_heads"], config["rope_theta"], config["rms_norm_eps"]) == \
        (cfg.n_kv_heads, cfg.rope_theta, cfg.norm_eps)
    assert config["max_position_embeddings"] == cfg.max_seq_len == tokens.shape[1]
    if cfg.rope_scaling_factor != 1.0:
        assert config["rope_scaling"] == {"rope_type": "linear", "factor": cfg.rope_scaling_factor}
    assert (config["bos_token_id"], config["eos_token_id"], config["pad_token_id"]) == (1, 2, 0)
    assert (out / "tokenizer.model").read_bytes() == (token_dataset.tokenizer_dir / "tokenizer.model").read_bytes()
    tok_config = json.loads((out / "tokenizer_config.json").read_text())
    assert tok_config["eos_token"] == "<|endoftext|>" and tok_config["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert tok_config["split_special_tokens"] is True
    # HF's tokenizer.json is built from the model (Kiln's card is kiln_tokenizer.json)
    assert json.loads((out / "tokenizer.json").read_text())["model"]["type"] == "BPE"


def test_the_exported_tokenizer_gives_the_ids_the_model_was_trained_on(tmp_path, token_dataset):
    """transformers' AutoTokenizer on the export folder (a second implementation: its own conversion of the
    SentencePiece model) gives Kiln's ids. It failed to load in Kiln's environment (sentencepiece 0.2.3's generated
    protobuf code needs a protobuf runtime Dagster does not allow), and once loaded prepended '▁' to every text,
    which Kiln's tokenizer (no dummy prefix) never does."""
    from kiln.tokens.tokenizer import Tokenizer

    out = save_hf(Transformer(CONFIGS["tied"], seed=7).state_dict(), CONFIGS["tied"], tmp_path / "hf",
                  tokenizer_dir=token_dataset.tokenizer_dir)
    kiln, hf = Tokenizer.load(token_dataset.tokenizer_dir), transformers.AutoTokenizer.from_pretrained(str(out))
    for text in ("Hello world, the items.", " leading space", "word\n\nnext paragraph\n", "café naïve 東京 🙂",
                 "def f(x):\n    return x  # two spaces"):
        assert hf(text, add_special_tokens=False)["input_ids"] == kiln.encode(text), text


# Text with the characters of special pieces (so the vocabularies have them; see docs/training.md's export section).
MARKUP = [f"<b>{i}</b> | a <i>box</i> || b -> c <br/>" for i in range(40)]


@pytest.fixture(scope="module")
def sentencepiece_tokenizers(tmp_path_factory):
    """SentencePiece BPE and unigram, trained by Kiln (identity normalization, no dummy prefix, whitespace kept) and
    brought (SentencePiece's own defaults: NFKC, a dummy prefix, extra whitespace removed), as tokenizer folders."""
    import io

    import sentencepiece as spm

    from kiln.common.config import TokenizerSettings
    from kiln.curation.documents import Document
    from kiln.tokens.tokenizer import TrainingSample, bring_tokenizer, train_tokenizer
    from tests.token_corpus import make_texts

    root = tmp_path_factory.mktemp("sentencepiece")
    texts = make_texts("prose", 200) + make_texts("code", 60) + make_texts("unicode", 60) + MARKUP
    docs = [Document(str(i), "s", t) for i, t in enumerate(texts)]
    sample = TrainingSample({"s": docs}, {"s": {"chars": sum(map(len, texts)), "documents": len(docs)}})
    folders = {}
    for model_type in ("bpe", "unigram"):
        folders["trained", model_type] = root / f"trained-{model_type}"
        train_tokenizer(sample, TokenizerSettings(vocab_size=500, model_type=model_type, num_threads=1),
                        folders["trained", model_type])
        model = io.BytesIO()
        spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, model_type=model_type,
                                       vocab_size=500, byte_fallback=True, num_threads=1, minloglevel=2)
        (root / f"{model_type}.model").write_bytes(model.getvalue())
        folders["brought", model_type] = root / f"brought-{model_type}"
        bring_tokenizer(sample, TokenizerSettings(source=str(root / f"{model_type}.model")),
                        folders["brought", model_type])
    return folders


@pytest.mark.parametrize("origin", ["trained", "brought"])
@pytest.mark.parametrize("model_type", ["bpe", "unigram"])
def test_the_exported_tokenizer_gives_kilns_ids_for_every_sentencepiece_model(origin, model_type, tmp_path,
                                                                               sentencepiece_tokenizers):
    """AutoTokenizer on the export gives the ids Kiln (sentencepiece itself) gives, for BPE and unigram, trained and
    brought. A unigram model was exported as a Llama tokenizer, which transformers 5 builds as BPE from the
    pieces: no merges, so every text came out as single characters; and it left out a brought model's NFKC and
    whitespace removal. Text that spells a special piece is text, as Kiln encodes it: the export read a document's
    '<|endoftext|>' as EOS and '<s>' as BOS. A literal '▁' is a known difference (docs/training.md)."""
    from kiln.tokens.tokenizer import Tokenizer
    from tests.token_corpus import make_texts

    folder = sentencepiece_tokenizers[origin, model_type]
    kiln = Tokenizer.load(folder)
    cfg = replace(CONFIGS["tied"], vocab_size=kiln.vocab_size)
    out = save_hf(Transformer(cfg, seed=7).state_dict(), cfg, tmp_path / "hf", tokenizer_dir=folder)
    hf = transformers.AutoTokenizer.from_pretrained(str(out))
    texts = [t for kind in ("prose", "code", "unicode") for t in make_texts(kind, 15, seed=1) if "\u2581" not in t]
    texts += ["", " ", "Hello world, the items.", " leading space", "trailing  ", "a  b\t\tc\n\n d",
              "café naïve 東京 🙂", "\x00\x07 \r\n", "x<|endoftext|>y and <s> or </s>",
              "<|fim_prefix|>a<pad><unk><0x41> <extra_id_0>"]
    for text in texts:
        ids = hf(text, add_special_tokens=False)["input_ids"]
        assert ids == kiln.encode(text), text
        assert hf.decode(ids) == kiln.decode(ids), text
    assert kiln.eos_id not in hf("x<|endoftext|>y", add_special_tokens=False)["input_ids"]  # a document's text


def test_the_long_context_check_sees_the_rope_settings(tmp_path):
    """The long-context match above depends on both settings: exported without the interpolation factor, or
    with the old base, HF's logits differ at the new length."""
    cfg = CONFIGS["long-context"]
    model = Transformer(cfg, seed=7).eval()
    tokens = torch.randint(0, cfg.vocab_size, (1, cfg.max_seq_len))
    with torch.no_grad():
        ours = model(tokens)
    for wrong in (replace(cfg, rope_scaling_factor=1.0), replace(cfg, rope_theta=10_000.0)):
        theirs = hf_logits(save_hf(model.state_dict(), wrong, tmp_path / str(wrong.rope_theta)), tokens)
        assert (theirs - ours).abs().max() > 1e-2


def test_a_wrong_rope_layout_would_be_caught(tmp_path):
    """The check above is sensitive: q/k rows permuted to the interleaved (Meta) layout break the match."""
    cfg = CONFIGS["tied"]
    model = Transformer(cfg, seed=7).eval()
    state = model.state_dict()
    hd = cfg.head_dim

    def interleave(w, heads):  # HF's convert_llama_weights_to_hf permute, reversed
        return w.view(heads, 2, hd // 2, cfg.d_model).transpose(1, 2).reshape(heads * hd, cfg.d_model)

    for i in range(cfg.n_layers):
        for name, heads in (("q_proj", cfg.n_heads), ("k_proj", cfg.n_kv_heads)):
            key = f"layers.{i}.self_attn.{name}.weight"
            state[key] = interleave(state[key], heads)
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len))
    with torch.no_grad():
        ours = model(tokens)
    theirs = hf_logits(save_hf(state, cfg, tmp_path / "hf"), tokens)
    assert (theirs - ours).abs().max() > 1e-2


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_safetensors_round_trip(name, tmp_path):
    cfg = CONFIGS[name]
    model = Transformer(cfg, seed=3)
    out = save_safetensors(model.state_dict(), cfg, tmp_path / "st", {"steps": 5})
    again = load_model(out)
    assert again.cfg == cfg
    for (k, a), b in zip(model.state_dict().items(), again.state_dict().values()):
        assert torch.equal(a, b), k
    assert json.loads((out / "model_config.json").read_text())["steps"] == 5


def test_an_export_made_again_leaves_the_published_links_as_they_were(tmp_path, token_dataset):
    """The checkpoint asset publishes an export by hard links; exporting again into the same run folder replaces
    each file (a new inode), so the published copy keeps the first export's bytes whole, never half of the second."""
    import os

    cfg = CONFIGS["tied"]
    state = Transformer(cfg, seed=3).state_dict()
    first = {"safetensors": save_safetensors(state, cfg, tmp_path / "run" / "st", {"steps": 5}),
             "hf": save_hf(state, cfg, tmp_path / "run" / "hf", tokenizer_dir=token_dataset.tokenizer_dir)}
    published = {}
    for fmt, folder in first.items():
        for path in folder.iterdir():
            link = tmp_path / "published" / fmt / path.name
            link.parent.mkdir(parents=True, exist_ok=True)
            os.link(path, link)
            published[link] = path.read_bytes()
    assert len(published) == 2 + 8  # model, config; model, config, generation, tokenizer model, json, card, 2 configs
    again = Transformer(cfg, seed=4).state_dict()
    save_safetensors(again, cfg, tmp_path / "run" / "st", {"steps": 9})
    save_hf(again, cfg, tmp_path / "run" / "hf", tokenizer_dir=token_dataset.tokenizer_dir)
    assert all(link.read_bytes() == data for link, data in published.items())
    assert json.loads((tmp_path / "run" / "st" / "model_config.json").read_text())["steps"] == 9
    assert json.loads((tmp_path / "published" / "safetensors" / "model_config.json").read_text())["steps"] == 5
    assert not [p for p in (tmp_path / "run").rglob(".*")]  # no temporary file left behind
