"""Per-language defaults of the quality rules: Gopher's stop words and word-length limits for each language, and
FineWeb's short-line rule off for Chinese and Japanese (_NO_SHORT_LINE_RULE).

Gopher (Rae et al. 2021, Table A1) keeps a document with at least two of eight very frequent English words ("the",
"be", "to", "of", "and", "that", "have", "with"): a sign that it is running text in the language, not a list, a
table or soup. Other languages need their own most frequent words. These are FineWeb-2's (Penedo et al. 2025,
"FineWeb2: One Pipeline to Scale Them All", arXiv:2506.20920): its per-language filter configs
(github.com/huggingface/fineweb-2, configs/<iso 639-3>_<script>.yml; code Apache-2.0) list each language's most
frequent words (8-22 of them) as `stopwords`, used with Gopher's `min_stop_words: 2`, and set the word-length limits
`min_avg_word_length` / `max_avg_word_length` per language. Words are as Kiln's tokenizer splits them
(kiln.curation.filters.text_stats.words: Chinese and Japanese text in characters), so FineWeb-2's clitics "l'" and
"d'" (French, Italian), which that tokenizer never yields, are left out, and so is the English "the" of its Finnish
and Turkish lists; Korean's particles and endings count at the end of a word (_STOP_WORD_ENDINGS).

A step's language defaults replace only its published (English) defaults: what a profile sets, for every language
or under `per_language`, wins (kiln.curation.filters.registry.step_params).
"""

from __future__ import annotations

from typing import Any

# ISO 639-1 code (as the language step identifies it) -> the FineWeb-2 config it comes from, and its stop words.
STOP_WORDS: dict[str, tuple[str, ...]] = {
    "cs": ("v", "a", "se", "na", "je", "z", "s", "do"),  # ces_Latn
    "da": ("i", "og", "af", "en", "til", "er", "den", "at", "som", "på", "for", "med", "det", "blev", "var", "der",
           "fra", "de", "han", "et"),  # dan_Latn
    "de": ("der", "und", "die", "in", "von", "im", "den", "des", "mit", "das", "er", "dem", "als", "wurde",
           "für"),  # deu_Latn
    "es": ("de", "la", "en", "el", "y", "a", "que", "del", "los", "se", "por", "un", "con", "una", "las",
           "su"),  # spa_Latn
    "fi": ("ja", "on", "oli", "hän", "vuonna", "myös", "joka", "se", "ei", "sen", "ovat", "sekä", "mutta", "että",
           "tai", "vuoden", "kanssa", "hänen", "jälkeen"),  # fin_Latn
    "fr": ("de", "la", "le", "et", "à", "en", "des", "du", "les", "est", "un", "une", "il", "dans", "par",
           "au"),  # fra_Latn
    "hr": ("je", "u", "i", "se", "na", "su", "za", "od", "s", "a"),  # hrv_Latn
    "hu": ("a", "az", "és", "is", "egy", "volt", "hogy", "nem", "meg", "de", "magyar", "első", "el",
           "között"),  # hun_Latn
    "id": ("dan", "yang", "di", "pada", "dari", "ini", "dengan", "adalah", "untuk", "dalam"),  # ind_Latn
    "it": ("di", "e", "il", "la", "in", "a", "del", "che", "è", "della", "un", "per", "nel", "con", "da", "i",
           "una"),  # ita_Latn
    "ja": ("の", "に", "を", "は", "た", "て", "が", "と", "で", "年", "し", "・", "月", "れ", "さ"),  # jpn_Jpan
    "ko": ("의", "다", "이", "는", "에", "을", "한", "년", "하", "은", "를", "했", "고", "에서", "가", "있", "으로", "인",
           "월", "로", "되"),  # kor_Hang
    "nl": ("de", "van", "in", "het", "een", "en", "is", "op", "voor", "met", "door", "zijn", "werd", "hij",
           "uit"),  # nld_Latn
    "pl": ("w", "i", "na", "z", "do", "się", "roku", "od", "a", "jest", "przez", "po", "jako", "oraz", "o",
           "został", "był", "nie"),  # pol_Latn
    "pt": ("de", "a", "e", "o", "em", "do", "da", "que", "um", "no", "uma", "com", "para", "na", "é",
           "foi"),  # por_Latn
    "ro": ("de", "în", "a", "și", "din", "la", "o", "cu", "este", "un", "pe", "fost", "care", "al"),  # ron_Latn
    "ru": ("в", "и", "на", "с", "года", "по", "году", "из", "был", "к", "не", "от", "что", "за", "для", "его",
           "как", "а", "он", "также", "до", "после"),  # rus_Cyrl
    "sl": ("je", "v", "in", "na", "so", "se", "ki", "za", "leta", "z"),  # slv_Latn
    "sr": ("у", "је", "и", "на", "се", "од", "су", "године", "да", "за", "из", "са"),  # srp_Cyrl
    "sv": ("i", "och", "är", "av", "en", "som", "den", "med", "på", "till", "att", "för"),  # swe_Latn
    "tr": ("ve", "bir", "olarak", "bu", "ile", "için", "olan", "da", "de", "tarafından", "yılında", "sonra", "en",
           "daha", "ilk"),  # tur_Latn
    "uk": ("у", "в", "на", "і", "з", "та", "до", "року", "за", "що"),  # ukr_Cyrl
    "zh": ("的", "年", "在", "月", "是", "和", "日", "了", "於", "·", "為", "有", "被", "人", "中", "为", "他", "與", "後",
           "也", "而", "由"),  # cmn_Hani
}

# FineWeb-2's average word length limits (characters per word), where they differ from Gopher's 3 and 10.
_WORD_LENGTH: dict[str, tuple[float, float]] = {
    "cs": (3, 11), "da": (3, 11), "de": (0, 15), "es": (3, 14), "fi": (3, 14), "fr": (2, 11), "hr": (2, 11),
    "hu": (3, 15), "id": (3, 12), "it": (3, 21), "ja": (1, 6), "ko": (1, 6), "nl": (3, 17), "pl": (3, 12),
    "pt": (3, 13), "ro": (1, 14), "ru": (3, 11), "sl": (2, 12), "sr": (3, 10), "sv": (3, 12), "tr": (3, 21),
    "uk": (3, 11), "zh": (1, 5),
}

# Kiln's, not FineWeb-2's: where words are characters, a share of stop words instead of two of them (GopherQuality's
# min_stop_word_ratio). Decided on the tune half of bench/multilingual_filter_eval.py: translated manual pages hold
# 5-30% stop characters (zh 1st percentile 5.2%, ja 12.9%), random characters of the language at most 2.5%.
_STOP_WORD_RATIO: dict[str, float] = {"zh": 0.04, "ja": 0.04}

# Kiln's, not FineWeb-2's: Korean writes its particles and endings onto the word before ("서울시는", "정책을", "열었다"),
# and Kiln splits Hangul at spaces, so FineWeb-2's list (made by a tokenizer that splits them off) matched almost no
# word: 6 of the 28 Korean manual pages installed here, and plain news prose, were dropped for too few stop words. A
# word ending in one of the list's bound forms counts (not 년 and 월, which end dates: "2024년").
_STOP_WORD_ENDINGS: dict[str, tuple[str, ...]] = {"ko": tuple(w for w in STOP_WORDS["ko"] if w not in ("년", "월"))}

# A language Kiln has no figures for (Thai, Arabic, Hindi, Vietnamese ...): Gopher's eight English stop words and
# English word lengths would judge it as English, so every such document was dropped (none holds two of those words;
# Thai, whose words are characters in Kiln's split, also failed the mean length of 3). Those two rules are off for
# it, unless a profile sets them (for every language, or under per_language); the other rules judge it as before.
UNMEASURED_LANGUAGE: dict[str, dict[str, Any]] = {
    "gopher_quality": {"min_stop_words": None, "min_avg_word_length": None, "max_avg_word_length": None},
}

# FineWeb's short-line rule (a page is dropped when 67% of its lines have at most 30 characters) was measured on
# English, where 30 characters are about 5 words. A Chinese or Japanese character carries about 5/8 of a word
# (kiln.common.text_units), so 30 of them are ~18 words, a whole sentence, and a story or a news page written a
# sentence per paragraph was "mostly short lines". Characters of different scripts have no common measure
# (text_units weighs words, not characters), so the rule is off for these languages, as FineWeb-2 has it off for
# every language (short_line_thr=999 in its pipeline); spaced scripts keep it, as their characters carry about what
# English ones do.
_NO_SHORT_LINE_RULE: tuple[str, ...] = ("ja", "zh")

# step name -> language -> parameters replacing the step's published defaults for documents in that language.
LANGUAGE_DEFAULTS: dict[str, dict[str, dict[str, Any]]] = {
    "gopher_quality": {
        lang: {"stop_words": list(words), "min_avg_word_length": _WORD_LENGTH[lang][0],
               "max_avg_word_length": _WORD_LENGTH[lang][1]}
        | ({"min_stop_word_ratio": _STOP_WORD_RATIO[lang]} if lang in _STOP_WORD_RATIO else {})
        | ({"stop_word_endings": list(_STOP_WORD_ENDINGS[lang])} if lang in _STOP_WORD_ENDINGS else {})
        for lang, words in STOP_WORDS.items()
    },
    "fineweb_quality": {lang: {"short_line_thr": None} for lang in _NO_SHORT_LINE_RULE},
}
