"""File formats a source may be in: JSON Lines (plain, .gz, .zst), Parquet, text files, WARC/WET."""

from __future__ import annotations

import gzip
import io
import json
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from html.parser import HTMLParser
from typing import Any

import pyarrow.parquet as pq

from kiln.config import Reading, Source
from kiln.documents import Document, make_doc_id
from kiln.readers.paths import SourceFile

EXCERPT_CHARS = 200


@dataclass(frozen=True)
class Quarantined:
    """A record that could not be read as a document, kept with the reason so nothing vanishes."""

    source: str
    locator: str
    reason: str
    excerpt: str | None

    def to_row(self) -> dict[str, Any]:
        return {"source": self.source, "locator": self.locator, "reason": self.reason, "excerpt": self.excerpt}


def _excerpt(data: bytes | str | None) -> str | None:
    if data is None:
        return None
    if isinstance(data, bytes):
        data = data[: EXCERPT_CHARS * 4].decode("utf-8", errors="replace")
    return data[:EXCERPT_CHARS]


def decode_utf8(data: bytes, source: str, locator: str) -> str | Quarantined:
    """The text, or the record quarantined as invalid_utf8 (never decoded with replacement characters)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return Quarantined(source, locator, "invalid_utf8", f"{exc}: {_excerpt(data)}")


def _decompressed(f: SourceFile) -> io.BufferedIOBase:
    raw = f.open()
    if f.uri.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw)
    if f.uri.endswith(".zst"):
        import zstandard

        return io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw, closefd=True))
    return raw


def as_internal_records(source: Source) -> Source:
    """The source as it reads records Kiln builds itself ({"text", "id", "url"}), not the user's fields."""
    return source.model_copy(update={"text_field": "text", "id_field": "id", "url_field": "url"})


_SURROGATE = re.compile("[\ud800-\udfff]")


def _unicode_repaired(value: Any) -> Any:
    """`value` with every lone surrogate (which no UTF-8 writer accepts) replaced by U+FFFD, keys included."""
    if isinstance(value, str):
        return _SURROGATE.sub("\ufffd", value)
    if isinstance(value, dict):
        return {_unicode_repaired(k): _unicode_repaired(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_unicode_repaired(v) for v in value]
    return value


def record_to_document(record: Any, source: Source, locator: str, reading: Reading) -> Document | Quarantined:
    """Validate one structured record (a JSON object, a Parquet row) and turn it into a document."""
    if not isinstance(record, dict):
        return Quarantined(source.name, locator, "not_an_object", _excerpt(json.dumps(record, default=str)))
    if _SURROGATE.search(json.dumps(record, ensure_ascii=False, default=str)):  # text, id, url, meta or a key
        if reading.unicode_errors == "quarantine":  # the excerpt ASCII-escaped, so it can be written
            return Quarantined(source.name, locator, "invalid_unicode", _excerpt(json.dumps(record, default=str)))
        record = _unicode_repaired(record)
    text = record.get(source.text_field)
    if text is None:
        return Quarantined(source.name, locator, "missing_text", _excerpt(json.dumps(record, default=str)))
    if not isinstance(text, str):
        return Quarantined(source.name, locator, "text_not_string", _excerpt(json.dumps(record, default=str)))
    if not text.strip():
        return Quarantined(source.name, locator, "empty_text", None)
    if len(text.encode("utf-8", errors="surrogatepass")) > reading.max_document_bytes:
        return Quarantined(source.name, locator, "too_large", _excerpt(text))
    native_id = record.get(source.id_field) if source.id_field else None
    if native_id is not None:
        locator = f"id:{native_id}"
    url = record.get(source.url_field) if source.url_field else None
    meta = {k: v for k, v in record.items() if k not in {source.text_field, source.url_field}}
    meta["locator"] = locator
    return Document(doc_id=make_doc_id(source.name, locator), source=source.name, text=text,
                    url=url if isinstance(url, str) else None, license=source.license, meta=meta)


def read_jsonl(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    lines = 0
    try:
        with _decompressed(f) as stream:
            for lineno, line in enumerate(stream, start=1):
                lines += 1
                locator = f"{f.relative}#L{lineno}"
                if not line.strip():
                    continue  # blank lines separate nothing in JSONL; not a record
                if len(line) > reading.max_document_bytes:
                    yield Quarantined(source.name, locator, "too_large", _excerpt(line))
                    continue
                decoded = decode_utf8(line, source.name, locator)
                if isinstance(decoded, Quarantined):
                    yield decoded
                    continue
                try:
                    record = json.loads(decoded)
                except json.JSONDecodeError as exc:
                    yield Quarantined(source.name, locator, "malformed_json", f"{exc.msg}: {_excerpt(decoded)}")
                    continue
                yield record_to_document(record, source, locator, reading)
    except (OSError, EOFError, ValueError) as exc:  # truncated/corrupt compression, unreadable file
        yield Quarantined(source.name, f"{f.relative}#L{lines + 1}", "unreadable_file", f"{type(exc).__name__}: {exc}")
        return
    if lines == 0:
        yield Quarantined(source.name, f.relative, "empty_file", None)


def read_parquet(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    try:
        with f.open() as raw:
            table = pq.read_table(io.BytesIO(raw.read()))
    except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a corrupt file
        yield Quarantined(source.name, f.relative, "unreadable_file", f"{type(exc).__name__}: {exc}")
        return
    if table.num_rows == 0:
        yield Quarantined(source.name, f.relative, "empty_file", None)
        return
    for batch in table.to_batches(max_chunksize=1000):
        offset = 0
        for row in batch.to_pylist():
            yield record_to_document(row, source, f"{f.relative}#row{offset}", reading)
            offset += 1


def read_text(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    """Each file is one document (a book, a page, a source file)."""
    try:
        with _decompressed(f) as stream:
            data = stream.read(reading.max_document_bytes + 1)
    except OSError as exc:
        yield Quarantined(source.name, f.relative, "unreadable_file", f"{type(exc).__name__}: {exc}")
        return
    if len(data) > reading.max_document_bytes:
        yield Quarantined(source.name, f.relative, "too_large", _excerpt(data))
        return
    text = decode_utf8(data, source.name, f.relative)
    if isinstance(text, Quarantined):
        yield text
        return
    yield record_to_document({"text": text}, as_internal_records(source), f.relative, reading)


class _HtmlText(HTMLParser):
    """Visible text of an HTML page: scripts, styles and head dropped, block elements end lines."""

    SKIP = {"script", "style", "noscript", "head", "template", "svg"}
    BLOCK = {"p", "div", "br", "li", "ul", "ol", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "section",
             "article", "blockquote", "table", "header", "footer", "nav", "hr", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)

    def text(self) -> str:
        lines = (" ".join(line.split()) for line in "".join(self.parts).splitlines())
        return "\n".join(line for line in lines if line)


def html_to_text(html: str) -> str:
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    return parser.text()


def read_warc(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    """WET `conversion` records as they are; WARC `response` records with HTML reduced to visible text."""
    from warcio.archiveiterator import ArchiveIterator

    seen, internal = 0, as_internal_records(source)
    try:
        with f.open() as raw:
            for record in ArchiveIterator(raw):
                if record.rec_type not in ("conversion", "response"):
                    continue  # warcinfo / request / metadata records hold no document text
                seen += 1
                record_id = record.rec_headers.get_header("WARC-Record-ID") or f"{f.relative}#{seen}"
                url = record.rec_headers.get_header("WARC-Target-URI")
                locator = f"{f.relative}#{record_id}"
                payload = record.content_stream().read(reading.max_document_bytes + 1)
                if len(payload) > reading.max_document_bytes:
                    yield Quarantined(source.name, locator, "too_large", _excerpt(payload))
                    continue
                if record.rec_type == "response":
                    content_type = (record.http_headers.get_header("Content-Type") if record.http_headers else "") or ""
                    if "html" not in content_type and "text" not in content_type:
                        yield Quarantined(source.name, locator, "not_text", content_type)
                        continue
                text = decode_utf8(payload, source.name, locator)
                if isinstance(text, Quarantined):
                    yield text
                    continue
                if record.rec_type == "response":
                    text = html_to_text(text)
                yield record_to_document({"text": text, "id": record_id, "url": url}, internal, locator, reading)
    except Exception as exc:  # noqa: BLE001 - warcio raises several types on a damaged archive
        yield Quarantined(source.name, f"{f.relative}#{seen + 1}", "unreadable_file", f"{type(exc).__name__}: {exc}")
        return
    if seen == 0:
        yield Quarantined(source.name, f.relative, "empty_file", None)


FORMAT_READERS: dict[str, Callable[[SourceFile, Source, Reading], Iterator[Document | Quarantined]]] = {
    "jsonl": read_jsonl,
    "parquet": read_parquet,
    "text": read_text,
    "warc": read_warc,
    "wet": read_warc,
}
