"""A deterministic synthetic web-like corpus of any size, for benchmarks and scale tests (nothing downloaded).

Document i depends only on (seed, i), so any slice can be generated on its own and two runs give the same
bytes. Words are drawn with Zipf frequencies from the English of Python's own documentation (the pydoc topics
shipped with the interpreter). Planted, at fixed rates: exact copies of earlier documents (case and spacing
changed), near copies (a few words changed), boilerplate junk (one line repeated) and documents with an email
address or a phone number — so every curation stage has work to do.

    python -m kiln.curation.synthetic OUT_DIR --documents 100000 [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
from dataclasses import dataclass
from functools import lru_cache
from itertools import accumulate
from pathlib import Path

from tqdm import tqdm

EXACT_COPY, NEAR_COPY, JUNK, PII = 0.04, 0.03, 0.03, 0.02  # shares of documents
FILE_DOCUMENTS = 50_000


@lru_cache(maxsize=1)
def _vocabulary() -> tuple[list[str], list[float]]:
    """Words and their cumulative Zipf weights."""
    from pydoc_data.topics import topics

    counts = Counter(w for text in topics.values() for w in re.findall(r"\b[a-z]{2,12}\b", text))
    words = [w for w, _ in counts.most_common(3000)]
    return words, list(accumulate(1 / (rank + 1) for rank in range(len(words))))


def _clean_text(seed: int, i: int) -> str:
    rng = random.Random(f"{seed}:{i}")
    words, cumulative = _vocabulary()
    paragraphs = []
    for _ in range(rng.randint(2, 5)):
        sentences = []
        for _ in range(rng.randint(3, 6)):
            chosen = rng.choices(words, cum_weights=cumulative, k=rng.randint(8, 18))
            sentences.append(" ".join(chosen).capitalize() + ".")
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


def document(seed: int, i: int) -> dict:
    """Document `i` of the corpus `seed`: {id, text, url}."""
    rng = random.Random(f"{seed}:{i}:kind")
    draw = rng.random()
    text = _clean_text(seed, i)
    if i > 0 and draw < EXACT_COPY:
        original = _clean_text(seed, rng.randrange(i))
        text = "  ".join(original.upper().split(" ")) if rng.random() < 0.5 else original
    elif i > 0 and draw < EXACT_COPY + NEAR_COPY:
        words = _clean_text(seed, rng.randrange(i)).split(" ")
        for k in rng.sample(range(len(words)), max(1, len(words) // 50)):
            words[k] = rng.choice(_vocabulary()[0])
        text = " ".join(words)
    elif draw < EXACT_COPY + NEAR_COPY + JUNK:
        text = "\n".join(["Click here to subscribe and win a prize today."] * rng.randint(20, 60))
    elif draw < EXACT_COPY + NEAR_COPY + JUNK + PII:
        contact = (f"Write to user{i}@example.com for details." if rng.random() < 0.5
                   else f"Call us at (415) 555-{rng.randint(1000, 9999)} for details.")
        text = f"{text} {contact}"
    return {"id": f"syn-{seed}-{i}", "text": text, "url": f"https://site{i % 997}.example.org/page/{i}"}


def write_corpus(out: Path, documents: int, seed: int = 0, file_documents: int = FILE_DOCUMENTS,
                 progress: bool = True) -> list[Path]:
    """JSONL files of `file_documents` documents each under `out` (a source with `kind: jsonl`)."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    with tqdm(total=documents, desc="synthetic corpus", unit="doc", disable=not progress, mininterval=2) as bar:
        for start in range(0, documents, file_documents):
            path = out / f"synthetic-{start // file_documents:05d}.jsonl"
            tmp = path.with_name(f".{path.name}.tmp")
            with open(tmp, "w", encoding="utf-8") as f:
                for i in range(start, min(start + file_documents, documents)):
                    f.write(json.dumps(document(seed, i)) + "\n")
                    bar.update(1)
            tmp.replace(path)
            paths.append(path)
    return paths


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--documents", type=int, default=100_000)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    paths = write_corpus(args.out, args.documents, args.seed)
    print(f"{args.documents:,} documents in {len(paths)} files under {args.out}")


if __name__ == "__main__":
    main()


# ------------------------------------------------------------------------------------ the scale corpus
#
# For bench/scale_bench.py: documents with a realistic length distribution and duplicates planted with known
# Jaccard similarity on the near-dedup shingling (word 5-grams after normalization; the texts' words are already
# normalized: lowercase, no digits, sentence punctuation only). Document i depends only on (seed, i) and is built
# from at most one earlier document, so any slice can be generated alone. Kinds (shares of documents):
#   plain         log-normal words per document (median SCALE_MEDIAN_WORDS, sigma SCALE_SIGMA), Zipf words
#   exact_copy    an earlier plain document, upper-cased or with doubled spaces (exact dedup's normalization
#                 folds both)
#   near_copy     an earlier plain document with runs of words replaced so that the Jaccard of the two shingle
#                 sets is the target (0.95, 0.9 or 0.85): d = round(S (1 - J) / (1 + J)) of its S shingles are
#                 destroyed (a run of m interior words destroys m + 4 and adds as many new ones)
#   shared_block  a hard negative: a contiguous block of 70-100% of document i - 1 (a plain one) inside fresh
#                 words, sized for a target Jaccard of 0.5, 0.6 or 0.65 with it (never above: the fresh words
#                 only add shingles)
#   template      a hard negative: one of SCALE_TEMPLATES site templates (200-400 words, half as header, half
#                 as footer) around a short body of 25-45% of the template's length: two documents of the same
#                 template have Jaccard at most (t - 8) / (t + L1 + L2) < 2/3, and share many LSH buckets

SCALE_RATES = {"exact_copy": 0.03, "near_copy": 0.06, "shared_block": 0.02, "template": 0.01}
NEAR_TARGETS = (0.95, 0.9, 0.85)
SHARED_BLOCK_TARGETS = (0.5, 0.6, 0.65)
SCALE_TEMPLATES = 64
SCALE_MEDIAN_WORDS, SCALE_SIGMA, SCALE_MIN_WORDS, SCALE_MAX_WORDS = 300, 0.8, 20, 20_000
SCALE_SHINGLE = 5
_KIND, _WORDS, _FORMAT, _EDIT, _TEMPLATE = 1, 2, 3, 4, 5  # rng streams per document


@dataclass(frozen=True)
class Planted:
    """What document i of a scale corpus is: its kind, the earlier document it is built from, the target Jaccard
    with that document (near copies and shared blocks), its template (template documents)."""

    i: int
    kind: str
    of: int | None = None
    target: float | None = None
    template: int | None = None


@lru_cache(maxsize=1)
def _zipf_table():
    import numpy as np

    words, cumulative = _vocabulary()
    return words, np.asarray(cumulative)


def _rng(seed: int, i: int, stream: int):
    import numpy as np

    # Philox keyed directly: no seed hashing per document (half the cost of default_rng's), streams independent
    return np.random.Generator(np.random.Philox(key=(seed << 72) | (i << 8) | stream))


def _zipf_words(rng, n: int) -> list[str]:
    import numpy as np

    words, cumulative = _zipf_table()
    picks = np.searchsorted(cumulative, rng.random(n) * cumulative[-1], side="right")
    return [words[k] for k in np.minimum(picks, len(words) - 1)]


def _drawn_kind(seed: int, i: int) -> tuple[str, object]:
    """The kind drawn for document i, and its rng (further draws: the document's parameters)."""
    rng = _rng(seed, i, _KIND)
    u = float(rng.random()) if i > 0 else 1.0
    for kind, rate in SCALE_RATES.items():
        if u < rate:
            return kind, rng
        u -= rate
    return "plain", rng


def _earlier_plain(seed: int, i: int, rng) -> int:
    for _ in range(64):
        j = int(rng.integers(0, i))
        if _drawn_kind(seed, j)[0] == "plain":
            return j
    return 0  # document 0 is always plain


def scale_plan(seed: int, i: int) -> Planted:
    """Document i's kind and parameters (cheap: no text)."""
    kind, rng = _drawn_kind(seed, i)
    if kind == "exact_copy":
        return Planted(i, kind, of=_earlier_plain(seed, i, rng))
    if kind == "near_copy":
        target = NEAR_TARGETS[int(rng.integers(len(NEAR_TARGETS)))]
        return Planted(i, kind, of=_earlier_plain(seed, i, rng), target=target)
    if kind == "shared_block":
        if _drawn_kind(seed, i - 1)[0] != "plain":  # each plain document anchors at most its successor
            return Planted(i, "plain")
        return Planted(i, kind, of=i - 1, target=SHARED_BLOCK_TARGETS[int(rng.integers(len(SHARED_BLOCK_TARGETS)))])
    if kind == "template":
        return Planted(i, kind, template=int(rng.integers(SCALE_TEMPLATES)))
    return Planted(i, "plain")


def _length(rng) -> int:
    import numpy as np

    n = float(np.exp(rng.normal(np.log(SCALE_MEDIAN_WORDS), SCALE_SIGMA)))
    return int(min(max(round(n), SCALE_MIN_WORDS), SCALE_MAX_WORDS))


@lru_cache(maxsize=SCALE_TEMPLATES)
def _template_words(seed: int, k: int) -> tuple[str, ...]:
    rng = _rng(seed, k, _TEMPLATE)  # a stream of its own: no document draws from it
    return tuple(_zipf_words(rng, int(rng.integers(200, 401))))


def shingle_count(words: list[str], n: int = SCALE_SHINGLE) -> int:
    return len({tuple(words[k:k + n]) for k in range(max(len(words) - n + 1, 1))})


def near_copy_words(words: list[str], target: float, rng, n: int = SCALE_SHINGLE) -> list[str]:
    """`words` with runs replaced so that the shingle sets' Jaccard is about `target` (see above): d shingles
    destroyed in runs of about n words, each inside its own slice of the interior (runs n - 1 words apart at
    least, so no shingle touches two runs); a document too short for that gets one run at its start (a run of d
    words there destroys d shingles)."""
    s = shingle_count(words, n)
    d = round(s * (1 - target) / (1 + target))
    out = list(words)

    def replace(k: int) -> None:
        while (w := _zipf_words(rng, 1)[0]) == words[k]:
            pass
        out[k] = w

    interior = len(words) - 2 * (n - 1)
    if d <= 0:
        return out
    if d < n or interior < d:
        for k in range(min(d, len(words))):
            replace(k)
        return out
    runs = max(1, min(round(d / (2 * n - 1)), d // n))
    while True:
        edited = d - (n - 1) * runs  # words replaced, over `runs` runs of at least one word
        sizes = [edited // runs + (1 if r < edited % runs else 0) for r in range(runs)]
        slice_len = interior // runs
        if runs == 1 or max(sizes) + (n - 1) <= slice_len:
            break
        runs -= 1
    for r, m in enumerate(sizes):
        lo = (n - 1) + r * slice_len
        p = lo + int(rng.integers(0, slice_len - m - (n - 1) + 1))
        for k in range(p, p + m):
            replace(k)
    return out


def scale_words(seed: int, i: int) -> list[str]:
    """Document i's words (normalized: what near-dedup shingles) — the text without case and punctuation."""
    plan = scale_plan(seed, i)
    if plan.kind == "exact_copy":
        return scale_words(seed, plan.of)
    if plan.kind == "near_copy":
        return near_copy_words(scale_words(seed, plan.of), plan.target, _rng(seed, i, _EDIT))
    rng = _rng(seed, i, _WORDS)
    if plan.kind == "shared_block":
        anchor = scale_words(seed, plan.of)
        c = max(SCALE_SHINGLE, round(len(anchor) * float(rng.uniform(0.7, 1.0))))
        c = min(c, len(anchor))
        off = int(rng.integers(0, len(anchor) - c + 1))
        fresh = max(10, round(c / plan.target - len(anchor)))
        before = int(rng.integers(0, fresh + 1))
        return _zipf_words(rng, before) + anchor[off:off + c] + _zipf_words(rng, fresh - before)
    if plan.kind == "template":
        t = list(_template_words(seed, plan.template))
        body = _zipf_words(rng, round(len(t) * float(rng.uniform(0.25, 0.45))))
        return t[:len(t) // 2] + body + t[len(t) // 2:]
    return _zipf_words(rng, _length(rng))


def _format(words: list[str], rng) -> str:
    """Sentences of 8-18 words (capitalized, a full stop), paragraphs of 3-6 sentences."""
    lengths = rng.integers(8, 19, size=len(words) // 8 + 1).tolist()
    per_paragraph = rng.integers(3, 7, size=len(words) // 24 + 1).tolist()
    paragraphs, sentences, k, s = [], [], 0, 0
    while k < len(words):
        m = lengths[s]
        s += 1
        sentences.append(" ".join(words[k:k + m]).capitalize() + ".")
        k += m
        if len(sentences) >= per_paragraph[len(paragraphs)]:
            paragraphs.append(" ".join(sentences))
            sentences = []
    if sentences:
        paragraphs.append(" ".join(sentences))
    return "\n\n".join(paragraphs)


def scale_document(seed: int, i: int) -> dict:
    """Document `i` of the scale corpus `seed`: {id, text, url}."""
    plan = scale_plan(seed, i)
    if plan.kind == "exact_copy":
        original = scale_document(seed, plan.of)["text"]
        rng = _rng(seed, i, _FORMAT)
        text = original.upper() if rng.random() < 0.5 else "  ".join(original.split(" "))
    else:
        # A near copy keeps its original's layout (the same sentence and paragraph breaks).
        layout = plan.of if plan.kind == "near_copy" else i
        text = _format(scale_words(seed, i), _rng(seed, layout, _FORMAT))
    return {"id": f"scale-{seed}-{i}", "text": text, "url": f"https://site{i % 997}.example.org/doc/{i}"}


def scale_documents(seed: int, start: int, stop: int):
    """Documents start .. stop - 1 (a slice: the same documents as generated one by one)."""
    for i in range(start, stop):
        yield scale_document(seed, i)


def _write_scale_file(args: tuple[Path, int, int, int]) -> tuple[str, int, int]:
    path, seed, start, stop = args
    tmp = path.with_name(f".{path.name}.tmp")
    chars = 0
    with open(tmp, "w", encoding="utf-8") as f:
        for doc in scale_documents(seed, start, stop):
            chars += len(doc["text"].encode("utf-8"))
            f.write(json.dumps(doc) + "\n")
    tmp.replace(path)
    return str(path), stop - start, chars


def write_scale_corpus(out: Path, documents: int, seed: int = 0, file_documents: int = 10_000,
                       workers: int = 1) -> tuple[list[Path], int]:
    """JSONL files of `file_documents` scale-corpus documents each under `out`, written by `workers`
    processes (one slice per file); returns the files and the UTF-8 bytes of all texts."""
    out.mkdir(parents=True, exist_ok=True)
    jobs = [(out / f"scale-{start // file_documents:05d}.jsonl", seed, start, min(start + file_documents, documents))
            for start in range(0, documents, file_documents)]
    if workers > 1 and len(jobs) > 1:
        from concurrent.futures import ProcessPoolExecutor

        with ProcessPoolExecutor(workers) as pool:
            done = list(pool.map(_write_scale_file, jobs))
    else:
        done = [_write_scale_file(j) for j in jobs]
    return [Path(p) for p, _, _ in done], sum(c for _, _, c in done)
