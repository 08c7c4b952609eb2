"""The mixture's draw decided from per-part summaries (kiln.tokens.draw) against the second implementation: sorting
the whole source, as `write_token_shards` did until stop 87 (kept here as `sorted_draw`)."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kiln.tokens.draw import Documents, Totals, cell_documents, copies, draw, needed_cells, summarize
from kiln.tokens.mixture import MixtureError, select_documents


def sorted_draw(key, place, length, phases):
    """Each phase's (copies per document, tokens, documents): the source sorted by (order_key, place); a phase takes
    its eligible documents least drawn first, each level from where the last phase stopped, through
    select_documents."""
    order = np.lexsort((place, key))
    used = np.zeros(len(order), np.int64)
    resume_at, out = 0, []
    for target, floor in phases:
        eligible = np.flatnonzero(length[order] >= floor) if floor else np.arange(len(order))
        sequence = eligible[np.lexsort(((eligible - resume_at) % max(len(order), 1), used[eligible]))]
        chosen, _ = select_documents(length[order[sequence]], target)
        drawn = sequence[chosen]
        np.add.at(used, drawn, 1)
        if len(drawn):
            resume_at = (int(drawn[-1]) + 1) % len(order)
        per_doc = np.zeros(len(order), np.int64)
        np.add.at(per_doc, order[drawn], 1)
        out.append((per_doc, int(length[order[drawn]].sum()), len(drawn)))
    return out


def summary_draw(key, place, length, phases, bounds):
    """The same phases, each process holding the documents between two of `bounds` (the parts)."""
    parts = [Documents(key[a:b], place[a:b], length[a:b]) for a, b in zip(bounds[:-1], bounds[1:])]
    cuts, resume, out = [], None, []
    for target, floor in phases:
        totals = Totals()  # as the shard writer adds them up, a part at a time
        for p in parts:
            totals.add(summarize(p, cuts, floor, resume))
        summary = totals.summary()
        cells = needed_cells(target, summary)
        assert len(cells) <= 3
        drawn = draw(target, floor, resume, summary, [cell_documents(p, cuts, floor, resume, cells) for p in parts])
        cuts.append(drawn.cut)
        resume = drawn.resume
        per_doc = np.concatenate([copies(p, cuts)[-1] for p in parts]) if parts else np.zeros(0, np.int64)
        out.append((per_doc, drawn.tokens, drawn.documents))
    return out


def test_a_hand_worked_draw():
    # Five documents in order_key order a..e with 3, 1, 4, 1, 5 tokens (14 in all), two parts.
    key = np.array([10, 20, 30, 40, 50], np.uint64) << np.uint64(40)
    place = np.arange(5, dtype=np.int64)
    length = np.array([3, 1, 4, 1, 5], np.int64)
    # Phase 1 wants 20 tokens: one pass (14), then 6 more: a+b = 4 (2 off) or a+b+c = 8 (2 off), a tie, left out:
    # a, b twice, c, d, e once (18 tokens, 7 documents), stopping after b.
    # Phase 2 wants 10 of the documents of at least 3 tokens (a, c, e), least drawn first and from after b: c, e (drawn
    # once), then a (twice). c+e = 9 (1 off) beats c+e+a = 12 (2 off): c and e, stopping after e.
    # Phase 3 wants 3 of any: d was drawn once, the others twice, then from after e: d, a, b, c, e with 1, 3, 1, 4,
    # 5 tokens. d+a = 4 (1 off) beats d = 1 (2 off): d and a.
    phases = [(20, 0), (10, 3), (3, 0)]
    expected = [([2, 2, 1, 1, 1], 18, 7), ([0, 0, 1, 0, 1], 9, 2), ([1, 0, 0, 1, 0], 4, 2)]
    for got, want in zip(summary_draw(key, place, length, phases, [0, 2, 5]), expected):
        assert got[0].tolist() == want[0] and got[1:] == want[1:]
    for got, want in zip(sorted_draw(key, place, length, phases), expected):
        assert got[0].tolist() == want[0] and got[1:] == want[1:]


@settings(max_examples=200, deadline=None)
@given(data=st.data())
def test_the_summaries_draw_exactly_what_sorting_the_source_draws(data):
    n = data.draw(st.integers(0, 60), label="documents")
    # Few key values and high bits only, some shared: documents in one cell and ties broken by place.
    spread = data.draw(st.sampled_from([4, 1 << 20, 1 << 63]), label="key spread")
    key = np.array(data.draw(st.lists(st.integers(0, 7), min_size=n, max_size=n)), np.uint64) * np.uint64(spread // 4)
    key = key | np.array(data.draw(st.lists(st.integers(0, 3), min_size=n, max_size=n)), np.uint64)
    length = np.array(data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n)), np.int64)
    place = np.arange(n, dtype=np.int64)
    phases = data.draw(st.lists(st.tuples(st.integers(0, 200), st.sampled_from([0, 0, 3, 6])), min_size=1,
                                max_size=4), label="phases (target, floor)")
    cuts = sorted(data.draw(st.lists(st.integers(0, n), max_size=4), label="part bounds"))
    bounds = [0, *cuts, n]
    try:
        want = sorted_draw(key, place, length, phases)
    except MixtureError as exc:
        with pytest.raises(MixtureError, match=str(exc)):
            summary_draw(key, place, length, phases, bounds)
        return
    got = summary_draw(key, place, length, phases, bounds)
    for (copies_got, tokens_got, docs_got), (copies_want, tokens_want, docs_want) in zip(got, want):
        assert copies_got.tolist() == copies_want.tolist()
        assert (tokens_got, docs_got) == (tokens_want, docs_want)


def test_a_large_source_is_drawn_from_three_cells_of_documents_at_most():
    rng = np.random.default_rng(5)
    n = 200_000
    key = rng.integers(0, 2 ** 63, n, dtype=np.uint64) * np.uint64(2)
    length = rng.integers(1, 300, n).astype(np.int64)
    place = np.arange(n, dtype=np.int64)
    docs = Documents(key, place, length)
    total = int(length.sum())
    summary = summarize(docs, [], 0, None)
    found = cell_documents(docs, [], 0, None, needed_cells(total * 2 + total // 3, summary))
    assert len(found.key) < 3 * n / 2 ** 16 * 4  # three cells of ~3 documents each, not the source
    drawn = draw(total * 2 + total // 3, 0, None, summary, [found])
    assert drawn.cut.passes == 2
    want = sorted_draw(key, place, length, [(total * 2 + total // 3, 0)])[0]
    assert copies(docs, [drawn.cut])[0].tolist() == want[0].tolist() and drawn.tokens == want[1]
