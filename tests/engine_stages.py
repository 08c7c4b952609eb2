"""The per-part stages (intake, filter, exact dedup, MinHash signatures) and the near-dup decisions on a synthetic
corpus, on a given engine, and a fingerprint of everything they wrote — to compare engines byte for byte.

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

from kiln.common.config import NearDedup, ProjectConfig, parse_config
from kiln.common.manifest import MANIFEST_NAME
from kiln.common.storage import Store
from kiln.curation.exact_dedup import HashSource, exact_dedup
from kiln.curation.pipeline import filter_documents, ingest, profile_steps
from kiln.dedup.buckets import decide_distributed
from kiln.dedup.signing import compute_signatures
from kiln.engine import SERIAL, Engine, RayEngine

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
    for source in config.sources:
        with store.staging("filtered", source.name) as writer:
            stats = filter_documents(store.files("raw", source.name, "documents"), profile_steps(config, source.name),
                                     config.curation.exact_dedup, writer, engine, progress=False)
            writer.commit(code_version="t", config={}, inputs={}, counts={}, stats=stats.to_dict())
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


def fingerprint(store: Store, assets=("raw", "filtered", "curated", "signatures")) -> dict[str, str]:
    """Every file the stages wrote, by path: its sha256 (manifests without their timings)."""
    found = {}
    for asset in assets:
        for path in sorted((store.root / asset).rglob("*")):
            if not path.is_file():
                continue
            data = path.read_bytes()
            if path.name == MANIFEST_NAME:
                data = json.dumps(_without_timings(json.loads(data)), sort_keys=True).encode()
            found[path.relative_to(store.root).as_posix()] = hashlib.sha256(data).hexdigest()
    return found


def main() -> None:
    store, corpus = Store(Path(sys.argv[1])), Path(sys.argv[2])
    stage = {"stages": run_stages, "near": near_stage}[sys.argv[3] if len(sys.argv) > 3 else "stages"]
    stage(corpus_config(corpus), store, RayEngine())  # RAY_ADDRESS: the cluster the test started


if __name__ == "__main__":
    main()
