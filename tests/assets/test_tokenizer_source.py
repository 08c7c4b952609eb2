"""`tokenizer.source: <file>` through Dagster: the tokenizer asset keeps the brought file as it is, its sha256 is the
tokenizer's identity in the manifest, the token shards and the data card, and its reports and round-trip check are
the trained tokenizer's. The curated documents are committed in code (the stages before are tested elsewhere)."""

import hashlib

import pyarrow as pa

from kiln.common.storage import write_parquet_atomic
from kiln.curation.documents import DOCUMENT_SCHEMA, Document, make_doc_id
from kiln.governance.data_card import _tokenizer as card_tokenizer
from tests.assets.project import load_project
from tests.brought_tokenizers import build_hf_tokenizer, reference_hf, shard_documents
from tests.conftest import SERIAL_ENGINE, write_jsonl
from tests.token_corpus import make_texts

TEXTS = {"web": make_texts("prose", 80), "code": make_texts("code", 40)}


def brought_project(source: str, tmp_path, kiln_home, monkeypatch, **tokenizer):
    sources = []
    for name, domain in (("web", "web"), ("code", "code")):
        write_jsonl(tmp_path / name / "a.jsonl", [{"id": 0, "text": "unused"}])
        sources.append({"name": name, "kind": "jsonl", "path": str(tmp_path / name), "license": "CC0",
                        "domain": domain, "profile": "none"})
    config = {"sources": sources, "profiles": {"none": []}, "engine": SERIAL_ENGINE,
              "tokenizer": {"source": source, **tokenizer},
              "shards": {"seq_len": 16, "tokens_per_shard": 1024, "val_fraction": 0.2}}
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    for name, texts in TEXTS.items():  # what quality_filtered_documents would have committed
        with project.store.staging("quality_filtered_documents", project.partition(name)) as writer:
            rows = [Document(make_doc_id(name, str(i)), name, t, meta={"language": "en"}).to_row()
                    for i, t in enumerate(texts)]
            write_parquet_atomic(writer.next_path("documents"), pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA))
            writer.commit(code_version="t", config={}, inputs={}, counts={"documents": len(rows)})
    return project


def test_a_tokenizer_json_is_the_tokenizer_through_dagster(tmp_path, kiln_home, monkeypatch):
    theirs = build_hf_tokenizer(tmp_path / "theirs" / "tokenizer.json", [t for ts in TEXTS.values() for t in ts])
    sha = hashlib.sha256(theirs.read_bytes()).hexdigest()
    project = brought_project(str(theirs), tmp_path, kiln_home, monkeypatch)

    result = project.materialize(["tokenizer"])
    assert result.success
    [check] = result.get_asset_check_evaluations()
    assert check.check_name == "round_trip" and check.passed
    assert check.metadata["documents_checked"].value == 120  # natural proportions: every document once
    # and cut into FIM prefix, middle and suffix, encoded piece by piece, they decode back too
    assert check.metadata["documents_changed"].value == check.metadata["fim_documents_changed"].value == 0
    event = result.asset_materializations_for_node("tokenizer")[0].metadata
    assert event["sha256"].value == sha and event["source"].value == str(theirs)
    assert event["kind"].value == "tokenizers bpe" and event["vocab_size"].value == 600
    store = project.store
    tok = store.manifest("tokenizer")
    assert {f.path: f.sha256 for f in tok.files}["hf_tokenizer.json"] == sha
    assert tok.config["tokenizer"] == {"source": str(theirs), "special_tokens": {}, "sample_documents": 20000,
                                       "sample_chars": 20000000, "seed": 0}
    ref = reference_hf(theirs)
    words = sum(len(t.split()) for t in TEXTS["web"])
    tokens = sum(len(ref.encode(t, add_special_tokens=False).ids) for t in TEXTS["web"])
    assert tok.stats["report"]["sources"]["web"]["fertility"] == round(tokens / words, 4)

    assert project.materialize(["token_shards"]).success
    shards = store.manifest("token_shards", project.current())
    assert shards.stats["tokenizer_sha256"] == sha and shards.inputs["tokenizer"] == tok.data_version
    assert shards.stats["eos_id"] == ref.token_to_id("<|endoftext|>")
    from kiln.tokens.shard_format import read_shard_set
    shard_set = read_shard_set(store.dataset_dir("token_shards", project.current()))
    docs = shard_documents(shard_set.dir, shard_set.shards, sha)
    plain = [ref.decode(d[:-1], skip_special_tokens=False) for d in docs
             if d[0] != ref.token_to_id("<|fim_prefix|>")]
    assert set(plain) <= set(TEXTS["web"] + TEXTS["code"]) and set(TEXTS["web"]) <= set(plain)

    card = card_tokenizer(tok)
    assert (card["sha256"], card["source"], card["kind"]) == (sha, str(theirs), "tokenizers")


def test_a_brought_tokenizer_that_changes_text_warns_and_one_lacking_eos_fails(tmp_path, kiln_home, monkeypatch):
    """A SentencePiece model that collapses whitespace (as Llama 2's does): a warning with the count, not a block;
    one without an end-of-document token: the asset fails naming the key to set."""
    import io

    import sentencepiece as spm

    texts = [t for ts in TEXTS.values() for t in ts]
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=model, vocab_size=450,
                                   byte_fallback=True, num_threads=1, minloglevel=2)  # default: nmt_nfkc, collapse
    lossy = tmp_path / "lossy.model"
    lossy.write_bytes(model.getvalue())
    project = brought_project(str(lossy), tmp_path, kiln_home, monkeypatch)
    result = project.materialize(["tokenizer"])
    [check] = result.get_asset_check_evaluations()
    assert not check.passed and check.severity.value == "WARN"
    sp = spm.SentencePieceProcessor(model_file=str(lossy))
    changed = sum(sp.decode(sp.encode(t)) != t for t in texts)
    assert check.metadata["documents_changed"].value == changed > 0
    assert check.metadata["fim_documents_changed"].value > 0  # whitespace collapsed at the cuts as well

    no_eos = tmp_path / "no_eos.model"
    out = io.BytesIO()
    spm.SentencePieceTrainer.train(sentence_iterator=iter(texts), model_writer=out, vocab_size=450, eos_id=-1,
                                   byte_fallback=True, num_threads=1, minloglevel=2)
    no_eos.write_bytes(out.getvalue())
    project = brought_project(str(no_eos), tmp_path / "b", kiln_home / "b", monkeypatch)
    result = project.materialize(["tokenizer"], raise_on_error=False)
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert "tokenizer.special_tokens.eos" in failure.step_failure_data.error.message


def test_a_tokenizer_trained_with_a_lossy_setting_warns_and_the_shards_follow(tmp_path, kiln_home, monkeypatch):
    """`remove_extra_whitespaces: true` is a documented setting that gives exactness up: the round-trip check warns
    (counting what it changes) instead of failing the step, so token_shards in the same run is written."""
    project = brought_project("train", tmp_path, kiln_home, monkeypatch, vocab_size=400,
                              remove_extra_whitespaces=True)
    result = project.materialize(["token_shards", "tokenizer"], raise_on_error=False)  # one run, the refresh's
    [check] = [c for c in result.get_asset_check_evaluations() if c.check_name == "round_trip"]
    # the code texts hold runs of spaces (indentation): collapsed, so changed
    assert not check.passed and check.severity.value == "WARN"
    assert check.metadata["documents_changed"].value == 40  # every code text, no prose text
    assert result.success and project.store.manifest("token_shards", project.current()) is not None


def test_only_the_exact_training_settings_promise_an_exact_round_trip():
    from kiln.common.config import TokenizerSettings

    assert TokenizerSettings().exact
    for lossy in ({"normalization": "nfkc"}, {"add_dummy_prefix": True}, {"remove_extra_whitespaces": True},
                  {"byte_fallback": False}):
        assert not TokenizerSettings(**lossy).exact, lossy
