"""Script-aware word units (kiln.common.text_units) and the stages that use them: expected splits written by hand per
script, English against the regexes Kiln used before (kept here as the second implementation), CJK near-duplicates
through the real signature + bucket chain, and decontamination n-grams on Chinese."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from kiln.common import text_units as tu
from kiln.common.config import NearDedup
from kiln.curation.documents import DOCUMENT_SCHEMA
from kiln.curation.filters import text_stats as ts
from kiln.dedup.buckets import decide_distributed, read_decisions
from kiln.dedup.decontaminate import BenchmarkIndex
from kiln.dedup.signing import compute_signatures, signature_groups
from kiln.dedup.text import normalized_words, shingle_ranges, words
from kiln.engine import SERIAL

# The regexes before text_units.
OLD_TOKENS = re.compile(r"\w+(?:['’\-]\w+)*|\.\.\.|[^\w\s]").findall
OLD_TOKEN_WORDS = re.compile(r"\w+(?:['’\-]\w+)*").findall
OLD_WORDS = re.compile(r"\w+").findall


@pytest.mark.parametrize("text, expected", [
    ("Don't stop: state-of-the-art, 2024!", ["Don", "t", "stop", "state", "of", "the", "art", "2024"]),
    ("Привет, мир! Ёлка", ["Привет", "мир", "Ёлка"]),
    ("中文分词很难。", ["中", "文", "分", "词", "很", "难"]),
    ("東京でiPhone 15を買った", ["東", "京", "で", "iPhone", "15", "を", "買", "っ", "た"]),
    ("カタカナとひらがなのテスト", ["カ", "タ", "カ", "ナ", "と", "ひ", "ら", "が", "な", "の", "テ", "ス", "ト"]),
    ("ภาษาไทย ดี", ["ภ", "า", "ษ", "า", "ไ", "ท", "ย", "ดี"]),  # ี (a vowel sign) stays on its consonant
    ("مرحبا بالعالم", ["مرحبا", "بالعالم"]),
    ("한국어 텍스트입니다", ["한국어", "텍스트입니다"]),  # Korean separates words with spaces
    ("हिन्दी भाषा", ["हिन्दी", "भाषा"]),  # vowel signs and virama inside the word (\w+ cut it into ह न द)
    ("cafe\u0301 ok", ["cafe\u0301", "ok"]),  # a decomposed accent stays in its word
])
def test_words_of_each_script(text, expected):
    assert tu.words(text) == expected


def test_tokens_whitespace_words_and_spans_on_mixed_text():
    text = "「東京」でiPhone 15を買った... 本当？ don't"
    assert ts.tokens(text) == ["「", "東", "京", "」", "で", "iPhone", "15", "を", "買", "っ", "た", "...", "本", "当",
                               "？", "don't"]
    assert ts.words(text) == [t for t in ts.tokens(text) if t not in ("「", "」", "...", "？")]
    assert tu.whitespace_words("中文 text，好") == ["中", "文", "text，", "好"]
    assert tu.count_words("Hello 世界") == 3
    spanned = words(text, with_spans=True)
    zero = str.maketrans("123456789", "000000000")  # the default normalization zeroes digits
    assert [text[a:b].lower().translate(zero) for a, b in spanned.spans] == spanned.words
    assert spanned.spans[:3] == [(1, 2), (2, 3), (4, 5)] and text[5:11] == "iPhone" and (5, 11) in spanned.spans


def _english_sample() -> list[str]:
    from pydoc_data.topics import topics  # Python's own reference text, on every machine
    return [topics[k] for k in sorted(topics)][:120] + [
        "“Smart quotes” — dashes, naïve café, Straße, ﬁle, ½ and 1,000.5 … ‘ok’", "ΟΔΟΣ ΑΣ σ Σ aΣ1b",
    ]


def test_english_splits_exactly_as_the_old_regexes():
    sample = _english_sample()
    assert all(tu.plain(t) for t in sample)
    for t in sample:
        assert ts.tokens(t) == OLD_TOKENS(t)
        assert ts.words(t) == OLD_TOKEN_WORDS(t)
        assert tu.words(t) == OLD_WORDS(t)
        assert tu.whitespace_words(t) == t.split()
    assert not tu.plain("ok 日本") and not tu.plain("e\u0301") and tu.plain("naïve — “x”")


def test_shingles_span_five_words_or_eight_characters():
    # Worked by hand: a word weighs 8, a no-space character 5; a shingle is complete at 40.
    w = lambda kinds: np.array([5 if k == "c" else 8 for k in kinds], dtype=np.int64)  # noqa: E731
    one = lambda kinds: [(int(a), int(b)) for _, a, b in zip(*shingle_ranges(  # noqa: E731
        w(kinds), np.array([0]), np.array([len(kinds)]), 5))]
    assert one("cccccccc") == [(0, 8)]
    assert one("ccccccccc") == [(0, 8), (1, 9)]
    assert one("wwwwww") == [(0, 5), (1, 6)]
    assert one("wwwwcc") == [(0, 6)]  # 4 words + 2 characters = 42
    assert one("wwwwccc") == [(0, 6)]  # from the second word: 3 words + 3 characters = 39, never complete
    assert one("ccccccc") == [(0, 7)]  # 7 characters: one shingle of all the words
    assert one("") == []  # no words: no shingle (two such texts share nothing a near-duplicate is made of)
    text_of, starts, ends = shingle_ranges(w("wwwwwwcccccccccc"), np.array([0, 6]), np.array([6, 10]), 5)
    assert text_of.tolist() == [0, 0, 1, 1, 1] and starts.tolist() == [0, 1, 6, 7, 8] and ends.tolist() == [5, 6, 14,
                                                                                                           15, 16]


ZH = ("数据清洗是训练语言模型之前最重要的步骤之一。网页中充满了导航栏、广告和重复的段落，"
      "如果不加处理就直接用于训练，模型会学到大量无用的内容。近似重复检测可以找出只改动了少数字词的文档副本，"
      "从而让每一份内容在语料中只出现一次。对于中文和日文这样不用空格分词的文字，"
      "必须把每个汉字当作一个单位来计算相似度，否则整段文字只会被当成几个很长的词。")
JA = ("大規模言語モデルの学習データを作るとき、重複した文書を取り除くことはとても大切です。"
      "ウェブ上には同じ記事が少しだけ書き換えられて何度も掲載されていることが多く、"
      "そのまま学習に使うとモデルが特定の文章を丸暗記してしまいます。日本語はスペースで単語を区切らないため、"
      "文字を単位として類似度を計算する必要があります。MinHashとLSHを使えば数百万件の文書でも高速に処理できます。")
OTHER_ZH = ("北方山谷里的园丁在最后一场霜冻过去之后才种下土豆，并在秋雨浸透田地之前把它们收获。"
            "铁路公司发布了一份新的时刻表，可是字体太小，连站长都看不清楚，只好把旧的时刻表重新贴了回去。")


def _clusters(tmp: Path, texts: list[str]) -> list[str]:
    """Each text's near-dup cluster from the real chain (signature parts, LSH buckets, exact verification)."""
    near = NearDedup()
    ids = [f"d{i}" for i in range(len(texts))]
    path = tmp / "docs.parquet"
    pq.write_table(pa.table({"doc_id": ids, "source": ["s"] * len(texts), "text": pa.array(texts, pa.large_string()),
                             "url": [None] * len(texts), "license": [None] * len(texts),
                             "meta": ["{}"] * len(texts)}, schema=DOCUMENT_SCHEMA), path)
    groups = signature_groups([path], near.rows_per_part)
    sigs = [tmp / f"sig-{i}.parquet" for i in range(len(groups))]
    compute_signatures(groups, sigs, near, engine=SERIAL, progress=False)
    decide_distributed(sigs, {"s": (1, 0)}, [], tmp / "work", tmp / "out", near, "r", engine=SERIAL)
    rows = {r["doc_id"]: r for r in read_decisions(tmp / "out").to_pylist()}
    return [rows[d]["cluster_id"] or d for d in ids]


def test_chinese_and_japanese_near_copies_are_found_and_other_text_is_not(tmp_path):
    # Two characters substituted: 16 of ~180 eight-character shingles broken on each side, Jaccard ~0.84-0.9.
    zh_copy = ZH.replace("导航栏", "导航条").replace("几个", "几条")
    ja_copy = JA.replace("とても大切", "非常に大切")
    clusters = _clusters(tmp_path, [ZH, JA, OTHER_ZH, zh_copy, ja_copy])
    assert clusters[3] == clusters[0] and clusters[4] == clusters[1]
    assert len({clusters[0], clusters[1], clusters[2]}) == 3
    # Under the old word split the Chinese text was its 10 clauses as 10 long "words" (counted by hand).
    assert len(OLD_WORDS(ZH)) == 10 and len(normalized_words(ZH)) == len(re.findall(r"[\u4e00-\u9fff]", ZH))


def test_decontamination_finds_and_cuts_a_chinese_item():
    item = "近似重复检测可以找出只改动了少数字词的文档副本"
    assert len(OLD_WORDS(item)) == 1  # before: one "word", below min_item_words, never indexed
    index = BenchmarkIndex.from_items([("bench", "q1", item)], ngram=13)
    doc = OTHER_ZH + item + "。" + OTHER_ZH
    (match,) = index.find(doc)
    assert doc[match.start:match.end] == item and match.item_id == "q1"
    # Its 12th character changed: each of its ten 13-character n-grams covers it, none is left.
    assert not index.find(OTHER_ZH + ZH.replace("只改动", "只变动"))


@pytest.mark.parametrize("text,script", [
    ("plain English", "Latin"), ("Grüße aus Köln", "Latin"), ("Привет, мир", "Cyrillic"),
    ("中文文本的例子", "Han"), ("日本語のテキストです", "Kana"),  # 3 Han, 7 kana: Japanese counts as Kana
    ("สวัสดีครับ", "Thai"), ("안녕하세요 여러분", "Hangul"), ("مرحبا بالعالم", "Arabic"), ("1234 !!", "none"),
    ("ls(1) は ファイル を 一覧 表示 する", "Kana"),  # 2 Latin letters, 6 kana, 4 Han
])
def test_dominant_script_is_the_script_most_letters_are_written_in(text, script):
    assert tu.dominant_script(text) == script


def test_a_thai_khmer_or_burmese_letter_weighs_a_quarter_of_a_word():
    """A unit of Thai, Lao, Khmer, Myanmar, Tibetan is a letter with its marks, not a syllable or a morpheme: Thai news
    prose segmented by hand is 3.85 of them a word, so each weighs 2 eighths (4 a word); a Han character or kana, or
    a Yi syllable, 5 eighths; any other word 8. By hand: ข้อใดต่อไปนี้ถูกต้องที่สุด ("which of the following is most
    correct", 5 words: ข้อ|ใด|ต่อไปนี้|ถูกต้อง|ที่สุด) is 17 units (ข้ อ ใ ด ต่ อ ไ ป นี้ ถู ก ต้ อ ง ที่ สุ ด), 34 eighths:
    4.25 words, not 17 x 5 = 85 (10.6 words)."""
    from kiln.common.text_units import word_weights

    assert word_weights(["日", "か", "ꀀ", "ภ", "ພ", "ក", "က", "ཀ", "word", "ไ"]).tolist() == [5, 5, 5, 2, 2, 2, 2, 2, 8, 2]
    quiz = tu.words("ข้อใดต่อไปนี้ถูกต้องที่สุด")
    assert quiz == ["ข้", "อ", "ใ", "ด", "ต่", "อ", "ไ", "ป", "นี้", "ถู", "ก", "ต้", "อ", "ง", "ที่", "สุ", "ด"]
    assert int(word_weights(quiz).sum()) == 34
    # a Thai shingle of 5 words: 20 letters (40 eighths), not 8
    _, starts, ends = shingle_ranges(word_weights(quiz), np.array([0]), np.array([17]), 5)
    assert list(zip(starts.tolist(), ends.tolist())) == [(0, 17)]  # 34 < 40: one shingle of all the letters
