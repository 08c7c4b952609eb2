"""PII in a document's other fields: its `url` and its `meta` pass the redactor its text passes (`redact_fields`).

- url: credentials (`user:password@`) are dropped; the host, the path and every query and fragment parameter's name
  and value are redacted as text, percent-decoded (an e-mail in `?email=`, an IP address as the host, a token the
  secret detector knows). A parameter named as a credential or a contact (`named_pii`: token, api_key, password,
  signature, email, phone, ...) loses its value whatever it looks like: a short session token has no shape to
  detect. A URL in which nothing is found stays as it was, byte for byte.
- meta: every string, at any depth (keys too); a string that is a URL is redacted as one; a value (a number too)
  under a credential or contact name (or its plural: `phones`, `api_keys`) is replaced; an int of 7 or more digits
  is redacted as its digits would be ("contact: 14155552671" is a phone number; a timestamp, an id, a count after a
  name that is no phone cue stays an int).
A value is redacted after its name, as the redactor reads a label in text ("version: 1.2.3.4" is a version, not an
IP address; "tel: 030 91456342" is a phone number). The filter stage runs this after its steps, so the URL
blocklist and every other filter decide on the fields as they were read.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Callable, Sequence
from functools import lru_cache
from typing import Any
from urllib.parse import quote, unquote, unquote_plus, urlsplit, urlunsplit

from kiln.common.secrets import redact_url as without_credentials
from kiln.curation.documents import Document
from kiln.curation.pii.base import PLACEHOLDERS
from kiln.curation.pii.redaction import PiiRedaction

Lookup = Callable[[str], str]  # a text -> the text redacted
BatchRedactor = Callable[[list[str]], list[str]]  # texts -> the same texts redacted, in order

# Names (split into lowercase words: "X-Amz-Signature", "apiKey", "author_email") whose value is a credential or a
# contact detail whatever it looks like: the last word, or the last two. A plural holds what its singular holds
# ("phones", "api_keys", "email_addresses": a list of them), except where the plural is mostly something else in
# a corpus's records: "tokens" a token count or a tokenizer's tokens ("num_tokens", "input_tokens"; a credential
# only after a word that says so: "access_tokens"), "signatures" a function's, "passes" a count, "cells" a
# notebook's. A plural after a count word ("num_emails", "number_of_phones") is a count.
_SECRET_WORDS = frozenset({"token", "secret", "password", "passwd", "pwd", "passphrase", "pass", "apikey", "signature",
                           "sig", "credential", "credentials", "auth", "authorization", "jwt", "otp", "sessionid"})
_SECRET_PAIRS = frozenset({("api", "key"), ("access", "key"), ("secret", "key"), ("private", "key"),
                           ("session", "id"), ("session", "key"),
                           *((kind, "tokens") for kind in ("access", "refresh", "api", "auth", "bearer", "session",
                                                           "oauth", "csrf", "secret"))})
_CONTACT_WORDS = {"email": "email", "mail": "email", "phone": "phone", "telephone": "phone", "tel": "phone",
                  "mobile": "phone", "cell": "phone", "fax": "phone", "msisdn": "phone", "ssn": "us_ssn"}
_NAME_TAILS = ("number", "no", "address", "addr")  # "phone_number", "email_address": the word before decides
_SINGULARS = _SECRET_WORDS | set(_CONTACT_WORDS) | set(_NAME_TAILS) | {"key", "id"}
_OTHER_PLURALS = frozenset({"tokens", "signatures", "sigs", "passes", "cells"})
_COUNT_WORDS = frozenset({"num", "n", "nb", "number", "count", "total", "max", "min"})
_WORDS = re.compile(r"[a-z]+|[0-9]+")
_CAMEL = re.compile(r"([a-z0-9])([A-Z])")
# An int with fewer digits is no number any detector finds (a national phone number has 7 or more). A bare number
# is never a phone number to the detector; after a phone cue ("contact", "tel", "mobile_...", "call_...") one
# valid in a phone region is, a timestamp too ("contact_time: 1700000000" is an Israeli number), as its digits
# are in a string.
_MIN_NUMBER = 10 ** 6
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://\S+")
_PATH_SAFE = "/<>@:!$&'()*+,;=~"  # what a redacted path keeps unescaped: its separators and the placeholders
_VALUE_SAFE = "<>@:/!$'()*,;~"  # in a query value, '&', '=', '+' and '#' would change what the URL says


@lru_cache(maxsize=4096)  # a corpus has few field and parameter names, each seen on every document
def _singular(word: str) -> str:
    """A plural of one of the names' words as its singular ("phones", "addresses", "keys"); any other word as it is."""
    if word not in _OTHER_PLURALS:
        for ending in ("es", "s"):
            if word.endswith(ending) and word[:-len(ending)] in _SINGULARS:
                return word[:-len(ending)]
    return word


def named_pii(name: str) -> str | None:
    """The PII type a field or parameter called `name` holds by its name ("secret" for `access_token`, "email"
    for `author_email`), or None."""
    words = _WORDS.findall(_CAMEL.sub(r"\1_\2", name).lower())
    if words and (singular := _singular(words[-1])) != words[-1]:
        if _COUNT_WORDS.intersection(words[:-1]):
            return None
        words[-1] = singular
    if len(words) > 1 and words[-1] in _NAME_TAILS:
        words = words[:-1]
    if not words:
        return None
    if words[-1] in _SECRET_WORDS or tuple(words[-2:]) in _SECRET_PAIRS:
        return "secret"
    return _CONTACT_WORDS.get(words[-1])


def _labelled(name: str, value: str, lookup: Lookup) -> str:
    """`value` redacted as text after its name ("name: value")."""
    if not value:
        return value
    label = f"{name}: " if name else ""
    out = lookup(label + value)
    return out[len(label):] if out.startswith(label) else lookup(value)  # the name itself held PII


def _decoded_part(raw: str, lookup: Lookup, safe: str) -> str:
    """A percent-encoded part (host, path, fragment) redacted as the text it stands for; unchanged if clean."""
    plain = unquote(raw)
    out = lookup(plain) if plain else plain
    return raw if out == plain else quote(out, safe=safe)


def _params(query: str, lookup: Lookup) -> str:
    pieces = []
    for piece in query.split("&"):
        name, eq, value = piece.partition("=")
        plain_name = unquote_plus(name)
        red_name = lookup(plain_name) if plain_name else plain_name
        new_name = name if red_name == plain_name else quote(red_name, safe=_VALUE_SAFE)
        kind = named_pii(plain_name)
        if kind and value:
            value = PLACEHOLDERS[kind]
        else:  # '+' is a space in a form's query, or a phone number's '+' ("+44+20+..."): every reading is checked
            readings = (unquote(value), unquote_plus(value), "+" + unquote_plus(value[1:]) if value[:1] == "+" else "")
            for plain in dict.fromkeys(r for r in readings if r):
                red = _labelled(plain_name, plain, lookup)
                if red != plain:
                    value = quote(red, safe=_VALUE_SAFE)
                    break
        pieces.append(new_name + eq + value)
    return "&".join(pieces)


def redact_url(url: str, lookup: Lookup) -> str:
    """`url` as it may be stored: no credentials, PII and secrets in its host, path, query and fragment redacted
    (`lookup` redacts one text)."""
    try:
        parts = urlsplit(url)
    except ValueError:  # an unclosed IPv6 bracket: the whole string as text
        return lookup(url)
    netloc = _decoded_part(without_credentials(parts.netloc), lookup, ":[]<>") if parts.netloc else parts.netloc
    path = _decoded_part(parts.path, lookup, _PATH_SAFE)
    query = _params(parts.query, lookup) if parts.query else parts.query
    fragment = parts.fragment and (_params(parts.fragment, lookup) if "=" in parts.fragment  # "#access_token=..."
                                   else _decoded_part(parts.fragment, lookup, _PATH_SAFE))
    if (netloc, path, query, fragment) == (parts.netloc, parts.path, parts.query, parts.fragment):
        return url
    return urlunsplit((parts.scheme, netloc, path, query, fragment))


def _whole(value: Any) -> bool:
    """An int, or a float holding one (JSON numbers, a pandas integer column with nulls): digits a number can hide."""
    return type(value) is int or (type(value) is float and value.is_integer())


def redact_meta(value: Any, lookup: Lookup, name: str = "") -> Any:
    """A document's meta (any JSON value) as it may be stored: every string redacted, keys too, and every whole
    number (an int, or a float such as 14155552671.0) of 7 or more digits read as its digits after its name
    ("contact: 14155552671"), left a number unless one was found."""
    if isinstance(value, dict):
        return {_labelled("", str(k), lookup): redact_meta(v, lookup, str(k)) for k, v in value.items()}
    if isinstance(value, list):
        return [redact_meta(v, lookup, name) for v in value]
    if isinstance(value, (str, int, float)) and not isinstance(value, bool) and value != "" and \
            (kind := named_pii(name)) is not None:
        return PLACEHOLDERS[kind]
    if isinstance(value, str):
        return redact_url(value, lookup) if _URL.fullmatch(value) else _labelled(name, value, lookup)
    if _whole(value) and abs(value) >= _MIN_NUMBER:  # a phone number (or a card) kept as a number
        digits = str(int(value))
        red = _labelled(name, digits, lookup)
        return value if red == digits else red
    return value


def _redacted(doc: Document, lookup: Lookup) -> tuple[str | None, dict]:
    return (redact_url(doc.url, lookup) if doc.url else doc.url), redact_meta(doc.meta, lookup)


def redact_fields(docs: Sequence[Document], redact_texts: BatchRedactor) -> Counter:
    """Every document's `url` and `meta` redacted in place, with one call of `redact_texts` for all the distinct
    strings of the batch. A first pass collects them (and already drops credentials and named values); only a
    document with a string the redactor changed is passed again. Returns the placeholders written, by PII type (a
    value found by its name counts as one found by its shape)."""
    asked: dict[str, None] = {}
    first = []
    for doc in docs:
        mine: list[str] = []

        def collect(text: str) -> str:
            mine.append(text)
            asked[text] = None
            return text

        first.append((*_redacted(doc, collect), mine))
    texts = list(asked)
    done = dict(zip(texts, redact_texts(texts))) if texts else {}

    def look(text: str) -> str:  # a text the first pass did not ask for (a name that held PII): on its own
        return done[text] if text in done else redact_texts([text])[0]

    written: Counter = Counter()
    for doc, (url, meta, mine) in zip(docs, first):
        redacted = _redacted(doc, look) if any(done[t] != t for t in mine) else (url, meta)
        if redacted != (doc.url, doc.meta):
            written.update(_placeholders(*redacted) - _placeholders(doc.url, doc.meta))
        doc.url, doc.meta = redacted
    return written


def _placeholders(url: str | None, meta: Any) -> Counter:
    """The placeholders in a document's url (percent-encoded there, in a path) and meta, by PII type."""
    fields = unquote(url or "") + "\n" + json.dumps(meta, ensure_ascii=False)
    return Counter({kind: n for kind, placeholder in PLACEHOLDERS.items() if (n := fields.count(placeholder))})


def step_redactor(step: PiiRedaction) -> BatchRedactor:
    """The `pii` step's redaction (its types, exemptions and regions) as a batch of texts."""
    return lambda texts: [v.text for v in step.batch([Document("", "", t) for t in texts])]


def text_lookup(step: PiiRedaction | None = None) -> Lookup:
    """One text at a time through `step` (the default `pii` step if None)."""
    redact = step_redactor(step or PiiRedaction())
    return lambda text: redact([text])[0]
