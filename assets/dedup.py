"""Near-duplicate removal across sources and refreshes, and benchmark decontamination."""

import shutil
import time
from dataclasses import dataclass

import dagster as dg
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from assets.curation import CURATED
from assets.partitions import FOLLOW, FOLLOW_IN_ORDER, SAME_REFRESH, document_partitions, refresh_partitions, source_and_refresh
from assets.results import check_specs, engine_metadata, full_funnel, materialize_result, standard_checks
from kiln.common.manifest import code_version
from kiln.common.plots import stacked_bars_markdown
from kiln.common.removals import example_excerpt
from kiln.common.storage import Snapshot, part_files, resume_key
from kiln.dedup.apply import decisions_by_part, deduplicate_source
from kiln.dedup.boilerplate import COUNTED_WITH, DECIDED_WITH, boilerplate_hashes, check_lines_settings
from kiln.dedup.bucket_index import check_signature_params, index_commit, index_documents
from kiln.dedup.buckets import decide_distributed, distinct_doc_ids, keep_all, survivor_violations
from kiln.dedup.decontaminate import load_benchmarks
from kiln.dedup.residual_overlap import overlapping_documents
from kiln.dedup.near import DECISION_SCHEMA, NEAR_DUPLICATE
from kiln.dedup.report import cluster_sizes_markdown, clusters_markdown, cross_source_markdown
from kiln.dedup.signing import compute_signatures, lines_table, signature_groups
from kiln.governance.refresh import load_refreshes, partition, upto
from resources import KilnConfig, KilnEngine, KilnStorage

SIGNATURES, INDEX, DEDUPLICATED = "minhash_signatures", "dedup_index", "deduplicated_documents"


@dg.asset(
    key=SIGNATURES, deps=[CURATED], partitions_def=document_partitions, group_name="dedup",
    kinds={"python", "parquet"},
    code_version=code_version("kiln.dedup.signing", "kiln.dedup.minhash", "kiln.dedup.fast_minhash", "kiln.dedup.text",
                              "kiln.dedup._kernels", "kiln.common.text_units", "kiln.common.splitmix"),
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
    curated = store.snapshot(CURATED, source)  # pinned: the version recorded is the one signed
    inputs = curated.files("documents")
    runner = engine.get(config.engine)
    version = dict(code_version=context.assets_def.code_versions_by_key[context.asset_key],
                   config={"near": near.model_dump(mode="json"), "boilerplate_lines": lines.model_dump()},
                   inputs={f"{CURATED}/{source}": curated.manifest.data_version})
    with store.staging(SIGNATURES, source, resume=resume_key(**version)) as writer:
        groups = signature_groups(inputs, near.rows_per_part)
        outputs = [writer.next_path("signatures") for _ in groups]
        lines_outputs = [writer.next_path("lines") for _ in groups] if lines.enabled else None
        started = time.perf_counter()
        signed = compute_signatures(groups, outputs, near, lines if lines.enabled else None, runner,
                                    label=f"minhash {source}", lines_paths=lines_outputs)
        documents = signed.documents
        seconds = time.perf_counter() - started
        manifest = writer.commit(**version, counts={"documents": documents})
    expected = curated.manifest.counts["documents"]
    return dg.MaterializeResult(
        metadata={**engine_metadata(runner, documents, seconds), "documents": documents,
                  "signature_parts": len(groups), "shingles_per_document_median": signed.median_shingles(),
                  "data_version": manifest.data_version,
                  "path": dg.MetadataValue.path(str(store.dataset_dir(SIGNATURES, source)))},
        check_results=[dg.AssetCheckResult(check_name="complete", passed=documents == expected,
                                           metadata={"signatures": documents, "curated_documents": expected})],
        data_version=dg.DataVersion(manifest.data_version))


@dg.asset(
    key=INDEX, group_name="dedup", kinds={"python", "parquet"}, partitions_def=refresh_partitions,
    pool="dedup_index",  # one writer at a time: a refresh decides against the earlier refreshes' indexes
    deps=[dg.AssetDep(SIGNATURES, partition_mapping=SAME_REFRESH)], automation_condition=FOLLOW_IN_ORDER,
    code_version=code_version("kiln.dedup.near", "kiln.dedup.buckets", "kiln.dedup.bucket_index",
                              "kiln.dedup.bucket_layout", "kiln.dedup.bucket_rounds", "kiln.dedup.components",
                              "kiln.dedup.boilerplate", "kiln.dedup._kernels", "kiln.dedup.minhash", "kiln.dedup.lsh",
                              "kiln.dedup.fast_minhash", "kiln.common.splitmix"),  # pair Jaccard, bands, bucket keys
    check_specs=[
        dg.AssetCheckSpec("conservation", asset=INDEX, blocking=True,
                          description="one decision per signed document: kept, near_duplicate or already_indexed"),
        dg.AssetCheckSpec("survivors_distinct", asset=INDEX, blocking=False,
                          description="no two surviving documents reach the Jaccard threshold (a sample, checked "
                                      "exactly and independently of the LSH banding)"),
    ],
)
def dedup_index(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                engine: KilnEngine) -> dg.MaterializeResult:
    """One refresh's near-duplicate decisions — each document kept, a near-duplicate (of this refresh or an
    earlier one), or already indexed — and its bucket index (the documents it accepted: band buckets, ids,
    shingle sets), which later refreshes read as the persistent index (kiln.dedup.bucket_index)."""
    config, store = kiln_config.load(), storage.store()
    near, lines = config.dedup.near, config.dedup.boilerplate_lines
    refresh = context.partition_key
    parts = [partition(s.name, refresh) for s in config.sources]
    # pinned (Store.snapshot): the versions recorded are the ones decided
    signature_sets = {p: store.snapshot(SIGNATURES, p) for p in parts}
    for p, m in signature_sets.items():
        # signatures of another scheme (or shingling) than the index's would silently not match
        check_signature_params(f"{SIGNATURES}/{p}", m.manifest.config.get("near", {}), near)
        check_lines_settings(f"{SIGNATURES}/{p}", m.manifest.config.get("boilerplate_lines"), lines, COUNTED_WITH,
                             SIGNATURES)
    signature_files = [f for m in signature_sets.values() for f in m.files("signatures")]  # config source order
    sources = {s.name: (s.quality_tier, order) for order, s in enumerate(config.sources)}
    runner = engine.get(config.engine)
    # The store's index lock, not only the pool: read the earlier indexes, decide and commit as one writer.
    with index_commit(store, refresh, context.log.info) as (writer, earlier):
        work = writer.scratch("near_dedup")
        if near.enabled:
            stats = decide_distributed(signature_files, sources, [path for _, path in earlier], work, writer.dir, near,
                                       refresh, engine=runner, partitions=near.partitions, max_bucket=near.max_bucket)
        else:  # every document kept, and indexed: a later refresh with near-dedup on must find its copies of them
            stats = keep_all(signature_files, sources, near, refresh, writer.dir, runner)
        shutil.rmtree(work)  # the shuffle files, as soon as the decisions are written
        decision_files = part_files(writer.dir / "decisions")  # pairs with signature_files, part by part
        decided = sum(pq.ParquetFile(f).metadata.num_rows for f in decision_files)
        distinct = distinct_doc_ids(decision_files, writer.scratch("distinct_ids"), runner)
        near_duplicates = sum(int(pc.sum(pc.equal(pq.read_table(f, columns=["status"]).column("status"),
                                                  NEAR_DUPLICATE)).as_py() or 0) for f in decision_files)
        boilerplate = ()
        if lines.enabled:  # the refresh's lines in more than min_documents documents, with how many
            boilerplate, documents = boilerplate_hashes([f for m in signature_sets.values() for f in m.files("lines")],
                                                        lines, writer.scratch("boilerplate"), runner)
            writer.write("lines", lines_table(boilerplate, documents))
        sampled, violations = survivor_violations(signature_files, decision_files, near.threshold, near.check_sample,
                                                  writer.scratch("survivor_check"), runner)
        stats["index"] = {"documents": index_documents([path for _, path in earlier]) + stats["kept"],
                          "refreshes": [r for r, _ in earlier] + [refresh]}
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"near": near.model_dump(mode="json"), "boilerplate_lines": lines.model_dump()},
            inputs={**{f"{SIGNATURES}/{name}": m.manifest.data_version for name, m in signature_sets.items()},
                    **{f"{INDEX}/{r}": store.manifest(INDEX, r).data_version for r, _ in earlier}},
            counts={"documents": decided, "near_duplicates": near_duplicates, "boilerplate_lines": len(boilerplate)},
            stats=stats)
    signed = sum(m.manifest.counts["documents"] for m in signature_sets.values())
    # Cluster members other than the kept copy are dropped later: their text shows only as the config allows.
    examples = _cluster_rows(writer.committed.files("decisions"), stats["example_clusters"])
    policy = config.curation.keep_rejected_text
    texts = None if policy == "none" else {
        doc_id: example_excerpt(text, policy) for doc_id, text in _texts_of(store, parts, examples).items()}
    return dg.MaterializeResult(
        metadata={
            "documents": decided, "near_duplicates": near_duplicates,
            "duplicate_rate_per_source": dg.MetadataValue.json(
                {s: v["duplicate_rate"] for s, v in stats["per_source"].items()}),
            "decisions_per_source": dg.MetadataValue.json(stats["per_source"]),
            "cross_source_duplicates": dg.MetadataValue.md(cross_source_markdown(stats["cross_source"])),
            "cluster_sizes": dg.MetadataValue.md(cluster_sizes_markdown(stats["cluster_sizes"])),
            "example_clusters": dg.MetadataValue.md(clusters_markdown(examples, stats["example_clusters"], texts)),
            **({"lsh": dg.MetadataValue.json(stats["lsh"]), "verification": dg.MetadataValue.json(stats["verification"]),
                "buckets": dg.MetadataValue.json(stats["buckets"]), "timing_seconds": dg.MetadataValue.json(stats["timing"]),
                **engine_metadata(runner, decided, stats["timing"]["total_seconds"])} if near.enabled else {}),
            "index_documents": stats["index"]["documents"],
            "matched_earlier_refreshes": stats["matched_earlier_refreshes"],
            "boilerplate_lines": len(boilerplate), "data_version": manifest.data_version,
            "accepted_per_refresh": dg.MetadataValue.md(stacked_bars_markdown(
                {r.key: {n: v.get("kept", 0) for n, v in m.stats["per_source"].items()}
                 for r in upto(load_refreshes(store), refresh) if (m := store.manifest_or_none(INDEX, r.key))},
                "documents the index accepted, by refresh", "documents")),
        },
        check_results=[
            dg.AssetCheckResult(check_name="conservation", passed=decided == signed and distinct == signed,
                                metadata={"signed": signed, "decisions": decided, "distinct_doc_ids": distinct}),
            dg.AssetCheckResult(check_name="survivors_distinct", passed=not violations,
                                severity=dg.AssetCheckSeverity.WARN,
                                metadata={"sampled": sampled, "violations": len(violations),
                                          "pairs": dg.MetadataValue.json(violations[:10])}),
        ],
        data_version=dg.DataVersion(manifest.data_version))


def _cluster_rows(decision_files, cluster_ids: list[str]) -> pa.Table:
    """The decision rows of the example clusters (read part by part, only those rows kept)."""
    wanted = pa.array(cluster_ids, pa.string())
    tables = [t.filter(pc.is_in(t.column("cluster_id"), wanted)) for t in map(pq.read_table, decision_files)]
    return pa.concat_tables(tables) if tables else DECISION_SCHEMA.empty_table()


def _texts_of(store, parts: list[str], rows: pa.Table) -> dict[str, str]:
    """Texts of the example clusters' members in this refresh's curated documents (for side-by-side display)."""
    wanted = set(rows.column("doc_id").to_pylist()) | set(rows.column("cluster_id").to_pylist())
    texts = {}
    for p in parts:
        texts |= store.values(CURATED, p, "text", wanted)
    return texts


@dg.asset(
    key=DEDUPLICATED, partitions_def=document_partitions, group_name="dedup", kinds={"python", "parquet"},
    deps=[CURATED, dg.AssetDep(INDEX, partition_mapping=SAME_REFRESH)], automation_condition=FOLLOW,
    code_version=code_version("kiln.dedup.apply", "kiln.dedup.decontaminate", "kiln.dedup.boilerplate", "kiln.common.removals",
                              "kiln.common.stats", "kiln.common.text_units", "kiln.dedup.text", "kiln.dedup.minhash"),
    check_specs=check_specs(DEDUPLICATED) + [
        dg.AssetCheckSpec("no_benchmark_overlap", asset=DEDUPLICATED, blocking=True,
                          description="no surviving document shares an n-gram with a declared benchmark item, by "
                                      "an independent look (kiln.dedup.residual_overlap)")],
)
def deduplicated_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                           engine: KilnEngine) -> dg.MaterializeResult:
    """One source's documents with near-duplicates, boilerplate lines and benchmark overlap removed, one engine
    task per curated part (kiln.dedup.apply)."""
    config, store = kiln_config.load(), storage.store()
    name, refresh = source_and_refresh(context)
    source = partition(name, refresh)
    inputs = pinned_inputs(store, config, name, refresh)
    curated, index = inputs.curated.manifest, inputs.index.manifest
    lines, decon = config.dedup.boilerplate_lines, config.decontamination
    check_lines_settings(f"{INDEX}/{refresh}", index.config.get("boilerplate_lines"), lines, DECIDED_WITH, INDEX)
    benchmarks = load_benchmarks(decon) if decon.enabled and decon.benchmarks else None
    runner = engine.get(config.engine)
    started = time.perf_counter()
    with store.staging(DEDUPLICATED, source) as writer:
        stats, contamination = apply_decisions(inputs, config, writer, runner)
        seconds = time.perf_counter() - started
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"decontamination": decon.model_dump(mode="json"), "boilerplate_lines": lines.model_dump(),
                    "keep_rejected_text": config.curation.keep_rejected_text,
                    "benchmarks": benchmarks.summary() if benchmarks else {}},
            inputs={f"{CURATED}/{source}": curated.data_version, f"{INDEX}/{refresh}": index.data_version},
            counts={"input": stats.docs_in, "documents": stats.docs_out, "rejected": stats.docs_in - stats.docs_out},
            stats={**stats.to_dict(), "contamination": contamination})
    overlap = [] if benchmarks is None else overlapping_documents(writer.committed.files("documents"), decon, runner)
    checks = standard_checks(writer.committed, curated.counts["documents"]) + [
        dg.AssetCheckResult(check_name="no_benchmark_overlap", passed=not overlap,
                            metadata={"documents_with_overlap": len(overlap),
                                      "examples": dg.MetadataValue.json(overlap[:5])})]
    return materialize_result(
        manifest, stats, store, checks, **engine_metadata(runner, stats.docs_in, seconds),
        contamination=dg.MetadataValue.json(contamination["per_benchmark"]),
        contaminated_items=dg.MetadataValue.md(contamination["markdown"]),
        **full_funnel(store, manifest, stats, "deduplicated documents"))


@dataclass(frozen=True)
class DedupInputs:
    """What one source's dedup apply reads, each pinned to one version (Store.snapshot): its curated documents, the
    refresh's index, and every source's signatures (whose part counts place this source's decisions in the index).
    Decisions are matched to parts by row counts, so a version of one read with another's would drop the wrong
    documents."""

    source: str
    curated: Snapshot
    index: Snapshot
    signatures: dict[str, Snapshot]  # source name -> its signatures, config order


def pinned_inputs(store, config, name: str, refresh: str) -> DedupInputs:
    return DedupInputs(name, store.snapshot(CURATED, partition(name, refresh)), store.snapshot(INDEX, refresh),
                       {s.name: store.snapshot(SIGNATURES, partition(s.name, refresh)) for s in config.sources})


def apply_decisions(inputs: DedupInputs, config, writer, engine, progress: bool = True):
    """Write one source's deduplicated documents through `writer`, one engine task per curated part, each reading its
    part and its part's decisions only (kiln.dedup.apply); returns (stage stats, contamination report)."""
    return deduplicate_source(
        inputs.curated.files("documents"), _decisions_of_parts(inputs), inputs.index.files("lines"),
        config.dedup.boilerplate_lines, config.decontamination, writer, engine,
        examples_per_reason=config.curation.examples_per_reason, rejected_text=config.curation.keep_rejected_text,
        progress=progress, label=f"dedup apply {inputs.curated.manifest.partition}")


def _decisions_of_parts(inputs: DedupInputs) -> list:
    """Each curated part's decisions file in the refresh's index, from the manifests' row counts alone (no decision
    is read here): the index numbered the signature parts of every source in config order (`dedup_index`)."""
    names = list(inputs.signatures)
    offset = sum(len(inputs.signatures[n].files("signatures")) for n in names[:names.index(inputs.source)])
    mine = slice(offset, offset + len(inputs.signatures[inputs.source].files("signatures")))
    index = inputs.index
    return decisions_by_part(_rows(inputs.curated, "documents"), _rows(inputs.signatures[inputs.source], "signatures"),
                             index.files("decisions")[mine], _rows(index, "decisions")[mine],
                             f"{CURATED}/{inputs.curated.manifest.partition} and {INDEX}/{index.manifest.partition}")


def _rows(dataset: Snapshot, role: str) -> list[int]:
    """Rows per file of one role, as the manifest recorded them (from the footer where it did not)."""
    return [f.rows if f.rows is not None else pq.ParquetFile(p).metadata.num_rows
            for f, p in zip(dataset.manifest.files_with_role(role), dataset.files(role))]


