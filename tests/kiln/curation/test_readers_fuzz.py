"""Readers that cannot be crashed: property tests of the real intake (`ingest`) for every file format.

Each test builds input files from generated data (valid, mutated, corrupt or random) and checks the intake's
invariant: it completes; kept + quarantined = the records in the file, each record exactly once (doc ids and
locators unique, the union covering every record); every kept string is valid Unicode. What "a record" is:

- Parquet: a row. A file with no rows is one `empty_file` record. A file that cannot be opened at all is one
  `unreadable_file` record (locator: the file); damage found while reading rows ends the file with one
  `unreadable_file` record at the first row not read (`x.parquet#row<k>`), after rows 0..k-1.
- WARC/WET: a `response`, `conversion` or `resource` record of a URL (warcinfo, request, metadata and revisit records
  hold no document and are not counted). An archive without one is one `empty_file` record; damage (what warcio cannot parse, a
  record without a valid Content-Length, an archive ending inside a record or in bytes that are no whole record)
  ends the archive with one `unreadable_file` record at `x.warc#<n+1>`, after the n document records read before.
- text: the file (one document per file, whatever its content or compression; damaged compression: one
  `unreadable_file` record).
- compressed JSONL: a non-blank line; damage ends the file with one `unreadable_file` record at the next line.

Bounded time: every test is derandomized with a fixed number of examples (see tests/kiln/curation/test_readers.py for the
plain-JSONL fuzz test).
"""

from __future__ import annotations

import decimal
import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import event, given, settings
from hypothesis import strategies as st
from hypothesis.control import currently_in_test_context

from kiln.common.config import Reading, Source
from kiln.common.storage import Store
from kiln.curation.pipeline import ingest

LIMIT = 64  # reading.max_document_bytes here, so "huge" strings (at and around the limit) stay cheap
READ_REASONS = {"invalid_utf8", "invalid_unicode", "not_an_object", "missing_text", "text_not_string", "empty_text",
                "too_large", "too_deep", "malformed_json", "malformed_html", "not_text", "unreadable_row",
                "unreadable_file", "empty_file", "duplicate_doc_id", "no_main_content", "invalid_charset"}


def fuzz(examples: int) -> settings:
    return settings(max_examples=examples, deadline=None, derandomize=True)


def source(kind, path, **kw):
    return Source(name="s", kind=kind, path=str(path), license="CC0", domain="web", profile="prose", **kw)


def _note(reason: str) -> None:
    """Count a quarantine reason in a property test, so `pytest --hypothesis-show-statistics` shows what the
    generators reach."""
    if currently_in_test_context():
        event(reason)


def intake(root, src, reading=None):
    """Run the real intake on `src`; its stats, kept rows and quarantine rows, with the invariants every format
    shares checked: counts add up, doc ids and locators are unique, every string is valid Unicode."""
    store = Store(root / "store")
    with store.staging("raw", "s") as writer:
        stats = ingest(src, reading or Reading(max_document_bytes=LIMIT, rows_per_part=3), writer, progress=False)
        writer.commit(code_version="t", config={}, inputs={}, counts={})
    kept = store.read_table("raw", "s").to_pylist() if store.files("raw", "s", "documents") else []
    quarantined = store.read_table("raw", "s", "quarantine").to_pylist() if store.files("raw", "s", "quarantine") \
        else []
    assert stats.docs_in == len(kept) + len(quarantined)
    assert stats.docs_out == len(kept)
    assert len({r["doc_id"] for r in kept}) == len(kept)
    for row in kept:
        for value in (row["text"], row["url"] or "", row["meta"]):
            value.encode("utf-8")  # strict: no lone surrogate reached Arrow
        assert isinstance(json.loads(row["meta"]), dict)
    for q in quarantined:
        _note(q["reason"])
        assert q["reason"] in READ_REASONS
        (q["locator"] + (q["excerpt"] or "")).encode("utf-8")
    locators = [json.loads(r["meta"])["locator"] for r in kept] + [q["locator"] for q in quarantined]
    assert len(set(locators)) == len(locators)
    return stats, kept, quarantined


def corrupted(data: bytes, how: str, k: int, noise: bytes) -> bytes:
    """`data` damaged: cut at k, bytes flipped at k (and after), garbage appended, or replaced by noise."""
    k = k % (len(data) + 1)
    if how == "truncate":
        return data[:k]
    if how == "flip":
        out = bytearray(data)
        for i, b in enumerate(noise or b"\x01"):
            if out:
                out[(k + i * 7919) % len(out)] ^= b or 0xFF
        return bytes(out)
    if how == "append":
        return data + noise
    return noise  # "replace": random bytes, not the format at all


_corruption = st.tuples(st.sampled_from(["truncate", "flip", "append", "replace"]), st.integers(0, 10_000),
                        st.binary(max_size=24))


def _sized(n: int) -> st.SearchStrategy[str]:
    """A string of about n UTF-8 bytes made of one repeated 1-, 2-, 3- or 4-byte character."""
    return st.sampled_from(["a", "é", "€", "\U0001F600"]).map(lambda c: c * max(1, n // len(c.encode())))


# Any code point but a surrogate (which no file format here can carry: Parquet strings are UTF-8), short, and
# strings at and around the size limit.
_texts = st.one_of(st.text(st.characters(exclude_categories=["Cs"]), max_size=24),
                   st.sampled_from(["", "   ", "\x00", "\x00 nul inside", "\ufeffbom"]),
                   st.integers(LIMIT - 4, LIMIT + 4).flatmap(_sized))


# ------------------------------------------------------------------------------------------------------ Parquet

def _column(n: int):
    """An Arrow array of n rows, of one of many types: what a text (or any other) column may turn out to be."""
    def rows(values):
        return st.lists(values, min_size=n, max_size=n)

    strings = rows(st.none() | _texts)
    return st.one_of(
        strings.map(lambda v: pa.array(v, pa.string())),
        strings.map(lambda v: pa.array(v, pa.large_string())),
        strings.map(lambda v: pa.array(v, pa.string()).dictionary_encode()),
        rows(st.none() | st.binary(max_size=12)).map(lambda v: pa.array(v, pa.binary())),
        # a string column holding invalid UTF-8: Parquet stores it, Arrow fails only when it decodes the values
        rows(st.binary(max_size=12)).map(lambda v: pa.array(v, pa.binary()).view(pa.string())),
        rows(st.none() | st.integers(-2**63, 2**63 - 1)).map(lambda v: pa.array(v, pa.int64())),
        rows(st.none() | st.floats()).map(lambda v: pa.array(v, pa.float64())),
        rows(st.none() | st.booleans()).map(lambda v: pa.array(v, pa.bool_())),
        # microseconds far outside Python's datetime range
        rows(st.none() | st.sampled_from([0, 2**62, -2**62]) | st.integers(-2**62, 2**62)).map(
            lambda v: pa.array(v, pa.timestamp("us"))),
        rows(st.none() | st.sampled_from([0, 2**31 - 1]) | st.integers(-2**31, 2**31 - 1)).map(
            lambda v: pa.array(v, pa.date32())),
        rows(st.none() | st.integers(-10**9, 10**9)).map(lambda v: pa.array(v, pa.duration("s"))),
        rows(st.none() | st.decimals(-10**6, 10**6, places=2)).map(
            lambda v: pa.array(v, pa.decimal128(12, 2))),
        rows(st.none() | st.fixed_dictionaries({"a": st.none() | st.integers(0, 9),
                                                "b": st.none() | st.binary(max_size=4), "t": st.none() | _texts})).map(
            lambda v: pa.array(v, pa.struct([("a", pa.int64()), ("b", pa.binary()), ("t", pa.string())]))),
        rows(st.none() | st.lists(st.none() | _texts, max_size=3)).map(lambda v: pa.array(v, pa.list_(pa.string()))),
        rows(st.none() | st.lists(st.lists(st.binary(max_size=3), max_size=2), max_size=2)).map(
            lambda v: pa.array(v, pa.list_(pa.list_(pa.binary())))),
        rows(st.none() | st.dictionaries(st.text(max_size=3), st.integers(0, 9), max_size=2)).map(
            lambda v: pa.array([None if m is None else list(m.items()) for m in v], pa.map_(pa.string(), pa.int64()))),
        st.just(pa.nulls(n)),
    )


@st.composite
def _tables(draw):
    n = draw(st.integers(0, 6))
    names = draw(st.lists(st.sampled_from(["url", "id", "meta", "c1", "c2", "locator"]), unique=True, max_size=3))
    columns = {name: draw(_column(n)) for name in names}
    text = draw(st.sampled_from(["string", "string", "any", "missing"]))  # mostly a text column of strings
    if text != "missing":
        columns["text"] = draw(st.lists(st.none() | _texts, min_size=n, max_size=n).map(pa.array)
                               if text == "string" else _column(n))
    return pa.table(columns) if columns else pa.table({"c": pa.nulls(n)})


def _write_parquet(table, row_group_size) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf, row_group_size=row_group_size)
    return buf.getvalue()


@fuzz(70)
@given(table=_tables(), row_group_size=st.sampled_from([1, 2, 100]))
def test_no_parquet_row_crashes_intake_and_every_row_is_counted_once(table, row_group_size, tmp_path_factory):
    """Rows of any column types (text as int/binary/struct/list/null/invalid UTF-8, or missing; timestamps out of
    Python's range, decimals, maps, nested lists as other columns), strings at the size limit: kept + quarantined
    = rows, each row once; a text column of strings is kept exactly where its value is a keepable text."""
    root = tmp_path_factory.mktemp("pq")
    (root / "x.parquet").write_bytes(_write_parquet(table, row_group_size))
    _, kept, quarantined = intake(root, source("parquet", root / "x.parquet", id_field=None))
    if table.num_rows == 0:
        assert not kept and [(q["locator"], q["reason"]) for q in quarantined] == [("x.parquet", "empty_file")]
        return
    locators = [json.loads(r["meta"])["locator"] for r in kept] + [q["locator"] for q in quarantined]
    assert sorted(locators) == sorted(f"x.parquet#row{i}" for i in range(table.num_rows))
    if "text" in table.column_names and table.column("text").type in (pa.string(), pa.large_string()):
        expected = {}  # rows whose text is keepable, and all of whose values convert (no invalid UTF-8 anywhere)
        for i in range(table.num_rows):
            try:
                value = table.slice(i, 1).to_pylist()[0]["text"]
            except (UnicodeDecodeError, ValueError, OverflowError):
                continue
            if isinstance(value, str) and value.strip() and len(value.encode()) <= LIMIT:
                expected[f"x.parquet#row{i}"] = value
        assert {json.loads(r["meta"])["locator"]: r["text"] for r in kept} == expected


def _valid_parquet() -> st.SearchStrategy[bytes]:
    rows = st.lists(st.tuples(_texts, st.integers(0, 99), st.binary(max_size=6)), min_size=1, max_size=8)
    return st.tuples(rows, st.sampled_from([1, 3, 100])).map(lambda a: _write_parquet(
        pa.table({"text": [r[0] for r in a[0]], "n": [r[1] for r in a[0]], "b": [r[2] for r in a[0]]}), a[1]))


@fuzz(60)
@given(data=_valid_parquet(), damage=_corruption)
def test_damaged_parquet_files_never_crash_intake(data, damage, tmp_path_factory):
    """A valid Parquet file truncated, with bytes flipped, garbage appended, or random bytes instead: either the
    whole file is one record (`unreadable_file`, or `empty_file` if its footer says no rows), or rows 0..k-1 are
    read and, if the damage is met, one `unreadable_file` record at row k stands for the rest."""
    root = tmp_path_factory.mktemp("pqbad")
    (root / "x.parquet").write_bytes(corrupted(data, *damage))
    _, kept, quarantined = intake(root, source("parquet", root / "x.parquet", id_field=None))
    rows = [json.loads(r["meta"])["locator"] for r in kept] + [q["locator"] for q in quarantined
                                                               if q["reason"] != "unreadable_file"]
    damaged = [q["locator"] for q in quarantined if q["reason"] == "unreadable_file"]
    assert len(damaged) <= 1
    _note(f"damage at {'row' if damaged and '#row' in damaged[0] else 'file'}")
    if damaged == ["x.parquet"] or rows == ["x.parquet"]:  # the whole file, one record
        assert len(kept) + len(quarantined) == 1
        return
    assert sorted(int(loc.rsplit("#row", 1)[1]) for loc in rows) == list(range(len(rows)))  # rows 0..k-1
    assert damaged in ([], [f"x.parquet#row{len(rows)}"])  # then row k stands for the rest


def test_parquet_column_types_that_crashed_intake(tmp_path):
    """Regression: invalid UTF-8 in a string column raised UnicodeDecodeError out of the reader; a timestamp outside
    Python's range raised OverflowError; bytes, dates, durations and decimals in other columns made the document's
    meta unserializable (TypeError in Document.to_row). Now: the bad rows are quarantined, the others kept, with
    those values in meta as strings."""
    table = pa.table({
        "text": pa.array([b"fine one", b"bad \xff utf-8", b"fine two", b"fine three"], pa.binary()).view(pa.string()),
        "blob": pa.array([b"\xff\xfe", None, b"ok", None], pa.binary()),
        "when": pa.array([0, None, None, 2**62], pa.timestamp("us")),
        "day": pa.array([0, None, 1, None], pa.date32()),
        "took": pa.array([90, None, None, None], pa.duration("s")),
        "price": pa.array([decimal.Decimal("1.50"), None, None, None], pa.decimal128(5, 2)),
        "nested": pa.array([{"b": b"\xfe"}, None, None, None], pa.struct([("b", pa.binary())])),
    })
    pq.write_table(table, tmp_path / "x.parquet", row_group_size=2)
    _, kept, quarantined = intake(tmp_path, source("parquet", tmp_path / "x.parquet", id_field=None))
    assert [r["text"] for r in kept] == ["fine one", "fine two"]
    assert sorted((q["locator"], q["reason"]) for q in quarantined) == [
        ("x.parquet#row1", "invalid_utf8"), ("x.parquet#row3", "unreadable_row")]
    meta = json.loads(kept[0]["meta"])
    assert meta["blob"] == "\\xff\\xfe" and meta["when"] == "1970-01-01T00:00:00" and meta["day"] == "1970-01-01"
    assert meta["took"] == "0:01:30" and meta["price"] == "1.50" and meta["nested"] == {"b": "\\xfe"}


def test_parquet_rows_past_the_first_batch_keep_their_own_locators(tmp_path):
    """Regression: the row number restarted at 0 in every batch (1,000 rows, or each row group), so row 1000 got
    row 0's locator and doc id, and was quarantined as duplicate_doc_id (with no id column: every row past the
    first batch). Now each row is `#row<n>` in file order, and all 2,500 rows are kept."""
    pq.write_table(pa.table({"text": [f"document {i}" for i in range(2500)]}), tmp_path / "big.parquet")
    pq.write_table(pa.table({"text": ["a", "b", "c"]}), tmp_path / "groups.parquet", row_group_size=1)
    for name, rows in [("big.parquet", 2500), ("groups.parquet", 3)]:
        (tmp_path / name.split(".")[0]).mkdir()
        _, kept, quarantined = intake(tmp_path / name.split(".")[0],
                                      source("parquet", tmp_path / name, id_field=None), Reading())
        assert not quarantined and len(kept) == rows
        assert [json.loads(r["meta"])["locator"] for r in kept] == [f"{name}#row{i}" for i in range(rows)]


def test_a_damaged_parquet_row_group_ends_the_file_after_the_rows_read(tmp_path):
    """The rows of the row groups before the damage are read; the damaged group and the rest are one
    unreadable_file record at the first row not read (before: the whole file, even its readable rows)."""
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": [f"row number {i}" for i in range(6)]}), buf, row_group_size=2,
                   compression="none")
    data = bytearray(buf.getvalue())
    chunk = pq.ParquetFile(io.BytesIO(bytes(data))).metadata.row_group(1).column(0)
    start = chunk.dictionary_page_offset or chunk.data_page_offset
    data[start: start + chunk.total_compressed_size] = b"\xff" * chunk.total_compressed_size
    (tmp_path / "x.parquet").write_bytes(bytes(data))
    _, kept, quarantined = intake(tmp_path, source("parquet", tmp_path / "x.parquet", id_field=None), Reading())
    assert [r["text"] for r in kept] == ["row number 0", "row number 1"]
    assert [(q["locator"], q["reason"]) for q in quarantined] == [("x.parquet#row2", "unreadable_file")]


# --------------------------------------------------------------------------------------------------- WARC / WET

def _warc_record(rec_type: str, block: bytes, rid: str | None, uri: str = "https://example.org/",
                 extra: list[tuple[str, str]] = (), length: int | None = None) -> bytes:
    headers = [("WARC-Type", rec_type)] + ([("WARC-Record-ID", rid)] if rid is not None else [])
    headers += [("WARC-Target-URI", uri), ("WARC-Date", "2024-01-01T00:00:00Z"), *extra]
    if rec_type in ("response", "request"):
        headers.append(("Content-Type", f"application/http; msgtype={rec_type}"))
    headers.append(("Content-Length", str(len(block) if length is None else length)))
    head = "WARC/1.0\r\n" + "".join(f"{k}: {v}\r\n" for k, v in headers) + "\r\n"
    return head.encode("utf-8") + block + b"\r\n\r\n"


def _http(body: bytes, content_type: str | None) -> bytes:
    head = "HTTP/1.1 200 OK\r\n" + (f"Content-Type: {content_type}\r\n" if content_type else "")
    return head.encode() + f"Content-Length: {len(body)}\r\n\r\n".encode() + body


_html = st.lists(st.sampled_from(["<p>", "</p>", "<b>", "<script>", "</script>", "<![ x ]>", "<![ x ]>", "<!--",
                                  "-->", "<!DOCTYPE html>", "&#xd800;", "&#x110000;", "&amp", "<", ">", "<svg>",
                                  "<head>", "<title>", "</", "<?php ?>", "<a href='x>"]) | st.text(max_size=6),
                 max_size=6).map("".join)
_payloads = st.one_of(
    _texts.map(lambda t: t.encode("utf-8")),
    st.tuples(_texts, st.sampled_from(["latin-1", "cp1252", "utf-16", "utf-16-le", "utf-8-sig"])).map(
        lambda a: a[0].encode(a[1], errors="replace")),
    st.binary(max_size=40),
    _html.map(lambda h: h.encode("utf-8")),
)
_content_types = st.sampled_from(["text/html; charset=utf-8", "text/html", "application/xhtml+xml", "text/plain",
                                  "text/css", "image/png", None])
# (type, payload, content type, has a WARC-Record-ID)
_warc_specs = st.lists(st.one_of(
    st.tuples(st.sampled_from(["response", "resource"]), _html.map(str.encode) | _payloads, _content_types,
              st.booleans() | st.just(True)),
    st.tuples(st.sampled_from(["conversion", "request", "warcinfo", "metadata"]), _payloads, st.none(),
              st.booleans() | st.just(True))), max_size=6)


def _archive(specs, gzipped: bool, name: str) -> tuple[bytes, list[str], list[tuple[int, int, bool]]]:
    """The archive's bytes, the expected id of each document record in order, and where each record starts and its
    block ends (uncompressed offsets), and whether it is a document record."""
    out, ids, spans, at = [], [], [], 0
    for i, (rec_type, payload, content_type, with_id) in enumerate(specs):
        rid = f"<urn:uuid:00000000-0000-0000-0000-{i:012d}>" if with_id else None
        block = _http(payload, content_type) if rec_type == "response" else payload
        resource_type = [("Content-Type", content_type)] if rec_type == "resource" and content_type else []
        record = _warc_record(rec_type, block, rid, extra=resource_type)
        out.append(gzip.compress(record, mtime=0) if gzipped else record)
        is_doc = rec_type in ("response", "conversion", "resource")  # a resource of a URL (https://example.org/)
        if is_doc:
            ids.append(rid or f"{name}#{len(ids) + 1}")
        spans.append((at, at + len(record) - 4, is_doc))  # the block ends before the record's closing CRLF CRLF
        at += len(record)
    return b"".join(out), ids, spans


def _warc_record_ids(kept, quarantined, name):
    """Each read record's WARC-Record-ID (`<urn:...>`), or `<file>#<n>` for the nth document record if it has none:
    a kept record's `id`, a quarantined one's locator (`<file>#<WARC-Record-ID>`, or that `<file>#<n>`)."""
    return [json.loads(r["meta"])["id"] for r in kept] + \
        [q["locator"].removeprefix(f"{name}#") if q["locator"].startswith(f"{name}#<") else q["locator"]
         for q in quarantined]


@fuzz(70)
@given(specs=_warc_specs, gzipped=st.booleans(), kind=st.sampled_from(["warc", "wet"]))
def test_no_warc_record_crashes_intake_and_every_document_record_is_counted_once(specs, gzipped, kind,
                                                                                 tmp_path_factory):
    """Archives of response / conversion records (HTML with hostile markup, text in latin-1 / UTF-16 / random bytes,
    empty and limit-sized payloads, non-text content types, no WARC-Record-ID) and resource records of a URL, among
    warcinfo / request / metadata records: kept + quarantined = the response, resource and conversion records, each
    once."""
    root = tmp_path_factory.mktemp("warc")
    name = "x.warc.gz" if gzipped else "x.warc"
    data, ids, _ = _archive(specs, gzipped, name)
    (root / name).write_bytes(data)
    _, kept, quarantined = intake(root, source(kind, root / name))
    if not ids:
        assert not kept and [(q["locator"], q["reason"]) for q in quarantined] == [(name, "empty_file")]
        return
    assert sorted(_warc_record_ids(kept, quarantined, name)) == sorted(ids)


@fuzz(60)
@given(specs=_warc_specs, gzipped=st.booleans(), damage=_corruption)
def test_damaged_warc_files_never_crash_intake(specs, gzipped, damage, tmp_path_factory):
    """An archive truncated (a cut .warc.gz member too), with bytes flipped, garbage appended, or random bytes
    instead: the n document records read before the damage are counted, then at most one `unreadable_file` record
    at `#<n+1>` for the rest; never more records than the archive had, plus that one. Exactly, for an uncompressed
    archive cut at byte k: the document records whose blocks end by k are read, and a document record cut in two
    is the unreadable_file record (never kept in part); with garbage appended, every document record is read."""
    root = tmp_path_factory.mktemp("warcbad")
    name = "x.warc.gz" if gzipped else "x.warc"
    data, ids, spans = _archive(specs, gzipped, name)
    damaged_data = corrupted(data, *damage)
    (root / name).write_bytes(damaged_data)
    _, kept, quarantined = intake(root, source("warc", root / name))
    damaged = [q["locator"] for q in quarantined if q["reason"] == "unreadable_file"]
    read = len(kept) + sum(q["reason"] not in ("unreadable_file", "empty_file") for q in quarantined)
    assert damaged in ([], [f"{name}#{read + 1}"])
    assert len(kept) + len(quarantined) <= max(1, len(ids) + 1)
    how, k = damage[0], len(damaged_data)
    if how == "truncate" and not gzipped:
        assert read == sum(is_doc and end <= k for _, end, is_doc in spans)
        if any(is_doc and start < k < end for start, end, is_doc in spans):
            assert damaged
    if how == "append":
        assert read == len(ids)


def test_warc_hostile_html_and_wrong_content_lengths(tmp_path):
    """Regression: HTML that Python's HTMLParser rejects (`<![ x ]>` raises AssertionError) ended the whole archive
    as one unreadable_file, losing the records after it: now that record alone is quarantined as malformed_html.
    A Content-Length running past the end of the file (a cut archive) kept the record with whatever followed it
    (here the next record, swallowed); now that is the damage: one unreadable_file record at `#<n+1>`. A
    Content-Length too short: warcio finds the next record again, and the short record is kept as declared."""
    good = _warc_record("conversion", b"a fine page of text", "<urn:a>")
    hostile = _warc_record("response", _http(b"<p>x</p><![ x ]>", "text/html"), "<urn:b>")
    after = _warc_record("conversion", b"read after the hostile page", "<urn:c>")
    no_id = _warc_record("conversion", b"a record without an id", None)
    last = _warc_record("conversion", b"the last page", "<urn:e>")
    head = good + hostile + after + no_id
    for name, tail in [("long", _warc_record("conversion", b"claims more than it has", "<urn:d>", length=10_000)),
                       ("short", _warc_record("conversion", b"claims less than it has", "<urn:d>", length=6))]:
        (tmp_path / name).mkdir()
        (tmp_path / name / "x.warc").write_bytes(head + tail + last)
        _, kept, quarantined = intake(tmp_path / name, source("warc", tmp_path / name / "x.warc"),
                                      Reading(html={"extractor": "visible_text"}))  # the reader HTMLParser rejects
        texts = {json.loads(r["meta"])["id"]: r["text"] for r in kept}
        reasons = {q["locator"]: q["reason"] for q in quarantined}
        assert texts | {"<urn:b>": None} == {"<urn:a>": "a fine page of text", "<urn:c>": "read after the hostile page",
                                             "x.warc#4": "a record without an id", "<urn:b>": None} | (
            {"<urn:d>": "claims", "<urn:e>": "the last page"} if name == "short" else {})
        assert reasons == {"x.warc#<urn:b>": "malformed_html"} | (
            {"x.warc#5": "unreadable_file"} if name == "long" else {})


@pytest.mark.parametrize("gzipped", [False, True])
@pytest.mark.parametrize("cut", ["block", "length", "header", "statusline"])
def test_a_cut_warc_ends_with_one_unreadable_record(tmp_path, gzipped, cut):
    """Regression: an archive cut inside its last record (a download stopped short) kept that record's partial
    text (cut in its block), an empty record (cut in its Content-Length value, which warcio reads as 0), or ended
    quietly as if complete (cut in its header: warcio stops at the EOFError). Now the records before the cut are
    read, and the cut record is one unreadable_file record at `#<n+1>`."""
    records = [_warc_record("conversion", f"page {i} of the crawl".encode(), f"<urn:{i}>") for i in range(3)]
    keep = {"block": len(records[-1]) - 10, "length": records[-1].index(b"Content-Length") + 15,
            "header": records[-1].index(b"Content-Length"), "statusline": 3}[cut]
    last = records[-1][:keep]
    data = b"".join(gzip.compress(r, mtime=0) for r in records[:-1]) + gzip.compress(last, mtime=0) if gzipped \
        else b"".join(records[:-1]) + last
    name = "x.warc.gz" if gzipped else "x.warc"
    (tmp_path / name).write_bytes(data)
    _, kept, quarantined = intake(tmp_path, source("warc", tmp_path / name), Reading())
    assert [r["text"] for r in kept] == ["page 0 of the crawl", "page 1 of the crawl"]
    assert [(q["locator"], q["reason"]) for q in quarantined] == [(f"{name}#3", "unreadable_file")]


def test_a_warc_record_without_content_length_does_not_swallow_the_archive(tmp_path):
    """Regression: a record (of any type) without Content-Length was read to the end of the archive, so a warcinfo
    record without one hid every document after it (an `empty_file`). Now it is damage: unreadable_file at `#1`."""
    info = _warc_record("warcinfo", b"software: x", "<urn:i>").replace(b"Content-Length: 11\r\n", b"")
    page = _warc_record("conversion", b"a page after it", "<urn:p>")
    (tmp_path / "x.warc").write_bytes(info + page + page.replace(b"<urn:p>", b"<urn:q>"))
    _, kept, quarantined = intake(tmp_path, source("warc", tmp_path / "x.warc"), Reading())
    assert not kept and [(q["locator"], q["reason"]) for q in quarantined] == [("x.warc#1", "unreadable_file")]


# ------------------------------------------------------------------------------------------------------- text

_text_files = st.one_of(
    st.tuples(_texts, st.sampled_from(["utf-8", "utf-16", "utf-16-be", "latin-1", "cp1252", "utf-8-sig"])).map(
        lambda a: a[0].encode(a[1], errors="replace")),
    st.binary(max_size=80),
    st.lists(_texts, max_size=4).map(lambda parts: "\x00".join(parts).encode()),  # NUL bytes inside valid UTF-8
)


def _compressed(data: bytes, suffix: str) -> bytes:
    if suffix == ".gz":
        return gzip.compress(data, mtime=0)
    return zstandard.ZstdCompressor().compress(data) if suffix == ".zst" else data


def _expected_text(data: bytes) -> tuple[str, str | None]:
    """(reason, None) or ("kept", text) for a text file's bytes."""
    if len(data) > LIMIT:
        return "too_large", None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        return "invalid_utf8", None
    return ("kept", text) if text.strip() else ("empty_text", None)


@fuzz(80)
@given(data=_text_files, ext=st.sampled_from([".txt", ".md"]), suffix=st.sampled_from(["", ".gz", ".zst"]),
       damage=st.none() | _corruption)
def test_every_text_file_is_one_record(data, ext, suffix, damage, tmp_path_factory):
    """Text in any encoding (UTF-16, latin-1, ...), random bytes, NUL bytes, sizes around the limit; plain, .gz or
    .zst, and the compressed ones damaged: each file is exactly one record; an undamaged file is kept exactly when
    it is non-blank UTF-8 within the size limit, with its text as is, and quarantined with the right reason
    otherwise."""
    root = tmp_path_factory.mktemp("text")
    name = f"x{ext}{suffix}"
    raw = _compressed(data, suffix)
    if damage is not None and suffix:
        raw = corrupted(raw, *damage)
    (root / name).write_bytes(raw)
    _, kept, quarantined = intake(root, source("text", root / name))
    outcome = [("kept", r["text"], json.loads(r["meta"])["locator"]) for r in kept] + \
              [(q["reason"], None, q["locator"]) for q in quarantined]
    assert len(outcome) == 1 and outcome[0][2] == name
    if damage is None or not suffix or raw == _compressed(data, suffix):
        assert outcome[0][:2] == _expected_text(data)


@fuzz(8)
@given(files=st.lists(_text_files, min_size=2, max_size=4))
def test_a_directory_of_text_files_is_one_record_per_file(files, tmp_path_factory):
    """Several files: one read task each, then the doc-id shuffle across them (the multi-file intake path)."""
    root = tmp_path_factory.mktemp("texts")
    (root / "in").mkdir()
    for i, data in enumerate(files):
        (root / "in" / f"f{i}.txt").write_bytes(data)
    _, kept, quarantined = intake(root, source("text", root / "in"))
    assert sorted([json.loads(r["meta"])["locator"] for r in kept] + [q["locator"] for q in quarantined]) == \
        [f"f{i}.txt" for i in range(len(files))]


def _flipped(data: bytes, at: int) -> bytes:
    return data[:at] + bytes([data[at] ^ 0xFF]) + data[at + 1:]


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
@pytest.mark.parametrize("kind", ["text", "jsonl"])
def test_damaged_compressed_files_are_quarantined_not_a_crash(tmp_path, suffix, kind):
    """Regression: in the text reader a truncated .gz raised EOFError, and in both readers corrupt deflate data
    raised zlib.error and a .zst with garbage ZstdError, out of the reader (a crashed run); a truncated .zst read as
    a shorter file, silently (zstandard's stream reader treats a cut frame as the end). Each now ends the file with
    one unreadable_file record: for JSONL after the lines read before the damage."""
    payload = b"".join(json.dumps({"text": f"line {i} of plain text"}).encode() + b"\n" for i in range(40))
    whole = _compressed(payload, suffix)
    damaged = [whole[: len(whole) // 2], whole[:-3], whole + b"garbage!", b"not compressed at all",
               _flipped(whole, 10)]
    for i, data in enumerate(damaged):
        name = f"x.{'txt' if kind == 'text' else 'jsonl'}{suffix}"
        (tmp_path / f"in{i}").mkdir()
        (tmp_path / f"in{i}" / name).write_bytes(data)
        _, kept, quarantined = intake(tmp_path / f"in{i}", source(kind, tmp_path / f"in{i}" / name), Reading())
        assert [q["reason"] for q in quarantined] == ["unreadable_file"], (i, quarantined)
        if kind == "text":
            assert not kept
        else:
            assert quarantined[0]["locator"] == f"{name}#L{len(kept) + 1}" and len(kept) <= 40


# ------------------------------------------------------------------------------------------------------- HTML

_html_files = st.one_of(
    _html.map(str.encode),  # hostile markup: `<![ x ]>`, cut tags, stray entities, unclosed script / comment
    st.tuples(_html, _texts).map(lambda a: f"<html><body><p>{a[1]}</p>{a[0]}".encode()),
    st.tuples(_texts, st.sampled_from(["utf-16", "latin-1", "cp1252"])).map(  # wrong or declared charset
        lambda a: f'<meta charset="{a[1]}"><p>{a[0]}</p>'.encode(a[1], errors="replace")),
    st.binary(max_size=80),
    _text_files,
)


@fuzz(60)
@given(data=_html_files, extractor=st.sampled_from(["trafilatura", "resiliparse", "visible_text"]),
       suffix=st.sampled_from(["", ".gz"]))
def test_every_html_file_is_one_record(data, extractor, suffix, tmp_path_factory):
    """Malformed HTML (hostile markup, truncated tags, random bytes, a charset that is wrong or declared), read by
    each extractor: each file is exactly one record, kept or quarantined with a reason, never a crash."""
    root = tmp_path_factory.mktemp("html")
    name = f"x.html{suffix}"
    (root / name).write_bytes(_compressed(data, suffix))
    _, kept, quarantined = intake(root, source("html", root / name, html_extractor=extractor), Reading(
        max_document_bytes=LIMIT * 4))
    outcome = [json.loads(r["meta"])["locator"] for r in kept] + [q["locator"] for q in quarantined]
    assert outcome == [name]
    assert all(r["text"].strip() for r in kept)  # never an empty document


# ------------------------------------------------------------------------------------------- compressed JSONL

_depths = st.sampled_from([1, 126, 127, 128, 990, 1000, 5000]) | st.integers(1, 3000)
_json_lines = st.one_of(
    st.fixed_dictionaries({"text": _texts}).map(lambda r: json.dumps(r).encode()),
    st.binary(max_size=30).filter(lambda b: b"\n" not in b),
    _depths.map(lambda d: b'{"text": "deep", "x": ' + b"[" * d + b"]" * d + b"}"),
    _depths.map(lambda d: b"[" * d + b"]" * d),
    _depths.map(lambda d: b"[" * d),
    st.just(b""),
)


@fuzz(60)
@given(lines=st.lists(_json_lines, min_size=1, max_size=8), suffix=st.sampled_from([".gz", ".zst"]),
       damage=st.none() | _corruption)
def test_compressed_jsonl_never_crashes_intake(lines, suffix, damage, tmp_path_factory):
    """.jsonl.gz / .jsonl.zst with random lines and records nested thousands deep, damaged or not: each non-blank
    line read is one record, and damage ends the file with one unreadable_file record at the next line number."""
    root = tmp_path_factory.mktemp("jsonlz")
    payload = b"\n".join(lines) + b"\n"
    raw = _compressed(payload, suffix)
    if damage is not None:
        raw = corrupted(raw, *damage)
    (root / f"x.jsonl{suffix}").write_bytes(raw)
    _, kept, quarantined = intake(root, source("jsonl", root / f"x.jsonl{suffix}", id_field=None),
                                  Reading(max_document_bytes=20_000, rows_per_part=3))  # room for deep records
    numbered = [(int(loc.rsplit("#L", 1)[1]), reason) for loc, reason in
                [(json.loads(r["meta"])["locator"], "kept") for r in kept] +
                [(q["locator"], q["reason"]) for q in quarantined] if "#L" in loc]
    assert len(numbered) == len(kept) + len(quarantined) or (not numbered and len(quarantined) == 1
                                                              and quarantined[0]["reason"] == "empty_file")
    damaged = [n for n, reason in numbered if reason == "unreadable_file"]
    assert len(damaged) <= 1
    if damaged:
        assert all(n < damaged[0] for n, reason in numbered if reason != "unreadable_file")
    if damage is None:
        assert sorted(n for n, _ in numbered) == [i for i, line in enumerate(lines, start=1) if line.strip()]


def test_deeply_nested_json_is_quarantined_not_a_crash(tmp_path):
    """Regression: a line nested deeper than Python's recursion limit raised RecursionError out of the JSONL reader
    (json.loads). Now it, and a record nested deeper than MAX_NESTING, is quarantined as too_deep."""
    from kiln.curation.readers.formats import MAX_NESTING

    lines = [b'{"text": "deep", "x": ' + b"[" * 5000 + b"]" * 5000 + b"}",
             b'{"text": "deep", "x": ' + b"[" * (MAX_NESTING + 1) + b"]" * (MAX_NESTING + 1) + b"}",
             b'{"text": "nested just enough", "x": ' + b"[" * (MAX_NESTING - 1) + b"]" * (MAX_NESTING - 1) + b"}",
             b"[" * 100_000]
    (tmp_path / "x.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    _, kept, quarantined = intake(tmp_path, source("jsonl", tmp_path / "x.jsonl", id_field=None), Reading())
    assert [r["text"] for r in kept] == ["nested just enough"]
    assert [(q["locator"], q["reason"]) for q in quarantined] == [
        ("x.jsonl#L1", "too_deep"), ("x.jsonl#L2", "too_deep"), ("x.jsonl#L4", "too_deep")]
