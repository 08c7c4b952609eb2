"""Text from the data as a person sees it (a terminal, a markdown page): characters that act instead of showing are
shown as `\\uXXXX` escapes, so what is read is what is there.

`UNSEEN`: C0 controls but tab and line feed, DEL and the C1 controls (ESC and 0x9b start a terminal's control
sequences: a title, a cleared screen, colours), and the bidirectional formatting characters (marks, embeddings,
overrides, isolates: U+202E makes "TIM" read "MIT", Trojan Source). A reader shows none of them, and they split
what the PII redactor reads: the quarantine excerpts drop them (kiln.curation.readers.formats).
"""

from __future__ import annotations

import re

UNSEEN = re.compile("[\x00-\x08\x0b-\x1f\x7f-\x9f\u061c\u200e\u200f\u202a-\u202e\u2066-\u2069]")


def visible(text: str) -> str:
    """`text` with every UNSEEN character as its `\\uXXXX` escape (also valid in a JSON string: the same character)."""
    return UNSEEN.sub(lambda m: f"\\u{ord(m.group()):04x}", text)


__all__ = ["UNSEEN", "visible"]
