"""What a document removed after intake leaves behind: enough for an auditor, none of its text by default.

`raw_documents` holds every record as it came in, behind the raw layer's access control. A document removed by a
later stage (filtered, duplicate, low quality, taken down) leaves a row with its id, source, url and license, the
stage and reason, what it duplicated, its length and a hash of its text: an auditor can trace it to the raw record,
and check a text against it, without the rejected table becoming a second copy of the very PII or secret that may
have got the document dropped. `curation.keep_rejected_text` opts into an `excerpt` or the `full` text, always
PII-redacted; the same setting decides whether the removal examples in a stage's metadata show an excerpt.

Kept text is redacted at least as hard as any `pii` step could be configured to redact the documents kept: every
PII type, and a national-format phone number of every region libphonenumber knows, not only the step's
`phone_regions` (a user who adds Panama to them must not find "tel: 200-1234" in a rejected row), so that no
setting of `curation.pii` can leave more of a removed document's PII than of a kept one's.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

import phonenumbers

from kiln.curation.pii import redact

RejectedText = Literal["none", "excerpt", "full"]
EXCERPT_CHARS = 200
_CUT_MARGIN = 256  # an excerpt is redacted past its cut, so a PII span crossing the cut is seen whole
EXCERPT_READS = EXCERPT_CHARS + _CUT_MARGIN  # the characters of a text an excerpt is made from, at least
# ... and at most, in practice: a window doubles past EXCERPT_READS only where redaction shortened it by more than
# _CUT_MARGIN, and no text is shortened from this many characters to EXCERPT_READS
EXCERPT_MOST_READS = 64 * 1024


def text_hash(text: str | bytes) -> str:
    """blake2b-128 of the text as the stage removed it (UTF-8; bytes as they are, e.g. a record intake could not
    decode): lets an auditor check a text against a removal or a quarantined record."""
    data = text if isinstance(text, bytes) else text.encode("utf-8", errors="surrogatepass")
    return hashlib.blake2b(data, digest_size=16).hexdigest()


_EVERY_REGION = tuple(sorted(phonenumbers.SUPPORTED_REGIONS))


def _redact(text: str) -> str:
    return redact(text, phone_regions=_EVERY_REGION)[0]


def kept_text(text: str, policy: RejectedText) -> str | None:
    """What of a removed document's text may be persisted: nothing, or its excerpt or whole text, PII-redacted."""
    if policy == "none":
        return None
    if policy == "excerpt":
        return _redacted_excerpt(text)
    return _redact(text)


def _redacted_excerpt(text: str) -> str:
    """The first EXCERPT_CHARS characters of the redacted text, redacting only as much of it as that needs: a
    window whose last _CUT_MARGIN characters the redactor left alone, after the excerpt's, so that no PII span of
    the excerpt crosses the window's cut. A fixed window is not enough: a placeholder shortens what it replaces (a
    PEM key by some 400 characters), pulling text from near the cut into the excerpt. The window doubles until
    then, or is the whole text."""
    size = EXCERPT_READS
    while True:
        window = text[:size]
        redacted = _redact(window)
        untouched = 0  # the characters at the window's end that the redactor left as they were (enough: the margin)
        while untouched < min(len(redacted), len(window), _CUT_MARGIN) and \
                redacted[-1 - untouched] == window[-1 - untouched]:
            untouched += 1
        # the excerpt ends at least _CUT_MARGIN characters of the text before the cut: either inside that untouched
        # end (then the redacted text goes on past it by as many) or before it
        if size >= len(text) or min(untouched, len(redacted) - EXCERPT_CHARS) >= _CUT_MARGIN:
            return redacted[:EXCERPT_CHARS]
        size *= 2


def example_excerpt(text: str, policy: RejectedText) -> str | None:
    """The excerpt a removal example in a stage's metadata may show (none unless rejected text is kept)."""
    return None if policy == "none" else kept_text(text, "excerpt")


def rejected_row(row: dict[str, Any], stage: str, reason: str, policy: RejectedText, text: str | None = None,
                 **extra: Any) -> dict[str, Any]:
    """A rejected table's row for document `row` (text `text` if given: the text as the stage removed it)."""
    text = row["text"] if text is None else text
    return {"doc_id": row["doc_id"], "source": row["source"], "url": row.get("url"), "license": row.get("license"),
            "stage": stage, "reason": reason, "duplicate_of": None, "cluster_id": None, "jaccard": None,
            "chars": len(text), "text_hash": text_hash(text), "text": kept_text(text, policy), **extra}
