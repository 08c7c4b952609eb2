"""The data card a reviewer signs, on a small store materialized through the asset graph: two sources, `web`
(random-word pages whose records each carry a `package_license`, some missing, null, empty or UNKNOWN; no
language step) and `ref` (Python's pydoc topics: English prose through the `language` step; the source's declared
licence). A stand-in run reads part of the shards (tests/audit_store.py), so the card has an exposure to show.

Expected licence and language counts are computed here from the documents' Parquet parts and the shards' member
list with pyarrow, independently of kiln.governance.data_card_documents."""

import json
import os
import string
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import torch
import yaml
from pydoc_data.topics import topics

from kiln.common.config import ConfigError, load_config, parse_config
from kiln.governance.data_card import build_data_card, mlflow_store
from kiln.governance.data_card_markdown import FUNNEL_PNG, data_card_markdown
from kiln.governance.refresh import latest
from tests.assets.project import load_project
from tests.audit_store import random_text, stand_in_checkpoint
from tests.conftest import SERIAL_ENGINE, write_jsonl
from training_jobs.settings import RunConfig, TrainingSettings
from training_jobs.setup import Dist, open_training

ROOT = Path(__file__).resolve().parents[3]
FINAL = "quality_filtered_documents"
MISSING = object()  # a record without the licence key at all
# web's records, in order: each page's declared package licence (the card reads meta.package_license)
WEB_LICENSES = ["MIT", "MIT", "Apache-2.0", None, "All rights reserved", MISSING, "UNKNOWN", " ", "MIT",
                "BSD-3-Clause"]
UNKNOWN = {None, MISSING, "UNKNOWN", " "}  # what the card must count as unknown
STATEMENTS = {"summary": "Random pages and Python's own reference topics, for tests.",
              "intended_use": ["Testing the data card."], "out_of_scope_use": "Anything else.",
              "limitations": ["Random words are not language.", "Ten pages."],
              "maintainers": ["the test suite"], "contact": "nobody@example.org"}


@pytest.fixture(scope="module")
def carded(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("card")
    with pytest.MonkeyPatch.context() as monkeypatch:
        home = tmp / "kiln"
        monkeypatch.setenv("KILN_HOME", str(home))
        rng = np.random.default_rng(11)
        vocab = ["".join(rng.choice(list(string.ascii_lowercase), 6)) for _ in range(5000)]
        web = [{"id": f"w{i}", "text": random_text(rng, vocab)}
               | ({} if lic is MISSING else {"package_license": lic}) for i, lic in enumerate(WEB_LICENSES)]
        ref = [{"id": k, "text": topics[k]} for k in sorted(topics) if 1500 <= len(topics[k]) <= 6000][:10]
        write_jsonl(tmp / "web" / "a.jsonl", web)
        write_jsonl(tmp / "ref" / "a.jsonl", ref)
        config = {
            "sources": [{"name": "web", "kind": "jsonl", "path": str(tmp / "web"), "license": "per-page",
                         "domain": "web", "quality_tier": 3, "profile": "none"},
                        {"name": "ref", "kind": "jsonl", "path": str(tmp / "ref"), "license": "PSF-2.0",
                         "domain": "reference", "quality_tier": 1, "profile": "english"}],
            "profiles": {"none": [], "english": [{"language": {"min_score": 0.5}}]},
            "engine": SERIAL_ENGINE, "tokenizer": {"vocab_size": 400},
            "mixture": {"weights": {"web": 0.5, "ref": 0.5}}, "shards": {"seq_len": 16, "val_fraction": 0.2},
            "quality": {"classifier": {"enabled": False}},
            "card": {**STATEMENTS, "license_fields": {"web": "package_license"}, "list_unknown_licenses": 2},
        }
        project = load_project(config, tmp, home, monkeypatch, in_memory=True)
        assert project.materialize_refresh(sources=["web", "ref"])
        store = project.store
        refresh, shards = latest(store, "token_shards")
        run_config = TrainingSettings(seq_len=16, micro_batch_size=2).to_run_config(
            dataset_dir=store.dataset_dir("token_shards", refresh), tokenizer_sha256=shards.stats["tokenizer_sha256"],
            output_dir=home / "run").write(home / "run" / "run_config.json")
        loader = open_training(RunConfig.read(run_config), Dist(0, 1, torch.device("cpu")))
        for _ in range(loader.batches_per_epoch // 2):  # a run that stopped halfway through its first epoch
            loader.next_batch()
        stand_in_checkpoint(store, run_config, loader.state_dict())
        result = project.materialize(["data_card"])
        assert result.success
        base = store.dataset_dir("data_card")
        yield {"project": project, "store": store, "home": home, "refresh": refresh, "base": base,
               "card": json.loads((base / "data_card.json").read_text()),
               "markdown": (base / "data_card.md").read_text(), "config": load_config(project.config_path),
               "metadata": result.asset_materializations_for_node("data_card")[0].metadata}


def final_documents(built, source: str) -> list[dict]:
    """The last stage's documents of a source (doc_id, meta parsed), read straight from its Parquet parts."""
    folder = built["store"].dataset_dir(FINAL, f"{source}/{built['refresh']}")
    rows = [r for p in sorted(folder.glob("part-*.parquet"))
            for r in pq.read_table(p, columns=["doc_id", "meta"]).to_pylist()]
    assert rows, folder
    return [{"doc_id": r["doc_id"], "meta": json.loads(r["meta"])} for r in rows]


def train_tokens(built) -> dict[str, int]:
    """doc_id -> copies x tokens in the shards' training split, from the member list's Parquet."""
    folder = built["store"].dataset_dir("token_shards", built["refresh"])
    rows = [r for p in folder.glob("members-*.parquet") for r in pq.read_table(p).to_pylist()]
    return {r["doc_id"]: r["copies"] * r["tokens"] for r in rows if r["split"] == "train"}


def test_the_licence_table_counts_each_documents_own_licence(carded):
    card, markdown = carded["card"], carded["markdown"]
    docs, tokens = final_documents(carded, "web"), train_tokens(carded)
    declared = {f"w{i}": lic for i, lic in enumerate(WEB_LICENSES)}
    expected: dict[str, Counter] = {}
    unknown_ids = set()
    for d in docs:
        raw = d["meta"].get("package_license", MISSING)
        assert raw is declared[d["meta"]["id"]] or raw == declared[d["meta"]["id"]]  # the reader kept the field
        lic = "unknown" if raw in UNKNOWN else raw
        unknown_ids |= {d["doc_id"]} if lic == "unknown" else set()
        row = expected.setdefault(lic, Counter())
        row["documents"] += 1
        row["in_train_shards"] += tokens.get(d["doc_id"], 0) > 0
        row["train_tokens"] += tokens.get(d["doc_id"], 0)
    web = card["licenses"]["per_source"]["web"]
    assert web["field"] == "meta.package_license"
    assert {k: dict(v) for k, v in web["licenses"].items()} == {k: dict(v) for k, v in expected.items()}
    assert "All rights reserved" in web["licenses"] and web["unknown"] == len(unknown_ids) >= 3
    assert {d["doc_id"] for d in web["unknown_listed"]} == unknown_ids
    # Every train token of the source is under some licence: the licence table adds up to the shards' figure.
    shards = carded["store"].manifest("token_shards", carded["refresh"])
    assert sum(r["train_tokens"] for r in web["licenses"].values()) == shards.stats["sources"]["web"]["train_tokens"]
    # ref has no licence field: every document under the source's declared licence.
    ref = card["licenses"]["per_source"]["ref"]
    assert list(ref["licenses"]) == ["PSF-2.0"] and ref["field"] == "license"
    assert ref["licenses"]["PSF-2.0"]["documents"] == len(final_documents(carded, "ref")) and ref["unknown"] == 0
    for lic, row in expected.items():
        assert (f"| web | `meta.package_license` | {lic} | {row['documents']:,} | {row['in_train_shards']:,} | "
                f"{row['train_tokens']:,} |") in markdown
    assert "| ref | `license` | PSF-2.0 |" in markdown
    # The sources table gives web's documents' licences, not its declared placeholder.
    assert "per-page" not in markdown and (f"| web | per document (`meta.package_license`): {len(expected) - 1} "
                                           f"licences, {len(unknown_ids)} documents unknown | web |") in markdown
    # Unknown ones listed by locator and doc id (no text), up to card.list_unknown_licenses, the rest counted.
    [line] = [x for x in markdown.splitlines() if x.startswith(f"- web: {len(unknown_ids)} document(s) of unknown")]
    assert line.count("`id:w") == 2 and f"and {len(unknown_ids) - 2} more" in line


def test_languages_are_identified_where_the_language_step_ran(carded):
    card, markdown = carded["card"], carded["markdown"]
    ref = card["languages"]["per_source"]["ref"]
    identified = Counter(d["meta"]["language"] for d in final_documents(carded, "ref"))
    assert ref["identified"] and ref["settings"] == {"min_score": 0.5}
    assert {k: v["documents"] for k, v in ref["languages"].items()} == dict(identified) and "en" in identified
    web = card["languages"]["per_source"]["web"]
    assert not web["identified"] and list(web["languages"]) == ["not identified"]
    assert web["languages"]["not identified"]["documents"] == len(final_documents(carded, "web"))
    assert "## Languages" in markdown
    assert f"| ref | kept en at score ≥ 0.5 | en | {identified['en']:,} |" in markdown
    assert "| web | off (profile `none`) | not identified |" in markdown


def test_licences_and_languages_are_counted_as_recorded_once_the_documents_are_materialized_again(carded, tmp_path):
    """Both sources' last document stage, and ref's filtered documents, are materialized again after the checkpoint
    (committed with one row of the old version): the documents trained on are gone from the store, so the card
    counts them as the shards' member list recorded them, with the licence field of that time. The expected values
    are the card built while the documents were there, read from the documents themselves (checked above against
    pyarrow)."""
    import shutil

    from kiln.common.storage import Store

    shutil.copytree(carded["store"].root, tmp_path / "data", symlinks=True)
    store = Store(tmp_path / "data")
    for asset, source in ((FINAL, "web"), (FINAL, "ref"), ("filtered_documents", "ref")):
        partition = f"{source}/{carded['refresh']}"
        old = store.snapshot(asset, partition)
        with store.staging(asset, partition) as w:
            w.write("documents", pq.read_table(old.files("documents")[0]).slice(0, 1))
            w.commit(code_version="new", config={"changed": True}, inputs=old.manifest.inputs,
                     counts={"documents": 1}, stats={})
    before = carded["card"]
    for config in (carded["config"], carded["config"].model_copy(
            update={"card": carded["config"].card.model_copy(update={"license_fields": {}})})):
        card = build_data_card(store, config)
        for table in ("licenses", "languages"):
            for name, counted in card[table]["per_source"].items():
                assert before[table]["per_source"][name]["counted_from"] == "documents"
                assert counted == {**before[table]["per_source"][name], "counted_from": "member list"}
    assert card["licenses"]["per_source"]["web"]["field"] == "meta.package_license"  # as recorded, not today's
    assert card["licenses"]["per_source"]["web"]["unknown_listed"]  # listed by locator, from the member list
    markdown = data_card_markdown(card, list_unknown=carded["config"].card.list_unknown_licenses)
    note = "Counted from the token shards' member list, as recorded when the shards were written (these " \
           "documents were materialized again since the training): web, ref."
    for section in ("## Licenses of the documents", "## Languages"):
        now, was = (m.split(section)[1].split("\n## ")[0] for m in (markdown, carded["markdown"]))
        assert note in now and now.replace(note, "").rstrip() == was.rstrip()


def test_statements_from_the_card_config(carded):
    card, markdown = carded["card"], carded["markdown"]
    assert card["statements"]["intended_use"] == ["Testing the data card."]
    assert card["statements"]["out_of_scope_use"] == ["Anything else."]  # one string: a one-item list
    sections = {s.split("\n", 1)[0]: s for s in markdown.split("\n## ")}
    assert sections["Intended use"].strip().endswith("- Testing the data card.")
    assert "- Random words are not language.\n- Ten pages." in sections["Limitations"]
    assert "Not stated (set `card.known_biases` in the project config)." in sections["Known biases"]
    assert "Maintainers: the test suite; contact: nobody@example.org." in markdown
    assert carded["store"].manifest("data_card").config["card"]["limitations"] == STATEMENTS["limitations"]


def test_exposure_per_source_in_tokens_and_epochs(carded):
    card, markdown = carded["card"], carded["markdown"]
    roles = carded["store"].manifest("training_run").stats["exposure"]["roles"]
    section = markdown.split("## Exposure per source (what the run read)", 1)[1].split("\n## ", 1)[0]
    for s in card["sources"]:
        v = roles["train"]["per_source"][s["name"]]
        assert s["exposure"] == v and v["tokens_read"] > 0
        assert (f"| train | {s['name']} | {v['tokens_read']:,} | {v['tokens']:,} | {v['share']:,.4g} | "
                f"{v['passes']:,.4g} | {v['planned_epochs']:,.4g} |") in section
    assert "| epochs read | planned epochs |" in section


def test_the_funnel_chart_is_a_png_next_to_the_card(carded):
    base, markdown = carded["base"], carded["markdown"]
    png = (base / FUNNEL_PNG).read_bytes()
    assert png.startswith(b"\x89PNG\r\n\x1a\n") and len(png) > 1000
    assert f"]({FUNNEL_PNG})" in markdown and carded["card"]["funnel"]["chart"] == FUNNEL_PNG
    assert FUNNEL_PNG in {f.path for f in carded["store"].manifest("data_card").files}
    # The UI cannot open a file beside the metadata: the chart is inlined there, the rest is the same page.
    shown = carded["metadata"]["data_card"].value
    assert "](data:image/png;base64," in shown and FUNNEL_PNG not in shown
    # Kept and removed, never a bare stage name for a count.
    assert "| source | records read | kept after raw_documents | kept after filtered_documents |" in markdown


def test_links_work_off_this_machine(carded):
    card, markdown, base = carded["card"], carded["markdown"], carded["base"]
    assert not any(host in text for text in (markdown, json.dumps(card)) for host in ("127.0.0.1", "localhost"))
    m = card["mlflow"]
    assert m["run_id"] == "abc123" and "url" not in m
    assert m["tracking_uri"] == f"sqlite:///{carded['home'] / 'mlflow.db'}"
    assert not Path(m["store"]).is_absolute() and (base / m["store"]).resolve() == (carded["home"] / "mlflow.db")
    assert f"[`{m['store']}`]({m['store']})" in markdown
    assert "abc123" in carded["metadata"]["mlflow_run"].value


def test_a_tracking_server_is_linked_as_configured(carded, tmp_path):
    store, config = carded["store"], carded["config"]
    card = build_data_card(store, config, run_url=lambda e, r: f"https://mlflow.example.org/#/experiments/{e}/runs/{r}",
                           tracking_uri="https://mlflow.example.org")
    assert card["mlflow"]["url"].startswith("https://mlflow.example.org") and "store" not in card["mlflow"]
    assert "https://mlflow.example.org/#/experiments/1/runs/abc123" in data_card_markdown(card)
    # A file store given as a folder (mlruns) or a file: URI: relative to the card's folder too.
    card_dir = tmp_path / "data" / "data_card" / "_all"
    assert mlflow_store(str(tmp_path / "mlruns"), card_dir)["store"] == "../../../mlruns"
    assert mlflow_store((tmp_path / "mlruns").as_uri(), card_dir)["store"] == "../../../mlruns"
    assert mlflow_store(f"sqlite:///{tmp_path}/m.db", card_dir)["store"] == "../../../m.db"


def test_the_tracking_uris_credentials_reach_neither_the_card_nor_the_run_link(carded):
    """MLFLOW_TRACKING_URI may carry a user and password (basic auth); the card and Dagster's metadata show the
    server without them."""
    from resources import MlflowTracking

    uri = "https://alice:s3cr3tTok3n@mlflow.example.org"
    tracking = MlflowTracking(tracking_uri=uri)
    url = tracking.run_url("1", "abc123")
    assert url == "https://mlflow.example.org/#/experiments/1/runs/abc123"
    card = build_data_card(carded["store"], carded["config"], run_url=tracking.run_url, tracking_uri=uri)
    assert card["mlflow"]["tracking_uri"] == "https://mlflow.example.org"
    assert "s3cr3tTok3n" not in json.dumps(card) and "s3cr3tTok3n" not in data_card_markdown(card)


def test_the_default_config_ships_no_toy_benchmark_and_the_demo_adds_it(tmp_path, monkeypatch):
    default, demo = load_config(ROOT / "configs" / "default.yaml"), load_config(ROOT / "configs" / "demo.yaml")
    assert default.decontamination.benchmarks == []
    assert [b.name for b in demo.decontamination.benchmarks] == ["demo_eval"]
    # The demo adds its toy benchmark and its card statements, nothing else.
    assert demo.model_dump(exclude={"decontamination", "card"}) == default.model_dump(exclude={"decontamination", "card"})
    assert Path(demo.decontamination.benchmarks[0].path).is_file()  # relative to the repository root, as run
    # The demo and `make` pick the demo's config when KILN_CONFIG is not set otherwise.
    assert "export KILN_CONFIG := $(or $(KILN_CONFIG),$(CURDIR)/configs/demo.yaml)" in (ROOT / "Makefile").read_text()
    from orchestration.demo import DEMO_CONFIG
    assert DEMO_CONFIG == ROOT / "configs" / "demo.yaml"
    # The demo's card states what the embedded corpora are for and reads the packages' own licences; the default
    # one states nothing a user would inherit for other data.
    assert demo.card.intended_use and demo.card.limitations and demo.card.out_of_scope_use
    assert demo.card.license_fields == {"package_readmes": "package_license", "package_licenses": "package_license"}
    assert not (default.card.summary or default.card.intended_use or default.card.limitations
                or default.card.license_fields)
    assert os.path.exists(ROOT / "kiln" / "dedup" / "data" / "benchmarks" / "demo_eval.jsonl")


def test_card_license_fields_must_name_a_source():
    raw = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    raw["card"]["license_fields"] = {"wikipedia": "license"}
    with pytest.raises(ConfigError, match=r"card.license_fields names unknown source 'wikipedia'"):
        parse_config(raw)
    raw["card"] = {"intended_uses": ["typo"]}
    with pytest.raises(ConfigError, match=r"card.intended_uses: unknown key; did you mean 'intended_use'"):
        parse_config(raw)


def _markdown_tokens(markdown: str) -> list:
    """Every token of the page as a CommonMark parser with GFM tables reads it (markdown-it-py), inline ones too."""
    from markdown_it import MarkdownIt

    flat = []
    for token in MarkdownIt("commonmark").enable("table").parse(markdown):
        flat += [token, *(token.children or [])]
    return flat


def _table_rows(markdown: str) -> list[list[str]]:
    """Each table row's cells as a reader sees them (text and code spans, markup gone)."""
    rows, row = [], None
    for token in _markdown_tokens(markdown):
        if token.type == "tr_open":
            row = []
            rows.append(row)
        elif token.type == "inline" and row is not None:
            row.append("".join(c.content for c in token.children if c.type in ("text", "code_inline")))
    return rows


def test_strings_from_the_documents_show_as_themselves_in_the_markdown(carded):
    """Licences, languages, locators and a request's reason come from the data: whatever markup, HTML, bidi
    override or control character they spell, a CommonMark reader shows them as text and the page keeps its
    structure (no tag, link, image or heading of theirs, no row split, no code span broken out of)."""
    import copy

    card = copy.deepcopy(carded["card"])
    hostile = {"<script>alert(1)</script>": "<script>alert(1)</script>",
               "GPL\n# Injected heading": "GPL # Injected heading",
               "\u202eTIM": "\\u202eTIM",  # shown as its escape: U+202E would make it read "MIT"
               "[click](https://evil.example)": "[click](https://evil.example)",
               "![x](https://evil.example/x.png)": "![x](https://evil.example/x.png)",
               "MIT | Apache-2.0": "MIT | Apache-2.0", "*bold* _it_ ~~gone~~ &#x202E;": "*bold* _it_ ~~gone~~ &#x202E;",
               "\x1b]0;title\x07red": "\\u001b]0;title\\u0007red"}
    row = {"documents": 1, "in_train_shards": 0, "train_tokens": 0}
    web = card["licenses"]["per_source"]["web"]
    web["licenses"] = {**web["licenses"], **{lic: row for lic in hostile}}
    web["unknown_listed"] = [{"doc_id": "d1", "locator": "id:w`5\n# boom", "in_train_shards": False},
                             {"doc_id": "d2", "locator": "id:w6|x", "in_train_shards": True},
                             {"doc_id": "d3", "locator": "``a``", "in_train_shards": False}]
    card["languages"]["per_source"]["web"]["languages"]["<b>xx</b>"] = row
    card["removal_requests"] = [{"request_id": "r1", "created_at": card["generated_at"], "kind": "doc_ids",
                                 "value": "1 doc ids", "reason": "<img src=x onerror=alert(1)>",
                                 "affected": {"documents": 1, "tokens": 2}}]
    markdown = data_card_markdown(card, list_unknown=10)
    tokens = _markdown_tokens(markdown)
    assert not [t for t in tokens if t.type in ("html_inline", "html_block", "image")]
    assert {t.attrs["href"] for t in tokens if t.type == "link_open"} == {card["mlflow"]["store"]}  # the card's own
    headings = [tokens[i + 1].content for i, t in enumerate(tokens) if t.type == "heading_open"]
    assert not [h for h in headings if "Injected" in h or "boom" in h]
    assert not [c for c in markdown if c in "\u202e\x1b\x07"]
    rows = _table_rows(markdown)
    licences = [r for r in rows if r[:2] == ["web", "meta.package_license"]]
    assert {r[2] for r in licences} >= set(hostile.values()) and {len(r) for r in licences} == {6}
    assert next(r for r in rows if r[2] == "<b>xx</b>")[:4] == ["web", "off (profile none)", "<b>xx</b>", "1"]
    assert next(r for r in rows if r[0] == "r1")[4] == "<img src=x onerror=alert(1)>"
    # The locators in code spans, whole: a backtick or a '|' in one does not end it.
    listed = next(t for t in tokens if t.type == "inline" and "document(s) of unknown licence" in t.content)
    assert [c.content for c in listed.children if c.type == "code_inline"] == ["id:w`5 # boom", "id:w6|x", "``a``"]


def test_documents_removed_by_request_are_no_licence_and_no_language_share(carded):
    """A source counted from the member list may hold documents a removal request took out: nothing is recorded of
    them but their id. They are no licence (the sources table counts web's licences without them) and take no share
    of the languages (web's documents are all "not identified": 100% of those whose language could be)."""
    import copy

    from kiln.governance.data_card_documents import REMOVED_BY_REQUEST

    card = copy.deepcopy(carded["card"])
    removed = {"documents": 3, "in_train_shards": 0, "train_tokens": 0}
    web = card["licenses"]["per_source"]["web"]
    known = len([lic for lic in web["licenses"] if lic != "unknown"])  # before: no request
    web["licenses"][REMOVED_BY_REQUEST] = removed
    card["languages"]["per_source"]["web"]["languages"][REMOVED_BY_REQUEST] = removed
    markdown = data_card_markdown(card)
    assert (f"| web | per document (`meta.package_license`): {known} licences, {web['unknown']} documents unknown, "
            f"3 removed by request | web |") in markdown
    not_identified = card["languages"]["per_source"]["web"]["languages"]["not identified"]["documents"]
    assert f"| web | off (profile `none`) | not identified | {not_identified:,} | 100.0% |" in markdown
    # Each is a row of its own, said for what it is, with no share.
    assert "| web | `meta.package_license` | removed by request: no licence recorded | 3 | 0 | 0 |" in markdown
    assert "| web | off (profile `none`) | removed by request: no language recorded | 3 | – | 0 |" in markdown


def test_a_small_share_is_kept_and_shown_as_below_the_cards_precision(carded):
    """A source of 400k tokens beside one of 10B: its share of the mixture is 4e-05, not 0 (rounded to 4 decimals),
    and the markdown, which shows 4 decimals at most, says it is below them rather than 0."""
    import copy
    from types import SimpleNamespace

    from kiln.governance.data_card import _mixture

    shards = SimpleNamespace(config={"mixture": {}}, stats={})
    mixture = _mixture(shards, {"web": {"train_tokens": 10_000_000_000}, "tiny": {"train_tokens": 400_000}})
    assert mixture["per_source"]["tiny"]["share"] == 400_000 / 10_000_400_000
    card = copy.deepcopy(carded["card"])
    card["mixture"]["per_source"]["web"]["share"] = 4e-05
    exposure = card["training"]["exposure"]["roles"]["train"]["per_source"]["web"]
    exposure.update(share=3e-06, passes=2e-05)
    card["sources"][0]["exposure"] = exposure
    markdown = data_card_markdown(card)
    mixture_row = next(x for x in markdown.split("## Mixture and effective epochs")[1].splitlines()
                       if x.startswith("| web |"))
    assert mixture_row.split(" | ")[4] == "<0.0001"
    exposure_row = next(x for x in markdown.split("## Exposure per source")[1].splitlines()
                        if x.startswith("| train | web |"))
    assert exposure_row.split(" | ")[4:6] == ["<0.0001", "<0.0001"]
    assert next(x for x in markdown.splitlines() if x.startswith("| web | per document")).endswith(" | <0.0001 |")
