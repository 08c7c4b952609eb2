"""A run folder's checkpoints on S3 (kiln/common/run_mirror.py), against moto's server on loopback: what goes up,
in which order, what comes down on another machine, and what a damaged or half-uploaded copy does. The run itself
resuming from a downloaded checkpoint, bit for bit: test_train_cpu.py."""

import json
import threading

import pytest

from kiln.common.remote import CorruptRemoteFile, S3Remote
from tests.s3 import _moto_server, s3_client, s3_endpoint  # noqa: F401 (fixtures)
from tests.training_jobs.test_checkpoint import fake_checkpoint
from training_jobs import checkpoint
from kiln.common.run_mirror import RunMirror

BUCKET, KEY = "kiln-runs", "run-abc"  # the run folder's name: $KILN_HOME/runs/<key> on every machine


@pytest.fixture
def remote(s3_endpoint):  # noqa: F811
    return S3Remote.connect(s3_client(s3_endpoint), BUCKET, "team/kiln", create_bucket=True)


def mirror(remote, run_dir, keep_last=2) -> RunMirror:
    return RunMirror(remote, run_dir, keep_last=keep_last)


def keys(remote) -> set[str]:
    return {k.removeprefix(f"team/kiln/_runs/{KEY}/") for k in remote.list_keys(f"team/kiln/_runs/{KEY}")}


def files_of(folder) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_complete_checkpoints_go_up_with_the_run_files_and_s3_keeps_the_newest_keep_last(remote, tmp_path):
    run = tmp_path / "a" / KEY
    ckpts = run / "checkpoints"
    for step in (4, 8):
        fake_checkpoint(ckpts, step)
    fake_checkpoint(ckpts, 12, complete=False)  # being saved: not uploaded
    (run / "metrics.jsonl").write_text('{"step": 1}\n')
    (run / "mlflow_run_id").write_text("abc123")
    assert mirror(remote, run).push() == ["step_00000008", "step_00000004"]
    model, optim = "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    assert keys(remote) == {f"checkpoints/step_0000000{s}/{name}" for s in (4, 8)
                            for name in (model, optim, checkpoint.MANIFEST)} | {"run/metrics.jsonl",
                                                                                 "run/mlflow_run_id"}
    manifest = remote.get_bytes(f"team/kiln/_runs/{KEY}/checkpoints/step_00000008/{checkpoint.MANIFEST}")
    assert manifest == (ckpts / "step_00000008" / checkpoint.MANIFEST).read_bytes()
    assert mirror(remote, run).push() == []  # a second look (a fresh mirror reads S3 again): nothing new

    checkpoint.write_manifest(ckpts / "step_00000012", 12, {"model": {}})  # step 12 completes; keep_last 2
    checkpoint.prune(ckpts, 2)
    assert mirror(remote, run).push() == ["step_00000012"]
    assert {k.split("/")[1] for k in keys(remote) if k.startswith("checkpoints/")} == {"step_00000008",
                                                                                         "step_00000012"}


def test_the_pulled_checkpoint_is_the_one_a_launch_resumes(remote, tmp_path):
    run = tmp_path / "a" / KEY
    for step in (4, 8):
        fake_checkpoint(run / "checkpoints", step)
    (run / "metrics.jsonl").write_text('{"step": 1}\n{"step": 8}\n')
    (run / "mlflow_run_id").write_text("abc123")
    mirror(remote, run).push()
    there = tmp_path / "b" / KEY
    warnings = []
    assert mirror(remote, there).pull(warnings.append) == "step_00000008" and not warnings
    assert files_of(there / "checkpoints" / "step_00000008") == files_of(run / "checkpoints" / "step_00000008")
    assert [f.path.name for f in checkpoint.checkpoints(there / "checkpoints")] == ["step_00000008"]
    found = checkpoint.find_resumable(there / "checkpoints", warn=warnings.append)
    assert found is not None and found.step == 8 and not warnings  # every file verifies against its sha256
    assert (there / "metrics.jsonl").read_bytes() == (run / "metrics.jsonl").read_bytes()
    assert (there / "mlflow_run_id").read_text() == "abc123"
    assert not list((there / "checkpoints").glob(".pulling-*"))


def test_a_machine_with_the_same_or_a_newer_checkpoint_downloads_nothing(remote, tmp_path):
    run = tmp_path / "a" / KEY
    fake_checkpoint(run / "checkpoints", 4)
    mirror(remote, run).push()
    same = tmp_path / "same" / KEY
    fake_checkpoint(same / "checkpoints", 4)
    newer = tmp_path / "newer" / KEY
    fake_checkpoint(newer / "checkpoints", 8)
    for folder in (same, newer):
        before = files_of(folder)
        assert mirror(remote, folder).pull(pytest.fail) is None
        assert files_of(folder) == before


def test_a_corrupt_copy_on_s3_is_reported_and_the_one_before_is_pulled(remote, tmp_path):
    run = tmp_path / "a" / KEY
    for step in (4, 8):
        fake_checkpoint(run / "checkpoints", step)
    mirror(remote, run).push()
    victim = f"team/kiln/_runs/{KEY}/checkpoints/step_00000008/zero_pp_rank_0_mp_rank_00_optim_states.pt"
    remote.put_bytes(victim, b"optim" * 299 + b"OPTIM")  # same size, other bytes: changed after Kiln wrote it
    there, warnings = tmp_path / "b" / KEY, []
    assert mirror(remote, there).pull(warnings.append) == "step_00000004"
    assert len(warnings) == 1 and "step_00000008" in warnings[0] and "sha256" in warnings[0]
    assert files_of(there / "checkpoints") == {f"step_00000004/{k}": v for k, v in
                                              files_of(run / "checkpoints" / "step_00000004").items()}


def test_an_incomplete_copy_here_is_moved_aside_for_the_complete_one(remote, tmp_path):
    run = tmp_path / "a" / KEY
    fake_checkpoint(run / "checkpoints", 8)
    mirror(remote, run).push()
    there = tmp_path / "b" / KEY
    half = fake_checkpoint(there / "checkpoints", 8, complete=False)  # this machine crashed while saving step 8
    (half / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"cut")
    assert mirror(remote, there).pull(pytest.fail) == "step_00000008"
    assert checkpoint.verify(there / "checkpoints" / "step_00000008") is None
    rejected = there / "checkpoints" / checkpoint.REJECTED / "step_00000008"
    assert (rejected / "zero_pp_rank_0_mp_rank_00_optim_states.pt").read_bytes() == b"cut"
    assert "downloaded from s3://" in (rejected / "REJECTED.txt").read_text()


def test_a_checkpoint_half_uploaded_is_not_complete_on_s3(remote, tmp_path, monkeypatch):
    """The upload dies after the files, before the manifest (the process killed): S3 holds no complete step 8, so
    another machine pulls step 4, and the next push uploads step 8 whole."""
    run = tmp_path / "a" / KEY
    fake_checkpoint(run / "checkpoints", 4)
    mirror(remote, run).push()
    fake_checkpoint(run / "checkpoints", 8)
    dying = mirror(remote, run)
    monkeypatch.setattr(S3Remote, "put_bytes", lambda self, key, data: (_ for _ in ()).throw(SystemExit("killed")))
    with pytest.raises(SystemExit):
        dying.push()
    monkeypatch.undo()
    assert "checkpoints/step_00000008/zero_pp_rank_0_mp_rank_00_model_states.pt" in keys(remote)
    assert mirror(remote, tmp_path / "b" / KEY).pull(pytest.fail) == "step_00000004"
    assert mirror(remote, run).push() == ["step_00000008"]
    assert mirror(remote, tmp_path / "c" / KEY).pull(pytest.fail) == "step_00000008"


def test_a_checkpoint_rotated_away_mid_upload_is_skipped(remote, tmp_path, monkeypatch):
    """keep_last deletes step 4 while it is uploaded (step 8 completed meanwhile): no manifest goes up for it."""
    import shutil

    run = tmp_path / "a" / KEY
    old = fake_checkpoint(run / "checkpoints", 4)
    upload = S3Remote.upload_files

    def rotated_first(self, items):
        if any(str(path).startswith(str(old)) for path, _ in items):
            fake_checkpoint(run / "checkpoints", 8)
            shutil.rmtree(old)
        return upload(self, items)

    monkeypatch.setattr(S3Remote, "upload_files", rotated_first)
    assert mirror(remote, run, keep_last=1).push() == []
    assert not any(k.endswith(checkpoint.MANIFEST) for k in keys(remote))
    assert mirror(remote, run, keep_last=1).push() == ["step_00000008"]


def test_a_step_saved_again_after_a_rollback_replaces_its_copy(remote, tmp_path):
    run = tmp_path / "a" / KEY
    ckpt = fake_checkpoint(run / "checkpoints", 8)
    runs_mirror = mirror(remote, run)
    runs_mirror.push()
    (ckpt / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"other weights")
    checkpoint.write_manifest(ckpt, 8, {"model": {}, "after": "rollback"})
    assert runs_mirror.push() == ["step_00000008"]
    there = tmp_path / "b" / KEY
    assert mirror(remote, there).pull(pytest.fail) == "step_00000008"
    assert files_of(there / "checkpoints" / "step_00000008") == files_of(ckpt)


def test_pushing_uploads_while_the_block_runs_and_once_more_at_its_end(remote, tmp_path):
    run = tmp_path / "a" / KEY
    info, warnings, seen = [], [], threading.Event()
    pushes = mirror(remote, run)

    def logged(message):
        info.append(message)
        seen.set()

    with pushes.pushing(logged, warnings.append, every_s=0.05):
        fake_checkpoint(run / "checkpoints", 4)
        assert seen.wait(30), "step 4 was not uploaded while the block ran"
        fake_checkpoint(run / "checkpoints", 8)  # the run's last checkpoint, just before it ends
    assert not warnings and any("step_00000008" in m for m in info)
    assert json.loads(remote.get_bytes(f"team/kiln/_runs/{KEY}/checkpoints/step_00000008/{checkpoint.MANIFEST}"))[
        "step"] == 8


def test_a_failing_upload_is_reported_and_tried_again_without_stopping_the_block(remote, tmp_path, monkeypatch):
    run = tmp_path / "a" / KEY
    fake_checkpoint(run / "checkpoints", 4)
    upload, failures = S3Remote.upload_files, []

    def flaky(self, items):
        if not failures:
            failures.append(1)
            raise ConnectionError("S3 away")
        return upload(self, items)

    monkeypatch.setattr(S3Remote, "upload_files", flaky)
    warnings = []
    with mirror(remote, run).pushing(lambda m: None, warnings.append, every_s=0.05):
        pass
    assert len(warnings) == 1 and "ConnectionError: S3 away" in warnings[0] and "trying again" in warnings[0]
    assert mirror(remote, run).push() == ["step_00000004"]


def test_a_finished_runs_exports_come_down_whole_on_another_machine(remote, tmp_path):
    run = tmp_path / "a" / KEY
    exports = {"safetensors": run / "export" / "safetensors", "hf": run / "export" / "hf"}
    (exports["safetensors"]).mkdir(parents=True)
    (exports["safetensors"] / "model.safetensors").write_bytes(b"weights" * 1000)
    (exports["hf"] / "tokenizer").mkdir(parents=True)
    (exports["hf"] / "config.json").write_text('{"model_type": "llama"}')
    (exports["hf"] / "tokenizer" / "tokenizer.model").write_bytes(b"spm")
    there = tmp_path / "b" / KEY
    assert not mirror(remote, there).pull_exports()  # nothing on S3 yet
    mirror(remote, run).push_exports({k: str(v) for k, v in exports.items()})
    (there / "export" / "hf").mkdir(parents=True)
    (there / "export" / "hf" / "config.json").write_text("half an export")  # replaced, not merged
    (there / ".pulling-export-killed" / "export").mkdir(parents=True)  # a download a killed process left
    assert mirror(remote, there).pull_exports()
    assert files_of(there / "export") == files_of(run / "export")
    assert not list(there.glob(".pulling-*"))

    key = f"team/kiln/_runs/{KEY}/run/export/safetensors/model.safetensors"
    remote.put_bytes(key, b"weights" * 999 + b"WEIGHTS")  # changed on S3 after the run wrote it
    elsewhere = tmp_path / "c" / KEY
    with pytest.raises(CorruptRemoteFile, match="sha256"):
        mirror(remote, elsewhere).pull_exports()
    assert not (elsewhere / "export").exists() and not list(elsewhere.glob(".pulling-*"))


def test_one_machine_at_a_time_launches_a_run(remote, tmp_path):
    """Each machine's run folder lock is its own: across machines, the launch holds a lease on S3, and a second
    machine is refused at once, told which host holds it; once the first lets go, it may launch."""
    import socket

    from kiln.common.remote import LockHeld

    here, there = mirror(remote, tmp_path / "a" / KEY), mirror(remote, tmp_path / "b" / KEY)
    with here.holding():
        with pytest.raises(LockHeld, match=f"launch.lock is held by a process on {socket.gethostname()}"):
            with there.holding():
                pass
        other_run = RunMirror(remote, tmp_path / "b" / "another-run-key")
        with other_run.holding():  # another run is not held up
            pass
    with there.holding():
        pass
