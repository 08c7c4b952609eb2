"""The garbage step's web-page rules (repeated lines, stubs) and the `web` profile that turns them on: each rule on a
hand-built page both ways (caught, and a near-miss clean page kept), with the measures worked out by hand."""

from __future__ import annotations

import pytest

from kiln.common.config import load_config
from kiln.common.stats import StageStats
from kiln.curation.documents import Document
from kiln.curation.filters import garbage as g
from kiln.curation.filters.garbage import Garbage
from kiln.curation.filters.registry import build_step
from kiln.curation.pipeline import profile_steps, run_steps

CONFIG = load_config("configs/default.yaml")
WEB = Garbage(max_repeated_line_fraction=0.7, min_content_words=30)

# A newsletter box repeated 12 times, its counter changing: every line after the first three repeats one.
REPEATED = "\n".join(f"Page {i} of 12: Subscribe to our newsletter\nGet the latest garden news in your inbox.\n"
                     "Sign up now" for i in range(1, 13))
# An API page: a few short lines repeat ("Parameters", "Returns"), the text around them does not.
API_PAGE = """\
open(path, mode)
Open the file at path and return a file object for reading or writing its bytes.
Parameters
path: the file to open, absolute or relative to the current working directory of the process.
Returns
A file object whose read and write methods move a position kept by the operating system.
close(file)
Close the file, flushing whatever the buffers hold to the device it was opened on.
Parameters
file: a file object that open returned and that has not been closed before this call.
Returns
Nothing; closing a file twice raises an error that names the file and the call that failed."""
NOT_FOUND = ("Page not found\nSorry, the page you are looking for does not exist.\nGo to homepage")
ENABLE_JS = "Example Site\nPlease enable JavaScript to view this site.\nThis site uses cookies."
# A short reference page: sentences of 7, 8 and 20 words under a one-word title (code characters make it content).
SHORT_PAGE = ("str.casefold()\nReturn a casefolded copy of the string. Casefolded strings may be used for caseless "
              "matching. Casefolding is similar to lowercasing but more aggressive, because it is intended to remove "
              "all case distinctions in a string.")


def verdict(step: Garbage, text: str) -> str | None:
    return step(Document(doc_id="d", source="s", text=text)).drop


def test_repeated_line_fraction_by_hand():
    # keys: [reply, 0] twice (counter), [great, post] twice: 6 + 6 + 9 + 9 characters, the second of each repeats
    assert g.repeated_line_fraction("Reply 1\nReply 2\n\nGreat post\nGreat post") == pytest.approx(15 / 30)
    assert g.line_key("Posted on March 3, 2021 at 10:30 by user123") == ["posted", "on", "0", "at", "0", "by", "0"]
    # one token apart, in the same place, on lines of 3+ tokens: a template's slot (16 + 14 characters, 14 repeat)
    assert g.repeated_line_fraction("Filed under School\nFiled under Diet") == pytest.approx(14 / 30)
    # two-token lines must match exactly
    assert g.repeated_line_fraction("Filed School\nFiled Diet") == 0
    # a different token in a different place is not a slot
    assert g.repeated_line_fraction("Filed under School\nSaved under Diet") == 0


def test_repeated_lines_rule_both_ways():
    # 36 lines, the first three new: 33 of 36 lines (and more than 0.9 of the characters) repeat
    assert g.repeated_line_fraction(REPEATED) > 0.9
    assert verdict(WEB, REPEATED) == "garbage.repeated_lines"
    # only "Parameters" and "Returns" repeat: 17 of 460-odd characters
    assert g.repeated_line_fraction(API_PAGE) < 0.05
    assert verdict(WEB, API_PAGE) is None


def test_stub_rule_both_ways():
    # "Page not found" and "Go to homepage" are short title-like lines (boilerplate); the sentence has 10 words
    assert g.content_words(NOT_FOUND) == 10
    assert verdict(WEB, NOT_FOUND) == "garbage.stub"
    # C4's notice lines (JavaScript, cookies) do not count: only the site name's line is left, and it is boilerplate
    assert g.content_words(ENABLE_JS) == 0
    assert verdict(WEB, ENABLE_JS) == "garbage.stub"
    # 35 words of sentences and the title's one: kept at 30, and at 36, not at 37
    assert g.content_words(SHORT_PAGE) == 36
    assert verdict(WEB, SHORT_PAGE) is None
    assert verdict(Garbage(min_content_words=36), SHORT_PAGE) is None
    assert verdict(Garbage(min_content_words=37), SHORT_PAGE) == "garbage.stub"


def test_web_rules_are_off_by_default():
    """Other profiles (and the demo's decisions) are unchanged: the rules run only where a profile sets them."""
    assert Garbage().max_repeated_line_fraction is None and Garbage().min_content_words is None
    for text in (REPEATED, NOT_FOUND, ENABLE_JS):
        assert verdict(Garbage(), text) is None


def test_web_profile_loads_with_its_steps():
    steps = [s.step for s in CONFIG.profiles["web"]]
    assert steps == ["url_blocklist", "garbage", "language", "gopher_quality", "badwords"]
    garbage = next(s for s in CONFIG.profiles["web"] if s.step == "garbage")
    assert garbage.params == {"max_repeated_line_fraction": 0.7, "min_content_words": 30}
    gopher = next(s for s in CONFIG.profiles["web"] if s.step == "gopher_quality")
    assert gopher.params["min_doc_words"] == 20 and gopher.params["max_non_alpha_words_ratio"] is None


def test_web_profile_drops_stubs_and_repeats_and_keeps_a_reference_page():
    config = CONFIG.model_copy(update={"sources": [s.model_copy(update={"profile": "web"})
                                                   for s in CONFIG.sources[:1]]})
    steps = [build_step(s.step, s.params) for s in profile_steps(config, config.sources[0].name)]
    docs = [Document(doc_id=str(i), source="s", text=t) for i, t in enumerate((REPEATED, NOT_FOUND, API_PAGE))]
    assert run_steps(docs, steps, StageStats(), 0) == ["garbage.repeated_lines", "garbage.stub", None]
