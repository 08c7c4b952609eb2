"""Residual-PII audit: a second, independent PII detector for the `residual_pii` asset check.

Scanning the redactor's output with the redactor's own detectors can only find what its fixed point left
behind, never what it misses by construction: a bug in one of its patterns hides in both passes. This
module re-implements the same promise (what `kiln.curation.pii` says it redacts) with different code and
different patterns, so that the check finds what the redactor missed:

- phone: Google's libphonenumber `PhoneNumberMatcher` (its own candidate grammar, date / time-stamp / page-range
  filters and validity), on short windows: around every '+', after a phone label found with its own word list
  (Latin-script words; Chinese, Japanese and Korean labels, whose numbers are read in those regions; Arabic,
  Persian, Hebrew, Hindi, Thai and Greek ones), and North American shapes. International numbers must be possible
  (Leniency.POSSIBLE) and shaped as their country's plan writes them (libphonenumber groups them; North American
  ones NXX NXX-XXXX), so numbers in unassigned ranges and typos of real ones are reported too; labelled national
  numbers must be valid (STRICT_GROUPING), so fictional ones (555-123-4567) are not reported.
- email: the WHATWG HTML "valid e-mail address" grammar, plus a letter-only top-level domain; with other scripts'
  letters, digits and combining marks where an address holds them (RFC 6531 local parts, IDN domains).
- iban: its own registry table (by length) and a digit-by-digit mod-97; compact, spaced or dashed; upper or lower
  case.
- credit_card: its own Luhn (a lookup of doubled digits) and issuer table, 13-19 digits.
- us_ssn: the SSA rules on AAA-GG-SSSS.
- ipv4 / ipv6: `ipaddress` on address-shaped tokens.
- secret: provider token prefixes (AWS AKIA/ASIA, GitHub ghp_/github_pat_, Slack xox?-, Stripe sk_live_/rk_live_,
  Google AIza, GitLab glpat-, JSON Web Tokens), private-key blocks with a body, and values assigned to credential
  names (`api_key = "..."`, `password: ...`) that are credentials beyond doubt (_assigned_secrets).

Very high precision is the point (a blocking check that cries wolf gets switched off), so the audit keeps
Kiln's documented exemptions, implemented again: placeholders (`<EMAIL>`, ...) are blanked first (a naive
scan reads "<IPV4>:8080" or "<PHONE> ext. 12" as fragments); documentation addresses (RFC 5737 / 3849, RFC
2606 example domains), loopback, multicast, netmasks, version numbers and OIDs ("version 1.2.3.4",
"v1.2.3.4.5", "section-7.1.1.1"), dates, decimals and clause numbers ("+35236450.6", "252.227-7013"),
part numbers in North American digits ("33471-90901"), decorators and handles ("``@dataclasses.dataclass``",
"/@user"), SSH remotes (git@github.com:org/repo), retina images (icon@2x.png), locale names
(sd_IN@devanagari.UTF-8), bits ("0100 1101 0011"), 8-byte hardware ids ("00:1a:2b:3c:4d:5e:6f:70") and x-filled
documentation tokens are not reported. Those are the false positives a
naive WHATWG-e-mail + PhoneNumberMatcher(VALID) scan reports on Kiln's redacted demo corpus (51 on 2,400
documents; this module: none).

`residual_pii(text)` returns sorted, non-overlapping `(type, start, end)` spans; `residual_pii_fields` scans the
`url` and `meta` of documents the same way.
It imports only kiln.curation.pii's constants (type names, placeholders, the words that make a "...key" a credential),
never its detectors.
"""

from __future__ import annotations

import bisect
import datetime
import ipaddress
import json
import math
import os
import re
import unicodedata
from collections import Counter
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import unquote, unquote_plus

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from phonenumbers import (Leniency, PhoneNumber, PhoneNumberFormat, PhoneNumberMatcher, ValidationResult,
                          format_number, is_possible_number_with_reason, is_valid_number, national_significant_number)

from kiln.curation.pii import PII_TYPES, PLACEHOLDERS
from kiln.curation.pii.secrets import KEY_QUALIFIERS
from kiln.engine import SERIAL, Engine

Span = tuple[str, int, int]
_DIGIT = re.compile(r"[0-9]")

_PLACEHOLDER = re.compile("|".join(re.escape(p) for p in PLACEHOLDERS.values()))


def _blank_placeholders(text: str) -> str:
    """Placeholders become spaces of the same length: offsets stay, and nothing can match inside or across one."""
    if "<" not in text:
        return text
    return _PLACEHOLDER.sub(lambda m: " " * len(m.group()), text)


# Characters written for ASCII ones: a number laid out with &nbsp; (U+00A0) on a web page, full-width forms on CJK
# pages, other scripts' decimal digits, typographic hyphens. Scanned as their ASCII twins, one for one, so spans keep
# their offsets (this module's own table: NFKC of the single character, Unicode digit values, four dashes).
class _AsciiTwins(dict):
    def __missing__(self, code: int) -> int:
        char = chr(code)
        category = unicodedata.category(char)
        nfkc = unicodedata.normalize("NFKC", char)
        if category == "Nd":
            twin = 48 + unicodedata.digit(char)
        elif len(nfkc) == 1 and nfkc.isascii() and category != "No":  # not superscripts or circled numbers
            twin = ord(nfkc)
        elif char in "\u2011\u2012\u2013\u2212":  # dashes inside numbers (not U+2010, man pages' hyphenation)
            twin = 45
        else:
            twin = code
        self[code] = twin
        return twin


_ASCII_TWINS = _AsciiTwins()


def _ascii_twins(text: str) -> str:
    return text if text.isascii() else text.translate(_ASCII_TWINS)


# Format characters (general category Cf: soft hyphens, zero-width joiners and spaces, bidi marks, word joiners ...)
# are invisible: "jane\xaddoe@gmail.com" reads as one address. Scanned without them; spans are reported at the
# original text's offsets.
_FORMAT_CHARS = re.compile("[" + "".join(re.escape(chr(c)) for c in range(0x10000)
                                         if unicodedata.category(chr(c)) == "Cf") + "]")


def _visible(text: str) -> tuple[str, list[int] | None]:
    """`text` without its format characters, and the original offset of each character left (None: none left out)."""
    if text.isascii() or _FORMAT_CHARS.search(text) is None:
        return text, None
    where: list[int] = []
    pos = 0
    for m in _FORMAT_CHARS.finditer(text):
        where.extend(range(pos, m.start()))
        pos = m.end()
    where.extend(range(pos, len(text)))
    return _FORMAT_CHARS.sub("", text), where


# Letters of scripts that write no space between a number and the next word (CJK, kana, Thai, Lao, Khmer, Myanmar,
# Tibetan, Tai, Yi; Hangul's particles attach to it): "090-1234-5678までご連絡ください" is a whole number.
_UNSPACED_SCRIPTS = ("CJK ", "HIRAGANA", "KATAKANA", "HALFWIDTH KATAKANA", "HANGUL", "THAI", "LAO ", "KHMER ",
                     "MYANMAR ", "TIBETAN ", "TAI ", "NEW TAI LUE ", "YI ")


def _word_char(c: str) -> bool:
    return (c.isalnum() or c == "_") and (c.isascii() or not unicodedata.name(c, "").startswith(_UNSPACED_SCRIPTS))


# --- email: WHATWG HTML "valid e-mail address" --------------------------------------------------------
# local = 1*( atext / "." ), domain = label *( "." label ), label = let-dig [ [ ldh-str ] let-dig ] (<= 63).
# Beyond the grammar: the local part starts with a letter or digit (not "``@decorator``", "/@handle"), the
# domain has a dot and ends in a letter-only TLD or an IDNA one ("xn--p1ai", .рф in ASCII), and the address is a
# whole token.
_ATEXT = "A-Za-z0-9.!#$%&'*+/=?^_`{|}~-"
_WHATWG_EMAIL = re.compile(
    r"[A-Za-z0-9][" + _ATEXT + r"]{0,63}@"
    r"((?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+(?:[Xx][Nn]--[A-Za-z0-9-]{0,58}[A-Za-z0-9]|[A-Za-z]{2,63}))"
)
_ENCODED_AT_SIGNS = ("%40", "%2540")  # '@' percent-encoded once, and twice (a URL in another URL's query)
_WHATWG_EMAIL_ENCODED = {sign: re.compile(_WHATWG_EMAIL.pattern.replace("@", sign, 1)) for sign in _ENCODED_AT_SIGNS}
_RESERVED_DOMAINS = ("example.com", "example.net", "example.org", "example.edu")  # RFC 2606
_RESERVED_TLDS = frozenset({"example", "test", "invalid", "localhost", "local", "internal", "lan", "home", "arpa",
                            "localdomain", "domain", "tld"})
# A "TLD" that is a file extension: icon@2x.png, file@v2.tar, pkg@1.0.whl.
_FILE_EXTENSIONS = frozenset({"png", "jpg", "jpeg", "gif", "svg", "webp", "ico", "bmp", "avif", "tif", "tiff", "pdf",
                              "css", "js", "mjs", "ts", "tsx", "jsx", "py", "pyc", "md", "rst", "txt", "json", "yaml",
                              "yml", "toml", "ini", "cfg", "html", "htm", "xml", "zip", "gz", "tgz", "tar", "whl", "so",
                              "dll", "exe", "sh", "rs", "go", "java", "rb", "php", "lock", "log", "csv", "utf"})


def _emails(text: str) -> Iterator[Span]:
    yield from _emails_at(text, "@")
    # Percent-encoded, as a URL carries it ("mailto:jane.doe%40gmail.com", "?email=jane%40corp.de"), and encoded twice
    # in a URL inside another URL's query ("?u=https%3A%2F%2Fx.io%2Fs%3Fe%3Djane%2540corp.de").
    for sign in _ENCODED_AT_SIGNS:
        if sign in text:
            yield from _emails_at(text, sign)


_QUERY_SEPARATORS = frozenset("?&=")
_ENCODED_QUERY_SEPARATOR = re.compile(r"%(?:25)?(?:3[ADFadf]|26|2[Ff])")  # = : ? & / percent-encoded


def _emails_at(text: str, sign: str) -> Iterator[Span]:
    at = text.find(sign)
    while at != -1:
        # Start of the local part: walk back over atext and other scripts' letters, digits and marks (at most 64),
        # and not over a URL query's separators ("...?email=jane@corp.de": atext, but the address starts after '=').
        start = at
        while (start > 0 and at - start < 64 and _local_char(text[start - 1])
               and text[start - 1] not in _QUERY_SEPARATORS):
            start -= 1
        if sign != "@":  # nor over those separators encoded, once or twice ("%3Fe%3Djane%40...": after "%3D")
            start = max([start] + [m.end() for m in _ENCODED_QUERY_SEPARATOR.finditer(text, start, at)])
        stop = at + len(sign)
        while stop < len(text) and stop - at < 256 and (text[stop] == "." or _domain_char(text[stop])):
            stop += 1
        ascii_only = text[start:stop].isascii()
        found = (_ascii_address(text, start, at, sign) if ascii_only
                 else _international_address(text, start, at) if sign == "@" else None)
        if found is None:
            at = text.find(sign, at + 1)
            continue
        start, end, domain = found
        tld = domain.rsplit(".", 1)[1]
        after = text[end : end + 2]
        ok = (
            not (after[:1] and (_word_char(after[0]) or after[0] == "-"))  # "sd_IN@devanagari.UTF-8"
            and not (after[:1] == ":" and after[1:2] and (after[1].isalnum() or after[1] in "/~"))  # git@host:org/repo
            and tld not in _RESERVED_TLDS and tld not in _FILE_EXTENSIONS
            and not any(domain == d or domain.endswith("." + d) for d in _RESERVED_DOMAINS)
            and not (start > 0 and text[start - 1] in "/@")  # a path or handle: /@user@host
        )
        if ok:
            yield "email", start, end
        at = text.find(sign, end)


_ATEXT_SET = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789.!#$%&'*+/=?^_`{|}~-")


def _local_char(c: str) -> bool:
    return c in _ATEXT_SET or (not c.isascii() and unicodedata.category(c)[0] in "LMN")


def _domain_char(c: str) -> bool:
    return c.isalnum() or c == "-" or (not c.isascii() and unicodedata.category(c)[0] == "M")


def _ascii_address(text: str, start: int, at: int, sign: str = "@") -> tuple[int, int, str] | None:
    """The WHATWG address whose '@' (`sign`: "%40" or "%2540" when percent-encoded) is at `at`, its local part
    starting at or after `start`."""
    while start < at and not text[start].isalnum():  # a local part starts with a letter or digit
        start += 1
    m = (_WHATWG_EMAIL if sign == "@" else _WHATWG_EMAIL_ENCODED[sign]).match(text, start) if start < at else None
    return None if m is None else (start, m.end(), m.group(1).lower())


def _unspaced(c: str) -> bool:
    return not c.isascii() and unicodedata.name(c, "").startswith(_UNSPACED_SCRIPTS)


def _international_address(text: str, start: int, at: int) -> tuple[int, int, str] | None:
    """An internationalized address (RFC 6531 local part, IDN domain: "प्रिया@gmail.com", "ravi@डाटामेल.भारत"): the
    WHATWG shape with any script's letters, digits and combining marks. Text in scripts written without spaces runs
    into the address ("邮箱地址zhangwei@163.com"): a local part mixing them with others starts after their last letter,
    and a top-level domain ends where its letters change between them and others ("bugs@samba.org发一个")."""
    local = text[start:at]
    if any(_unspaced(c) for c in local) and not all(_unspaced(c) or c == "." for c in local):
        start = at
        while not _unspaced(text[start - 1]):
            start -= 1
    while start < at and not text[start].isalnum():
        start += 1
    if start == at:
        return None
    labels, i = [], at + 1
    while True:
        j = i
        while j < len(text) and _domain_char(text[j]):
            j += 1
        labels.append(text[i:j])
        if j + 1 < len(text) and text[j] == "." and _domain_char(text[j + 1]):
            i = j + 1
            continue
        break
    tld, kind = labels[-1], None
    for k, c in enumerate(tld):
        if unicodedata.category(c)[0] == "M":
            continue
        if not c.isalpha() or kind not in (None, _unspaced(c)):
            tld = tld[:k]
            break
        kind = _unspaced(c)
    labels[-1] = tld
    if len(labels) < 2 or len(tld) < 2 or not all(
            0 < len(label) <= 63 and label[0].isalnum() and label[-1] != "-" for label in labels):
        return None
    end = at + 1 + len(".".join(labels))
    return start, end, text[at + 1 : end].lower()


# --- phone: libphonenumber's matcher on short windows -------------------------------------------------
# The matcher is pure Python and slow on whole documents (~2 ms per KB per region), so it only sees windows
# that could hold a number Kiln redacts: an international one ('+' then a digit), a North American shape,
# or anything right after a phone label.
AUDIT_PHONE_REGIONS: tuple[str, ...] = ("US", "GB", "DE", "FR", "IT", "ES", "NL", "BE", "AT", "CH", "IE", "PT", "PL",
                                        "SE", "DK", "NO", "FI", "CA", "AU", "IN")
_PLUS = re.compile(r"\+[0-9]")
_IDD = re.compile(r"(?<![\w.+/:-])00[1-9]")  # 0049 ...: '00', the international prefix of most countries, for '+'
_NANP_TAIL = re.compile(r"[0-9]{3}[.-][0-9]{4}")  # 555-0134 / 555.0134: the area code is read by the matcher
# Labels are found from a stem (str.find in a lowercased copy), then the whole word must be one of these.
_LABEL_STEMS = ("phone", "tel", "t\u00e9l", "fax", "mobil", "m\u00f3vil", "cell", "handy", "gsm", "portable", "whatsapp",
                "tlf", "call")
_LABELS = frozenset({"phone", "telephone", "tel", "t\u00e9l", "t\u00e9l\u00e9phone", "telefon", "telefono",
                     "tel\u00e9fono", "telefoon", "fax", "mobile", "mobil", "mobiel", "m\u00f3vil", "cell", "cellphone",
                     "cellulare", "handy", "gsm", "portable", "whatsapp", "tlf"})
_CALL = re.compile(r"call (?:us|me)(?: (?:at|on))?\b")
# Chinese, Japanese and Korean labels, found where they stand (no spaces mark words there): telephone, mobile, contact,
# inquiries; and the regions whose national numbers follow them.
_CJK_LABEL_WORDS = ("電話", "电话", "携帯", "ケータイ", "手机", "手機", "連絡先", "联系方式", "聯絡", "問い合わせ",
                    "전화", "휴대폰", "핸드폰", "연락처", "문의")
_CJK_LABEL = re.compile("|".join(_CJK_LABEL_WORDS))
_CJK_REGIONS = ("JP", "KR", "CN", "TW", "HK")
# Labels in scripts whose words take prefixes (Arabic ال/ل/و, Hebrew ב/ל/ו ...), also found where they stand, then read
# in the configured regions: Arabic and Persian (telephone, mobile, call, contact), Hebrew (telephone, mobile, fax,
# the abbreviation tel'), Hindi (phone with and without the nukta, in both its encodings; mobile, telephone, contact),
# Thai (telephone/call, mobile), Greek (tel., mobile; any case).
_SCRIPT_LABEL_WORDS = ("هاتف", "جوال", "موبايل", "موبایل", "تلفون", "تليفون", "تلفن", "همراه", "اتصل", "اتصال", "تماس",
                       "טלפון", "נייד", "פקס", "טל'", "טל\u05f3",
                       "\u092b\u093c\u094b\u0928", "\u095e\u094b\u0928", "फोन", "मोबाइल", "दूरभाष", "संपर्क",
                       "โทร", "มือถือ", "τηλ", "κινητ")
_SCRIPT_LABEL = re.compile("|".join(_SCRIPT_LABEL_WORDS), re.IGNORECASE)
_WINDOW = 32
_FIRST = frozenset("+(0123456789")
_LABEL_GAP = 16  # the number starts at most this far after its label
# A sentence ends between a label word and the number (a word of 4 letters or more, then a full stop): the label was
# a word of the sentence before ("das portable Format. (8589934591 Byte)"). Abbreviations are shorter: "Tel. no. ...".
_SENTENCE_END = re.compile(r"[^\W\d_]{4,}\.\s")
_ASCII_LOWER = str.maketrans("ABCDEFGHIJKLMNOPQRSTUVWXYZ", "abcdefghijklmnopqrstuvwxyz")


def _digits_in(s: str) -> int:
    return sum(1 for c in s if "0" <= c <= "9")


# Hebrew's one-letter prefixes (in, the, and, to, from, that), which it joins to a number too: "התקשרו ל050-1234567".
_HEBREW_PREFIXES = frozenset("בהולמש")


def _clean_edges(text: str, start: int, end: int, prefixed: bool = False) -> bool:
    """A number that is a whole token: not glued to letters or a longer number, not a decimal or a version.
    `prefixed`: up to two Hebrew prefix letters may be joined to its start."""
    if prefixed:
        lead = start
        while lead > 0 and start - lead < 2 and text[lead - 1] in _HEBREW_PREFIXES:
            lead -= 1
        start = lead
    before = text[max(0, start - 2) : start]
    after = text[end : end + 2]
    if before[-1:] and (_word_char(before[-1]) or before[-1] in "+"):
        return False
    if len(before) == 2 and before[1] in ".,-/:" and before[0].isdigit():
        return False
    if after[:1] and _word_char(after[0]):
        return False
    if len(after) == 2 and after[0] in ".,-/:" and after[1].isdigit():
        return False
    return True


def _is_date(s: str) -> bool:
    """2024-01-15, 15.01.2024, 01/15/24: three numbers, one separator, and a real calendar day."""
    for sep in "-./":
        parts = s.split(sep)
        if len(parts) == 3 and all(p.isdigit() for p in parts):
            a, b, c = parts
            for y, m, d in ((a, b, c), (c, b, a), (c, a, b)) if len(a) == 4 else ((c, b, a), (c, a, b)):
                if len(y) in (2, 4) and len(m) <= 2 and len(d) <= 2:
                    try:
                        datetime.date(int(y) if len(y) == 4 else 2000 + int(y), int(m), int(d))
                        return True
                    except ValueError:
                        pass
    return False


_AFTER_PLUS = re.compile(r"\+[0-9]{1,4}[ .-]?$")
_DOTTED_NATIONAL = re.compile(r"\+[0-9]{1,3} [0-9]+(?:\.[0-9]+){2,}")  # "+687 75.12.34" (New Caledonia)


_NANP_NSN = re.compile(r"[2-9][0-9]{2}[2-9][0-9]{6}")  # NXX NXX-XXXX: no area code or exchange starts with 0 or 1


def _plan_shaped(n: PhoneNumber) -> bool:
    """A possible number written as its country writes numbers: a length of that country (not one diallable only
    locally), and a shape libphonenumber's formats group ("+44 20 5876 9083" is grouped; "+44 7911 12345", a
    digit short for a mobile, comes back as one run of digits)."""
    if is_possible_number_with_reason(n) != ValidationResult.IS_POSSIBLE:
        return False
    nsn = national_significant_number(n)
    if n.country_code == 1 and not _NANP_NSN.fullmatch(nsn):
        return False
    national = format_number(n, PhoneNumberFormat.INTERNATIONAL).split(" ", 1)[-1]
    return national != nsn and _digits_in(national) == len(nsn)


def _match_phones(text: str, lo: int, hi: int, region: str, leniency: int,
                  idd_only: bool = False) -> Iterator[tuple[int, int]]:
    window = text[lo:hi]
    for m in PhoneNumberMatcher(window, region, leniency=leniency, max_tries=8):
        if idd_only and (m.start != 0 or not m.raw_string.startswith("00")):
            continue  # in a region that dials out with 00, a number written from its "00" names its country
        if leniency == Leniency.POSSIBLE and not (is_valid_number(m.number) or _plan_shaped(m.number)):
            continue
        start, end = lo + m.start, lo + m.end
        raw = m.raw_string
        if raw[0] != "+" and _AFTER_PLUS.search(text, max(0, start - 6), start):
            continue  # the rest of an international number the matcher found invalid: "+1 027-646-5868"
        # One '.', or '.' beside '-' or ' ', is a decimal or a clause number ("+35236450.6", "252.227-7013"):
        # numbers written with dots use them between every group (of the national number: "+687 75.12.34").
        dots = raw.count(".")
        if (dots and (dots == 1 or "-" in raw or " " in raw.strip()) and not _DOTTED_NATIONAL.fullmatch(raw)) or (
                _is_date(raw)):
            continue
        if m.number.extension is None and _clean_edges(text, start, end, prefixed=True):
            yield start, end


MIN_PHONE_DIGITS = 7


def _after_label(text: str, k: int, regions: tuple[str, ...]) -> Iterator[tuple[int, int]]:
    """The number that follows a phone label ending at `k`, with at most a word or two between ("Tel. (office):
    ..."), read in the first of `regions` where it is valid and grouped as that region groups it."""
    if _digits_in(text[k : k + _LABEL_GAP + _WINDOW]) < 6:
        return
    hi = min(len(text), k + _LABEL_GAP + _WINDOW)
    for region in regions:
        found = [sp for sp in _match_phones(text, k, hi, region, Leniency.STRICT_GROUPING)
                 if sp[0] - k <= _LABEL_GAP and "\n" not in text[k : sp[0]] and text[sp[0]] in _FIRST
                 and not _SENTENCE_END.search(text, k, sp[0])]
        if found:
            yield found[0]
            return


def _phones(text: str, regions: tuple[str, ...]) -> Iterator[Span]:
    seen: set[tuple[int, int]] = set()
    for m in _PLUS.finditer(text):  # international: the number names its country
        if (m.start() > 0 and _word_char(text[m.start() - 1])) or _digits_in(text[m.start() : m.start() + 24]) < 6:
            continue
        lo = max(0, m.start() - 1)
        seen.update(_match_phones(text, lo, min(len(text), m.start() + _WINDOW), "ZZ", Leniency.POSSIBLE))
    for m in _IDD.finditer(text):
        if _digits_in(text[m.start() : m.start() + 24]) < 8:
            continue
        # Read in a region whose international prefix is 00; only numbers that name their country by it count.
        seen.update(_match_phones(text, m.start(), min(len(text), m.start() + _WINDOW), "DE", Leniency.POSSIBLE,
                                  idd_only=True))
    for m in _NANP_TAIL.finditer(text):
        lo, hi = max(0, m.start() - 7), min(len(text), m.end() + 2)
        # Grouped as North America writes it (3-3-4): part numbers like "33471-90901" hold valid digits too.
        seen.update(_match_phones(text, lo, hi, "US", Leniency.EXACT_GROUPING))
    lowered = text.lower()
    if len(lowered) != len(text):  # "İ" lowercases to two characters
        lowered = text.translate(_ASCII_LOWER)
    for stem in _LABEL_STEMS:
        i = lowered.find(stem)
        while i != -1:
            k = i + len(stem)
            while k < len(text) and text[k].isalpha():
                k += 1
            word = lowered[i:k]
            if word == "call":
                m = _CALL.match(lowered, i)
                k = m.end() if m else k
                word = "call" if m else ""
            if (i == 0 or not _word_char(text[i - 1])) and word in _LABELS | {"call"}:
                seen.update(_after_label(text, k, regions))
            i = lowered.find(stem, k)
    for m in _CJK_LABEL.finditer(text):
        seen.update(_after_label(text, m.end(), _CJK_REGIONS))
    for m in _SCRIPT_LABEL.finditer(text):
        seen.update(_after_label(text, m.end(), regions))
    for start, end in seen:
        # A few regions have 4-6 digit numbers, but in text that short a run is an issue or part number far more
        # often ("cell args bpo-43693" in CPython's own comments): the audit wants certainty.
        digits = [c for c in text[start:end] if "0" <= c <= "9"]
        if len(digits) >= MIN_PHONE_DIGITS and not set(digits) <= {"0", "1"}:  # bits: "0100 1101 0011"
            yield "phone", start, end


# --- iban ---------------------------------------------------------------------------------------------
# The SWIFT IBAN registry, by length, and Iran's Sheba numbers (26, ISO 13616 in form, outside the registry): this
# table is written independently of kiln.curation.pii's (a test compares them).
_IBAN_BY_LENGTH = {
    15: "NO", 16: "BE", 18: "DK FI FK FO GL NL SD", 19: "MK SI", 20: "AT BA EE KZ LT LU MN XK",
    21: "CH HR LI LV", 22: "BG BH CR DE GB GE IE ME RS VA", 23: "AE GI IL IQ OM SO TL", 24: "AD CZ ES MD PK RO SA SE SK TN VG",
    25: "LY PT ST", 26: "IR IS TR", 27: "BI DJ FR GR IT MC MR SM", 28: "AL AZ BY CY DO GT HN HU LB NI PL SV",
    29: "BR EG PS QA UA", 30: "JO KW MU YE", 31: "MT SC", 32: "LC", 33: "RU",
}
IBAN_COUNTRY_LENGTHS: dict[str, int] = {c: n for n, cs in _IBAN_BY_LENGTH.items() for c in cs.split()}
# Upper case, as ISO 13616 writes it, lower case as people type it ("de89 3704 ..."), or capitalised as a phone's
# keyboard writes a message's first word ("De89 3704 ..."): found from the check digits, with the country read back.
_IBAN_CHECK = re.compile(r"[0-9][0-9](?<=[A-Z][A-Z][0-9][0-9]|[A-Za-z][a-z][0-9][0-9])")
_IBAN_BODY = re.compile(r"(?:[ -]?[A-Za-z0-9]){11,31}")


def _mod97(chars: str) -> int:
    """The remainder mod 97 of the number whose digits are `chars` with letters as 10..35, digit by digit."""
    r = 0
    for c in chars:
        v = ord(c) - 48 if c <= "9" else ord(c.upper()) - 55
        r = (r * 100 + v) % 97 if v > 9 else (r * 10 + v) % 97
    return r


def _ibans(text: str) -> Iterator[Span]:
    for m in _IBAN_CHECK.finditer(text):
        start = m.start() - 2
        country = text[start : start + 2].upper()
        length = IBAN_COUNTRY_LENGTHS.get(country)
        if length is None or (start > 0 and _word_char(text[start - 1])):
            continue
        body = _IBAN_BODY.match(text, m.end())
        if body is None:
            continue
        # Walk the body to the country's length; the IBAN must end a token there.
        chars, end = [], m.end()
        for i in range(m.end(), body.end()):
            if text[i] not in " -":
                chars.append(text[i])
                if len(chars) == length - 4:
                    end = i + 1
                    break
        if len(chars) != length - 4 or (end < len(text) and _word_char(text[end])):
            continue
        bban = "".join(chars)
        check = text[start + 2 : start + 4]
        if check in ("00", "01", "99") or _mod97(bban + country + check) != 1:
            continue
        if not bban.isdigit() and all(c in "0123456789abcdef" for c in bban):
            continue  # lower-case hex with letters in it: a hash or an id that passed mod 97 by chance (1 in 97)
        yield "iban", start, end


# --- credit cards -------------------------------------------------------------------------------------
_CARD_RUN = re.compile(r"[0-9](?:[ -]?[0-9]){12,18}")
_DOUBLED = (0, 2, 4, 6, 8, 1, 3, 5, 7, 9)  # the digit sum of 2*d
# (first digits, lengths) per issuer; prefixes as ranges of equal-length strings.
_ISSUERS = (
    ("4", "4", (13, 16, 19)), ("51", "55", (16,)), ("2221", "2720", (16,)), ("34", "34", (15,)), ("37", "37", (15,)),
    ("6011", "6011", (16, 17, 18, 19)), ("644", "649", (16, 17, 18, 19)), ("65", "65", (16, 17, 18, 19)),
    ("62", "62", (16, 17, 18, 19)), ("3528", "3589", (16, 17, 18, 19)), ("300", "305", (14, 15, 16, 17, 18, 19)),
    ("36", "36", (14, 15, 16, 17, 18, 19)), ("38", "39", (14, 15, 16, 17, 18, 19)), ("2200", "2204", (16, 17, 18, 19)),
    # Domestic networks (Wikipedia, "Payment card number"; Elo's own ranges as Braintree's credit-card-type lists them;
    # Shetab member banks' BINs as the Central Bank of Iran lists them): RuPay, Verve, UzCard, Humo, Troy, Elo, Shetab.
    ("60", "60", (16,)), ("81", "82", (16,)), ("508", "508", (16,)),
    ("506099", "506198", (16, 18, 19)), ("507865", "507964", (16, 18, 19)),
    ("8600", "8600", (16,)), ("5614", "5614", (16,)), ("9860", "9860", (16,)), ("979200", "979289", (16,)),
    ("504175", "504175", (16,)), ("506699", "506778", (16,)), ("509000", "509999", (16,)), ("636297", "636297", (16,)),
    ("636368", "636368", (16,)),
    *((bin_, bin_, (16,)) for bin_ in ("502229", "502806", "502908", "502938", "589210", "589463", "610433", "636214",
                                        "639346", "639370", "639607")),
)


def _luhn(digits: str) -> bool:
    odd = digits[-1::-2]
    even = digits[-2::-2]
    return (sum(map(int, odd)) + sum(_DOUBLED[int(d)] for d in even)) % 10 == 0


def _cards(text: str) -> Iterator[Span]:
    for m in _CARD_RUN.finditer(text):
        s = m.group()
        seps = {c for c in s if not c.isdigit()}
        if len(seps) > 1 or not _clean_edges(text, m.start(), m.end()):
            continue
        digits = s.replace(" ", "").replace("-", "")
        if not seps and digits[-5:] == "00000":  # a bare round number: an amount or a power (Kiln leaves them)
            continue
        label = text[max(0, m.start() - 12) : m.start()].lower().rstrip(" :=#-")
        if label.endswith(("ean", "ean13", "ean-13", "gtin", "upc", "barcode", "imei", "isbn")):
            continue  # a barcode or a device id that happens to pass Luhn
        if any(lo <= digits[: len(lo)] <= hi and len(digits) in lengths for lo, hi, lengths in _ISSUERS) and _luhn(digits):
            yield "credit_card", m.start(), m.end()


# --- us_ssn -------------------------------------------------------------------------------------------
# Found from the "-GG-SSSS" tail (a pattern that starts with a literal is searched ~25x faster than one that
# starts with a digit class), then the area is read back.
_SSN_TAIL = re.compile(r"-([0-9]{2})-([0-9]{4})")


def _ssns(text: str) -> Iterator[Span]:
    for m in _SSN_TAIL.finditer(text):
        start = m.start() - 3
        area = text[max(0, start) : m.start()]
        group, serial = m.groups()
        if start < 0 or not (area.isdigit() and area.isascii()):
            continue
        if area in ("000", "666") or area[0] == "9" or group == "00" or serial == "0000":
            continue
        if _clean_edges(text, start, m.end()):
            yield "us_ssn", start, m.end()


# --- ip addresses -------------------------------------------------------------------------------------
_IPV4_TAIL = re.compile(r"\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]{1,3}")  # the last three octets; the first is read back
_IPV6_GATE = re.compile(r":[0-9A-Fa-f]{0,4}:")  # every IPv6 address has two colons at most 4 hex digits apart
_IPV6_CHARS = frozenset("0123456789abcdefABCDEF:.")
# Four dotted numbers after these words are versions, sections and OIDs ("version 1.2.3.4", "section-7.1.1.1",
# __version__ = "0.5.1.2", ObjectIdentifier("2.5.29.9"), "pkg>=3.10.0.2").
_VERSIONISH = re.compile(
    r"(?i)(?:(?:versi[oó]n|identifier|revision)\w*|\b(?:ver|rev|release|build|section|sec|chapter|rfc|oid|§)s?)\.?\W{0,4}$"
    r"|[<>=!~]=\s*$")
_OID_CONTEXT = ("object identifier", "oid", "{ id-", "{id-")  # anywhere earlier on the line
_DOC_NETS = tuple(ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32"))


def _mask(n: int, bits: int) -> bool:
    return bin(n)[2:].zfill(bits).rstrip("0").count("0") == 0 or bin(n)[2:].zfill(bits).lstrip("0").count("0") == 0


def _ipv4s(text: str, keep: frozenset[str], keep_documentation: bool) -> Iterator[Span]:
    for t in _IPV4_TAIL.finditer(text):
        start = t.start()
        while start > 0 and t.start() - start < 3 and "0" <= text[start - 1] <= "9":
            start -= 1
        if start == t.start():
            continue
        m_start, m_end = start, t.end()
        s = text[m_start:m_end]
        before, after = text[max(0, m_start - 1) : m_start], text[m_end : m_end + 2]
        if (before and (_word_char(before) or before == ".")) or (after[:1] and _word_char(after[0])) or (
                after[:1] == "." and after[1:2].isalnum()):
            continue
        try:
            addr = ipaddress.IPv4Address(s)  # rejects octets > 255 and leading zeros
        except ValueError:
            continue
        if s in keep or addr.is_loopback or addr.is_unspecified or _mask(int(addr), 32):
            continue
        if keep_documentation and any(addr in n for n in _DOC_NETS if n.version == 4):
            continue
        if _VERSIONISH.search(text, max(0, m_start - 24), m_start):
            continue
        line = text[text.rfind("\n", 0, m_start) + 1 : m_start].lower()
        if any(c in line for c in _OID_CONTEXT) or addr.is_multicast:
            continue
        yield "ipv4", m_start, m_end


def _ipv6s(text: str, keep_documentation: bool) -> Iterator[Span]:
    pos = 0
    while (g := _IPV6_GATE.search(text, pos)) is not None:
        start, end = g.start(), g.end()
        while start > 0 and text[start - 1] in _IPV6_CHARS:
            start -= 1
        while end < len(text) and text[end] in _IPV6_CHARS:
            end += 1
        pos = end
        while end > start and text[end - 1] == ".":  # a sentence's full stop
            end -= 1
        s = text[start:end]
        before, after = text[max(0, start - 1) : start], text[end : end + 1]
        if (before and _word_char(before)) or (after and _word_char(after)) or len(s) > 45:
            continue
        if "::" in s and (sum(1 for g in s.split(":") if g) < 2 or not any(c.isdigit() for c in s) or len(s) < 6):
            continue  # "a::b", "dead::beef", "x[::2]": scopes and slices
        if len(s) == 23 and s[2::3] == ":" * 7:
            continue  # eight bytes, two hex digits each: a hardware id (EUI-64, WWN: 00:1a:2b:3c:4d:5e:6f:70)
        try:
            addr = ipaddress.IPv6Address(s)
        except ValueError:
            continue
        if addr.is_loopback or addr.is_unspecified or addr.is_multicast or _mask(int(addr), 128):
            continue
        if keep_documentation and any(addr in n for n in _DOC_NETS if n.version == 6):
            continue
        yield "ipv6", start, end


# --- secrets: provider prefixes and key blocks --------------------------------------------------------
# (substring that every such token contains, its pattern): each pattern only runs on texts holding its substring.
_TOKENS = tuple((gate, re.compile(pattern + r"(?![A-Za-z0-9_])")) for gate, pattern in (
    ("AKIA", r"AKIA[A-Z0-9]{16}"),
    ("ASIA", r"ASIA[A-Z0-9]{16}"),
    ("gh", r"gh[pousr]_[A-Za-z0-9]{36,251}"),
    ("github_pat_", r"github_pat_[A-Za-z0-9_]{22,251}"),
    ("xox", r"xox[bpas]-[0-9]{6,}-[A-Za-z0-9-]{8,}"),
    ("k_live_", r"[sr]k_live_[A-Za-z0-9]{20,247}"),
    ("AIza", r"AIza[0-9A-Za-z_-]{35}"),
    ("glpat-", r"glpat-[0-9A-Za-z_-]{20,64}"),
    ("eyJ", r"eyJ[0-9A-Za-z_-]{10,}\.eyJ[0-9A-Za-z_-]{10,}\.[0-9A-Za-z_-]{10,}"),
))
_KEY_BLOCK = re.compile(r"-----BEGIN [A-Z0-9 ]*PRIVATE KEY(?: BLOCK)?-----(?:\s|\\n|\\r)+(?:[A-Za-z-]+:[^\n]*\n)*"
                        r"[A-Za-z0-9+/=]{16,}")


# Values assigned to credential names: `api_key = "..."`, `"client_secret": "..."`, `DB_PASSWORD=...` in code, .env,
# YAML and INI files, `?token=...&` in a query, `;Password=...;` in a connection string. A name ends in a credential
# word (secret, token, password, passwd, pwd, passphrase, credential(s); "key" only after one of the words that make
# it a credential: KEY_QUALIFIERS, the list the redactor reads too, one list), then `=`, `:`, `=>` or `:=`, then the
# value: quoted, or unquoted where it ends its line (its query parameter after '?' or '&', its connection-string
# field after ';'). Reported when a credential beyond doubt (this check must not cry wolf): 20+ characters of letters
# and digits mixed, 3.5+ bits each, for any such name; for a password's name (password, passwd, pwd, passphrase,
# secret) also 8+ characters with a letter and a digit, quoted or written as .env and YAML write values (not `name =
# identifier`, which is code). Never a template or variable reference, a URL or a path (first character not a
# letter or a digit, no "{{"), and never a call's argument (`get("password", ...)`: no ',' before the value).
_CREDENTIAL_WORD = re.compile(  # followed by an assignment (most "key" and "token" in code are not: checked in C)
    r"(?:secret|token|passw(?:or)?d|pwd|passphrase|credential|key)(?=(?:s|[_-]?key)?[\"']?\]?[ \t]*(?::=|=>|[:=]))")
_KEY_QUALIFIED = re.compile(r"(?:" + KEY_QUALIFIERS + r")[_-]?$")
_PASSWORD_NAMES = frozenset({"password", "passwd", "pwd", "passphrase", "secret"})
_ASSIGNED = re.compile(
    r"(?:s|[_-]?key)?[\"']?\]?[ \t]*(?P<op>:=|=>|[:=])[ \t]*"
    r"(?:(?P<q>[\"'`])(?P<qv>[^\s\"'`<>]{8,256})(?P=q)|(?P<v>[^\s\"'`<>&;#,()\[\]{}]{8,256})(?P<end>[ \t]*(?:\r?\n|\Z)|[&#;]))")
_NAME_CHARS = frozenset("abcdefghijklmnopqrstuvwxyz0123456789_.-")
_CODE_NAME = re.compile(r"[A-Za-z_][\w.]*")  # `password = pw_hash`, `secret = self.key_v2`: code


def _bits(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _assigned_secrets(text: str) -> Iterator[Span]:
    lowered = text.lower()
    if len(lowered) != len(text):  # "İ" lowercases to two characters
        lowered = text.translate(_ASCII_LOWER)
    for k in _CREDENTIAL_WORD.finditer(lowered):
        word = k.group()
        if word == "key" and not _KEY_QUALIFIED.search(lowered, max(0, k.start() - 16), k.start()):
            continue
        m = _ASSIGNED.match(lowered, k.end())  # the name in any case: SECRET_KEY, dbPassword
        if m is None:
            continue
        name_start = k.start()
        while name_start > 0 and lowered[name_start - 1] in _NAME_CHARS:
            name_start -= 1
        before = text[name_start - 1 : name_start]
        quoted = m.group("qv") is not None
        start = m.start("qv" if quoted else "v")
        value = text[start : m.end("qv" if quoted else "v")]
        if not quoted:
            value = value.rstrip(".!?:")  # a sentence's full stop
        if not quoted and m.group("end")[:1] in ("&", "#", ";") and not (
                before in ("?", "&") and m.group("end") in ("&", "#") or before == ";" and m.group("end") == ";"):
            continue  # a value ends its line, or its query parameter or connection-string field
        if not value[:1].isalnum() or "{{" in value or "://" in value or not any(c.isdigit() for c in value) or not any(
                c.isalpha() for c in value):
            continue
        code = not quoted and _CODE_NAME.fullmatch(value) is not None  # `settings.SECRET_KEY_2024`, `pw_hash_v2`
        if code and "." in value:
            continue
        if (len(value) >= 20 and _bits(value) >= 3.5) or (
                word in _PASSWORD_NAMES and len(value) >= 8 and len(set(value)) >= 5
                and not (code and "=" in m.group("op") and " " in lowered[k.end() : start])):
            yield "secret", start, start + len(value)


def _secrets(text: str) -> Iterator[Span]:
    yield from _assigned_secrets(text)
    for gate, pattern in _TOKENS:
        if gate not in text:
            continue
        for m in pattern.finditer(text):
            s = m.group()
            if m.start() > 0 and _word_char(text[m.start() - 1]):
                continue
            body = s[4:]
            if not (any(c.isdigit() for c in body) and any(c.isalpha() for c in body)) or len(set(body)) < 8:
                continue  # documentation stand-ins: sk_live_xxxxxxxxxxxxxxxxxxxxxxxx, AKIAXXXXXXXXXXXXXXXX
            yield "secret", m.start(), m.end()
    if "PRIVATE KEY" in text:
        for m in _KEY_BLOCK.finditer(text):
            yield "secret", m.start(), m.end()


# --- API ----------------------------------------------------------------------------------------------
_ORDER = ("secret", "email", "iban", "credit_card", "us_ssn", "ipv6", "ipv4", "phone")  # overlaps: earlier wins


def residual_pii(
    text: str,
    types: Iterable[str] = PII_TYPES,
    ipv4_keep: Iterable[str] = ("127.0.0.1", "0.0.0.0", "255.255.255.255"),
    keep_documentation: bool = True,
    phone_regions: Iterable[str] = AUDIT_PHONE_REGIONS,
) -> list[Span]:
    """PII left in (redacted) `text`, as sorted non-overlapping (type, start, end), for the asked types; characters
    written for ASCII ones (_AsciiTwins) are read as those."""
    wanted = set(types)
    unknown = wanted - set(PII_TYPES)
    if unknown:
        raise ValueError(f"unknown PII type(s) {sorted(unknown)}; allowed: {', '.join(PII_TYPES)}")
    text, where = _visible(_blank_placeholders(text))
    text = _ascii_twins(text)
    has_digit = _DIGIT.search(text) is not None
    found: list[Span] = []
    for kind in _ORDER:
        if kind not in wanted or (not has_digit and kind not in ("secret", "email", "ipv6")):
            continue
        if kind == "secret":
            found.extend(_secrets(text))
        elif kind == "email":
            found.extend(_emails(text))
        elif kind == "iban":
            found.extend(_ibans(text))
        elif kind == "credit_card":
            found.extend(_cards(text))
        elif kind == "us_ssn":
            found.extend(_ssns(text))
        elif kind == "ipv6":
            found.extend(_ipv6s(text, keep_documentation))
        elif kind == "ipv4":
            found.extend(_ipv4s(text, frozenset(ipv4_keep), keep_documentation))
        else:
            found.extend(_phones(text, tuple(phone_regions)))
    out: list[Span] = []
    taken: list[tuple[int, int]] = []  # accepted (start, end), sorted and disjoint
    for kind, start, end in found:  # in _ORDER: a span overlapping an earlier type's is dropped
        i = bisect.bisect_left(taken, (start, end))
        if (i > 0 and taken[i - 1][1] > start) or (i < len(taken) and taken[i][0] < end):
            continue
        taken.insert(i, (start, end))
        out.append((kind, start, end) if where is None else (kind, where[start], where[end - 1] + 1))
    return sorted(out, key=lambda s: s[1])


# For each type, an RE2 pattern (pyarrow.compute: one linear C++ pass over a whole column) that every text with a
# finding of that type matches: a substring every finding contains, made of characters a blanked placeholder
# never supplies. A text no screen matches is not scanned at all (most of a corpus).
AUDIT_SCREENS: dict[str, str] = {
    "secret": r"AKIA|ASIA|gh[pousr]_|github_pat_|xox[bpas]-|[sr]k_live_|AIza|glpat-|eyJ|PRIVATE KEY"
              r"|(?i:secret|token|passw|pwd|passphrase|credential|(?:" + KEY_QUALIFIERS + r")[_-]?key)",
    "email": "@|%40|%2540",
    "iban": r"[A-Z]{2}[0-9]{2}|[A-Za-z][a-z][0-9]{2}",
    "credit_card": r"[0-9](?:[ -]?[0-9]){12}",
    "us_ssn": r"[0-9]{3}-[0-9]{2}-[0-9]{4}",
    "ipv4": r"[0-9]\.[0-9]{1,3}\.[0-9]{1,3}\.[0-9]",
    "ipv6": r":[0-9A-Fa-f]{0,4}:",
    "phone": r"\+[0-9]|\b00[1-9]|[0-9]{3}[.-][0-9]{4}"
             r"|(?i:phone|tel|t\x{e9}l|fax|mobil|m\x{f3}vil|cell|handy|gsm|portable|whatsapp|tlf|call)\pL*[^\n0-9]{0,32}[+(0-9]"
             r"|(?:" + "|".join(_CJK_LABEL_WORDS) + r")[^\n0-9]{0,32}[+(0-9]"
             r"|(?i:" + "|".join(_SCRIPT_LABEL_WORDS) + r")[^\n0-9]{0,32}[+(0-9]",
}


def residual_pii_batch(
    texts: list[str] | pa.Array | pa.ChunkedArray,
    types: Iterable[str] = PII_TYPES,
    ipv4_keep: Iterable[str] = ("127.0.0.1", "0.0.0.0", "255.255.255.255"),
    keep_documentation: bool = True,
    phone_regions: Iterable[str] = AUDIT_PHONE_REGIONS,
) -> list[list[Span]]:
    """`residual_pii` of every text (a list or an Arrow string column), with the types each text cannot hold
    screened out first."""
    wanted = tuple(t for t in PII_TYPES if t in set(types))
    if len(wanted) != len(set(types)):
        residual_pii("", types)  # raises, naming the unknown types
    if not isinstance(texts, (pa.Array, pa.ChunkedArray)):
        try:
            texts = pa.array(texts, pa.large_string())
        except UnicodeEncodeError:  # a lone surrogate: no Arrow array, every text is scanned in full
            return [residual_pii(t, wanted, ipv4_keep, keep_documentation, phone_regions) for t in texts]
    scanned = texts  # what the screens read: the texts as the detectors do
    if not pc.all(pc.string_is_ascii(texts)).as_py():
        scanned = pa.array([_ascii_twins(_visible(t)[0]) if t else t for t in texts.to_pylist()], pa.large_string())
    hits = [pc.match_substring_regex(scanned, AUDIT_SCREENS[t]).to_pylist() for t in wanted]
    keep, regions = tuple(ipv4_keep), tuple(phone_regions)
    out: list[list[Span]] = []
    for i, row in enumerate(zip(*hits) if wanted else [()] * len(texts)):
        screened = tuple(t for t, h in zip(wanted, row) if h)
        out.append(residual_pii(texts[i].as_py() or "", screened, keep, keep_documentation, regions) if screened else [])
    return out


# --- url and meta ------------------------------------------------------------------------------------
# What a reader of a document's other fields sees, as texts to scan: the URL percent-decoded (its address and
# path, then each query or fragment parameter as "name: value", in every reading of '+'), and every string of the
# meta JSON at any depth, keys alone and values after their key ("version: 1.2.3.4" reads as a version here too).


def _url_texts(url: str) -> Iterator[str]:
    head, _, tail = url.partition("?") if "?" in url else url.partition("#")
    yield unquote(head)
    for param in re.split(r"[&#]", tail) if tail else ():
        name, _, value = param.partition("=")
        name = unquote_plus(name)
        if not value:
            yield name
        readings = {unquote(value), unquote_plus(value), "+" + unquote_plus(value[1:]) if value[:1] == "+" else ""}
        yield from (f"{name}: {r}" for r in sorted(readings) if r)


def _meta_texts(value, key: str = "") -> Iterator[str]:
    if isinstance(value, dict):
        for k, v in value.items():
            yield str(k)
            yield from _meta_texts(v, str(k))
    elif isinstance(value, list):
        for v in value:
            yield from _meta_texts(v, key)
    elif isinstance(value, str) and value:
        yield from (f"{key}: {t}" if key else t for t in (_url_texts(value) if "://" in value else (value,)))
    elif type(value) is int or (type(value) is float and value.is_integer()):  # a phone number kept as a number
        yield f"{key}: {int(value)}" if key else str(int(value))  # reads as one after its name


def residual_pii_fields(
    urls: list[str | None],
    metas: list[str | None],
    types: Iterable[str] = PII_TYPES,
    ipv4_keep: Iterable[str] = ("127.0.0.1", "0.0.0.0", "255.255.255.255"),
    keep_documentation: bool = True,
    phone_regions: Iterable[str] = AUDIT_PHONE_REGIONS,
) -> list[list[tuple[str, str]]]:
    """For each document (its `url` and its `meta` as stored: a JSON object), the (field, type) of every finding:
    `residual_pii` on what a reader of those fields sees, all documents' texts in one batch."""
    owners, texts = [], []
    for i, (url, meta) in enumerate(zip(urls, metas)):
        for where, found in (("url", _url_texts(url) if url else ()),
                             ("meta", _meta_texts(json.loads(meta)) if meta else ())):
            for text in found:
                owners.append((i, where))
                texts.append(text)
    out: list[list[tuple[str, str]]] = [[] for _ in urls]
    for (i, where), spans in zip(owners, residual_pii_batch(texts, types, ipv4_keep, keep_documentation,
                                                            phone_regions)):
        out[i].extend((where, kind) for kind, _, _ in spans)
    return out


# --- a stage's whole output ---------------------------------------------------------------------------


@dataclass
class ResidualReport:
    """What the scan of a stage's output found: counts only, and document ids, never the matched text."""

    hits: dict[str, int] = field(default_factory=dict)  # type -> findings
    fields: dict[str, int] = field(default_factory=dict)  # text / url / meta -> findings
    examples: list[str] = field(default_factory=list)  # "doc_id: type in field", the first few

    def add(self, other: ResidualReport, examples: int) -> None:
        for mine, theirs in ((self.hits, other.hits), (self.fields, other.fields)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        self.examples += other.examples[:max(examples - len(self.examples), 0)]


@dataclass(frozen=True)
class _ScanTask:
    path: str
    types: tuple[str, ...]
    ipv4_keep: tuple[str, ...]
    keep_documentation: bool
    phone_regions: tuple[str, ...]
    examples: int


def _scan_part(task: _ScanTask) -> ResidualReport:
    report = ResidualReport()
    settings = (task.types, task.ipv4_keep, task.keep_documentation, task.phone_regions)
    for batch in pq.ParquetFile(task.path).iter_batches(batch_size=1000, columns=["doc_id", "text", "url", "meta"]):
        in_text = residual_pii_batch(batch.column("text"), *settings)
        in_fields = residual_pii_fields(batch.column("url").to_pylist(), batch.column("meta").to_pylist(), *settings)
        for doc_id, spans, others in zip(batch.column("doc_id").to_pylist(), in_text, in_fields):
            for where, kind in [("text", kind) for kind, _, _ in spans] + others:
                report.hits[kind] = report.hits.get(kind, 0) + 1
                report.fields[where] = report.fields.get(where, 0) + 1
                if len(report.examples) < task.examples:
                    report.examples.append(f"{doc_id}: {kind} in {where}")
    return report


def scan_documents(paths: Sequence[Path], types: Iterable[str] = PII_TYPES,
                   ipv4_keep: Iterable[str] = ("127.0.0.1", "0.0.0.0", "255.255.255.255"),
                   keep_documentation: bool = True, phone_regions: Iterable[str] = AUDIT_PHONE_REGIONS,
                   engine: Engine = SERIAL, examples: int = 5, progress: bool = True) -> ResidualReport:
    """`residual_pii` over the text, url and meta of every document of a stage's Parquet parts, one engine task
    per part, so the scan of a large output is spread as the stage that wrote it was. The examples are the first
    `examples` findings in part order, whatever the engine."""
    tasks = [_ScanTask(str(p), tuple(types), tuple(ipv4_keep), keep_documentation, tuple(phone_regions), examples)
             for p in paths]
    report = ResidualReport()
    for part in engine.map_parts(_scan_part, tasks, desc="residual pii", progress=progress,
                                  size=lambda t: os.path.getsize(t.path)):
        report.add(part, examples)
    return report


__all__ = ["AUDIT_PHONE_REGIONS", "AUDIT_SCREENS", "IBAN_COUNTRY_LENGTHS", "ResidualReport", "residual_pii",
           "residual_pii_batch", "residual_pii_fields", "scan_documents"]
