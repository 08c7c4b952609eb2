"""The embedded default corpora: real text already on every machine that runs Kiln, nothing downloaded.

- `python_docs`: Python's reference documentation (`pydoc_data` topics) and the standard library's
  docstrings (read with `ast`, never imported), one document per topic or module.
- `package_readmes`: long descriptions of the installed distributions: web-like Markdown/reST with
  real URLs and e-mail addresses.
- `package_licenses`: license files shipped by the installed distributions (heavy natural duplication).
  Both leave out editable installs (`pip install -e`, Kiln's own in a checkout): their metadata is a snapshot of a
  working tree, so the same name and version carry a new text after each edit and reinstall.
- `stdlib_code`: the standard library's Python source.
- `multilingual`: the translated manual pages installed under /usr/share/man/<language>/ (Debian's manpages-de,
  -fr, -es, -it, -pl, -ru, -ja, -zh, ...), rendered to text by groff, one document per page, its directory's
  language in `meta.expected_language`.

Items are ordered by a hash of their locator, so a `max_documents` cap takes a stable, unbiased sample.
"""

from __future__ import annotations

import ast
import gzip
import hashlib
import importlib.metadata
import json
import os
import re
import subprocess
import sys
import sysconfig
from collections.abc import Iterator
from pathlib import Path

from packaging.utils import canonicalize_name

from kiln.common.config import Reading, Source
from kiln.curation.documents import Document
from kiln.curation.readers.formats import (Quarantined, as_internal_records, decode_utf8, quarantine,
                                           record_to_document)

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


def _editable(dist) -> bool:
    """Installed with `pip install -e` (PEP 610's direct_url.json)."""
    try:
        return bool(json.loads(dist.read_text("direct_url.json") or "{}").get("dir_info", {}).get("editable"))
    except (ValueError, AttributeError):  # malformed: the installer's fault, not a reason to drop the package
        return False


def _distributions() -> list[importlib.metadata.Distribution]:
    named = [(canonicalize_name(d.metadata.get("Name") or ""), d) for d in importlib.metadata.distributions()]
    # By name: the working tree of an editable install holds its own `*.egg-info`, found first from that directory.
    editable = {name for name, d in named if _editable(d)}
    seen, out = set(), []
    for name, dist in named:
        if name and name not in seen and name not in editable:
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


MAN_ROOT = Path("/usr/share/man")
MAN_WIDTH = 78  # columns, as `man` at MANWIDTH=80 sets groff's line length
MAN_RENDER_SECONDS = 60
_MAN_FILE = re.compile(r"^(?P<name>.+)\.(?P<section>[1-9][a-z0-9]*)(?:\.gz)?$")
_OVERSTRIKE = re.compile(r".\x08")  # what `col -b` removes, should a page still carry one


class ManPageError(Exception):
    """A manual page that cannot be rendered; `reason` is the quarantine reason, the message says why."""

    def __init__(self, reason: str, detail: str):
        super().__init__(detail)
        self.reason = reason


def render_man_page(path: str | Path) -> str:
    """A manual page (troff source, plain or .gz) as plain UTF-8 text, the same bytes on every run: groff's `man`
    macros at a fixed width in the C.UTF-8 locale, no justification or hyphenation (they would pad and split words),
    no bold / underline overstrikes (as `col -b`), trailing spaces and blank edges removed. Raises ManPageError
    (reason `man_unreadable`, `invalid_utf8`, `man_alias`, `man_render_failed` or `man_render_empty`)."""
    path = Path(path)
    try:
        raw = path.read_bytes()
        if path.suffix == ".gz":
            raw = gzip.decompress(raw)
    except (OSError, EOFError, gzip.BadGzipFile) as exc:
        raise ManPageError("man_unreadable", f"{path}: {exc}") from None
    try:
        source = raw.decode("utf-8").removeprefix("\ufeff")
    except UnicodeDecodeError as exc:  # Debian policy: pages under /usr/share/man are UTF-8
        raise ManPageError("invalid_utf8", f"{path}: {exc}") from None
    if _man_alias(source):
        raise ManPageError("man_alias", f"{path} only includes another page (.so)")
    # `.na`/`.nh` first: filled, unhyphenated lines; -t runs tbl, harmless on pages without tables.
    command = ["groff", "-Tutf8", "-man", "-t", "-k", "-Kutf-8", "-P-cbou", "-rcR=1",
               f"-rLL={MAN_WIDTH}n", f"-rLT={MAN_WIDTH}n"]
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LC_ALL": "C.UTF-8"}  # no GROFF_* from the caller
    try:
        done = subprocess.run(command, input=(".na\n.nh\n" + source).encode("utf-8"), capture_output=True,
                              env=env, timeout=MAN_RENDER_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ManPageError("man_render_failed", f"{path}: {exc}") from None
    if done.returncode != 0:
        message = done.stderr.decode("utf-8", "replace").strip().splitlines()[-1:] or ["no message"]
        raise ManPageError("man_render_failed", f"{path}: groff exited {done.returncode}: {message[0][:200]}")
    text = _OVERSTRIKE.sub("", done.stdout.decode("utf-8", "replace"))
    text = "\n".join(line.rstrip() for line in text.splitlines()).strip("\n")
    if not text.strip():
        raise ManPageError("man_render_empty", f"{path} renders to no text")
    return text + "\n"


def _man_alias(source: str) -> bool:
    """A page whose only request is `.so other/page` (an alias of another page), comments aside."""
    lines = [line for line in source.splitlines() if line.strip() and not line.startswith(('.\\"', "'\\\"", '\\"'))]
    return len(lines) == 1 and lines[0].startswith(".so ")


def man_language(directory: str) -> str:
    """The ISO 639-1 code of a /usr/share/man/<directory> (`zh_CN` → `zh`, `pt_BR` → `pt`, `de` → `de`)."""
    return directory.split("_")[0].split(".")[0].split("@")[0]


def translated_man_pages(root: Path | None = None) -> list[tuple[str, str, str, str, Path]]:
    """(locator, directory, section, page, path) of every translated page under `root` (MAN_ROOT)/<language>/man<N>/,
    in a stable hashed order. Symbolic links are other names of a page listed already: not pages."""
    root = MAN_ROOT if root is None else root
    items = []
    if not root.is_dir():
        return items
    for lang_dir in sorted(p for p in root.iterdir() if p.is_dir() and not p.name.startswith("man")):
        for section_dir in sorted(lang_dir.glob("man*")):
            for path in sorted(section_dir.iterdir()):
                m = _MAN_FILE.match(path.name)
                if m is None or path.is_symlink() or not path.is_file():
                    continue
                items.append((f"man/{lang_dir.name}/{section_dir.name}/{path.name}", lang_dir.name,
                              m["section"], m["name"], path))
    return _stable_order(items)


def _multilingual() -> Iterator[dict]:
    for locator, directory, section, page, path in translated_man_pages():
        try:
            text = render_man_page(path)
        except ManPageError as exc:
            if exc.reason != "man_alias":
                yield {"id": locator, "quarantine": exc.reason, "detail": str(exc)}
            continue
        lang = man_language(directory)
        # `expected_language`, not `language`: the language step writes `language` (what it identified).
        yield {"id": locator, "text": text, "url": f"man:{page}({section})@{directory}", "expected_language": lang,
               "man_locale": directory, "man_section": section, "man_page": page}


CORPORA = {
    "python_docs": _python_docs,
    "package_readmes": _package_readmes,
    "package_licenses": _package_licenses,
    "stdlib_code": _stdlib_code,
    "multilingual": _multilingual,
}


def read_builtin(source: Source, reading: Reading) -> Iterator[Document | Quarantined]:
    as_records = as_internal_records(source)
    for record in CORPORA[source.corpus]():
        if "quarantine" in record:  # a page that failed to render: its reason, never a crash
            yield quarantine(source.name, record["id"], record["quarantine"], detail=record["detail"])
            continue
        if "path_bytes" in record:  # files: decode here so invalid UTF-8 is quarantined like any source's
            text = decode_utf8(record.pop("path_bytes"), source.name, record["id"])
            if isinstance(text, Quarantined):
                yield text
                continue
            record["text"] = text
        yield record_to_document(record, as_records, record["id"], reading)
