"""A small store for audit and data-card tests, built by materializing the data assets in the demo's order.

Two sources: `ref` (tier 1, 10 documents) and `web`, whose records include near-copies of ref documents
(w0-w2), a document too short for its filter profile ("short"), one quoting a benchmark item (w9) and an
unreadable line. The mixture repeats web and subsamples ref, so some ref documents are left out of
training. A stand-in checkpoint (a training_run and a checkpoint manifest over the real token shards, no
training) closes the chain, so lineage, source usage and the data card work without the slow training
path (tests/assets/test_training_assets.py covers the real one).
"""

from __future__ import annotations

import json
import string
from pathlib import Path

import numpy as np

from kiln.common.config import load_config
from kiln.common.storage import Store
from kiln.governance.refresh import latest
from tests.assets.project import load_project
from tests.conftest import SERIAL_ENGINE, web_and_ref_sources, write_jsonl

BENCHMARK_ITEM = ("which ancient guild of lantern makers first standardized the copper wick gauge used across "
                  "the northern harbour towns")
SHORT = "Buy cheap lanterns now, friends."


def random_text(rng, vocab, n=120):
    """A document of n random words from vocab (shared by the dedup and audit tests)."""
    return " ".join(rng.choice(vocab, n))


def edit(text, rng, vocab, k=2):
    """A near-copy: k words replaced."""
    words = text.split()
    for p in rng.choice(len(words), k, replace=False):
        words[p] = str(rng.choice(vocab))
    return " ".join(words)


def build_audit_store(tmp: Path, monkeypatch) -> dict:
    """Materialize everything up to the token shards under `tmp/kiln`, then the stand-in checkpoint."""
    home = tmp / "kiln"
    monkeypatch.setenv("KILN_HOME", str(home))
    rng = np.random.default_rng(7)
    vocab = ["".join(rng.choice(list(string.ascii_lowercase), 6)) for _ in range(5000)]
    ref = [random_text(rng, vocab) for _ in range(10)]
    web = ([edit(t, rng, vocab) for t in ref[:3]] + [random_text(rng, vocab) for _ in range(6)]
           + [random_text(rng, vocab, 40) + " " + BENCHMARK_ITEM + " " + random_text(rng, vocab, 40)])
    write_jsonl(tmp / "ref" / "a.jsonl", [{"id": f"r{i}", "text": t} for i, t in enumerate(ref)])
    write_jsonl(tmp / "web" / "week1.jsonl", [{"id": f"w{i}", "text": t} for i, t in enumerate(web)]
                + [{"id": "short", "text": SHORT}, "{not json"])
    write_jsonl(tmp / "bench.jsonl", [{"id": "q1", "question": "Who standardized the wick gauge?",
                                       "answer": BENCHMARK_ITEM}])
    config = {
        "sources": web_and_ref_sources(tmp, web_license="CC-BY-4.0", ref_license="CC0-1.0", web_profile="web"),
        "profiles": {"none": [], "web": [{"gopher_quality": {"min_doc_words": 20, "min_stop_words": None}}]},
        "engine": SERIAL_ENGINE,
        "tokenizer": {"vocab_size": 400},
        "mixture": {"weights": {"web": 0.75, "ref": 0.25}},
        "shards": {"seq_len": 16, "val_fraction": 0.2},
        "decontamination": {"benchmarks": [{"name": "lanterns", "path": str(tmp / "bench.jsonl"),
                                            "text_fields": ["question", "answer"]}]},
        "quality": {"classifier": {"enabled": False}},  # every stage runs; no classifier to train on 20 documents
    }
    project = load_project(config, tmp, home, monkeypatch, in_memory=True)
    assert project.materialize_refresh(sources=["web", "ref"])  # the demo's waves, up to the token shards
    store = Store(home / "data")
    checkpoint = stand_in_checkpoint(store)
    return {"project": project, "home": home, "store": store, "config": load_config(tmp / "kiln.yaml"),
            "config_path": tmp / "kiln.yaml", "ref": ref, "web": web, "rng": rng, "vocab": vocab,
            "checkpoint": checkpoint, "members": members(store)}


def stand_in_checkpoint(store: Store, run_config: Path | None = None, loader_state: dict | None = None,
                        name: str = ""):
    """A training_run and a checkpoint manifest over the real token shards (weights are not needed here); with a
    run config and its loader's final state, the run records what it read as the training_run asset does. Versions
    are content hashes: stand-ins of another `name` are other runs and checkpoints, not the same one again."""
    from kiln.governance.exposure import EXPOSURE_FILE, measure_exposure

    refresh, shards = latest(store, "token_shards")
    with store.staging("training_run") as writer:
        (writer.dir / "summary.json").write_text(json.dumps({"steps": 3, **({"name": name} if name else {}), **({"loader": loader_state} if loader_state
                                                                             else {})}))
        inputs = {f"token_shards/{refresh}": shards.data_version,
                  "tokenizer": store.manifest("tokenizer").data_version}
        exposure = {"exposure": measure_exposure(run_config, loader_state, writer.dir / EXPOSURE_FILE)} \
            if loader_state else {}
        run = writer.commit(code_version="test", config={}, inputs=inputs, counts={"steps": 3},
                            stats={"mlflow": {"experiment_id": "1", "run_id": "abc123"}, **exposure})
    with store.staging("checkpoint") as writer:
        (writer.dir / "safetensors").mkdir()
        (writer.dir / "safetensors" / "model.safetensors").write_bytes(b"stand-in weights" + name.encode())
        return writer.commit(code_version="test", config={}, inputs={"training_run": run.data_version},
                             counts={"parameters": 1, "steps": 3}, stats={"mlflow": run.stats["mlflow"]})


def later_training_on_other_data(store: Store) -> None:
    """A training run that read no shard set of this store, and its checkpoint: they replace the store's."""
    with store.staging("training_run") as w:
        (w.dir / "summary.json").write_text("{}")
        run = w.commit(code_version="test", config={}, inputs={}, counts={"steps": 1})
    with store.staging("checkpoint") as w:
        (w.dir / "weights.bin").write_bytes(b"later weights")
        w.commit(code_version="test", config={}, inputs={"training_run": run.data_version}, counts={"steps": 1})


def members(store: Store) -> dict[str, dict]:
    """doc_id -> its row of the token shards' member list."""
    return {r["doc_id"]: r for r in store.read_table("token_shards", latest(store, "token_shards")[0],
                                                     "members").to_pylist()}
