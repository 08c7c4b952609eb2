"""Training through Dagster: torchrun and Ray Train via Pipes, a real `mlflow server`, checkpoint, evaluation (the
deepspeed launcher: tests/training_jobs/conftest.py's run_b)."""

import json
import os
import socket
import string
import subprocess
import sys
import time
import urllib.request
from collections import Counter
from pathlib import Path
from urllib.parse import quote, unquote, unquote_plus

import dagster as dg
import numpy as np
import pyarrow.parquet as pq
import pytest
import torch

from kiln.common.config import load_config
from kiln.governance.forget import record_request
from kiln.governance.membership import membership
from kiln.governance.render import render
from kiln.tokens.tokenizer import Tokenizer
from tests.assets.project import load_project
from tests.conftest import SERIAL_ENGINE, write_jsonl
from tests.token_corpus import read_sequences, token_grams
from training_jobs import launch
from training_jobs.loader import ShardLoader
from training_jobs.settings import RunConfig
from training_jobs.setup import Dist, open_training

DATA = ["raw_documents", "filtered_documents", "curated_documents", "minhash_signatures"]


@pytest.fixture(scope="module")
def mlflow_root(tmp_path_factory):
    """Where the tracking server keeps its database and artifacts."""
    return tmp_path_factory.mktemp("mlflow")


@pytest.fixture(scope="module")
def mlflow_server(mlflow_root):
    """A real tracking server on loopback, as users run it."""
    root = mlflow_root
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([str(Path(sys.executable).parent / "mlflow"), "server", "--backend-store-uri",
                             f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination", str(root / "artifacts"),
                             "--host", "127.0.0.1", "--port", str(port), "--workers", "1"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True,
                            env={**os.environ, "MLFLOW_SERVER_ENABLE_JOB_EXECUTION": "false"})  # as `make mlflow`
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120  # its first start migrates a fresh SQLite store: slow on a loaded machine
    while True:
        try:
            if urllib.request.urlopen(f"{url}/health", timeout=1).status == 200:
                break
        except OSError:
            time.sleep(0.25)
        if time.monotonic() > deadline:
            proc.kill()
            pytest.fail("mlflow server did not come up in 120 s")
    yield url
    proc.terminate()
    proc.wait(30)


# One of each PII type in a format the redactor is documented to catch (kiln/curation/pii/), and a phrase that marks
# documents the filters drop: after raw_documents none of them may be persisted anywhere.
PLANTED_PII = ["quinn.harlow@fastmail.fm", "(312) 867-5309", "+44 20 7946 0958", "83.149.21.7",
               "2a03:2880:f10c:83:face:b00c:0:25de", "536-22-8741", "4556 7375 8689 9855",
               "ghp_4Xq9ZrT2mLp8Vn3Kd7Wb1Yc6Hf5Js0Ae2Gu4"]
DROPPED_MARK = "velvet okapi canary"
URL_PASSWORD = "okapi-hunter2"  # in a URL's user:password@


def leaked(needles: list[str], text: str) -> set[str]:
    """The needles in `text` as it is, or percent-encoded (a URL may store them either way). `text` is decoded once,
    not once per needle: the decoding is most of the scan's time (the checkpoints and databases hold many a '%')."""
    forms = (text, unquote(text), unquote_plus(text))
    return {needle for needle in needles if any(needle in form for form in forms)}


def event_log_text(instance) -> dict[str, str]:
    """Every event Dagster stored for every run of `instance` (materializations and their metadata, check results,
    logs), serialized as the event log storage holds it: read through the instance, as a reader of the UI would, so
    nothing hides in how SQLite lays out its pages."""
    return {f"event log of run {run.run_id}": "\n".join(e.to_json() for e in instance.all_logs(run.run_id))
            for run in instance.get_runs()}


def persisted_text(root: Path, skip: Path | None = None) -> dict[str, str]:
    """Every file under `root` (but `skip`) as text: Parquet decoded row by row, anything else (JSON, YAML, logs,
    SQLite databases, tokenizer files, binaries) as its bytes read as UTF-8, so a string stored plainly shows."""
    import pyarrow.parquet as pq

    out = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and not (skip and p.is_relative_to(skip))):
        if path.suffix == ".parquet":
            out[str(path)] = json.dumps(pq.read_table(path).to_pylist(), default=str, ensure_ascii=False)
        else:
            out[str(path)] = path.read_bytes().decode("utf-8", errors="replace")
    return out


@pytest.mark.slow
def test_train_checkpoint_evaluate_through_dagster(tmp_path, kiln_home, monkeypatch, mlflow_server, mlflow_root):
    monkeypatch.delenv("MLFLOW_TRACKING_URI", raising=False)
    rng = np.random.default_rng(0)
    vocab = ["".join(rng.choice(list(string.ascii_lowercase), 5)) for _ in range(300)]
    # A learnable corpus: documents are runs of a few repeated phrases.
    phrases = [" ".join(rng.choice(vocab, 6)) for _ in range(20)]
    docs = [" ".join(rng.choice(phrases, 30)) + f" doc {i}." for i in range(120)]
    # PII in kept documents (redacted), in documents from a blocked domain (dropped by the filters before the PII
    # step), and in an exact copy (dropped by exact dedup); in the text, in URL query strings (plain and
    # percent-encoded, with a password in the address) and in extra fields (meta: named, unnamed, nested); and in
    # records intake quarantines (a malformed line, a repeated id).
    with_pii = [f"{docs[i]} Contact {pii} for details." for i, pii in enumerate(PLANTED_PII)]
    dropped = [f"{DROPPED_MARK}: reach me at {pii} any time." for pii in PLANTED_PII]

    def fields(host: str, i: int, pii: str) -> dict:
        return {"url": f"https://reader:{URL_PASSWORD}@{host}/{i}?ref={pii if i % 2 else quote(pii)}&page=2",
                "contact": pii, "profile": {"note": f"reach me at {pii}", "links": [f"https://{host}/?c={quote(pii)}"]}}

    records = ([{"id": i, "text": t} | (fields("news.example.org", i, PLANTED_PII[i]) if i < len(PLANTED_PII) else {})
                for i, t in enumerate(with_pii + docs[len(PLANTED_PII):])]
               + [{"id": f"blocked-{i}", "text": t} | fields("spam.blocked.example", i, pii)
                  for i, (t, pii) in enumerate(zip(dropped, PLANTED_PII))]
               + [{"id": "copy", "text": with_pii[0], "author_email": PLANTED_PII[0]}]
               + ['{"id": "broken", "text": "' + f"{DROPPED_MARK} " + " ".join(PLANTED_PII) + '"',  # no closing brace
                  {"id": 0, "text": f"{DROPPED_MARK} again: " + " ".join(PLANTED_PII)}])  # id 0 repeated
    write_jsonl(tmp_path / "web" / "a.jsonl", records)
    config = {
        "sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC0",
                     "domain": "web", "profile": "blocklist"}],
        "profiles": {"blocklist": ["url_blocklist"]},  # the bundled list blocks blocked.example
        "engine": SERIAL_ENGINE, "dedup": {"near": {"enabled": False}},
        "tokenizer": {"vocab_size": 400},
        "shards": {"seq_len": 64, "val_fraction": 0.1},
        "training": {"model": {"preset": "tiny"}, "micro_batch_size": 4, "max_steps": 24,
                     "schedule": {"lr": 0.003, "min_lr": 0.0003, "warmup_steps": 4},
                     "checkpoint": {"every_steps": 10, "keep_last": 2}, "log_every_steps": 4},
        "evaluation": {"max_val_tokens": 2000, "max_tokens_per_source": 2000, "sample_tokens": 8},
    }
    project = load_project(config, tmp_path, kiln_home, monkeypatch)
    project.resources["mlflow_tracking"] = project.definitions.MlflowTracking(tracking_uri=mlflow_server,
                                                                              experiment="kiln-test")
    project.resources["training_launcher"] = project.definitions.TrainingLauncher(nproc_per_node=2)  # torchrun
    project.resources["pipes_subprocess_client"] = project.definitions.dg.PipesSubprocessClient()
    assert project.materialize(DATA, "web").success
    assert project.materialize(["dedup_index"]).success
    assert project.materialize(["deduplicated_documents"], "web").success
    assert project.materialize(["quality_classifier"]).success  # off: one web source, no reference source
    assert project.materialize(["quality_scores", "quality_filtered_documents"], "web").success
    assert project.materialize(["tokenizer"]).success and project.materialize(["token_shards"]).success

    result = project.materialize(["training_run", "checkpoint", "evaluation"])
    assert result.success
    assert all(e.passed for e in result.get_asset_check_evaluations())
    run_meta = result.asset_materializations_for_node("training_run")[0].metadata
    assert "data:image/png;base64" in run_meta["loss_curve"].value
    assert "data:image/png;base64" in run_meta["time_breakdown"].value  # summary.json's time, part by part
    layout = run_meta["layout"].value  # the run's layout and why (training_jobs/layout.py): on CPU, the JSON's ZeRO-3
    assert layout["zero_stage"] == 3 and layout["micro_batch"] == 4 and "no accelerator" in layout["reason"]
    run = json.loads((kiln_home / "data" / "training_run" / "_all" / "_manifest.json").read_text())
    summary = run["stats"]["summary"]
    assert summary["status"] == "completed" and summary["steps"] == 24 and summary["world_size"] == 2
    metrics = [json.loads(line) for line in (kiln_home / "data" / "training_run" / "_all" / "metrics.jsonl")
               .read_text().splitlines()]
    losses = [m["train/loss"] for m in metrics if "train/loss" in m]
    assert np.mean(losses[-4:]) < np.mean(losses[:4]) - 0.5  # it learns the phrases
    shards_key = f"token_shards/{project.current()}"
    assert run["inputs"].keys() == {shards_key, "tokenizer"}

    import mlflow

    client = mlflow.MlflowClient(mlflow_server)
    mlflow_run = client.get_run(run["stats"]["mlflow"]["run_id"])
    assert mlflow_run.data.tags["kiln.token_shards.data_version"] == run["inputs"][shards_key]
    assert mlflow_run.data.tags["kiln.refresh"] == project.current()
    assert mlflow_run.info.status == "FINISHED"
    assert mlflow_run.data.params["world_size"] == "2" and "training.max_steps" in mlflow_run.data.params
    assert len(client.get_metric_history(mlflow_run.info.run_id, "train/loss")) >= 5
    artifacts = {a.path for a in client.list_artifacts(mlflow_run.info.run_id, "checkpoint/safetensors")}
    assert "checkpoint/safetensors/model.safetensors" in artifacts

    evaluation = json.loads((kiln_home / "data" / "evaluation" / "_all" / "evaluation.json").read_text())
    assert evaluation["validation"]["tokens"] > 0 and evaluation["per_source"]["web"]["loss"] is not None
    assert evaluation["probes"]["shuffled_control"]["loss"] is not None and len(evaluation["samples"]) == 3

    # The checkpoint's data card: the MLflow run, training and evaluation figures, lineage back to raw documents.
    carded = project.materialize(["data_card"])
    assert carded.success and all(e.passed for e in carded.get_asset_check_evaluations())
    card = json.loads((kiln_home / "data" / "data_card" / "_all" / "data_card.json").read_text())
    ckpt = json.loads((kiln_home / "data" / "checkpoint" / "_all" / "_manifest.json").read_text())
    assert card["checkpoint"]["data_version"] == ckpt["data_version"] and card["training"]["summary"]["steps"] == 24
    assert card["mlflow"]["run_id"] == run["stats"]["mlflow"]["run_id"] and card["mlflow"]["url"].startswith(mlflow_server)
    assert card["evaluation"]["validation"]["loss"] == evaluation["validation"]["loss"]
    assert {"checkpoint", "training_run", f"raw_documents/{project.partition('web')}"} <= \
        {n["key"] for n in card["lineage"]["nodes"]}
    assert "| web | CC0 |" in carded.asset_materializations_for_node("data_card")[0].metadata["data_card"].value

    # The checkpoint folder serves as the quality stage's reference language model (CCNet-style perplexity).
    from kiln.quality.perplexity import ReferenceModel

    reference = ReferenceModel.load(kiln_home / "data" / "checkpoint" / "_all", device="cpu")
    plain = docs[len(PLANTED_PII)]  # a training document without PII
    learned, shuffled = reference.perplexities([plain, " ".join(reversed(plain.split()))], max_tokens=64)
    assert 1 < learned < shuffled

    # Privacy: after raw_documents, no planted PII and nothing of a dropped document anywhere Kiln, Dagster or
    # MLflow wrote (the store and its rejected tables, manifests, metadata in the event log, logs, the tokenizer,
    # MLflow's database and artifacts); the raw layer itself still holds them. Dagster's storage is read twice: its
    # files as bytes (compute logs, SQLite) and its event log through the instance.
    raw = kiln_home / "data" / "raw_documents"
    written = persisted_text(kiln_home, skip=raw) | persisted_text(Path(project.instance.root_directory)) | \
        persisted_text(mlflow_root) | event_log_text(project.instance)
    assert len(written) > 50 and any("rejected" in p for p in written)
    events = "".join(t for p, t in written.items() if p.startswith("event log"))
    assert "removed_examples" in events and "read.duplicate_doc_id" in events and "read.malformed_json" in events
    needles = [*PLANTED_PII, DROPPED_MARK, URL_PASSWORD]
    leaks = {(needle, path) for path, text in written.items() for needle in leaked(needles, text)}
    assert not leaks
    raw_text = "".join(persisted_text(raw).values())
    assert all(needle in raw_text for needle in needles)
    quarantined = {r["reason"] for f in raw.rglob("quarantine-*.parquet") for r in pq.read_table(f).to_pylist()}
    assert quarantined == {"malformed_json", "duplicate_doc_id"}
    filtered = json.loads((kiln_home / "data" / "filtered_documents" / project.partition("web") / "_manifest.json")
                          .read_text())
    assert filtered["counts"]["rejected"] == len(dropped)

    # The assets never set a process-wide tracking URI: later processes must not inherit this server.
    assert "MLFLOW_TRACKING_URI" not in os.environ

    # Materializing again with the same data and settings finds the finished run and does not retrain.
    again = project.materialize(["training_run"])
    assert again.success
    rerun = json.loads((kiln_home / "data" / "training_run" / "_all" / "_manifest.json").read_text())["stats"]
    assert rerun["summary"]["steps_this_run"] == 0 and rerun["mlflow"]["run_id"] == run["stats"]["mlflow"]["run_id"]

    # While another launch trains in the run folder, materializing is refused before anything is written there; and
    # so it is when that launch takes the folder just after the asset's check (its launch command exits BUSY): the
    # folder's summary.json is the other launch's, not a reason for this one.
    run_dir = Path(run["stats"]["run_dir"])
    run_config_bytes = (run_dir / "run_config.json").read_bytes()
    training_module, checks = sys.modules["assets.training"], []

    def passes_first(folder: Path) -> str | None:
        checks.append(folder)
        return None if len(checks) == 1 else launch.busy(folder)

    def refusal(result) -> str:
        return next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE").step_failure_data.error.message

    holder = f"{run_dir} is being trained by another launch (pid {os.getpid()} on "
    with launch.run_folder_lock(run_dir):
        message = refusal(project.materialize(["training_run"], raise_on_error=False))
        assert holder in message and (run_dir / "run_config.json").read_bytes() == run_config_bytes, message
        with monkeypatch.context() as patched:
            patched.setattr(training_module, "busy", passes_first)
            message = refusal(project.materialize(["training_run"], raise_on_error=False))
        assert holder in message and "training completed" not in message, message
        assert checks == [run_dir, run_dir]  # the check before launch, and the one after the launch command failed

    # Another materialization of the same run key between its check and its launch (the launch lock not yet taken):
    # this one is refused too, and rewrites neither its run_config.json nor its MLflow run id.
    run_config_bytes = (run_dir / "run_config.json").read_bytes()  # the last materialization's, written before refusal
    mlflow_id_bytes = (run_dir / "mlflow_run_id").read_bytes()
    with launch.run_folder_lock(run_dir, launch.MATERIALIZING):
        message = refusal(project.materialize(["training_run"], raise_on_error=False))
    assert holder in message, message
    assert (run_dir / "run_config.json").read_bytes() == run_config_bytes
    assert (run_dir / "mlflow_run_id").read_bytes() == mlflow_id_bytes

    # A launch that never started a rank (here a launcher that exits at once) leaves no MLflow run RUNNING for ever:
    # the asset ends the run its ranks did not.
    launcher_class = type(project.resources["training_launcher"])
    with monkeypatch.context() as patched:
        patched.setattr(launcher_class, "command", lambda self, *args: [sys.executable, "-c", "raise SystemExit(3)"])
        stillborn = project.materialize(["training_run"], raise_on_error=False,
                                        run_config={"ops": {"training_run": {"config": {"max_steps": 5}}}})
    assert not stillborn.success
    new_dirs = [d for d in run_dir.parent.iterdir() if d != run_dir]
    assert len(new_dirs) == 1 and (new_dirs[0] / "mlflow_run_id").is_file()
    stillborn_run = client.get_run((new_dirs[0] / "mlflow_run_id").read_text().strip())
    assert stillborn_run.info.status == "FAILED" and stillborn_run.info.end_time is not None

    # The Dagster run terminated during the launch (Terminate in the UI: Dagster raises its interrupt, a
    # BaseException, in the step, and Pipes stops the launch): the MLflow run is ended KILLED, not left RUNNING.
    def terminated(self, *args, **kwargs):
        raise dg.DagsterExecutionInterruptedError()

    with monkeypatch.context() as patched:
        patched.setattr(type(project.resources["pipes_subprocess_client"]), "run", terminated)
        stopped = project.materialize(["training_run"], raise_on_error=False,
                                      run_config={"ops": {"training_run": {"config": {"max_steps": 4}}}})
    assert not stopped.success
    [stopped_dir] = [d for d in run_dir.parent.iterdir() if d not in (run_dir, *new_dirs)]
    stopped_run = client.get_run((stopped_dir / "mlflow_run_id").read_text().strip())
    assert stopped_run.info.status == "KILLED" and stopped_run.info.end_time is not None

    # A takedown between the base run and the continued run: refresh 2 lands, and the documents the continued run's
    # replay of the base's shards (refresh 1's, which still hold them) would read first are forgotten.
    store, a_dir = project.store, kiln_home / "data" / shards_key
    base_ckpt = json.loads((kiln_home / "data" / "checkpoint" / "_all" / "_manifest.json").read_text())
    seed = run["config"]["training"]["seed"]
    base_web = project.partition("web")
    new_docs = [" ".join(rng.choice(phrases, 30)) + f" new {i}." for i in range(20)]
    write_jsonl(kiln_home / "landing" / "web" / "b.jsonl",
                [{"id": f"new-{i}", "text": t} for i, t in enumerate(new_docs)])
    second = project.refresh().key
    replay_first = set().union(*(token_grams(seq) for rank in range(2) for seq in read_sequences(
        ShardLoader(a_dir, "train", None, 1, rank, 2, seed=seed), 6)))  # 6 steps x 4 x 25%: 6 per rank
    tok = Tokenizer.load(store.dataset_dir("tokenizer"))
    texts = {r["doc_id"]: r["text"] for p in store.files("quality_filtered_documents", base_web, "documents")
             for r in pq.read_table(p, columns=["doc_id", "text"]).to_pylist()}
    # A document's own content: its 12-grams no other document has (these documents share their phrases; each
    # ends in its own number and some in their own contact).
    doc_grams = {doc: token_grams(tok.encode(text) + [tok.eos_id]) for doc, text in texts.items()}
    seen = Counter(g for grams in doc_grams.values() for g in grams)
    own = {doc: {g for g in grams if seen[g] == 1} for doc, grams in doc_grams.items()}
    forgotten = sorted(doc for doc, grams in own.items() if grams & replay_first)
    assert 1 <= len(forgotten) < len(texts) // 4
    request = record_request(store, load_config(project.config_path), "doc_ids", forgotten, "owner asked")
    assert [a["checkpoint"] for a in request.affected] == [base_ckpt["data_version"]]  # it trained on them
    assert project.materialize_refresh(sources=["web"]) and project.current() == second

    # Continued pretraining from `latest` (the checkpoint above) with a re-warmup and 25% replay of the base's
    # shards: a new run folder, the base recorded with the chain it came from, forgetting measured per domain.
    # This run trains on Ray Train workers (training.launcher: ray, the resource following the config; an embedded
    # local Ray): its Pipes messages and MLflow run must reach the asset all the same.
    base_export = Path(summary["exports"]["safetensors"])
    config["training"] |= {"base_checkpoint": "latest", "rewarmup_steps": 2, "max_steps": 6,
                           "checkpoint": {"every_steps": 3, "keep_last": 1}, "launcher": "ray"}
    config["mixture"] = {"replay": {"share": 0.25}}
    config["storage"] = {"keep_old_run_checkpoints": 0}
    resources = project.resources
    project = load_project(config, tmp_path, kiln_home, monkeypatch)
    project.resources.update({k: resources[k] for k in ("mlflow_tracking", "pipes_subprocess_client")})
    project.resources["training_launcher"] = project.definitions.TrainingLauncher(nproc_per_node=2)
    continued = project.materialize(["training_run", "checkpoint", "evaluation", "data_card"])
    assert continued.success
    run2 = json.loads((kiln_home / "data" / "training_run" / "_all" / "_manifest.json").read_text())
    # storage.keep_old_run_checkpoints 0: the base run's checkpoints go once the store's checkpoint no longer came
    # from it (not when training_run moved on); its exports, the continued run's base, stay, and the new run's own.
    pruned = {node: continued.asset_materializations_for_node(node)[0].metadata["pruned_runs"].value["runs"]
              for node in ("training_run", "checkpoint")}
    assert pruned == {"training_run": {}, "checkpoint": {run_dir.name: {"checkpoints": [
        "step_00000020", "step_00000024"], "on_s3": []}}}
    assert not (run_dir / "checkpoints").exists() and (base_export / "model.safetensors").is_file()
    assert (Path(run2["stats"]["run_dir"]) / "checkpoints" / "step_00000006" / "manifest.json").is_file()
    assert run2["config"]["launcher"] == {"name": "ray", "world_size": 2}
    reported = continued.asset_materializations_for_node("training_run")[0].metadata  # rank 0's, relayed by Ray
    assert reported["mlflow_run_id"].value == run2["stats"]["mlflow"]["run_id"]
    assert reported["steps"].value == 6 and reported["world_size"].value == 2
    assert client.get_run(run2["stats"]["mlflow"]["run_id"]).info.status == "FINISHED"
    assert client.get_metric_history(run2["stats"]["mlflow"]["run_id"], "train/loss")  # the workers logged to MLflow
    base = run2["stats"]["base_checkpoint"]
    from training_jobs.checkpoint import sha256_file

    assert base["kind"] == "safetensors" and Path(base["path"]) == base_export
    assert base["sha256"] == sha256_file(base_export / "model.safetensors")
    assert base["checkpoint_data_version"] == base_ckpt["data_version"]
    assert base["trained_on"] == str(kiln_home / "data" / shards_key)
    assert {"checkpoint", "training_run", shards_key} <= {n["key"] for n in base["chain"]["nodes"]}
    assert any(n["key"].startswith("raw_documents/web/") for n in base["chain"]["nodes"])
    assert run2["config"]["replay"] == {"share": 0.25, "dataset_dir": base["trained_on"]}
    assert run2["inputs"].keys() == {f"token_shards/{second}", shards_key, "tokenizer", "removal_requests"}
    # What the run's replay loader read, rebuilt from its recorded run config and final cursor (both ranks), checked
    # by content: none of the forgotten documents' 12-grams; without the exclusions, the same count of sequences
    # holds them.
    recorded = RunConfig.from_json((kiln_home / "data" / "training_run" / "_all" / "run_config.json").read_text())
    cursor = run2["stats"]["summary"]["loader"]["replay"]
    read = cursor["epoch"] * cursor["sequences_per_epoch"] + cursor["position"]
    assert recorded.replay.exclude and read >= 6
    # the versions checked before launch (lineage, requests, exclusions) are the ones every loader was held to
    assert recorded.dataset_data_version == run2["inputs"][f"token_shards/{second}"]
    assert recorded.replay.data_version == run2["inputs"][shards_key]

    def replay_read(run_config) -> set:
        return set().union(*(token_grams(seq) for rank in range(2) for seq in read_sequences(
            open_training(run_config, Dist(rank, 2, torch.device("cpu"))).replay, read)))

    gone = set().union(*(own[d] for d in forgotten))
    assert not gone & replay_read(recorded)
    unexcluded = recorded.model_copy(update={"replay": recorded.replay.model_copy(update={"exclude": {}})})
    assert gone & replay_read(unexcluded)
    ckpt2 = json.loads((kiln_home / "data" / "checkpoint" / "_all" / "_manifest.json").read_text())["data_version"]
    for doc in forgotten:
        answer = membership(store, load_config(project.config_path), doc_id=doc)
        assert answer.verdict == "removed" and not answer.reached_training, render(answer)
        assert f"when checkpoint {ckpt2} replayed token_shards {run['inputs'][shards_key]}" in answer.summary
        # The base checkpoint, replaced in the store by the continued one, did train on it: said, not judged.
        assert f"checkpoint {base_ckpt['data_version']}, replaced in the store since, was trained on token_shards " \
               f"{run['inputs'][shards_key]}" in " ".join(answer.notes), render(answer)
    s2 = run2["stats"]["summary"]
    assert s2["steps"] == 6 and s2["base_val_loss"] < summary["val_loss"] + 0.5  # starts where the base ended
    assert run2["stats"]["run_dir"] != run["stats"]["run_dir"]

    evaluation2 = json.loads((kiln_home / "data" / "evaluation" / "_all" / "evaluation.json").read_text())
    web = evaluation2["forgetting"]["web"]
    assert web["tokens"] == evaluation2["per_source"]["web"]["tokens"]
    assert web["loss"] == evaluation2["per_source"]["web"]["loss"]
    assert web["forgetting"] == pytest.approx(web["loss"] - web["base_loss"], abs=2e-5)
    history = client.get_metric_history(run2["stats"]["mlflow"]["run_id"], "forgetting/web")
    assert [h.value for h in history] == [web["forgetting"]]
    card2 = (kiln_home / "data" / "data_card" / "_all" / "data_card.md").read_text()
    assert "Continued pretraining" in card2 and base["sha256"][:16] in card2 and "Forgetting per domain" in card2

    from kiln.governance.audit import lineage

    text = render(lineage(project.store, "checkpoint"))
    assert "continued pretraining from base checkpoint safetensors" in text and base_ckpt["data_version"] in text

    # A run that fails inside the training processes comes back as a Failure with their reason (summary.json), and
    # one that cannot work is refused before anything launches.
    missing = tmp_path / "no_such_shards"
    failed = project.materialize(["training_run"], raise_on_error=False, run_config={  # deepspeed: no retries
        "ops": {"training_run": {"config": {"replay_from": str(missing), "max_steps": 7, "launcher": "deepspeed"}}}})
    failure = next(e for e in failed.all_events if e.event_type_value == "STEP_FAILURE")
    assert not failed.success and "training failed" in failure.step_failure_data.error.message
    assert str(missing) in failure.step_failure_data.error.message
    config["tokenizer"]["sentinel_tokens"] = 100  # the config asks for sentinels; the fitted tokenizer has none
    config["training"]["objective"] = "span_corruption"
    project = load_project(config, tmp_path, kiln_home, monkeypatch)
    refused = project.materialize(["training_run"], raise_on_error=False)
    failure = next(e for e in refused.all_events if e.event_type_value == "STEP_FAILURE")
    assert "the tokenizer of this KILN_HOME was fitted without them" in failure.step_failure_data.error.message


def test_a_tracking_server_that_cannot_be_reached_fails_the_run_without_its_password_in_dagsters_event_log(
        tmp_path, kiln_home, monkeypatch):
    """MLFLOW_TRACKING_URI may carry user:password@ (a deployment's environment); MLflow's errors quote the URI. The
    failure names the server without them, and no event Dagster stored (the failure, its cause, its traceback)
    holds the password."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "3")
    rng = np.random.default_rng(0)
    vocab = ["".join(rng.choice(list(string.ascii_lowercase), 5)) for _ in range(300)]
    write_jsonl(tmp_path / "web" / "a.jsonl", [{"id": i, "text": " ".join(rng.choice(vocab, 80))} for i in range(12)])
    config = {"sources": [{"name": "web", "kind": "jsonl", "path": str(tmp_path / "web"), "license": "CC0",
                           "domain": "web", "profile": "none"}],
              "profiles": {"none": []}, "engine": SERIAL_ENGINE, "decontamination": {"enabled": False},
              "quality": {"classifier": {"enabled": False}}, "tokenizer": {"vocab_size": 400},
              "shards": {"seq_len": 16, "val_fraction": 0.0}}
    project = load_project(config, tmp_path, kiln_home, monkeypatch, in_memory=True)
    assert project.materialize_refresh()
    project.resources["mlflow_tracking"] = project.definitions.MlflowTracking(
        tracking_uri=f"http://alice:{URL_PASSWORD}@127.0.0.1:9")  # the discard port: nothing listens
    result = project.materialize(["training_run"], raise_on_error=False)
    assert not result.success
    failure = result.get_step_failure_events()[0].step_failure_data
    assert "MLflow at http://127.0.0.1:9" in failure.user_failure_data.description
    assert failure.error.cause is None and failure.error.context is None
    assert not {path for path, text in event_log_text(project.instance).items() if leaked([URL_PASSWORD], text)}


def test_the_launch_config_changes_one_runs_recipe_and_is_validated_like_the_project():

    from assets.training import TrainingLaunch
    from kiln.common.config import load_config

    project = load_config(Path(__file__).resolve().parents[2] / "configs" / "default.yaml")
    assert TrainingLaunch().apply(project) is project
    changed = TrainingLaunch(base_checkpoint="/runs/a/checkpoints/step_00000300", rewarmup_steps=5, seq_len=512,
                             rope_theta=1e6, rope_scaling_factor=2.0, replay_share=0.1, objective="prefix_lm",
                             max_steps=50).apply(project)
    t = changed.training
    assert (t.base_checkpoint, t.rewarmup_steps, t.seq_len, t.objective, t.max_steps) == \
        ("/runs/a/checkpoints/step_00000300", 5, 512, "prefix_lm", 50)
    assert (t.model.rope_theta, t.model.rope_scaling.factor, t.model.preset) == (1e6, 2.0, project.training.model.preset)
    assert changed.mixture.replay.share == 0.1 and changed.mixture.replay.from_ is None
    assert changed.mixture.weights == project.mixture.weights and changed.sources == project.sources
    with pytest.raises(dg.Failure, match="mixture.replay mixes earlier data into a continued run"):
        TrainingLaunch(replay_share=0.1).apply(project)
    with pytest.raises(dg.Failure, match="training.objective"):
        TrainingLaunch(objective="mlm").apply(project)
    # A field whose config key has another name is named too; a factor of 0 is a factor (checked), not "unset".
    with pytest.raises(dg.Failure, match=r"(?s)training.model.rope_scaling.factor = 0.0: Input should be greater "
                                         r"than 1.*rope_scaling_factor is training.model.rope_scaling.factor"):
        TrainingLaunch(rope_scaling_factor=0.0).apply(project)
    # An empty base checkpoint is no folder (it resolved to the working directory): refused, saying what to give.
    with pytest.raises(dg.Failure, match="training.base_checkpoint is empty: give a checkpoint folder or `latest`"):
        TrainingLaunch(base_checkpoint=" ").apply(project)


def test_a_launcher_left_unset_trains_on_every_visible_gpu_and_on_two_cpu_processes_without_one(monkeypatch, tmp_path):
    from resources import TrainingLauncher

    # torchrun's command names the run folder (its --log-dir), read from the run config
    monkeypatch.chdir(tmp_path)
    Path("run.json").write_text(json.dumps({"output_dir": str(tmp_path / "run")}))

    def launcher(*args, **settings) -> list[str]:  # the launcher's own command, without the supervisor before it
        cmd = TrainingLauncher(**settings).command(Path("run.json"), *args)
        # training_jobs.launch.supervise, holding the run folder's lock
        assert cmd[:5] == [sys.executable, "-m", "training_jobs.launch", "--run-config", "run.json"]
        return cmd[5:]

    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    assert TrainingLauncher().world_size("deepspeed") == 8
    assert launcher()[3:5] == ["--nproc_per_node", "8"]  # torchrun by default
    assert launcher()[-6:-4] == ["--log-dir", str(tmp_path / "run" / "torchelastic")]  # not an empty folder in /tmp
    assert launcher("deepspeed")[1:3] == ["--num_gpus", "8"]
    assert TrainingLauncher(nproc_per_node=2).world_size("torchrun") == 2  # a setting wins over the machine
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 0)
    assert TrainingLauncher().world_size("torchrun") == 2
    assert launcher("torchrun")[3:5] == ["--nproc_per_node", "2"]
    # torchrun picks its rendezvous port itself unless one is set; the deepspeed launcher is always given one
    default = launcher()
    assert "--standalone" in default and "--master_port" not in default
    assert launcher(master_port=29511)[5:7] == ["--master_port", "29511"]
    assert launcher("deepspeed", master_port=29511)[3:5] == ["--master_port", "29511"]


def test_another_number_of_ranks_trains_in_a_run_folder_of_its_own():
    """The same data and settings on 2 GPUs and then on 1 are two runs (another global batch; 2 ranks' checkpoints
    do not load on 1): a finished 2-rank run is neither resumed nor refused when materialized on 1. A retry on as many
    ranks finds its folder again."""
    from assets.training import run_key

    settings = '{"seq_len": 32, "parallelism": {"dp": null}}'
    assert run_key("shards-v1", "tok-v1", settings, 2) == run_key("shards-v1", "tok-v1", settings, 2)
    assert run_key("shards-v1", "tok-v1", settings, 2) != run_key("shards-v1", "tok-v1", settings, 1)


def test_a_continued_run_on_another_version_of_its_replayed_shards_is_another_run():
    """The replayed shard set materialized again (its folder now another version, the exclusions the same) kept the
    run key: a crashed continued run's folder was resumed, every rank's loader refused the new version
    (DatasetReplaced: its position means nothing there), and no materialization could get past it. Its version is
    part of the key now, as the training shards' is."""
    from assets.training import continued_run

    base = {"sha256": "b" * 64}
    replay = {"share": 0.1, "dataset_dir": "/store/token_shards/r1", "data_version": "v1"}
    assert continued_run(base, replay) == continued_run(base, dict(replay))
    assert continued_run(base, replay) != continued_run(base, {**replay, "data_version": "v2"})
    assert continued_run(base, replay) != continued_run(base, {**replay, "exclude": {"r1/part-0.bin": [3]}})
    assert continued_run(base, None) != continued_run(base, replay) and continued_run(None, None) == ""


def test_the_launcher_follows_the_config_and_a_layout_that_does_not_fit_it_is_refused_before_launch():

    from assets.training import TrainingLaunch, launch_layout, ray_reachable
    from kiln.common.config import load_config
    from resources import TrainingLauncher

    project = load_config(Path(__file__).resolve().parents[2] / "configs" / "default.yaml")
    assert project.training.launcher == "torchrun"
    on_ray = TrainingLaunch(launcher="ray").apply(project).training
    assert launch_layout(on_ray, TrainingLauncher(nproc_per_node=2)) == ("ray", 2)
    assert launch_layout(on_ray, TrainingLauncher(launcher="torchrun")) == ("torchrun", 2)  # the resource wins
    def with_layout(**changes):
        return type(project.training).model_validate({**project.training.model_dump(), **changes})

    pipeline = with_layout(parallelism={"pp": 2, "zero_stage": 1})
    assert launch_layout(pipeline, TrainingLauncher(nproc_per_node=4)) == ("torchrun", 4)
    with pytest.raises(dg.Failure, match=r"training.parallelism \(tp 1 x pp 2 = 2 ranks per data-parallel replica\) "
                                         r"does not fit the 3 training processes.*the torchrun launcher"):
        launch_layout(pipeline, TrainingLauncher(nproc_per_node=3))
    with pytest.raises(dg.Failure, match="tp 1 x pp 2 x dp 4 = 8 ranks.*the 2 training processes.*the ray launcher"):
        launch_layout(with_layout(launcher="ray", parallelism={"pp": 2, "dp": 4, "zero_stage": 1}),
                      TrainingLauncher(num_workers=2))
    with pytest.raises(dg.Failure, match="TrainingLauncher starts 0 training processes"):
        launch_layout(on_ray, TrainingLauncher(nproc_per_node=0))
    # num_workers 0 (KILN_TRAINING_WORKERS=0) is a setting to refuse, not one left unset: it fell back to
    # nproc_per_node (here 2) and the run trained on as many ranks as if it were unset
    for workers in (0, -1):
        with pytest.raises(dg.Failure, match=f"TrainingLauncher.num_workers is {workers}: the ray launcher needs at "
                                             f"least 1 training worker"):
            launch_layout(on_ray, TrainingLauncher(num_workers=workers, nproc_per_node=2))
    assert launch_layout(on_ray, TrainingLauncher(num_workers=None, nproc_per_node=2)) == ("ray", 2)  # unset
    # A Ray address nobody answers at is refused before launch, naming the setting it came from.
    with pytest.raises(dg.Failure, match=r"engine.ray_address = '127\.0\.0\.1:9': no Ray cluster answers there"):
        ray_reachable(TrainingLauncher(), "127.0.0.1:9")
    with pytest.raises(dg.Failure, match=r"TrainingLauncher.ray_address = '127\.0\.0\.1:9'"):
        ray_reachable(TrainingLauncher(ray_address="127.0.0.1:9"), "head:6379")
    cmd = TrainingLauncher(num_workers=4, max_failures=1).command(Path("run.json"), "ray", "head:6379")
    assert cmd[6:] == ["-m", "training_jobs.ray_launch", "--run-config", "run.json", "--num-workers", "4",
                       "--max-failures", "1", "--address", "head:6379"]


def test_the_evaluation_holds_out_the_documents_the_shards_held_out(tmp_path, monkeypatch):
    """The per-source losses are over held-out documents, by the split the checkpoint's shards were written with. The
    evaluation chose them by the config's shards.val_fraction now: raised after training, it scored training documents
    as held out (here, at 0.6 instead of 0.2, 2 of web's 3 and 4 of ref's 6)."""
    import yaml

    from kiln.common.storage import Store
    from tests.audit_store import build_audit_store
    from training_jobs.export import save_safetensors
    from training_jobs.model import ModelConfig, Transformer

    built = build_audit_store(tmp_path, monkeypatch)
    store: Store = built["store"]
    run, tokenizer = store.manifest("training_run"), store.manifest("tokenizer")
    cfg = ModelConfig(vocab_size=tokenizer.stats["card"]["vocab_size"], d_model=32, n_layers=1, n_heads=2,
                      n_kv_heads=2, ffn_hidden=64, max_seq_len=16)
    with store.staging("checkpoint") as w:  # a real (random) model, for the losses to be computed
        save_safetensors(Transformer(cfg, seed=0).state_dict(), cfg, w.dir / "safetensors")
        w.commit(code_version="test", config={}, inputs={"training_run": run.data_version},
                 counts={"parameters": 1, "steps": 3}, stats={"mlflow": run.stats["mlflow"]})
    config = yaml.safe_load(built["config_path"].read_text())
    evaluated = {}
    for val_fraction in (config["shards"]["val_fraction"], 0.6):
        config["shards"]["val_fraction"] = val_fraction
        built["config_path"].write_text(yaml.safe_dump(config))
        assert built["project"].materialize(["evaluation"]).success
        evaluated[val_fraction] = store.manifest("evaluation").stats["per_source"]
    first, raised = evaluated.values()
    assert first == raised and {s: first[s]["tokens"] > 0 for s in ("web", "ref")} == {"web": True, "ref": True}



def test_the_evaluation_scores_a_checkpoint_with_what_its_run_trained_on_or_refuses(tmp_path, monkeypatch):
    """The evaluation read the store's current tokenizer, training run and token shards, whichever checkpoint it
    scored: after the tokenizer was fitted again (another vocabulary) and the shards written with it, and a newer run
    trained on them whose checkpoint was not exported yet, the old checkpoint was scored with a tokenizer it never
    saw (a meaningless loss, reported as a success) and the manifest named the new versions as read. Now it reads
    the versions its own run read, records them (and the documents it scored per source), and refuses, naming what
    differs and what to do, where the store no longer holds them."""
    import yaml

    from kiln.common.storage import Store
    from kiln.governance.refresh import latest
    from tests.audit_store import build_audit_store
    from training_jobs.export import save_safetensors
    from training_jobs.model import ModelConfig, Transformer

    def refusal(result) -> str:
        assert not result.success
        return next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE").step_failure_data.error.message

    built = build_audit_store(tmp_path, monkeypatch)
    store: Store = built["store"]
    project, run, tokenizer = built["project"], store.manifest("training_run"), store.manifest("tokenizer")
    refresh, shards = latest(store, "token_shards")
    cfg = ModelConfig(vocab_size=tokenizer.stats["card"]["vocab_size"], d_model=32, n_layers=1, n_heads=2,
                      n_kv_heads=2, ffn_hidden=64, max_seq_len=16)
    with store.staging("checkpoint") as w:
        save_safetensors(Transformer(cfg, seed=0).state_dict(), cfg, w.dir / "safetensors")
        checkpoint = w.commit(code_version="test", config={}, inputs={"training_run": run.data_version},
                              counts={"parameters": 1, "steps": 3}, stats={"mlflow": run.stats["mlflow"]})
    assert project.materialize(["evaluation"]).success
    inputs = store.manifest("evaluation").inputs
    assert {k: inputs[k] for k in ("checkpoint", f"token_shards/{refresh}", "tokenizer")} == {
        "checkpoint": checkpoint.data_version, f"token_shards/{refresh}": shards.data_version,
        "tokenizer": tokenizer.data_version}

    # The tokenizer fitted again, the shards not yet: the checkpoint's shards are there, its tokenizer is not.
    config = yaml.safe_load(built["config_path"].read_text())
    config["tokenizer"]["vocab_size"] = 300
    built["config_path"].write_text(yaml.safe_dump(config))
    assert project.materialize(["tokenizer"]).success
    refitted = store.manifest("tokenizer").stats["card"]["sha256"]
    trained = tokenizer.stats["card"]["sha256"]
    assert refitted != trained
    message = refusal(project.materialize(["evaluation"], raise_on_error=False))
    assert f"tokenizer {trained[:12]}" in message and f"{refitted[:12]}" in message, message
    assert "train again with the new tokenizer" in message.lower(), message

    # The shards written with the new tokenizer and a newer run trained on them, not exported yet: the checkpoint's
    # own shards are gone, and the newer run is not what it was trained on.
    assert project.materialize(["token_shards"]).success
    new_shards = store.manifest("token_shards", refresh)
    with store.staging("training_run") as w:
        (w.dir / "summary.json").write_text("{}")
        newer = w.commit(code_version="test", config={}, counts={"steps": 3},
                         inputs={f"token_shards/{refresh}": new_shards.data_version,
                                 "tokenizer": store.manifest("tokenizer").data_version},
                         stats={"mlflow": {"experiment_id": "1", "run_id": "newer"}})
    message = refusal(project.materialize(["evaluation"], raise_on_error=False))
    assert f"token_shards[{refresh}] {shards.data_version}" in message and new_shards.data_version in message, message
    assert f"training_run {newer.data_version}" in message and "materialize checkpoint" in message, message
    assert store.manifest("evaluation").inputs == inputs  # nothing written
    # The documents scored per source are inputs too (the current ones: removal requests applied since are left out).
    assert {k: v for k, v in inputs.items() if k.startswith("quality_filtered_documents/")} == {
        f"quality_filtered_documents/{p}": store.manifest("quality_filtered_documents", p).data_version
        for p in (project.partition("web"), project.partition("ref"))}

def test_the_loss_curve_draws_each_step_once_by_the_row_the_run_kept():
    """metrics.jsonl holds a step twice when it was trained again (a resume from the checkpoint at step 2, a rollback):
    drawn in file order the curve doubled back. Worked by hand: steps 1-4, then 3-4 again after the resume."""
    from assets.training import loss_curve

    rows = [{"step": s, "train/loss": loss, "train/lr": 0.1} for s, loss in ((1, 5.0), (2, 4.0), (3, 9.0), (4, 8.0))]
    rows += [{"step": 2, "val/loss": 4.5}]  # a validation row: no training loss
    rows += [{"step": s, "train/loss": loss, "train/lr": 0.05} for s, loss in ((3, 3.5), (4, 3.0))]
    assert loss_curve(rows) == [(1, 5.0, 0.1), (2, 4.0, 0.1), (3, 3.5, 0.05), (4, 3.0, 0.05)]
