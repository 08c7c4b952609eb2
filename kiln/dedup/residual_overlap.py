"""A second look for benchmark text in what decontamination kept, by code of its own (as kiln.curation.residual_pii
is to the PII redactor): the `no_benchmark_overlap` check. Re-running the detector (kiln.dedup.decontaminate) on its
own output could only agree with it, so a detector bug (a copy it misses) would pass.

The rule read here is the detector's exact rule, read more strictly: an item's words are runs of Python's `\\w`, each
with its combining marks, of its NFC lowercased text (the detector also maps digits to 0 and splits CJK text into
characters, which only makes more texts equal); a run weighs what the detector's words in it weigh (text_units: a
character of a script without spaces 5 eighths of a word, each stretch of other word characters a word), an item of
at least `min_item_words` words' weight contributes, from each run, the fewest runs that weigh `ngram` words (a
lighter item: the whole item as one); a document overlaps when it holds one of them. The detector's n-gram from the
run's first word ends inside the last of those runs, so it is in the document too. Every overlap
found here is one the detector's exact rule also finds, so a hit is a detector bug, never a false alarm. (The detector's
edited-copy rules find more; this look does not try to.)
"""

from __future__ import annotations

import os
import re
import unicodedata
from collections import defaultdict
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import pyarrow.parquet as pq

from kiln.common.config import Decontamination
from kiln.common.text_units import WORD_WEIGHT, mark_code_points, unit_weights
from kiln.dedup.decontaminate import read_benchmark_file
from kiln.engine import SERIAL, Engine

# Words with their combining marks (Arabic harakat, Devanagari vowel signs), as the detector reads them: `\w` alone
# breaks a word at each mark, and two texts differing only in marks would read the same here and not there.
_WORD = re.compile(r"(?:\w[" + "".join(map(chr, sorted(mark_code_points()))) + "]*)+")


_UNITS = unit_weights()  # code point -> its unit's weight
_MARKS = mark_code_points()


def _words(text: str) -> list[str]:
    return _WORD.findall(unicodedata.normalize("NFC", text).lower())


def _weight(run: str) -> int:
    """The detector's words in a run, weighed: a character of a script without spaces its text_units weight, WORD_WEIGHT
    per stretch of other word characters (marks stay with the character before them)."""
    weight, in_word = 0, False
    for c in run:
        if (unit := _UNITS.get(ord(c))) is not None:
            weight, in_word = weight + unit, False
        elif ord(c) not in _MARKS:
            weight, in_word = weight + (0 if in_word else WORD_WEIGHT), True
    return weight


class ItemNgrams:
    """The n-grams of benchmark items, by size, with the words that start one (a cheap first test per position)."""

    def __init__(self, items: Iterable[str], ngram: int, min_item_words: int):
        self.by_size: dict[int, set[tuple[str, ...]]] = defaultdict(set)
        for text in items:
            words = _words(text)
            weights = [_weight(w) for w in words]
            if sum(weights) < min_item_words * WORD_WEIGHT:
                continue  # the detector skips such an item too
            target = min(ngram * WORD_WEIGHT, sum(weights))
            for i in range(len(words)):
                k, reached = i, 0
                while k < len(words) and reached < target:
                    reached, k = reached + weights[k], k + 1
                if reached < target:
                    break  # no later start reaches it either
                self.by_size[k - i].add(tuple(words[i:k]))
        self.starts = {gram[0] for grams in self.by_size.values() for gram in grams}

    def overlaps(self, text: str) -> bool:
        words = _words(text)
        for i, word in enumerate(words):
            if word in self.starts and any(tuple(words[i:i + n]) in grams for n, grams in self.by_size.items()):
                return True
        return False


def item_ngrams(settings) -> ItemNgrams:
    """The n-grams of every item of `decontamination.benchmarks` (kiln.common.config.Decontamination), read from
    their files as the detector reads them (the file reading is shared; the matching is not)."""
    texts = (text for b in settings.benchmarks
             for _, _, text in read_benchmark_file(Path(b.path), b.name, b.text_fields, b.id_field))
    return ItemNgrams(texts, settings.ngram, settings.min_item_words)


@dataclass(frozen=True)
class _OverlapTask:
    path: str
    settings: str  # Decontamination as JSON


@lru_cache(maxsize=2)
def _items(settings: str) -> ItemNgrams:
    """Built once per worker process."""
    return item_ngrams(Decontamination.model_validate_json(settings))


def _overlapping_in_part(task: _OverlapTask) -> list[str]:
    items = _items(task.settings)
    return [doc_id for batch in pq.ParquetFile(task.path).iter_batches(batch_size=1000, columns=["doc_id", "text"])
            for doc_id, text in zip(batch.column("doc_id").to_pylist(), batch.column("text").to_pylist())
            if items.overlaps(text)]


def overlapping_documents(paths: Sequence[Path], settings: Decontamination, engine: Engine = SERIAL,
                          progress: bool = True) -> list[str]:
    """The documents of a stage's Parquet parts that hold an n-gram of a benchmark item (`settings.benchmarks`), in
    part order: one engine task per part, so the look at a large output is spread as the stage that wrote it was."""
    tasks = [_OverlapTask(str(p), settings.model_dump_json()) for p in paths]
    return [doc_id for found in engine.map_parts(_overlapping_in_part, tasks, desc="benchmark overlap",
                                                 progress=progress, size=lambda t: os.path.getsize(t.path))
            for doc_id in found]
