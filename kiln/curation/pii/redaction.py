"""PII redaction: personal data and secrets become fixed, typed placeholders.

E-mail addresses, phone numbers, IPv4/IPv6 addresses, US social security numbers, payment card numbers,
IBANs and credentials are replaced by `<EMAIL>`, `<PHONE>`, `<IPV4>`, `<IPV6>`, `<US_SSN>`,
`<CREDIT_CARD>`, `<IBAN>` and `<SECRET>` (DataTrove's PIIFormatter, BigCode's StarCoder PII pass and
Dolma do the same). Typed placeholders keep the text readable and let the model learn "an address goes
here" without memorising anyone's address.

Precision matters as much as recall: this runs over code and technical prose, full of version numbers,
dates, ids, hashes and `a::b`. So every number type has strict boundaries (never a slice of a longer
number), and the ambiguous ones are validated: phone numbers by Google's libphonenumber (`phonenumbers`:
every country's numbering plan), card numbers by Luhn and issuer prefix, IBANs by the SWIFT registry's
lengths and mod 97, SSNs by the SSA rules, IP addresses by octet range and `ipaddress`, generic secrets
by length and entropy. Cheap regular expressions find candidates; the validators only see those.
Measured on tests/data/pii (bench/pii_bench.py) and, for precision on code, on the demo corpora.

`find_pii` returns non-overlapping spans; `redact` replaces them. Placeholders contain no digits, '@'
or ':' and are never matched again, and `redact` runs to a fixed point, so it is idempotent.
"""

from __future__ import annotations

import bisect
import ipaddress
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import ClassVar

import phonenumbers
import pyarrow.compute as pc

from kiln.curation.documents import Document
from kiln.curation.filters.base import Verdict, keep
from kiln.curation.filters.text_stats import arrow_texts
from kiln.curation.pii.base import PII_TYPES, PLACEHOLDERS, _check_types, detection_text, original_span
from kiln.curation.pii.contact import _PHONE_CUE_CJK, _PHONE_CUE_WORDS, DEFAULT_PHONE_REGIONS, _find_email, _find_phone
from kiln.curation.pii.financial import _find_card, _find_iban, _find_ssn
from kiln.curation.pii.network import DEFAULT_IPV4_KEEP, _find_ipv4, _find_ipv6
from kiln.curation.pii.secrets import KEY_QUALIFIERS, _find_secret

# When detections overlap, the earlier type here wins: a key inside a PEM block is one secret, the
# IPv4 tail of `::ffff:10.0.0.1` belongs to the IPv6 address, digits in an e-mail's local part are
# the e-mail, an IBAN's digit groups are not a card or a phone number. Within a type the earlier, then
# longer, match wins.
_PRIORITY = ("secret", "email", "ipv6", "ipv4", "iban", "credit_card", "us_ssn", "phone")


@dataclass(frozen=True)
class PiiMatch:
    type: str
    start: int
    end: int


_ANY_DIGIT = re.compile(r"[0-9]")


# --- batch screens -------------------------------------------------------------------------------
# For each type, an RE2 pattern (pyarrow.compute: one linear-time C++ pass over a whole batch) that every
# text with a detection of that type matches: a substring every detected span contains. A type whose
# screen misses a text is not run on it (most texts need two or three detectors of seven, ~3x faster).
# Every screen is also unaffected by redaction: its substring holds no placeholder character ('<', '>',
# capitals and '_'), or for secrets is followed by an assignment a placeholder's '>' never is, so it
# holds on every pass of `redact`'s fixed point. Secret keywords are searched in a lowercased copy;
# RE2's (?i) folds the same letters (the Kelvin sign too).
SCREENS: dict[str, str] = {
    "secret": r"(?i)(?:" + KEY_QUALIFIERS + r")[_-]?key"  # the credential keys the detector knows
              r"|private key|secret|token|passw|pwd|credential|akia|asia|gh[pousr]_|github_pat_|xox[abpr]-"
              # a name ending in "pass" or "passphrase" (DB_PASS, dbPass): only with its assignment (code says "pass")
              r"|pass(?:phrase)?(?:[_-]?(?:access[_-]?)?key|s)?[\"']?\]?\s*(?::=|=>|[:=,])",
    "email": "@|%40|%2540",
    "ipv6": r":[0-9A-Fa-f]{0,4}:",
    "ipv4": r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]",
    "credit_card": r"[0-9]{12}|[0-9]{3}[ -][0-9]{4}",
    "us_ssn": r"[0-9]{3}[ -][0-9]{2}[ -][0-9]{4}",
    "iban": r"(?:[A-Z]{2}|[A-Za-z][a-z])[0-9]{2}(?:[ -]?[A-Za-z0-9]{4}){2}",
    "phone": r"[0-9]{3}[.-][0-9]{4}|\+[1-9](?:[0-9]{5}|[0-9]{0,4}[ \x{a0}\x{202f}./()-])",
}
# Provider tokens, Slack webhooks, passwords in URLs and Authorization headers (the `tokens` part of _find_secret):
# few texts have one, so _find_secret skips that part where this does not match.
SECRET_TOKEN_SCREEN = (
    r"k_live_|whsec_|AIza|glpat-|npm_|pypi-AgEIcHlwaS5vcmc|hf_|SG\.[0-9A-Za-z_-]{22}\.|do[opr]_v1_|dapi[0-9a-f]"
    r"|shp(?:at|ca|pa|ss)_|sk-(?:ant-|proj-|svcacct-|admin-)|T3BlbkFJ|eyJ[0-9A-Za-z_-]{10,}\.eyJ|hooks\.slack\.com"
    r"|(?i:authorization)|://[^\s/@]*:[^\s/@]*@"
)
# National numbers (see _NATIONAL): a superset of the three ways one counts, each with the seven digits it
# needs - a cue on its line then the number (_PHONE_CUE), a header with a phone column, a trunk prefix or
# parenthesised area code, an e-mail address just before. Only texts it matches run the national detector:
# a looser screen lets most source code through ("0 1", "call" and a digit).
_D7 = r"[0-9](?:[ \x{a0}\x{202f}./()-]{0,2}[0-9]){6}"


def _re2(pattern: str) -> str:
    """A Python pattern's \\uXXXX escapes as RE2 writes them."""
    return re.sub(r"\\u([0-9a-fA-F]{4})", r"\\x{\1}", pattern)


# Two parts: a cue, a header or an e-mail address before (every national detector runs) / a number that starts
# as only a phone number does (only those candidates are looked at: a scan ~3x cheaper than every digit run's).
PHONE_CUE_SCREEN = "|".join((
    r"(?i:(?:^|[^a-z0-9\x{e0}-\x{ff}])(?:" + _re2(_PHONE_CUE_WORDS).replace("\\w", "[a-z0-9_\\x{e0}-\\x{ff}]")
    + r")(?:[^a-z]|$)[^\n]*)" + _D7,  # unbounded: a smaller automaton than {0,48}, and still a superset
    r"(?:" + _re2(_PHONE_CUE_CJK) + r")[^\n]*" + _D7,
    r"(?im:(?:^|[,;|\t])[ \t\"']*(?:phone\w*|tel|telephone|telefon\w*|mobile?|cell\w*|fax)[ \t\"']*(?:[,;|\t]|$))",
    r"@[^\s@]+[ \t]*[,;|]?[ \t]*\r?\n?[ \t]*\(?" + _D7,
    r"\|[ \t]*\(?" + _D7,  # a table cell
))
PHONE_TRUNK_SCREEN = (
    r"\b0[0-9](?:[ \x{a0}\x{202f}./()-]{0,2}[0-9]){5}"
    r"|\(0?[0-9]{1,5}(?:[ -][0-9]{1,4})?\)[ \x{a0}\x{202f}./-]{0,2}[0-9]|8 \([0-9]")
PHONE_NATIONAL_SCREEN = PHONE_CUE_SCREEN + "|" + PHONE_TRUNK_SCREEN


def screen(texts: list[str], types: Iterable[str] = PII_TYPES) -> list[tuple[str, ...]]:
    """For each text, the types that may have a detection in it (a superset; the detectors decide)."""
    return _screen(texts, types)[0]


# Simple screens that few texts match share one pass (a pass over a batch costs about the same, whatever the
# pattern); only the texts their union matches are screened again, one pattern at a time. (Not the phone cue
# screen: RE2 builds its automaton lazily, per call, and a union with it costs several passes on the small
# batches the filter stage gives a step.)
_RARE_SCREENS = ("ipv4", "us_ssn", "iban", "phone_trunk", "secret_tokens")


def _screen(texts: list[str], types: Iterable[str]) -> tuple[list[tuple[str, ...]], list[frozenset[str]]]:
    """`screen`, and for each text the parts of detectors it cannot trigger (find_pii's `_skip`)."""
    wanted = _check_types(types)
    if (array := arrow_texts([detection_text(t)[0] for t in texts])) is None:
        return [wanted] * len(texts), [frozenset()] * len(texts)
    patterns = {t: SCREENS[t] for t in wanted}
    if "phone" in wanted:
        patterns["phone_cue"] = PHONE_CUE_SCREEN
        patterns["phone_trunk"] = PHONE_TRUNK_SCREEN
    if "secret" in wanted:
        patterns["secret_tokens"] = SECRET_TOKEN_SCREEN
    rare = [t for t in _RARE_SCREENS if t in patterns]
    hit: dict[str, list[bool]] = {
        t: pc.match_substring_regex(array, p).to_pylist() for t, p in patterns.items() if t not in rare}
    if rare:
        union = pc.match_substring_regex(array, "|".join(f"(?:{patterns[t]})" for t in rare))
        where = [i for i, h in enumerate(union.to_pylist()) if h]
        sub = pc.filter(array, union) if where else None
        for t in rare:
            hit[t] = [False] * len(texts)
            for i, h in zip(where, pc.match_substring_regex(sub, patterns[t]).to_pylist() if where else ()):
                hit[t][i] = h
    none = [False] * len(texts)
    cue, trunk, tokens = hit.get("phone_cue", none), hit.get("phone_trunk", none), hit.get("secret_tokens", none)
    national = [c or t for c, t in zip(cue, trunk)]
    rows, skips = [], []
    for i in range(len(texts)):
        row = [t for t in wanted if hit[t][i]]
        skip = set()
        if "phone" in wanted and not national[i]:
            skip.add("phone_national")
        elif "phone" in wanted and not cue[i]:
            skip.add("phone_cued")  # no cue, header or e-mail address: only numbers that start as a phone's do
        if "phone" in row:
            pass
        elif national[i]:  # a national number is a phone detection whatever the '+' and NANP screen says
            row.append("phone")
            skip.add("phone_plus")
        if "secret" in wanted and not tokens[i]:
            skip.add("secret_tokens")
        if tokens[i] and "secret" not in row:
            row.append("secret")
        rows.append(tuple(t for t in wanted if t in row))
        skips.append(frozenset(skip))
    return rows, skips


# --- API ----------------------------------------------------------------------------------------


def find_pii(
    text: str,
    types: Iterable[str] = PII_TYPES,
    ipv4_keep: Iterable[str] = DEFAULT_IPV4_KEEP,
    keep_documentation: bool = True,
    phone_regions: Iterable[str] = DEFAULT_PHONE_REGIONS,
    _skip: frozenset[str] = frozenset(),
) -> list[PiiMatch]:
    """Non-overlapping PII spans in `text`, sorted by start. `phone_regions`: the countries a national-format
    number ("030 91456342", no country code) may be from; empty: only +CC and North American numbers.
    `_skip`: parts of detectors the batch screens ruled out for this text (internal). The detectors read the text
    with Unicode digits, full-width forms, spaces and dashes folded to ASCII and invisible format characters left out
    (`detection_text`); spans are the original text's."""
    wanted = set(_check_types(types))
    text, dropped = detection_text(text)
    has_digit = _ANY_DIGIT.search(text) is not None
    candidates: list[tuple[int, int, int, str]] = []  # (priority, start, end, type)
    for rank, kind in enumerate(_PRIORITY):
        if kind not in wanted:
            continue
        if kind == "secret":
            spans = _find_secret(text, "secret_tokens" not in _skip)
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
        elif kind == "iban":
            spans = _find_iban(text)
        else:
            spans = _find_phone(text, () if "phone_national" in _skip else tuple(phone_regions),
                                "phone_plus" not in _skip, "phone_cued" not in _skip)
        candidates.extend((rank, start, end, kind) for start, end in spans if end > start)

    candidates.sort(key=lambda c: (c[0], c[1], c[1] - c[2]))
    taken: list[tuple[int, int]] = []  # accepted (start, end), sorted, disjoint
    matches: list[PiiMatch] = []
    for _, start, end, kind in candidates:
        i = bisect.bisect_left(taken, (start, end))
        if (i > 0 and taken[i - 1][1] > start) or (i < len(taken) and taken[i][0] < end):
            continue
        taken.insert(i, (start, end))
        matches.append(PiiMatch(kind, *original_span(dropped, start, end)))
    matches.sort(key=lambda m: m.start)
    return matches


def redact(
    text: str,
    types: Iterable[str] = PII_TYPES,
    ipv4_keep: Iterable[str] = DEFAULT_IPV4_KEEP,
    keep_documentation: bool = True,
    phone_regions: Iterable[str] = DEFAULT_PHONE_REGIONS,
    _skip: frozenset[str] = frozenset(),
) -> tuple[str, dict[str, int]]:
    """`text` with every PII span replaced by its type's placeholder, and how many of each (nonzero).

    Runs to a fixed point: replacing a match can expose a neighbour that was rejected only because of
    the characters it touched ("555.123.4567+1-555-123-4567": the second number's '+' followed a
    digit), so the output never has a detectable span left and redact(redact(x)) == redact(x). Each
    pass replaces characters outside placeholders and no detector matches inside a placeholder, so
    this ends; a second pass only runs on text that had PII.
    """
    counts: Counter[str] = Counter()
    phone_regions = tuple(phone_regions)
    while matches := find_pii(text, types, ipv4_keep, keep_documentation, phone_regions, _skip):
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
    # Regions a labelled national-format number ("Tel. 030 91456342") may belong to; [] = +CC and NANP only.
    phone_regions: list[str] = field(default_factory=lambda: list(DEFAULT_PHONE_REGIONS))

    def __post_init__(self) -> None:
        self.types = list(_check_types(self.types))
        supported = phonenumbers.SUPPORTED_REGIONS
        bad = [r for r in self.phone_regions if r not in supported]
        if bad:
            raise ValueError(f"phone_regions: {bad} are not ISO 3166 regions libphonenumber knows (e.g. US, GB, DE)")
        self._regions = tuple(self.phone_regions)
        for ip in self.ipv4_keep:
            try:
                ipaddress.IPv4Address(ip)
            except ValueError as e:
                raise ValueError(f"ipv4_keep: {ip!r} is not an IPv4 address") from e
        self._keep = frozenset(self.ipv4_keep)

    def find(self, text: str) -> list[PiiMatch]:
        """What this step would redact: the residual-PII check scans outputs with exactly these settings."""
        return find_pii(text, self.types, self._keep, self.keep_documentation, self._regions)

    def __call__(self, doc: Document) -> Verdict:
        text, counts = redact(doc.text, self.types, self._keep, self.keep_documentation, self._regions)
        return keep(text, **counts)

    def batch(self, docs: list[Document]) -> list[Verdict]:
        """The same verdicts as one call per document, with the detectors each text cannot trigger screened out."""
        verdicts = []
        rows, skips = _screen([d.text for d in docs], self.types)
        for doc, types, skip in zip(docs, rows, skips):
            text, counts = (redact(doc.text, types, self._keep, self.keep_documentation, self._regions, skip)
                            if types else (doc.text, {}))
            verdicts.append(keep(text, **counts))
        return verdicts
