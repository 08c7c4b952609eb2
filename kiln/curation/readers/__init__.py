"""Reading a declared source into documents; anything unreadable becomes a `Quarantined` record.

`read_source(source, reading)` yields `Document`s and `Quarantined`s in a stable order. It never
raises for bad data: a broken line, file or field is quarantined with a reason and reading goes on.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator

from kiln.common.config import Reading, Source
from kiln.curation.documents import Document, make_doc_id
from kiln.curation.readers.builtin import read_builtin
from kiln.curation.readers.formats import FORMAT_READERS, HTML_SUFFIXES, Quarantined, quarantine
from kiln.curation.readers.paths import SourceFile, expand

# Files landed for a builtin source (which has no file format of its own) are read by their extension.
EXTENSION_KINDS = {".jsonl": "jsonl", ".json": "jsonl", ".ndjson": "jsonl", ".parquet": "parquet", ".warc": "warc",
                   ".wet": "wet", **dict.fromkeys(HTML_SUFFIXES, "html"),  # a page: its main content
                   ".txt": "text", ".md": "text", ".rst": "text", ".py": "text"}  # a text file: one document


def read_source(source: Source, reading: Reading, files: list[SourceFile] | None = None,
                namespace: str = "") -> Iterator[Document | Quarantined]:
    """The source's records: its configured path or corpus, or `files` instead (a refresh's landed files).
    A `namespace` (the refresh) prefixes every locator, so records of different refreshes never share a doc id
    even when their native ids repeat."""
    if files is not None:
        records = _read_files(source, reading, files)
    elif source.kind == "builtin":
        records = read_builtin(source, reading)
    else:
        matched = expand(source.path)
        records = _read_files(source, reading, matched) if matched else \
            iter([Quarantined(source.name, source.path, "no_files_matched", None)])
    kept = 0
    for record in records:
        if namespace:
            record = _namespaced(record, namespace)
        if isinstance(record, Document):
            if source.max_documents is not None and kept >= source.max_documents:
                return
            kept += 1
        yield record


def _read_files(source: Source, reading: Reading, files: list[SourceFile]) -> Iterator[Document | Quarantined]:
    for f in files:
        kind = source.kind if source.kind != "builtin" else _kind_of(f)
        if kind is None:
            yield Quarantined(source.name, f.relative, "unsupported_format",
                              f"{f.relative}: a builtin source reads landed files by extension "
                              f"({', '.join(sorted(EXTENSION_KINDS))}, optionally .gz/.zst)")
            continue
        yield from FORMAT_READERS[kind](f, source, reading)


# Kinds whose file is one document: `ingest` reads many of them per task.
ONE_DOCUMENT_KINDS = frozenset({"text", "html"})


def one_document_per_file(source: Source, f: SourceFile) -> bool:
    return (source.kind if source.kind != "builtin" else _kind_of(f)) in ONE_DOCUMENT_KINDS


def _kind_of(f: SourceFile) -> str | None:
    return next((k for ext, k in EXTENSION_KINDS.items() if f.bare_name.endswith(ext)), None)


def _namespaced(record: Document | Quarantined, namespace: str) -> Document | Quarantined:
    if isinstance(record, Quarantined):
        return dataclasses.replace(record, locator=f"{namespace}/{record.locator}")
    locator = f"{namespace}/{record.meta.get('locator', record.doc_id)}"
    return dataclasses.replace(record, doc_id=make_doc_id(record.source, locator),
                               meta={**record.meta, "locator": locator})


__all__ = ["Quarantined", "SourceFile", "one_document_per_file", "quarantine", "read_source"]
