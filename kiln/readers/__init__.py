"""Reading a declared source into documents; anything unreadable becomes a `Quarantined` record.

`read_source(source, reading)` yields `Document`s and `Quarantined`s in a stable order. It never
raises for bad data: a broken line, file or field is quarantined with a reason and reading goes on.
"""

from __future__ import annotations

from collections.abc import Iterator

from kiln.config import Reading, Source
from kiln.documents import Document
from kiln.readers.builtin import read_builtin
from kiln.readers.formats import FORMAT_READERS, Quarantined
from kiln.readers.paths import expand


def read_source(source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    if source.kind == "builtin":
        records = read_builtin(source, reading)
    else:
        records = _read_files(source, reading)
    kept = 0
    for record in records:
        if isinstance(record, Document):
            if source.max_documents is not None and kept >= source.max_documents:
                return
            kept += 1
        yield record


def _read_files(source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    read_file = FORMAT_READERS[source.kind]
    files = expand(source.path)
    if not files:
        yield Quarantined(source.name, source.path, "no_files_matched", None)
        return
    for f in files:
        yield from read_file(f, source, reading)


__all__ = ["Quarantined", "read_source"]
