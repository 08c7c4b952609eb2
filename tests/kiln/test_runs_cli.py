"""`kiln runs list` and `kiln runs prune`: which runs' checkpoints go (here and on S3, against moto's server on
loopback), which stay and why, and that what a run is and did stays with it."""

import json
import shutil
from pathlib import Path

from kiln.cli import main
from kiln.common.remote import S3Remote
from kiln.common.run_mirror import RunMirror
from kiln.common.storage import Store
from training_jobs.launch import run_folder_lock
from tests.run_folders import make_run
from tests.s3 import _moto_server, s3_client, s3_endpoint  # noqa: F401 (fixtures)

DEFAULT = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


def commit(store: Store, asset: str, stats: dict, inputs: dict | None = None) -> str:
    with store.staging(asset) as writer:
        (writer.dir / "summary.json").write_text(json.dumps(stats))
        return writer.commit(code_version="test", config={}, inputs=inputs or {}, counts={}, stats=stats).data_version


def store_naming(store: Store, runs: Path, current: str, checkpointed: str) -> None:
    """The store's training_run names run `current`; its checkpoint came from an earlier training_run version,
    of run `checkpointed` (the checkpoint asset not yet materialized again)."""
    earlier = commit(store, "training_run", {"run_dir": str(runs / checkpointed)})
    commit(store, "checkpoint", {"model": "tiny"}, inputs={"training_run": earlier})
    commit(store, "training_run", {"run_dir": str(runs / current)})


def kiln_runs(*args: str, home: Path, config: Path = DEFAULT) -> None:
    assert main(["runs", *args, "--home", str(home), "--config", str(config), "--json"]) == 0


def listed(capsys) -> dict[str, dict]:
    return {r["key"]: r for r in json.loads(capsys.readouterr().out)["runs"]}


def test_prune_deletes_the_checkpoints_of_runs_the_store_moved_past_and_keeps_what_they_are(tmp_path, capsys):
    home = tmp_path / "kiln"
    runs = home / "runs"
    for key, steps, age in (("current", [4, 8], 500), ("carded", [6], 400), ("recent", [2], 100),
                            ("old", [3, 6], 1000), ("older", [5], 2000), ("busy", [1], 3000)):
        make_run(runs, key, steps, age, status="failed" if key == "recent" else "completed")
    store_naming(Store(home / "data"), runs, current="current", checkpointed="carded")
    (runs / "carded" / ".pruned-0badf00d").mkdir()  # left by a prune killed mid-deletion (SIGKILL, power loss)
    (runs / "carded" / ".pruned-0badf00d" / "zero_pp_rank_0_optim_states.pt").write_bytes(b"x" * 1000)
    (runs / "busy" / ".pruned-feedface").mkdir()  # the same in a run held now: perhaps another prune deleting it

    with run_folder_lock(runs / "busy"):  # a launch trains there now
        kiln_runs("list", home=home)
        before = listed(capsys)
        assert [k for k in before] == ["recent", "carded", "current", "old", "older", "busy"]  # newest first
        assert {k: r["kept_because"] for k, r in before.items()} == {
            "current": "the store's current training_run", "carded": "the run of the store's current checkpoint",
            "recent": "one of the 1 newest others", "old": None, "older": None,
            "busy": before["busy"]["kept_because"]}
        assert before["busy"]["kept_because"].startswith(f"in use: {runs / 'busy'} is being trained by another launch")
        assert before["old"]["checkpoints"] == ["step_00000003", "step_00000006"] and before["old"]["steps"] == 6
        assert before["old"]["checkpoint_bytes"] > 200_000

        kiln_runs("prune", home=home)  # a dry run: nothing deleted
        capsys.readouterr()
        assert (runs / "old" / "checkpoints" / "step_00000006" / "manifest.json").is_file()

        kiln_runs("prune", "--yes", home=home)
        freed = json.loads(capsys.readouterr().out)["freed_bytes"]
    assert freed == before["old"]["checkpoint_bytes"] + before["older"]["checkpoint_bytes"] + 1000
    assert not (runs / "carded" / ".pruned-0badf00d").exists()
    assert (runs / "busy" / ".pruned-feedface").is_dir()  # left to whoever holds the run
    for key in ("old", "older"):
        assert not (runs / key / "checkpoints").exists() and not list((runs / key).glob(".pruned-*"))
        assert {p.name for p in (runs / key).iterdir()} >= {"summary.json", "metrics.jsonl", "mlflow_run_id", "export"}
        assert (runs / key / "export" / "safetensors" / "model.safetensors").read_bytes() == b"weights"
    assert json.loads((runs / "old" / "checkpoints_pruned.json").read_text())["checkpoints"] == \
        ["step_00000003", "step_00000006"]
    for key in ("current", "carded", "recent", "busy"):
        assert (runs / key / "checkpoints").is_dir(), key

    # --keep 0: the failed recent run goes too; the store's runs never do
    kiln_runs("prune", "--yes", "--keep", "0", home=home)
    capsys.readouterr()
    assert not (runs / "recent" / "checkpoints").exists()
    assert not (runs / "busy" / ".pruned-feedface").exists()  # let go of since
    assert (runs / "current" / "checkpoints" / "step_00000008" / "manifest.json").is_file()
    assert (runs / "carded" / "checkpoints" / "step_00000006" / "manifest.json").is_file()


def test_prune_deletes_the_copies_on_s3_too_and_a_run_another_machine_trains_stays(tmp_path, s3_endpoint, capsys):  # noqa: F811
    client = s3_client(s3_endpoint)
    remote = S3Remote.connect(client, "kiln-runs", "team", create_bucket=True)
    config = tmp_path / "kiln.yaml"
    config.write_text(f"extends: {DEFAULT}\nstorage:\n  backend: s3\n  bucket: kiln-runs\n  prefix: team\n"
                      "  keep_old_run_checkpoints: 0\n")  # prune's --keep when it is not given
    home = tmp_path / "kiln"
    runs = home / "runs"
    elsewhere = tmp_path / "machine-b" / "runs"  # runs trained on another machine: only their copy is on S3
    for folder in (make_run(runs, "current", [4], 500), make_run(runs, "old", [2, 3], 1000),
                   make_run(elsewhere, "gone", [7], 0), make_run(elsewhere, "held", [9], 0)):
        assert RunMirror(remote, folder, keep_last=2).push()
    store_naming(Store(home / "data", remote), runs, current="current", checkpointed="current")
    shutil.rmtree(home / "data")  # this machine's cache: the store's runs are read from S3's manifests alone

    with RunMirror(remote, elsewhere / "held").holding():  # machine b trains "held" now
        kiln_runs("prune", "--yes", config=config, home=home)
    pruned = listed(capsys)
    assert pruned["held"]["kept_because"].startswith("in use: ") and "launch.lock is held by" in \
        pruned["held"]["kept_because"]
    assert pruned["gone"]["on_s3"] == ["step_00000007"] and pruned["gone"]["kept_because"] is None

    def on_s3(key: str) -> set[str]:
        return {k.split("/checkpoints/")[1] for k in remote.list_keys(f"team/_runs/{key}/checkpoints")}

    assert on_s3("old") == on_s3("gone") == set()
    assert on_s3("current") == {"step_00000004/manifest.json", "step_00000004/mp_rank_00_model_states.pt"}
    assert "step_00000009/manifest.json" in on_s3("held")
    assert remote.get_bytes("team/_runs/old/run/metrics.jsonl") is not None  # what the run did stays
    assert not (runs / "old" / "checkpoints").exists()
    assert not (home / "data" / "checkpoint").exists()  # no dataset was fetched to answer (a checkpoint's weights)


def test_a_bad_keep_names_the_flag(tmp_path, capsys):
    assert main(["runs", "prune", "--keep", "-1", "--home", str(tmp_path), "--config", str(DEFAULT)]) == 2
    assert "kiln runs prune: --keep -1: give 0 or more" in capsys.readouterr().err
