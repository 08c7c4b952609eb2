"""Readers: every format, and corrupt input quarantined with a reason while the rest is read."""

import gzip
import io
import json

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from kiln.config import Reading, Source
from kiln.documents import Document
from kiln.readers import Quarantined, read_source
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
    (d / "d.jsonl").write_text(json.dumps({"id": 8, "text": "x" * 2000}) + "\n")
    docs, bad = split(list(read_source(source("jsonl", d), Reading(max_document_bytes=1000))))
    assert [doc.meta["id"] for doc in docs] == [1, 5, 7]
    reasons = sorted(q.reason for q in bad)
    assert reasons == sorted(["malformed_json", "missing_text", "text_not_string", "empty_text", "not_an_object",
                              "invalid_utf8", "empty_file", "too_large"])
    assert {q.locator for q in bad if q.reason == "malformed_json"} == {"a.jsonl#L2"}
    assert docs[0].url == "https://a.org/1" and docs[0].license == "CC0"


def test_doc_ids_are_stable_and_distinct(tmp_path):
    path = write_jsonl(tmp_path / "a.jsonl", [{"text": prose(1)}, {"text": prose(2)}])
    first = [d.doc_id for d in read_source(source("jsonl", path), Reading())]
    second = [d.doc_id for d in read_source(source("jsonl", path), Reading())]
    assert first == second and len(set(first)) == 2


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
    docs, bad = split(list(read_source(source("warc", tmp_path / "x.warc.gz"), Reading())))
    assert not bad
    assert docs[0].text == "Hello world." and docs[0].url == "https://example.org/page"
    assert docs[1].text == prose(1)


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


@pytest.mark.parametrize("corpus", ["package_readmes", "package_licenses"])
def test_package_corpora_read_after_deepspeed_is_imported(corpus):
    """Importing deepspeed adds importlib_metadata's distributions, whose metadata raises KeyError for a
    missing field (e.g. Home-page) where the standard library's returns None: every package must still read."""
    import importlib.metadata

    import deepspeed  # noqa: F401

    assert any(type(d.metadata).__module__.startswith("importlib_metadata") for d in importlib.metadata.distributions())
    src = Source(name=corpus, kind="builtin", corpus=corpus, license="x", domain="reference", profile="p")
    docs, _ = split(list(read_source(src, Reading())))
    assert len(docs) > 50
