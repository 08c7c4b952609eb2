"""The per-part stages (intake, filter, exact dedup, MinHash signatures), the near-dup decisions, and the stages
after them that run on the engine (token shards: a tokenize task per curated part; the quality classifier: its
cross-fitted fold fits and final fit) on a synthetic corpus, on a given engine, and a fingerprint of everything
they wrote — to compare engines byte for byte.

Also a driver process for a Ray cluster: `python -m tests.engine_stages STORE CORPUS [stages|near]` runs the
per-part stages (default) or the near-dup stage on the cluster in RAY_ADDRESS (tests start it so that the cluster can
be disturbed while the driver runs).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
from pathlib import Path

from kiln.common.config import (
    Fim,
    Mixture,
    NearDedup,
    ProjectConfig,
    QualityClassifier,
    ShardSettings,
    TokenizerSettings,
    parse_config,
)
from kiln.common.manifest import MANIFEST_NAME
from kiln.common.storage import Store
from kiln.curation.exact_dedup import HashSource, exact_dedup
from kiln.curation.pipeline import filter_documents, ingest, profile_steps
from kiln.dedup.buckets import decide_distributed
from kiln.dedup.signing import compute_signatures
from kiln.engine import SERIAL, Engine, RayEngine
from kiln.quality.classifier import CARD_FILE, Example, train_classifier
from kiln.tokens.mixture import SourceParts
from kiln.tokens.shard_writer import write_token_shards
from kiln.tokens.tokenizer import draw_training_sample, read_documents, train_tokenizer
from tests.store_files import published_files

SOURCES = ("web", "mirror")
NEAR = NearDedup()  # mirror holds a slice of web's documents again: cross-source duplicates


def corpus_config(corpus: Path, rows_per_part: int = 50) -> ProjectConfig:
    return parse_config({
        "sources": [{"name": name, "kind": "jsonl", "path": str(corpus / name), "license": "CC-BY", "domain": "web",
                     "quality_tier": tier, "profile": "prose"} for name, tier in zip(SOURCES, (3, 2))],
        "profiles": {"prose": ["url_blocklist", "language", "gopher_repetition", "gopher_quality", "c4"]},
        "reading": {"rows_per_part": rows_per_part},
    })


REPEATED_IDS = 20  # web's last file repeats the first records of its first file: ids seen before, quarantined


def write_corpus(corpus: Path, documents: int) -> None:
    from kiln.curation.synthetic import write_corpus as synthetic

    files = synthetic(corpus / "web", documents, seed=1, file_documents=max(1, documents // 3), progress=False)
    first = files[0].read_text(encoding="utf-8").splitlines(keepends=True)
    (corpus / "web" / "synthetic-99999.jsonl").write_text("".join(first[:REPEATED_IDS]), encoding="utf-8")
    synthetic(corpus / "mirror", documents // 4, seed=1, progress=False)  # the first quarter of web, again


def ingest_all(config: ProjectConfig, store: Store, engine: Engine = SERIAL) -> None:
    for source in config.sources:
        with store.staging("raw", source.name) as writer:
            stats = ingest(source, config.reading, writer, engine, progress=False)
            writer.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())


def run_stages(config: ProjectConfig, store: Store, engine: Engine) -> None:
    """raw (already ingested) → filtered → curated → signatures, every stage on `engine`."""
    filter_stage(config, store, engine)
    exact_and_signature_stages(config, store, engine)


def filter_stage(config: ProjectConfig, store: Store, engine: Engine) -> None:
    for source in config.sources:
        with store.staging("filtered", source.name) as writer:
            stats = filter_documents(store.files("raw", source.name, "documents"), profile_steps(config, source.name),
                                     config.curation.exact_dedup, writer, engine, progress=False)
            writer.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())


def exact_and_signature_stages(config: ProjectConfig, store: Store, engine: Engine) -> None:
    """filtered (already written) → curated (exact dedup's shuffle) → signatures."""
    hashed = [HashSource(s.name, s.quality_tier, tuple(map(str, store.files("filtered", s.name, "documents"))))
              for s in config.sources]
    for i, source in enumerate(config.sources):
        with store.staging("curated", source.name) as writer:
            stats = exact_dedup(hashed, i, writer, writer.scratch("shuffle"), engine, progress=False)
            writer.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())
        with store.staging("signatures", source.name) as writer:
            inputs = store.files("curated", source.name, "documents")  # a signature part each: many small tasks
            compute_signatures([[p] for p in inputs], [writer.next_path("signatures") for _ in inputs], NEAR, None,
                               engine, progress=False)
            writer.commit(code_version="t", config={}, inputs={}, counts={})


# Tiny settings: the comparison is of bytes, not of quality. FIM on mirror (prose, but FIM's per-document draws run
# in the tokenize tasks), and weights that repeat mirror and subsample web (selection by the tasks' order keys).
TOKENIZER = TokenizerSettings(vocab_size=400, sample_chars=200_000, num_threads=1)
SHARDS = ShardSettings(seq_len=32, tokens_per_shard=8192, val_fraction=0.1, seed=5,
                       fim=Fim(rate=0.5, spm_rate=0.5, sources=["mirror"]))
MIXTURE = Mixture(weights={"web": 0.6, "mirror": 0.4})
# fastText's input matrix ((words + 2M buckets) x dim floats) stays above glibc's largest mmap threshold (32 MiB):
# with thread 1 fastText seems to initialize only part of it, the rest being what the allocation held (mmap: zeros).
# Far smaller matrices (10k-500k buckets x 16) gave fits that differed from run to run or failed with NaN; 2M x 8
# and 2M x 64 gave the same bytes in 6 of 6 fits. 2M x 16 floats: 128 MB.
CLASSIFIER = QualityClassifier(folds=3, epochs=5, dim=16, quantize_cutoff=1_000)  # 4 fits of about a second in all
DOWNSTREAM = ("token_shards", "quality_classifier")


def curated_parts(config: ProjectConfig, store: Store) -> list[SourceParts]:
    return [SourceParts(s.name, s.domain, store.files("curated", s.name, "documents")) for s in config.sources]


def train_stage_tokenizer(config: ProjectConfig, store: Store, out: Path) -> Path:
    """The tokenizer the shards use, trained once (not an engine stage) on a store's curated documents."""
    train_tokenizer(draw_training_sample(curated_parts(config, store), {}, TOKENIZER), TOKENIZER, out)
    return out


def downstream_stages(config: ProjectConfig, store: Store, engine: Engine, tokenizer: Path) -> None:
    """curated (already computed) → token shards (one tokenize task per curated part on `engine`, as the
    token_shards asset calls write_token_shards) and the quality classifier (mirror's documents the positives,
    web's the negatives: the fold fits and the final fit are `engine` tasks, as the quality_classifier asset)."""
    with store.staging("token_shards") as writer:
        result = write_token_shards(curated_parts(config, store), tokenizer, SHARDS, MIXTURE, writer, engine,
                                    progress=False)
        writer.commit(code_version="t", config={}, inputs={}, counts=result.counts(), stats=result.manifest_stats())
    web, mirror = ([Example(d.doc_id, d.source, d.text)
                    for d in read_documents(store.files("curated", name, "documents"))] for name in SOURCES)
    with store.staging("quality_classifier") as writer:
        card = train_classifier(mirror, web, CLASSIFIER, writer.dir, engine, progress=False)
        writer.commit(code_version="t", config={}, inputs={}, counts={}, stats={"card": card.to_dict()})


NEAR_PARTITIONS = 4


def near_stage(config: ProjectConfig, store: Store, engine: Engine) -> dict:
    """signatures (already computed) → near-dup decisions and the refresh's bucket index under near/, as the
    dedup_index asset calls `decide_distributed` (every source's signature parts in config source order, no earlier
    refresh); its shuffle folder removed afterwards, as the asset does."""
    signature_files = [f for s in config.sources for f in store.files("signatures", s.name, "signatures")]
    sources = {s.name: (s.quality_tier, order) for order, s in enumerate(config.sources)}
    work = store.root / ".near-work"
    stats = decide_distributed(signature_files, sources, [], work, store.root / "near", NEAR, "r",
                               engine=engine, partitions=NEAR_PARTITIONS)
    shutil.rmtree(work)
    return stats


def _without_timings(value):
    if isinstance(value, dict):
        return {k: _without_timings(v) for k, v in value.items() if k not in ("seconds", "created_at", "git_commit")}
    if isinstance(value, list):
        return [_without_timings(v) for v in value]
    return value


TIMED_JSON = (MANIFEST_NAME, CARD_FILE)  # JSON files that record how long something took


def fingerprint(store: Store, assets=("raw", "filtered", "curated", "signatures")) -> dict[str, str]:
    """Every file the stages wrote, by path: its sha256 (manifests and the classifier's card without their
    timings)."""
    found = {}
    for asset in assets:
        for path in published_files(store.root / asset):
            data = path.read_bytes()
            if path.name in TIMED_JSON:
                data = json.dumps(_without_timings(json.loads(data)), sort_keys=True).encode()
            if path.name == MANIFEST_NAME and (path.parent / CARD_FILE).is_file():
                # The card's entry (hash, size) and the data version follow its timings; the card itself is
                # compared without them above.
                manifest = json.loads(data)
                manifest.pop("data_version")
                manifest["files"] = [{k: v for k, v in f.items() if k not in ("sha256", "bytes")}
                                     if f["path"] == CARD_FILE else f for f in manifest["files"]]
                data = json.dumps(manifest, sort_keys=True).encode()
            found[path.relative_to(store.root).as_posix()] = hashlib.sha256(data).hexdigest()
    return found


def main() -> None:
    store, corpus = Store(Path(sys.argv[1])), Path(sys.argv[2])
    stage = {"stages": run_stages, "exact": exact_and_signature_stages, "near": near_stage}[sys.argv[3] if len(sys.argv) > 3 else "stages"]
    stage(corpus_config(corpus), store, RayEngine())  # RAY_ADDRESS: the cluster the test started


if __name__ == "__main__":
    main()
