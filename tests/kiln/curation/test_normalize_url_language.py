"""The steps Kiln writes itself (normalize, URL blocklist, language); the published heuristics have their own file."""

import functools

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from py3langid.langid import MODEL_FILE, LanguageIdentifier

from kiln.curation.documents import Document
from kiln.curation.filters.language import LANGUAGES, _identifier, identify_many
from kiln.curation.filters.registry import build_step
from tests.conftest import prose


def doc(text, url=None):
    return Document(doc_id="d", source="s", text=text, url=url)


def test_normalize_repairs_mojibake_and_composes():
    step = build_step("normalize")
    assert step(doc("The caf\u00c3\u00a9 opens at nine.")).text == "The caf\u00e9 opens at nine."  # UTF-8 read as Latin-1
    assert step(doc("Cafe\u0301")).text == "Caf\u00e9"  # NFC composes
    assert step(doc("a\r\nb\rc\x00d\u200b")).text == "a\nb\ncd"
    assert step(doc("\u201cquoted\u201d")).text == "\u201cquoted\u201d"  # no cosmetic rewrites
    assert step(doc("def f():\n    return 1\n")).text == "def f():\n    return 1\n"  # indentation kept
    assert step(doc("\x00\x01  ")).drop == "normalize.empty_after_normalization"


def test_a_zero_width_space_between_khmer_myanmar_lao_or_thai_words_is_kept():
    """Khmer, Myanmar, Lao and Thai write no space between words; a zero-width space is where a word ends, the only
    boundary their text has, and it was stripped with the control characters. Elsewhere it is still stripped."""
    step = build_step("normalize")
    khmer = "\u1797\u17b6\u179f\u17b6\u200b\u1781\u17d2\u1798\u17c2\u179a"  # ភាសា​ខ្មែរ "Khmer language"
    thai = "\u0e20\u0e32\u0e29\u0e32\u200b\u0e44\u0e17\u0e22"  # ภาษา​ไทย "Thai language"
    myanmar = "\u1019\u103c\u1014\u103a\u1019\u102c\u200b\u1018\u102c\u101e\u102c"  # မြန်မာ​ဘာသာ
    for text in (khmer, thai, myanmar):
        assert step(doc(text)).text == text
    assert step(doc("zero\u200bwidth " + khmer + "\u200b.")).text == "zerowidth " + khmer + "."


def test_normalize_leaves_html_entities_as_written_whatever_else_the_line_holds():
    """ftfy's default decodes HTML entities on the lines it repairs, those with a non-ASCII character: the same code
    line lost its `&amp;` only where its comment had an accent, and escaped markup in prose became markup."""
    step = build_step("normalize")
    for text in ('s.replace("&amp;", "&")  # escape HTML', 's.replace("&amp;", "&")  # \u00e9chapper le HTML',
                 "\u00e9crivez &lt;br&gt; pour un saut de ligne"):
        assert step(doc(text)).text == text
    assert step(doc("caf\u00c3\u00a9 &amp; cr\u00c3\u00a8me")).text == "caf\u00e9 &amp; cr\u00e8me"  # mojibake still repaired


@pytest.mark.parametrize("url, dropped", [
    ("https://blocked.example/page", True),
    ("http://www.blocked.example/a?b=c", True),
    ("https://notblocked.example/", False),
    ("https://python.org/", False),
    (None, False),
])
def test_url_blocklist_blocks_domains_and_subdomains(url, dropped):
    verdict = build_step("url_blocklist")(doc("text", url))
    assert (verdict.drop == "url_blocklist.blocked_domain") is dropped


def test_url_blocklist_custom_file(tmp_path):
    path = tmp_path / "domains.txt"
    path.write_text("# spam farms\nspam.org\n")
    step = build_step("url_blocklist", {"domains_file": str(path)})
    assert not step(doc("t", "https://a.spam.org/x")).kept
    with pytest.raises(ValueError, match="does not exist"):
        build_step("url_blocklist", {"domains_file": str(tmp_path / "missing.txt")})


def test_language_keeps_english_drops_others_and_records_the_score():
    step = build_step("language", {"languages": ["en"], "min_score": 0.65})
    english = doc(prose(1))
    assert step(english).kept and english.meta["language"] == "en" and english.meta["language_score"] > 0.9
    german = doc("Die Stadt am Fluss wurde auf dem Handel mit Salz und Holz gegründet, und zwei Jahrhunderte lang "
                 "führten ihre Kaufleute sorgfältig Buch über jedes Schiff, das die Schleuse passierte.")
    assert step(german).drop == "language.other_language"
    assert build_step("language", {"languages": ["de"]})(german).kept
    with pytest.raises(ValueError, match="unknown language"):
        build_step("language", {"languages": ["klingon"]})


# The language step walks py3langid's byte automaton for a whole batch in numpy; py3langid's own per-text walk is
# the second implementation: every (language, probability) must be bit-identical.
@functools.cache
def _reference_identifier() -> LanguageIdentifier:
    return LanguageIdentifier.from_model_file(MODEL_FILE, norm_probs=True)


LANGUAGE_SAMPLES = [
    "", " ", "a", "THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG", "Der schnelle braune Fuchs springt über den Hund.",
    "日本語のテキストです。", "Ωμέγα και άλφα", "\u212a\u0130", "def f(x):\n    return x ** 2\n", "ÄÖÜ HELLO WORLD",
]


@settings(max_examples=100, deadline=None, derandomize=True)
@given(st.lists(st.one_of(st.sampled_from(LANGUAGE_SAMPLES), st.text(max_size=300),
                          st.text(alphabet="abcdefghij ÉÀ\n.,", max_size=300)), min_size=1, max_size=12))
def test_language_batch_is_py3langids_own_classification(texts):
    reference = _reference_identifier()
    texts = [t + prose(i) if i % 3 == 0 else t for i, t in enumerate(texts)]  # long texts too
    expected = [(lang, float(p)) for lang, p in (reference.classify(t[:4000]) for t in texts)]
    assert identify_many(texts, max_chars=4000) == expected
    assert [(lang, float(p)) for lang, p in _identifier().classify_many([t[:4000] for t in texts], chunk_bytes=64)] \
        == expected  # many chunks


def test_the_codes_a_config_may_name_are_the_models_classes():
    """Config parsing checks codes against `LANGUAGES` without loading the model; py3langid's model file decides."""
    assert LANGUAGES == frozenset(_reference_identifier().nb_classes)


def test_soft_hyphens_and_word_joiners_are_removed_so_a_hyphenated_copy_is_the_same_text():
    """A CMS's hyphenation (`&shy;`) reaches the text as U+00AD in every long word with the default extractor
    (resiliparse keeps it; trafilatura drops it): invisible, yet it cut each such word in two for every word-based
    stage, so the hyphenated copy of a page was neither an exact nor a near duplicate of the plain one, and a listed
    bad word evaded the bad-words rule. U+2060 (word joiner) is as invisible."""
    from kiln.common.config import ShingleNormalization
    from kiln.curation.pipeline import content_hash
    from kiln.dedup.text import normalized_words

    step = build_step("normalize")
    plain = "Die Donaudampfschifffahrtsgesellschaft ver\u00f6ffentlichte ihre Jahresbilanz: 100\u20ac pro Aktie."
    hyphenated = ("Die Donau\u00addampf\u00adschiff\u00adfahrts\u00adgesellschaft ver\u00ad\u00f6ffentlichte ihre "
                  "Jahres\u00adbilanz: 100\u2060\u20ac pro Aktie.")
    assert step(doc(hyphenated)).text == plain
    assert content_hash(step(doc(hyphenated)).text) == content_hash(plain)
    assert normalized_words(step(doc(hyphenated)).text, ShingleNormalization()) == [
        "die", "donaudampfschifffahrtsgesellschaft", "veröffentlichte", "ihre", "jahresbilanz", "000", "pro", "aktie"]
    assert step(doc("\u00ad\u2060")).drop == "normalize.empty_after_normalization"
    assert build_step("normalize", {"strip_control": False})(doc(hyphenated)).text == hyphenated
