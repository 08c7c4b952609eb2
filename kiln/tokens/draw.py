"""Which documents each phase of the mixture draws, decided from per-part summaries (no sort of a whole source).

The mixture (kiln.tokens.mixture) orders a source's training documents by `order_key` (a hash of the seed and the
doc_id; ties by the document's place in the run) and draws each phase from that order, cycling: a phase takes the
documents it may draw (those of at least its `min_document_tokens`) least drawn first, each level starting where the
last phase stopped, and `select_documents` picks whole passes plus the prefix of the next whose tokens come closest
to the target. Following that order by sorting every document of a source needs the whole source in one process.

Here a phase's draw is a `Cut`: a few integers that a process holding any part of the source applies to its own
documents to know how many copies of each the phase takes (`copies`). Every document has a *rank* in a phase's
order, (times drawn before, wrapped, order_key, place): `wrapped` is 0 for documents after the last one an earlier
phase drew, 1 for the others, so the order restarts where the last phase stopped. A phase draws `passes` copies of
each eligible document, plus one of those ranked up to `last`. The driver finds the cut from two summaries per
part: `summarize`, the tokens and documents in each cell of the rank space (keyed by times drawn, wrapped and the
top 16 bits of order_key), which it adds up a part at a time (`Totals`: 2^16 cells of 16 B per level, whatever the
size of the source); then `cell_documents`, the documents of the at most three cells the cut needs (about 3 / 2^16
of the source). It is the same draw, document for document, as sorting the source (tests/kiln/tokens/test_draw.py
keeps that sort as the second implementation).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from kiln.tokens.mixture import MixtureError

KEY_BITS = 16  # order_key's top bits in a cell's code: 65,536 cells per (times drawn, wrapped)

Rank = tuple[int, int, int, int]  # (times drawn before the phase, wrapped, order_key, place)


@dataclass(frozen=True)
class Documents:
    """A source's training documents held by one process (a part, or any slice): one entry each."""

    key: np.ndarray  # uint64: order_key
    place: np.ndarray  # int64: unique within the run, in the order the parts were listed (breaks key ties)
    length: np.ndarray  # int64: tokens, EOS included


@dataclass(frozen=True)
class Cut:
    """One phase's draw from one source, as a rule over ranks (module docstring)."""

    floor: int  # eligible documents have at least this many tokens
    resume: tuple[int, int] | None  # (order_key, place) of the last document drawn before the phase: None, none
    passes: int = 0  # copies of every eligible document
    last: Rank | None = None  # and one more of each eligible document ranked up to this one


@dataclass(frozen=True)
class Summary:
    """One process's documents by cell of a phase's rank space: cell code, tokens, documents (codes ascending)."""

    codes: np.ndarray  # uint64
    tokens: np.ndarray  # int64
    documents: np.ndarray  # int64


@dataclass(frozen=True)
class Cells:
    """The eligible documents of some cells, with their ranks."""

    used: np.ndarray
    wrapped: np.ndarray
    key: np.ndarray
    place: np.ndarray
    length: np.ndarray


@dataclass(frozen=True)
class Drawn:
    """A phase's draw from one source: its cut, what it took, and where the next phase resumes."""

    cut: Cut
    tokens: int
    documents: int
    resume: tuple[int, int] | None


def _wrapped(docs: Documents, resume: tuple[int, int] | None) -> np.ndarray:
    if resume is None:
        return np.zeros(len(docs.key), np.int64)
    key, place = np.uint64(resume[0]), resume[1]
    after = (docs.key > key) | ((docs.key == key) & (docs.place > place))
    return (~after).astype(np.int64)


def _copies(docs: Documents, used: np.ndarray, cut: Cut) -> np.ndarray:
    eligible = docs.length >= cut.floor
    copies = np.where(eligible, cut.passes, 0).astype(np.int64)
    if cut.last is not None:
        u, w, k, p = cut.last
        wrapped, k = _wrapped(docs, cut.resume), np.uint64(k)
        up_to = (used < u) | ((used == u) & ((wrapped < w) | ((wrapped == w) & (
            (docs.key < k) | ((docs.key == k) & (docs.place <= p))))))
        copies += eligible & up_to
    return copies


def copies(docs: Documents, cuts: Sequence[Cut]) -> np.ndarray:
    """How many copies of each document the phases of `cuts` (in order) take: int64, (phases, documents)."""
    used = np.zeros(len(docs.key), np.int64)
    out = np.zeros((len(cuts), len(docs.key)), np.int64)
    for i, cut in enumerate(cuts):
        out[i] = _copies(docs, used, cut)
        used += out[i]
    return out


def _codes(used: np.ndarray, wrapped: np.ndarray, key: np.ndarray) -> np.ndarray:
    return ((used.astype(np.uint64) << np.uint64(KEY_BITS + 1)) | (wrapped.astype(np.uint64) << np.uint64(KEY_BITS))
            | (key >> np.uint64(64 - KEY_BITS)))


def _ranked(docs: Documents, cuts: Sequence[Cut], floor: int, resume: tuple[int, int] | None):
    eligible = docs.length >= floor
    used = copies(docs, cuts).sum(axis=0)[eligible]  # times drawn before the phase
    wrapped = _wrapped(docs, resume)[eligible]
    key = docs.key[eligible]
    return used, wrapped, key, docs.place[eligible], docs.length[eligible], _codes(used, wrapped, key)


def summarize(docs: Documents, cuts: Sequence[Cut], floor: int, resume: tuple[int, int] | None) -> Summary:
    """The first summary for the phase after `cuts` (phases drawn so far, in order), drawing documents of at least
    `floor` tokens from after `resume`."""
    *_, length, codes = _ranked(docs, cuts, floor, resume)
    cells, inverse = np.unique(codes, return_inverse=True)
    return Summary(cells, np.bincount(inverse, weights=length, minlength=len(cells)).astype(np.int64),
                   np.bincount(inverse, minlength=len(cells)).astype(np.int64))


def cell_documents(docs: Documents, cuts: Sequence[Cut], floor: int, resume: tuple[int, int] | None,
                   cells: np.ndarray) -> Cells:
    """The second summary: the eligible documents of the cells `cells` (codes), with their ranks."""
    used, wrapped, key, place, length, codes = _ranked(docs, cuts, floor, resume)
    keep = np.isin(codes, cells)
    return Cells(used[keep], wrapped[keep], key[keep], place[keep], length[keep])


class Totals:
    """Summaries of disjoint documents added up one at a time into dense arrays per (times drawn, wrapped): what it
    holds is bounded by the rank space (2^16 cells of 16 B per level), not by the number of parts added."""

    def __init__(self):
        self.tokens: dict[int, np.ndarray] = {}
        self.documents: dict[int, np.ndarray] = {}

    def add(self, summary: Summary) -> None:
        level = (summary.codes >> np.uint64(KEY_BITS)).astype(np.int64)
        cell = (summary.codes & np.uint64((1 << KEY_BITS) - 1)).astype(np.int64)
        for lv in np.unique(level).tolist():
            if lv not in self.tokens:
                self.tokens[lv] = np.zeros(1 << KEY_BITS, np.int64)
                self.documents[lv] = np.zeros(1 << KEY_BITS, np.int64)
            mine = level == lv
            np.add.at(self.tokens[lv], cell[mine], summary.tokens[mine])
            np.add.at(self.documents[lv], cell[mine], summary.documents[mine])

    def summary(self) -> Summary:
        """The total, its nonempty cells in code order."""
        codes, tokens, documents = [np.zeros(0, np.uint64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
        for lv in sorted(self.tokens):
            held = np.flatnonzero(self.documents[lv])
            codes.append((np.uint64(lv) << np.uint64(KEY_BITS)) | held.astype(np.uint64))
            tokens.append(self.tokens[lv][held])
            documents.append(self.documents[lv][held])
        return Summary(np.concatenate(codes), np.concatenate(tokens), np.concatenate(documents))


def _in_rank_order(found: Sequence[Cells]) -> Cells:
    cat = [np.concatenate([getattr(c, f) for c in found]) for f in ("used", "wrapped", "key", "place", "length")]
    order = np.lexsort((cat[3], cat[2], cat[1], cat[0]))
    return Cells(*(a[order] for a in cat))


def _rank(cells: Cells, i: int) -> Rank:
    return int(cells.used[i]), int(cells.wrapped[i]), int(cells.key[i]), int(cells.place[i])


def needed_cells(target: int, summary: Summary) -> np.ndarray:
    """The cells (codes) whose documents `draw` needs from every part (`cell_documents`) for a phase taking `target`
    tokens: the cell where the partial pass's tokens reach the target, the cell before it (the last document drawn
    may be there) and the last cell (the last document of a whole pass). None when it needs no documents."""
    total = int(summary.tokens.sum())
    if target <= 0 or total == 0:
        return np.zeros(0, np.uint64)
    rest = target % total
    cum = np.cumsum(summary.tokens)
    at = int(np.searchsorted(cum, rest, side="left")) if rest else len(cum) - 1
    return np.unique(summary.codes[[max(at - 1, 0), at, len(cum) - 1]])


def draw(target: int, floor: int, resume: tuple[int, int] | None, summary: Summary, found: Sequence[Cells]) -> Drawn:
    """The cut of a phase taking `target` tokens from documents of at least `floor` tokens, given the merged first
    summary of the source's documents and every part's `cell_documents` of the `needed_cells`. Whole passes over the
    eligible documents, then the prefix of the next whose tokens come closest to the target (within half a document,
    as `kiln.tokens.mixture.select_documents`)."""
    nothing = Drawn(Cut(floor, resume), 0, 0, resume)
    n, total = int(summary.documents.sum()), int(summary.tokens.sum())
    if target <= 0:
        return nothing
    if n == 0:
        raise MixtureError(f"asked for {target} tokens from a source with no documents")
    if total == 0:
        raise MixtureError(f"asked for {target} tokens from a source whose documents are all empty")
    passes, rest = divmod(target, total)
    cum = np.cumsum(summary.tokens)
    at = int(np.searchsorted(cum, rest, side="left")) if rest else len(cum) - 1
    cells = _in_rank_order(found)
    # Codes rise with rank: the crossing cell's first document in `cells`.
    first = int(np.searchsorted(_codes(cells.used, cells.wrapped, cells.key), summary.codes[at], side="left"))
    m = 0  # eligible documents the partial pass takes
    if rest:
        before = int(cum[at - 1]) if at else 0  # tokens of the cells before the crossing one
        running = before + np.cumsum(cells.length[first:])
        e = first + int(np.searchsorted(running, rest, side="left"))  # the document that crosses `rest`
        lower = int(running[e - first]) - int(cells.length[e])
        upper = lower + int(cells.length[e])
        taken = abs(upper - rest) < abs(lower - rest)  # a tie leaves it out, as select_documents does
        m = int(summary.documents[:at].sum()) + (e - first) + taken
        last = e if taken else e - 1
        tokens = passes * total + (upper if taken else lower)
    else:
        tokens = passes * total
    if m:
        end = _rank(cells, last)
    elif passes:
        end = _rank(cells, len(cells.key) - 1)  # the last document of the last whole pass
    else:
        return nothing
    return Drawn(Cut(floor, resume, passes, end if m else None), tokens, passes * n + m, (end[2], end[3]))


__all__ = ["Cells", "Cut", "Documents", "Drawn", "KEY_BITS", "Summary", "Totals", "cell_documents", "copies", "draw",
           "needed_cells", "summarize"]
