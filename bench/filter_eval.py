"""Garbage catch rate and clean loss of the default filter profiles, on a mixed corpus assembled from this machine.

    .venv/bin/python bench/filter_eval.py [--config configs/default.yaml] [--per-source 400] [--per-cell 150]
                                          [--per-web-cell 400] [--per-group 40] [--split heldout|dev|all]
                                          [--web-profile web] [--seed 0] [--without garbage]

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

and clean technical web pages: the installed HTML documentation bench/extraction_pages.py finds (Sphinx, MkDocs,
texinfo, man, DocBook, Doxygen, gtk-doc, Node, npm, mdBook, rustdoc; at most --per-group pages per package or book),
read as a WARC or html source reads a page (kiln.curation.readers.html.extract, the default extractor, given the
whole page), through the `web` profile (the default for web pages; `prose` with a config that has none) and, for
comparison, `technical_docs` and `prose`. A page counts when the region its generator marks as content has 30 words or
more and it does not declare a language other than English. Its wrapped set (real text in boilerplate written here)
is shown on its own row, outside the web pages' total.

A clean document has at least 30 words (code: any size); C headers marked generated in their first lines are left
out (code_quality drops those by design). Garbage documents come from seeded generators, one set per kind and
profile where the kind turns up (web pages run through `web` and `prose`, scraped documentation through
`technical_docs`, ...):

    boilerplate      navigation / link-list pages: menus, breadcrumbs, footers, Markdown or bare-URL link lists
    char_soup        random printable ASCII, random letters, symbol runs, binary decoded as Latin-1 / UTF-8
    encoded_blob     base64 (MIME lines, data: URIs, PEM), hex (dumps, digests, C arrays), uuencode
    minified_code    minified JavaScript (alone in code sources)
    repeated_lines   web pages of 2-6 lines repeated 10-200 times, verbatim or with a counter, a date or a name
                     changing, in order or shuffled (comments, listings, logs, SEO spam, share bars, ...)
    stub             very short web pages: errors (404, 403, 500), login / cookie / bot-check / age walls, parked
                     domains, "enable JavaScript", placeholders, a title and one line

with real sentences around them (at most as long as the payload: the payload is what the document is).

Held out: web pages (by a hash of their path) and the repeated-line and stub families (by a hash of their name) are
split in two; rules are tuned on `--split dev` only, and the default `--split heldout` reports the other half.
Seeded and deterministic for a given machine (what is installed decides the pages); a few minutes on one core.

Every document goes through the real steps (`normalize`, the profile, `pii`: `kiln.curation.pipeline.run_steps`).
Prints the catch rate per garbage kind (and per profile; the web-page kinds count in the web profile, the others'
figures are for comparison), the clean loss per source and per web-page generator with its top drop reasons, and
docs/s. `--without garbage` runs the profiles without that step (the "before" figures). Exits 1 if a kind is caught
below 99%, a clean source loses more than 10%, or the web pages lose more than 10% in the web profile.
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

# ================================================================================================ clean web pages

# Real HTML documentation installed on the machine (bench/extraction_pages.py's page sources: Sphinx, MkDocs, texinfo,
# man, DocBook, Doxygen, gtk-doc, Node, npm, mdBook and rustdoc pages, by package or book), each page turned into text
# as a WARC or html source reads it: Kiln's main-content extraction with its default extractor, given the whole page.
# Its wrapped set (real article text in boilerplate written here) is reported on its own row.


def held_out(key: str) -> bool:
    """The held-out half: a page (by its path) or a garbage family (by its name), chosen by a hash. Rules are tuned
    on the other (dev) half only."""
    return hashlib.blake2b(key.encode(), digest_size=8).digest()[0] % 2 == 1


def _in_split(key: str, split: str) -> bool:
    return split == "all" or held_out(key) == (split == "heldout")


def _default_extractor() -> str:
    from kiln.curation.readers.html import DEFAULT_EXTRACTOR

    return DEFAULT_EXTRACTOR


def page_text(html: str, english: bool = False) -> str | None:
    """A page's main content as Kiln reads it; None when it has none (or, with `english`, when the page declares a
    language other than English: the profiles here keep English, other languages are the multilingual set's)."""
    from kiln.curation.readers.html import extract

    found = extract(html)
    if found is None or english and found.language and not found.language.startswith("en"):
        return None
    return found.text


def web_pages(per_group: int, split: str) -> dict[str, list[str]]:
    """Up to `per_group` pages of each package or book in the split (`dev`, `heldout` or `all`), as text, by
    generator (`wrapped`: the wrapped set). A page is content when the region its generator marks as content has
    MIN_WORDS words or more (fewer: a stub or a redirect by the page's own markup, neither clean nor garbage here);
    pages that declare a language other than English (rust-by-example's translations) are left out."""
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import extraction_pages as ep

    out: dict[str, list[str]] = defaultdict(list)
    for source in ep.SOURCES:
        n = 0
        for page in ep.real_pages(source, 0, Counter()):  # lazily, in the page set's hash order
            if n >= per_group:
                break
            if _in_split(page.path, split) and len(page.gold.split()) >= MIN_WORDS and \
                    (text := page_text(page.html, english=True)):
                out[source.set].append(text)
                n += 1
    wrapped = [p for p in ep.wrapped_pages(0) if _in_split(p.path, split)][:per_group * 4]
    out["wrapped"] = [t for p in wrapped if (t := page_text(p.html))]
    return dict(out)


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


# ---- web-page garbage: repeated lines and stubs. Each is built from families (line pools, stub kinds) split by a hash
# of the family's name into a dev half (what the rules were tuned on) and a held-out half (what is reported).

FIRST = ("alex", "maria", "john", "li", "fatima", "sam", "olga", "pierre", "kenji", "ana", "david", "nina", "omar")
CITIES = ("Boston", "Austin", "Denver", "Leeds", "Lyon", "Osaka", "Porto", "Perth", "Dublin", "Seattle", "Miami")
MONTHS = ("January", "February", "March", "April", "May", "June", "July", "August", "September", "October",
          "November", "December")
DAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")


def _fill(rng: random.Random, template: str) -> str:
    """A template's {placeholders} drawn afresh."""
    topic = rng.choice(TOPIC)
    values = {"t": topic, "T": topic.title(), "city": rng.choice(CITIES), "n": rng.randint(2, 99),
              "user": rng.choice(FIRST) + rng.choice(("", "_", "")) + str(rng.randint(1, 9999)),
              "name": rng.choice(FIRST).title(), "price": f"{rng.randint(3, 999)}.{rng.randint(0, 99):02d}",
              "month": rng.choice(MONTHS), "day": rng.randint(1, 28), "year": rng.randint(2009, 2026),
              "weekday": rng.choice(DAYS), "time": f"{rng.randint(0, 23):02d}:{rng.randint(0, 59):02d}",
              "date": rng.choice((f"{rng.choice(MONTHS)} {rng.randint(1, 28)}, {rng.randint(2009, 2026)}",
                                  f"{rng.randint(2009, 2026)}-{rng.randint(1, 12):02d}-{rng.randint(1, 28):02d}",
                                  f"{rng.randint(1, 28)}/{rng.randint(1, 12)}/{rng.randint(2009, 2026)}")),
              "site": rng.choice(DOMAINS), "Headline": _headline(rng), "temp": rng.randint(-10, 38),
              "ray": "".join(rng.choice("0123456789abcdef") for _ in range(16))}
    return template.format(**values)


REPEATED_FAMILIES: dict[str, tuple[str, ...]] = {
    "newsletter": ("Subscribe to our newsletter", "Get the latest {t} news delivered to your inbox.", "Sign up now",
                   "No spam, unsubscribe at any time.", "Join {n},000 readers"),
    "comments": ("{user} says:", "{date} at {time}", "Great post, thanks for sharing!", "Reply", "Nice article."),
    "post_list": ("{Headline}", "Posted on {date} by admin", "Read more »", "{n} comments", "Filed under {T}"),
    "products": ("Buy cheap {t} online", "Price: ${price}", "Add to cart", "Free shipping on orders over $50",
                 "In stock - ships in {n} days", "Rated {n} out of 5"),
    "server_log": ("{date} {time} INFO heartbeat ok", "{date} {time} DEBUG polling queue {t}",
                   "{date} {time} WARN retrying connection to db ({n}/5)", "{date} {time} INFO request served"),
    "seo_spam": ("best {t} in {city}", "cheap {t} {city}", "{t} near me", "top rated {t} {year}",
                 "{t} deals {city} {year}"),
    "loading": ("Loading...", "Please wait while the page loads.", "Retrying in {n} seconds", "Still loading"),
    "calendar": ("{weekday}, {month} {day}", "No events scheduled", "View calendar", "Add to my calendar"),
    "share_bar": ("Share on Facebook", "Share on Twitter", "Tweet", "Pin it", "Email this", "Print"),
    "forum": ("Re: {Headline}", "Quote", "Posted by {user} » {date}", "Top", "Report this post"),
    "php_errors": ("Warning: mysqli_connect(): (HY000/2002): Connection refused in /var/www/html/{t}.php on line {n}",
                   "Notice: Undefined index: {t} in /var/www/html/index.php on line {n}",
                   "Deprecated: Function create_function() is deprecated in /var/www/html/lib.php on line {n}"),
    "weather": ("{city}: {temp}°C, partly cloudy", "Wind {n} km/h", "Humidity {n}%", "Updated {time}"),
    "sentences": (),  # real sentences from the machine's prose, each repeated
    "headlines": ("{Headline}", "{Headline}", "{Headline}"),
}


def repeated_lines(rng: random.Random, sentences: list[str], family: str) -> str:
    """A page made of 2-6 distinct lines repeated 10-200 times, in order or shuffled, verbatim or with a counter,
    a date or a name changing between repeats; sometimes under a title and over a footer."""
    pool = REPEATED_FAMILIES[family] or tuple(rng.sample(sentences, 6))
    k = rng.randint(2, min(6, len(pool)))
    templates = rng.sample(pool, k)
    repeats = int(round(10 * 20 ** rng.random()))  # 10-200, log-uniform
    vary = rng.choice(("none", "fields", "counter", "date"))
    fixed = [_fill(rng, t) for t in templates]
    lines = []
    for i in range(repeats):
        block = [_fill(rng, t) for t in templates] if vary == "fields" else list(fixed)
        if vary == "counter":
            block[0] = rng.choice((f"{i + 1}. {block[0]}", f"{block[0]} ({i + 1})", f"#{i + 1} {block[0]}",
                                   f"Page {i + 1} of {repeats}: {block[0]}"))
        elif vary == "date":
            block[0] = f"{_fill(rng, '{date}')} {block[0]}"
        lines += block
    if rng.random() < 0.3:
        rng.shuffle(lines)
    if rng.random() < 0.4:
        lines.insert(0, _headline(rng))
    if rng.random() < 0.3:
        lines.append(f"© {rng.randint(2005, 2026)} {rng.choice(DOMAINS)}. {FOOTER[0]}")
    return rng.choice(("\n", "\n\n")).join(lines)


STUB_FAMILIES: dict[str, tuple[tuple[str, ...], ...]] = {  # variants, each a few lines
    "not_found": (("404 Not Found", "The requested URL was not found on this server."),
                  ("Page not found", "Sorry, the page you are looking for does not exist or has been moved.",
                   "Go to homepage"),
                  ("Oops! That page can’t be found.", "It looks like nothing was found at this location. "
                   "Maybe try a search?"),),
    "enable_js": (("You need to enable JavaScript to run this app.",),
                  ("{T} | {site}", "JavaScript is disabled in your browser. Please enable JavaScript to view this "
                   "site."),
                  ("This site requires JavaScript.", "Please turn on JavaScript and reload the page."),),
    "login_wall": (("Sign in", "Email", "Password", "Remember me", "Forgot your password?",
                    "Don't have an account? Sign up"),
                   ("Log in to continue to {site}", "Username or email address", "Password", "Log in",
                    "New here? Create an account."),
                   ("Members only", "You must be logged in to view this page.", "Log in | Register"),),
    "parked_domain": (("{site}", "This domain is for sale!", "Buy this domain", "Related searches",
                       "{T} Deals", "Cheap {T}", "{T} Online"),
                      ("{site} is parked free, courtesy of a domain registrar.", "Get this domain"),
                      ("The domain {site} may be for sale. Click here to inquire about this domain.",),),
    "access_denied": (("403 Forbidden", "You don't have permission to access this resource."),
                      ("Access Denied", "You don't have permission to access \"http://{site}/\" on this server.",
                       "Reference #18.{ray}"),),
    "bot_check": (("Checking your browser before accessing {site}.", "This process is automatic. Your browser will "
                   "redirect to your requested content shortly.", "Please allow up to 5 seconds…",
                   "Ray ID: {ray}"),
                  ("Just a moment...", "Verify you are human by completing the action below.",
                   "{site} needs to review the security of your connection before proceeding."),),
    "coming_soon": (("Coming soon", "Our new website is under construction. Stay tuned!"),
                    ("{T} Co.", "We're launching soon.", "Enter your email to be notified.", "Notify me"),),
    "maintenance": (("We'll be back soon!", "Sorry for the inconvenience but we're performing some maintenance at "
                     "the moment. We'll be back online shortly!", "— The Team"),
                    ("Site under maintenance", "Please check back later."),),
    "paywall": (("{Headline}", "Subscribe to continue reading.", "You have reached your limit of free articles "
                 "this month."),
                ("{Headline}", "This article is for subscribers only.", "Already a subscriber? Sign in"),),
    "cookie_wall": (("We value your privacy", "We and our partners use cookies to store and access information on "
                     "your device for personalised ads and content, ad and content measurement and audience "
                     "insights.", "Accept all", "Reject all", "Manage preferences"),
                    ("This website uses cookies to ensure you get the best experience.", "Got it!",
                     "Learn more"),),
    "age_gate": (("Are you 18 or older?", "You must be of legal age to enter this site.", "Yes", "No"),
                 ("Please verify your age", "Enter your date of birth", "Month", "Day", "Year", "Enter"),),
    "moved": (("Moved Permanently", "The document has moved here."),
              ("Redirecting…", "If you are not redirected automatically, follow this link to the new page."),),
    "server_error": (("500 Internal Server Error", "The server encountered an internal error or misconfiguration "
                      "and was unable to complete your request.", "Apache/2.4.41 (Ubuntu) Server at {site} Port 80"),
                     ("502 Bad Gateway", "nginx"),
                     ("Service Unavailable", "The server is temporarily unable to service your request due to "
                      "maintenance downtime or capacity problems. Please try again later."),),
    "suspended": (("Account Suspended", "This account has been suspended.",
                   "Contact your hosting provider for more information."),),
    "default_page": (("Welcome to nginx!", "If you see this page, the nginx web server is successfully installed "
                      "and working. Further configuration is required.", "Thank you for using nginx."),
                     ("It works!",),
                     ("Apache2 Debian Default Page", "It works!"),),
    "empty_results": (("Search results for \"{t}\"", "No results found.", "Try different keywords."),
                      ("Your cart is empty", "Continue shopping"),
                      ("{T}", "There are no posts in this category yet."),),
    "title_and_line": (("{Headline}", "@sentence"),
                       ("{T} - {site}", "@sentence"),
                       ("{Headline}", "{date}"),),
    "media_only": (("{Headline}", "Watch later", "Share", "0:00 / {n}:{day}",
                    "Your browser does not support the video tag."),
                   ("{T} gallery", "Photo 1 of {n}", "Previous", "Next"),),
}


def stub(rng: random.Random, sentences: list[str], family: str) -> str:
    """A very short page that is not content: an error, a wall (login, cookies, paywall, bot check, age), a parked
    domain, a placeholder, or a title and one line; sometimes with a site name over it and a footer under it."""
    lines = [rng.choice(sentences) if t == "@sentence" else _fill(rng, t)
             for t in rng.choice(STUB_FAMILIES[family])]
    if rng.random() < 0.3:
        lines.insert(0, rng.choice(DOMAINS))
    if rng.random() < 0.3:
        lines.append(rng.choice((f"© {rng.randint(2005, 2026)} {rng.choice(DOMAINS)}", "Privacy Policy | Terms",
                                 "Powered by WordPress", "Home")))
    return "\n".join(lines)


def family_documents(families: dict, make: Callable[..., str], n: int, rng: random.Random, sentences: list[str],
                     split: str) -> list[str]:
    """`n` documents from the families of the split, in turn."""
    names = [f for f in sorted(families) if _in_split(f, split)]
    return [make(rng, sentences, names[i % len(names)]) for i in range(n)]


WEB = "web"  # the default profile for web pages (WARC and html sources), when the config has it
GARBAGE: dict[str, tuple[tuple[str, ...], Callable[..., str]]] = {
    "boilerplate": ((WEB, "prose", "technical_docs"), boilerplate),
    "char_soup": ((WEB, "prose", "technical_docs", "legal", "code"), char_soup),
    "encoded_blob": ((WEB, "prose", "technical_docs", "legal", "code"), encoded_blob),
    "minified_code": ((WEB, "prose", "technical_docs", "code"), minified_code),
}
# Web-page kinds, from families split into dev and held-out halves.
WEB_GARBAGE: dict[str, tuple[tuple[str, ...], dict, Callable[..., str]]] = {
    "repeated_lines": ((WEB, "prose", "technical_docs"), REPEATED_FAMILIES, repeated_lines),
    "stub": ((WEB, "prose", "technical_docs"), STUB_FAMILIES, stub),
}


def sentences_for_garbage() -> list[str]:
    """Real sentences (from prose paragraphs on this machine) for the little text around garbage."""
    out = []
    for para in prose_paragraphs()[-400:]:
        out += [s for s in re.split(r"(?<=[.!?])\s+", para) if 40 <= len(s) <= 200]
    return out


def garbage_documents(per_cell: int, seed: int, per_web_cell: int = 0, split: str = "heldout",
                      profiles: set[str] | None = None) -> Iterator[tuple[str, str, str]]:
    """(kind, profile, text) for `per_cell` documents of each kind in each profile it turns up in (of `profiles`,
    when given), and `per_web_cell` of each web-page kind from the families of `split`."""
    sentences = sentences_for_garbage()
    for kind, (kind_profiles, make) in GARBAGE.items():
        for profile in kind_profiles:
            if profiles is not None and profile not in profiles:
                continue
            rng = random.Random(f"{seed}/{kind}/{profile}")
            for _ in range(per_cell):
                if kind == "minified_code":
                    yield kind, profile, make(rng, sentences, in_prose=profile != "code")
                else:
                    yield kind, profile, make(rng, sentences)
    for kind, (kind_profiles, families, make) in WEB_GARBAGE.items():
        for profile in kind_profiles:
            if profiles is None or profile in profiles:
                rng = random.Random(f"{seed}/{kind}/{profile}/{split}")
                for text in family_documents(families, make, per_web_cell, rng, sentences, split):
                    yield kind, profile, text


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


def _top(reasons: list[str | None], n: int = 3) -> str:
    return ", ".join(f"{r} {c}" for r, c in Counter(r for r in reasons if r).most_common(n))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--config", default=os.environ.get("KILN_CONFIG", "configs/default.yaml"))
    ap.add_argument("--per-source", type=int, default=400, help="clean documents per source (at most)")
    ap.add_argument("--per-cell", type=int, default=150, help="garbage documents per kind and profile")
    ap.add_argument("--per-web-cell", type=int, default=400,
                    help="documents per web-page garbage kind (repeated lines, stubs) and profile")
    ap.add_argument("--per-group", type=int, default=40,
                    help="clean web pages per package or book (at most; the wrapped set: 4 times as many)")
    ap.add_argument("--split", choices=("heldout", "dev", "all"), default="heldout",
                    help="which half of the web pages and web-page garbage families (tune on dev only)")
    ap.add_argument("--web-profile", default=None,
                    help=f"the profile web pages get (default: '{WEB}' if the config has it, else 'prose')")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--without", action="append", default=[], help="leave this step out of every profile")
    args = ap.parse_args()
    config = load_config(args.config)
    profiles = build_profiles(config, set(args.without))
    web = args.web_profile or (WEB if WEB in profiles else "prose")
    if web not in profiles:
        ap.error(f"--web-profile {web!r} is not a profile of {args.config}; it has {', '.join(profiles)}")

    t0 = time.perf_counter()
    clean = list(clean_documents(args.per_source, args.seed))
    pages = web_pages(args.per_group, args.split)
    garbage: dict[tuple[str, str], list[str]] = defaultdict(list)
    for kind, profile, text in garbage_documents(args.per_cell, args.seed, args.per_web_cell, args.split,
                                                 set(profiles)):
        garbage[kind, profile].append(text)
    n_docs = sum(len(t) for *_, t in clean) + sum(map(len, garbage.values())) + sum(map(len, pages.values()))
    print(f"corpus: {n_docs:,} documents assembled in {time.perf_counter() - t0:.1f}s "
          f"(profiles from {args.config}{'; without ' + ', '.join(args.without) if args.without else ''})")
    print(f"web pages and web-page garbage families: the {args.split} half "
          f"({'held out: no rule was tuned on it' if args.split == 'heldout' else 'rules may be tuned on it'}); "
          f"web pages are run through '{web}' (the default profile for web pages) and, for comparison, "
          f"'technical_docs' and 'prose'; pages turned into text by Kiln's main-content extraction "
          f"(kiln.curation.readers.html.extract, its default extractor: {_default_extractor()})\n")

    t0, failed = time.perf_counter(), []
    print(f"{'garbage kind':<15}{'profile':<16}{'docs':>6}{'caught':>9}   top reasons")
    by_kind: dict[str, list[int]] = defaultdict(lambda: [0, 0])
    rows = []
    for (kind, profile), texts in garbage.items():
        reasons = run(texts, profiles[profile], f"{kind}/{profile}")
        caught = sum(r is not None for r in reasons)
        if kind in WEB_GARBAGE and profile != web:  # the other profiles' figures on web garbage are for comparison
            rows.append(f"{kind:<15}{profile:<16}{len(texts):>6}{caught / len(texts):>9.1%}   {_top(reasons)}"
                        "   (comparison)")
            continue
        by_kind[kind][0] += caught
        by_kind[kind][1] += len(texts)
        rows.append(f"{kind:<15}{profile:<16}{len(texts):>6}{caught / len(texts):>9.1%}   {_top(reasons)}")
    print("\n".join(rows))
    for kind, (caught, total) in by_kind.items():
        ok = caught / total >= MIN_CATCH
        failed += [] if ok else [f"{kind} caught {caught / total:.1%}"]
        print(f"{kind:<15}{'all':<16}{total:>6}{caught / total:>9.1%}   {'ok' if ok else 'BELOW 99%'}")

    print(f"\n{'clean source':<18}{'profile':<16}{'docs':>6}{'lost':>8}{'garbage.*':>11}   top reasons")
    for source, profile, texts in clean:
        if not texts:
            print(f"{source:<18}{profile:<16}{0:>6}      -    (nothing on this machine)")
            continue
        reasons = run(texts, profiles[profile], source)
        lost = sum(r is not None for r in reasons)
        ok = lost / len(texts) <= MAX_LOSS
        failed += [] if ok else [f"{source} lost {lost / len(texts):.1%}"]
        ours = sum(r is not None and r.startswith("garbage.") for r in reasons)
        print(f"{source:<18}{profile:<16}{len(texts):>6}{lost / len(texts):>8.1%}{ours / len(texts):>11.1%}   "
              f"{_top(reasons)}{'' if ok else '  OVER 10%'}")

    print(f"\n{'web pages':<18}{'profile':<16}{'docs':>6}{'lost':>8}{'garbage.*':>11}   top reasons "
          f"({args.split} half)")
    for profile in dict.fromkeys((web, "technical_docs", "prose")):
        if profile not in profiles:
            continue
        everything: list[str | None] = []
        for site, texts in pages.items():
            if not texts:
                print(f"{site:<18}{profile:<16}{0:>6}      -    (nothing on this machine)")
                continue
            reasons = run(texts, profiles[profile], f"web/{site}")
            everything += reasons if site != "wrapped" else []  # the goal is on pages nobody here wrote
            lost = sum(r is not None for r in reasons)
            ours = sum(r is not None and r.startswith("garbage.") for r in reasons)
            print(f"{site:<18}{profile:<16}{len(texts):>6}{lost / len(texts):>8.1%}{ours / len(texts):>11.1%}   "
                  f"{_top(reasons)}")
        lost = sum(r is not None for r in everything)
        ok = lost / max(len(everything), 1) <= MAX_LOSS
        label = "real web pages"
        if profile == web:
            failed += [] if ok else [f"web pages lost {lost / max(len(everything), 1):.1%} in '{web}'"]
        ours = sum(r is not None and r.startswith("garbage.") for r in everything)
        print(f"{label:<18}{profile:<16}{len(everything):>6}{lost / max(len(everything), 1):>8.1%}"
              f"{ours / max(len(everything), 1):>11.1%}   {_top(everything)}"
              f"{'' if profile != web else '   ok' if ok else '   OVER 10%'}\n")
    dt = time.perf_counter() - t0
    print(f"{n_docs:,} documents through their profiles in {dt:.1f}s: {n_docs / dt:,.0f} docs/s on one core")
    if failed:
        print("FAILED: " + "; ".join(failed))
        return 1
    print(f"ok: every garbage kind caught >= {MIN_CATCH:.0%} (web-page kinds in '{web}'), every clean source and "
          f"the web pages in '{web}' lost <= {MAX_LOSS:.0%}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
