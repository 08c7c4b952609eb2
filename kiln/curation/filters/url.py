"""URL / domain blocklist: drop documents whose URL's host is (a subdomain of) a listed domain."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import ClassVar
from urllib.parse import urlsplit

from kiln.curation.documents import Document
from kiln.curation.filters.base import Verdict, drop, keep
from kiln.curation.filters.wordlists import cached_while_unchanged, load_wordlist

DEFAULT_BLOCKLIST = str(Path(__file__).resolve().parent.parent / "data" / "blocklist_domains.txt")


@cached_while_unchanged
def _blocked_domains(path: str) -> frozenset[str]:
    return frozenset(d.lower().lstrip(".") for d in load_wordlist(path))


def host_of(url: str) -> str | None:
    try:
        host = urlsplit(url if "//" in url else f"//{url}").hostname
    except ValueError:
        return None
    return host.lower().rstrip(".") if host else None


@dataclass
class UrlBlocklist:
    name: ClassVar[str] = "url_blocklist"
    list_files: ClassVar[tuple[str, ...]] = ("domains_file",)  # what it decides by, beyond its parameters
    domains_file: str = DEFAULT_BLOCKLIST
    drop_unparseable: bool = False

    def __post_init__(self):
        _blocked_domains(self.domains_file)  # fail at config time, not in a worker

    def __call__(self, doc: Document) -> Verdict:
        if not doc.url:
            return keep(doc.text)
        host = host_of(doc.url)
        if host is None:
            return drop(self.name, "unparseable_url", doc.text) if self.drop_unparseable else keep(doc.text)
        blocked = _blocked_domains(self.domains_file)
        labels = host.split(".")
        # example.com blocks example.com and any subdomain of it, but not notexample.com
        if any(".".join(labels[i:]) in blocked for i in range(len(labels))):
            return drop(self.name, "blocked_domain", doc.text)
        return keep(doc.text)
