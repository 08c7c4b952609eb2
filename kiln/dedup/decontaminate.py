"""Benchmark decontamination: remove (or cut out) training text that shares an n-gram with an eval item.

A model that trained on a benchmark's items scores well on it without being good at the task, so every
document is checked against the declared evaluation sets (`decontamination.benchmarks`) before it can
reach the token shards. Following GPT-3 and most successors, a document is contaminated when it shares
one n-gram (13 normalized words by default) with any item; items shorter than that but with at least
`min_item_words` words contribute one n-gram made of all their words.

Copies get edited on their way around the web: a word changed every dozen words leaves no 13-gram whole. Two
rules find them, both from the item's distinct short n-grams (`fuzzy_ngram` words, 4 by default; a 4-gram of
more than 10 items, "which of the following", is a common phrase and is left out):

- aligned: the whole item appears in one place of the document with at most `max_edit_share` (0.2) of its
  words edited: a replaced or deleted item word is one edit, a run of m inserted words (m+1)/2; the fewest
  edits over every span of the document, by dynamic programming. A 19-word item allows 3 edits. A copy that
  is the item word for word with one sentence inserted between two of its words (a leaked item annotated) is
  one edit, whatever the sentence's length; a sentence runs from a word that starts with a capital letter to
  the first word followed by . ! or ? (read from the raw text). Sibling pages put text where a copy would,
  but change words around it or insert text that is no sentence: pthread_rwlockattr_setkind_np(3) holds its
  siblings' "... return 0; on error, they return a nonzero error number." with a sentence after "return 0"
  and "they return" changed; systemd-path(1) holds systemd-cat(1)'s "... are understood: -h, --help Print a
  short help text and exit." with an option, "--suffix= Printed paths ...", inserted. Their inserted text is
  a plain run, 4 and 5 edits on its own, past the 3 those items allow (bench/decon_eval.py, --seed 1 and the
  default). Only items whose short n-grams the document holds are aligned, and only near them: a copy within
  E edits keeps at least (the item's n-grams - n * E) of them whole, so that many found is a filter that
  loses no copy.
- share: the document holds at least `min_share` (0.4) of the item's short n-grams and at least
  `min_shared_ngrams` (20) of them: long items cut up or reordered. The count keeps it off short items,
  where a few common phrases ("can be added to the", "at the head of the list") make a large share: the
  STAILQ(3) manual page holds 7 of the 16 4-grams of a 19-word sentence of slist(3), and none of its copies.

Words are normalized first (case, punctuation, digits; items and documents both composed to NFC), so those edits
never count. In scripts written without spaces (Chinese, Japanese, Thai ...) a word is a character, and for the exact
rule and `min_item_words` it weighs 5/8 of a word, a letter of Thai, Khmer, Myanmar ... 1/4 (text_units.word_weights,
as dedup's shingles): an n-gram of 13 words is 13 spaced words or the shortest run of words from a start that weighs
as much (21 Chinese characters, 52 Thai letters), and an item needs 8 words' weight (13 characters, 32 Thai letters)
to be indexed. Counted a word each, a 9-character item ("下列说法中正确的是",
"which of the following is correct") was indexed whole and matched every exercise sheet that asks it. The short
n-grams of the edited-copy rules weigh `fuzzy_ngram` words the same way (4 words: 7 Chinese characters, 16 Thai
letters), and `min_shared_ngrams` counts them in words' worth (BenchmarkIndex.shared_ngrams); the aligned rule's
edits stay counted in those words and characters, a share of the item's. Counted a character each, 4-letter Thai
n-grams (about one word) made a news report share 42% of the n-grams of an unrelated item written in the same news
phrasing ("... announced a plan ... aiming to reduce the problem of ..."), and it was dropped as an edited copy.
bench/decon_eval.py measures both sides: sibling manual pages and API docs, and edited copies.

Speed matters (the check runs over every document), so words are hashed once each with a stable 64-bit
hash (blake2b, not Python's salted `hash`, so results do not change between processes) and n-gram hashes
are computed for all positions at once with numpy. Character spans (and sentences) are only computed for
documents that hit or get as far as the alignment, which are rare.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import unicodedata
import zlib
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kiln.common.config import Decontamination, ShingleNormalization
from kiln.common.text_units import WORD_PATTERN, WORD_WEIGHT, Splitter, plain, word_weights
from kiln.dedup.text import normalized_words, words

DROP_REASON = "decontamination.benchmark_overlap"
TOO_SHORT_REASON = "decontamination.too_short_after_redact"
DEMO_BENCHMARK = Path(__file__).resolve().parent / "data" / "benchmarks" / "demo_eval.jsonl"

# One row per (benchmark item, document) found together; `action` is "dropped" or "redacted".
CONTAMINATION_SCHEMA = pa.schema([
    pa.field("benchmark", pa.string(), nullable=False),
    pa.field("item_id", pa.string(), nullable=False),
    pa.field("doc_id", pa.string(), nullable=False),
    pa.field("source", pa.string(), nullable=False),
    pa.field("action", pa.string(), nullable=False),
    pa.field("share", pa.float64()),  # of the item's short n-grams found in the document
])

NORMALIZATION = ShingleNormalization()  # decontamination always uses the defaults: case, punctuation, digits
COMMON_OWNERS = 10  # a short n-gram of more items than this is a common phrase, not evidence for one item
INSERTED_RUN_WORD = 0.5  # aligned rule: each inserted word after the first of a run; m words inserted cost (m+1)/2
# The words of kiln.dedup.text (text_units.WORDS), one match each: its first character, and the . ! ? (or 。！？)
# that ends it if any
_FIRST_CHAR = Splitter(r"(\w)\w*", rf"(?=(.))(?:{WORD_PATTERN})")
_SENTENCE_END = Splitter(r"\w+(?:[^\w.!?]*([.!?]))?", rf"(?:{WORD_PATTERN})(?:[^\w.!?。！？]*([.!?。！？]))?")

# Polynomial n-gram hash mod 2**64: hash(w_j..w_j+k-1) = sum_t h(w_j+t) * P**t. With prefix sums of
# h(w_i) * P**i, every window of every size costs one subtraction and one multiply by P**-j (P is odd,
# so it is invertible mod 2**64).
_P = np.uint64(0x9E3779B97F4A7C15)
_P_INV = np.uint64(pow(int(_P), -1, 2**64))
_MAX_CACHED_WORDS = 2_000_000


class BenchmarkError(ValueError):
    """A benchmark file that cannot be used; the message names the file, the line and the fix."""


@dataclass(frozen=True)
class Match:
    """One benchmark item found in a text: the character span of a maximal run of overlapping matched
    n-grams of that item (one Match per run, not per n-gram)."""

    benchmark: str
    item_id: str
    start: int
    end: int
    share: float | None = None  # of the item's distinct short n-grams found in the text (None: fuzzy matching off)


@dataclass(frozen=True)
class Outcome:
    kept: bool
    text: str  # the original, or the redacted text when spans were cut
    matches: list[Match]
    reason: str | None = None  # DROP_REASON or TOO_SHORT_REASON when not kept

    @property
    def contaminated(self) -> bool:
        return bool(self.matches)

    @property
    def action(self) -> str | None:
        """What happened to a contaminated document: "dropped", "redacted", or None when clean."""
        if not self.matches:
            return None
        return "redacted" if self.kept else "dropped"


class _WordHashes(dict):
    """Word -> 8-byte blake2b digest, computed on first use (a dict lookup is much cheaper than blake2b)."""

    def __missing__(self, word: str) -> bytes:
        digest = self[word] = blake2b(word.encode("utf-8", "surrogatepass"), digest_size=8).digest()
        return digest


_word_hashes = _WordHashes()
_powers = np.ones(1, dtype=np.uint64)
_inverse_powers = np.ones(1, dtype=np.uint64)


def _power_tables(n: int) -> tuple[np.ndarray, np.ndarray]:
    """P**i and P**-i for i < n (grown on demand and kept: documents reuse them)."""
    global _powers, _inverse_powers
    if len(_powers) < n:
        size = max(n, 2 * len(_powers), 1024)
        _powers = _cumpow(_P, size)
        _inverse_powers = _cumpow(_P_INV, size)
    return _powers[:n], _inverse_powers[:n]


def _cumpow(base: np.uint64, n: int) -> np.ndarray:
    out = np.empty(n, dtype=np.uint64)
    out[0] = 1
    if n > 1:
        out[1:] = np.cumprod(np.full(n - 1, base, dtype=np.uint64))  # wraps mod 2**64, as intended
    return out


def _word_hash_array(ws: list[str]) -> np.ndarray:
    if len(_word_hashes) > _MAX_CACHED_WORDS:
        _word_hashes.clear()  # bounded memory over millions of documents; the common words come back fast
    return np.frombuffer(b"".join(map(_word_hashes.__getitem__, ws)), dtype="<u8").astype(np.uint64, copy=False)


def _window_hashes(prefix: np.ndarray, inverse_powers: np.ndarray, size: int) -> np.ndarray:
    """Hashes of every window of `size` words, from the prefix sums of h(w_i) * P**i."""
    count = len(prefix) - size
    return (prefix[size:] - prefix[:count]) * inverse_powers[:count]


def _prefix(hashes: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    powers, inverse = _power_tables(len(hashes))
    prefix = np.zeros(len(hashes) + 1, dtype=np.uint64)
    np.cumsum(hashes * powers, out=prefix[1:])
    return prefix, inverse


def ngram_hashes(ws: list[str], size: int) -> np.ndarray:
    """Stable 64-bit hashes of every `size`-word window of `ws` (empty when there are fewer words)."""
    if len(ws) < size:
        return np.empty(0, dtype=np.uint64)
    prefix, inverse = _prefix(_word_hash_array(ws))
    return _window_hashes(prefix, inverse, size)


def _cumulative(weights: np.ndarray | None) -> np.ndarray | None:
    """Prefix sums of the words' weights (None: every word weighs WORD_WEIGHT)."""
    if weights is None:
        return None
    cum = np.zeros(len(weights) + 1, dtype=np.int64)
    np.cumsum(weights, out=cum[1:])
    return cum


def _weighted_windows(prefix: np.ndarray, inverse_powers: np.ndarray, cum: np.ndarray | None,
                      target: int) -> tuple[np.ndarray, np.ndarray]:
    """(ends, hashes) of the windows that weigh `target` (text_units weights): from each start that can reach it, the
    shortest run of words that does, start j's window ending at ends[j]. `cum` None: every word weighs WORD_WEIGHT,
    and the windows are the `ceil(target / WORD_WEIGHT)`-word ones."""
    n = len(prefix) - 1
    if cum is None:
        size = -(-target // WORD_WEIGHT)
        if n < size:
            return np.empty(0, dtype=np.int64), np.empty(0, dtype=np.uint64)
        return np.arange(size, n + 1, dtype=np.int64), _window_hashes(prefix, inverse_powers, size)
    ends = np.searchsorted(cum, cum[:-1] + target, side="left")
    ends = ends[ends <= n]  # nondecreasing: the starts that reach it come first
    starts = np.arange(len(ends))
    return ends, (prefix[ends] - prefix[starts]) * inverse_powers[:len(ends)]


def _weights(ws: list[str], text: str) -> np.ndarray | None:
    """The words' (of `text`) text_units weights, None when every word weighs WORD_WEIGHT (no character of a no-space
    script: English and most text answer from one scan of the text)."""
    if plain(text):
        return None
    weights = word_weights(ws)
    return None if (weights == WORD_WEIGHT).all() else weights


@dataclass
class BenchmarkIndex:
    """The n-grams of every indexed eval item, for fast membership tests and for naming what matched."""

    ngram: int
    min_item_words: int
    # weight -> sorted unique hashes of the n-grams of that weight (text_units: WORD_WEIGHT a word; most items give
    # `ngram` words' weight, short items their own)
    keys: dict[int, np.ndarray] = field(default_factory=dict)
    # weight -> n-gram hash -> ((benchmark, item_id), ...)
    owners: dict[int, dict[int, tuple[tuple[str, str], ...]]] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)  # benchmark -> counts (see summary)
    # Edited copies: every item's distinct short n-grams (common ones left out), and how many each item has
    fuzzy_ngram: int | None = None
    min_share: float | None = None
    fuzzy_keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    fuzzy_owners: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    fuzzy_counts: dict[tuple[str, str], int] = field(default_factory=dict)
    min_shared_ngrams: int = 3
    # Where words weigh less than a word (text_units: Chinese, Thai ...): a short n-gram's weight in eighths (by its
    # first word; WORD_WEIGHT when absent), and an item's longest short n-gram in words (`fuzzy_ngram` when absent)
    fuzzy_weights: dict[int, int] = field(default_factory=dict)
    fuzzy_spans: dict[tuple[str, str], int] = field(default_factory=dict)
    # The aligned rule: each item's word hashes, and the edits it allows (floor(max_edit_share * words))
    max_edit_share: float | None = None
    item_words: dict[tuple[str, str], np.ndarray] = field(default_factory=dict)

    @classmethod
    def from_items(cls, items: Iterable[tuple[str, str, str]], ngram: int = 13, min_item_words: int = 8,
                   fuzzy_ngram: int | None = None, min_share: float | None = None, *,
                   max_edit_share: float | None = None, min_shared_ngrams: int = 3) -> BenchmarkIndex:
        """Index (benchmark, item_id, text) triples; their short n-grams too when `min_share` or
        `max_edit_share` is set (see the module docstring for both rules)."""
        owners: dict[int, dict[int, set[tuple[str, str]]]] = defaultdict(lambda: defaultdict(set))
        short: dict[int, set[tuple[str, str]]] = defaultdict(set)
        fuzzy = fuzzy_ngram if (min_share is not None or max_edit_share is not None) else None
        stats: dict[str, dict[str, int]] = {}
        item_words: dict[tuple[str, str], np.ndarray] = {}
        fuzzy_weights: dict[int, int] = {}
        fuzzy_spans: dict[tuple[str, str], int] = {}
        for benchmark, item_id, text in items:
            s = stats.setdefault(benchmark, {"items": 0, "items_indexed": 0, "items_skipped_short": 0, "ngrams": 0})
            s["items"] += 1
            ws = normalized_words(text)
            weights = _weights(ws, text)
            cum = _cumulative(weights)
            total = len(ws) * WORD_WEIGHT if cum is None else int(cum[-1])
            if total < min_item_words * WORD_WEIGHT:
                s["items_skipped_short"] += 1
                continue
            target = min(total, ngram * WORD_WEIGHT)
            prefix, inverse = _prefix(_word_hash_array(ws))
            hashes = np.unique(_weighted_windows(prefix, inverse, cum, target)[1])
            owner = (benchmark, str(item_id))
            table = owners[target]
            for h in hashes.tolist():
                table[h].add(owner)
            if fuzzy:  # `fuzzy` words' weight, as the exact n-grams: 4 words, or 7 Chinese characters, 16 Thai letters
                ends, short_hashes = _weighted_windows(prefix, inverse, cum, fuzzy * WORD_WEIGHT)
                for h in np.unique(short_hashes).tolist():
                    short[h].add(owner)
                if weights is not None and len(ends):
                    for h, w in zip(short_hashes.tolist(), weights[:len(ends)].tolist()):
                        if w != WORD_WEIGHT:
                            fuzzy_weights[h] = w
                    fuzzy_spans[owner] = int((ends - np.arange(len(ends))).max())
            if fuzzy and max_edit_share is not None:
                item_words[owner] = _word_hash_array(ws).copy()
            s["items_indexed"] += 1
            s["ngrams"] += len(hashes)
        frozen = {size: {h: tuple(sorted(o)) for h, o in table.items()} for size, table in sorted(owners.items())}
        keys = {size: np.array(sorted(table), dtype=np.uint64) for size, table in frozen.items()}
        fuzzy_owners = {h: tuple(sorted(o)) for h, o in short.items() if len(o) <= COMMON_OWNERS}
        counts: dict[tuple[str, str], int] = defaultdict(int)
        for item_owners in fuzzy_owners.values():
            for owner in item_owners:
                counts[owner] += 1
        return cls(ngram, min_item_words, keys, frozen, stats, fuzzy, min_share,
                   np.array(sorted(fuzzy_owners), dtype=np.uint64), fuzzy_owners, dict(counts),
                   min_shared_ngrams, {h: w for h, w in fuzzy_weights.items() if h in fuzzy_owners}, fuzzy_spans,
                   max_edit_share if fuzzy else None, item_words)

    @classmethod
    def from_settings(cls, items: Iterable[tuple[str, str, str]], settings: Decontamination) -> BenchmarkIndex:
        """The index the `decontamination` settings describe."""
        return cls.from_items(items, settings.ngram, settings.min_item_words, settings.fuzzy_ngram,
                              settings.min_share, max_edit_share=settings.max_edit_share,
                              min_shared_ngrams=settings.min_shared_ngrams)

    def summary(self) -> dict[str, Any]:
        """Per benchmark: items read, indexed, skipped as too short, n-grams; plus distinct n-grams overall."""
        return {"benchmarks": {name: dict(s) for name, s in self.stats.items()},
                "distinct_ngrams": sum(len(k) for k in self.keys.values()),
                "ngram_sizes": [w // WORD_WEIGHT if w % WORD_WEIGHT == 0 else w / WORD_WEIGHT  # in words
                                for w in sorted(self.keys)],
                "fuzzy": {"ngram": self.fuzzy_ngram, "min_share": self.min_share,
                          "min_shared_ngrams": self.min_shared_ngrams, "max_edit_share": self.max_edit_share,
                          "distinct_ngrams": len(self.fuzzy_keys)} if self.fuzzy_ngram else None}

    def __bool__(self) -> bool:
        return bool(self.keys)

    def shared_ngrams(self, hashes: set[int]) -> float:
        """How many short n-grams `hashes` make, in words' worth: one each, but one that starts with a Chinese
        character 5/8 and a Thai letter 1/4 (text_units; an item of n words has about as many n-grams in every
        script), so `min_shared_ngrams` keeps the share rule off the same short items in every script."""
        if not self.fuzzy_weights:
            return len(hashes)
        weight = self.fuzzy_weights.get
        return sum(weight(h, WORD_WEIGHT) for h in hashes) / WORD_WEIGHT

    def allowed_edits(self, owner: tuple[str, str]) -> int:
        """Edits the aligned rule allows an item: floor(max_edit_share * its words)."""
        return int(self.max_edit_share * len(self.item_words[owner]) + 1e-9)

    def _hits(self, ws: list[str], text: str) -> tuple[list[tuple[int, tuple[tuple[str, str], ...], int]], dict]:
        """(first word, owners, size) of every window of `ws` (the words of `text`) that makes an item match, and
        each matched item's share of short n-grams found (only items with a short n-gram in `ws`)."""
        if not self.keys or not ws:
            return [], {}
        doc = _word_hash_array(ws)
        prefix, inverse = _prefix(doc)
        cum = _cumulative(_weights(ws, text))
        hits = []
        for target, keys in self.keys.items():
            table = self.owners[target]
            ends, windows = _weighted_windows(prefix, inverse, cum, target)
            hits += [(j, table[h], int(ends[j]) - j) for j, h in _found(windows, keys)]
        shares: dict[tuple[str, str], float] = {}
        if self.fuzzy_ngram and len(ws) >= self.fuzzy_ngram and len(self.fuzzy_keys):
            n = self.fuzzy_ngram
            short_ends, short_windows = _weighted_windows(prefix, inverse, cum, n * WORD_WEIGHT)
            found = _found(short_windows, self.fuzzy_keys)
            distinct: dict[tuple[str, str], set[int]] = defaultdict(set)
            where: dict[tuple[str, str], list[int]] = defaultdict(list)
            for j, h in found:
                for owner in self.fuzzy_owners[h]:
                    distinct[owner].add(h)
                    where[owner].append(j)
            shares = {o: len(hs) / self.fuzzy_counts[o] for o, hs in distinct.items()}
            if self.min_share is not None:
                flagged = {o for o, hs in distinct.items()
                           if self.shared_ngrams(hs) >= self.min_shared_ngrams and shares[o] >= self.min_share}
                for j, h in found:
                    if owners := tuple(o for o in self.fuzzy_owners[h] if o in flagged):
                        hits.append((j, owners, int(short_ends[j]) - j))
            if self.max_edit_share is not None:
                sentences = None
                for owner, hs in distinct.items():
                    item, allowed = self.item_words[owner], self.allowed_edits(owner)
                    # span * allowed is the most n-grams `allowed` edits can break (an n-gram spans `span` words at
                    # most): fewer found, no copy here
                    if len(hs) < self.fuzzy_counts[owner] - self.fuzzy_spans.get(owner, n) * allowed:
                        continue
                    if sentences is None:  # only for the rare document that gets this far
                        sentences = _sentences(text, len(ws))
                    if span := _aligned_span(item, doc, where[owner], allowed, sentences):
                        hits.append((span[0], (owner,), span[1] - span[0]))
        return hits, shares

    def contains(self, text: str) -> bool:
        """Whether `text` matches any item (no spans: the fast path for drop-only checks)."""
        return bool(self._hits(_composed(normalized_words(text), text), text)[0])

    def find(self, text: str) -> list[Match]:
        """Every item found in `text`, ordered by position; one Match per run of overlapping n-grams."""
        ws = _composed(normalized_words(text), text)
        hits, shares = self._hits(ws, text)
        if not hits:
            return []
        spanned = words(text, NORMALIZATION, with_spans=True)  # spans only for the rare text that hits
        if (spanned_words := _composed(spanned.words, text)) != ws:  # never seen (a test checks both word views
            hits, shares = self._hits(spanned_words, text)  # agree); stay correct anyway
        runs: dict[tuple[str, str], list[tuple[int, int]]] = defaultdict(list)
        for first, owners, size in hits:
            for owner in owners:
                runs[owner].append((first, first + size))
        matches = []
        for (benchmark, item_id), ranges in runs.items():
            share = shares.get((benchmark, item_id), 0.0) if self.fuzzy_ngram else None
            for first, end in _merge(ranges):
                matches.append(Match(benchmark, item_id, spanned.spans[first][0], spanned.spans[end - 1][1], share))
        return sorted(matches, key=lambda m: (m.start, m.end, m.benchmark, m.item_id))


def _composed(ws: list[str], text: str) -> list[str]:
    """The words of `text` composed to NFC, as items are read: a document that a profile without `normalize` kept
    decomposed ("e" + U+0301, as macOS file names and some PDFs write it) still matches. Word by word, so each word
    keeps its span in the text; a text already in NFC (nearly all) costs one scan."""
    if text.isascii() or unicodedata.is_normalized("NFC", text):
        return ws
    return [unicodedata.normalize("NFC", w) for w in ws]


def _sentences(text: str, n_words: int) -> np.ndarray:
    """(first word, end) of every sentence of `text` a copy may have had inserted, as indices into its
    `n_words` normalized words: from a word that starts with a capital letter to the first word at or after it
    that ends a sentence (followed by . ! or ? before the next word), `end` one past that word. Regular
    expressions over the whole text, not a loop over its words: a long document costs milliseconds."""
    firsts = _FIRST_CHAR.findall(text)
    if len(firsts) != n_words:  # not the words of kiln.dedup.text (never seen): no sentence is cheap
        return np.empty((0, 2), dtype=np.int64)
    ends = np.flatnonzero(np.array(_SENTENCE_END.findall(text) or [""]) != "")
    first = np.flatnonzero(np.fromiter(map(str.isupper, firsts), dtype=bool, count=n_words))
    at = np.searchsorted(ends, first)  # the first sentence end at or after each capital
    first, at = first[at < len(ends)], at[at < len(ends)]
    return np.stack([first, ends[at] + 1], axis=1)


def _last_row(item: np.ndarray, seg: np.ndarray, limit: float, sentences: np.ndarray,
              anchored: bool = False) -> np.ndarray | None:
    """Entry j of the last line: the fewest edits turning `item` into a span of `seg` that ends before word j
    (and starts at word 0 when `anchored`, else anywhere). A replaced or deleted item word costs 1, a run of
    inserted document words 1 + INSERTED_RUN_WORD per word after the first; or one edit in all for the item
    word for word with one of `sentences` ((first, end) word ranges of `seg`) inserted between two of its
    words. None once every span needs more than `limit` (a line's minimum never decreases)."""
    steps = np.arange(len(seg) + 1, dtype=np.float64) * INSERTED_RUN_WORD
    row = np.zeros(len(seg) + 1)
    if anchored:
        row[1:] = np.inf
        row = _insert_runs(row, steps)
    exact = np.where(row == 0, 0.0, np.inf)  # the item's first i words word for word, ending before word j
    cut = np.full(len(seg) + 1, np.inf)  # the same with one sentence inserted: one edit
    for i, word in enumerate(item.tolist(), start=1):
        differs = seg != word
        nxt = np.empty_like(row)
        nxt[0] = i
        np.minimum(row[:-1] + differs, row[1:] + 1, out=nxt[1:])  # keep or replace, or delete the item word
        row = _insert_runs(nxt, steps)
        exact[1:], cut[1:] = np.where(differs, np.inf, exact[:-1]), np.where(differs, np.inf, cut[:-1])
        exact[0], cut[0] = np.inf, np.inf
        if i < len(item) and len(sentences):  # a sentence after item word i, then the rest word for word
            np.minimum.at(cut, sentences[:, 1], exact[sentences[:, 0]] + 1)
        if min(row.min(), cut.min()) > limit:
            return None
    return np.minimum(row, cut)


def _insert_runs(line: np.ndarray, steps: np.ndarray) -> np.ndarray:
    """line[j] = min(line[j], min over k < j of line[k] + 1 + (j - k - 1) * INSERTED_RUN_WORD): document words
    k..j-1 inserted as one run. With steps[j] = j * INSERTED_RUN_WORD that is a prefix minimum of line - steps."""
    best = np.minimum.accumulate(line - steps)
    out = line.copy()
    out[1:] = np.minimum(line[1:], best[:-1] + steps[1:] + (1 - INSERTED_RUN_WORD))
    return out


def _aligned_span(item: np.ndarray, doc: np.ndarray, positions: list[int], allowed: int,
                  sentences: np.ndarray) -> tuple[int, int] | None:
    """Word span [start, end) of `doc` that `item` turns into with the fewest edits, if at most `allowed`;
    searched near `positions` (where the item's n-grams were found: a copy with few edits keeps some).
    `sentences`: (first, end) word ranges of `doc` that may cut a copy (see _last_row)."""
    longest = int((sentences[:, 1] - sentences[:, 0]).max()) if len(sentences) else 0
    # the longest span within `allowed` edits, or of the item word for word around one sentence
    reach = len(item) + max(int(allowed / INSERTED_RUN_WORD), longest) + 1
    segments = list(_merge([(max(0, j - reach), min(len(doc), j + reach)) for j in positions]))
    best: tuple[float, int, int] | None = None
    for first, last in segments:
        seg = doc[first:last]
        if len(item) - np.count_nonzero(np.isin(item, seg)) > allowed:
            continue  # each item word the segment lacks costs an edit: cheap, and most phrase-sharing stops here
        inside = sentences[(sentences[:, 0] >= first) & (sentences[:, 1] <= last)] - first
        row = _last_row(item, seg, allowed, inside)
        if row is None:
            continue
        end = int(np.argmin(row))
        if best is None or row[end] < best[0]:
            # the same edits, read backwards: a sentence (first, end) of seg[:end] is (end - its end, end - first)
            mirrored = end - inside[inside[:, 1] <= end][:, ::-1]
            back = _last_row(item[::-1], seg[:end][::-1], allowed, mirrored, anchored=True)
            best = (float(row[end]), first + end - int(np.argmin(back)), first + end)
    return (best[1], best[2]) if best else None


def _found(windows: np.ndarray, keys: np.ndarray) -> list[tuple[int, int]]:
    """(position, hash) of the windows whose hash is in the sorted `keys`."""
    at = np.searchsorted(keys, windows)
    np.minimum(at, len(keys) - 1, out=at)
    return [(int(j), int(windows[j])) for j in np.flatnonzero(keys[at] == windows)]


def _merge(ranges: list[tuple[int, int]]) -> Iterator[tuple[int, int]]:
    """Union of half-open ranges, touching ones joined."""
    ranges = sorted(ranges)
    start, end = ranges[0]
    for s, e in ranges[1:]:
        if s > end:
            yield start, end
            start, end = s, e
        else:
            end = max(end, e)
    yield start, end


def redact_spans(text: str, spans: Iterable[tuple[int, int]], margin: int) -> str:
    """`text` without the union of `spans` widened by `margin` characters each side; pieces joined by "\\n"."""
    widened = [(max(0, s - margin), min(len(text), e + margin)) for s, e in spans]
    if not widened:
        return text
    pieces, cursor = [], 0
    for s, e in _merge(widened):
        pieces.append(text[cursor:s])
        cursor = e
    pieces.append(text[cursor:])
    return "\n".join(p for p in pieces if p.strip())


def decontaminate(text: str, index: BenchmarkIndex, settings: Decontamination) -> Outcome:
    """Drop a contaminated document, or cut the overlaps out of it (mode "redact").

    The index decides what matches (its n-gram size); `settings` decide what to do about it. A redacted
    text is checked again, since joining the pieces could in principle form a new matching n-gram; one
    with no word left is dropped whatever `min_chars_after_redact` says.
    """
    if not settings.enabled or not index:
        return Outcome(True, text, [])
    matches = index.find(text)
    if not matches:
        return Outcome(True, text, [])
    if settings.mode == "drop":
        return Outcome(False, text, matches, DROP_REASON)
    redacted, found = text, matches
    for _ in range(3):
        redacted = redact_spans(redacted, [(m.start, m.end) for m in found], settings.redact_margin_chars)
        found = index.find(redacted)
        if not found:
            break
    if found or not normalized_words(redacted) or len(redacted) < settings.min_chars_after_redact:
        return Outcome(False, text, matches, TOO_SHORT_REASON)
    return Outcome(True, redacted, matches)


# ---- loading benchmark files -------------------------------------------------------------------------


def load_benchmarks(settings: Decontamination, base_dir: str | Path | None = None) -> BenchmarkIndex:
    """Read every declared benchmark file into one index. Relative paths are resolved against `base_dir`
    (default: the current directory); any problem raises BenchmarkError naming the key, file and line."""
    def items() -> Iterator[tuple[str, str, str]]:
        names = [b.name for b in settings.benchmarks]
        for i, bench in enumerate(settings.benchmarks):
            if bench.name in names[:i]:
                raise BenchmarkError(f"decontamination.benchmarks[{i}].name: {bench.name!r} is declared more than "
                                     f"once; give each benchmark a unique name")
            path = Path(bench.path)
            if not path.is_absolute() and base_dir is not None:
                path = Path(base_dir) / path
            if not path.is_file():
                raise BenchmarkError(f"decontamination.benchmarks[{i}].path: file not found: {str(path)!r} "
                                     f"(benchmark {bench.name!r}); point it at a JSONL file of items (relative "
                                     f"paths are resolved against {str(Path(base_dir or '.').resolve())!r}) or "
                                     f"remove the entry")
            yield from read_benchmark_file(path, bench.name, bench.text_fields, bench.id_field)
    return BenchmarkIndex.from_settings(items(), settings)


def read_benchmark_file(path: Path, name: str, text_fields: list[str],
                        id_field: str | None) -> Iterator[tuple[str, str, str]]:
    """(benchmark, item_id, text) per non-blank line of a JSONL (or .jsonl.gz) file."""
    opener = gzip.open if path.suffix == ".gz" else open
    try:
        yield from _benchmark_items(opener(path, "rt", encoding="utf-8"), path, name, text_fields, id_field)
    except (UnicodeDecodeError, EOFError, gzip.BadGzipFile, zlib.error) as exc:
        what = "not UTF-8 text" if isinstance(exc, UnicodeDecodeError) else "a damaged or cut-short gzip file"
        raise BenchmarkError(f"{path} (benchmark {name!r}): {what} ({exc}); write the items as UTF-8 JSONL, gzipped "
                             f"whole or not at all") from None


def _benchmark_items(f, path: Path, name: str, text_fields: list[str],
                     id_field: str | None) -> Iterator[tuple[str, str, str]]:
    first_line: dict[str, tuple[int, str]] = {}  # item id -> (its first line, the sha256 of its text)
    with f:
        for line_no, line in enumerate(f, start=1):
            if not line.strip():
                continue
            where = f"{path}:{line_no} (benchmark {name!r})"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise BenchmarkError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno}); each line must "
                                     f"be one JSON object, e.g. {{\"id\": 1, \"text\": \"...\"}}") from None
            if not isinstance(record, dict):
                raise BenchmarkError(f"{where}: expected a JSON object, got {type(record).__name__}; each line "
                                     f"must be one object with the fields {text_fields}")
            item_id, text = _item_id(record, id_field, line_no, where), _item_text(record, text_fields, where)
            # Two texts under one id would be one item to the index: the second's words replace the first's for the
            # aligned rule, and both count to its share, so an edited copy of the first would go unfound.
            digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
            first, first_digest = first_line.setdefault(item_id, (line_no, digest))
            if first_digest != digest:
                raise BenchmarkError(f"{where}: id {item_id!r} (field {id_field!r}) is line {first}'s too, with "
                                     f"another text; ids must be unique within a benchmark: fix the file, or set "
                                     f"id_field: null to name items by line number")
            yield name, item_id, text


def _item_id(record: dict, id_field: str | None, line_no: int, where: str) -> str:
    if id_field is None:
        return str(line_no)
    if record.get(id_field) is None:
        raise BenchmarkError(f"{where}: no {id_field!r} field (the id_field); present fields: {sorted(record)}; "
                             f"set id_field to one of them, or to null to use line numbers")
    return str(record[id_field])


def _item_text(record: dict, text_fields: list[str], where: str) -> str:
    parts = []
    for name in text_fields:
        value = record.get(name)
        if value is None:
            raise BenchmarkError(f"{where}: no {name!r} field (listed in text_fields) or it is null; present "
                                 f"fields: {sorted(record)}; fix text_fields or the file")
        if isinstance(value, list) and all(isinstance(v, str | int | float) for v in value):
            value = "\n".join(map(str, value))  # e.g. multiple-choice options
        elif isinstance(value, int | float):
            value = str(value)
        elif not isinstance(value, str):
            raise BenchmarkError(f"{where}: field {name!r} is a {type(value).__name__}; text fields must be "
                                 f"strings, numbers or lists of them")
        parts.append(value)
    # NFC, as curation's `normalize` step writes documents (and as a document's words are composed, `_composed`): an
    # item saved decomposed ("e" + U+0301) would never equal a document's words
    return unicodedata.normalize("NFC", "\n".join(parts))


# ---- reporting -----------------------------------------------------------------------------------------


def report_rows(doc_id: str, source: str, outcome: Outcome) -> list[dict[str, str]]:
    """One CONTAMINATION_SCHEMA row per benchmark item found in a document (none for a clean one)."""
    if not outcome.matches:
        return []
    shares: dict[tuple[str, str], float | None] = {}
    for m in outcome.matches:
        shares[(m.benchmark, m.item_id)] = m.share
    return [{"benchmark": b, "item_id": i, "doc_id": doc_id, "source": source, "action": outcome.action,
             "share": shares[(b, i)]} for b, i in sorted(shares)]


def contamination_counts(rows: Iterable[dict[str, str]]) -> dict[str, dict[str, int]]:
    """Per benchmark: distinct items found, documents affected, and how many were dropped or redacted."""
    items: dict[str, set] = defaultdict(set)
    docs: dict[str, dict[tuple[str, str], str]] = defaultdict(dict)
    for r in rows:
        items[r["benchmark"]].add(r["item_id"])
        docs[r["benchmark"]][(r["source"], r["doc_id"])] = r["action"]
    out = {}
    for benchmark in sorted(items):
        actions = list(docs[benchmark].values())
        out[benchmark] = {"items_contaminated": len(items[benchmark]), "documents_affected": len(actions),
                          "documents_dropped": actions.count("dropped"),
                          "documents_redacted": actions.count("redacted")}
    return out


def report_table(rows: Iterable[dict[str, str]]) -> pa.Table:
    return pa.Table.from_pylist(list(rows), schema=CONTAMINATION_SCHEMA)
