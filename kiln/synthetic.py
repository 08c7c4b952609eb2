"""A deterministic synthetic web-like corpus of any size, for benchmarks and scale tests (nothing downloaded).

Document i depends only on (seed, i), so any slice can be generated on its own and two runs give the same
bytes. Words are drawn with Zipf frequencies from the English of Python's own documentation (the pydoc topics
shipped with the interpreter). Planted, at fixed rates: exact copies of earlier documents (case and spacing
changed), near copies (a few words changed), boilerplate junk (one line repeated) and documents with an email
address or a phone number — so every curation stage has work to do.

    python -m kiln.synthetic OUT_DIR --documents 100000 [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import random
import re
from collections import Counter
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
