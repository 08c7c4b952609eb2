"""HTML main-content extraction (kiln.curation.readers.html) on real pages: five pages of Python's documentation
(tests/data/html, PSF licence) with boilerplate planted around their real text: navigation links, a cookie banner,
related links, a comment thread and a footer, each carrying a marker word found nowhere else. Main content keeps
the article's paragraphs and none of the markers; WARC responses and the `html` source kind read through it."""

from __future__ import annotations

import io
import json
import re
from pathlib import Path

import lxml.html
import pytest

from kiln.common.config import ConfigError, Reading, Source
from kiln.common.config.loading import parse_config
from kiln.curation.readers import Quarantined, read_source
from kiln.curation.readers.html import EXTRACTORS, decode_html, extract

PAGES = sorted((Path(__file__).parent / "data" / "html").glob("*.html"))
MARKERS = {"nav": "qxnavmarker", "cookie": "qxcookiemarker", "related": "qxrelatedmarker",
           "comment": "qxcommentmarker", "footer": "qxfootermarker", "share": "qxsharemarker"}
MAIN_EXTRACTORS = ("trafilatura", "resiliparse")

COOKIE = ('<div id="cookie-consent" class="cookie-banner" role="dialog"><p>We use cookies to give you the best '
          f'experience on our website. By continuing to browse you agree to our use of cookies {MARKERS["cookie"]}. '
          '<a href="/privacy">Learn more</a></p><button class="accept">Accept all cookies</button></div>')
RELATED = ('<aside class="related-posts"><h3>Related articles</h3><ul>'
           f'<li><a href="/blog/ten-tips">Ten tips for faster Python scripts {MARKERS["related"]}</a></li>'
           '<li><a href="/blog/packaging">Packaging your first project the easy way</a></li>'
           '<li><a href="/blog/typing">A gentle introduction to type hints</a></li></ul></aside>')
COMMENTS = ('<section id="comments" class="comments-area"><h3>2 comments</h3><ol class="comment-list">'
            '<li class="comment"><p class="comment-author">alex_dev on March 3, 2024</p>'
            f'<p>Great write-up, this helped me a lot with my own scripts at work {MARKERS["comment"]}.</p></li>'
            '<li class="comment"><p class="comment-author">maria on March 4, 2024</p>'
            '<p>Thanks, I had been wondering about this for a long time.</p></li></ol>'
            '<form class="comment-form"><p>Leave a reply</p><textarea name="comment"></textarea></form></section>')
FOOTER = ('<footer class="site-footer"><p>Copyright 2024 Example Developer Blog. All rights reserved '
          f'{MARKERS["footer"]}.</p><ul><li><a href="/privacy">Privacy policy</a></li><li><a href="/terms">Terms of '
          'use</a></li><li><a href="/contact">Contact us</a></li></ul></footer>')


def _main(page: str):
    return lxml.html.fromstring(page).xpath('//div[@role="main"]')[0]


def paragraphs(page: str) -> list[str]:
    """The article's own paragraphs (Sphinx's main region), whitespace-normalized: what extraction must keep."""
    return [" ".join(p.text_content().split()) for p in _main(page).iter("p") if len(p.text_content().split()) >= 8]


def planted_sphinx(page: str) -> str:
    """The real page with markers planted in its own boilerplate (the navigation bar, the sidebar, the footer) and a
    cookie banner, related links and a comment thread added where sites put them."""
    nav = f'<li><a href="/blog/">Blog {MARKERS["nav"]}</a></li><li><a href="/about/">About us</a></li>'
    out = page.replace('<body>', f'<body>{COOKIE}', 1)
    out = re.sub(r'(<div class="related" role="navigation"[^>]*>\s*<h3>Navigation</h3>\s*<ul>)', rf'\1{nav}', out,
                 count=1)
    out = out.replace('<div class="sphinxsidebar"', f'{RELATED}{COMMENTS}<div class="sphinxsidebar"', 1)
    out = out.replace('<div class="footer">', f'<div class="footer"><p>Site maintained by the docs team '
                      f'{MARKERS["footer"]}.</p>', 1)
    assert all(m in out for k, m in MARKERS.items() if k != "share")
    return out


def planted_blog(page: str) -> str:
    """The page's article (its main region) inside a blog template: site header and menu, byline, share bar,
    related posts, comments and site footer around it."""
    main = _main(page)
    body = "".join(lxml.html.tostring(child, encoding="unicode") for child in main)
    title = " ".join(main.xpath("string(.//h1)").split()).rstrip("¶")
    menu = "".join(f'<li><a href="/{w.lower()}/">{w}</a></li>' for w in ("Home", "Tutorials", "News", "Events"))
    return (f'<!DOCTYPE html><html lang="en-GB"><head><meta charset="utf-8"><title>{title} | Example Developer Blog'
            '</title><link rel="canonical" href="/blog/article.html">'
            '<meta property="article:published_time" content="2024-03-02T09:30:00+00:00"></head><body>'
            f'{COOKIE}<header class="site-header"><a class="logo" href="/">Example Developer Blog</a>'
            f'<nav class="main-navigation"><ul>{menu}<li><a href="/jobs/">Jobs {MARKERS["nav"]}</a></li></ul></nav>'
            '</header><main id="main"><article class="post"><div class="entry-content">'
            f'{body}</div><div class="share-buttons">Share this article: <a href="#">Twitter</a> '
            f'<a href="#">Facebook</a> <a href="#">LinkedIn {MARKERS["share"]}</a></div></article>{RELATED}'
            f'{COMMENTS}</main>{FOOTER}</body></html>')


def _norm(text: str) -> str:
    return " ".join(text.split())


def kept_share(page: str, text: str) -> float:
    """The share of the page's article paragraphs found whole in `text`."""
    text, article = _norm(text).replace("¶", ""), paragraphs(page)
    return sum(_norm(p.replace("¶", "")) in text for p in article) / len(article)


@pytest.fixture(scope="module")
def pages() -> dict[str, str]:
    assert len(PAGES) == 5, f"the real pages are missing from {PAGES[0].parent if PAGES else 'tests/data/html'}"
    return {p.name: p.read_text(encoding="utf-8") for p in PAGES}


@pytest.mark.parametrize("extractor", MAIN_EXTRACTORS)
@pytest.mark.parametrize("template", [planted_sphinx, planted_blog])
def test_main_content_keeps_the_article_and_drops_planted_boilerplate(pages, extractor, template):
    for name, page in pages.items():
        out = extract(template(page), extractor, url="https://example.org/blog/x")
        text = _norm(out.text)
        leaked = [m for m in MARKERS.values() if m in text]
        assert not leaked, f"{extractor} kept boilerplate {leaked} of {name}"
        assert kept_share(page, out.text) >= 0.9, f"{extractor} lost paragraphs of {name}"
    # code blocks and tables are kept: a line of the sorting HOWTO's code, a cell of the curses HOWTO's table
    assert ">>> sorted([5, 2, 3, 1, 4])" in extract(template(pages["howto-sorting.html"]), extractor).text
    assert "curs_set()" in extract(template(pages["howto-curses.html"]), extractor).text


@pytest.mark.parametrize("extractor", MAIN_EXTRACTORS)
def test_paragraphs_are_lines_and_code_keeps_its_lines(pages, extractor):
    """The source wraps paragraphs at 80 columns (a browser shows spaces there); a code block's lines stay lines."""
    lines = extract(pages["howto-sorting.html"], extractor).text.splitlines()
    assert ("Python lists have a built-in list.sort() method that modifies the list in-place. There is also a sorted() "
            "built-in function that builds a new sorted list from an iterable.") in lines
    at = lines.index(">>> a = [5, 2, 3, 1, 4]")
    assert lines[at + 1: at + 4] == [">>> a.sort()", ">>> a", "[1, 2, 3, 4, 5]"]


def test_visible_text_keeps_everything_visible(pages):
    text = extract(planted_sphinx(pages["tutorial-appetite.html"]), "visible_text").text
    assert all(m in text for k, m in MARKERS.items() if k != "share")  # the old reader: boilerplate included


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_metadata_from_the_page(pages, extractor):
    out = extract(planted_blog(pages["tutorial-appetite.html"]), extractor, url="https://example.org/blog/x")
    assert out.canonical_url == "https://example.org/blog/article.html"  # resolved against the page's url
    assert out.language == "en-gb" and out.date == "2024-03-02"
    assert "Whetting Your Appetite" in out.title
    assert out.meta() == {"title": out.title, "date": "2024-03-02", "html_language": "en-gb",
                          "canonical_url": "https://example.org/blog/article.html"}


def test_a_page_of_boilerplate_only_has_no_main_content():
    page = ("<html><head><title>Home</title></head><body><nav class='main-nav'><ul><li><a href='/'>Home</a></li>"
            "<li><a href='/blog/'>Blog</a></li></ul></nav><footer class='site-footer'>(c) 2024 Example</footer>"
            "</body></html>")
    assert extract(page, "resiliparse") is None
    assert extract(page, "trafilatura").text == "Home Blog"  # its fallback, a stub the length rules drop
    assert extract(page, "visible_text").text == "Home\nBlog\n(c) 2024 Example"


@pytest.mark.parametrize("extractor", EXTRACTORS)
def test_a_page_without_text_is_none(extractor):
    assert extract("<html><head><title>t</title><script>var x = 1;</script></head><body>  </body></html>",
                   extractor) is None


def test_charsets_as_declared():
    page = '<html><head><meta charset="windows-1252"></head><body><p>Caf\u00e9 cr\u00e8me</p></body></html>'
    assert decode_html(page.encode("cp1252")) == (page, "cp1252")
    assert decode_html(page.encode("utf-8"), "text/html; charset=UTF-8")[0] == page  # the HTTP header wins
    assert decode_html(b"\xef\xbb\xbf<p>x</p>") == ("<p>x</p>", "utf-8-sig")
    assert decode_html("<p>\u00e9</p>".encode("latin-1"))[0] is None  # undeclared: UTF-8, and it is not
    # a label that names no encoding is passed over, as browsers do: the page's own <meta>, then UTF-8
    assert decode_html(b"<p>x</p>", "text/html; charset=klingon") == ("<p>x</p>", "utf-8")
    assert decode_html(page.encode("cp1252"), "text/html; charset=utf8mb4") == (page, "cp1252")
    assert decode_html(page.encode("cp1252"), "text/html; charset=none") == (page, "cp1252")


@pytest.mark.parametrize("label, text, codec", [
    ("windows-874", "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22", "cp874"),  # WHATWG's name for Thai
    ("iso-8859-8-i", "\u05e2\u05d1\u05e8\u05d9\u05ea", "iso8859-8"),  # the usual Hebrew label
    ("x-sjis", "\u65e5\u672c\u8a9e", "cp932"), ("windows-31j", "\u2460 \u9ad9", "cp932"),
    ("x-gbk", "\u4e2d\u6587", "gb18030"), ("x-cp1251", "\u0420\u0443\u0441\u0441\u043a\u0438\u0439", "cp1251"),
    ("ks_c_5601-1989", "\ud55c\uad6d\uc5b4", "cp949"), ("x-mac-cyrillic", "\u0420\u0443\u0441", "mac-cyrillic"),
])
def test_every_whatwg_label_names_the_browsers_decoder(label, text, codec):
    """Labels of the WHATWG Encoding standard that Python's codecs do not know quarantined the page a browser shows
    (invalid_charset): the label table (encoding.spec.whatwg.org) is the second implementation here."""
    page = f'<html><head><meta charset="{label}"></head><body><p>{text}</p></body></html>'
    assert decode_html(page.encode(codec)) == (page, codec)
    assert decode_html(page.encode(codec), f"text/html; charset={label.upper()}") == (page, codec)


def test_charsets_decode_as_browsers_decode_them():
    """WHATWG Encoding: a label names the browser's decoder, often a superset of the codec Python gives that name.
    Each text below is valid in the browser's decoder and not in Python's namesake (so it was quarantined as
    invalid_charset): 똠 is cp949-only (not in EUC-KR), 镕 GBK-only (not in GB2312), ① and 髙 cp932-only (not in
    Shift_JIS); bytes 0x81 and 0x8D are C1 controls in windows-1252 (undefined in Python's cp1252); ISO-8859-9 pages
    are read as windows-1254 (0x93/0x94 are curly quotes, C1 controls in Latin-5)."""
    def page(charset: str, body: str) -> str:
        return f'<html><head><meta charset="{charset}"></head><body><p>{body}</p></body></html>'

    cases = [("euc-kr", "cp949", "\ub620 \ud55c\uad6d\uc5b4"), ("gb2312", "gb18030", "\u9555 \u4e2d\u6587"),
             ("shift_jis", "cp932", "\u2460 \u9ad9 \u65e5\u672c"), ("iso-8859-9", "cp1254", "\u201cT\u00fcrk\u00e7e\u201d")]
    for label, decoder, body in cases:
        text = page(label, body)
        assert decode_html(text.encode(decoder)) == (text, decoder), label
    windows = page("iso-8859-1", "a\u0081b\u008dc \u20ac")
    assert decode_html(b"".join(bytes([ord(c)]) if ord(c) < 0x100 else "\u20ac".encode("cp1252") for c in windows)) \
        == (windows, "cp1252")
    # a page that declares UTF-16 in its own ASCII bytes is UTF-8 (HTML's rule), not pseudo-CJK garbage
    ascii_page = page("utf-16", "plain English")
    assert decode_html(ascii_page.encode("ascii")) == (ascii_page, "utf-8")



def test_an_xml_declaration_names_the_charset_of_xhtml_and_of_html_without_a_meta():
    """An XML declaration's encoding is what an XML parser reads an XHTML page in (XML 1.0 appendix F, RFC 7303: after
    a byte-order mark and the HTTP charset, before anything else), and what WHATWG HTML's prescan falls back to for
    text/html when no <meta> names one ("get an XML encoding", as Blink and WebKit, and Gecko since 2021). Such a
    windows-1251 XHTML page without a <meta> was quarantined as invalid_utf8."""
    body = "<body><p>\u0421\u044a\u0435\u0448\u044c \u0436\u0435 \u0435\u0449\u0451</p></body></html>"
    xhtml = ('<?xml version="1.0" encoding="windows-1251"?>\n<html xmlns="http://www.w3.org/1999/xhtml"><head>'
             '<title>t</title></head>' + body)
    for content_type in ("application/xhtml+xml", "text/html", None):
        assert decode_html(xhtml.encode("cp1251"), content_type) == (xhtml, "cp1251")
    assert decode_html(xhtml.encode("cp1251"), "application/xhtml+xml; charset=koi8-r")[1] == "koi8-r"  # HTTP first
    # XHTML: the declaration before a <meta>; HTML: a <meta> before the declaration
    both = '<?xml version="1.0" encoding="koi8-r"?><html><head><meta charset="windows-1251"/></head>' + body
    assert decode_html(both.encode("koi8-r"), "application/xhtml+xml") == (both, "koi8-r")
    assert decode_html(both.encode("cp1251"), "text/html") == (both, "cp1251")
    # single quotes and spaces around "=" are the declaration's; one not at the start, or an unquoted or spaced
    # label, is none (UTF-8); UTF-16 declared in ASCII bytes is UTF-8
    assert decode_html(("<?xml version='1.0' encoding = 'KOI8-R' ?>" + body).encode("koi8-r"))[1] == "koi8-r"
    for page in (' <?xml version="1.0" encoding="koi8-r"?>', "<?xml version=1.0 encoding=koi8-r?>",
                 '<?xml version="1.0" encoding="koi8 r"?>', '<?xml version="1.0" encoding="UTF-16"?>'):
        assert decode_html((page + body).encode("utf-8"), "application/xhtml+xml") == (page + body, "utf-8"), page


def test_a_meta_charset_anywhere_in_the_head_is_read_and_one_in_a_comment_is_not():
    """Browsers honour a <meta> charset anywhere in <head> (WHATWG HTML: one met after the prescan's first bytes
    "changes the encoding"; Blink scans to the first body tag), and the prescan skips comments and passes over a
    <meta> whose label names no encoding. Only the first 2 KB were read: a windows-1251 page whose analytics snippet
    came first was quarantined as invalid_utf8, and a <meta> inside a comment overrode the page's own."""
    snippet = "<script>" + "window.dataLayer = window.dataLayer || []; dataLayer.push({'event': 'view'});\n" * 40 \
        + "</script>"
    assert len(snippet) > 3000
    body = "<body><p>\u041c\u043e\u0441\u043a\u0432\u0430 \u2014 \u0441\u0442\u043e\u043b\u0438\u0446\u0430</p></body>"
    late = ('<html><head>' + snippet + '<meta http-equiv="Content-Type" content="text/html; charset=windows-1251">'
            '</head>' + body + '</html>')
    assert decode_html(late.encode("cp1251")) == (late, "cp1251")
    commented = '<html><head><!-- <meta charset="utf-8"> --><meta charset="windows-1251"></head>' + body + "</html>"
    assert decode_html(commented.encode("cp1251")) == (commented, "cp1251")
    second = '<html><head><meta charset="none"><meta charset="koi8-r"></head>' + body.replace("\u2014", "-") + "</html>"
    assert decode_html(second.encode("koi8-r")) == (second, "koi8-r")
    # in the body, past the prescan's bytes: not a declaration of the page (undeclared: UTF-8)
    in_body = "<html><head></head><body>" + snippet + '<p><meta charset="koi8-r">\u00e9</p></body></html>'
    assert decode_html(in_body.encode("utf-8")) == (in_body, "utf-8")


# ------------------------------------------------------------------------------------------------ readers

def source(kind, path, **kw):
    return Source(name="s", kind=kind, path=str(path), license="PSF-2.0", domain="docs", profile="prose", **kw)


def split(records):
    return [r for r in records if not isinstance(r, Quarantined)], [r for r in records if isinstance(r, Quarantined)]


def _warc(responses: list[tuple[str, bytes, str]]) -> bytes:
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    for url, body, content_type in responses:
        http = StatusAndHeaders("200 OK", [("Content-Type", content_type)], protocol="HTTP/1.1")
        writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(body), http_headers=http))
    return buf.getvalue()


LATIN = ("<html><body><article><p>Caf\u00e9 cr\u00e8me, na\u00efve fa\u00e7ades: a page written in Latin-1.</p>"
         "</article></body></html>")


def test_warc_responses_are_main_content_and_bad_pages_are_quarantined(pages, tmp_path):
    names = sorted(pages)
    good = [(f"https://example.org/{n}", planted_blog(pages[n]).encode(), "text/html; charset=utf-8") for n in names]
    app_shell = b"<html><head><script src='/app.js'></script></head><body><div id='root'></div></body></html>"
    bad = [("https://example.org/empty", app_shell, "text/html"),
           ("https://example.org/binary", bytes(range(256)) * 4, "text/html"),
           ("https://example.org/latin", LATIN.encode("latin-1"), "text/html; charset=iso-8859-1")]
    (tmp_path / "x.warc.gz").write_bytes(_warc(good + bad))
    docs, quarantined = split(list(read_source(source("warc", tmp_path / "x.warc.gz"), Reading())))
    assert [d.url for d in docs] == [u for u, _, _ in good] + ["https://example.org/latin"]
    for d, name in zip(docs, names):
        assert not [m for m in MARKERS.values() if m in d.text]
        assert kept_share(pages[name], d.text) >= 0.9
        assert d.meta["canonical_url"] == "https://example.org/blog/article.html"
        assert d.meta["html_language"] == "en-gb" and d.meta["date"] == "2024-03-02"
    assert docs[-1].text == LATIN[LATIN.index("Caf"):LATIN.index("</p>")]  # decoded as declared (as cp1252)
    assert [q.reason for q in quarantined] == ["no_main_content", "invalid_utf8"]



def test_a_truncated_warc_record_cut_inside_a_character_is_read_up_to_the_cut(tmp_path):
    """Crawlers cut a long response at a size limit and say so (`WARC-Truncated: length`, Common Crawl's); the cut
    falls inside a character two times in three in Chinese or Japanese UTF-8 (never in ASCII English), and the whole
    page was quarantined as invalid_utf8. A record that says it is truncated is decoded up to its last whole
    character; one that does not say so, or with a bad byte before the cut, is still quarantined."""
    from warcio.statusandheaders import StatusAndHeaders
    from warcio.warcwriter import WARCWriter

    head = "<html><head><meta charset='{}'><title>t</title></head><body><article>"
    para = "<p>\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3042\u308b\u3002</p>"  # 東京は日本の首都である。
    whole = head + para * 3 + "<p>\u4eac"  # the page as far as it came, then "京" cut after its first bytes
    for charset, codec, kept in (("utf-8", "utf-8", 2), ("shift_jis", "cp932", 1)):
        page = whole.format(charset)
        cut = page[:-1].encode(codec) + "\u4eac".encode(codec)[:kept]
        assert decode_html(cut, f"text/html; charset={charset}")[0] is None
        assert decode_html(cut, f"text/html; charset={charset}", truncated=True) == (page[:-1], codec)
    assert decode_html(b"<p>\xff\xe4\xba", "text/html; charset=utf-8", truncated=True)[0] is None  # bad before

    cut = whole.format("utf-8")[:-1].encode() + "\u4eac".encode()[:2]
    buf = io.BytesIO()
    writer = WARCWriter(buf, gzip=True)
    for url, warc_headers in (("https://example.jp/cut", {"WARC-Truncated": "length"}), ("https://example.jp/bad", {})):
        http = StatusAndHeaders("200 OK", [("Content-Type", "text/html; charset=utf-8")], protocol="HTTP/1.1")
        writer.write_record(writer.create_warc_record(url, "response", payload=io.BytesIO(cut), http_headers=http,
                                                      warc_headers_dict=warc_headers))
    (tmp_path / "x.warc.gz").write_bytes(buf.getvalue())
    docs, quarantined = split(list(read_source(source("warc", tmp_path / "x.warc.gz"), Reading())))
    assert [d.url for d in docs] == ["https://example.jp/cut"]
    assert docs[0].text.startswith("\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd")
    assert [q.reason for q in quarantined] == ["invalid_utf8"]


def test_warc_extractor_per_source(pages, tmp_path):
    (tmp_path / "x.warc.gz").write_bytes(_warc([("https://example.org/a", planted_sphinx(
        pages["tutorial-appetite.html"]).encode(), "text/html")]))
    docs, _ = split(list(read_source(source("warc", tmp_path / "x.warc.gz", html_extractor="visible_text"),
                                     Reading(html={"extractor": "trafilatura"}))))
    assert MARKERS["nav"] in docs[0].text  # the source's visible_text beats reading.html.extractor


def test_html_source_kind_from_a_folder(pages, tmp_path):
    site = tmp_path / "site"
    (site / "blog").mkdir(parents=True)
    (site / "blog" / "a.html").write_text(planted_blog(pages["howto-sorting.html"]))
    venv = pages["tutorial-venv.html"]
    canonical = re.search(r'<link rel="canonical"[^>]*>', venv)[0]  # Debian's build links to file:///usr/share/...
    (site / "b.htm").write_text(planted_sphinx(venv.replace(canonical, "")))
    (site / "empty.html").write_text("<html><body><div class='cookie-banner'>Accept cookies</div></body></html>")
    (site / "broken.html").write_bytes(b"<html><body><p>caf\xe9 \xff\xfe</p>")
    docs, quarantined = split(list(read_source(source("html", site), Reading())))
    assert [d.meta["locator"] for d in docs] == ["b.htm", "blog/a.html"]
    assert docs[0].url == "b.htm"  # no canonical link: the file's locator
    assert docs[1].url == "/blog/article.html"  # its canonical link (no page url to resolve it against)
    assert docs[1].meta["title"] == "Sorting HOW TO | Example Developer Blog"
    assert docs[1].meta["html_language"] == "en-gb"
    assert all(m not in d.text for d in docs for m in MARKERS.values())
    assert sorted((q.locator, q.reason) for q in quarantined) == [("broken.html", "invalid_utf8"),
                                                                  ("empty.html", "no_main_content")]


def test_html_in_a_jsonl_field(pages, tmp_path):
    rows = [{"id": "p1", "url": "https://example.org/p1", "raw": planted_blog(pages["tutorial-floatingpoint.html"]),
             "crawl": "2024-10"},
            {"id": "p2", "raw": "<html><body><footer>(c) 2024</footer></body></html>"},
            {"id": "p3", "raw": 42}]
    (tmp_path / "x.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    docs, quarantined = split(list(read_source(source("jsonl", tmp_path / "x.jsonl", html_field="raw"),
                                               Reading(html={"extractor": "resiliparse"}))))
    assert len(docs) == 1 and docs[0].url == "https://example.org/p1"
    assert "Floating Point Arithmetic: Issues and Limitations" in docs[0].text
    assert MARKERS["comment"] not in docs[0].text
    assert "raw" not in docs[0].meta and docs[0].meta["crawl"] == "2024-10" and docs[0].meta["date"] == "2024-03-02"
    assert [(q.locator, q.reason) for q in quarantined] == [("x.jsonl#L2", "no_main_content"),
                                                                 ("x.jsonl#L3", "text_not_string")]


def test_html_in_a_parquet_binary_column(pages, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    page = planted_blog(pages["howto-sorting.html"]).replace('charset="utf-8"', 'charset="windows-1252"')
    odd = b'<meta charset="shift_jis"><p>\x81\x20</p>'  # 0x81 leads a two-byte character, 0x20 cannot end one
    pq.write_table(pa.table({"id": ["a", "b"], "html": [page.encode("cp1252", errors="replace"), odd]}),
                   tmp_path / "x.parquet")
    docs, quarantined = split(list(read_source(source("parquet", tmp_path / "x.parquet", html_field="html"),
                                               Reading())))
    assert "Python lists have a built-in list.sort() method" in docs[0].text and docs[0].url == "/blog/article.html"
    assert [(q.locator, q.reason) for q in quarantined] == [("x.parquet#row1", "invalid_charset")]


def test_malformed_html_never_crashes_a_read(tmp_path):
    """Truncated tags, unbalanced nesting, hostile declarations, NUL bytes, deep nesting: each page is a document or
    quarantined with a reason, for every extractor."""
    hostile = ["<p>x</p><![ x ]>", "<html><body><p>An unclosed para<div><table><tr><td>cell",
               "<p>Text with a NUL \x00 byte and a truncated tag <a href='x", "<!DOCTYPE html><?php ?><svg><p>a",
               "<div>" * 5000 + "deep text in many divs" + "</div>" * 10, "&#xd800;&#x110000;<p>&amp</p>", "<", ""]
    for i, page in enumerate(hostile):
        (tmp_path / f"p{i}.html").write_text(page)
    for extractor in EXTRACTORS:
        docs, quarantined = split(list(read_source(source("html", tmp_path, html_extractor=extractor), Reading())))
        assert len(docs) + len(quarantined) == len(hostile)
        assert {q.reason for q in quarantined} <= {"no_main_content", "malformed_html", "empty_text", "empty_file"}
        for d in docs:
            d.text.encode("utf-8")  # strict: valid Unicode


def test_bad_extractor_names_the_key_and_the_choices():
    base = {"sources": [], "reading": {"html": {"extractor": "readability"}}}
    with pytest.raises(ConfigError, match=r"reading\.html\.extractor = 'readability'.*'trafilatura', "
                                          r"'resiliparse' or 'visible_text'"):
        parse_config(base)
    with pytest.raises(ConfigError, match=r"html_field is for kind jsonl or parquet.*use kind: html"):
        parse_config({"sources": [{"name": "w", "kind": "text", "path": "x", "license": "x", "domain": "web",
                                   "profile": "prose", "html_field": "raw"}]})
    with pytest.raises(ConfigError, match=r"sources\[0\]\.html_extractor = 'jusText'"):
        parse_config({"sources": [{"name": "w", "kind": "html", "path": "x", "license": "x", "domain": "web",
                                   "profile": "prose", "html_extractor": "jusText"}]})
