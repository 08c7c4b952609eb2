"""What every data asset reports: manifest-derived data version, counts, funnel, histograms, checks."""

from __future__ import annotations

import dagster as dg
import pyarrow.parquet as pq

from kiln.common.manifest import Manifest
from kiln.common.stats import StageStats, chain, examples_markdown, funnel_markdown, length_histogram_markdown
from kiln.common.storage import Snapshot, Store
from kiln.curation.documents import DOCUMENT_SCHEMA
from kiln.engine import Engine
from kiln.governance.catalog import RAW, stages_read

CHECKS = ("conservation", "non_empty", "schema")


def check_specs(asset: str, *extra: str) -> list[dg.AssetCheckSpec]:
    descriptions = {
        "conservation": "documents in = kept + rejected (+ quarantined): nothing disappears silently",
        "non_empty": "the output holds at least one document (when any came in)",
        "schema": "every documents part has the document contract's columns and types",
        "residual_pii": "no PII pattern is left in the output's text, url or meta",
    }
    return [dg.AssetCheckSpec(name, asset=asset, blocking=name != "non_empty", description=descriptions[name])
            for name in (*CHECKS, *extra)]


def standard_checks(output: Snapshot, docs_in: int) -> list[dg.AssetCheckResult]:
    """Checks of the version just committed (`DatasetWriter.committed`) computed from what is on disk (file row
    counts), not from the counters that wrote it."""
    manifest = output.manifest
    rows = {role: sum(f.rows or 0 for f in manifest.files_with_role(role))
            for role in ("documents", "rejected", "quarantine")}
    accounted = rows["documents"] + rows["rejected"] + rows["quarantine"]
    bad_schema = []
    for f in manifest.files_with_role("documents"):
        schema = pq.read_schema(output.folder / f.path)
        missing = [fld.name for fld in DOCUMENT_SCHEMA if schema.get_field_index(fld.name) < 0
                   or not schema.field(fld.name).type.equals(fld.type)]
        if missing:
            bad_schema.append(f"{f.path}: {missing}")
    return [
        dg.AssetCheckResult(check_name="conservation", passed=accounted == docs_in,
                            metadata={"in": docs_in, "kept": rows["documents"], "rejected": rows["rejected"],
                                      "quarantined": rows["quarantine"], "unaccounted": docs_in - accounted}),
        # A refresh that brought a source nothing has nothing to keep; an input that was all removed is the warning.
        dg.AssetCheckResult(check_name="non_empty", passed=rows["documents"] > 0 or docs_in == 0,
                            severity=dg.AssetCheckSeverity.WARN, metadata={"documents": rows["documents"],
                                                                           "input": docs_in}),
        dg.AssetCheckResult(check_name="schema", passed=not bad_schema,
                            metadata={"problems": dg.MetadataValue.json(bad_schema), "parts": len(
                                manifest.files_with_role("documents"))}),
    ]


def stage_metadata(manifest: Manifest, stats: StageStats, store: Store) -> dict:
    return {
        "documents": stats.docs_out,
        "rejected": stats.docs_dropped,
        "characters": stats.chars_out,
        "kept_share": round(stats.docs_out / max(stats.docs_in, 1), 4),
        "funnel": dg.MetadataValue.md(funnel_markdown(stats)),
        "length_histogram": dg.MetadataValue.md(
            length_histogram_markdown(stats.lengths_out, "kept documents (characters)") + "\n\n"
            + length_histogram_markdown(stats.lengths_dropped, "removed documents (characters)")),
        "removed_examples": dg.MetadataValue.md(examples_markdown(stats)),
        "path": dg.MetadataValue.path(str(store.dataset_dir(manifest.asset, manifest.partition))),
        "data_version": manifest.data_version,
        "git_commit": manifest.git_commit or "unknown",
    }


def full_funnel(store: Store, manifest: Manifest, stats: StageStats, output: str) -> dict:
    """The funnel from raw records to this output, over the versions of the stages it was built from (never
    over a stage materialized again since)."""
    stages = stages_read(store, manifest)
    start = "raw records" if stages and stages[0].asset == RAW else \
        f"`{(stages[0] if stages else manifest).asset}` (the versions read before it predate the store's history)"
    funnel = chain([StageStats.from_dict(m.stats) for m in stages] + [stats])
    return {"full_funnel": dg.MetadataValue.md(f"From {start} to {output}:\n\n" + funnel_markdown(funnel))}


def engine_metadata(engine: Engine, documents: int, seconds: float) -> dict:
    """Where a stage ran and how fast: engine, address (never credentials), workers, documents/s, and the
    Ray dashboard when one is running."""
    described = engine.describe()
    metadata = {"engine": dg.MetadataValue.json(described),
                "docs_per_second": round(documents / max(seconds, 1e-9), 1), "stage_seconds": round(seconds, 2)}
    if "dashboard" in described:
        metadata["ray_dashboard"] = dg.MetadataValue.url(described["dashboard"])
    return metadata


def materialize_result(manifest: Manifest, stats: StageStats, store: Store, checks: list[dg.AssetCheckResult],
                       **extra_metadata) -> dg.MaterializeResult:
    return dg.MaterializeResult(metadata={**stage_metadata(manifest, stats, store), **extra_metadata},
                                check_results=checks, data_version=dg.DataVersion(manifest.data_version))
