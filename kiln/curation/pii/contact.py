"""Contact details: e-mail addresses, and phone numbers (North American, international +CC, and the national
formats of `phone_regions`), checked against libphonenumber's numbering plans: valid numbers, and possible ones
(unassigned ranges, typos) where a country code or trunk prefix says they are phone numbers."""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from functools import lru_cache, partial

import phonenumbers
from phonenumbers.phonenumberutil import (  # pinned: constraints.txt
    _choose_formatting_pattern_for_number,
    _maybe_strip_national_prefix_carrier_code,
)

from kiln.common.text_units import MARKS_BMP
from kiln.curation.pii.base import _NUM_R, _UNSPACED, _UNSPACED_LETTER, _WORD, glued

# libphonenumber compiles its metadata's patterns as it meets each region; `re` caches only 512, fewer than the
# metadata has, so a corpus of many countries would recompile them over and over. Keep every compiled one.
phonenumbers.re_util.enable_pattern_cache()


# --- email --------------------------------------------------------------------------------------
# local@domain.tld with a TLD of 2+ letters: `@decorator`, `user@localhost` and `pip install pkg@1.2`
# are not addresses. Retina image names (`icon@2x.png`) and SSH remotes (`git@github.com:user/repo`)
# are excluded explicitly. A TLD may also be an IDNA one in its ASCII form ("ivan@mail.xn--p1ai": .рф). Matching
# starts only at '@' signs (rare, found with str.find) and walks back over the local part, at most 64 characters
# (RFC 5321). A TLD is in one script: "bugs@samba.org发一个日志"
# ends at "org". Local parts and domain labels hold any script's letters with their combining marks (RFC 6531
# addresses: "प्रिया@gmail.com", "somsri@ตัวอย่าง.com"; Indic vowel signs and Thai vowels are marks, not letters).
_EMAIL_CHAR = r"[\w%+" + MARKS_BMP + r"-]"
_EMAIL_LEAD = r"(?<!" + _WORD + r")(?<![%+" + MARKS_BMP + r"-])"
_EMAIL_BODY = (
    _EMAIL_CHAR + r"+(?:\." + _EMAIL_CHAR + r"+)*"
    r"@(?![0-9]+(?:\.[0-9]+)?x\.(?:png|jpe?g|gif|webp|svg|ico|bmp|avif)(?![\w-]))"
    r"(?:[^\W_][\w" + MARKS_BMP + r"-]{0,62}\.)+"
    r"(?:[Xx][Nn]--[A-Za-z0-9-]{0,58}[A-Za-z0-9]"  # an IDNA top-level domain in ASCII: xn--p1ai (.рф)
    r"|(?:[^\W\d_" + _UNSPACED + r"][" + MARKS_BMP + r"]*){2,63}|(?:[" + _UNSPACED + r"][" + MARKS_BMP + r"]*){2,63})"
    r"(?!" + _WORD + r")(?!-)(?!:[\w~/])"
)
_EMAIL = re.compile(_EMAIL_LEAD + _EMAIL_BODY)
# The same address percent-encoded, as a URL written into text carries it ("mailto:jane.doe%40example.org",
# "?email=jane.doe%40gmail.com&..."): its '@' written "%40"; or encoded twice, as a URL inside another URL's query
# carries it (a redirect or tracking link: "?u=https%3A%2F%2Fx.com%2Fsub%3Fe%3Djane.doe%2540gmail.com"): "%2540".
# Its local part starts after the link's own syntax encoded before it ('=', '?', '&', '/', ':' encoded once or twice:
# "%3Femail%3Djane%40...", "%253Fe%253Djane%252540..."): "email%3D" is the rest of the link, not the address.
_ENCODED_AT_SIGNS = ("%40", "%2540")
_ENCODED_SEPARATOR = re.compile(r"%(?:25)?(?:3[ADFadf]|26|2[Ff])")
_AFTER_ENCODED_SEPARATOR = r"(?:(?<=%3[ADFadf])|(?<=%26)|(?<=%2[Ff])|(?<=%253[ADFadf])|(?<=%2526)|(?<=%252[Ff])|"
_EMAIL_ENCODED = {sign: re.compile(_AFTER_ENCODED_SEPARATOR + _EMAIL_LEAD + ")" + _EMAIL_BODY.replace("@", sign, 1))
                  for sign in _ENCODED_AT_SIGNS}
_LOCAL = frozenset("_%+-")  # local-part characters besides letters, digits, marks and single dots
_MARK = re.compile("[" + MARKS_BMP + "]")


def _is_local(c: str) -> bool:
    return c.isalnum() or c in _LOCAL or _MARK.match(c) is not None


def _find_email(text: str) -> Iterator[tuple[int, int]]:
    yield from _find_email_at(text, "@", _EMAIL)
    for sign, pattern in _EMAIL_ENCODED.items():
        if sign in text:
            yield from _find_email_at(text, sign, pattern)


def _find_email_at(text: str, sign: str, pattern: re.Pattern) -> Iterator[tuple[int, int]]:
    at = text.find(sign)
    while at != -1:
        # Back to the start of the local part: word characters, and dots only between two of them
        # (so "see...bob@x.org" starts at "bob"). _EMAIL's look-behind rejects a run longer than 64 (but
        # one of letters of unspaced scripts: their text runs into the address, _local_part_start).
        start = at
        while start > 0 and at - start <= 64 and (
            _is_local(text[start - 1])
            or (text[start - 1] == "." and start < at and start >= 2 and _is_local(text[start - 2]))
        ):
            start -= 1
        start = _local_part_start(text, start, at)
        if sign != "@":
            for sep in _ENCODED_SEPARATOR.finditer(text, start, at):
                start = sep.end()
        m = pattern.match(text, start)
        if m is not None and not _in_url_userinfo(text, start):
            yield m.span()
        at = text.find(sign, m.end() if m is not None else at + 1)


def _local_part_start(text: str, start: int, at: int) -> int:
    """Scripts written without spaces (Chinese, Japanese, Thai ...) run into an address: in "邮箱地址zhangwei@163.com" it
    starts after their last letter. A local part all in them ("张伟@163.com") is kept whole."""
    local = text[start:at]
    if local.isascii() or _UNSPACED_LETTER.search(local) is None or _UNSPACED_LOCAL.fullmatch(local):
        return start
    start = at
    while _UNSPACED_LETTER.match(text[start - 1]) is None:
        start -= 1
    while start < at and (text[start] == "." or _MARK.match(text[start])):
        start += 1
    return start


_UNSPACED_LOCAL = re.compile("[" + _UNSPACED + "][." + _UNSPACED + MARKS_BMP + "]*")


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

# Hebrew joins its one-letter prefixes (ב "in", ה "the", ו "and", ל "to", מ "from", ש "that") to the next word, a
# number too: "התקשרו ל050-1234567" ("call 050-..."). One or two of them do not make a number part of a longer token.
_HEBREW_PREFIX = "[\u05d1\u05d4\u05d5\u05dc\u05de\u05e9]"
_GLUE = "[^\\W" + _UNSPACED + "\u05d1\u05d4\u05d5\u05dc\u05de\u05e9]"  # _WORD less those prefixes


def _unglued(first: str) -> str:
    """Look-behinds for a phone number's first character (`first`, a pattern of one character): no word character
    right before it, but one or two Hebrew prefix letters with none before them."""
    return (f"(?<!{_GLUE}{first})(?<!{_GLUE}{_HEBREW_PREFIX}{first})"
            f"(?<!{_WORD}{_HEBREW_PREFIX}{_HEBREW_PREFIX}{first})")


# North American: (555) 123-4567, 555-123-4567, 555.123.4567 (one separator throughout), optionally
# after a leading 1. Area codes never start with 0 or 1, which also keeps "123-456-7890" counters out.
# These shapes are unmistakable on their own and are not validated (555 numbers are fictional, and
# still what a document's author wrote as a phone number). A bare 10-digit run is as likely an order
# id or a timestamp and is not matched.
# The first character is consumed, then the branches look behind at what it was: '(' , an area
# code's first digit, or a leading '1'.
_PHONE_NANP = re.compile(
    "[(0-9]" + _unglued("[(0-9]") + r"(?<!\+[(0-9])(?<![0-9][.-][(0-9])"
    r"(?:(?:(?<=\()|(?<=1)[ .-]?\()[2-9][0-9]{2}\) ?[0-9]{3}[.-][0-9]{4}"
    r"|(?:(?<=[2-9])|(?<=1)[ .-]?[2-9])[0-9]{2}(?P<sep>[.-])[0-9]{3}(?P=sep)[0-9]{4})" + _NUM_R
)
# International: '+' (or "(+49)"), the country code, then digit groups of any length split by one
# space, no-break space, dot, dash or slash, with parenthesised area or trunk codes anywhere:
# +49 30 91456342, +44 7323 277460, +49 (0)89 1234 5678, +7 (495) 123-45-67, +8613812345678.
# Each group is a maximal digit run ended by a separator or '(', so there is no ambiguous split to
# backtrack over. A candidate is a phone number when libphonenumber says the number is valid in the
# country its code names (the right length and a range that is actually assigned), or possible there:
# a length and leading digits of a shape that country writes, assigned or not (_possible_number: an
# unassigned range, a typo). Either rejects scores, formulas, dates, coordinates and timezone offsets
# that merely start with '+'. When the whole run is neither, trailing space-separated groups are dropped
# one by one while the rest is valid (a number followed by another number, "+44 20 7946 0958 3"); a run
# joined by '-' or '.' to more digits is one token and stays whole or nothing.
_PHONE_SEP = "[ \u00a0\u202f.\\-/]"
_PHONE_INTL = re.compile(
    r"\+" + _unglued(r"\+") + r"(?<!\+\+)[1-9][0-9]*(?P<cc>\))?"
    r"(?:" + _PHONE_SEP + r"?\([0-9]{1,5}\)" + _PHONE_SEP + r"?[0-9]+|" + _PHONE_SEP + r"[0-9]+){0,8}"
)
# National formats (no country code: 030 91456342, 06 12 34 56 78, (021) 737 8957, 0459/45.66.33,
# 8 (925) 620-38-13, 090-7385-4464; a trunk prefix and an area code in one pair of parentheses: Hungary's
# (06 1) 234 5678, Lithuania's (0-312) 34567, Turkmenistan's (8 12) 34-56-78) are how most people write their
# number, and look like any list of numbers in code and tables. A national candidate counts when libphonenumber
# says it is a valid number of one of `phone_regions` (or a possible one, _possible_number, written with the
# region's trunk prefix and at least _MIN_POSSIBLE_NATIONAL digits after it), written the way that region writes
# it (its trunk prefix where the region's own format has one: "030 91456342" in DE, never "30 91456342"; CN mobiles
# and NANP numbers without), and either
#   - a phone cue precedes it: a label or a calling phrase on its line ("Tel.", "phone=", "Móvil:",
#     "TEL;TYPE=CELL:", "llámanos al", "appelez-nous au", "Bel ons op", "call me on", "電話", "联系电话",
#     "전화번호", "هاتف", "טלפון", "फ़ोन"...), a "phone" column in a CSV / table header above it, or an e-mail address
#     right before it (a contact or signature block): then any grouping, or none;
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
    r"(?:\(" + _unglued(r"\(") + r"(?<![+(.]\()(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){7})0?[0-9]{1,5}(?:[ -][0-9]{1,4})?\)"
    r"|[0-9]" + _unglued("[0-9]") + r"(?<![+.(][0-9])(?<![0-9][.,/-][0-9])(?<![A-Za-z]-[0-9])"
    r"(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){6})"
    r"[0-9]*)"
    r"(?:" + _PHONE_SEP + r"?\([0-9]{1,5}\)" + _PHONE_SEP + r"?[0-9]+|" + _PHONE_SEP + r"[0-9]+){0,8}"
)
# The candidates an uncued number can be (_TRUNK_START): the same runs as _NATIONAL finds, found from their start.
_NATIONAL_TRUNK = re.compile(
    r"(?:\(" + _unglued(r"\(") + r"(?<![+(.]\()(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){7})0?[0-9]{1,5}(?:[ -][0-9]{1,4})?\)"
    r"|0" + _unglued("0") + r"(?<![+.(]0)(?<![0-9][.,/-]0)(?<![A-Za-z]-0)(?=[0-9])"
    r"(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){6})[0-9]*"
    r"|8" + _unglued("8") + r"(?<![+.(]8)(?<![0-9][.,/-]8)(?<![A-Za-z]-8)(?= \([0-9])"
    r"(?=(?:[ \u00a0\u202f./()-]{0,2}[0-9]){6}))"
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
    # Arabic هاتف جوال موبايل تلفون اتصل اتصال; Persian تلفن همراه موبایل تماس
    r"|\u0647\u0627\u062a\u0641|\u062c\u0648\u0627\u0644|\u0645\u0648\u0628\u0627[\u064a\u06cc]\u0644"
    r"|\u062a\u0644\u0641\u0648\u0646|\u0627\u062a\u0635\u0627?\u0644|\u062a\u0644\u0641\u0646"
    r"|\u0647\u0645\u0631\u0627\u0647|\u062a\u0645\u0627\u0633"
    # Hebrew טלפון נייד פקס טל'
    r"|\u05d8\u05dc\u05e4\u05d5\u05df|\u05e0\u05d9\u05d9\u05d3|\u05e4\u05e7\u05e1|\u05d8\u05dc['\u05f3]"
    # Hindi फ़ोन फोन मोबाइल दूरभाष संपर्क (फ़ as फ + nukta, NFC's form, or as U+095E)
    r"|(?:\u092b\u093c?|\u095e)\u094b\u0928|\u092e\u094b\u092c\u093e\u0907\u0932"
    r"|\u0926\u0942\u0930\u092d\u093e\u0937|\u0938\u0902\u092a\u0930\u094d\u0915"
    # Thai โทร มือถือ; Greek τηλ κινητ
    r"|\u0e42\u0e17\u0e23|\u0e21\u0e37\u0e2d\u0e16\u0e37\u0e2d|\u03c4\u03b7\u03bb|\u03ba\u03b9\u03bd\u03b7\u03c4"
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
# labelled national number it would be valid somewhere ("call me at 666-12-3456": a Spanish mobile). Written with
# spaces after a phone cue it is a phone number (Tajikistan's national format, "Tel: 372 12 3456"; an SSN so written
# needs an SSN label, and that detector comes first).
_SSN_SHAPE = re.compile(r"[0-9]{3}[- ][0-9]{2}[- ][0-9]{4,5}")
_NON_DIGITS = re.compile(r"[^0-9]+")
_NOT_BINARY = re.compile(r"[2-9]")


# A country code, a space, and the national number in dotted groups, as New Caledonia and French Polynesia write it
# ("+687 75.12.34"; France's "+33 1.23.45.67.89"): dots throughout the national number, so no decimal.
_DOTTED_AFTER_COUNTRY_CODE = re.compile(r"\+[0-9]{1,3}[ \u00a0\u202f][0-9]+(?:\.[0-9]+){2,}")


def _shape_ok(s: str) -> bool:
    # Dots mixed with other separators, or a single one, are decimals ("+3.14 2.71", "+35236450.6"), never a
    # phone number (dotted ones use dots throughout: +33.1.23.45.67.89, +687 75.12.34). E.164 allows at most 15
    # digits (a national trunk "0" makes 16 and an international "00" prefix 17).
    seps = set(_PHONE_SEPS.findall(s))
    if "." in seps and (len(seps - {".", "/"}) > 0 or (s.count(".") == 1 and "/" not in seps)) and not (
            _DOTTED_AFTER_COUNTRY_CODE.fullmatch(s)):
        return False
    if _DATE_LIKE.fullmatch(s.lstrip("+")) or _DATE_START.match(s.lstrip("+(")):
        return False
    if seps == {"."} and s.count(".") == 3 and all(len(g) <= 3 for g in s.lstrip("+").split(".")):
        return False  # an IPv4 address, a version or an OID's shape ("0.10.256.0"), not a phone number
    if not _NOT_BINARY.search(s):
        return False  # bits ("0100 1101", "0b 0100 0000 1111 0000"): 0s and 1s alone, 1 in 1,000 seven-digit numbers
    return 6 <= sum(c.isdigit() for c in s) <= 17


def _international_ok(s: str, possible: bool = True) -> bool:
    """+CC...: valid in the country its code names, a North American number (fictional 555s included), or
    (`possible`) a number the country's plan could hold (_possible_number)."""
    if not _shape_ok(s):
        return False
    try:
        n = phonenumbers.parse(s, None)
    except phonenumbers.NumberParseException:
        return False
    return n.extension is None and (phonenumbers.is_valid_number(n) or _nanp_shape(n)
                                    or (possible and _possible_number(n)))


def _possible_number(n: phonenumbers.PhoneNumber) -> bool:
    """A number its country's plan could hold, assigned or not: one of the lengths its numbers have, and the
    leading digits and length of one of the ways the country writes its numbers (libphonenumber's formats).
    Validity asks more, a range a carrier actually holds: "+44 20 5876 9083" and "+81 3-0002-0479" are not, but
    a reader sees phone numbers, and so are most typos of real ones. North American numbers also keep the plan's
    NXX NXX-XXXX rule (no area code or exchange starts with 0 or 1: "+1 (215) 029-5856" is none)."""
    if phonenumbers.is_possible_number_with_reason(n) != phonenumbers.ValidationResult.IS_POSSIBLE:
        return False  # a wrong length, or one only diallable locally (which a number with its country never is)
    nsn = phonenumbers.national_significant_number(n)
    if n.country_code == 1 and (nsn[0] in "01" or nsn[3] in "01"):
        return False
    region = phonenumbers.region_code_for_country_code(n.country_code)
    md = (phonenumbers.PhoneMetadata.metadata_for_nongeo_region(n.country_code) if region == "001"
          else phonenumbers.PhoneMetadata.metadata_for_region(region))
    return md is not None and _choose_formatting_pattern_for_number(md.number_format, nsn) is not None


@lru_cache(maxsize=8)
def _region_table(regions: tuple[str, ...]) -> tuple[tuple[str, str, re.Pattern, re.Pattern | None,
                                                           phonenumbers.PhoneMetadata | None], ...]:
    """(region, trunk prefix, its numbers' general pattern, the prefixes its numbers are read without (libphonenumber's
    national_prefix_for_parsing: Belarus writes its trunk prefix 8 and then the area code's 0, "8 0152 45-09-11"), its
    metadata where it rewrites a number as it parses it): a cheap test before libphonenumber's own."""
    out = []
    for region in regions:
        md = phonenumbers.PhoneMetadata.metadata_for_region(region)
        if md is None or md.general_desc is None or md.general_desc.national_number_pattern is None:
            continue
        out.append((region, md.national_prefix or "", re.compile(md.general_desc.national_number_pattern),
                    re.compile(md.national_prefix_for_parsing) if md.national_prefix_for_parsing else None,
                    md if md.national_prefix_transform_rule else None))
    return tuple(out)


def _parsed_national(digits: str, rewrites: phonenumbers.PhoneMetadata | None) -> str:
    """The national number libphonenumber reads `digits` as in a region that rewrites numbers as it parses them (its
    metadata: `rewrites`): Argentina's "011 15 2345 6789" is 9 11 2345 6789 (a mobile), Brazil's "0 21 11 ..." drops
    the carrier code 21. '' elsewhere, or where nothing is rewritten."""
    if rewrites is None:
        return ""
    _, national, stripped = _maybe_strip_national_prefix_carrier_code(digits, rewrites)
    return national if stripped else ""


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


# A national number in no assigned range (valid in none of `regions`, possible in one) must also be long: short
# digit runs after a 0 are code and tables far more often ("012 0123", a hex dump's "00 00 00 ..."), and its
# number never starts with the trunk prefix again (0 0...: the international prefix).
_MIN_POSSIBLE_NATIONAL = 8


def _national_ok(s: str, regions: tuple[str, ...], grouped: bool) -> bool:
    """A national-format number valid in one of `regions` and written as that region writes it (see above);
    `grouped`: also grouped as the region groups it."""
    if not _shape_ok(s) or (_SSN_SHAPE.fullmatch(s) and ("-" in s or grouped)):
        return False  # spaced after a phone cue, it is the number the cue names (Tajikistan's "372 12 3456")
    digits = _NON_DIGITS.sub("", s)
    written = _DIGIT_GROUPS.findall(s)
    if len(digits) < 7 or _isbn_like(digits, written):
        return False
    for region, trunk, general, prefixes, rewrites in _region_table(regions):
        nsn = digits[len(trunk):] if trunk and digits.startswith(trunk) else digits
        read = prefixes.match(digits) if prefixes is not None else None
        if not (general.fullmatch(nsn) or general.fullmatch(digits) or digits.startswith("00")
                or (read is not None and general.fullmatch(digits[read.end():]))
                or general.fullmatch(_parsed_national(digits, rewrites))):
            continue
        try:
            n = phonenumbers.parse(s, region, keep_raw_input=True)
        except phonenumbers.NumberParseException:
            continue
        valid = phonenumbers.is_valid_number(n)
        if n.extension is not None or not (valid or _possible_number(n)):
            continue
        if n.country_code_source == phonenumbers.CountryCodeSource.FROM_NUMBER_WITH_IDD:
            return not grouped or len(written) > 1  # 0049 30 91456342: the number names its country
        carrier = n.preferred_domestic_carrier_code  # as written: "0 21 (11) 91234-5678" names carrier 21 (BR)
        formatted = (phonenumbers.format_national_number_with_carrier_code(n, carrier) if carrier
                     else phonenumbers.format_number(n, phonenumbers.PhoneNumberFormat.NATIONAL))
        fgroups = _DIGIT_GROUPS.findall(formatted)
        national = phonenumbers.national_significant_number(n)
        if not valid and not (trunk and digits == trunk + national and len(national) >= _MIN_POSSIBLE_NATIONAL
                              and not national.startswith(trunk)):
            continue  # a number in no assigned range counts only with the trunk prefix that says "national number"
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


def _phone_end(text: str, start: int, end: int, ok: Callable[[str], bool], trim: bool,
               ok_cut: Callable[[str], bool] | None = None) -> int | None:
    """Where the phone number text[start:end] is ends: `end` if it is one, else (`trim`) the end of its longest
    prefix cut at a space that is one (by `ok_cut`, default `ok`); None when no such number, or when the run is a
    slice of a longer token."""
    if (end < len(text) and glued(text[end])) or (
            end + 1 < len(text) and text[end] in ".-:," and text[end + 1].isdigit()):
        return None  # a slice of a longer token, a decimal, or a time ("... 14:22:05")
    while True:
        if ok(text[start:end]):
            return end
        ok = ok_cut or ok
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
                if start > 0 and glued(text[start - 1]):
                    continue
            # A run cut short must be a valid number: a merely possible prefix of a longer impossible run
            # ("+86 123 4567" of "+86 123 4567 8901") is no evidence of where a number ends.
            found = _phone_end(text, start, end, _international_ok, trim=True,
                               ok_cut=partial(_international_ok, possible=False))
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
