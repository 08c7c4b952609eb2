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

# A <meta> naming a charset, or a comment (skipped, as WHATWG's prescan skips them: an unclosed one hides the rest).
# A tag is read up to 1,024 characters and the next < or >: a page of unclosed `<meta`s costs linear time.
_META_CHARSET = re.compile(rb"""<!--.*?(?:-->|\Z)|<meta[^<>]{1,1024}?charset\s*=\s*["']?\s*([A-Za-z0-9_.:-]+)""",
                           re.IGNORECASE | re.DOTALL)
_BODY = re.compile(rb"<body[\s/>]", re.IGNORECASE)
PRESCAN_BYTES = 2048  # read for a <meta> charset wherever it is (WHATWG's prescan reads 1,024)
HEAD_BYTES = 1 << 16  # and up to the first <body> tag within these: a browser honours a <meta> anywhere in <head>
_BOMS = ((codecs.BOM_UTF8, "utf-8-sig"), (codecs.BOM_UTF16_LE, "utf-16"), (codecs.BOM_UTF16_BE, "utf-16"))


# WHATWG Encoding's labels (encoding.spec.whatwg.org, "Encodings"), each with the Python codec of the decoder
# browsers use for it: a superset of what Python's codec of the same name reads, so a page a browser shows is never
# quarantined (gb2312 pages use GBK's characters, EUC-KR pages cp949's, ISO-8859-1 pages windows-1252's, ...). Many
# of these labels (windows-874, iso-8859-8-i, x-sjis, windows-31j, ks_c_5601-1989, x-mac-cyrillic) Python lacks.
_WHATWG_ENCODINGS = {
    "utf-8": "unicode-1-1-utf-8 unicode11utf8 unicode20utf8 utf-8 utf8 x-unicode20utf8",
    "cp866": "866 cp866 csibm866 ibm866",
    "iso8859-2": "csisolatin2 iso-8859-2 iso-ir-101 iso8859-2 iso88592 iso_8859-2 iso_8859-2:1987 l2 latin2",
    "iso8859-3": "csisolatin3 iso-8859-3 iso-ir-109 iso8859-3 iso88593 iso_8859-3 iso_8859-3:1988 l3 latin3",
    "iso8859-4": "csisolatin4 iso-8859-4 iso-ir-110 iso8859-4 iso88594 iso_8859-4 iso_8859-4:1988 l4 latin4",
    "iso8859-5": "csisolatincyrillic cyrillic iso-8859-5 iso-ir-144 iso8859-5 iso88595 iso_8859-5 iso_8859-5:1988",
    "iso8859-6": "arabic asmo-708 csiso88596e csiso88596i csisolatinarabic ecma-114 iso-8859-6 iso-8859-6-e "
                 "iso-8859-6-i iso-ir-127 iso8859-6 iso88596 iso_8859-6 iso_8859-6:1987",
    "iso8859-7": "csisolatingreek ecma-118 elot_928 greek greek8 iso-8859-7 iso-ir-126 iso8859-7 iso88597 iso_8859-7 "
                 "iso_8859-7:1987 sun_eu_greek",
    "iso8859-8": "csiso88598e csisolatinhebrew hebrew iso-8859-8 iso-8859-8-e iso-ir-138 iso8859-8 iso88598 "
                 "iso_8859-8 iso_8859-8:1988 visual csiso88598i iso-8859-8-i logical",
    "iso8859-10": "csisolatin6 iso-8859-10 iso-ir-157 iso8859-10 iso885910 l6 latin6",
    "iso8859-13": "iso-8859-13 iso8859-13 iso885913",
    "iso8859-14": "iso-8859-14 iso8859-14 iso885914",
    "iso8859-15": "csisolatin9 iso-8859-15 iso8859-15 iso885915 iso_8859-15 l9",
    "iso8859-16": "iso-8859-16",
    "koi8-r": "cskoi8r koi koi8 koi8-r koi8_r",
    "koi8-u": "koi8-ru koi8-u",
    "mac-roman": "csmacintosh mac macintosh x-mac-roman",
    "cp874": "dos-874 iso-8859-11 iso8859-11 iso885911 tis-620 windows-874",
    "cp1250": "cp1250 windows-1250 x-cp1250",
    "cp1251": "cp1251 windows-1251 x-cp1251",
    "cp1252": "ansi_x3.4-1968 ascii cp1252 cp819 csisolatin1 ibm819 iso-8859-1 iso-ir-100 iso8859-1 iso88591 "
              "iso_8859-1 iso_8859-1:1987 l1 latin1 us-ascii windows-1252 x-cp1252",
    "cp1253": "cp1253 windows-1253 x-cp1253",
    "cp1254": "cp1254 csisolatin5 iso-8859-9 iso-ir-148 iso8859-9 iso88599 iso_8859-9 iso_8859-9:1989 l5 latin5 "
              "windows-1254 x-cp1254",
    "cp1255": "cp1255 windows-1255 x-cp1255",
    "cp1256": "cp1256 windows-1256 x-cp1256",
    "cp1257": "cp1257 windows-1257 x-cp1257",
    "cp1258": "cp1258 windows-1258 x-cp1258",
    "mac-cyrillic": "x-mac-cyrillic x-mac-ukrainian",
    "gb18030": "chinese csgb2312 csiso58gb231280 gb2312 gb_2312 gb_2312-80 gbk iso-ir-58 x-gbk gb18030",
    "big5hkscs": "big5 big5-hkscs cn-big5 csbig5 x-x-big5",
    "euc_jp": "cseucpkdfmtjapanese euc-jp x-euc-jp",
    "iso2022_jp": "csiso2022jp iso-2022-jp",
    "cp932": "csshiftjis ms932 ms_kanji shift-jis shift_jis sjis windows-31j x-sjis",
    "cp949": "cseuckr csksc56011987 euc-kr iso-ir-149 korean ks_c_5601-1987 ks_c_5601-1989 ksc5601 ksc_5601 "
             "windows-949",
    "utf-16-be": "unicodefffe utf-16be",
    "utf-16-le": "csunicode iso-10646-ucs-2 ucs-2 unicode unicodefeff utf-16 utf-16le",
}
_WHATWG_LABELS = {label: codec for codec, labels in _WHATWG_ENCODINGS.items() for label in labels.split()}


def label_codec(label: str) -> str | None:
    """The Python codec of the decoder browsers use for a charset label, or None for a label that names no text
    encoding (`none`, `utf8mb4`, `base64`): browsers ignore such a label and look at the next declaration."""
    label = label.strip().lower()
    if label in _WHATWG_LABELS:
        return _WHATWG_LABELS[label]
    try:
        info = codecs.lookup(label)
    except LookupError:
        return None
    if not getattr(info, "_is_text_encoding", True):  # base64, hex, zlib: bytes-to-bytes codecs
        return None
    # a label outside WHATWG's whose codec is one of its encodings (latin-1 is Python's iso8859-1): the browser's
    # decoder for that encoding
    return _WHATWG_LABELS.get(info.name.replace("_", "-"), info.name)


XHTML = "application/xhtml+xml"  # the media type of an XHTML page (a .xhtml file's): read by an XML parser


def html_charset(data: bytes, content_type: str | None = None) -> str:
    """The codec a page is in, as browsers pick it: a byte-order mark, else the HTTP Content-Type's charset, else what
    the page says of itself, else UTF-8; a label that names no encoding is passed over for the next. What a page says:
    for HTML (WHATWG HTML's prescan), the first <meta charset> (or http-equiv) of its <head> (`_meta_codec`), else an
    XML declaration's encoding; for XHTML (`application/xhtml+xml`, which an XML parser reads: XML 1.0 appendix F,
    RFC 7303), the XML declaration's, else, for a page that has none, its <meta>."""
    for bom, name in _BOMS:
        if data.startswith(bom):
            return name
    declared = re.search(r"charset\s*=\s*[\"']?([A-Za-z0-9_.:-]+)", content_type or "", re.IGNORECASE)
    if declared and (codec := label_codec(declared[1])):
        return codec
    if (content_type or "").split(";")[0].strip().lower() == XHTML:
        codec = _xml_codec(data) or _meta_codec(data)
    else:
        codec = _meta_codec(data) or _xml_codec(data)
    # a page that says it is UTF-16 in its own ASCII bytes cannot be: browsers read it as UTF-8 (WHATWG HTML)
    return "utf-8" if codec is None or codec.startswith("utf-16") else codec


def _meta_codec(data: bytes) -> str | None:
    """The codec of the first <meta> charset that names an encoding, outside comments, in the page's first
    PRESCAN_BYTES or, further, before its first <body> tag within HEAD_BYTES: browsers honour one anywhere in <head>
    (WHATWG HTML's "change the encoding" when the parser meets it; Blink scans to the body), so a page whose scripts
    or styles come first is still read in its charset."""
    body = _BODY.search(data, 0, HEAD_BYTES)
    for m in _META_CHARSET.finditer(data, 0, max(PRESCAN_BYTES, body.start() if body else HEAD_BYTES)):
        if m[1] is not None and (codec := label_codec(m[1].decode("ascii"))):
            return codec
    return None


def _xml_codec(data: bytes) -> str | None:
    """The codec the XML declaration `<?xml ... encoding="..."?>` the page starts with names, as WHATWG HTML's "get an
    XML encoding" reads it (also how an XML parser finds it in ASCII-compatible bytes), or None."""
    if not data.startswith(b"<?xml") or (end := data.find(b">", 0, PRESCAN_BYTES)) < 0:
        return None
    at = data.find(b"encoding", 0, end)
    m = _XML_ENCODING.match(data, at + len(b"encoding"), end) if at >= 0 else None
    return label_codec(m[2].decode("ascii")) if m else None


_XML_ENCODING = re.compile(rb"[\x00-\x20]*=[\x00-\x20]*([\"'])([\x21-\x7e]*?)\1")


def _c1_passthrough(error: UnicodeDecodeError) -> tuple[str, int]:
    """WHATWG's single-byte windows-125x decoders read a byte the code page leaves undefined (0x81, 0x8D, 0x8F, 0x90,
    0x9D in windows-1252) as the C1 control of the same value; Python's codecs refuse it."""
    if not isinstance(error, UnicodeDecodeError):
        raise error
    return "".join(map(chr, error.object[error.start:error.end])), error.end


codecs.register_error("kiln-c1", _c1_passthrough)
_SINGLE_BYTE = ("cp1252", "cp1254", "cp874")


def decode_html(data: bytes, content_type: str | None = None,
                truncated: bool = False) -> tuple[str | None, str]:
    """(the page's text, its codec): decoded strictly in the charset it declares (`html_charset`); the text is None
    when the bytes are not valid in it. Never decoded with replacement characters. `truncated`: the bytes are the
    start of a longer page (a WARC record cut at the crawler's size limit), so a character the cut split at their end
    is left out, not a reason to refuse the page (a cut falls inside a character two times in three in Chinese or
    Japanese UTF-8)."""
    codec = html_charset(data, content_type)
    errors = "kiln-c1" if codec in _SINGLE_BYTE else "strict"
    try:
        if truncated:  # an incremental decoder keeps the bytes of an unfinished character back instead of raising
            return codecs.getincrementaldecoder(codec)(errors).decode(data, final=False), codec
        return data.decode(codec, errors), codec
    except UnicodeDecodeError:
        return None, codec
