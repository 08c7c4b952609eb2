"""Garbage catch rate and clean loss of the default filter profiles, on a mixed corpus assembled from this machine.

    .venv/bin/python bench/filter_eval.py [--config configs/default.yaml] [--per-source 400] [--per-cell 150]
                                          [--seed 0] [--without garbage]

Clean documents are real text already on the machine, labelled by source kind, each run through the profile a
user would pick for it (configs/default.yaml's profile names):

    python_code      code            standard-library .py files
    c_headers        code            /usr/include C headers (full of ;{} by nature)
    docstrings       technical_docs  standard-library docstrings, one document per module (as `python_docs`)
    pydoc_topics     technical_docs  Python's reference topics (pydoc_data)
    man_pages        technical_docs  /usr/share/man pages (troff, rendered by a simple strip)
    doc_files        technical_docs  README / Markdown / reST / text docs under /usr/share/doc
    package_readmes  technical_docs  installed distributions' long descriptions (badges, link tables)
    licenses         legal           /usr/share/common-licenses and installed distributions' license files
    debian_copyright legal           /usr/share/doc/*/copyright
    prose            prose           paragraphs of prose from the documents above, a few per document

A clean document has at least 30 words (code: any size); C headers marked generated in their first lines are left
out (code_quality drops those by design). Garbage documents come from seeded generators, one set per kind and
profile where the kind turns up (web pages run through `prose`, scraped documentation through `technical_docs`, ...):

    boilerplate      navigation / link-list pages: menus, breadcrumbs, footers, Markdown or bare-URL link lists
    char_soup        random printable ASCII, random letters, symbol runs, binary decoded as Latin-1 / UTF-8
    encoded_blob     base64 (MIME lines, data: URIs, PEM), hex (dumps, digests, C arrays), uuencode
    minified_code    minified JavaScript (alone in code sources)

with real sentences around them (at most as long as the payload: the payload is what the document is). Seeded and
deterministic for a given machine; a few thousand documents, under a minute on one core.

Every document goes through the real steps (`normalize`, the profile, `pii`: `kiln.curation.pipeline.run_steps`). Prints the
catch rate per garbage kind (and per profile), the clean loss per source with its top drop reasons, and docs/s.
`--without garbage` runs the profiles without that step (the "before" figures). Exits 1 if a kind is caught below
99% or a clean source loses more than 10%.
"""

from __future__ import annotations

import argparse
import ast
import base64
import binascii
import functools
import gzip
import hashlib
import importlib.metadata
import os
import random
import re
import string
import sys
import sysconfig
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Iterator
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.common.config import StepSpec, load_config  # noqa: E402
from kiln.common.stats import StageStats  # noqa: E402
from kiln.curation.documents import Document  # noqa: E402
from kiln.curation.filters.registry import build_step  # noqa: E402
from kiln.curation.pipeline import run_steps  # noqa: E402

MIN_CATCH = 0.99
MAX_LOSS = 0.10

# ================================================================================================ clean text


def _read(path: Path, limit: int = 400_000) -> str | None:
    """A text file's content (gzip'd or not), or None if it is not UTF-8 text or is too large."""
    try:
        raw = gzip.open(path).read(limit + 1) if path.suffix == ".gz" else path.read_bytes()[: limit + 1]
        if len(raw) > limit or b"\0" in raw:
            return None
        return raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError, gzip.BadGzipFile):
        return None


def _sample(items: list, n: int, rng: random.Random) -> list:
    items = sorted(items)
    return items if len(items) <= n else rng.sample(items, n)


def _stdlib_files() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "test", "tests", "idle_test", "__pycache__", "dist-packages"}
    return [p for p in sorted(root.rglob("*.py")) if not skip.intersection(p.relative_to(root).parts[:-1])]


def python_code(n: int, rng: random.Random) -> list[str]:
    return [t for p in _sample(_stdlib_files(), n, rng) if (t := _read(p, 1_000_000)) and len(t) >= 20]


def _generated(text: str) -> bool:
    """Marked as generated in its first lines: `code_quality` drops those by design, so they are not clean here."""
    head = "\n".join(text.split("\n", 5)[:5]).lower()
    return any(m in head for m in ("generated", "do not edit"))


def c_headers(n: int, rng: random.Random) -> list[str]:
    files = [p for p in Path("/usr/include").rglob("*.h") if p.is_file()] if Path("/usr/include").is_dir() else []
    return [t for p in _sample(files, n * 2, rng) if (t := _read(p)) and len(t) >= 200 and not _generated(t)][:n]


@functools.cache
def _module_docstrings(path: Path) -> str | None:
    """A module's docstrings as one document (module, then its public classes and functions), as `python_docs`."""
    try:
        tree = ast.parse(path.read_bytes())
    except (SyntaxError, ValueError):
        return None
    root = Path(sysconfig.get_paths()["stdlib"])
    module = ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")
    sections = [f"{module}\n{'=' * len(module)}\n\n{d}"] if (d := ast.get_docstring(tree)) else []
    sections += [f"{module}.{node.name}\n\n{d}" for node in ast.walk(tree)
                 if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
                 and not node.name.startswith("_") and (d := ast.get_docstring(node))]
    return "\n\n".join(sections) or None


def docstrings(n: int, rng: random.Random) -> list[str]:
    return [t for p in _sample(_stdlib_files(), int(n * 1.6), rng) if (t := _module_docstrings(p))][:n]


def pydoc_topics(n: int, rng: random.Random) -> list[str]:
    from pydoc_data.topics import topics

    return [topics[k] for k in _sample(list(topics), n, rng)]


_ROFF_ESCAPES = [(re.compile(p), r) for p, r in (
    (r"\\f(?:\[[^\]]*\]|\(..|.)", ""), (r"\\s[-+]?\d", ""), (r"\\\((?:em|en)", "-"), (r"\\\(bu", "*"),
    (r"\\\((?:aq|cq|oq)", "'"), (r"\\\((?:dq|lq|rq)", '"'), (r"\\\(co", "(c)"), (r"\\\(..", ""),
    (r"\\\*(?:\(..|\[[^\]]*\]|.)", ""), (r"\\-", "-"), (r"\\e", "\\\\"), (r"\\[&|^c,/%]", ""),
    (r"\\ ", " "), (r"\\(.)", r"\1"))]
_ROFF_SKIP = {"TH", "Dd", "Dt", "Os", "so", "de", "ds", "nr", "ie", "el", "if", "ft", "ad", "na", "hy", "nh", "ne",
              "in", "ta", "ti", "ll", "pc", "ig", "..", "ns", "rs", "UC", "TS", "TE", "PD", "ss", "cs", "bp"}
_ROFF_BREAKS = {"PP", "P", "LP", "TP", "IP", "HP", "RS", "RE", "sp", "br", "SH", "SS", "Sh", "Ss", "Pp", "Bl", "El",
                "It", "nf", "fi", "EX", "EE", "Bd", "Ed"}


def render_man(src: str) -> str:
    """A man page's text from its troff source by a simple strip: text lines filled into paragraphs, headings and
    tags on lines of their own, escapes removed (no-fill blocks kept line by line)."""
    out: list[str] = []
    para: list[str] = []
    fill = True

    def flush() -> None:
        if para:
            out.append(" ".join(para))
            para.clear()

    for line in src.splitlines():
        if line.startswith((".\\\"", "'\\\"")) or line.strip() in (".", "'"):
            continue
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].strip().partition(" ")
            if macro in _ROFF_SKIP:
                continue
            if macro in _ROFF_BREAKS:
                flush()
                fill = {"nf": False, "EX": False, "Bd": False, "fi": True, "EE": True, "Ed": True}.get(macro, fill)
                if macro in ("SH", "SS", "Sh", "Ss"):
                    out.append("")
                    rest = rest.replace('"', "")
                elif macro in ("IP", "TP", "HP", "It"):
                    rest = rest.split('"')[1] if rest.startswith('"') else rest.split(" ")[0] if macro == "IP" else rest
                else:
                    rest = ""
                if rest:
                    out.append(rest)
                continue
            if macro[:1] in "IBR" and len(macro) <= 2:  # .B .I .BR .IR .BI ...: fonts
                line = "".join(rest.replace('"', "").split()) if len(macro) == 2 else rest.replace('"', "")
            else:
                line = rest
        for pattern, repl in _ROFF_ESCAPES:
            line = pattern.sub(repl, line)
        if not line.strip():
            flush()
            out.append("")
        elif fill:
            para.append(line.strip())
        else:
            out.append(line)
    flush()
    return re.sub(r"\n{3,}", "\n\n", "\n".join(out)).strip()


@functools.cache
def _man_page(path: Path) -> str | None:
    src = _read(path)
    return render_man(src) if src and not src.lstrip().startswith(".so") else None


def man_pages(n: int, rng: random.Random) -> list[str]:
    root = Path("/usr/share/man")
    files = [p for sec in ("man1", "man5", "man7", "man8") if (root / sec).is_dir() for p in (root / sec).iterdir()
             if p.suffix == ".gz" and not p.is_symlink()]
    out = []
    for p in _sample(files, n * 2, rng):
        if (text := _man_page(p)) and len(text) >= 300:
            out.append(text)
    return out[:n]


_DOC_NAME = re.compile(r"(?i)^(readme|faq|todo|bugs|hacking|contributing|install|usage|notes|overview)"
                       r"|\.(md|markdown|rst|txt)(\.gz)?$")


def _doc_files() -> list[Path]:
    root = Path("/usr/share/doc")
    if not root.is_dir():
        return []
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink() and _DOC_NAME.search(p.name)
                  and "examples" not in p.parts and not p.name.lower().startswith(("changelog", "copyright")))


def doc_files(n: int, rng: random.Random) -> list[str]:
    return [t for p in _sample(_doc_files(), n * 2, rng) if (t := _read(p, 200_000)) and len(t.strip()) >= 200][:n]


def package_readmes(n: int, rng: random.Random) -> list[str]:
    seen, out = set(), []
    for dist in importlib.metadata.distributions():
        name = (dist.metadata.get("Name") or "").lower()
        text = dist.metadata.get_payload() or dist.metadata.get("Description") or ""
        if name and name not in seen and len(text.strip()) >= 200:
            seen.add(name)
            out.append((name, text))
    return [t for _, t in _sample(out, n, rng)]


def licenses(n: int, rng: random.Random) -> list[str]:
    files = sorted(Path("/usr/share/common-licenses").glob("*")) if Path("/usr/share/common-licenses").is_dir() else []
    for dist in importlib.metadata.distributions():
        for f in dist.files or []:
            name = Path(str(f)).name.lower()
            if name.startswith(("license", "licence", "copying", "notice")) and \
                    not name.endswith((".py", ".pyc", ".json")):
                files.append(Path(dist.locate_file(f)))
    texts = {t for p in files if p.is_file() and (t := _read(p)) and len(t.strip()) >= 200}
    return _sample(list(texts), n, rng)


def debian_copyright(n: int, rng: random.Random) -> list[str]:
    files = sorted(Path("/usr/share/doc").glob("*/copyright")) if Path("/usr/share/doc").is_dir() else []
    texts = {t for p in files if p.is_file() and (t := _read(p)) and len(t.strip()) >= 200}
    return _sample(list(texts), n, rng)


_PROSE_PARA = re.compile(r"^[A-Z][^\n]*[.!?]$")


@functools.cache
def prose_paragraphs(seed: int = 1) -> list[str]:
    """Paragraphs that read as prose (sentences of words, no code or tables), re-flowed to one line each."""
    rng = random.Random(seed)
    texts = pydoc_topics(10_000, rng) + docstrings(300, rng) + doc_files(300, rng) + man_pages(150, rng)
    paras = set()
    for text in texts:
        for para in re.split(r"\n\s*\n", text):
            if para[:1].isspace():  # indented: code, a quote or a definition list
                continue
            flat = " ".join(para.split())
            ws = flat.split()
            if (len(ws) >= 25 and _PROSE_PARA.match(flat) and flat.count(". ") + 1 >= 2
                    and sum(w.strip(".,;:!?\"'()").isalpha() for w in ws) >= 0.9 * len(ws)
                    and not re.search(r"[{}<>=|`*#_\\/@$%]|::|\.\.\.|--", flat)):
                paras.add(flat)
    return sorted(paras)


def prose(n: int, rng: random.Random) -> list[str]:
    paras = prose_paragraphs()
    return ["\n\n".join(rng.sample(paras, rng.randint(3, 8))) for _ in range(n)] if len(paras) >= 8 else []


CLEAN: dict[str, tuple[str, Callable[[int, random.Random], list[str]]]] = {
    "python_code": ("code", python_code),
    "c_headers": ("code", c_headers),
    "docstrings": ("technical_docs", docstrings),
    "pydoc_topics": ("technical_docs", pydoc_topics),
    "man_pages": ("technical_docs", man_pages),
    "doc_files": ("technical_docs", doc_files),
    "package_readmes": ("technical_docs", package_readmes),
    "licenses": ("legal", licenses),
    "debian_copyright": ("legal", debian_copyright),
    "prose": ("prose", prose),
}

# ================================================================================================ garbage

NAV_ITEMS = ("Home", "About", "About Us", "Contact", "Contact Us", "Blog", "News", "Products", "Services", "Pricing",
             "Login", "Sign in", "Sign up", "Register", "My Account", "Cart", "Checkout", "Help", "FAQ", "Support",
             "Careers", "Jobs", "Press", "Investors", "Partners", "Events", "Shop", "Store", "Gallery", "Videos",
             "Sports", "Business", "Technology", "Science", "Health", "Travel", "Politics", "Opinion", "Weather",
             "Entertainment", "Music", "Movies", "Books", "Food", "Recipes", "Deals", "Coupons", "Downloads",
             "Documentation", "Docs", "API Reference", "Tutorials", "Guides", "Community", "Forum", "Search",
             "Sitemap", "Archive", "Categories", "Tags", "Authors", "Subscribe", "Newsletter", "RSS", "Privacy Policy",
             "Terms of Service", "Terms of Use", "Cookie Policy", "Accessibility", "Advertise", "Legal", "Imprint")
FOOTER = ("All rights reserved.", "Powered by WordPress", "Back to top", "Skip to content", "Skip to main content",
          "Follow us on Facebook", "Follow us on Twitter", "Share this:", "Like this:", "Loading...", "Read more",
          "Continue reading", "Leave a comment", "Previous post", "Next post", "Older posts", "Newer posts")
TOPIC = ("garden", "kitchen", "budget", "travel", "winter", "coffee", "running", "python", "camera", "wedding",
         "city council", "election", "market", "housing", "school", "football", "recipe", "vacation", "startup",
         "climate", "phone", "laptop", "guitar", "marathon", "museum", "festival", "mortgage", "diet", "puppy")
HEADLINE = ("{n} Best Ways to Improve Your {t}", "Why Everyone Is Talking About the New {t}",
            "How to Plan a {t} on a Budget", "The Ultimate Guide to {t}", "{t}: What You Need to Know in {y}",
            "Top {n} {t} Tips for Beginners", "Review: Is the {t} Worth It?", "Breaking: {t} Update Announced",
            "{n} Mistakes Everyone Makes With Their {t}", "Everything About {t} Explained")
SEPS = (" | ", " · ", " / ", " - ", "  ", " • ", " » ", " :: ")
DOMAINS = ("example.com", "news.example.org", "shop.example.net", "blog.example.io", "www.example.co.uk")


def _slug(text: str) -> str:
    return re.sub(r"[^a-z0-9]+", "-", text.lower()).strip("-")


def _url(rng: random.Random, text: str) -> str:
    path = "/".join(_slug(rng.choice(TOPIC)) for _ in range(rng.randint(0, 2)))
    return f"https://{rng.choice(DOMAINS)}/{path}{'/' if path else ''}{_slug(text)}" + rng.choice(("", ".html", "/"))


def _headline(rng: random.Random) -> str:
    return rng.choice(HEADLINE).format(n=rng.randint(3, 25), t=rng.choice(TOPIC).title(), y=rng.randint(2015, 2026))


def _link_text(rng: random.Random) -> str:
    return rng.choice(NAV_ITEMS) if rng.random() < 0.55 else _headline(rng)


def boilerplate(rng: random.Random, sentences: list[str]) -> str:
    """A page that is mostly navigation: menus, breadcrumbs, link lists, footers; at most a sentence or two."""
    style = rng.choice(("markdown", "plain", "bullets", "urls", "pipes", "mixed", "titled"))
    blocks: list[str] = []
    if rng.random() < 0.5:
        blocks.append(rng.choice(FOOTER[4:6]))
    if rng.random() < 0.4:
        blocks.append(" > ".join(["Home", *rng.sample(NAV_ITEMS[4:], rng.randint(1, 3))]))
    for _ in range(rng.randint(2, 5)):
        items = [_link_text(rng) for _ in range(rng.randint(4, 14))]
        kind = style if style != "mixed" else rng.choice(("markdown", "plain", "bullets", "urls", "pipes"))
        if kind == "markdown":
            blocks.append("\n".join(f"[{t}]({_url(rng, t)})" for t in items))
        elif kind == "bullets":
            bullet = rng.choice(("* ", "- ", "• ", "+ "))
            blocks.append("\n".join(f"{bullet}[{t}]({_url(rng, t)})" if rng.random() < 0.6 else f"{bullet}{t}"
                                    for t in items))
        elif kind == "urls":
            blocks.append("\n".join(rng.choice((f"{t} - {_url(rng, t)}", _url(rng, t), f"{t}: {_url(rng, t)}"))
                                    for t in items))
        elif kind == "pipes":
            blocks.append(rng.choice(SEPS).join(items))
        elif kind == "titled":
            blocks.append(rng.choice(("Related articles", "Most popular", "Trending now", "You may also like",
                                      "Recent Posts", "Categories", "Quick links")) + "\n" + "\n".join(items))
        else:
            blocks.append("\n".join(items))
    if rng.random() < 0.4 and sentences:  # a teaser sentence or two: still mostly navigation
        blocks.insert(rng.randint(0, len(blocks)), " ".join(rng.sample(sentences, rng.randint(1, 2))))
    footer = rng.sample(NAV_ITEMS[-12:], rng.randint(2, 6))
    blocks.append(rng.choice(SEPS).join(footer))
    blocks.append(f"© {rng.randint(2005, 2026)} {rng.choice(TOPIC).title()} Media Inc. {FOOTER[0]}")
    if rng.random() < 0.5:
        blocks.append("\n".join(rng.sample(FOOTER, rng.randint(2, 5))))
    return rng.choice(("\n", "\n\n")).join(blocks)


def char_soup(rng: random.Random, sentences: list[str]) -> str:
    """Random characters: printable ASCII, letters in word-sized runs, symbol runs, binary decoded as text."""
    n = int(rng.choice((150, 300, 600, 1500, 4000, 12000)) * rng.uniform(0.8, 1.25))
    style = rng.choice(("printable", "letters", "lower_words", "alnum_tokens", "symbols", "latin1", "utf8_binary",
                        "unicode_mix", "keyboard"))
    if style == "printable":  # uniform printable ASCII with some spaces and line breaks
        alphabet = string.ascii_letters + string.digits + string.punctuation + " " * 8
        text = "".join(rng.choice(alphabet) for _ in range(n))
    elif style in ("letters", "lower_words"):  # random letters in word-sized runs
        alphabet = string.ascii_lowercase if style == "lower_words" else string.ascii_letters
        text = " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(1, 10))) for _ in range(n // 6))
    elif style == "alnum_tokens":  # captcha / key-like tokens
        alphabet = string.ascii_letters + string.digits
        text = " ".join("".join(rng.choice(alphabet) for _ in range(rng.randint(3, 14))) for _ in range(n // 9))
    elif style == "symbols":  # symbol runs with a few letters
        alphabet = string.punctuation * 3 + string.ascii_letters + "    "
        text = "".join(rng.choice(alphabet) for _ in range(n))
    elif style == "latin1":  # a binary file read as Latin-1
        text = bytes(rng.randrange(256) for _ in range(n)).decode("latin-1")
    elif style == "utf8_binary":  # a binary file read as UTF-8 with replacement characters
        text = bytes(rng.randrange(256) for _ in range(n)).decode("utf-8", errors="replace")
    elif style == "unicode_mix":  # code points from many scripts and symbol blocks
        blocks = [(0x21, 0x7E), (0xA1, 0x17F), (0x370, 0x3FF), (0x400, 0x4FF), (0x2190, 0x22FF), (0x2500, 0x25FF),
                  (0x4E00, 0x4FFF), (0x3040, 0x30FF), (0x0600, 0x06FF)]
        text = "".join(" " if rng.random() < 0.12 else chr(rng.randint(*rng.choice(blocks))) for _ in range(n))
    else:  # keyboard mashing
        rows = ("qwertyuiop", "asdfghjkl;", "zxcvbnm,./", "1234567890")
        text = " ".join("".join(rng.choice(rng.choice(rows)) for _ in range(rng.randint(2, 12))) for _ in range(n // 7))
    if rng.random() < 0.3:  # broken into lines
        width = rng.randint(40, 120)
        text = "\n".join(text[i:i + width] for i in range(0, len(text), width))
    if rng.random() < 0.3:  # a line of real text before it
        before, _ = _around(rng, sentences, len(text), 1, 0)
        text = f"{before}\n\n{text}" if before else text
    return text


def _around(rng: random.Random, sentences: list[str], payload: int, before: int, after: int) -> tuple[str, str]:
    """Up to `before` and `after` real sentences around a payload, together never longer than it (the payload is
    what the document is: "a little surrounding text")."""
    picked = [[], []]
    budget = payload
    for side, most in ((0, before), (1, after)):
        for s in rng.sample(sentences, rng.randint(0, most)) if sentences else []:
            if len(s) + 1 <= budget:
                picked[side].append(s)
                budget -= len(s) + 1
    return " ".join(picked[0]), " ".join(picked[1])


def _random_bytes(rng: random.Random, n: int) -> bytes:
    return bytes(rng.randrange(256) for _ in range(n))


def encoded_blob(rng: random.Random, sentences: list[str]) -> str:
    """A base64 / hex / uuencoded payload with a little text around it."""
    n = int(rng.choice((120, 300, 800, 2000, 6000)) * rng.uniform(0.8, 1.25))
    data = _random_bytes(rng, n)
    style = rng.choice(("mime", "data_uri", "pem", "b64_line", "hexdump", "hex_lines", "c_array", "uuencode",
                        "digests"))
    name = f"{rng.choice(TOPIC).replace(' ', '_')}{rng.randint(1, 99)}"
    if style == "mime":
        blob = base64.encodebytes(data).decode()
        head = (f"Content-Type: application/octet-stream; name=\"{name}.bin\"\nContent-Transfer-Encoding: base64\n"
                f"Content-Disposition: attachment; filename=\"{name}.bin\"\n\n")
        body = head + blob
    elif style == "data_uri":
        body = f'<img alt="{name}" src="data:image/png;base64,{base64.b64encode(data).decode()}">'
    elif style == "pem":
        b64 = base64.b64encode(data).decode()
        body = "-----BEGIN CERTIFICATE-----\n" + "\n".join(b64[i:i + 64] for i in range(0, len(b64), 64)) \
               + "\n-----END CERTIFICATE-----"
    elif style == "b64_line":
        body = f"{name} = {base64.b64encode(data).decode()}"
    elif style == "hexdump":  # xxd
        rows = []
        for off in range(0, len(data), 16):
            chunk = data[off:off + 16]
            hexes = " ".join(chunk[i:i + 2].hex() for i in range(0, len(chunk), 2))
            rows.append(f"{off:08x}: {hexes:<39}  {''.join(chr(b) if 32 <= b < 127 else '.' for b in chunk)}")
        body = "\n".join(rows)
    elif style == "hex_lines":
        h = data.hex()
        body = "\n".join(h[i:i + 64] for i in range(0, len(h), 64))
    elif style == "c_array":
        body = f"static const unsigned char {name}[] = {{\n" + ",\n".join(
            "  " + ", ".join(f"0x{b:02x}" for b in data[i:i + 12]) for i in range(0, len(data), 12)) + "\n};"
    elif style == "uuencode":
        lines = [binascii.b2a_uu(data[i:i + 45]).decode().rstrip("\n") for i in range(0, len(data), 45)]
        body = f"begin 644 {name}.bin\n" + "\n".join(lines) + "\n`\nend"
    else:  # a wall of digests
        body = "\n".join(hashlib.sha256(data[i:i + 8]).hexdigest() + rng.choice(("", f"  {name}-{i}.tar.gz"))
                         for i in range(0, len(data), 8))
    before, after = _around(rng, sentences, len(body), 2, 1)
    return "\n\n".join(p for p in (before, body, after) if p)


JS_WORDS = ("init", "render", "update", "config", "options", "data", "value", "items", "length", "push", "call",
            "apply", "prototype", "document", "window", "element", "style", "display", "none", "click", "event",
            "target", "handler", "callback", "promise", "then", "catch", "resolve", "reject", "state", "props",
            "module", "exports", "require", "default", "get", "set", "keys", "map", "filter", "reduce", "indexOf")


def _js_name(rng: random.Random) -> str:
    return rng.choice(string.ascii_letters + "_$") + (rng.choice(string.ascii_lowercase + string.digits)
                                                     if rng.random() < 0.4 else "")


def _js_expr(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 2 or r < 0.3:
        return rng.choice((_js_name(rng), str(rng.randint(0, 999)), f'"{rng.choice(JS_WORDS)}"', "!0", "!1",
                           "null", "void 0", f"{_js_name(rng)}.{rng.choice(JS_WORDS)}"))
    if r < 0.5:
        return f"{_js_expr(rng, depth + 1)}{rng.choice(('+', '-', '*', '===', '!==', '&&', '||', '<', '>'))}" \
               f"{_js_expr(rng, depth + 1)}"
    if r < 0.7:
        args = ",".join(_js_expr(rng, depth + 1) for _ in range(rng.randint(0, 3)))
        return f"{_js_name(rng)}.{rng.choice(JS_WORDS)}({args})"
    if r < 0.85:
        pairs = ",".join(f"{rng.choice(JS_WORDS)}:{_js_expr(rng, depth + 1)}" for _ in range(rng.randint(1, 4)))
        return "{" + pairs + "}"
    return f"{_js_expr(rng, depth + 1)}?{_js_expr(rng, depth + 1)}:{_js_expr(rng, depth + 1)}"


def _js_stmt(rng: random.Random, depth: int = 0) -> str:
    r = rng.random()
    if depth > 2 or r < 0.35:
        return rng.choice((f"var {_js_name(rng)}={_js_expr(rng)}", f"{_js_name(rng)}={_js_expr(rng)}",
                           f"return {_js_expr(rng)}", _js_expr(rng)))
    body = ";".join(_js_stmt(rng, depth + 1) for _ in range(rng.randint(1, 4)))
    if r < 0.55:
        params = ",".join(_js_name(rng) for _ in range(rng.randint(0, 3)))
        return f"function {_js_name(rng)}({params}){{{body}}}"
    if r < 0.7:
        return f"if({_js_expr(rng)}){{{body}}}else{{{_js_stmt(rng, depth + 1)}}}"
    if r < 0.8:
        i = _js_name(rng)
        return f"for(var {i}=0;{i}<{_js_name(rng)}.length;{i}++){{{body}}}"
    return f"{_js_name(rng)}.{rng.choice(JS_WORDS)}=function({_js_name(rng)}){{{body}}}"


def minified_js(rng: random.Random, n_chars: int) -> str:
    head = rng.choice(("", "!function(e,t){", "(function(){", f'/*! {rng.choice(JS_WORDS)} v{rng.randint(1, 9)}.'
                       f'{rng.randint(0, 20)}.{rng.randint(0, 9)} | MIT License */\n', '"use strict";'))
    parts = [head]
    size = len(head)
    while size < n_chars:
        stmt = _js_stmt(rng)
        parts.append(stmt + ";")
        size += len(stmt) + 1
    code = "".join(parts) + ("}();" if head.startswith("!") else "})();" if head.startswith("(") else "")
    if rng.random() < 0.25:  # some bundlers wrap at a fixed width
        width = rng.choice((500, 1000, 2000))
        code = "\n".join(code[i:i + width] for i in range(0, len(code), width))
    return code


def minified_code(rng: random.Random, sentences: list[str], in_prose: bool = True) -> str:
    """Minified JavaScript as scraped pages carry it: in prose and docs sources with a few sentences around it."""
    code = minified_js(rng, int(rng.choice((300, 800, 2000, 6000, 20000)) * rng.uniform(0.8, 1.25)))
    if not in_prose:
        return code
    before, after = _around(rng, sentences, len(code), 4, 3)
    return "\n\n".join(p for p in (before, code, after) if p)


GARBAGE: dict[str, tuple[tuple[str, ...], Callable[..., str]]] = {
    "boilerplate": (("prose", "technical_docs"), boilerplate),
    "char_soup": (("prose", "technical_docs", "legal", "code"), char_soup),
    "encoded_blob": (("prose", "technical_docs", "legal", "code"), encoded_blob),
    "minified_code": (("prose", "technical_docs", "code"), minified_code),
}


def sentences_for_garbage() -> list[str]:
    """Real sentences (from prose paragraphs on this machine) for the little text around garbage."""
    out = []
    for para in prose_paragraphs()[-400:]:
        out += [s for s in re.split(r"(?<=[.!?])\s+", para) if 40 <= len(s) <= 200]
    return out


def garbage_documents(per_cell: int, seed: int) -> Iterator[tuple[str, str, str]]:
    """(kind, profile, text) for `per_cell` documents of each kind in each profile it turns up in."""
    sentences = sentences_for_garbage()
    for kind, (profiles, make) in GARBAGE.items():
        for profile in profiles:
            rng = random.Random(f"{seed}/{kind}/{profile}")
            for _ in range(per_cell):
                if kind == "minified_code":
                    yield kind, profile, make(rng, sentences, in_prose=profile != "code")
                else:
                    yield kind, profile, make(rng, sentences)


MIN_WORDS = 30  # a clean document has at least this many words: shorter ones are the length rules' business


def clean_documents(per_source: int, seed: int) -> Iterator[tuple[str, str, list[str]]]:
    """(source, profile, texts) for each clean source kind."""
    for source, (profile, read) in CLEAN.items():
        texts = read(per_source, random.Random(f"{seed}/{source}"))
        yield source, profile, [t for t in texts if profile == "code" or len(t.split()) >= MIN_WORDS]


# ================================================================================================ evaluation


def build_profiles(config, without: set[str]) -> dict[str, list]:
    """Each profile's steps as `filter_documents` runs them (normalize, the profile, pii), minus `without`."""
    out = {}
    for name, specs in config.profiles.items():
        specs = [StepSpec(step="normalize", params=config.curation.normalize), *specs,
                 StepSpec(step="pii", params=config.curation.pii)]
        out[name] = [build_step(s.step, s.params) for s in specs if s.step not in without]
    return out


def run(docs: list[str], steps: list, label: str) -> list[str | None]:
    out: list[str | None] = []
    for i in range(0, len(docs), 1000):  # the filter stage's batch size
        batch = [Document(doc_id=f"{label}/{i + j}", source=label, text=t) for j, t in enumerate(docs[i:i + 1000])]
        out += run_steps(batch, steps, StageStats(), 0)
    return out


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.environ.get("KILN_CONFIG", "configs/default.yaml"))
    ap.add_argument("--per-source", type=int, default=400, help="clean documents per source (at most)")
    ap.add_argument("--per-cell", type=int, default=150, help="garbage documents per kind and profile")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--without", action="append", default=[], help="leave this step out of every profile")
    args = ap.parse_args()
    config = load_config(args.config)
    profiles = build_profiles(config, set(args.without))

    t0 = time.perf_counter()
    clean = list(clean_documents(args.per_source, args.seed))
    garbage: dict[tuple[str, str], list[str]] = defaultdict(list)
    for kind, profile, text in garbage_documents(args.per_cell, args.seed):
        garbage[kind, profile].append(text)
    n_docs = sum(len(t) for *_, t in clean) + sum(map(len, garbage.values()))
    print(f"corpus: {n_docs:,} documents assembled in {time.perf_counter() - t0:.1f}s "
          f"(profiles from {args.config}{'; without ' + ', '.join(args.without) if args.without else ''})\n")

    t0, failed = time.perf_counter(), []
    print(f"{'garbage kind':<15}{'profile':<16}{'docs':>6}{'caught':>9}   top reasons")
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rows = []
    for (kind, profile), texts in garbage.items():
        reasons = run(texts, profiles[profile], f"{kind}/{profile}")
        caught = sum(r is not None for r in reasons)
        by_kind[kind][0] += caught
        by_kind[kind][1] += len(texts)
        top = ", ".join(f"{r} {c}" for r, c in Counter(r for r in reasons if r).most_common(3))
        rows.append(f"{kind:<15}{profile:<16}{len(texts):>6}{caught / len(texts):>9.1%}   {top}")
    print("\n".join(rows))
    for kind, (caught, total) in by_kind.items():
        ok = caught / total >= MIN_CATCH
        failed += [] if ok else [f"{kind} caught {caught / total:.1%}"]
        print(f"{kind:<15}{'all':<16}{total:>6}{caught / total:>9.1%}   {'ok' if ok else 'BELOW 99%'}")

    print(f"\n{'clean source':<18}{'profile':<16}{'docs':>6}{'lost':>8}{'garbage.*':>11}   top reasons")
    n_clean = 0
    for source, profile, texts in clean:
        if not texts:
            print(f"{source:<18}{profile:<16}{0:>6}      -    (nothing on this machine)")
            continue
        reasons = run(texts, profiles[profile], source)
        lost = sum(r is not None for r in reasons)
        n_clean += len(texts)
        ok = lost / len(texts) <= MAX_LOSS
        failed += [] if ok else [f"{source} lost {lost / len(texts):.1%}"]
        top = ", ".join(f"{r} {c}" for r, c in Counter(r for r in reasons if r).most_common(3))
        ours = sum(r is not None and r.startswith("garbage.") for r in reasons)
        print(f"{source:<18}{profile:<16}{len(texts):>6}{lost / len(texts):>8.1%}{ours / len(texts):>11.1%}   {top}"
              f"{'' if ok else '  OVER 10%'}")
    dt = time.perf_counter() - t0
    print(f"\n{n_docs:,} documents through their profiles in {dt:.1f}s: {n_docs / dt:,.0f} docs/s on one core")
    if failed:
        print("FAILED: " + "; ".join(failed))
        return 1
    print(f"ok: every garbage kind caught >= {MIN_CATCH:.0%}, every clean source lost <= {MAX_LOSS:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
