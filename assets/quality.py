"""Model-based quality: a fastText classifier trained on the user's own sources, scores (and reference-LM
perplexity) stored next to every document, and filtering on those stored scores."""

import time
from collections.abc import Iterator, Sequence

import dagster as dg
import numpy as np

from assets.dedup import DEDUPLICATED
from assets.partitions import (
    FOLLOW,
    FOLLOW_REQUESTS,
    LOADED_CONFIG,
    ONCE,
    document_partitions,
    partition_key,
    refresh_partitions,
    source_and_refresh,
)
from assets.results import check_specs, engine_metadata, full_funnel, materialize_result, standard_checks
from kiln.common.manifest import code_version
from kiln.common.plots import figure_markdown, pyplot
from kiln.common.removals import example_excerpt
from kiln.common.storage import Snapshot, resume_key
from kiln.governance.forget import (
    REQUEST_COLUMNS,
    REQUESTS,
    applied_requests,
    first_match,
    load_requests,
    naming_requests,
    raw_partitions,
    with_intake_urls,
)
from kiln.governance.refresh import load_refreshes, materialized, partition, upto
from kiln.quality.classifier import Example, balanced_sample, train_classifier
from kiln.quality.rules import RuleError, decide, decile_rows, filter_parts, threshold_effect
from kiln.quality.scoring import out_of_range as scores_out_of_range
from kiln.quality.scoring import read_scores, score_parts
from kiln.tokens.tokenizer import read_documents
from resources import KilnConfig, KilnEngine, KilnStorage

CLASSIFIER, SCORES, QUALITY_FILTERED = "quality_classifier", "quality_scores", "quality_filtered_documents"


@dg.asset(
    key=CLASSIFIER, group_name="quality", kinds={"python", "fasttext"},
    deps=[dg.AssetDep(DEDUPLICATED, partition_mapping=dg.AllPartitionMapping())], automation_condition=ONCE,
    # hash_unit: the sample, the folds; forget: the documents a removal request keeps out of the sample
    code_version=code_version("kiln.quality.classifier", "kiln.tokens.mixture", "kiln.governance.forget"),
    check_specs=[dg.AssetCheckSpec("separates", asset=CLASSIFIER, blocking=False,
                                   description="cross-validated ROC AUC of at least 0.8 (reference vs web documents)")],
)
def quality_classifier(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                       engine: KilnEngine) -> dg.MaterializeResult:
    """The fastText "reference vs web" classifier: reference sources' documents are the positives, web
    sources' the negatives, from every refresh so far, none that a removal request recorded before the fit names; the
    model file, its card (sha256, cross-validated metrics) and its training sample (ids, folds, out-of-fold scores).
    Fitted once: refitting re-scores every refresh. The cross-fitting folds and the final fit run in parallel on the
    engine."""
    config, store = kiln_config.load(), storage.store()
    positives, negatives = config.quality_classes()
    settings = config.quality.classifier
    pos_parts, neg_parts = materialized(store, DEDUPLICATED, positives), materialized(store, DEDUPLICATED, negatives)
    with store.staging(CLASSIFIER) as writer:
        inputs = {f"{DEDUPLICATED}/{p}": m.manifest.data_version for p, m in (pos_parts | neg_parts).items()}
        card = None
        if config.quality_classifier_enabled:  # else classifier_recipe says enabled: False
            # No document a removal request names is drawn (deduplicated_documents still holds it: requests apply in
            # quality_filtered_documents and the shards); URLs as intake read them, as the tokenizer's sample.
            requests, requests_version = load_requests(store)
            if requests_version:
                inputs[REQUESTS] = requests_version
            requests = with_intake_urls(store, requests, raw_partitions(store, positives + negatives))
            # Choose the sample by id first, then read only its texts: a web source may be far larger.
            pos_ids, neg_ids = balanced_sample(_ids(pos_parts, requests), _ids(neg_parts, requests),
                                               settings.max_documents_per_class)
            runner = engine.get(config.engine)
            card = train_classifier(_examples(pos_parts, set(pos_ids)), _examples(neg_parts, set(neg_ids)),
                                    settings, writer.dir, runner)
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config=classifier_recipe(config),
            inputs=inputs, counts={"training_documents": sum(card.sample["per_source"].values()) if card else 0},
            stats={"card": card.to_dict() if card else None})
    if card is None:
        context.log.info("quality classifier off: no positive and negative sources (quality.classifier)")
        return dg.MaterializeResult(metadata={"enabled": False, "data_version": manifest.data_version},
                                    check_results=[dg.AssetCheckResult(check_name="separates", passed=True,
                                                                       metadata={"enabled": False})],
                                    data_version=dg.DataVersion(manifest.data_version))
    cv = card.cross_validation
    return dg.MaterializeResult(
        metadata={"sha256": card.sha256, "positive_sources": positives, "negative_sources": negatives,
                  "cross_validation": dg.MetadataValue.json(cv), "cv_auc": cv["auc"],
                  "cv_precision": cv["precision"], "cv_recall": cv["recall"],
                  "sample": dg.MetadataValue.json(card.sample), "training_seconds": card.seconds,
                  **engine_metadata(runner, sum(card.sample["per_source"].values()), card.seconds),
                  "path": dg.MetadataValue.path(str(store.dataset_dir(CLASSIFIER))),
                  "data_version": manifest.data_version},
        check_results=[dg.AssetCheckResult(check_name="separates", passed=cv["auc"] is not None and cv["auc"] >= 0.8,
                                           severity=dg.AssetCheckSeverity.WARN, metadata={"auc": cv["auc"]})],
        data_version=dg.DataVersion(manifest.data_version))


def classifier_recipe(config) -> dict:
    """What the classifier is fitted with, as its manifest records it (`make demo` refits when this changes)."""
    positives, negatives = config.quality_classes()
    return {"classifier": config.quality.classifier.model_dump(mode="json"), "positive_sources": positives,
            "negative_sources": negatives, "enabled": config.quality_classifier_enabled}


def _ids(parts: dict[str, Snapshot], requests: Sequence = ()) -> Iterator[str]:
    """Every doc id but those a removal request in `requests` names, streamed a batch at a time: balanced_sample
    keeps only its sample, whatever the corpus."""
    for snapshot in parts.values():
        for batch in snapshot.iter_batches(columns=list(REQUEST_COLUMNS) if requests else ["doc_id"],
                                           batch_size=10_000):
            ids = batch.column("doc_id").to_pylist()
            yield from (d for d, request in zip(ids, naming_requests(requests, batch)) if request is None)


def _examples(parts: dict[str, Snapshot], wanted: set[str]) -> list[Example]:
    return [Example(d.doc_id, d.source, d.text) for m in parts.values()
            for d in read_documents(m.files("documents")) if d.doc_id in wanted]


@dg.asset(
    key=SCORES, deps=[DEDUPLICATED, CLASSIFIER], partitions_def=document_partitions, group_name="quality",
    kinds={"python", "parquet"}, automation_condition=FOLLOW,
    code_version=code_version("kiln.quality.scoring", "kiln.quality.classifier", "kiln.quality.perplexity",
                              "kiln.tokens.tokenizer", "training_jobs.export", "training_jobs.model"),  # perplexity
    check_specs=[dg.AssetCheckSpec("complete", asset=SCORES, blocking=True,
                                   description="every document is kept with its scores, each in range")],
)
def quality_scores(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                   engine: KilnEngine) -> dg.MaterializeResult:
    """One source's documents with their quality columns: `quality_score` (the classifier's P(reference))
    and `perplexity` under the reference language model, when one is configured. One engine task per part
    (the reference LM on a GPU runs in this step, which owns the GPU)."""
    config, store = kiln_config.load(), storage.store()
    source, settings = partition(*source_and_refresh(context)), config.quality.perplexity
    # both pinned: the versions recorded are the ones scored
    deduplicated, classifier = store.snapshot(DEDUPLICATED, source), store.snapshot(CLASSIFIER)
    classifier_dir = classifier.folder if classifier.manifest.stats["card"] else None
    if classifier_dir is None and config.quality_classifier_enabled:  # fitted once, while it was off
        raise dg.Failure(description=(
            f"{CLASSIFIER} was fitted while the classifier was off, and the config enables it now "
            f"(positive sources {', '.join(config.quality_classes()[0])}): materialize {CLASSIFIER} again (it is "
            f"fitted only when missing), then {SCORES}"))
    reference = {"reference_model_sha256": None, "reference_tokenizer_sha256": None}
    if settings.model:
        from kiln.quality.perplexity import ReferenceModel

        reference = ReferenceModel.identity(settings.model)  # a bad folder fails here, naming the key
    runner = engine.get(config.engine)
    version = dict(code_version=context.assets_def.code_versions_by_key[context.asset_key],
                   config={"perplexity": settings.model_dump(mode="json"), **reference},
                   inputs={f"{DEDUPLICATED}/{source}": deduplicated.manifest.data_version,
                           CLASSIFIER: classifier.manifest.data_version})
    inputs = deduplicated.files("documents")
    with store.staging(SCORES, source, resume=resume_key(**version)) as writer:
        started = time.perf_counter()
        counts = score_parts(inputs, [writer.next_path("documents") for _ in inputs], classifier_dir, settings,
                             runner, label=f"quality {source}")
        seconds = time.perf_counter() - started
        manifest = writer.commit(**version, counts=counts)
    doc_ids, scores, perplexity = read_scores(writer.committed.files("documents"))
    expected = deduplicated.manifest.counts["documents"]
    out_of_range = scores_out_of_range(scores, perplexity, classifier_dir is not None, settings.model is not None)
    metadata = {**engine_metadata(runner, counts["documents"], seconds),
                "documents": counts["documents"], "data_version": manifest.data_version,
                "path": dg.MetadataValue.path(str(store.dataset_dir(SCORES, source)))}
    # The lowest deciles are what the quality rule will drop: like a removal example, an excerpt only if the config
    # keeps rejected text (kiln.common.removals), redacted; and, as a takedown keeps none of a document's text, none
    # of a document a removal request names (the quality filter removes it).
    policy = config.curation.keep_rejected_text
    texts = {}
    if policy != "none":
        shown = {doc_ids[row] for values in (scores, perplexity) for _, row in decile_rows(values)}
        shown -= set(_requested(store, writer.committed, load_requests(store)[0]))
        texts = {doc_id: example_excerpt(text, policy)
                 for doc_id, text in writer.committed.values("text", shown).items()}
    for name, values, log in (("quality_score", scores, False), ("perplexity", perplexity, True)):
        if np.isfinite(values).any():
            finite = values[np.isfinite(values)]
            metadata[f"{name}_median"] = round(float(np.median(finite)), 4)
            metadata[f"{name}_histogram"] = dg.MetadataValue.md(histogram_markdown(finite, name, source, log))
            metadata[f"{name}_deciles"] = dg.MetadataValue.md(deciles_markdown(values, doc_ids, texts, name))
    if classifier_dir:
        metadata["min_score_effect"] = dg.MetadataValue.md(threshold_markdown(threshold_effect(scores)))
    return dg.MaterializeResult(
        metadata=metadata,
        check_results=[dg.AssetCheckResult(check_name="complete", passed=len(doc_ids) == expected and not out_of_range,
                                           metadata={"documents": len(doc_ids), "expected": expected,
                                                     "out_of_range": out_of_range})],
        data_version=dg.DataVersion(manifest.data_version))


class EarlierScoresRefitted(dg.AutomationCondition):
    """True for a (refresh, source) partition unless its source's rule ranks among every refresh's classifier scores
    (`QualityRule.ranks_scores`) and the source's quality_scores in an earlier refresh are older than the classifier's
    latest fit (not re-made yet, or being re-made). After a refit every refresh is scored again, in runs that finish
    in any order: the filter of refresh 2 run before refresh 1 is re-scored is refused (`_scored_unlike`), and
    nothing would ask for it again. It waits instead, and follows once the earlier scores are re-made."""

    @property
    def name(self) -> str:
        return "earlier_scores_refitted"

    def evaluate(self, context) -> dg.AutomationResult:
        candidates = context.candidate_subset.expensively_compute_partition_keys()
        ranked = {s for s, rule in LOADED_CONFIG.quality.rules.items() if rule is not None and rule.ranks_scores}
        waiting = set()
        if ranked & {document_partitions.get_partition_key_from_str(k).keys_by_dimension["source"] for k in candidates}:
            instance = context.asset_graph_view.instance
            fits = instance.fetch_materializations(dg.AssetKey(CLASSIFIER), limit=1).records
            scored = instance.event_log_storage.get_latest_storage_id_by_partition(
                dg.AssetKey(SCORES), dg.DagsterEventType.ASSET_MATERIALIZATION)
            order = instance.get_dynamic_partitions(refresh_partitions.name)
            for k in candidates if fits else ():
                dims = document_partitions.get_partition_key_from_str(k).keys_by_dimension
                source, refresh = dims["source"], dims["refresh"]
                earlier = order[:order.index(refresh)] if refresh in order else []
                if source in ranked and any(
                        (at := scored.get(str(partition_key(source, r)))) is not None and at < fits[0].storage_id
                        for r in earlier):
                    waiting.add(k)
        return dg.AutomationResult(context, context.candidate_subset.compute_intersection_with_partition_keys(
            set(candidates) - waiting))


# Eager, but a whole-source rule's later refresh waits for the earlier ones' scores of the same classifier fit.
FOLLOW_FITTED = (FOLLOW_REQUESTS & EarlierScoresRefitted()).with_label("eager, on one classifier fit") \
    if FOLLOW_REQUESTS is not None else None


@dg.asset(
    key=QUALITY_FILTERED, deps=[SCORES, REQUESTS], partitions_def=document_partitions, group_name="quality",
    kinds={"python", "parquet"}, automation_condition=FOLLOW_FITTED,
    code_version=code_version("kiln.quality.rules", "kiln.governance.forget", "kiln.common.removals", "kiln.common.stats",
                              "kiln.curation.documents", "kiln.tokens.mixture"),  # hash_unit: ties at a cutoff
    check_specs=check_specs(QUALITY_FILTERED),
)
def quality_filtered_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig,
                               storage: KilnStorage) -> dg.MaterializeResult:
    """One source's documents that pass its quality rule (`quality.rules`), decided from the stored scores
    alone, and that no removal request (`kiln forget`) names; removed documents go to the rejected table with
    their scores and the rule or request that removed them."""
    config, store = kiln_config.load(), storage.store()
    name, refresh = source_and_refresh(context)
    source = partition(name, refresh)
    rule = config.quality.rules.get(name)
    scored = store.snapshot(SCORES, source)  # pinned: the version recorded is the one filtered
    parts = scored.files("documents")
    doc_ids, scores, perplexity = read_scores(parts)
    # The source's scores in the refreshes before this one: a whole-source rule cuts among all of them
    earlier = materialized(store, SCORES, [name], upto(load_refreshes(store), refresh)[:-1])
    if unlike := _scored_unlike(rule, scored, earlier):
        raise dg.Failure(description=(
            f"{QUALITY_FILTERED}[{source}]: the rule of {name} cuts among every refresh's {unlike['what']}, but "
            f"{SCORES} for {', '.join(unlike['partitions'])} were made with another {unlike['by']} than {source}'s "
            f"(fitted or changed since): ranked together they would cut at a meaningless point; materialize {SCORES} "
            f"for {', '.join(unlike['partitions'])} first, then this partition again"))
    earlier_ids, earlier_scores, earlier_perplexity = read_scores([f for m in earlier.values()
                                                                   for f in m.files("documents")])
    try:
        decision = decide(doc_ids, scores, perplexity, rule, (earlier_ids, earlier_scores, earlier_perplexity))
    except RuleError as exc:
        raise dg.Failure(description=f"{QUALITY_FILTERED}[{source}]: {exc}") from None
    requests, requests_version = load_requests(store)
    requested = _requested(store, scored, requests)
    applied = sorted({r.removeprefix("removal_request:") for r in requested.values()})
    newly_applied = set(applied) - applied_requests(store.manifest_or_none(QUALITY_FILTERED, source))
    with store.staging(QUALITY_FILTERED, source) as writer:
        stats = filter_parts(parts, doc_ids, decision, writer, config.curation.examples_per_reason, requested,
                             config.curation.keep_rejected_text)
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"rule": rule.model_dump(mode="json") if rule else None,
                    "keep_rejected_text": config.curation.keep_rejected_text,
                    "removal_requests": applied},
            inputs={f"{SCORES}/{source}": scored.manifest.data_version,
                    **{f"{SCORES}/{p}": m.manifest.data_version for p, m in earlier.items()},
                    **({REQUESTS: requests_version} if requests_version else {})},
            counts={"input": stats.docs_in, "documents": stats.docs_out, "rejected": stats.docs_in - stats.docs_out},
            stats={**stats.to_dict(), "cutoffs": decision.cutoffs},
            forget_replaced=bool(newly_applied))  # the documents replaced may include what a request removes now
    return materialize_result(
        manifest, stats, store, standard_checks(writer.committed, scored.manifest.counts["documents"]),
        rule=dg.MetadataValue.json(rule.model_dump(mode="json") if rule else {"keep": "everything"}),
        cutoffs=dg.MetadataValue.json(decision.cutoffs),
        **full_funnel(store, manifest, stats, "quality-filtered documents"))


def _scored_unlike(rule, scored: Snapshot, earlier: dict[str, Snapshot]) -> dict | None:
    """The earlier partitions whose stored scores a whole-source rule cannot rank with `scored`'s: made by another
    classifier (keep_top_fraction), or another reference model or `max_tokens` (perplexity_buckets). After the
    classifier is fitted again, every refresh's scores are re-made; a later refresh re-scored first would otherwise
    be cut against the earlier ones' scores from the old model."""
    checks = []
    if rule is not None and rule.ranks_scores:
        checks.append(("classifier scores", "quality_classifier", lambda m: m.inputs.get(CLASSIFIER)))
    if rule is not None and rule.perplexity_buckets is not None:
        checks.append(("perplexities", "reference model", lambda m: (
            m.config.get("reference_model_sha256"), m.config.get("reference_tokenizer_sha256"),
            m.config.get("perplexity", {}).get("max_tokens"))))
    for what, by, made_with in checks:
        partitions = [p for p, m in earlier.items() if made_with(m.manifest) != made_with(scored.manifest)]
        if partitions:
            return {"what": what, "by": by, "partitions": partitions}
    return None


def _requested(store, scored: Snapshot, requests: list) -> dict[str, str]:
    """doc_id -> `removal_request:<id>` for the scored documents (the version filtered) that a removal request names
    (a URL pattern matched against their URLs as read: raw_documents' partition of the same source and refresh)."""
    if not requests:
        return {}
    requests = with_intake_urls(store, requests, [scored.manifest.partition])
    out = {}
    for batch in scored.iter_batches(columns=["doc_id", "source", "url"]):
        for doc_id, src, url in zip(*(batch.column(c).to_pylist() for c in ("doc_id", "source", "url"))):
            if (request := first_match(requests, doc_id, src, url)) is not None:
                out[doc_id] = request.reject_reason
    return out


def histogram_markdown(values: np.ndarray, name: str, source: str, log: bool = False) -> str:
    """A distribution reads faster as a picture than as a table."""
    fig, ax = pyplot().subplots(figsize=(6, 2.6), dpi=100)
    bins = np.geomspace(values.min(), values.max(), 40) if log and values.min() > 0 and values.max() > values.min() \
        else 40
    ax.hist(values, bins=bins, color="tab:blue")
    if log:
        ax.set_xscale("log")
    ax.set_xlabel(name)
    ax.set_ylabel("documents")
    ax.set_title(f"{source}: {len(values):,} documents", fontsize=9)
    return figure_markdown(fig, f"{name} histogram")


def deciles_markdown(values: np.ndarray, doc_ids: list[str], excerpts: dict[str, str], name: str) -> str:
    lines = [f"| decile | {name} | doc_id |" + (" excerpt |" if excerpts else ""),
             "|---:|---:|---|" + ("---|" if excerpts else "")]
    for decile, row in decile_rows(values):
        excerpt = " ".join(excerpts.get(doc_ids[row], "").split())[:160].replace("|", "\\|")
        lines.append(f"| {decile} | {values[row]:.4g} | `{doc_ids[row]}` |" + (f" {excerpt} |" if excerpts else ""))
    return "\n".join(lines)


def threshold_markdown(rows: list[dict]) -> str:
    lines = ["| min_score | documents kept | share kept |", "|---:|---:|---:|"]
    lines += [f"| {r['min_score']} | {r['kept']:,} | {r['kept_share']:.1%} |" for r in rows]
    return "\n".join(lines)

