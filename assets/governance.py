"""Governance: the data card of the current checkpoint (uses, sources, licences, languages, funnel, lineage)."""

import json

import dagster as dg

from assets.partitions import follow_only
from assets.tokens import SHARDS, TOKENIZER
from assets.training import CHECKPOINT, EVALUATION, RUN
from kiln.common.manifest import code_version
from kiln.common.plots import png_markdown
from kiln.common.secrets import redact_url
from kiln.governance.catalog import Catalog, node_key
from kiln.governance.data_card import DATA_CARD, build_data_card
from kiln.governance.data_card_markdown import FUNNEL_PNG, FUNNEL_TITLE, data_card_markdown, funnel_png
from kiln.governance.forget import REQUESTS
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.governance.refresh import partition
from resources import KilnConfig, KilnStorage, MlflowTracking


# Recorded by `kiln forget`, outside Dagster; `removal_requests_sensor` reports each new version, so the assets that
# apply the requests (the quality filter, the token shards) show as stale until they are materialized again.
removal_requests = dg.AssetSpec(
    REQUESTS, group_name="governance", kinds={"json"},
    description="Removal requests (`kiln forget`): whole sources, URL patterns or doc ids to take out of training "
                "data. Applied by quality_filtered_documents and, for every refresh, by token_shards.")


@dg.asset(
    key=DATA_CARD, group_name="governance", kinds={"python", "markdown", "json"},
    automation_condition=follow_only(CHECKPOINT, EVALUATION),
    deps=[CHECKPOINT, EVALUATION, RUN, SHARDS, TOKENIZER, REQUESTS,
          *[dg.AssetDep(stage, partition_mapping=dg.AllPartitionMapping()) for stage in DOCUMENT_STAGES]],
    code_version=code_version("kiln.governance.data_card", "kiln.governance.data_card_markdown",
                              "kiln.governance.data_card_documents", "kiln.governance.document_facts",
                              "kiln.common.plots", "kiln.governance.audit",
                              "kiln.governance.catalog", "kiln.governance.lineage", "kiln.governance.forget",
                              "kiln.common.stats", "kiln.dedup.report"),  # the card's funnel and cross-source table
    check_specs=[dg.AssetCheckSpec("lineage_complete", asset=DATA_CARD, blocking=False,
                                   description="the checkpoint's lineage reaches raw_documents for every source in its "
                                               "token shards, and every recorded input version is the one in the store")],
)
def data_card(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
              mlflow_tracking: MlflowTracking) -> dg.MaterializeResult:
    """The checkpoint's data card (markdown + JSON + the funnel chart as a PNG): intended use and limitations (the
    `card:` config), sources, the documents' own licences and languages, sizes at every stage, the filter funnel,
    dedup, decontamination and PII figures, tokenizer, mixture and epochs, what the run read, training settings, the
    MLflow run, and the lineage chain back to the raw sources with hashes."""
    config, store = kiln_config.load(), storage.store()
    tracking_uri = mlflow_tracking.tracking_uri  # its credentials never reach the card or the metadata
    # A tracking server's page of the checkpoint's own run (the card finds it: the store's newest training_run may be
    # a later one); a local store is linked from the card by a path relative to the card's folder (a loopback UI
    # address would not open on a reviewer's machine).
    run_url = mlflow_tracking.run_url if tracking_uri.startswith(("http://", "https://")) else None
    card = build_data_card(store, config, run_url=run_url, tracking_uri=tracking_uri)
    mlflow = card["mlflow"] or {}
    url = mlflow.get("url")
    card["funnel"]["chart"] = FUNNEL_PNG
    chart = funnel_png(card)
    unknown = config.card.list_unknown_licenses
    markdown = data_card_markdown(card, f"![{FUNNEL_TITLE}]({FUNNEL_PNG})", unknown)
    # The versions the checkpoint was built from (its lineage), also where one was materialized again since: the card
    # describes those. The removal requests are the store's current ones, as the card lists them.
    chain = card["lineage"]
    catalog = Catalog(store, pins={n["key"]: n["data_version"] for n in chain["nodes"]
                                   if n["data_version"] and n["key"] != REQUESTS})
    found = [(a, None) for a in (CHECKPOINT, RUN, TOKENIZER)] + \
        [(SHARDS, card["shards"]["refresh"] if card["shards"] else None)] + \
        [(stage, partition(s["name"], r["key"])) for stage in DOCUMENT_STAGES for s in card["sources"]
         for r in card["refreshes"]]
    found.append((REQUESTS, None))  # removal requests recorded after training are part of the card
    inputs = {node_key(a, p): m.data_version for a, p in found if (m := catalog.manifest(a, p)) is not None}
    if card["evaluation"]:  # the evaluation of this checkpoint the card shows
        inputs[EVALUATION] = card["evaluation"]["data_version"]
    with store.staging(DATA_CARD) as writer:
        (writer.dir / "data_card.md").write_text(markdown, encoding="utf-8")
        (writer.dir / FUNNEL_PNG).write_bytes(chart)
        (writer.dir / "data_card.json").write_text(json.dumps(card, indent=2, ensure_ascii=False, default=str),
                                                   encoding="utf-8")
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"sources": [s["name"] for s in card["sources"]], "card": config.card.model_dump(mode="json")},
            inputs=inputs,
            counts={"sources": len(card["sources"]), "lineage_datasets": len(chain["nodes"])},
            stats={"checkpoint": card["checkpoint"]["data_version"], "format": card["format"]})
    base = store.dataset_dir(DATA_CARD)
    # Every source in the shard set must trace back to its raw documents, and no input may have been replaced
    # (the card's own lineage: writing the card does not touch the checkpoint's chain).
    raw = {n["partition"].split("/")[0] for n in chain["nodes"] if n["asset"] == DOCUMENT_STAGES[0]}
    missing = sorted(s["name"] for s in card["sources"] if s["name"] not in raw)
    links = {"mlflow_run": dg.MetadataValue.url(url) if url else
             f"run {mlflow['run_id']} in {redact_url(tracking_uri)}" if mlflow.get("run_id") else "none"}
    # The UI shows no files beside the metadata: the chart goes inline there.
    shown = data_card_markdown(card, png_markdown(chart, FUNNEL_TITLE), unknown)
    return dg.MaterializeResult(
        metadata={"data_card": dg.MetadataValue.md(shown), "removal_requests": len(card["removal_requests"]),
                  "path": dg.MetadataValue.path(str(base / "data_card.md")),
                  "json": dg.MetadataValue.path(str(base / "data_card.json")),
                  "checkpoint": card["checkpoint"]["data_version"],
                  "checkpoint_path": dg.MetadataValue.path(card["checkpoint"]["path"]),
                  "lineage_datasets": len(chain["nodes"]), "data_version": manifest.data_version, **links},
        check_results=[dg.AssetCheckResult(
            check_name="lineage_complete", passed=not missing and not chain["problems"],
            severity=dg.AssetCheckSeverity.WARN,
            metadata={"sources_without_raw_lineage": dg.MetadataValue.json(missing),
                      "problems": dg.MetadataValue.json(chain["problems"])})],
        data_version=dg.DataVersion(manifest.data_version))
