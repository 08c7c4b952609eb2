"""What of a record may be stored after intake besides its redacted text: its URL and meta redacted the way its text
is, and a quarantined record as a hash, a locator and a redacted excerpt."""

import hashlib
import json

import pytest

from kiln.common.config import parse_config
from kiln.common.storage import Store
from kiln.curation.documents import Document
from kiln.curation.filters.url import UrlBlocklist
from kiln.curation.pii.fields import named_pii, redact_fields, redact_meta, redact_url, step_redactor, text_lookup
from kiln.curation.pii.redaction import PiiRedaction
from kiln.curation.pipeline import filter_documents, ingest, profile_steps
from kiln.curation.residual_pii import residual_pii_fields
from tests.conftest import SERIAL_ENGINE, prose, write_jsonl

EMAIL, PHONE, TOKEN = "quinn.harlow@fastmail.fm", "+44 20 7946 0958", "ghp_4Xq9ZrT2mLp8Vn3Kd7Wb1Yc6Hf5Js0Ae2Gu4"
LOOKUP = text_lookup()


@pytest.mark.parametrize("url, expected", [
    # credentials go, the rest of the address stays
    ("https://alice:hunter2@shop.example.net/cart?item=42", "https://shop.example.net/cart?item=42"),
    # an e-mail address in the query, as is and percent-encoded under a name that says nothing
    (f"https://shop.example.net/p?email={EMAIL}&q=red+shoes", "https://shop.example.net/p?email=<EMAIL>&q=red+shoes"),
    ("https://shop.example.net/p?ref=quinn.harlow%40fastmail.fm", "https://shop.example.net/p?ref=<EMAIL>"),
    # a credential by its parameter's name (too short for any detector), and a provider token by its shape
    ("https://api.example.net/v1/items?token=abc123&page=2", "https://api.example.net/v1/items?token=<SECRET>&page=2"),
    (f"https://api.example.net/v1/items?t={TOKEN}", "https://api.example.net/v1/items?t=<SECRET>"),
    ("https://s3.example.net/b/k?X-Amz-Credential=AK%2F2024&X-Amz-Signature=9f3a",
     "https://s3.example.net/b/k?X-Amz-Credential=<SECRET>&X-Amz-Signature=<SECRET>"),
    ("https://app.example.net/cb#access_token=xyz&state=7", "https://app.example.net/cb#access_token=<SECRET>&state=7"),
    # a phone number: encoded, with '+' for spaces, and by a contact name
    ("https://x.example.net/?c=%2B44%2020%207946%200958", "https://x.example.net/?c=<PHONE>"),
    ("https://x.example.net/?c=+44+20+7946+0958", "https://x.example.net/?c=<PHONE>"),
    ("https://x.example.net/?phone=3128675309", "https://x.example.net/?phone=<PHONE>"),
    # PII in the host and in the path
    ("http://83.149.21.7:8080/status", "http://<IPV4>:8080/status"),
    ("https://x.example.net/users/quinn.harlow%40fastmail.fm/posts", "https://x.example.net/users/<EMAIL>/posts"),
    (f"mailto:{EMAIL}", "mailto:<EMAIL>"),
])
def test_a_url_loses_its_credentials_and_the_pii_in_it(url, expected):
    assert redact_url(url, LOOKUP) == expected


@pytest.mark.parametrize("url", [
    "https://docs.python.org/3.11/search.html?q=os.path&check_keywords=yes&area=default#module-os.path",
    "https://pypi.org/project/requests/?version=2.31.0.1&sort=desc",  # a version after its name is no IP address
    "https://example.org/a%20b/?q=caf%C3%A9+au+lait&page=2&tokenizer=bpe",
    "https://example.org/",
])
def test_a_url_with_nothing_in_it_stays_byte_for_byte(url):
    assert redact_url(url, LOOKUP) == url


def test_parameter_names_that_hold_credentials_or_contacts():
    assert [named_pii(n) for n in ("access_token", "apiKey", "api-key", "X-Amz-Signature", "client_secret",
                                   "password", "author_email", "phoneNumber", "email_address", "ssn")] == \
        ["secret"] * 6 + ["email", "phone", "email", "us_ssn"]
    assert [named_pii(n) for n in ("tokenizer", "key", "monkey", "page", "automobile", "q", "")] == [None] * 7


def test_meta_strings_are_redacted_at_any_depth_and_names_that_hold_pii_lose_their_value():
    meta = {"author_email": EMAIL, "version": "2.8.0.1", "phone": 3128675309, "stars": 12, "ok": True, "none": None,
            "tags": ["python", f"call {PHONE}"], "profile": {"home": "https://bob:pw@x.example.net/?api_key=k1&lang=en",
                                                               "ip": "83.149.21.7"},
            EMAIL: "a key holding PII", "locator": "a.jsonl#L3"}
    assert redact_meta(meta, LOOKUP) == {
        "author_email": "<EMAIL>", "version": "2.8.0.1", "phone": "<PHONE>", "stars": 12, "ok": True, "none": None,
        "tags": ["python", "call <PHONE>"], "profile": {"home": "https://x.example.net/?api_key=<SECRET>&lang=en",
                                                        "ip": "<IPV4>"},
        "<EMAIL>": "a key holding PII", "locator": "a.jsonl#L3"}


def test_plural_and_list_names_hold_what_their_singular_holds_and_counts_stay_counts():
    assert [named_pii(n) for n in ("phones", "emails", "phone_numbers", "contact_emails", "api_keys", "apiKeys",
                                   "email_addresses", "secrets", "passwords", "access_tokens", "refreshTokens",
                                   "session_ids", "faxes", "ssns")] == \
        ["phone", "email", "phone", "email"] + ["secret"] * 2 + ["email"] + ["secret"] * 5 + ["phone", "us_ssn"]
    # a token count is no credential, a notebook's cells are no phones, a count of e-mails is a number
    assert [named_pii(n) for n in ("tokens", "num_tokens", "token_count", "max_tokens", "input_tokens", "n_tokens",
                                   "cells", "num_emails", "number_of_phones", "n_phone_numbers", "email_count",
                                   "signatures", "passes", "names", "titles", "urls", "keys")] == [None] * 17
    assert [named_pii(n) for n in ("name", "title", "url", "token", "tokenizer")] == [None, None, None, "secret", None]


# meta with numbers: a phone number kept as an int under a plural name or a contact label, and numbers that are
# counts, years, ids, sizes and timestamps
NUMBERS_META = {"phones": [14155552671, PHONE], "emails": [EMAIL, "x"], "phone_numbers": [3128675309],
                "contact_emails": "team", "api_keys": ["k1"], "contact": 14155552671, "tel": 4915123456789,
                "author": {"mobile": 3128675309, "id": 3128675309},
                "created": 1700000000, "timestamp": 1700000000, "year": 2024, "tokens": 512, "num_tokens": 2048,
                "token_count": 4096, "num_emails": 3, "size": 2147483647, "n": 3128675309, "score": 0.5,
                "stars": 1234567, "ok": True}
NUMBERS_REDACTED = {"phones": ["<PHONE>", "<PHONE>"], "emails": ["<EMAIL>", "<EMAIL>"], "phone_numbers": ["<PHONE>"],
                    "contact_emails": "<EMAIL>", "api_keys": ["<SECRET>"], "contact": "<PHONE>", "tel": "<PHONE>",
                    "author": {"mobile": "<PHONE>", "id": 3128675309},
                    "created": 1700000000, "timestamp": 1700000000, "year": 2024, "tokens": 512, "num_tokens": 2048,
                    "token_count": 4096, "num_emails": 3, "size": 2147483647, "n": 3128675309, "score": 0.5,
                    "stars": 1234567, "ok": True}


def test_numbers_in_meta_are_read_after_their_name_as_strings_are():
    """An int of 7 or more digits passes the redactor as its digits after its key ("contact: 14155552671" is a
    phone number); it stays an int unless something is found. A bare number, or one under a name that is no phone
    cue (a timestamp, an id, a size), is not a phone number."""
    assert redact_meta(NUMBERS_META, LOOKUP) == NUMBERS_REDACTED
    assert LOOKUP("1700000000") == "1700000000" and LOOKUP("14155552671") == "14155552671"
    # the same numbers as floats (JSON writes 14155552671.0; a pandas integer column with nulls reads as floats)
    floats = {"contact": 14155552671.0, "created": 1700000000.0, "score": 0.5, "ratio": float("nan")}
    redacted = redact_meta(floats, LOOKUP)
    assert redacted["contact"] == "<PHONE>" and redacted["created"] == 1700000000.0 and redacted["score"] == 0.5
    # and the residual audit reads them too
    assert residual_pii_fields([None], [json.dumps({"tel": 14155552671.0})]) == [[("meta", "phone")]]


def test_the_batched_redaction_of_fields_gives_what_one_lookup_gives():
    """`redact_fields` collects a batch's texts in a first pass: a number's digits are among them, so a document
    whose only finding is a number is passed again."""
    metas = [dict(NUMBERS_META), {"contact": 14155552671, "stars": 3}, {"created": 1700000000, "tokens": 512}]
    docs = [Document(str(i), "web", "t", meta=meta) for i, meta in enumerate(metas)]
    redact_fields(docs, step_redactor(PiiRedaction()))
    assert [d.meta for d in docs] == [NUMBERS_REDACTED, {"contact": "<PHONE>", "stars": 3},
                                      {"created": 1700000000, "tokens": 512}]


def test_the_placeholders_written_into_url_and_meta_are_counted_by_type():
    """Counted by hand: the URL's e-mail parameter (1 e-mail, by its name), author_email (1 e-mail, by its name),
    contact.phone (1 phone, by its name) and the Berlin number in a note (1 phone, by its shape); nothing for the
    clean document, nor for a placeholder a field already held. The card's "PII replaced" read only the text's."""
    docs = [Document("a", "web", "t", url=f"https://news.example.net/p?email={EMAIL}&page=2",
                     meta={"author_email": EMAIL, "contact": {"phone": PHONE}, "note": "ruf an: +49 30 91456342"}),
            Document("b", "web", "t", url="https://news.example.net/q", meta={"stars": 3}),
            Document("c", "web", "t", meta={"author": "<EMAIL>", "stars": 4})]
    assert redact_fields(docs, step_redactor(PiiRedaction())) == {"email": 2, "phone": 2}
    assert docs[0].meta["note"] == "ruf an: <PHONE>" and docs[2].meta == {"author": "<EMAIL>", "stars": 4}


def _filter(tmp_path, records, profile, keep="none"):
    write_jsonl(tmp_path / "web" / "a.jsonl", records)
    config = parse_config({
        "sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC0",
                     "domain": "web", "profile": "p"}],
        "profiles": {"p": profile}, "engine": SERIAL_ENGINE, "curation": {"keep_rejected_text": keep}})
    store = Store(tmp_path / "store")
    with store.staging("raw", "web") as w:
        stats = ingest(config.sources[0], config.reading, w, progress=False, rejected_text=keep)
        w.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())
    with store.staging("filtered", "web") as w:
        filtered = filter_documents(store.files("raw", "web", "documents"), profile_steps(config, "web"),
                                    config.curation.exact_dedup, w, progress=False)
        w.commit(code_version="t", config={}, inputs={}, counts={}, stats=filtered.to_dict())
    kept = store.read_table("filtered", "web").to_pylist()
    rejected = store.read_table("filtered", "web", "rejected").to_pylist() \
        if store.files("filtered", "web", "rejected") else []
    return stats, store, kept, rejected


def test_the_filter_stage_redacts_url_and_meta_of_kept_and_rejected_rows_after_the_blocklist_decided(tmp_path):
    """The blocklist decides on the URL as read (a blocked host behind credentials and PII is still blocked, an
    allowed one still allowed); what both tables store is the redacted URL and meta."""
    records = [
        {"id": "kept", "text": prose(1), "url": f"https://alice:hunter2@news.example.org/a?email={EMAIL}&page=2",
         "author_email": EMAIL, "contact": {"phone": PHONE, "site": "https://news.example.org/"}},
        {"id": "blocked", "text": prose(2), "url": f"https://bob:pw@spam.blocked.example/x?token=t0k3n&ref={EMAIL}",
         "author_email": EMAIL},
    ]
    decided = [UrlBlocklist()(Document("d", "web", prose(1), url=r["url"])).drop for r in records]
    assert decided == [None, "url_blocklist.blocked_domain"]
    _, store, kept, rejected = _filter(tmp_path, records, ["url_blocklist"])
    # the filter stage's pii counts hold what url and meta were given too (the texts hold none): kept, an e-mail in
    # the URL, author_email, contact.phone; rejected, ref's e-mail, author_email, the token
    assert store.manifest("filtered", "web").stats["steps"]["pii"]["counts"] == {"email": 4, "phone": 1, "secret": 1}
    (row,) = kept
    assert row["url"] == "https://news.example.org/a?email=<EMAIL>&page=2"
    assert json.loads(row["meta"]) == {"id": "kept", "author_email": "<EMAIL>", "locator": "id:kept",
                                       "contact": {"phone": "<PHONE>", "site": "https://news.example.org/"}}
    (dropped,) = rejected
    assert dropped["reason"] == "url_blocklist.blocked_domain"
    assert dropped["url"] == "https://spam.blocked.example/x?token=<SECRET>&ref=<EMAIL>"


def test_quarantined_records_keep_a_redacted_excerpt_and_a_hash_and_metadata_no_raw_text(tmp_path):
    """A malformed line and a repeated id, both full of PII: the quarantine table holds their hashes (blake2b-128
    of the line's bytes, of the repeat's text) and redacted excerpts; the stage's examples (Dagster metadata) show
    redacted locators, and no excerpt unless removed text may be kept."""
    malformed = '{"id": "m", "text": "write to ' + EMAIL + ' or call ' + PHONE + '"'  # no closing brace
    repeat_text = f"Second copy: write to {EMAIL} or call {PHONE}."
    records = [{"id": EMAIL, "text": prose(1)}, malformed, {"id": EMAIL, "text": repeat_text}]
    for keep in ("none", "excerpt"):
        stats, store, kept, _ = _filter(tmp_path / keep, records, [], keep)
        assert len(kept) == 1
        rows = {q["reason"]: q for q in store.read_table("raw", "web", "quarantine").to_pylist()}
        assert rows["malformed_json"]["excerpt"] == \
            'Expecting \',\' delimiter: {"id": "m", "text": "write to <EMAIL> or call <PHONE>"\n'
        assert rows["malformed_json"]["record_hash"] == \
            hashlib.blake2b((malformed + "\n").encode(), digest_size=16).hexdigest()
        assert rows["malformed_json"]["locator"] == "a.jsonl#L2"
        assert rows["duplicate_doc_id"]["excerpt"] == "Second copy: write to <EMAIL> or call <PHONE>."
        assert rows["duplicate_doc_id"]["record_hash"] == \
            hashlib.blake2b(repeat_text.encode(), digest_size=16).hexdigest()
        examples = stats.examples
        assert examples["read.duplicate_doc_id"][0]["doc_id"] == "id:<EMAIL>"
        assert examples["read.malformed_json"][0]["doc_id"] == "a.jsonl#L2"
        if keep == "none":
            assert all("excerpt" not in e for items in examples.values() for e in items)
        else:
            assert examples["read.duplicate_doc_id"][0]["excerpt"] == rows["duplicate_doc_id"]["excerpt"]
        assert EMAIL not in json.dumps(stats.to_dict()) and PHONE not in json.dumps(stats.to_dict())


def test_a_doc_id_repeated_across_files_is_quarantined_redacted_too(tmp_path):
    """Two files: the repeat is found by the doc-id shuffle (the first-id pass), not by the reading task."""
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": "x", "text": prose(1)}])
    write_jsonl(tmp_path / "web" / "b.jsonl", [{"id": "x", "text": f"mail {EMAIL}"}])
    config = parse_config({"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"),
                                        "license": "CC0", "domain": "web", "profile": "p"}],
                           "profiles": {"p": []}, "engine": SERIAL_ENGINE})
    store = Store(tmp_path / "store")
    with store.staging("raw", "web") as w:
        stats = ingest(config.sources[0], config.reading, w, progress=False, rejected_text="excerpt")
        w.commit(code_version="t", config={}, inputs={}, counts={})
    (row,) = store.read_table("raw", "web", "quarantine").to_pylist()
    assert (row["reason"], row["excerpt"], row["locator"]) == ("duplicate_doc_id", "mail <EMAIL>", "id:x")
    assert row["record_hash"] == hashlib.blake2b(f"mail {EMAIL}".encode(), digest_size=16).hexdigest()
    assert stats.examples["read.duplicate_doc_id"] == [{"doc_id": "id:x", "note": "", "excerpt": "mail <EMAIL>"}]


def test_the_residual_check_reads_url_and_meta_as_a_reader_would():
    """The audit's own detector on the fields: PII found where it is plain, encoded or after a '+', none in the
    redacted forms above, and a version after its name is no IP address."""
    urls = [f"https://x.example.net/?email={EMAIL}", "https://x.example.net/?c=+44+20+7946+0958",
            "http://83.149.21.7/", "https://x.example.net/?email=<EMAIL>&token=<SECRET>", None]
    metas = [None, json.dumps({"author": {"mail": "quinn.harlow%40fastmail.fm",
                                          "h": f"https://y.example.net/?e={EMAIL}"}}),
             json.dumps({"version": "2.8.0.1"}), json.dumps({"author_email": "<EMAIL>", "n": 3128675309}),
             json.dumps({"tel": 4930914563420})]
    assert residual_pii_fields(urls, metas) == [
        [("url", "email")], [("url", "phone"), ("meta", "email"), ("meta", "email")], [("url", "ipv4")], [],
        [("meta", "phone")]]  # the second document's meta: "quinn.harlow%40fastmail.fm" (percent-encoded) and h's EMAIL


def test_a_quarantined_records_excerpt_is_redacted_whatever_its_script(tmp_path):
    """Records quarantined whole (no text field, a text that is not a string, not an object, a lone surrogate) are
    shown by their JSON: ASCII-escaped, "jürgen" is "j\\u00fcrgen", which no detector reads as an address, and a
    no-break space between a number's groups hides the number. The excerpt keeps the characters as written."""
    email, phone = "jürgen.müller@example.de", "030\u00a091456342"
    said = f"Ruf an: {phone}, mail {email}"
    records = [{"id": "a", "body": said}, {"id": "b", "text": 7, "note": said}, [said],
               '{"id": "c", "note": "' + said + ' \\ud800", "text": "' + prose(1) + '"}', {"id": "d", "text": prose(2)}]
    _, store, kept, _ = _filter(tmp_path, records, [], "excerpt")
    assert len(kept) == 1
    rows = {q["reason"]: q["excerpt"] for q in store.read_table("raw", "web", "quarantine").to_pylist()}
    assert set(rows) == {"missing_text", "text_not_string", "not_an_object", "invalid_unicode"}
    for reason, excerpt in rows.items():
        assert "Ruf an: <PHONE>, mail <EMAIL>" in excerpt, (reason, excerpt)
        assert "91456342" not in excerpt and "müller" not in excerpt and "m\\u00fcller" not in excerpt
    assert "\\ud800" in rows["invalid_unicode"]  # the lone surrogate escaped, so the row could be written


def test_an_excerpt_after_a_long_secret_still_redacts_the_secret_at_the_excerpts_end(monkeypatch):
    """A private key early in a text is one 8-character placeholder for its ~300 characters: the redacted excerpt's
    200 characters then reach ~450 characters into the text, where a fixed window of 456 cut a GitHub token in two
    and its first 15 characters went through undetected."""
    from kiln.common.removals import kept_text

    body = "".join("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"[i * 7 % 64] for i in range(240))
    pem = "-----BEGIN PRIVATE KEY-----\n" + "\n".join(body[i:i + 64] for i in range(0, 240, 64)) + \
        "\n-----END PRIVATE KEY-----"
    head = "Deploy key:\n" + pem + "\nthen "
    text = head + "x" * (440 - len(head)) + " " + TOKEN + " for the bot. " + "More words follow here. " * 20
    assert text.index(TOKEN) == 441  # across the old window's cut at 456
    expected = ("Deploy key:\n<SECRET>\nthen " + "x" * (440 - len(head)) + " <SECRET> for the bot. "
                + "More words follow here. " * 20)[:200]
    assert kept_text(text, "excerpt") == expected
    # nothing to redact: the first 200 characters, from one window of 456 (not the whole 13,640-character text)
    import kiln.common.removals as removals

    windows = []
    monkeypatch.setattr(removals, "redact", lambda t, **_: windows.append(len(t)) or (t, {}))
    assert kept_text(prose(3) * 20, "excerpt") == (prose(3) * 20)[:200] and windows == [456]


def test_kept_text_of_a_removed_document_is_redacted_at_least_as_the_configured_pii_step_redacts():
    """A Panama number (fixed lines: 7 digits from 2, "200-1234") is a phone number only to a `pii` step whose
    `phone_regions` name PA, which the defaults do not. A removed document's kept text and excerpt redact it whatever
    the step's regions: it must not be the one place a configured user's PII survives."""
    from kiln.common.removals import example_excerpt, kept_text

    text = "Panama office, call us on tel: 200-1234 today. " + prose(4)
    assert PiiRedaction().batch([Document("d", "s", text)])[0].text == text  # default regions: not a number
    configured = PiiRedaction(phone_regions=["PA"]).batch([Document("d", "s", text)])[0].text
    assert configured.startswith("Panama office, call us on tel: <PHONE> today.")
    assert kept_text(text, "full") == configured
    assert kept_text(text, "excerpt") == example_excerpt(text, "full") == configured[:200]


@pytest.mark.parametrize("workers", [1, 2])
def test_the_residual_scan_of_a_stages_parts_runs_a_task_per_part_and_reports_in_part_order(tmp_path, workers):
    """The residual_pii check scans each part of the output as an engine task (a curated source of 100M documents
    was scanned in the step's one process). Worked by hand: seven documents, each with one finding (an e-mail in the
    text of five, the URL of one, a telephone number in the meta of one), and clean ones, in three parts whose last
    is the largest (an engine starts the largest first); the examples are the first five findings in part order."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kiln.curation.documents import DOCUMENT_SCHEMA
    from kiln.curation.residual_pii import scan_documents
    from kiln.engine import SERIAL, ProcessPool

    def doc(i: int, text: str = "Nothing to see here.", url=None, meta=None) -> dict:
        return Document(f"d{i}", "web", text, url=url, meta=meta or {}).to_row()

    parts = [[doc(0, f"Write to {EMAIL} today."), doc(1), doc(2, url=f"https://x.example.net/?email={EMAIL}")],
             [doc(3, meta={"tel": 4930914563420}), doc(4, f"Or to {EMAIL}.")],
             [doc(5, f"Mail {EMAIL}"), doc(6), doc(7, f"Also {EMAIL}"), doc(8, f"And {EMAIL}")] + [
                 doc(10 + k, prose(k)) for k in range(40)]]
    paths = []
    for k, rows in enumerate(parts):
        paths.append(tmp_path / f"documents-{k:05d}.parquet")
        pq.write_table(pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA), paths[-1])
    report = scan_documents(paths, engine=ProcessPool(workers=2) if workers == 2 else SERIAL, progress=False)
    assert report.hits == {"email": 6, "phone": 1} and report.fields == {"text": 5, "url": 1, "meta": 1}
    assert report.examples == ["d0: email in text", "d2: email in url", "d3: phone in meta", "d4: email in text",
                               "d5: email in text"]
