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
or ':' and are never matched again, so `redact` is idempotent.
"""

from __future__ import annotations

import bisect
import ipaddress
import math
import re
from collections import Counter
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from kiln.documents import Document

if TYPE_CHECKING:
    from kiln.filters.base import Verdict

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


# Shared number boundaries: a match never starts or ends inside a longer token. `\w` stops
# "x555-123-4567" and "4111...1111" inside a longer digit run; a digit joined by '.' or '-' stops the
# middle of "12-555-123-4567" or "555-123-4567-89" (order numbers, part numbers).
_NUM_L = r"(?<!\w)(?<![0-9][.-])"
_NUM_R = r"(?!\w)(?![.-][0-9])"
_ANY_DIGIT = re.compile(r"[0-9]")


# --- email --------------------------------------------------------------------------------------
# local@domain.tld with a TLD of 2+ letters: `@decorator`, `user@localhost` and `pip install pkg@1.2`
# are not addresses. The look-behind lets a match start only at the beginning of a run of local-part
# characters, so a long word is scanned once, not once per character. `icon@2x.png` (retina image
# names) and `git@github.com:user/repo` (an SSH remote, not a mailbox) are excluded explicitly.
_EMAIL = re.compile(
    r"(?<![\w.%+-])"
    r"[\w%+-]+(?:\.[\w%+-]+)*"
    r"@(?![0-9]+(?:\.[0-9]+)?x\.(?:png|jpe?g|gif|webp|svg|ico|bmp|avif)(?![\w-]))"
    r"(?:[^\W_][\w-]{0,62}\.)+"
    r"[^\W\d_]{2,63}(?![\w-])(?!:[\w~/])"
)


def _find_email(text: str) -> Iterator[tuple[int, int]]:
    if "@" in text:
        for m in _EMAIL.finditer(text):
            yield m.span()


# --- phone --------------------------------------------------------------------------------------
# Only shapes that are unmistakably phone numbers: a bare 10-digit run is as likely an order id or a
# timestamp, and national formats without a country code (020 7946 0958) look like any number list.
#
# North American: (555) 123-4567, 555-123-4567, 555.123.4567, optional leading 1. Area codes never
# start with 0 or 1, which also keeps "123-456-7890"-style counters out. One separator throughout.
_PHONE_NANP = re.compile(
    _NUM_L
    + r"(?<!\+)(?:1[ .-]?)?"
    + r"(?:\([2-9][0-9]{2}\) ?[0-9]{3}[.-][0-9]{4}"
    + r"|[2-9][0-9]{2}(?P<sep>[.-])[0-9]{3}(?P=sep)[0-9]{4})"
    + _NUM_R
)
# International: +CC then digit groups split by single spaces, dots or dashes, optionally with a
# parenthesised area/trunk code: +44 20 7946 0958, +44 (0)20 7946 0958, +1-555-123-4567,
# +7 (495) 123-45-67, or unseparated +8613812345678. Each group is a maximal digit run ended by a
# separator, so there is no ambiguous split to backtrack over.
_PHONE_INTL = re.compile(
    r"(?<![\w+])\+[1-9](?:"
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
    if "+" in text:
        for m in _PHONE_INTL.finditer(text):
            if _intl_phone_ok(m.group()):
                yield m.span()


# --- ipv4 ---------------------------------------------------------------------------------------
# Four dotted octets 0-255 without leading zeros. A fifth part or a letter attached means a version
# ("1.2.3.4.5", "v1.2.3.4"), as does a preceding "version"/"release"/"build" word. Otherwise a
# four-part number IS indistinguishable from an address and is redacted.
_OCTET = r"(?:25[0-5]|2[0-4][0-9]|1[0-9]{2}|[1-9]?[0-9])"
_IPV4 = re.compile(rf"(?<!\w)(?<![0-9]\.){_OCTET}(?:\.{_OCTET}){{3}}(?!\w)(?!\.[0-9])")
_VERSION_BEFORE = re.compile(r"(?i)\b(?:version|release|build|ver|rev)\.?\s*[:=#]?\s*$")


def _find_ipv4(text: str, keep: frozenset[str]) -> Iterator[tuple[int, int]]:
    for m in _IPV4.finditer(text):
        if m.group() in keep or _VERSION_BEFORE.search(text, max(0, m.start() - 16), m.start()):
            continue
        yield m.span()


# --- ipv6 ---------------------------------------------------------------------------------------
# A cheap candidate (2-7 colons between hex groups, optional dotted-quad tail), then `ipaddress`
# decides. That rejects times (12:30:45), MAC addresses and slices. `::` and `::1` identify no one.
# A compressed form with fewer than 4 hex digits or no decimal digit at all ("a::b", "dead::beef") is
# far more often a C++/Rust scope than an address; a full 8-group form is always an address.
_IPV6 = re.compile(
    r"(?<![\w:.])"
    r"[0-9A-Fa-f]{0,4}(?::(?:(?:[0-9]{1,3}\.){3}[0-9]{1,3}|[0-9A-Fa-f]{0,4})){2,7}"
    r"(?![\w:])(?!\.[0-9])"
)
_HEX = frozenset("0123456789abcdefABCDEF")


def _ipv6_ok(s: str) -> bool:
    try:
        addr = ipaddress.IPv6Address(s)
    except ValueError:
        return False
    if addr.is_unspecified or addr.is_loopback:
        return False
    if "::" in s:
        return sum(c in _HEX for c in s) >= 4 and any(c.isdigit() for c in s)
    return True


def _find_ipv6(text: str) -> Iterator[tuple[int, int]]:
    if ":" in text:
        for m in _IPV6.finditer(text):
            if _ipv6_ok(m.group()):
                yield m.span()


# --- us_ssn -------------------------------------------------------------------------------------
# AAA-GG-SSSS with the SSA's never-issued values excluded: area 000, 666 or 900-999, group 00, serial
# 0000. Dashes only: a bare 9-digit run or "123 45 6789" is more often something else.
_SSN = re.compile(_NUM_L + r"(?!000|666|9)[0-9]{3}-(?!00)[0-9]{2}-(?!0000)[0-9]{4}" + _NUM_R)


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
    _NUM_L
    + r"(?:[0-9]{13,19}|[0-9]{4}(?P<sep>[ -])[0-9]{4,6}(?:(?P=sep)[0-9]{1,6}){1,3})"
    + _NUM_R
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

# PEM private keys, whole block. A block cut off before its END line (truncated documents) loses its
# header and base64 body lines.
_PEM = re.compile(
    r"-----BEGIN ((?:[A-Z0-9]+ )*PRIVATE KEY(?: BLOCK)?)-----"
    r"(?:[\s\S]{0,20000}?-----END \1-----|(?:\r?\n[A-Za-z0-9+/=]{16,})*)"
)
# AWS access key ids (long-term AKIA, temporary ASIA).
_AWS_KEY_ID = re.compile(r"(?<![A-Za-z0-9])(?:AKIA|ASIA)[A-Z0-9]{16}(?![A-Za-z0-9])")
# AWS secret access keys have no prefix: only when assigned to a key that says what they are.
_AWS_SECRET = re.compile(
    r"(?i:aws[_-]?secret[_-]?(?:access[_-]?)?key)[\"']?\s*(?::=|=>|[:=])\s*[\"']?"
    r"(?P<v>[A-Za-z0-9/+=]{40})(?![A-Za-z0-9/+=])"
)
# GitHub (classic ghp_/gho_/ghu_/ghs_/ghr_, fine-grained github_pat_) and Slack tokens. Slack ones must
# contain a digit so documentation placeholders like "xoxb-your-token-here" stay.
_TOKEN = re.compile(
    r"(?<![A-Za-z0-9_])(?:"
    r"gh[pousr]_[A-Za-z0-9]{36,251}"
    r"|github_pat_[A-Za-z0-9_]{22,251}"
    r"|xox[abpr]-(?=[A-Za-z-]{0,250}[0-9])[A-Za-z0-9-]{10,250}"
    r")(?![A-Za-z0-9_-])"
)
# key = value where the key name ends in a credential word (camelCase or snake_case, any prefix:
# dbPassword, GITHUB_TOKEN, client_secret, SECRET_KEY). The key must END there: "tokenizer_name" and
# "password_hint" are not credentials.
_ASSIGNED = re.compile(
    r"(?i)(?:api[_-]?key|access[_-]?key|private[_-]?key|secret|token|passw(?:or)?d|pwd|credentials?)"
    r"(?:[_-]?(?:access[_-]?)?key|s)?"
    r"[\"']?\s*(?::=|=>|[:=])\s*"
    r"(?:(?P<q>[\"'`])(?P<qv>[^\s\"'`<>]{16,256})(?P=q)"
    r"|(?P<v>[A-Za-z0-9+/=_.~-]{16,256})(?![A-Za-z0-9+/=_.~-]))"
)


def _shannon_bits(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _assigned_secret_ok(v: str) -> bool:
    # Random-looking: letters AND digits, >= 3 bits of entropy per character. Not a URL, a path, an
    # environment/template reference or a dotted attribute chain.
    if "://" in v or v[0] in "/.~$%{" or not any(c.isdigit() for c in v) or not any(c.isalpha() for c in v):
        return False
    return _shannon_bits(v) >= 3.0


def _find_secret(text: str) -> Iterator[tuple[int, int]]:
    if "PRIVATE KEY" in text:
        for m in _PEM.finditer(text):
            yield m.span()
    if "AKIA" in text or "ASIA" in text:
        for m in _AWS_KEY_ID.finditer(text):
            yield m.span()
    if "gh" in text or "xox" in text:
        for m in _TOKEN.finditer(text):
            yield m.span()
    for m in _AWS_SECRET.finditer(text):
        yield m.span("v")
    for m in _ASSIGNED.finditer(text):
        group = "qv" if m.group("qv") is not None else "v"
        if _assigned_secret_ok(m.group(group)):
            yield m.span(group)


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
            spans = _find_ipv6(text)
        elif not has_digit:
            continue  # every remaining type is made of digits
        elif kind == "ipv4":
            spans = _find_ipv4(text, frozenset(ipv4_keep))
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
) -> tuple[str, dict[str, int]]:
    """`text` with every PII span replaced by its type's placeholder, and how many of each (nonzero)."""
    matches = find_pii(text, types, ipv4_keep)
    if not matches:
        return text, {}
    parts: list[str] = []
    pos = 0
    for m in matches:
        parts.append(text[pos : m.start])
        parts.append(PLACEHOLDERS[m.type])
        pos = m.end
    parts.append(text[pos:])
    return "".join(parts), dict(Counter(m.type for m in matches))


@dataclass
class PiiRedaction:
    """Curation step: replace PII with typed placeholders. Never drops; counts say what was replaced."""

    name: ClassVar[str] = "pii"
    types: list[str] = field(default_factory=lambda: list(PII_TYPES))
    ipv4_keep: list[str] = field(default_factory=lambda: sorted(DEFAULT_IPV4_KEEP))

    def __post_init__(self) -> None:
        self.types = list(_check_types(self.types))
        for ip in self.ipv4_keep:
            try:
                ipaddress.IPv4Address(ip)
            except ValueError as e:
                raise ValueError(f"ipv4_keep: {ip!r} is not an IPv4 address") from e
        self._keep = frozenset(self.ipv4_keep)

    def __call__(self, doc: Document) -> Verdict:
        # Imported here: `kiln.filters` registers this step, so a module-level import would be circular.
        from kiln.filters.base import keep

        text, counts = redact(doc.text, self.types, self._keep)
        return keep(text, **counts)
