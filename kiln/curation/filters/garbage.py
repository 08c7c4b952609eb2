"""Garbage: documents that are mostly encoded payloads, minified code, character soup or navigation boilerplate.

One step, six rules (reasons `garbage.<rule>`), each off when its threshold is None, checked in this order (the
last two, for web pages, are off unless a profile sets them: the `web` profile does):

- `encoded_blob`: base64 runs (40+ characters of the base64 alphabet with an upper- and a lower-case letter and a
  digit, and not a URL path), hex (32+ hex digits in a row; 9+ byte groups as dumps, C arrays and `\\x` escapes
  print them, a quarter of the groups with a letter a-f), `\\u` escape runs and uuencode lines: StarCoder2's
  encoded-data filter for code (Lozhkov et al. 2024, arXiv:2402.19173: base64 / hex / unicode-escape matches over
  half a file, or one over 1024 characters). Drop when they cover `max_encoded_fraction` of the non-space
  characters: 0.3 is measured (bench/filter_eval.py: clean documents reach 0.21, a hash or a short base64 literal in
  a source file a few %; the garbage it must catch is at least half payload).
- `minified_code`: lines of `minified_line_chars` (200) characters or more with `;{}` at least 2% of them
  (RedPajama-V2's `rps_doc_curly_bracket` signal, C4's `{` rule made a density) and spaces at most 12% (minified
  JavaScript has ~4%, prose ~16%). Drop when such lines hold `max_minified_fraction` (0.3) of the characters. Code
  does not have them (BigCode drops files with a line over 1000 characters, `code_quality` here).
- `char_soup`: lines (20+ non-space characters) whose character classes change at `soup_class_changes` (40%) of
  adjacent non-space characters (lower, upper, digit, other letter, symbol, other; between letters, a change of
  script, as Unicode's Scripts.txt assigns them, with Han, kana and Hangul one: the character-class entropy random
  text maximizes and words keep low), whose symbols differ from the one
  before at `soup_symbol_changes` (40%) of the characters (symbol soup; rules and table borders repeat one symbol), or
  whose letter pairs are `soup_rare_pairs` (25%) "rare" (a dictionary of letter pairs: the 294 pairs seen less than
  once in 50,000 in English reference text, the pydoc topics of Python 3.11 and /usr/share/common-licenses; English
  has ~1% of them, code identifiers under 25%, random letters 43%; a pair ends in a lower-case letter). A short
  line with few pairs is soup with a quarter of them rare and 30% class changes. Drop when such lines hold
  `max_soup_fraction` (0.3) of the non-space characters. (Gopher's 80%-of-words-with-a-letter and symbol-to-word
  rules, and code_quality's alphanumeric fraction, catch only some soup.)
- `link_density`: lines classified as jusText classifies blocks (Pomikálek 2011, whose link-density limit is 0.2
  per paragraph; `link_density` 0.5 per line here, as a Markdown line carries its URL): boilerplate when more than
  half of its words are link text or URLs, when it is a menu (3+ items between separators, short or title-like, each
  starting with a capital or a letter of a script without case), or
  when it is short (under jusText's 70 characters), has no code characters, no terminal punctuation and is at most
  three words or title-like (FineWeb's short-line rule, Penedo et al. 2024, counts lines of 30 characters or less).
  Headings, badges and directives count for neither side. Drop when boilerplate lines hold
  `max_boilerplate_fraction` (0.5) of the words and there are at least three of them. Words are `weighed_words`: a
  character of Chinese or Japanese 5/8 of a word, a Thai letter 1/4, as Gopher's and C4's (text_units), a URL one.
- `repeated_lines`: pages of a few lines repeated many times (comment threads, listings, log spam, a box repeated
  down the page), with counters, dates or names changing between repeats: Gopher's duplicate-line rules (Rae et al.
  2021) on lines compared by `line_key` (lower case, a token with a digit or a month or weekday name as "0"),
  where a line of 3-16 tokens also repeats an earlier one that differs from it in one token in the same place (a
  template's slot). Drop when repeated lines hold `max_repeated_line_fraction` of the non-space characters (web:
  0.7: on bench/filter_eval.py's dev half 0.4% of clean technical pages reach it, index pages all).
- `stub`: pages with little text besides boilerplate: error pages, login / cookie / bot-check / age walls, parked
  domains, "enable JavaScript", a title and a line. Drop when the words outside boilerplate lines (`line_kinds`; C4's
  notice lines, a mention of JavaScript, cookies or a policy, left out) are fewer than `min_content_words` (web: 30;
  Gopher's whole-page minimum is 50 words, which drops short API pages).

Speed: `batch` screens the documents (the whole text when short; else 1,000-character windows spaced so that any
stretch of 30% of the text, the least any rule needs, holds one) with a few vectorized passes, and runs the Python /
numpy checks only on those a screen passes: an encoded run (RE2, pyarrow.compute); a line with six of `;{}` (RE2);
`soup_screen` soup signs per UTF-8 byte (every byte pair of the batch looked up in one numpy table: rare letter or
symbol pairs, odd non-ASCII neighbours); `boilerplate_screen` title-like lines, links and menu separators per line
(RE2). The screens are part of the rules (a document they do not pass is never dropped by that rule), and `__call__`
is `batch` on one document, so both give the same verdicts.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Annotated, ClassVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from annotated_types import Interval
from pydantic import NonNegativeFloat, NonNegativeInt, PositiveInt

from kiln.common.text_units import count_words, plain, weighed_count, whitespace_words
from kiln.curation.documents import Document
from kiln.curation.filters.base import Fraction, Verdict, drop, keep
from kiln.curation.filters.c4 import POLICY_SUBSTRINGS
from kiln.curation.filters.text_stats import TERMINAL_PUNCTUATION

# ---- encoded_blob -----------------------------------------------------------------------------------------------

# ASCII-only classes (no \b \w \s), so Python's `re` and RE2 read them the same way. No pattern crosses a line.
_HEX_GROUP = r"(?:0[xX]|\\x)?[0-9a-fA-F]{2,8}"
ENCODED_PATTERN = (
    r"[A-Za-z0-9+/]{40,}={0,2}"  # base64 (MIME and PEM lines, data: URIs, literals)
    r"|(?:0[xX])?[0-9a-fA-F]{32,}"  # hex strings and digests
    rf"|(?:{_HEX_GROUP}[ \t,:]{{1,3}}){{8,}}{_HEX_GROUP}"  # hex bytes: dumps, C arrays, colon-separated
    r"|(?:\\x[0-9a-fA-F]{2}){8,}|(?:\\u[0-9a-fA-F]{4}){8,}"  # escapes
    r"|(?m:^M[ -`]{60}$)"  # uuencode: a full 45-byte line
)
ENCODED_RE = re.compile(ENCODED_PATTERN)
# The screens: what a payload that can reach the threshold has in some window of the document: a base64 stretch
# without a slash (URL paths have one every few characters), hex groups, escapes or a uuencode line, in which Python
# then finds a run `_is_payload` accepts (long identifiers, spelled-out numbers and year lists are not).
BASE64_SCREEN = r"[A-Za-z0-9+]{32}"
ENCODED_SCREEN = (rf"(?:{_HEX_GROUP}[ \t,:]{{1,3}}){{8}}"
                  r"|(?:\\[xu][0-9a-fA-F]{2}){8}"
                  r"|(?m:^M[ -`]{60}$)")
_ENCODED_SCREEN_RE = re.compile(ENCODED_SCREEN)
_BASE64_RUN = re.compile(r"(?<![A-Za-z0-9+/])[A-Za-z0-9+/]{32,}")
_HEX_DIGITS = re.compile(r"[0-9a-fA-F]{2,8}")
_NOT_HEX = re.compile(r"0[xX]|\\x|[ \t,:]")


def _is_payload(run: str) -> bool:
    """A match that is an encoded payload, not a word, a number list, a URL path or an upper-case line."""
    if len(run) == 61 and run[0] == "M" and not run.isalnum():  # uuencode: most characters are not letters
        return sum(c.isalpha() for c in run) <= 0.6 * len(run)
    bare = _NOT_HEX.sub("", run)
    if all(c in "0123456789abcdefABCDEF" for c in bare):  # hex: digits, and letters in a quarter of the groups
        groups = _HEX_DIGITS.findall(run)
        return any(c.isdigit() for c in bare) and sum(not g.isdigit() for g in groups) >= 0.25 * len(groups)
    return (run.count("/") <= len(run) // 16 and any(c.isdigit() for c in run)
            and any(c.isupper() for c in run) and any(c.islower() for c in run))


def _payload_chars(text: str) -> int:
    return sum(len(m.group()) - m.group().count(" ") - m.group().count("\t")
               for m in ENCODED_RE.finditer(text) if _is_payload(m.group()))


def _non_space(text: str) -> int:
    return len(text) - text.count(" ") - text.count("\n") - text.count("\t") - text.count("\r")


def encoded_fraction(text: str) -> float:
    """Share of the non-space characters in encoded payload runs."""
    return _payload_chars(text) / max(_non_space(text), 1)


def _encoded_fractions(texts: list[str], at_least: float) -> list[float]:
    """`encoded_fraction` of each text where it may reach `at_least`, else 0. The runs RE2 finds in a whole text,
    payload or not, bound its share from above (one pass for all texts); only texts over the bound are split into
    lines for Python's regex, which runs only on the lines RE2 finds a run in."""
    out = [0.0] * len(texts)
    if not texts:
        return out
    array = _arrow(texts)
    bound = pc.subtract(pc.utf8_length(array), pc.utf8_length(pc.replace_substring_regex(array, ENCODED_PATTERN, "")))
    maybe = [i for i, (b, t) in enumerate(zip(bound.to_pylist(), texts)) if b >= at_least * max(_non_space(t), 1)]
    lines, owner = [], []
    for i in maybe:
        split = texts[i].split("\n")
        lines += split
        owner += [i] * len(split)
    covered = [0] * len(texts)
    if lines:
        for j in np.flatnonzero(pc.match_substring_regex(_arrow(lines), ENCODED_PATTERN)).tolist():
            covered[owner[j]] += _payload_chars(lines[j])
    for i in maybe:
        out[i] = covered[i] / max(_non_space(texts[i]), 1)
    return out


# ---- minified_code ----------------------------------------------------------------------------------------------

# The screen: six of ;{} on one line.
MINIFIED_SCREEN = r"[;{}]" + r"[^\n;{}]*[;{}]" * 5


def minified_fraction(text: str, line_chars: int = 200, min_punct: float = 0.02, max_spaces: float = 0.12) -> float:
    """Share of the characters in minified lines (long, dense in ;{}, few spaces)."""
    minified = 0
    for line in text.split("\n"):
        n = len(line)
        if n >= line_chars and line.count(" ") <= max_spaces * n and \
                line.count(";") + line.count("{") + line.count("}") >= min_punct * n:
            minified += n
    return minified / max(len(text), 1)


# ---- char_soup --------------------------------------------------------------------------------------------------

# Lower-case letter pairs seen less than once in 50,000 letter pairs of English reference text (the pydoc topics of
# Python 3.11 and /usr/share/common-licenses, 434,219 pairs): random letters land on one 43% of the time.
RARE_LETTER_PAIRS = frozenset("""
aa ah ao bb bf bg bh bk bn bq bv bw bx bz cb cd cf cg cj cn cv cw cx cz df dh dk dm dn dp dq dx dz ej ek ez fb fc fd fg
fh fj fk fm fn fq fs fv fw fx fz gb gd gf gj gk gq gv gw gx gy gz hb hc hd hf hg hh hj hk hp hq hv hw hx hz ih ij iw iy
jb jc jd jf jg jh ji jj jk jl jm jn jp jq jr js jt jv jw jx jy jz kb kc kd kf kh kj kk km ko kq kt kv kx ky kz lb lh lj
lk lm ln lq lx lz md mf mg mh mj mk mq mw mx mz nj nq nw nx nz oj oq pb pc pf pg pj pk pq pv pw px pz qa qb qc qd qe qf
qg qh qi qj qk ql qm qn qo qp qq qr qs qt qv qw qx qy qz rh rj rq rx rz sb sg sj sr sv sx sz tg tj tk tq tv tx tz uh uj
uk uq uu uv uw ux uy uz vb vc vd vf vg vh vj vk vl vn vp vq vr vs vt vu vv vw vx vy vz wb wc wd wf wg wj wk wm wp wq wt
wu wv wx wy wz xb xd xf xg xj xk xl xm xn xq xr xu xv xw xz yd yf yg yh yj yk yq yu yv yx yy zb zc zd zf zg zh zj zk zl
zm zn zo zp zq zr zs zt zu zv zw zx zy zz""".split())
# Adjacent ASCII symbol pairs seen at least once in 5,000 such pairs of reference text (the same pydoc topics and
# licenses, 400 files of CPython's test suite and 43 Markdown files of pyenv and Rust's documentation on the machine
# it was measured on: 422,107 pairs). The soup screen counts the other pairs: it only picks what the rule measures.
COMMON_SYMBOL_PAIRS = frozenset((
    '!" !\' != !` "" "% "\' "( ") "* "+ ", "- ". "/ ": "; "< "= "> "@ "[ "\\ "] '
    '"_ "{ "} ## #[ %( &# \'" \'# \'% \'& \'\' \'( \') \'* \'+ \', \'- \'. \'/ \': \'< \'= \'> '
    '\'? \'@ \'[ \'\\ \'] \'^ \'_ \'{ \'| \'} (" (# (\' (( () (* (- (. (? ([ (\\ (_ ({ )" '
    ')\' )( )) )* ), ). ): ); )[ )\\ )] )` )} *" *\' *( *) ** *, *- *. *= *{ +" '
    '+\' ++ +- += ," ,\' ,) -" -\' -+ -- -= -> ." .\' .) .* ., .. ./ .\\ .] ._ /" '
    '/\' /) /. // :" :% :\' :- :/ :: := :\\ :] :{ ;" ;\' ;< </ << <= <[ =" =% =\' '
    '=( =- == =? =[ =\\ =_ ={ >" >\' >, >: >< >= >> >` ?" ?\' ?= [" [\' [( [- [: '
    '[[ [\\ [] [` \\" \\\' \\( \\) \\\\ ]" ]\' ]( ]) ]* ]+ ], ]. ]: ]> ][ ]] ]` ]} _" '
    '_\' _( _) _, _. _[ __ `# `) `, `- `. `< `] `` `{ {! {" {\' {} }" }\' }) }, '
    '}. }: }` }} ~~'
).split())
_ASCII_SYMBOLS = [chr(c) for c in range(33, 127) if not chr(c).isalnum()]
_RARE_SYMBOL_PAIRS = [a + b for a in _ASCII_SYMBOLS for b in _ASCII_SYMBOLS
                      if a != b and "`" not in a + b and "_" not in a + b and a + b not in COMMON_SYMBOL_PAIRS]


@functools.cache
def _sign_pairs() -> np.ndarray:
    """The soup screen's signs, as a table of UTF-8 byte pairs (second byte << 8 | first): rare letter pairs in any
    case; pairs of different symbols not in COMMON_SYMBOL_PAIRS (backtick and underscore pairs are markup and
    identifiers); a non-ASCII character followed by a Latin-1 / Latin Extended one (mojibake, binary read as Latin-1)
    or by one from U+2000-U+2FFF (punctuation, arrows, math, technical, box, geometric symbols); U+FFFD."""
    table = np.zeros(1 << 16, dtype=bool)
    def mark(first: int, second: int) -> None:
        table[second << 8 | first] = True  # as a little-endian uint16 reads the two bytes

    for pair in RARE_LETTER_PAIRS:
        for a in (pair[0], pair[0].upper()):
            for b in (pair[1], pair[1].upper()):
                mark(ord(a), ord(b))
    for pair in _RARE_SYMBOL_PAIRS:
        mark(ord(pair[0]), ord(pair[1]))
    for continuation in range(0x80, 0xC0):
        for lead in (*range(0xC2, 0xCA), 0xE2):
            mark(continuation, lead)
    mark(0xBF, 0xBD)  # U+FFFD is EF BF BD
    return table


_BOX = re.compile("[\u2500-\u259f]")  # box drawing and blocks: table borders, not soup


def soup_signs(texts: list[str]) -> np.ndarray:
    """Soup signs per UTF-8 byte of each text (the screen): every byte pair looked up in `_sign_pairs` at once (box
    drawing read as spaces)."""
    raw = [(t if t.isascii() else _BOX.sub(" ", t)).encode("utf-8", "surrogatepass") for t in texts]
    sizes = np.array([len(r) for r in raw], dtype=np.int64)
    data = b"\n".join(raw)  # a newline is in no sign: no pair crosses two texts
    starts = np.r_[0, np.cumsum(sizes + 1)]
    signs = np.zeros(len(texts), dtype=np.int64)
    for offset in (0, 1):  # the pairs at even and at odd offsets, each as one little-endian uint16 array
        view = data[offset:]
        pairs = np.frombuffer(view[: len(view) - len(view) % 2], dtype="<u2")
        signs += np.diff(np.searchsorted(np.flatnonzero(_sign_pairs()[pairs]) * 2 + offset, starts))
    return signs / np.maximum(sizes, 1)


_SPACE, _LOWER, _UPPER, _DIGIT, _LETTER, _SYMBOL, _OTHER = range(7)
# Scripts whose letters mix within the words of real text: one "script" for the soup rule's script changes.
_ONE_SCRIPT = {"Hira": "Hani", "Kana": "Hani", "Hang": "Hani", "Bopo": "Hani"}  # CJK, kana, Hangul
_NO_SCRIPT = ("Zyyy", "Zinh", "Zzzz")  # Common, Inherited, unassigned: the script of the letters around them


@functools.cache
def _script_table() -> tuple[np.ndarray, np.ndarray]:
    """(first code point of each range, its script's number) from Unicode's Scripts.txt (fontTools' copy), Latin
    numbered 0, -1 for Common and Inherited (digits, punctuation, combining marks, the Katakana-Hiragana prolonged
    sound mark, zero-width joiners) and unassigned code points."""
    from fontTools.unicodedata import Scripts

    names = ["Latn", *sorted({_ONE_SCRIPT.get(v, v) for v in Scripts.VALUES} - {"Latn", *_NO_SCRIPT})]
    number = {name: i for i, name in enumerate(names)} | dict.fromkeys(_NO_SCRIPT, -1)
    return (np.array(Scripts.RANGES, dtype=np.int64),
            np.array([number[_ONE_SCRIPT.get(v, v)] for v in Scripts.VALUES], dtype=np.int64))


@functools.lru_cache(maxsize=1 << 16)
def _class_of(ch: str) -> int:
    """A character's class for the soup rule; `_` counts as a space (snake_case is words, not a class change)."""
    cat = unicodedata.category(ch)
    return (_SPACE if ch.isspace() or ch == "_" else _LOWER if cat == "Ll" else _UPPER if cat in ("Lu", "Lt")
            else _DIGIT if cat[0] == "N" else _LETTER if cat[0] in "LM" else _SYMBOL if cat[0] in "PS" else _OTHER)


def _classes_and_scripts(codes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Class and script of each code point of a non-ASCII text: ASCII ones from the table, the others looked up once
    per distinct character."""
    ascii_classes = np.frombuffer(_ascii_tables()[0], dtype=np.uint8)
    classes = ascii_classes[np.minimum(codes, 255)]
    scripts = np.zeros(len(codes), dtype=np.int64)  # Latin
    wide = np.flatnonzero(codes >= 128)
    distinct, index = np.unique(codes[wide], return_inverse=True)
    classes[wide] = np.array([_class_of(chr(c)) for c in distinct.tolist()], dtype=np.uint8)[index]
    starts, numbers = _script_table()
    scripts[wide] = numbers[np.searchsorted(starts, distinct, side="right") - 1][index]
    return classes, scripts


@functools.cache
def _rare_pairs() -> np.ndarray:
    """RARE_LETTER_PAIRS as a table indexed by 32 * first + second (letters numbered 1-26)."""
    rare = np.zeros(32 * 32, dtype=bool)
    for pair in RARE_LETTER_PAIRS:
        rare[(ord(pair[0]) - 96) * 32 + ord(pair[1]) - 96] = True
    return rare


@functools.cache
def _ascii_tables() -> tuple[bytes, bytes]:
    """bytes.translate tables for ASCII text: each byte's class, and each ASCII letter's number (1-26, else 0)."""
    return (bytes(_class_of(chr(c)) for c in range(128)) + bytes(128),
            bytes(c - 96 if 97 <= c <= 122 else c - 64 if 65 <= c <= 90 else 0 for c in range(256)))


def soup_lines(text: str) -> np.ndarray:
    """Per line: [non-space characters, class changes, symbol changes, rare letter pairs, letter pairs]. Letter pairs
    are of ASCII letters, the second lower-case (upper then upper is an acronym, lower then upper a camelCase joint)."""
    rare = _rare_pairs()
    if text.isascii():  # bytes translated in C; every letter is Latin, so no script changes
        raw = text.encode("ascii")
        class_table, letter_table = _ascii_tables()
        codes = np.frombuffer(raw, dtype=np.uint8)
        cls = np.frombuffer(raw.translate(class_table), dtype=np.uint8)
        low = np.frombuffer(raw.translate(letter_table), dtype=np.uint8).astype(np.uint16)
        script = None
    else:
        codes = np.frombuffer(text.encode("utf-32-le", errors="surrogatepass"), dtype=np.uint32)
        cls, script = _classes_and_scripts(codes)
        low = np.where((codes >= 97) & (codes <= 122), codes - 96,
                       np.where((codes >= 65) & (codes <= 90), codes - 64, 0)).astype(np.uint16)
    if len(codes) == 0:
        return np.zeros((5, 0), dtype=np.int64)
    solid = cls != _SPACE
    changed = cls[1:] != cls[:-1]  # masks from here on are about the second character of each adjacent pair
    if script is not None:  # a change of script between two letters (a mark or joiner of no script is none)
        letter = ((cls == _LOWER) | (cls == _UPPER) | (cls == _LETTER)) & (script >= 0)
        changed |= letter[1:] & letter[:-1] & (script[1:] != script[:-1])
    changed &= solid[1:] & solid[:-1]
    symbol_change = (cls[1:] == _SYMBOL) & (codes[1:] != codes[:-1])
    pair = (low[:-1] > 0) & (cls[1:] == _LOWER) & (low[1:] > 0)  # ending in lower case: not an acronym, not a joint
    rare_pair = pair & rare.take((low[:-1] << 5) | low[1:])
    bounds = np.r_[0, np.flatnonzero(codes == 10) + 1, len(codes)]

    def per_line(mask: np.ndarray, offset: int) -> np.ndarray:
        return np.diff(np.searchsorted(np.flatnonzero(mask) + offset, bounds))

    return np.stack([per_line(solid, 0), per_line(changed, 1), per_line(symbol_change, 1), per_line(rare_pair, 1),
                     per_line(pair, 1)])


def soup_fraction(text: str, min_line: int = 20, class_changes: float = 0.4, symbol_changes: float = 0.4,
                  rare_pairs: float = 0.25, min_pairs: int = 10) -> float:
    """Share of the non-space characters in character-soup lines."""
    solid, changed, symbols, rare, pairs = soup_lines(text)
    soup = (solid >= min_line) & ((changed >= class_changes * solid) | (symbols >= symbol_changes * solid)
                                  | ((pairs >= min_pairs) & (rare >= rare_pairs * pairs))
                                  # a short line has few letter pairs: a few rare ones and mixed classes will do
                                  | ((pairs >= 4) & (rare >= rare_pairs * pairs) & (changed >= 0.3 * solid)))
    return float(solid[soup].sum()) / max(int(solid.sum()), 1)


# ---- link_density -----------------------------------------------------------------------------------------------

_MD_IMAGE = re.compile(r"!\[[^\]\n]*\]\([^)\s]*\)")
_MD_LINK = re.compile(r"\[([^\]\n]*)\]\([^)\s]*\)")
_URL = re.compile(r"(?:https?://|www\.)[^\s)>\]]+")
# Menu separators: spaced ASCII marks, runs of spaces, and the full-width bar Chinese and Japanese menus write
# unspaced (ホーム｜会社概要｜製品; never inside a word, unlike the middle dot ・ of a katakana name).
_SEPARATOR = re.compile(r"\s+(?:[|·•»/>~:–-]|::)\s+|\s{2,}|\s*｜\s*")
_CODE = re.compile(r"[=(){}\[\];<>\"`$\\_*@%#^~]|(?:^|\s)--?\w")
_MENU_CODE = re.compile(r"[=(){}\[\];<\"`$\\_*@%#^~]")
_LETTER_RE = re.compile(r"[^\W\d_]")
_EMPTY_LINKS = re.compile(r"(?:\[\]\([^)\s]*\)\s*)+")
# A line ending in one of these is no title or menu item: C4's sentence ends with those of other scripts
# (text_stats.TERMINAL_PUNCTUATION: 。！？ danda, Arabic question mark ...), and the clause marks.
_TERMINAL = tuple(dict.fromkeys((*TERMINAL_PUNCTUATION, ":", ";", ",", "”", "’", "：", "；", "，", "、")))
_JUSTEXT_SHORT = 70  # jusText's length_low: blocks shorter than this are "short"
# The screen counts title-like lines (every word capitalized, a number or of one to three letters, no code
# characters or terminal punctuation; separators allowed), links and menu separators. A `(?m)^` pattern is counted
# only where it runs to the line's end: pyarrow counts from where the last match ended, and `^` would match there.
_PLAIN = r"[^\s.!?=(){}\[\];<>\"`$\\_*@%#^~]"
_ITEM = r"[^\s=(){}\[\];<>\"`$\\_*@%#^~]"
TITLE_LINE_SCREEN = (rf"(?m)^[ \t]*(?:[-*+•][ \t]+)?(?:[A-Z0-9&]{_PLAIN}*|[a-z]{{1,3}})"
                     rf"(?:[ \t]+(?:[A-Z0-9&]{_ITEM}*|[a-z]{{1,3}}|[|·•»>/~:–-]|::))*[ \t]*$")
LINK_SCREEN = r"\]\(|[^(]https?://|[^(/]www\.| (?:[|·•»>/~–-]|::) |｜"  # a Markdown link counts once


def weighed_words(text: str) -> float:
    """The words of a text as the line rules count them: `count_words`, a unit of an unspaced script weighed as
    text_units.weighed_count weighs it (a Han character or kana 5/8 of a word, a Thai letter 1/4), as Gopher's
    document length and C4's words per line are. Counted one each, a six-character Japanese link title made six
    words, the length of an English sentence, and no link line."""
    return len(text.split()) if plain(text) else weighed_count(whitespace_words(text))


def _link_text(match: re.Match) -> str:
    return match.group(1)


def _title_like(words: list[str]) -> bool:
    """Most words of four or more letters capitalized: a menu item or a headline, not a sentence."""
    long = [w for w in words if len(w) >= 4 and w[0].isalpha()]
    return bool(long) and sum(w[0].isupper() for w in long) >= 0.75 * len(long)


def _menu_initial(char: str) -> bool:
    """A menu item's first letter: a capital, or a letter of a script without case (Chinese, Japanese, Korean, Thai,
    Arabic, Hebrew, Devanagari ...), whose menus could not be told by capitals and all passed for content."""
    return char.isalpha() and not char.islower()


# What sends a long line down the full path: link marks, whitespace other than single spaces, ASCII separators.
_MARKS = ("](", "://", "www.", "\t", "\r", "\x0b", "\x0c", "  ", " | ", " / ", " > ", " ~ ", " : ", " - ", " :: ")


def classify_line(line: str, link_density: float = 0.5) -> tuple[str, float]:
    """("boilerplate" | "content" | "neutral", words) for one line."""
    s = line.strip()
    if len(s) >= _JUSTEXT_SHORT and s.isascii() and s[-1] not in " :-|" and s[0] not in "*-+>#:" \
            and not s.startswith(".. ") and not any(m in s for m in _MARKS) and "reserved" not in s.lower():
        # a long line without links, separators or a footer mark: the rules below make it content (or neutral)
        return ("content", len(s.split())) if _LETTER_RE.search(s) else ("neutral", 0)
    return _classify(s, link_density)


def _classify(s: str, link_density: float) -> tuple[str, float]:
    """`classify_line` for a stripped line, every rule in order."""
    if s[:1] in ("*", "-", "+", "•", ">"):
        s = s.lstrip("*-+•> ")
    if not s or s[0] in "#:" or s.startswith(".. "):  # headings, reST directives and fields: markup, not text
        return "neutral", 0
    urls = link_words = 0
    if "](" in s or "://" in s or "www." in s:
        if "![" in s:
            s = _MD_IMAGE.sub("", s).strip()
            if not s or _EMPTY_LINKS.fullmatch(s):  # badges
                return "neutral", 0
        urls = len(_URL.findall(s))
        link_words = sum(weighed_words(t) for t in _MD_LINK.findall(s)) + urls
        text = _URL.sub(" ", _MD_LINK.sub(_link_text, s)).strip().rstrip(" :-|")
    else:
        text = s.rstrip(" :-|")
    ws = whitespace_words(text)  # a character of Chinese, Japanese or Thai is a unit, as everywhere in Kiln ...
    n = len(ws) if plain(text) else weighed_count(ws)  # ... weighing 5/8 of a word (a Thai letter 1/4), as in Gopher
    words = n + urls
    if words == 0:
        return "neutral", 0
    if link_words > link_density * words:
        return "boilerplate", words
    if not _LETTER_RE.search(text):
        return "neutral", 0
    code = _MENU_CODE.search(text)
    if not code and not s.startswith("|") and _SEPARATOR.search(text):
        items = [x for x in _SEPARATOR.split(text) if x]
        if len(items) >= 3 and sum((weighed_words(x) <= 4 or _title_like(x.split())) and _menu_initial(x[0])
                                   for x in items) >= 0.75 * len(items):
            return "boilerplate", words
    if code or _CODE.search(text):
        return "content", words
    if len(text) < _JUSTEXT_SHORT and not text.endswith(_TERMINAL) and (n <= 3 or _title_like(ws)):
        return "boilerplate", words
    if text[0] == "©" or "all rights reserved" in text.lower():
        return "boilerplate", words
    return "content", words


def boilerplate_fraction(text: str, link_density: float = 0.5, at_least: float | None = None) -> tuple[float, int]:
    """(share of the words in boilerplate lines, how many boilerplate lines). With `at_least`, stops (returning a
    share below it) once content words rule that share out: a line's words are at most its words as count_words
    counts them plus two per URL, so the text's plus two per URL mark bound boilerplate plus content words."""
    boiler = content = lines = 0
    most = count_words(text) + 2 * (text.count("://") + text.count("www.")) if at_least else None
    for _, kind, words in line_kinds(text, link_density):
        if kind == "boilerplate":
            boiler += words
            lines += 1
        elif kind == "content":
            content += words
            if most is not None and content > (1 - at_least) * most:
                return 0.0, lines
    return boiler / max(boiler + content, 1), lines


def line_kinds(text: str, link_density: float = 0.5) -> Iterator[tuple[str, str, float]]:
    """(line, kind, words) for each line, as `classify_line` has it, except that a lower-case line continuing an
    unfinished content line is content (a wrapped sentence)."""
    previous = None  # the last line, if it was content
    for line in text.split("\n"):
        kind, words = classify_line(line, link_density)
        if (kind == "boilerplate" and previous is not None and line.strip()[:1].islower()
                and not previous.rstrip().endswith(_TERMINAL)):
            kind = "content"
        yield line, kind, words
        previous = line if kind == "content" else None


# ---- stub -------------------------------------------------------------------------------------------------------


def content_words(text: str, link_density: float = 0.5, enough: int | None = None) -> float:
    """Words (`weighed_words`) outside boilerplate lines (`line_kinds`: content, and neutral lines such as headings,
    fields and directives), leaving out the lines C4 removes as notices (a mention of JavaScript, cookies or a policy:
    kiln.curation.filters.c4). With `enough`, stops counting once it is reached."""
    n = 0
    for line, kind, words in line_kinds(text, link_density):
        if kind != "boilerplate":
            lower = line.lower()
            if "javascript" not in lower and not any(p in lower for p in POLICY_SUBSTRINGS):
                n += words if kind == "content" else weighed_words(line)
                if enough is not None and n >= enough:
                    break
    return n


# ---- repeated_lines ---------------------------------------------------------------------------------------------

# A line's key: its tokens in lower case, where a token with a digit or a month or weekday name stands for "0"
# (counters, dates, times, prices, user names with numbers), a run of them for one.
_CALENDAR = frozenset("""jan january feb february mar march apr april may jun june jul july aug august sep sept
september oct october nov november dec december mon monday tue tues tuesday wed wednesday thu thurs thursday fri friday
sat saturday sun sunday""".split())
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"0" * 9)


def _folded(text: str) -> str:
    """Lower case, every ASCII digit "0" (on the UTF-8 bytes, where no other character has a digit's byte)."""
    return text.lower().encode("utf-8", "surrogatepass").translate(_DIGITS_TO_ZERO).decode("utf-8", "surrogatepass")


def _key(folded_line: str) -> list[str]:
    out: list[str] = []
    for token in folded_line.split():
        if "0" in token or token.strip(".,;:") in _CALENDAR:
            if out and out[-1] == "0":
                continue
            token = "0"
        out.append(token)
    return out


def line_key(line: str) -> list[str]:
    """A line's tokens as `repeated_line_fraction` compares them."""
    return _key(_folded(line))


def repeated_line_fraction(text: str, one_word_apart: tuple[int, int] = (3, 16), at_least: float | None = None) \
        -> float:
    """Share of the non-space characters (of the lines' keys) in lines that repeat an earlier line: the same
    `line_key`, or, for lines of `one_word_apart` tokens, the same but for one token in the same place (a slot a
    template fills: a name, a topic). Lines without a letter (blank, rules, symbols, numbers) count for neither side.
    With `at_least`, stops (returning a share below it)
    once the lines that do not repeat rule that share out (keys are never longer than their lines)."""
    most_new = (1 - at_least) * _non_space(text) if at_least is not None else None
    seen: set[tuple] = set()
    repeated = new = 0
    lo, hi = one_word_apart
    for line in _folded(text).split("\n"):
        tokens = _key(line)
        if not tokens or not _LETTER_RE.search(line):  # rules, symbols and numbers alone: markup, not text
            continue
        keys = [("=", *tokens)]
        if lo <= len(tokens) <= hi:
            keys += [(i, *tokens[:i], *tokens[i + 1:]) for i in range(len(tokens))]
        chars = sum(map(len, tokens))
        if seen.isdisjoint(keys):
            new += chars
            if most_new is not None and new > most_new:
                return 0.0
        else:
            repeated += chars
        seen.update(keys)
    return repeated / max(repeated + new, 1)


# ---- the step ---------------------------------------------------------------------------------------------------

WINDOW = 1000  # characters a screen reads at a time in a long document
WHOLE = 7 * WINDOW  # documents up to this long are screened whole
RULE_SHARE = 0.3  # the least share of a document any rule needs: a stretch this long holds a whole window


def _arrow(texts: list[str]) -> pa.Array:
    try:
        return pa.array(texts, pa.large_string())
    except UnicodeEncodeError:  # a lone surrogate: read that text with U+FFFD in its place
        return pa.array([t.encode("utf-8", "surrogatepass").decode("utf-8", "replace") for t in texts],
                        pa.large_string())


def windows(text: str) -> list[str]:
    """What the screens read of a text: all of it up to WHOLE characters; else WINDOW-character windows every
    `RULE_SHARE * len - WINDOW` characters (so any stretch of RULE_SHARE of the text holds a whole one) and the last
    WINDOW characters."""
    n = len(text)
    if n <= WHOLE:
        return [text]
    step = int(RULE_SHARE * n) - WINDOW
    return [text[s:s + WINDOW] for s in range(0, n - WINDOW, step)] + [text[n - WINDOW:]]


# A rule drops at `share >= threshold`: a threshold of 0 would drop every document its screen passes.
_Threshold = Annotated[float, Interval(gt=0, le=1)]


@dataclass
class Garbage:
    name: ClassVar[str] = "garbage"

    max_encoded_fraction: _Threshold | None = 0.3  # of the non-space characters (StarCoder2: 0.5 of a file)
    max_minified_fraction: _Threshold | None = 0.3  # of the characters, in minified lines
    minified_line_chars: PositiveInt = 200
    max_soup_fraction: _Threshold | None = 0.3  # of the non-space characters, in soup lines
    soup_class_changes: _Threshold = 0.4  # per non-space character of a line
    soup_symbol_changes: _Threshold = 0.4  # per non-space character of a line
    soup_rare_pairs: _Threshold = 0.25  # per letter pair of a line
    soup_screen: Fraction = 0.05  # soup signs per byte of a window before a document's lines are measured
    max_boilerplate_fraction: _Threshold | None = 0.5  # of the words, in boilerplate lines
    link_density: Fraction = 0.5  # of a line's words in link text or URLs: a link line (jusText: 0.2 per block)
    # title-like lines, links and separators per line (of the windows) to classify (a line may hold several)
    boilerplate_screen: NonNegativeFloat = 0.5
    max_repeated_line_fraction: _Threshold | None = None  # of the non-space characters, in repeated lines (web: 0.7)
    min_content_words: NonNegativeInt | None = None  # in content lines, notices left out (web: 30)

    def __call__(self, doc: Document) -> Verdict:
        return self.batch([doc])[0]

    def batch(self, docs: list[Document]) -> list[Verdict]:
        texts = [d.text for d in docs]
        if not texts:
            return []
        reasons: list[str | None] = [None] * len(texts)
        pieces = [windows(t) for t in texts]
        first = np.cumsum([0] + [len(p) for p in pieces[:-1]])  # each document's first window
        flat = [w for p in pieces for w in p]
        array = _arrow(flat)

        def any_window(hits: np.ndarray) -> list[int]:
            return np.flatnonzero(np.logical_or.reduceat(hits, first)).tolist()

        def counts(pattern: str) -> np.ndarray:
            return pc.count_substring_regex(array, pattern).to_numpy(zero_copy_only=False)

        if self.max_encoded_fraction is not None:
            # One RE2 pass for both screens; the few windows it passes are told apart by Python's regex.
            screened = pc.match_substring_regex(array, f"{BASE64_SCREEN}|{ENCODED_SCREEN}")
            hits = np.zeros(len(flat), dtype=bool)
            for j in np.flatnonzero(screened.to_numpy(zero_copy_only=False)).tolist():
                other = _ENCODED_SCREEN_RE.search(flat[j]) is not None
                runs = ENCODED_RE.finditer(flat[j]) if other else _BASE64_RUN.finditer(flat[j])
                hits[j] = any(_is_payload(m.group()) for m in runs)
            maybe = any_window(hits)
            for i, share in zip(maybe, _encoded_fractions([texts[i] for i in maybe], self.max_encoded_fraction)):
                if share >= self.max_encoded_fraction:
                    reasons[i] = "encoded_blob"
        if self.max_minified_fraction is not None:
            for i in any_window(pc.match_substring_regex(array, MINIFIED_SCREEN).to_numpy(zero_copy_only=False)):
                if reasons[i] is None and \
                        minified_fraction(texts[i], self.minified_line_chars) >= self.max_minified_fraction:
                    reasons[i] = "minified_code"
        if self.max_soup_fraction is not None:
            for i in any_window(soup_signs(flat) >= self.soup_screen):
                if reasons[i] is None and soup_fraction(
                        texts[i], class_changes=self.soup_class_changes, symbol_changes=self.soup_symbol_changes,
                        rare_pairs=self.soup_rare_pairs) >= self.max_soup_fraction:
                    reasons[i] = "char_soup"
        if self.max_boilerplate_fraction is not None:
            items = np.add.reduceat(counts(TITLE_LINE_SCREEN) + counts(LINK_SCREEN), first)
            lines = np.add.reduceat(np.array([w.count("\n") + 1 for w in flat]), first)
            for i in np.flatnonzero((items >= 3) & (items >= self.boilerplate_screen * lines)).tolist():
                if reasons[i] is None:
                    share, n = boilerplate_fraction(texts[i], self.link_density, self.max_boilerplate_fraction)
                    if n >= 3 and share >= self.max_boilerplate_fraction:
                        reasons[i] = "link_density"
        if self.max_repeated_line_fraction is not None:
            for i, t in enumerate(texts):
                if reasons[i] is None and repeated_line_fraction(t, at_least=self.max_repeated_line_fraction) \
                        >= self.max_repeated_line_fraction:
                    reasons[i] = "repeated_lines"
        if self.min_content_words is not None:
            for i, t in enumerate(texts):
                if reasons[i] is None and content_words(t, self.link_density, self.min_content_words) \
                        < self.min_content_words:
                    reasons[i] = "stub"
        return [keep(t) if r is None else drop(self.name, r, t) for t, r in zip(texts, reasons)]
