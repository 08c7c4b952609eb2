"""Model-based quality: the fastText classifier, reference-LM perplexity, and rules applied to stored scores."""

from __future__ import annotations

import random

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln import engine as engine_module
from kiln.common.config import ConfigError, QualityClassifier, QualityPerplexity, QualityRule, parse_config
from kiln.common.storage import Store, write_parquet_atomic
from kiln.curation.documents import DOCUMENT_SCHEMA, QUALITY_REJECTED_SCHEMA, SCORED_SCHEMA, Document
from kiln.engine import SERIAL, ProcessPool, RayEngine
from kiln.quality.classifier import (
    CARD_FILE,
    MODEL_FILE,
    SAMPLE_FILE,
    ClassifierCard,
    Example,
    QualityScorer,
    balanced_sample,
    cross_validation_metrics,
    fasttext_text,
    train_classifier,
)
from kiln.quality.perplexity import ReferenceModel
from kiln.quality.rules import (
    ABOVE_MAX_PERPLEXITY,
    BELOW_MIN,
    BOTTOM_FRACTION,
    decide,
    decile_rows,
    filter_parts,
    perplexity_buckets,
)
from kiln.quality.scoring import read_scores, score_parts
from tests.conftest import in_fresh_process
from tests.quality_corpus import junk_texts, labelled_split, reference_texts, train_reference_model, word_salad

# Quantizing 10,000 kept features adds ~4.5 s per fit; 2,000 keeps these tests quick and still quantizes.
SETTINGS = QualityClassifier(quantize_cutoff=2_000)


@pytest.fixture(scope="module")
def classifier(tmp_path_factory):
    train_pos, train_neg, test_pos, test_neg = labelled_split()
    out = tmp_path_factory.mktemp("classifier")
    card = train_classifier(train_pos, train_neg, SETTINGS, out)
    return out, card, test_pos, test_neg


def test_classifier_separates_reference_from_junk_it_never_saw(classifier):
    out, card, test_pos, test_neg = classifier
    scorer = QualityScorer.load(out)
    scores = np.concatenate([scorer.score([e.text for e in test_pos]), scorer.score([e.text for e in test_neg])])
    truth = np.array([True] * len(test_pos) + [False] * len(test_neg))
    metrics = cross_validation_metrics(truth, scores)
    print(f"\n[quality classifier] unseen documents: {metrics}")
    assert metrics["auc"] >= 0.98
    assert metrics["precision"] >= 0.95 and metrics["recall"] >= 0.95
    assert ((scores >= 0) & (scores <= 1)).all()
    # Cross-fitting measured the sample itself with out-of-fold scores.
    cv = card.cross_validation
    assert cv["auc"] >= 0.98 and cv["positives"] == cv["negatives"] == card.sample["positive"] > 0


def test_card_names_the_model_and_every_training_document(classifier):
    out, card, _, _ = classifier
    assert ClassifierCard.read(out) == card
    sample = pq.read_table(out / SAMPLE_FILE).to_pylist()
    assert len(sample) == sum(card.sample["per_source"].values()) == card.sample["positive"] + card.sample["negative"]
    assert card.sample["positive"] == card.sample["negative"]  # balanced
    assert {r["label"] for r in sample} == {"reference", "web"} and {r["fold"] for r in sample} == set(range(5))
    assert all(0 <= r["out_of_fold_score"] <= 1 for r in sample)


def test_sample_documents_get_their_out_of_fold_score(classifier):
    """The final model saw the sample; scoring its documents with it would flatter them (or, for the
    negatives of the source being filtered, condemn them)."""
    out, _, _, _ = classifier
    scorer = QualityScorer.load(out)
    row = pq.read_table(out / SAMPLE_FILE).to_pylist()[0]
    train_pos, train_neg, _, _ = labelled_split()
    text = next(e.text for e in train_pos + train_neg if e.doc_id == row["doc_id"])
    assert scorer.score([text], [row["doc_id"]])[0] == row["out_of_fold_score"]
    assert scorer.score([text], ["not-in-the-sample"])[0] == scorer.score([text])[0]


def test_single_thread_training_is_reproducible(classifier, tmp_path):
    out, card, _, _ = classifier
    train_pos, train_neg, _, _ = labelled_split()
    assert train_classifier(train_pos, train_neg, SETTINGS, tmp_path).sha256 == card.sha256


def test_parallel_fits_give_the_same_model_and_out_of_fold_scores(classifier, tmp_path):
    """The fits run as parallel engine tasks; two worker processes must give what one gave, bit for bit."""
    out, card, _, _ = classifier
    train_pos, train_neg, _, _ = labelled_split()
    parallel = train_classifier(train_pos, train_neg, SETTINGS, tmp_path, ProcessPool(2), progress=False)
    assert parallel.sha256 == card.sha256 and parallel.cross_validation == card.cross_validation
    assert pq.read_table(tmp_path / SAMPLE_FILE).equals(pq.read_table(out / SAMPLE_FILE))


def test_out_of_fold_scores_come_from_a_model_that_never_saw_the_fold(classifier, tmp_path):
    """Second implementation of one fold's fit: fastText trained directly on the other folds' lines, in the
    training order, then asked for P(reference) of fold 0's documents."""
    import fasttext

    from kiln.quality.classifier import NEGATIVE, POSITIVE
    from kiln.tokens.mixture import hash_unit

    out, _, _, _ = classifier
    settings = SETTINGS
    train_pos, train_neg, _, _ = labelled_split()
    texts = {e.doc_id: e.text for e in train_pos + train_neg}
    sample = sorted(pq.read_table(out / SAMPLE_FILE).to_pylist(),
                    key=lambda r: hash_unit("quality-order", settings.seed, r["doc_id"]))
    label = {"reference": POSITIVE, "web": NEGATIVE}
    path = tmp_path / "train.txt"
    path.write_text("".join(f"{label[r['label']]} {fasttext_text(texts[r['doc_id']], settings.max_words)}\n"
                            for r in sample if r["fold"] != 0), encoding="utf-8")
    model = fasttext.train_supervised(str(path), epoch=settings.epochs, lr=settings.lr, wordNgrams=settings.word_ngrams,
                                      dim=settings.dim, minCount=settings.min_count, thread=1, seed=settings.seed,
                                      verbose=0)
    model.quantize(cutoff=settings.quantize_cutoff)
    held_out = [r for r in sample if r["fold"] == 0]
    labels, probs = model.predict([fasttext_text(texts[r["doc_id"]], settings.max_words) for r in held_out], k=2)
    expected = [min(1.0, max(0.0, dict(zip(ls, ps)).get(POSITIVE, 0.0))) for ls, ps in zip(labels, probs)]
    assert [r["out_of_fold_score"] for r in held_out] == expected


def test_a_small_class_is_dealt_over_the_folds_so_no_sample_document_gets_a_score_from_a_model_that_saw_it(tmp_path):
    """Folds were doc_id hash % folds: r6, r10 and r13 all hash to fold 0 of 3, so with them as the only reference
    documents fold 0's model had no positive to train on and was not fitted; its documents kept no out-of-fold score
    and quality_scores gave them the final model's, which trained on them (and the cross-validation measured no
    positive at all). Each class is now dealt round-robin over the folds in hash order: by hand, 3 + 3 documents
    over 3 folds is one positive and one negative per fold, so every fold's model trains on both classes and every
    sample document has its out-of-fold score. A class of one document cannot be cross-fitted: refused."""
    from kiln.tokens.mixture import hash_unit

    assert [hash_unit("quality-fold", d) % 3 for d in ("r6", "r10", "r13")] == [0, 0, 0]  # the case, as it was
    refs, junk = reference_texts(), junk_texts(3, seed=1)
    pos = [Example(d, "ref", refs[i]) for i, d in enumerate(("r6", "r10", "r13"))]
    neg = [Example(f"w{i}", "web", t) for i, t in enumerate(junk)]
    settings = QualityClassifier(folds=3, quantize_cutoff=None, dim=8, epochs=5)
    card = train_classifier(pos, neg, settings, tmp_path, progress=False)
    sample = pq.read_table(tmp_path / SAMPLE_FILE).to_pylist()
    assert sorted((r["fold"], r["label"]) for r in sample) == [(f, label) for f in range(3)
                                                                for label in ("reference", "web")]
    assert all(r["out_of_fold_score"] is not None for r in sample)
    assert card.cross_validation["positives"] == card.cross_validation["negatives"] == 3
    scorer = QualityScorer.load(tmp_path)
    assert list(scorer.score([e.text for e in pos], [e.doc_id for e in pos])) == \
        [next(r["out_of_fold_score"] for r in sample if r["doc_id"] == e.doc_id) for e in pos]
    with pytest.raises(ValueError, match="at least two positive and two negative documents.*has 1"):
        train_classifier(pos[:1], neg, settings, tmp_path / "one", progress=False)


def test_the_shipped_model_is_quantized_and_small_unless_told_otherwise(classifier, tmp_path):
    """fastText's full supervised model is (2M hash buckets + vocabulary) x dim floats: 2M x 64 x 4 bytes is
    512 MB before any word. Quantized (10k features kept by default, 8-bit product codes) it is under 1 MB."""
    import fasttext

    out, _, _, _ = classifier
    assert fasttext.load_model(str(out / MODEL_FILE)).is_quantized()
    assert (out / MODEL_FILE).stat().st_size < 10 * 2**20
    train_pos, train_neg, _, _ = labelled_split()
    full = SETTINGS.model_copy(update={"quantize_cutoff": None, "dim": 8, "folds": 2})
    train_classifier(train_pos, train_neg, full, tmp_path, progress=False)
    assert not fasttext.load_model(str(tmp_path / MODEL_FILE)).is_quantized()
    assert (tmp_path / MODEL_FILE).stat().st_size >= 2_000_000 * 8 * 4  # every hash bucket's row, dim 8


def test_a_model_file_changed_after_training_is_refused(classifier, tmp_path):
    out, _, _, _ = classifier
    for name in (MODEL_FILE, CARD_FILE):
        (tmp_path / name).write_bytes((out / name).read_bytes())
    with open(tmp_path / MODEL_FILE, "ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError, match="does not match its card"):
        QualityScorer.load(tmp_path)


def test_fasttext_text_is_one_lowercase_line_capped_in_words():
    assert fasttext_text("Hello, World!\nSecond line\tend.", 100) == "hello , world ! second line end ."
    assert fasttext_text("a b c d e", 3) == "a b c"
    # a document quoting fastText's label prefix: one underscore less, so the line keeps its one label
    line = fasttext_text("Predict: __label__reference 0.9, see foo__label__x", 100)
    assert line == "predict : _label__reference 0 . 9 , see foo__label__x"
    assert [t for t in line.split() if t.startswith("__label__")] == []
    # Chinese has no spaces: each character is a unit (not the clause between two commas), so max_words bounds it;
    # a Devanagari word keeps its vowel signs and virama (combining marks `\w` alone splits at)
    assert fasttext_text("河流城镇，商人记录。", 100) == "河 流 城 镇 ， 商 人 记 录 。"
    # Weighed as Kiln weighs words (text_units): worked by hand, 3 words are 24 eighths; each Han character takes 5,
    # so four leave 4 and the comma (a word: 8) ends the line; 2 words (16) end at the 4th character. A Thai unit (a
    # letter with its marks: ข น ม ปั ง ...) takes 2 eighths, so 2 words are the first 8 units.
    assert fasttext_text("河流城镇，商人记录。", 3) == "河 流 城 镇 ，"
    assert fasttext_text("河流城镇，商人记录。", 2) == "河 流 城 镇"
    thai = fasttext_text("ขนมปังอร่อยมาก ขนมปังอร่อยมาก", 2).split()
    assert len(thai) == 8 and fasttext_text("ขนมปังอร่อยมาก ขนมปังอร่อยมาก", 100).split()[:8] == thai
    assert fasttext_text("नमस्ते दुनिया", 100) == "नमस्ते दुनिया"


def _train_reference(root):
    """The reference model of these tests: its own corpus, seed and torch thread (tests.quality_corpus)."""
    path, _ = train_reference_model(reference_texts()[::2], root, steps=250, seed=0)
    return path


@pytest.fixture(scope="module")
def reference_path(tmp_path_factory):
    return _train_reference(tmp_path_factory.mktemp("reference"))


@pytest.fixture(scope="module")
def reference(reference_path):
    return ReferenceModel.load(reference_path, device="cpu"), reference_texts()[1::2]


def test_in_domain_text_has_lower_perplexity_than_the_same_words_shuffled(reference):
    model, unseen = reference
    rng = random.Random(0)
    natural = model.perplexities(unseen)
    shuffled = model.perplexities([word_salad(t, rng) for t in unseen])
    print(f"\n[perplexity] median in-domain {np.median(natural):.1f}, shuffled {np.median(shuffled):.1f}, "
          f"in-domain lower for {(natural < shuffled).mean():.1%} of documents")
    # The bounds come from 24 reference models (train_reference_model seeds 0-23: other weights and batch orders,
    # as another torch or tokenizer version would give): median in-domain / median shuffled 0.752-0.893 (mean 0.803,
    # sd 0.032; this seed 0.814), in-domain lower for 86.5%-97.1% of the documents (mean 94.9%, sd 2.3%; this seed
    # 94.7%). Each bound lies beyond every seed and 3 sd; a model that learned only word frequencies (80 steps)
    # gives 0.99 and 70%.
    assert np.median(natural) < 0.92 * np.median(shuffled)
    assert (natural < shuffled).mean() >= 0.84


def test_the_reference_model_is_the_same_whatever_ran_before(reference_path, tmp_path):
    """The fixture again in this process after disturbing what earlier tests leave behind: the global RNGs, torch's
    thread count, and a patched standard-library function (an import in the suite replaces inspect.isgenerator,
    whose docstring was in the corpus: the medians above were 44.7 / 52.1 after the whole suite, 41.2 / 50.7
    alone). The same weights, bit for bit, and the same perplexities."""
    import inspect

    import torch

    first = ReferenceModel.load(reference_path, device="cpu")
    threads, isgenerator = torch.get_num_threads(), inspect.isgenerator
    try:
        torch.manual_seed(1234)
        np.random.seed(99)
        random.seed(7)
        torch.set_num_threads(1 if threads > 1 else 2)
        inspect.isgenerator = lambda obj: isgenerator(obj)  # a wrapper without a docstring, as that import's
        again = ReferenceModel.load(_train_reference(tmp_path), device="cpu")
    finally:
        torch.set_num_threads(threads)
        inspect.isgenerator = isgenerator
    assert again.model_sha256 == first.model_sha256
    texts = reference_texts()[1::2]
    np.testing.assert_array_equal(again.perplexities(texts), first.perplexities(texts))


def test_perplexity_does_not_depend_on_batching_or_padding(reference):
    model, unseen = reference
    texts = unseen[:12] + ["", "x"]
    one = model.perplexities(texts, max_tokens=96, batch_size=1)
    many = model.perplexities(texts, max_tokens=96, batch_size=7)
    assert np.isnan(one[12]) and np.isnan(many[12])  # no tokens, no perplexity
    np.testing.assert_allclose(np.delete(one, 12), np.delete(many, 12), rtol=1e-4)


def test_reference_model_path_errors_name_the_fix(tmp_path):
    with pytest.raises(FileNotFoundError, match="is not a Kiln checkpoint: missing .*model.safetensors"):
        ReferenceModel.load(tmp_path)


def test_rules_keep_or_drop_with_the_first_failed_rule_as_reason():
    ids = [f"d{i}" for i in range(10)]
    scores = np.array([0.9, 0.1, 0.5, 0.7, 0.3, 0.95, 0.2, 0.6, 0.8, np.nan])
    ppl = np.array([10, 20, 30, 40, 50, 60, 70, 80, 90, 100], dtype=float)
    d = decide(ids, scores, ppl, QualityRule(min_score=0.25, keep_top_fraction=0.5, max_perplexity=75))
    assert d.removed[1] == BELOW_MIN and d.removed[6] == BELOW_MIN and d.removed[9] == BELOW_MIN  # NaN fails too
    kept = d.keep_mask(10)
    # Top half by score: 0.95, 0.9, 0.8, 0.7, 0.6; of those, perplexity 80 and 90 are above 75.
    assert sorted(np.flatnonzero(kept)) == [0, 3, 5]
    assert d.removed[7] == ABOVE_MAX_PERPLEXITY and d.removed[8] == ABOVE_MAX_PERPLEXITY
    assert d.removed[2] == BOTTOM_FRACTION and d.removed[4] == BOTTOM_FRACTION
    assert d.cutoffs["top_fraction_min_score"] == 0.6


def test_top_fraction_keeps_exactly_its_share_even_with_ties():
    ids = [f"d{i}" for i in range(100)]
    d = decide(ids, np.full(100, 0.5), np.full(100, np.nan), QualityRule(keep_top_fraction=0.3))
    assert d.keep_mask(100).sum() == 30
    # 7% of 100 is 7, though 0.07 * 100 is 7.000000000000001 in binary floating point (ceil of it: 8)
    for fraction, kept in ((0.07, 7), (0.29, 29), (0.57, 57), (0.071, 8)):
        assert decide(ids, np.full(100, 0.5), np.full(100, np.nan),
                      QualityRule(keep_top_fraction=fraction)).keep_mask(100).sum() == kept, fraction
    again = decide(list(reversed(ids)), np.full(100, 0.5), np.full(100, np.nan), QualityRule(keep_top_fraction=0.3))
    assert {ids[i] for i in np.flatnonzero(d.keep_mask(100))} == \
        {list(reversed(ids))[i] for i in np.flatnonzero(again.keep_mask(100))}


def test_a_rule_on_scores_that_were_never_made_is_refused_not_applied():
    """Scores all missing (made while the classifier was off) judged by `min_score` dropped every document; a
    perplexity rule on perplexities never computed dropped them all as the tail. Both name what to materialize."""
    from kiln.quality.rules import RuleError

    ids, none = ["a", "b"], np.full(2, np.nan)
    for rule, message in ((QualityRule(min_score=0.5), "needs scores.*made without quality_classifier"),
                          (QualityRule(keep_top_fraction=0.5), "needs scores"),
                          (QualityRule(perplexity_buckets=["head"]), "needs perplexities.*without a reference model.*quality.perplexity.model")):
        with pytest.raises(RuleError, match=message):
            decide(ids, none, none, rule)
    assert decide(ids, np.array([0.9, np.nan]), none, QualityRule(min_score=0.5)).removed == {1: BELOW_MIN}


def test_whole_source_rules_cut_among_every_refresh_so_far():
    """A later refresh of 3 low-scoring documents kept all 3 under a 90% top fraction (ceil(0.9 * 3) = 3), while
    among the source's 103 documents they are the bottom. Worked by hand: earlier scores 0.01..1.00 (100 documents),
    these 0.001-0.003; keep ceil(0.9 * 103) = 93, so the bottom 10 are these 3 and the earlier 0.01..0.07. The
    buckets' edges are the quantiles of all 103 perplexities: these three at 5000 are the tail, not the head."""
    earlier = ([f"e{i}" for i in range(100)], np.arange(1, 101) / 100, np.arange(1, 101, dtype=float))
    ids, scores, ppl = ["a", "b", "c"], np.array([0.001, 0.002, 0.003]), np.full(3, 5000.0)
    alone = decide(ids, scores, ppl, QualityRule(keep_top_fraction=0.9))
    assert alone.removed == {}  # the refresh alone: every document kept
    d = decide(ids, scores, ppl, QualityRule(keep_top_fraction=0.9), earlier)
    assert d.removed == {0: BOTTOM_FRACTION, 1: BOTTOM_FRACTION, 2: BOTTOM_FRACTION}
    assert d.cutoffs["top_fraction_min_score"] == 0.08
    buckets = decide(ids, scores, ppl, QualityRule(perplexity_buckets=["head", "middle"]), earlier)
    assert list(buckets.buckets) == ["tail"] * 3 and len(buckets.removed) == 3
    assert decide(ids, scores, ppl, QualityRule(perplexity_buckets=["head"])).removed == {}  # alone: all "head"


def test_ccnet_buckets_split_at_the_sources_own_quantiles():
    ppl = np.arange(1, 101, dtype=float)
    buckets, edges = perplexity_buckets(ppl, (0.3, 0.6))
    assert [int((buckets == b).sum()) for b in ("head", "middle", "tail")] == [30, 30, 40]
    d = decide([str(i) for i in range(100)], np.full(100, np.nan), ppl, QualityRule(perplexity_buckets=["head"]))
    assert d.keep_mask(100).sum() == 30 and set(d.removed.values()) == {"perplexity_middle", "perplexity_tail"}
    assert d.cutoffs["bucket_edges"] == edges


def test_decile_rows_pick_one_document_per_decile_in_order():
    values = np.array([5.0, np.nan, *range(100)])
    picks = decile_rows(values)
    assert [d for d, _ in picks] == list(range(1, 11))
    picked = [values[row] for _, row in picks]
    assert picked == sorted(picked) and not any(np.isnan(picked))


def _documents(tmp_path, texts, per_part=None):
    rows = [Document(f"doc-{i}", "web", t, license="MIT").to_row() for i, t in enumerate(texts)]
    per_part = per_part or len(rows)
    paths = [tmp_path / f"part-{i:05d}.parquet" for i in range(0, len(rows), per_part)]
    for path, start in zip(paths, range(0, len(rows), per_part)):
        write_parquet_atomic(path, pa.Table.from_pylist(rows[start:start + per_part], schema=DOCUMENT_SCHEMA))
    return paths


def test_thresholds_apply_to_stored_scores_without_scoring_again(classifier, tmp_path):
    out, _, test_pos, test_neg = classifier
    texts = [e.text for e in test_pos[:30]] + [e.text for e in test_neg[:30]]
    store = Store(tmp_path / "store")
    with store.staging("scores", "web") as writer:
        counts = score_parts(parts := _documents(tmp_path, texts), [writer.next_path("documents") for _ in parts],
                             out, progress=False)
        writer.commit(code_version="t", config={}, inputs={}, counts=counts)
    assert counts == {"documents": 60, "scored": 60, "perplexity_scored": 0}
    scored = store.read_table("scores", "web")
    assert scored.schema.equals(SCORED_SCHEMA) and scored.column("perplexity").null_count == 60

    ids, scores, ppl = read_scores(store.files("scores", "web", "documents"))
    kept_by_threshold = {}
    for threshold in (0.5, 0.99999):
        decision = decide(ids, scores, ppl, QualityRule(min_score=threshold))
        with store.staging("filtered", "web") as writer:
            stats = filter_parts(store.files("scores", "web", "documents"), ids, decision, writer)
            writer.commit(code_version="t", config={}, inputs={}, counts={})
        kept, rejected = store.read_table("filtered", "web"), store.read_table("filtered", "web", "rejected")
        assert kept.num_rows + rejected.num_rows == 60 == stats.docs_in
        assert rejected.schema.equals(QUALITY_REJECTED_SCHEMA)
        assert set(rejected.column("reason").to_pylist()) == {BELOW_MIN}
        assert all(s < threshold for s in rejected.column("quality_score").to_pylist())
        assert all(s >= threshold for s in kept.column("quality_score").to_pylist())
        kept_by_threshold[threshold] = kept.num_rows
    assert kept_by_threshold[0.5] == 30  # the reference half
    assert kept_by_threshold[0.99999] < kept_by_threshold[0.5]


@pytest.mark.parametrize("engine", [ProcessPool(workers=2), RayEngine(workers=2)], ids=["pool-2", "ray-2"])
def test_scoring_writes_the_same_bytes_on_every_engine(classifier, reference_path, engine, tmp_path):
    """Scores (classifier and reference-LM perplexity on CPU) are engine tasks, one per part: workers load each
    model themselves, and the parts they write equal those this process writes, byte for byte."""
    out, _, test_pos, test_neg = classifier
    texts = [e.text for e in test_pos[:20]] + [e.text for e in test_neg[:20]] + [""]
    parts = _documents(tmp_path, texts, per_part=7)
    perplexity = QualityPerplexity(model=str(reference_path), max_tokens=64, batch_size=4, device="cpu")
    written = {}
    for name, runner in (("serial", SERIAL), ("engine", engine)):
        outputs = [tmp_path / name / p.name for p in parts]
        outputs[0].parent.mkdir()
        counts = score_parts(parts, outputs, out, perplexity, runner, progress=False)
        assert counts == {"documents": 41, "scored": 41, "perplexity_scored": 40}  # "" has no tokens
        written[name] = [p.read_bytes() for p in outputs]
    assert len(written["engine"]) == 6 and written["engine"] == written["serial"]
    scored = pq.read_table(tmp_path / "serial").to_pylist()
    assert [r["doc_id"] for r in scored] == [f"doc-{i}" for i in range(41)]  # every part in its input order
    expected = ReferenceModel.load(reference_path, "cpu").perplexities(texts, max_tokens=64, batch_size=4)
    np.testing.assert_allclose([r["perplexity"] for r in scored[:40]], expected[:40], rtol=1e-4)
    if isinstance(engine, RayEngine):
        engine_module.shutdown()  # the embedded Ray this test started


BASE = {"sources": [{"name": "ref", "kind": "jsonl", "path": "r.jsonl", "license": "x", "domain": "reference",
                     "profile": "p"},
                    {"name": "web", "kind": "jsonl", "path": "w.jsonl", "license": "x", "domain": "web", "profile": "p"},
                    {"name": "code", "kind": "jsonl", "path": "c.jsonl", "license": "x", "domain": "code",
                     "profile": "p"}],
        "profiles": {"p": ["code_quality"]}}


@pytest.mark.parametrize("quality, message", [
    ({"rules": {"nope": {"min_score": 0.5}}}, "quality.rules names unknown source 'nope'"),
    ({"rules": {"web": {"max_perplexity": 100}}}, "quality.perplexity.model is not set"),
    ({"classifier": {"positive_sources": ["web"], "negative_sources": ["web"]}}, "both positive and negative"),
    ({"classifier": {"enabled": True, "negative_sources": []}}, "needs positive and negative sources"),
    ({"classifier": {"enabled": False}, "rules": {"web": {"keep_top_fraction": 0.5}}}, "the classifier is off"),
    ({"rules": {"web": {"perplexity_buckets": ["head"], "bucket_quantiles": [0.6, 0.3]}}}, "bucket_quantiles"),
    ({"classifier": {"dim": 4}}, r"quality.classifier.dim.*fastText trains unreproducibly below 8"),
])
def test_bad_quality_config_names_the_key_and_the_fix(quality, message):
    with pytest.raises(ConfigError, match=message):
        parse_config({**BASE, "quality": quality})


def test_classifier_classes_default_to_reference_and_web_domains():
    config = parse_config(BASE)
    assert config.quality_classes() == (["ref"], ["web"]) and config.quality_classifier_enabled
    only_code = parse_config({**BASE, "sources": BASE["sources"][2:]})
    assert not only_code.quality_classifier_enabled  # auto: off without both classes, no error


def test_the_scores_complete_check_counts_nan_as_missing_only_where_something_scored():
    """NaN is "not scored": with no classifier and no reference model every document has it, in range; where one
    scored, a NaN is a document it missed. By hand: rows 1 (score 1.2), 2 (NaN score) and 3 (perplexity 0.5)."""
    import numpy as np

    from kiln.quality.scoring import out_of_range

    scores = np.array([0.3, 1.2, np.nan, 0.9])
    perplexity = np.array([12.0, 30.0, 8.0, 0.5])
    assert out_of_range(scores, perplexity, classified=True, perplexed=True) == 3
    assert out_of_range(scores, perplexity, classified=False, perplexed=True) == 2  # the NaN score is "not scored"
    unscored = np.full(4, np.nan)
    assert out_of_range(unscored, unscored, classified=False, perplexed=False) == 0
    assert out_of_range(scores, unscored, classified=True, perplexed=True) == 4  # no perplexity where a model scored


def test_a_new_reference_model_at_the_same_path_is_the_one_scored(tmp_path):
    """quality.perplexity.model often names a link that moves on after each training (checkpoint/_all): a worker
    that already loaded the old model at that path scores with the new one, the one whose sha256 is recorded."""
    import shutil

    texts = reference_texts()
    a, _ = train_reference_model(texts[:60], tmp_path / "a", steps=20, seed=0)
    b, _ = train_reference_model(texts[60:120], tmp_path / "b", steps=20, seed=1)
    live = tmp_path / "live"
    parts = _documents(tmp_path, texts[200:210])
    settings = QualityPerplexity(model=str(live), device="cpu", max_tokens=32, batch_size=4)

    def scored(model, name):
        shutil.rmtree(live, ignore_errors=True)
        shutil.copytree(model, live)
        out = tmp_path / f"scored-{name}.parquet"
        score_parts(parts, [out], None, settings, SERIAL, progress=False)  # SERIAL: this process, warm after "a"
        return pq.read_table(out).column("perplexity").to_numpy()

    first, second = scored(a, "a"), scored(b, "b")
    fresh_b = ReferenceModel.load(b, "cpu").perplexities(texts[200:210], 32, 4)
    assert not np.allclose(first, fresh_b)  # the two models do score differently
    np.testing.assert_allclose(second, fresh_b, rtol=1e-5)


def _sample_order(doc_id: str) -> int:
    """The sample's order written out here: blake2b-64 (little-endian) of "quality-sample" + 0x1f + the doc id."""
    import hashlib

    return int.from_bytes(hashlib.blake2b(f"quality-sample\x1f{doc_id}".encode(), digest_size=8).digest(), "little")


def test_the_balanced_sample_is_each_class_s_first_ids_by_hash_cut_to_the_smaller_class():
    positives = [f"ref-{i}" for i in range(12)]
    negatives = [f"web-{i}" for i in range(7)]
    for cap, n in ((5, 5), (100, 7)):
        pos, neg = balanced_sample(iter(positives), iter(negatives), cap)  # one-pass streams, as the asset gives
        assert pos == sorted(positives, key=_sample_order)[:n] and neg == sorted(negatives, key=_sample_order)[:n]
    examples = [Example(d, "ref", f"text {d}") for d in positives]
    assert [e.doc_id for e in balanced_sample(examples, negatives, 3)[0]] == sorted(positives, key=_sample_order)[:3]


def test_choosing_the_classifier_sample_holds_the_sample_not_the_corpus(tmp_path):
    """quality_classifier's driver streams the classes' doc ids (assets.quality._ids) into balanced_sample: its peak
    does not grow with the corpus. Before, 100k ids a class peaked at 25 MiB."""
    store = Store(tmp_path)

    def source(name, n):
        with store.staging("deduplicated", name) as w:
            for start in range(0, n, 20_000):
                w.write("documents", pa.table({"doc_id": [f"{name}-{i:012d}-native-identifier"
                                                          for i in range(start, min(n, start + 20_000))]}))
            w.commit(code_version="t", config={}, inputs={}, counts={})

    peaks = []
    for n in (20_000, 100_000):
        source(f"ref{n}", n)
        source(f"web{n}", n)
        # measured in a new interpreter: tracemalloc also counts the test worker's other threads
        peak, chosen = in_fresh_process(f"""
import json, tracemalloc
from pathlib import Path
from assets.quality import _ids
from kiln.common.storage import Store
from kiln.quality.classifier import balanced_sample
store = Store(Path({str(tmp_path)!r}))
pos, neg = {{"ref{n}": store.snapshot("deduplicated", "ref{n}")}}, {{"web{n}": store.snapshot("deduplicated", "web{n}")}}
tracemalloc.start()
chosen = balanced_sample(_ids(pos), _ids(neg), 1000)
print(json.dumps([tracemalloc.get_traced_memory()[1] / 2**20, chosen]))
""")
        peaks.append(peak)
        assert [len(c) for c in chosen] == [1000, 1000]
        assert chosen[0] == sorted((f"ref{n}-{i:012d}-native-identifier" for i in range(n)), key=_sample_order)[:1000]
    assert peaks[1] < 1.5 * peaks[0] + 1 and peaks[1] < 4, peaks  # measured 1.2 and 1.2 (before: 5.5 and 25)
