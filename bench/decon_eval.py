"""Decontamination on edited copies: how many are found, per kind of edit, with the 13-gram rule alone and with
the share of short n-grams (the default), and how many unrelated documents are flagged.

    .venv/bin/python bench/decon_eval.py [--copies 50] [--seed 0] [--min-share S] [--fuzzy-ngram N]

Items: the demo benchmark (kiln/dedup/data/benchmarks/demo_eval.jsonl, question + answer). Each copy is an item
edited at random positions and set between two paragraphs of unrelated text: `substitution` (10% of its words
replaced), `insertion` (a sentence inserted at a random word), `deletion` (10% of its words deleted),
`case_punctuation` (upper case, punctuation swapped, 5% of words replaced), `verbatim` (as published). Unrelated
documents: the synthetic demo corpus's clean texts and every paragraph of this machine's license texts
(/usr/share/common-licenses). Nothing here reads the detector's code to build the copies.
"""

from __future__ import annotations

import argparse
import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.common.config import Decontamination  # noqa: E402
from kiln.curation.synthetic import document  # noqa: E402
from kiln.dedup.decontaminate import DEMO_BENCHMARK, BenchmarkIndex, read_benchmark_file  # noqa: E402

SENTENCES = ["The weather turned cold that week.", "Nobody in the office could explain why.",
             "It was the third attempt that year.", "A small crowd had gathered by the door."]
PUNCTUATION = {",": ";", ".": "!", "?": ".", ":": " -"}


def edit(text: str, kind: str, rng: random.Random, vocabulary: list[str]) -> str:
    words = text.split()
    if kind == "substitution" or kind == "case_punctuation":
        share = 0.10 if kind == "substitution" else 0.05
        for k in rng.sample(range(len(words)), max(1, round(share * len(words)))):
            words[k] = rng.choice(vocabulary)
    elif kind == "insertion":
        words.insert(rng.randrange(1, len(words)), rng.choice(SENTENCES))
    elif kind == "deletion":
        for k in sorted(rng.sample(range(len(words)), max(1, round(0.10 * len(words)))), reverse=True):
            del words[k]
    out = " ".join(words)
    if kind == "case_punctuation":
        out = "".join(PUNCTUATION.get(c, c) for c in out.upper())
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--copies", type=int, default=50, help="edited copies per item and kind")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--min-share", type=float, default=Decontamination().min_share)
    ap.add_argument("--fuzzy-ngram", type=int, default=Decontamination().fuzzy_ngram)
    args = ap.parse_args()
    settings = Decontamination(min_share=args.min_share, fuzzy_ngram=args.fuzzy_ngram)
    items = list(read_benchmark_file(DEMO_BENCHMARK, "demo_eval", ["question", "answer"], "id"))
    exact = BenchmarkIndex.from_items(items, settings.ngram, settings.min_item_words)
    fuzzy = BenchmarkIndex.from_items(items, settings.ngram, settings.min_item_words, settings.fuzzy_ngram,
                                      settings.min_share)
    unrelated = [document(7, i)["text"] for i in range(2000)]
    for path in sorted(Path("/usr/share/common-licenses").glob("*")):
        if path.is_file():
            unrelated += [p for p in path.read_text(errors="replace").split("\n\n") if len(p.split()) >= 20]
    vocabulary = sorted({w for t in unrelated[:200] for w in t.split() if w.isalpha()})
    rng = random.Random(args.seed)
    print(f"{len(items)} items, {args.copies} copies per item and kind; 13-gram rule vs + share of "
          f"{settings.fuzzy_ngram}-grams >= {settings.min_share}")
    print(f"{'edit':<18}{'copies':>8}{'13-gram':>10}{'default':>10}  median share")
    for kind in ("verbatim", "substitution", "insertion", "deletion", "case_punctuation"):
        found_exact = found = 0
        shares = []
        for _, item_id, text in items:
            for _ in range(args.copies):
                copy = text if kind == "verbatim" else edit(text, kind, rng, vocabulary)
                doc = f"{rng.choice(unrelated)}\n\n{copy}\n\n{rng.choice(unrelated)}"
                found_exact += any(m.item_id == item_id for m in exact.find(doc))
                matches = [m for m in fuzzy.find(doc) if m.item_id == item_id]
                found += bool(matches)
                shares += [max(m.share for m in matches)] if matches else []
        n = len(items) * args.copies
        median = sorted(shares)[len(shares) // 2] if shares else float("nan")
        print(f"{kind:<18}{n:>8}{found_exact / n:>10.1%}{found / n:>10.1%}  {median:.2f}")
    flagged = sum(bool(fuzzy.find(t)) for t in unrelated)
    flagged_exact = sum(bool(exact.find(t)) for t in unrelated)
    print(f"unrelated documents flagged: {flagged} of {len(unrelated)} (13-gram rule alone: {flagged_exact})")


if __name__ == "__main__":
    main()
