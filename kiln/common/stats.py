"""The statistics every stage reports the same way, so funnels, histograms and examples come for free."""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from typing import Any


@dataclass
class StepStats:
    docs_in: int = 0
    chars_in: int = 0
    dropped: Counter = field(default_factory=Counter)  # reason -> documents
    chars_dropped: Counter = field(default_factory=Counter)  # reason -> characters
    chars_rewritten: int = 0  # characters removed by rewrites (C4 line removal, PII placeholders)
    counts: Counter = field(default_factory=Counter)  # what rewrites did, e.g. {"email": 3}
    seconds: float = 0.0

    def merge(self, other: StepStats) -> None:
        self.docs_in += other.docs_in
        self.chars_in += other.chars_in
        self.dropped.update(other.dropped)
        self.chars_dropped.update(other.chars_dropped)
        self.chars_rewritten += other.chars_rewritten
        self.counts.update(other.counts)
        self.seconds += other.seconds

    def to_dict(self) -> dict[str, Any]:
        # Not dataclasses.asdict: it rebuilds a Counter from (key, value) pairs, counting the pairs.
        return {"docs_in": self.docs_in, "chars_in": self.chars_in, "dropped": dict(self.dropped),
                "chars_dropped": dict(self.chars_dropped), "chars_rewritten": self.chars_rewritten,
                "counts": dict(self.counts), "seconds": round(self.seconds, 4)}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StepStats:
        return cls(d["docs_in"], d["chars_in"], Counter(d["dropped"]), Counter(d["chars_dropped"]),
                   d["chars_rewritten"], Counter(d["counts"]), d["seconds"])


@dataclass
class LengthHistogram:
    """Document lengths in characters as counts per eighth of an octave: the same few hundred numbers whatever the
    corpus size, so a stage's statistics stay small on a driver that merges one per part."""

    PER_OCTAVE = 8
    buckets: Counter = field(default_factory=Counter)  # b -> documents of length in [2^(b/8), 2^((b+1)/8)); 0 in 0

    def add(self, n: int) -> None:
        self.buckets[int(math.log2(max(n, 1)) * self.PER_OCTAVE)] += 1

    def extend(self, lengths) -> None:
        for n in lengths:
            self.add(n)

    def merge(self, other: LengthHistogram) -> None:
        self.buckets.update(other.buckets)

    def __len__(self) -> int:
        return sum(self.buckets.values())

    def median(self) -> int:
        """The lower edge of the bucket holding the median document (within 9% of the exact median)."""
        half, seen = (len(self) + 1) // 2, 0
        for b in sorted(self.buckets):
            seen += self.buckets[b]
            if seen >= half:
                return math.ceil(2 ** (b / self.PER_OCTAVE)) if b else 0
        return 0

    def octaves(self) -> Counter:
        """Documents per power of two (log2 buckets)."""
        out: Counter = Counter()
        for b, n in self.buckets.items():
            out[b // self.PER_OCTAVE] += n
        return out

    def to_dict(self) -> dict[str, int]:
        return {str(b): n for b, n in sorted(self.buckets.items())}

    @classmethod
    def from_dict(cls, d: dict[str, int]) -> LengthHistogram:
        return cls(Counter({int(b): n for b, n in d.items()}))


@dataclass
class StageStats:
    """What went in, what came out, and which step removed what: one per stage per partition."""

    docs_in: int = 0
    chars_in: int = 0
    docs_out: int = 0
    chars_out: int = 0
    steps: dict[str, StepStats] = field(default_factory=dict)
    examples: dict[str, list[dict[str, str]]] = field(default_factory=dict)  # reason -> [{doc_id, excerpt}]
    lengths_out: LengthHistogram = field(default_factory=LengthHistogram)  # characters per kept document
    lengths_dropped: LengthHistogram = field(default_factory=LengthHistogram)
    # identified language -> documents of the stage's input the language step identified as it / of those kept
    languages_in: Counter = field(default_factory=Counter)
    languages_out: Counter = field(default_factory=Counter)

    def step(self, name: str) -> StepStats:
        return self.steps.setdefault(name, StepStats())

    def add_example(self, reason: str, doc_id: str, limit: int, note: str = "", excerpt: str | None = None) -> None:
        """An example of a removal: the document's id, a note (what it duplicated, its score), and an excerpt of
        its text only where the caller may show one (kiln.common.removals decides after intake)."""
        bucket = self.examples.setdefault(reason, [])
        if len(bucket) < limit:
            bucket.append({"doc_id": doc_id, "note": note} | ({"excerpt": excerpt[:300]} if excerpt else {}))

    @property
    def docs_dropped(self) -> int:
        return sum(sum(s.dropped.values()) for s in self.steps.values())

    def merge(self, other: StageStats, examples_limit: int = 3) -> None:
        self.docs_in += other.docs_in
        self.chars_in += other.chars_in
        self.docs_out += other.docs_out
        self.chars_out += other.chars_out
        for name, s in other.steps.items():
            self.step(name).merge(s)
        for reason, items in other.examples.items():
            bucket = self.examples.setdefault(reason, [])
            bucket.extend(items[: max(0, examples_limit - len(bucket))])
        self.lengths_out.merge(other.lengths_out)
        self.lengths_dropped.merge(other.lengths_dropped)
        self.languages_in.update(other.languages_in)
        self.languages_out.update(other.languages_out)

    def to_dict(self, with_lengths: bool = False) -> dict[str, Any]:
        d = {"docs_in": self.docs_in, "chars_in": self.chars_in, "docs_out": self.docs_out,
             "chars_out": self.chars_out, "steps": {n: s.to_dict() for n, s in self.steps.items()},
             "examples": self.examples}
        if self.languages_in:
            d["languages"] = {lang: {"in": n, "kept": self.languages_out[lang]}
                              for lang, n in sorted(self.languages_in.items(), key=lambda kv: (-kv[1], kv[0]))}
        if with_lengths:
            d |= {"lengths_out": self.lengths_out.to_dict(), "lengths_dropped": self.lengths_dropped.to_dict()}
        return d

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> StageStats:
        languages = d.get("languages", {})
        return cls(d["docs_in"], d["chars_in"], d["docs_out"], d["chars_out"],
                   {k: StepStats.from_dict(v) for k, v in d["steps"].items()},
                   d.get("examples", {}),  # none in a manifest from the store's history (Manifest.for_history)
                   LengthHistogram.from_dict(d.get("lengths_out", {})),
                   LengthHistogram.from_dict(d.get("lengths_dropped", {})),
                   Counter({k: v["in"] for k, v in languages.items()}),
                   Counter({k: v["kept"] for k, v in languages.items() if v["kept"]}))


def funnel_rows(stats: StageStats) -> list[dict[str, Any]]:
    """One row per (step, reason) that dropped something, with its share of the stage's input."""
    rows = []
    for step_name, s in stats.steps.items():
        for reason, n in sorted(s.dropped.items(), key=lambda kv: -kv[1]):
            rows.append({"step": step_name, "reason": reason, "docs": n, "share_of_docs": n / max(stats.docs_in, 1),
                         "chars": s.chars_dropped[reason], "share_of_chars": s.chars_dropped[reason] / max(stats.chars_in, 1)})
    return rows


def funnel_markdown(stats: StageStats) -> str:
    lines = [f"**{stats.docs_in:,} documents in → {stats.docs_out:,} kept** "
             f"({stats.docs_out / max(stats.docs_in, 1):.1%}; characters {stats.chars_out / max(stats.chars_in, 1):.1%})",
             "", "| step | reason | docs | % docs | chars | % chars |", "|---|---|---:|---:|---:|---:|"]
    for r in funnel_rows(stats):
        lines.append(f"| {r['step']} | `{r['reason']}` | {r['docs']:,} | {r['share_of_docs']:.1%} | {r['chars']:,} | "
                     f"{r['share_of_chars']:.1%} |")
    rewrites = [(n, s) for n, s in stats.steps.items() if s.chars_rewritten or s.counts]
    if rewrites:
        lines += ["", "| step | chars rewritten | counts |", "|---|---:|---|"]
        for n, s in rewrites:
            counts = ", ".join(f"{k}={v:,}" for k, v in sorted(s.counts.items()))
            lines.append(f"| {n} | {s.chars_rewritten:,} | {counts} |")
    if stats.languages_in:
        lines += ["", "| language (identified) | docs in | kept | % kept |", "|---|---:|---:|---:|"]
        for lang, n in sorted(stats.languages_in.items(), key=lambda kv: (-kv[1], kv[0])):
            kept = stats.languages_out[lang]
            lines.append(f"| {lang} | {n:,} | {kept:,} | {kept / n:.1%} |")
    return "\n".join(lines)


def length_histogram_markdown(lengths: LengthHistogram, title: str, width: int = 40) -> str:
    """Document lengths in characters, log2 buckets, drawn as text bars (readable in any UI)."""
    if not len(lengths):
        return f"**{title}**: no documents"
    buckets = lengths.octaves()
    top = max(buckets.values())
    lines = [f"**{title}** ({len(lengths):,} docs, median ≈ {lengths.median():,} chars)", "```"]
    for b in range(min(buckets), max(buckets) + 1):
        n = buckets.get(b, 0)
        lines.append(f"{2 ** b:>9,}–{2 ** (b + 1) - 1:<9,} {'█' * math.ceil(width * n / top):<{width}} {n:,}")
    lines.append("```")
    return "\n".join(lines)


def examples_markdown(stats: StageStats) -> str:
    if not stats.examples:
        return "nothing removed"
    out = []
    for reason, items in sorted(stats.examples.items()):
        out.append(f"**`{reason}`**")
        for item in items:
            said = " ".join(filter(None, (item.get("note"), item.get("excerpt"))))
            out.append(f"- `{item['doc_id']}`" + (f": {' '.join(said.split())[:200]}" if said else ""))
    return "\n".join(out)


def chain(stages: list[StageStats], examples_limit: int = 3) -> StageStats:
    """Consecutive stages as one funnel: the first stage's input, every step in order, the last's output."""
    total = StageStats()
    for s in stages:
        total.merge(s, examples_limit)
    total.docs_in, total.chars_in = stages[0].docs_in, stages[0].chars_in
    total.docs_out, total.chars_out = stages[-1].docs_out, stages[-1].chars_out
    total.lengths_out = LengthHistogram(Counter(stages[-1].lengths_out.buckets))
    return total
