"""Near-duplicate removal across sources and refreshes, and benchmark decontamination."""

import time

import dagster as dg
import numpy as np
import pyarrow.compute as pc

from assets.curation import CURATED
from assets.partitions import FOLLOW, SAME_REFRESH, document_partitions, refresh_partitions, source_and_refresh
from assets.results import check_specs, engine_metadata, materialize_result, standard_checks
from kiln.dedup.apply import deduplicate_source
from kiln.dedup.boilerplate import boilerplate_hashes
from kiln.dedup.decontaminate import load_benchmarks
from kiln.dedup.minhash import compute_signatures, lines_table
from kiln.dedup.near import NEAR_DUPLICATE, Batch, near_dedup, survivor_violations
from kiln.dedup.report import clusters_markdown, cross_source_markdown, cluster_sizes_markdown
from kiln.manifest import code_version
from kiln.plots import stacked_bars_markdown
from kiln.refresh import load_refreshes, partition, upto
from kiln.removals import example_excerpt
from kiln.stats import StageStats, chain, funnel_markdown
from kiln.storage import resume_key
from resources import DedupIndexStore, KilnConfig, KilnEngine, KilnStorage

SIGNATURES, INDEX, DEDUPLICATED = "minhash_signatures", "dedup_index", "deduplicated_documents"


@dg.asset(
    key=SIGNATURES, deps=[CURATED], partitions_def=document_partitions, group_name="dedup",
    kinds={"python", "parquet"}, code_version=code_version("kiln.dedup.minhash", "kiln.dedup.text"),
    check_specs=[dg.AssetCheckSpec("complete", asset=SIGNATURES, blocking=True,
                                   description="one signature per curated document")],
    automation_condition=FOLLOW,
)
def minhash_signatures(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                       engine: KilnEngine) -> dg.MaterializeResult:
    """MinHash signatures and shingle sets of one source's curated documents (arrays, never pickles)."""
    config, store = kiln_config.load(), storage.store()
    source = partition(*source_and_refresh(context))
    near, lines = config.dedup.near, config.dedup.boilerplate_lines
    curated = store.manifest(CURATED, source)
    inputs = store.files(CURATED, source, "documents")
    runner = engine.get(config.engine)
    version = dict(code_version=context.assets_def.code_versions_by_key[context.asset_key],
                   config={"near": near.model_dump(mode="json"), "boilerplate_lines": lines.model_dump()},
                   inputs={f"{CURATED}/{source}": curated.data_version})
    with store.staging(SIGNATURES, source, resume=resume_key(**version)) as writer:
        outputs = [writer.next_path("signatures") for _ in inputs]
        started = time.perf_counter()
        documents, line_counts = compute_signatures(inputs, outputs, near, lines if lines.enabled else None,
                                                    runner, label=f"minhash {source}")
        seconds = time.perf_counter() - started
        if lines.enabled:
            writer.write("lines", lines_table(line_counts))
        manifest = writer.commit(**version, counts={"documents": documents})
    shingles = store.read_table(SIGNATURES, source, "signatures", columns=["shingles"])
    sizes = (pc.list_value_length(shingles.column("shingles")).to_numpy(zero_copy_only=False)
             if shingles.num_rows else np.zeros(0))
    expected = curated.counts["documents"]
    return dg.MaterializeResult(
        metadata={**engine_metadata(runner, documents, seconds),
                  "documents": documents, "shingles_per_document_median": float(np.median(sizes)) if sizes.size else 0.0,
                  "data_version": manifest.data_version,
                  "path": dg.MetadataValue.path(str(store.dataset_dir(SIGNATURES, source)))},
        check_results=[dg.AssetCheckResult(check_name="complete", passed=documents == expected,
                                           metadata={"signatures": documents, "curated_documents": expected})],
        data_version=dg.DataVersion(manifest.data_version))


@dg.asset(
    key=INDEX, group_name="dedup", kinds={"python", "parquet"}, partitions_def=refresh_partitions,
    pool="dedup_index",  # one index writer at a time (the index also holds a writer lock); other runs go on
    deps=[dg.AssetDep(SIGNATURES, partition_mapping=SAME_REFRESH)], automation_condition=FOLLOW,
    code_version=code_version("kiln.dedup.near", "kiln.dedup.index", "kiln.dedup.boilerplate"),
    check_specs=[
        dg.AssetCheckSpec("conservation", asset=INDEX, blocking=True,
                          description="one decision per signed document: kept, near_duplicate or already_indexed"),
        dg.AssetCheckSpec("survivors_distinct", asset=INDEX, blocking=False,
                          description="no two surviving documents reach the Jaccard threshold (a sample, checked "
                                      "exactly and independently of the LSH banding)"),
    ],
)
def dedup_index(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                dedup_index_store: DedupIndexStore) -> dg.MaterializeResult:
    """The persistent MinHash LSH index of accepted documents, grown by one refresh, and that refresh's
    decisions: each document is kept, a near-duplicate (of this refresh or an earlier one), or already indexed."""
    config, store = kiln_config.load(), storage.store()
    near, lines = config.dedup.near, config.dedup.boilerplate_lines
    refresh = context.partition_key
    parts = [partition(s.name, refresh) for s in config.sources]
    manifests = {p: store.manifest(SIGNATURES, p) for p in parts}
    batch = Batch.from_tables([(s.quality_tier, store.read_table(SIGNATURES, p, "signatures"))
                               for s, p in zip(config.sources, parts)])
    with store.staging(INDEX, refresh) as writer, dedup_index_store.open(near, store.remote) as index:
        result = near_dedup(batch, index, near, batch_name=refresh, enabled=near.enabled)
        writer.write("decisions", result.decisions)
        boilerplate = set()
        if lines.enabled:
            boilerplate = boilerplate_hashes([store.read_table(SIGNATURES, p, "lines") for p in parts], lines)
            writer.write("lines", lines_table({h: 0 for h in boilerplate}))
        sampled, violations = survivor_violations(batch, result.decisions, near.threshold, near.check_sample)
        # The index is made durable before this manifest: a crash in between re-runs to the same decisions
        # (documents already in the index count as kept).
        result.stats["index"] = index.commit()
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"near": near.model_dump(mode="json"), "boilerplate_lines": lines.model_dump()},
            inputs={f"{SIGNATURES}/{name}": m.data_version for name, m in manifests.items()},
            counts={"documents": len(batch), "near_duplicates": int(pc.sum(pc.equal(
                result.decisions.column("status"), NEAR_DUPLICATE)).as_py() or 0),
                    "boilerplate_lines": len(boilerplate)},
            stats=result.stats)
    stats = result.stats
    # Cluster members other than the kept copy are dropped later: their text shows only as the config allows.
    policy = config.curation.keep_rejected_text
    texts = None if policy == "none" else {
        doc_id: example_excerpt(text, policy)
        for doc_id, text in _texts_of(store, parts, stats["example_clusters"], result.decisions).items()}
    return dg.MaterializeResult(
        metadata={
            "documents": len(batch), "near_duplicates": manifest.counts["near_duplicates"],
            "duplicate_rate_per_source": dg.MetadataValue.json(
                {s: v["duplicate_rate"] for s, v in stats["per_source"].items()}),
            "decisions_per_source": dg.MetadataValue.json(stats["per_source"]),
            "cross_source_duplicates": dg.MetadataValue.md(cross_source_markdown(stats["cross_source"])),
            "cluster_sizes": dg.MetadataValue.md(cluster_sizes_markdown(stats["cluster_sizes"])),
            "example_clusters": dg.MetadataValue.md(clusters_markdown(result.decisions, stats["example_clusters"], texts)),
            "lsh": dg.MetadataValue.json(stats["lsh"]), "verification": dg.MetadataValue.json(stats["verification"]),
            "timing_seconds": dg.MetadataValue.json(stats["timing"]),
            "index_documents": stats["index"]["documents"], "index_backend": near.index.backend,
            "matched_earlier_refreshes": stats["matched_earlier_refreshes"],
            "boilerplate_lines": len(boilerplate), "data_version": manifest.data_version,
            "accepted_per_refresh": dg.MetadataValue.md(stacked_bars_markdown(
                {r.key: {n: v.get("kept", 0) for n, v in m.stats["per_source"].items()}
                 for r in upto(load_refreshes(store), refresh) if (m := store.manifest_or_none(INDEX, r.key))},
                "documents the index accepted, by refresh", "documents")),
        },
        check_results=[
            dg.AssetCheckResult(check_name="conservation", passed=result.decisions.num_rows == len(batch)
                                and len(set(result.decisions.column("doc_id").to_pylist())) == len(batch),
                                metadata={"signed": len(batch), "decisions": result.decisions.num_rows}),
            dg.AssetCheckResult(check_name="survivors_distinct", passed=not violations,
                                severity=dg.AssetCheckSeverity.WARN,
                                metadata={"sampled": sampled, "violations": len(violations),
                                          "pairs": dg.MetadataValue.json(violations[:10])}),
        ],
        data_version=dg.DataVersion(manifest.data_version))


def _texts_of(store, parts: list[str], cluster_ids: list[str], decisions) -> dict[str, str]:
    """Texts of the example clusters' members in this refresh's curated documents (for side-by-side display)."""
    wanted = set(cluster_ids) | {r["doc_id"] for r in decisions.to_pylist() if r["cluster_id"] in set(cluster_ids)}
    texts = {}
    for p in parts:
        texts |= store.values(CURATED, p, "text", wanted)
    return texts


@dg.asset(
    key=DEDUPLICATED, partitions_def=document_partitions, group_name="dedup", kinds={"python", "parquet"},
    deps=[CURATED, dg.AssetDep(INDEX, partition_mapping=SAME_REFRESH)], automation_condition=FOLLOW,
    code_version=code_version("kiln.dedup.apply", "kiln.dedup.decontaminate", "kiln.dedup.boilerplate", "kiln.removals",
                              "kiln.stats"),
    check_specs=check_specs(DEDUPLICATED) + [
        dg.AssetCheckSpec("no_benchmark_overlap", asset=DEDUPLICATED, blocking=True,
                          description="no surviving document shares an n-gram with a declared benchmark item")],
)
def deduplicated_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig,
                           storage: KilnStorage) -> dg.MaterializeResult:
    """One source's documents with near-duplicates, boilerplate lines and benchmark overlap removed."""
    config, store = kiln_config.load(), storage.store()
    name, refresh = source_and_refresh(context)
    source = partition(name, refresh)
    curated, index = store.manifest(CURATED, source), store.manifest(INDEX, refresh)
    decisions = store.read_table(INDEX, refresh, "decisions")
    mine = decisions.filter(pc.and_(pc.equal(decisions.column("source"), name),
                                    pc.equal(decisions.column("status"), NEAR_DUPLICATE)))
    removed = {r["doc_id"]: r for r in mine.to_pylist()}
    lines = config.dedup.boilerplate_lines
    boilerplate = set(store.read_table(INDEX, refresh, "lines").column("line_hash").to_pylist()) if lines.enabled else set()
    decon = config.decontamination
    benchmarks = load_benchmarks(decon) if decon.enabled and decon.benchmarks else None
    with store.staging(DEDUPLICATED, source) as writer:
        stats, contamination = deduplicate_source(
            store.files(CURATED, source, "documents"), removed, boilerplate, lines, benchmarks, decon, writer,
            examples_per_reason=config.curation.examples_per_reason, rejected_text=config.curation.keep_rejected_text)
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"decontamination": decon.model_dump(mode="json"), "boilerplate_lines": lines.model_dump(),
                    "keep_rejected_text": config.curation.keep_rejected_text,
                    "benchmarks": benchmarks.summary() if benchmarks else {}},
            inputs={f"{CURATED}/{source}": curated.data_version, f"{INDEX}/{refresh}": index.data_version},
            counts={"input": stats.docs_in, "documents": stats.docs_out, "rejected": stats.docs_in - stats.docs_out},
            stats={**stats.to_dict(), "contamination": contamination})
    funnel = chain([StageStats.from_dict(store.manifest(a, source).stats)
                    for a in ("raw_documents", "filtered_documents", CURATED)] + [stats])
    overlap = _residual_overlap(store, source, benchmarks)
    checks = standard_checks(store, manifest, curated.counts["documents"]) + [
        dg.AssetCheckResult(check_name="no_benchmark_overlap", passed=not overlap,
                            metadata={"documents_with_overlap": len(overlap),
                                      "examples": dg.MetadataValue.json(overlap[:5])})]
    return materialize_result(
        manifest, stats, store, checks,
        contamination=dg.MetadataValue.json(contamination["per_benchmark"]),
        contaminated_items=dg.MetadataValue.md(contamination["markdown"]),
        full_funnel=dg.MetadataValue.md("From raw records to deduplicated documents:\n\n" + funnel_markdown(funnel)))


def _residual_overlap(store, source: str, benchmarks) -> list[str]:
    if benchmarks is None:
        return []
    found = []
    for batch in store.iter_batches(DEDUPLICATED, source, columns=["doc_id", "text"]):
        for doc_id, text in zip(batch.column("doc_id").to_pylist(), batch.column("text").to_pylist()):
            if benchmarks.find(text):
                found.append(doc_id)
    return found
