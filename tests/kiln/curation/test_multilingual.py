"""Settings per language (Gopher's stop words per language, `per_language` in profiles), the per-language funnel, and
the `multilingual` builtin corpus (translated manual pages rendered by groff)."""

import gzip
import json
import unicodedata
from pathlib import Path

import pytest

from kiln.common.config import ConfigError, Reading, Source, parse_config
from kiln.common.stats import StageStats, funnel_markdown
from kiln.common.storage import Store
from kiln.curation.documents import Document
from kiln.curation.filters.registry import STEPS, build_step
from kiln.curation.filters.stopwords import LANGUAGE_DEFAULTS
from kiln.curation.pipeline import build_steps, filter_documents, ingest, profile_steps, run_steps
from kiln.curation.readers import Quarantined, builtin
from tests.conftest import SERIAL_ENGINE, write_jsonl
from tests.man_pages import man_pages

# 38 words. German stop words (FineWeb-2's list): Die, der, und, das, in, dem, des, Mit, wurde; Gopher's English
# ones: none.
GERMAN = ("Dieses Programm zeigt Informationen über Dateien an. Die Einträge werden alphabetisch sortiert, falls "
          "keine andere Sortierung angegeben wurde. Mit der Option kann man versteckte Dateien anzeigen lassen, und "
          "das Ergebnis erscheint in einer Liste auf dem Bildschirm des Benutzers.")
# 38 words. Gopher's stop words: the (x5), of, and, with, that, have; German ones: none.
ENGLISH = ("The program lists information about the files of the directory and sorts the entries alphabetically when "
           "no other order is given with the sort option, so that users have a clear view of their data on the "
           "screen every time.")
FRENCH = ("Cette commande affiche des informations sur les fichiers du répertoire courant. Les entrées sont triées "
          "par ordre alphabétique si aucune autre option de tri n'est indiquée par l'utilisateur dans la ligne de "
          "commande.")


def doc(text: str, language: str | None = None) -> Document:
    """A document as the language step leaves it: identified as `language` (with a score), or not identified."""
    meta = {} if language is None else {"language": language, "language_score": 0.99}
    return Document(doc_id=text[:10], source="s", text=text, meta=meta, identified_language=language)


def test_gopher_stop_words_follow_the_documents_language():
    """German text has none of Gopher's eight English stop words: judged as English (no language) it is dropped,
    judged as German it is kept; English text judged with German stop words is dropped. Batch and per-document
    verdicts agree, and a mixed batch keeps its order."""
    step = build_step("gopher_quality", {"min_doc_words": 20})
    assert step(doc(GERMAN)).drop == "gopher_quality.min_stop_words"
    assert step(doc(GERMAN, "de")).kept
    assert step(doc(ENGLISH)).kept and step(doc(ENGLISH, "en")).kept
    assert step(doc(ENGLISH, "de")).drop == "gopher_quality.min_stop_words"
    batch = [doc(GERMAN, "de"), doc(ENGLISH, "de"), doc(GERMAN), doc(ENGLISH, "en"), doc(GERMAN, "de")]
    assert [v.drop for v in step.batch(batch)] == [step(d).drop for d in batch] == [
        None, "gopher_quality.min_stop_words", "gopher_quality.min_stop_words", None, None]


def test_a_records_own_language_field_is_no_identification_and_never_crashes_the_step():
    """Readers keep a record's fields in its meta: a `language` of its own (a list, a number, a code with no score)
    is not what the language step identified, so the step's own settings judge it, as a document with none."""
    step = build_step("gopher_quality", {"min_doc_words": 20})
    records = [Document(doc_id=f"r{i}", source="s", text=GERMAN, meta={"language": value})
               for i, value in enumerate((["de", "fr"], 7, {"code": "de"}, "de"))]
    assert [v.drop for v in step.batch(records)] == ["gopher_quality.min_stop_words"] * 4
    assert step.batch([doc(GERMAN, "de")])[0].kept  # identified as German: German stop words


def test_chinese_needs_a_share_of_stop_characters_not_just_two():
    """Chinese words are characters (kiln.common.text_units): 2 stop characters (的, 是) in 34 are 5.9%, kept; the
    same 2 in 98 characters are 2.0%, under zh's 4% (min_stop_word_ratio), dropped; English has no such rule."""
    plain = "显示文件信息目录内容列出全部选项"  # 16 characters, none of them a zh stop character
    step = build_step("gopher_quality", {"min_doc_words": 20})
    assert step(doc("的" + plain + "是" + plain, "zh")).kept
    assert step(doc("的" + plain * 6 + "是", "zh")).drop == "gopher_quality.min_stop_word_ratio"
    assert step.batch([doc("的" + plain * 6 + "是", "zh")])[0].drop == "gopher_quality.min_stop_word_ratio"


def test_a_profiles_per_language_settings_reach_the_step_after_the_language_step():
    """The language step identifies each document; gopher_quality then runs with the settings of that language:
    German with min_doc_words 1000 (the profile's per_language), English with the profile's 20."""
    config = parse_config({
        "sources": [{"name": "s", "kind": "jsonl", "path": "x", "license": "CC0", "domain": "web", "profile": "p"}],
        "profiles": {"p": [{"language": {"languages": ["de", "en"]}},
                           {"gopher_quality": {"min_doc_words": 20, "per_language": {"de": {"min_doc_words": 1000}}}}]},
        "engine": SERIAL_ENGINE})
    spec = config.profiles["p"][1]
    assert spec.params == {"min_doc_words": 20} and spec.per_language == {"de": {"min_doc_words": 1000}}
    docs = [doc(GERMAN), doc(ENGLISH)]
    reasons = run_steps(docs, build_steps(profile_steps(config, "s")), StageStats(), 0)
    assert [d.meta["language"] for d in docs] == ["de", "en"]
    assert reasons == ["gopher_quality.min_doc_words", None]
    # A dumped config reads back to the same settings.
    again = parse_config(config.model_dump())
    assert again.profiles["p"][1] == spec


def _profile_error(steps) -> str:
    with pytest.raises(ConfigError) as exc:
        parse_config({"sources": [{"name": "s", "kind": "jsonl", "path": "x", "license": "CC0", "domain": "web",
                                   "profile": "p"}], "profiles": {"p": steps}})
    return str(exc.value)


def test_a_steps_parameter_values_are_checked_against_their_types_when_the_config_loads():
    """Before, a wrong value loaded and the stage failed at its first document ("'<' not supported between
    instances of 'int' and 'str'"): now the config names the step, the parameter, the value and the default."""
    message = _profile_error([{"gopher_quality": {"min_doc_words": "many"}}])
    assert ("profiles.p[0] (gopher_quality): min_doc_words: Input should be a valid integer, unable to parse string "
            "as an integer (given 'many'; default 50)") in message
    assert "form: Input should be 'NFC', 'NFKC', 'NFD' or 'NFKD' (given 'NFX'; default 'NFC')" in \
        _profile_error([{"normalize": {"form": "NFX"}}])
    assert ("profiles.p[1] (gopher_quality).per_language.de: min_stop_words: Input should be a valid integer "
            "(given [1]; default 2)") in \
        _profile_error(["language", {"gopher_quality": {"per_language": {"de": {"min_stop_words": [1]}}}}])
    assert "profiles.p[0] (c4): its parameters are a mapping of name: value, got 5" in \
        _profile_error([{"step": "c4", "params": 5}])
    assert "profiles.p[0]: a step's name is a string, got ['c4']" in _profile_error([{"step": ["c4"], "params": {}}])


def test_a_steps_parameter_values_are_checked_against_their_ranges_when_the_config_loads():
    """Before, a fraction of 1.5 or a negative count loaded and the step silently kept or dropped everything: now the
    config names the step, the parameter, the value, the range allowed and the default."""
    assert ("profiles.p[0] (gopher_quality): max_bullet_lines_ratio: Input should be less than or equal to 1 "
            "(given 1.5; allowed: at least 0 and at most 1, or null; default 0.9)") in \
        _profile_error([{"gopher_quality": {"max_bullet_lines_ratio": 1.5}}])
    assert ("profiles.p[0] (gopher_repetition): dup_line_frac: Input should be greater than or equal to 0 "
            "(given -0.2; allowed: at least 0 and at most 1, or null; default 0.3)") in \
        _profile_error([{"gopher_repetition": {"dup_line_frac": -0.2}}])
    assert ("profiles.p[0] (c4): min_words_per_line: Input should be greater than or equal to 0 (given -1; allowed: "
            "at least 0, or null; default 3)") in _profile_error([{"c4": {"min_words_per_line": -1}}])
    # An n-gram size of 0 and a fraction over 1 inside the pairs: each named by its place in the list.
    message = _profile_error([{"gopher_repetition": {"top_n_grams": [[0, 0.2], [3, 1.2]]}}])
    assert "top_n_grams.0.0: Input should be greater than 0 (given 0; allowed: over 0; default ((2, 0.2)," in message
    assert "top_n_grams.1.1: Input should be less than or equal to 1 (given 1.2; allowed: at least 0 and at most 1;" \
        in message
    # Where the edge itself drops every page: FineWeb drops at line_punct ratio <= thr and short lines >= thr.
    assert ("profiles.p[0] (fineweb_quality): line_punct_thr: Input should be less than 1 (given 1; allowed: at "
            "least 0 and under 1, or null; default 0.12)") in \
        _profile_error([{"fineweb_quality": {"line_punct_thr": 1}}])
    assert "short_line_thr: Input should be greater than 0 (given 0; allowed: over 0 and at most 1, or null;" in \
        _profile_error([{"fineweb_quality": {"short_line_thr": 0}}])
    assert "profiles.p[0] (language): languages: List should have at least 1 item" in \
        _profile_error([{"language": {"languages": []}}])
    # In a per-language setting: the key goes on to the language.
    assert ("profiles.p[1] (gopher_quality).per_language.de: min_stop_word_ratio: Input should be less than or equal "
            "to 1 (given 4; allowed: at least 0 and at most 1, or null; default None)") in \
        _profile_error(["language", {"gopher_quality": {"per_language": {"de": {"min_stop_word_ratio": 4}}}}])


def test_a_minimum_above_its_maximum_is_refused_for_the_profile_and_for_each_language():
    assert ("profiles.p[0] (gopher_quality): min_doc_words (200) is above max_doc_words (100), so no document can "
            "pass both: lower min_doc_words or raise max_doc_words (null turns a rule off)") in \
        _profile_error([{"gopher_quality": {"min_doc_words": 200, "max_doc_words": 100}}])
    assert "profiles.p[0] (code_quality): min_chars (30) is above max_chars (20)" in \
        _profile_error([{"code_quality": {"min_chars": 30, "max_chars": 20}}])
    # The profile's 200 words for every language, Chinese's own maximum 100: refused for zh.
    assert "profiles.p[1] (gopher_quality).per_language.zh: min_doc_words (200) is above max_doc_words (100)" in \
        _profile_error(["language", {"gopher_quality": {"min_doc_words": 200,
                                                        "per_language": {"zh": {"max_doc_words": 100}}}}])
    # A per-language maximum below the published English minimum (3) but not German's own (0): accepted.
    build_step("gopher_quality", {}, {"de": {"max_avg_word_length": 2}})
    # A profile's minimum average word length of 10 is within English's 3-10, above Japanese's default maximum of 6.
    message = _profile_error(["language", {"gopher_quality": {"min_avg_word_length": 10}}])
    assert "profiles.p[1] (gopher_quality): settings for 'ja' documents" in message
    assert "per_language.ja can set any of them): min_avg_word_length (10.0) is above max_avg_word_length (6.0)" \
        in message


def test_boundary_values_of_a_range_are_accepted_where_they_mean_something():
    """0 and 1 for rules that drop above a threshold (0: drop on any match, as C4's bad words), a minimum equal to
    its maximum, null for any rule; every step with its defaults and every language's defaults."""
    for name, params in [("badwords", {"max_ratio": 0.0}), ("badwords", {"max_ratio": 1}),
                         ("gopher_quality", {"min_doc_words": 0, "max_symbol_word_ratio": 0,
                                             "max_bullet_lines_ratio": 1, "min_stop_words": 0,
                                             "min_stop_word_ratio": 1}),
                         ("gopher_quality", {"min_doc_words": 10, "max_doc_words": 10}),
                         ("gopher_quality", {"min_doc_words": None, "max_doc_words": 1, "max_avg_word_length": 1,
                                             "min_avg_word_length": 0}),
                         ("gopher_repetition", {"dup_line_frac": 0, "dup_para_frac": 1, "top_n_grams": [[1, 0]]}),
                         ("fineweb_quality", {"line_punct_thr": 0, "short_line_thr": 1, "char_duplicates_ratio": 1,
                                              "short_line_length": 0, "new_line_ratio": 2.5}),
                         ("garbage", {"max_soup_fraction": 1, "soup_screen": 0, "link_density": 0,
                                      "boilerplate_screen": 3}),
                         ("code_quality", {"min_chars": 0, "max_chars": 1, "min_alnum_fraction": 1,
                                           "max_encoded_fraction": 0, "autogen_scan_lines": 0}),
                         ("language", {"min_score": 0}), ("language", {"min_score": 1}),
                         ("c4", {"min_words_per_line": 0, "min_num_sentences": 0, "max_word_length": 1})]:
        build_step(name, params)
    for name in STEPS:
        build_step(name)
    assert sorted(build_step("gopher_quality")._by_language) == sorted(LANGUAGE_DEFAULTS["gopher_quality"])


def test_per_language_settings_are_checked_when_the_config_loads():
    message = _profile_error(["language", {"gopher_quality": {"per_language": {"german": {"min_doc_words": 5}}}}])
    assert "profiles.p[1] (gopher_quality).per_language: unknown language code 'german'" in message
    assert "ISO 639-1" in message
    message = _profile_error(["language", {"gopher_quality": {"per_language": {"de": {"min_words": 5}}}}])
    assert "profiles.p[1] (gopher_quality).per_language.de: step 'gopher_quality' has no parameter(s) ['min_words']" \
        in message
    message = _profile_error([{"gopher_quality": {"per_language": {"de": {"min_doc_words": 5}}}}, "language"])
    assert "profiles.p[0] (gopher_quality).per_language" in message
    assert "move `- language` above `- gopher_quality`" in message
    message = _profile_error([{"language": {"per_language": {"de": {"min_score": 0.3}}}}])
    assert "profiles.p[0] (language).per_language" in message and "no per-language settings" in message
    message = _profile_error(["language", {"gopher_quality": {"per_language": {"de": 5}}}])
    assert "profiles.p[1] (gopher_quality).per_language.de must be a mapping" in message


def _filtered(tmp_path, records: list[dict], profile: list) -> tuple[StageStats, Store]:
    """`records` read and filtered through `profile` as the filter stage does, one source `s`."""
    write_jsonl(tmp_path / "src" / "a.jsonl", records)
    config = parse_config({
        "sources": [{"name": "s", "kind": "jsonl", "path": str(tmp_path / "src"), "license": "CC0", "domain": "web",
                     "profile": "p"}],
        "profiles": {"p": profile}, "engine": SERIAL_ENGINE})
    store = Store(tmp_path / "store")
    with store.staging("raw", "s") as w:
        w.commit(code_version="t", config={}, inputs={}, counts={},
                 stats=ingest(config.sources[0], config.reading, w, progress=False).to_dict())
    with store.staging("filtered", "s") as w:
        stats = filter_documents(store.files("raw", "s", "documents"), profile_steps(config, "s"),
                                 config.curation.exact_dedup, w, progress=False)
        w.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())
    return stats, store


def test_the_filter_funnel_counts_documents_per_identified_language(tmp_path):
    """German, English and French documents through a profile keeping de and en: 1 in / 1 kept for de and en, 1 in /
    0 kept for fr, in the stage's statistics, their dict form and the funnel's markdown (counts only, no text)."""
    stats, _ = _filtered(tmp_path, [{"id": "de", "text": GERMAN}, {"id": "en", "text": ENGLISH},
                                    {"id": "fr", "text": FRENCH}],
                         [{"language": {"languages": ["de", "en"]}}, {"gopher_quality": {"min_doc_words": 20}}])
    assert dict(stats.languages_in) == {"de": 1, "en": 1, "fr": 1}
    assert +stats.languages_out == {"de": 1, "en": 1}
    as_dict = stats.to_dict()
    assert as_dict["languages"] == {"de": {"in": 1, "kept": 1}, "en": {"in": 1, "kept": 1},
                                    "fr": {"in": 1, "kept": 0}}
    again = StageStats.from_dict(as_dict)
    assert again.languages_in == stats.languages_in and +again.languages_out == +stats.languages_out
    markdown = funnel_markdown(stats)
    assert "| fr | 1 | 0 | 0.0% |" in markdown and "| de | 1 | 1 | 100.0% |" in markdown
    assert "Dateien" not in markdown and "fichiers" not in markdown


def test_a_records_own_language_and_score_fields_do_not_choose_the_settings_or_count_in_the_funnel(tmp_path):
    """CCNet and RedPajama records carry `language` and `language_score` of their own, which readers keep in meta.
    With no language step in the profile (or before it) no language was identified: English prose labelled "zh" by
    its record is judged with the step's own (English) settings and kept, where Chinese defaults dropped it, and the
    funnel counts no language."""
    stats, store = _filtered(tmp_path, [{"id": "en", "text": ENGLISH, "language": "zh", "language_score": 0.97}],
                             [{"gopher_quality": {"min_doc_words": 20}}])
    assert stats.docs_out == 1 and not stats.languages_in
    [kept] = store.read_table("filtered", "s").to_pylist()
    assert json.loads(kept["meta"])["language"] == "zh"  # the record's own field, kept as it came


# ---- the multilingual builtin corpus --------------------------------------------------------------------------------

PAGE = """.\\" a hand-written page
.TH FOO 1 "2024-01-01" "Kiln" "Benutzerbefehle"
.SH NAME
foo \\- zeigt etwas an
.SH BESCHREIBUNG
Der Befehl zeigt die Dateien und Verzeichnisse.
"""


def _gz(path: Path, text: str | bytes) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(text.encode() if isinstance(text, str) else text))


def test_multilingual_corpus_renders_pages_skips_aliases_and_quarantines_what_fails(tmp_path, monkeypatch):
    _gz(tmp_path / "de" / "man1" / "foo.1.gz", PAGE)
    (tmp_path / "de" / "man1" / "bar.1.gz").symlink_to("foo.1.gz")  # another name of foo
    _gz(tmp_path / "de" / "man1" / "baz.1.gz", ".so man1/foo.1\n")  # an alias by inclusion
    (tmp_path / "de" / "man1" / "bad.1.gz").write_bytes(b"\x1f\x8b not gzip at all")
    (tmp_path / "zh_CN" / "man8").mkdir(parents=True)
    (tmp_path / "zh_CN" / "man8" / "qux.8").write_text(".TH QUX 8\n.SH 名称\nqux \\- 修改用户的帐户信息\n", "utf-8")
    monkeypatch.setattr(builtin, "MAN_ROOT", tmp_path)
    source = Source(name="ml", kind="builtin", corpus="multilingual", license="GPL-3.0-or-later", domain="reference",
                    profile="p")
    records = list(builtin.read_builtin(source, Reading()))
    docs = {d.meta["man_page"]: d for d in records if isinstance(d, Document)}
    (bad,) = [r for r in records if isinstance(r, Quarantined)]
    assert sorted(docs) == ["foo", "qux"] and len(records) == 3
    assert bad.reason == "man_unreadable" and bad.locator == "man/de/man1/bad.1.gz"
    foo = docs["foo"]
    assert foo.url == "man:foo(1)@de" and foo.meta["expected_language"] == "de" and foo.meta["man_section"] == "1"
    assert "language" not in foo.meta  # the language step's key stays free
    lines = foo.text.splitlines()
    assert lines[0].split() == ["FOO(1)", "Benutzerbefehle", "FOO(1)"]
    assert "       Der Befehl zeigt die Dateien und Verzeichnisse." in lines
    assert "       foo - zeigt etwas an" in lines
    assert docs["qux"].meta["expected_language"] == "zh" and "修改用户的帐户信息" in docs["qux"].text
    assert [r.doc_id for r in builtin.read_builtin(source, Reading()) if isinstance(r, Document)] == \
        [r.doc_id for r in records if isinstance(r, Document)]


def _script_share(text: str, script: str) -> float:
    letters = [c for c in text if c.isalpha()]
    return sum(script in unicodedata.name(c, "") for c in letters) / max(len(letters), 1)


@pytest.mark.parametrize("directory,check", [
    ("de", lambda t: _script_share(t, "LATIN") > 0.9 and any(c in t for c in "äöüßÄÖÜ")),
    ("ru", lambda t: _script_share(t, "CYRILLIC") > 0.3),
    ("ja", lambda t: _script_share(t, "HIRAGANA") + _script_share(t, "KATAKANA") > 0.05),
    ("zh_CN", lambda t: _script_share(t, "CJK UNIFIED") > 0.1),  # chpasswd(8)'s: 15%, its options untranslated
])
def test_installed_translated_pages_render_in_their_script(directory, check):
    """Two installed pages per language (Debian's manpages-de, -ru, -ja, -zh; .ci/run installs them) render to text
    in that language's script."""
    texts = man_pages(directory, 2)
    assert all(t.strip() and check(t) for t in texts)


# A Chinese news article, written for this test: four sentences on four lines, each ending in 。(no spaces anywhere).
ZH_ARTICLE = ("今年春天，市政府宣布在老城区修建一座新的公共图书馆。\n"
              "新图书馆将收藏二十万册图书，并为儿童设立专门的阅读区。\n"
              "工程预计明年秋天完工，届时市民可以免费借阅。\n"
              "许多居民表示，他们期待周末带着孩子去那里读书。")
JA_ARTICLE = ("今日は朝から雨が降っていました。午後になると少し晴れてきました。\n"
              "駅前の本屋で新しい料理の本を買いました。夕方には友人と喫茶店で話しました。\n"
              "帰り道に公園を通ると、桜がきれいに咲いていました。明日も晴れるといいです。")


def test_chinese_and_japanese_lines_are_content_and_their_sentences_count():
    """Kiln splits Chinese and Japanese into characters everywhere but here: the garbage step counted a whole
    unspaced sentence as one word and did not know 。 as a sentence end, so every line was a "title" (short, no
    terminal punctuation, 3 words or fewer) and the web profile dropped every Chinese, Japanese or Thai page as a stub;
    C4 counted one sentence per line. Worked by hand: each ZH line is a sentence, so is each 。 of JA (6 on 3 lines)."""
    from kiln.curation.filters.garbage import classify_line, content_words
    from kiln.curation.filters.text_stats import count_sentences

    web_garbage = build_step("garbage", {"max_repeated_line_fraction": 0.7, "min_content_words": 30})
    for article in (ZH_ARTICLE, JA_ARTICLE):
        assert all(classify_line(line)[0] == "content" for line in article.splitlines()), article
        # every Han character and kana a unit weighing 5/8 of a word (text_units.weighed_count, as Gopher counts a
        # document's words), every mark of punctuation (、，。) a word of its own
        weighed = sum(5 / 8 if unicodedata.name(c).startswith(("CJK UNIFIED", "HIRAGANA", "KATAKANA")) else 1
                      for c in "".join(article.split()))
        assert content_words(article) == weighed
        assert web_garbage(Document("d", "s", article)).drop is None
    assert [count_sentences(line) for line in ZH_ARTICLE.splitlines()] == [1, 1, 1, 1]
    assert [count_sentences(line) for line in JA_ARTICLE.splitlines()] == [2, 2, 2]
    assert build_step("c4", {"min_num_sentences": 5})(Document("d", "s", JA_ARTICLE)).drop is None
    # a menu is still one: three short items, no sentence end
    assert classify_line("首页")[0] == "boilerplate"
    assert web_garbage(Document("d", "s", "首页\n新闻\n联系我们")).drop is not None


# A Chinese pottery site's navigation page, written for this test as tests/kiln/curation/test_garbage_filters.py's
# English one (navigation_page): skip link, menu bar, breadcrumb, linked and plain headlines, footer.
ZH_MENU = ["首页", "关于我们", "产品", "服务", "价格", "博客", "招聘", "联系我们"]
ZH_HEADLINES = ["釉料配方的十个技巧", "如何用有限的预算建工作室", "窑炉入门完全指南", "为什么大家都在谈乐烧",
                "初学者最适合的五种黏土"]
ZH_NAVIGATION = "\n".join(["跳到主要内容", " | ".join(ZH_MENU), "首页 > 工作坊 > 烧制",
                           *[f"* [{h}](https://pottery.example.cn/{i}/)" for i, h in enumerate(ZH_HEADLINES)],
                           "相关文章", *ZH_HEADLINES, "隐私政策 · 使用条款 · Cookie 政策", "© 2024 陶艺传媒 版权所有"])


@pytest.mark.parametrize("line", [" | ".join(ZH_MENU), "首页 > 工作坊 > 烧制", "ホーム | 会社概要 | 製品 | お問い合わせ",
                                  "홈 | 회사 소개 | 제품 | 연락처", "หน้าแรก | เกี่ยวกับเรา | สินค้า | ติดต่อเรา",
                                  "الرئيسية | من نحن | المنتجات | اتصل بنا", "होम | हमारे बारे में | उत्पाद | संपर्क",
                                  "ホーム｜会社概要｜製品｜お問い合わせ", "首页｜新闻｜关于我们｜联系我们"])
def test_a_menu_in_a_script_without_capitals_is_a_menu(line):
    """A menu item had to start with a capital, so a menu bar of Chinese, Japanese, Korean, Thai, Arabic or Hindi
    (scripts without case) was content, and the Chinese navigation page below was kept where its English twin is
    dropped; nor was the full-width bar that Chinese and Japanese menus write without spaces (｜) a separator.
    Worked by hand: every item is at most four words (a Han character 5/8 of one: 联系我们 2.5)."""
    from kiln.curation.filters.garbage import classify_line

    assert classify_line(line)[0] == "boilerplate"


def test_a_chinese_navigation_page_is_dropped_and_articles_are_not():
    """Worked by hand from the lines' kinds: boilerplate, the menu bar (8 items, 19.5 words), the breadcrumb, the five
    link lines, 相关文章 and the footer; content, the skip link and the five plain headlines (35.0 words of 115.875):
    70% boilerplate, over technical_docs' max_boilerplate_fraction 0.5 (it was 47%, kept, with the menu bar and the
    breadcrumb as content)."""
    from kiln.curation.filters.garbage import boilerplate_fraction

    share, lines = boilerplate_fraction(ZH_NAVIGATION)
    assert lines == 10 and share == pytest.approx(1 - 35.0 / 115.875)
    tech = build_step("garbage", {})
    assert tech(Document("d", "s", ZH_NAVIGATION)).drop == "garbage.link_density"
    unspaced = ZH_NAVIGATION.replace(" | ", "｜").replace(" > ", "｜")  # the same page, bars written without spaces
    assert boilerplate_fraction(unspaced) == (share, lines)
    assert tech(Document("d", "s", unspaced)).drop == "garbage.link_density"
    for article in (ZH_ARTICLE, JA_ARTICLE, " ".join(ZH_HEADLINES)):  # sentences; headlines run together
        assert tech(Document("d", "s", article)).drop is None


# A Japanese site's link list, written for this test: eight "<title> - <URL>" lines, each title a four-kanji noun,
# as Japanese navigation writes them (company profile, careers, terms of use, products, case studies, developers,
# changelog, technical documents).
JA_LINK_LIST = "\n".join(f"{title} - https://www.example.jp/{slug}" for title, slug in [
    ("会社概要", "company"), ("採用情報", "careers"), ("利用規約", "terms"), ("製品一覧", "products"),
    ("導入事例", "cases"), ("開発情報", "developers"), ("更新履歴", "changes"), ("技術資料", "docs")])
# A Japanese diary entry with links, written for this test: three sentences with two links in them, a bare map URL and
# a "related articles" heading over two Markdown links.
JA_LINKED_ARTICLE = ("今日は朝から雨が降っていました。午後になると少し晴れてきました。\n"
                     "駅前の本屋で[新しい料理の本](https://books.example.jp/item/42)を買いました。\n"
                     "帰り道に公園を通ると、桜がきれいに咲いていました。\n"
                     "地図: https://sakura.example.jp/map\n"
                     "写真は[こちら](https://photos.example.jp/2026/04)にまとめました。\n"
                     "関連記事\n"
                     "- [桜の名所](https://sakura.example.jp/)\n"
                     "- [雨の日の過ごし方](https://blog.example.jp/rain)")


def test_japanese_and_thai_link_lines_weigh_their_words_as_everywhere_else():
    """The link-list rules counted each character of an unspaced script as a whole word: a four-kanji link title
    (会社概要, "company profile", two words) made four, more than the three of a short line, so a Japanese link list
    was all content and kept (the bench's Japanese link lists were caught 84%); a Thai menu item (หน้าแรก, "home",
    6 letters) made six. Words weigh as Gopher's and C4's: a Han character or kana 5/8 of a word, a Thai letter 1/4.
    Worked by hand: each line of JA_LINK_LIST is 4 x 5/8 = 2.5 words and its URL one: short, no sentence end,
    boilerplate, 8 lines of 3.5 words, all of the list."""
    from kiln.curation.filters.garbage import boilerplate_fraction, classify_line, content_words

    tech = build_step("garbage", {})  # technical_docs' garbage step
    web = build_step("garbage", {"max_repeated_line_fraction": 0.7, "min_content_words": 30})
    assert [classify_line(line) for line in JA_LINK_LIST.splitlines()] == [("boilerplate", 3.5)] * 8
    assert boilerplate_fraction(JA_LINK_LIST) == (1.0, 8)
    for step in (tech, web):
        assert step(Document("d", "s", JA_LINK_LIST)).drop == "garbage.link_density"
    # Thai: หน้าแรก is ห น้ า แ ร ก, 6 letters with their marks (1.5 words); เกี่ยวกับเรา is เ กี่ ย ว กั บ เ ร า (9, 2.25)
    assert classify_line("หน้าแรก - https://www.example.co.th/") == ("boilerplate", 2.5)
    assert classify_line("[เกี่ยวกับเรา](https://www.example.co.th/about)") == ("boilerplate", 3.25)

    # The article, by hand (units of 5/8, 、。 a word each, a URL one word):
    #   sentences: 30 units + 2 marks = 20.75; 19 units + 1 = 12.875 and the link's URL: 13.875, its link words
    #   (新しい料理の本, 7 units, and the URL) 5.375, under half; 23 + 2 = 16.375; 13 + 1 = 9.125 and the URL: 10.125
    #   boilerplate: 地図 and the URL 2.25 (a short line); 関連記事 2.5 (short); 桜の名所 2.5 + 1; 8 units 5 + 1
    kinds = [classify_line(line) for line in JA_LINKED_ARTICLE.splitlines()]
    assert kinds == [("content", 20.75), ("content", 13.875), ("content", 16.375), ("boilerplate", 2.25),
                     ("content", 10.125), ("boilerplate", 2.5), ("boilerplate", 3.5), ("boilerplate", 6)]
    assert boilerplate_fraction(JA_LINKED_ARTICLE) == (14.25 / 75.375, 4)  # 14.25 of 14.25 + 61.125 words
    assert content_words(JA_LINKED_ARTICLE) == 61.125  # over the web profile's 30: no stub
    for step in (tech, web):
        assert step(Document("d", "s", JA_LINKED_ARTICLE)).drop is None


# Korean news prose, written for this test: 24 words, none of them one of FineWeb-2's Korean stop words on its own
# (those are particles and endings, written onto the word before); 15 end in one: 서울시는 정책을 발표했다 목적은
# 시민들의 편의를 높이는 것이다 노선을 재정비하고 간격을 줄이겠다고 밝혔다 정책은 시행된다 (은 는 을 를 의 다 고).
KOREAN = ("서울시는 오늘 새로운 대중교통 정책을 발표했다. 이번 정책의 목적은 시민들의 편의를 높이는 것이다. 시장은 "
          "버스 노선을 재정비하고 배차 간격을 줄이겠다고 밝혔다. 새 정책은 다음 달부터 시행된다.")
KOREAN_MENU = " ".join(["홈", "뉴스", "스포츠", "연예", "경제", "사회", "문화", "날씨", "사진", "영상"] * 3)


def test_korean_particles_written_onto_words_count_as_its_stop_words():
    """FineWeb-2's Korean stop words are particles and endings its tokenizer splits off; Kiln splits Hangul at spaces,
    so they never matched and Korean prose was dropped for too few stop words (6 of the 28 Korean manual pages here).
    A word ending in one of them counts; a menu of nouns still has none."""
    step = build_step("gopher_quality", {"min_doc_words": 20})
    assert step(doc(KOREAN, "ko")).kept
    assert step(doc(KOREAN_MENU, "ko")).drop == "gopher_quality.min_stop_words"
    assert [v.drop for v in step.batch([doc(KOREAN, "ko"), doc(KOREAN_MENU, "ko")])] == \
        [None, "gopher_quality.min_stop_words"]
    assert LANGUAGE_DEFAULTS["gopher_quality"]["ko"]["stop_word_endings"] and \
        "년" not in LANGUAGE_DEFAULTS["gopher_quality"]["ko"]["stop_word_endings"]


# Thai news prose, written for this test: no spaces between words, none of Gopher's English stop words.
THAI = ("กรุงเทพมหานครประกาศแผนพัฒนาระบบขนส่งสาธารณะฉบับใหม่เมื่อวานนี้ โดยมีเป้าหมายเพื่อลดปัญหาการจราจรติดขัดในเขตเมือง "
        "ผู้ว่าราชการกล่าวว่าโครงการนี้จะช่วยให้ประชาชนเดินทางได้สะดวกและรวดเร็วมากขึ้น และยังช่วยลดมลพิษทางอากาศอีกด้วย")


def test_a_language_kiln_has_no_figures_for_is_not_judged_by_englishs():
    """Thai (and Arabic, Hindi ...: any language without Kiln's stop words) was judged with Gopher's eight English
    words and English word lengths: every such document was dropped. Those two rules are off for it; what a profile
    sets for it still applies, and English keeps Gopher's."""
    step = build_step("gopher_quality", {"min_doc_words": 20})
    assert step(doc(THAI, "th")).kept
    assert step(doc(ENGLISH.replace("the ", "").replace("of ", "").replace("and ", "").replace("that ", "")
                    .replace("have ", "").replace("with ", ""), "en")).drop == "gopher_quality.min_stop_words"
    strict = build_step("gopher_quality", {"min_doc_words": 20}, per_language={"th": {"min_stop_words": 2}})
    assert strict(doc(THAI, "th")).drop == "gopher_quality.min_stop_words"


# A Chinese story a sentence per line, dialogue among them: line lengths 35, 21, 22, 12, 30, 21, 31, 29 characters
# (~23, 13, 14, 8, 20, 13, 21, 19 words at 1.6 characters a word), so 6 of 8 lines (75%) have at most 30 characters.
CHINESE_STORY = """那天晚上，老王坐在院子里，看着天上的月亮发呆，想起了很多年以前的事情。
他的女儿走过来问：“爸爸，你在想什么呢？”
老王笑了笑，说：“我在想我们小时候的事情。”
“那时候是什么样子的？”
“那时候没有电，大家晚上都在外面乘凉，孩子们追着萤火虫跑。”
女儿坐到他身边，轻声说：“你给我讲讲吧。”
于是老王开始讲起了村子里的故事，一直讲到深夜，月亮都落下去了。
第二天早上，女儿把这些故事都写了下来，准备寄给远方的弟弟。"""


def test_fineweb_short_line_rule_is_off_for_chinese_and_japanese_only():
    """30 characters are ~5 English words but ~18 Chinese ones: the story's sentences are "short lines" (75% of
    lines, over the 67% threshold). Identified as Chinese (or Japanese), the rule is off; unidentified, or as any
    other language, the rule judges as before, and English short lines still drop a page."""
    assert [len(line) for line in CHINESE_STORY.split("\n")] == [35, 21, 22, 12, 30, 21, 31, 29]
    step = build_step("fineweb_quality")
    assert step(doc(CHINESE_STORY)).drop == "fineweb_quality.short_line_ratio"
    assert step(doc(CHINESE_STORY, "zh")).kept and step(doc(CHINESE_STORY, "ja")).kept
    assert step(doc(CHINESE_STORY, "ko")).drop == "fineweb_quality.short_line_ratio"
    menu = "Home.\nAbout us.\nContact.\n" + ENGLISH  # 3 of 4 lines short
    assert step(doc(menu, "en")).drop == step(doc(menu)).drop == "fineweb_quality.short_line_ratio"
    # a profile that sets the rule for every language sets it for Chinese too
    assert build_step("fineweb_quality", {"short_line_thr": 0.7})(doc(CHINESE_STORY, "zh")).drop == \
        "fineweb_quality.short_line_ratio"


def test_gopher_document_length_weighs_a_chinese_character_as_five_eighths_of_a_word():
    """min_doc_words / max_doc_words count words as text_units weighs them: 54 Han characters are 33.75 words (not
    54), 80 of them are 50; a Latin word in Chinese text is one word. Batch and per-document verdicts agree, and
    English counts are unchanged."""
    news = "北京市政府今天宣布了一项新的交通政策，旨在缓解城市中心的交通拥堵问题。根据新规定，外地车辆将不能进入五环以内的道路。"
    assert sum("\u4e00" <= c <= "\u9fff" for c in news) == 54  # + 4 punctuation marks, never words
    off = {"min_avg_word_length": None, "max_avg_word_length": None, "min_stop_words": None,
           "max_non_alpha_words_ratio": None}

    def verdicts(text, **params):
        step = build_step("gopher_quality", {**off, **params})
        single, (batched,) = step(doc(text)), step.batch([doc(text)])
        assert single.drop == batched.drop
        return single.drop

    assert verdicts(news, min_doc_words=50) == "gopher_quality.min_doc_words"  # 33.75 words (kept before: 54)
    assert verdicts(news, min_doc_words=33) is None and verdicts(news, min_doc_words=34) is not None
    eighty = "中国" * 40  # 80 characters: 50 words exactly
    assert verdicts(eighty, min_doc_words=50) is None and verdicts(eighty + "国", min_doc_words=50) is None
    assert verdicts(eighty[:-1], min_doc_words=50) == "gopher_quality.min_doc_words"  # 49.375
    assert verdicts(eighty, max_doc_words=50) is None
    assert verdicts(eighty + "国", max_doc_words=50) == "gopher_quality.max_doc_words"  # 50.625
    # mixed: "iPhone" and "15" are words, 72 characters 45 words: 47
    mixed = "我买了iPhone 15。" + "中国" * 35
    assert verdicts(mixed, min_doc_words=47) is None and verdicts(mixed, min_doc_words=48) is not None
    # English: 40 words (counted by hand), as before
    assert verdicts(ENGLISH, min_doc_words=40) is None and verdicts(ENGLISH, min_doc_words=41) is not None


def test_a_turkish_capital_dotted_i_lowercases_to_the_stop_words_i():
    """Python lowercases "İ" (U+0130) to "i" + U+0307, so a sentence's first "İlk" was no stop word "ilk". By hand,
    Turkish stop words (FineWeb-2's list) in this news sentence: "İlk" and "ve"; 2, as min_stop_words needs (it was 1,
    and the sentence was dropped). A heading in capitals: "İÇİN", "VE", "İLE", "BİR": 4."""
    step = build_step("gopher_quality", {"min_doc_words": 5})
    news = "İlk belirlemelere göre ulaşımda ciddi aksamalar oldu ve bazı metro seferleri iptal edildi."
    assert step(doc(news, "tr")).kept and step.batch([doc(news, "tr")])[0].kept
    assert step(doc(news.replace("İlk", "Yeni"), "tr")).drop == "gopher_quality.min_stop_words"  # "ve" alone
    heading = "BAŞVURU İÇİN GEREKLİ BELGELER VE TARİHLER İLE BİR ÖRNEK FORM AŞAĞIDADIR"
    four = build_step("gopher_quality", {"min_doc_words": 5, "min_stop_words": 4})
    assert four(doc(heading, "tr")).kept
    assert build_step("gopher_quality", {"min_doc_words": 5, "min_stop_words": 5})(doc(heading, "tr")).drop == \
        "gopher_quality.min_stop_words"
    # a listed word spelled with the capital is the same word
    assert build_step("gopher_quality", {"min_doc_words": 5, "stop_words": ["İlk", "ve"], "min_avg_word_length": None})(
        doc(news)).kept


def test_thai_words_for_gophers_length_are_letters_at_a_quarter_of_a_word():
    """THAI is 48 words (hand-segmented: กรุงเทพมหานคร|ประกาศ|แผน|พัฒนา|...|อีก|ด้วย), 185 letters with their marks:
    185 x 2/8 = 46.25 words, under Gopher's 50, as its 48 words are. Weighed as Han characters (5/8) it was 115.6
    "words" and kept."""
    step = build_step("gopher_quality", {"min_doc_words": 50})
    assert step(doc(THAI, "th")).drop == "gopher_quality.min_doc_words"
    assert build_step("gopher_quality", {"min_doc_words": 46})(doc(THAI, "th")).kept
    assert not build_step("gopher_quality", {"min_doc_words": 47})(doc(THAI, "th")).kept


def test_c4_counts_words_per_line_as_gopher_does_in_every_script():
    """C4's min_words_per_line (3) counts a Chinese or Japanese character as 5/8 of a word and a Thai letter as 1/4
    (text_units), as Gopher's length does; a punctuation mark standing alone is a word, as it was. By hand:
    "好的。" is 5+5+8 = 18 eighths, 2.25 words (it was 3 "words": removed now, as "OK." is); "之一。" likewise;
    "我们明天再讨论。" is 6 x 5 + 8 = 38, 4.75: kept. Thai menu lines, which end a sentence with no mark: "หน้าแรก"
    (home: ห น้ า แ ร ก, 6 letters, 1.5 words) and "ติดต่อเรา" (contact us: ติ ด ต่ อ เ ร า, 7, 1.75) are removed;
    "ประชาชนเดินทางได้สะดวก" (ประชาชน|เดินทาง|ได้|สะดวก, 7+6+2+5 = 20 letters, 5 words) is kept. English lines:
    as before ("OK." removed, "See you then." kept)."""
    step = build_step("c4", {"min_num_sentences": 0})
    zh = ["好的。", "之一。", "我们明天再讨论。"]
    th = ["หน้าแรก", "ติดต่อเรา", "ประชาชนเดินทางได้สะดวก"]
    en = ["OK.", "See you then."]
    for lines, kept in ((zh, ["我们明天再讨论。"]), (th, ["ประชาชนเดินทางได้สะดวก"]), (en, ["See you then."])):
        verdict = step(doc("\n".join(lines)))
        assert verdict.kept and verdict.text.split("\n") == kept, lines
        assert verdict.counts["lines_removed"] == len(lines) - 1


def test_fineweb_list_ratio_weighs_tokens_as_gopher_does():
    """FineWeb's list_ratio (newlines / tokens > 0.3) counts a Chinese character as 5/8 of a token and a Thai letter
    as 1/4 (text_units). By hand, the same 5-item navigation menu: English "Home / Contact us / Log in / Sign up /
    About us" is 9 tokens, 4/9 = 0.44: dropped. Thai "หน้าแรก / ติดต่อเรา / เข้าสู่ระบบ / สมัครสมาชิก / เกี่ยวกับเรา" is
    6 + 7 + 8 + 9 + 9 = 39 letters (ห น้ า แ ร ก, ติ ด ต่ อ เ ร า, เ ข้ า สู่ ร ะ บ บ, ส มั ค ร ส ม า ชิ ก,
    เ กี่ ย ว กั บ เ ร า), 9.75 tokens: 4/9.75 = 0.41, dropped (one a letter: 4/39 = 0.10, kept). Chinese "首页 / 联系我们 /
    登录 / 注册 / 关于我们" is 14 characters, 8.75 tokens: 0.46, dropped (4/14 = 0.29, kept). THAI prose: kept."""
    step = build_step("fineweb_quality", {"line_punct_thr": None, "short_line_thr": None,
                                          "char_duplicates_ratio": None})
    menus = {"en": ["Home", "Contact us", "Log in", "Sign up", "About us"],
             "th": ["หน้าแรก", "ติดต่อเรา", "เข้าสู่ระบบ", "สมัครสมาชิก", "เกี่ยวกับเรา"],
             "zh": ["首页", "联系我们", "登录", "注册", "关于我们"]}
    for lang, items in menus.items():
        assert step(doc("\n".join(items))).drop == "fineweb_quality.list_ratio", lang
    assert step(doc(THAI)).kept and step(doc(THAI.replace(" ", "\n"))).kept  # 3 lines of 185 letters
