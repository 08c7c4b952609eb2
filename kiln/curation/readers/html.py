"""The one place HTML becomes text: a page's main content (navigation, menus, footers, cookie banners, related links
and comment threads left out) and what the page says about itself (title, date, language, canonical URL).

Three extractors, chosen by `reading.html.extractor` (or a source's `html_extractor`):
- `resiliparse` (default): DCLM's choice, native-code parsing and main-content rules; on 4,930 real pages of 12
  generators (bench/extraction_bench.py) precision 0.989 and recall 0.957 of the words, ~380 pages per CPU-second;
- `trafilatura`: FineWeb's choice (its ablations: better models than the crawl's own WET text); precision 0.995 but
  recall 0.839 there (it drops API reference tables and signatures), ~9x slower;
- `visible_text`: every visible string of the page (Kiln's reader before main-content extraction).

Nothing here fetches anything: a page is read as given, `url` only resolves a relative canonical link.
"""

from __future__ import annotations

import codecs
import logging
import re
from dataclasses import dataclass
from html.parser import HTMLParser
from urllib.parse import urljoin

from kiln.common.config.curation import HtmlExtractor, HtmlReading

# trafilatura logs every page it finds nothing in at ERROR, with its URL: the quarantine counts those pages instead
logging.getLogger("trafilatura").setLevel(logging.CRITICAL)

EXTRACTORS: tuple[str, ...] = HtmlExtractor.__args__  # resiliparse, trafilatura, visible_text
# reading.html.extractor's default, chosen by bench/extraction_bench.py (docs/curation.md)
DEFAULT_EXTRACTOR = HtmlReading().extractor


@dataclass(frozen=True)
class Extracted:
    text: str
    title: str | None
    date: str | None  # YYYY-MM-DD, when the page declares one in a <meta> tag
    language: str | None  # as the page declares it (<html lang>), lowercase: "en", "de-at"
    canonical_url: str | None  # <link rel=canonical>, absolute when `url` is given

    def meta(self) -> dict[str, str]:
        """What a document's `meta` keeps of it: the fields found."""
        found = {"title": self.title, "date": self.date, "html_language": self.language,
                 "canonical_url": self.canonical_url}
        return {k: v for k, v in found.items() if v}


def extract(html: str, extractor: str = DEFAULT_EXTRACTOR, url: str | None = None) -> Extracted | None:
    """The page's main content and metadata, or None when it has none (no text the extractor keeps). Raises on
    markup a parser rejects outright; readers quarantine that as malformed_html."""
    if extractor not in EXTRACTORS:
        raise ValueError(f"unknown HTML extractor {extractor!r}; use one of {', '.join(EXTRACTORS)}")
    from resiliparse.parse.html import HTMLTree

    tree = HTMLTree.parse(html)  # parsed once: the metadata, then resiliparse's extraction, read the same tree
    head = _head(tree, url)
    if extractor == "trafilatura":
        text = _trafilatura(html, url)
    elif extractor == "resiliparse":
        text = _resiliparse(tree)
    else:
        text = html_to_text(html)
    text = _tidy(text)
    if not text:
        return None
    return Extracted(text=text, **head)


# --------------------------------------------------------------------------------------------- extractors

def _trafilatura(html: str, url: str | None) -> str:
    import trafilatura
    from trafilatura.xml import xmltotxt

    # Tables and code kept (trafilatura keeps <pre> as code blocks whatever include_formatting says), markup,
    # links, images and comment sections not; no deduplication (its LRU cache would make a page's text depend on
    # the pages read before it). fast: no fallback to readability / jusText, which on Python's pages lowered recall
    # (0.92 against 0.96) and speed; favor_precision lowered recall to 0.86. Its own metadata (htmldate) would halve
    # its speed: `_head` reads it instead. A page of nothing but boilerplate may still give a few words (its menu):
    # the garbage and length rules downstream drop such stubs.
    doc = trafilatura.bare_extraction(
        html, url=url, fast=True, include_comments=False, include_tables=True, include_formatting=False,
        include_links=False, include_images=False, deduplicate=False, with_metadata=False)
    if doc is None or doc.body is None:
        return ""
    return xmltotxt(_unwrapped(doc.body), include_formatting=False)


_SPACES = re.compile(r"\s+")


def _unwrapped(body):
    """trafilatura's tree with the source's line breaks inside paragraphs, headings, items and cells made spaces, as
    a browser renders them (its text output keeps them: 86% of Python's paragraphs came out cut at the source's
    wrap column); block code (a <code> with line breaks) keeps its lines."""
    stack = [(body, False)]
    while stack:
        node, in_code = stack.pop()
        in_code = in_code or (node.tag == "code" and "\n" in "".join(node.itertext()))
        if node.text and not in_code:
            node.text = _SPACES.sub(" ", node.text)
        for child in node:
            if child.tail and not in_code:  # a child's tail is its parent's text
                child.tail = _SPACES.sub(" ", child.tail)
            stack.append((child, in_code))
    return body


def _resiliparse(html) -> str:
    from resiliparse.extract.html2text import extract_plain_text

    # main_content: its boilerplate heuristics (nav, header, footer, sidebars, comments, share buttons);
    # preserve_formatting keeps paragraphs, list items and <pre> code on their own lines
    return extract_plain_text(html, main_content=True, preserve_formatting=True, list_bullets=True,
                              alt_texts=False, links=False, form_fields=False, noscript=False, comments=False)


class _HtmlText(HTMLParser):
    """Visible text of an HTML page: scripts, styles and head dropped, block elements end lines."""

    SKIP = {"script", "style", "noscript", "head", "template", "svg"}
    BLOCK = {"p", "div", "br", "li", "ul", "ol", "tr", "h1", "h2", "h3", "h4", "h5", "h6", "pre", "section",
             "article", "blockquote", "table", "header", "footer", "nav", "hr", "title"}

    def __init__(self):
        super().__init__(convert_charrefs=True)
        self.parts: list[str] = []
        self.skipping = 0

    def handle_starttag(self, tag, attrs):
        if tag in self.SKIP:
            self.skipping += 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_endtag(self, tag):
        if tag in self.SKIP and self.skipping:
            self.skipping -= 1
        elif tag in self.BLOCK:
            self.parts.append("\n")

    def handle_data(self, data):
        if not self.skipping:
            self.parts.append(data)

    def text(self) -> str:
        lines = (" ".join(line.split()) for line in "".join(self.parts).splitlines())
        return "\n".join(line for line in lines if line)


def html_to_text(html: str) -> str:
    """Every visible string of the page (the `visible_text` extractor)."""
    parser = _HtmlText()
    parser.feed(html)
    parser.close()
    return parser.text()


# ----------------------------------------------------------------------------------------------- metadata

# Where pages declare their publication date (Open Graph / article, schema.org, Dublin Core, common CMS tags)
_DATE_META = ('meta[property="article:published_time"]', 'meta[property="og:published_time"]',
              'meta[itemprop="datePublished"]', 'meta[name="date"]', 'meta[name="dc.date"]', 'meta[name="DC.date"]',
              'meta[name="dcterms.date"]', 'meta[name="pubdate"]', 'meta[name="publish-date"]',
              'meta[name="parsely-pub-date"]', 'meta[name="sailthru.date"]')
_ISO_DATE = re.compile(r"\s*(\d{4})-(\d{2})-(\d{2})")


def _head(tree, url: str | None) -> dict:
    """Title, declared date, <html lang> and canonical URL, read from lexbor's tree (resiliparse's parser): the same
    for every extractor, and ~1,000 pages/s, against ~20 for trafilatura's own metadata."""
    document = tree.document
    title = document.query_selector("title")
    canonical = document.query_selector('link[rel="canonical"]')
    root = document.query_selector("html")
    date = None
    for selector in _DATE_META:
        node = document.query_selector(selector)
        date = node is not None and _iso_date(node.getattr("content") or node.getattr("datetime"))
        if date:
            break
    href = (canonical.getattr("href") or "").strip() if canonical is not None else ""
    lang = ((root.getattr("lang") or "").strip().lower().replace("_", "-") if root is not None else "") or None
    return {"title": _clean(title.text if title is not None else None), "date": date or None,
            "language": lang, "canonical_url": (urljoin(url, href) if url else href) if href else None}


def _iso_date(value: str | None) -> str | None:
    m = _ISO_DATE.match(value or "")
    return f"{m[1]}-{m[2]}-{m[3]}" if m else None


def _clean(value: str | None) -> str | None:
    return " ".join(value.split()) or None if value else None


def _tidy(text: str) -> str:
    """Trailing spaces off every line, at most one blank line between blocks (code keeps its indentation)."""
    lines = [line.rstrip() for line in text.splitlines()]
    return re.sub(r"\n{3,}", "\n\n", "\n".join(lines)).strip("\n")


# ------------------------------------------------------------------------------------------------ charsets

_META_CHARSET = re.compile(rb"""<meta[^>]+charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""", re.IGNORECASE)
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


def html_charset(data: bytes, content_type: str | None = None) -> str:
    """The encoding a page is in, as browsers pick it: a byte-order mark, else the HTTP Content-Type's charset,
    else a <meta charset> (or http-equiv) in its first 2 KB, else UTF-8."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name
    declared = re.search(r"charset\s*=\s*[\"']?([A-Za-z0-9_.:-]+)", content_type or "", re.IGNORECASE)
    if declared:
        return declared[1]
    meta = _META_CHARSET.search(data[:2048])
    if not meta:
        return "utf-8"
    label = meta[1].decode("ascii")
    # a page that says it is UTF-16 in its own ASCII bytes cannot be: browsers read it as UTF-8 (WHATWG HTML)
    return "utf-8" if label.lower().replace("_", "-").startswith(("utf-16", "utf16")) else label


# The decoder browsers use for a label (WHATWG Encoding): a superset of what Python's codec of that name reads, so a
# page a browser shows is never quarantined (gb2312 pages use GBK's characters, EUC-KR pages cp949's, ...).
_WHATWG_DECODER = {"ascii": "cp1252", "iso8859-1": "cp1252", "iso8859-9": "cp1254",
                   "iso8859-11": "cp874", "tis-620": "cp874", "gb2312": "gb18030", "gbk": "gb18030",
                   "euc_kr": "cp949", "shift_jis": "cp932", "big5": "big5hkscs"}


def _c1_passthrough(error: UnicodeDecodeError) -> tuple[str, int]:
    """WHATWG's single-byte windows-125x decoders read a byte the code page leaves undefined (0x81, 0x8D, 0x8F, 0x90,
    0x9D in windows-1252) as the C1 control of the same value; Python's codecs refuse it."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "".join(map(chr, error.object[error.start:error.end])), error.end


codecs.register_error("kiln-c1", _c1_passthrough)
_SINGLE_BYTE = ("cp1252", "cp1254", "cp874")


def decode_html(data: bytes, content_type: str | None = None) -> tuple[str | None, str]:
    """(the page's text, its charset): decoded strictly in the charset it declares (`html_charset`); the text is None
    when that charset is unknown or the bytes are not valid in it. Never decoded with replacement characters."""
    label = html_charset(data, content_type)
    try:
        codec = codecs.lookup(label).name
    except LookupError:
        return None, label
    codec = _WHATWG_DECODER.get(codec, codec)
    try:
        return data.decode(codec, "kiln-c1" if codec in _SINGLE_BYTE else "strict"), codec
    except (UnicodeDecodeError, LookupError):  # LookupError: a codec that is no text encoding (charset=base64, hex)
        return None, codec
