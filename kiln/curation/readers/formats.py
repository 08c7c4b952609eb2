"""File formats a source may be in: JSON Lines (plain, .gz, .zst), Parquet, text files, WARC/WET, HTML files."""

from __future__ import annotations

import contextlib
import functools
import gzip
import hashlib
import io
import json
import math
import re
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import zstandard

from kiln.common.config import Reading, Source
from kiln.common.display import UNSEEN
from kiln.common.removals import EXCERPT_MOST_READS, kept_text, text_hash
from kiln.curation.documents import Document, make_doc_id
from kiln.curation.readers.html import XHTML, Extracted, decode_html, extract
from kiln.curation.readers.paths import SourceFile

# A structured record nested deeper than this (lists/objects in lists/objects) is quarantined as too_deep: Python's
# json recursion limit (~1000) would crash the reader, or a later stage that parses the record's meta, long before.
MAX_NESTING = 128
# What a damaged or truncated compressed stream raises while it is read (gzip: OSError, EOFError or zlib.error for
# corrupt deflate data; zstd: ZstdError, or EOFError from _ZstdStream).
STREAM_ERRORS = (OSError, EOFError, ValueError, zlib.error, zstandard.ZstdError)


@dataclass(frozen=True)
class Quarantined:
    """A record that could not be read as a document, kept with the reason so nothing vanishes. Built by
    `quarantine`: what it shows of the record is PII-redacted, and its hash identifies the record exactly."""

    source: str
    locator: str
    reason: str
    excerpt: str | None  # what went wrong and the record's start, PII-redacted (kiln.common.removals.kept_text)
    record_hash: str | None = None  # blake2b-128 of the record (kiln.common.removals.text_hash)

    def to_row(self) -> dict[str, Any]:
        return {"source": self.source, "locator": self.locator, "reason": self.reason, "excerpt": self.excerpt,
                "record_hash": self.record_hash}


def quarantine(source: str, locator: str, reason: str, record: bytes | str | None = None,
               detail: str | None = None, record_hash: str | None = None) -> Quarantined:
    """`record` (its bytes or text, when there is one) quarantined for `reason`. Its excerpt (`detail`, what went
    wrong, then the record's first EXCERPT_CHARS characters) passes the redactor kept text passes, as the quarantine
    table and the removal examples in Dagster's metadata show it; the record itself is only hashed (`record_hash`:
    the hash of a record of which `record` is only the start)."""
    shown = []
    if detail:
        shown.append(kept_text(detail, "full"))  # an exception's message may quote the record
    if record is not None:
        shown.append(kept_text(_readable(record) if isinstance(record, bytes) else record, "excerpt"))
    return Quarantined(source, locator, reason, ": ".join(x for x in shown if x) or None,
                       record_hash or (None if record is None else text_hash(record)))


_UTF16_BOMS = ((b"\xff\xfe", "utf-16-le"), (b"\xfe\xff", "utf-16-be"))


def _readable(record: bytes) -> str:
    """The start of a record intake could not read, as a person would read it, for the redactor to see what that
    person would: UTF-16 by its byte-order mark, else UTF-8 with controls removed. UTF-16 without a mark (Notepad's
    "Unicode", Excel's "Unicode text") decoded as UTF-8 is its letters with a NUL between each: the redactor saw no
    e-mail or number in `j\0a\0n\0e\0@\0...`, and the excerpt showed them to anyone who reads past the NULs."""
    head = record[:EXCERPT_MOST_READS * 4]
    for bom, codec in _UTF16_BOMS:
        if head.startswith(bom):
            return head[len(bom):].decode(codec, errors="replace")
    return UNSEEN.sub("", head.decode("utf-8", errors="replace"))


def decode_utf8(data: bytes, source: str, locator: str) -> str | Quarantined:
    """The text, or the record quarantined as invalid_utf8 (never decoded with replacement characters)."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        return quarantine(source, locator, "invalid_utf8", data, str(exc))


class _ZstdStream(io.RawIOBase):
    """The decompressed bytes of a stream of zstd frames. Raises EOFError where the input ends inside a frame (a
    truncated file), which zstandard's own `stream_reader` reports as a clean end: gzip raises EOFError there too.
    Input goes in small chunks, so one call never inflates more than CHUNK x zstd's maximum ratio."""

    CHUNK = 4096

    def __init__(self, raw):
        self._raw, self._dctx, self._frame = raw, zstandard.ZstdDecompressor(), None
        self._input, self._output, self._at = b"", b"", 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        while self._at >= len(self._output):
            if not self._input:
                self._input = self._raw.read(self.CHUNK)
                if not self._input:
                    if self._frame is not None:
                        raise EOFError("zstd stream ended inside a frame (truncated file)")
                    return 0
            if self._frame is None:
                self._frame = self._dctx.decompressobj()
            chunk, self._input = self._input[: self.CHUNK], self._input[self.CHUNK:]
            self._output, self._at = self._frame.decompress(chunk), 0
            if self._frame.eof:  # the next frame, if any, starts in what this one left unread
                self._input, self._frame = self._frame.unused_data + self._input, None
        n = min(len(buffer), len(self._output) - self._at)
        buffer[:n] = self._output[self._at: self._at + n]
        self._at += n
        return n

    def close(self) -> None:
        self._raw.close()
        super().close()


def _decompressed(f: SourceFile) -> io.BufferedIOBase:
    raw = f.open()
    if f.uri.endswith(".gz"):
        return gzip.GzipFile(fileobj=raw)
    if f.uri.endswith(".zst"):
        return io.BufferedReader(_ZstdStream(raw))
    return raw


def as_internal_records(source: Source) -> Source:
    """The source as it reads records Kiln builds itself ({"text", "id", "url"}), not the user's fields."""
    return source.model_copy(update={"text_field": "text", "id_field": "id", "url_field": "url", "html_field": None})


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


def _nesting(value: Any) -> int:
    """How deeply lists and objects nest in `value` (a bare value: 0), counted without recursion and only until
    past MAX_NESTING."""
    if not isinstance(value, (dict, list, tuple)):
        return 0
    deepest, stack = 0, [(value, 1)]
    while stack and deepest <= MAX_NESTING:
        node, depth = stack.pop()
        deepest = max(deepest, depth)
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list, tuple)))
    return deepest


def _json_native(value: Any) -> Any:
    """A Parquet value (from Arrow) as JSON can hold it in a document's meta: bytes as text (invalid UTF-8 as \\x..
    escapes), dates and times in ISO 8601, decimals, durations and anything else as their str()."""
    if value is None or isinstance(value, (str, int, float)):
        return value
    if isinstance(value, dict):
        return {str(k): _json_native(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_native(v) for v in value]
    if isinstance(value, bytes):
        return value.decode("utf-8", errors="backslashreplace")
    return value.isoformat() if hasattr(value, "isoformat") else str(value)


def record_to_document(record: Any, source: Source, locator: str, reading: Reading) -> Document | Quarantined:
    """Validate one structured record (a JSON object, a Parquet row) and turn it into a document."""
    try:
        dumped = json.dumps(record, ensure_ascii=False, default=str)
    except RecursionError:
        return quarantine(source.name, locator, "too_deep")
    if dumped.count("[") + dumped.count("{") > MAX_NESTING and _nesting(record) > MAX_NESTING:
        return quarantine(source.name, locator, "too_deep", dumped.encode("utf-8", "backslashreplace"))
    if not isinstance(record, dict):
        return quarantine(source.name, locator, "not_an_object", dumped)  # not ASCII-escaped: the redactor reads it
    if _SURROGATE.search(dumped):  # text, id, url, meta or a key
        if reading.unicode_errors == "quarantine":  # the lone surrogates escaped, so it can be written
            return quarantine(source.name, locator, "invalid_unicode", dumped.encode("utf-8", "backslashreplace"))
        record = _unicode_repaired(record)
    text_field = source.html_field or source.text_field
    text = record.get(text_field)
    if text is None:
        return quarantine(source.name, locator, "missing_text", dumped)
    if isinstance(text, bytes):  # a Parquet binary column: a page's bytes as crawled, or text written as plain
        # binary (Impala, Hive and old Spark write strings without the UTF-8 annotation), read as UTF-8, strictly
        text = (decoded_html(text, None, source.name, locator) if source.html_field
                else decode_utf8(text, source.name, locator))
        if isinstance(text, Quarantined):
            return text
    if not isinstance(text, str):
        return quarantine(source.name, locator, "text_not_string", dumped)
    if source.html_field:  # the text is the page's main content; what the page says of itself joins the meta
        url = record.get(source.url_field) if source.url_field else None
        page = extracted(text, source, reading, locator, url if isinstance(url, str) else None)
        if isinstance(page, Quarantined):
            return page
        text = page.text
        if page.canonical_url and source.url_field and not isinstance(url, str):  # no url of its own
            record = {**record, source.url_field: page.canonical_url}
        record = {**{k: v for k, v in page.meta().items() if k not in record}, **record}  # the record's own win
    if not text.strip():
        return quarantine(source.name, locator, "empty_text")
    if len(text.encode("utf-8", errors="surrogatepass")) > reading.max_document_bytes:
        return quarantine(source.name, locator, "too_large", text)
    native_id = _native_id(record.get(source.id_field)) if source.id_field else None
    if native_id is not None:
        locator = f"id:{native_id}"
    url = record.get(source.url_field) if source.url_field else None
    meta = {k: v for k, v in record.items() if k not in {text_field, source.url_field}}
    meta["locator"] = locator
    return Document(doc_id=make_doc_id(source.name, locator), source=source.name, text=text,
                    url=url if isinstance(url, str) else None, license=source.license, meta=meta)


_BOM = b"\xef\xbb\xbf"  # a UTF-8 byte order mark, which Windows tools write before a file's first record
_DRAIN = 1 << 20


def _lines(stream, limit: int) -> Iterator[tuple[bytes, str | None]]:
    """The stream's lines, each (line, None), or for a line longer than `limit` bytes (its first limit + 1 bytes,
    the whole line's text_hash): read in bounded pieces, so a reader's memory does not grow with a line's length."""
    while line := stream.readline(limit + 1):
        if len(line) <= limit or line.endswith(b"\n"):
            yield line, None
            continue
        digest, piece = hashlib.blake2b(line, digest_size=16), line  # text_hash of the whole line, piece by piece
        while not piece.endswith(b"\n") and (piece := stream.readline(_DRAIN)):
            digest.update(piece)
        yield line, digest.hexdigest()


def _read_bounded(stream, limit: int) -> tuple[bytes, str | None]:
    """At most the stream's first limit + 1 bytes, and for a stream longer than `limit` the text_hash of all of it,
    read on in bounded pieces: a too_large record's hash identifies the whole record, not its start."""
    data = stream.read(limit + 1)
    if len(data) <= limit:
        return data, None
    digest = hashlib.blake2b(data, digest_size=16)
    while piece := stream.read(_DRAIN):
        digest.update(piece)
    return data, digest.hexdigest()


def _native_id(value: Any) -> str | None:
    """A record's own id, or None where it has none to name it by (then its place in the file does): a null, an
    empty string, NaN (a Parquet integer column with nulls reads as floats) or a list or object would give every such
    record the same id, and all but the first would be quarantined as duplicate_doc_id."""
    if isinstance(value, str):
        return value if value.strip() else None
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    if isinstance(value, int):  # any size: a float check of a 400-digit id overflows
        return str(value)
    return str(value) if math.isfinite(value) else None


def read_jsonl(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    lines = records = 0
    try:
        with _decompressed(f) as stream:
            for lineno, (line, long_hash) in enumerate(_lines(stream, reading.max_document_bytes), start=1):
                lines += 1
                locator = f"{f.relative}#L{lineno}"
                if lineno == 1 and line.startswith(_BOM):
                    line = line[len(_BOM):]
                if not line.strip():
                    continue  # blank lines separate nothing in JSONL; not a record
                records += 1
                if long_hash is not None or len(line) > reading.max_document_bytes:
                    yield quarantine(source.name, locator, "too_large", line, record_hash=long_hash)
                    continue
                decoded = decode_utf8(line, source.name, locator)
                if isinstance(decoded, Quarantined):
                    yield decoded
                    continue
                try:
                    record = json.loads(decoded)
                except json.JSONDecodeError as exc:
                    yield quarantine(source.name, locator, "malformed_json", decoded, exc.msg)
                    continue
                except ValueError as exc:  # an integer past Python's 4,300-digit limit: this record, not the file
                    yield quarantine(source.name, locator, "malformed_json", decoded, str(exc).split(";")[0])
                    continue
                except RecursionError:
                    yield quarantine(source.name, locator, "too_deep", decoded)
                    continue
                yield record_to_document(record, source, locator, reading)
    except STREAM_ERRORS as exc:  # truncated/corrupt compression, unreadable file
        yield quarantine(source.name, f"{f.relative}#L{lines + 1}", "unreadable_file",
                         detail=f"{type(exc).__name__}: {exc}")
        return
    if records == 0:  # no bytes, or blank lines only: the file is reported, not silently nothing
        yield quarantine(source.name, f.relative, "empty_file")


def read_parquet(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    """One record per row, a row group at a time. A file that cannot be opened is one unreadable_file record; a
    damaged row group ends the file with one unreadable_file record at the first row not read. The file is read
    where it lies, a row group at a time (a worker's memory holds one, not the file)."""
    with contextlib.ExitStack() as held:
        try:
            parquet = pq.ParquetFile(held.enter_context(f.open_seekable()))
            declared = parquet.metadata.num_rows
        except Exception as exc:  # noqa: BLE001 - pyarrow raises many types for a corrupt file
            yield quarantine(source.name, f.relative, "unreadable_file", detail=f"{type(exc).__name__}: {exc}")
            return
        yield from _parquet_rows(parquet, declared, f, source, reading)


def _parquet_rows(parquet: pq.ParquetFile, declared: int, f: SourceFile, source: Source,
                  reading: Reading) -> Iterator[Document | Quarantined]:
    if declared == 0:
        yield quarantine(source.name, f.relative, "empty_file")
        return
    offset = 0  # rows read so far: the next row's number (across row groups and batches)
    for group in range(parquet.num_row_groups):
        try:
            batches = parquet.read_row_group(group).to_batches(max_chunksize=1000)
        except Exception as exc:  # noqa: BLE001 - a damaged page or row group
            yield quarantine(source.name, f"{f.relative}#row{offset}", "unreadable_file",
                             detail=f"row group {group}: {type(exc).__name__}: {exc}")
            return
        for batch in batches:
            for row in _batch_rows(batch):
                locator = f"{f.relative}#row{offset}"
                offset += 1
                if isinstance(row, tuple):  # (column, exception): a value Arrow cannot turn into Python
                    column, exc = row
                    reason = "invalid_utf8" if isinstance(exc, UnicodeDecodeError) else "unreadable_row"
                    yield quarantine(source.name, locator, reason,
                                     detail=f"column {column!r}: {type(exc).__name__}: {exc}")
                    continue
                row = {k: v if k in (source.text_field, source.html_field) else _json_native(v) for k, v in row.items()}
                yield record_to_document(row, source, locator, reading)
    if offset < declared:
        yield quarantine(source.name, f"{f.relative}#row{offset}", "unreadable_file",
                         detail=f"the file ended after {offset} of the {declared} rows its footer declares")


def _batch_rows(batch: pa.RecordBatch) -> list[dict | tuple[str, Exception]]:
    """The batch's rows as dicts; a row with a value that cannot be converted (invalid UTF-8 in a string, a
    timestamp outside Python's range) as (its column, the exception) instead."""
    try:
        return batch.to_pylist()
    except Exception:  # noqa: BLE001 - find the rows (and columns) that fail, one at a time
        pass
    rows: list[dict | tuple[str, Exception]] = []
    for i in range(batch.num_rows):
        row: dict | tuple[str, Exception] = {}
        for name, column in zip(batch.schema.names, batch.columns):
            try:
                row[name] = column[i].as_py()
            except Exception as exc:  # noqa: BLE001
                row = (name, exc)
                break
        rows.append(row)
    return rows


def _whole_file(f: SourceFile, source: Source, reading: Reading) -> bytes | Quarantined:
    """A file that is one document: its bytes (decompressed), or unreadable_file / too_large."""
    try:
        with _decompressed(f) as stream:
            data, whole_hash = _read_bounded(stream, reading.max_document_bytes)
    except STREAM_ERRORS as exc:
        return quarantine(source.name, f.relative, "unreadable_file", detail=f"{type(exc).__name__}: {exc}")
    if whole_hash is not None:
        return quarantine(source.name, f.relative, "too_large", data, record_hash=whole_hash)
    return data


def read_text(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    """Each file is one document (a book, a page, a source file)."""
    data = _whole_file(f, source, reading)
    text = data if isinstance(data, Quarantined) else decode_utf8(data, source.name, f.relative)
    if isinstance(text, Quarantined):
        yield text
        return
    yield record_to_document({"text": text}, as_internal_records(source), f.relative, reading)


HTML_SUFFIXES = (".html", ".htm", ".xhtml")


def read_html(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    """Each file is one page: its main content (`extracted`), its url the page's canonical link, else its locator.
    Files of other types (a site's stylesheets, scripts, images) are quarantined as unsupported_format."""
    if not f.bare_name.endswith(HTML_SUFFIXES):
        yield quarantine(source.name, f.relative, "unsupported_format",
                         detail=f"{f.relative}: an html source reads {', '.join(HTML_SUFFIXES)} files "
                                f"(optionally .gz/.zst); a glob such as site/**/*.html names only those")
        return
    data = _whole_file(f, source, reading)
    if isinstance(data, Quarantined):
        yield data
        return
    if not data.strip():
        yield quarantine(source.name, f.relative, "empty_file")
        return
    # a .xhtml file is XHTML (an XML declaration names its charset); others HTML
    html = decoded_html(data, XHTML if f.bare_name.endswith(".xhtml") else None, source.name, f.relative)
    page = html if isinstance(html, Quarantined) else extracted(html, source, reading, f.relative, None)
    if isinstance(page, Quarantined):
        yield page
        return
    yield record_to_document({"text": page.text, "url": page.canonical_url or f.relative, **page.meta()},
                             as_internal_records(source), f.relative, reading)


def decoded_html(data: bytes, content_type: str | None, source: str, locator: str,
                 truncated: bool = False) -> str | Quarantined:
    """A page's text in the charset it declares (`decode_html`; `truncated`: the start of a longer page), or the page
    quarantined: invalid_utf8 (UTF-8, declared or not, and the bytes are not), or invalid_charset (bytes not valid in
    the charset declared)."""
    text, charset = decode_html(data, content_type, truncated)
    if text is not None:
        return text
    reason = "invalid_utf8" if charset in ("utf-8", "utf-8-sig") else "invalid_charset"
    return quarantine(source, locator, reason, data, f"not valid {charset}")


def extracted(html: str, source: Source, reading: Reading, locator: str, url: str | None) -> Extracted | Quarantined:
    """The page's main content by the source's extractor (its html_extractor, else reading.html.extractor), or the
    page quarantined: no_main_content (never an empty document), or malformed_html where a parser gives up."""
    try:
        page = extract(html, source.html_extractor or reading.html.extractor, url)
    except Exception as exc:  # noqa: BLE001 - parsers raise many types on hostile markup (HTMLParser: `<![ x ]>`)
        return quarantine(source.name, locator, "malformed_html", html, f"{type(exc).__name__}: {exc}")
    return page if page is not None else quarantine(source.name, locator, "no_main_content", html)


def read_warc(f: SourceFile, source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    """WET `conversion` records as they are; WARC `response` records, and `resource` records of a URL (`_holds_page`),
    of HTML or XHTML as their main content (`extracted`), of text/plain as it is, in the charset they declare, and of
    any other content type quarantined as not_text. Other records (warcinfo, request, metadata, revisit, a crawler's
    own resource records) hold no document and are not records here. Damage (an
    archive warcio cannot parse on, a record without Content-Length, an archive that ends inside a record) ends the
    file with one unreadable_file record at `#<n+1>`, after the n document records read before it."""
    from warcio.archiveiterator import ArchiveIterator

    _brotli_for_warcio()
    done = 0  # document records read; the one being read is number done + 1
    try:
        with f.open() as raw:
            archive = ArchiveIterator(raw)
            for record in archive:
                length = record.rec_headers.get_header("Content-Length") if record.format == "warc" else "0"
                if not re.fullmatch(r"\s*[0-9]+\s*", length or ""):
                    # no (valid) Content-Length: a header block cut short, or a record whose end cannot be found
                    # (warcio would read the rest of the archive as its content, or none of it)
                    yield quarantine(source.name, f"{f.relative}#{done + 1}", "unreadable_file",
                                     str(record.rec_headers),
                                     f"a {record.rec_type} record with Content-Length {length!r}")
                    return
                if not _holds_page(record):
                    continue
                outcome = _warc_document(record, done + 1, f, source, reading)
                done += 1
                yield outcome
                if isinstance(outcome, Quarantined) and outcome.reason == "unreadable_file":
                    return
            # warcio ends quietly where what is left does not parse as a record (a header cut short, noise):
            # `offset` is where the last whole record (and the blank lines after it) ended
            tail = archive.fh.tell() - archive.offset
    except Exception as exc:  # noqa: BLE001 - warcio raises several types on a damaged archive
        yield quarantine(source.name, f"{f.relative}#{done + 1}", "unreadable_file",
                         detail=f"{type(exc).__name__}: {exc}")
        return
    if tail > 0:
        yield quarantine(source.name, f"{f.relative}#{done + 1}", "unreadable_file",
                         detail=f"the archive ends with {tail} bytes that are not a whole record")
    elif done == 0:
        yield quarantine(source.name, f.relative, "empty_file")


class _BrotliDecompressor:
    """What warcio 1.8 expects of a brotli decompressor, over brotli 1.2's: warcio sets `unused_data` on it and calls
    `decompress`; brotli 1.2's Decompressor takes no new attribute and names the call `process`, so every page served
    `Content-Encoding: br` failed."""

    def __init__(self):
        import brotli

        self._decompressor, self.unused_data = brotli.Decompressor(), None

    def decompress(self, data: bytes) -> bytes:
        return self._decompressor.process(data)


@functools.cache
def _brotli_for_warcio() -> None:
    from warcio.bufferedreaders import BufferedReader

    BufferedReader.DECOMPRESSORS["br"] = _BrotliDecompressor


# A WARC page's media type: whether it is HTML (read for its main content) or plain text (read as it is). Other types,
# text/css, text/javascript, text/csv and images among them, are no documents.
_PAGE_TYPES = {"text/html": True, XHTML: True, "text/plain": False}
# A `resource` record of one of these holds a resource as fetched (warcit, Webrecorder and Browsertrix store pages so,
# Heritrix FTP files); others are the crawler's own (wget's metadata:// log, urn: page info, screenshots, text)
_RESOURCE_SCHEMES = ("http:", "https:", "ftp:", "file:")


def _holds_page(record) -> bool:
    """Whether a WARC record is a document record: WET text, an HTTP response, or a resource fetched from a URL."""
    if record.rec_type == "resource":
        return (record.rec_headers.get_header("WARC-Target-URI") or "").lower().startswith(_RESOURCE_SCHEMES)
    return record.rec_type in ("conversion", "response")


def _warc_document(record, ordinal: int, f: SourceFile, source: Source, reading: Reading) -> Document | Quarantined:
    """The `ordinal`th document record of the archive, as a document or quarantined."""
    record_id = record.rec_headers.get_header("WARC-Record-ID")
    locator = f"{f.relative}#{record_id}" if record_id else f"{f.relative}#{ordinal}"
    record_id = record_id or locator  # no id of its own: where it is (file and ordinal) stands in
    url = record.rec_headers.get_header("WARC-Target-URI")
    try:  # the HTTP Content-Encoding undone (gzip, deflate, br)
        payload, whole_hash = _read_bounded(record.content_stream(), reading.max_document_bytes)
    except Exception as exc:  # noqa: BLE001 - a decompressor's error: this record's, the archive reads on
        return quarantine(source.name, locator, "undecodable_content", detail=f"{type(exc).__name__}: {exc}")
    if whole_hash is not None:
        return quarantine(source.name, locator, "too_large", payload, record_hash=whole_hash)
    block = record.raw_stream  # a LimitReader: what is left of the record's Content-Length
    if getattr(block, "limit", 0) > 0 and not block.read(1):  # a cut file, or a Content-Length past its end
        return quarantine(source.name, f"{f.relative}#{ordinal}", "unreadable_file", payload,
                          f"the archive ends {block.limit} bytes inside record {record_id}")
    meta = {}
    if record.rec_type == "conversion":
        text = decode_utf8(payload, source.name, locator)
    else:
        headers = record.http_headers if record.rec_type == "response" else record.rec_headers  # resource: no HTTP
        content_type = ((headers.get_header("Content-Type") if headers else "") or "").lower()
        is_html = _PAGE_TYPES.get(content_type.split(";")[0].strip())
        if is_html is None:
            return quarantine(source.name, locator, "not_text", detail=content_type)
        # a record the crawler cut at its size limit says so (WARC 1.1 WARC-Truncated: length, time, ...)
        truncated = bool(record.rec_headers.get_header("WARC-Truncated"))
        text = decoded_html(payload, content_type, source.name, locator, truncated)
        if is_html and not isinstance(text, Quarantined):  # text/plain as it is
            page = extracted(text, source, reading, locator, url)
            if isinstance(page, Quarantined):
                return page
            text, meta = page.text, page.meta()
    if isinstance(text, Quarantined):
        return text
    return record_to_document({"text": text, "id": record_id, "url": url, **meta}, as_internal_records(source),
                              locator, reading)


FORMAT_READERS: dict[str, Callable[[SourceFile, Source, Reading], Iterator[Document | Quarantined]]] = {
    "jsonl": read_jsonl,
    "parquet": read_parquet,
    "text": read_text,
    "warc": read_warc,
    "wet": read_warc,
    "html": read_html,
}
