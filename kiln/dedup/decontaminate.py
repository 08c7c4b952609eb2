"""Benchmark decontamination: remove (or cut out) training text that shares an n-gram with an eval item.

A model that trained on a benchmark's items scores well on it without being good at the task, so every
document is checked against the declared evaluation sets (`decontamination.benchmarks`) before it can
reach the token shards. Following GPT-3 and most successors, a document is contaminated when it shares
one n-gram (13 normalized words by default) with any item; items shorter than that but with at least
`min_item_words` words contribute one n-gram made of all their words.

Copies get edited on their way around the web: a word changed every dozen words leaves no 13-gram whole. So
a document is also contaminated when it holds at least `min_share` (0.4) of an item's distinct short n-grams
(`fuzzy_ngram` words, 4 by default; at least 3 of them), the share being reported. A 4-gram that many items
share ("which of the following") says nothing about any one of them and is left out of that count, so a
document that merely uses an item's common phrases is not flagged. Words are normalized first (case,
punctuation, digits, Unicode), so those edits never count. bench/decon_eval.py measures both sides.

Speed matters (the check runs over every document), so words are hashed once each with a stable 64-bit
hash (blake2b, not Python's salted `hash`, so results do not change between processes) and n-gram hashes
are computed for all positions at once with numpy. Character spans are only computed for documents that
hit, which are rare.
"""

from __future__ import annotations

import gzip
import json
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from hashlib import blake2b
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from kiln.common.config import Decontamination, ShingleNormalization
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
MIN_FUZZY_NGRAMS = 3  # a share counts only from this many of an item's short n-grams found
COMMON_OWNERS = 10  # a short n-gram of more items than this is a common phrase, not evidence for one item

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


@dataclass
class BenchmarkIndex:
    """The n-grams of every indexed eval item, for fast membership tests and for naming what matched."""

    ngram: int
    min_item_words: int
    # size -> sorted unique n-gram hashes of that size (most items give `ngram`, short items their length)
    keys: dict[int, np.ndarray] = field(default_factory=dict)
    # size -> n-gram hash -> ((benchmark, item_id), ...)
    owners: dict[int, dict[int, tuple[tuple[str, str], ...]]] = field(default_factory=dict)
    stats: dict[str, dict[str, int]] = field(default_factory=dict)  # benchmark -> counts (see summary)
    # Edited copies: every item's distinct short n-grams (common ones left out), and how many each item has
    fuzzy_ngram: int | None = None
    min_share: float | None = None
    fuzzy_keys: np.ndarray = field(default_factory=lambda: np.empty(0, dtype=np.uint64))
    fuzzy_owners: dict[int, tuple[tuple[str, str], ...]] = field(default_factory=dict)
    fuzzy_counts: dict[tuple[str, str], int] = field(default_factory=dict)

    @classmethod
    def from_items(cls, items: Iterable[tuple[str, str, str]], ngram: int = 13, min_item_words: int = 8,
                   fuzzy_ngram: int | None = None, min_share: float | None = None) -> BenchmarkIndex:
        """Index (benchmark, item_id, text) triples (and their short n-grams when `min_share` is set)."""
        owners: dict[int, dict[int, set[tuple[str, str]]]] = defaultdict(lambda: defaultdict(set))
        short: dict[int, set[tuple[str, str]]] = defaultdict(set)
        fuzzy = fuzzy_ngram if min_share is not None else None
        stats: dict[str, dict[str, int]] = {}
        for benchmark, item_id, text in items:
            s = stats.setdefault(benchmark, {"items": 0, "items_indexed": 0, "items_skipped_short": 0, "ngrams": 0})
            s["items"] += 1
            ws = normalized_words(text)
            if len(ws) < min_item_words:
                s["items_skipped_short"] += 1
                continue
            size = min(len(ws), ngram)
            hashes = np.unique(ngram_hashes(ws, size))
            owner = (benchmark, str(item_id))
            table = owners[size]
            for h in hashes.tolist():
                table[h].add(owner)
            if fuzzy:
                for h in np.unique(ngram_hashes(ws, fuzzy)).tolist():
                    short[h].add(owner)
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
                   np.array(sorted(fuzzy_owners), dtype=np.uint64), fuzzy_owners, dict(counts))

    def summary(self) -> dict[str, Any]:
        """Per benchmark: items read, indexed, skipped as too short, n-grams; plus distinct n-grams overall."""
        return {"benchmarks": {name: dict(s) for name, s in self.stats.items()},
                "distinct_ngrams": sum(len(k) for k in self.keys.values()),
                "ngram_sizes": sorted(self.keys),
                "fuzzy": {"ngram": self.fuzzy_ngram, "min_share": self.min_share,
                          "distinct_ngrams": len(self.fuzzy_keys)} if self.fuzzy_ngram else None}

    def __bool__(self) -> bool:
        return bool(self.keys)

    def _hits(self, ws: list[str]) -> tuple[list[tuple[int, tuple[tuple[str, str], ...], int]], dict]:
        """(first word, owners, size) of every window of `ws` that makes an item match, and each matched item's
        share of short n-grams found (only items with a short n-gram in `ws`)."""
        if not self.keys or not ws:
            return [], {}
        prefix, inverse = _prefix(_word_hash_array(ws))
        hits = []
        for size, keys in self.keys.items():
            if len(ws) >= size:
                table = self.owners[size]
                hits += [(j, table[h], size) for j, h in _found(_window_hashes(prefix, inverse, size), keys)]
        shares: dict[tuple[str, str], float] = {}
        if self.fuzzy_ngram and len(ws) >= self.fuzzy_ngram and len(self.fuzzy_keys):
            found = _found(_window_hashes(prefix, inverse, self.fuzzy_ngram), self.fuzzy_keys)
            distinct: dict[tuple[str, str], set[int]] = defaultdict(set)
            for _, h in found:
                for owner in self.fuzzy_owners[h]:
                    distinct[owner].add(h)
            shares = {o: len(hs) / self.fuzzy_counts[o] for o, hs in distinct.items()}
            flagged = {o for o, hs in distinct.items() if len(hs) >= MIN_FUZZY_NGRAMS and shares[o] >= self.min_share}
            if flagged:
                for j, h in found:
                    if owners := tuple(o for o in self.fuzzy_owners[h] if o in flagged):
                        hits.append((j, owners, self.fuzzy_ngram))
        return hits, shares

    def contains(self, text: str) -> bool:
        """Whether `text` matches any item (no spans: the fast path for drop-only checks)."""
        return bool(self._hits(normalized_words(text))[0])

    def find(self, text: str) -> list[Match]:
        """Every item found in `text`, ordered by position; one Match per run of overlapping n-grams."""
        ws = normalized_words(text)
        hits, shares = self._hits(ws)
        if not hits:
            return []
        spanned = words(text, NORMALIZATION, with_spans=True)  # spans only for the rare text that hits
        if spanned.words != ws:  # never seen (a test checks both word views agree); stay correct anyway
            hits, shares = self._hits(spanned.words)
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
    return BenchmarkIndex.from_items(items(), settings.ngram, settings.min_item_words, settings.fuzzy_ngram,
                                     settings.min_share)


def read_benchmark_file(path: Path, name: str, text_fields: list[str],
                        id_field: str | None) -> Iterator[tuple[str, str, str]]:
    """(benchmark, item_id, text) per non-blank line of a JSONL (or .jsonl.gz) file."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt", encoding="utf-8") as f:
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
            yield name, _item_id(record, id_field, line_no, where), _item_text(record, text_fields, where)


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
    return "\n".join(parts)


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
