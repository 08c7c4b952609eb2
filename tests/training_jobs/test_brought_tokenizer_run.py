"""A training run on token shards made with a brought tokenizer (a `tokenizers` tokenizer.json, a SentencePiece
model): the run checks the file's sha256 against its config, learns, and its Hugging Face export carries the same
file byte for byte, which `transformers` reads back to the same ids."""

from __future__ import annotations

import hashlib
import json

import pytest

from kiln.common.config import TokenizerSettings
from kiln.tokens.shard_writer import write_token_shards
from kiln.tokens.tokenizer import Tokenizer, bring_tokenizer, draw_training_sample
from tests.brought_tokenizers import build_hf_tokenizer, build_sentencepiece, texts_of
from tests.token_corpus import NATURAL, shard_settings, standard_sources
from tests.training_jobs.conftest import SEQ, TokenDataset, check, launch, read_metrics, summary_of, write_run
from training_jobs.base import _tokenizer_of_hf

pytestmark = pytest.mark.slow


@pytest.mark.parametrize("kind", ["tokenizer.json", "spiece.model"])
def test_a_run_trains_on_shards_of_a_brought_tokenizer(kind, tmp_path):
    sources = standard_sources(tmp_path / "docs")
    texts = texts_of(sources)
    build = build_hf_tokenizer if kind == "tokenizer.json" else build_sentencepiece
    theirs = build(tmp_path / "theirs" / kind, texts)
    sha = hashlib.sha256(theirs.read_bytes()).hexdigest()
    settings = TokenizerSettings(source=str(theirs))
    bring_tokenizer(draw_training_sample(sources, {}, settings), settings, tmp_path / "tok")
    result = write_token_shards(sources, tmp_path / "tok", shard_settings(seq_len=SEQ, val_fraction=0.15), NATURAL,
                                tmp_path / "shards", progress=False)
    (tmp_path / "shards" / "_manifest.json").write_text(json.dumps({"stats": result.manifest_stats()}))
    data = TokenDataset(tmp_path / "shards", tmp_path / "tok", result.tokenizer_sha256, result.vocab_size)
    assert data.tokenizer_sha256 == sha

    out = tmp_path / "run"
    check(launch(write_run(tmp_path, data, out, max_steps=6, val_every_steps=6,
                           schedule=dict(total_steps=6), checkpoint=dict(every_steps=6)), launcher="python"))
    summary, metrics = summary_of(out), read_metrics(out)
    assert summary["status"] == "completed" and sorted(metrics) == list(range(1, 7))
    assert metrics[6]["train/loss"] < metrics[1]["train/loss"]  # it learns
    hf = out / "export" / "hf"
    copied = hf / ("tokenizer.json" if kind == "tokenizer.json" else "tokenizer.model")
    assert copied.read_bytes() == theirs.read_bytes() and _tokenizer_of_hf(hf) == sha
    config = json.loads((hf / "config.json").read_text())
    assert config["eos_token_id"] == result.eos_id and config["vocab_size"] >= result.vocab_size
    # Kiln's reader of the export folder (evaluation, the perplexity filter) finds the same tokenizer
    assert Tokenizer.load(hf).sha256 == sha and Tokenizer.load(hf).eos_id == result.eos_id

    if kind == "tokenizer.json":  # transformers loads the export's tokenizer and encodes as `tokenizers` does
        from transformers import AutoTokenizer

        auto = AutoTokenizer.from_pretrained(str(hf))
        assert auto.eos_token_id == result.eos_id
        assert auto(texts[0], add_special_tokens=False)["input_ids"] == Tokenizer.load(tmp_path / "tok").encode(texts[0])


def test_a_run_config_pointing_at_another_tokenizer_file_is_refused(tmp_path):
    """The run's own check (training_jobs.setup.check_tokenizer): the model file in tokenizer_dir must be the one
    the shards were made with. A refusal a restart cannot change (train.REFUSALS: Ray Train does not retry it)."""
    from training_jobs.settings import RunConfig
    from training_jobs.setup import check_tokenizer
    from training_jobs.train import REFUSALS

    sources = standard_sources(tmp_path / "docs", {"prose": 60, "code": 20, "unicode": 20})
    theirs = build_hf_tokenizer(tmp_path / "theirs" / "tokenizer.json", texts_of(sources), vocab_size=400)
    settings = TokenizerSettings(source=str(theirs))
    bring_tokenizer(draw_training_sample(sources, {}, settings), settings, tmp_path / "tok")
    run = RunConfig(dataset_dir=str(tmp_path), tokenizer_sha256=hashlib.sha256(theirs.read_bytes()).hexdigest(),
                    tokenizer_dir=str(tmp_path / "tok"), output_dir=str(tmp_path / "o"))
    check_tokenizer(run)  # the same file: fine
    with pytest.raises(REFUSALS, match="hf_tokenizer.json has sha256"):
        check_tokenizer(run.model_copy(update={"tokenizer_sha256": "0" * 64}))
