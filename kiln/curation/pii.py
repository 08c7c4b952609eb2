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

import base64
import bisect
import ipaddress
import math
import re
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from functools import lru_cache, partial
from typing import ClassVar

import phonenumbers
import pyarrow.compute as pc
from phonenumbers.phonenumberutil import _choose_formatting_pattern_for_number  # pinned: constraints.txt

from kiln.curation.documents import Document
from kiln.curation.filters.base import Verdict, keep
from kiln.curation.filters.text_stats import arrow_texts

# libphonenumber compiles its metadata's patterns as it meets each region; `re` caches only 512, fewer than the
# metadata has, so a corpus of many countries would recompile them over and over. Keep every compiled one.
phonenumbers.re_util.enable_pattern_cache()

PII_TYPES: tuple[str, ...] = ("email", "phone", "ipv4", "ipv6", "us_ssn", "credit_card", "iban", "secret")
PLACEHOLDERS: dict[str, str] = {t: f"<{t.upper()}>" for t in PII_TYPES}

# Addresses that identify no one and appear in every networking tutorial.
DEFAULT_IPV4_KEEP: frozenset[str] = frozenset({"127.0.0.1", "0.0.0.0", "255.255.255.255"})

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
        if m is not None and not _in_url_userinfo(text, start):
            yield m.span()
        at = text.find("@", m.end() if m is not None else at + 1)


def _in_url_userinfo(text: str, start: int) -> bool:
    """Whether `start` follows "scheme://user:" in the same token: "https://oauth2:TOKEN@gitlab.com" holds a
    password (a secret), not an e-mail address."""
    if start == 0 or text[start - 1] != ":":
        return False
    scheme = text.rfind("://", max(0, start - 256), start)
    return scheme != -1 and not any(c.isspace() for c in text[scheme:start])


# --- phone --------------------------------------------------------------------------------------
# Three ways in, each a cheap regex that finds candidates; libphonenumber (`phonenumbers`, Google's
# metadata for every country's numbering plan) decides the international and national ones.
#
# North American: (555) 123-4567, 555-123-4567, 555.123.4567 (one separator throughout), optionally
# after a leading 1. Area codes never start with 0 or 1, which also keeps "123-456-7890" counters out.
# These shapes are unmistakable on their own and are not validated (555 numbers are fictional, and
# still what a document's author wrote as a phone number). A bare 10-digit run is as likely an order
# id or a timestamp and is not matched.
# The first character is consumed, then the branches look behind at what it was: '(' , an area
# code's first digit, or a leading '1'.
_PHONE_NANP = re.compile(
    r"[(0-9](?<![\w+][(0-9])(?<![0-9][.-][(0-9])"
    r"(?:(?:(?<=\()|(?<=1)[ .-]?\()[2-9][0-9]{2}\) ?[0-9]{3}[.-][0-9]{4}"
    r"|(?:(?<=[2-9])|(?<=1)[ .-]?[2-9])[0-9]{2}(?P<sep>[.-])[0-9]{3}(?P=sep)[0-9]{4})" + _NUM_R
)
# International: '+' (or "(+49)"), the country code, then digit groups of any length split by one
# space, no-break space, dot, dash or slash, with parenthesised area or trunk codes anywhere:
# +49 30 91456342, +44 7323 277460, +49 (0)89 1234 5678, +7 (495) 123-45-67, +8613812345678.
# Each group is a maximal digit run ended by a separator or '(', so there is no ambiguous split to
# backtrack over. A candidate is a phone number when libphonenumber says the number is valid in the
# country its code names (the right length and a range that is actually assigned), which rejects
# scores, formulas, dates, coordinates and timezone offsets that merely start with '+'. When the whole
# run is not valid, trailing space-separated groups are dropped one by one (a number followed by
# another number, "+44 20 7946 0958 3"); a run joined by '-' or '.' to more digits is one token and
# stays whole or nothing.
_PHONE_SEP = "[ \u00a0\u202f.\\-/]"
_PHONE_INTL = re.compile(
    r"\+(?<![\w+]\+)[1-9][0-9]*(?P<cc>\))?"
    r"(?:" + _PHONE_SEP + r"?\([0-9]{1,5}\)" + _PHONE_SEP + r"?[0-9]+|" + _PHONE_SEP + r"[0-9]+){0,8}"
)
# National formats (no country code: 030 91456342, 06 12 34 56 78, (021) 737 8957, 0459/45.66.33,
# 8 (925) 620-38-13, 090-7385-4464) are how most people write their number, and look like any list of
# numbers in code and tables. A national candidate counts when libphonenumber says it is a valid number of
# one of `phone_regions`, written the way that region writes it (its trunk prefix where the region's own
# format has one: "030 91456342" in DE, never "30 91456342"; CN mobiles and NANP numbers without), and
# either
#   - a phone cue precedes it: a label or a calling phrase on its line ("Tel.", "phone=", "Móvil:",
#     "TEL;TYPE=CELL:", "llámanos al", "appelez-nous au", "Bel ons op", "call me on", "電話", "联系电话",
#     "전화번호"...), a "phone" column in a CSV / table header above it, or an e-mail address right before
#     it (a contact or signature block): then any grouping, or none;
#   - or no cue, but it is grouped as that region groups its numbers (each written group is one or more of
#     libphonenumber's national format groups: "320 7629457" is 320|762 9457 in IT; or one of the region's
#     alternate formats), with at least one separator, it looks like a phone number on its own (it starts
#     with a trunk prefix or a parenthesised area code: 0..., (0..., 8 (...; or it is a whole cell of a table
#     row whose other cells are words: a contact list), and nothing before it on its line says it is
#     something else (an order, invoice, customer, case or part number, a postal code, an ISBN/EAN/IMEI...). Two groups joined by '-' or '/' must be a trunk-prefixed
#     area code and a subscriber number ("055-2235207"): otherwise they are a range, a fraction, an ISSN or
#     a ZIP+4 ("2045-2047", "3147/488", "2376-5992", "02111-1307").
# Every number of 16 or fewer digits is valid somewhere, so the trunk-prefix and grouping rules are what keep
# ids, part numbers and code out; dates, decimals, SSN shapes and ISBNs are rejected first.
# (The look-aheads ask for seven digits with at most two separator characters between neighbours: most numbers in
# code are shorter, and are dropped before any Python runs.)
_NATIONAL = re.compile(
    r"(?:\((?<![\w+(.]\()(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){7})0?[0-9]{1,5}\)"
    r"|[0-9](?<![\w+.(][0-9])(?<![0-9][.,/-][0-9])(?<![A-Za-z]-[0-9])(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){6})"
    r"[0-9]*)"
    r"(?:" + _PHONE_SEP + r"?\([0-9]{1,5}\)" + _PHONE_SEP + r"?[0-9]+|" + _PHONE_SEP + r"[0-9]+){0,8}"
)
# The candidates an uncued number can be (_TRUNK_START): the same runs as _NATIONAL finds, found from their start.
_NATIONAL_TRUNK = re.compile(
    r"(?:\((?<![\w+(.]\()(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){7})0?[0-9]{1,5}\)"
    r"|0(?<![\w+.(]0)(?<![0-9][.,/-]0)(?<![A-Za-z]-0)(?=[0-9])(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){6})[0-9]*"
    r"|8(?<![\w+.(]8)(?<![0-9][.,/-]8)(?<![A-Za-z]-8)(?= \([0-9])(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){6}))"
    r"(?:" + _PHONE_SEP + r"?\([0-9]{1,5}\)" + _PHONE_SEP + r"?[0-9]+|" + _PHONE_SEP + r"[0-9]+){0,8}"
)
# Cues, in a lowercased copy of the line before the number (at most _CUE_REACH characters before it).
_PHONE_CUE_WORDS = (
    r"tel|t\u00e9l|tlf|telf|telefon\w*|telephone|t\u00e9l\u00e9phone|tel\u00e9fono|telefone|telefoon|phone\w*|fax"
    r"|mobile?|mobil\w*|mobiel|m\u00f3vil|movil|cell|cellphone|cellular|cellulare|cel|celular|handy|gsm|portable"
    r"|whatsapp|sms|call(?:s|ed|ing)?|text (?:me|us)|reach|ring|bel|bellen|ll\u00e1m\w*|llam\w*|ligue|ligar|appel\w*"
    r"|joindre|chiam\w*|contact\w*|contatt\w*|kontakt\w*|dzwo\w*|zadzwo\w*|anruf\w*|rufen|erreichbar|emergency"
    r"|(?:al|au|am|op|p\u00e5|no|pod) (?:num[e\u00e9]ro|n\u00famero|nummer|numer|nr)"
    r"|\u0442\u0435\u043b\w*|\u0437\u0432\u043e\u043d\w*|\u043c\u043e\u0431\w*"  # тел, звон, моб
)
_PHONE_CUE_CJK = (  # 電話 电话 手机 手機 携帯 連絡 联系 聯絡 問い合わせ 전화 연락 휴대 문의
    r"\u96fb\u8a71|\u7535\u8bdd|\u624b\u673a|\u624b\u6a5f|\u643a\u5e2f|\u9023\u7d61|\u8054\u7cfb|\u806f\u7d61"
    r"|\u554f\u3044\u5408\u308f\u305b|\uc804\ud654|\uc5f0\ub77d|\ud734\ub300|\ubb38\uc758"
)
# Searched in a lowercased copy of the line before the number, led by a line start or the character before the
# window (so a cue is a whole word or a word's start: "phone=", "Telefonnummer", never "xtel").
_PHONE_CUE = re.compile(  # ("<" before: Kiln's own <PHONE> placeholder is no cue on redact's later passes)
    r"[^a-z0-9\u00e0-\u00ff<](?:" + _PHONE_CUE_WORDS + r")(?![a-z])|" + _PHONE_CUE_CJK
)
_CUE_REACH = 48
# A CSV, TSV or Markdown table header with a phone column, on a line above the number.
_PHONE_HEADER = re.compile(
    r"(?im)^[^\n]*(?:^|[,;|\t])[ \t\"']*(?:phone\w*|tel|telephone|telefon\w*|mobile?|cell\w*|fax)[ \t\"']*(?:[,;|\t]|$)"
)
_HEADER_REACH = 400
# Before an uncued number: words that say it is not a phone number.
_NOT_A_PHONE_BEFORE = re.compile(
    r"(?i)(?:(?:order|bestell|auftrag|commande|pedido|ordine|invoice|rechnung|factur|fattur|kunden|customer|client"
    r"|postleitzahl|account|konto|serial|tracking|aktenzeichen|artikel|versi[oó]n)\w*"
    r"|\b(?:sku|rma|case|ticket|zip|plz|postal|isbn|ean|gtin|upc|imei|iban|ssn|part|ref|pmid|doi|item|art|nr|no|id))"
    r"\b[^\n]{0,24}$"
)
# Where a national-format number may be from (the `pii` step's `phone_regions`): the largest economies and web
# languages. Each region makes more digit strings valid, so a longer list finds more and risks more; `+CC` numbers
# of every country are found whatever it holds.
DEFAULT_PHONE_REGIONS: tuple[str, ...] = (
    "US", "CA", "GB", "IE", "AU", "NZ", "IN", "SG", "ZA", "DE", "AT", "CH", "FR", "BE", "NL", "LU", "IT", "ES",
    "PT", "BR", "MX", "AR", "CL", "CO", "PL", "CZ", "SE", "NO", "DK", "FI", "RU", "UA", "TR", "JP", "KR", "CN",
    "HK", "TW", "IL", "AE",
)
_PHONE_SEPS = re.compile("[ \u00a0\u202f./-]")
_SPACES = frozenset(" \u00a0\u202f")
_SEPARATORS = frozenset(" \u00a0\u202f./-")


def _nanp_shape(n: phonenumbers.PhoneNumber) -> bool:
    """+1 (555) ...: the area code everyone writes in examples and forms. It is not a diallable area code, but
    what the writer meant is a phone number (as the North American rule reads "555-123-4567"); any other
    number libphonenumber calls invalid is not one ("+1 (215) 029-5856": no exchange starts with 0)."""
    return n.country_code == 1 and str(n.national_number).startswith("555") and len(str(n.national_number)) == 10


# A date written with one separator throughout is valid in some numbering plan or other ("2024-01-15",
# "15.01.2024"): never a phone number.
_DATE_LIKE = re.compile(r"[0-9]{4}([./-])[0-9]{1,2}\1[0-9]{1,2}|[0-9]{1,2}([./-])[0-9]{1,2}\2(?:[0-9]{2}|[0-9]{4})")
# A run that starts with a full date is a date and a time or a counter ("2024-03-15 14:22:05").
_DATE_START = re.compile(
    r"(?:(?:19|20)[0-9]{2}([./-])(?:0?[1-9]|1[0-2])\1(?:0?[1-9]|[12][0-9]|3[01])"
    r"|(?:0?[1-9]|[12][0-9]|3[01])([./-])(?:0?[1-9]|1[0-2])\2(?:19|20)[0-9]{2})(?![0-9])")
# AAA-GG-SSSS is a US social security number's shape, and the us_ssn detector's to decide (SSA rules); as a
# labelled national number it would be valid somewhere ("call me at 666-12-3456": a Spanish mobile).
_SSN_SHAPE = re.compile(r"[0-9]{3}[- ][0-9]{2}[- ][0-9]{4,5}")
_NON_DIGITS = re.compile(r"[^0-9]+")


def _shape_ok(s: str) -> bool:
    # Dots mixed with other separators, or a single one, are decimals ("+3.14 2.71", "+35236450.6"), never a
    # phone number (dotted ones use dots throughout: +33.1.23.45.67.89). E.164 allows at most 15 digits (a
    # national trunk "0" makes 16 and an international "00" prefix 17).
    seps = set(_PHONE_SEPS.findall(s))
    if "." in seps and (len(seps - {".", "/"}) > 0 or (s.count(".") == 1 and "/" not in seps)):
        return False
    if _DATE_LIKE.fullmatch(s.lstrip("+")) or _DATE_START.match(s.lstrip("+(")):
        return False
    if seps == {"."} and s.count(".") == 3 and all(len(g) <= 3 for g in s.lstrip("+").split(".")):
        return False  # an IPv4 address, a version or an OID's shape ("0.10.256.0"), not a phone number
    return 6 <= sum(c.isdigit() for c in s) <= 17


def _international_ok(s: str) -> bool:
    """+CC...: valid in the country its code names, or a North American number (fictional 555s included)."""
    if not _shape_ok(s):
        return False
    try:
        n = phonenumbers.parse(s, None)
    except phonenumbers.NumberParseException:
        return False
    return n.extension is None and (phonenumbers.is_valid_number(n) or _nanp_shape(n))


@lru_cache(maxsize=8)
def _region_table(regions: tuple[str, ...]) -> tuple[tuple[str, str, re.Pattern], ...]:
    """(region, trunk prefix, its numbers' general pattern): a cheap test before libphonenumber's own."""
    out = []
    for region in regions:
        md = phonenumbers.PhoneMetadata.metadata_for_region(region)
        if md is None or md.general_desc is None or md.general_desc.national_number_pattern is None:
            continue
        out.append((region, md.national_prefix or "", re.compile(md.general_desc.national_number_pattern)))
    return tuple(out)


def _isbn_like(digits: str, written: list[str]) -> bool:
    """An ISBN-13 (978/979 and the EAN check digit), or an ISBN-10 written in its four groups with a one-digit
    check group last (0-306-40615-2) and a valid mod-11 check (which 1 in 11 ten-digit numbers pass by chance,
    hence the shape)."""
    if len(digits) == 13 and digits[:3] in ("978", "979"):
        return sum(int(d) * (3 if i % 2 else 1) for i, d in enumerate(digits)) % 10 == 0
    if len(digits) == 10 and len(written) == 4 and len(written[-1]) == 1:
        return sum(int(d) * (10 - i) for i, d in enumerate(digits)) % 11 == 0
    return False


def _grouped_as_formatted(written: list[str], formatted: list[str]) -> bool:
    """Each written group is one or more consecutive groups of the region's own format."""
    i = 0
    for group in written:
        acc = ""
        while len(acc) < len(group) and i < len(formatted):
            acc += formatted[i]
            i += 1
        if acc != group:
            return False
    return i == len(formatted)


_DIGIT_GROUPS = re.compile(r"[0-9]+")


def _national_ok(s: str, regions: tuple[str, ...], grouped: bool) -> bool:
    """A national-format number valid in one of `regions` and written as that region writes it (see above);
    `grouped`: also grouped as the region groups it."""
    if not _shape_ok(s) or _SSN_SHAPE.fullmatch(s):
        return False
    digits = _NON_DIGITS.sub("", s)
    written = _DIGIT_GROUPS.findall(s)
    if len(digits) < 7 or _isbn_like(digits, written):
        return False
    for region, trunk, general in _region_table(regions):
        nsn = digits[len(trunk):] if trunk and digits.startswith(trunk) else digits
        if not (general.fullmatch(nsn) or general.fullmatch(digits) or digits.startswith("00")):
            continue
        try:
            n = phonenumbers.parse(s, region, keep_raw_input=True)
        except phonenumbers.NumberParseException:
            continue
        if n.extension is not None or not phonenumbers.is_valid_number(n):
            continue
        if n.country_code_source == phonenumbers.CountryCodeSource.FROM_NUMBER_WITH_IDD:
            return not grouped or len(written) > 1  # 0049 30 91456342: the number names its country
        formatted = phonenumbers.format_number(n, phonenumbers.PhoneNumberFormat.NATIONAL)
        fgroups = _DIGIT_GROUPS.findall(formatted)
        national = phonenumbers.national_significant_number(n)
        if digits == national and trunk and "".join(fgroups) == trunk + national:
            if not _trunk_optional(region, national):
                continue  # "30 91456342": a German number needs its 0
            fgroups = [g for g in [fgroups[0][len(trunk):], *fgroups[1:]] if g]
        elif digits not in ("".join(fgroups), trunk + national):
            continue
        if not grouped or (len(written) > 1 and (_grouped_as_formatted(written, fgroups)
                                                  or _grouped_as_alternate_format(s, region))):
            return True
    return False


def _grouped_as_alternate_format(s: str, region: str) -> bool:
    """Grouped as one of the region's other usual formats ("670 444 011" as well as "670 44 40 11" in ES): what
    libphonenumber's own matcher accepts at Leniency.STRICT_GROUPING (it knows the alternate formats)."""
    return any(m.start == 0 and m.end == len(s)
               for m in phonenumbers.PhoneNumberMatcher(s, region, leniency=phonenumbers.Leniency.STRICT_GROUPING))


def _trunk_optional(region: str, national: str) -> bool:
    """Whether the region writes this number without its trunk prefix too (Indian mobiles: 98765 43210)."""
    md = phonenumbers.PhoneMetadata.metadata_for_region(region)
    fmt = _choose_formatting_pattern_for_number(md.number_format, national)
    return fmt is not None and bool(fmt.national_prefix_optional_when_formatting)


_AFTER_EMAIL = re.compile(r"[\w.%+-]@[\w-]+(?:\.[\w-]+)+[ \t]*[,;|]?[ \t]*\r?\n?[ \t]*$")
_TRUNK_START = re.compile(r"\(|0[0-9]|8 \(")


def _uncued_phone_shape(text: str, start: int, end: int) -> bool:
    line_start = text.rfind("\n", 0, start) + 1
    if _NOT_A_PHONE_BEFORE.search(text, max(line_start, start - 40), start):
        return False
    written = text[start:end]
    groups = _DIGIT_GROUPS.findall(written)
    if len(groups) == 2 and not _SPACES.intersection(written) and not (
            groups[0][0] == "0" and 2 <= len(groups[0]) <= 4 and len(groups[1]) >= 5):
        return False
    return _TRUNK_START.match(written) is not None or _contact_table_cell(text, line_start, start, end)


def _contact_table_cell(text: str, line_start: int, start: int, end: int) -> bool:
    """A whole Markdown table cell, in a row with two cells of words (a name, a city): a contact list."""
    line_end = text.find("\n", end)
    line = text[line_start : len(text) if line_end == -1 else line_end]
    before, after = text[line_start:start].rstrip(" \t"), text[end : len(text) if line_end == -1 else line_end]
    if not (before.endswith("|") and after.lstrip(" \t").startswith("|")):
        return False
    return sum(1 for cell in line.split("|") if _WORDS_CELL.fullmatch(cell.strip())) >= 2


_WORDS_CELL = re.compile(r"[^\W\d_][^\W\d_'.-]*(?:[ '.-][^\W\d_]+)*")


def _phone_cued(text: str, start: int) -> bool:
    line_start = text.rfind("\n", 0, start) + 1
    lo = max(line_start, start - _CUE_REACH)
    window = ("\n" + text[lo:start]) if lo == line_start else text[lo - 1 : start]
    if _PHONE_CUE.search(window.lower()):
        return True
    if "@" in text[max(0, start - 120) : start] and _AFTER_EMAIL.search(text, max(0, start - 120), start):
        return True  # right after an e-mail address: a contact or signature block
    if line_start > 0 and any(d in text[line_start:start] for d in ",;|\t"):
        # a row under a header with a phone column: "name,phone,city" / "| Name | Phone |"
        return _PHONE_HEADER.search(text, max(0, line_start - _HEADER_REACH), line_start) is not None
    return False


def _phone_end(text: str, start: int, end: int, ok: Callable[[str], bool], trim: bool) -> int | None:
    """Where the phone number text[start:end] is ends: `end` if it is one, else (`trim`) the end of its longest
    prefix cut at a space that is one; None when no such number, or when the run is a slice of a longer token."""
    if (end < len(text) and (text[end].isalnum() or text[end] == "_")) or (
            end + 1 < len(text) and text[end] in ".-:," and text[end + 1].isdigit()):
        return None  # a slice of a longer token, a decimal, or a time ("... 14:22:05")
    while True:
        if ok(text[start:end]):
            return end
        cut = end - 1
        while cut > start and text[cut].isdigit():
            cut -= 1
        if not trim or cut <= start or text[cut] not in _SPACES or text[cut - 1] == ")":
            return None  # never end on a parenthesised trunk code: "+49 (0) 30"
        end = cut


_AFTER_COUNTRY_CODE = re.compile(r"\+[0-9]{1,4}\)?[ \u00a0\u202f.-]?$")


def _find_phone(text: str, regions: tuple[str, ...] = DEFAULT_PHONE_REGIONS, plus_nanp: bool = True,
                cued: bool = True) -> Iterator[tuple[int, int]]:
    """Phone spans. What the batch screens rule out for a text: `regions` empty, no national numbers;
    `plus_nanp` False, no '+' or North American ones; `cued` False, no national number with a cue before it
    (then only candidates that start as a phone number does are scanned for)."""
    for m in _PHONE_NANP.finditer(text) if plus_nanp else ():
        # Not the rest of an international number the '+' rule below found invalid: "+1 (215) 029-5856".
        if not _AFTER_COUNTRY_CODE.search(text, max(0, m.start() - 7), m.start()):
            yield m.span()
    if plus_nanp and "+" in text:
        for m in _PHONE_INTL.finditer(text):
            start, end = m.span()
            if m.group("cc"):  # "(+49) 30 ...": the '(' belongs to the number, and starts a token
                if start == 0 or text[start - 1] != "(":
                    continue
                start -= 1
                if start > 0 and (text[start - 1].isalnum() or text[start - 1] == "_"):
                    continue
            found = _phone_end(text, start, end, _international_ok, trim=True)
            if found is not None:
                yield start, found
    if regions:
        for m in (_NATIONAL if cued else _NATIONAL_TRUNK).finditer(text):
            start, end = m.span()
            written = m.group()
            if start > 1 and text[start - 1] in _SEPARATORS and (text[start - 2].isdigit() or text[start - 2] == ")"):
                continue  # the rest of a longer run: "+44 20 437 973" (an invalid international number)
            bare = written.isdigit()
            if bare and len(written) > 17:
                continue
            # Without a cue, a grouped number must look like one on its own (cheap tests first).
            eligible = not bare and (_TRUNK_START.match(written) is not None or "|" in text[max(0, start - 8) : start])
            has_cue = cued and _phone_cued(text, start)
            if not has_cue and not (eligible and _uncued_phone_shape(text, start, end)):
                continue
            found = _phone_end(text, start, end, partial(_national_ok, regions=regions, grouped=not has_cue),
                               trim=False)
            if found is not None:
                yield start, found


# --- iban ---------------------------------------------------------------------------------------
# ISO 13616: country code, two check digits, then a BBAN whose length the country fixes (the SWIFT IBAN
# registry), written compact (DE89370400440532013000) or in groups of four split by single spaces
# (DE89 3704 0044 0532 0130 00). Valid when the number moved to the end, letters as 10-35, is 1 mod 97
# (so check digits are 02-98), which rejects 99% of look-alike tokens; the country's length and whole-
# token boundaries (never a slice of a longer word) reject the rest of the shapes.
IBAN_LENGTHS: dict[str, int] = {
    "AD": 24, "AE": 23, "AL": 28, "AT": 20, "AZ": 28, "BA": 20, "BE": 16, "BG": 22, "BH": 22, "BI": 27,
    "BR": 29, "BY": 28, "CH": 21, "CR": 22, "CY": 28, "CZ": 24, "DE": 22, "DJ": 27, "DK": 18, "DO": 28,
    "EE": 20, "EG": 29, "ES": 24, "FI": 18, "FK": 18, "FO": 18, "FR": 27, "GB": 22, "GE": 22, "GI": 23,
    "GL": 18, "GR": 27, "GT": 28, "HN": 28, "HR": 21, "HU": 28, "IE": 22, "IL": 23, "IQ": 23, "IS": 26,
    "IT": 27, "JO": 30, "KW": 30, "KZ": 20, "LB": 28, "LC": 32, "LI": 21, "LT": 20, "LU": 20, "LV": 21,
    "LY": 25, "MC": 27, "MD": 24, "ME": 22, "MK": 19, "MN": 20, "MR": 27, "MT": 31, "MU": 30, "NI": 28,
    "NL": 18, "NO": 15, "OM": 23, "PK": 24, "PL": 28, "PS": 29, "PT": 25, "QA": 29, "RO": 24, "RS": 22,
    "RU": 33, "SA": 24, "SC": 31, "SD": 18, "SE": 24, "SI": 19, "SK": 24, "SM": 27, "SO": 23, "ST": 25,
    "SV": 28, "TL": 23, "TN": 24, "TR": 26, "UA": 29, "VA": 22, "VG": 24, "XK": 20, "YE": 30,
}
# Upper case, as ISO 13616 writes both forms (a lower-case one is rare enough, and a pattern that must
# also stop at lower-case letters is tried at most positions of a text: several times slower).
_IBAN = re.compile(r"[A-Z]{2}[0-9]{2}(?:[A-Z0-9]{11,30}|(?: [A-Z0-9]{4}){2,7}(?: [A-Z0-9]{1,4})?)")


def iban_ok(s: str) -> bool:
    """ISO 13616 check: a registered country, its length, check digits 02-98, and mod 97 = 1."""
    compact = s.replace(" ", "").upper()
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact[2:4].isdigit() or not 2 <= int(compact[2:4]) <= 98:
        return False
    if not compact.isalnum() or not compact.isascii():
        return False
    return int("".join(str(int(c, 36)) for c in compact[4:] + compact[:4])) % 97 == 1


def _find_iban(text: str) -> Iterator[tuple[int, int]]:
    for m in _IBAN.finditer(text):
        s = m.group()
        length = IBAN_LENGTHS.get(s[:2])
        if length is None or (m.start() > 0 and (text[m.start() - 1].isalnum() or text[m.start() - 1] == "_")):
            continue
        if " " in s:
            # Groups of four: the IBAN ends at the group that completes the country's length, which must
            # end the group (a longer last group is a different token: "DE89 ... 00 BIC").
            end = length + (length - 1) // 4  # characters with a space after every 4
            if len(s) < end or (end < len(s) and s[end] != " "):
                continue
            span = (m.start(), m.start() + end)
        else:
            if len(s) != length:
                continue
            span = m.span()
        nxt = text[span[1] : span[1] + 1]
        if (nxt.isalnum() or nxt == "_") or not iban_ok(text[span[0] : span[1]]):
            continue
        yield span


# --- ipv4 ---------------------------------------------------------------------------------------
# Four dotted numbers, each 0-255 without leading zeros. More parts or a letter or '.' attached mean
# a version, section or OID ("1.2.3.4.5", "v1.2.3.4", "11.2.0.4.v3", "#id.3.1.3.2"), as does a
# preceding "version"/"section"/"Identifier(" word or a version specifier (">=3.10.0.2"). Netmasks
# and hostmasks (255.255.255.0, 0.0.0.255) identify no one. Otherwise a four-part number IS
# indistinguishable from an address ("Python 3.11.7.1" included) and is redacted.
_IPV4 = re.compile(r"[0-9](?<![\w.][0-9])[0-9]{0,2}(?:\.[0-9]{1,3}){3}(?!\w)(?!\.\w)")
_NOT_AN_ADDRESS_BEFORE = re.compile(
    r"(?i)(?:(?:versi[oó]n\w*|identifier|revision|(?<![a-z])(?:ver|rev|release|build|section|sec|chapter|rfc|oid|§))"
    r"s?\.?\W{0,4}|[<>!~=]=\s*)$"
)
# An OID's context anywhere earlier on its line: "... OBJECT IDENTIFIER ::= { id-ce 17 } -- 2.5.29.17".
_OID_LINE = re.compile(r"(?i)object identifier|\boid\b|\{ *id-")


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
    # Multicast groups (224.0.0.251 is mDNS) name a service, not a host.
    return not (_is_mask(int(addr), 32) or addr.is_multicast or (keep_documentation and _documentation(addr)))


def _find_ipv4(text: str, keep: frozenset[str], keep_documentation: bool) -> Iterator[tuple[int, int]]:
    for m in _IPV4.finditer(text):
        if m.group() in keep or not _ipv4_ok(m.group(), keep_documentation):
            continue
        if _NOT_AN_ADDRESS_BEFORE.search(text, max(0, m.start() - 24), m.start()):
            continue
        line_start = text.rfind("\n", max(0, m.start() - 120), m.start()) + 1
        if _OID_LINE.search(text, max(line_start, m.start() - 120), m.start()):
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
_IPV6 = re.compile(r"(?<![\w:.])[0-9A-Fa-f:]{2,45}(?:\.[0-9]{1,3}){0,3}(?!\w)(?!:[\w:])(?!\.[0-9])")
# A dotted-quad tail is always last, so a colon after it starts a port: "[client ::ffff:1.2.3.4:55120]".
_IPV6_PORT = re.compile(r"(?<![\w:.])[0-9A-Fa-f:]{2,39}[0-9]{1,3}(?:\.[0-9]{1,3}){3}(?=:[0-9]{1,5}(?![\w:.]))")
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
    return not (addr.is_unspecified or addr.is_loopback or addr.is_multicast or _is_mask(int(addr), 128)
                or (keep_documentation and _documentation(addr)))


def _find_ipv6(text: str, keep_documentation: bool) -> Iterator[tuple[int, int]]:
    pos = 0
    while (g := _IPV6_GATE.search(text, pos)) is not None:
        start = g.start()
        while start > 0 and g.start() - start < 4 and text[start - 1] in _HEX:
            start -= 1
        m = _IPV6.match(text, start) or _IPV6_PORT.match(text, start)
        end = -1 if m is None else m.end() - (m.group().endswith(":") and not m.group().endswith("::"))
        if m is not None and _ipv6_ok(text[start:end], keep_documentation):
            yield start, end  # without a colon that ends a phrase: "from 2a00:1450::1: icmp_seq=1"
            pos = end
        else:
            pos = g.start() + 1


# --- us_ssn -------------------------------------------------------------------------------------
# AAA-GG-SSSS minus what the SSA never issues: area 000, 666 or 900-999, group 00, serial 0000.
# "AAA GG SSSS" with spaces only with an SSN label before it ("SSN:", "social security number", a CSV or table
# header with an "ssn" column) or a US tax form named on its line (an employee record: "| ... | W-4 on file |"):
# otherwise it is more often something else.
# A bare 9-digit run never counts.
_SSN = re.compile(
    _LEAD + r"[0-9]{2}(?<!000)(?<!666)(?<!9[0-9]{2})-[0-9]{2}(?<!-00)-[0-9]{4}(?<!0000)" + _NUM_R
)
_SSN_SPACED = re.compile(
    _LEAD + r"[0-9]{2}(?<!000)(?<!666)(?<!9[0-9]{2}) [0-9]{2}(?<! 00) [0-9]{4}(?<!0000)(?! [0-9])" + _NUM_R
)
_SSN_LABEL = re.compile(r"(?i)\bssns?\b|\bss#|social security|\bmy social\b|seguro social|s[ée]curit[ée] sociale")
_SSN_LINE = re.compile(r"(?i)\b(?:w-[249]|i-9|1099|i?tin)\b")
_SSN_LABEL_REACH = 200  # characters before the number: a table or CSV header, or the sentence


def _find_ssn(text: str) -> Iterator[tuple[int, int]]:
    if "-" in text:
        for m in _SSN.finditer(text):
            yield m.span()
    for m in _SSN_SPACED.finditer(text):
        line_start, line_end = text.rfind("\n", 0, m.start()) + 1, text.find("\n", m.end())
        if _SSN_LABEL.search(text, max(0, m.start() - _SSN_LABEL_REACH), m.start()) or _SSN_LINE.search(
                text, line_start, len(text) if line_end == -1 else line_end):
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


# Luhn-valid numbers that a label says are something else: EAN-13/GTIN barcodes (some start with 4), IMEIs.
_NOT_A_CARD_BEFORE = re.compile(r"(?i)(?:ean(?:-?13)?|gtin|upc|barcode|isbn(?:-1[03])?|imei)\W{0,3}$")


def _find_card(text: str) -> Iterator[tuple[int, int]]:
    pos = 0
    while (m := _CARD.search(text, pos)) is not None:
        if _NOT_A_CARD_BEFORE.search(text, max(0, m.start() - 12), m.start()):
            pos = m.end()
            continue
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
_SECRET_KEYWORD = re.compile(r"key|secret|token|passw(?:or)?d|pass(?:phrase)?|pwd|credentials?")  # a fast scan
_KEY_QUALIFIER = re.compile(r"(?:api|access|private|encryption|signing|master|session|license)[_-]?$")  # of "...key"
# After the key: `"key": "v"`, `$cfg["key"] = "v"`, `setdefault("KEY", "v")` (a quoted key and a comma), `key = v`.
# An unquoted value runs to the end of its line in .env, YAML and INI files (any symbols: generated
# passwords have them), to the next '&' in a URL query (`?token=...&`) and to the next ';' in a connection
# string (`Server=db;Password=...;Encrypt=True`): which one is decided by what precedes the key.
_ASSIGN_OP = r"(?:[_-]?(?:[Aa][Cc][Cc][Ee][Ss][Ss][_-]?)?[Kk][Ee][Yy]|[Ss])?(?:[\"']\]?\s*(?::=|=>|[:=,])|\]?\s*(?::=|=>|[:=]))\s*"
_QUOTED = r"(?P<q>[\"'`])(?P<qv>[^\s\"'`<>]{16,256}+)(?P=q)"  # possessive: never retry shorter values
_ASSIGNED_VALUE = {
    "line": re.compile(_ASSIGN_OP + r"(?:" + _QUOTED + r"|(?P<v>[^\s\"'`<>]{16,256}+)(?=[ \t]*(?:\r?\n|\Z|\s#)))"),
    "query": re.compile(_ASSIGN_OP + r"(?:" + _QUOTED + r"|(?P<v>[^\s\"'`<>&#]{16,256}+)(?=[ \t]*(?:[\r\n&#]|\Z)))"),
    "dsn": re.compile(_ASSIGN_OP + r"(?:" + _QUOTED + r"|(?P<v>[^\s\"'`<>;]{16,256}+)(?=[ \t]*(?:[\r\n;]|\Z)))"),
}
_KEY_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
_CALL = re.compile(r"[A-Za-z_][\w.]*[(\[]")  # `token = self.get_token(request)`, `tokens[i]`: code, not a value
_TRAILING = ".,;:!?)]}'\""  # punctuation after a value in prose or markup ("?password=...)."), not part of it
# Credentials with a published prefix and alphabet, redacted wherever they occur: (a substring every token holds,
# its pattern). Stripe secret and restricted keys and webhook secrets, Google API keys, GitLab, npm, PyPI,
# Hugging Face, SendGrid, DigitalOcean, Databricks, Shopify, Anthropic and OpenAI tokens, JSON Web Tokens.
_PROVIDER_TOKENS = tuple((gate, re.compile(pattern + r"(?![A-Za-z0-9_-])")) for gate, pattern in (
    ("k_live_", r"[sr]k_live_[0-9A-Za-z]{20,247}"),
    ("whsec_", r"whsec_[0-9A-Za-z+/=]{32,100}"),
    ("AIza", r"AIza[0-9A-Za-z_-]{35}"),
    ("glpat-", r"glpat-[0-9A-Za-z_-]{20,64}"),
    ("npm_", r"npm_[0-9A-Za-z]{36}"),
    ("pypi-", r"pypi-AgEIcHlwaS5vcmc[0-9A-Za-z_-]{16,}"),
    ("hf_", r"hf_[0-9A-Za-z]{34,40}"),
    ("SG.", r"SG\.[0-9A-Za-z_-]{22}\.[0-9A-Za-z_-]{43}"),
    ("_v1_", r"do[opr]_v1_[0-9a-f]{64}"),
    ("dapi", r"dapi[0-9a-f]{32}(?:-[0-9]{1,2})?"),
    ("shp", r"shp(?:at|ca|pa|ss)_[0-9a-fA-F]{32}"),
    ("sk-", r"sk-(?:ant-(?:api|admin)[0-9]{2}-[0-9A-Za-z_-]{80,}|(?:proj|svcacct|admin)-[0-9A-Za-z_-]{40,}"
            r"|[0-9A-Za-z]{20}T3BlbkFJ[0-9A-Za-z]{20})"),
    ("eyJ", r"eyJ[0-9A-Za-z_-]{10,}\.eyJ[0-9A-Za-z_-]{10,}\.[0-9A-Za-z_-]{10,}"),
))
# Slack incoming-webhook URLs: the last component is the secret. HTTP Basic/Bearer credentials after their header.
_SLACK_WEBHOOK = re.compile(r"hooks\.slack\.com/services/T[A-Z0-9]{6,}/B[A-Z0-9]{6,}/([A-Za-z0-9]{20,32})(?![A-Za-z0-9])")
_AUTH_HEADER = re.compile(r"(?i)authorization[\"']?\s*[:=]\s*[\"']?(?:basic|bearer|token)\s+([A-Za-z0-9+/=._~-]{16,})")
# A password in a URL: scheme://user:password@host (user may be empty: redis://:password@host).
_URL_USERINFO = re.compile(r"[^\s:/@?#\"'<>]*:([^\s/@?#\"'<>]{8,256})@[A-Za-z0-9]")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _shannon_bits(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


_BASE64 = re.compile(r"[A-Za-z0-9+/]+")


def _assigned_secret_ok(v: str, aws: bool, min_length: int = 16) -> bool:
    # Random-looking: letters AND digits, >= 3 bits of entropy per character. Not a URL, a path, an
    # environment/template reference. AWS secret keys (exactly 40 base64 characters) may lack digits.
    if len(v) < min_length or "://" in v or "{{" in v or not any(c.isalpha() for c in v):
        return False
    if v[0] in "/.~$%{<" and not (aws and len(v) == 40 and _BASE64.fullmatch(v)):
        return False  # a path, an environment or template reference (an AWS secret key may start with '/')
    if not (any(c.isdigit() for c in v) or (aws and len(v) == 40)):
        return False
    return _shannon_bits(v) >= 3.0


def _basic_credentials(value: str) -> bool:
    """HTTP Basic: base64 of "user:password" (random passwords may lack a digit in their base64 form)."""
    try:
        decoded = base64.b64decode(value, validate=True).decode("utf-8")
    except (ValueError, UnicodeDecodeError):
        return False
    return ":" in decoded and decoded.isprintable() and len(decoded.split(":", 1)[1]) >= 8


def _varied(token: str) -> bool:
    """Not a documentation stand-in: "AKIAXXXXXXXXXXXXXXXX", "ghp_xxxx...x" repeat one or two characters."""
    return len(set(token)) >= 8


def _find_secret(text: str, tokens: bool = True) -> Iterator[tuple[int, int]]:
    """Secret spans; `tokens` False: not the provider tokens, webhook URLs, URL passwords and Authorization
    headers (the batch screen says a text has none)."""
    if "PRIVATE KEY" in text:
        for m in _PEM.finditer(text):
            yield m.span()
    for m in _AWS_KEY_ID.finditer(text):
        if _varied(m.group()[4:]):
            yield m.span()
    if any(p in text for p in _GITHUB_PREFIXES):
        for m in _GITHUB_TOKEN.finditer(text):
            if _varied(m.group()[4:]):
                yield m.span()
    if "xox" in text:
        for m in _SLACK_TOKEN.finditer(text):
            yield m.span()
    for gate, pattern in _PROVIDER_TOKENS if tokens else ():
        if gate in text:
            for m in pattern.finditer(text):
                if (m.start() == 0 or not (text[m.start() - 1].isalnum() or text[m.start() - 1] == "_")) and _varied(
                        m.group()):
                    yield m.span()
    if tokens and "hooks.slack.com" in text:
        for m in _SLACK_WEBHOOK.finditer(text):
            yield m.span(1)
    pos = text.find("://") if tokens else -1
    while pos != -1:
        m = _URL_USERINFO.match(text, pos + 3)
        if m is not None and _assigned_secret_ok(m.group(1), False, 8):
            yield m.span(1)
        pos = text.find("://", pos + 3)
    lowered = text.lower()
    if len(lowered) != len(text):  # a few non-ASCII characters lowercase to two ("İ")
        lowered = text.translate(_ASCII_LOWER)
    if tokens and "authorization" in lowered:
        for m in _AUTH_HEADER.finditer(text):
            if _assigned_secret_ok(m.group(1), True) or _basic_credentials(m.group(1)):
                yield m.span(1)
    for k in _SECRET_KEYWORD.finditer(lowered):
        if k.group() == "key" and not _KEY_QUALIFIER.search(lowered, max(0, k.start() - 12), k.start()):
            continue
        key_start = k.start()
        while key_start > 0 and lowered[key_start - 1] in _KEY_CHARS:
            key_start -= 1
        before = text[key_start - 1 : key_start]
        kind = "query" if before in ("?", "&") else "dsn" if before == ";" else "line"
        m = _ASSIGNED_VALUE[kind].match(text, k.end())
        if m is None:
            continue
        group = "qv" if m.group("qv") is not None else "v"
        value = m.group(group)
        aws = "aws" in lowered[key_start : k.start()]
        # Code, not a value: a call (`token = self.get_token(request)`) or a line that ends in ',' or an opening
        # bracket (`private_key: PKCS7PrivateKeyTypes,`).
        start, end = m.span(group)
        if group == "v":
            if _CALL.match(value) is not None or value[-1] in ",;([{":
                continue
            while kind == "query" and end > start and text[end - 1] in _TRAILING and (
                    text.count("(", start, end) <= text.count(")", start, end - 1)):
                end -= 1  # "?password=...)." in prose; a .env line's value ends the line, punctuation included
            value = text[start:end]
        if _assigned_secret_ok(value, aws):
            yield start, end


# --- batch screens -------------------------------------------------------------------------------
# For each type, an RE2 pattern (pyarrow.compute: one linear-time C++ pass over a whole batch) that every
# text with a detection of that type matches: a substring every detected span contains. A type whose
# screen misses a text is not run on it (most texts need two or three detectors of seven, ~3x faster).
# Every screen is also unaffected by redaction: its substring holds no placeholder character ('<', '>',
# capitals and '_'), or for secrets is followed by an assignment a placeholder's '>' never is, so it
# holds on every pass of `redact`'s fixed point. Secret keywords are searched in a lowercased copy;
# RE2's (?i) folds the same letters (the Kelvin sign too).
SCREENS: dict[str, str] = {
    "secret": r"(?i)(?:api|access|private|encryption|signing|master|session|license)[_-]?key|private key|secret|token"
              r"|passw|pwd|credential|akia|asia|gh[pousr]_|github_pat_|xox[abpr]-",
    "email": "@",
    "ipv6": r":[0-9A-Fa-f]{0,4}:",
    "ipv4": r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]",
    "credit_card": r"[0-9]{12}|[0-9]{3}[ -][0-9]{4}",
    "us_ssn": r"[0-9]{3}[ -][0-9]{2}[ -][0-9]{4}",
    "iban": r"[A-Z]{2}[0-9]{2}(?: ?[A-Z0-9]{4}){2}",
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
    r"\b0[0-9](?:[ \x{a0}\x{202f}./()-]{0,2}[0-9]){5}|\(0?[0-9]{1,5}\)[ \x{a0}\x{202f}./-]{0,2}[0-9]|8 \([0-9]")
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
    if (array := arrow_texts(texts)) is None:
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
    phone_regions: Iterable[str] = DEFAULT_PHONE_REGIONS,
    _skip: frozenset[str] = frozenset(),
) -> list[PiiMatch]:
    """Non-overlapping PII spans in `text`, sorted by start. `phone_regions`: the countries a national-format
    number ("030 91456342", no country code) may be from; empty: only +CC and North American numbers.
    `_skip`: parts of detectors the batch screens ruled out for this text (internal)."""
    wanted = set(_check_types(types))
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
        matches.append(PiiMatch(kind, start, end))
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
