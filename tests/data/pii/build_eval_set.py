"""Build the labelled PII evaluation set, tests/data/pii/eval.jsonl (GitHub issue 20, item 2).

    python tests/data/pii/build_eval_set.py [--out tests/data/pii/eval.jsonl] [--stats]

Deterministic (fixed seed, standard library only) and independent of the detector under test: nothing
here imports `kiln`. Every positive is written from a published format:

- phone: ITU-T E.164 country codes and each country's national numbering plan (area codes, mobile
  ranges, number lengths), in the ways people write numbers in that country (national with trunk
  prefix, international with +CC or 00CC, the local grouping and separators);
- iban: ISO 13616 as published in the SWIFT IBAN registry (length and BBAN structure per country),
  ISO 7064 mod 97-10 check digits computed here, and the national check digits where a country defines
  a simple one (BE, ES, FR, IT);
- us_ssn: the SSA's rules (area 001-899 except 666, group 01-99, serial 0001-9999);
- credit_card: issuer identification number ranges and lengths per network, Luhn check digit;
- ipv4 / ipv6: globally routable unicast addresses (IANA special-purpose registries excluded, RFC 5737 and
  RFC 3849 documentation ranges excluded);
- email: RFC 5321/5322 addresses with personal local parts on real-world mail domains and TLDs;
- secret: the token formats providers publish (AWS, GitHub, Slack, Stripe, Google, GitLab, npm, PyPI,
  OpenAI, Anthropic, Hugging Face, SendGrid, ...), PEM private keys (RFC 7468) with valid DER
  prefixes, JWTs (RFC 7519), credentials in URLs and random values assigned to credential names.

Near-misses are written the same way (ISBN check digits, UUID version bits, ...). See README.md for the
decisions on what counts as PII. Each output line is one JSON object:
{"id", "kind", "type", "country", "near_miss_kind", "text", "spans": [{"type", "start", "end"}]}.
"""

from __future__ import annotations

import argparse
import base64
import ipaddress
import json
import random
import re
import sys
import unicodedata
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

SEED = 20240315
OUT = Path(__file__).resolve().parent / "eval.jsonl"
TYPES = ("email", "phone", "ipv4", "ipv6", "us_ssn", "credit_card", "iban", "secret")
DIGITS = "0123456789"
UPPER = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
LOWER = "abcdefghijklmnopqrstuvwxyz"
ALNUM = UPPER + LOWER + DIGITS
B64 = ALNUM + "+/"
B64URL = ALNUM + "-_"
HEX = "0123456789abcdef"


@dataclass(frozen=True)
class Pii:
    """A labelled item inside a template."""

    type: str
    text: str


_SLOT = re.compile(r"⟦(\w+)⟧")


def compose(template: str, fields: dict) -> tuple[str, list[dict]]:
    """Fill ⟦slot⟧s; Pii values become labelled spans, anything else is plain text."""
    out: list[str] = []
    spans: list[dict] = []
    pos = n = 0
    for m in _SLOT.finditer(template):
        lit = template[pos:m.start()]
        out.append(lit)
        n += len(lit)
        v = fields[m.group(1)]
        if isinstance(v, Pii):
            spans.append({"type": v.type, "start": n, "end": n + len(v.text)})
            v = v.text
        out.append(v)
        n += len(v)
        pos = m.end()
    out.append(template[pos:])
    return "".join(out), spans


def D(rng: random.Random, n: int, first: str = DIGITS) -> str:
    """n random digits, the first from `first`."""
    if n <= 0:
        return ""
    return rng.choice(first) + "".join(rng.choice(DIGITS) for _ in range(n - 1))


def R(rng: random.Random, n: int, alphabet: str) -> str:
    return "".join(rng.choice(alphabet) for _ in range(n))


def pick(rng: random.Random, weighted: list[tuple[int, object]]):
    total = sum(w for w, _ in weighted)
    x = rng.randrange(total)
    for w, v in weighted:
        if x < w:
            return v
        x -= w
    raise AssertionError


def rbytes(rng: random.Random, n: int) -> bytes:
    return rng.getrandbits(8 * n).to_bytes(n, "big")


def grp(s: str, sizes: list[int], sep: str = " ") -> str:
    out, i = [], 0
    for k in sizes:
        out.append(s[i:i + k])
        i += k
    if i < len(s):
        out.append(s[i:])
    return sep.join(x for x in out if x)


# --- people and places used in contexts ---------------------------------------------------------

NAMES = [
    ("Anna", "Schmidt"), ("Lukas", "Müller"), ("Sophie", "Martin"), ("Hugo", "Lefèvre"), ("Giulia", "Rossi"),
    ("Marco", "Bianchi"), ("Lucía", "García"), ("Javier", "Fernández"), ("Emma", "de Vries"), ("Daan", "Jansen"),
    ("Lotte", "Peeters"), ("Noah", "Huber"), ("Lea", "Gruber"), ("Elias", "Meier"), ("Astrid", "Lindqvist"),
    ("Oskar", "Nilsson"), ("Zofia", "Kowalska"), ("Jakub", "Nowak"), ("Aoife", "Murphy"), ("Cian", "Byrne"),
    ("Olivia", "Smith"), ("Jack", "Wilson"), ("Charlotte", "Brown"), ("Mia", "Thompson"), ("Yuki", "Tanaka"),
    ("Haruto", "Suzuki"), ("Priya", "Sharma"), ("Arjun", "Patel"), ("Ana", "Souza"), ("João", "Oliveira"),
    ("Sofía", "Hernández"), ("Diego", "López"), ("Thandiwe", "Nkosi"), ("Sipho", "Dlamini"), ("Wei", "Zhang"),
    ("Li", "Wang"), ("Minjun", "Kim"), ("Seoyeon", "Park"), ("Dmitri", "Ivanov"), ("Olga", "Petrova"),
    ("Inês", "Costa"), ("Tiago", "Ferreira"), ("Emily", "Johnson"), ("Michael", "Williams"), ("Ethan", "Tremblay"),
    ("Chloé", "Gagnon"), ("Liam", "Walsh"), ("Grace", "Taylor"), ("Mateo", "Ruiz"), ("Fatima", "Khan"),
    ("Omar", "Haddad"), ("Sarah", "Cohen"), ("David", "Levi"), ("Nina", "Berg"), ("Jonas", "Weber"),
    ("Clara", "Fischer"), ("Paul", "Wagner"), ("Marie", "Dubois"), ("Louis", "Moreau"), ("Elena", "Romano"),
    ("Luca", "Ricci"), ("Carmen", "Díaz"), ("Pablo", "Moreno"), ("Sanne", "Bakker"), ("Ruben", "Visser"),
    ("Ingrid", "Hansen"), ("Mikkel", "Larsen"), ("Aino", "Virtanen"), ("Mateusz", "Wiśniewski"), ("Hana", "Novák"),
    ("Kenji", "Watanabe"), ("Sakura", "Ito"), ("Rahul", "Gupta"), ("Ananya", "Iyer"), ("Lucas", "Santos"),
    ("Beatriz", "Lima"), ("Valentina", "Torres"), ("Alejandro", "Ramírez"), ("Naledi", "Mokoena"), ("Chen", "Liu"),
    ("Ji-woo", "Choi"), ("Ivan", "Smirnov"), ("Tomás", "Silva"), ("Ava", "Davis"), ("James", "Miller"),
    ("Isabella", "Garcia"), ("Benjamin", "Martinez"), ("Harper", "Anderson"), ("Henry", "Clark"), ("Zoe", "Roberts"),
]

CITIES = {
    "US": ["Austin", "Denver", "Seattle", "Chicago", "Boston", "Atlanta"], "CA": ["Toronto", "Montréal", "Calgary"],
    "GB": ["London", "Manchester", "Leeds", "Bristol"], "DE": ["Berlin", "München", "Hamburg", "Köln"],
    "FR": ["Paris", "Lyon", "Nantes", "Lille"], "IT": ["Roma", "Milano", "Torino"],
    "ES": ["Madrid", "Barcelona", "Valencia"], "NL": ["Amsterdam", "Rotterdam", "Utrecht"],
    "BE": ["Bruxelles", "Antwerpen", "Gent"], "CH": ["Zürich", "Genève", "Bern"],
    "AT": ["Wien", "Graz", "Linz"], "SE": ["Stockholm", "Göteborg", "Malmö"], "PL": ["Warszawa", "Kraków", "Gdańsk"],
    "IE": ["Dublin", "Cork", "Galway"], "AU": ["Sydney", "Melbourne", "Brisbane"], "NZ": ["Auckland", "Wellington"],
    "JP": ["東京", "大阪", "横浜"], "IN": ["Delhi", "Mumbai", "Bengaluru"], "BR": ["São Paulo", "Rio de Janeiro", "Curitiba"],
    "MX": ["Ciudad de México", "Guadalajara", "Monterrey"], "ZA": ["Johannesburg", "Cape Town", "Durban"],
    "SG": ["Singapore"], "KR": ["서울", "부산"], "CN": ["北京", "上海", "广州"], "RU": ["Москва", "Санкт-Петербург"],
    "PT": ["Lisboa", "Porto"],
}


def ascii_fold(s: str) -> str:
    s = s.replace("ß", "ss").replace("ø", "o").replace("æ", "ae").replace("ł", "l").replace("Ł", "L")
    return "".join(c for c in unicodedata.normalize("NFKD", s) if not unicodedata.combining(c))


# --- phone numbers: E.164 country codes and national numbering plans ----------------------------
# Each country function returns (written form, E.164 form). Area codes and mobile prefixes are from the
# national plans (Bundesnetzagentur, Ofcom, ARCEP, AGCOM, CNMC, ACM, BIPT, OFCOM CH, RTR, PTS, UKE, ComReg,
# ACMA, NZ NNA, MIC Japan, TRAI, Anatel, IFT, ICASA, IMDA, MSIT, MIIT, Rossvyaz, ANACOM, NANPA/CNA).

PHONE_COUNTRIES = ("US", "CA", "GB", "DE", "FR", "IT", "ES", "NL", "BE", "CH", "AT", "SE", "PL", "IE", "AU", "NZ",
                   "JP", "IN", "BR", "MX", "ZA", "SG", "KR", "CN", "RU", "PT")
US_AREAS = ["201", "202", "206", "212", "213", "214", "215", "303", "305", "310", "312", "313", "404", "408", "415",
            "503", "510", "512", "602", "617", "646", "650", "702", "704", "713", "718", "720", "773", "801", "804",
            "808", "813", "818", "858", "901", "917", "919", "929", "971", "978"]
CA_AREAS = ["204", "250", "289", "306", "403", "416", "418", "437", "438", "450", "514", "519", "587", "604", "613",
            "647", "705", "709", "778", "780", "807", "819", "902", "905"]


def _nanp(rng, areas):
    npa = rng.choice(areas)
    while True:
        nxx = D(rng, 3, "23456789")
        if nxx[1:] != "11" and nxx != "555" and nxx != "950":
            break
    line = D(rng, 4)
    e164 = f"+1{npa}{nxx}{line}"
    text = pick(rng, [
        (30, f"({npa}) {nxx}-{line}"), (25, f"{npa}-{nxx}-{line}"), (8, f"{npa}.{nxx}.{line}"),
        (5, f"1-{npa}-{nxx}-{line}"), (4, f"{npa} {nxx} {line}"), (4, f"1 ({npa}) {nxx}-{line}"),
        (10, f"+1 {npa}-{nxx}-{line}"), (8, f"+1 ({npa}) {nxx}-{line}"), (4, e164), (3, f"+1 {npa} {nxx} {line}"),
        (2, f"+1.{npa}.{nxx}.{line}")])
    return text, e164


def phone_US(rng):
    return _nanp(rng, US_AREAS)


def phone_CA(rng):
    return _nanp(rng, CA_AREAS)


def phone_GB(rng):
    kind = pick(rng, [(5, "mobile"), (3, "london"), (3, "city"), (1, "five")])
    if kind == "mobile":
        nsn = rng.choice(["7400", "7412", "7423", "7440", "7481", "7503", "7511", "7535", "7564", "7577", "7588",
                          "7712", "7723", "7747", "7768", "7777", "7788", "7801", "7824", "7852", "7860", "7877",
                          "7903", "7912", "7944", "7956", "7967", "7983", "7999"]) + D(rng, 6)
        g = [4, 6]
    elif kind == "london":
        nsn = "20" + D(rng, 8, "378")
        g = [2, 4, 4]
    elif kind == "city":
        area, first = rng.choice([("161", "2345789"), ("121", "2345"), ("131", "2345"), ("141", "2345"), ("113", "234"),
                                  ("117", "9"), ("114", "2"), ("115", "9"), ("116", "2"), ("118", "9")])
        nsn = area + D(rng, 7, first)
        g = [3, 3, 4]
    else:
        nsn = rng.choice(["1223", "1865", "1273", "1904", "1225"]) + D(rng, 6, "2345678")
        g = [4, 6]
    text = pick(rng, [(10, "0" + grp(nsn, g)), (3, "0" + nsn), (8, "+44 " + grp(nsn, g)), (4, "+44 (0)" + grp(nsn, g)),
                      (2, "+44" + nsn), (1, "0044 " + grp(nsn, g))])
    return text, "+44" + nsn


def phone_DE(rng):
    if rng.random() < 0.5:
        area, n = rng.choice([("151", 8), ("152", 8), ("157", 8), ("159", 8), ("160", 7), ("162", 7), ("170", 7),
                              ("171", 7), ("172", 7), ("175", 7), ("176", 8), ("177", 8), ("178", 8), ("179", 7)])
        sub = D(rng, n)
    else:
        area, n = rng.choice([("30", 8), ("40", 8), ("89", 7), ("89", 8), ("69", 7), ("69", 8), ("221", 7),
                              ("211", 7), ("711", 7), ("341", 7), ("351", 7), ("511", 7), ("911", 7), ("421", 7)])
        sub = D(rng, n, "23456789")
    text = pick(rng, [(8, f"0{area} {sub}"), (3, f"0{area}/{sub}"), (2, f"(0{area}) {sub}"), (2, f"0{area}-{sub}"),
                      (8, f"+49 {area} {sub}"), (4, f"+49 (0){area} {sub}"), (2, f"+49-{area}-{sub}"),
                      (2, f"+49{area}{sub}"), (2, f"0049 {area} {sub}")])
    return text, f"+49{area}{sub}"


def phone_FR(rng):
    # Metropolitan France only: 0262/0263/0269, 0590/0594/0596, 0639, 069x are overseas departments.
    nsn = pick(rng, [(4, "6" + D(rng, 1, "0124578") + D(rng, 7)), (2, "7" + D(rng, 1, "3456789") + D(rng, 7)),
                     (2, "1" + D(rng, 8, "4")), (1, rng.choice("2345") + D(rng, 1, "1345678") + D(rng, 7))])
    pairs = grp(nsn[1:], [2, 2, 2, 2])
    text = pick(rng, [(10, f"0{nsn[0]} {pairs}"), (3, f"0{nsn[0]}.{pairs.replace(' ', '.')}"), (2, "0" + nsn),
                      (8, f"+33 {nsn[0]} {pairs}"), (3, f"+33 (0){nsn[0]} {pairs}"), (2, "+33" + nsn),
                      (1, f"0033 {nsn[0]} {pairs}")])
    return text, "+33" + nsn


def phone_IT(rng):
    if rng.random() < 0.6:
        p = rng.choice(["320", "324", "327", "328", "329", "330", "331", "333", "334", "335", "336", "338", "339",
                        "340", "342", "345", "346", "347", "348", "349", "351", "366", "368", "380", "388", "389",
                        "391", "392", "393"])
        s = D(rng, 7)
        nsn = p + s
        text = pick(rng, [(6, f"{p} {s[:3]} {s[3:]}"), (4, f"{p} {s}"), (2, f"{p}-{s}"), (2, nsn),
                          (6, f"+39 {p} {s[:3]} {s[3:]}"), (3, f"+39 {p} {s}"), (2, "+39" + nsn),
                          (1, f"0039 {p} {s}")])
    else:
        area, n = rng.choice([("06", 8), ("02", 8), ("011", 7), ("055", 7), ("081", 7), ("051", 7), ("010", 7)])
        s = D(rng, n, "2345678")
        nsn = area + s
        sg = f"{s[:4]} {s[4:]}" if n == 8 else f"{s[:3]} {s[3:]}"
        text = pick(rng, [(6, f"{area} {sg}"), (3, f"{area} {s}"), (2, f"{area}-{s}"),
                          (6, f"+39 {area} {sg}"), (3, f"+39 {area} {s}"), (1, "+39" + nsn)])
    return text, "+39" + nsn


def phone_ES(rng):
    if rng.random() < 0.6:
        nsn = pick(rng, [(5, "6" + D(rng, 8)), (1, "7" + D(rng, 1, "1234") + D(rng, 7))])
        text = pick(rng, [(5, grp(nsn, [3, 2, 2, 2])), (5, grp(nsn, [3, 3, 3])), (2, nsn),
                          (5, "+34 " + grp(nsn, [3, 3, 3])), (3, "+34 " + grp(nsn, [3, 2, 2, 2])), (2, "+34" + nsn),
                          (1, "0034 " + grp(nsn, [3, 3, 3]))])
    else:
        area = rng.choice(["91", "93", "96", "94", "95"])
        nsn = area + D(rng, 7, "2345678")
        text = pick(rng, [(5, grp(nsn, [2, 3, 2, 2])), (4, grp(nsn, [3, 3, 3])), (5, "+34 " + grp(nsn, [2, 3, 2, 2])),
                          (3, "+34 " + grp(nsn, [3, 3, 3]))])
    return text, "+34" + nsn


def phone_NL(rng):
    if rng.random() < 0.55:
        s = D(rng, 7)
        nsn = "6" + D(rng, 1, "12345") + s
        m = nsn[1:]
        text = pick(rng, [(6, f"06-{m}"), (4, f"06 {m[:4]} {m[4:]}"), (2, f"06 {grp(m, [2, 2, 2, 2])}"),
                          (6, f"+31 6 {m}"), (3, f"+31 (0)6 {m[:4]} {m[4:]}"), (2, "+31" + nsn),
                          (1, f"0031 6 {m}")])
    else:
        area = rng.choice(["20", "10", "70", "30", "40", "50"])
        s = D(rng, 7, "2345678")
        nsn = area + s
        text = pick(rng, [(5, f"0{area}-{s[:3]} {s[3:]}"), (4, f"0{area} {s[:3]} {s[3:]}"), (3, f"0{area}-{s}"),
                          (5, f"+31 {area} {s[:3]} {s[3:]}"), (3, f"+31 (0){area} {s[:3]} {s[3:]}")])
    return text, "+31" + nsn


def phone_BE(rng):
    if rng.random() < 0.55:
        p = "4" + D(rng, 1, "5789") + D(rng, 1)
        s = D(rng, 6)
        nsn = p + s
        pr = grp(s, [2, 2, 2])
        text = pick(rng, [(6, f"0{p} {pr}"), (3, f"0{p}/{pr.replace(' ', '.')}"), (2, f"0{nsn}"),
                          (6, f"+32 {p} {pr}"), (2, f"+32 (0){p} {pr}"), (2, "+32" + nsn)])
    else:
        area, first = rng.choice([("2", "234567"), ("3", "2345678"), ("9", "23")])
        s = D(rng, 7, first)
        nsn = area + s
        sg = grp(s, [3, 2, 2])
        text = pick(rng, [(6, f"0{area} {sg}"), (3, f"0{area}/{sg.replace(' ', '.')}"), (6, f"+32 {area} {sg}"),
                          (2, f"+32 (0){area} {sg}")])
    return text, "+32" + nsn


def phone_CH(rng):
    if rng.random() < 0.5:
        area = "7" + D(rng, 1, "5689")
        s = D(rng, 7)
    else:
        area = rng.choice(["44", "43", "22", "31", "61", "21", "41", "71"])
        s = D(rng, 7, "2345678")
    nsn = area + s
    sg = grp(s, [3, 2, 2])
    text = pick(rng, [(8, f"0{area} {sg}"), (8, f"+41 {area} {sg}"), (3, f"+41 (0){area} {sg}"), (2, "+41" + nsn),
                      (2, f"0041 {area} {sg}")])
    return text, "+41" + nsn


def phone_AT(rng):
    if rng.random() < 0.55:
        area, n = rng.choice([("664", 7), ("676", 7), ("650", 7), ("660", 7), ("699", 8), ("680", 7), ("681", 8)])
        s = D(rng, n)
    else:
        area, n = rng.choice([("1", 7), ("316", 6), ("732", 6), ("662", 6), ("512", 6)])
        s = D(rng, n, "2345678")
    nsn = area + s
    sg = grp(s, [3, 2, 2]) if n == 7 else grp(s, [2, 2, 2, 2]) if n == 8 else grp(s, [2, 2, 2])
    text = pick(rng, [(6, f"0{area} {s}"), (3, f"0{area} {sg}"), (2, f"0{area}/{s}"), (6, f"+43 {area} {s}"),
                      (4, f"+43 {area} {sg}"), (2, f"+43 (0){area} {s}"), (2, "+43" + nsn)])
    return text, "+43" + nsn


def phone_SE(rng):
    if rng.random() < 0.55:
        area = "7" + rng.choice("02369")
        s = D(rng, 7)
    else:
        area = rng.choice(["8", "31", "40", "18", "13"])
        s = D(rng, 7, "2345678")
    nsn = area + s
    sg = grp(s, [3, 2, 2])
    text = pick(rng, [(6, f"0{area}-{sg}"), (3, f"0{area} {sg}"), (2, f"0{nsn}"), (6, f"+46 {area} {sg}"),
                      (2, f"+46 (0){area} {sg}"), (2, "+46" + nsn)])
    return text, "+46" + nsn


def phone_PL(rng):
    if rng.random() < 0.6:
        nsn = rng.choice(["50", "51", "53", "57", "60", "66", "69", "72", "73", "78", "79", "88"]) + D(rng, 7)
        text = pick(rng, [(6, grp(nsn, [3, 3, 3])), (2, grp(nsn, [3, 3, 3], "-")), (2, nsn),
                          (6, "+48 " + grp(nsn, [3, 3, 3])), (2, "+48" + nsn), (1, "0048 " + grp(nsn, [3, 3, 3]))])
    else:
        area = rng.choice(["22", "12", "58", "61", "71"])
        s = D(rng, 7, "2345678")
        nsn = area + s
        sg = grp(s, [3, 2, 2])
        text = pick(rng, [(5, f"{area} {sg}"), (3, f"({area}) {sg}"), (5, f"+48 {area} {sg}")])
    return text, "+48" + nsn


def phone_IE(rng):
    kind = pick(rng, [(5, "m"), (3, "d"), (2, "c")])
    if kind == "m":
        area, s = "8" + rng.choice("35679"), D(rng, 7, "123456789")
        sg = f"{s[:3]} {s[3:]}"
    elif kind == "d":
        area, s = "1", D(rng, 7, "2345678")
        sg = f"{s[:3]} {s[3:]}"
    else:
        area, s = "21", D(rng, 7, "2345679")
        sg = f"{s[:3]} {s[3:]}"
    nsn = area + s
    text = pick(rng, [(6, f"0{area} {sg}"), (2, f"0{area}-{s}"), (6, f"+353 {area} {sg}"),
                      (2, f"+353 (0){area} {sg}"), (2, "+353" + nsn), (1, f"00353 {area} {sg}")])
    return text, "+353" + nsn


def phone_AU(rng):
    if rng.random() < 0.55:
        nsn = "4" + D(rng, 8, "0123")
        m = nsn[1:]
        text = pick(rng, [(6, f"04{m[:2]} {m[2:5]} {m[5:]}"), (2, "0" + nsn), (5, f"+61 4{m[:2]} {m[2:5]} {m[5:]}"),
                          (4, f"+61 4 {m[:4]} {m[4:]}"), (2, "+61" + nsn)])
    else:
        area, first = rng.choice([("2", "89"), ("3", "89"), ("7", "3"), ("8", "89")])
        s = D(rng, 8, first)
        nsn = area + s
        text = pick(rng, [(6, f"(0{area}) {s[:4]} {s[4:]}"), (4, f"0{area} {s[:4]} {s[4:]}"),
                          (6, f"+61 {area} {s[:4]} {s[4:]}"), (1, "+61" + nsn)])
    return text, "+61" + nsn


def phone_NZ(rng):
    if rng.random() < 0.55:
        area, s = rng.choice(["21", "22", "27"]), D(rng, 7, "23456789")
    else:
        area, first = rng.choice([("9", "345689"), ("4", "3458"), ("3", "3"), ("7", "8")])
        s = D(rng, 7, first)
    nsn = area + s
    sg = f"{s[:3]} {s[3:]}"
    text = pick(rng, [(6, f"0{area} {sg}"), (2, f"(0{area}) {sg}"), (2, f"0{area}-{s[:3]}-{s[3:]}"),
                      (6, f"+64 {area} {sg}"), (2, "+64" + nsn)])
    return text, "+64" + nsn


def phone_JP(rng):
    kind = pick(rng, [(5, "m"), (3, "big"), (2, "mid")])
    if kind == "m":
        area, s = rng.choice(["90", "80", "70"]), D(rng, 8, "123456789")
        a, b = s[:4], s[4:]
    elif kind == "big":
        area, s = rng.choice(["3", "6"]), D(rng, 8, "3456")
        a, b = s[:4], s[4:]
    else:
        area, s = rng.choice(["45", "52", "75", "92"]), D(rng, 7, "2345678")
        a, b = s[:3], s[3:]
    nsn = area + s
    text = pick(rng, [(8, f"0{area}-{a}-{b}"), (2, f"0{area}({a}){b}"), (2, f"0{nsn}"), (6, f"+81 {area}-{a}-{b}"),
                      (4, f"+81 {area} {a} {b}"), (2, f"+81-{area}-{a}-{b}"), (2, "+81" + nsn)])
    return text, "+81" + nsn


def phone_IN(rng):
    if rng.random() < 0.65:
        nsn = D(rng, 10, "6789")
        text = pick(rng, [(6, f"{nsn[:5]} {nsn[5:]}"), (3, f"0{nsn[:5]} {nsn[5:]}"), (2, nsn),
                          (8, f"+91 {nsn[:5]} {nsn[5:]}"), (4, f"+91-{nsn}"), (3, "+91" + nsn), (2, f"+91 {nsn}")])
    else:
        area = rng.choice(["11", "22", "80", "44", "33"])
        s = D(rng, 8, "2346")
        nsn = area + s
        text = pick(rng, [(5, f"0{area}-{s[:4]} {s[4:]}"), (3, f"0{area} {s}"), (2, f"0{area}-{s}"),
                          (5, f"+91 {area} {s[:4]} {s[4:]}"), (2, f"+91-{area}-{s}")])
    return text, "+91" + nsn


def phone_BR(rng):
    ddd = rng.choice(["11", "21", "31", "41", "51", "61", "71", "81", "85", "19", "27", "48"])
    if rng.random() < 0.6:
        s = "9" + D(rng, 8, "6789")
        a, b = s[:5], s[5:]
    else:
        s = D(rng, 8, "2345")
        a, b = s[:4], s[4:]
    nsn = ddd + s
    text = pick(rng, [(8, f"({ddd}) {a}-{b}"), (2, f"{ddd} {a}-{b}"), (8, f"+55 {ddd} {a}-{b}"),
                      (4, f"+55 ({ddd}) {a}-{b}"), (2, "+55" + nsn), (1, f"+55 {ddd} {a} {b}")])
    return text, "+55" + nsn


def phone_MX(rng):
    area = rng.choice(["55", "33", "81", "222", "998", "442", "664"])
    s = D(rng, 10 - len(area), "23456789")
    nsn = area + s
    sg = f"{s[:4]} {s[4:]}" if len(s) == 8 else f"{s[:3]} {s[3:]}"
    text = pick(rng, [(6, f"{area} {sg}"), (3, f"({area}) {sg}"), (2, f"{area}-{sg.replace(' ', '-')}"),
                      (6, f"+52 {area} {sg}"), (2, f"+52 ({area}) {sg}"), (2, "+52" + nsn)])
    return text, "+52" + nsn


def phone_ZA(rng):
    if rng.random() < 0.6:
        area = rng.choice(["60", "61", "62", "63", "71", "72", "73", "74", "76", "78", "79", "81", "82", "83", "84"])
        s = D(rng, 7)
    else:
        area = rng.choice(["11", "21", "31", "12"])
        s = D(rng, 7, "2345678")
    nsn = area + s
    sg = f"{s[:3]} {s[3:]}"
    text = pick(rng, [(6, f"0{area} {sg}"), (2, f"(0{area}) {sg}"), (2, f"0{area}-{s[:3]}-{s[3:]}"), (2, "0" + nsn),
                      (6, f"+27 {area} {sg}"), (2, "+27" + nsn)])
    return text, "+27" + nsn


def phone_SG(rng):
    nsn = pick(rng, [(3, "9" + D(rng, 7, "0123478")), (2, "8" + D(rng, 7, "123456789")),
                     (2, "6" + D(rng, 1, "123458") + D(rng, 6))])
    text = pick(rng, [(4, f"{nsn[:4]} {nsn[4:]}"), (8, f"+65 {nsn[:4]} {nsn[4:]}"), (2, f"+65 {nsn[:4]}-{nsn[4:]}"),
                      (2, "+65" + nsn), (1, f"(+65) {nsn[:4]} {nsn[4:]}")])
    return text, "+65" + nsn


def phone_KR(rng):
    if rng.random() < 0.6:
        area, s = "10", D(rng, 8, "2346789")
        a, b = s[:4], s[4:]
    else:
        area = rng.choice(["2", "51", "31", "32", "53"])
        s = D(rng, 8, "2345678")
        a, b = s[:4], s[4:]
    nsn = area + s
    text = pick(rng, [(8, f"0{area}-{a}-{b}"), (2, f"0{area} {a} {b}"), (6, f"+82 {area}-{a}-{b}"),
                      (4, f"+82 {area} {a} {b}"), (2, "+82" + nsn)])
    return text, "+82" + nsn


def phone_CN(rng):
    if rng.random() < 0.65:
        p = rng.choice(["130", "131", "132", "133", "135", "136", "137", "138", "139", "150", "151", "152", "153",
                        "155", "156", "157", "158", "159", "176", "177", "180", "181", "182", "185", "186", "187",
                        "188", "189", "198", "199"])
        nsn = p + D(rng, 8)
        text = pick(rng, [(5, grp(nsn, [3, 4, 4])), (3, nsn), (2, grp(nsn, [3, 4, 4], "-")),
                          (6, "+86 " + grp(nsn, [3, 4, 4])), (2, "+86 " + nsn), (2, "+86" + nsn)])
    else:
        area = rng.choice(["10", "21", "20", "755"])
        s = D(rng, 8, "567")
        nsn = area + s
        text = pick(rng, [(5, f"0{area}-{s[:4]} {s[4:]}"), (3, f"0{area}-{s}"), (2, f"(0{area}) {s[:4]} {s[4:]}"),
                          (5, f"+86 {area} {s[:4]} {s[4:]}")])
    return text, "+86" + nsn


def phone_RU(rng):
    if rng.random() < 0.6:
        area = rng.choice(["903", "905", "906", "909", "915", "916", "917", "925", "926", "977", "985", "999"])
    else:
        area = rng.choice(["495", "499", "812", "343", "383"])
    s = D(rng, 7, "23456789")
    nsn = area + s
    sg = f"{s[:3]}-{s[3:5]}-{s[5:]}"
    text = pick(rng, [(6, f"+7 ({area}) {sg}"), (5, f"+7 {area} {sg}"), (5, f"8 ({area}) {sg}"),
                      (2, f"8 {area} {s[:3]} {s[3:5]} {s[5:]}"), (2, "+7" + nsn)])
    return text, "+7" + nsn


def phone_PT(rng):
    if rng.random() < 0.6:
        nsn = rng.choice(["91", "92", "93", "96"]) + D(rng, 7)
    else:
        nsn = rng.choice(["21", "22"]) + D(rng, 7, "2345789")
    sg = grp(nsn, [3, 3, 3])
    text = pick(rng, [(7, sg), (2, nsn), (7, "+351 " + sg), (2, "+351" + nsn), (1, "00351 " + sg)])
    return text, "+351" + nsn


PHONE_GEN = {c: globals()[f"phone_{c}"] for c in PHONE_COUNTRIES}

LANG = {"US": "en", "CA": "en", "GB": "en", "IE": "en", "AU": "en", "NZ": "en", "SG": "en", "IN": "en", "ZA": "en",
        "DE": "de", "AT": "de", "CH": "de", "FR": "fr", "BE": "fr", "IT": "it", "ES": "es", "MX": "es", "NL": "nl",
        "SE": "sv", "PL": "pl", "JP": "ja", "KR": "ko", "CN": "zh", "RU": "ru", "BR": "pt", "PT": "pt"}

PHONE_TEMPLATES = {
    "en": ["Call me on ⟦p⟧ if anything changes before Friday.",
           "You can reach our front desk at ⟦p⟧ (Mon–Fri, 9am–5pm).",
           "Mobile: ⟦p⟧ | Office hours by appointment only",
           "For bookings ring ⟦p⟧ and ask for ⟦first⟧.",
           "Best regards,\n⟦name⟧\nSenior Account Manager\nTel: ⟦p⟧",
           "Emergency contact: ⟦name⟧ (sister), ⟦p⟧",
           "Text me at ⟦p⟧ when you land and I'll come pick you up.",
           "Hi, it's ⟦first⟧ again - my new number is ⟦p⟧, please update your records.",
           "If the parcel can't be delivered, the driver will phone ⟦p⟧ before 6pm.",
           "Landlord: ⟦name⟧, phone ⟦p⟧, rent due on the 1st of each month."],
    "de": ["Rufen Sie uns gerne an: ⟦p⟧ (Mo–Fr 8–16 Uhr).",
           "Mit freundlichen Grüßen\n⟦name⟧\nVertrieb\nTel.: ⟦p⟧",
           "Bei Rückfragen erreichen Sie Herrn ⟦last⟧ unter ⟦p⟧.",
           "Terminvereinbarung telefonisch unter ⟦p⟧ oder persönlich in der Praxis.",
           "Mobil: ⟦p⟧ – bitte nur in dringenden Fällen anrufen."],
    "fr": ["Pour toute question, appelez-nous au ⟦p⟧.",
           "Cordialement,\n⟦name⟧\nResponsable clientèle\nTél. : ⟦p⟧",
           "Vous pouvez joindre ⟦first⟧ au ⟦p⟧ du lundi au vendredi.",
           "Réservations par téléphone au ⟦p⟧ ou sur place."],
    "it": ["Per informazioni chiamaci al ⟦p⟧.", "Cordiali saluti,\n⟦name⟧\nCell. ⟦p⟧",
           "Prenotazioni al numero ⟦p⟧ (chiedere di ⟦first⟧)."],
    "es": ["Para cualquier duda, llámanos al ⟦p⟧.", "Un saludo,\n⟦name⟧\nMóvil: ⟦p⟧",
           "Puedes contactar con ⟦first⟧ en el ⟦p⟧ de lunes a viernes."],
    "nl": ["Bel ons gerust op ⟦p⟧ voor een afspraak.", "Met vriendelijke groet,\n⟦name⟧\nMobiel: ⟦p⟧",
           "Je kunt ⟦first⟧ bereiken op ⟦p⟧ (werkdagen)."],
    "pt": ["Para mais informações, ligue para ⟦p⟧.", "Atenciosamente,\n⟦name⟧\nCel./WhatsApp: ⟦p⟧",
           "Fale com ⟦first⟧ pelo telefone ⟦p⟧."],
    "sv": ["Ring oss gärna på ⟦p⟧ om du har frågor.", "Med vänliga hälsningar\n⟦name⟧\nMobil: ⟦p⟧"],
    "pl": ["W razie pytań proszę dzwonić: ⟦p⟧.", "Pozdrawiam serdecznie\n⟦name⟧\ntel. kom. ⟦p⟧"],
    "ja": ["お問い合わせ：⟦p⟧（平日9時〜18時）までお気軽にどうぞ。", "担当：⟦name⟧　TEL ⟦p⟧　よろしくお願いいたします。"],
    "ko": ["문의 사항은 ⟦p⟧ 로 연락 주시기 바랍니다.", "담당자: ⟦name⟧, 전화번호: ⟦p⟧ (평일 9시-18시)"],
    "zh": ["如有疑问，请拨打联系电话：⟦p⟧（工作日9:00-18:00）。", "联系人：⟦name⟧，手机：⟦p⟧，欢迎来电咨询。"],
    "ru": ["По всем вопросам звоните по телефону ⟦p⟧.", "С уважением,\n⟦name⟧\nТел.: ⟦p⟧"],
}
PHONE_GENERIC = [
    '{"name": "⟦name⟧", "phone": "⟦p⟧", "city": "⟦city⟧"}',
    "name,phone,city\n⟦name⟧,⟦p⟧,⟦city⟧",
    "BEGIN:VCARD\nVERSION:3.0\nFN:⟦name⟧\nTEL;TYPE=CELL:⟦p⟧\nEND:VCARD",
    '<a href="tel:⟦pc⟧">⟦p⟧</a> – ⟦name⟧, ⟦city⟧',
    "| ⟦name⟧ | ⟦city⟧ | ⟦p⟧ |",
    "contact:\n  name: ⟦name⟧\n  phone: \"⟦p⟧\"\n  city: ⟦city⟧",
    "2024-03-15 14:22:05 INFO sms.send to=⟦pc⟧ template=otp status=queued",
    "customer_phone = \"⟦p⟧\"  # from the signup form",
]


# --- IBAN: ISO 13616, SWIFT IBAN registry ---------------------------------------------------------
# Country: (IBAN length, BBAN structure: n digits, a upper-case letters, c alphanumerics).
IBAN_FORMATS = {
    "AT": (20, "5n11n"), "BE": (16, "3n7n2n"), "BG": (22, "4a4n2n8c"), "CH": (21, "5n12c"), "CZ": (24, "4n6n10n"),
    "DE": (22, "8n10n"), "DK": (18, "4n9n1n"), "EE": (20, "2n2n11n1n"), "ES": (24, "4n4n1n1n10n"),
    "FI": (18, "3n11n"), "FR": (27, "5n5n11c2n"), "GB": (22, "4a6n8n"), "GR": (27, "3n4n16c"),
    "HR": (21, "7n10n"), "HU": (28, "3n4n1n15n1n"), "IE": (22, "4a6n8n"), "IT": (27, "1a5n5n12c"),
    "LT": (20, "5n11n"), "LU": (20, "3n13c"), "NL": (18, "4a10n"), "NO": (15, "4n6n1n"), "PL": (28, "8n16n"),
    "PT": (25, "4n4n11n2n"), "RO": (24, "4a16c"), "SE": (24, "3n16n1n"), "SI": (19, "5n8n2n"), "SK": (24, "4n6n10n"),
    "TR": (26, "5n1n16c"), "SA": (24, "2n18c"), "AE": (23, "3n16n"), "BR": (29, "8n5n10n1a1c"),
}
IBAN_COUNTRIES = ("DE", "FR", "GB", "ES", "IT", "NL", "BE", "AT", "CH", "PL", "PT", "IE", "SE", "DK", "FI", "NO",
                  "CZ", "HU", "GR", "RO", "LU", "HR", "SI", "SK", "LT", "EE", "BG", "TR", "SA", "AE", "BR")
BANK_CODES = {
    "DE": ["37040044", "10070000", "50010517", "70150000", "20050550", "12030000", "43060967", "10010010",
           "60050101", "76026000", "50070010", "30020900"],
    "GB": ["NWBK", "BARC", "LOYD", "HBUK", "MIDL", "NAIA", "MONZ", "SRLG"], "IE": ["AIBK", "BOFI", "IPBS", "ULSB"],
    "NL": ["ABNA", "INGB", "RABO", "TRIO", "SNSB", "ASNB", "KNAB", "BUNQ"], "RO": ["BTRL", "RNCB", "BRDE", "INGB"],
    "BG": ["UNCR", "BNBG", "STSA", "FINV"], "FR": ["30004", "30003", "30002", "20041", "10278", "30006", "16958"],
    "IT": ["03069", "02008", "05034", "01030", "03062"], "ES": ["2100", "0049", "0182", "2080", "0081", "1465"],
}
BIC_BANKS = {"DE": ["COBA", "DEUT", "INGD", "SSKM", "HASP", "BYLA", "GENO"], "FR": ["BNPA", "SOGE", "CRLY", "PSST"],
             "IT": ["BCIT", "UNCR", "BAPP"], "ES": ["CAIX", "BSCH", "BBVA"], "NL": ["ABNA", "INGB", "RABO"],
             "BE": ["GEBA", "BBRU", "KRED"], "AT": ["BKAU", "GIBA", "RZBA"]}


def _alnum_value(s: str) -> str:
    return "".join(str(int(c, 36)) for c in s)


def iban_check(cc: str, bban: str) -> str:
    return f"{98 - int(_alnum_value(bban + cc + '00')) % 97:02d}"


def _bban_random(rng, spec: str) -> str:
    out = []
    for n, t in re.findall(r"(\d+)([nac])", spec):
        n = int(n)
        if t == "n":
            out.append(D(rng, n))
        elif t == "a":
            out.append(R(rng, n, UPPER))
        else:  # alphanumeric: in practice mostly digits
            out.append(R(rng, n, UPPER + DIGITS) if n < 3 else D(rng, n) if rng.random() < 0.8
                       else R(rng, 2, UPPER) + D(rng, n - 2))
    return "".join(out)


_IT_ODD = [1, 0, 5, 7, 9, 13, 15, 17, 19, 21, 2, 4, 18, 20, 11, 3, 6, 8, 12, 14, 16, 10, 22, 25, 24, 23]


def _it_cin(s: str) -> str:
    total = 0
    for i, c in enumerate(s):
        v = int(c) if c.isdigit() else ord(c) - 65
        total += _IT_ODD[v] if i % 2 == 0 else v
    return UPPER[total % 26]


def _es_control(ten: str) -> str:
    w = [1, 2, 4, 8, 5, 10, 9, 7, 3, 6]
    d = 11 - sum(int(a) * b for a, b in zip(ten, w)) % 11
    return str({11: 0, 10: 1}.get(d, d))


def make_bban(rng, cc: str) -> str:
    spec = IBAN_FORMATS[cc][1]
    bban = _bban_random(rng, spec)
    if cc in BANK_CODES:
        code = rng.choice(BANK_CODES[cc])
        off = 1 if cc == "IT" else 0
        bban = bban[:off] + code + bban[off + len(code):]
    if cc == "BE":  # national check: first 10 digits mod 97 (00 -> 97)
        bban = bban[:10] + f"{int(bban[:10]) % 97 or 97:02d}"
    elif cc == "FR":  # RIB key: 97 - (89 bank + 15 branch + 3 account) mod 97, account digits only
        acct = D(rng, 11)
        bban = bban[:10] + acct
        bban += f"{97 - (89 * int(bban[:5]) + 15 * int(bban[5:10]) + 3 * int(acct)) % 97:02d}"
    elif cc == "ES":  # two control digits: bank+branch, then account
        bank, branch, acct = bban[:4], bban[4:8], bban[10:]
        bban = bank + branch + _es_control("00" + bank + branch) + _es_control(acct) + acct
    elif cc == "IT":  # CIN letter over ABI + CAB + account
        rest = bban[1:6] + bban[6:11] + D(rng, 12)
        bban = _it_cin(rest) + rest
    assert len(cc) + 2 + len(bban) == IBAN_FORMATS[cc][0], cc
    return bban


def make_iban(rng, cc: str) -> str:
    bban = make_bban(rng, cc)
    return cc + iban_check(cc, bban) + bban


def iban_written(rng, iban: str) -> str:
    return pick(rng, [(5, grp(iban, [4] * 8)), (4, iban)])


def make_bic(rng, cc: str) -> str:
    bank = rng.choice(BIC_BANKS.get(cc, [R(rng, 4, UPPER)]))
    return bank + cc + R(rng, 2, UPPER + DIGITS) + rng.choice(["", "XXX", R(rng, 3, UPPER + DIGITS)])


IBAN_TEMPLATES = {
    "en": ["Please transfer the amount to IBAN ⟦i⟧ (BIC ⟦bic⟧) quoting invoice 2024-0415.",
           "Bank details: ⟦name⟧, IBAN: ⟦i⟧, BIC: ⟦bic⟧",
           "My IBAN is ⟦i⟧ – could you send the deposit back there?",
           "Payee: ⟦name⟧\nIBAN ⟦i⟧\nReference: rent March"],
    "de": ["Bankverbindung: ⟦name⟧, IBAN ⟦i⟧, BIC ⟦bic⟧",
           "Bitte überweisen Sie den Betrag innerhalb von 14 Tagen auf das Konto IBAN: ⟦i⟧.",
           "Kontoinhaber: ⟦name⟧ · IBAN: ⟦i⟧ · Verwendungszweck: Rechnung 4711"],
    "fr": ["Merci d'effectuer le virement sur le compte IBAN : ⟦i⟧ (BIC : ⟦bic⟧).",
           "Titulaire : ⟦name⟧ – IBAN ⟦i⟧", "Mon RIB : IBAN ⟦i⟧, au nom de ⟦name⟧."],
    "it": ["Effettuare il bonifico sull'IBAN ⟦i⟧ intestato a ⟦name⟧.", "Coordinate bancarie – IBAN: ⟦i⟧"],
    "es": ["Puede realizar la transferencia a la cuenta ⟦i⟧ a nombre de ⟦name⟧.",
           "Datos bancarios: IBAN ⟦i⟧ – titular ⟦name⟧"],
    "nl": ["Graag het bedrag overmaken naar ⟦i⟧ t.n.v. ⟦name⟧.", "Rekeningnummer (IBAN): ⟦i⟧ – ⟦name⟧"],
    "pt": ["Por favor transfira para o IBAN ⟦i⟧ em nome de ⟦name⟧.", "Dados bancários: IBAN ⟦i⟧"],
    "pl": ["Proszę o przelew na rachunek ⟦i⟧ (odbiorca: ⟦name⟧).", "Numer konta IBAN: ⟦i⟧"],
    "sv": ["Betala till IBAN ⟦i⟧, mottagare ⟦name⟧.", "Kontonummer (IBAN): ⟦i⟧"],
}
IBAN_LANG = {"DE": "de", "AT": "de", "CH": "de", "LU": "fr", "FR": "fr", "BE": "fr", "IT": "it", "ES": "es",
             "NL": "nl", "PT": "pt", "BR": "pt", "PL": "pl", "SE": "sv"}
IBAN_GENERIC = [
    "<CdtrAcct><Id><IBAN>⟦ic⟧</IBAN></Id></CdtrAcct>",
    '{"beneficiary": "⟦name⟧", "iban": "⟦ic⟧", "amount": "1250.00", "currency": "EUR"}',
    "name;iban;amount\n⟦name⟧;⟦ic⟧;349,90",
    "payout_account:\n  holder: ⟦name⟧\n  iban: ⟦ic⟧",
    "| ⟦name⟧ | ⟦i⟧ | 2024-03-15 |",
]


# --- cards: IIN ranges and lengths per network, Luhn --------------------------------------------

def luhn_digit(body: str) -> str:
    total = 0
    for i, ch in enumerate(reversed(body)):
        d = int(ch)
        if i % 2 == 0:
            d = d * 2 - 9 if d > 4 else d * 2
        total += d
    return str((10 - total % 10) % 10)


CARD_NETWORKS = [  # (weight, network, prefix generator, length)
    (30, "visa", lambda r: "4" + D(r, 5), 16),
    (14, "mastercard", lambda r: str(r.randint(51, 55)) + D(r, 4), 16),
    (8, "mastercard", lambda r: str(r.randint(2221, 2720)) + D(r, 2), 16),
    (12, "amex", lambda r: r.choice(["34", "37"]) + D(r, 4), 15),
    (8, "discover", lambda r: r.choice(["6011" + D(r, 2), "65" + D(r, 4), str(r.randint(644, 649)) + D(r, 3)]), 16),
    (8, "jcb", lambda r: str(r.randint(3528, 3589)) + D(r, 2), 16),
    (5, "diners", lambda r: "36" + D(r, 4), 14),
    (5, "unionpay", lambda r: "62" + D(r, 4, "2345678"), 16),
    (3, "visa", lambda r: "4" + D(r, 5), 13),
]


def make_card(rng) -> tuple[str, str]:
    network, gen, n = pick(rng, [(w, (net, g, n)) for w, net, g, n in CARD_NETWORKS])
    while True:
        body = gen(rng)
        body += D(rng, n - 1 - len(body))
        num = body + luhn_digit(body)
        if not num.endswith("0000"):
            return network, num


def card_written(rng, num: str) -> str:
    n = len(num)
    g = [4, 6, 5] if n == 15 else [4, 6, 4] if n == 14 else [4, 4, 4, 4] if n == 16 else [4, 4, 5] if n == 13 else [4]
    return pick(rng, [(9, grp(num, g)), (4, grp(num, g, "-")), (7, num)])


CARD_TEMPLATES = [
    "Card number: ⟦c⟧  Exp: ⟦exp⟧  Name on card: ⟦upname⟧",
    "Kreditkarte: ⟦c⟧, gültig bis ⟦exp⟧ – bitte belasten Sie die Anzahlung.",
    "Numéro de carte : ⟦c⟧ (expire fin ⟦exp⟧)",
    "Número de tarjeta: ⟦c⟧, vencimiento ⟦exp⟧.",
    "Numero carta: ⟦c⟧ scad. ⟦exp⟧",
    "hi, my card is ⟦c⟧ exp ⟦exp⟧, can you retry the payment?",
    '{"card_number": "⟦c⟧", "exp_month": ⟦mm⟧, "exp_year": 20⟦yy⟧, "holder": "⟦upname⟧"}',
    "2024-03-15T14:22:05Z WARN payments charge_failed pan=⟦c⟧ amount=49.99 currency=EUR reason=insufficient_funds",
    "order_id,card,amount\n88213,⟦c⟧,129.00",
    "Please charge ⟦c⟧ for the remaining balance of $1,240.00.",
    "| ⟦upname⟧ | ⟦c⟧ | ⟦exp⟧ |",
    "カード番号：⟦c⟧　有効期限：⟦exp⟧",
    "Payment method on file: ⟦c⟧ (⟦network⟧, expires ⟦exp⟧)",
]


# --- SSN: SSA rules ------------------------------------------------------------------------------

def make_ssn(rng) -> str:
    while True:
        area = rng.randint(1, 899)
        if area != 666:
            break
    return f"{area:03d}", f"{rng.randint(1, 99):02d}", f"{rng.randint(1, 9999):04d}"


SSN_TEMPLATES = [
    "SSN: ⟦s⟧", "Social Security Number: ⟦s⟧ (verified 03/2024)",
    "Employee: ⟦name⟧, SSN ⟦s⟧, start date 2019-06-03",
    "emp_id,name,ssn,hire_date\n10442,⟦name⟧,⟦s⟧,2019-06-03",
    '{"applicant": "⟦name⟧", "ssn": "⟦s⟧", "dob": "1984-07-19"}',
    "Box a – Employee's social security number: ⟦s⟧",
    "Número de Seguro Social: ⟦s⟧",
    "my social is ⟦s⟧ if you need it for the lease application",
    "TIN/SSN: ⟦s⟧   Filing status: Married filing jointly",
    "Please confirm the last digits of SSN ⟦s⟧ with the applicant before closing.",
    "| ⟦name⟧ | ⟦s⟧ | W-4 on file |",
    "2024-03-15 09:12:44 INFO kyc.submit user=77123 ssn=⟦s⟧ result=match",
]


# --- e-mail -------------------------------------------------------------------------------------

MAIL_DOMAINS = [
    "gmail.com", "googlemail.com", "outlook.com", "hotmail.com", "hotmail.co.uk", "hotmail.fr", "live.com",
    "yahoo.com", "yahoo.co.jp", "yahoo.com.br", "yahoo.es", "icloud.com", "me.com", "proton.me", "protonmail.com",
    "gmx.de", "gmx.net", "gmx.at", "web.de", "t-online.de", "orange.fr", "free.fr", "laposte.net", "sfr.fr",
    "libero.it", "virgilio.it", "tiscali.it", "telefonica.net", "terra.com.br", "uol.com.br", "bol.com.br",
    "mail.ru", "yandex.ru", "qq.com", "163.com", "naver.com", "daum.net", "rediffmail.com", "bigpond.com",
    "optusnet.com.au", "xtra.co.nz", "shaw.ca", "rogers.com", "comcast.net", "verizon.net", "att.net", "ziggo.nl",
    "kpnmail.nl", "telenet.be", "skynet.be", "bluewin.ch", "seznam.cz", "wp.pl", "onet.pl", "o2.pl", "eircom.net",
    "btinternet.com", "sky.com", "virginmedia.com", "fastmail.com", "zoho.com", "hey.com", "posteo.de",
    "mailbox.org", "tutanota.com", "aol.com", "inbox.lv", "abv.bg", "freenet.de", "online.no", "telia.com",
]
ORG_DOMAINS = [
    "cs.stanford.edu", "mit.edu", "ox.ac.uk", "eng.cam.ac.uk", "tum.de", "in.tum.de", "ethz.ch", "inf.ethz.ch",
    "epfl.ch", "uni-heidelberg.de", "sorbonne-universite.fr", "u-tokyo.ac.jp", "iisc.ac.in", "usp.br",
    "unimelb.edu.au", "student.unimelb.edu.au", "uva.nl", "kuleuven.be", "uw.edu", "ucl.ac.uk", "kth.se",
    "uj.edu.pl", "tcd.ie", "auckland.ac.nz", "uct.ac.za", "nus.edu.sg", "snu.ac.kr", "tsinghua.edu.cn",
    "nhs.net", "mueller-bau.de", "studio-lumen.fr", "nordwind-energie.de", "harborview-dental.com", "brightpath.io",
    "kitefin.ai", "mail.quantumleaf.dev", "eu.corp.lindenhof.group", "tallpine.co", "redfern-legal.com.au",
    "casa-verde.com.mx", "fernandes-arquitetos.com.br", "kanazawa-seiki.co.jp", "bluegum.co.nz", "alpenblick.at",
    "sunbird.travel", "ledgerly.app", "orbitlab.tech", "pixelforge.studio", "greenmile.eu", "nautilus-labs.xyz",
    "hollandtrade.nl", "vinhos-douro.pt", "kotlin-works.dev", "delta-shipping.gr", "nordicsoft.fi",
    "fjordline-data.no", "dansk-design.dk", "praha-consult.cz", "mumbai-textiles.co.in", "jozi-tech.co.za",
    "research.northgate.org", "mail.hkg.lotusbay.com.hk", "dept.physics.uoregon.edu",
]
UNICODE_EMAILS = ["jürgen.weiß@müller-bau.de", "zoë.dupré@café-lumière.fr", "josé.garcía@correo-ñandú.es",
                  "info.müller@bäckerei-schön.de", "søren@blåbær.dk"]


def make_email(rng, first: str, last: str) -> str:
    f, l = ascii_fold(first).lower().replace(" ", "").replace("'", ""), ascii_fold(last).lower().replace(" ", "")
    tag = rng.choice(["news", "github", "shop", "work", "spam", "receipts", "2024", "lists"])
    local = pick(rng, [
        (10, f"{f}.{l}"), (4, f"{f}{l}"), (4, f"{f[0]}{l}"), (3, f"{f}_{l}"), (3, f"{f}-{l}"),
        (4, f"{f}.{l}{rng.randint(1, 99)}"), (3, f"{f}{rng.randint(70, 99)}"), (4, f"{f}.{l}+{tag}"),
        (2, f"{l}.{f}"), (2, f"{f[0]}.{l}"), (2, f"{f}{l[0]}{rng.randint(1, 999)}"), (1, f"{l}{f[0]}"),
        (1, f"{f}.{l}.{rng.randint(2000, 2012)}"), (1, f"{f}+{tag}")])
    domain = pick(rng, [(6, rng.choice(MAIL_DOMAINS)), (4, rng.choice(ORG_DOMAINS))])
    return f"{local}@{domain}"


EMAIL_TEMPLATES = [
    "Please reach me at ⟦e⟧ if the invoice is unclear.",
    "Contact: ⟦e⟧",
    "From: ⟦name⟧ <⟦e⟧>\nSubject: Re: quarterly numbers",
    "Reply-To: ⟦e⟧\nDate: Fri, 15 Mar 2024 14:22:05 +0100",
    "Send your CV to mailto:⟦e⟧ before 31 March.",
    '<a href="mailto:⟦e⟧">⟦name⟧</a>',
    "Signed-off-by: ⟦name⟧ <⟦e⟧>",
    "commit 9fceb02d0ae598e95dc970b74767f19372d61af8\nAuthor: ⟦name⟧ <⟦e⟧>\nDate:   Mon Mar 11 10:02:17 2024 +0100",
    'maintainers = [{ name = "⟦name⟧", email = "⟦e⟧" }]',
    "id,name,email,signup\n1042,⟦name⟧,⟦e⟧,2023-11-02",
    '{"user": {"name": "⟦name⟧", "email": "⟦e⟧", "verified": true}}',
    "reviewer:\n  name: ⟦name⟧\n  email: ⟦e⟧",
    "Schreiben Sie mir einfach an ⟦e⟧, ich melde mich dann.",
    "N'hésitez pas à m'écrire à ⟦e⟧ pour plus d'informations.",
    "Escríbeme a ⟦e⟧ y te envío el presupuesto.",
    "Per qualsiasi domanda scrivete a ⟦e⟧.",
    "Mail me op ⟦e⟧ als je vragen hebt.",
    "Me mande um e-mail em ⟦e⟧ quando puder.",
    "ご連絡は ⟦e⟧ までお願いいたします。",
    "如有问题请发送邮件至 ⟦e⟧ 。",
    "(questions? ⟦e⟧)",
    "cc: ⟦e⟧, ⟦e2⟧",
    "Thanks to ⟦name⟧ (⟦e⟧) for the patch.",
    "2024-03-15 14:22:05,117 INFO auth: login ok for ⟦e⟧ from ⟦ip⟧",
    "# Maintainer: ⟦name⟧ <⟦e⟧>",
    "> On Tue, Mar 12, 2024 at 9:41 AM ⟦name⟧ <⟦e⟧> wrote:\n> Sounds good, see you then.",
]


# --- IP addresses -------------------------------------------------------------------------------

def _public(addr) -> bool:
    return addr.is_global and not addr.is_multicast and not addr.is_reserved


def make_ipv4(rng) -> str:
    while True:
        a = ipaddress.IPv4Address(rng.getrandbits(32))
        s = str(a)
        o = [int(x) for x in s.split(".")]
        if _public(a) and 1 <= o[0] <= 223 and o[3] not in (0, 255) and o[0] != 255:
            return s


IPV6_PREFIXES = ["2a00:1450", "2606:4700", "2001:4860", "2a03:2880", "2400:cb00", "2604:a880", "2a01:4f8",
                 "2001:41d0", "2a02:c207", "2600:1f18", "2a05:d014", "2406:da18", "2a01:7e00", "2607:f8b0",
                 "2a0e:97c0", "2001:67c", "2c0f:fb50", "2800:3f0", "2409:8a00", "2a02:8108", "2a01:cb00",
                 "2003:e1", "2a02:a210", "2001:1c00", "2605:6400"]


def make_ipv6(rng) -> ipaddress.IPv6Address:
    while True:
        pre = rng.choice(IPV6_PREFIXES).split(":")
        groups = [int(g, 16) for g in pre] + [rng.getrandbits(16) for _ in range(4 - len(pre))]
        iid = pick(rng, [(5, [rng.getrandbits(16) for _ in range(4)]), (2, [0, 0, 0, rng.randint(1, 0x30)]),
                         (1, [0, 0, rng.getrandbits(16), rng.getrandbits(16)])])
        if rng.random() < 0.3:
            groups[3] = 0 if rng.random() < 0.5 else groups[3]
            groups[2] = rng.getrandbits(12)
        a = ipaddress.IPv6Address(":".join(f"{g:x}" for g in groups + iid))
        if _public(a):
            return a


def ipv6_written(rng, a: ipaddress.IPv6Address) -> str:
    form = pick(rng, [(12, "compressed"), (3, "exploded"), (3, "full"), (1, "upper")])
    if form == "compressed":
        return a.compressed
    if form == "exploded":
        return a.exploded
    if form == "full":
        return ":".join(f"{int(g, 16):x}" for g in a.exploded.split(":"))
    return a.compressed.upper()


IPV4_TEMPLATES = [
    '⟦ip⟧ - - [15/Mar/2024:14:22:05 +0000] "GET /index.html HTTP/1.1" 200 5124 "-" "Mozilla/5.0 (X11; Linux x86_64)"',
    "Mar 15 14:22:05 web01 sshd[21834]: Failed password for invalid user admin from ⟦ip⟧ port 52214 ssh2",
    "Mar 15 09:01:33 bastion sshd[1187]: Accepted publickey for deploy from ⟦ip⟧ port 50122 ssh2",
    "2024-03-15 14:22:05,123 fail2ban.actions [812]: NOTICE [sshd] Ban ⟦ip⟧",
    "iptables -A INPUT -s ⟦ip⟧ -j DROP  # repeated scans",
    "sudo ufw deny from ⟦ip⟧ to any port 22",
    "allow ⟦ip⟧;\ndeny all;",
    "www    3600    IN    A    ⟦ip⟧",
    "X-Forwarded-For: ⟦ip⟧, ⟦ip2⟧",
    '{"remote_addr": "⟦ip⟧", "status": 403, "path": "/wp-login.php"}',
    "64 bytes from ⟦ip⟧: icmp_seq=1 ttl=56 time=12.4 ms",
    "ssh -p 2222 root@⟦ip⟧",
    "curl -v http://⟦ip⟧:8080/healthz",
    "Ihre öffentliche IP-Adresse lautet ⟦ip⟧.",
    "Adresse IP du serveur : ⟦ip⟧ (hébergé chez OVH)",
    "La dirección IP ⟦ip⟧ ha sido bloqueada tras varios intentos fallidos.",
    "host    all    all    ⟦ip⟧/32    scram-sha-256",
    "Require ip ⟦ip⟧",
    "Reply from ⟦ip⟧: bytes=32 time=14ms TTL=117",
    "client ⟦ip⟧#53412 (api.internal): query: api.internal IN A +E(0)K",
    "timestamp,src_ip,dst_port,action\n2024-03-15T14:22:05Z,⟦ip⟧,443,ALLOW",
    "New sign-in to your account from ⟦ip⟧ (Frankfurt, Germany). Wasn't you?",
    "route add -net ⟦ipnet⟧/24 gw ⟦ip⟧",
    "| web-03 | ⟦ip⟧ | eu-central-1 | running |",
    "traceroute: 7  ⟦ip⟧  18.311 ms  18.240 ms  18.193 ms",
    "The attacker's IP was ⟦ip⟧ according to the WAF logs.",
]
IPV6_TEMPLATES = [
    "    inet6 ⟦ip6⟧/64 scope global dynamic mngtmpaddr",
    "listen [⟦ip6⟧]:443 ssl http2;",
    "www    3600    IN    AAAA    ⟦ip6⟧",
    "Mar 15 14:22:05 web01 sshd[21834]: Failed password for root from ⟦ip6⟧ port 41234 ssh2",
    "curl -g 'http://[⟦ip6⟧]:8080/status'",
    "64 bytes from ⟦ip6⟧: icmp_seq=1 ttl=57 time=9.81 ms",
    '⟦ip6⟧ - - [15/Mar/2024:14:22:05 +0000] "GET /feed.xml HTTP/2.0" 304 0',
    '{"client_ip": "⟦ip6⟧", "country": "DE", "blocked": false}',
    "Ihre IPv6-Adresse: ⟦ip6⟧",
    "Adresse IPv6 attribuée : ⟦ip6⟧",
    "ip -6 route add default via ⟦ip6⟧ dev eth0",
    "New login from ⟦ip6⟧ on Firefox (Linux).",
    "| db-01 | ⟦ip6⟧ | fra1 |",
    "ssh admin@⟦ip6⟧ -i ~/.ssh/id_ed25519",
    "AllowUsers deploy@⟦ip6⟧",
]
IPV6_MAPPED_TEMPLATES = [
    "remoteAddress: '⟦ip6⟧', remotePort: 51234",
    "2024-03-15T14:22:05.118Z info request from ⟦ip6⟧ GET /api/v1/items 200 12ms",
    "Connection from ⟦ip6⟧ port 443 accepted",
    "[client ⟦ip6⟧:55120] AH01630: client denied by server configuration",
]


# --- secrets: providers' published token formats ------------------------------------------------

def aws_key_id(rng) -> str:
    return rng.choice(["AKIA", "AKIA", "AKIA", "ASIA"]) + R(rng, 16, UPPER + "234567")


def pem_block(rng) -> tuple[str, str]:
    """(label, base64 body) for a key with a valid DER prefix."""
    kind = pick(rng, [(3, "ed25519"), (3, "ec"), (2, "ec8"), (2, "rsa_cut")])
    if kind == "ed25519":
        der = bytes.fromhex("302e020100300506032b657004220420") + rbytes(rng, 32)
        return "PRIVATE KEY", base64.b64encode(der).decode()
    if kind == "ec":
        der = (bytes.fromhex("30770201010420") + rbytes(rng, 32) + bytes.fromhex("a00a06082a8648ce3d030107a144034200")
               + b"\x04" + rbytes(rng, 64))
        return "EC PRIVATE KEY", base64.b64encode(der).decode()
    if kind == "ec8":
        der = (bytes.fromhex("308187020100301306072a8648ce3d020106082a8648ce3d030107046d306b0201010420")
               + rbytes(rng, 32) + bytes.fromhex("a144034200") + b"\x04" + rbytes(rng, 64))
        return "PRIVATE KEY", base64.b64encode(der).decode()
    der = bytes.fromhex("308204a40201000282010100") + rbytes(rng, 150)  # RSA-2048, cut off (truncated document)
    return "RSA PRIVATE KEY", base64.b64encode(der).decode()[:64 * 3]


def b64u(b: bytes) -> str:
    return base64.urlsafe_b64encode(b).decode().rstrip("=")


def make_jwt(rng, first: str) -> str:
    alg = rng.choice(["HS256", "HS256", "ES256"])
    header = b64u(json.dumps({"alg": alg, "typ": "JWT"}, separators=(",", ":")).encode())
    claims = {"sub": str(rng.randint(10**6, 10**9)), "name": ascii_fold(first), "iat": 1710512525 + rng.randint(0, 10**6)}
    if rng.random() < 0.5:
        claims["exp"] = claims["iat"] + 3600
    if rng.random() < 0.4:
        claims["role"] = rng.choice(["admin", "user", "editor"])
    payload = b64u(json.dumps(claims, separators=(",", ":")).encode())
    sig = b64u(rbytes(rng, 32 if alg == "HS256" else 64))
    return f"{header}.{payload}.{sig}"


def strong_value(rng) -> str:
    """A random credential value as generators and people with password managers make them."""
    kind = pick(rng, [(4, "alnum"), (2, "hex"), (2, "b64"), (2, "pw"), (1, "django"), (1, "urlsafe")])
    while True:
        if kind == "alnum":
            v = R(rng, rng.randint(16, 40), ALNUM)
        elif kind == "hex":
            v = R(rng, rng.choice([32, 40, 64]), HEX)
        elif kind == "b64":
            v = base64.b64encode(rbytes(rng, rng.choice([24, 32, 33]))).decode()
        elif kind == "pw":
            v = R(rng, rng.randint(16, 28), ALNUM + "!@#$%^&*-_=+?")
        elif kind == "django":
            v = "django-insecure-" + R(rng, 50, LOWER + DIGITS + "!@#$%^&*(-_=+)") if rng.random() < 0.3 \
                else R(rng, 50, LOWER + DIGITS + "!@#$%^&*(-_=+)")
        else:
            v = b64u(rbytes(rng, rng.choice([24, 32])))
        if any(c.isdigit() for c in v) and any(c.isalpha() for c in v) and v[0] not in "$%{/.~":
            return v


# (template, slots) for assignments; ⟦v⟧ is the secret value.
ASSIGN_TEMPLATES = [
    'DB_PASSWORD=⟦v⟧\nDB_HOST=db.internal\nDB_PORT=5432',
    'SECRET_KEY = "⟦v⟧"\nDEBUG = False\nALLOWED_HOSTS = ["app.lindenhof.group"]',
    'api_key: "⟦v⟧"\ntimeout: 30\nregion: eu-west-1',
    '  "client_secret": "⟦v⟧",\n  "redirect_uri": "https://app.ledgerly.app/oauth/callback"',
    "export API_TOKEN=⟦v⟧",
    "const apiKey = '⟦v⟧';\nfetch(`${BASE}/v2/orders`, { headers: { 'x-api-key': apiKey } });",
    "      - POSTGRES_PASSWORD=⟦v⟧\n      - POSTGRES_DB=orders",
    "[database]\nuser = app\npassword = ⟦v⟧\nhost = db01.internal",
    'self.auth_token = "⟦v⟧"  # TODO move to vault',
    "JWT_SECRET=⟦v⟧\nJWT_EXPIRES_IN=3600",
    "webhook_secret: ⟦v⟧",
    'ENCRYPTION_KEY = "⟦v⟧"',
    "spring.datasource.password=⟦v⟧\nspring.datasource.username=svc_orders",
    '$config["smtp_password"] = "⟦v⟧";',
    'mysql -h db.internal -u root --password="⟦v⟧" orders < dump.sql',
    "access_token=⟦v⟧",
    'refresh_token = "⟦v⟧"',
    "    password: ⟦v⟧\n    username: svc-backup",
    'MASTER_KEY="⟦v⟧"',
    "redis.password = ⟦v⟧",
    'os.environ.setdefault("SIGNING_SECRET", "⟦v⟧")',
    "Hier das neue Passwort für den Testserver – password: ⟦v⟧",
    "DB_PASS=⟦v⟧",
    "X-Api-Key: ⟦v⟧",
]


def secret_items(rng, first: str, last: str) -> tuple[str, str, list]:
    """One secret-bearing text: (subkind, template, fields)."""
    S = lambda v: Pii("secret", v)  # noqa: E731
    sub = pick(rng, [(30, "aws"), (36, "github"), (14, "slack"), (8, "slack_webhook"), (22, "stripe"),
                     (20, "google"), (30, "pem"), (70, "assign"), (24, "jwt"), (26, "conn"), (5, "gitlab"),
                     (5, "npm"), (3, "pypi"), (6, "openai"), (3, "anthropic"), (5, "hf"), (4, "sendgrid"),
                     (3, "twilio"), (3, "shopify"), (3, "databricks"), (3, "digitalocean"), (5, "basic")])
    if sub == "aws":
        kid, sec = aws_key_id(rng), R(rng, 40, B64)
        t = rng.choice([
            "[default]\naws_access_key_id = ⟦k⟧\naws_secret_access_key = ⟦s⟧\nregion = eu-central-1",
            "export AWS_ACCESS_KEY_ID=⟦k⟧\nexport AWS_SECRET_ACCESS_KEY=⟦s⟧",
            'AWS_ACCESS_KEY_ID: "⟦k⟧"\nAWS_SECRET_ACCESS_KEY: "⟦s⟧"',
            's3 = boto3.client("s3", aws_access_key_id="⟦k⟧", aws_secret_access_key="⟦s⟧")'])
        return sub, t, {"k": S(kid), "s": S(sec)}
    if sub == "github":
        p = pick(rng, [(6, "ghp_"), (2, "gho_"), (2, "ghs_"), (1, "ghu_"), (1, "ghr_"), (3, "github_pat_")])
        tok = p + (R(rng, 22, ALNUM) + "_" + R(rng, 59, ALNUM) if p == "github_pat_" else R(rng, 36, ALNUM))
        t = rng.choice([
            "export GITHUB_TOKEN=⟦t⟧", "git clone https://⟦user⟧:⟦t⟧@github.com/acme/infra.git",
            "- name: Checkout\n  with:\n    token: ⟦t⟧",
            'curl -H "Authorization: token ⟦t⟧" https://api.github.com/user',
            "oops, I pasted my token in the issue: ⟦t⟧ (revoked now?)", 'gh_token = "⟦t⟧"',
            "//npm.pkg.github.com/:_authToken=⟦t⟧"])
        return sub, t, {"t": S(tok), "user": ascii_fold(first).lower()}
    if sub == "slack":
        if rng.random() < 0.7:
            tok = f"xoxb-{D(rng, rng.randint(10, 13), '123456789')}-{D(rng, 13, '123456789')}-{R(rng, 24, ALNUM)}"
        else:
            tok = (f"xoxp-{D(rng, 12, '123456789')}-{D(rng, 12, '123456789')}-{D(rng, 13, '123456789')}-"
                   f"{R(rng, 32, HEX)}")
        t = rng.choice(["SLACK_BOT_TOKEN=⟦t⟧", 'client = WebClient(token="⟦t⟧")',
                        "slack:\n  token: ⟦t⟧\n  channel: '#alerts'", "the bot uses ⟦t⟧ to post into #deploys"])
        return sub, t, {"t": S(tok)}
    if sub == "slack_webhook":
        t = rng.choice(["SLACK_WEBHOOK_URL=https://hooks.slack.com/services/⟦w1⟧/⟦w2⟧/⟦t⟧",
                        'curl -X POST -H "Content-type: application/json" --data \'{"text":"deploy done"}\' '
                        "https://hooks.slack.com/services/⟦w1⟧/⟦w2⟧/⟦t⟧",
                        "webhook: https://hooks.slack.com/services/⟦w1⟧/⟦w2⟧/⟦t⟧"])
        return sub, t, {"w1": "T" + R(rng, 10, UPPER + DIGITS), "w2": "B" + R(rng, 10, UPPER + DIGITS),
                        "t": S(R(rng, 24, ALNUM))}
    if sub == "stripe":
        p = pick(rng, [(6, "sk_live_"), (2, "rk_live_"), (2, "whsec_")])
        tok = p + (R(rng, 32, ALNUM) if p == "whsec_" else
                   pick(rng, [(1, R(rng, 24, ALNUM)), (2, "51" + R(rng, 97, ALNUM))]))
        t = rng.choice(['stripe.api_key = "⟦t⟧"', "STRIPE_SECRET_KEY=⟦t⟧",
                        "curl https://api.stripe.com/v1/charges -u ⟦t⟧: -d amount=2000 -d currency=eur",
                        "const stripe = require('stripe')('⟦t⟧');", "STRIPE_WEBHOOK_SECRET=⟦t⟧"])
        return sub, t, {"t": S(tok)}
    if sub == "google":
        tok = "AIza" + R(rng, 35, ALNUM + "-_")
        t = rng.choice([
            '<script src="https://maps.googleapis.com/maps/api/js?key=⟦t⟧&callback=initMap" async></script>',
            "GOOGLE_API_KEY=⟦t⟧", 'firebaseConfig = { apiKey: "⟦t⟧", authDomain: "shop-4f2a1.firebaseapp.com" };',
            "curl 'https://www.googleapis.com/youtube/v3/videos?part=snippet&id=dQw4w9WgXcQ&key=⟦t⟧'",
            "<string name=\"google_api_key\">⟦t⟧</string>"])
        return sub, t, {"t": S(tok)}
    if sub == "pem":
        label, body = pem_block(rng)
        style = pick(rng, [(3, "file"), (2, "json"), (2, "yaml")])
        lines = [body[i:i + 64] for i in range(0, len(body), 64)]
        cut = label == "RSA PRIVATE KEY"
        if style == "json":
            pem = f"-----BEGIN {label}-----\\n" + "\\n".join(lines) + ("" if cut else f"\\n-----END {label}-----")
            t = ('{"type": "service_account", "private_key": "⟦k⟧\\n", "client_email": "⟦sa⟧"}'
                 if not cut else '"private_key": "⟦k⟧')
            sa = f"{rng.choice(['svc', 'etl-runner', 'ci-deployer'])}@{rng.choice(['shop', 'data', 'infra'])}-" \
                 f"{rng.choice(['prod', 'dev'])}-{D(rng, 6)}.iam.gserviceaccount.com"
            return sub, t, {"k": S(pem), "sa": Pii("email", sa)}
        if style == "yaml":
            pem = f"-----BEGIN {label}-----\n" + "".join(f"    {x}\n" for x in lines) + (
                "" if cut else f"    -----END {label}-----")
            return sub, "tls:\n  key: |\n    ⟦k⟧" + ("" if cut else "\n  cert: cert.pem"), {"k": S(pem.rstrip("\n"))}
        pem = f"-----BEGIN {label}-----\n" + "\n".join(lines) + ("" if cut else f"\n-----END {label}-----")
        t = rng.choice(["here is the key for staging:\n⟦k⟧\ndon't commit it", "$ cat id_key.pem\n⟦k⟧",
                        "⟦k⟧"]) if not cut else "$ head -4 server.key\n⟦k⟧"
        return sub, t, {"k": S(pem)}
    if sub == "assign":
        return sub, rng.choice(ASSIGN_TEMPLATES), {"v": S(strong_value(rng))}
    if sub == "jwt":
        t = rng.choice(["Authorization: Bearer ⟦t⟧",
                       'curl -H "Authorization: Bearer ⟦t⟧" https://api.ledgerly.app/v1/me',
                        '{"access_token": "⟦t⟧", "token_type": "Bearer", "expires_in": 3600}',
                        "Cookie: session=⟦t⟧; Path=/; HttpOnly", "localStorage.setItem('id_token', '⟦t⟧');",
                        "https://app.brightpath.io/sso/callback?jwt=⟦t⟧"])
        return sub, t, {"t": S(make_jwt(rng, first))}
    if sub == "conn":
        pw = R(rng, rng.randint(16, 28), ALNUM)
        user = rng.choice(["app", "svc_orders", "admin", "postgres", "reporting", ascii_fold(first).lower()])
        t = rng.choice([
            "DATABASE_URL=postgres://⟦u⟧:⟦p⟧@db.internal.prod:5432/orders",
            'engine = create_engine("postgresql+psycopg2://⟦u⟧:⟦p⟧@pg-main.lindenhof.group/analytics")',
            "MONGO_URI=mongodb+srv://⟦u⟧:⟦p⟧@cluster0.x7k2p.mongodb.net/?retryWrites=true&w=majority",
            "REDIS_URL=redis://:⟦p⟧@cache.prod.internal:6379/0",
            "amqp://⟦u⟧:⟦p⟧@rabbitmq.svc.cluster.local:5672/%2F",
            'mysql_url = "mysql://⟦u⟧:⟦p⟧@mysql-02.dc1.kitefin.ai:3306/billing"',
            "jdbc:sqlserver://sql01.corp.tallpine.co:1433;databaseName=hr;user=⟦u⟧;password=⟦p⟧;encrypt=true",
            "Server=tcp:shop-db.database.windows.net,1433;User ID=⟦u⟧;Password=⟦p⟧;Encrypt=True;"])
        return sub, t, {"u": user, "p": S(pw)}
    if sub == "gitlab":
        return sub, rng.choice(["GITLAB_TOKEN=⟦t⟧",
                               'git remote set-url origin "https://oauth2:⟦t⟧@gitlab.com/grp/app.git"',
                                "PRIVATE-TOKEN: ⟦t⟧"]), {"t": S("glpat-" + R(rng, 20, ALNUM + "-_"))}
    if sub == "npm":
        return sub, rng.choice(["//registry.npmjs.org/:_authToken=⟦t⟧", "NPM_TOKEN=⟦t⟧ npm publish --access public"]), \
            {"t": S("npm_" + R(rng, 36, ALNUM))}
    if sub == "pypi":
        tok = "pypi-AgEIcHlwaS5vcmc" + R(rng, rng.randint(120, 160), B64URL)
        return sub, rng.choice(["[pypi]\n  username = __token__\n  password = ⟦t⟧", "TWINE_PASSWORD=⟦t⟧",
                                "twine upload -u __token__ -p ⟦t⟧ dist/*"]), {"t": S(tok)}
    if sub == "openai":
        tok = pick(rng, [(1, "sk-" + R(rng, 20, ALNUM) + "T3BlbkFJ" + R(rng, 20, ALNUM)),
                         (2, "sk-proj-" + R(rng, rng.randint(120, 156), ALNUM + "-_"))])
        return sub, rng.choice(["OPENAI_API_KEY=⟦t⟧", 'client = OpenAI(api_key="⟦t⟧")',
                                'curl https://api.openai.com/v1/models -H "Authorization: Bearer ⟦t⟧"']), {"t": S(tok)}
    if sub == "anthropic":
        tok = "sk-ant-api03-" + R(rng, 93, ALNUM + "-_") + "AA"
        return sub, rng.choice(["ANTHROPIC_API_KEY=⟦t⟧",
                               'curl https://api.anthropic.com/v1/messages -H "x-api-key: ⟦t⟧"']), \
            {"t": S(tok)}
    if sub == "hf":
        return sub, rng.choice(["HF_TOKEN=⟦t⟧", "huggingface-cli login --token ⟦t⟧",
                                'login(token="⟦t⟧")']), {"t": S("hf_" + R(rng, 34, UPPER + LOWER))}
    if sub == "sendgrid":
        return sub, rng.choice(["SENDGRID_API_KEY=⟦t⟧", "sg = SendGridAPIClient('⟦t⟧')"]), \
            {"t": S("SG." + R(rng, 22, B64URL) + "." + R(rng, 43, B64URL))}
    if sub == "twilio":
        return sub, rng.choice(["TWILIO_AUTH_TOKEN=⟦t⟧", "client = Client(account_sid, '⟦t⟧')"]), \
            {"t": S(R(rng, 32, HEX))}
    if sub == "shopify":
        return sub, rng.choice(["SHOPIFY_ACCESS_TOKEN=⟦t⟧", "X-Shopify-Access-Token: ⟦t⟧"]), \
            {"t": S("shpat_" + R(rng, 32, HEX))}
    if sub == "databricks":
        return sub, rng.choice(["DATABRICKS_TOKEN=⟦t⟧", "databricks configure --token ⟦t⟧"]), \
            {"t": S("dapi" + R(rng, 32, HEX))}
    if sub == "digitalocean":
        return sub, rng.choice(["DIGITALOCEAN_TOKEN=⟦t⟧", "doctl auth init -t ⟦t⟧"]), \
            {"t": S("dop_v1_" + R(rng, 64, HEX))}
    user = ascii_fold(first).lower()
    basic = base64.b64encode(f"{user}:{R(rng, rng.randint(12, 20), ALNUM)}".encode()).decode()
    return "basic", rng.choice(["Authorization: Basic ⟦t⟧",
                                'curl -H "Authorization: Basic ⟦t⟧" https://ci.tallpine.co/api/json']), \
        {"t": S(basic)}


# --- near-misses --------------------------------------------------------------------------------

def isbn13(rng) -> str:
    body = rng.choice(["978", "979"]) + D(rng, 9)
    check = (10 - sum(int(c) * (3 if i % 2 else 1) for i, c in enumerate(body)) % 10) % 10
    return body + str(check)


def isbn10(rng) -> str:
    body = D(rng, 9, "0123489")
    s = sum((10 - i) * int(c) for i, c in enumerate(body)) % 11
    c = (11 - s) % 11
    return body + ("X" if c == 10 else str(c))


def hyphenate_isbn(rng, isbn: str) -> str:
    if len(isbn) == 13:
        g = rng.randint(1, 2)
        p = rng.randint(2, 5)
        return "-".join([isbn[:3], isbn[3:3 + g], isbn[3 + g:3 + g + p], isbn[3 + g + p:12], isbn[12]])
    g = rng.randint(1, 2)
    p = rng.randint(2, 5)
    return "-".join([isbn[:g], isbn[g:g + p], isbn[g + p:9], isbn[9]])


def ean13(rng) -> str:
    body = rng.choice(["400", "401", "402", "403", "404", "405", "406", "407", "408", "409", "440", "300", "500",
                       "800", "871", "590"]) + D(rng, 9)
    check = (10 - sum(int(c) * (3 if i % 2 else 1) for i, c in enumerate(body)) % 10) % 10
    return body + str(check)


def uuid4(rng) -> str:
    h = list(f"{rng.getrandbits(128):032x}")
    h[12] = "4"
    h[16] = "89ab"[int(h[16], 16) % 4]
    s = "".join(h)
    return f"{s[:8]}-{s[8:12]}-{s[12:16]}-{s[16:20]}-{s[20:]}"


def near_misses(rng) -> list[tuple[str, str]]:
    """(near_miss_kind, text) pairs."""
    out: list[tuple[str, str]] = []
    add = lambda k, t: out.append((k, t))  # noqa: E731
    name = lambda: " ".join(rng.choice(NAMES))  # noqa: E731

    # ISBN-10/13 with valid check digits, hyphenated and compact.
    for i in range(32):
        isbn = isbn13(rng) if i % 3 else isbn10(rng)
        w = hyphenate_isbn(rng, isbn) if i % 2 else isbn
        add("isbn", rng.choice([f"{name()}. Collected Essays. 2nd ed. Berlin, 2019. ISBN {w}.",
                                f"@book{{k{i}, title={{Numerical Methods}}, year={{2016}}, isbn={{{w}}}}}",
                                f"ISBN-{len(isbn)}: {w} | Paperback, 412 pages",
                                f"Neuauflage erschienen (ISBN {w}), 24,90 €.",
                                f"Référence de l'ouvrage : ISBN {w}, disponible en librairie."]))
    # Versions: a version marker, more than four parts, or a part over 255 (bare four-part numbers are
    # address-shaped and left out of both sides).
    versions = [
        "Upgraded the agent to v2.10.0.1 last night, no issues so far.", "Python 3.11.7 (main, Dec  4 2023, 18:10:11)",
        "numpy==1.26.4\npandas==2.2.1\nscipy==1.12.0", "node v20.11.1 / npm 10.2.4",
        "User-Agent: Mozilla/5.0 (Windows NT 10.0; Win64; x64) Chrome/122.0.6261.94 Safari/537.36",
        "Microsoft Windows [Version 10.0.19045.4046]", "release 1.2.3.4.5 fixes the regression in the parser",
        "OpenSSL 3.0.13 30 Jan 2024 (Library: OpenSSL 3.0.13 30 Jan 2024)",
        "Linux web01 6.5.0-26-generic #26-Ubuntu SMP",
        "__version__ = '0.5.1.2'", "<version>2.17.1</version>", "go version go1.22.1 linux/amd64",
        "versionName \"8.3.0.12\" versionCode 80300", "Oracle Database 19c Enterprise Edition Release 19.0.0.0.0",
        "typing-extensions>=3.10.0.2", "Firmware version 4.2.1.7 is available for your router.",
        "Build 22631.3296 (Windows 11 23H2)", "dotnet --version\n8.0.203", "Bump protobuf from 3.20.3 to 4.25.3",
        "Chrome 123.0.6312.58 (Official Build) (64-bit)", "ver. 5.4.1.2 – Änderungsprotokoll siehe unten",
        "Versión 2.0.0.4 del firmware publicada el 12/03/2024.", "pip install torch==2.2.1+cu121",
        "Ruby 3.3.0p0 (2023-12-25 revision 5124f9ac75)",
        "PostgreSQL 16.2 on x86_64-pc-linux-gnu, compiled by gcc 12.2.0",
        "kernel-5.14.0-362.18.1.el9_3.x86_64", "Apache/2.4.58 (Unix) OpenSSL/3.0.13", "v1.28.7+k3s1 kube-proxy",
        "Revision 1.3.2.4 of the spec supersedes revision 1.3.2.3.", "rev. 2.1.0.3 of the board layout",
        "Section 8.2.4.44 of the HTML standard"]
    for t in versions:
        add("version", t)
    # Dates, times, timestamps.
    for _ in range(32):
        y, mo, d, h, mi, s = rng.randint(2015, 2025), rng.randint(1, 12), rng.randint(1, 28), rng.randint(0, 23), \
            rng.randint(0, 59), rng.randint(0, 59)
        ep = rng.randint(1_420_000_000, 1_760_000_000)
        ms = rng.randint(0, 999)
        add("datetime", rng.choice([
            f"{y}-{mo:02d}-{d:02d} {h:02d}:{mi:02d}:{s:02d} INFO worker started (pid 4182)",
            f"backup_{y}{mo:02d}{d:02d}{h:02d}{mi:02d}{s:02d}.tar.gz  3.2G",
            f'{{"ts": {ep}{ms:03d}, "event": "page_view", "path": "/pricing"}}',
            f"created_at={ep} updated_at={ep + rng.randint(10, 99999)}",
            f"{y}-{mo:02d}-{d:02d}T{h:02d}:{mi:02d}:{s:02d}.{ms:03d}+01:00 request completed in 182ms",
            f"Le rendez-vous est fixé au {d:02d}/{mo:02d}/{y} à {h:02d}h{mi:02d}.",
            f"Termin: {d:02d}.{mo:02d}.{y}, {h:02d}:{mi:02d} Uhr",
            f"Fri, {d:02d} Mar {y} {h:02d}:{mi:02d}:{s:02d} +0000 (UTC) message accepted",
            f"elapsed {h:02d}:{mi:02d}:{s:02d}.{ms:03d}, opening hours 09:00-17:30",
            f"{y}{mo:02d}{d:02d}-{h:02d}{mi:02d}{s:02d} snapshot completed, next run {y}{mo:02d}{d:02d}-235959"]))
    # Coordinates.
    for _ in range(26):
        lat, lon = rng.uniform(-60, 70), rng.uniform(-170, 175)
        add("coordinates", rng.choice([
            f"The venue is at {lat:.4f}, {lon:.4f} (see map).", f"GPS: {lat:.6f} {lon:.6f}",
            f"lat={lat:.5f}&lon={lon:.5f}&zoom=14", f'{{"type": "Point", "coordinates": [{lon:.6f}, {lat:.6f}]}}',
            f"POINT({lon:.4f} {lat:.4f}) -- SRID 4326", f"geo:{lat:.6f},{lon:.6f};u=35",
            f"Koordinaten: {abs(lat):.4f}° {'N' if lat > 0 else 'S'}, {abs(lon):.4f}° {'E' if lon > 0 else 'W'}"]))
    # Order, invoice, tracking, ticket numbers.
    for _ in range(34):
        add("order_number", rng.choice([
            f"Order #{D(rng, 3, '123456789')}-{D(rng, 7)}-{D(rng, 7)} has shipped.",
            f"Invoice INV-{rng.randint(2019, 2025)}-{D(rng, 6)} is due on receipt.",
            f"Tracking number: 1Z{R(rng, 6, UPPER + DIGITS)}{D(rng, 10)} (UPS Ground)",
            f"PO {D(rng, 10, '4')} – please reference on all correspondence",
            f"Sendungsnummer: {D(rng, 12)} (DHL Paket)",
            f"USPS tracking {grp('94' + D(rng, 20), [4] * 6)} delivered to front door",
            f"Case #{D(rng, 8, '0')} has been escalated to tier 2.",
            f"Ticket INC{D(rng, 7, '0')} resolved by change CHG{D(rng, 7, '0')}.",
            f"RMA {rng.randint(2020, 2025)}-{D(rng, 4)}-{D(rng, 4)} approved",
            f"Kundennummer {D(rng, 4, '123456789')}-{D(rng, 4)}, Rechnungsnummer {D(rng, 8, '123456789')}",
            f"Numéro de commande : {D(rng, 9, '123456789')}, suivi Colissimo {R(rng, 2, UPPER)}{D(rng, 9)}FR",
            f"ref {D(rng, 2, '123456789')}-{D(rng, 3, '23456789')}-{D(rng, 3)}-{D(rng, 4)}-{D(rng, 2)} (part number)",
            f"SKU {D(rng, 3, '123456789')}.{D(rng, 3)}.{D(rng, 2)} – 24 units in stock"]))
    for _ in range(16):
        add("uuid", rng.choice([f"request_id={uuid4(rng)} status=200", f'"id": "{uuid4(rng)}",',
                                f"Deleted volume {uuid4(rng)} (vol-ebs-data)"]))
    for _ in range(24):
        sha = R(rng, 40, HEX)
        add("hash", rng.choice([f"commit {sha}\nMerge: {sha[:7]} {R(rng, 7, HEX)}",
                                f"Fixed in {sha[:7]} (see PR #{rng.randint(100, 9999)})",
                                f"image: registry.io/app@sha256:{R(rng, 64, HEX)}",
                                f"{R(rng, 32, HEX)}  release-{rng.randint(1, 9)}.tar.gz",
                                f"SHA256 (dist.zip) = {R(rng, 64, HEX)}", f"etag: W/\"{R(rng, 32, HEX)}\""]))
    for _ in range(10):
        add("hex_colour", rng.choice([f".btn-primary {{ color: #{R(rng, 6, HEX)}; background: #{R(rng, 3, HEX)}; }}",
                                      f"palette: ['#{R(rng, 6, HEX)}', '#{R(rng, 6, HEX)}', '#{R(rng, 6, HEX)}']"]))
    maths = [
        "e ≈ 2.71828 18284 59045 and π ≈ 3.14159 26535 89793", "1 + 2 = 3, 12 + 34 = 46, 555 + 1234 = 1789",
        "x = 555 * 123 - 4567", "The first primes: 2 3 5 7 11 13 17 19 23 29 31 37 41 43 47",
        "Fibonacci: 1 1 2 3 5 8 13 21 34 55 89 144 233 377 610 987", "7 14 21 28 35 42 49 56 63 70",
        "2^64 = 18446744073709551616", "20! = 2432902008176640000",
        "[[0.1234, 3.4512], [6.7823, 9.0145], [2.2001, 7.7777]]", "loss: 0.3412 0.2987 0.2650 0.2511 0.2499",
        "| n | n² | n³ |\n|---|----|-----|\n| 12 | 144 | 1728 |\n| 13 | 169 | 2197 |",
        "+3.14 2.71 -1.41 +1.73", "sqrt(2) = 1.4142135623730951", "det = 1.234e-05 ± 2.1e-07",
        "Avogadro 6.02214076e23, Planck 6.62607015e-34", "12 345 678 + 98 765 432 = 111 111 110",
        "f(x) = 3x² + 2x − 7; f(4) = 49", "1/7 = 0.142857142857142857...", "x: 100 200 300 400 500 600 700 800 900",
        "matrix rows: 1 0 0 0 / 0 1 0 0 / 0 0 1 0 / 0 0 0 1", "9 × 9 = 81; 99 × 99 = 9801; 999 × 999 = 998001",
        "Population 2023: 83 294 633 (DE), 67 848 156 (FR), 58 870 762 (IT)",
        "Stats: mean 412.55, sd 37.81, n=1200, p<0.001", "0.1 + 0.2 = 0.30000000000000004",
        "CRC: 4294967295, INT_MAX: 2147483647, UINT16: 65535", "Sudoku row: 5 3 4 6 7 8 9 1 2",
        "Dimensions: 1920 x 1080 px, 72 dpi, 24-bit", "Progress: 1024/4096 (25.0%) 3.2 MB/s ETA 00:00:42",
        "Scores: 98.5 97.25 96.75 95.0 94.125", "z = (x - 3.5) / 1.25 ; t = 2.045 ; df = 29"]
    for t in maths:
        add("math", t)
    prices = ["Total: $1,299.99 (incl. tax)", "Preis: € 1.234,56 inkl. MwSt.", "£12.50 per person, children £6.25",
              "¥120,000 (税込)", "1 234,56 € TTC", "USD 2,499.00 – EUR 2.299,00 – GBP 1,999.00",
              "R$ 3.450,90 em até 10x sem juros", "₹ 1,24,999.00 only", "CHF 1'299.90 statt 1'499.90",
              "Subtotal 845.20\nShipping 12.99\nVAT 164.59\nTotal 1022.78", "zł 4 599,00 brutto",
              "Budget 2024: $14,250,000.00 (+3.5% YoY)", "Precio: 1.299,99 € IVA incluido", "A$1,849.00 RRP",
              "Price per unit 0.0045 USD, 1,000,000 units = 4,500.00 USD", "₩1,290,000원", "kr 12 995,-",
              "MXN $18,499.00 a 12 MSI", "was $79.99 now $59.99 save 25%", "8.888,88 € Restbetrag"]
    for t in prices:
        add("price", t)
    oids = ["OID 1.3.6.1.4.1.311.21.7 (Microsoft certificate template)",
            "sha256WithRSAEncryption (1.2.840.113549.1.1.11)",
            "snmpget -v2c -c public switch01 1.3.6.1.2.1.1.3.0", "iso.3.6.1.2.1.2.2.1.10.3 = Counter32: 3912312",
            "id-ce-subjectAltName OBJECT IDENTIFIER ::= { id-ce 17 } -- 2.5.29.17", 'ObjectIdentifier("2.5.29.9")',
            "OID 2.5.4.3 (commonName)", "1.3.6.1.5.5.7.3.1 serverAuth, 1.3.6.1.5.5.7.3.2 clientAuth",
            "enterprises.2021.4.5.0 memTotalReal", "urn:oid:2.16.840.1.113883.3.1", "policy 2.23.140.1.2.1 (DV)",
            "1.2.840.10045.3.1.7 prime256v1", "oid: 1.3.6.1.4.1.11129.2.4.2 (SCT list)",
            "LDAP 1.3.6.1.4.1.1466.115.121.1.15",
            "2.16.840.1.101.3.4.2.1 id-sha256"]
    for t in oids:
        add("oid", t)
    doc_ips = ["Example: ssh admin@192.0.2.10", "server 198.51.100.23 is used in our docs",
               "203.0.113.7 - - [10/Oct/2000:13:55:36 -0700] \"GET / HTTP/1.0\" 200",
               "ping 2001:db8::1", "address 2001:db8:85a3::8a2e:370:7334/64", "listen 127.0.0.1:8080;",
               "bind 0.0.0.0:5432",
               "broadcast 255.255.255.255 netmask 255.255.255.0", "server_name localhost; listen [::]:80;",
               "nameserver ::1",
               "ipconfig: Subnet Mask . . . : 255.255.240.0", "wildcard 0.0.0.255 in the ACL",
               "route 198.51.100.0/24 via 192.0.2.1",
               "e.g. 203.0.113.0/24 and 2001:db8:1234::/48 in RFC examples", "curl http://127.0.0.1:9090/metrics",
               "AAAA 2001:db8:10::35 (documentation prefix)", "Beispiel: IP 192.0.2.44, Gateway 192.0.2.1",
               "exemple : 198.51.100.77 (plage de documentation)", "ip addr add 2001:db8:0:1::101/64 dev eth0",
               "netmask 255.255.255.128 (a /25)", "host 203.0.113.200 unreachable (test net)",
               "0.0.0.0/0 -> igw-0a1b2c",
               "ping -c1 127.0.0.1 && echo ok", "inet 127.0.0.1/8 scope host lo",
               "ff02::1 all-nodes multicast is not an address of anyone",
               "2001:0db8:0000:0000:0000:ff00:0042:8329 (RFC 3849)",
               "Gateway: 198.51.100.1, DNS: 192.0.2.53"]
    for t in doc_ips:
        add("reserved_ip", t)
    # Cards: Luhn-invalid with a real prefix, and Luhn-valid with no issuer (prefix 1, 7, 9; not 8, which RuPay's 81
    # and 82 and UzCard's 8600 are: "1779" draws as "1789" did, so only those texts change).
    for i in range(32):
        _, num = make_card(rng)
        if i % 3:
            num = num[:-1] + str((int(num[-1]) + rng.randint(1, 9)) % 10)
        else:
            body = rng.choice("1779") + D(rng, 14)
            num = body + luhn_digit(body)
        w = card_written(rng, num)
        add("card_invalid", rng.choice([f"Card number: {w} (declined: invalid number)",
                                        f"test input {w} should fail validation",
                                        f"Account {w}", f"ref: {w}", f"Kartennummer ungültig: {w}"]))
    for _ in range(10):
        body = rng.choice(["35", "86", "99", "01"]) + D(rng, 12)
        imei = body + luhn_digit(body)
        add("imei", rng.choice([f"IMEI: {imei}", f"Device IMEI {imei} registered to fleet 7", f"*#06# → {imei}"]))
    for _ in range(12):
        ean = ean13(rng)
        add("ean_barcode", rng.choice([f"EAN {ean} – Vollmilch 1 l", f"GTIN: {ean}", f"barcode={ean}&qty=3"]))
    ssn_bad = []
    for i in range(28):
        a, g, s = make_ssn(rng)
        k = i % 6
        if k == 0:
            a = "000"
        elif k == 1:
            a = "666"
        elif k == 2:
            a = str(rng.randint(900, 999))
            g = f"{rng.randint(1, 49):02d}"  # not an ITIN group (50-65, 70-88, 90-92, 94-99)
        elif k == 3:
            g = "00"
        elif k == 4:
            s = "0000"
        else:
            s = s + str(rng.randint(0, 9))  # 10-digit serial: not an SSN
        ssn_bad.append(f"{a}-{g}-{s}")
    for w in ssn_bad:
        add("ssn_invalid", rng.choice([f"SSN field rejected: {w}", f"part no. {w}", f"test fixture ssn_invalid = '{w}'",
                                       f"Invalid SSN {w} (SSA never issues this)"]))
    # Phone-shaped numbers that are valid in no region: NANP area or exchange codes starting 0/1, unassigned
    # country codes, national numbers of the wrong length.
    bad_phones = []
    for _ in range(8):
        bad_phones.append(f"+1 {rng.choice('01')}{D(rng, 2)}-{D(rng, 3, '23456789')}-{D(rng, 4)}")
        bad_phones.append(f"+1 ({rng.choice(US_AREAS)}) {rng.choice('01')}{D(rng, 2)}-{D(rng, 4)}")
    for cc in ["999", "990", "997", "283", "425"]:
        bad_phones.append(f"+{cc} {D(rng, 4)} {D(rng, 4)}")
    for t in ["+44 20 {0} {1}", "+33 0{0} {1}"]:
        bad_phones.append(t.format(D(rng, 3), D(rng, 3)))
    bad_phones += ["+44 20 7946 09", "+33 1 23 45 67", "+61 0 4123 456", "+86 123 4567 8901", "+7 (000) 123-45-67",
                   "+7 (123) 456-78-90", "+31 6 1234 567", "+61 2 1234 567", "+55 11 1234-567", "+44 7911 12345",
                   "+33 6 12 34 56 7", "+34 000 000 000"]
    for p in bad_phones:
        add("phone_invalid", rng.choice([f"Invalid phone number: {p}", f"phone field failed validation ({p})",
                                         f"test_phone_rejects('{p}')", f"placeholder {p} in the form mock-up"]))
    # IBAN-shaped: wrong check digits, wrong length, unknown country.
    for i in range(30):
        cc = rng.choice(IBAN_COUNTRIES[:16])
        bban = make_bban(rng, cc)
        good = iban_check(cc, bban)
        k = i % 3
        if k == 0:
            chk = f"{(int(good) + rng.randint(1, 90)) % 97 + 2:02d}"
            chk = chk if chk != good else f"{(int(good) + 1) % 97 + 2:02d}"
            iban = cc + chk + bban
        elif k == 1:
            iban = cc + good + bban[:-1]
            iban = cc + iban_check(cc, iban[4:]) + iban[4:]  # correct checksum, wrong length for the country
        else:
            xx = rng.choice(["XX", "ZZ", "QQ", "AA"])
            iban = xx + iban_check(xx, bban) + bban
        w = iban_written(rng, iban)
        add("iban_invalid", rng.choice([f"IBAN {w} is invalid – please check the digits.",
                                        f"example_iban = \"{w}\"  # fails mod-97",
                                        f"Ungültige IBAN: {w}", f"IBAN invalide : {w}"]))
    email_like = [
        "pip install 'requests@git+https://github.com/psf/requests@v2.31.0'", "@property\ndef name(self) -> str:",
        "ssh user@localhost -p 2222", "see icon@2x.png and logo@1.5x.jpg in assets/",
        "git clone git@github.com:acme/infra.git",
        "a @ b.com is not how you write an address", "npm i @scope/pkg@latest --save",
        "docker pull nginx@sha256:0d17b565c37bcbd895e9d92315a05c1c3c9a29f762b011a10c54a66cd53c9b31",
        "go get golang.org/x/net@v0.22.0", "@media (max-width: 600px) { .nav { display: none; } }",
        "@Override\npublic String toString()",
        "thanks @jsmith and @maria_dev for the review!", "root@web-01:~# systemctl restart nginx",
        "user@host:~$ ls -la",
        "export default { name: 'App', components: { Foo } } // @ts-check", "vue@3.4.21 react@18.2.0 svelte@4.2.12",
        "pattern: ^[a-z]+@[a-z]+\\.[a-z]{2,}$", "@SpringBootApplication\npublic class App {}",
        "mail to: <name>@<domain>",
        "deploy@ci-runner-7 finished job 8812", "postgres@db-primary:5432 is accepting connections",
        "@here the build is green again", "#[derive(Debug)] @@ -12,7 +12,8 @@ fn main()",
        "ansible all -u admin@localdomain -m ping",
        "select * from users where email like '%@%';", "image@3x.webp", "kubectl --context=admin@prod-cluster get pods",
        "name@example? no, use the form", "@@ -1,4 +1,5 @@", "uses: actions/checkout@v4"]
    for t in email_like:
        add("email_like", t)
    ipv6_like = [
        "std::string s; std::vector<int> v;", "Foo::Bar::baz()", "x[::2] + y[1::2] + a[::1000]",
        "MAC 00:1A:2B:3C:4D:5E",
        "12:30:45 job finished", "impl fmt::Display for Point { fn fmt(&self, f: &mut fmt::Formatter) }",
        "map :: (a -> b) -> [a] -> [b]", "Illuminate\\Support\\Facades::route('home')",
        "ff:ff:ff:ff:ff:ff broadcast MAC",
        "dead::beef is not an address", "Time: 10:15:30:45 (frames)", "a::b::c::d", "ACE::Task<ACE_MT_SYNCH>",
        "$obj::method() and self::CONST", "ratio 16:9:4:3", "2024-03-15T14:22:05 PT1H30M", "key::value::other",
        "bt addr 3c:5a:b4:01:02:03", "Module::Class::CONSTANT = 1", "perl -MData::Dumper -e 'print Dumper(\\%h)'",
        "le match s'est terminé 2:1:0 après 90:00", "crate::utils::parse_u16(&buf[4..6])", "::before { content: '' }",
        "chmod u=rwx,g=rx,o= file && echo done:ok:1", "time 01:02:03:04:05 sequence"]
    for t in ipv6_like:
        add("ipv6_like", t)
    placeholders = [
        'password = "changeme"', 'DB_PASSWORD=changeme', 'api_key = os.environ["API_KEY"]', "SECRET_KEY=${SECRET_KEY}",
        "token: {{ .Values.github.token }}", 'password: "<your-password>"',
        "GITHUB_TOKEN=ghp_xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx",
        "AWS_ACCESS_KEY_ID=AKIAXXXXXXXXXXXXXXXX", "xoxb-your-token-here", "Authorization: Bearer <token>",
        "password: ********", '"password": ""', "stripe.api_key = 'sk_live_...'", "max_tokens=4096, temperature=0.2",
        'tokenizer = AutoTokenizer.from_pretrained("meta-llama/Llama-2-7b-hf")',
        'password_reset_url = "/accounts/reset/"',
        '{"token_type": "bearer", "expires_in": 3600}', "csrf_token = get_token(request)",
        "secret_santa_assignments = []",
        "-----BEGIN PUBLIC KEY-----\nMFkwEwYHKoZIzj0CAQYIKoZIzj0DAQcDQgAE" + R(rng, 56, B64) + "\n" + R(rng, 32, B64) + "==\n-----END PUBLIC KEY-----",
        "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAI" + R(rng, 43, B64) + " deploy@ci",
        '"integrity": "sha512-' + R(rng, 86, B64) + '=="', "private_key: PKCS7PrivateKeyTypes,",
        "token = self.get_token(request)", "the password is hunter2hunter2",
        "-----BEGIN CERTIFICATE-----\n...\n-----END CERTIFICATE-----",
        "api_key: REPLACE_ME", "export OPENAI_API_KEY=sk-...", "client_secret: ${{ secrets.CLIENT_SECRET }}",
        "PASSWORD=password", "Set SECRET_KEY to a long random string in production.", "passwd: files systemd",
        "access_token_ttl: 900", 'key_name = "prod-signing-key"',
        "-----BEGIN RSA PRIVATE KEY-----\n-----END RSA PRIVATE KEY-----"]
    for t in placeholders:
        add("placeholder_credential", t)
    for _ in range(20):
        add("numeric_id", rng.choice([
            f"https://x.com/someone/status/{D(rng, 19, '1')}", f"Discord user ID {D(rng, 18, '1')}",
            f"doi:10.{D(rng, 4, '1')}/s{D(rng, 5)}-{D(rng, 3)}-{D(rng, 4)}-{D(rng, 1)}",
            f"arXiv:{rng.randint(2001, 2412)}.{D(rng, 5)}v{rng.randint(1, 4)}", f"PMID: {D(rng, 8, '123')}",
            f"US Patent {D(rng, 2, '1')},{D(rng, 3)},{D(rng, 3)} B2", f"ZIP+4: {D(rng, 5, '123456789')}-{D(rng, 4)}",
            f"Aktenzeichen {D(rng, 3)} Js {D(rng, 5)}/{rng.randint(18, 24)}", f"BL No. {R(rng, 4, UPPER)}{D(rng, 7)}"]))
    return out


# --- assembly -----------------------------------------------------------------------------------

class Builder:
    def __init__(self, seed: int):
        self.rng = random.Random(seed)
        self.records: list[dict] = []
        self.texts: set[str] = set()

    def person(self):
        return self.rng.choice(NAMES)

    def add(self, kind, type_, country, nmk, template, fields) -> bool:
        text, spans = compose(template, fields)
        if text in self.texts:
            return False
        assert 40 <= len(text) <= 400, (len(text), text)
        self.texts.add(text)
        self.records.append({"id": len(self.records) + 1, "kind": kind, "type": type_, "country": country,
                             "near_miss_kind": nmk, "text": text, "spans": spans})
        return True

    def base_fields(self, country=None):
        first, last = self.person()
        fields = {"first": first, "last": last, "name": f"{first} {last}",
                  "upname": ascii_fold(f"{first} {last}").upper()}
        fields["city"] = self.rng.choice(CITIES.get(country, ["Berlin", "Lyon", "Leeds", "Porto"]))
        return fields


NEUTRAL_LEADS = ["Notes from the code review on Tuesday:", "Copied from the nightly build log:",
                 "See the snippet below for the context:", "From the README, section three (Usage):",
                 "Quick question about this line, is it right?", "Pasted from the team wiki page yesterday:",
                 "Aus dem Protokoll der Sitzung vom Montag:", "Extrait de la documentation du projet :",
                 "Fragmento del informe que me enviaste:"]


PADS = {
    "us_ssn": ["Applicant record from the HR onboarding form:", "Copied from the tax preparation worksheet:",
               "Datos del formulario de solicitud:"],
    "iban": ["Zahlungsinformationen zur Rechnung 2024-118:", "Payment details for the March invoice:"],
    "email": ["Forwarded message from the support inbox:", "Copied from the mailing list archive:"],
    "ipv4": ["Excerpt from the server logs this morning:", "From the firewall change request:"],
    "ipv6": ["Excerpt from the server logs this morning:", "From the network change request:"],
    "credit_card": ["Copied from the support chat transcript:", "From the failed payments report:"],
    "secret": ["Found in the repository history (config):", "Pasted into the team chat by mistake:"],
}


def _pad(template: str, lang: str, rng) -> str:
    """Short templates get a leading line so every text is at least 40 characters."""
    leads = {"en": "Updated contact details below.", "de": "Aktualisierte Kontaktdaten:",
             "fr": "Coordonnées mises à jour :", "es": "Datos de contacto actualizados:", "it": "Recapiti aggiornati:",
             "nl": "Bijgewerkte contactgegevens:", "pt": "Dados de contato atualizados:",
             "sv": "Uppdaterade kontaktuppgifter:",
             "pl": "Zaktualizowane dane kontaktowe:", "ja": "連絡先を更新しました。", "ko": "연락처가 변경되었습니다.",
             "zh": "联系方式已更新。", "ru": "Обновлённые контактные данные:"}
    return leads.get(lang, leads["en"]) + "\n" + template


COMBO_TEMPLATES = {  # several items in one text; at most one item that carries a country (phone, iban, us_ssn)
    "phone": ["⟦name⟧\n⟦e⟧\n⟦p⟧", "Name: ⟦name⟧ | E-mail: ⟦e⟧ | Phone: ⟦p⟧",
              "name,email,phone\n⟦name⟧,⟦e⟧,⟦p⟧", '{"name": "⟦name⟧", "email": "⟦e⟧", "phone": "⟦p⟧"}',
              "Bestellung 30117: Lieferung an ⟦name⟧, Tel. ⟦p⟧, Karte ⟦c⟧",
              "Lead: ⟦name⟧ <⟦e⟧>, tel ⟦p⟧ – wants a demo next week.",
              "2024-03-15 14:22:05 signup email=⟦e⟧ phone=⟦p⟧ ip=⟦ip⟧"],
    "iban": ["Refund to IBAN ⟦i⟧, confirmation sent to ⟦e⟧.", "Kontoinhaber: ⟦name⟧, ⟦e⟧, IBAN ⟦i⟧",
             '{"holder": "⟦name⟧", "email": "⟦e⟧", "iban": "⟦ic⟧"}'],
    "us_ssn": ["⟦name⟧, SSN ⟦s⟧, ⟦e⟧", "name,ssn,email\n⟦name⟧,⟦s⟧,⟦e⟧",
               '{"name": "⟦name⟧", "ssn": "⟦s⟧", "card": "⟦c⟧"}', "Applicant ⟦name⟧ (SSN ⟦s⟧) applied from ⟦ip⟧"],
    None: ["card=⟦c⟧ email=⟦e⟧ ip=⟦ip⟧ risk=0.82", "Card ⟦c⟧ was used from ⟦ip⟧ and ⟦ip6⟧ within 3 minutes.",
           '{"email": "⟦e⟧", "last_ip": "⟦ip⟧", "last_ip6": "⟦ip6⟧"}', "DB_HOST=⟦ip⟧\nDB_USER=app\nDB_PASSWORD=⟦v⟧",
           "user ⟦e⟧ created API key ⟦gh⟧ from ⟦ip6⟧", "Receipt for ⟦e⟧: paid with ⟦c⟧ on 2024-03-15"],
}
TARGET = 310  # labelled spans per type


def build(seed: int = SEED) -> list[dict]:
    b = Builder(seed)
    rng = b.rng
    counts: Counter = Counter()
    phone_i = iban_i = 0

    def fill(type_, country, template, fields, lang="en", kind="positive", nmk=None) -> bool:
        text, _ = compose(template, fields)
        if len(text) < 40:
            template = _pad(template, lang, rng) if type_ == "phone" else rng.choice(PADS[type_]) + "\n" + template
        if not b.add(kind, type_, country, nmk, template, fields):
            return False
        counts.update(s["type"] for s in b.records[-1]["spans"])
        return True

    def common():
        f = b.base_fields()
        f2 = b.person()
        network, num = make_card(rng)
        mm, yy = rng.randint(1, 12), rng.randint(25, 31)
        f.update(e=Pii("email", make_email(rng, f["first"], f["last"]) if rng.random() > 0.015
                       else rng.choice(UNICODE_EMAILS)),
                 e2=Pii("email", make_email(rng, *f2)), ip=Pii("ipv4", make_ipv4(rng)), ip2=Pii("ipv4", make_ipv4(rng)),
                 ipnet=Pii("ipv4", ".".join(make_ipv4(rng).split(".")[:3]) + ".0"),
                 ip6=Pii("ipv6", ipv6_written(rng, make_ipv6(rng))), c=Pii("credit_card", card_written(rng, num)),
                 exp=f"{mm:02d}/{yy}", mm=str(mm), yy=str(yy), network=network.capitalize(),
                 v=Pii("secret", strong_value(rng)), gh=Pii("secret", "ghp_" + R(rng, 36, ALNUM)))
        return f

    def phone_fields():
        nonlocal phone_i
        country = PHONE_COUNTRIES[phone_i % len(PHONE_COUNTRIES)]
        phone_i += 1
        text, e164 = PHONE_GEN[country](rng)
        f = common()
        f["city"] = rng.choice(CITIES[country])
        f.update(p=Pii("phone", text), pc=Pii("phone", e164))
        return country, f

    def iban_fields():
        nonlocal iban_i
        country = IBAN_COUNTRIES[iban_i % len(IBAN_COUNTRIES)]
        iban_i += 1
        iban = make_iban(rng, country)
        f = common()
        f.update(bic=make_bic(rng, country), i=Pii("iban", iban_written(rng, iban)), ic=Pii("iban", iban))
        return country, f

    def ssn_fields():
        f = common()
        f["city"] = rng.choice(CITIES["US"])
        a, g, s = make_ssn(rng)
        f["s"] = Pii("us_ssn", ("-" if rng.random() < 0.87 else " ").join((a, g, s)))
        return f

    # Texts with several items: contact records, sign-ups, payment and fraud logs.
    for _ in range(120):
        country, f = phone_fields()
        fill("phone", country, rng.choice(COMBO_TEMPLATES["phone"]), f, LANG[country])
    for _ in range(50):
        country, f = iban_fields()
        fill("iban", country, rng.choice(COMBO_TEMPLATES["iban"]), f, IBAN_LANG.get(country, "en"))
    for _ in range(60):
        fill("us_ssn", "US", rng.choice(COMBO_TEMPLATES["us_ssn"]), ssn_fields())
    for _ in range(110):
        t = rng.choice(COMBO_TEMPLATES[None])
        primary = "secret" if "⟦v⟧" in t or "⟦gh⟧" in t else "credit_card" if "⟦c⟧" in t else "email"
        fill(primary, None, t, common())
    # One item per text, until every type has TARGET labelled spans.
    while counts["phone"] < TARGET:
        country, f = phone_fields()
        lang = LANG[country]
        t = rng.choice(PHONE_TEMPLATES[lang]) if rng.random() < 0.65 else rng.choice(PHONE_GENERIC)
        fill("phone", country, t, f, lang)
    while counts["iban"] < TARGET:
        country, f = iban_fields()
        lang = IBAN_LANG.get(country, "en")
        t = (rng.choice(IBAN_TEMPLATES[lang] + (IBAN_TEMPLATES["en"] if lang != "en" else []))
             if rng.random() < 0.7 else rng.choice(IBAN_GENERIC))
        fill("iban", country, t, f, lang)
    while counts["us_ssn"] < TARGET:
        fill("us_ssn", "US", rng.choice(SSN_TEMPLATES), ssn_fields())
    while counts["email"] < TARGET:
        f = common()
        f["ip"] = f["ip"] if rng.random() < 0.5 else f["ip6"]
        fill("email", None, rng.choice(EMAIL_TEMPLATES), f)
    while counts["ipv4"] < TARGET:
        fill("ipv4", None, rng.choice(IPV4_TEMPLATES), common())
    while counts["ipv6"] < TARGET:
        f = common()
        if rng.random() < 0.15:
            pre = pick(rng, [(4, "::ffff:"), (1, "64:ff9b::"), (1, "::FFFF:")])
            f["ip6"] = Pii("ipv6", pre + make_ipv4(rng))
            t = rng.choice(IPV6_MAPPED_TEMPLATES + IPV6_TEMPLATES[:8])
        else:
            t = rng.choice(IPV6_TEMPLATES)
        fill("ipv6", None, t, f)
    while counts["credit_card"] < TARGET:
        fill("credit_card", None, rng.choice(CARD_TEMPLATES), common())
    while counts["secret"] < TARGET:
        f = common()
        _sub, t, fields = secret_items(rng, f["first"], f["last"])
        f.update(fields)
        fill("secret", None, t, f)
    for nmk, text in near_misses(rng):
        if len(text) < 40:
            text = rng.choice(NEUTRAL_LEADS) + "\n" + text
        b.add("near_miss", None, None, nmk, "⟦t⟧", {"t": text})
    return b.records


def stats(records: list[dict]) -> str:
    spans = Counter(s["type"] for r in records for s in r["spans"])
    lines = [f"{len(records)} texts, {sum(r['kind'] == 'positive' for r in records)} with PII, "
             f"{sum(r['kind'] == 'near_miss' for r in records)} near-misses"]
    lines.append("labelled spans per type: " + ", ".join(f"{t} {spans[t]}" for t in TYPES))
    for t in ("phone", "iban"):
        c = Counter(r["country"] for r in records if r["type"] == t)
        lines.append(f"{t} countries ({len(c)}): " + ", ".join(f"{k} {v}" for k, v in sorted(c.items())))
    lines.append("near-miss kinds: " + ", ".join(
        f"{k} {v}" for k, v in sorted(Counter(r["near_miss_kind"] for r in records if r["near_miss_kind"]).items())))
    return "\n".join(lines)


def write(records: list[dict], out: Path) -> None:
    with open(out, "w", encoding="utf-8", newline="\n") as f:
        for r in records:
            f.write(json.dumps(r, ensure_ascii=False, separators=(",", ":")) + "\n")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    ap.add_argument("--stats", action="store_true", help="print counts per type, country and near-miss kind")
    args = ap.parse_args(argv)
    records = build()
    write(records, args.out)
    if args.stats:
        print(stats(records))


if __name__ == "__main__":
    sys.exit(main())
