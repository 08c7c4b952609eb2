"""Main-content extraction on real pages: word-level precision, recall and F1 of each HTML extractor Kiln has
(`kiln.curation.readers.html.EXTRACTORS`, today's visible-text reader included), and pages per second on one core.

    .venv/bin/python bench/extraction_bench.py [--sets sphinx,texinfo,...] [--limit N] [--per-group 300]
                                               [--extractors trafilatura,resiliparse,visible_text] [--json PATH]

Pages (bench/extraction_pages.py): HTML documentation installed on this machine, each with a gold text taken from
the region its generator marks as the content (Sphinx role=main / articleBody / div.body, by theme; texinfo,
DocBook, gtk-doc, Doxygen, groff, MkDocs, mdBook, rustdoc, Node.js and npm docs by their own markup), and a
wrapped set: real article text (Python's reference topics, man pages) in boilerplate written here (five layouts;
nav bar, cookie banner, breadcrumbs, byline, share buttons, sidebar with ads, related links, comment thread,
footer). Selection is deterministic: each package's pages in SHA-256 order of their path, `--per-group` of them
(0: all), `--limit` per set (0: all). The extractor gets the whole page, as `kiln.curation.readers.html.extract`
runs in the readers; it is never told the marker.

Score: bag-of-words overlap of lowercased `\\w+` tokens (multiset intersection): P = |gold ∩ out| / |out|,
R = |gold ∩ out| / |gold|, as the dragnet benchmark (Peters & Lecocq, "Content Extraction Using Diverse Feature
Sets", WWW 2013) and scrapinghub's article-extraction-benchmark (evaluate.py, with tokens instead of its 4-gram
shingles) do. Bevendorff et al. 2023 score with ROUGE-LSum (order-aware); that is not computed here. Figures are
micro-averaged (sums over pages) and per-page means (a page with no output has recall 0 and no precision). Time is
one process, one thread: pages per CPU-second (process time) and per wall-second.

The goal (issue 35): the chosen extractor at P >= 0.95 and R >= 0.90 (micro, all pages).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import sys
import time
from collections import Counter, defaultdict
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from extraction_pages import MIN_GOLD_WORDS, SETS, Page, pages, words  # noqa: E402

from kiln.curation.readers.html import EXTRACTORS, extract  # noqa: E402

GOAL_P, GOAL_R = 0.95, 0.90
GOLD_RULE = ("gold = visible text of the generator-marked content region (first match per page; see "
             "bench/extraction_pages.py: SPHINX_MARKERS and the *_gold functions), minus script/style/noscript/"
             "template/[hidden]/display:none and minus theme navigation inside it (role=navigation, <nav>, "
             "prev/next bars); block elements separate words; tokens = re.findall(r'\\w+', text.lower()); "
             f"pages whose gold has < {MIN_GOLD_WORDS} words are skipped")


# ================================================================================================ scoring

def overlap(gold: Counter, out: Counter) -> int:
    """Words in both, counted with multiplicity (multiset intersection)."""
    return sum((gold & out).values())


def prf(tp: int, n_out: int, n_gold: int) -> tuple[float | None, float, float]:
    """(precision, recall, F1) from true positives and the sizes of the output and gold bags; precision is None
    when there is no output (the page counts for recall only)."""
    p = tp / n_out if n_out else None
    r = tp / n_gold if n_gold else 1.0
    f = 2 * p * r / (p + r) if p and r else 0.0
    return p, r, f


def _share(missing: Counter, parts: dict[str, Counter]) -> dict[str, float]:
    """Missing words spread over the page parts that hold them, in proportion to each part's count of the word."""
    out: dict[str, float] = defaultdict(float)
    for w, m in missing.items():
        holders = {label: c[w] for label, c in parts.items() if c[w]}
        total = sum(holders.values())
        if not total:
            out["unattributed"] += m
            continue
        for label, c in holders.items():
            out[label] += m * c / total
    return out


class Tally:
    """Sums over pages for one extractor on one group of pages."""

    def __init__(self):
        self.pages = self.none = self.errors = 0
        self.tp = self.n_out = self.n_gold = 0
        self.tp_nt = self.n_gold_nt = 0  # the same with in-page tables of contents taken out of the gold
        self.p_sum = self.r_sum = self.f_sum = 0.0
        self.p_pages = 0
        self.cpu = self.wall = 0.0
        self.bytes = 0
        self.lost = defaultdict(float)  # gold words missed, by page part
        self.extra = defaultdict(float)  # output words not in the gold, by page part

    def add(self, page: Page, out: Counter | None, cpu: float, wall: float, error: bool) -> tuple:
        gold = Counter(words(page.gold))
        out = out or Counter()
        tp, n_out, n_gold = overlap(gold, out), sum(out.values()), sum(gold.values())
        p, r, f = prf(tp, n_out, n_gold)
        self.pages += 1
        self.none += not n_out and not error
        self.errors += error
        self.tp, self.n_out, self.n_gold = self.tp + tp, self.n_out + n_out, self.n_gold + n_gold
        gold_nt = gold - page.inside.get("toc", Counter())
        self.tp_nt += overlap(gold_nt, out)
        self.n_gold_nt += sum(gold_nt.values())
        if p is not None:
            self.p_sum += p
            self.p_pages += 1
        self.r_sum += r
        self.f_sum += f
        self.cpu += cpu
        self.wall += wall
        self.bytes += len(page.html.encode())
        for label, n in _share(gold - out, page.inside).items():
            self.lost[label] += n
        for label, n in _share(out - gold, page.outside).items():
            self.extra[label] += n
        return p, r, f

    def figures(self) -> dict:
        p, r, f = prf(self.tp, self.n_out, self.n_gold)
        p_nt, r_nt, f_nt = prf(self.tp_nt, self.n_out, self.n_gold_nt)
        mp = self.p_sum / self.p_pages if self.p_pages else None
        mr = self.r_sum / self.pages if self.pages else None
        return {
            "pages": self.pages, "no_output": self.none, "errors": self.errors,
            "micro": {"precision": p, "recall": r, "f1": f, "gold_words": self.n_gold, "output_words": self.n_out,
                      "overlap": self.tp},
            # sensitivity check, not the headline: Sphinx toctrees, texinfo menus, DocBook/Doxygen TOCs are link
            # lists the author placed in the page; scored here as if they were navigation (out of the gold)
            "micro_without_toc": {"precision": p_nt, "recall": r_nt, "f1": f_nt, "gold_words": self.n_gold_nt},
            "mean": {"precision": mp, "recall": mr, "f1": self.f_sum / self.pages if self.pages else None},
            "cpu_s": round(self.cpu, 3), "wall_s": round(self.wall, 3),
            "pages_per_cpu_s": self.pages / self.cpu if self.cpu else None,
            "pages_per_wall_s": self.pages / self.wall if self.wall else None,
            "mb_per_cpu_s": self.bytes / 1e6 / self.cpu if self.cpu else None,
            # shares of the gold (recall lost) and of the output (precision lost), by page part
            "recall_lost_by_part": {k: v / self.n_gold for k, v in sorted(self.lost.items(), key=lambda kv: -kv[1])}
            if self.n_gold else {},
            "precision_lost_by_part": {k: v / self.n_out for k, v in sorted(self.extra.items(), key=lambda kv: -kv[1])}
            if self.n_out else {},
        }


# ================================================================================================ running

def run(page_list: list[Page], extractors: tuple[str, ...], worst: int) -> dict:
    by_set: dict[tuple[str, str], Tally] = defaultdict(Tally)
    by_group: dict[tuple[str, str, str], Tally] = defaultdict(Tally)
    total: dict[str, Tally] = defaultdict(Tally)
    real: dict[str, Tally] = defaultdict(Tally)
    scores: dict[str, list] = defaultdict(list)
    for page in page_list:
        for name in extractors:
            error = False
            c0, w0 = time.process_time(), time.perf_counter()
            try:
                got = extract(page.html, name)
            except Exception:  # noqa: BLE001 - a page an extractor rejects scores recall 0; counted as an error
                got, error = None, True
            cpu, wall = time.process_time() - c0, time.perf_counter() - w0
            out = Counter(words(got.text)) if got is not None else None
            tallies = [by_set[name, page.set], by_group[name, page.set, page.group], total[name]]
            tallies += [real[name]] if page.set != "wrapped" else []
            p, r, f = [t.add(page, out, cpu, wall, error) for t in tallies][0]
            scores[name].append((f, r, p, page.set, page.path))
    worst_pages = {name: {s: [{"f1": round(f, 3), "recall": round(r, 3),
                                "precision": None if p is None else round(p, 3), "path": path}
                               for f, r, p, _, path in sorted(x for x in rows if x[3] == s)[:worst]]
                          for s in sorted({x[3] for x in rows})}
                   for name, rows in scores.items()}
    return {
        "overall": {name: t.figures() for name, t in total.items()},
        "overall_real_pages": {name: t.figures() for name, t in real.items()},
        "by_set": {f"{s}/{name}": t.figures() for (name, s), t in by_set.items()},
        "by_group": {f"{s}/{g}/{name}": t.figures() for (name, s, g), t in by_group.items()},
        "worst_pages": worst_pages,
    }


def _f(x: float | None, digits: int = 3) -> str:
    return "   - " if x is None else f"{x:.{digits}f}"


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def report(results: dict, extractors: tuple[str, ...], page_list: list[Page], skipped: Counter,
           markers: Counter) -> None:
    print(f"machine: {_cpu_model()}, {os.cpu_count()} CPUs; Python {platform.python_version()}; trafilatura "
          f"{_version('trafilatura')}, resiliparse {_version('resiliparse')}, lxml {_version('lxml')}")
    print(f"gold: {GOLD_RULE}")
    print("score: bag-of-words P/R/F1 (multiset intersection of tokens); micro = sums over pages, mean = per-page "
          "average (no output: recall 0, no precision); speed = one process, one thread\n")
    per_set = Counter(p.set for p in page_list)
    print(f"pages: {len(page_list)} ({', '.join(f'{s} {n}' for s, n in per_set.items())}); "
          f"real (not wrapped): {len(page_list) - per_set.get('wrapped', 0)}")
    print("gold markers: " + "; ".join(f"{m}: {n}" for m, n in markers.most_common()))
    if skipped:
        print("skipped: " + "; ".join(f"{k}: {n}" for k, n in sorted(skipped.items())))
    header = (f"\n{'set':<10} {'extractor':<13} {'pages':>5}  {'P':>5} {'R':>5} {'F1':>5}  | {'P':>5} {'R':>5} "
              f"{'F1':>5} | {'none':>4} {'err':>3} {'pages/cpu-s':>11} {'cpu s':>7} {'MB/cpu-s':>8}")
    print(f"{'':<31}  {'micro':^17}  | {'mean per page':^17} |")
    print(header.lstrip("\n"))
    rows = [(s, results["by_set"]) for s in SETS if any(p.set == s for p in page_list)]
    rows += [("REAL", None), ("ALL", None)]
    for s, table in rows:
        for name in extractors:
            fig = (table[f"{s}/{name}"] if table is not None else
                   results["overall_real_pages"].get(name) if s == "REAL" else results["overall"][name])
            if not fig:
                continue
            mi, me = fig["micro"], fig["mean"]
            print(f"{s:<10} {name:<13} {fig['pages']:>5}  {_f(mi['precision'])} {_f(mi['recall'])} {_f(mi['f1'])}  | "
                  f"{_f(me['precision'])} {_f(me['recall'])} {_f(me['f1'])} | {fig['no_output']:>4} "
                  f"{fig['errors']:>3} {_f(fig['pages_per_cpu_s'], 1):>11} {fig['cpu_s']:>7.1f} "
                  f"{_f(fig['mb_per_cpu_s'], 2):>8}")
        print()
    print("by package / book (micro P / R per extractor):")
    groups = sorted({(p.set, p.group) for p in page_list}, key=lambda sg: (SETS.index(sg[0]), sg[1]))
    print(f"{'set/group':<36} {'pages':>5}  " + "  ".join(f"{n:>15}" for n in extractors))
    for s, g in groups:
        figs = [results["by_group"][f"{s}/{g}/{n}"] for n in extractors]
        cells = "  ".join(f"{_f(f['micro']['precision'])} / {_f(f['micro']['recall'])}".rjust(15) for f in figs)
        print(f"{s + '/' + g:<36} {figs[0]['pages']:>5}  {cells}")
    print("\nwhere the words go (share of all gold words missed, share of all output words not in the gold, by page "
          "part; proportional attribution of each word to the parts that hold it):")
    for name in extractors:
        for s in [s for s in SETS if any(p.set == s for p in page_list)] + ["ALL"]:
            fig = results["overall"][name] if s == "ALL" else results["by_set"][f"{s}/{name}"]
            lost = ", ".join(f"{k} {v:.3f}" for k, v in list(fig["recall_lost_by_part"].items())[:6])
            extra = ", ".join(f"{k} {v:.3f}" for k, v in list(fig["precision_lost_by_part"].items())[:6])
            print(f"  {name:<13} {s:<8} recall lost: {lost or '-'}\n  {'':<13} {'':<8} precision lost: {extra or '-'}")
    print("\ngoal (micro, all pages): P >= 0.95 and R >= 0.90")
    for name in extractors:
        mi = results["overall"][name]["micro"]
        ok = (mi["precision"] or 0) >= GOAL_P and mi["recall"] >= GOAL_R
        nt = results["overall"][name]["micro_without_toc"]
        print(f"  {name:<13} P {_f(mi['precision'])}  R {_f(mi['recall'])}  {'meets' if ok else 'misses'} the goal"
              f"   (in-page TOCs out of the gold: P {_f(nt['precision'])}  R {_f(nt['recall'])})")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--sets", default=",".join(SETS), help=f"comma-separated, from {', '.join(SETS)}")
    ap.add_argument("--limit", type=int, default=0, help="pages per set at most (0: all)")
    ap.add_argument("--per-group", type=int, default=300, help="pages per package / book at most (0: all)")
    ap.add_argument("--extractors", default=",".join(EXTRACTORS))
    ap.add_argument("--worst", type=int, default=5, help="lowest-F1 pages listed per set in the JSON")
    ap.add_argument("--json", type=Path, help="write every figure to this file")
    args = ap.parse_args(argv)
    sets = tuple(s.strip() for s in args.sets.split(",") if s.strip())
    extractors = tuple(e.strip() for e in args.extractors.split(",") if e.strip())
    if bad := [s for s in sets if s not in SETS]:
        ap.error(f"--sets: unknown set(s) {', '.join(bad)}; choose from {', '.join(SETS)}")
    if bad := [e for e in extractors if e not in EXTRACTORS]:
        ap.error(f"--extractors: unknown extractor(s) {', '.join(bad)}; choose from {', '.join(EXTRACTORS)}")
    skipped: Counter = Counter()
    t0 = time.perf_counter()
    page_list = list(pages(sets, args.limit, args.per_group, skipped))
    build_s = time.perf_counter() - t0
    if not page_list:
        print(f"no pages found for sets {', '.join(sets)}: install the packages listed in bench/extraction_pages.py",
              file=sys.stderr)
        return 1
    markers = Counter(f"{p.set}: {p.marker}" for p in page_list)
    results = run(page_list, extractors, args.worst)
    report(results, extractors, page_list, skipped, markers)
    print(f"\n(page sets built in {build_s:.1f} s, not counted in the speed figures)")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({
            "args": {"sets": sets, "limit": args.limit, "per_group": args.per_group, "extractors": extractors},
            "machine": {"cpu": _cpu_model(), "cpus": os.cpu_count(), "python": platform.python_version()},
            "versions": {d: _version(d) for d in ("trafilatura", "resiliparse", "lxml")},
            "gold_rule": GOLD_RULE, "tokens": r"re.findall(r'\w+', text.lower())",
            "pages": [{"set": p.set, "group": p.group, "path": p.path, "marker": p.marker,
                       "gold_words": len(words(p.gold))} for p in page_list],
            "skipped": dict(skipped), "markers": dict(markers), **results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
