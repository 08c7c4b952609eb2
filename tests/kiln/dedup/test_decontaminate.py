"""Benchmark decontamination: planted overlaps are found through case/punctuation/digit edits and
shorter ones are not; drop vs redact; short items; several benchmarks and the contamination report;
clear errors for bad benchmark files; properties over generated text."""

from __future__ import annotations

import hashlib
import json
import pickle
import re

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kiln.common.config import Benchmark, Decontamination, ShingleNormalization
from kiln.dedup.decontaminate import (
    CONTAMINATION_SCHEMA,
    DEMO_BENCHMARK,
    DROP_REASON,
    TOO_SHORT_REASON,
    BenchmarkError,
    BenchmarkIndex,
    contamination_counts,
    decontaminate,
    load_benchmarks,
    ngram_hashes,
    redact_spans,
    report_rows,
    report_table,
)
from kiln.dedup.text import normalized_words, words
from tests.conftest import CLEAN_PROSE, write_jsonl

ITEM = ("In 1887 the lighthouse keeper recorded forty storms, each one logged with the wind "
        "direction, the barometer reading and the number of ships that sought shelter in the bay.")
ITEM_WORDS = ITEM.split()
FILLER_A = ("Gardeners in the northern valleys plant their potatoes late, after the last frost has gone, "
            "and harvest them before the autumn rains soak the fields. ")
FILLER_B = (" Meanwhile the railway company published a new timetable that nobody could read, because "
            "the printer had used a font so small that even the stationmaster gave up.")


def index_of(*items: tuple[str, str, str], ngram: int = 13, min_item_words: int = 8) -> BenchmarkIndex:
    return BenchmarkIndex.from_items(items, ngram=ngram, min_item_words=min_item_words)


def planted(n_words: int, start: int = 2) -> str:
    return FILLER_A + " ".join(ITEM_WORDS[start:start + n_words]) + FILLER_B


DROP = Decontamination()
REDACT = Decontamination(mode="redact", redact_margin_chars=0, min_chars_after_redact=0)


def fuzzy_index(*items: tuple[str, str, str], **settings_) -> BenchmarkIndex:
    """The index as the default settings (changed by `settings_`) build it: 13-grams, the aligned rule and the
    share of each item's 4-grams."""
    return BenchmarkIndex.from_settings(items, DROP.model_copy(update=settings_))


# ---- finding ------------------------------------------------------------------------------------


def test_planted_13_word_overlap_is_found_and_located():
    index = index_of(("trivia", "q1", ITEM))
    text = planted(13)
    matches = index.find(text)
    assert len(matches) == 1
    m = matches[0]
    assert (m.benchmark, m.item_id) == ("trivia", "q1")
    assert text[m.start:m.end] == " ".join(ITEM_WORDS[2:15]).rstrip(",")  # spans are words: no trailing comma


def test_overlap_survives_case_punctuation_and_digit_changes():
    index = index_of(("trivia", "q1", ITEM))
    copy = " ".join(ITEM_WORDS[:14]).upper().replace(",", " ;").replace("1887", "1923").replace(" ", " -- ")
    text = FILLER_A + copy + FILLER_B
    assert [(m.benchmark, m.item_id) for m in index.find(text)] == [("trivia", "q1")]


def test_12_word_overlap_is_not_found():
    index = index_of(("trivia", "q1", ITEM))
    for start in range(0, len(ITEM_WORDS) - 12):
        assert index.find(planted(12, start)) == []
    assert decontaminate(planted(12), index, DROP).kept


def test_a_long_copy_gives_one_match_per_item_run():
    index = index_of(("trivia", "q1", ITEM))
    text = FILLER_A + ITEM + FILLER_B + " and again: " + ITEM
    matches = index.find(text)
    assert [text[m.start:m.end] for m in matches] == [ITEM.rstrip("."), ITEM.rstrip(".")]


def test_hashes_are_stable_and_order_sensitive():
    """blake2b, not Python's salted hash: the same words give the same n-gram hash everywhere."""
    assert ngram_hashes(["the", "cat", "sat"], 3).tolist() == ngram_hashes(["the", "cat", "sat"], 3).tolist()
    assert len(ngram_hashes(["a", "b", "c", "d"], 2)) == 3
    assert ngram_hashes(["a", "b"], 2)[0] != ngram_hashes(["b", "a"], 2)[0]
    assert ngram_hashes(["a"], 2).size == 0
    # A value pinned once: changing the hash silently would make old reports and indexes disagree.
    assert ngram_hashes(["kiln"], 1).tolist() == [int.from_bytes(hashlib.blake2b(b"kiln", digest_size=8).digest(),
                                                                  "little")]


@settings(max_examples=50, deadline=None)
@given(st.lists(st.sampled_from(["a", "b", "c", "dé", "0"]), min_size=1, max_size=40), st.integers(1, 13))
def test_window_hashes_equal_the_polynomial_definition(ws, size):
    """The prefix-sum shortcut gives exactly sum_t h(w_j+t) * P**t mod 2**64 for every window."""
    def h(w: str) -> int:
        return int.from_bytes(hashlib.blake2b(w.encode(), digest_size=8).digest(), "little")
    p = 0x9E3779B97F4A7C15
    expected = [sum(h(w) * pow(p, t, 2**64) for t, w in enumerate(ws[j:j + size])) % 2**64
                for j in range(len(ws) - size + 1)]
    assert ngram_hashes(ws, size).tolist() == expected


def test_index_survives_pickling_for_worker_processes():
    index = pickle.loads(pickle.dumps(index_of(("trivia", "q1", ITEM))))
    assert [m.item_id for m in index.find(planted(13))] == ["q1"]


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=st.characters(codec="utf-8"), max_size=200))
def test_fast_words_equal_the_shared_word_view(text):
    for norm in (ShingleNormalization(), ShingleNormalization(digits="remove"),
                 ShingleNormalization(strip_punctuation=False, lowercase=False, digits="keep")):
        assert normalized_words(text, norm) == words(text, norm).words


def test_final_sigma_is_lowercased_per_word():
    text = "ΟΔΟΣ ΟΔΟΣ. ΣΑΣ"
    assert normalized_words(text) == words(text).words


# ---- drop and redact ----------------------------------------------------------------------------


def test_drop_mode_removes_the_document_and_names_the_item():
    index = index_of(("trivia", "q1", ITEM))
    out = decontaminate(planted(20), index, DROP)
    assert not out.kept and out.reason == DROP_REASON and out.action == "dropped"
    assert out.text == planted(20)
    assert [(m.benchmark, m.item_id) for m in out.matches] == [("trivia", "q1")]


def test_redact_cuts_the_item_and_keeps_the_rest():
    index = index_of(("trivia", "q1", ITEM))
    out = decontaminate(planted(20), index, REDACT)
    assert out.kept and out.reason is None and out.action == "redacted"
    assert out.text == FILLER_A + "\n" + FILLER_B
    assert "lighthouse" not in out.text and index.find(out.text) == []


def test_redact_margin_is_honoured_and_clipped():
    index = index_of(("trivia", "q1", ITEM))
    text = planted(20)
    (m,) = index.find(text)
    out = decontaminate(text, index, REDACT.model_copy(update={"redact_margin_chars": 10}))
    assert out.text == text[:m.start - 10] + "\n" + text[m.end + 10:]
    huge = decontaminate(text, index, REDACT.model_copy(update={"redact_margin_chars": 10_000}))
    assert not huge.kept and huge.reason == TOO_SHORT_REASON


def test_too_short_after_redact_is_dropped():
    index = index_of(("trivia", "q1", ITEM))
    text = "Intro. " + ITEM + " Outro."
    strict = REDACT.model_copy(update={"min_chars_after_redact": 200})
    out = decontaminate(text, index, strict)
    assert not out.kept and out.reason == TOO_SHORT_REASON and out.action == "dropped"
    assert decontaminate(text, index, REDACT).text == "Intro. \n. Outro."  # the span ends at "bay", not "."
    assert decontaminate(ITEM, index, REDACT).reason == TOO_SHORT_REASON  # no word left: dropped even at 0


def test_redact_spans_merges_overlaps():
    assert redact_spans("abcdefghij", [(2, 4), (3, 6), (8, 9)], margin=0) == "ab\ngh\nj"
    assert redact_spans("abcdefghij", [(2, 4)], margin=1) == "a\nfghij"
    assert redact_spans("abc", [], margin=5) == "abc"


def test_disabled_or_empty_index_keeps_everything():
    index = index_of(("trivia", "q1", ITEM))
    assert decontaminate(planted(20), index, DROP.model_copy(update={"enabled": False})).kept
    assert decontaminate(planted(20), index_of(), DROP).kept


# ---- short items --------------------------------------------------------------------------------


def test_short_items_use_all_their_words_and_tiny_ones_are_skipped():
    short = "What is the capital city of Burkina Faso today"  # 9 words
    tiny = "Name the largest ocean"  # 4 words: skipped
    index = index_of(("qa", "short", short), ("qa", "tiny", tiny), ("qa", "long", ITEM))
    assert index.summary()["benchmarks"]["qa"] == {"items": 3, "items_indexed": 2, "items_skipped_short": 1,
                                                   "ngrams": 1 + len(ITEM_WORDS) - 13 + 1}
    assert index.summary()["ngram_sizes"] == [9, 13]
    hit = FILLER_A + "what is the CAPITAL city of burkina faso, today?" + FILLER_B
    assert [m.item_id for m in index.find(hit)] == ["short"]
    assert index.find(FILLER_A + "what is the capital city of burkina faso" + FILLER_B) == []  # 8 of 9
    assert index.find(FILLER_A + tiny + FILLER_B) == []


# ---- several benchmarks and the report ----------------------------------------------------------


def test_multiple_benchmarks_and_report_aggregation():
    other = ("The committee agreed that every bridge in the district would be inspected twice a year "
             "by an engineer from outside the county.")
    index = index_of(("trivia", "q1", ITEM), ("civics", "c7", other), ("civics", "c8", ITEM))
    docs = {
        "d1": FILLER_A + ITEM + FILLER_B,                 # trivia q1 and civics c8 (same text)
        "d2": FILLER_A + other + FILLER_B,                # civics c7
        "d3": FILLER_A + FILLER_B,                        # clean
        "d4": FILLER_A * 3 + other + FILLER_B * 3,        # civics c7, redacted and kept
    }
    rows = []
    for doc_id, text in docs.items():
        mode = REDACT if doc_id == "d4" else DROP
        rows += report_rows(doc_id, "web", decontaminate(text, index, mode))
    assert sorted((r["benchmark"], r["item_id"], r["doc_id"], r["action"]) for r in rows) == [
        ("civics", "c7", "d2", "dropped"), ("civics", "c7", "d4", "redacted"), ("civics", "c8", "d1", "dropped"),
        ("trivia", "q1", "d1", "dropped")]
    assert contamination_counts(rows) == {
        "civics": {"items_contaminated": 2, "documents_affected": 3, "documents_dropped": 2, "documents_redacted": 1},
        "trivia": {"items_contaminated": 1, "documents_affected": 1, "documents_dropped": 1, "documents_redacted": 0}}
    table = report_table(rows)
    assert table.schema == CONTAMINATION_SCHEMA and table.num_rows == 4
    assert report_table([]).num_rows == 0


# ---- loading benchmark files --------------------------------------------------------------------


def test_load_benchmarks_reads_fields_ids_and_line_numbers(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"qid": 7, "question": ITEM, "choices": ["one", "two"]}])
    write_jsonl(tmp_path / "b.jsonl", [{"text": "too short"}, {"text": CLEAN_PROSE}])
    (tmp_path / "b.jsonl").write_text("\n" + (tmp_path / "b.jsonl").read_text())  # blank lines are skipped
    settings_ = Decontamination(benchmarks=[
        Benchmark(name="a", path="a.jsonl", text_fields=["question", "choices"], id_field="qid"),
        Benchmark(name="b", path=str(tmp_path / "b.jsonl"), id_field=None)])
    index = load_benchmarks(settings_, base_dir=tmp_path)
    assert index.summary()["benchmarks"]["b"]["items_skipped_short"] == 1
    assert [(m.benchmark, m.item_id) for m in index.find(FILLER_A + ITEM + " one two")] == [("a", "7")]
    assert [m.item_id for m in index.find(CLEAN_PROSE[100:400])] == ["3"]  # line 3: after the blank line


@pytest.mark.parametrize("line, expected", [
    ("{broken", r"bad\.jsonl:2 \(benchmark 'bad'\): not valid JSON .* each line must be one JSON object"),
    ('["a list"]', r"bad\.jsonl:2 .*expected a JSON object, got list"),
    ('{"id": 2}', r"bad\.jsonl:2 .*no 'text' field \(listed in text_fields\).*present fields: \['id'\]"),
    ('{"text": "x"}', r"bad\.jsonl:2 .*no 'id' field \(the id_field\).*or to null to use line numbers"),
    ('{"id": 2, "text": {"a": 1}}', r"bad\.jsonl:2 .*field 'text' is a dict"),
    # two texts under one id: the index would know one item (the second's words, both texts' n-grams), and an edited
    # copy of the first went unfound; JSON's 1 and "1" are one id
    ('{"id": 1, "text": "another item entirely"}', r"bad\.jsonl:2 .*id '1' \(field 'id'\) is line 1's too, with "
                                                   r"another text; .*set id_field: null"),
    ('{"id": "1", "text": "another item entirely"}', r"bad\.jsonl:2 .*id '1' \(field 'id'\) is line 1's too"),
])
def test_bad_jsonl_names_file_line_and_fix(tmp_path, line, expected):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"id": 1, "text": ITEM}) + "\n" + line + "\n", encoding="utf-8")
    s = Decontamination(benchmarks=[Benchmark(name="bad", path=str(path))])
    with pytest.raises(BenchmarkError, match=expected):
        load_benchmarks(s)


def test_an_item_written_twice_under_its_id_is_one_item(tmp_path):
    path = tmp_path / "twice.jsonl"
    path.write_text((json.dumps({"id": 1, "text": ITEM}) + "\n") * 2, encoding="utf-8")
    index = load_benchmarks(Decontamination(benchmarks=[Benchmark(name="b", path=str(path))]))
    assert [(m.benchmark, m.item_id) for m in index.find(planted(20))] == [("b", "1")]


def test_a_benchmark_file_that_is_not_utf8_or_a_cut_short_gzip_names_the_file_and_the_fix(tmp_path):
    import gzip

    whole = (json.dumps({"id": 1, "text": ITEM}) + "\n").encode("utf-8") * 50
    (tmp_path / "latin1.jsonl").write_bytes(whole + b'{"id": 2, "text": "caf\xe9"}\n')
    (tmp_path / "cut.jsonl.gz").write_bytes(gzip.compress(whole)[:-20])
    for name, expected in (("latin1.jsonl", "not UTF-8 text"), ("cut.jsonl.gz", "a damaged or cut-short gzip file")):
        s = Decontamination(benchmarks=[Benchmark(name="b", path=str(tmp_path / name))])
        with pytest.raises(BenchmarkError, match=re.escape(f"{tmp_path / name} (benchmark 'b'): {expected} (")
                           + r".*write the items as UTF-8 JSONL, gzipped whole or not at all"):
            load_benchmarks(s)


def test_missing_file_names_the_config_key(tmp_path):
    s = Decontamination(benchmarks=[Benchmark(name="ok", path=str(DEMO_BENCHMARK), text_fields=["question", "answer"]),
                                    Benchmark(name="gone", path="nope/eval.jsonl")])
    with pytest.raises(BenchmarkError, match=re.escape("decontamination.benchmarks[1].path: file not found: ")):
        load_benchmarks(s, base_dir=tmp_path)


def test_duplicate_benchmark_names_are_refused(tmp_path):
    write_jsonl(tmp_path / "a.jsonl", [{"id": 1, "text": ITEM}])
    b = Benchmark(name="same", path=str(tmp_path / "a.jsonl"))
    with pytest.raises(BenchmarkError, match=r"benchmarks\[1\]\.name: 'same' is declared more than once"):
        load_benchmarks(Decontamination(benchmarks=[b, b]))


def test_demo_benchmark_loads():
    s = Decontamination(benchmarks=[Benchmark(name="demo", path=str(DEMO_BENCHMARK),
                                              text_fields=["question", "answer"])])
    summary = load_benchmarks(s).summary()["benchmarks"]["demo"]
    assert summary["items"] >= 15 and summary["items_skipped_short"] == 0


# ---- properties ---------------------------------------------------------------------------------

# Words guaranteed not to be in ITEM after normalization (ITEM's words are plain English ones).
OTHER_WORDS = st.sampled_from(["zebra", "Quartz", "nimbus", "FJORD", "x-ray", "42", "émigré", "naïve", "Ωmega",
                               "plinth", "kettle", "  ", "\n", "...", "(", ")", "—"])


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(OTHER_WORDS, max_size=120), st.lists(st.sampled_from(ITEM_WORDS), max_size=12))
def test_text_without_the_item_is_untouched_in_redact_mode(noise, item_bits):
    """Any text whose item-words never form 13 consecutive item words stays exactly as it was."""
    index = index_of(("trivia", "q1", ITEM))
    text = " ".join(noise[: len(noise) // 2] + item_bits + noise[len(noise) // 2:])
    out = decontaminate(text, index, REDACT)
    assert out.kept and out.text == text and out.matches == []


@settings(max_examples=100, deadline=None)
@given(st.lists(OTHER_WORDS, max_size=60), st.lists(OTHER_WORDS, max_size=60), st.integers(0, 50))
def test_a_planted_item_is_always_found_and_cut(before, after, margin):
    index = index_of(("trivia", "q1", ITEM))
    text = " ".join(before) + " " + ITEM + " " + " ".join(after)
    out = decontaminate(text, index, REDACT.model_copy(update={"redact_margin_chars": margin}))
    assert [m.item_id for m in out.matches] == ["q1"]
    if out.kept:
        assert index.find(out.text) == [] and "lighthouse" not in out.text
    else:  # dropped only when no word is left
        rest = redact_spans(text, [(m.start, m.end) for m in out.matches], margin)
        assert out.reason == TOO_SHORT_REASON and not re.search(r"\w", rest)


# ---- edited copies ----------------------------------------------------------------------------------
# ITEM has 29 words, so 26 distinct 4-grams, and the aligned rule allows floor(0.2 * 29) = 5 edits. Each edit
# below leaves no 13 words of it in a row (the exact rule misses every one of them); the share of its 4-grams
# still found is worked out by hand next to each.


def _edited(positions_to_words: dict[int, str | None], upper: bool = False, insert: dict[int, str] | None = None):
    """ITEM with words (1-based positions) replaced, or deleted (None), and sentences inserted after positions."""
    out = []
    for i, word in enumerate(ITEM_WORDS, start=1):
        if i in positions_to_words:
            word = positions_to_words[i]
        if word is not None:
            out.append(word.upper() if upper else word)
        if insert and i in insert:
            out.append(insert[i])
    return FILLER_A + " ".join(out) + FILLER_B


EDITS = {
    # words 6, 16, 26 replaced (10%): windows starting at 3-6, 13-16 and 23-26 are lost, 12 of 26: 14/26
    "substitution": (_edited({6: "noted", 16: "a", 26: "refuge"}), 14 / 26),
    # a sentence after words 10 and 20: the 3 windows across each seam are lost: 20/26, just min_shared_ngrams
    # (20); aligned, the runs of 8 and 5 inserted words cost (8+1)/2 + (5+1)/2 = 7.5 > 5 edits
    "insertion": (_edited({}, insert={10: "It was a hard year for the coast.", 20: "Records were kept in ink."}),
                  20 / 26),
    # words 8 and 19 deleted: whole windows left in runs 1-7, 9-18, 20-29: 4 + 7 + 7 = 18/26
    "deletion": (_edited({8: None, 19: None}), 18 / 26),
    # upper case, commas turned into semicolons (normalized away) and words 10, 20 replaced: 4 + 4 lost: 18/26
    "case_punctuation": (_edited({10: "every", 20: "a"}, upper=True).replace(",", ";"), 18 / 26),
}


@pytest.mark.parametrize("kind", sorted(EDITS))
def test_an_edited_copy_is_found_and_reports_its_share_of_short_ngrams(kind):
    text, share = EDITS[kind]
    assert index_of(("trivia", "q1", ITEM)).find(text) == []  # the 13-gram rule alone misses it
    matches = fuzzy_index(("trivia", "q1", ITEM)).find(text)
    assert {(m.benchmark, m.item_id) for m in matches} == {("trivia", "q1")}
    assert all(m.share == pytest.approx(share) for m in matches) and share >= DROP.min_share
    out = decontaminate(text, fuzzy_index(("trivia", "q1", ITEM)), DROP)
    assert not out.kept and out.reason == DROP_REASON
    assert report_rows("d1", "web", out)[0]["share"] == pytest.approx(share)


def test_shared_common_phrases_and_short_overlaps_are_not_flagged():
    index = fuzzy_index(("trivia", "q1", ITEM))
    # two 4-grams of the item in an unrelated text: below 3 found
    assert index.find(FILLER_A + "They counted the number of ships that came in." + FILLER_B) == []
    # 12 words in a row: 9 of the 26 4-grams, a share of 0.35 < 0.4 (and no 13-gram)
    for start in range(0, len(ITEM_WORDS) - 12):
        assert index.find(planted(12, start)) == []
    # A phrase eleven items share says nothing about any one of them. Each 8-word item has 5 4-grams, 4 of them
    # ("which of the following" ... "following is true about") in all eleven: without leaving those out, this
    # text would hold 4 of 5 (0.8) of every item.
    quiz = [("quiz", f"q{i}", f"Which of the following is true about {topic}?") for i, topic in enumerate(
        "tides winds stars maps knots sails ropes anchors flags bells lamps".split())]
    assert fuzzy_index(*quiz).find(FILLER_A + "Which of the following is true about pruning roses?" + FILLER_B) == []
    assert [m.item_id for m in fuzzy_index(*quiz).find(FILLER_A + quiz[3][2] + FILLER_B)] == ["q3"]


def test_fuzzy_matching_can_be_turned_off():
    text, _ = EDITS["substitution"]
    settings_ = Decontamination(min_share=None, max_edit_share=None)
    index = BenchmarkIndex.from_settings([("trivia", "q1", ITEM)], settings_)
    assert index.find(text) == [] and index.summary()["fuzzy"] is None


def test_the_share_rule_needs_min_shared_ngrams():
    """The insertion copy holds exactly 20 of ITEM's 26 4-grams; its inserted runs cost 7.5 edits, past the 5
    the aligned rule allows, so the share rule alone decides it at min_shared_ngrams' boundary."""
    text, share = EDITS["insertion"]
    assert {m.item_id for m in fuzzy_index(("trivia", "q1", ITEM), min_shared_ngrams=20).find(text)} == {"q1"}
    assert fuzzy_index(("trivia", "q1", ITEM), min_shared_ngrams=21).find(text) == []
    # the share (20/26 = 0.77) at min_share's boundary, the count met
    assert fuzzy_index(("trivia", "q1", ITEM), min_share=share).find(text) != []
    assert fuzzy_index(("trivia", "q1", ITEM), min_share=share + 0.01).find(text) == []
    # aligned, the same copy is found once 7.5 edits are allowed: floor(0.26 * 29) = 7, floor(0.28 * 29) = 8
    assert fuzzy_index(("trivia", "q1", ITEM), min_share=None, max_edit_share=0.26).find(text) == []
    assert fuzzy_index(("trivia", "q1", ITEM), min_share=None, max_edit_share=0.28).find(text) != []


# ---- short items: phrasing shared is not the item -----------------------------------------------------
# Issue 38: slist(3)'s sentence as a 19-word item, against the sentence of its sibling STAILQ(3). The item has 16
# distinct 4-grams; the sibling holds 7 of them ("new elements can be", "elements can be added", "can be added
# to", "be added to the", "after an existing element", "at the head of", "the head of the"): 7/16 = 0.44 of
# them, and no 13 words in a row. Aligned, the nearest span needs 4 edits: "list" -> "tail" plus "queue"
# inserted (2), "or" deleted (1), the last "list" -> "tail" (1: the span ends there); the rule allows
# floor(0.2 * 19) = 3.

SLIST = "New elements can be added to the list after an existing element or at the head of the list."
STAILQ = ("A singly linked tail queue is headed by a structure defined by the STAILQ_HEAD() macro. The elements are "
          "singly linked for minimum space and pointer manipulation overhead at the expense of O(n) removal for "
          "arbitrary elements. New elements can be added to the tail queue after an existing element, at the head "
          "of the tail queue, or at the end of the tail queue. A STAILQ_HEAD structure is declared as follows.")
SLIST_WORDS = SLIST.rstrip(".").split()


def test_a_sibling_page_sharing_phrases_of_a_short_item_is_not_flagged():
    before = Decontamination(max_edit_share=None, min_shared_ngrams=3)  # the rule issue 38 was filed against
    (m,) = {(m.item_id, m.share) for m in BenchmarkIndex.from_settings([("b", "q", SLIST)], before).find(STAILQ)}
    assert m == ("q", 7 / 16)
    assert fuzzy_index(("b", "q", SLIST)).find(STAILQ) == []
    assert decontaminate(STAILQ, fuzzy_index(("b", "q", SLIST)), DROP).kept
    # the 4 edits at max_edit_share's boundary: floor(0.22 * 19) = 4 finds it, floor(0.2 * 19) = 3 does not
    assert {m.item_id for m in fuzzy_index(("b", "q", SLIST), max_edit_share=0.22).find(STAILQ)} == {"q"}
    assert fuzzy_index(("b", "q", SLIST), max_edit_share=0.2).find(STAILQ) == []


def _slist_edited(replace: dict[int, str] | None = None, delete: tuple[int, ...] = (),
                  insert: dict[int, str] | None = None) -> str:
    """SLIST with words (1-based) replaced or deleted, and words inserted after positions."""
    replace, insert, out = replace or {}, insert or {}, []
    for i, word in enumerate(SLIST_WORDS, start=1):
        if i not in delete:
            out.append(replace.get(i, word))
        if i in insert:
            out.append(insert[i])
    return " ".join(out) + "."


@pytest.mark.parametrize("copy, edits", [
    (_slist_edited(replace={8: "queue"}), 1),
    (_slist_edited(delete=(13,)), 1),
    (_slist_edited(replace={8: "queue"}, delete=(13,)), 2),
    (_slist_edited(replace={8: "queue"}, delete=(13,), insert={3: "quickly"}), 3),
    (_slist_edited(replace={8: "queue", 16: "front"}, delete=(13,), insert={3: "quickly"}), 4),
    (_slist_edited(insert={12: "as shown below"}), 2),  # a run of 3 inserted words: (3 + 1) / 2
    (_slist_edited(insert={12: "as shown in the example"}), 3),  # 5 words: 3
    (_slist_edited(insert={12: "as shown in the example below"}), 3.5),  # 6 words: 3.5
])
def test_an_edited_copy_of_a_short_item_is_found_within_its_allowed_edits(copy, edits):
    """19 words allow 3 edits: each replaced, deleted or inserted word is one, a run of m inserted words
    (m + 1) / 2. Every 13-word window of the item holds words 7-13, and each copy edits one of them, so none
    keeps 13 words in a row; nor 20 4-grams (the item has 16)."""
    index = fuzzy_index(("b", "q", SLIST))
    assert index_of(("b", "q", SLIST)).find(FILLER_A + copy + FILLER_B) == []
    found = index.find(FILLER_A + copy + FILLER_B)
    assert bool(found) == (edits <= 3)
    if found:  # the match spans the aligned copy, so redaction cuts all of it
        out = decontaminate(FILLER_A + copy + FILLER_B, index, REDACT)
        assert out.text == FILLER_A + "\n." + FILLER_B  # the span runs from "New" to the last "list"


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from(["replace", "delete", "insert"]), st.integers(0, 28), OTHER_WORDS
                          .filter(lambda w: len(normalized_words(w)) == 1)), max_size=5),
       st.lists(OTHER_WORDS, max_size=30), st.lists(OTHER_WORDS, max_size=30))
def test_any_copy_within_the_allowed_edits_is_found(edits, before, after):
    """ITEM (29 words) allows 5 edits (of one word each: "x-ray" is two); the n-gram filter in front of the
    alignment may never lose such a copy."""
    ws = list(ITEM_WORDS)
    for op, at, word in edits:
        at = min(at, len(ws) - 1)
        if op == "replace":
            ws[at] = word
        elif op == "delete":
            del ws[at]
        else:
            ws.insert(at, word)
    text = " ".join(before + ws + after)
    assert [m.item_id for m in fuzzy_index(("trivia", "q1", ITEM)).find(text)] == ["q1"]


# ---- a sentence inserted into a copy ----------------------------------------------------------------------
# The item word for word with one sentence (a word starting with a capital letter up to the first . ! or ?)
# inserted between two of its words is one edit, whatever the sentence's length; anything else inserted is a
# run, m words (m + 1) / 2. SLIST (19 words) allows 3 edits, and every 13-word window of it holds words 7-13,
# so a sentence after word 8 leaves no 13-gram, and 16 4-grams are fewer than min_shared_ngrams (20).
WEATHER = "The weather turned cold that week."  # 6 words: as a plain run (6 + 1) / 2 = 3.5 edits


@pytest.mark.parametrize("copy, found", [
    (_slist_edited(insert={8: WEATHER}), True),  # one edit
    (_slist_edited(insert={8: "The " + "long " * 38 + "week."}), True),  # 40 words: still one
    # "list. The weather ... week. After an": the item cut into two sentences; case and punctuation normalized
    (_slist_edited(replace={8: "list.", 9: "After"}, insert={8: WEATHER}), True),
    (_slist_edited(insert={8: WEATHER.lower()}), False),  # no capital: a run of 6, 3.5 edits
    (_slist_edited(insert={8: WEATHER.rstrip(".")}), False),  # no end: the "sentence" runs to the item's last word
    (_slist_edited(replace={16: "front"}, insert={8: WEATHER}), False),  # not word for word: 3.5 + 1
    (_slist_edited(insert={8: "The weather turned cold. Nobody knew why."}), False),  # two sentences: a run of 8, 4.5
    (_slist_edited(insert={5: WEATHER, 12: "Nobody knew why."}), False),  # two places: 3.5 + 2.5
])
def test_a_copy_with_a_sentence_inserted_is_found(copy, found):
    index = fuzzy_index(("b", "q", SLIST))
    assert index_of(("b", "q", SLIST)).find(FILLER_A + copy + FILLER_B) == []
    assert bool(index.find(FILLER_A + copy + FILLER_B)) == found
    if found:  # the match spans the copy, sentence included, so redaction cuts all of it
        out = decontaminate(FILLER_A + copy + FILLER_B, index, REDACT)
        assert out.text == FILLER_A + "\n." + FILLER_B


# Sibling manual pages put a sentence where a copy would, but around it they change the item's words or insert
# text that is no sentence. pthread_attr_init(3)'s 16 words allow 3 edits; pthread_rwlockattr_setkind_np(3) puts a
# 7-word sentence after "return 0" and changes "they return" to "pthread_rwlockattr_setkind_np() returns": not
# word for word, so the sentence is a run, (7 + 1) / 2 = 4 edits on its own. Its longest run of the item's words
# is 8 ("return value ... return 0"): no 13-gram; it holds 6 of the 13 4-grams (5 in the first 8 words, "a
# nonzero error number"), fewer than 20.
RETURN_VALUE = "RETURN VALUE On success, these functions return 0; on error, they return a nonzero error number."
RWLOCK_PAGE = ("RETURN VALUE\nOn success, these functions return 0.\nGiven valid pointer arguments,\n"
               "pthread_rwlockattr_getkind_np()\nalways succeeds.\nOn error,\npthread_rwlockattr_setkind_np()\n"
               "returns a nonzero error number.\n")
# systemd-cat(1)'s 15 words allow 3; systemd-path(1) puts an option between them. That run starts with the option's
# name, "--suffix=", so it is no sentence: 9 words, (9 + 1) / 2 = 5 edits. "Printed ... string." is a sentence, but
# the word before it, "suffix", is not the item's. Runs of the item's words: 6 and 9, 3 + 6 of its 12 4-grams.
OPTIONS = "OPTIONS The following options are understood: -h, --help Print a short help text and exit."
SUFFIX_PAGE = ("OPTIONS\n\nThe following options are understood:\n\n--suffix=\nPrinted paths are suffixed by the "
               "specified string.\n\n-h, --help\nPrint a short help text and exit.\n\n--version\nPrint a short "
               "version string and exit.\n")


def test_a_sibling_page_with_a_sentence_where_a_copy_would_have_one_is_not_flagged():
    assert fuzzy_index(("b", "q", RETURN_VALUE)).find(RWLOCK_PAGE) == []
    assert fuzzy_index(("b", "q", OPTIONS)).find(SUFFIX_PAGE) == []
    # the boundaries: with "they return" as the item has it, or without the option's name, each is the item word
    # for word with one sentence inserted
    restored = RWLOCK_PAGE.replace("pthread_rwlockattr_setkind_np()\nreturns", "they return")
    assert [m.item_id for m in fuzzy_index(("b", "q", RETURN_VALUE)).find(restored)] == ["q"]
    assert [m.item_id for m in fuzzy_index(("b", "q", OPTIONS)).find(SUFFIX_PAGE.replace("--suffix=\n", ""))] == ["q"]
    # the plain runs at max_edit_share's boundary: floor(0.34 * 15) = 5 finds the option, floor(0.3 * 15) = 4 not
    assert fuzzy_index(("b", "q", OPTIONS), max_edit_share=0.34).find(SUFFIX_PAGE) != []
    assert fuzzy_index(("b", "q", OPTIONS), max_edit_share=0.3).find(SUFFIX_PAGE) == []


@settings(max_examples=60, deadline=None)
@given(st.integers(1, len(SLIST_WORDS) - 1), st.sampled_from(["Quartz", "Ωmega", "Émile", "ZEBRA"]),
       st.lists(st.sampled_from(["zebra", "nimbus", "plinth", "kettle", "x-ray", "42", "émigré", "—", "(", ")"]),
                max_size=60), st.sampled_from([".", "!", "?", ".)", '?"']))
def test_any_sentence_inserted_between_two_words_of_an_item_is_found(at, first, rest, end):
    """Wherever it goes and however long it is; the n-gram filter in front of the alignment never loses it."""
    sentence = " ".join([first, *rest]) + end
    copy = " ".join(SLIST_WORDS[:at] + [sentence] + SLIST_WORDS[at:]) + "."
    assert [m.item_id for m in fuzzy_index(("b", "q", SLIST)).find(FILLER_A + copy + FILLER_B)] == ["q"]


def test_the_independent_look_finds_exact_copies_by_its_own_reading_and_only_what_the_detector_finds():
    """kiln.dedup.residual_overlap, the no_benchmark_overlap check: its own words (\\w runs with their marks, of the NFC
    lowercased text) and n-grams. By hand: ITEM has 29 such words; 13 of them in a row are one of its n-grams, 12 are
    not; the upper-case copy is the same words; an 8-word item is one whole n-gram and a 7-word one is skipped
    (min_item_words 8). Wherever it finds a copy, the detector finds one too (a second implementation of the exact rule,
    stricter)."""
    from kiln.dedup.residual_overlap import ItemNgrams

    items = ItemNgrams([ITEM, "one two three four five six seven eight", "only seven words in this short item"],
                       ngram=13, min_item_words=8)
    assert len(re.findall(r"\w+", ITEM)) == 29 and set(items.by_size) == {13, 8}
    detector = index_of(("b", "q", ITEM), ("b", "e", "one two three four five six seven eight"),
                        ("b", "s", "only seven words in this short item"))
    cases = {planted(13): True, planted(12): False, (FILLER_A + ITEM + FILLER_B).upper(): True,
             FILLER_A + "One two three four five six seven eight." + FILLER_B: True,
             FILLER_A + "one two three four five six seven" + FILLER_B: False,
             FILLER_A + "only seven words in this short item" + FILLER_B: False, CLEAN_PROSE: False}
    for text, expected in cases.items():
        assert items.overlaps(text) is expected, text
        if expected:
            assert detector.find(text), text


def test_an_item_saved_decomposed_is_found_in_a_document_normalized_to_nfc(tmp_path):
    """A benchmark file may spell "é" as "e" + U+0301 (NFD, as macOS file tools and some exports write it); the
    documents are NFC after curation's normalize step. The item is read as NFC too: the copy is found (it was not),
    and by the independent look as well."""
    import unicodedata

    from kiln.dedup.residual_overlap import ItemNgrams

    item = ("Le général décida que la cérémonie aurait lieu près de l'église, après la fête du village, "
            "où les élèves chanteraient une dernière fois avant l'été")
    decomposed = unicodedata.normalize("NFD", item)
    assert decomposed != item and len(decomposed) > len(item)
    write_jsonl(tmp_path / "b.jsonl", [{"id": "q", "text": decomposed}])
    settings_ = Decontamination(benchmarks=[Benchmark(name="b", path=str(tmp_path / "b.jsonl"))])
    document = FILLER_A + item + FILLER_B  # NFC, as curation writes it
    assert [m.item_id for m in load_benchmarks(settings_).find(document)] == ["q"]
    assert ItemNgrams([decomposed], ngram=13, min_item_words=8).overlaps(document)


def test_a_document_kept_decomposed_is_found_and_redacted_at_its_own_spans():
    """The other side: a profile without curation's `normalize` step keeps a document as it came, NFD included. Its
    words are composed to NFC as the items are, so the copy is found, in both modes; the redacted span is the copy's
    in the decomposed text (longer than the NFC one by its 15 accented letters, one mark each: général 2, décida 1,
    cérémonie 2, près 1, l'église 1, après 1, fête 1, où 1, élèves 2, dernière 1, l'été 2)."""
    import unicodedata

    item = ("Le général décida que la cérémonie aurait lieu près de l'église, après la fête du village, "
            "où les élèves chanteraient une dernière fois avant l'été")
    decomposed = unicodedata.normalize("NFD", item)
    assert len(decomposed) - len(item) == 15
    index = index_of(("b", "q", item))
    document = FILLER_A + decomposed + FILLER_B
    (match,) = index.find(document)
    assert (match.item_id, document[match.start:match.end]) == ("q", decomposed)
    assert decontaminate(document, index, DROP).reason == DROP_REASON
    out = decontaminate(document, index, REDACT)
    assert out.kept and out.text == FILLER_A + "\n" + FILLER_B


def test_the_independent_look_reads_a_word_with_its_combining_marks_as_the_detector_does():
    """Vocalized Arabic: the same letters with other vowel marks (fatha U+064E <-> damma U+064F, kasra U+0650 ->
    fatha) are other words to the detector, which keeps marks inside words; `\\w` alone split every word at its marks,
    so the look saw the same bare letters, reported an overlap the detector rightly does not, and the blocking check
    failed on a clean document."""
    from kiln.dedup.residual_overlap import ItemNgrams

    words = ["كَتَبَ", "الطَّالِبُ", "دَرْسَهُ", "فِي", "المَدْرَسَةِ", "ثُمَّ", "ذَهَبَ", "إِلَى", "البَيْتِ", "مَعَ",
             "أَخِيهِ", "الصَّغِيرِ", "وَقَرَأَ", "كِتَابًا", "جَدِيدًا", "اليَوْمَ"]
    item = " ".join(words)
    other_marks = item.replace("\u064e", "\u064f").replace("\u0650", "\u064e")
    look = ItemNgrams([item], ngram=13, min_item_words=8)
    detector = index_of(("b", "q", item))
    assert look.overlaps("مقدمة. " + item + " خاتمة.") and detector.find("مقدمة. " + item + " خاتمة.")
    assert not detector.find("مقدمة. " + other_marks + " خاتمة.")
    assert not look.overlaps("مقدمة. " + other_marks + " خاتمة.")


# A Chinese exam item (37 Han characters, punctuation aside) and unrelated texts sharing a common phrase with it.
ZH_ITEM = "关于光合作用的叙述，下列说法中正确的是：植物在光照条件下把二氧化碳转化为有机物"
ZH_FILLER_A = "今天的物理作业一共有五道题，老师要求大家周五之前交上来。"
ZH_FILLER_B = "做完以后记得检查一遍，不要有遗漏。"


def test_chinese_ngrams_weigh_a_character_as_five_eighths_of_a_word():
    """The exact rule in text_units' weights: 13 words are 104 eighths, so 21 Han characters (105) and not 13; an item
    needs 8 words' weight, 13 characters (65 >= 64), not 8. By hand: the 9-character "下列说法中正确的是" ("which of the
    following is correct": 45 eighths) is skipped, as a 7-word English item is, instead of matching every exercise
    sheet that asks it; a 16-character item (80) is one n-gram of all its characters; the 37-character item matches
    a document holding 21 of its characters in a row, not one holding 20. The independent look agrees."""
    from kiln.dedup.residual_overlap import ItemNgrams

    def han(text):
        return sum("\u4e00" <= c <= "\u9fff" for c in text)

    assert han(ZH_ITEM) == 37 and han("下列说法中正确的是") == 9
    short = "下列说法中正确的是"
    sixteen = "中华人民共和国成立于一九四九年"  # 15 characters: 75 eighths; with 十 below, 16
    assert han(sixteen) == 15
    index = index_of(("b", "q", ZH_ITEM), ("b", "s", short), ("b", "t", sixteen + "十"), ("b", "u", sixteen))
    stats = index.summary()["benchmarks"]["b"]
    assert (stats["items_indexed"], stats["items_skipped_short"]) == (3, 1)  # 9 characters: 45 < 64
    assert index.summary()["ngram_sizes"] == [9.375, 10, 13]  # 75, 80 and 104 eighths
    exercise = ZH_FILLER_A + "关于电流，下列说法中正确的是哪一项？" + ZH_FILLER_B
    assert index.find(exercise) == []  # matched as "s" before
    chars = "".join(c for c in ZH_ITEM if "\u4e00" <= c <= "\u9fff")
    for n, found in ((21, True), (20, False)):
        document = ZH_FILLER_A + chars[5:5 + n] + ZH_FILLER_B
        matches = index.find(document)
        assert [m.item_id for m in matches] == (["q"] if found else []), n
        if found:
            assert document[matches[0].start:matches[0].end] == chars[5:5 + n]
    whole = ZH_FILLER_A + sixteen + "十" + ZH_FILLER_B
    assert sorted(m.item_id for m in index.find(whole)) == ["t", "u"]
    assert index.find(ZH_FILLER_A + sixteen[:14] + ZH_FILLER_B) == []
    look = ItemNgrams([ZH_ITEM, short, sixteen], ngram=13, min_item_words=8)
    for text in (exercise, ZH_FILLER_A + chars[:21] + ZH_FILLER_B, ZH_FILLER_A + ZH_ITEM + ZH_FILLER_B,
                 ZH_FILLER_A + "，" + sixteen + "。" + ZH_FILLER_B):
        assert look.overlaps(text) <= bool(index.find(text)), text  # a hit of the look is a hit of the detector
    assert look.overlaps(ZH_FILLER_A + "。" + ZH_ITEM + "。" + ZH_FILLER_B)
    assert not look.overlaps(exercise)


# Thai news prose, written for these tests: 48 words (hand-segmented), 185 letters with their marks (text_units).
TH_NEWS = ("กรุงเทพมหานครประกาศแผนพัฒนาระบบขนส่งสาธารณะฉบับใหม่เมื่อวานนี้ โดยมีเป้าหมายเพื่อลดปัญหาการจราจรติดขัดในเขตเมือง "
           "ผู้ว่าราชการกล่าวว่าโครงการนี้จะช่วยให้ประชาชนเดินทางได้สะดวกและรวดเร็วมากขึ้น และยังช่วยลดมลพิษทางอากาศอีกด้วย")


def test_a_thai_letter_weighs_a_quarter_of_a_word_in_decontamination():
    """A Thai unit is a letter, not a Han character: 2 eighths. By hand: "ข้อใดต่อไปนี้ถูกต้องที่สุด" ("which of the
    following is most correct", 5 words) is 17 units, 34 eighths < 64: skipped, as a 5-word English item is (at 5
    eighths a unit, 85, it was indexed whole and matched every Thai quiz sheet asking it). The first sentence of
    TH_NEWS (94 units, 188 eighths) is indexed: a document holding 52 of its units in a row (104 eighths, 13 words)
    matches, 51 do not."""
    quiz = "ข้อใดต่อไปนี้ถูกต้องที่สุด"
    first = TH_NEWS.split(" ")[0] + " " + TH_NEWS.split(" ")[1]
    index = index_of(("b", "quiz", quiz), ("b", "news", first))
    stats = index.summary()["benchmarks"]["b"]
    assert (stats["items_indexed"], stats["items_skipped_short"]) == (1, 1)
    assert index.find("แบบทดสอบบทที่สาม\n" + quiz + "\nก. แผนนี้เริ่มในปีหน้า\nข. แผนนี้เสร็จในสามปี") == []
    units = normalized_words(first)
    assert len(units) == 94
    for n, found in ((52, True), (51, False)):
        copy = "".join(units[10:10 + n])
        document = "ข่าวเช้าวันนี้ " + copy + " จบข่าว"
        assert [m.item_id for m in index.find(document)] == (["news"] if found else []), n
    from kiln.dedup.residual_overlap import ItemNgrams
    look = ItemNgrams([quiz, first], ngram=13, min_item_words=8)  # the independent look weighs them the same
    assert not look.overlaps("แบบทดสอบ " + quiz + " ก. แผนนี้เริ่มในปีหน้า")
    assert look.overlaps("ข่าวเช้าวันนี้ " + first + " จบข่าว")


# An item written in the same news phrasing as TH_NEWS's first sentence ("the Metropolitan Waterworks Authority
# announced a plan to improve the water supply in the city area, aiming to reduce leaks and murky water"): no copy.
TH_WATER = "การประปานครหลวงประกาศแผนปรับปรุงระบบน้ำประปาในเขตเมือง โดยมีเป้าหมายเพื่อลดปัญหาน้ำรั่วและน้ำขุ่น"


def test_short_ngrams_of_the_edited_copy_rules_weigh_words_in_every_script():
    """The short n-grams are 4 words' weight (32 eighths): 16 Thai letters, 7 Han characters. By hand: TH_WATER is 81
    letters, 66 short n-grams (81 - 16 + 1), not 76 distinct 4-letter ones (about a word each); the longest run it shares
    with TH_NEWS, "โดยมีเป้าหมายเพื่อลดปัญหา" (25 letters), holds 10 of them: 15%, under min_share 0.4 (4-letter
    n-grams: 42%, and the news was dropped as an edited copy), and 10 x 2/8 = 2.5 n-grams' worth, under
    min_shared_ngrams 20. Its copy with one word replaced ("น้ำขุ่น" murky water -> "น้ำเสีย" foul water) is found.
    A 30-character Chinese item has 24 short n-grams, 15 words' worth (24 x 5/8): as an English item of 18 words,
    under min_shared_ngrams, where its 27 4-character n-grams were over. English: 4-word n-grams, as before."""
    index = fuzzy_index(("b", "water", TH_WATER))
    assert len(normalized_words(TH_WATER)) == 81 and index.fuzzy_counts[("b", "water")] == 66
    assert index.find(TH_NEWS) == []
    copy = TH_WATER.replace("น้ำขุ่น", "น้ำเสีย")
    assert [m.item_id for m in index.find("ข่าวเช้าวันนี้ " + copy + " ติดตามข่าวต่อไป")] == ["water"]
    zh = "中华人民共和国成立于一九四九年十月一日首都设在北京市人口众多历史悠久"
    zh30 = zh[:30]  # no character twice in a 7-character run: 24 distinct n-grams
    assert len(normalized_words(zh30)) == 30
    index = fuzzy_index(("b", "zh", zh30))
    hashes = set(index.fuzzy_owners)
    assert index.fuzzy_counts[("b", "zh")] == 24 and index.shared_ngrams(hashes) == 15.0
    english = fuzzy_index(("b", "en", CLEAN_PROSE))
    n_words = len(normalized_words(CLEAN_PROSE))
    assert english.fuzzy_counts[("b", "en")] == len(set(zip(*(normalized_words(CLEAN_PROSE)[i:] for i in range(4)))))
    assert english.shared_ngrams(set(english.fuzzy_owners)) == english.fuzzy_counts[("b", "en")] <= n_words - 3


@pytest.mark.parametrize("workers", [1, 2])
def test_the_no_benchmark_overlap_look_runs_a_task_per_part_and_lists_in_part_order(tmp_path, workers):
    """The check's second look reads each part of the output as an engine task (it read a whole source in the step's
    one process). Planted by hand: the item's 13 words in documents p0-1 and p2-0, 12 of them (too few) in p1-0."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kiln.curation.documents import DOCUMENT_SCHEMA, Document
    from kiln.dedup.residual_overlap import overlapping_documents
    from kiln.engine import SERIAL, ProcessPool

    write_jsonl(tmp_path / "bench.jsonl", [{"id": 1, "text": ITEM}])
    decon = Decontamination(benchmarks=[Benchmark(name="bench", path=str(tmp_path / "bench.jsonl"))])
    parts = [[CLEAN_PROSE, planted(13)], [planted(12), CLEAN_PROSE[:300]], [planted(13, start=5)] + [CLEAN_PROSE] * 30]
    paths = []
    for k, texts in enumerate(parts):
        paths.append(tmp_path / f"documents-{k:05d}.parquet")
        rows = [Document(f"p{k}-{i}", "web", t).to_row() for i, t in enumerate(texts)]
        pq.write_table(pa.Table.from_pylist(rows, schema=DOCUMENT_SCHEMA), paths[-1])
    engine = ProcessPool(workers=2) if workers == 2 else SERIAL
    assert overlapping_documents(paths, decon, engine, progress=False) == ["p0-1", "p2-0"]
