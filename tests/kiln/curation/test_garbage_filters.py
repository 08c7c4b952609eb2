"""The garbage step: what each rule drops (and the default profiles kept before it), the near-misses it must keep,
and properties: random soup of any length is dropped, clean prose never is, `batch` agrees with one call per document.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import random
import string
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.common.config import load_config
from kiln.common.stats import StageStats
from kiln.curation.documents import Document
from kiln.curation.filters import garbage as g
from kiln.curation.filters.base import Verdict
from kiln.curation.filters.garbage import Garbage
from kiln.curation.filters.registry import STEPS, build_step
from kiln.curation.pipeline import run_steps

CONFIG = load_config(Path(__file__).resolve().parents[3] / "configs" / "default.yaml")


def doc(text: str) -> Document:
    return Document(doc_id="d", source="test", text=text)


def garbage_for(profile: str) -> Garbage:
    """The garbage step as the default config's profile sets it up."""
    spec = next(s for s in CONFIG.profiles[profile] if s.step == "garbage")
    return build_step("garbage", spec.params)


def old_profile(profile: str) -> list:
    """The default profile's steps without the garbage step: what ran before it."""
    return [build_step(s.step, s.params) for s in CONFIG.profiles[profile] if s.step != "garbage"]


def kept_by(steps: list, text: str) -> bool:
    return run_steps([doc(text)], steps, StageStats(), 0) == [None]


def noise(seed: int, n: int) -> bytes:
    """Deterministic pseudo-random bytes."""
    out, block = b"", 0
    while len(out) < n:
        out += hashlib.sha256(f"{seed}/{block}".encode()).digest()
        block += 1
    return out[:n]


SENTENCES = [
    "The kiln was fired slowly overnight so that the thick walls of the large jars would not crack.",
    "Potters in the valley have traded their work at the autumn market for more than two hundred years.",
    "A careful firing log, kept with notes about the weather and the fuel, is often the difference between "
    "a cracked pot and a good one.",
    "Most of the clay comes from a single pit on the north side of the river, where the seam is thick and clean.",
    "Glaze recipes were written down only rarely, and many of them were lost when the old workshops closed.",
    "The museum keeps a small collection of the shards that were found when the foundations were dug.",
    "Students who visit the workshop in the spring learn to center the clay before they learn anything else.",
    "When the weather turns cold, the drying room is heated with the waste heat of the kiln next door.",
]
PROSE = "\n\n".join(" ".join(SENTENCES[i:i + 3]) for i in range(0, 8, 3))

# ---- each rule: kept by today's default profile, dropped now ---------------------------------------------------


def hex_dump_page() -> str:
    data = noise(1, 640)
    rows = []
    for off in range(0, len(data), 16):
        chunk = data[off:off + 16]
        hexes = " ".join(chunk[i:i + 2].hex() for i in range(0, 16, 2))
        rows.append(f"{off:08x}: {hexes}  {''.join(chr(b) if 32 <= b < 127 else '.' for b in chunk)}")
    return f"{SENTENCES[0]} {SENTENCES[1]}\n\n" + "\n".join(rows) + f"\n\n{SENTENCES[2]}"


def c_array_page() -> str:
    """A docs page that is mostly a table of bytes, after a paragraph of English."""
    data = noise(1, 512)
    rows = ",\n".join("  " + ", ".join(f"0x{b:02x}" for b in data[i:i + 12]) for i in range(0, len(data), 12))
    return f"{' '.join(SENTENCES[:5])}\n\nstatic const unsigned char glaze_table[] = {{\n{rows}\n}};\n\n{SENTENCES[5]}"


def uuencoded_file() -> str:
    data = noise(2, 900)
    lines = [binascii.b2a_uu(data[i:i + 45]).decode().rstrip("\n") for i in range(0, len(data), 45)]
    return "# firing schedule, packed\nbegin 644 schedule.bin\n" + "\n".join(lines) + "\n`\nend\n"


def minified_page() -> str:
    rng = random.Random(3)
    names = ["addEventListener", "querySelector", "prototype", "createElement", "appendChild", "setAttribute",
             "removeChild", "preventDefault", "classList", "innerHTML"]
    variables = ["element", "options", "handler", "target", "config", "window", "document", "callback"]
    parts = []
    while sum(map(len, parts)) < 2500:
        a, b, c = (rng.choice(variables) for _ in range(3))
        parts.append(rng.choice([
            f"function {a}({b},{c}){{return {b}.{rng.choice(names)}({c})||{{}}}}",
            f"var {a}={b}.{rng.choice(names)}?{c}:null;",
            f"for(var index=0;index<{b}.length;index++){{{c}.{rng.choice(names)}({b}[index])}}",
            f"if(!{a}){{{b}.{rng.choice(names)}={{{c}:!0,{rng.choice(names)}:void 0}}}}",
        ]))
    return " ".join(SENTENCES[:3]) + "\n\n" + ";".join(parts) + "\n\n" + SENTENCES[3]


def letter_soup(seed: int, chars: int, alphabet: str = string.ascii_lowercase, width: int = 64) -> str:
    rng = random.Random(seed)
    words, total = [], 0
    while total < chars:
        word = "".join(rng.choice(alphabet) for _ in range(rng.randint(2, 9)))
        words.append(word)
        total += len(word) + 1
    text = " ".join(words)
    return "\n".join(text[i:i + width] for i in range(0, len(text), width))


def navigation_page() -> str:
    menu = ["Home", "About Us", "Products", "Services", "Pricing", "Blog", "Careers", "Contact"]
    headlines = ["10 Best Ways to Glaze a Bowl", "How to Plan a Studio on a Budget", "The Ultimate Guide to Kilns",
                 "Why Everyone Is Talking About Raku", "Top 5 Clay Bodies for Beginners"]
    return "\n".join([
        "Skip to main content",
        " | ".join(menu),
        "Home > Workshop > Firing",
        *[f"* [{h}](https://pottery.example.com/{h.lower().replace(' ', '-')}/)" for h in headlines],
        "Related articles",
        *headlines,
        "Privacy Policy · Terms of Use · Cookie Policy",
        "© 2024 Clay Media Inc. All rights reserved.",
    ])


SOUP_ALPHABETS = {
    "letters": string.ascii_letters,
    "lower": string.ascii_lowercase,
    "alnum": string.ascii_letters + string.digits,
    "keyboard": "qwertyuiopasdfghjklzxcvbnm1234567890,./'",
    "symbols": string.ascii_letters + "!\"#$%&'()*+,-./:<=>?@[\\]^_`|~" * 2,
    "unicode": "".join(map(chr, [*range(0xA1, 0x17F), *range(0x391, 0x3C9), *range(0x410, 0x44F),
                                 *range(0x2190, 0x21FF), *range(0x2200, 0x22FF), *range(0x3041, 0x3096)])),
}


DROPS = [  # (profile a user would pick, rule, text)
    ("technical_docs", "encoded_blob", c_array_page()),
    ("code", "encoded_blob", uuencoded_file()),
    ("technical_docs", "minified_code", minified_page()),
    ("code", "char_soup", letter_soup(4, 3000)),
    ("technical_docs", "char_soup", " ".join(SENTENCES[:3]) + "\n\n" + letter_soup(4, 900, SOUP_ALPHABETS["alnum"])),
    ("technical_docs", "char_soup", f"{SENTENCES[3]}\n\n" + letter_soup(3, 300, SOUP_ALPHABETS["keyboard"])),
    ("technical_docs", "link_density", navigation_page()),
]


@pytest.mark.parametrize(("profile", "rule", "text"), DROPS, ids=[f"{p}-{r}" for p, r, _ in DROPS])
def test_each_rule_drops_what_the_default_profile_kept(profile, rule, text):
    assert kept_by(old_profile(profile), text)  # today: kept
    assert garbage_for(profile)(doc(text)).drop == f"garbage.{rule}"


# ---- near-misses: kept ------------------------------------------------------------------------------------------

PY_WITH_BRACES = '''"""Render the firing report as a small HTML page."""

from __future__ import annotations

import json

CSS = "body{margin:0;padding:0}h1{font-size:2em;color:#333}table{border-collapse:collapse;width:100%}"
SCRIPT = "function sort(t){var r=t.rows;for(var i=1;i<r.length;i++){r[i].hidden=false;}return r;}"


def page(title: str, rows: list[dict]) -> str:
    """One table row per reading; the style and script are inlined so the page is a single file."""
    body = "".join(f"<tr><td>{r['minute']}</td><td>{r['celsius']:.1f}</td></tr>" for r in rows)
    head = f"<style>{CSS}</style><script>{SCRIPT}</script>"
    return f"<html><head>{head}<title>{title}</title></head><body><table>{body}</table></body></html>"


def dump(rows: list[dict]) -> str:
    return json.dumps({"rows": rows, "units": {"time": "minute", "temperature": "celsius"}}, indent=2)
'''

JSON_CONFIG = json.dumps({
    "name": "kiln-controller", "version": "2.4.1", "homepage": "https://github.com/example/kiln-controller",
    "license": "MIT", "sha256": hashlib.sha256(b"kiln-controller-2.4.1").hexdigest(),
    "thermocouple": {"type": "K", "offset": -1.5, "pins": {"clock": 11, "select": 8, "data": 9}},
    "schedules": [{"name": f"cone {c}", "ramp": [[100, 120], [600, 150], [1000 + 20 * c, 60]], "hold": 10}
                  for c in range(6)],
    "alerts": {"email": "studio@example.com", "max_temperature": 1300, "retry": [5, 10, 30]},
}, indent=2)

README_LINK_TABLE = """# kiln-tools

Small tools for people who fire their own kilns: logging, schedules and a controller.
Each tool is a separate package; the table below links to their documentation and source.

| Package | What it does | Docs |
|---------|--------------|------|
""" + "\n".join(f"| [{n}](https://github.com/example/{n}) | {d} | [docs](https://{n}.readthedocs.io/) |" for n, d in [
    ("kiln-log", "records thermocouple readings to CSV"), ("kiln-plan", "builds firing schedules from cone targets"),
    ("kiln-ctl", "drives the relay board of an electric kiln"), ("kiln-web", "shows a live chart of the firing"),
    ("kiln-alerts", "sends a message when the temperature drifts"), ("kiln-sim", "simulates a kiln for testing"),
]) + """

## Installation

Install the packages you need with pip, for example `pip install kiln-log kiln-plan`, and run
`kiln-log --port /dev/ttyUSB0` to start recording. Every tool reads the same configuration file.

## Contributing

Bug reports and pull requests are welcome. Please run the test suite before sending a change, and describe
the kiln and controller you tested with, since the relay timings differ between models.
"""

SOURCE_WITH_HASH = '''"""Verify downloaded firmware images before flashing the controller."""

import base64
import hashlib

FIRMWARE_SHA256 = "9f2c4b7d1e8a3f6c5b0d2e9a7c4f1b8e6d3a0c5f2b9e7d4a1c8f5b2e9d6a3c0f"
SIGNING_KEY_ID = base64.b64decode("a2lsbi1maXJtd2FyZS1rZXk=")


def verify(path: str) -> bool:
    """True if the image at `path` has the published digest."""
    with open(path, "rb") as f:
        digest = hashlib.sha256(f.read()).hexdigest()
    return digest == FIRMWARE_SHA256
'''

MIT_LICENSE = """MIT License

Copyright (c) 2024 The Kiln Authors

Permission is hereby granted, free of charge, to any person obtaining a copy
of this software and associated documentation files (the "Software"), to deal
in the Software without restriction, including without limitation the rights
to use, copy, modify, merge, publish, distribute, sublicense, and/or sell
copies of the Software, and to permit persons to whom the Software is
furnished to do so, subject to the following conditions:

The above copyright notice and this permission notice shall be included in all
copies or substantial portions of the Software.

THE SOFTWARE IS PROVIDED "AS IS", WITHOUT WARRANTY OF ANY KIND, EXPRESS OR
IMPLIED, INCLUDING BUT NOT LIMITED TO THE WARRANTIES OF MERCHANTABILITY,
FITNESS FOR A PARTICULAR PURPOSE AND NONINFRINGEMENT. IN NO EVENT SHALL THE
AUTHORS OR COPYRIGHT HOLDERS BE LIABLE FOR ANY CLAIM, DAMAGES OR OTHER
LIABILITY, WHETHER IN AN ACTION OF CONTRACT, TORT OR OTHERWISE, ARISING FROM,
OUT OF OR IN CONNECTION WITH THE SOFTWARE OR THE USE OR OTHER DEALINGS IN THE
SOFTWARE.
"""

MAN_PAGE = """NAME
ls - list directory contents

SYNOPSIS
ls [OPTION]... [FILE]...

DESCRIPTION
List information about the FILEs (the current directory by default). Sort entries alphabetically if none of
-cftuvSUX nor --sort is specified.
Mandatory arguments to long options are mandatory for short options too.
-a, --all do not ignore entries starting with .
-A, --almost-all do not list implied . and ..
--author with -l, print the author of each file
-b, --escape print C-style escapes for nongraphic characters
--block-size=SIZE with -l, scale sizes by SIZE when printing them; e.g., '--block-size=M'
-B, --ignore-backups do not list implied entries ending with ~
-c with -lt: sort by, and show, ctime (time of last modification of file status information)
-C list entries by columns
--color[=WHEN] color the output WHEN; more info below
-d, --directory list directories themselves, not their contents
-h, --human-readable with -l and -s, print sizes like 1K 234M 2G etc.

AUTHOR
Written by Richard M. Stallman and David MacKenzie.
"""

C_HEADER = """/* Dictionary object interface */
#ifndef Py_DICTOBJECT_H
#define Py_DICTOBJECT_H
#ifdef __cplusplus
extern "C" {
#endif

PyAPI_DATA(PyTypeObject) PyDict_Type;

#define PyDict_Check(op) \\
                 PyType_FastSubclass(Py_TYPE(op), Py_TPFLAGS_DICT_SUBCLASS)
#define PyDict_CheckExact(op) Py_IS_TYPE(op, &PyDict_Type)

PyAPI_FUNC(PyObject *) PyDict_New(void);
PyAPI_FUNC(PyObject *) PyDict_GetItem(PyObject *mp, PyObject *key);
PyAPI_FUNC(PyObject *) PyDict_GetItemWithError(PyObject *mp, PyObject *key);
PyAPI_FUNC(int) PyDict_SetItem(PyObject *mp, PyObject *key, PyObject *item);
PyAPI_FUNC(int) PyDict_DelItem(PyObject *mp, PyObject *key);
PyAPI_FUNC(void) PyDict_Clear(PyObject *mp);
PyAPI_FUNC(int) PyDict_Next(PyObject *mp, Py_ssize_t *pos, PyObject **key, PyObject **value);
PyAPI_FUNC(PyObject *) PyDict_Keys(PyObject *mp);
PyAPI_FUNC(PyObject *) PyDict_Values(PyObject *mp);
PyAPI_FUNC(PyObject *) PyDict_Items(PyObject *mp);
PyAPI_FUNC(Py_ssize_t) PyDict_Size(PyObject *mp);
PyAPI_FUNC(PyObject *) PyDict_Copy(PyObject *mp);
PyAPI_FUNC(int) PyDict_Contains(PyObject *mp, PyObject *key);

#ifdef __cplusplus
}
#endif
#endif /* !Py_DICTOBJECT_H */
"""

KEEPS = [  # (profile, what, text)
    ("code", "python with ;{} in strings", PY_WITH_BRACES),
    ("technical_docs", "python with ;{} in strings", PY_WITH_BRACES),
    ("code", "json config", JSON_CONFIG),
    ("technical_docs", "json config", JSON_CONFIG),
    ("technical_docs", "readme with a table of links", README_LINK_TABLE),
    ("prose", "readme with a table of links", README_LINK_TABLE),
    ("code", "source with a sha256 and a short base64 literal", SOURCE_WITH_HASH),
    ("legal", "license text", MIT_LICENSE),
    ("technical_docs", "license text", MIT_LICENSE),
    ("technical_docs", "man page excerpt", MAN_PAGE),
    ("code", "C header full of CamelCase macros", C_HEADER),
    ("prose", "prose", PROSE),
    ("technical_docs", "empty", ""),
]


@pytest.mark.parametrize(("profile", "what", "text"), KEEPS, ids=[f"{p}-{w}" for p, w, _ in KEEPS])
def test_near_misses_are_kept(profile, what, text):
    verdict = garbage_for(profile)(doc(text))
    assert verdict.kept and verdict.text == text


def test_step_contract_and_rules_off():
    assert STEPS["garbage"] is Garbage
    off = Garbage(max_encoded_fraction=None, max_minified_fraction=None, max_soup_fraction=None,
                  max_boilerplate_fraction=None)
    for _, _, text in DROPS:
        assert off(doc(text)).kept
    for profile, rule, text in DROPS:  # each rule off on its own
        step = garbage_for(profile)
        setattr(step, {"encoded_blob": "max_encoded_fraction", "minified_code": "max_minified_fraction",
                       "char_soup": "max_soup_fraction", "link_density": "max_boilerplate_fraction"}[rule], None)
        assert step(doc(text)).drop != f"garbage.{rule}"


def test_rule_measures():
    assert g.encoded_fraction(SOURCE_WITH_HASH) < 0.2
    assert g.encoded_fraction(hex_dump_page()) > 0.5
    assert g.encoded_fraction("2001, 2002, 2003, 2004, 2005, 2006, 2007, 2008, 2009, 2010, 2011") == 0  # numbers
    assert g.encoded_fraction("https://github.com/example/kiln-controller/blob/main/docs/firing/schedules") == 0
    assert g.minified_fraction(PY_WITH_BRACES) == 0 and g.minified_fraction(minified_page()) > 0.5
    assert g.soup_fraction(PROSE) == 0 and g.soup_fraction(letter_soup(6, 800)) > 0.9
    share, lines = g.boilerplate_fraction(navigation_page())
    assert share > 0.8 and lines >= 10
    assert g.boilerplate_fraction(README_LINK_TABLE)[0] < 0.2
    badge = "[![PyPI](https://img.shields.io/pypi/v/kiln.svg)](https://pypi.org/p/kiln)"
    assert g.classify_line(badge) == ("neutral", 0)
    assert g.classify_line("See [the docs](https://kiln.example.com/) for the schedule format.")[0] == "content"
    assert g.classify_line("Home | About | Contact | Blog")[0] == "boilerplate"


# The soup rule's script changes follow Unicode's Scripts.txt: a letter next to a letter of the same script is none,
# wherever a 128-code-point block boundary falls inside that script (Ethiopic U+1200-139F and U+2D80-2DDF, the
# Arabic letters of Persian and Urdu past U+067F, Armenian past U+057F). Each line here, written by hand, changes
# class only where a capital meets lower case or a letter meets its punctuation.
SCRIPT_LINES = {
    # a change at each ። after a letter
    "am": ("ኢትዮጵያ በአፍሪካ ቀንድ የምትገኝ ሀገር ናት። ዋና ከተማዋ አዲስ አበባ ሲሆን ብዙ ሚሊዮን ሰዎች ይኖሩባታል። አማርኛ የሀገሪቱ የሥራ ቋንቋ ነው።", 3),
    # Հ, Ե, Ա before lower case; the comma and two ։ after letters
    "hy": ("Հայաստանի մայրաքաղաքը Երևանն է, որը աշխարհի ամենահին քաղաքներից մեկն է։ Այստեղ ապրում է ավելի քան մեկ "
           "միլիոն մարդ։", 6),
    # the two ۔ after letters
    "ur": ("پاکستان کی قومی زبان اردو ہے اور یہ ملک کے تمام صوبوں میں بولی اور سمجھی جاتی ہے۔ لاہور اور کراچی بڑے شہر ہیں "
           "جہاں لاکھوں لوگ رہتے ہیں۔", 2),
    "ethiopic extended": ("ሀⶀ" * 15, 0),
    "ethiopic then arabic": ("ሀب" * 15, 29),  # two scripts: every pair
}


@pytest.mark.parametrize("name", sorted(SCRIPT_LINES))
def test_soup_script_changes_are_between_scripts(name):
    text, changes = SCRIPT_LINES[name]
    assert g.soup_lines(text)[1].tolist() == [changes]


def test_an_amharic_article_with_a_checklist_is_kept():
    """An Amharic article with a short checklist (a check mark after each item) was dropped as char_soup: every
    Ethiopic letter at or past U+1280 was another "script" than those before it. The English one never was."""
    am = "ኢትዮጵያ በአፍሪካ ቀንድ የምትገኝ ሀገር ናት። ዋና ከተማዋ አዲስ አበባ ሲሆን ብዙ ሚሊዮን ሰዎች ይኖሩባታል። አማርኛ የሀገሪቱ የሥራ ቋንቋ ነው።\n"
    en = ("Ethiopia is a country in the Horn of Africa. Its capital is Addis Ababa, home to several million people. "
          "Amharic is the working language.\n")
    for body, item in ((am, "ቡና✔ ሻይ✔ ውሃ✔ ዳቦ✔\n"), (en, "coffee✔ tea✔ water✔ bread✔\n")):
        assert Garbage().batch([doc(body * 80 + item * 60)])[0].drop is None
    assert g.soup_fraction("ሀب" * 15) == 1.0  # two scripts letter by letter are still soup


def test_windows_cover_every_stretch_of_a_rules_share():
    assert g.windows("short") == ["short"]
    text = "".join(chr(65 + i % 26) for i in range(100_000))
    pieces = g.windows(text)
    assert all(len(p) == g.WINDOW for p in pieces) and pieces[-1] == text[-g.WINDOW:]
    step = int(g.RULE_SHARE * len(text)) - g.WINDOW
    starts = [*range(0, len(text) - g.WINDOW, step), len(text) - g.WINDOW]
    for a in range(0, len(text) - int(g.RULE_SHARE * len(text)), 997):  # any stretch of RULE_SHARE holds a window
        b = a + int(g.RULE_SHARE * len(text))
        assert any(a <= s and s + g.WINDOW <= b for s in starts)


# ---- properties -------------------------------------------------------------------------------------------------

@st.composite
def soups(draw, min_chars: int = 200):
    alphabet = SOUP_ALPHABETS[draw(st.sampled_from(sorted(SOUP_ALPHABETS)))]
    seed = draw(st.integers(0, 2**32 - 1))
    chars = draw(st.integers(min_chars, 6000))
    width = draw(st.sampled_from([0, 40, 72, 120]))
    text = letter_soup(seed, chars, alphabet, width=width or 10**9)
    if draw(st.booleans()):  # a sentence before it, never longer than the soup
        text = f"{random.Random(seed).choice(SENTENCES)}\n\n{text}"
    return text


@settings(max_examples=150, deadline=None, derandomize=True)
@given(soups(), st.sampled_from(["prose", "technical_docs", "legal", "code"]))
def test_char_soup_of_any_length_is_dropped(text, profile):
    assert garbage_for(profile)(doc(text)).drop == "garbage.char_soup"


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.integers(0, 2**32 - 1), st.integers(300, 8000), st.sampled_from(["base64", "hex", "uu"]),
       st.sampled_from(["prose", "technical_docs", "legal", "code"]))
def test_encoded_payloads_are_dropped(seed, size, encoding, profile):
    data = noise(seed, size)
    if encoding == "base64":
        payload = base64.encodebytes(data).decode()
    elif encoding == "hex":
        payload = "\n".join(data[i:i + 32].hex(" ") for i in range(0, size, 32))
    else:
        payload = "\n".join(binascii.b2a_uu(data[i:i + 45]).decode().rstrip("\n") for i in range(0, size, 45))
    text = f"{SENTENCES[seed % len(SENTENCES)]}\n\n{payload}"
    assert garbage_for(profile)(doc(text)).drop == "garbage.encoded_blob"


@settings(max_examples=150, deadline=None, derandomize=True)
@given(st.lists(st.sampled_from(SENTENCES), min_size=1, max_size=24), st.sampled_from([" ", "\n", "\n\n"]),
       st.sampled_from(["prose", "technical_docs", "legal", "code"]))
def test_clean_prose_is_never_dropped(sentences, joiner, profile):
    assert garbage_for(profile)(doc(joiner.join(sentences))).kept


PIECES = [PROSE, PY_WITH_BRACES, JSON_CONFIG, README_LINK_TABLE, MAN_PAGE, hex_dump_page(), minified_page(),
          navigation_page(), letter_soup(7, 600), "x\ud800y soup \ufffd\ufffd", ""]


@settings(max_examples=60, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.sampled_from(range(len(PIECES))), min_size=1, max_size=3), min_size=1, max_size=8),
       st.sampled_from(["prose", "technical_docs", "legal", "code"]))
def test_batch_gives_the_verdicts_of_one_call_per_document(mixes, profile):
    step = garbage_for(profile)
    texts = ["\n".join(PIECES[i] for i in mix) for mix in mixes]
    batch = step.batch([doc(t) for t in texts])
    assert batch == [step(doc(t)) for t in texts]
    assert all(isinstance(v, Verdict) and v.text == t for v, t in zip(batch, texts))


LINE_TOKENS = [*"aZ9 .:-|*#>[]()/_`=©\t", "https://x.io", "www.", "](", " | ", " :: ", "  ", "reserved", "é", "Home",
               "the kiln", "Firing Schedule"]
line_text = st.lists(st.sampled_from(LINE_TOKENS), max_size=40).map(lambda parts: "".join(parts) * 3)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(line_text)
def test_the_fast_path_classifies_lines_as_the_rules_do(line):
    """Long plain lines skip the rules: they must come out exactly as the rules would have them."""
    assert g.classify_line(line) == g._classify(line.strip(), 0.5)
