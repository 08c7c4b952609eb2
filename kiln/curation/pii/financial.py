"""Account and identity numbers: IBANs (SWIFT registry lengths, mod 97), US social security numbers (SSA rules)
and payment card numbers (Luhn, issuer ranges)."""

from __future__ import annotations

import re
from collections.abc import Iterator

from kiln.curation.pii.base import _LEAD, _NUM_R, glued

# --- iban ---------------------------------------------------------------------------------------
# ISO 13616: country code, two check digits, then a BBAN whose length the country fixes (the SWIFT IBAN
# registry), written compact (DE89370400440532013000) or in groups of four split by single spaces
# (DE89 3704 0044 0532 0130 00) or dashes (DE89-3704-0044-0532-0130-00), one separator throughout. Valid when the number moved to the end, letters as 10-35, is 1 mod 97
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
    "IR": 26,  # not in SWIFT's registry: Iran's own Sheba number, ISO 13616 in form, written on every Persian invoice
}
# Upper case, as ISO 13616 writes both forms, or in lower case as people type them ("de89 3704 0044 0532 0130 00",
# "gb82west12345698765432", "GB82 west ..."), or with a capital first letter: a phone's keyboard capitalises the first
# word of a message or a line ("De89 3704 ...", "Gb82 West ..."). A country not in capitals is found from its check
# digits (a pattern led by a lower-case letter is tried at most positions of a text: several times slower), two
# characters before its match. A word is never one: the country's exact length and mod 97 (1 in 97) must hold too.
_IBAN_BODY = (r"(?:[{a}0-9]{{11,30}}"
              r"|(?P<sep>[ -])[{a}0-9]{{4}}(?:(?P=sep)[{a}0-9]{{4}}){{1,6}}(?:(?P=sep)[{a}0-9]{{1,4}})?)")
_IBAN = re.compile(r"[A-Z]{2}[0-9]{2}" + _IBAN_BODY.format(a="A-Za-z"))
_IBAN_LOWER = re.compile(r"[0-9]{2}(?<=[A-Za-z][a-z][0-9]{2})" + _IBAN_BODY.format(a="A-Za-z"))
_HEX = frozenset("0123456789abcdef")


def iban_ok(s: str) -> bool:
    """ISO 13616 check: a registered country, its length, check digits 02-98, and mod 97 = 1."""
    compact = s.replace(" ", "").replace("-", "").upper()
    if IBAN_LENGTHS.get(compact[:2]) != len(compact) or not compact[2:4].isdigit() or not 2 <= int(compact[2:4]) <= 98:
        return False
    if not compact.isalnum() or not compact.isascii():
        return False
    return int("".join(str(int(c, 36)) for c in compact[4:] + compact[:4])) % 97 == 1


def _find_iban(text: str) -> Iterator[tuple[int, int]]:
    yield from _find_iban_in(text, _IBAN, 0)
    yield from _find_iban_in(text, _IBAN_LOWER, 2)


def _find_iban_in(text: str, pattern: re.Pattern, lead: int) -> Iterator[tuple[int, int]]:
    """IBANs found by `pattern`, whose matches start `lead` characters after the IBAN's."""
    for m in pattern.finditer(text):
        start = m.start() - lead
        s = text[start : m.end()]
        length = IBAN_LENGTHS.get(s[:2].upper())
        if length is None or (start > 0 and glued(text[start - 1])):
            continue
        if s[4:].isalnum() and set(s[4:]) <= _HEX and not s[4:].isdigit():
            continue  # lower-case hex with a letter after the check digits: a hash or an id ("ad12f3..."), no account
        if sep := m.group("sep"):
            # Groups of four: the IBAN ends at the group that completes the country's length, which must
            # end the group (a longer last group is a different token: "DE89 ... 00 BIC").
            end = length + (length - 1) // 4  # characters with a separator after every 4
            if len(s) < end or (end < len(s) and s[end] != sep):
                continue
            span = (start, start + end)
        else:
            if len(s) != length:
                continue
            span = (start, m.end())
        nxt = text[span[1] : span[1] + 1]
        if (nxt and glued(nxt)) or not iban_ok(text[span[0] : span[1]]):
            continue
        yield span


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
    # National networks, from the IIN table of Wikipedia's "Payment card number" (2024): RuPay (India; its 65, 353
    # and 356 are Discover's and JCB's above), Verve (Nigeria; its 650002-650027 are in Discover's 65), UzCard and
    # Humo (Uzbekistan), Troy (Turkey; its 65 is Discover's).
    ("60", "60", (16,)),  # RuPay (with the Shetab banks 603769, 603770, 603799)
    ("81", "82", (16,)),
    ("508", "508", (16,)),
    ("506099", "506198", (16, 18, 19)),  # Verve
    ("507865", "507964", (16, 18, 19)),
    ("8600", "8600", (16,)),  # UzCard
    ("5614", "5614", (16,)),
    ("9860", "9860", (16,)),  # Humo
    ("979200", "979289", (16,)),  # Troy
    # Elo (Brazil), the ranges of its own that no network above covers (Braintree's credit-card-type table; its
    # 4... ranges are Visa's, 627780 is in UnionPay's 62, 650031-655058 in Discover's 65).
    ("504175", "504175", (16,)),
    ("506699", "506778", (16,)),
    ("509000", "509999", (16,)),
    ("636297", "636297", (16,)),
    ("636368", "636368", (16,)),
    # Shetab (Iran): the member banks' BINs outside 60 and 62 (the Central Bank of Iran's list, as Iranian payment
    # libraries carry it): Mellat, Sepah, Refah, Pasargad, Tose'e Ta'avon, Shahr, Day, Sina, Sarmayeh, Tat/Ayandeh,
    # Mehr Eqtesad.
    ("610433", "610433", (16,)),
    ("589210", "589210", (16,)),
    ("589463", "589463", (16,)),
    ("502229", "502229", (16,)),
    ("502806", "502806", (16,)),
    ("502908", "502908", (16,)),
    ("502938", "502938", (16,)),
    ("636214", "636214", (16,)),
    ("639346", "639346", (16,)),
    ("639370", "639370", (16,)),
    ("639607", "639607", (16,)),
)


def _luhn_ok(digits: str) -> bool:
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return total % 10 == 0


def _card_ok(digits: str, grouped: bool = False) -> bool:
    # A bare run ending in five zeros is a round number (an amount, a power, a product in a maths table: 1 in 100,000
    # real cards); one written in a card's groups ("4111 1111 1117 0000") is a card whatever its last digits.
    if not grouped and digits.endswith("00000"):
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
            if _card_ok(digits, grouped=k > 1):
                end = m.start() + len(" ".join(groups[:k]))
                break
        if end is not None:
            yield m.start(), end
            pos = end
        else:
            pos = m.start() + len(groups[0]) + 1  # a card may still start at the next group
