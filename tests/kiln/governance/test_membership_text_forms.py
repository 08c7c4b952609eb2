"""Membership by text finds a document whatever Unicode form the text is pasted in: the question goes through the
`normalize` step the documents went through before exact dedup hashed them (and the raw texts it falls back to do
too), so a takedown asked by text reaches the document."""

from __future__ import annotations

import unicodedata

import pytest

from kiln.common.config import load_config
from kiln.common.storage import Store
from kiln.curation.documents import make_doc_id
from kiln.governance.membership import membership
from tests.assets.project import load_project
from tests.conftest import SERIAL_ENGINE, write_jsonl

SHY = "\u00ad"
CAFE = ("Le café où la crème brûlée était servie chaque été près de la fenêtre, à côté du piano que personne "
        "n'accordait plus depuis des années, était notre endroit préféré.")
HARBOUR = ("The lighthouse keeper walked along the northern harbour wall every evening and counted the boats "
           "returning from the fishing grounds before the tide turned again.")
# An e-mail address: the curated text holds <EMAIL>, so only the raw text (stored decomposed, NFD) can match it.
MAIL = ("Écrivez à josé.müller@exemple.fr pour réserver une table près de la fenêtre du café; les crêpes flambées "
        "sont servies après vingt heures, été comme hiver.")
# A CMS's hyphenation: soft hyphens in the raw text, none in the curated one.
FRIDGE = f"Docu{SHY}men{SHY}ta{SHY}tion of the re{SHY}fri{SHY}ger{SHY}a{SHY}tor schedule, kept next to the loading dock."


def hyphenated(text: str) -> str:
    return " ".join(w[:2] + SHY + w[2:] if len(w) > 4 else w for w in text.split(" "))


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("forms")
    mp = pytest.MonkeyPatch()
    try:
        home = tmp / "kiln"
        mp.setenv("KILN_HOME", str(home))
        write_jsonl(tmp / "web" / "a.jsonl", [{"id": "cafe", "text": CAFE}, {"id": "harbour", "text": HARBOUR},
                                              {"id": "mail", "text": unicodedata.normalize("NFD", MAIL)},
                                              {"id": "fridge", "text": FRIDGE}])
        config = {"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp / "web"), "license": "CC0",
                               "domain": "web", "quality_tier": 1, "profile": "none"}],
                  "profiles": {"none": []}, "engine": SERIAL_ENGINE, "quality": {"classifier": {"enabled": False}}}
        project = load_project(config, tmp, home, mp, in_memory=True)
        for asset in ("raw_documents", "filtered_documents"):
            assert project.materialize([asset], "web").success
        yield Store(home / "data"), load_config(tmp / "kiln.yaml")
    finally:
        mp.undo()


@pytest.mark.parametrize("doc, query", [
    ("cafe", unicodedata.normalize("NFD", CAFE)),  # decomposed accents (macOS file names, some editors)
    ("cafe", CAFE.encode("utf-8").decode("cp1252")),  # mojibake that the normalize step's ftfy repairs
    ("cafe", "\ufeff" + CAFE.replace(" ", "\r\n", 3)),  # a Notepad file: byte-order mark, CRLF
    ("harbour", hyphenated(HARBOUR)),  # copied from a page with &shy;
    ("harbour", HARBOUR.replace(" the ", " the\u2060 ").replace("boats", "bo\u200bats")),  # word joiner, ZWSP
    ("mail", MAIL),  # composed query, decomposed raw text: both sides normalized
    ("mail", hyphenated(MAIL)),
    ("fridge", FRIDGE),  # the raw form: soft hyphens the curated text lost
    ("fridge", FRIDGE.replace(SHY, "")),
])
def test_a_text_in_another_unicode_form_finds_the_document_exactly(store, doc, query):
    answer = membership(*store, text=query)
    assert (answer.match, answer.doc_id) == ("exact", make_doc_id("web", f"id:{doc}"))


def test_a_copy_whose_curated_text_a_filter_rewrote_is_found_beside_the_unchanged_one(tmp_path, monkeypatch):
    """The same page in two sources: `web`'s C4 filter drops its "Share this page" line, `ref` keeps the text as it
    came. Asked by the page's text, both copies are named: the curated hash finds ref's, only the raw text finds
    web's, which is still headed for training; a takedown built from an answer naming ref's alone would leave it."""
    page = "Share this page\n" + "\n".join(
        f"The keeper of lighthouse number {i} walked the northern harbour wall every evening and counted boats."
        for i in range(6))
    for source in ("web", "ref"):
        write_jsonl(tmp_path / source / "a.jsonl", [{"id": "lh", "text": page}])
    config = {"sources": [{"name": s, "kind": "jsonl", "path": str(tmp_path / s), "license": "CC0", "domain": d,
                           "quality_tier": 1, "profile": p}
                          for s, d, p in (("web", "web", "c4only"), ("ref", "reference", "none"))],
              "profiles": {"none": [], "c4only": ["c4"]}, "engine": SERIAL_ENGINE,
              "quality": {"classifier": {"enabled": False}}}
    home = tmp_path / "kiln"
    monkeypatch.setenv("KILN_HOME", str(home))
    project = load_project(config, tmp_path, home, monkeypatch, in_memory=True)
    for source in ("web", "ref"):
        for asset in ("raw_documents", "filtered_documents"):
            assert project.materialize([asset], source).success
    store = Store(home / "data")
    [curated] = store.read_table("filtered_documents", project.partition("web"), columns=["text"]).to_pylist()
    assert not curated["text"].startswith("Share this page")  # the C4 line filter rewrote web's copy
    answer = membership(store, load_config(tmp_path / "kiln.yaml"), text=page)
    named = {answer.doc_id} | {m["doc_id"] for m in answer.other_matches}
    assert answer.match == "exact" and named == {make_doc_id("web", "id:lh"), make_doc_id("ref", "id:lh")}


def test_texts_as_read_are_searched_by_their_intake_hashes_and_read_only_where_none_cover_them(tmp_path, monkeypatch):
    """The filter stage keeps the hash of every text it read (`intake_hashes`): asked by text, membership reads no
    raw text while those hashes cover the raw documents. A source read but not filtered yet is not covered: its
    texts are read and hashed one by one, and its document is found."""
    from kiln.governance import membership as membership_module

    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": "cafe", "text": unicodedata.normalize("NFD", CAFE)}])
    write_jsonl(tmp_path / "ref" / "a.jsonl", [{"id": "harbour", "text": HARBOUR}])
    config = {"sources": [{"name": s, "kind": "jsonl", "path": str(tmp_path / s), "license": "CC0", "domain": "web",
                           "quality_tier": 1, "profile": "none"} for s in ("web", "ref")],
              "profiles": {"none": []}, "engine": SERIAL_ENGINE, "quality": {"classifier": {"enabled": False}}}
    home = tmp_path / "kiln"
    monkeypatch.setenv("KILN_HOME", str(home))
    project = load_project(config, tmp_path, home, monkeypatch, in_memory=True)
    for asset in ("raw_documents", "filtered_documents"):
        assert project.materialize([asset], "web").success
    store, settings = Store(home / "data"), load_config(tmp_path / "kiln.yaml")
    scanned = []
    scan = membership_module._scan_raw
    monkeypatch.setattr(membership_module, "_scan_raw", lambda *a: scanned.append(a[2]) or scan(*a))

    assert membership(store, settings, text=CAFE).doc_id == make_doc_id("web", "id:cafe")  # NFC asked, NFD read
    assert membership(store, settings, text=HARBOUR).verdict == "never_seen"
    assert scanned == []  # answered from the hashes alone

    assert project.materialize(["raw_documents"], "ref").success  # read, not filtered yet
    answer = membership(store, settings, text=HARBOUR)
    assert answer.doc_id == make_doc_id("ref", "id:harbour") and answer.stages[0].status == "kept", answer.summary
    assert scanned == [project.partition("ref")]


def test_the_text_as_the_filter_wrote_it_is_found_by_the_hashes_alone(store, monkeypatch):
    """A kept text the PII step rewrote (its e-mail address a placeholder) is found as written too: the bucketed
    intake hashes hold its curated hash beside the one of its text as read, so no documents' file is searched."""
    from kiln.governance import membership as membership_module

    data, config = store
    [partition] = data.partitions("filtered_documents")
    texts = {r["doc_id"]: r["text"] for r in data.read_table("filtered_documents", partition).to_pylist()}
    mail = make_doc_id("web", "id:mail")
    assert "<EMAIL>" in texts[mail] and "josé" not in texts[mail]
    searched = []
    search = membership_module.search
    monkeypatch.setattr(membership_module, "search",
                        lambda files, wanted: searched.extend(files) or search(files, wanted))
    answer = membership(data, config, text=texts[mail])
    assert (answer.match, answer.doc_id) == ("exact", mail)
    assert searched and all(path.name.startswith("intake_hashes-") for path in searched)
