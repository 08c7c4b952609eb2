"""Quality steps: for each step and each rule, documents it must keep and ones it must drop (with the reason)."""

from __future__ import annotations

import base64
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.curation.documents import Document
from kiln.curation.filters import text_stats as ts
from kiln.curation.filters.badwords import DEFAULT_WORDS_FILE, BadWords, load_word_list
from kiln.curation.filters.c4 import C4
from kiln.curation.filters.code import CodeQuality
from kiln.curation.filters.fineweb import FineWebQuality
from kiln.curation.filters.gopher import GopherQuality, GopherRepetition


def doc(text: str) -> Document:
    return Document(doc_id="d", source="test", text=text)


def reason(step, text: str) -> str | None:
    return step(doc(text)).drop


# ---- fixtures (built in code) -----------------------------------------------------------------

P1 = (
    "Pottery is one of the oldest human technologies. Archaeologists have found fired clay vessels in "
    "East Asia that are more than eighteen thousand years old, long before farming spread across the "
    "region. Early potters shaped coils of wet clay by hand and baked them in open bonfires, which "
    "produced uneven temperatures and fragile walls."
)
P2 = (
    "The kiln changed that. By enclosing the fire, a kiln holds heat evenly and can reach temperatures "
    "high enough to turn clay into stoneware or porcelain. Chinese workshops of the Han dynasty built "
    "long climbing kilns on hillsides, and each chamber used the exhaust of the one below it to preheat "
    "the next batch."
)
P3 = (
    "Modern studio potters still face the same questions as their predecessors. They must choose a clay "
    "body, decide how quickly to raise the temperature, and judge when the glaze has matured. A careful "
    "firing log, kept with notes about the weather and the fuel, is often the difference between a "
    "cracked pot and a good one."
)
PROSE = f"{P1}\n\n{P2}\n\n{P3}"

PY_MODULE = '''"""Read and write firing logs for a pottery kiln."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path


@dataclass
class Reading:
    minute: int
    celsius: float


def load_log(path: Path) -> list[Reading]:
    """Parse a two-column CSV of minutes since ignition and temperatures."""
    with path.open(newline="") as f:
        rows = csv.reader(f)
        next(rows)  # header
        return [Reading(int(m), float(c)) for m, c in rows]


def peak(readings: list[Reading]) -> Reading:
    """The hottest reading; raises ValueError on an empty log."""
    if not readings:
        raise ValueError("empty firing log")
    return max(readings, key=lambda r: r.celsius)


def ramp_rate(readings: list[Reading]) -> float:
    """Average heating rate in degrees per hour between the first reading and the peak."""
    top = peak(readings)
    first = readings[0]
    hours = (top.minute - first.minute) / 60
    return (top.celsius - first.celsius) / hours if hours else 0.0
'''

PROSE_STEPS = [GopherQuality(), GopherRepetition(), C4(), FineWebQuality(), BadWords()]


@pytest.mark.parametrize("step", PROSE_STEPS, ids=lambda s: s.name)
def test_clean_prose_is_kept_by_every_prose_filter(step):
    assert step(doc(PROSE)).kept


def test_step_contract():
    steps = [*PROSE_STEPS, CodeQuality()]
    assert [s.name for s in steps] == [
        "gopher_quality",
        "gopher_repetition",
        "c4",
        "fineweb_quality",
        "badwords",
        "code_quality",
    ]
    for step in steps:
        assert dataclasses.is_dataclass(step)
        for f in dataclasses.fields(step):  # every parameter has a default: configs only override
            assert f.default is not dataclasses.MISSING or f.default_factory is not dataclasses.MISSING


# ---- text_stats ------------------------------------------------------------------------------


def test_tokenizer_splits_words_and_punctuation():
    assert ts.tokens("Don't stop... #1 state-of-the-art, ok!") == [
        "Don't", "stop", "...", "#", "1", "state-of-the-art", ",", "ok", "!",
    ]
    assert ts.words("Don't stop... #1 state-of-the-art, ok!") == ["Don't", "stop", "1", "state-of-the-art", "ok"]
    assert ts.has_alpha("état") and ts.has_alpha("x86") and not ts.has_alpha("1999")


# Persian writes a zero-width non-joiner inside words (می‌خواهیم "we want", کتاب‌ها "books"); a zero-width joiner
# glues emoji into one picture (a family, a person of a skin tone at a laptop). Each was a token of its own.
FA_PROSE = (
    "ما می‌خواهیم این کتاب‌ها را به کتابخانه‌ها بدهیم. دانشجویان در دانشگاه‌های ایران درس می‌خوانند و کارهای "
    "پژوهشی انجام می‌دهند. آن‌ها همیشه به زبان‌های خارجی علاقه‌مند بوده‌اند. شهر تهران پایتخت ایران است و جمعیت آن "
    "بیش از هشت میلیون نفر است. مردم این شهر در روزهای تعطیل به پارک‌ها می‌روند و با خانواده‌هایشان وقت می‌گذرانند. "
    "بسیاری از خیابان‌های قدیمی شهر درختان بلندی دارند که در تابستان سایه‌ی خنکی می‌سازند."
)


def test_zero_width_joiners_stay_inside_words_and_emoji():
    assert ts.tokens("می\u200cخواهیم کتاب\u200cها.") == ["می\u200cخواهیم", "کتاب\u200cها", "."]
    assert ts.words("می\u200cخواهیم کتاب\u200cها.") == ["می\u200cخواهیم", "کتاب\u200cها"]
    # as many tokens as the text written without the joiners: its 68 words between spaces and 6 full stops
    assert len(ts.tokens(FA_PROSE)) == len(ts.tokens(FA_PROSE.replace("\u200c", ""))) == 68 + 6
    family, coder = "\U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466", "\U0001F468\U0001F3FD\u200d\U0001F4BB"
    # an emoji with its skin tone or presentation selector, or a joiner sequence, is one token
    assert ts.tokens(f"ok {family} {coder} \U0001F44D\U0001F3FD \u2764\ufe0f!") == [
        "ok", family, coder, "\U0001F44D\U0001F3FD", "\u2764\ufe0f", "!"]
    assert ts.tokens("a\u200d\U0001F469 \u200d") == ["a", "\u200d", "\U0001F469", "\u200d"]  # a joiner not joining


def test_gopher_quality_keeps_persian_and_emoji_prose():
    persian = GopherQuality(min_stop_words=None, min_avg_word_length=None)  # as for a language Kiln has no figures for
    emoji = " \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 ".join([P1, P2, P3, P1])
    for step, text in ((persian, FA_PROSE), (GopherQuality(), emoji)):
        assert step(doc(text)).drop is None
        assert step.batch([doc(text)])[0].drop is None


@settings(max_examples=300, deadline=None, derandomize=True)
@given(st.text(alphabet=st.sampled_from("ab1_ -'’.…,#\n\té½٣\u0301\u00a0x"), max_size=200) | st.text(max_size=200))
def test_word_tokens_are_the_words_of_the_text(text):
    """Gopher derives its words from its tokens (one regex pass): the same list as scanning for words."""
    assert ts.word_tokens(ts.tokens(text)) == ts.words(text)


def test_duplicate_and_ngram_helpers():
    assert ts.find_duplicates(["a", "bb", "a", "bb", "c"]) == (2, 3)
    assert ts.paragraphs("\n a\n\n\nb \n") == ["a", "b"]
    assert ts.top_ngram_chars(["x", "y", "x", "y", "z"], 2) == 3 * 2  # "x y" twice
    # the 3-gram "a b c" repeats once: its 3 characters count, then the scan jumps past it
    assert ts.duplicated_ngram_chars(["a", "b", "c", "a", "b", "c"], 3) == 3
    assert ts.duplicated_ngram_chars(["a", "b"], 3) == 0
    assert ts.count_sentences("One. Two! Three? “Four.”") == 4
    assert ts.count_sentences("no end mark") == 1 and ts.count_sentences("  ") == 0


# One paragraph of plain news-style prose per language, each sentence ended as the script ends it: Amharic (።),
# Burmese (။), Khmer (។), Armenian (։), Tibetan (།); Thai and Lao with no mark, a space or the line's end after the
# sentence. Six sentences each, written here by hand; C4 needs five.
SENTENCE_ENDS = {
    "th": ("สภาเมืองอนุมัติงบประมาณใหม่วันนี้", "งบประมาณนี้ให้เงินเพิ่มแก่โรงเรียน"),
    "lo": ("ສະພາເມືອງໄດ້ອະນຸມັດງົບປະມານໃໝ່ມື້ນີ້", "ງົບປະມານນີ້ໃຫ້ເງິນເພີ່ມແກ່ໂຮງຮຽນ"),
    "am": ("የከተማው ምክር ቤት ዛሬ አዲስ በጀት አጸደቀ።", "በጀቱ ለትምህርት ቤቶች ተጨማሪ ገንዘብ ይሰጣል።"),
    "my": ("မြို့တော်ကောင်စီသည် ယနေ့ ဘတ်ဂျက်အသစ်ကို အတည်ပြုခဲ့သည်။", "ဘတ်ဂျက်သည် ကျောင်းများအတွက် ငွေပိုမိုပေးသည်။"),
    "km": ("ក្រុមប្រឹក្សាក្រុងបានអនុម័តថវិកាថ្មីនៅថ្ងៃនេះ។", "ថវិកានេះផ្តល់ប្រាក់បន្ថែមដល់សាលារៀន។"),
    "hy": ("Քաղաքային խորհուրդն այսօր հաստատեց նոր բյուջեն։", "Բյուջեն լրացուցիչ միջոցներ է տրամադրում դպրոցներին։"),
    "bo": ("གྲོང་ཁྱེར་གྱི་ལས་ཁུངས་ཀྱིས་དེ་རིང་འཆར་གཞི་གསར་པ་ཞིག་ཆོག་མཆན་བྱས།", "འཆར་གཞི་འདིས་སློབ་གྲྭ་རྣམས་ལ་དངུལ་མང་བ་སྤྲོད།"),
}


@pytest.mark.parametrize("language", sorted(SENTENCE_ENDS))
def test_c4_and_fineweb_read_the_sentence_ends_of_every_script(language):
    """C4 and FineWeb knew only . ! ? and the marks of Chinese, Japanese, Hindi and Arabic: every line of these
    languages "had no sentence end", so C4 removed them all (too_few_sentences) and FineWeb dropped the document
    (line_punct_ratio). Thai and Lao end a sentence with a space, or the line."""
    a, b = SENTENCE_ENDS[language]
    document = doc("\n".join([a, b, f"{a} {b}", f"{b} {a}", f"{a} {a}", f"{b} {b}"]))
    assert ts.count_sentences(document.text) == 10
    assert C4()(document).drop is None
    assert FineWebQuality()(document).drop is None



def test_a_chinese_sentence_closed_by_its_quotation_mark_ends_a_line():
    """Chinese quotes with “ ” (Japanese with 「 」, already read): a line of dialogue ends 。” ？” or ！”. C4 removed
    every such line (no terminal punctuation) and FineWeb did not count it, so a story told in dialogue lost its
    sentences (too_few_sentences). A closing quote or bracket after another script's sentence end ends the line as
    the end does; after . ! ? nothing changes (C4's English rule)."""
    lines = ["他的女儿走过来问：“爸爸，你在想什么呢？”", "老王笑了笑，说：“我在想小时候的事情。”",
             "女儿坐到他身边，轻声说：“你给我讲讲吧！”", "弟弟在信里写道：（我下个月就回家。）",
             "她回答说：‘好的，我知道了。’", "老王说：“好。”他们一起回家了。"]
    for line in lines:
        assert ts.ends_sentence(line), line
    kept = C4()(doc("\n".join(lines)))
    assert kept.drop is None and kept.text == "\n".join(lines)
    assert not ts.ends_sentence("他说：“我明天来”") and not ts.ends_sentence("“书名”")  # a quote with no end inside
    assert not ts.ends_sentence("He said “I will come.”")  # English: C4's five marks, as before


# ---- GopherQuality ---------------------------------------------------------------------------


def _lines(template: str, n: int) -> str:
    return "\n".join(template.format(i=i) for i in range(n))


GOPHER_QUALITY_DROPS = {
    "min_doc_words": "The cat sat on the mat and looked at the garden.",
    "max_doc_words": "the kiln " * 50_001,
    "min_avg_word_length": "it is a " * 30,
    "max_avg_word_length": "internationalization of the counterrevolutionaries " * 15,
    "hash_word_ratio": PROSE + " #pottery and glaze kilns" * 100,
    "ellipsis_word_ratio": PROSE + " and then..." * 40,
    "max_bullet_lines_ratio": _lines("- item {i} of the list with the details that matter", 20),
    "max_ellipsis_lines_ratio": _lines("The story of the old house and the garden goes on {i} …", 10),
    "max_non_alpha_words_ratio": "The years of the kiln were " + " ".join(str(1900 + i) for i in range(80)) + ".",
    "min_stop_words": "Quick brown foxes jump over lazy dogs. " * 10,
}


@pytest.mark.parametrize("rule", GOPHER_QUALITY_DROPS)
def test_gopher_quality_drops(rule):
    assert reason(GopherQuality(), GOPHER_QUALITY_DROPS[rule]) == f"gopher_quality.{rule}"


SINGLE_PARAM_RULES = [r for r in GOPHER_QUALITY_DROPS if r not in ("hash_word_ratio", "ellipsis_word_ratio")]


@pytest.mark.parametrize("rule", SINGLE_PARAM_RULES)
def test_gopher_quality_rule_disabled_by_none(rule):
    assert reason(GopherQuality(**{rule: None}), GOPHER_QUALITY_DROPS[rule]) != f"gopher_quality.{rule}"


def test_gopher_quality_symbol_ratio_disabled_by_none():
    step = GopherQuality(max_symbol_word_ratio=None)
    assert reason(step, GOPHER_QUALITY_DROPS["hash_word_ratio"]) is None
    assert reason(step, GOPHER_QUALITY_DROPS["ellipsis_word_ratio"]) is None


def test_gopher_quality_edges():
    # stop words count case-insensitively; a few hashtags or bullets in prose are fine
    assert GopherQuality()(doc(PROSE.upper())).kept
    assert GopherQuality()(doc(PROSE + " #pottery #kilns")).kept
    assert GopherQuality()(doc("- " + P1 + "\n- " + P2 + "\n" + P3)).kept
    # with every rule off even an empty document passes (no division by zero)
    off = {f.name: None for f in dataclasses.fields(GopherQuality)}
    assert GopherQuality(**off)(doc("")).kept


# ---- GopherRepetition ------------------------------------------------------------------------

SHORT_NOTES = [f"Note {i} is here." for i in range(10)]
UNIQUE_LINES = [f"Line {i} says something different about glaze number {i * 7}." for i in range(10)]

GOPHER_REPETITION_DROPS = {
    "dup_para_frac": "\n\n".join([P1, P1, P1, P2]),
    "dup_para_char_frac": "\n\n".join([*SHORT_NOTES, P1, P1]),
    "dup_line_frac": "\n".join([*UNIQUE_LINES, *["Read more"] * 6]),
    "dup_line_char_frac": "\n".join([*SHORT_NOTES, P1, P1]),
    "top_2gram_char_frac": " ".join(f"click here offer{i}" for i in range(20)),
    "dup_5gram_char_frac": f"{P1} {P2} {P1}",  # a passage copied inside one paragraph
}


@pytest.mark.parametrize("rule", GOPHER_REPETITION_DROPS)
def test_gopher_repetition_drops(rule):
    assert reason(GopherRepetition(), GOPHER_REPETITION_DROPS[rule]) == f"gopher_repetition.{rule}"


def test_boilerplate_junk_is_dropped_by_repetition():
    junk = "\n\n".join(["Buy cheap watches online. Best prices guaranteed. Free shipping!"] * 5 + [P1])
    assert reason(GopherRepetition(), junk) == "gopher_repetition.dup_para_frac"
    nav = "\n".join(["Home", "Shop", "Blog", "Contact"] * 4 + [P1])
    assert reason(GopherRepetition(), nav) == "gopher_repetition.dup_line_frac"


@pytest.mark.parametrize("rule", ["dup_para_frac", "dup_para_char_frac", "dup_line_frac", "dup_line_char_frac"])
def test_gopher_repetition_rule_disabled_by_none(rule):
    assert reason(GopherRepetition(**{rule: None}), GOPHER_REPETITION_DROPS[rule]) != f"gopher_repetition.{rule}"


@pytest.mark.parametrize(("n", "frac"), [(2, 0.20), (3, 0.18), (4, 0.16)])
def test_gopher_repetition_top_ngram_each_n(n, frac):
    step = GopherRepetition(top_n_grams=((n, frac),), dup_n_grams=None)
    spam = " ".join(f"buy cheap pills now offer{i}" for i in range(20))
    assert reason(step, spam) == f"gopher_repetition.top_{n}gram_char_frac"
    assert reason(step, PROSE) is None


@pytest.mark.parametrize(("n", "frac"), [(5, 0.15), (6, 0.14), (7, 0.13), (8, 0.12), (9, 0.11), (10, 0.10)])
def test_gopher_repetition_dup_ngram_each_n(n, frac):
    step = GopherRepetition(top_n_grams=None, dup_n_grams=[[n, frac]])  # lists, as from YAML
    assert step.dup_n_grams == ((n, frac),)
    assert reason(step, GOPHER_REPETITION_DROPS["dup_5gram_char_frac"]) == f"gopher_repetition.dup_{n}gram_char_frac"
    assert reason(step, PROSE) is None


# Where words are characters (Chinese, Japanese, Thai ...), "n words" is n words' worth of characters, as dedup's
# shingles weigh them (text_units.WORD_WEIGHT / UNIT_WEIGHT: 5 words are 8 characters): a 5-character word such as
# オプション was a repeated 5-gram wherever it recurred, and ordinary Japanese and Thai prose was dropped.
def test_ngram_helpers_weigh_characters_of_unspaced_scripts():
    from kiln.common.text_units import word_weights

    def counts(text, n):
        toks = ts.tokens(text)
        weights = word_weights(toks)
        return ts.duplicated_ngram_chars(toks, n, weights), ts.top_ngram_chars(toks, n, weights)

    # オ プ シ ョ ン を 使 う 。 オ プ シ ョ ン が 多 い 。: as character 5-grams オプション repeats (5 characters);
    # 5 words' worth is 8 characters (オプションを使う, オプションが多い, ...), and none of those repeats.
    toks = ts.tokens("オプションを使う。オプションが多い。")
    assert ts.duplicated_ngram_chars(toks, 5) == 5
    assert counts("オプションを使う。オプションが多い。", 5)[0] == 0
    # 一二三四五六七八 twice: the 8-character gram starting at the second 一 repeats the first (8 characters, then the
    # scan is at the end). Two words' worth is 4 characters; 一二三四 is the first of the 4-character grams seen
    # twice: 4 characters (no space between them) x 2.
    assert counts("一二三四五六七八一二三四五六七八", 5)[0] == 8
    assert counts("一二三四五六七八一二三四五六七八", 2)[1] == 4 * 2
    # spaced words weigh a word each: the same numbers as without weights ("the cat sat on the" repeats at the eighth
    # word; "the cat" is the first of the bigrams seen twice, 7 characters with its space)
    words = "the cat sat on the mat and the cat sat on the mat again".split()
    weights = word_weights(words)
    assert ts.duplicated_ngram_chars(words, 5, weights) == ts.duplicated_ngram_chars(words, 5) == 3 + 3 + 3 + 2 + 3
    assert ts.top_ngram_chars(words, 2, weights) == ts.top_ngram_chars(words, 2) == 7 * 2


# Written here by hand: plain Japanese instructions of a manual page (the words オプション and ファイル recur, as in
# any manual) and Thai encyclopedia prose (กรุงเทพมหานคร, 13 characters, five times).
JA_PROSE = (
    "このオプションを指定すると、ファイルの内容を標準出力に表示します。オプションを省略した場合は、現在のディレクトリに"
    "あるファイルを一覧にします。設定ファイルが見つからないときは、既定の値を使います。複数のオプションを組み合わせる"
    "こともできますが、同じファイルを二度指定してはいけません。詳しい使い方は、付属のマニュアルを参照してください。"
)
TH_PROSE = (
    "กรุงเทพมหานครเป็นเมืองหลวงและนครที่มีประชากรมากที่สุดของประเทศไทย เป็นศูนย์กลางการปกครอง การศึกษา "
    "การคมนาคมขนส่ง การเงินการธนาคาร การพาณิชย์ การสื่อสาร และความเจริญของประเทศ\n\n"
    "เมืองนี้ตั้งอยู่บนสามเหลี่ยมปากแม่น้ำเจ้าพระยา มีแม่น้ำเจ้าพระยาไหลผ่านและแบ่งเมืองออกเป็นสองฝั่ง คือ ฝั่งพระนครและ"
    "ฝั่งธนบุรี กรุงเทพมหานครมีพื้นที่ทั้งหมด 1,568.737 ตารางกิโลเมตร\n\n"
    "ประชากรตามทะเบียนราษฎรกว่าห้าล้านคน ทำให้กรุงเทพมหานครเป็นเอกนคร มีผู้กล่าวว่า กรุงเทพมหานครเป็นเอกนครที่สุดในโลก "
    "เพราะมีประชากรมากกว่านครที่มีประชากรมากเป็นอันดับสองถึงสี่สิบเท่า\n\n"
    "นักท่องเที่ยวจากทั่วโลกเดินทางมาเยี่ยมชมวัดพระแก้ว พระบรมมหาราชวัง และตลาดน้ำ ซึ่งเป็นสถานที่ท่องเที่ยวที่มีชื่อเสียง "
    "อาหารริมทางของกรุงเทพมหานครก็ได้รับการยกย่องว่าเป็นหนึ่งในอาหารที่ดีที่สุดในโลก"
)


def test_gopher_repetition_keeps_unspaced_prose_and_drops_unspaced_spam():
    assert reason(GopherRepetition(), JA_PROSE) is None
    assert reason(GopherRepetition(), TH_PROSE) is None
    # the same review copied ten times with a counter: nine tenths of it repeat an earlier 8-character gram
    spam = " ".join(f"这个产品非常好，我很喜欢，推荐给大家。编号{i}" for i in range(10))
    assert reason(GopherRepetition(top_n_grams=None), spam) == "gopher_repetition.dup_5gram_char_frac"
    assert reason(GopherRepetition(), spam).startswith("gopher_repetition.top_")


def test_gopher_repetition_ngram_rules_disabled_by_none():
    step = GopherRepetition(top_n_grams=None, dup_n_grams=None)
    assert reason(step, GOPHER_REPETITION_DROPS["top_2gram_char_frac"]) is None
    assert reason(step, GOPHER_REPETITION_DROPS["dup_5gram_char_frac"]) is None
    assert GopherRepetition()(doc("")).kept


# ---- C4 ----------------------------------------------------------------------------------------

C4_PAGE = "\n".join(
    [
        "Accept all cookies",  # no terminal punctuation
        "This website uses cookies to improve your experience.",  # policy
        "Please enable JavaScript to view the comments.",  # javascript
        P1,
        "",
        P2,
        "Thank you!",  # fewer than 3 words
        "Read our privacy policy and terms of use.",  # policy
        "Loading...",  # ends in an ellipsis
        "Share this post:",  # no terminal punctuation
    ]
)


def test_c4_removes_boilerplate_lines_and_keeps_the_rest():
    v = C4()(doc(C4_PAGE))
    assert v.kept
    assert v.text == f"{P1}\n{P2}"
    assert v.counts == {"lines_removed": 7}


def test_c4_keeps_prose_joining_lines():
    v = C4()(doc(PROSE))
    assert v.kept and v.text == f"{P1}\n{P2}\n{P3}" and v.counts == {}


def test_c4_line_rules_each():
    base = f"{P1}\n{P2}"
    long_word = "Here is a token " + "x" * 1001 + "."
    for line in [
        "Posted in Pottery and Ceramics",  # filter_no_terminal_punct
        "Thank you.",  # min_words_per_line
        "This site requires Javascript to work properly.",  # filter_javascript
        "By continuing you agree to our use of cookies.",  # filter_policy
        long_word,  # max_word_length
    ]:
        v = C4()(doc(f"{base}\n{line}"))
        assert v.kept and v.text == base and v.counts == {"lines_removed": 1}, line


@pytest.mark.parametrize(
    ("params", "line"),
    [
        ({"filter_no_terminal_punct": False}, "Posted in Pottery and Ceramics"),
        ({"min_words_per_line": None}, "Thank you."),
        ({"filter_javascript": False}, "This site requires Javascript to work properly."),
        ({"filter_policy": False}, "By continuing you agree to our use of cookies."),
        ({"max_word_length": None}, "Here is a token " + "x" * 1001 + "."),
    ],
)
def test_c4_line_rules_disabled(params, line):
    v = C4(**params)(doc(f"{P1}\n{P2}\n{line}"))
    assert v.kept and v.text == f"{P1}\n{P2}\n{line}" and "lines_removed" not in v.counts


def test_c4_citations():
    line = "Kilns reached Korea by the fourth century.[1] They later spread to Japan.[citation needed]"
    v = C4()(doc(f"{P1}\n{P2}\n{line}"))
    assert v.text.endswith("Kilns reached Korea by the fourth century. They later spread to Japan.")
    assert v.counts == {"citations_removed": 2}
    v = C4(remove_citations=False)(doc(f"{P1}\n{P2}\n{line}"))  # then it ends in "]": no terminal punct
    assert v.text == f"{P1}\n{P2}" and v.counts == {"lines_removed": 1}


C4_DROPS = {
    "lorem_ipsum": f"{PROSE}\nLorem ipsum dolor sit amet, consectetur adipiscing elit.",
    "curly_bracket": f"{PROSE}\nThe template prints {{name}} for each visitor.",
    "too_few_sentences": "This page has only one real sentence in it.\nHome\nAbout us",
}


@pytest.mark.parametrize("rule", C4_DROPS)
def test_c4_page_drops(rule):
    v = C4()(doc(C4_DROPS[rule]))
    assert v.drop == f"c4.{rule}"
    assert v.text == C4_DROPS[rule]  # a dropped page is recorded as it came in


@pytest.mark.parametrize(
    ("params", "rule"),
    [({"filter_lorem_ipsum": False}, "lorem_ipsum"), ({"filter_curly_bracket": False}, "curly_bracket"),
     ({"min_num_sentences": None}, "too_few_sentences")],
)
def test_c4_page_rules_disabled(params, rule):
    assert C4(**params)(doc(C4_DROPS[rule])).kept


def test_c4_curly_bracket_only_on_surviving_lines():
    # as in C4: a code line without terminal punctuation is removed before the "{" page rule sees it
    v = C4()(doc(f"{P1}\n{P2}\nfunction init() {{"))
    assert v.kept and v.text == f"{P1}\n{P2}"


def test_c4_empty_after_cleanup():
    menu = "Home\nShop\nContact"
    assert reason(C4(min_num_sentences=None), menu) == "c4.empty"
    assert C4(min_num_sentences=None, drop_empty=False)(doc(menu)).kept
    assert reason(C4(), menu) == "c4.too_few_sentences"


# ---- FineWebQuality --------------------------------------------------------------------------

CATALOGUE = _lines("Category number {i} of the shop catalogue", 10)
FINEWEB_DROPS = {
    "line_punct_ratio": CATALOGUE,
    "short_line_ratio": _lines("Item {i} is sold.", 10) + "\n" + P1,
    "char_dup_ratio": f"{P1}\n{P2}\n{P3}\nPosted by admin.\nPosted by admin.",
    "list_ratio": _lines("Internationalization{i} counterrevolutionaries.", 20),
}


@pytest.mark.parametrize("rule", FINEWEB_DROPS)
def test_fineweb_drops(rule):
    assert reason(FineWebQuality(), FINEWEB_DROPS[rule]) == f"fineweb_quality.{rule}"


@pytest.mark.parametrize(
    ("param", "rule"),
    [("line_punct_thr", "line_punct_ratio"), ("short_line_thr", "short_line_ratio"),
     ("char_duplicates_ratio", "char_dup_ratio"), ("new_line_ratio", "list_ratio")],
)
def test_fineweb_rule_disabled_by_none(param, rule):
    assert reason(FineWebQuality(**{param: None}), FINEWEB_DROPS[rule]) != f"fineweb_quality.{rule}"


def test_fineweb_line_punct_exclude_zero():
    assert FineWebQuality(line_punct_exclude_zero=True)(doc(CATALOGUE)).kept
    # a few punctuated lines among many bare ones still fail: exclude_zero only spares ratio == 0
    some = CATALOGUE + "\n" + P1
    assert reason(FineWebQuality(line_punct_exclude_zero=True), some) == "fineweb_quality.line_punct_ratio"


def test_fineweb_thresholds_are_inclusive_as_datatrove():
    # exactly 2/3 short lines: short_line_thr=0.67 keeps it, 2/3 itself as threshold drops it (>=)
    text = f"Short one.\nShort two.\n{P1}"
    assert reason(FineWebQuality(), text) is None
    assert reason(FineWebQuality(short_line_thr=2 / 3), text) == "fineweb_quality.short_line_ratio"


# ---- BadWords ----------------------------------------------------------------------------------


def test_badwords_default_list_is_bundled_and_modest():
    wl = load_word_list(str(DEFAULT_WORDS_FILE))
    assert 60 <= len(wl) <= 150
    assert "fuck" in wl.single and ("blow", "job") in wl.phrases[2]
    assert load_word_list(str(DEFAULT_WORDS_FILE)) is wl  # cached per path


def test_badwords_drops_spam_and_tolerates_a_stray_word():
    spam = "Free porn videos, horny sluts and xxx cams online now. " * 5
    assert reason(BadWords(), spam) == "badwords.max_ratio"
    stray = PROSE + " Oh shit, the kiln cracked."  # 1 listed word in ~180: under 1%
    assert reason(BadWords(), stray) is None
    assert reason(BadWords(max_ratio=0.0), stray) == "badwords.max_ratio"  # C4's drop-on-any
    assert reason(BadWords(max_ratio=None), spam) is None


def test_badwords_custom_file_phrases_case_and_boundaries(tmp_path):
    path = tmp_path / "words.txt"
    path.write_text("# fruit we do not want\nbanana\nred  apple   # a phrase\n\n", encoding="utf-8")
    step = BadWords(max_ratio=0.1, words_file=str(path))
    assert reason(step, "I ate a BANANA today.") == "badwords.max_ratio"  # 1 of 4 words
    assert reason(step, "Look, a Red\nApple here.") == "badwords.max_ratio"  # phrase across a newline
    assert reason(step, "Bananas and redapple and red apples are fine.") is None  # word boundaries
    assert reason(step, "") is None
    with pytest.raises(ValueError, match="does not exist"):
        BadWords(words_file=str(tmp_path / "missing.txt"))(doc(PROSE))


def test_badwords_match_a_turkish_capital_dotted_i(tmp_path):
    """A Turkish list holds "için" and "iğrenç"; a text writes them "İÇİN" and "İğrenç". Python lowercases İ to i + a
    combining dot (two characters), which no list holds; as a list entry is read, so is the text (text_stats.lower)."""
    path = tmp_path / "tr.txt"
    path.write_text("için\niğrenç\n", encoding="utf-8")
    step = BadWords(max_ratio=0.3, words_file=str(path))
    assert reason(step, "İğrenç bir gün") == "badwords.max_ratio"  # 1 of 3 words: 0.33 > 0.3
    assert reason(step, "BUNU İÇİN YAZDIM") == "badwords.max_ratio"
    assert reason(step, "Bunu onun için yazdım ve gittim") is None  # 1 of 6: 0.17


# ---- CodeQuality -----------------------------------------------------------------------------

BLOB = base64.b64encode(bytes(range(256)) * 8).decode()
BLOB_LINES = "\n".join(BLOB[i : i + 76] for i in range(0, len(BLOB), 76))  # wrapped like MIME base64
EMBEDDED_PNG = PY_MODULE + f'\nLOGO_PNG = """\n{BLOB_LINES}\n"""\n'
C_HEX_ARRAY = "static const unsigned char firmware[] = {\n" + "\n".join(
    "    " + ", ".join(f"0x{(r * 16 + c) % 256:02x}" for c in range(16)) + "," for r in range(40)
) + "\n};\n"

CODE_DROPS = {
    "min_chars": "x = 1\n",
    "max_chars": "a = 1\n" * 200_000,
    "autogenerated": "// Code generated by protoc-gen-go. DO NOT EDIT.\n" + PY_MODULE,
    "max_line_length": "var a=1;" * 300 + "\n",  # a minified bundle on one line
    "max_avg_line_length": _lines("ROW_{i} = (" + ", ".join(["'glaze'", "1280.0", "'oxidation'"] * 10) + ")", 20),
    "min_alnum_fraction": "/* ================================ */\n" * 30,
    "encoded_data": EMBEDDED_PNG,
}


def test_code_keeps_a_real_module():
    v = CodeQuality()(doc(PY_MODULE))
    assert v.kept and v.text == PY_MODULE


@pytest.mark.parametrize("rule", CODE_DROPS)
def test_code_drops(rule):
    assert reason(CodeQuality(), CODE_DROPS[rule]) == f"code_quality.{rule}"


@pytest.mark.parametrize(
    ("param", "rule"),
    [("min_chars", "min_chars"), ("max_chars", "max_chars"), ("autogen_scan_lines", "autogenerated"),
     ("max_line_length", "max_line_length"), ("max_avg_line_length", "max_avg_line_length"),
     ("min_alnum_fraction", "min_alnum_fraction")],
)
def test_code_rule_disabled_by_none(param, rule):
    assert reason(CodeQuality(**{param: None}), CODE_DROPS[rule]) != f"code_quality.{rule}"


def test_code_encoded_data_rules():
    assert reason(CodeQuality(), C_HEX_ARRAY) == "code_quality.encoded_data"
    off = CodeQuality(max_encoded_match_chars=None, max_encoded_fraction=None)
    assert reason(off, EMBEDDED_PNG) is None and reason(off, C_HEX_ARRAY) is None
    # a short hash or a small byte table is not a blob
    small = PY_MODULE + '\nSHA = "' + "ab12" * 16 + '"\nMAGIC = b"\\x89\\x50\\x4e\\x47\\x0d\\x0a\\x1a\\x0a"\n'
    assert reason(CodeQuality(), small) is None


def test_code_autogen_marker_only_in_the_head():
    lines = PY_MODULE.split("\n")
    late = "\n".join(lines[:6] + ["# generated by hand, then edited"] + lines[6:])
    assert reason(CodeQuality(), late) is None
    assert reason(CodeQuality(autogen_scan_lines=10), late) == "code_quality.autogenerated"
    assert reason(CodeQuality(autogen_markers=("@generated",)), "# @Generated\n" + PY_MODULE) == (
        "code_quality.autogenerated"
    )


def test_code_minified_without_line_cap_fails_on_average():
    step = CodeQuality(max_line_length=None)
    assert reason(step, CODE_DROPS["max_line_length"]) == "code_quality.max_avg_line_length"


# The batch form screens with RE2 (pyarrow) and must decide exactly as the per-document form, which always runs
# Python's `re`: the per-document form is the independent second implementation here.
HEX_EDGES = [
    "x = [" + ",\u00a0".join(f"0x{i:02x}" for i in range(12)) + "]\n",  # Python's \s: a no-break space
    "é" + " ".join(f"{i:02x}" for i in range(20)) + "é\n",  # Unicode letters next to the hex run
    "data = '" + "".join(f"\\x{i:02x}" for i in range(40)) + "'\n",
    "s = '" + "\\u00e9" * 12 + "'\n",
    "q = " + "A" * 63 + "\n",  # one short of a base64 run
]


@pytest.mark.parametrize("text", [*CODE_DROPS.values(), C_HEX_ARRAY, PY_MODULE, *HEX_EDGES],
                         ids=[*CODE_DROPS, "hex_array", "module", *(f"edge{i}" for i in range(len(HEX_EDGES)))])
def test_code_batch_form_decides_as_the_per_document_form(text):
    step = CodeQuality(max_encoded_match_chars=200)
    assert [v.drop for v in step.batch([doc(text)])] == [step(doc(text)).drop]


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.text(alphabet="0123456789abcdefxX\\u, \u00a0\u2003\t\né_+/=AZ", min_size=0, max_size=400))
def test_code_batch_form_on_generated_text(text):
    step = CodeQuality(min_chars=None, max_encoded_match_chars=40, max_encoded_fraction=0.2, min_alnum_fraction=None)
    assert [v.drop for v in step.batch([doc(text)])] == [step(doc(text)).drop]


# Gopher's batch form counts the words of a whole batch in numpy over code points; the per-document form
# (Python's `re` tokenizer) is the second implementation, on text built to hit every tokenizer edge: joiners
# inside and outside words, dot runs, Unicode words, digits, marks, all of str.splitlines' breaks, bullets, stop
# words in any case, and the two non-ASCII letters that lowercase to ASCII.
GOPHER_ALPHABET = st.sampled_from([
    "a", "b", "Z", "1", "_", " ", "'", "’", "-", "--", ".", "..", "...", "…", "#", ",", "\n", "\r\n", "\r", "\x0b",
    "\x1c", "\u2028", "\t", "\u00a0", "é", "½", "٣", "\u0301", "\u212a", "\u0130", "•", "- ", "日本",
    "the", "THE", "The", "of", "to", "be", "and", "that", "have", "with", "wITh", "than", "them", "withdraw",
    "x-the", "the-x", "'the", "don't",
    "\u200c", "\u200d", "\U0001F468", "\U0001F3FD", "\u2764", "\ufe0f",  # joiners, emoji, skin tone, selector
])
gopher_text = st.lists(GOPHER_ALPHABET, max_size=60).map("".join)


@settings(max_examples=400, deadline=None, derandomize=True)
@given(st.lists(gopher_text, min_size=1, max_size=6))
def test_gopher_batch_counts_are_the_tokenizers_counts(texts):
    from kiln.curation.filters.gopher import _batch_counts, _WordCounts

    got = _batch_counts(texts, chunk_chars=50)  # several chunks, texts split across none
    for text, counts in zip(texts, got):
        exact = _WordCounts(text, stop_words_needed=10**9)
        assert (counts.tokens, counts.words, counts.word_chars, counts.alpha_words, counts.stop_words) == (
            exact.tokens, exact.words, exact.word_chars, exact.alpha_words, exact.stop_words), text


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(gopher_text, min_size=1, max_size=6))
def test_gopher_batch_form_decides_as_the_per_document_form(texts):
    for step in (GopherQuality(min_doc_words=1), GopherQuality(min_doc_words=None, min_avg_word_length=1,
                                                              max_non_alpha_words_ratio=0.5, min_stop_words=1)):
        docs = [doc(t) for t in texts]
        assert [v.drop for v in step.batch(docs)] == [step(d).drop for d in docs]


@settings(max_examples=300, deadline=None, derandomize=True)
@given(gopher_text)
def test_bullet_and_ellipsis_lines_match_a_loop_over_the_lines(text):
    lines = ts.lines(text)
    assert ts.count_bullet_and_ellipsis_lines(text) == (
        sum(1 for line in lines if line.lstrip().startswith(ts.BULLETS)),
        sum(1 for line in lines if line.rstrip().endswith(ts.ELLIPSES)))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(gopher_text)
def test_count_with_letter_is_has_alpha_per_word(text):
    ws = ts.words(text)
    assert ts.count_with_letter(ws) == sum(map(ts.has_alpha, ws))


@settings(max_examples=200, deadline=None, derandomize=True)
@given(st.lists(st.lists(st.sampled_from([
    "fuck", "FUCK", "Fuck", "fuc\u212a", "f\u0130ck", "motherfucker", "fuck-off", "x'fuck", "fucking", " ", "\n", ".",
    "é", "word", "class", "shit", "sHit", "two girls one cup", "Two  Girls"]), max_size=30).map("".join),
    min_size=1, max_size=5))
def test_badwords_batch_form_decides_as_the_per_document_form(texts):
    docs = [doc(t) for t in texts]
    for step in (BadWords(), BadWords(max_ratio=0.0), BadWords(max_ratio=0.2)):
        assert [v.drop for v in step.batch(docs)] == [step(d).drop for d in docs]


def test_batch_forms_take_the_per_document_path_on_a_lone_surrogate():
    """Arrow cannot hold a lone surrogate: the RE2 screens step aside, the verdicts stay the per-document ones."""
    from kiln.curation.pii import PiiRedaction

    texts = ["bad \ud800 text with the word fuck and mail a@b.co " * 3, "The cat and the dog. " * 20]
    docs = [doc(t) for t in texts]
    for step in (GopherQuality(), BadWords(max_ratio=0.0), CodeQuality(), PiiRedaction()):
        assert [(v.text, v.drop, v.counts) for v in step.batch(docs)] == [
            (v.text, v.drop, v.counts) for v in map(step, docs)]
