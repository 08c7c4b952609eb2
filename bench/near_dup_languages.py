"""Near-duplicate detection per language on real text from this machine, with planted near-copies of known Jaccard.

    .venv/bin/python bench/near_dup_languages.py [--docs 300] [--out docs/bench/near_dup_languages.txt]

Documents are the translated manual pages Debian installs under /usr/share/man/{zh_CN,ja,ru,de,fr}/ and the English
ones under /usr/share/man/man{1,5,8}/ (the control), rendered by the `multilingual` builtin corpus's renderer
(`kiln.curation.readers.builtin.render_man_page`), cut to at most 12,000 characters at a paragraph break. Each
language gets up to --docs pages of at least 800 characters and, for each, one or two edited copies: word edits in
spaced scripts, character edits in Chinese and Japanese (substitutions, insertions, deletions, drawn from the
language's own text), and in a third of the copies two paragraphs swapped, edited until the copy's Jaccard with its
original reaches a random target (two thirds in [0.8, 1], one third in [0.6, 0.8): pairs that must not be found).

The Jaccard is computed exactly by this script's own implementation of the shingles Kiln documents (no hashing, no
Kiln code): words lowercased with ASCII digits as 0, punctuation stripped, a combining mark inside its word, every
Han / kana / Thai ... character (told by its Unicode name) a word of its own; a shingle runs from each word to the
first that brings it to 5 words' weight, a no-space character weighing 5/8 of a word (so 5 words or 8 characters).

Then the real near-dedup chain as `dedup_index` runs it under configs/default.yaml's dedup.near: signature parts
(`signing.compute_signatures`), LSH buckets, exact verification and decisions (`buckets.decide_distributed`), one run
per language. Prints per language: planted pairs at J >= 0.8 and the share caught (not both survive), planted
pairs below 0.8 wrongly paired, and precision (found pairs, original or planted, whose exact Jaccard is >= 0.8);
`before` is the same run with Kiln's word split as it was before `kiln.common.text_units` (a switch in this script
only: the old regexes and the fast signer's plain path), `after` is the code as it is.
"""

from __future__ import annotations

import argparse
import platform
import random
import sys
import tempfile
import time
import unicodedata
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from kiln.common.config import load_config  # noqa: E402
from kiln.curation.documents import DOCUMENT_SCHEMA  # noqa: E402
from kiln.curation.readers.builtin import MAN_ROOT, ManPageError, render_man_page  # noqa: E402
from kiln.dedup.buckets import decide_distributed, read_decisions  # noqa: E402
from kiln.dedup.signing import compute_signatures, signature_groups  # noqa: E402
from kiln.engine import SERIAL  # noqa: E402

LANGUAGES = {"zh": ["zh_CN"], "ja": ["ja"], "ru": ["ru"], "de": ["de"], "fr": ["fr"], "en": ["man1", "man5", "man8"]}
NO_SPACE_NAMES = ("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH", "HIRAGANA", "KATAKANA", "HALFWIDTH KATAKANA",
                  "IDEOGRAPHIC", "THAI", "LAO", "KHMER", "MYANMAR", "TIBETAN")
MIN_CHARS, MAX_CHARS = 800, 12_000
N, THRESHOLD = 5, 0.8


# ---------------------------------------------------------------------------------------- reference shingles

def _kind(ch: str, cache: dict = {}) -> str:  # noqa: B006 (a per-process memo)
    k = cache.get(ch)
    if k is None:
        if ch.isalnum() or ch == "_":
            k = "unit" if unicodedata.name(ch, "").startswith(NO_SPACE_NAMES) else "word"
        elif unicodedata.category(ch).startswith("M"):
            k = "mark"
        else:
            k = "other"
        cache[ch] = k
    return k


def units(text: str) -> list[tuple[int, int, bool]]:
    """(start, end, is a no-space character) of every word, by a loop over characters."""
    out: list[list] = []
    open_word = False  # the last character belongs to a word that may continue
    for i, ch in enumerate(text):
        k = _kind(ch)
        if k == "word":
            if open_word and not out[-1][2]:
                out[-1][1] = i + 1
            else:
                out.append([i, i + 1, False])
            open_word = True
        elif k == "unit":
            out.append([i, i + 1, True])
            open_word = True
        elif k == "mark" and open_word:
            out[-1][1] = i + 1
        else:
            open_word = False
    return [tuple(u) for u in out]


def normalized(text: str) -> list[tuple[str, bool]]:
    digits = str.maketrans("0123456789", "0000000000")
    return [(text[a:b].lower().translate(digits), unit) for a, b, unit in units(text)]


def shingles(text: str) -> set[tuple[str, ...]]:
    ws = normalized(text)
    out = set()
    for i in range(len(ws)):
        weight = 0
        for j in range(i, len(ws)):
            weight += 5 if ws[j][1] else 8
            if weight >= 8 * N:
                out.add(tuple(w for w, _ in ws[i:j + 1]))
                break
    return out or {tuple(w for w, _ in ws)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b) if a or b else 1.0


# ---------------------------------------------------------------------------------------- corpus and copies

def pages(lang: str, limit: int) -> list[str]:
    paths = sorted(p for d in LANGUAGES[lang] for p in (MAN_ROOT / d).rglob("*") if p.is_file() and not p.is_symlink())
    random.Random(lang).shuffle(paths)
    out = []
    for path in paths:
        try:
            text = render_man_page(path)
        except ManPageError:
            continue
        if len(text) > MAX_CHARS:
            cut = text.rfind("\n\n", 0, MAX_CHARS)
            text = text[:cut if cut > MIN_CHARS else MAX_CHARS]
        if len(text) >= MIN_CHARS:
            out.append(text)
        if len(out) >= limit:
            break
    return out


def edited(text: str, k: int, plan: list[tuple[str, float, str]], swap: tuple[float, float] | None) -> str:
    """`text` with the first k edits of `plan` (kind, position as a share of the words, inserted/substituted word)
    and, if `swap`, two paragraphs swapped first."""
    if swap:
        paras = text.split("\n\n")
        if len(paras) >= 3:
            i = int(swap[0] * (len(paras) - 1))
            j = min(len(paras) - 1, i + 1)
            paras[i], paras[j] = paras[j], paras[i]
            text = "\n\n".join(paras)
    us = units(text)
    edits = {}
    for kind, where, word in plan[:k]:
        edits.setdefault(int(where * len(us)), (kind, word))
    out, at = [], 0
    for idx, (a, b, unit) in enumerate(us):
        if idx not in edits:
            continue
        kind, word = edits[idx]
        out.append(text[at:a])
        sep = "" if unit else " "
        if kind == "sub":
            out.append(word)
        elif kind == "ins":
            out.append(text[a:b] + sep + word)
        at = b  # "del": the word is left out
    out.append(text[at:])
    return "".join(out)


def plant(text: str, target: float, pool: list[str], rng: random.Random) -> tuple[str, float]:
    """An edited copy of `text` whose exact Jaccard with it is the largest at or below `target` along one random
    edit plan (bisection over the number of edits)."""
    base = shingles(text)
    plan = [(rng.choice(("sub", "ins", "del")), rng.random(), rng.choice(pool)) for _ in range(len(units(text)))]
    swap = (rng.random(), rng.random()) if rng.random() < 1 / 3 else None
    lo, hi = 0, len(plan)
    while lo < hi:
        mid = (lo + hi) // 2
        if jaccard(base, shingles(edited(text, mid, plan, swap))) > target:
            lo = mid + 1
        else:
            hi = mid
    copy = edited(text, lo, plan, swap)
    return copy, jaccard(base, shingles(copy))


# ---------------------------------------------------------------------------------------- Kiln's chain

def kiln_pairs(docs: list[str], near, tmp: Path) -> tuple[list[tuple[int, int]], set[int]]:
    """Found pairs (removed, the accepted document it matches) and the documents kept, from the real signature +
    bucket chain."""
    ids = [f"d{i:06d}" for i in range(len(docs))]
    path = tmp / "part-00000.parquet"
    pq.write_table(pa.table({"doc_id": ids, "source": ["bench"] * len(docs), "text": pa.array(docs, pa.large_string()),
                             "url": [None] * len(docs), "license": [None] * len(docs), "meta": ["{}"] * len(docs)},
                            schema=DOCUMENT_SCHEMA), path)
    groups = signature_groups([path], near.rows_per_part)
    sig_parts = [tmp / f"sig-{i:05d}.parquet" for i in range(len(groups))]
    compute_signatures(groups, sig_parts, near, engine=SERIAL, progress=False)
    decide_distributed(sig_parts, {"bench": (1, 0)}, [], tmp / "work", tmp / "out", near, "bench", engine=SERIAL,
                       max_bucket=near.max_bucket)
    rows = read_decisions(tmp / "out").to_pylist()
    index = {d: i for i, d in enumerate(ids)}
    found = [(index[r["doc_id"]], index[r["duplicate_of"]]) for r in rows if r["duplicate_of"]]
    kept = {index[r["doc_id"]] for r in rows if r["status"] == "kept"}
    return found, kept


class OldWordSplit:
    """Kiln's word split before text_units, for the `before` column: the old regexes everywhere (`plain` always true)
    and the fast signer's plain path (its code point map without the no-space and mark flags)."""

    def __enter__(self):
        from kiln.common import text_units
        from kiln.dedup import fast_minhash
        self.saved = text_units.plain, fast_minhash._code_point_map
        old_map = fast_minhash._code_point_map
        text_units.plain = lambda text: True
        fast_minhash._code_point_map = lambda *a: old_map(*a) & fast_minhash._CODE_BITS
        return self

    def __exit__(self, *exc):
        from kiln.common import text_units
        from kiln.dedup import fast_minhash
        text_units.plain, fast_minhash._code_point_map = self.saved


def evaluate(docs: list[str], pairs: list[tuple[int, int, float]], near, shingle_sets: list[set]) -> dict:
    with tempfile.TemporaryDirectory() as tmp:
        found, kept = kiln_pairs(docs, near, Path(tmp))
    positives = [(a, b) for a, b, j in pairs if j >= THRESHOLD]
    negatives = [(a, b) for a, b, j in pairs if j < THRESHOLD]
    # Caught: not both survive (the copy is removed, or its original is, as a copy of another accepted page that the
    # copy does not match: greedy decisions never compare a document with a removed one).
    caught = sum(not (a in kept and b in kept) for a, b in positives)
    found_set = set(found)
    merged = sum((b, a) in found_set or (a, b) in found_set for a, b in negatives)
    true_found = sum(jaccard(shingle_sets[a], shingle_sets[b]) >= THRESHOLD for a, b in found)
    return {"positives": len(positives), "caught": caught, "negatives": len(negatives), "merged": merged,
            "found": len(found), "true_found": true_found}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--docs", type=int, default=300, help="pages per language")
    ap.add_argument("--languages", default=",".join(LANGUAGES))
    ap.add_argument("--config", default="configs/default.yaml")
    ap.add_argument("--out", default=None, help="also write the report here")
    args = ap.parse_args()
    near = load_config(args.config).dedup.near
    lines = [f"machine: {platform.node() or '?'} ({platform.processor() or platform.machine()}), Python "
             f"{platform.python_version()}; dedup.near from {args.config}: shingle_size {near.shingle_size}, "
             f"num_perm {near.num_perm}, threshold {near.threshold}, scheme {near.scheme}",
             f"{'lang':<5}{'pages':>6}{'copies':>7}{'pairs J>=0.8':>13}{'caught before':>15}{'caught after':>14}"
             f"{'J<0.8 merged b/a':>18}{'precision before':>18}{'precision after':>17}"]
    print("\n".join(lines), flush=True)
    for lang in args.languages.split(","):
        t0 = time.perf_counter()
        originals = pages(lang, args.docs)
        pool = [t[a:b] for t in originals for a, b, _ in units(t)]
        rng = random.Random(f"near-dup {lang}")
        docs, pairs = list(originals), []
        copies_each = 2 if len(originals) < args.docs else 1
        for i, text in enumerate(originals):
            for _ in range(copies_each):
                target = rng.uniform(0.8, 1.0) if rng.random() < 2 / 3 else rng.uniform(0.6, 0.8)
                copy, j = plant(text, target, pool, rng)
                pairs.append((i, len(docs), j))
                docs.append(copy)
        shingle_sets = [shingles(t) for t in docs]
        with OldWordSplit():
            before = evaluate(docs, pairs, near, shingle_sets)
        after = evaluate(docs, pairs, near, shingle_sets)

        def share(r: dict) -> str:
            return f"{r['caught'] / max(r['positives'], 1):.2%}"

        def precision(r: dict) -> str:
            return f"{r['true_found'] / r['found']:.4f} ({r['found']})" if r["found"] else "- (0)"

        line = (f"{lang:<5}{len(originals):>6}{len(docs) - len(originals):>7}{after['positives']:>13}"
                f"{share(before):>15}{share(after):>14}{before['merged']:>9}/{after['merged']:<8}"
                f"{precision(before):>18}{precision(after):>17}")
        lines.append(line)
        print(line + f"   [{time.perf_counter() - t0:.0f} s]", flush=True)
    lines += ["caught: planted pairs with exact J >= 0.8 of which not both documents survive near-dedup; J<0.8 merged:",
              "planted pairs below 0.8 that near-dedup paired (before/after); precision: found pairs (a removed document",
              "and the accepted one it names) whose exact Jaccard is >= 0.8, with the number found. Exact Jaccard: this",
              "script's own shingles (5 words, or 8 characters of Chinese/Japanese), not Kiln's."]
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
