"""The data engine: the same bytes whatever runs the stages — in this process, a process pool, an embedded Ray with
1, 2 or 4 workers, a two-node Ray cluster, and that cluster losing a node mid-stage (a filter stage, and the
near-dup decision rounds) — and clear errors for a bad address. The stages compared: intake, filters, exact dedup,
signatures, token shards (tokenize tasks) and the quality classifier's cross-fitted fold fits."""

import contextlib
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from kiln import engine as engine_module
from kiln.common.config import parse_config
from kiln.common.secrets import redact, redact_url
from kiln.common.storage import Store
from kiln.dedup.buckets import read_decisions
from kiln.dedup.near import NEAR_DUPLICATE
from kiln.dedup.shuffle import SCRATCH, SHUFFLE
from kiln.engine import SERIAL, EngineError, ProcessPool, RayEngine, engine_for
from kiln.engine.base import GUIDED, chunks
from kiln.quality.classifier import CARD_FILE, MODEL_FILE, SAMPLE_FILE, ClassifierCard
from kiln.tokens.shard_format import read_shard_set
from tests.engine_stages import (
    CLASSIFIER,
    DOWNSTREAM,
    REPEATED_IDS,
    corpus_config,
    downstream_stages,
    exact_and_signature_stages,
    filter_stage,
    fingerprint,
    ingest_all,
    near_stage,
    run_stages,
    train_stage_tokenizer,
    write_corpus,
)
from tests.ray_cluster import start_cluster

REPO = Path(__file__).resolve().parents[3]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    root = tmp_path_factory.mktemp("engine-corpus")
    write_corpus(root, 600)
    return root


@pytest.fixture(scope="module")
def serial_store(corpus, tmp_path_factory) -> Store:
    """The stages in this process, one part after another (read only: copy it to write more)."""
    store = Store(tmp_path_factory.mktemp("serial"))
    config = corpus_config(corpus)
    ingest_all(config, store)
    run_stages(config, store, SERIAL)
    return store


@pytest.fixture(scope="module")
def tokenizer(corpus, serial_store, tmp_path_factory) -> Path:
    """Trained once, in this process: every engine's token shards use the same model."""
    return train_stage_tokenizer(corpus_config(corpus), serial_store, tmp_path_factory.mktemp("tokenizer"))


@pytest.fixture(scope="module")
def serial_downstream(corpus, serial_store, tokenizer, tmp_path_factory) -> Store:
    """Token shards and the quality classifier in this process, on a copy of the serial store's curated data."""
    store = Store(shutil.copytree(serial_store.root, tmp_path_factory.mktemp("serial-downstream") / "store"))
    downstream_stages(corpus_config(corpus), store, SERIAL, tokenizer)
    return store


@pytest.fixture(scope="module")
def reference(serial_store, serial_downstream):
    """What every engine must reproduce byte for byte."""
    return fingerprint(serial_store) | fingerprint(serial_downstream, assets=DOWNSTREAM)


@pytest.fixture(scope="module", autouse=True)
def embedded_ray_stops():
    yield
    engine_module.shutdown()  # the embedded Ray this module started: nothing left running


def test_reference_run_has_work_for_every_stage(reference, corpus, tmp_path):
    """Not a vacuous comparison: filters drop, exact dedup finds copies within and across sources, parts are many."""
    rejected = {p.split("/")[0] + "/" + p.split("/")[1] for p in reference if "/rejected-" in p}
    assert rejected == {"filtered/web", "filtered/mirror", "curated/web", "curated/mirror"}
    assert sum("/part-" in p and p.startswith("filtered/web") for p in reference) == 12  # 600 docs, 50 per part
    # Intake read web's 4 files as 4 tasks; the ids its last file repeats are quarantined, nothing else is.
    store = Store(tmp_path / "store")
    ingest_all(corpus_config(corpus), store)
    quarantine = store.read_table("raw", "web", "quarantine").to_pylist()
    assert [q["reason"] for q in quarantine] == ["duplicate_doc_id"] * REPEATED_IDS
    assert {q["locator"] for q in quarantine} == {f"id:syn-1-{i}" for i in range(REPEATED_IDS)}
    assert store.read_table("raw", "web").num_rows == 600


def test_reference_downstream_stages_have_work_for_every_task(serial_downstream, reference):
    """Token shards from several tokenize tasks per source, FIM applied, mirror repeated; a classifier whose every
    fold was fitted and scored (a fold that failed or was skipped leaves NaN scores), scores that differ."""
    shards = read_shard_set(serial_downstream.dataset_dir("token_shards"))
    assert {s.split for s in shards.shards} == {"train", "val"} and len(shards.shards) >= 3
    stats = serial_downstream.manifest("token_shards").stats
    assert stats["sources"]["web"]["parts"] >= 4 and stats["sources"]["mirror"]["parts"] >= 2
    assert stats["sources"]["mirror"]["fim_documents"] > 0 and stats["sources"]["web"]["fim_documents"] == 0
    assert stats["sources"]["mirror"]["effective_epochs"] > 1 > stats["sources"]["web"]["effective_epochs"]
    assert sum(p.startswith("token_shards/") and p.endswith(".bin") for p in reference) == len(shards.shards)
    folder = serial_downstream.dataset_dir("quality_classifier")
    sample = pq.read_table(folder / SAMPLE_FILE).to_pydict()
    scores = np.array(sample["out_of_fold_score"], dtype=float)
    assert sorted(set(sample["fold"])) == list(range(CLASSIFIER.folds)) and np.isfinite(scores).all()
    folds = np.array(sample["fold"])  # per-document scores from each fold's model, not one constant per fold
    assert all(len(set(scores[folds == k].tolist())) > 10 for k in range(CLASSIFIER.folds))
    assert ClassifierCard.read(folder).cross_validation["folds"] == CLASSIFIER.folds
    assert {p.rsplit("/", 1)[1] for p in reference if p.startswith("quality_classifier/")} >= {MODEL_FILE, CARD_FILE,
                                                                                                SAMPLE_FILE}


@pytest.mark.parametrize("engine", [ProcessPool(workers=2), RayEngine(workers=4), RayEngine(workers=1),
                                    RayEngine(workers=2)], ids=["pool-2", "ray-4", "ray-1", "ray-2"])
def test_every_engine_and_worker_count_writes_the_same_bytes(engine, corpus, tokenizer, reference, tmp_path):
    """Every stage from intake to the token shards' bytes and the classifier's model and out-of-fold scores."""
    store = Store(tmp_path / "store")
    config = corpus_config(corpus)
    ingest_all(config, store, engine)
    run_stages(config, store, engine)
    downstream_stages(config, store, engine, tokenizer)
    assert fingerprint(store) | fingerprint(store, assets=DOWNSTREAM) == reference


def test_a_round_is_dispatched_in_runs_that_shrink_to_single_tasks():
    """182 equal tasks on 2 workers, each run 1/(GUIDED x 2) = 1/4 of the tasks left, at least one, worked by hand:
    182/4 = 45.5 -> 45; 137/4 -> 34; 103/4 -> 25; 78/4 -> 19; 59/4 -> 14; 45/4 -> 11; 34/4 -> 8; 26/4 -> 6; 20/4 -> 5;
    15/4 -> 3; 12/4 -> 3; 9/4 -> 2; then 7 tasks left, each run under 2: one task each."""
    assert GUIDED == 2
    got = chunks(list(range(182)), 2)
    assert [len(c) for c in got] == [45, 34, 25, 19, 14, 11, 8, 6, 5, 3, 3, 2] + [1] * 7
    assert [i for c in got for i in c] == list(range(182))  # consecutive runs of the task order


@pytest.mark.parametrize("n, workers", [(2000, 2), (40, 2), (31, 1), (5000, 7), (1, 3)])
def test_sized_rounds_go_largest_first_and_no_run_holds_more_than_its_share(n, workers):
    """With sizes: the launch order is the largest first, every task once; a run holds at most 1/(GUIDED x workers)
    of the work left when it starts, unless it is one task larger than that; the last run is one task."""
    sizes = [(i * 7919) % 1000 + 1 + (1000 * n if i == n // 2 else 0) for i in range(n)]  # one above any share
    got = chunks([f"task-{i}" for i in range(n)], workers, size=lambda t: sizes[int(t[5:])])
    order = [i for c in got for i in c]
    assert sorted(order) == list(range(n)) and [sizes[i] for i in order] == sorted(sizes, reverse=True)
    left = sum(sizes)
    for c in got:
        work = sum(sizes[i] for i in c)
        assert len(c) == 1 or work <= left / (GUIDED * workers)
        left -= work
    assert len(got[-1]) == 1 and got[0] == [n // 2]


def test_a_pool_round_of_many_small_tasks_returns_each_result_at_its_task():
    tasks = list(range(1000))
    assert ProcessPool(workers=2).map_parts(abs, [-t for t in tasks], desc="t", progress=False,
                                            size=lambda t: t % 7) == tasks


def test_a_killed_driver_leaves_no_pool_process_behind():
    """A step process using the pool SIGKILLed (the out-of-memory killer, a hard kill) runs no exit handler: its
    workers, its forkserver and its resource tracker must still go, not live on adopted by init."""
    import psutil

    code = ("import time; from kiln.engine import ProcessPool\n"
            "ProcessPool(workers=2).map_parts(abs, [-1, -2, -3, -4], desc='t', progress=False)\n"
            "print('ready', flush=True); time.sleep(600)")
    driver = subprocess.Popen([sys.executable, "-c", code], cwd=REPO, stdout=subprocess.PIPE, text=True)
    pool: list = []
    try:
        assert driver.stdout.readline().strip() == "ready"
        pool = psutil.Process(driver.pid).children(recursive=True)
        assert len(pool) >= 3, pool  # the forkserver and its two workers
    finally:
        driver.kill()
        driver.wait()

    def alive() -> list:  # an exited process this sandbox's init never reaps stays a zombie: gone all the same
        with_status = []
        for proc in pool:
            with contextlib.suppress(psutil.Error):
                if proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE:
                    with_status.append(proc)
        return with_status

    deadline = time.monotonic() + 10
    while alive() and time.monotonic() < deadline:
        time.sleep(0.2)
    left = [(proc.pid, " ".join(proc.cmdline())[-80:]) for proc in alive()]
    for proc in alive():  # by the pids recorded above, never by name
        proc.kill()
    assert not left, left


@pytest.mark.parametrize("workers", [1, 2])
def test_ray_never_runs_more_tasks_at_once_than_its_workers(workers, tmp_path):
    """With as many workers as Ray has CPUs, twice that many chunks are in flight (the next one queued at each
    worker's lease) and Ray's CPU accounting still runs only `workers` at once; with fewer, only `workers` are in
    flight. Each task records when it ran; no instant is inside more than `workers` of them."""
    cpus = max(os.cpu_count() or 1, workers)  # the embedded Ray's CPUs (ray_engine.connect)
    folder = str(tmp_path)

    def timed(task):
        start = time.time()
        time.sleep(0.1)
        Path(folder, f"{task}.txt").write_text(f"{start} {time.time()}")
        return task

    assert RayEngine(workers=workers).map_parts(timed, list(range(24)), desc="t", progress=False) == list(range(24))
    spans = [tuple(map(float, p.read_text().split())) for p in tmp_path.glob("*.txt")]
    assert len(spans) == 24
    most = max(sum(1 for a, b in spans if a <= t < b) for t, _ in spans)
    assert 1 <= most <= min(workers, cpus)


def test_an_embedded_ray_too_small_for_the_workers_asked_is_started_again_larger():
    """An embedded Ray started for fewer workers was reused as it was: asked for more workers than its CPUs, a
    stage ran only as many tasks at once as it had. Fewer workers keep the running one."""
    import ray

    first = RayEngine(workers=(os.cpu_count() or 1) + 1).session()  # or the larger one an earlier test started
    cpus, node = int(ray.cluster_resources()["CPU"]), ray.get_runtime_context().get_node_id()
    assert cpus >= (os.cpu_count() or 1) + 1
    larger = RayEngine(workers=cpus + 2).session()
    # Another Ray: a new node id (the GCS port alone may be the freed one, reused), and the CPUs asked for.
    assert larger is not first and ray.get_runtime_context().get_node_id() != node
    assert ray.cluster_resources()["CPU"] == cpus + 2
    assert RayEngine(workers=1).session() is larger  # enough CPUs: the same Ray


def test_ray_engine_describes_itself_without_credentials():
    described = RayEngine(workers=2).describe()
    assert described["engine"] == "ray" and described["address"] == "embedded" and described["workers"] == 2
    assert described["nodes"] == 1


def test_addresses_and_recorded_values_lose_their_credentials():
    assert redact_url("admin:s3cret@head.example:6379") == "head.example:6379"
    assert redact_url("ray://admin:s3cret@head:10001") == "ray://head:10001"
    assert redact_url("10.0.0.5:6379") == "10.0.0.5:6379"
    assert redact_url("redis://:pw@127.0.0.1:6380/0") == "redis://127.0.0.1:6380/0"
    config = {"engine": {"ray_address": "ray://u:pw@r:10001"}, "hosts": ["s3://k:pw@b/x", "a@b.org"]}
    assert redact(config) == {"engine": {"ray_address": "ray://r:10001"}, "hosts": ["s3://b/x", "a@b.org"]}


def test_a_password_holding_an_at_sign_is_redacted_whole():
    """urllib (so MLflow, requests, redis) reads an unencoded '@' in a password as part of it: the userinfo ends at
    the authority's last '@'. Redaction stopped at the first and showed the rest of the password as the host."""
    from urllib.parse import urlsplit

    url = "http://kiln:p@ss@mlflow.internal:5000/#/experiments?owner=a@b.org"
    assert urlsplit(url).password == "p@ss" and urlsplit(url).hostname == "mlflow.internal"
    assert redact_url(url) == "http://mlflow.internal:5000/#/experiments?owner=a@b.org"
    assert redact_url("redis://:s3cr3t@pw@redis.svc:6379/0") == "redis://redis.svc:6379/0"
    assert redact_url("admin:p@ss@head-node:6379") == "head-node:6379"
    assert redact({"uri": f"see {url} and http://a:b@h"}) == {
        "uri": "see http://mlflow.internal:5000/#/experiments?owner=a@b.org and http://h"}


def test_a_bad_ray_address_names_the_key_and_the_address(monkeypatch):
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    config = parse_config({"sources": [{"name": "web", "kind": "jsonl", "path": "x", "license": "CC0",
                                        "domain": "web", "profile": "none"}], "profiles": {"none": []},
                           "engine": {"ray_address": "127.0.0.1:9"}})
    started = time.monotonic()
    with pytest.raises(EngineError) as error:
        engine_for(config.engine).map_parts(abs, [1], desc="t", progress=False)
    assert "engine.ray_address" in str(error.value) and "127.0.0.1:9" in str(error.value)
    assert time.monotonic() - started < 30  # not Ray's minute of retries
    with pytest.raises(EngineError, match="Ray Client address.*GCS address"):
        RayEngine("ray://127.0.0.1:10001").map_parts(abs, [1], desc="t", progress=False)


def test_ray_address_from_the_environment_is_named_as_such(monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", "127.0.0.1:9")
    with pytest.raises(EngineError, match=r"RAY_ADDRESS = '127\.0\.0\.1:9'"):
        RayEngine().map_parts(abs, [1], desc="t", progress=False)


def _driver(cluster, store: Path, corpus: Path, stage: str = "stages") -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "tests.engine_stages", str(store), str(corpus), stage], cwd=REPO,
                            env=cluster.env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.fixture(scope="module")
def cluster():
    """One two-node loopback cluster for the node-loss tests (each test kills its worker node; the next one starts a
    fresh worker): one cluster start, not one per test."""
    started = start_cluster(nodes=2)
    yield started
    started.stop()


@pytest.mark.slow
def test_a_stopped_test_cluster_leaves_no_process_behind():
    """`RayCluster.stop` stops what its `ray start` calls started, and the agents each raylet forks, which rename
    themselves (`ray::DashboardAgent`, `ray::RuntimeEnvAgent`) and outlive their raylet: nothing of it survives."""
    import psutil

    started = start_cluster(nodes=1)
    try:
        roots = [psutil.Process(pid) for pid in set().union(*started.node_pids) if psutil.pid_exists(pid)]
        tree = {p for root in roots for p in [root, *root.children(recursive=True)]}
        assert any(p.name().startswith("ray::") for p in tree), [p.name() for p in tree]  # the agents are found
    finally:
        started.stop()
    _, alive = psutil.wait_procs(tree, timeout=10)
    assert not alive, [(p.pid, p.name()) for p in alive]


def _lose_a_worker_mid_stage(cluster, driver: subprocess.Popen, started: Callable[[], bool], stage: str) -> None:
    """SIGKILL the worker node's raylet once `started()` holds and it is running a part task right now (a worker
    machine dying while its task runs); the driver must still finish, its lost tasks redone on the head."""
    worker = cluster.newest_node
    deadline = time.monotonic() + 300
    while not (started() and cluster.running_map_task(worker)):
        assert driver.poll() is None and time.monotonic() < deadline, f"the {stage} stage never reached the worker"
        time.sleep(0.02)
    cluster.kill_node(worker)
    killed_while_running = driver.poll() is None
    output, _ = driver.communicate(timeout=600)
    assert driver.returncode == 0, output
    assert killed_while_running
    # The node really is gone. The GCS marks it dead after missed health checks, which a fast stage can outrun: wait.
    deadline = time.monotonic() + 120
    while cluster.alive_nodes() != 1:
        assert time.monotonic() < deadline, "the killed node is still alive for the cluster"
        time.sleep(1)


@pytest.mark.slow
def test_two_node_cluster_gives_the_same_bytes_even_when_a_node_dies_mid_stage(cluster, tmp_path):
    corpus = tmp_path / "corpus"
    write_corpus(corpus, 2000)  # 40 + 10 parts: the filter stage runs long enough to lose a node in it
    config = corpus_config(corpus)
    serial = Store(tmp_path / "serial")
    ingest_all(config, serial)
    run_stages(config, serial, SERIAL)
    expected = fingerprint(serial)

    cluster.ensure_nodes(2)
    # Both nodes run parts until one dies (an undisturbed two-node run adds nothing: every byte is compared)
    disturbed = Store(tmp_path / "disturbed")
    ingest_all(config, disturbed)
    driver = _driver(cluster, disturbed.root, corpus)
    # Mid-stage: the filter has written parts, and the second node is running one right now.
    _lose_a_worker_mid_stage(
        cluster, driver, lambda: bool(list((disturbed.root / "filtered").glob(".web.staging-*/part-*.parquet"))),
        "filter")
    assert fingerprint(disturbed) == expected
    assert not list(disturbed.root.rglob(".*.tmp-*"))  # no half-written part anywhere


@pytest.mark.slow
def test_exact_dedup_gives_the_same_bytes_when_a_node_dies_mid_shuffle(cluster, tmp_path):
    """Exact dedup's two shuffle rounds (scatter per part, decide per bucket: one file per task, read by listing) on
    a two-node cluster that loses a raylet mid-stage: the same curated parts and signatures as in this process."""
    corpus = tmp_path / "corpus"
    write_corpus(corpus, 2000)  # 40 + 10 filtered parts: scatter tasks enough to lose a node among them
    config = corpus_config(corpus)
    serial = Store(tmp_path / "serial")
    ingest_all(config, serial)
    filter_stage(config, serial, SERIAL)
    disturbed = Store(shutil.copytree(serial.root, tmp_path / "disturbed"))  # the same filtered parts on both sides
    exact_and_signature_stages(config, serial, SERIAL)
    expected = fingerprint(serial, assets=("curated", "signatures"))
    assert any(p.startswith("curated/") for p in expected)

    cluster.ensure_nodes(2)
    driver = _driver(cluster, disturbed.root, corpus, "exact")
    # Mid-stage: the scatter round has written shuffle files, and the worker runs a task right now.
    _lose_a_worker_mid_stage(cluster, driver, lambda: bool(list((disturbed.root / "curated").glob(
        f".*.staging-*/.shuffle/scatter/*{SHUFFLE}"))), "exact dedup")
    assert fingerprint(disturbed, assets=("curated", "signatures")) == expected
    assert not list(disturbed.root.rglob(".*.tmp-*"))  # no half-written file anywhere


@pytest.mark.slow
def test_near_dup_decisions_are_the_same_when_a_node_dies_mid_stage(cluster, tmp_path):
    """decide_distributed's rounds (shuffle writes named by task position, read by listing) on a two-node cluster
    that loses a raylet mid-stage: the same decisions and bucket index, byte for byte, as in this process."""
    corpus = tmp_path / "corpus"
    write_corpus(corpus, 3000)  # 75 signature parts: on 600 documents the 11 rounds could end before the kill
    config = corpus_config(corpus)
    signed = Store(tmp_path / "signed")
    ingest_all(config, signed)
    run_stages(config, signed, SERIAL)
    # The same signatures on both sides: only the near-dup rounds are disturbed.
    serial, disturbed = (Store(shutil.copytree(signed.root, tmp_path / name)) for name in ("serial", "disturbed"))
    near_stage(config, serial, SERIAL)
    expected = fingerprint(serial, assets=("near",))
    decisions = read_decisions(serial.root / "near")
    assert decisions.column("status").to_pylist().count(NEAR_DUPLICATE) >= 10  # not a vacuous comparison
    signature_parts = sum(len(serial.files("signatures", s.name, "signatures")) for s in config.sources)
    assert sum(p.startswith("near/decisions/") for p in expected) == signature_parts  # one decisions file per part
    assert "near/index/_index.json" in expected

    cluster.ensure_nodes(2)
    driver = _driver(cluster, disturbed.root, corpus, "near")
    # Mid-stage: the keys round has written node tables (shuffles under way), and the worker runs a task right now.
    _lose_a_worker_mid_stage(cluster, driver, lambda: bool(list((disturbed.root / ".near-work" / "nodes").glob(
        f"*{SCRATCH}"))), "near-dup")
    assert fingerprint(disturbed, assets=("near",)) == expected
    assert not list(disturbed.root.rglob(".*.tmp-*"))  # no half-written file anywhere


def _missing_checkpoint(path):
    raise FileNotFoundError(f"quality.perplexity.model = {path!r} is not a Kiln checkpoint")  # a message, no filename


def test_a_task_s_file_not_found_reads_the_same_on_the_pool_and_on_one_machine_s_ray():
    """Only a missing file on a cluster of several nodes may be a KILN_HOME that is not shared; otherwise the task's
    own error comes back as it was raised, as the process pool gives it."""
    expected = "quality.perplexity.model = '/no/such/checkpoint' is not a Kiln checkpoint"
    for engine in (ProcessPool(workers=2), RayEngine(workers=2)):
        with pytest.raises(FileNotFoundError) as error:
            engine.map_parts(_missing_checkpoint, ["/no/such/checkpoint"], desc="t", progress=False)
        assert str(error.value).strip().splitlines()[-1].endswith(expected), (engine, str(error.value))
        assert "shared filesystem" not in str(error.value)


def test_a_file_missing_on_a_node_of_a_cluster_names_the_shared_filesystem_and_keeps_the_error():
    from kiln.engine.ray_engine import _run_part

    def missing(path):
        raise FileNotFoundError(2, "No such file or directory", path)

    with pytest.raises(EngineError, match=r"No such file or directory: '/store/part-1'.*one shared filesystem"):
        _run_part(missing, "/store/part-1", nodes=2)
    with pytest.raises(FileNotFoundError, match=r"^\[Errno 2\] No such file or directory: '/store/part-1'$"):
        _run_part(missing, "/store/part-1", nodes=1)  # one machine: nothing to share
