"""Quality-model throughput: fastText classifier training and scoring, and reference-LM perplexity.

    .venv/bin/python bench/quality_bench.py [--docs 4000] [--presets tiny,small] [--max-tokens 512]
                                            [--demo-store .kiln/data]

Corpus: reference documents are this machine's standard-library docstrings (module, class and function),
junk documents are generated keyword-spam and navigation pages (tests/quality_corpus.py), as many as the
reference ones. Prints, for the machine named first:
- classifier training seconds (cross-fitted: `folds` models plus the final one), cross-validated AUC and model
  size, full (every hash bucket) and quantized (`quality.classifier.quantize_cutoff`); with `--demo-store`, the
  same on the training sample of the classifier `make demo` built (its documents read from the store);
- classifier scoring documents/s on one core (fastText's predict is single-threaded);
- perplexity documents/s with `--max-tokens` tokens per document, on CPU with one thread and with every
  core, for Kiln model presets with random weights (speed does not depend on the weights), and on the
  GPU when there is one.
"""

from __future__ import annotations

import argparse
import ast
import glob
import os
import platform
import shutil
import sys
import sysconfig
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import pyarrow.parquet as pq  # noqa: E402
import torch  # noqa: E402

from kiln.common.config import QualityClassifier  # noqa: E402
from kiln.quality.classifier import MODEL_FILE, SAMPLE_FILE, Example, QualityScorer, train_classifier  # noqa: E402
from kiln.quality.perplexity import ReferenceModel  # noqa: E402
from kiln.tokens.tokenizer import Tokenizer, read_documents  # noqa: E402
from tests.quality_corpus import junk_texts  # noqa: E402
from tests.token_corpus import train_small_tokenizer, write_source  # noqa: E402
from training_jobs.model import ModelConfig, Transformer  # noqa: E402
from training_jobs.settings import ModelSettings  # noqa: E402


def stdlib_docstrings(limit: int) -> list[str]:
    root = Path(sysconfig.get_paths()["stdlib"])
    docs = []
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.parts or "test" in path.parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8", errors="replace"))
        except (SyntaxError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef):
                doc = ast.get_docstring(node, clean=True)
                if doc and len(doc) >= 200:
                    docs.append(doc)
                    if len(docs) >= limit:
                        return docs
    return docs


def compare_sizes(positives: list[Example], negatives: list[Example], settings: QualityClassifier, out: Path) -> None:
    """Train the full and the quantized classifier; print time, cross-validated AUC and model size of each."""
    for name, variant in (("full", settings.model_copy(update={"quantize_cutoff": None})), ("quantized", settings)):
        started = time.perf_counter()
        card = train_classifier(positives, negatives, variant, out / name, progress=False)
        seconds = time.perf_counter() - started
        size = (out / name / MODEL_FILE).stat().st_size / 1e6
        print(f"  classifier {name:<9} (cutoff {variant.quantize_cutoff}): {size:8.2f} MB, cross-validated AUC "
              f"{card.cross_validation['auc']}, {seconds:.1f} s for {variant.folds} folds + final model on "
              f"{card.sample['positive']} + {card.sample['negative']:,} documents ({variant.epochs} epochs, "
              f"{variant.word_ngrams}-grams, dim {variant.dim}, 1 thread)")
        shutil.rmtree(out / name)


def demo_sample(data: Path) -> tuple[list[Example], list[Example]]:
    """The documents of the demo classifier's training sample, read back from the store's deduplicated ones."""
    sample = pq.read_table(data / "quality_classifier" / "_all" / SAMPLE_FILE).to_pylist()
    label = {r["doc_id"]: r["label"] for r in sample}
    found = {d.doc_id: d for d in read_documents(sorted(map(Path, glob.glob(
        f"{data / 'deduplicated_documents'}/**/part-*.parquet", recursive=True))))
             if d.doc_id in label}
    examples = [Example(i, found[i].source, found[i].text) for i in label if i in found]
    return [e for e in examples if label[e.doc_id] == "reference"], [e for e in examples if label[e.doc_id] == "web"]


def rate(n: int, seconds: float) -> str:
    return f"{n / seconds:,.0f} docs/s"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--docs", type=int, default=4000, help="reference documents (and as many junk ones)")
    parser.add_argument("--presets", default="tiny,small", help="Kiln model presets for the perplexity figures")
    parser.add_argument("--max-tokens", type=int, default=512)
    parser.add_argument("--perplexity-docs", type=int, default=256)
    parser.add_argument("--demo-store", help="a store's data folder (e.g. .kiln/data after `make demo`)")
    args = parser.parse_args()
    cores = os.cpu_count() or 1
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else None
    print(f"machine: {platform.processor() or platform.machine()}, {cores} cores, torch {torch.__version__}"
          f"{f', GPU {gpu}' if gpu else ', no GPU'}")

    refs = stdlib_docstrings(args.docs)
    junk = junk_texts(len(refs), seed=0)
    mb = sum(len(t.encode()) for t in refs + junk) / 1e6
    print(f"corpus: {len(refs):,} reference docstrings + {len(junk):,} junk pages, {mb:.1f} MB")
    positives = [Example(f"ref-{i}", "reference", t) for i, t in enumerate(refs)]
    negatives = [Example(f"junk-{i}", "web", t) for i, t in enumerate(junk)]
    settings = QualityClassifier()
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        if args.demo_store:
            print(f"the demo's classifier sample ({args.demo_store}):")
            compare_sizes(*demo_sample(Path(args.demo_store)), settings, tmp / "demo")
        print("this corpus:")
        compare_sizes(positives, negatives, settings, tmp / "full")
        train_classifier(positives, negatives, settings, tmp / "classifier", progress=False)
        scorer = QualityScorer.load(tmp / "classifier")
        texts = [e.text for e in positives + negatives]
        scorer.score(texts[:100])
        started = time.perf_counter()
        scorer.score(texts)
        seconds = time.perf_counter() - started
        print(f"classifier scoring, 1 core: {rate(len(texts), seconds)} ({mb / seconds:.1f} MB/s)")

        tok_dir = train_small_tokenizer(tmp, [write_source(tmp, "reference", refs[:2000], domain="reference")])
        tok = Tokenizer.load(tok_dir)
        long_enough = [t for t in refs if len(tok.encode(t)) >= args.max_tokens]
        sample = (long_enough or refs)[:args.perplexity_docs]
        print(f"perplexity: {len(sample)} documents of >= {args.max_tokens} tokens (first {args.max_tokens} scored)")
        for preset in args.presets.split(","):
            model = Transformer(ModelConfig(**ModelSettings(preset=preset).architecture(tok.vocab_size,
                                                                                       args.max_tokens))).eval()
            targets = [("cpu", 1), ("cpu", cores)] + ([("cuda", None)] if gpu else [])
            for device, threads in targets:
                if threads:
                    torch.set_num_threads(threads)
                reference = ReferenceModel(model.to(device), tok, device, "random")
                reference.perplexities(sample[:8], args.max_tokens, 8)
                if device == "cuda":
                    torch.cuda.synchronize()
                started = time.perf_counter()
                reference.perplexities(sample, args.max_tokens, 32 if device == "cuda" else 8)
                if device == "cuda":
                    torch.cuda.synchronize()
                where = f"cpu, {threads} thread{'s' if threads > 1 else ''}" if device == "cpu" else f"GPU ({gpu})"
                print(f"  {preset} ({model.param_count() / 1e6:.1f}M params), {where}: "
                      f"{rate(len(sample), time.perf_counter() - started)}")
            torch.set_num_threads(cores)


if __name__ == "__main__":
    main()
