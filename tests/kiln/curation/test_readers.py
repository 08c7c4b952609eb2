"""Readers: every format, and corrupt input quarantined with a reason while the rest is read."""

import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.common.config import Reading, Source
from kiln.curation.documents import Document
from kiln.curation.readers import Quarantined, read_source
from tests.conftest import prose, write_jsonl


def source(kind, path, **kw):
    return Source(name="s", kind=kind, path=str(path), license="CC0", domain="web", profile="prose", **kw)


def split(records):
    docs = [r for r in records if isinstance(r, Document)]
    bad = [r for r in records if isinstance(r, Quarantined)]
    return docs, bad


def test_corrupt_jsonl_is_quarantined_and_counted_while_the_rest_is_read(tmp_path):
    d = tmp_path / "in"
    write_jsonl(d / "a.jsonl", [{"id": 1, "text": prose(1), "url": "https://a.org/1"}, "{not json",
                                {"id": 2}, {"id": 3, "text": 42}, {"id": 4, "text": "   "}, ["a", "list"],
                                {"id": 5, "text": prose(5)}])
    (d / "b.jsonl").write_bytes(b'{"id": 6, "text": "caf\xe9 au lait"}\n' + json.dumps({"id": 7, "text": prose(7)}).encode() + b"\n")
    (d / "c.jsonl").write_bytes(b"")
    (d / "e.jsonl").write_bytes(b"\n\n  \n")  # blank lines only: no record, reported as empty all the same
    (d / "d.jsonl").write_text(json.dumps({"id": 8, "text": "x" * 2000}) + "\n")
    docs, bad = split(list(read_source(source("jsonl", d), Reading(max_document_bytes=1000))))
    assert [doc.meta["id"] for doc in docs] == [1, 5, 7]
    reasons = sorted(q.reason for q in bad)
    assert reasons == sorted(["malformed_json", "missing_text", "text_not_string", "empty_text", "not_an_object",
                              "invalid_utf8", "empty_file", "empty_file", "too_large"])
    assert {q.locator for q in bad if q.reason == "empty_file"} == {"c.jsonl", "e.jsonl"}
    assert {q.locator for q in bad if q.reason == "malformed_json"} == {"a.jsonl#L2"}
    assert docs[0].url == "https://a.org/1" and docs[0].license == "CC0"


def test_a_byte_order_mark_before_the_first_record_is_not_part_of_it(tmp_path):
    """Windows tools write a UTF-8 BOM (EF BB BF) before a file's first line, which json.loads refuses: the first
    record was quarantined as malformed_json. Only the file's start can hold one; a BOM inside a later line is
    that line's own malformed JSON."""
    path = tmp_path / "bom.jsonl"
    path.write_bytes(b'\xef\xbb\xbf{"id": "a", "text": "first"}\r\n{"id": "b", "text": "second"}\r\n'
                     b'\xef\xbb\xbf{"id": "c", "text": "third"}\n')
    docs, bad = split(list(read_source(source("jsonl", path), Reading())))
    assert [d.text for d in docs] == ["first", "second"]
    assert [(q.reason, q.locator) for q in bad] == [("malformed_json", "bom.jsonl#L3")]


@pytest.mark.parametrize("suffix", ["", ".gz"])
def test_an_overlong_line_is_quarantined_whole_without_holding_it_in_memory(tmp_path, suffix):
    """A line past max_document_bytes is read in pieces: quarantined as too_large with the hash of the whole line
    (blake2b-128, computed here by hand over the bytes written), and the record after it is read as usual. The
    reader's peak memory is measured in a child process: a 200 MB line must not raise it by 200 MB."""
    import hashlib
    import subprocess
    import sys

    line = b'{"id": "big", "text": "' + b"a" * (200 << 20) + b'"}\n'
    payload = line + b'{"id": "small", "text": "after it"}\n'
    path = tmp_path / f"big.jsonl{suffix}"
    path.write_bytes(gzip.compress(payload, compresslevel=1) if suffix else payload)
    # VmHWM (this process's peak RSS), not ru_maxrss, which a child inherits from the parent's peak across exec
    code = f"""
import re
from kiln.common.config import Reading, Source
from kiln.curation.readers import Quarantined, read_source
peak = lambda: int(re.search(r"VmHWM:\\s+(\\d+)", open("/proc/self/status").read()).group(1))
s = Source(name="s", kind="jsonl", path={str(path)!r}, license="CC0", domain="web", profile="prose")
before = peak()
out = [(r.reason, r.record_hash) if isinstance(r, Quarantined) else r.text
       for r in read_source(s, Reading(max_document_bytes=1_000_000))]
print(repr(out)); print((peak() - before) // 1024)
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    out, grown_mb = run.stdout.splitlines()[-2:]
    assert eval(out) == [("too_large", hashlib.blake2b(line, digest_size=16).hexdigest()), "after it"]
    assert int(grown_mb) < 100, f"peak RSS grew by {grown_mb} MB reading a 200 MB line"


def test_a_too_large_file_or_warc_page_is_hashed_whole_not_by_its_start(tmp_path):
    """A too_large text file, HTML file or WARC page was hashed over its first max_document_bytes + 1 bytes only, so
    two large records that start alike had one record_hash, and an auditor's hash of the record (blake2b-128 of its
    bytes, computed here by hand) matched nothing. The whole record is hashed now, read on in bounded pieces."""
    import hashlib

    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    def whole(data):
        return hashlib.blake2b(data, digest_size=16).hexdigest()

    reading = Reading(max_document_bytes=1000, html={"extractor": "visible_text"})
    big = [b"<p>" + b"same start " * 200 + ending + b"</p>" for ending in (b"one", b"two")]
    for kind, name in [("text", "t.txt"), ("html", "p.html")]:
        folder = tmp_path / kind
        folder.mkdir()
        for i, data in enumerate(big):
            (folder / f"{i}{name}").write_bytes(data)
        docs, bad = split(list(read_source(source(kind, folder), reading)))
        assert not docs and [(q.reason, q.record_hash) for q in bad] == [("too_large", whole(d)) for d in big]
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
    for i, data in enumerate(big):
        writer.write_record(writer.create_warc_record(f"https://example.org/{i}", "response",
                                                      payload=io.BytesIO(data), http_headers=http))
    (tmp_path / "x.warc.gz").write_bytes(buf.getvalue())
    docs, bad = split(list(read_source(source("warc", tmp_path / "x.warc.gz"), reading)))
    assert not docs and [(q.reason, q.record_hash) for q in bad] == [("too_large", whole(d)) for d in big]


@pytest.mark.parametrize("bom", [b"\xff\xfe", b""], ids=["bom", "no-bom"])
def test_a_utf16_file_quarantined_shows_no_pii_in_its_excerpt(tmp_path, bom):
    """A UTF-16 export (Notepad's "Unicode", Excel's "Unicode text") is no UTF-8: quarantined, with an excerpt of its
    start. That excerpt was its bytes read as UTF-8, a NUL between every letter, which the redactor reads past but a
    person does not: the e-mail, phone and card number were kept readable in the quarantine table."""
    # (all-ASCII UTF-16 without a mark is valid UTF-8, NULs and all: read, and normalized by the filter step)
    body = "Name,Email,Phone,Card\r\nZo\u00eb Doe,jane.doe@gmail.com,+49 30 91456342,4111 1111 1111 1111\r\n"
    (tmp_path / "contacts.txt").write_bytes(bom + body.encode("utf-16-le"))
    docs, bad = split(list(read_source(source("text", tmp_path / "contacts.txt"), Reading())))
    assert not docs and [q.reason for q in bad] == ["invalid_utf8"]
    shown = bad[0].excerpt.replace("\x00", "")
    assert "Doe" in shown and "<EMAIL>" in shown
    for pii in ("jane.doe@gmail.com", "91456342", "4111 1111 1111 1111"):
        assert pii not in shown


def test_doc_ids_are_stable_and_distinct(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": prose(1)}, {"text": prose(2)}])
    first = [d.doc_id for d in read_source(source("jsonl", path), Reading())]
    second = [d.doc_id for d in read_source(source("jsonl", path), Reading())]
    assert first == second and len(set(first)) == 2


def test_records_without_a_usable_id_are_named_by_their_place_not_lost_as_duplicates(tmp_path):
    """An empty string, NaN, a list or an object as the id gave every such record the same doc_id ("id:", "id:nan"),
    and all but the first were quarantined as duplicate_doc_id. They are named by their line or row instead; real
    ids, string or number, still name their records."""
    records = [{"id": "", "text": prose(1)}, {"id": "", "text": prose(2)}, {"id": [1], "text": prose(3)},
               {"id": {"k": 1}, "text": prose(4)}, {"id": "  ", "text": prose(5)}, {"id": "a", "text": prose(6)},
               {"id": 7, "text": prose(7)}]
    docs, bad = split(list(read_source(source("jsonl", write_jsonl(tmp_path / "a.jsonl", records)), Reading())))
    assert [d.meta["locator"] for d in docs] == ["a.jsonl#L1", "a.jsonl#L2", "a.jsonl#L3", "a.jsonl#L4",
                                                 "a.jsonl#L5", "id:a", "id:7"]
    assert not bad and len({d.doc_id for d in docs}) == 7
    # a Parquet integer column with nulls: pandas writes it as floats, the nulls as NaN
    pq.write_table(pa.table({"id": [1.0, float("nan"), float("nan")], "text": [prose(1), prose(2), prose(3)]}),
                   tmp_path / "x.parquet")
    docs, bad = split(list(read_source(source("parquet", tmp_path / "x.parquet"), Reading())))
    assert len(docs) == 3 and not bad and len({d.doc_id for d in docs}) == 3
    assert docs[0].meta["locator"] == "id:1.0"  # as before: a real id's doc_id does not change


def test_very_long_integers_are_one_records_problem_not_the_files(tmp_path):
    """A 400-digit id crashed intake (its float check overflowed); a number past Python's 4,300-digit limit raised a
    ValueError that ended the file, losing every later record and naming the next line."""
    path = tmp_path / "big.jsonl"
    path.write_text("\n".join([json.dumps({"id": "a", "text": "first"}),
                               '{"id": "b", "text": "second", "n": ' + "9" * 5000 + "}",
                               '{"id": ' + "7" * 400 + ', "text": "third"}',
                               json.dumps({"id": "d", "text": "fourth"})]) + "\n")
    docs, bad = split(list(read_source(source("jsonl", path), Reading(max_document_bytes=10_000))))
    assert [d.text for d in docs] == ["first", "third", "fourth"]
    assert docs[1].meta["locator"] == "id:" + "7" * 400
    assert [(q.reason, q.locator) for q in bad] == [("malformed_json", "big.jsonl#L2")]


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_jsonl(tmp_path, suffix):
    payload = "\n".join(json.dumps({"id": i, "text": prose(i)}) for i in range(3)).encode()
    data = gzip.compress(payload) if suffix == ".gz" else zstandard.ZstdCompressor().compress(payload)
    path = tmp_path / f"x.jsonl{suffix}"
    path.write_bytes(data)
    docs, bad = split(list(read_source(source("jsonl", path), Reading())))
    assert len(docs) == 3 and not bad


def test_truncated_gzip_quarantines_the_rest_of_the_file(tmp_path):
    payload = "\n".join(json.dumps({"id": i, "text": prose(i)}) for i in range(200)).encode()
    path = tmp_path / "x.jsonl.gz"
    path.write_bytes(gzip.compress(payload)[:-300])
    docs, bad = split(list(read_source(source("jsonl", path), Reading())))
    assert len(docs) < 200 and [q.reason for q in bad] == ["unreadable_file"]


def test_parquet_and_max_documents(tmp_path):
    pq.write_table(pa.table({"id": [1, 2, 3], "text": [prose(1), None, prose(3)]}), tmp_path / "x.parquet")
    docs, bad = split(list(read_source(source("parquet", tmp_path / "x.parquet"), Reading())))
    assert len(docs) == 2 and [q.reason for q in bad] == ["missing_text"]
    capped = split(list(read_source(source("parquet", tmp_path / "x.parquet", max_documents=1), Reading())))[0]
    assert len(capped) == 1


def test_a_parquet_text_column_of_plain_binary_is_read_as_utf8(tmp_path):
    """Impala, Hive and old Spark write strings as binary without the UTF-8 annotation: every row was quarantined as
    text_not_string. The bytes are now read as UTF-8, strictly: invalid UTF-8 is quarantined as invalid_utf8."""
    text = "Gärten und Flüsse: ein ordentlicher Absatz."
    pq.write_table(pa.table({"id": [1, 2, 3], "text": pa.array([text.encode(), b"bad \xff byte", None], pa.binary()),
                             "url": pa.array([b"https://example.org/1", None, None], pa.binary())}),
                   tmp_path / "x.parquet")
    docs, bad = split(list(read_source(source("parquet", tmp_path / "x.parquet", url_field="url"), Reading())))
    assert [(d.text, d.url) for d in docs] == [(text, "https://example.org/1")]
    assert [(q.locator, q.reason) for q in bad] == [("x.parquet#row1", "invalid_utf8"),
                                                    ("x.parquet#row2", "missing_text")]


def test_a_parquet_file_is_read_a_row_group_at_a_time_not_whole(tmp_path, monkeypatch):
    """The reader read the whole file into memory before its first record (a worker's memory grew with the file: +157
    MB for a 152 MB file). It now reads where the file lies: for the first record, its footer and first row group
    (8 row groups of ~260 KB of incompressible text here: at most a quarter of the file)."""
    import base64
    import os

    from kiln.curation.readers.paths import SourceFile

    path = tmp_path / "big.parquet"
    with pq.ParquetWriter(path, pa.schema([("id", pa.string()), ("text", pa.string())]), compression="zstd") as w:
        for g in range(8):
            w.write_table(pa.table({"id": [f"{g}-{i}" for i in range(100)],
                                    "text": [base64.b64encode(os.urandom(2000)).decode() for _ in range(100)]}))
    read, real_open = [0], SourceFile.open_seekable

    class Counting:
        def __init__(self, f):
            self.f = f

        def read(self, n=-1):
            data = self.f.read(n)
            read[0] += len(data)
            return data

        def __getattr__(self, name):
            return getattr(self.f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

    monkeypatch.setattr(SourceFile, "open_seekable", lambda self: Counting(real_open(self)))
    records = read_source(source("parquet", path), Reading())
    assert isinstance(next(records), Document)
    assert 0 < read[0] < path.stat().st_size / 4, (read[0], path.stat().st_size)
    assert sum(isinstance(r, Document) for r in records) == 799


def test_text_directory(tmp_path):
    (tmp_path / "books").mkdir()
    (tmp_path / "books" / "a.txt").write_text(prose(1))
    (tmp_path / "books" / "b.txt").write_bytes(b"\xff\xfe broken")
    docs, bad = split(list(read_source(source("text", tmp_path / "books"), Reading())))
    assert [d.meta["locator"] for d in docs] == ["a.txt"] and [q.reason for q in bad] == ["invalid_utf8"]


def test_warc_html_and_wet(tmp_path):
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    html = b"<html><head><title>t</title><script>var x=1;</script></head><body><p>Hello <b>world</b>.</p></body></html>"
    http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
    writer.write_record(writer.create_warc_record("https://example.org/page", "response",
                                                  payload=io.BytesIO(html), http_headers=http))
    writer.write_record(writer.create_warc_record("https://example.org/wet", "conversion",
                                                  payload=io.BytesIO(prose(1).encode())))
    (tmp_path / "x.warc.gz").write_bytes(buf.getvalue())
    # the visible-text reader here; main-content extraction of WARC pages: tests/test_html_extraction.py
    reading = Reading(html={"extractor": "visible_text"})
    docs, bad = split(list(read_source(source("warc", tmp_path / "x.warc.gz"), reading)))
    assert not bad
    assert docs[0].text == "Hello world." and docs[0].url == "https://example.org/page"
    assert docs[1].text == prose(1)


def test_a_warc_reads_pages_and_plain_text_only_resource_records_too(tmp_path):
    """Any content type with "text" in it was read as a document (stylesheets, scripts, CSV, calendars), and an HTML
    page stored as a `resource` record (warcit, Webrecorder, Browsertrix) was passed over uncounted. Now: HTML, XHTML
    and text/plain are documents, in a response or a resource record of a URL; other content types are quarantined
    as not_text; request, metadata and warcinfo records, and a crawler's own resource records (wget's metadata://
    log), are no documents and not records here."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    para = "A real paragraph of prose about gardens and rivers, long enough to be kept."
    html = f"<html><body><p>{para}</p></body></html>".encode()
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    writer.write_record(writer.create_warcinfo_record("x.warc.gz", {"software": "test"}))

    def response(url, body, content_type):
        http = StatusAndHeaders("200 OK", [("Content-Type", content_type)], protocol="HTTP/1.1")
        writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=http))

    def resource(url, body, content_type):
        writer.write_record(writer.create_warc_record(url, "resource", payload=io.BytesIO(body),
                                                      warc_headers_dict={"Content-Type": content_type}))

    response("https://e.org/site.css", b"body { margin: 0; padding: 0; font-family: Arial; }\n" * 3, "text/css")
    response("https://e.org/app.js", b"var greeting = 'hello there, reader of this script';\n" * 3,
             "text/javascript; charset=utf-8")
    response("https://e.org/t.csv", b"name,city\nAda,London\nAlan,Wilmslow\n", "text/csv")
    response("https://e.org/cal.ics", b"BEGIN:VCALENDAR\nVERSION:2.0\nEND:VCALENDAR\n", "text/calendar")
    response("https://e.org/a.txt", para.encode(), "text/plain; charset=utf-8")
    response("https://e.org/x.xhtml", html, "application/xhtml+xml")
    writer.write_record(writer.create_warc_record("https://e.org/page.html", "request", payload=io.BytesIO(b""),
                                                  http_headers=StatusAndHeaders("GET /page.html", [],
                                                                                protocol="HTTP/1.1",
                                                                                is_http_request=True)))
    resource("https://e.org/page.html", html, "text/html")
    resource("https://e.org/notes.txt", para.encode(), "text/plain")
    resource("https://e.org/logo.png", b"\x89PNG\r\n\x1a\n" + bytes(64), "image/png")
    resource("metadata://gnu.org/software/wget/warc/wget.log", b"--2024-01-01-- https://e.org/ connected.",
             "text/plain")
    writer.write_record(writer.create_warc_record("https://e.org/page.html", "metadata",
                                                  payload=io.BytesIO(b"outlink: https://e.org/a.txt\n"),
                                                  warc_headers_dict={"Content-Type": "application/warc-fields"}))
    (tmp_path / "x.warc.gz").write_bytes(buf.getvalue())
    docs, bad = split(list(read_source(source("warc", tmp_path / "x.warc.gz"),
                                       Reading(html={"extractor": "visible_text"}))))
    assert [(d.url, d.text) for d in docs] == [("https://e.org/a.txt", para), ("https://e.org/x.xhtml", para),
                                               ("https://e.org/page.html", para), ("https://e.org/notes.txt", para)]
    assert [q.reason for q in bad] == ["not_text"] * 5
    assert [q.excerpt for q in bad] == ["text/css", "text/javascript; charset=utf-8", "text/csv", "text/calendar",
                                        "image/png"]


def test_a_warc_reads_brotli_pages_and_a_bad_page_is_its_own_problem(tmp_path):
    """Pages served `Content-Encoding: br` all failed (warcio 1.8 and brotli 1.2 disagree on the decompressor), and the
    first one ended the archive: the pages after it were lost. A page whose bytes are not valid in its charset is
    quarantined alone, and the archive reads on; a charset label that is no text encoding (`charset=base64`: a
    LookupError, a traceback for an html source) is passed over, as browsers do, and the page read as UTF-8."""
    import brotli
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    page = b"<html><body><p>" + b"An ordinary paragraph of text for the reader to keep. " * 3 + b"</p></body></html>"
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=False)
    served = [("br", brotli.compress(page), "utf-8"), (None, b"<p>\x81\x20</p>", "shift_jis"),  # 0x20 ends no 0x81
              (None, page, "base64"), (None, page, "utf-8")]
    for i, (encoding, body, charset) in enumerate(served):
        headers = [("Content-Type", f"text/html; charset={charset}")] + ([("Content-Encoding", encoding)]
                                                                          if encoding else [])
        writer.write_record(writer.create_warc_record(f"https://example.org/{i}", "response", payload=io.BytesIO(body),
                                                      http_headers=StatusAndHeaders("200 OK", headers,
                                                                                    protocol="HTTP/1.1")))
    (tmp_path / "x.warc").write_bytes(buf.getvalue())
    docs, bad = split(list(read_source(source("warc", tmp_path / "x.warc"), Reading(html={"extractor": "visible_text"}))))
    assert [d.url for d in docs] == ["https://example.org/0", "https://example.org/2", "https://example.org/3"]
    assert docs[0].text == docs[1].text == docs[2].text and docs[0].text.startswith("An ordinary paragraph")
    assert [q.reason for q in bad] == ["invalid_charset"]
    (tmp_path / "p.html").write_bytes(b'<meta charset="hex">' + page)  # an html source: a record, not a traceback
    docs, bad = split(list(read_source(source("html", tmp_path / "p.html"), Reading())))
    assert not bad and docs[0].text.startswith("An ordinary paragraph")


def test_an_xhtml_file_or_record_is_read_in_the_charset_its_xml_declaration_names(tmp_path):
    """A windows-1251 .xhtml page or application/xhtml+xml WARC record whose only charset is its XML declaration (no
    <meta>, as XHTML needs none) was quarantined as invalid_utf8."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    text = "\u0421\u044a\u0435\u0448\u044c \u0436\u0435 \u0435\u0449\u0451 \u044d\u0442\u0438\u0445 " * 5
    page = ('<?xml version="1.0" encoding="windows-1251"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><head>'
            f"<title>t</title></head><body><p>{text.strip()}</p></body></html>").encode("cp1251")
    (tmp_path / "site").mkdir()
    (tmp_path / "site" / "p.xhtml").write_bytes(page)
    reading = Reading(html={"extractor": "visible_text"})
    docs, bad = split(list(read_source(source("html", tmp_path / "site"), reading)))
    assert not bad and [d.text for d in docs] == [text.strip()]
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=False)
    http = StatusAndHeaders("200 OK", [("Content-Type", "application/xhtml+xml")], protocol="HTTP/1.1")
    writer.write_record(writer.create_warc_record("https://e.org/p.xhtml", "response", payload=io.BytesIO(page),
                                                  http_headers=http))
    (tmp_path / "x.warc").write_bytes(buf.getvalue())
    docs, bad = split(list(read_source(source("warc", tmp_path / "x.warc"), reading)))
    assert not bad and [d.text for d in docs] == [text.strip()]


def test_missing_path_is_quarantined_not_a_crash(tmp_path):
    docs, bad = split(list(read_source(source("jsonl", tmp_path / "nothing-*.jsonl"), Reading())))
    assert not docs and [q.reason for q in bad] == ["no_files_matched"]


@pytest.mark.parametrize("corpus", ["python_docs", "package_readmes", "package_licenses", "stdlib_code"])
def test_builtin_corpora_are_real_and_bounded(corpus):
    src = Source(name=corpus, kind="builtin", corpus=corpus, license="x", domain="reference", profile="p",
                 max_documents=25)
    docs, _ = split(list(read_source(src, Reading())))
    assert len(docs) == 25
    assert len({d.doc_id for d in docs}) == 25
    assert sum(len(d.text) for d in docs) > 25 * 200  # real text, not placeholders


def _dist_info(root, name, editable=None, egg=False):
    info = root / (f"{name}.egg-info" if egg else f"{name}-1.0.dist-info")
    info.mkdir()
    (info / ("PKG-INFO" if egg else "METADATA")).write_text(f"Metadata-Version: 2.1\nName: {name}\nVersion: 1.0\n\n"
                                   f"# {name}\n\nThe long description of {name}, as its README says it.\n")
    (info / "LICENSE").write_text(f"The licence of {name}: permission is granted to use it.\n")
    (info / "RECORD").write_text(f"{info.name}/METADATA,,\n{info.name}/LICENSE,,\n")
    if editable is not None:  # PEP 610, as pip writes it for `pip install [-e] <dir>`
        (info / "direct_url.json").write_text(json.dumps({"url": "file:///src", "dir_info": {"editable": editable}}))


def test_editable_installs_are_left_out_of_the_package_corpora(tmp_path, monkeypatch):
    """An editable install's metadata is a snapshot of a working tree: one name and version, a new text after each
    edit. An install from the same directory without -e is a fixed snapshot, and is read like any package. The
    working tree holds its own egg-info, found first when the tree is on sys.path (Kiln's, run from a checkout)."""
    site, tree = tmp_path / "site", tmp_path / "tree"
    site.mkdir(), tree.mkdir()
    _dist_info(site, "kiln_test_wheel")
    _dist_info(site, "kiln_test_local", editable=False)
    _dist_info(site, "kiln_test_editable", editable=True)
    _dist_info(tree, "kiln_test_editable", egg=True)
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.syspath_prepend(str(tree))
    for corpus in ("package_readmes", "package_licenses"):
        src = Source(name=corpus, kind="builtin", corpus=corpus, license="x", domain="reference", profile="p")
        texts = " ".join(d.text for d in read_source(src, Reading()) if isinstance(d, Document))
        assert "of kiln_test_wheel" in texts and "of kiln_test_local" in texts, corpus
        assert "of kiln_test_editable" not in texts, corpus


# In a fresh interpreter: whether importlib_metadata's finder is still on sys.meta_path in a test process depends on
# what ran there before (deepspeed is imported once per process).
_AFTER_DEEPSPEED = """
import importlib.metadata, json
import deepspeed  # noqa: F401
from kiln.common.config import Reading, Source
from kiln.curation.documents import Document
from kiln.curation.readers import read_source
counts = {"importlib_metadata": any(type(d.metadata).__module__.startswith("importlib_metadata")
                                    for d in importlib.metadata.distributions())}
for corpus in ("package_readmes", "package_licenses"):
    src = Source(name=corpus, kind="builtin", corpus=corpus, license="x", domain="reference", profile="p")
    counts[corpus] = sum(isinstance(r, Document) for r in read_source(src, Reading()))
print(json.dumps(counts))
"""


def test_package_corpora_read_after_deepspeed_is_imported():
    """Importing deepspeed adds importlib_metadata's distributions, whose metadata raises KeyError for a
    missing field (e.g. Home-page) where the standard library's returns None: every package must still read."""
    import subprocess
    import sys
    from pathlib import Path

    done = subprocess.run([sys.executable, "-c", _AFTER_DEEPSPEED], cwd=Path(__file__).resolve().parents[3],
                          capture_output=True, text=True)
    assert done.returncode == 0, done.stderr[-3000:]
    counts = json.loads(done.stdout.splitlines()[-1])
    assert counts["importlib_metadata"] and counts["package_readmes"] > 50 and counts["package_licenses"] > 50, counts


# Valid JSON, invalid Unicode: each line escapes a lone UTF-16 surrogate somewhere (text, id, url, another field,
# a key). Written as the raw JSON a hostile producer would send.
SURROGATE_LINES = [
    r'{"id": "s1", "text": "broken \ud800 text, long enough to keep"}',
    r'{"id": "s2\udfff", "text": "an id with a lone low surrogate"}',
    r'{"id": "s3", "text": "a url with one", "url": "https://a.org/\ud83d"}',
    r'{"id": "s4", "text": "a metadata field with one", "title": "x\ud800y"}',
    r'{"id": "s5", "text": "a key with one", "\ud800": 1}',
    r'{"id": "ok", "text": "a pair is fine: \ud83d\ude00"}',
]


@pytest.mark.parametrize("mode", ["quarantine", "replace"])
def test_lone_surrogates_are_quarantined_or_replaced_and_intake_completes(tmp_path, mode):
    """Before: the first line passed the JSON decoder and crashed raw_documents inside pyarrow."""
    from kiln.common.storage import Store
    from kiln.curation.pipeline import ingest

    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "a.jsonl").write_text("\n".join(SURROGATE_LINES) + "\n", encoding="ascii")
    reading = Reading(unicode_errors=mode, rows_per_part=2)
    store = Store(tmp_path / "store")
    with store.staging("raw", "s") as writer:
        stats = ingest(source("jsonl", tmp_path / "in", id_field="id"), reading, writer, progress=False)
        writer.commit(code_version="t", config={}, inputs={}, counts={})
    kept = store.read_table("raw", "s").to_pylist()
    quarantined = store.read_table("raw", "s", "quarantine").to_pylist() if store.files("raw", "s", "quarantine") \
        else []
    assert stats.docs_in == len(kept) + len(quarantined) == 6
    by_id = {json.loads(r["meta"])["id"]: r for r in kept}
    assert by_id["ok"]["text"] == "a pair is fine: \U0001F600"  # a surrogate pair is one valid code point
    if mode == "quarantine":
        assert list(by_id) == ["ok"]
        assert [q["reason"] for q in quarantined] == ["invalid_unicode"] * 5
        assert [q["locator"] for q in quarantined] == [f"a.jsonl#L{i}" for i in range(1, 6)]
    else:
        assert quarantined == [] and len(kept) == 6
        assert by_id["s1"]["text"] == "broken \ufffd text, long enough to keep"
        assert "s2\ufffd" in by_id and by_id["s3"]["url"] == "https://a.org/\ufffd"


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(st.characters(), max_size=20),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(st.characters(), max_size=5), inner,
                                                               max_size=3), max_leaves=8)
_records = st.one_of(
    st.fixed_dictionaries({"text": st.text(st.characters(), min_size=0, max_size=60)},
                          optional={"id": st.text(st.characters(), max_size=8) | st.integers(),
                                    "url": st.text(st.characters(), max_size=20) | st.integers(), "x": _json_values})
    .map(lambda r: json.dumps(r).encode()),  # valid JSON, every code point (lone surrogates escaped)
    _json_values.map(lambda v: json.dumps(v).encode()),  # valid JSON that is not a record
    st.binary(min_size=1, max_size=40).filter(lambda b: b"\n" not in b and b.strip()),  # anything at all
)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(lines=st.lists(_records, min_size=1, max_size=12), mode=st.sampled_from(["quarantine", "replace"]))
def test_no_jsonl_line_crashes_intake_and_every_line_is_counted_once(lines, mode, tmp_path_factory):
    """Random JSON (every code point, lone surrogates escaped), non-record JSON and random bytes: the intake always
    completes, and kept + quarantined = the file's lines, each line's locator once."""
    from kiln.common.storage import Store
    from kiln.curation.pipeline import ingest

    root = tmp_path_factory.mktemp("fuzz")
    (root / "in").mkdir()
    (root / "in" / "a.jsonl").write_bytes(b"\n".join(lines) + b"\n")
    store = Store(root / "store")
    with store.staging("raw", "s") as writer:
        stats = ingest(source("jsonl", root / "in", id_field=None), Reading(unicode_errors=mode, rows_per_part=3),
                       writer, progress=False)
        writer.commit(code_version="t", config={}, inputs={}, counts={})
    kept = store.read_table("raw", "s").to_pylist() if store.files("raw", "s", "documents") else []
    quarantined = store.read_table("raw", "s", "quarantine").to_pylist() if store.files("raw", "s", "quarantine") \
        else []
    assert stats.docs_in == len(kept) + len(quarantined) == len(lines)
    locators = [json.loads(r["meta"])["locator"] for r in kept] + [q["locator"] for q in quarantined]
    assert sorted(locators) == sorted(f"a.jsonl#L{i}" for i in range(1, len(lines) + 1))
