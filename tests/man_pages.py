"""Installed translated manual pages for the tests that need real text in other scripts (Debian's manpages-de, -ru,
-ja, -zh ...; .ci/run installs them). Without them a test skips, naming the package, or fails where
KILN_REQUIRE_MANPAGES is set (CI): a missing package must not pass for a green run."""

from __future__ import annotations

import os

import pytest

from kiln.curation.readers import builtin


def man_pages(directory: str, count: int) -> list[str]:
    """The first `count` installed pages of /usr/share/man/<directory> (hashed order), rendered to text."""
    texts = []
    for *_, path in (p for p in builtin.translated_man_pages() if p[1] == directory):
        try:
            texts.append(builtin.render_man_page(path))
        except builtin.ManPageError:
            continue
        if len(texts) == count:
            return texts
    message = (f"{count} pages under /usr/share/man/{directory} needed, {len(texts)} installed "
               f"(apt-get install manpages-{directory[:2]})")
    if os.environ.get("KILN_REQUIRE_MANPAGES"):
        pytest.fail(message)
    pytest.skip(message)
