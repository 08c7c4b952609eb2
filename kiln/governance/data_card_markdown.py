"""The data card as markdown, for people (the `data_card` asset writes it as data_card.md and shows it in the UI);
the dict `build_data_card` returns is the JSON for machines."""

from __future__ import annotations

import re
from pathlib import PurePath
from typing import Any

from kiln.common.display import visible
from kiln.common.manifest import to_the_second
from kiln.common.plots import figure_png, stacked_bars
from kiln.dedup.report import cross_source_markdown
from kiln.governance.data_card_documents import MEMBER_LIST, REMOVED_BY_REQUEST, UNKNOWN
from kiln.governance.lineage import DOCUMENT_STAGES


def _replayed(training: dict) -> str:
    """What the replay left out for removal requests, as the sentence's end."""
    info = training.get("replayed_shards")
    if not info:
        return "."
    requests = info.get("removal_requests") or []
    return (f" (token_shards `{info['data_version']}`); {len(requests)} removal request(s) applied to it, "
            f"{info['removed_documents']:,} replayed document(s) ({info['removed_tokens']:,} tokens) skipped"
            + (f", {info['unknown_urls']:,} without a known URL (not matchable by a URL pattern)"
               if info.get("unknown_urls") else "") + _held_out(info) + ".")


def _held_out(info: dict) -> str:
    """The replayed train documents left out as the run's validation documents (a raised shards.val_fraction)."""
    held = info.get("validation_held_out") or {}
    return (f"; {held['documents']:,} replayed train document(s) ({held['tokens']:,} tokens) left out as this run's "
            f"validation documents (shards.val_fraction {held['val_fraction']}, the replayed set's "
            f"{held['replayed_val_fraction']})" if held.get("documents") else "")


def _exposure_markdown(exposure: dict | None) -> list[str]:
    """What the run read per source, against the mixture's plan (a run may stop long before its planned epochs)."""
    if exposure is None:
        return ["", "The run recorded no exposure (trained before it was recorded): the epochs above are the "
                    "mixture's plan, not what the run read."]
    out = ["", f"What the run read (from its loader's final cursor; per document in `{exposure['file']}` sha256 "
               f"`{exposure.get('sha256')}`): tokens read as inputs, their share of the source's tokens in the "
               f"shards, epochs read (tokens read over the source's own data, before the mixture repeated or "
               f"subsampled it) against the mixture's planned epochs, and documents reached.", ""]
    rows = []
    for role, r in exposure["roles"].items():
        if r.get("unavailable"):
            out.append(f"- {role} (token_shards `{r['data_version']}`): {r['unavailable']}")
            continue
        rows += [[role, n, v["tokens_read"], v["tokens"], _fraction(v["share"]), _fraction(v["passes"]),
                  v["planned_epochs"], f"{v['documents_read']:,} / {v['documents']:,}"]
                 for n, v in r["per_source"].items()]
    out += _table(["read as", "source", "tokens read", "tokens in shards", "share read", "epochs read",
                   "planned epochs", "documents reached"], rows, "|---|---|---:|---:|---:|---:|---:|---:|")
    return out


def _n(value: Any) -> str:
    if value is None:
        return "–"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:,.4g}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def _table(header: list[str], rows: list[list[Any]], align: str | None = None) -> list[str]:
    align = align or "|" + "---|" * len(header)
    return ["| " + " | ".join(header) + " |", align] + ["| " + " | ".join(_cell(c) for c in r) + " |" for r in rows]


class _Markdown(str):
    """Markdown this module wrote (code spans of `_code`, its own words): a cell shows it as markdown."""


# Markdown and HTML that inline text could start: emphasis, code, links and images, tags and entities, strikethrough,
# a table cell's end. An underscore between two letters or digits starts no emphasis: kept as it is, for readability.
_SPECIAL = re.compile(r"[\\`*\[\]<>&|~]|(?<![0-9A-Za-z])_|_(?![0-9A-Za-z])")


def _one_line(value: Any) -> str:
    """A value on one line (a line break would end a table row or a list item), its unseen characters visible."""
    return visible(" ".join(str(value).splitlines()))


def _text(value: Any) -> str:
    """A string from the data (a licence, a language, a reason, a name) as inline markdown that shows as itself:
    no tag, link, image, emphasis or heading it spells takes effect, and a bidi override or a control character shows
    as its escape (U+202E would make "TIM" read "MIT")."""
    return _one_line(_SPECIAL.sub(lambda m: "\\" + m.group(), str(value)))


def _code(value: Any) -> _Markdown:
    """A value from the data as a code span that shows it as it is: fenced with a backtick run longer than any in it
    (CommonMark), a space inside the fence where it starts or ends with a backtick."""
    text = _one_line(value) or " "
    fence = "`" * (max(map(len, re.findall("`+", text)), default=0) + 1)
    pad = " " if text[0] == "`" or text[-1] == "`" else ""
    return _Markdown(f"{fence}{pad}{text}{pad}{fence}")


def _cell(value: Any) -> str:
    """A table cell: a string as `_text` shows it; this module's markdown as it is, but a '|' in it (in a code span)
    would split the row and shift every column after it (GFM reads the escaped one as a '|' there too)."""
    if isinstance(value, _Markdown):
        return value.replace("|", "\\|")
    return _text(value) if isinstance(value, str) else _n(value)


def _fraction(value: float | None) -> str:
    """A share or a number of passes as `_n` shows it; one below 0.0001 but not 0 as "<0.0001" (the JSON has it)."""
    if isinstance(value, float) and 0 < abs(value) < 1e-4:
        return _Markdown("<0.0001")  # markdown as it is: '<' and a digit start no tag
    return _n(value)


def _rule(rule: dict | None) -> str:
    """A quality rule as its set keys (`keep_top_fraction=0.9`), or "keep everything"."""
    set_keys = {k: v for k, v in (rule or {}).items() if v is not None and k != "bucket_quantiles"}
    if "perplexity_buckets" in set_keys:
        set_keys["bucket_quantiles"] = rule["bucket_quantiles"]
    return ", ".join(f"{k}={v}" for k, v in set_keys.items()) or "keep everything"


def _mlflow_markdown(m: dict[str, Any]) -> str:
    """The run and where it is tracked: the server's page, or the local store by a path relative to this card."""
    line = f"MLflow run {_code(m.get('run_id'))} (experiment {_text(m.get('experiment_id'))})"
    if m.get("url"):
        return f"{line}: {m['url']}."
    if m.get("store"):
        return (f"{line}, tracked in {_code(m['tracking_uri'])}: the store is [`{m['store']}`]({m['store']}) "
                f"relative to this card (browse it with `make mlflow` here, or `mlflow ui --backend-store-uri` on that "
                f"store where it is copied).")
    return f"{line}" + (f", tracked at {_code(m['tracking_uri'])}." if m.get("tracking_uri") else ".")


# (heading, key, what a reviewer reads when the config says nothing): Datasheets for Datasets / HF dataset cards
_STATEMENTS = [("Summary", "summary"), ("Intended use", "intended_use"), ("Out-of-scope use", "out_of_scope_use"),
               ("Limitations", "limitations"), ("Known biases", "known_biases")]


def _statements_markdown(statements: dict[str, Any] | None) -> list[str]:
    """The `card:` statements, each under its heading; an unset one says so and names its key."""
    statements, out = statements or {}, []
    for heading, key in _STATEMENTS:
        value = statements.get(key)
        out += ["", f"## {heading}", ""]
        if not value:
            out.append(f"Not stated (set `card.{key}` in the project config).")
        else:
            out += [value] if isinstance(value, str) else [f"- {v}" for v in value]
    out += ["", "## Maintenance, contact and citation", ""]
    maintainers = statements.get("maintainers") or []
    out.append(f"Maintainers: {', '.join(maintainers) if maintainers else 'not stated (set `card.maintainers`)'}; "
               f"contact: {statements.get('contact') or 'not stated (set `card.contact`)'}.")
    if statements.get("citation"):
        out += ["", "```", statements["citation"].strip(), "```"]
    return out


def _license_cell(source: dict[str, Any], card: dict[str, Any]) -> str:
    """The source's declared licence, or for one whose documents carry their own, how many there are."""
    mine = ((card.get("licenses") or {}).get("per_source") or {}).get(source["name"])
    if not isinstance(mine, dict) or mine["field"] == "license":
        return source["license"]
    known = len([lic for lic in mine["licenses"] if lic not in (UNKNOWN, REMOVED_BY_REQUEST)])
    removed = (mine["licenses"].get(REMOVED_BY_REQUEST) or {}).get("documents")
    return _Markdown(f"per document ({_code(mine['field'])}): {known} licences, {mine['unknown']:,} documents unknown"
                     + (f", {removed:,} removed by request" if removed else ""))


# A document a removal request took out of the shards has nothing recorded but its id (data_card_documents): its row
# says so, and it is neither a licence nor a language, nor in the languages' shares.
_NO_LICENSE = f"{REMOVED_BY_REQUEST}: no licence recorded"
_NO_LANGUAGE = f"{REMOVED_BY_REQUEST}: no language recorded"


def _licenses_markdown(card: dict[str, Any], list_unknown: int) -> list[str]:
    info = card.get("licenses") or {}
    out = ["", "## Licenses of the documents", "",
           f"Each document's own licence, over the documents the token shards were built from (`{info.get('stage')}`, "
           f"every refresh in them); in train shards: documents with at least one copy in the shards' training split; "
           f"train tokens: their copies x tokens. `unknown`: the licence field is missing, null, empty or UNKNOWN.", ""]
    rows, listed = [], []
    for name, v in (info.get("per_source") or {}).items():
        if not isinstance(v, dict):
            rows.append([name, v, None, None, None, None])
            continue
        rows += [[name, _code(v['field']), _NO_LICENSE if lic == REMOVED_BY_REQUEST else lic, r["documents"],
                  r["in_train_shards"], r["train_tokens"]]
                 for lic, r in v["licenses"].items()]
        if v["unknown"]:
            shown = v["unknown_listed"][:list_unknown]
            more = v["unknown"] - len(shown)
            listed.append(f"- {_text(name)}: {v['unknown']:,} document(s) of unknown licence: "
                          + ", ".join(f"{_code(d['locator'] or d['doc_id'])} ({_text(d['doc_id'])}"
                                      + (", in train shards)" if d["in_train_shards"] else ")") for d in shown)
                          + (f", and {more:,} more (data_card.json lists up to 1,000)" if more > 0 else ""))
    out += _table(["source", "licence from", "licence", "documents", "in train shards", "train tokens"], rows,
                  "|---|---|---|---:|---:|---:|")
    out += [""] + (listed or ["No document of unknown licence."]) + _recorded_note(info)
    return out


def _recorded_note(info: dict[str, Any]) -> list[str]:
    """Which sources were counted from the shards' member list, and why."""
    names = [name for name, v in (info.get("per_source") or {}).items()
             if isinstance(v, dict) and v.get("counted_from") == MEMBER_LIST]
    return ["", f"Counted from the token shards' member list, as recorded when the shards were written (these "
                f"documents were materialized again since the training): {', '.join(map(_text, names))}."] \
        if names else []


def _languages_markdown(card: dict[str, Any]) -> list[str]:
    info = card.get("languages") or {}
    out = ["", "## Languages", "",
           f"`meta.language` as the `language` step identified it (py3langid, ISO 639-1), over `{info.get('stage')}`; "
           "\"not identified\": the source's filter profile has no `language` step.", ""]
    rows = []
    for name, v in (info.get("per_source") or {}).items():
        if not isinstance(v, dict):
            rows.append([name, v, None, None, None, None])
            continue
        settings = v.get("settings")
        step = (f"kept {', '.join(settings.get('languages') or ['en'])} at score ≥ "
                f"{settings.get('min_score', 0.65)}" if settings is not None else
                _Markdown(f"off (profile {_code(v.get('profile'))})"))
        total = sum(r["documents"] for lang, r in v["languages"].items() if lang != REMOVED_BY_REQUEST) or 1
        rows += [[name, step, _NO_LANGUAGE, r["documents"], None, r["train_tokens"]] if lang == REMOVED_BY_REQUEST else
                 [name, step, lang, r["documents"], f"{r['documents'] / total:.1%}", r["train_tokens"]]
                 for lang, r in v["languages"].items()]
    return out + _table(["source", "language step", "language", "documents", "share", "train tokens"], rows,
                        "|---|---|---|---:|---:|---:|") + _recorded_note(info)


FUNNEL_PNG = "data_card_funnel.png"  # written next to data_card.md, which links it relatively
FUNNEL_TITLE = "Documents kept after each stage, by source (all refreshes)"


def funnel_png(card: dict[str, Any]) -> bytes:
    """The funnel as a chart: records read, then the documents each stage kept, one bar per stage stacked by
    source (the figures of the "Documents kept after each stage" table)."""
    bars: dict[str, dict[str, float]] = {"records read": {}}
    for s in card["sources"]:
        raw = s["stages"].get(DOCUMENT_STAGES[0])
        bars["records read"][s["name"]] = raw.get("documents_in") or 0 if isinstance(raw, dict) else 0
        for stage, st in s["stages"].items():
            bars.setdefault(stage.removesuffix("_documents"), {})[s["name"]] = \
                st["documents"] if isinstance(st, dict) else 0
    return figure_png(stacked_bars(bars, FUNNEL_TITLE, "documents", legend="upper right"))


def _read(read: dict[str, int] | None) -> list[Any]:
    """What the run read of a request's documents, as two table cells ("not recorded" where it recorded nothing)."""
    return ["not recorded"] * 2 if read is None else [read["documents"], read["tokens"]]


def data_card_markdown(card: dict[str, Any], funnel_image: str | None = None, list_unknown: int = 20) -> str:
    """The card for people: one page, the figures an auditor asks for first, the rest in data_card.json.
    `funnel_image`: the funnel chart as a markdown image (a relative link to its PNG, or inlined);
    `list_unknown`: documents of unknown licence listed per source (`card.list_unknown_licenses`)."""
    c, out = card["checkpoint"], []
    out += [f"# Data card: checkpoint `{c['data_version']}`", "",
            f"Generated {to_the_second(card['generated_at'])} from the store; checkpoint created "
            f"{to_the_second(c['created_at'])}, git `{c['git_commit'] or 'unknown'}`, {_n(c['parameters'])} "
            f"parameters, {_n(c['steps'])} steps."]
    if c.get("replaced_by"):
        out += ["", f"This checkpoint was replaced in the store since (now `{c['replaced_by']}`): the card describes it "
                f"from the store's history of manifests, as it was trained."]
    if card.get("mlflow"):
        out.append(_mlflow_markdown(card["mlflow"]))

    if card.get("removal_requests"):
        out += ["", "## ⚠ Removal requests affecting this checkpoint", "",
                "This checkpoint was trained on documents that were later asked to be removed (`kiln forget`). "
                "The next token shards exclude them; this checkpoint still contains what it learned from them.", ""]
        out += _table(["request", "recorded", "kind", "value", "reason", "documents in its training set", "tokens",
                       "documents read", "tokens read"],
                      [[_code(r['request_id']), to_the_second(r["created_at"]), r["kind"], r["value"],
                        r["reason"] or "", r["affected"]["documents"], r["affected"]["tokens"],
                        *_read(r["affected"].get("read"))]
                       for r in card["removal_requests"]])

    out += _statements_markdown(card.get("statements"))

    out += ["", "## Sources and licenses", ""]
    rows = []
    for s in card["sources"]:
        t = s["tokens"] or {}
        raw = s["stages"].get(DOCUMENT_STAGES[0])
        read = s.get("exposure") or {}
        rows.append([s["name"], _license_cell(s, card), s["domain"], s["quality_tier"], s["origin"],
                     raw.get("documents_in") if isinstance(raw, dict) else None, t.get("train_documents"),
                     t.get("train_tokens"), t.get("effective_epochs"), read.get("tokens_read"),
                     _fraction(read.get("passes"))])
    out += _table(["source", "license", "domain", "tier", "origin", "raw records", "train split documents",
                   "train tokens", "planned epochs", "tokens read", "epochs read"], rows,
                  "|---|---|---|---:|---|---:|---:|---:|---:|---:|---:|")
    out += _licenses_markdown(card, list_unknown)
    out += _languages_markdown(card)

    out += ["", "## Refreshes in the training data", ""]
    out += _table(["refresh", "registered", "trigger", "landed files", "raw records", "documents kept"],
                  [[_code(r['key']), to_the_second(r["created_at"]), r["trigger"],
                    "configured sources" if r["landed_files"] is None else r["landed_files"], r["raw_records"],
                    r["documents"]] for r in card["refreshes"]],
                  "|---|---|---|---:|---:|---:|")

    out += ["", "## Documents kept after each stage (all refreshes)", "",
            "Records read, then the documents each stage kept (its output); the funnel below lists what each step "
            "removed.", ""]
    rows = []
    for s in card["sources"]:
        raw = s["stages"].get(DOCUMENT_STAGES[0])
        rows.append([s["name"], raw.get("documents_in") if isinstance(raw, dict) else None]
                    + [st["documents"] if isinstance(st, dict) else st for st in s["stages"].values()])
    out += _table(["source", "records read", *[f"kept after {st}" for st in DOCUMENT_STAGES]], rows,
                  "|---|---:|" + "---:|" * len(DOCUMENT_STAGES))

    out += ["", "## Filter funnel (all sources, raw records to the last stage)", ""]
    out += [funnel_image, ""] if funnel_image else []
    out.append(card["funnel"]["markdown"])

    d = card["dedup"]
    out += ["", "## Deduplication and decontamination", ""]
    rows = [[name, v["exact_duplicates"], v["near_duplicates"], v["boilerplate_only"],
             (card["decontamination"]["per_source"].get(name) or {}).get("documents_removed")
             if isinstance(card["decontamination"]["per_source"].get(name), dict) else None]
            for name, v in d["per_source"].items()]
    out += _table(["source", "exact duplicates", "near duplicates", "boilerplate-only", "benchmark overlap removed"],
                  rows, "|---|---:|---:|---:|---:|")
    if d["index"]:
        i = d["index"]
        lsh, ver = i.get("lsh") or {}, i.get("verification") or {}
        out += ["", f"Near-duplicate index: {_n(i['documents'])} accepted documents; Jaccard threshold "
                    f"{lsh.get('threshold')}, LSH {lsh.get('bands')} bands x {lsh.get('rows')} rows over "
                    f"{lsh.get('num_perm')} permutations; {_n(ver.get('candidate_pairs'))} candidate pairs verified "
                    f"exactly.", "", cross_source_markdown(i.get("cross_source") or {})]
    benchmarks = {}
    for v in card["decontamination"]["per_source"].values():
        for name, counts in (v.get("per_benchmark") or {}).items() if isinstance(v, dict) else ():
            total = benchmarks.setdefault(name, {})
            for k, n in counts.items():
                total[k] = total.get(k, 0) + n
    declared = (card["decontamination"].get("benchmarks") or {}).get("benchmarks") or {}
    for name in declared:
        benchmarks.setdefault(name, {})
    if benchmarks:
        out += [""] + _table(["benchmark", "items contaminated", "documents affected", "dropped", "redacted"],
                             [[b, v.get("items_contaminated", 0), v.get("documents_affected", 0),
                               v.get("documents_dropped", 0), v.get("documents_redacted", 0)]
                              for b, v in sorted(benchmarks.items())], "|---|---:|---:|---:|---:|")
    else:
        out += ["", "No benchmark was declared for decontamination."]

    out += ["", "## PII replaced by placeholders", ""]
    types = sorted({t for v in card["pii"].values() if v for t in v})
    out += _table(["source", *types, "total"], [[n, *[(v or {}).get(t, 0) for t in types], sum((v or {}).values())]
                                                 for n, v in card["pii"].items()],
                  "|---|" + "---:|" * (len(types) + 1))

    q = card["quality"]
    out += ["", "## Quality filtering", ""]
    clf = q["classifier"]
    if clf is None:
        out.append("quality_classifier: not materialized.")
    elif clf.get("enabled"):
        h = clf.get("cross_validation") or {}
        out.append(f"fastText classifier `{(clf.get('sha256') or '')[:16]}` (positives "
                   f"{', '.join(clf['positive_sources'] or [])}; negatives {', '.join(clf['negative_sources'] or [])}), "
                   f"{h.get('folds')}-fold cross-validated: ROC AUC {_n(h.get('auc'))}, precision {_n(h.get('precision'))}, recall "
                   f"{_n(h.get('recall'))}.")
    else:
        out.append("Classifier off (no positive and negative sources, or disabled).")
    out += [""] + _table(["source", "rule", "kept", "removed"],
                         [[n, "not materialized", None, None] if not isinstance(v, dict) else
                          [n, _rule(v["rule"]), v["documents"], v["removed"]]
                          for n, v in q["per_source"].items()],
                         "|---|---|---:|---:|")

    t = card["tokenizer"]
    out += ["", "## Tokenizer", ""]
    # A brought tokenizer (tokenizer.source: a file) was measured on the sample, not trained on it.
    brought = t is not None and t.get("source", "train") != "train"
    out.append("not materialized" if t is None else
               f"{t.get('kind', 'sentencepiece')} {t['model_type']}, {_n(t['vocab_size'])} pieces ({t['dtype']}), "
               f"sha256 `{t['sha256']}`, " + (f"brought as `{PurePath(t['source']).name}`, measured" if brought else "trained") +
               f" on {_n(t['sample'].get('documents'))} documents ({_n(t['sample'].get('chars'))} characters); "
               f"data version `{t['data_version']}`.")

    mix = card["mixture"]
    out += ["", "## Mixture and effective epochs", ""]
    if mix is None:
        out.append("token_shards: not materialized.")
    else:
        weights = (mix.get("settings") or {}).get("weights") or {}
        out += _table(["source", "weight", "natural train tokens", "train tokens", "share", "effective epochs"],
                      [[n, weights.get(n, "natural"), v["natural_train_tokens"], v["train_tokens"],
                        _fraction(v["share"]), v["effective_epochs"]] for n, v in mix["per_source"].items()],
                      "|---|---:|---:|---:|---:|---:|")
        out += [f"- warning: {w}" for w in mix.get("warnings") or []]
        sh = card["shards"]
        out += ["", f"Token shards `{sh['data_version']}` (refresh `{sh['refresh']}`): "
                    f"{_n(sh['counts'].get('train_tokens'))} train and "
                    f"{_n(sh['counts'].get('val_tokens'))} validation tokens in {_n(sh['counts'].get('shards'))} shards "
                    f"(seq_len {sh['seq_len']}); member list `{(sh['member_list'] or {}).get('path')}` sha256 "
                    f"`{(sh['member_list'] or {}).get('sha256')}`."]
        if sh.get("removal_requests"):
            lost = ", ".join(f"{n}: {_n(k)}" for n, k in sh["removed_by_request"].items()) or "none matched"
            out += ["", f"Removal requests honoured by these shards, across every refresh they read: "
                        f"{', '.join(f'`{r}`' for r in sh['removal_requests'])}; documents left out by source: {lost}."]

    out += ["", "## Exposure per source (what the run read)"]
    out += _exposure_markdown(card["training"].get("exposure"))

    tr = card["training"]
    out += ["", "## Training", ""]
    s, settings = tr["summary"], tr.get("settings") or {}
    model = (settings.get("model") or {}).get("preset") if isinstance(settings.get("model"), dict) else None
    out.append(f"Run `{tr['data_version']}`: status {_n(s.get('status'))}, {_n(s.get('steps'))} steps, "
               f"{_n(s.get('tokens_seen'))} tokens seen, preset {_n(model)}, {_n(s.get('world_size'))} processes on "
               f"{_n(s.get('device'))} ({_n(s.get('precision'))}); final training loss {_n(s.get('final_loss'))}, "
               f"validation loss {_n(s.get('val_loss'))}; {tr['stability_events']} stability events. Full settings in "
               f"data_card.json.")
    base = tr.get("base_checkpoint")
    if base:
        replay = tr.get("replay")
        out += ["", f"Continued pretraining (objective {_n(s.get('objective'))}) from base checkpoint `{base['kind']}` "
                    f"sha256 `{base['sha256'][:16]}` at `{base['path']}` (trained on `{base['trained_on']}`), "
                    f"base validation loss on this run's held-back tokens {_n(s.get('base_val_loss'))}; "
                    + (f"replay: {replay['share']:.0%} of sequences from `{replay['dataset_dir']}`" + _replayed(tr)
                       if replay else "no replay."),
                "", "What the base checkpoint was built from, when this run started:", "", "```",
                (base.get("chain") or {}).get("text") or "unknown: the base came from outside this store", "```"]
    if card.get("evaluation"):
        v = card["evaluation"]["validation"] or {}
        out.append(f"Evaluation `{card['evaluation']['data_version']}`: validation loss {_n(v.get('loss'))}, "
                   f"perplexity {_n(v.get('perplexity'))} over {_n(v.get('tokens'))} tokens.")
        seen = card["evaluation"].get("base_trained_on_validation")
        if seen:
            count = _n(seen["documents"]) if seen.get("documents") is not None else "some"
            out.append(f"The validation loss includes {count} document(s) the base checkpoint "
                       f"trained on (its training shards were written at shards.val_fraction "
                       f"{seen['base_val_fraction']}, this run's at {seen['val_fraction']}): optimistic on them.")
        forgetting = card["evaluation"].get("forgetting")
        if forgetting:
            out += ["", "Forgetting per domain (validation loss of this checkpoint minus the base's, same tokens; "
                        "positive = worse than the base):", ""]
            out += _table(["domain", "tokens", "base loss", "this loss", "forgetting"],
                          [[d, _n(f["tokens"]), f["base_loss"], f["loss"], f["forgetting"]]
                           for d, f in forgetting.items()], "|---|---:|---:|---:|---:|")

    lin = card["lineage"]
    out += ["", f"## Lineage ({len(lin['nodes'])} datasets back to the raw sources)", ""]
    out += _table(["dataset", "data version", "code version", "git commit", "created", "files", "status"],
                  [[_code(n['key']), _code(n['data_version']), n["code_version"], (n["git_commit"] or "unknown")[:12],
                    to_the_second(n["created_at"]), len(n["files"]),
                    _Markdown(n["status"] + (f" (now {_code(n['current_version'])})" if n["status"] == "replaced"
                                             else ""))]
                   for n in lin["nodes"]],
                  "|---|---|---|---|---|---:|---|")
    out += [f"- warning: {p}" for p in lin["problems"]]
    out += ["", "File hashes (sha256) of every dataset are in `data_card.json` under `lineage`."]
    return "\n".join(out) + "\n"
