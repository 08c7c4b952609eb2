"""What redacting `url` and `meta` (kiln.curation.pii.fields) adds to the filter stage, per 1000 documents.

    .venv/bin/python bench/field_redaction_bench.py [--documents 5000] [--repeats 5]

Documents from kiln.curation.synthetic (deterministic web-like prose), each with a URL (half with a query
string, one in ten with an e-mail address in it) and a meta of the shape a JSONL reader gives (the native id, the
locator, two extra fields, one nested). Timed in this process (one core), best of --repeats passes:
- the `prose` profile of configs/default.yaml with `normalize` first and `pii` last, on the texts (`run_steps`);
- `redact_fields` on the same documents, with the `pii` step's redactor.
The figures are for the machine it runs on; quote them with the machine named.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from kiln.common.config import StepSpec, load_config
from kiln.common.stats import StageStats
from kiln.curation.documents import Document
from kiln.curation.filters.registry import build_step
from kiln.curation.pii.fields import redact_fields, step_redactor
from kiln.curation.pii.redaction import PiiRedaction
from kiln.curation.pipeline import run_steps
from kiln.curation.synthetic import document

CONFIG = Path(__file__).resolve().parents[1] / "configs" / "default.yaml"


def corpus(n: int) -> list[Document]:
    docs = []
    for i in range(n):
        r = document(0, i)
        query = (f"?utm_source=feed&page={i % 7}" if i % 2 else "") + (f"&email=reader{i}@fastmail.fm" if i % 10 == 1
                                                                        else "")
        docs.append(Document(r["id"], "web", r["text"], url=r["url"] + query,
                             meta={"id": r["id"], "locator": f"a.jsonl#L{i + 1}", "lang": "en",
                                   "crawl": {"date": "2024-05-01", "tags": ["news", f"batch-{i % 13}"]}}))
    return docs


def best(fn, n: int, repeats: int) -> float:
    """Best seconds per 1000 documents over `repeats` passes, on fresh copies (both stages rewrite in place)."""
    times = []
    for _ in range(repeats):
        docs = corpus(n)
        start = time.perf_counter()
        for k in range(0, n, 1000):
            fn(docs[k:k + 1000])
        times.append(time.perf_counter() - start)
    return min(times) / n * 1000


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--documents", type=int, default=5000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    config = load_config(CONFIG)
    specs = [StepSpec(step="normalize", params=config.curation.normalize), *config.profiles["prose"],
             StepSpec(step="pii", params=config.curation.pii)]  # as profile_steps builds them for a prose source
    steps = [build_step(s.step, s.params) for s in specs]
    pii = next(s for s in steps if isinstance(s, PiiRedaction))
    redact_texts = step_redactor(pii)
    text = best(lambda docs: run_steps(docs, steps, StageStats(), 3), args.documents, args.repeats)
    fields = best(lambda docs: redact_fields(docs, redact_texts), args.documents, args.repeats)
    print(f"{args.documents:,} documents, best of {args.repeats}, one core")
    print(f"filter steps (prose profile, normalize .. pii): {text * 1000:8.1f} ms per 1000 documents")
    print(f"url + meta redaction (redact_fields):          {fields * 1000:8.1f} ms per 1000 documents "
          f"(+{fields / text:.1%} of the steps)")


if __name__ == "__main__":
    main()
