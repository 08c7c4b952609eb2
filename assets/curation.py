"""Curation: raw sources → filtered documents → curated (exactly deduplicated) documents, per source."""


import dagster as dg

from assets.results import check_specs, materialize_result, standard_checks
from kiln.config import load_config
from kiln.curation import HashTable, apply_exact_dedup, exact_duplicates, filter_documents, ingest, profile_steps
from kiln.manifest import code_version
from kiln.filters.registry import build_step
from kiln.pii import PiiRedaction
from kiln.storage import Store
from kiln.stats import StageStats, chain, funnel_markdown
from resources import KilnConfig, KilnStorage

# One partition per declared source, so sources materialize (and fail, and refresh) independently.
source_partitions = dg.StaticPartitionsDefinition([s.name for s in load_config().sources])

RAW, FILTERED, CURATED = "raw_documents", "filtered_documents", "curated_documents"
KINDS = {"python", "parquet"}


@dg.asset(
    key=RAW, partitions_def=source_partitions, group_name="curation", kinds=KINDS,
    code_version=code_version("kiln.readers", "kiln.curation", "kiln.documents", "kiln.storage"),
    check_specs=check_specs(RAW),
)
def raw_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig,
                  storage: KilnStorage) -> dg.MaterializeResult:
    """Every readable record of one source as a document with a stable id; unreadable ones quarantined."""
    config, store = kiln_config.load(), storage.store()
    source = config.source(context.partition_key)
    with store.staging(RAW, source.name) as writer:
        stats = ingest(source, config.reading, writer, examples_per_reason=config.curation.examples_per_reason)
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"source": source.model_dump(mode="json"), "reading": config.reading.model_dump(mode="json")},
            inputs={}, counts={"records": stats.docs_in, "documents": stats.docs_out,
                               "quarantined": stats.docs_in - stats.docs_out},
            stats=stats.to_dict())
    quarantined = dict(stats.steps["read"].dropped)
    return materialize_result(manifest, stats, store, standard_checks(store, manifest, stats.docs_in),
                              quarantined=sum(quarantined.values()),
                              quarantine_reasons=dg.MetadataValue.json(quarantined))


@dg.asset(
    key=FILTERED, deps=[RAW], partitions_def=source_partitions, group_name="curation", kinds=KINDS,
    code_version=code_version("kiln.filters", "kiln.pii", "kiln.curation", "kiln.stats"),
    check_specs=check_specs(FILTERED),
)
def filtered_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig,
                       storage: KilnStorage) -> dg.MaterializeResult:
    """Normalized documents that pass the source's filter profile, with PII replaced by typed placeholders."""
    config, store = kiln_config.load(), storage.store()
    source = context.partition_key
    raw = store.manifest(RAW, source)
    steps = profile_steps(config, source)
    with store.staging(FILTERED, source) as writer:
        stats = filter_documents(store.files(RAW, source, "documents"), steps, config.curation.exact_dedup, writer,
                                 workers=config.curation.workers,
                                 examples_per_reason=config.curation.examples_per_reason, label=f"filter {source}")
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"profile": config.source(source).profile, "steps": [s.model_dump() for s in steps],
                    "exact_dedup": config.curation.exact_dedup.model_dump()},
            inputs={f"{RAW}/{source}": raw.data_version},
            counts={"input": stats.docs_in, "documents": stats.docs_out, "rejected": stats.docs_in - stats.docs_out},
            stats=stats.to_dict())
    pii = dict(stats.steps["pii"].counts) if "pii" in stats.steps else {}
    return materialize_result(manifest, stats, store, standard_checks(store, manifest, raw.counts["documents"]),
                              pii_redactions=dg.MetadataValue.json(pii), pii_total=sum(pii.values()),
                              step_seconds=dg.MetadataValue.json({n: round(s.seconds, 2) for n, s in stats.steps.items()}))


@dg.asset(
    key=CURATED, partitions_def=source_partitions, group_name="curation", kinds=KINDS,
    # Exact dedup compares every source's hashes, so each partition depends on all filtered partitions.
    deps=[dg.AssetDep(FILTERED, partition_mapping=dg.AllPartitionMapping())],
    code_version=code_version("kiln.curation", "kiln.stats"),
    check_specs=check_specs(CURATED, "residual_pii"),
)
def curated_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig,
                      storage: KilnStorage) -> dg.MaterializeResult:
    """The clean documents of one source: filtered, PII-free, and exactly deduplicated across all sources."""
    config, store = kiln_config.load(), storage.store()
    source = context.partition_key
    inputs = {s.name: store.manifest(FILTERED, s.name) for s in config.sources}
    dedup = config.curation.exact_dedup
    duplicates = exact_duplicates([
        HashTable(s.name, s.quality_tier, store.read_table(FILTERED, s.name, columns=["doc_id", "content_hash"]))
        for s in config.sources]) if dedup.enabled else {}
    with store.staging(CURATED, source) as writer:
        stats = apply_exact_dedup(store.files(FILTERED, source, "documents"), duplicates, writer,
                                  config.curation.examples_per_reason)
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"exact_dedup": dedup.model_dump(), "sources": [s.name for s in config.sources]},
            inputs={f"{FILTERED}/{name}": m.data_version for name, m in inputs.items()},
            counts={"input": stats.docs_in, "documents": stats.docs_out, "rejected": stats.docs_in - stats.docs_out},
            stats=stats.to_dict())
    funnel = chain([StageStats.from_dict(store.manifest(RAW, source).stats),
                    StageStats.from_dict(inputs[source].stats), stats])
    checks = standard_checks(store, manifest, inputs[source].counts["documents"]) + [
        residual_pii_check(store, source, build_step("pii", config.curation.pii))]
    return materialize_result(manifest, stats, store, checks,
                              full_funnel=dg.MetadataValue.md("From raw records to curated documents:\n\n"
                                                              + funnel_markdown(funnel)))


def residual_pii_check(store: Store, source: str, detector: PiiRedaction) -> dg.AssetCheckResult:
    """Scan the output again with the same detectors: any hit means redaction missed something."""
    hits: dict[str, int] = {}
    examples = []
    for batch in store.iter_batches(CURATED, source, columns=["doc_id", "text"]):
        for doc_id, text in zip(batch.column("doc_id").to_pylist(), batch.column("text").to_pylist()):
            for m in detector.find(text):
                hits[m.type] = hits.get(m.type, 0) + 1
                if len(examples) < 5:
                    examples.append(f"{doc_id}: {m.type}")
    return dg.AssetCheckResult(check_name="residual_pii", passed=not hits,
                               metadata={"hits": dg.MetadataValue.json(hits), "examples": dg.MetadataValue.json(examples)})

