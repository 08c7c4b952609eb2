"""The data card of a checkpoint: what went into it, in figures the manifests already hold.

`build_data_card` gathers, for a checkpoint in a store (the current one, or one a later training replaced, from the
store's history of manifests: `kiln audit card`): the statements of the `card:` config section
(intended and out-of-scope use, limitations, biases, maintainers: kiln.common.config.card), sources and their
declared licenses, the licences and languages of the documents themselves (kiln.governance.data_card_documents),
sizes at every document stage, the filter funnel, dedup and decontamination figures, PII counts, quality filtering,
the tokenizer, the mixture and effective epochs (the plan), what the run read of each source (its exposure:
kiln.governance.exposure), the training settings and results, the MLflow run and where it is tracked,
and the full lineage chain with hashes (`kiln.governance.audit.lineage`). `data_card_markdown` renders it for
people (its own module); the dict itself is the JSON for machines. Every other figure comes from the manifests, not
recomputed: a figure that is not in a manifest is not on the card, and a stage that is not materialized says so.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlparse

from kiln.common.config import ProjectConfig
from kiln.common.manifest import Manifest, applied_requests, now_utc
from kiln.common.removals import kept_text
from kiln.common.secrets import redact_url
from kiln.common.stats import StageStats, chain, funnel_markdown, funnel_rows
from kiln.common.storage import Store
from kiln.governance.audit import pinned
from kiln.governance.catalog import CHECKPOINT, INDEX, SHARDS, TOKENIZER, TRAINING_RUN, Catalog
from kiln.governance.data_card_documents import licenses_and_languages
from kiln.governance.forget import affected_checkpoints, load_requests
from kiln.governance.lineage import DOCUMENT_STAGES
from kiln.governance.refresh import load_refreshes, partition, trained_refresh

FORMAT = "kiln.data_card/1"
EVALUATION = "evaluation"
CLASSIFIER = "quality_classifier"
DATA_CARD = "data_card"


def build_data_card(store: Store, config: ProjectConfig, checkpoint: str = CHECKPOINT,
                    run_url: Callable[[str, str], str] | None = None,
                    tracking_uri: str | None = None) -> dict[str, Any]:
    """The card of a checkpoint (`checkpoint`: the store's current one by default, else as `kiln audit lineage` takes
    it), as a JSON-ready dict (see the module docstring). `run_url(experiment_id, run_id)`: a run's page on a
    tracking server, given the ids of this checkpoint's own run (the store's newest run may be another's);
    `tracking_uri`: where runs are tracked (for a local store, the card links the store by a path relative to the
    card's folder, which works wherever the folders are copied together)."""
    # Every figure is of the version the checkpoint was built from, also where one was materialized again since.
    chain_, catalog = pinned(store, checkpoint)
    ckpt = catalog.manifest(CHECKPOINT)
    now = catalog.current_manifest(CHECKPOINT)
    replaced_by = now.data_version if now is not None and catalog.replaced(CHECKPOINT) else None
    run, tok = catalog.manifest(TRAINING_RUN), catalog.manifest(TOKENIZER)
    # The newest evaluation of this checkpoint (not of whichever checkpoint the store's evaluation is of now).
    evaluation = next((e for e in catalog.published(EVALUATION) if e.inputs.get(CHECKPOINT) == ckpt.data_version),
                      None)
    refresh = trained_refresh(run)
    shards = catalog.manifest(SHARDS, refresh) if refresh else None
    # The refreshes in the checkpoint's token shards: every figure below covers exactly those.
    refreshes = (shards.config.get("refreshes") or [shards.partition]) if shards else []
    shard_sources = (shards.stats.get("sources") or {}) if shards else {}
    declared = [s.name for s in config.sources]  # config order; sources no longer declared follow
    names = [n for n in declared if n in shard_sources or not shard_sources] + \
        sorted(n for n in shard_sources if n not in declared)
    parts = {name: [partition(name, r) for r in refreshes] for name in names}
    stage_stats = {name: merged_stage_stats(catalog, parts[name]) for name in names}
    summary = (run.stats.get("summary") or {}) if run else {}
    mlflow = dict((ckpt.stats.get("mlflow") or (run.stats.get("mlflow") if run else None) or {}))
    if mlflow.get("run_id") and run_url:
        mlflow["url"] = run_url(mlflow.get("experiment_id"), mlflow["run_id"])
    if mlflow and tracking_uri:
        mlflow.update(mlflow_store(tracking_uri, store.dataset_dir(DATA_CARD)))
    licenses, languages = licenses_and_languages(catalog, config, parts, shards)
    return {
        "format": FORMAT,
        "generated_at": now_utc(),
        "checkpoint": {"data_version": ckpt.data_version, "created_at": ckpt.created_at, "git_commit": ckpt.git_commit,
                       "parameters": ckpt.counts.get("parameters"), "steps": ckpt.counts.get("steps"),
                       "formats": ckpt.config.get("formats"), "model": ckpt.stats.get("model"),
                       # a checkpoint a later training replaced: the one the store holds now (its files are gone)
                       "replaced_by": replaced_by,
                       "path": store.location(CHECKPOINT) if replaced_by is None else None,
                       "files": [{"path": f.path, "sha256": f.sha256, "bytes": f.bytes} for f in ckpt.files]},
        "statements": _statements(config),
        "refreshes": _refreshes(store, catalog, refreshes, parts),
        "sources": [{**_source(catalog, config, name, shard_sources.get(name), stage_stats[name], parts[name]),
                     "exposure": _source_exposure(run, name)} for name in names],
        "licenses": licenses,
        "languages": languages,
        "funnel": _funnel(stage_stats),
        "dedup": _dedup(catalog, stage_stats, refreshes),
        "decontamination": _decontamination(catalog, parts, stage_stats),
        "pii": {name: dict(s["filtered_documents"].steps["pii"].counts) if "filtered_documents" in s
                and "pii" in s["filtered_documents"].steps else None for name, s in stage_stats.items()},
        "quality": _quality(catalog, parts),
        "tokenizer": _tokenizer(tok),
        "mixture": _mixture(shards, {n: shard_sources[n] for n in names if n in shard_sources}),
        "shards": _shards(shards),
        "training": {"data_version": run.data_version if run else None,
                     "settings": run.config.get("training") if run else None,
                     "launcher": run.config.get("launcher") if run else None,
                     "summary": {k: summary.get(k) for k in (
                         "status", "steps", "tokens_seen", "final_loss", "val_loss", "tokens_per_s", "mfu", "n_params",
                         "world_size", "device", "precision", "rollbacks", "train_seconds", "objective",
                         "base_val_loss", "val_ppl_pos", "long_document_token_share")},
                     "base_checkpoint": run.stats.get("base_checkpoint") if run else None,
                     "replay": run.config.get("replay") if run else None,
                     # the replayed shard set, and the removal requests applied to it (kiln.governance.replay)
                     "replayed_shards": run.stats.get("replay") if run else None,
                     # what the run read, per role (train, replay), phase and source, and the per-document file
                     "exposure": _exposure(run),
                     "stability_events": len(summary.get("stability_events") or [])},
        "evaluation": {"data_version": evaluation.data_version, "validation": evaluation.stats.get("validation"),
                       "per_source": evaluation.stats.get("per_source"),
                       "forgetting": evaluation.stats.get("forgetting"),
                       # validation documents the base checkpoint trained on (its shards' val_fraction was lower)
                       "base_trained_on_validation": evaluation.stats.get("base_trained_on_validation"),
                       "evaluated_checkpoint": evaluation.inputs.get(CHECKPOINT)} if evaluation else None,
        "mlflow": mlflow or None,
        "removal_requests": _removal_requests(store, ckpt.data_version, shards),
        "lineage": chain_.to_dict(),
    }


def mlflow_store(tracking_uri: str, card_dir: Path) -> dict[str, Any]:
    """Where the run is tracked, as the card gives it: the configured URI, and for a local store (SQLite, a file
    store) its path relative to the card's folder; never a loopback UI address the reader may not have, nor the
    URI's credentials (MLFLOW_TRACKING_URI may hold a user and password)."""
    out: dict[str, Any] = {"tracking_uri": redact_url(tracking_uri)}
    scheme = urlparse(tracking_uri).scheme
    if scheme == "sqlite":  # SQLAlchemy: sqlite:///relative.db, sqlite:////absolute.db
        local = tracking_uri.removeprefix("sqlite:///")
    elif scheme == "file":
        local = unquote(urlparse(tracking_uri).path)
    elif not scheme:  # a plain folder: MLflow's file store (mlruns)
        local = tracking_uri
    else:
        return out
    out["store"] = Path(os.path.relpath(Path(local).resolve(), Path(card_dir).resolve())).as_posix()
    return out


def _statements(config: ProjectConfig) -> dict[str, Any]:
    """The card's statements from `card:` (kiln.common.config.card), without the settings that only steer it."""
    return config.card.model_dump(mode="json", exclude={"license_fields", "list_unknown_licenses"})


def _exposure(run: Manifest | None) -> dict[str, Any] | None:
    """The run's recorded exposure (`stats.exposure`) with its file's hash; None for a run that recorded none."""
    info = (run.stats.get("exposure") if run else None) or None
    if info is None:
        return None
    f = next((f for f in run.files if f.path == info["file"]), None)
    return {**info, "sha256": f.sha256 if f else None, "rows": f.rows if f else None}


def _source_exposure(run: Manifest | None, name: str) -> dict[str, Any] | None:
    """What the run read of one source of its own shards (role `train`), beside the mixture's planned epochs."""
    roles = ((run.stats.get("exposure") or {}).get("roles") if run else None) or {}
    return (roles.get("train") or {}).get("per_source", {}).get(name)


def _removal_requests(store: Store, checkpoint: str, shards: Manifest | None) -> list[dict[str, Any]]:
    """Removal requests (`kiln forget`) recorded after this checkpoint was trained on documents they name. A request
    lists the checkpoints it affected when it was recorded; one recorded while this checkpoint's run was still
    training (published after the request) is checked here, unless the shards the run read applied it. The card
    is published: a request's free-text reason ("asked by jane@example.org") passes the PII redactor, and a URL
    pattern, which names the requester's own address (an e-mail or an IP in it, escaped as a regex the redactor
    does not read), is not shown: the request in the store keeps it, under the request's id."""
    requests, _ = load_requests(store)
    honoured = applied_requests(shards)  # recorded before the run started: its replay applied them too
    out = []
    for r in requests:
        affected = next((a for a in r.affected if a["checkpoint"] == checkpoint), None)
        if affected is None and r.request_id not in honoured:
            affected = next(iter(affected_checkpoints(store, r, only=checkpoint)), None)
        if affected is not None:
            out.append({**r.to_dict(), "value": r.value if r.kind == "source" else
                        f"{len(r.value)} doc ids" if r.kind == "doc_ids" else "a URL pattern (kept in the store's "
                                                                             "request)",
                        "reason": kept_text(r.reason, "full") if r.reason else r.reason, "affected": affected})
    return out


def _manifests(catalog: Catalog, stage: str, parts: list[str]) -> dict[str, Manifest]:
    return {p: m for p in parts if (m := catalog.manifest(stage, p)) is not None}


def merged_stage_stats(catalog: Catalog, parts: list[str]) -> dict[str, StageStats]:
    """Each materialized document stage's statistics for one source over its refreshes, in pipeline order."""
    out = {}
    for stage in DOCUMENT_STAGES:
        for m in _manifests(catalog, stage, parts).values():
            if "docs_in" in m.stats:
                out.setdefault(stage, StageStats()).merge(StageStats.from_dict(m.stats))
    return out


def _refreshes(store: Store, catalog: Catalog, keys: list[str], parts: dict[str, list[str]]) -> list[dict[str, Any]]:
    """Each refresh in the checkpoint's shards: when and how it arrived, and the documents it added."""
    registered = {r.key: r for r in load_refreshes(store)}
    out = []
    for key in keys:
        r = registered.get(key)
        mine = [p for ps in parts.values() for p in ps if p.endswith(f"/{key}")]
        raw, final = _manifests(catalog, DOCUMENT_STAGES[0], mine), _manifests(catalog, DOCUMENT_STAGES[-1], mine)
        out.append({"key": key, "created_at": r.created_at if r else None, "trigger": r.trigger if r else None,
                    "landed_files": None if r is None or r.is_initial else sum(len(f) for f in r.files.values()),
                    "raw_records": sum(m.counts.get("records", 0) for m in raw.values()),
                    "documents": sum(m.counts.get("documents", 0) for m in final.values())})
    return out


def _source(catalog: Catalog, config: ProjectConfig, name: str, tokens: dict | None,
            stats: dict[str, StageStats], parts: list[str]) -> dict[str, Any]:
    raws = _manifests(catalog, DOCUMENT_STAGES[0], parts)
    recorded = (next(iter(raws.values())).config.get("source") if raws else None) or {}
    declared = next((s.model_dump(mode="json") for s in config.sources if s.name == name), {})
    spec = {**declared, **recorded}  # as it was configured when it was read
    stages = {}
    for stage in DOCUMENT_STAGES:
        found = _manifests(catalog, stage, parts)
        s = stats.get(stage)
        stages[stage] = "not materialized" if not found else {
            "data_versions": {p.split("/", 1)[1]: m.data_version for p, m in found.items()},
            "documents_in": s.docs_in if s else None,
            "documents": s.docs_out if s else sum(m.counts.get("documents", 0) for m in found.values()),
            "characters": s.chars_out if s else None,
            "removed": (s.docs_in - s.docs_out) if s else sum(m.counts.get("rejected", 0) for m in found.values())}
    return {"name": name, "license": spec.get("license"), "domain": spec.get("domain"),
            "quality_tier": spec.get("quality_tier"), "kind": spec.get("kind"),
            "origin": spec.get("corpus") or spec.get("path"), "profile": spec.get("profile"),
            "max_documents": spec.get("max_documents"), "stages": stages, "tokens": tokens}


def _funnel(stage_stats: dict[str, dict[str, StageStats]]) -> dict[str, Any]:
    per_source, by_stage = {}, {}
    for name, stats in stage_stats.items():
        if not stats:
            continue
        whole = chain(list(stats.values()))
        per_source[name] = {"documents_in": whole.docs_in, "documents_out": whole.docs_out,
                            "characters_in": whole.chars_in, "characters_out": whole.chars_out,
                            "stages": list(stats), "rows": funnel_rows(whole)}
        for stage, s in stats.items():
            by_stage.setdefault(stage, StageStats()).merge(s)
    # All sources stage by stage, so the funnel's steps read in pipeline order.
    total = chain([by_stage[s] for s in DOCUMENT_STAGES if s in by_stage]) if by_stage else StageStats()
    return {"total": {"documents_in": total.docs_in, "documents_out": total.docs_out, "characters_in": total.chars_in,
                      "characters_out": total.chars_out, "rows": funnel_rows(total)},
            "per_source": per_source, "markdown": funnel_markdown(total) if total.docs_in else "no document stages"}


def _removed(stats: StageStats | None, step: str) -> int:
    return sum(stats.steps[step].dropped.values()) if stats and step in stats.steps else 0


def _dedup(catalog: Catalog, stage_stats: dict[str, dict[str, StageStats]], refreshes: list[str]) -> dict[str, Any]:
    indexes = {r: m for r in refreshes if (m := catalog.manifest(INDEX, r)) is not None}
    index = indexes[list(indexes)[-1]] if indexes else None  # the index as of the newest refresh in the shards
    stats = index.stats if index else {}
    per_source = {name: {"exact_duplicates": _removed(s.get("curated_documents"), "exact_dedup"),
                         "near_duplicates": _removed(s.get("deduplicated_documents"), "near_dedup"),
                         "boilerplate_only": _removed(s.get("deduplicated_documents"), "boilerplate_lines")}
                  for name, s in stage_stats.items()}
    return {"per_source": per_source,
            "index": None if index is None else {
                "data_version": index.data_version, "near": index.config.get("near"),
                "documents": (stats.get("index") or {}).get("documents"), "lsh": stats.get("lsh"),
                "verification": stats.get("verification"), "clusters": stats.get("clusters"),
                "cross_source": stats.get("cross_source"),
                "matched_earlier_refreshes": stats.get("matched_earlier_refreshes")},
            "per_refresh": {r: {"data_version": m.data_version, "documents": m.counts.get("documents"),
                                "near_duplicates": m.counts.get("near_duplicates"),
                                "matched_earlier_refreshes": m.stats.get("matched_earlier_refreshes")}
                            for r, m in indexes.items()}}


def _decontamination(catalog: Catalog, parts: dict[str, list[str]], stage_stats) -> dict[str, Any]:
    per_source, settings = {}, None
    for name, ps in parts.items():
        found = _manifests(catalog, "deduplicated_documents", ps)
        if not found:
            per_source[name] = "not materialized"
            continue
        per_benchmark: dict[str, dict[str, int]] = {}
        for m in found.values():
            settings = settings or {"settings": m.config.get("decontamination"),
                                    "benchmarks": m.config.get("benchmarks")}
            for bench, counts in ((m.stats.get("contamination") or {}).get("per_benchmark") or {}).items():
                total = per_benchmark.setdefault(bench, {})
                for k, n in counts.items():
                    total[k] = total.get(k, 0) + n
        per_source[name] = {"documents_removed": _removed(stage_stats[name].get("deduplicated_documents"),
                                                          "decontamination"), "per_benchmark": per_benchmark}
    return {**(settings or {}), "per_source": per_source}


def _quality(catalog: Catalog, parts: dict[str, list[str]]) -> dict[str, Any]:
    classifier = catalog.manifest(CLASSIFIER)
    card = (classifier.stats.get("card") or None) if classifier else None
    per_source = {}
    for name, ps in parts.items():
        found = _manifests(catalog, "quality_filtered_documents", ps)
        newest = list(found.values())[-1] if found else None
        per_source[name] = "not materialized" if newest is None else {
            "rule": newest.config.get("rule"),
            "cutoffs": {p.split("/", 1)[1]: m.stats.get("cutoffs") for p, m in found.items()},
            "documents": sum(m.counts.get("documents", 0) for m in found.values()),
            "removed": sum(m.counts.get("rejected", 0) for m in found.values())}
    return {"classifier": None if classifier is None else {
        "data_version": classifier.data_version, "enabled": classifier.config.get("enabled"),
        "positive_sources": classifier.config.get("positive_sources"),
        "negative_sources": classifier.config.get("negative_sources"),
        "sha256": card.get("sha256") if card else None,
        "cross_validation": card.get("cross_validation") if card else None},
        "per_source": per_source}


def _tokenizer(tok) -> dict[str, Any] | None:
    if tok is None:
        return None
    card = tok.stats.get("card") or {}
    overall = (tok.stats.get("report") or {}).get("overall")
    return {"data_version": tok.data_version, "sha256": card.get("sha256"), "vocab_size": card.get("vocab_size"),
            "model_type": card.get("model_type"), "dtype": card.get("dtype"), "settings": card.get("settings"),
            "sample": {k: v for k, v in (card.get("sample") or {}).items() if k in ("documents", "chars")},
            "special_tokens": card.get("special_tokens"), "fit": overall,
            "source": card.get("source", "train"), "kind": card.get("kind", "sentencepiece")}


def _mixture(shards, sources: dict[str, dict]) -> dict[str, Any] | None:
    if shards is None:
        return None
    total = sum(s.get("train_tokens", 0) for s in sources.values())
    return {"settings": shards.config.get("mixture"), "phases": shards.stats.get("phases"),
            "warnings": shards.stats.get("warnings"),
            "per_source": {n: {"natural_train_tokens": s.get("natural_train_tokens"),
                               "train_tokens": s.get("train_tokens"),
                               # unrounded: 400k tokens beside 10B is a share, not 0 (the markdown rounds)
                               "share": s.get("train_tokens", 0) / total if total else None,
                               "effective_epochs": s.get("effective_epochs")} for n, s in sources.items()}}



def _shards(shards) -> dict[str, Any] | None:
    if shards is None:
        return None
    members = shards.files_with_role("members")
    return {"data_version": shards.data_version, "refresh": shards.partition, "refreshes": shards.config.get("refreshes"),
            "counts": shards.counts, "seq_len": shards.stats.get("seq_len"),
            "tokenizer_sha256": shards.stats.get("tokenizer_sha256"), "dtype": shards.stats.get("dtype"),
            "settings": shards.config.get("shards"),
            # every removal request in force when the shards were built, and what each source lost to them
            "removal_requests": shards.config.get("removal_requests", []),
            "removed_by_request": {n: s["removed_by_request"] for n, s in (shards.stats.get("sources") or {}).items()
                                   if s.get("removed_by_request")},
            "member_list": {"path": members[0].path, "sha256": members[0].sha256, "rows": members[0].rows}
            if members else None}


__all__ = ["DATA_CARD", "FORMAT", "build_data_card", "merged_stage_stats", "mlflow_store"]
