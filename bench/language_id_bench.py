"""Language identification on this machine's manual pages: py3langid (Kiln's `language` step) against lingua.

    .venv/bin/python bench/language_id_bench.py [--per-language 60] [--english 120] [--lingua-path DIR]

Documents: translated manual pages of every language with at least 40 pages installed (the `multilingual` builtin
corpus, its directory's language as the label; pages left mostly untranslated, half of their word 5-grams in the
English page, are left out as bench/multilingual_filter_eval.py does), and English pages from /usr/share/man/man1-8,
each read as the language step reads it (its first 4,000 characters), and as 200-character snippets of its running
text (short web pages, captions).

Identifiers, both offline with their models in the wheel: py3langid (97 languages, Kiln's batched form
kiln.curation.filters.language.identify_many) and lingua-language-detector (75 languages; all of them loaded,
high-accuracy mode and low-accuracy mode). lingua is not a Kiln dependency (a 96 MB wheel): install it where you
like (`pip install --target DIR lingua-language-detector==2.1.1`) and pass `--lingua-path DIR`.

Prints accuracy per language and in all, and documents per second on one core (model loading apart).
"""

from __future__ import annotations

import argparse
import hashlib
import random
import sys
import time
from collections import defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from kiln.curation.filters.language import identify_many  # noqa: E402
from kiln.curation.readers.builtin import (MAN_ROOT, ManPageError, man_language, render_man_page,  # noqa: E402
                                           translated_man_pages)
from multilingual_filter_eval import MIN_PAGES, UNTRANSLATED, english_share  # noqa: E402

MAX_CHARS = 4000  # what the language step reads of a document
SNIPPET = 200


def labelled_pages(per_language: int, english: int) -> list[tuple[str, str]]:
    """(language, text) of translated pages (mostly translated ones) and English pages."""
    listed = defaultdict(list)
    for _locator, directory, section, page, path in translated_man_pages():
        listed[man_language(directory)].append((section, page, path))
    out = []
    for lang, items in sorted(listed.items()):
        if len(items) < MIN_PAGES:
            continue
        taken = 0
        for section, page, path in items:
            if taken == per_language:
                break
            try:
                text = render_man_page(path)
            except ManPageError:
                continue
            if english_share(text, section, page) < UNTRANSLATED:
                out.append((lang, text))
                taken += 1
    english_pages = sorted((p for d in sorted(MAN_ROOT.glob("man[1-8]")) for p in d.iterdir() if p.is_file()),
                           key=lambda p: hashlib.blake2b(str(p).encode(), digest_size=8).digest())
    taken = 0
    for path in english_pages:
        if taken == english:
            break
        try:
            text = render_man_page(path)
        except ManPageError:
            continue
        if len(text) >= 1000:
            out.append(("en", text))
            taken += 1
    return out


def snippet(rng: random.Random, text: str) -> str:
    """SNIPPET characters of the page's running text (its indented lines joined)."""
    body = " ".join(line.strip() for line in text.splitlines() if line.startswith("       ") and line.strip())
    start = rng.randrange(max(1, len(body) - SNIPPET))
    return body[start:start + SNIPPET]


def lingua_identifiers(path: str | None) -> dict:
    if path:
        sys.path.insert(0, path)
    try:
        from lingua import LanguageDetectorBuilder
    except ImportError:
        print("lingua-language-detector is not installed: its columns are left out (see the docstring)\n")
        return {}
    t0 = time.perf_counter()
    high = LanguageDetectorBuilder.from_all_languages().with_preloaded_language_models().build()
    low = LanguageDetectorBuilder.from_all_languages().with_low_accuracy_mode().with_preloaded_language_models().build()
    print(f"lingua: models loaded in {time.perf_counter() - t0:.1f}s")

    def using(detector):
        def identify(texts: list[str]) -> list[str]:
            out = []
            for t in texts:
                lang = detector.detect_language_of(t)
                out.append(lang.iso_code_639_1.name.lower() if lang is not None else "?")
            return out
        return identify

    return {"lingua (high accuracy)": using(high), "lingua (low accuracy)": using(low)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--per-language", type=int, default=60)
    ap.add_argument("--english", type=int, default=120)
    ap.add_argument("--lingua-path", default=None, help="where lingua-language-detector is installed (--target)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    t0 = time.perf_counter()
    pages = labelled_pages(args.per_language, args.english)
    rng = random.Random(args.seed)
    sets = {"document (first 4,000 chars)": [(lang, text[:MAX_CHARS]) for lang, text in pages],
            f"snippet ({SNIPPET} chars)": [(lang, snippet(rng, text)) for lang, text in pages]}
    languages = sorted({lang for lang, _ in pages})
    print(f"{len(pages)} pages in {len(languages)} languages, rendered in {time.perf_counter() - t0:.0f}s\n")

    identifiers = {"py3langid (Kiln)": lambda texts: [lang for lang, _ in identify_many(texts, MAX_CHARS)]}
    identifiers |= lingua_identifiers(args.lingua_path)
    for set_name, items in sets.items():
        texts = [t for _, t in items]
        print(f"== {set_name}")
        print(f"{'identifier':<24} {'docs/s':>8} {'all':>6}  " + " ".join(f"{lang:>5}" for lang in languages))
        for name, identify in identifiers.items():
            identify(texts[:20])  # warm-up
            t1 = time.perf_counter()
            guesses = identify(texts)
            rate = len(texts) / (time.perf_counter() - t1)
            right = defaultdict(list)
            for (lang, _), guess in zip(items, guesses):
                right[lang].append(guess == lang)
            overall = sum(map(sum, right.values())) / len(items)
            print(f"{name:<24} {rate:>8,.0f} {overall:>6.1%}  "
                  + " ".join(f"{sum(right[lang]) / len(right[lang]):>5.0%}" for lang in languages))
        print()
    print("pages per language: " + ", ".join(f"{lang} {sum(1 for x, _ in pages if x == lang)}" for lang in languages))
    return 0


if __name__ == "__main__":
    sys.exit(main())
