"""PII redaction: personal data and secrets become fixed, typed placeholders.

E-mail addresses, phone numbers, IPv4/IPv6 addresses, US social security numbers, payment card numbers
and credentials are replaced by `<EMAIL>`, `<PHONE>`, `<IPV4>`, `<IPV6>`, `<US_SSN>`,
`<CREDIT_CARD>` and `<SECRET>` (DataTrove's PIIFormatter, BigCode's StarCoder PII pass and Dolma do
the same). Typed placeholders keep the text readable and let the model learn "an address goes here"
without memorising anyone's address.

Precision matters as much as recall: this runs over code and technical prose, full of version numbers,
dates, ids, hashes and `a::b`. So every number type has strict boundaries (never a slice of a longer
number), and the ambiguous ones are validated: card numbers by Luhn and issuer prefix, SSNs by the SSA
rules, IP addresses by octet range and `ipaddress`, generic secrets by length and entropy.

`find_pii` returns non-overlapping spans; `redact` replaces them. Placeholders contain no digits, '@'
or ':' and are never matched again, and `redact` runs to a fixed point, so it is idempotent.
"""

from __future__ import annotations

import bisect
import ipaddress
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import pyarrow.compute as pc

from kiln.documents import Document
from kiln.filters.base import Verdict, keep
from kiln.filters.text_stats import arrow_texts

PII_TYPES: tuple[str, ...] = ("email", "phone", "ipv4", "ipv6", "us_ssn", "credit_card", "secret")
PLACEHOLDERS: dict[str, str] = {t: f"<{t.upper()}>" for t in PII_TYPES}

# Addresses that identify no one and appear in every networking tutorial.
DEFAULT_IPV4_KEEP: frozenset[str] = frozenset({"127.0.0.1", "0.0.0.0", "255.255.255.255"})

# When detections overlap, the earlier type here wins: a key inside a PEM block is one secret, the
# IPv4 tail of `::ffff:10.0.0.1` belongs to the IPv6 address, digits in an e-mail's local part are
# the e-mail. Within a type the earlier, then longer, match wins.
_PRIORITY = ("secret", "email", "ipv6", "ipv4", "credit_card", "us_ssn", "phone")


@dataclass(frozen=True)
class PiiMatch:
    type: str
    start: int
    end: int


# Speed: Python's `re` jumps quickly to candidate positions only when a pattern starts with a literal
# or a character class; a leading look-behind means a full match attempt at every position (~8x
# slower over a whole corpus). So patterns consume their first character and then look behind it.
#
# Number boundaries: a match never starts or ends inside a longer token. `\w` stops "x555-123-4567"
# and a card inside a longer digit run; a digit joined by '.' or '-' stops the middle of
# "12-555-123-4567" or "555-123-4567-89" (order and part numbers).
_LEAD = r"[0-9](?<!\w[0-9])(?<![0-9][.-][0-9])"  # first digit of a number that starts a token
_NUM_R = r"(?!\w)(?![.-][0-9])"
_ANY_DIGIT = re.compile(r"[0-9]")


# --- email --------------------------------------------------------------------------------------
# local@domain.tld with a TLD of 2+ letters: `@decorator`, `user@localhost` and `pip install pkg@1.2`
# are not addresses. Retina image names (`icon@2x.png`) and SSH remotes (`git@github.com:user/repo`)
# are excluded explicitly. Matching starts only at '@' signs (rare, found with str.find) and walks
# back over the local part, at most 64 characters (RFC 5321).
_EMAIL = re.compile(
    r"(?<![\w%+-])"
    r"[\w%+-]+(?:\.[\w%+-]+)*"
    r"@(?![0-9]+(?:\.[0-9]+)?x\.(?:png|jpe?g|gif|webp|svg|ico|bmp|avif)(?![\w-]))"
    r"(?:[^\W_][\w-]{0,62}\.)+"
    r"[^\W\d_]{2,63}(?![\w-])(?!:[\w~/])"
)
_LOCAL = frozenset("_%+-")  # local-part characters besides letters, digits and single dots


def _is_local(c: str) -> bool:
    return c.isalnum() or c in _LOCAL


def _find_email(text: str) -> Iterator[tuple[int, int]]:
    at = text.find("@")
    while at != -1:
        # Back to the start of the local part: word characters, and dots only between two of them
        # (so "see...bob@x.org" starts at "bob"). _EMAIL's look-behind rejects a run longer than 64.
        start = at
        while start > 0 and at - start <= 64 and (
            _is_local(text[start - 1])
            or (text[start - 1] == "." and start < at and start >= 2 and _is_local(text[start - 2]))
        ):
            start -= 1
        m = _EMAIL.match(text, start)
        if m is not None:
            yield m.span()
        at = text.find("@", m.end() if m is not None else at + 1)


# --- phone --------------------------------------------------------------------------------------
# Only shapes that are unmistakably phone numbers: a bare 10-digit run is as likely an order id or a
# timestamp, and national formats without a country code (020 7946 0958) look like any number list.
#
# North American: (555) 123-4567, 555-123-4567, 555.123.4567 (one separator throughout), optionally
# after a leading 1. Area codes never start with 0 or 1, which also keeps "123-456-7890" counters out.
# The first character is consumed, then the branches look behind at what it was: '(' , an area
# code's first digit, or a leading '1'.
_PHONE_NANP = re.compile(
    r"[(0-9](?<![\w+][(0-9])(?<![0-9][.-][(0-9])"
    r"(?:(?:(?<=\()|(?<=1)[ .-]?\()[2-9][0-9]{2}\) ?[0-9]{3}[.-][0-9]{4}"
    r"|(?:(?<=[2-9])|(?<=1)[ .-]?[2-9])[0-9]{2}(?P<sep>[.-])[0-9]{3}(?P=sep)[0-9]{4})" + _NUM_R
)
# International: +CC then digit groups split by single spaces, dots or dashes, optionally with a
# parenthesised area/trunk code: +44 20 7946 0958, +44 (0)20 7946 0958, +1-555-123-4567,
# +7 (495) 123-45-67, or unseparated +8613812345678. Each group is a maximal digit run ended by a
# separator, so there is no ambiguous split to backtrack over.
_PHONE_INTL = re.compile(
    r"\+(?<![\w+]\+)[1-9](?:"
    r"[0-9]{7,14}"
    r"|[0-9]{0,2}(?:[ .-]?\([0-9]{1,4}\)[ .-]?[0-9]{1,5}|[ .-][0-9]{1,5})(?:[ .-][0-9]{1,5}){1,4}"
    r")" + _NUM_R
)
_PHONE_SEPS = re.compile(r"[ .-]")


def _intl_phone_ok(s: str) -> bool:
    # E.164 allows at most 15 digits; fewer than 8 is a score or a formula ("+1 2 3 4"). Dots mixed with
    # spaces or dashes are decimals ("+3.14 2.71"), not a phone number.
    digits = sum(c.isdigit() for c in s)
    seps = set(_PHONE_SEPS.findall(s))
    return 8 <= digits <= 15 and not ("." in seps and len(seps) > 1)


def _find_phone(text: str) -> Iterator[tuple[int, int]]:
    for m in _PHONE_NANP.finditer(text):
        yield m.span()
    for m in _PHONE_INTL.finditer(text):
        if _intl_phone_ok(m.group()):
            yield m.span()


# --- ipv4 ---------------------------------------------------------------------------------------
# Four dotted numbers, each 0-255 without leading zeros. More parts or a letter or '.' attached mean
# a version, section or OID ("1.2.3.4.5", "v1.2.3.4", "11.2.0.4.v3", "#id.3.1.3.2"), as does a
# preceding "version"/"section"/"Identifier(" word or a version specifier (">=3.10.0.2"). Netmasks
# and hostmasks (255.255.255.0, 0.0.0.255) identify no one. Otherwise a four-part number IS
# indistinguishable from an address ("Python 3.11.7.1" included) and is redacted.
_IPV4 = re.compile(r"[0-9](?<![\w.][0-9])[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?!\w)(?!\.\w)")
_NOT_AN_ADDRESS_BEFORE = re.compile(
    r"(?i)(?:(?:version\w*|identifier|(?<![a-z])(?:ver|rev|release|build|section|sec|chapter|rfc|oid|§))"
    r"s?\.?\W{0,4}|[<>!~=]=\s*)$"
)


# Ranges reserved for documentation and examples (RFC 5737, RFC 3849): they identify no one, and
# redacting them would break the code samples and docs that use them on purpose.
DOCUMENTATION_NETWORKS = tuple(ipaddress.ip_network(n) for n in (
    "192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))


def _documentation(addr: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    return any(addr in net for net in DOCUMENTATION_NETWORKS if net.version == addr.version)


def _is_mask(n: int, bits: int) -> bool:
    """0...01...1 or 1...10...0: a netmask or hostmask, not an address."""
    inverse = n ^ ((1 << bits) - 1)
    return (n & (n + 1)) == 0 or (inverse & (inverse + 1)) == 0


def _ipv4_ok(s: str, keep_documentation: bool = True) -> bool:
    octets = s.split(".")
    if any(int(o) > 255 or (o[0] == "0" and o != "0") for o in octets):
        return False
    addr = ipaddress.IPv4Address(s)
    return not _is_mask(int(addr), 32) and not (keep_documentation and _documentation(addr))


def _find_ipv4(text: str, keep: frozenset[str], keep_documentation: bool) -> Iterator[tuple[int, int]]:
    for m in _IPV4.finditer(text):
        if m.group() in keep or not _ipv4_ok(m.group(), keep_documentation):
            continue
        if _NOT_AN_ADDRESS_BEFORE.search(text, max(0, m.start() - 24), m.start()):
            continue
        yield m.span()


# --- ipv6 ---------------------------------------------------------------------------------------
# Every address has two colons at most 4 hex digits apart: find those (rare outside addresses and
# `::` scopes), step back over the first group, match a candidate of hex digits and colons (optional
# dotted-quad tail), and let `ipaddress` decide. That rejects times (12:30:45), MAC addresses and
# slices. `::` and `::1` identify no one. A compressed form with a single group, fewer than 4 hex
# digits or no decimal digit at all ("a[::1000]", "2001::/32", "a::b", "dead::beef") is far more often
# a slice, a prefix or a C++/Rust scope than an address; a full 8-group form is always an address.
_IPV6_GATE = re.compile(r":[0-9A-Fa-f]{0,4}:")
_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f:]{2,45}(?:\.[0-9]{1,3}){0,3}(?![\w:])(?!\.[0-9])")
_HEX = frozenset("0123456789abcdefABCDEF")


def _ipv6_ok(s: str, keep_documentation: bool = True) -> bool:
    if "::" in s and (
        sum(1 for g in s.split(":") if g) < 2
        or sum(c in _HEX for c in s) < 4
        or not any(c.isdigit() for c in s)
    ):
        return False
    try:
        addr = ipaddress.IPv6Address(s)
    except ValueError:
        return False
    return not (addr.is_unspecified or addr.is_loopback or _is_mask(int(addr), 128)
                or (keep_documentation and _documentation(addr)))


def _find_ipv6(text: str, keep_documentation: bool) -> Iterator[tuple[int, int]]:
    pos = 0
    while (g := _IPV6_GATE.search(text, pos)) is not None:
        start = g.start()
        while start > 0 and g.start() - start < 4 and text[start - 1] in _HEX:
            start -= 1
        m = _IPV6.match(text, start)
        if m is not None and _ipv6_ok(m.group(), keep_documentation):
            yield m.span()
            pos = m.end()
        else:
            pos = g.start() + 1


# --- us_ssn -------------------------------------------------------------------------------------
# AAA-GG-SSSS minus what the SSA never issues: area 000, 666 or 900-999, group 00, serial 0000.
# Dashes only: a bare 9-digit run or "123 45 6789" is more often something else.
_SSN = re.compile(
    _LEAD + r"[0-9]{2}(?<!000)(?<!666)(?<!9[0-9]{2})-[0-9]{2}(?<!-00)-[0-9]{4}(?<!0000)" + _NUM_R
)


def _find_ssn(text: str) -> Iterator[tuple[int, int]]:
    if "-" in text:
        for m in _SSN.finditer(text):
            yield m.span()


# --- credit_card --------------------------------------------------------------------------------
# 13-19 digits, unseparated or in groups (4-4-4-4, 4-6-5, ...) split by one consistent space or dash.
# Long digit runs are everywhere (ids, timestamps, ISBNs), so a candidate must also pass the Luhn
# checksum every issued card carries (rejects 90% of random runs) and start with a prefix that a card
# network actually issues, at a length that network uses.
_CARD = re.compile(
    _LEAD + r"(?:[0-9]{12,18}|[0-9]{3}(?P<sep>[ -])[0-9]{4,6}(?:(?P=sep)[0-9]{1,6}){1,3})" + _NUM_R
)
_R16_19 = (16, 17, 18, 19)
_R14_19 = (14, 15, 16, 17, 18, 19)
_R13_19 = (13, 14, 15, 16, 17, 18, 19)
# (lowest prefix, highest prefix, lengths), prefixes compared as equal-length digit strings.
_CARD_IIN: tuple[tuple[str, str, tuple[int, ...]], ...] = (
    ("4", "4", (13, 16, 19)),  # Visa
    ("51", "55", (16,)),  # Mastercard
    ("2221", "2720", (16,)),  # Mastercard 2-series
    ("34", "34", (15,)),  # American Express
    ("37", "37", (15,)),
    ("6011", "6011", _R16_19),  # Discover
    ("644", "649", _R16_19),
    ("65", "65", _R16_19),
    ("62", "62", _R16_19),  # UnionPay (includes Discover's 622126-622925)
    ("3528", "3589", _R16_19),  # JCB
    ("300", "305", _R14_19),  # Diners Club
    ("36", "36", _R14_19),
    ("38", "39", _R14_19),
    ("2200", "2204", _R16_19),  # Mir
    ("5018", "5018", _R13_19),  # Maestro
    ("5020", "5020", _R13_19),
    ("5038", "5038", _R13_19),
    ("5893", "5893", _R13_19),
    ("6304", "6304", _R13_19),
    ("6759", "6759", _R13_19),
    ("6761", "6763", _R13_19),
)


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_ok(digits: str) -> bool:
    if digits.endswith("0000"):  # round numbers are amounts and powers; 1 in 10,000 real cards
        return False
    n = len(digits)
    for low, high, lengths in _CARD_IIN:
        if n in lengths and low <= digits[: len(low)] <= high:
            return _luhn_ok(digits)
    return False


def _find_card(text: str) -> Iterator[tuple[int, int]]:
    pos = 0
    while (m := _CARD.search(text, pos)) is not None:
        groups = m.group().replace("-", " ").split(" ")
        # A space-grouped card may be followed by more numbers ("4111 1111 1111 1111 123" with a CVV):
        # try dropping trailing groups. Dash groups are one token, so all or nothing.
        shortest = 1 if m.group("sep") == " " else len(groups)
        end = None
        for k in range(len(groups), shortest - 1, -1):
            digits = "".join(groups[:k])
            if len(digits) < 13:
                break
            if _card_ok(digits):
                end = m.start() + len(" ".join(groups[:k]))
                break
        if end is not None:
            yield m.start(), end
            pos = end
        else:
            pos = m.start() + len(groups[0]) + 1  # a card may still start at the next group


# --- secret -------------------------------------------------------------------------------------
# Credentials with a recognisable shape are redacted wherever they occur; a generic
# `password = "..."` assignment only when the value is long and random-looking, and then only the
# value (the key name is harmless and keeps code readable).

# PEM private keys: BEGIN line, optional RFC 1421 headers (Proc-Type, DEK-Info), base64 lines, END
# line, replaced whole. Lines may be broken by real newlines or by "\n" escapes (keys pasted into
# string literals). At least one base64 line is required, so code and docs that only name the
# markers stay. A block cut off before its END line (truncated documents) loses what it has.
_PEM_NL = r"(?:(?:\r?\n|(?:\\r)?\\n)[ \t]*)+"
_PEM = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----[ \t]*"
    r"(?:" + _PEM_NL + r"[A-Za-z-]+:[^\r\n\\]*)*"
    r"(?:" + _PEM_NL + r"[A-Za-z0-9+/=]+[ \t]*)+"
    r"(?:" + _PEM_NL + r"-----END \1-----)?"
)
# AWS access key ids (long-term AKIA, temporary ASIA).
_AWS_KEY_ID = re.compile(r"A(?<![A-Za-z0-9]A)(?:KIA|SIA)[A-Z0-9]{16}(?![A-Za-z0-9])")
# GitHub (classic ghp_/gho_/ghu_/ghs_/ghr_, fine-grained github_pat_) and Slack tokens. Slack ones must
# contain a digit so documentation placeholders like "xoxb-your-token-here" stay.
_GITHUB_PREFIXES = ("ghp_", "gho_", "ghu_", "ghs_", "ghr_", "github_pat_")
_GITHUB_TOKEN = re.compile(
    r"(?:gh[pousr]_(?<![A-Za-z0-9_]gh._)[A-Za-z0-9]{36,251}"
    r"|github_pat_(?<![A-Za-z0-9_]github_pat_)[A-Za-z0-9_]{22,251})(?![A-Za-z0-9_-])"
)
_SLACK_TOKEN = re.compile(
    r"xox[abpr]-(?<![A-Za-z0-9_]xox.-)(?=[A-Za-z-]{0,250}[0-9])[A-Za-z0-9-]{10,250}(?![A-Za-z0-9_-])"
)
# Assignments `key = "value"`, `"key": "value"`, `key => 'value'`, and unquoted `KEY=value` lines as in
# .env, YAML or INI files and URL queries (`?token=...&`). Unquoted values must end the line (or the
# query parameter) so code like `token = self.get_token(...)` or `key: SomeTypeName,` stays. The key
# name must END in a credential word, in any case and with any prefix (dbPassword, GITHUB_TOKEN,
# client_secret, SECRET_KEY, aws_secret_access_key): "tokenizer_name" and "password_hint" are not.
# Keywords are found in an ASCII-lowercased copy (a case-insensitive alternation would be tried at
# every position), the rest is matched on the original text right after each keyword.
_SECRET_KEYWORD = re.compile(
    r"api[_-]?key|access[_-]?key|private[_-]?key|secret|token|passw(?:or)?d|pwd|credentials?"
)
_ASSIGNED_VALUE = re.compile(
    r"(?:[_-]?(?:access[_-]?)?[Kk][Ee][Yy]|[Ss])?"
    r"[\"']?\s*(?::=|=>|[:=])\s*"
    r"(?:(?P<q>[\"'`])(?P<qv>[^\s\"'`<>]{16,256}+)(?P=q)"  # possessive: never retry shorter values
    r"|(?P<v>[A-Za-z0-9+/=_~-]{16,256}+)(?=[ \t]*(?:[\r\n&]|\Z|\s#)))"
)
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _shannon_bits(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _assigned_secret_ok(v: str, aws: bool) -> bool:
    # Random-looking: letters AND digits, >= 3 bits of entropy per character. Not a URL, a path, an
    # environment/template reference. AWS secret keys (exactly 40 base64 characters) may lack digits.
    if "://" in v or v[0] in "/.~$%{" or not any(c.isalpha() for c in v):
        return False
    if not (any(c.isdigit() for c in v) or (aws and len(v) == 40)):
        return False
    return _shannon_bits(v) >= 3.0


def _find_secret(text: str) -> Iterator[tuple[int, int]]:
    if "PRIVATE KEY" in text:
        for m in _PEM.finditer(text):
            yield m.span()
    for m in _AWS_KEY_ID.finditer(text):
        yield m.span()
    if any(p in text for p in _GITHUB_PREFIXES):
        for m in _GITHUB_TOKEN.finditer(text):
            yield m.span()
    if "xox" in text:
        for m in _SLACK_TOKEN.finditer(text):
            yield m.span()
    lowered = text.lower()
    if len(lowered) != len(text):  # a few non-ASCII characters lowercase to two ("İ")
        lowered = text.translate(_ASCII_LOWER)
    for k in _SECRET_KEYWORD.finditer(lowered):
        m = _ASSIGNED_VALUE.match(text, k.end())
        if m is None:
            continue
        group = "qv" if m.group("qv") is not None else "v"
        aws = "aws" in lowered[max(0, k.start() - 4) : k.start()]
        if _assigned_secret_ok(m.group(group), aws):
            yield m.span(group)


# --- batch screens -------------------------------------------------------------------------------
# For each type, an RE2 pattern (pyarrow.compute: one linear-time C++ pass over a whole batch) that every
# text with a detection of that type matches: a substring every detected span contains. A type whose
# screen misses a text is not run on it (most texts need two or three detectors of seven, ~3x faster).
# Every screen is also unaffected by redaction: its substring holds no placeholder character ('<', '>',
# capitals and '_'), or for secrets is followed by an assignment a placeholder's '>' never is, so it
# holds on every pass of `redact`'s fixed point. Secret keywords are searched in a lowercased copy;
# RE2's (?i) folds the same letters (the Kelvin sign too).
SCREENS: dict[str, str] = {
    "secret": r"(?i)(?:api|access|private)[_-]?key|private key|secret|token|passw|pwd|credential"
              r"|akia|asia|gh[pousr]_|github_pat_|xox[abpr]-",
    "email": "@",
    "ipv6": r":[0-9A-Fa-f]{0,4}:",
    "ipv4": r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]",
    "credit_card": r"[0-9]{12}|[0-9]{3}[ -][0-9]{4}",
    "us_ssn": r"[0-9]{3}-[0-9]{2}-[0-9]{4}",
    "phone": r"[0-9]{3}[.-][0-9]{4}|\+[1-9](?:[0-9]{7}|[0-9]{0,2}[ .(-])",
}


def screen(texts: list[str], types: Iterable[str] = PII_TYPES) -> list[tuple[str, ...]]:
    """For each text, the types that may have a detection in it (a superset; the detectors decide)."""
    wanted = _check_types(types)
    if (array := arrow_texts(texts)) is None:
        return [wanted] * len(texts)
    hits = [pc.match_substring_regex(array, SCREENS[t]).to_pylist() for t in wanted]
    return [tuple(t for t, h in zip(wanted, row) if h) for row in zip(*hits)] if wanted else [()] * len(texts)


# --- API ----------------------------------------------------------------------------------------


def _check_types(types: Iterable[str]) -> tuple[str, ...]:
    wanted = (types,) if isinstance(types, str) else tuple(types)
    bad = [t for t in wanted if t not in PII_TYPES]
    if bad:
        raise ValueError(f"unknown PII type(s) {bad}; allowed: {', '.join(PII_TYPES)}")
    return wanted


def find_pii(
    text: str,
    types: Iterable[str] = PII_TYPES,
    ipv4_keep: Iterable[str] = DEFAULT_IPV4_KEEP,
    keep_documentation: bool = True,
) -> list[PiiMatch]:
    """Non-overlapping PII spans in `text`, sorted by start."""
    wanted = set(_check_types(types))
    has_digit = _ANY_DIGIT.search(text) is not None
    candidates: list[tuple[int, int, int, str]] = []  # (priority, start, end, type)
    for rank, kind in enumerate(_PRIORITY):
        if kind not in wanted:
            continue
        if kind == "secret":
            spans = _find_secret(text)
        elif kind == "email":
            spans = _find_email(text)
        elif kind == "ipv6":
            spans = _find_ipv6(text, keep_documentation)
        elif not has_digit:
            continue  # every remaining type is made of digits
        elif kind == "ipv4":
            spans = _find_ipv4(text, frozenset(ipv4_keep), keep_documentation)
        elif kind == "credit_card":
            spans = _find_card(text)
        elif kind == "us_ssn":
            spans = _find_ssn(text)
        else:
            spans = _find_phone(text)
        candidates.extend((rank, start, end, kind) for start, end in spans if end > start)

    candidates.sort(key=lambda c: (c[0], c[1], c[1] - c[2]))
    taken: list[tuple[int, int]] = []  # accepted (start, end), sorted, disjoint
    matches: list[PiiMatch] = []
    for _, start, end, kind in candidates:
        i = bisect.bisect_left(taken, (start, end))
        if (i > 0 and taken[i - 1][1] > start) or (i < len(taken) and taken[i][0] < end):
            continue
        taken.insert(i, (start, end))
        matches.append(PiiMatch(kind, start, end))
    matches.sort(key=lambda m: m.start)
    return matches


def redact(
    text: str,
    types: Iterable[str] = PII_TYPES,
    ipv4_keep: Iterable[str] = DEFAULT_IPV4_KEEP,
    keep_documentation: bool = True,
) -> tuple[str, dict[str, int]]:
    """`text` with every PII span replaced by its type's placeholder, and how many of each (nonzero).

    Runs to a fixed point: replacing a match can expose a neighbour that was rejected only because of
    the characters it touched ("555.123.4567+1-555-123-4567": the second number's '+' followed a
    digit), so the output never has a detectable span left and redact(redact(x)) == redact(x). Each
    pass replaces characters outside placeholders and no detector matches inside a placeholder, so
    this ends; a second pass only runs on text that had PII.
    """
    counts: Counter[str] = Counter()
    while matches := find_pii(text, types, ipv4_keep, keep_documentation):
        parts: list[str] = []
        pos = 0
        for m in matches:
            parts.append(text[pos : m.start])
            parts.append(PLACEHOLDERS[m.type])
            pos = m.end
        parts.append(text[pos:])
        text = "".join(parts)
        counts.update(m.type for m in matches)
    return text, dict(counts)


@dataclass
class PiiRedaction:
    """Curation step: replace PII with typed placeholders. Never drops; counts say what was replaced."""

    name: ClassVar[str] = "pii"
    types: list[str] = field(default_factory=lambda: list(PII_TYPES))
    ipv4_keep: list[str] = field(default_factory=lambda: sorted(DEFAULT_IPV4_KEEP))
    keep_documentation: bool = True  # RFC 5737 / RFC 3849 example addresses are not PII

    def __post_init__(self) -> None:
        self.types = list(_check_types(self.types))
        for ip in self.ipv4_keep:
            try:
                ipaddress.IPv4Address(ip)
            except ValueError as e:
                raise ValueError(f"ipv4_keep: {ip!r} is not an IPv4 address") from e
        self._keep = frozenset(self.ipv4_keep)

    def find(self, text: str) -> list[PiiMatch]:
        """What this step would redact: the residual-PII check scans outputs with exactly these settings."""
        return find_pii(text, self.types, self._keep, self.keep_documentation)

    def __call__(self, doc: Document) -> Verdict:
        text, counts = redact(doc.text, self.types, self._keep, self.keep_documentation)
        return keep(text, **counts)

    def batch(self, docs: list[Document]) -> list[Verdict]:
        """The same verdicts as one call per document, with the detectors each text cannot trigger screened out."""
        verdicts = []
        for doc, types in zip(docs, screen([d.text for d in docs], self.types)):
            text, counts = redact(doc.text, types, self._keep, self.keep_documentation) if types else (doc.text, {})
            verdicts.append(keep(text, **counts))
        return verdicts
