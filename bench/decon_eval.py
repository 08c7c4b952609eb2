"""Decontamination on real text: false flags on documents that share phrasing with an item without containing it,
and how many edited copies of items are still found; today's rule ("before") against the default ("after").

    .venv/bin/python bench/decon_eval.py [--per-family 25] [--copies 3] [--seed 0] [--max-edit-share F]
                                         [--min-shared-ngrams N] [--min-share S] [--show 10]

The evaluation set, all from text on this machine (nothing downloaded):
- Documents in families of siblings that share phrasing: manual pages (the BSD queue(3) pages list, slist,
  stailq, tailq, circleq; pthread_*(3); a sample of man2 system calls; git-*(1), openssl-*(1), dpkg*(1),
  systemd*(1), gcloud compute instances(1), alpha and GA), read from the .gz troff with markup stripped simply;
  and `pydoc` text of sibling stdlib functions (os.path.*, str, bytes, list, dict and set methods, math,
  itertools, shutil, os, re, random, statistics, pathlib.Path).
- Benchmark items: sentences of 15-60 words drawn from those documents (at most 2 per document).
- (b) Sibling pairs: every document checked against every item not drawn from it. A flagged pair is a false
  flag when the document does not contain the item: no span of it is within a quarter of the item's words of
  edits (word edit distance > 25% of the item, by a second, independent implementation below). Flagged pairs
  within that distance are near-copies (sibling pages often repeat a sentence whole) and listed apart.
- (c) Edited copies: each item with k = 1..3 words edited (each edit replaces, inserts or deletes a word at a
  random position; new words drawn from other documents) set in the middle of a document of another family.
- The earlier edit kinds (10% of the words replaced or deleted, a sentence inserted, case and punctuation
  changed plus 5% replaced) on the same items and on the demo benchmark (kiln/dedup/data/benchmarks).

"before" is the rule of the previous release: a 13-gram, or at least 40% of an item's 4-grams and at least 3 of
them (max_edit_share null, min_shared_ngrams 3). "after" is the configured default unless overridden here.
"""

from __future__ import annotations

import argparse
import gzip
import inspect
import itertools
import math
import os.path
import pathlib
import pydoc
import random
import re
import shutil
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.common.config import Decontamination  # noqa: E402
from kiln.dedup.decontaminate import DEMO_BENCHMARK, BenchmarkIndex, read_benchmark_file  # noqa: E402
from kiln.dedup.text import normalized_words  # noqa: E402

MAN = Path("/usr/share/man")
BEFORE = Decontamination(max_edit_share=None, min_shared_ngrams=3)
SENTENCES = ["The weather turned cold that week.", "Nobody in the office could explain why.",
             "It was the third attempt that year.", "A small crowd had gathered by the door."]
ISSUE_38_ITEM = "New elements can be added to the list after an existing element or at the head of the list."
PUNCTUATION = {",": ";", ".": "!", "?": ".", ":": " -"}

# ---- reading manual pages: troff with its markup stripped simply ----------------------------------------

_ESCAPES = [(re.compile(r"\\f(\[[^\]]*\]|\(..|.)"), ""), (re.compile(r"\\\*(\[[^\]]*\]|\(..|.)"), ""),
            (re.compile(r"\\s[+-]?\d+"), ""), (re.compile(r"\\\((em|en)"), " - "), (re.compile(r"\\\(aq"), "'"),
            (re.compile(r"\\\((dq|lq|rq)"), '"'), (re.compile(r"\\\[[^\]]*\]|\\\(.."), " "),
            (re.compile(r"\\[-%&c]"), lambda m: "-" if m.group(0) == "\\-" else ""),
            (re.compile(r"\\e"), "\\\\"), (re.compile(r"\\ "), " ")]
_TEXT_MACROS = {"B", "I", "BR", "BI", "IB", "IR", "RB", "RI", "SM", "SB", "SH", "SS", "IP", "UR", "MT", "OP"}
_ALTERNATING = {"BR", "BI", "IB", "IR", "RB", "RI"}  # fonts alternate between arguments, joined with no space
_BREAK_MACROS = {"PP", "P", "LP", "SH", "SS", "TP", "IP", "sp", "HP"}


def troff_text(raw: str) -> str | None:
    """Plain text of a man(7) page; None for a `.so` redirect."""
    out = []
    for line in raw.splitlines():
        if line.startswith((".\\\"", "'\\\"", "\\\"")):
            continue
        if line.startswith(".so "):
            return None
        if line.startswith((".", "'")):
            macro, _, rest = line[1:].strip().partition(" ")
            if macro in _BREAK_MACROS:
                out.append("")
            args = [a or b for a, b in re.findall(r'"([^"]*)"|(\S+)', rest)]
            if macro in ("IP", "TP"):
                args = args[:1]  # the tag; the rest is an indent
            if macro in _TEXT_MACROS and args:
                out.append(("" if macro in _ALTERNATING else " ").join(args))
            continue
        out.append(line)
    text = "\n".join(out)
    for pattern, repl in _ESCAPES:
        text = pattern.sub(repl, text)
    return text


def man_page(path: Path) -> str | None:
    try:
        return troff_text(gzip.open(path, "rt", errors="replace").read())
    except (OSError, EOFError):
        return None


def man_families(per_family: int, rng: random.Random) -> dict[str, dict[str, str]]:
    """family -> {page: text}; real pages only (symlinks and `.so` redirects skipped), sampled per family."""
    pattern = {
        "queue(3)": ("man3", r"(list|slist|stailq|tailq|circleq)\.3\.gz"),
        "pthread(3)": ("man3", r"pthread_.*\.3\.gz"),
        "syscalls(2)": ("man2", r".*\.2\.gz"),
        "git(1)": ("man1", r"git-.*\.1\.gz"),
        "openssl(1)": ("man1", r"openssl-.*\.1ssl\.gz"),
        "dpkg(1)": ("man1", r"dpkg.*\.1\.gz"),
        "systemd(1)": ("man1", r"systemd.*\.1\.gz"),
        "gcloud-instances(1)": ("man1", r"gcloud_(alpha_)?compute_instances_[a-z-]+\.1\.gz"),
    }
    out: dict[str, dict[str, str]] = {}
    for family, (section, regex) in pattern.items():
        folder = MAN / section
        if not folder.is_dir():
            continue
        paths = sorted(p for p in folder.iterdir() if re.fullmatch(regex, p.name) and not p.is_symlink())
        pages = {p.name: t for p in paths if (t := man_page(p)) and len(t.split()) >= 50}
        names = sorted(pages)
        if len(names) > per_family:
            names = sorted(rng.sample(names, per_family))
        if len(names) >= 2:
            out[family] = {f"man:{n}": pages[n] for n in names}
    return out


# ---- API docs: pydoc text of sibling stdlib functions ------------------------------------------------------


def pydoc_families(per_family: int, rng: random.Random) -> dict[str, dict[str, str]]:
    def members(obj, prefix: str, filter_=callable) -> dict[str, object]:
        return {f"{prefix}.{n}": getattr(obj, n) for n in dir(obj)
                if not n.startswith("_") and filter_(getattr(obj, n, None))}
    modules = {"os.path": (os.path, "os.path"), "str": (str, "str"), "bytes": (bytes, "bytes"),
               "list+dict+set": None, "math": (math, "math"), "itertools": (itertools, "itertools"),
               "shutil": (shutil, "shutil"), "os": (os, "os"), "re": (re, "re"), "random": (random, "random"),
               "statistics": (statistics, "statistics"), "pathlib.Path": (pathlib.Path, "pathlib.Path")}
    out: dict[str, dict[str, str]] = {}
    for family, spec in modules.items():
        objs = ({**members(list, "list"), **members(dict, "dict"), **members(set, "set")} if spec is None
                else members(*spec))
        objs = {n: o for n, o in objs.items() if not inspect.isclass(o) and not inspect.ismodule(o)}
        names = sorted(objs)
        if len(names) > per_family:
            names = sorted(rng.sample(names, per_family))
        docs = {}
        for n in names:
            text = pydoc.render_doc(objs[n], title=f"Python Library Documentation: {n} (%s)", renderer=pydoc.plaintext)
            if len(text.split()) >= 12:
                docs[f"pydoc:{n}"] = text
        if len(docs) >= 2:
            out[f"pydoc {family}"] = docs
    return out


# ---- items, copies and the independent distance ------------------------------------------------------------


def draw_items(families: dict[str, dict[str, str]], rng: random.Random) -> list[tuple[str, str, str, str]]:
    """(family, doc, item_id, text): up to 2 sentences of 15-60 words per document, each text once."""
    items, seen = [], set()
    for family, docs in families.items():
        for doc, text in docs.items():
            flat = re.sub(r"\s+", " ", text)
            sentences = [s for s in re.split(r"(?<=[.!?])\s+", flat) if 15 <= len(normalized_words(s)) <= 60]
            for s in rng.sample(sentences, min(2, len(sentences))):
                key = tuple(normalized_words(s))
                if key not in seen:
                    seen.add(key)
                    items.append((family, doc, f"{doc}#{len(items)}", s))
    return items


def edit_words(text: str, k: int, rng: random.Random, vocabulary: list[str]) -> str:
    """`text` with k words edited: each a replacement, an insertion or a deletion at a random position. Only
    tokens that are one word once normalized are replaced or deleted ("e.g." is two), so k edits are k words."""
    ws = text.split()
    for _ in range(k):
        single = [i for i, w in enumerate(ws) if len(normalized_words(w)) == 1]
        op = rng.choice(("replace", "insert", "delete") if single else ("insert",))
        new = rng.choice(vocabulary)
        if op == "replace":
            at = rng.choice(single)
            while normalized_words(new) == normalized_words(ws[at]):
                new = rng.choice(vocabulary)
            ws[at] = new
        elif op == "insert":
            ws.insert(rng.randrange(len(ws) + 1), new)
        else:
            del ws[rng.choice(single)]
    return " ".join(ws)


def edit_kind(text: str, kind: str, rng: random.Random, vocabulary: list[str]) -> str:
    """The earlier bench's edits: share of words replaced/deleted, a sentence inserted, case and punctuation."""
    ws = text.split()
    if kind in ("substitution", "case_punctuation"):
        for at in rng.sample(range(len(ws)), max(1, round((0.10 if kind == "substitution" else 0.05) * len(ws)))):
            ws[at] = rng.choice(vocabulary)
    elif kind == "insertion":
        ws.insert(rng.randrange(1, len(ws)), rng.choice(SENTENCES))
    elif kind == "deletion":
        for at in sorted(rng.sample(range(len(ws)), max(1, round(0.10 * len(ws)))), reverse=True):
            del ws[at]
    out = " ".join(ws)
    return "".join(PUNCTUATION.get(c, c) for c in out.upper()) if kind == "case_punctuation" else out


def closest_span_edits(item: list[str], doc: list[str]) -> int:
    """Fewest word edits turning `item` into some span of `doc`: a second implementation, document-major (one
    column per document word, plain Python over the item), not the detector's item-major numpy lines."""
    col = list(range(len(item) + 1))  # before any document word: i item words all deleted
    best = col[-1]
    for word in doc:
        nxt = [0]  # a span may start at any document word
        for i, w in enumerate(item, start=1):
            nxt.append(min(col[i - 1] + (w != word), col[i] + 1, nxt[i - 1] + 1))
        col = nxt
        best = min(best, col[-1])
    return best


def shares_ngram(item: list[str], doc: list[str], n: int) -> bool:
    """Whether `doc` holds n consecutive words of `item` (all of it when shorter): compared as word tuples."""
    n = min(n, len(item))
    grams = {tuple(item[i:i + n]) for i in range(len(item) - n + 1)}
    return any(tuple(doc[j:j + n]) in grams for j in range(len(doc) - n + 1))


# ---- the evaluation ------------------------------------------------------------------------------------------


def flagged_pairs(index: BenchmarkIndex, docs: dict[str, str]) -> set[tuple[str, str]]:
    return {(m.item_id, doc) for doc, text in docs.items() for m in index.find(text)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-family", type=int, default=25, help="documents sampled per family")
    ap.add_argument("--copies", type=int, default=3, help="edited copies per item and k")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-edit-share", type=_optional_float, default=Decontamination().max_edit_share)
    ap.add_argument("--min-shared-ngrams", type=int, default=Decontamination().min_shared_ngrams)
    ap.add_argument("--min-share", type=_optional_float, default=Decontamination().min_share)
    ap.add_argument("--show", type=int, default=10, help="false flags listed per rule")
    args = ap.parse_args()
    after = Decontamination(max_edit_share=args.max_edit_share, min_shared_ngrams=args.min_shared_ngrams,
                            min_share=args.min_share)
    rules = {"before": BEFORE, "after": after}
    rng = random.Random(args.seed)
    t0 = time.perf_counter()
    families = {**man_families(args.per_family, rng), **pydoc_families(args.per_family, rng)}
    docs = {doc: text for fam in families.values() for doc, text in fam.items()}
    family_of = {doc: fam for fam, fam_docs in families.items() for doc in fam_docs}
    items = draw_items(families, rng)
    if "man:slist.3.gz" in docs:  # the case of issue 38: a sentence of slist(3) against its sibling STAILQ(3)
        items.append(("queue(3)", "man:slist.3.gz", "man:slist.3.gz#issue38", ISSUE_38_ITEM))
    source = {item_id: doc for _, doc, item_id, _ in items}
    item_text = {item_id: text for _, _, item_id, text in items}
    triples = [("eval", item_id, text) for _, _, item_id, text in items]
    indexes = {name: BenchmarkIndex.from_settings(triples, s) for name, s in rules.items()}
    print(f"{len(docs)} documents in {len(families)} families ("
          + ", ".join(f"{f} {len(d)}" for f, d in families.items()) + f"); {len(items)} items of 15-60 words")
    print(f"before: {_describe(BEFORE)}\nafter:  {_describe(after)}")

    # (b) documents that share phrasing: every document against every item not drawn from it
    doc_words = {doc: normalized_words(text) for doc, text in docs.items()}
    distance: dict[tuple[str, str], int] = {}
    print("\n(b) flagged (item, document) pairs, the item's own document left out; a flagged pair is a copy (the")
    print("    document holds the item within 25% of its words edited), a 13-gram overlap (the exact rule, kept as it")
    print("    was), or else a false flag")
    print(f"{'rule':<8}{'pairs':>9}{'flagged':>9}{'copies':>8}{'13-gram':>9}{'false flags':>13}  (same family / other)")
    listed = {}
    for name, index in indexes.items():
        pairs = {(i, d) for i, d in flagged_pairs(index, docs) if source[i] != d}
        copies = overlaps = 0
        false = []
        for item_id, doc in sorted(pairs):
            item = normalized_words(item_text[item_id])
            if (item_id, doc) not in distance:
                distance[(item_id, doc)] = closest_span_edits(item, doc_words[doc])
            if distance[(item_id, doc)] <= 0.25 * len(item):
                copies += 1
            elif shares_ngram(item, doc_words[doc], BEFORE.ngram):
                overlaps += 1
            else:
                false.append((item_id, doc))
        same = sum(family_of[source[i]] == family_of[d] for i, d in false)
        print(f"{name:<8}{len(items) * (len(docs) - 1):>9}{len(pairs):>9}{copies:>8}{overlaps:>9}{len(false):>13}"
              f"  ({same} / {len(false) - same})")
        listed[name] = false
    for name, false in listed.items():
        for item_id, doc in false[:args.show]:
            n = len(normalized_words(item_text[item_id]))
            print(f"  {name} false flag: {doc} for {source[item_id]}: {distance[(item_id, doc)]} of {n} words to "
                  f"edit; item {item_text[item_id][:90]!r}")

    if "man:stailq.3.gz" in docs:
        verdicts = {name: any(m.item_id.endswith("#issue38") for m in index.find(docs["man:stailq.3.gz"]))
                    for name, index in indexes.items()}
        print("  issue 38's item (from slist(3)) in STAILQ(3): "
              + ", ".join(f"{name} {'flagged' if hit else 'not flagged'}" for name, hit in verdicts.items()))

    # (c) edited copies with k words edited, in a document of another family
    vocabulary = sorted({w for text in list(docs.values())[::7] for w in text.split()
                         if w.isalpha() and len(normalized_words(w)) == 1})
    hosts = {fam: [d for d in docs if family_of[d] != fam] for fam in families}
    print(f"\n(c) edited copies found ({args.copies} per item and k, set in a document of another family)")
    print(f"{'k':<8}{'copies':>9}" + "".join(f"{n:>10}" for n in rules) + "   after, by item length 15-19/20-29/30+")
    for k in (1, 2, 3):
        found = Counter()
        by_len: dict[str, list[int]] = {"15-19": [0, 0], "20-29": [0, 0], "30+": [0, 0]}
        n = 0
        for fam, doc, item_id, text in items:
            for _ in range(args.copies):
                host = docs[rng.choice(hosts[fam])].split("\n\n")
                at = len(host) // 2
                copy = "\n\n".join(host[:at] + [edit_words(text, k, rng, vocabulary)] + host[at:])
                n += 1
                length = len(normalized_words(text))
                bucket = by_len["15-19" if length < 20 else "20-29" if length < 30 else "30+"]
                bucket[1] += 1
                for name, index in indexes.items():
                    hit = any(m.item_id == item_id for m in index.find(copy))
                    found[name] += hit
                    bucket[0] += hit and name == "after"
        print(f"{k:<8}{n:>9}" + "".join(f"{found[r] / n:>10.1%}" for r in rules) + "   "
              + " / ".join(f"{f / t:.1%}" if t else "-" for f, t in by_len.values()))

    # the earlier edit kinds, on these items and on the demo benchmark
    demo = list(read_benchmark_file(DEMO_BENCHMARK, "demo_eval", ["question", "answer"], "id"))
    demo_indexes = {name: BenchmarkIndex.from_settings(demo, s) for name, s in rules.items()}
    unrelated = [p for path in sorted(Path("/usr/share/common-licenses").glob("*")) if path.is_file()
                 for p in path.read_text(errors="replace").split("\n\n") if len(p.split()) >= 20]
    print(f"\nearlier edit kinds ({args.copies} copies per item; found: before / after)")
    print(f"{'edit':<18}{'real-text items':>18}{'demo items':>16}")
    for kind in ("verbatim", "substitution", "insertion", "deletion", "case_punctuation"):
        row = []
        for pool, idx in ((items, indexes), ([("demo", None, i, t) for _, i, t in demo], demo_indexes)):
            found, n = Counter(), 0
            for _, _, item_id, text in pool:
                for _ in range(args.copies):
                    copy = text if kind == "verbatim" else edit_kind(text, kind, rng, vocabulary)
                    doc = f"{rng.choice(unrelated)}\n\n{copy}\n\n{rng.choice(unrelated)}"
                    n += 1
                    for name, index in idx.items():
                        found[name] += any(m.item_id == item_id for m in index.find(doc))
            row.append(f"{found['before'] / n:.1%} / {found['after'] / n:.1%}")
        print(f"{kind:<18}{row[0]:>18}{row[1]:>16}")
    flagged = {name: sum(bool(index.find(t)) for t in unrelated) for name, index in demo_indexes.items()}
    print(f"license paragraphs flagged by the demo items: before {flagged['before']}, after {flagged['after']} "
          f"of {len(unrelated)}")
    print(f"\n{time.perf_counter() - t0:.0f} s")


def _optional_float(value: str) -> float | None:
    return None if value.lower() in ("none", "null", "off") else float(value)


def _describe(s: Decontamination) -> str:
    aligned = (f"whole item within {s.max_edit_share:.0%} of its words edited" if s.max_edit_share is not None
               else "no aligned rule")
    share = (f"share of {s.fuzzy_ngram}-grams >= {s.min_share} with >= {s.min_shared_ngrams} of them"
             if s.min_share is not None else "no share rule")
    return f"{s.ngram}-gram; {aligned}; {share}"


if __name__ == "__main__":
    np.seterr(all="ignore")
    main()
