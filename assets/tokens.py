"""The tokenizer and the training-ready token shards (one version per refresh), from every source's
quality-filtered documents."""

import time
from pathlib import Path

import dagster as dg

from assets.partitions import FOLLOW, FOLLOW_FILTERED, LOADED_CONFIG, ONCE, SAME_REFRESH, refresh_partitions
from assets.quality import QUALITY_FILTERED
from assets.results import engine_metadata
from kiln.common.manifest import code_version, sha256_file
from kiln.common.plots import stacked_bars_markdown
from kiln.governance.forget import (
    REQUESTS,
    applied_requests,
    load_requests,
    raw_partitions,
    unapplied_requests,
    with_intake_urls,
)
from kiln.governance.refresh import Refresh, load_refreshes, materialized, unmaterialized, upto
from kiln.tokens.interchange import export_shards, verify_export
from kiln.tokens.mixture import MixtureError, SourceParts
from kiln.tokens.shard_format import read_shard_set, verify_shards
from kiln.tokens.shard_writer import write_token_shards
from kiln.tokens.tokenizer import (
    Tokenizer,
    TokenizerError,
    bring_tokenizer,
    draw_training_sample,
    round_trip_changes,
    tokenizer_report,
    train_tokenizer,
)
from resources import KilnConfig, KilnEngine, KilnStorage

TOKENIZER, SHARDS = "tokenizer", "token_shards"
ALL_SOURCES = dg.AssetDep(QUALITY_FILTERED, partition_mapping=dg.AllPartitionMapping())


def _sources(config, store, refreshes: list[Refresh]) -> tuple[list[SourceParts], dict[str, str]]:
    """Every source's quality-filtered parts over these refreshes (config order, oldest refresh first) and their
    data versions, for the manifest."""
    parts, inputs = [], {}
    for s in config.sources:
        found = materialized(store, QUALITY_FILTERED, [s.name], refreshes)
        inputs |= {f"{QUALITY_FILTERED}/{p}": m.manifest.data_version for p, m in found.items()}
        parts.append(SourceParts(s.name, s.domain, [f for m in found.values() for f in m.files("documents")]))
    return parts, inputs


@dg.asset(
    key=TOKENIZER, deps=[ALL_SOURCES], group_name="tokens", kinds={"python", "sentencepiece"}, automation_condition=ONCE,
    code_version=code_version("kiln.tokens.tokenizer", "kiln.tokens.mixture", "kiln.tokens.fim"),
    check_specs=[dg.AssetCheckSpec("round_trip", asset=TOKENIZER, blocking=True,
                                   description="decode(encode(text)) == text on every sampled document, whole and cut "
                                               "into FIM prefix, middle and suffix encoded piece by piece (a brought "
                                               "tokenizer, or one trained with a setting that gives exactness up, "
                                               "that changes some text: a warning, with the counts)")],
)
def tokenizer(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage) -> dg.MaterializeResult:
    """The sentencepiece BPE tokenizer (byte fallback, exact round trip, BOS/EOS/PAD/FIM tokens) trained on a
    sample drawn by the mixture weights from every refresh so far, or the file `tokenizer.source` names, measured on
    that sample. Fitted once: a new tokenizer invalidates every refresh's token shards."""
    config, store = kiln_config.load(), storage.store()
    refreshes = load_refreshes(store)
    sources, inputs = _sources(config, store, refreshes)
    requests, requests_version = load_requests(store)
    if requests_version:
        inputs[REQUESTS] = requests_version
    # no document a removal request names is drawn, in an older refresh either (URLs as intake read them)
    matchers = with_intake_urls(store, requests, raw_partitions(store, [s.name for s in sources], refreshes))
    try:
        sample = draw_training_sample(sources, config.mixture.weights, config.tokenizer, matchers)
    except MixtureError as exc:  # the message names the weights or the sources to fix
        raise dg.Failure(description=str(exc)) from None
    with store.staging(TOKENIZER) as writer:
        trained = config.tokenizer.source == "train"
        try:
            card = (train_tokenizer if trained else bring_tokenizer)(sample, config.tokenizer, writer.dir)
        except TokenizerError as exc:  # what to change is in the message: show it as the failure itself
            raise dg.Failure(description=str(exc)) from None
        tok = Tokenizer.load(writer.dir)
        report = tokenizer_report(tok, sample.documents)
        changed = round_trip_changes(tok, (d for docs in sample.documents.values() for d in docs),
                                     config.tokenizer.seed)
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config=tokenizer_recipe(config),
            inputs=inputs, counts={"vocab_size": card.vocab_size, "sample_documents": card.sample["documents"],
                                   "sample_chars": card.sample["chars"]},
            stats={"card": card.to_dict(), "report": report})
    return dg.MaterializeResult(
        metadata={
            "sha256": card.sha256, "vocab_size": card.vocab_size, "dtype": card.dtype,
            "source": card.source, "kind": f"{card.kind} {card.model_type}",
            "sample": dg.MetadataValue.json(card.sample),
            "fit_per_source": dg.MetadataValue.md(fit_markdown(report["sources"], "source")),
            "fit_per_language": dg.MetadataValue.md(fit_markdown(report["languages"], "language")),
            "fit_per_script": dg.MetadataValue.md(fit_markdown(report["scripts"], "script")),
            "examples": dg.MetadataValue.md(examples_markdown(report["examples"])),
            "special_tokens": dg.MetadataValue.json(card.special_tokens),
            "training_seconds": card.seconds, "data_version": manifest.data_version,
            "path": dg.MetadataValue.path(str(store.dataset_dir(TOKENIZER))),
        },
        # A tokenizer trained with the exact settings that loses text is a bug (blocks); a brought one, or one trained
        # with a key that gives exactness up (normalization: nfkc, ...), may change text by design (warns).
        check_results=[dg.AssetCheckResult(check_name="round_trip", passed=not changed["whole"] and not changed["fim"],
                                           severity=dg.AssetCheckSeverity.ERROR if config.tokenizer.exact else
                                           dg.AssetCheckSeverity.WARN,
                                           metadata={"documents_checked": card.sample["documents"],
                                                     "documents_changed": len(changed["whole"]),
                                                     "broken": dg.MetadataValue.json(changed["whole"][:10]),
                                                     "fim_documents_changed": len(changed["fim"]),
                                                     "fim_broken": dg.MetadataValue.json(changed["fim"][:10])})],
        data_version=dg.DataVersion(manifest.data_version))


def tokenizer_recipe(config) -> dict:
    """What the tokenizer is built from, as its manifest records it (`make demo` rebuilds it when this changes): the
    settings and, for a brought tokenizer, its file's sha256 (the same path may hold a new file)."""
    brought = config.tokenizer.source != "train"
    return {"tokenizer": config.tokenizer.applicable(), "mixture_weights": config.mixture.weights,
            **({"source_sha256": sha256_file(Path(config.tokenizer.source).expanduser())} if brought else {})}


def fit_markdown(rows: dict[str, dict], label: str) -> str:
    lines = [f"| {label} | documents | tokens | fertility (tokens/word) | tokens/char | bytes/token | byte-fallback share |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['documents']:,} | {r['tokens']:,} | {r['fertility']} | {r['tokens_per_char']} | "
                     f"{r['bytes_per_token']} | {r['byte_fallback_share']:.2%} |"
                     if r["tokens"] else f"| {name} | {r['documents']:,} | 0 | | | | |")
    return "\n".join(lines)


def examples_markdown(examples: list[dict]) -> str:
    out = []
    for e in examples:
        pieces = " ".join(f"`{p}`" for p in e["pieces"][:60]).replace("|", "\\|")
        out.append(f"**{e['source']}** `{e['doc_id']}` ({e['tokens']} tokens): {pieces}")
    return "\n\n".join(out)


@dg.asset(
    # The removal requests are an input: a new request makes every shard version stale (it may name any refresh).
    # Under automation the shards follow the quality filter that applies it (FOLLOW_FILTERED), not the request.
    key=SHARDS, deps=[TOKENIZER, dg.AssetDep(QUALITY_FILTERED, partition_mapping=SAME_REFRESH), REQUESTS],
    partitions_def=refresh_partitions, automation_condition=FOLLOW_FILTERED, group_name="tokens",
    kinds={"python", "numpy"},
    code_version=code_version("kiln.tokens.shard_writer", "kiln.tokens.shard_format", "kiln.tokens.mixture", "kiln.tokens.fim",
                              "kiln.tokens.draw", "kiln.governance.forget", "kiln.governance.document_facts",
                              "kiln.tokens.tokenizer",  # encode_batch: the token ids
                              "kiln.common.splitmix"),  # the shuffle keys
    check_specs=[
        dg.AssetCheckSpec("shards_verified", asset=SHARDS, blocking=True,
                          description="every shard's header, size and tokenizer hash check out; totals match"),
        dg.AssetCheckSpec("mixture_on_target", asset=SHARDS, blocking=False,
                          description="every source's share of each phase is within 1 point of its weight"),
    ],
)
def token_shards(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
                 engine: KilnEngine) -> dg.MaterializeResult:
    """The training set as of one refresh: every refresh up to it, as token shards with a train/validation split
    by document hash, mixture weights and curriculum phases, fill-in-the-middle for code, a deterministic
    shuffle; EOS between documents. Every removal request so far is applied to every refresh's documents."""
    config, store = kiln_config.load(), storage.store()
    refresh = context.partition_key
    included = upto(load_refreshes(store), refresh)
    missing = unmaterialized(store, QUALITY_FILTERED, [s.name for s in config.sources], included)
    if missing:  # left out, the set would say it holds those refreshes while none of their documents is in it
        raise dg.Failure(description=(
            f"token_shards[{refresh}] holds every refresh up to it, but {QUALITY_FILTERED} was never materialized "
            f"for {', '.join(missing)} (its intake failed or never ran); materialize those partitions first"))
    sources, inputs = _sources(config, store, included)
    tok = store.snapshot(TOKENIZER)  # the version recorded is the one encoded with
    inputs[TOKENIZER] = tok.manifest.data_version
    requests, requests_version = load_requests(store)
    if requests_version:
        inputs[REQUESTS] = requests_version
    # a URL pattern matched against the URLs as read (the documents' own are redacted): the ids it names go along
    matchers = with_intake_urls(store, requests, raw_partitions(store, [s.name for s in sources], included))
    runner = engine.get(config.engine)
    newly_applied = {r.request_id for r in requests} - applied_requests(store.manifest_or_none(SHARDS, refresh))
    with store.staging(SHARDS, refresh) as writer:
        started = time.perf_counter()
        try:
            result = write_token_shards(sources, tok.folder, config.shards, config.mixture, writer,
                                        runner, requests=matchers, license_fields=config.card.license_fields)
        except (TokenizerError, MixtureError) as exc:  # e.g. FIM and a brought tokenizer without FIM symbols;
            # a weighted source with no training tokens: the message names the key to change
            raise dg.Failure(description=str(exc)) from None
        seconds = time.perf_counter() - started
        removed = {n: s["removed_by_request"] for n, s in result.sources.items() if s["removed_by_request"]}
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"shards": config.shards.model_dump(mode="json"),
                    "mixture": config.mixture.model_dump(mode="json", exclude={"replay"}),  # replay is the run's
                    "refreshes": [r.key for r in included], "removal_requests": [r.request_id for r in requests]},
            inputs=inputs, counts=result.counts(), stats=result.manifest_stats(),
            forget_replaced=bool(newly_applied))  # the shards replaced may hold what the new requests remove
    for warning in result.warnings:
        context.log.warning(warning)
    exported = store.manifest_or_none(EXPORTS, refresh)
    # Nothing re-exports the refresh when shards.export is [] (the export does not follow) or refresh.automation is
    # false (nothing follows): its export still holds the removed documents' tokens for a Megatron or HF run.
    not_following = ("shards.export is []" if not config.shards.export else
                     "refresh.automation is false" if not config.refresh.automation else None)
    if newly_applied and not_following and exported is not None and exported.config.get("export"):
        # (an export made with shards.export [] holds no tokens: nothing to warn of)
        context.log.warning(f"{EXPORTS}/{refresh} was exported from shards that hold documents a removal request "
                            f"removed since ({', '.join(sorted(newly_applied))}), and {not_following}, so nothing "
                            f"re-exports it: materialize {EXPORTS} for {refresh} again, or delete "
                            f"{store.dataset_dir(EXPORTS, refresh)}")
    base, written = store.dataset_dir(SHARDS, refresh), writer.committed.folder
    shard_set = read_shard_set(written)
    problems = list(verify_shards(written, shard_set.shards, tok.manifest.stats["card"]["sha256"]))
    off_target = [f"{p['name']}/{name}: share {s['share']:.4f} vs weight {s['target_share']:.4f}"
                  for p in result.phases for name, s in p["sources"].items()
                  if abs(s["share"] - s["target_share"]) > 0.01]
    return dg.MaterializeResult(
        metadata={
            **{k: v for k, v in result.counts().items()},
            **engine_metadata(runner, sum(s["documents"] for s in result.sources.values()), seconds),
            "tokenizer_sha256": result.tokenizer_sha256, "seq_len": result.seq_len,
            "per_source": dg.MetadataValue.md(sources_markdown(result.sources)),
            "phases": dg.MetadataValue.json(result.phases),
            "warnings": dg.MetadataValue.json(result.warnings),
            "seconds": dg.MetadataValue.json(result.seconds), "data_version": manifest.data_version,
            "refreshes": dg.MetadataValue.json(manifest.config["refreshes"]),
            "removed_by_request": dg.MetadataValue.json(removed),  # documents left out, per source
            "tokens_per_refresh": dg.MetadataValue.md(stacked_bars_markdown(
                {key: {n: v["natural_train_tokens"] for n, v in m.stats["sources"].items()} for r in included
                 if (m := store.manifest_or_none(SHARDS, key := r.key)) is not None},
                "train tokens available per source, by shard-set version (refresh)", "tokens")),
            "path": dg.MetadataValue.path(str(base)),
        },
        check_results=[
            dg.AssetCheckResult(check_name="shards_verified", passed=not problems and len(shard_set.shards) > 0,
                                metadata={"shards": len(shard_set.shards), "shards_with_problems": len(problems),
                                          "problems": dg.MetadataValue.json(problems[:10])}),
            dg.AssetCheckResult(check_name="mixture_on_target", passed=not off_target,
                                severity=dg.AssetCheckSeverity.WARN,
                                metadata={"off_target": dg.MetadataValue.json(off_target)}),
        ],
        data_version=dg.DataVersion(manifest.data_version))


def sources_markdown(sources: dict[str, dict]) -> str:
    lines = ["| source | documents (train / val) | natural tokens | train tokens | effective epochs | FIM docs |",
             "|---|---:|---:|---:|---:|---:|"]
    for name, s in sources.items():
        lines.append(f"| {name} | {s['train_documents']:,} / {s['val_documents']:,} | {s['natural_train_tokens']:,} | "
                     f"{s['train_tokens']:,} | {s['effective_epochs']:.2f} | {s['fim_documents']:,} |")
    return "\n".join(lines)


EXPORTS = "shard_exports"


@dg.asset(
    key=EXPORTS, deps=[SHARDS], partitions_def=refresh_partitions, group_name="tokens", kinds={"parquet", "megatron"},
    # Follows new shards only when the config asks for an export (`shards.export`); by hand otherwise.
    automation_condition=FOLLOW if LOADED_CONFIG.shards.export else None,
    code_version=code_version("kiln.tokens.interchange", "kiln.tokens.shard_format"),
    check_specs=[dg.AssetCheckSpec("matches_shards", asset=EXPORTS, blocking=True,
                                   description="every exported split holds the documents and tokens of its shards "
                                               "(Megatron file sizes, Parquet rows and token ids)")],
)
def shard_exports(context: dg.AssetExecutionContext, kiln_config: KilnConfig,
                  storage: KilnStorage) -> dg.MaterializeResult:
    """The refresh's token shards in the formats other trainers read (`shards.export`): Megatron-LM / NeMo's
    indexed dataset (`megatron/<split>.bin/.idx`) and Parquet token ids for Hugging Face `datasets`
    (`parquet/<split>-NNNNN.parquet`), token for token, one document per Megatron document / Parquet row."""
    config, store = kiln_config.load(), storage.store()
    refresh = context.partition_key
    shards = store.snapshot(SHARDS, refresh)  # the version recorded is the one exported
    applied = applied_requests(shards.manifest)
    newly_applied = applied - applied_requests(store.manifest_or_none(EXPORTS, refresh))
    formats = config.shards.export
    if not formats:
        context.log.warning("shards.export is []: nothing exported; set shards.export: [megatron, parquet] "
                            "in the config to write the shards for Megatron-LM and Hugging Face datasets")
    elif pending := unapplied_requests(store, shards.manifest):  # as training_run refuses them: another trainer
        # reads the export
        raise dg.Failure(description=(
            f"{SHARDS}/{refresh} hold documents that removal request(s) {', '.join(r.request_id for r in pending)} "
            f"name, recorded after they were written: materialize {SHARDS} again first (the UI shows it stale), "
            f"so that no export holds them"))
    with store.staging(EXPORTS, refresh) as writer:
        stats = export_shards(shards.folder, writer.dir, formats)
        problems = verify_export(writer.dir, stats)
        counts = {f"{split}_{what}": entry[what] for split, entry in stats["splits"].items()
                  for what in ("documents", "tokens")}
        manifest = writer.commit(code_version=context.assets_def.code_versions_by_key[context.asset_key],
                                 config={"export": formats, "removal_requests": sorted(applied)},
                                 inputs={f"{SHARDS}/{refresh}": shards.manifest.data_version},
                                 counts=counts, stats=stats,
                                 # the export replaced may hold the tokens of documents a new request removed
                                 forget_replaced=bool(newly_applied))
    base = store.dataset_dir(EXPORTS, refresh)
    return dg.MaterializeResult(
        metadata={**counts, "formats": dg.MetadataValue.json(formats), "megatron_dtype": str(stats["megatron_dtype"]),
                  "token_shards": shards.manifest.data_version, "data_version": manifest.data_version,
                  "path": dg.MetadataValue.path(str(base))},
        check_results=[dg.AssetCheckResult(check_name="matches_shards", passed=not problems,
                                           metadata={"problems": dg.MetadataValue.json(problems[:10])})],
        data_version=dg.DataVersion(manifest.data_version))
