"""Curation: raw sources → filtered documents → curated (exactly deduplicated) documents, per source and
refresh."""

import json
import time

import dagster as dg

from assets.partitions import (
    FOLLOW,
    FOLLOW_IN_ORDER,
    SAME_REFRESH_EVERY_SOURCE,
    document_partitions,
    refresh_partitions,
    source_and_refresh,
)
from assets.results import check_specs, engine_metadata, full_funnel, materialize_result, standard_checks
from kiln.common.manifest import code_version
from kiln.common.secrets import redact
from kiln.common.storage import Snapshot, resume_key
from kiln.curation.exact_dedup import HashSource, exact_dedup, remove_shuffle, stale_shuffles
from kiln.curation.filters.badwords import DEFAULT_WORDS_FILE
from kiln.curation.filters.registry import build_step
from kiln.curation.filters.url import DEFAULT_BLOCKLIST
from kiln.curation.pii import PiiRedaction
from kiln.curation.pipeline import filter_documents, ingest, list_file_digests, profile_steps
from kiln.curation.readers import SourceFile
from kiln.curation.residual_pii import scan_documents
from kiln.engine import Engine
from kiln.governance.refresh import (
    check_unchanged,
    ensure_refresh,
    load_refreshes,
    partition,
    require_earlier,
    unmaterialized,
    upto,
)
from resources import KilnConfig, KilnEngine, KilnStorage

RAW, FILTERED, CURATED = "raw_documents", "filtered_documents", "curated_documents"
KINDS = {"python", "parquet"}


@dg.asset(
    key=RAW, partitions_def=document_partitions, group_name="curation", kinds=KINDS,
    # quarantine excerpts are redacted: the redactor's code is the raw layer's too
    code_version=code_version("kiln.curation.readers", "kiln.curation.pipeline", "kiln.curation.documents",
                              "kiln.common.storage", "kiln.common.removals", "kiln.curation.pii",
                              "kiln.curation.exact_dedup", "kiln.dedup.shuffle"),  # the doc-id repeats' shuffle
    check_specs=check_specs(RAW),
)
def raw_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                  engine: KilnEngine) -> dg.MaterializeResult:
    """Every readable record of one source in one refresh as a document with a stable id (the first refresh
    reads the source as configured, later ones the files that landed for it); unreadable ones quarantined.
    Files are read in parallel on the engine, one task each."""
    config, store = kiln_config.load(), storage.store()
    runner = engine.get(config.engine)
    name, key = source_and_refresh(context)
    added = context.instance.get_dynamic_partitions(refresh_partitions.name)  # the order automation follows
    source, refresh = config.source(name), ensure_refresh(store, config, key, added)
    landed = refresh.files_of(name)
    check_unchanged(refresh, source)  # the same files as when the refresh was registered, or a clear error
    files = None if refresh.is_initial else [SourceFile(f.uri, f.relative) for f in landed]
    started = time.perf_counter()
    with store.staging(RAW, partition(name, key)) as writer:
        stats = ingest(source, config.reading, writer, runner, examples_per_reason=config.curation.examples_per_reason,
                       files=files, namespace="" if refresh.is_initial else key,
                       rejected_text=config.curation.keep_rejected_text)
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"source": source.model_dump(mode="json"), "reading": config.reading.model_dump(mode="json"),
                    "refresh": {"key": key, "trigger": refresh.trigger, "created_at": refresh.created_at,
                                "landed_files": None if refresh.is_initial else [vars(f) for f in landed]}},
            inputs={}, counts={"records": stats.docs_in, "documents": stats.docs_out,
                               "quarantined": stats.docs_in - stats.docs_out},
            stats=stats.to_dict())
    quarantined = dict(stats.steps["read"].dropped)
    return materialize_result(manifest, stats, store, standard_checks(writer.committed, stats.docs_in),
                              quarantined=sum(quarantined.values()),
                              quarantine_reasons=dg.MetadataValue.json(quarantined),
                              **engine_metadata(runner, stats.docs_in, time.perf_counter() - started))


@dg.asset(
    key=FILTERED, deps=[RAW], partitions_def=document_partitions, group_name="curation", kinds=KINDS,
    code_version=code_version("kiln.curation.filters", "kiln.curation.pii", "kiln.curation.pipeline", "kiln.common.removals",
                              "kiln.common.stats", "kiln.common.text_units", "kiln.curation.documents",
                              "kiln.curation.exact_dedup",  # duplicates_in: the repeats the filter stage drops
                              data=(DEFAULT_BLOCKLIST, DEFAULT_WORDS_FILE)),  # the built-in lists decide too
    check_specs=check_specs(FILTERED), automation_condition=FOLLOW,
)
def filtered_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                       engine: KilnEngine) -> dg.MaterializeResult:
    """Normalized documents that pass the source's filter profile, with PII replaced by typed placeholders."""
    config, store = kiln_config.load(), storage.store()
    name, key = source_and_refresh(context)
    here = partition(name, key)
    raw = store.snapshot(RAW, here)  # pinned: the version recorded is the one filtered
    steps = profile_steps(config, name)
    runner = engine.get(config.engine)
    version = dict(code_version=context.assets_def.code_versions_by_key[context.asset_key],
                   config={"profile": config.source(name).profile, "steps": [s.model_dump() for s in steps],
                           "exact_dedup": config.curation.exact_dedup.model_dump(),
                           "keep_rejected_text": config.curation.keep_rejected_text,
                           "list_files": list_file_digests(steps)},
                   inputs={f"{RAW}/{here}": raw.manifest.data_version})
    with store.staging(FILTERED, here, resume=resume_key(**version)) as writer:
        started = time.perf_counter()
        stats = filter_documents(raw.files("documents"), steps, config.curation.exact_dedup, writer,
                                 runner, examples_per_reason=config.curation.examples_per_reason,
                                 label=f"filter {here}", rejected_text=config.curation.keep_rejected_text)
        seconds = time.perf_counter() - started
        manifest = writer.commit(
            **version, counts={"input": stats.docs_in, "documents": stats.docs_out, "rejected": stats.docs_in - stats.docs_out},
            stats=stats.to_dict())
    pii = dict(stats.steps["pii"].counts) if "pii" in stats.steps else {}
    checks = standard_checks(writer.committed, raw.manifest.counts["documents"])
    return materialize_result(manifest, stats, store, checks,
                              **engine_metadata(runner, stats.docs_in, seconds),
                              pii_redactions=dg.MetadataValue.json(pii), pii_total=sum(pii.values()),
                              step_seconds=dg.MetadataValue.json({n: round(s.seconds, 2) for n, s in stats.steps.items()}))


@dg.asset(
    key=CURATED, partitions_def=document_partitions, group_name="curation", kinds=KINDS,
    # Exact dedup compares every source's hashes, so each partition depends on every source of its refresh.
    deps=[dg.AssetDep(FILTERED, partition_mapping=SAME_REFRESH_EVERY_SOURCE)],
    code_version=code_version("kiln.curation.exact_dedup", "kiln.common.removals", "kiln.common.stats",
                              "kiln.curation.documents", "kiln.dedup.shuffle"),  # the hash shuffle exact dedup reads
    check_specs=check_specs(CURATED, "residual_pii"), automation_condition=FOLLOW_IN_ORDER,
)
def curated_documents(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                      engine: KilnEngine) -> dg.MaterializeResult:
    """The clean documents of one source in one refresh: filtered, PII-free, and exactly deduplicated across all
    sources and against every earlier refresh (whose copy always wins: it may already be in token shards)."""
    config, store = kiln_config.load(), storage.store()
    name, key = source_and_refresh(context)
    here = partition(name, key)
    # Every input pinned (Store.snapshot): the versions recorded are the ones compared.
    inputs = {partition(s.name, key): store.snapshot(FILTERED, partition(s.name, key)) for s in config.sources}
    # Earlier refreshes' curated documents, as "tier 0": better than any copy in this refresh. A source added to
    # the config later has no dataset in earlier refreshes; the manifest lists exactly what was compared. One an
    # earlier refresh holds that is not curated yet is still to come: refused.
    names, before = [s.name for s in config.sources], upto(load_refreshes(store), key)[:-1]
    require_earlier(CURATED, here, unmaterialized(store, CURATED, names, before))
    earlier = {p: m for r in before for s in names
               if (m := store.snapshot_or_none(CURATED, p := partition(s, r.key))) is not None}
    dedup = config.curation.exact_dedup
    sources = [HashSource(p, 0, tuple(map(str, m.files("documents")))) for p, m in earlier.items()] + [
        HashSource(p, config.source(p.split("/")[0]).quality_tier, tuple(map(str, m.files("documents"))))
        for p, m in inputs.items()]
    runner = engine.get(config.engine)
    version = dict(code_version=context.assets_def.code_versions_by_key[context.asset_key],
                   config={"exact_dedup": dedup.model_dump(), "sources": [s.name for s in config.sources],
                           "quality_tiers": {s.name: s.quality_tier for s in config.sources},
                           "earlier_refreshes": sorted({p.split("/")[1] for p in earlier}),
                           "keep_rejected_text": config.curation.keep_rejected_text},
                   inputs={**{f"{FILTERED}/{p}": m.manifest.data_version for p, m in inputs.items()},
                           **{f"{CURATED}/{p}": m.manifest.data_version for p, m in earlier.items()}})
    # Every source of the refresh has this same version, so they share one shuffle (done by the first to get there).
    shuffle = store.shared_scratch(CURATED, f"exact-dedup-{key}-{resume_key(**version)}")
    for stale in stale_shuffles(shuffle):
        remove_shuffle(stale, wait=False)  # this refresh's inputs have changed since; unless another run uses it
    with store.staging(CURATED, here, resume=resume_key(**version)) as writer:
        started = time.perf_counter()
        stats = exact_dedup(sources, [s.name for s in sources].index(here), writer, shuffle, runner, dedup.enabled,
                            config.curation.examples_per_reason, label=f"exact dedup {here}",
                            rejected_text=config.curation.keep_rejected_text)
        seconds = time.perf_counter() - started
        manifest = writer.commit(
            **version, counts={"input": stats.docs_in, "documents": stats.docs_out, "rejected": stats.docs_in - stats.docs_out},
            stats=stats.to_dict())
    recorded = json.loads(json.dumps(redact(version["config"])))  # the config as a manifest holds it
    if all((m := store.manifest_or_none(CURATED, p)) is not None and m.inputs == version["inputs"]
           and m.config == recorded for p in inputs):
        remove_shuffle(shuffle)  # the last source of the refresh is done
    checks = standard_checks(writer.committed, inputs[here].manifest.counts["documents"]) + [
        residual_pii_check(writer.committed, build_step("pii", config.curation.pii), runner)]
    return materialize_result(manifest, stats, store, checks, **engine_metadata(runner, stats.docs_in, seconds),
                              **full_funnel(store, manifest, stats, "curated documents"))


def residual_pii_check(output: Snapshot, step: PiiRedaction, engine: Engine) -> dg.AssetCheckResult:
    """Scan the output with a second, independent detector (kiln.curation.residual_pii: its own code and patterns, so it finds
    what the redactor's own patterns miss, which scanning with them again never could), for the types and exemptions
    the `pii` step is configured with: a type turned off there is not looked for. Any hit means redaction missed
    something. The text, the `url` and the `meta` are scanned (the filter stage redacts all three), one engine task
    per part. Reports hits per type and per field and document ids only, never the matched text."""
    report = scan_documents(output.files("documents"), step.types, step.ipv4_keep, step.keep_documentation,
                            step.phone_regions, engine)
    return dg.AssetCheckResult(check_name="residual_pii", passed=not report.hits,
                               metadata={"hits": dg.MetadataValue.json(report.hits),
                                         "fields": dg.MetadataValue.json(report.fields),
                                         "examples": dg.MetadataValue.json(report.examples)})

