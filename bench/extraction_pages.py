"""Page sets for bench/extraction_bench.py: real HTML pages installed on this machine, each with a gold main-content
text taken from the region its generator marks as the page's content, and a wrapped set of real article text put
into boilerplate written here (nav bar, cookie banner, sidebar, related links, share buttons, comments, footer).

Nothing is downloaded at run time; a set whose files are not installed is empty (and reported so). The Debian
packages that hold the real pages (see SETS below) are installed by `.ci/run`.

Gold rule, for every generator: the text of the marked region, minus what is never shown (script, style, noscript,
template, [hidden], display:none) and minus the chrome the generator itself puts inside that region (navigation
it marks as such: role=navigation, <nav>, prev/next button bars, navigation tables). Everything the page's author
wrote stays in the gold: code blocks, tables, admonitions, API signatures, and in-page tables of contents
(Sphinx toctrees, texinfo menus), which are part of the document source. Words are `\\w+` runs of the lowercased
text (Python's Unicode `re`), as scrapinghub's article-extraction-benchmark tokenizes (`evaluate.py`, _TOKEN_RE).
The extractor is given the whole page and never the marker.
"""

from __future__ import annotations

import hashlib
import html as htmllib
import random
import re
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import lxml.html

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.curation.readers.html import decode_html  # noqa: E402

MAN_ARTICLES = 220  # man pages wrapped, beside Python's 79 reference topics
MIN_GOLD_WORDS = 20  # a page whose marked region has fewer words is a stub or redirect, not an article
_WORD = re.compile(r"\w+")


def words(text: str) -> list[str]:
    """Word tokens as scored: `\\w+` runs of the lowercased text."""
    return _WORD.findall(text.lower())


@dataclass
class Page:
    set: str  # sphinx, texinfo, docbook, gtkdoc, doxygen, man, mdbook, rustdoc, nodejs, npm, wrapped
    group: str  # the package / book / template within the set
    path: str  # where it comes from (a file, or the article wrapped)
    html: str
    gold: str
    marker: str  # how the gold region was found
    # words of the gold by page part (code, table, ...) and of the text outside it (nav, sidebar, footer, ...),
    # for the loss analysis only: the score uses `gold` alone
    inside: dict[str, Counter] = field(default_factory=dict)
    outside: dict[str, Counter] = field(default_factory=dict)


# ============================================================================================ region text

_INVISIBLE = {"script", "style", "noscript", "template", "head"}
_BLOCK = {"address", "article", "aside", "blockquote", "br", "caption", "dd", "details", "dialog", "div", "dl", "dt",
          "fieldset", "figcaption", "figure", "footer", "form", "h1", "h2", "h3", "h4", "h5", "h6", "header", "hr",
          "li", "main", "nav", "ol", "p", "pre", "section", "summary", "table", "tbody", "td", "tfoot", "th", "thead",
          "tr", "ul", "body", "html", "button", "option", "select", "textarea", "label", "input", "title"}
_DISPLAY_NONE = re.compile(r"display\s*:\s*none", re.IGNORECASE)


def _hidden(el) -> bool:
    return el.tag in _INVISIBLE or el.get("hidden") is not None or bool(_DISPLAY_NONE.search(el.get("style") or ""))


def region_text(roots, drop=()) -> str:
    """Visible text of the elements `roots` (in order), leaving out the subtrees in `drop`; block elements break
    words apart (`<p>a</p><p>b</p>` is "a b", never "ab"), inline ones do not."""
    dropped = set(drop)
    parts: list[str] = []

    def walk(el) -> None:
        if not isinstance(el.tag, str) or el in dropped or _hidden(el):
            return
        block = el.tag in _BLOCK
        if block:
            parts.append("\n")
        if el.text:
            parts.append(el.text)
        for child in el:
            walk(child)
            if child.tail:
                parts.append(child.tail)
        if block:
            parts.append("\n")

    for root in roots:
        walk(root)
    return "\n".join(" ".join(line.split()) for line in "".join(parts).splitlines() if line.strip())


def _labelled_words(roots, drop, label_of: Callable) -> dict[str, Counter]:
    """Words of the visible text under `roots` by label: `label_of(el)` names a part (or None to inherit); the
    outermost labelled element decides (a table inside an admonition counts as admonition)."""
    dropped = set(drop)
    out: dict[str, Counter] = {}

    def add(label: str, text: str | None) -> None:
        if text and (ws := words(text)):
            out.setdefault(label, Counter()).update(ws)

    def walk(el, label: str) -> None:
        if not isinstance(el.tag, str) or el in dropped or _hidden(el):
            return
        if label == "text":
            label = label_of(el) or label
        add(label, el.text)
        for child in el:
            walk(child, label)
            add(label, child.tail)

    for root in roots:
        walk(root, "text")
    return out


def _classes(el) -> set[str]:
    return set((el.get("class") or "").split())


def _inside_label(el) -> str | None:
    """The page part a gold element belongs to, for the loss analysis (outermost labelled part wins)."""
    tag, cls = el.tag, _classes(el)
    if tag == "pre" or any(c.startswith("highlight") for c in cls) or "programlisting" in cls or "fragment" in cls:
        return "code"
    if tag == "table" and not cls & {"menu", "navigation", "nav"}:
        return "table"
    if cls & {"admonition", "note", "warning", "seealso", "versionadded", "versionchanged", "deprecated", "tip",
              "important", "caution", "hint", "attention", "danger", "error", "api_stability", "api_metadata"}:
        return "admonition"
    if cls & {"toctree-wrapper", "menu", "toc", "mini-toc", "contents", "summary"}:
        return "toc"
    if tag == "dt":
        return "signature"
    if tag in ("h1", "h2", "h3", "h4", "h5", "h6"):
        return "heading"
    return None


_OUTSIDE_KEYS = (("cookie", ("cookie", "consent", "gdpr")), ("comments", ("comment", "disqus", "reply")),
                 ("share", ("share", "social")), ("related", ("related", "prev-next", "navfooter", "navheader")),
                 ("sidebar", ("sidebar", "aside", "wy-nav-side", "bd-sidebar")),
                 ("nav", ("nav", "menu", "breadcrumb", "toc", "search")), ("footer", ("footer", "ft", "copyright")),
                 ("header", ("header", "hd", "banner", "top", "masthead", "titlearea")))


def _outside_label(el) -> str | None:
    """The page part of text outside the gold, from the element's tag, role, class and id (first key found)."""
    attrs = " ".join((el.tag, el.get("role") or "", el.get("class") or "", el.get("id") or "")).lower()
    for label, keys in _OUTSIDE_KEYS:
        if any(k in attrs for k in keys):
            return label
    return None


# ============================================================================================ gold regions

def _x(tree, xpath: str) -> list:
    return tree.xpath(xpath)


def _cls(name: str) -> str:
    return f"contains(concat(' ', normalize-space(@class), ' '), ' {name} ')"


# Theme chrome inside a marked region: the theme's own navigation, never the author's text
_CHROME = f".//*[@role='navigation'] | .//nav | .//div[{_cls('prev-next-area')}] | .//div[{_cls('rst-footer-buttons')}]"

# Sphinx themes mark the content differently; first match wins: sphinx_rtd_theme (itemprop=articleBody inside
# role=main, with breadcrumbs and footer buttons beside it), pydata/furo/classic/alabaster/pydoctheme (role=main),
# djangodocs (div#yui-main: the theme has no role=main), older themes (div.body)
SPHINX_MARKERS = (
    ("itemprop=articleBody", "//*[@itemprop='articleBody']"),
    ("role=main", "//*[@role='main']"),
    ("div#yui-main", "//div[@id='yui-main']"),
    ("div.body", f"//div[{_cls('body')}]"),
)


def sphinx_gold(tree) -> tuple[str, list, list] | None:
    for marker, xpath in SPHINX_MARKERS:
        found = _x(tree, xpath)
        if found:
            return marker, found[:1], _x(found[0], _CHROME)
    return None


def _body(tree) -> list:
    return _x(tree, "//body")[:1]


def texinfo_gold(tree):
    """makeinfo (div.header / div.nav-panel hold the node navigation) or texi2html 1.78 (navigation tables of
    [ << ] [ >> ] buttons, a 'This document was generated' trailer): the body minus those."""
    body = _body(tree)
    if not body:
        return None
    if _x(tree, f"//div[{_cls('header')} or {_cls('nav-panel')}]"):
        nav = _x(tree, f"//div[{_cls('header')} or {_cls('nav-panel')}]")
        return "makeinfo: body - div.header/nav-panel", body, nav
    nav = [t for t in _x(tree, "//table[not(@class)]")
           if (cells := [" ".join(td.text_content().split()) for td in t.iter("td")])
           and all(c in ("", "\xa0") or (c.startswith("[") and c.endswith("]")) for c in cells)]
    trailer = _x(tree, "//p[font[@size='-2'] and contains(., 'This document was generated')]")
    return "texi2html: body - nav tables - trailer", body, nav + trailer


def docbook_gold(tree):
    """DocBook XSL (valgrind, libsigc++ tutorial): the body minus its navheader/navfooter (and valgrind's table.nav)."""
    body = _body(tree)
    drop = _x(tree, f"//div[{_cls('navheader')} or {_cls('navfooter')}] | //table[{_cls('nav')}]")
    return ("docbook: body - navheader/navfooter", body, drop) if body else None


def gtkdoc_gold(tree):
    """gtk-doc: the body minus table.navigation (Top | Description, home/up/prev/next) and div.footer."""
    body = _body(tree)
    drop = _x(tree, f"//table[{_cls('navigation')}] | //div[{_cls('footer')}]")
    return ("gtk-doc: body - table.navigation - div.footer", body, drop) if body else None


def doxygen_gold(tree):
    """Doxygen: div.headertitle (the page title) and div.contents; the top bar, member summary links, search and
    the 'Generated by' footer are outside them."""
    found = _x(tree, f"//div[{_cls('headertitle')}]")[:1] + _x(tree, f"//div[{_cls('contents')}]")[:1]
    return ("doxygen: div.headertitle + div.contents", found, []) if found else None


def groff_gold(tree):
    """groff -Thtml man pages: the body minus the index of section links before the first <hr>."""
    body = _body(tree)
    if not body:
        return None
    drop = []
    for child in body[0]:
        if child.tag == "hr":
            break
        if child.tag == "a" and (child.get("href") or "").startswith("#"):
            drop.append(child)
    return "groff: body - section index", body, drop


def marked_gold(xpath: str, name: str, minus: str = "") -> Callable:
    def gold(tree):
        found = _x(tree, xpath)[:1]
        return (name, found, (_x(found[0], minus) if minus else []) + _x(found[0], _CHROME)) if found else None
    return gold


# ============================================================================================ page sources

DOC = Path("/usr/share/doc")
RUST = next(iter(sorted(Path.home().glob(".rustup/toolchains/stable-*/share/doc/rust/html"))), None)
# Generated listings and indexes are navigation, not content: Sphinx's genindex/search/module index/_modules
# (highlighted source), rustdoc's all-items and module index pages, 404s
_NOT_CONTENT = re.compile(r"(^|/)(genindex[^/]*|search|py-modindex|modindex|np-modindex|404|not_found|all|"
                          r"index-\w+|sitemap|print|toc)\.html$|(^|/)(_modules|_static|_sources|_images|src)/")


@dataclass(frozen=True)
class Source:
    set: str
    group: str
    root: Path
    gold: Callable
    pattern: str = "**/*.html"
    keep: Callable[[str], bool] = lambda rel: True


def _sphinx(group: str, root: Path) -> Source:
    return Source("sphinx", group, root, sphinx_gold)


SOURCES: tuple[Source, ...] = (
    # Sphinx, by theme: pydoctheme (python3-doc), djangodocs (python-django-doc), sphinx13 (sphinx-doc), the
    # Pallets theme (python-flask-doc, python-jinja2-doc), alabaster (python-requests-doc), sphinx_rtd_theme
    # (python-tornado-doc), pydata-sphinx-theme (groonga-doc, English half), mkdocs-nature (python-markdown-doc,
    # MkDocs with a Sphinx-like theme: same role=main marker, its own set)
    *(_sphinx("python3-doc", p) for p in sorted(DOC.glob("python3.*/html"))[:1]),
    _sphinx("python-django-doc", DOC / "python-django-doc/html"),
    _sphinx("sphinx-doc", DOC / "sphinx-doc/html"),
    _sphinx("python-flask-doc", DOC / "python-flask-doc/html"),
    _sphinx("python-jinja2-doc", DOC / "python-jinja2-doc/html"),
    _sphinx("python-requests-doc", DOC / "python-requests-doc/html"),
    _sphinx("python-tornado-doc", DOC / "python-tornado-doc/html"),
    _sphinx("groonga-doc", DOC / "groonga-doc/en/html"),
    Source("mkdocs", "python-markdown-doc", DOC / "python-markdown-doc/docs", sphinx_gold),
    Source("texinfo", "octave-doc", DOC / "octave/octave.html", texinfo_gold),
    Source("texinfo", "liboctave", DOC / "octave/liboctave.html", texinfo_gold),
    Source("texinfo", "gettext-doc", DOC / "gettext", texinfo_gold, "gettext_*.html",
           lambda rel: rel not in ("gettext_abt.html", "gettext_toc.html", "gettext_fot.html")),
    Source("man", "gettext-doc", DOC / "gettext", groff_gold, "*.[0-9].html"),
    Source("docbook", "valgrind", DOC / "valgrind/html", docbook_gold),
    Source("docbook", "libsigc++-2.0-doc", DOC / "libsigc++-2.0-doc/tutorial/html", docbook_gold),
    Source("doxygen", "libsigc++-2.0-doc", DOC / "libsigc++-2.0-doc/reference/html", doxygen_gold,
           keep=lambda rel: not re.search(r"(-members|^files|^annotated|^hierarchy|^functions.*|^globals.*|"
                                          r"^namespacemembers.*|^classes|^modules|^inherits|_source)\.html$", rel)),
    Source("gtkdoc", "libglib2.0-doc", Path("/usr/share/gtk-doc/html"), gtkdoc_gold,
           keep=lambda rel: not re.search(r"(^|/)(index|api-index-.*|annotation-glossary|deprecated-api-index|"
                                          r".*-hierarchy)\.html$", rel)),
    Source("gtkdoc", "gnutls-doc", DOC / "gnutls-doc/api-reference", gtkdoc_gold),
    Source("nodejs", "nodejs", DOC / "nodejs/api", marked_gold("//*[@id='apicontent']", "node: div#apicontent")),
    Source("npm", "npm", Path("/usr/lib/node_modules/npm/docs/output"),
           marked_gold("//section[@id='content']", "npm: section#content - toc - edit footer",
                       ".//section[@id='table_of_contents'] | .//footer[@id='edit']")),
    *(Source("mdbook", f"rust-{b}", RUST / b, marked_gold("//main", "mdbook: <main>"))
      for b in ("book", "reference", "cargo", "nomicon", "rust-by-example", "rustc", "edition-guide",
                "embedded-book", "rustdoc", "unstable-book") if RUST),
    *(Source("rustdoc", f"rust-{c}", RUST / c, marked_gold("//section[@id='main-content']",
                                                          "rustdoc: section#main-content"))
      for c in ("std", "core", "alloc", "proc_macro") if RUST),
)

SETS = ("sphinx", "mkdocs", "texinfo", "man", "docbook", "doxygen", "gtkdoc", "nodejs", "npm", "mdbook", "rustdoc",
        "wrapped")


def _order(key: str) -> bytes:
    return hashlib.sha256(key.encode()).digest()


def _files(source: Source) -> list[tuple[str, Path]]:
    """(relative path, file) of a source's candidate pages, in hash order (a fixed pseudo-random sample)."""
    if not source.root.is_dir():
        return []
    seen, out = set(), []
    for path in source.root.glob(source.pattern):
        rel = path.relative_to(source.root).as_posix()
        real = path.resolve()
        if not path.is_file() or real in seen or _NOT_CONTENT.search(rel) or not source.keep(rel):
            continue
        seen.add(real)
        out.append((rel, path))
    return sorted(out, key=lambda item: _order(f"{source.group}/{item[0]}"))


_XML_DECL = re.compile(r"^\s*<\?xml[^>]*\?>")


def parse(html: str):
    return lxml.html.document_fromstring(_XML_DECL.sub("", html, count=1) or "<html></html>")


def gold_of(html: str, gold_fn: Callable) -> tuple[str, str, dict, dict] | None:
    """(marker, gold text, words by page part inside it, words by page part outside it) or None if the page has
    no marked region."""
    tree = parse(html)
    found = gold_fn(tree)
    if not found or not found[1]:
        return None
    marker, roots, drop = found
    text = region_text(roots, drop)
    inside = _labelled_words(roots, drop, _inside_label)
    # outside: every visible element of the body not in the gold, labelled by its nearest named ancestor part
    gold_ids = {id(r) for r in roots}
    body = _body(tree)
    outside: dict[str, Counter] = {}
    if body:
        def walk(el, label: str, in_gold: bool) -> None:
            if not isinstance(el.tag, str) or _hidden(el):
                return
            in_gold_here = (in_gold or id(el) in gold_ids) and el not in drop
            label = _outside_label(el) or label
            if el.text and not in_gold_here and (ws := words(el.text)):
                outside.setdefault(label, Counter()).update(ws)
            for child in el:
                walk(child, label, in_gold_here)
                if child.tail and not in_gold_here and (ws := words(child.tail)):
                    outside.setdefault(label, Counter()).update(ws)
        drop = set(drop)
        walk(body[0], "other", False)
    return marker, text, inside, outside


def real_pages(source: Source, limit: int, skipped: Counter) -> Iterator[Page]:
    """Up to `limit` pages (0: all) of a source with a gold of at least MIN_GOLD_WORDS words, in hash order;
    the others are counted in `skipped` by reason."""
    n = 0
    for rel, path in _files(source):
        if limit and n >= limit:
            return
        html, why = decode_html(path.read_bytes())
        if html is None:
            skipped[f"{source.set}/{source.group}: undecodable"] += 1
            continue
        found = gold_of(html, source.gold)
        if found is None:
            skipped[f"{source.set}/{source.group}: no marked region"] += 1
            continue
        marker, gold, inside, outside = found
        if len(words(gold)) < MIN_GOLD_WORDS:
            skipped[f"{source.set}/{source.group}: gold under {MIN_GOLD_WORDS} words"] += 1
            continue
        n += 1
        yield Page(source.set, source.group, str(path), html, gold, marker, inside, outside)


# ============================================================================================ wrapped set

def _articles() -> list[tuple[str, str, str]]:
    """(id, title, body text) of real articles: Python's reference topics (pydoc_data) and man pages (rendered
    from troff by bench/filter_eval.py's render_man), in hash order."""
    from pydoc_data.topics import topics

    out = []
    for key, text in topics.items():
        lines = text.strip("\n").split("\n")
        if len(lines) > 2 and set(lines[1]) <= set("*=-"):
            out.append((f"pydoc_topics/{key}", lines[0].strip(), "\n".join(lines[2:])))
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from filter_eval import _man_page  # one troff renderer for the benches

    man = Path("/usr/share/man/man1")
    pages = sorted((p for p in man.glob("*.1.gz") if not p.is_symlink()), key=lambda p: _order(p.name)) \
        if man.is_dir() else []
    families: Counter = Counter()
    n_man = 0
    for p in pages:
        # at most 3 pages per command family (gcloud alone installs thousands of near-identical pages)
        family = re.split(r"[-_.]", p.name, maxsplit=1)[0]
        if families[family] >= 3 or n_man >= MAN_ARTICLES:
            continue
        text = _man_page(p)
        if text and 150 <= len(text.split()) <= 6000:
            families[family] += 1
            n_man += 1
            out.append((f"man1/{p.name}", p.name.removesuffix(".1.gz") + "(1)", text))
    return sorted(out, key=lambda a: _order(a[0]))


def _article_html(title: str, body: str, rng: random.Random) -> str:
    """An article's text as HTML: indented blocks as <pre>, short capitalised lines as headings, the rest as
    paragraphs; its words are exactly the title's and the body's."""
    blocks = [b for b in re.split(r"\n\s*\n", body) if b.strip()]
    h1 = rng.choice(("<h1>", '<h1 class="entry-title">', '<h1 class="post-title">', '<h1 itemprop="headline">'))
    out = [f"{h1}{htmllib.escape(title)}</h1>"]
    for block in blocks:
        lines = block.split("\n")
        if all(line[:1].isspace() for line in lines if line.strip()):
            out.append(f"<pre><code>{htmllib.escape(block)}</code></pre>")
        elif (len(lines) == 1 and len(block.split()) <= 6 and block.strip()[:1].isupper()
              and not block.rstrip().endswith(".")):
            out.append(f"<h2>{htmllib.escape(block.strip())}</h2>")
        else:
            out.append(f"<p>{htmllib.escape(' '.join(block.split()))}</p>")
    return "\n".join(out)


SITE_NAMES = ("DevNotes Daily", "The Byte Column", "Stack Journal", "Open Source Weekly", "CodeCraft Magazine",
              "Terminal Times", "Kernel Chronicle", "The Daily Diff")
NAV_ITEMS = ("Home", "News", "Tutorials", "Reviews", "Guides", "Podcasts", "Events", "Jobs", "About", "Contact",
             "Newsletter", "Topics", "Community", "Videos", "Deals", "Subscribe")
COOKIE_TEXTS = (
    "We use cookies and similar technologies to improve your experience, analyse traffic and personalise ads. "
    "By clicking Accept all you consent to our use of cookies.",
    "This website stores cookies on your computer. These cookies are used to collect information about how you "
    "interact with our website and allow us to remember you.",
    "Your privacy matters to us. We and our partners store and access information on your device for "
    "personalised advertising and content, audience insights and product development.",
    "We value your privacy. Cookies help us deliver our services; by using our services you agree to our use of "
    "cookies. Learn more in our cookie policy.")
COOKIE_BUTTONS = (("Accept all", "Reject all", "Manage preferences"), ("Got it!", "Learn more"),
                  ("I agree", "Customize", "Decline"), ("OK", "Privacy settings"))
HEADLINE_A = ("Ten things", "Why developers", "How we", "What nobody tells you about", "The quiet rise of",
              "A beginner's guide to", "Five mistakes", "Lessons learned from", "Inside the", "The future of")
HEADLINE_B = ("remote teams", "container security", "open source funding", "static typing", "legacy code",
              "the command line", "code review", "technical debt", "edge computing", "database migrations",
              "accessibility audits", "incident response")
TAGS = ("linux", "python", "devops", "security", "cloud", "tutorial", "opinion", "career", "tools", "release",
        "performance", "testing")
AUTHORS = ("Maria Lopez", "Kenji Watanabe", "Priya Raman", "Tom Becker", "Aisha Okafor", "Lukas Novak",
           "Sofia Rossi", "Daniel Kim", "Emma Johansson", "Omar Haddad", "Chloe Martin", "Ravi Patel")
COMMENTS = (
    "Great write-up, thanks for sharing this!", "This saved me hours of debugging yesterday.",
    "I disagree with the second point, in my experience it depends a lot on the team size.",
    "Does anyone know if this still works on the latest release?", "Bookmarked. Clear and to the point.",
    "Could you do a follow-up on the performance side of things?", "First!",
    "We tried something similar at work and ran into problems with caching. Any tips?",
    "Thanks, finally an explanation that makes sense to me.", "Typo in the third paragraph, otherwise excellent.",
    "I have been doing this wrong for years, apparently.", "Nice article but the examples could use more comments.",
    "Shared this with my whole team.", "How does this compare to the approach described last month?",
    "Really helpful, please keep writing about this topic.", "Not sure I follow the last example, can you explain?")
FOOTER_LINKS = ("Privacy Policy", "Terms of Service", "Cookie Policy", "Advertise", "Careers", "Press", "Sitemap",
                "Accessibility", "Contact us", "RSS feed", "Do not sell my personal information")
SHARE = ("Share on Twitter", "Share on Facebook", "Share on LinkedIn", "Share on Reddit", "Email this article",
         "Copy link", "Tweet", "Pin it")
SIDEBAR_TITLES = ("Popular posts", "Trending now", "Most read", "Editor's picks")


def _headline(rng: random.Random) -> str:
    return f"{rng.choice(HEADLINE_A)} {rng.choice(HEADLINE_B)}"


def _links(rng: random.Random, texts, n: int) -> list[tuple[str, str]]:
    picked = rng.sample(list(texts), min(n, len(texts)))
    return [(t, "/" + re.sub(r"\W+", "-", t.lower()).strip("-")) for t in picked]


def _boilerplate(rng: random.Random, site: str) -> dict[str, str]:
    """The boilerplate parts of one page, each as HTML in one of several markups (labels match the analysis)."""
    e = htmllib.escape
    items = _links(rng, NAV_ITEMS, rng.randint(6, 10))
    nav = rng.choice((
        "<nav class=\"main-nav\"><ul>" + "".join(f"<li><a href=\"{u}\">{e(t)}</a></li>" for t, u in items)
        + "</ul></nav>",
        "<div id=\"menu\" class=\"menu-bar\">" + " | ".join(f"<a href=\"{u}\">{e(t)}</a>" for t, u in items) + "</div>",
        "<div class=\"navbar navbar-expand\"><a class=\"navbar-brand\" href=\"/\">" + e(site)
        + "</a><ul class=\"navbar-nav\">"
        + "".join(f"<li class=\"nav-item\"><a class=\"nav-link\" href=\"{u}\">{e(t)}</a></li>" for t, u in items)
        + "</ul><form class=\"search\"><input type=\"search\" placeholder=\"Search\"><button>Search</button>"
          "</form></div>",
    ))
    buttons = rng.choice(COOKIE_BUTTONS)
    cookie = rng.choice((
        f"<div id=\"cookie-banner\" class=\"cookie-consent\"><p>{e(rng.choice(COOKIE_TEXTS))}</p>"
        + "".join(f"<button>{e(b)}</button>" for b in buttons) + "</div>",
        f"<div class=\"gdpr-popup\" role=\"dialog\"><span>{e(rng.choice(COOKIE_TEXTS))}</span> "
        + " ".join(f"<a href=\"#\" class=\"btn\">{e(b)}</a>" for b in buttons) + "</div>",
    ))
    crumbs = f"<div class=\"breadcrumbs\"><a href=\"/\">Home</a> &raquo; <a href=\"/{rng.choice(TAGS)}\">" \
             f"{rng.choice(TAGS).title()}</a></div>"
    author = rng.choice(AUTHORS)
    byline = rng.choice((
        f"<p class=\"byline\">By <a href=\"/author\">{author}</a> &middot; {rng.randint(1, 28)} March "
        f"{rng.randint(2015, 2024)} &middot; {rng.randint(3, 15)} min read</p>",
        f"<div class=\"meta\"><span class=\"author\">{author}</span> "
        f"<time>20{rng.randint(15, 24)}-0{rng.randint(1, 9)}-1{rng.randint(0, 9)}</time></div>",
    ))
    share = rng.choice((
        "<div class=\"share-buttons\">" + "".join(f"<a href=\"#\">{s}</a>" for s in rng.sample(SHARE, 4)) + "</div>",
        "<ul class=\"social\">" + "".join(f"<li><a href=\"#\">{s}</a></li>" for s in rng.sample(SHARE, 3)) + "</ul>",
    ))
    popular = [(_headline(rng), "/p") for _ in range(5)]
    sidebar = (f"<h3>{rng.choice(SIDEBAR_TITLES)}</h3><ul>"
               + "".join(f"<li><a href=\"{u}\">{e(t)}</a></li>" for t, u in popular)
               + "</ul><h3>Tags</h3><p>" + " ".join(f"<a href=\"/tag/{t}\">{t}</a>" for t in rng.sample(TAGS, 6))
               + "</p><h3>Newsletter</h3><p>Get the best stories in your inbox every week. No spam, unsubscribe "
                 "any time.</p><form><input type=\"email\" placeholder=\"Your email\"><button>Sign up</button></form>"
               + "<div class=\"ad\"><small>Advertisement</small><p>Deploy faster with CloudRunner. Start your "
                 "free trial today.</p></div>")
    related = "<h3>" + rng.choice(("Related articles", "You might also like", "More from " + site, "Read next")) \
              + "</h3><ul>" + "".join(f"<li><a href=\"/r\">{e(_headline(rng))}</a></li>" for _ in range(4)) + "</ul>"
    n_comments = rng.randint(2, 6)
    comment_items = []
    for _ in range(n_comments):
        who, said = rng.choice(AUTHORS), " ".join(rng.sample(COMMENTS, rng.randint(1, 2)))
        when = f"{rng.randint(1, 23)} hours ago"
        comment_items.append(rng.choice((
            f"<li class=\"comment\"><div class=\"comment-author\">{who}</div><div class=\"comment-date\">{when}</div>"
            f"<div class=\"comment-body\"><p>{e(said)}</p></div><a class=\"reply\" href=\"#\">Reply</a></li>",
            f"<article class=\"comment\"><header><b>{who}</b> <span>{when}</span></header><p>{e(said)}</p>"
            f"<footer><a href=\"#\">Reply</a> <a href=\"#\">Like</a></footer></article>",
        )))
    comments = (f"<h3>{n_comments} Comments</h3><ol class=\"commentlist\">" + "".join(comment_items) + "</ol>"
                "<h3>Leave a Reply</h3><form><label>Name</label><input><label>Comment</label><textarea></textarea>"
                "<button>Post Comment</button></form>")
    footer = ("<p>" + " | ".join(f"<a href=\"/f\">{t}</a>" for t in rng.sample(FOOTER_LINKS, 6)) + "</p>"
              f"<p>&copy; {rng.randint(2012, 2024)} {e(site)}. All rights reserved. 221 Example Street, Springfield."
              "</p>")
    return {"nav": nav, "cookie": cookie, "header": crumbs, "byline": byline, "share": share, "sidebar": sidebar,
            "related": related, "comments": comments, "footer": footer}


def _template(kind: int, site: str, parts: dict[str, str], article: str, rng: random.Random) -> str:
    """A whole page in one of five layouts: HTML5 semantic, div soup, table layout, Bootstrap grid, and a blog
    whose comments are <article> elements beside the post's."""
    p = parts
    head = f"<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"><title>{htmllib.escape(site)}</title>" \
           "<link rel=\"stylesheet\" href=\"/css/site.css\"><script>window.dataLayer=[];</script></head>"
    if kind == 0:
        body = (f"<body>{p['cookie']}<header class=\"site-header\"><div class=\"logo\">{site}</div>{p['nav']}</header>"
                f"{p['header']}<main><article>{p['byline']}{article}</article>{p['share']}"
                f"<section class=\"related\">{p['related']}</section><section id=\"comments\" class=\"comments\">"
                f"{p['comments']}</section></main><aside class=\"sidebar\">{p['sidebar']}</aside>"
                f"<footer class=\"site-footer\">{p['footer']}</footer></body>")
    elif kind == 1:
        body = (f"<body><div id=\"wrapper\"><div id=\"top\">{site}</div>{p['nav']}<div id=\"content\">{p['header']}"
                f"<div class=\"post\">{p['byline']}<div class=\"entry\">{article}</div></div>{p['share']}"
                f"<div class=\"related-posts\">{p['related']}</div><div id=\"comments\">{p['comments']}</div></div>"
                f"<div id=\"sidebar\">{p['sidebar']}</div><div id=\"footer\">{p['footer']}</div></div>"
                f"{p['cookie']}</body>")
    elif kind == 2:
        body = (f"<body><table width=\"100%\"><tr><td colspan=\"2\"><b>{site}</b> {p['nav']}</td></tr><tr>"
                f"<td width=\"200\" valign=\"top\">{p['sidebar']}</td><td valign=\"top\">{p['header']}{p['byline']}"
                f"{article}{p['share']}{p['related']}{p['comments']}</td></tr><tr><td colspan=\"2\">{p['footer']}"
                f"</td></tr></table>{p['cookie']}</body>")
    elif kind == 3:
        body = (f"<body>{p['nav']}<div class=\"container\"><div class=\"row\">{p['header']}</div><div class=\"row\">"
                f"<div class=\"col-md-8\"><div class=\"card\"><div class=\"card-body\">{p['byline']}{article}</div>"
                f"</div>{p['share']}<div class=\"card mt-3\">{p['related']}</div><div class=\"card mt-3\" "
                f"id=\"disqus_thread\">{p['comments']}</div></div><div class=\"col-md-4\">{p['sidebar']}</div></div>"
                f"</div><footer class=\"footer bg-dark\">{p['footer']}</footer>{p['cookie']}</body>")
    else:
        body = (f"<body>{p['cookie']}<div class=\"site\"><header>{site}{p['nav']}</header><div class=\"site-content\">"
                f"<article class=\"post\" itemscope itemtype=\"https://schema.org/BlogPosting\">{p['byline']}"
                f"<div class=\"post-content\" itemprop=\"articleBody\">{article}</div>{p['share']}</article>"
                f"<section class=\"related\">{p['related']}</section><section class=\"comments-area\">"
                f"{p['comments']}</section></div><aside class=\"widget-area\">{p['sidebar']}</aside>"
                f"<footer>{p['footer']}</footer></div></body>")
    return f"{head}\n{body}\n</html>\n"


def wrapped_pages(limit: int) -> Iterator[Page]:
    """Real article text in boilerplate: one seeded layout and boilerplate per article (seed: the article's id)."""
    for n, (aid, title, body) in enumerate(_articles()):
        if limit and n >= limit:
            return
        rng = random.Random(_order(aid))
        site = rng.choice(SITE_NAMES)
        kind = rng.randrange(5)
        parts = _boilerplate(rng, site)
        article = _article_html(title, body, rng)
        html = _template(kind, site, parts, article, rng)
        gold = title + "\n" + body
        outside = {}
        for label, part in parts.items():
            fragment = lxml.html.fragment_fromstring(part, create_parent="div")
            outside.setdefault(label, Counter()).update(words(region_text([fragment])))
        outside.setdefault("header", Counter()).update(words(site))
        tree = lxml.html.fragment_fromstring(article, create_parent="div")
        inside = _labelled_words([tree], [], _inside_label)
        yield Page("wrapped", f"layout-{kind}", aid, html, gold, "wrapped: the article text", inside, outside)


def pages(sets: tuple[str, ...], limit: int, per_group: int, skipped: Counter) -> Iterator[Page]:
    """The pages of `sets`: at most `per_group` per package/book (0: all), `limit` per set (0: all)."""
    for name in sets:
        if name == "wrapped":
            yield from wrapped_pages(limit)
            continue
        n = 0
        for source in SOURCES:
            if source.set != name:
                continue
            if limit and n >= limit:
                break
            cap = min((x for x in (per_group, limit - n if limit else 0) if x), default=0)
            for page in real_pages(source, cap, skipped):
                n += 1
                yield page
