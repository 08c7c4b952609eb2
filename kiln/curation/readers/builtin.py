"""The embedded default corpora: real text already on every machine that runs Kiln, nothing downloaded.

- `python_docs`: Python's reference documentation (`pydoc_data` topics) and the standard library's
  docstrings (read with `ast`, never imported), one document per topic or module.
- `package_readmes`: long descriptions of the installed distributions: web-like Markdown/reST with
  real URLs and e-mail addresses.
- `package_licenses`: license files shipped by the installed distributions (heavy natural duplication).
- `stdlib_code`: the standard library's Python source.

Items are ordered by a hash of their locator, so a `max_documents` cap takes a stable, unbiased sample.
"""

from __future__ import annotations

import ast
import hashlib
import importlib.metadata
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from kiln.common.config import Reading, Source
from kiln.curation.documents import Document
from kiln.curation.readers.formats import Quarantined, as_internal_records, decode_utf8, record_to_document

PY_VERSION = f"{sys.version_info.major}.{sys.version_info.minor}"
EXCLUDED_STDLIB_DIRS = {"site-packages", "test", "tests", "idle_test", "__pycache__", "dist-packages"}
LICENSE_NAMES = ("license", "licence", "copying", "notice", "authors")


def _stable_order(items: list[tuple[str, ...]]) -> list[tuple[str, ...]]:
    return sorted(items, key=lambda item: hashlib.blake2b(item[0].encode(), digest_size=8).digest())


def _stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> list[Path]:
    root = _stdlib_root()
    return sorted(p for p in root.rglob("*.py")
                  if not EXCLUDED_STDLIB_DIRS.intersection(p.relative_to(root).parts[:-1]))


def _python_docs() -> Iterator[dict]:
    from pydoc_data.topics import topics

    items = [(f"pydoc/{name}", "topic", name) for name in topics]
    items += [(f"docstrings/{p.relative_to(_stdlib_root())}", "module", str(p)) for p in _stdlib_files()]
    for locator, kind, ref in _stable_order(items):
        if kind == "topic":
            yield {"id": locator, "text": topics[ref], "url": f"https://docs.python.org/{PY_VERSION}/reference/",
                   "topic": ref}
        else:
            yield from _module_docstrings(Path(ref), locator)


def _module_docstrings(path: Path, locator: str) -> Iterator[dict]:
    module = ".".join(path.relative_to(_stdlib_root()).with_suffix("").parts).removesuffix(".__init__")
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return  # a few stdlib files are templates, not Python; they carry no docstrings to read
    sections = []
    if doc := ast.get_docstring(tree):
        sections.append(f"{module}\n{'=' * len(module)}\n\n{doc}")
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and not node.name.startswith("_"):
            if doc := ast.get_docstring(node):
                sections.append(f"{module}.{node.name}\n\n{doc}")
    if sections:
        top = module.split(".")[0]
        yield {"id": locator, "text": "\n\n".join(sections), "module": module,
               "url": f"https://docs.python.org/{PY_VERSION}/library/{top}.html"}


def _distributions() -> list[importlib.metadata.Distribution]:
    seen, out = set(), []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        if name and name not in seen:
            seen.add(name)
            out.append(dist)
    return sorted(out, key=lambda d: d.metadata.get("Name").lower())


def _homepage(dist) -> str | None:
    if url := dist.metadata.get("Home-page"):
        return url
    for entry in dist.metadata.get_all("Project-URL") or []:
        return entry.split(",", 1)[-1].strip()
    return None


def _dist_license(dist) -> str | None:
    if expression := dist.metadata.get("License-Expression"):
        return expression
    lines = (dist.metadata.get("License") or "").strip().splitlines()
    return lines[0][:100] if lines else None  # some packages paste the whole license text here


def _package_readmes() -> Iterator[dict]:
    items = [(f"readme/{d.metadata['Name']}", d) for d in _distributions()]
    for locator, dist in _stable_order(items):
        text = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if text.strip():
            yield {"id": locator, "text": text, "url": _homepage(dist), "package": dist.metadata.get("Name"),
                   "version": dist.version, "package_license": _dist_license(dist),
                   "content_type": dist.metadata.get("Description-Content-Type")}


def _package_licenses() -> Iterator[dict]:
    items = []
    for dist in _distributions():
        for f in dist.files or []:
            name = Path(str(f)).name.lower()
            if name.startswith(LICENSE_NAMES) and not name.endswith((".py", ".pyc", ".json")):
                items.append((f"license/{dist.metadata.get('Name')}/{f}", dist, f))
    for locator, dist, f in _stable_order(items):
        path = Path(dist.locate_file(f))
        if path.is_file():
            yield {"id": locator, "path_bytes": path.read_bytes(), "url": _homepage(dist),
                   "package": dist.metadata.get("Name"), "package_license": _dist_license(dist)}


def _stdlib_code() -> Iterator[dict]:
    items = [(f"stdlib/{p.relative_to(_stdlib_root())}", p) for p in _stdlib_files()]
    for locator, path in _stable_order(items):
        yield {"id": locator, "path_bytes": path.read_bytes(), "language": "python", "python_version": PY_VERSION,
               "url": None}


CORPORA = {
    "python_docs": _python_docs,
    "package_readmes": _package_readmes,
    "package_licenses": _package_licenses,
    "stdlib_code": _stdlib_code,
}


def read_builtin(source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    as_records = as_internal_records(source)
    for record in CORPORA[source.corpus]():
        if "path_bytes" in record:  # files: decode here so invalid UTF-8 is quarantined like any source's
            text = decode_utf8(record.pop("path_bytes"), source.name, record["id"])
            if isinstance(text, Quarantined):
                yield text
                continue
            record["text"] = text
        yield record_to_document(record, as_records, record["id"], reading)
