"""Checkpoint bookkeeping without DeepSpeed: RNG states, manifests, verification, resume choice, rotation;
and the peak-FLOPs table."""

from __future__ import annotations

import io
import json
import os
import random
import shutil
import threading
import time
from collections import OrderedDict
from pathlib import Path

import numpy as np
import pytest
import torch

from training_jobs import checkpoint
from training_jobs.flops import mfu, peak_flops_for


def draws():
    return random.random(), float(np.random.rand()), float(torch.rand(1))


def test_rng_states_round_trip_without_pickle():
    random.seed(1), np.random.seed(2), torch.manual_seed(3)
    state = checkpoint.rng_state()
    buf = io.BytesIO()
    torch.save(state, buf)
    buf.seek(0)
    restored = torch.load(buf, weights_only=True)  # JSON types and tensors only
    expected = draws()
    checkpoint.set_rng_state(restored)
    assert draws() == expected
    json.dumps({k: v for k, v in restored.items() if k != "torch"})  # everything but the tensor is plain JSON


def fake_checkpoint(root: Path, step: int, complete: bool = True) -> Path:
    path = root / checkpoint.tag_for(step)
    path.mkdir(parents=True)
    (path / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"model" * 100 + bytes([step]))
    (path / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"optim" * 300)
    if complete:
        checkpoint.write_manifest(path, step, {"model": {}})
    return path


def test_manifest_lists_every_file_and_verifies(tmp_path):
    path = fake_checkpoint(tmp_path, 4)
    manifest = checkpoint.read_manifest(path)
    assert manifest["step"] == 4 and sorted(manifest["files"]) == sorted(p.name for p in path.glob("*.pt"))
    assert checkpoint.verify(path) is None


@pytest.mark.parametrize("damage, problem", [
    (lambda p: (p / "manifest.json").unlink(), "no manifest.json"),
    (lambda p: (p / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"optim" * 299 + b"OPTIM"), "sha256"),
    (lambda p: (p / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"short"), "bytes, the manifest says"),
    (lambda p: (p / "zero_pp_rank_0_mp_rank_00_model_states.pt").unlink(), "is missing"),
    # manifests that are not Kiln's: each a reason, not a KeyError or AttributeError out of resume
    (lambda p: (p / "manifest.json").write_text('{"format": "kiln-checkpoint/1"}'), "lists no files as Kiln"),
    (lambda p: (p / "manifest.json").write_text('{"format": "kiln-checkpoint/1", "files": {"a.pt": 5}}'),
     "lists no files as Kiln"),
    (lambda p: (p / "manifest.json").write_text('{"format": "kiln-checkpoint/1", "files": {}}'),
     "lists no files as Kiln"),  # a manifest listing nothing would verify nothing
    (lambda p: (p / "manifest.json").write_text("[]"), "has format 'list'"),
    (lambda p: (p / "manifest.json").write_text("null"), "has format 'NoneType'"),
])
def test_damage_is_detected(tmp_path, damage, problem):
    path = fake_checkpoint(tmp_path, 4)
    damage(path)
    assert problem in checkpoint.verify(path)


def test_a_folder_that_is_not_there_or_holds_checkpoints_is_named_as_such(tmp_path):
    """What export and a base checkpoint verify first: a step folder that is not there (a typo, one keep_last rotated
    away) or the checkpoints folder itself is not "the run stopped while saving it"; the complete ones are named."""
    root = tmp_path / "checkpoints"
    fake_checkpoint(root, 4)
    fake_checkpoint(root, 8)
    fake_checkpoint(root, 12, complete=False)  # no manifest: not one to point at
    assert checkpoint.verify(root) == ("it holds checkpoints: point at a step_N folder inside it "
                                       "(the complete ones there: step_00000004, step_00000008)")
    assert checkpoint.verify(root / "step_00000002") == \
        "it does not exist (the complete ones there: step_00000004, step_00000008)"
    assert checkpoint.verify(tmp_path / "chekpoints" / "step_00000004") == "it does not exist"
    (root / "step_00000004" / "manifest.json").unlink()
    (root / "step_00000008" / "manifest.json").unlink()
    assert checkpoint.verify(root).endswith("inside it (none there is complete)")
    assert checkpoint.verify(root / "step_00000008") == "no manifest.json (the run stopped while saving it)"


def test_resume_takes_the_newest_good_one_and_moves_bad_ones_aside(tmp_path):
    fake_checkpoint(tmp_path, 4)
    corrupt = fake_checkpoint(tmp_path, 8)
    (corrupt / "zero_pp_rank_0_mp_rank_00_optim_states.pt").write_bytes(b"x" * 1500)
    fake_checkpoint(tmp_path, 12, complete=False)  # died while saving
    warnings = []
    found = checkpoint.find_resumable(tmp_path, warn=warnings.append)
    assert found.step == 4
    assert len(warnings) == 2 and "step_00000012: no manifest.json" in warnings[0] and "sha256" in warnings[1]
    rejected = tmp_path / checkpoint.REJECTED
    assert sorted(p.name for p in rejected.iterdir()) == ["step_00000008", "step_00000012"]
    assert "sha256" in (rejected / "step_00000008" / "REJECTED.txt").read_text()
    assert [f.step for f in checkpoint.checkpoints(tmp_path, complete_only=False)] == [4]
    assert checkpoint.find_resumable(tmp_path / "nothing-here") is None


def test_a_checkpoint_of_another_format_is_refused_and_left_where_it_is(tmp_path):
    """A complete checkpoint whose manifest names another Kiln checkpoint format (an older Kiln's, say) is not
    damage: moving it aside and resuming from an older one, or from step 0, would silently train again what it holds.
    It is refused naming both formats and the way forward, and nothing is moved."""
    fake_checkpoint(tmp_path, 4)
    newer = fake_checkpoint(tmp_path, 8)
    manifest = json.loads((newer / "manifest.json").read_text())
    (newer / "manifest.json").write_text(json.dumps({**manifest, "format": "kiln-checkpoint/0"}))
    with pytest.raises(checkpoint.CheckpointFormatError,
                       match=r"step_00000008 is a checkpoint of format 'kiln-checkpoint/0'; this Kiln resumes "
                             r"'kiln-checkpoint/1' ones\..*another output_dir / checkpoint.dir \(nothing was moved"):
        checkpoint.find_resumable(tmp_path, warn=lambda _: None)
    assert [f.step for f in checkpoint.checkpoints(tmp_path)] == [4, 8] and not (tmp_path / checkpoint.REJECTED).exists()


def test_a_rollback_record_applies_to_the_checkpoint_it_names_only(tmp_path):
    """What a rollback to a checkpoint left the run in (record_rollback) is read back for that checkpoint, as saved;
    not for another (a newer one written since, which holds the rollback itself), nor for one saved again under its
    tag, nor when there is none or it is unreadable."""
    four, eight = fake_checkpoint(tmp_path, 4), fake_checkpoint(tmp_path, 8)
    found = {step: checkpoint.Found(step, path) for step, path in ((4, four), (8, eight))}
    assert checkpoint.rollback_record(tmp_path, found[4]) is None
    state = {"tokens_skipped": 384, "loader": {"position": 28}, "monitor": {"rollbacks": 1}}
    checkpoint.record_rollback(tmp_path, found[4], state)
    assert checkpoint.rollback_record(tmp_path, found[4]) == state
    assert checkpoint.rollback_record(tmp_path, found[8]) is None
    checkpoint.write_manifest(four, 4, {"model": {"saved": "again"}})
    assert checkpoint.rollback_record(tmp_path, found[4]) is None
    (tmp_path / checkpoint.ROLLBACK_RECORD).write_text("{not json")
    assert checkpoint.rollback_record(tmp_path, found[8]) is None
    assert [f.step for f in checkpoint.checkpoints(tmp_path)] == [4, 8]  # not taken for a checkpoint


def test_keep_last_k_counts_complete_checkpoints_only(tmp_path):
    for step in (2, 4, 6, 8):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 10, complete=False)
    deleted = checkpoint.prune(tmp_path, keep_last=2)
    assert [p.name for p in deleted] == ["step_00000002", "step_00000004"]
    assert [f.step for f in checkpoint.checkpoints(tmp_path, complete_only=False)] == [6, 8, 10]


@pytest.mark.parametrize("background", [False, True], ids=["synchronous", "background"])
def test_a_checkpoint_is_on_disk_before_the_one_before_is_pruned(tmp_path, monkeypatch, background):
    """A power loss after the rotation (keep_last 1 deletes the only other checkpoint) must find the new one whole:
    its files, its manifest and the folder entries naming them flushed to disk before the old one is deleted.
    Every os.fsync is recorded by the path of its descriptor."""
    fake_checkpoint(tmp_path, 4)
    synced: list[Path] = []
    real_fsync, real_rmtree = os.fsync, shutil.rmtree

    def fsync(fd):
        synced.append(Path(os.readlink(f"/proc/self/fd/{fd}")))
        real_fsync(fd)

    synced_at_prune: list[list[Path]] = []

    def rmtree(path, **kw):
        synced_at_prune.append(list(synced))
        real_rmtree(path, **kw)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(shutil, "rmtree", rmtree)
    writer = checkpoint.BackgroundWriter() if background else None
    manifests = checkpoint.ManifestWriter() if background else None
    new = checkpoint.save(FakeEngine(), tmp_path, 8, {}, keep_last=1, manifests=manifests, writer=writer)
    if background:
        manifests.wait()
        writer.close()
        manifests.close()
    assert [f.step for f in checkpoint.checkpoints(tmp_path, complete_only=False)] == [8]
    assert len(synced_at_prune) == 1  # the step 4 folder
    before = synced_at_prune[0]
    data = {new / "zero_pp_rank_0_mp_rank_00_model_states.pt", new / "zero_pp_rank_0_mp_rank_00_optim_states.pt"}
    assert data <= set(before)
    manifest_flushed = max(i for i, p in enumerate(before)
                           if p.parent == new and p.name.startswith(f".{checkpoint.MANIFEST}.tmp-"))
    assert new in before[manifest_flushed + 1:]  # the manifest's rename, after it was written
    assert tmp_path in before  # the checkpoint folder's own entry


class TorchSaves:
    """DeepSpeed's default checkpoint engine, as far as a save goes: torch.save to the path."""

    def save(self, state, path):
        torch.save(state, path)


class FakeEngine:
    """What checkpoint.save asks of a DeepSpeed engine, in one process: its files under root/tag, written through
    its checkpoint engine, as DeepSpeed's save_checkpoint does."""

    def __init__(self):
        self.checkpoint_engine = TorchSaves()
        self.weights = torch.arange(1000, dtype=torch.float32)

    def save_checkpoint(self, root, tag, client_state, save_latest):
        folder = Path(root) / tag
        folder.mkdir(parents=True, exist_ok=True)
        self.checkpoint_engine.save({"kiln": client_state["kiln"]["step"], "module": {"w": self.weights}},
                                    str(folder / "zero_pp_rank_0_mp_rank_00_model_states.pt"))
        self.checkpoint_engine.save({"optim": self.weights * 2},
                                    str(folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt"))

    def autotp_size(self):
        return 1


class HeldHashing:
    """A hash function that waits until released: hashing as slow as a test needs."""

    def __init__(self):
        self.release = threading.Event()

    def __call__(self, path):
        assert self.release.wait(30), "the test never released the hashing"
        return checkpoint.sha256_file(path)


def test_save_returns_before_the_hashing_and_the_manifest_appears_later(tmp_path):
    held = HeldHashing()
    writer = checkpoint.ManifestWriter(hash_file=held)
    try:
        path = checkpoint.save(FakeEngine(), tmp_path, 4, {}, keep_last=2, manifests=writer)
        assert path == tmp_path / "step_00000004" and not (path / checkpoint.MANIFEST).exists()
        assert checkpoint.checkpoints(tmp_path) == []  # not complete while hashing
        held.release.set()
        writer.wait()
        assert checkpoint.verify(path) is None and checkpoint.read_manifest(path)["step"] == 4
        assert [f.step for f in checkpoint.checkpoints(tmp_path)] == [4]
    finally:
        held.release.set()
        writer.close()


def test_a_run_killed_while_hashing_resumes_from_the_checkpoint_before(tmp_path):
    """The folder as a SIGKILL during the background hashing leaves it (copied while the hashing is held): the
    unhashed checkpoint is incomplete, resume takes the one before it."""
    live, killed = tmp_path / "live", tmp_path / "killed"
    fake_checkpoint(live, 4)
    held = HeldHashing()
    writer = checkpoint.ManifestWriter(hash_file=held)
    try:
        checkpoint.save(FakeEngine(), live, 8, {}, keep_last=1, manifests=writer)
        shutil.copytree(live, killed)
        warnings = []
        assert checkpoint.find_resumable(killed, warn=warnings.append).step == 4
        assert "step_00000008: no manifest.json" in warnings[0]
        # Rotation (keep_last 1) waits for the manifest: the last complete checkpoint stays until then.
        assert [f.step for f in checkpoint.checkpoints(live, complete_only=False)] == [4, 8]
        held.release.set()
        writer.wait()
        assert [f.step for f in checkpoint.checkpoints(live, complete_only=False)] == [8]
    finally:
        held.release.set()
        writer.close()


def test_a_failed_manifest_write_is_raised_on_the_training_thread(tmp_path):
    def broken_disk(path):
        raise OSError("No space left on device")

    writer = checkpoint.ManifestWriter(hash_file=broken_disk)
    checkpoint.save(FakeEngine(), tmp_path, 4, {}, keep_last=2, manifests=writer)
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    writer.close()
    assert checkpoint.find_resumable(tmp_path, warn=lambda _: None) is None  # never complete


# ------------------------------------------------------------------------------- background writes

@pytest.fixture
def held_writes(monkeypatch):
    """The background writes wait until the returned event is set (writing as slow as a test needs); with
    `failing` set they then fail as on a full disk."""
    release, real = threading.Event(), checkpoint.save_atomically

    def slow(obj, path, zipfile=True):
        assert release.wait(30), "the test never released the writes"
        if getattr(release, "failing", False):
            raise OSError("No space left on device")
        real(obj, path, zipfile)

    monkeypatch.setattr(checkpoint, "save_atomically", slow)
    yield release
    release.set()


def test_a_background_save_writes_the_state_as_it_was_when_save_returned(tmp_path, held_writes):
    engine, writer, manifests = FakeEngine(), checkpoint.BackgroundWriter(), checkpoint.ManifestWriter()
    release = held_writes
    try:
        path = checkpoint.save(engine, tmp_path, 4, {}, keep_last=2, manifests=manifests, writer=writer)
        assert list(path.iterdir()) == []  # nothing written yet: save returned after the copy to host memory
        engine.weights += 1000  # training goes on, in place, while the thread writes
        release.set()
        writer.wait()
        manifests.wait()
        model = torch.load(path / "zero_pp_rank_0_mp_rank_00_model_states.pt", weights_only=True)
        assert torch.equal(model["module"]["w"], torch.arange(1000, dtype=torch.float32))  # the values at save time
        assert checkpoint.verify(path) is None and sorted(checkpoint.read_manifest(path)["files"]) == [
            "zero_pp_rank_0_mp_rank_00_model_states.pt", "zero_pp_rank_0_mp_rank_00_optim_states.pt"]
        assert not list(path.glob(".*"))  # the marker and the temporary names are gone
    finally:
        release.set()
        writer.close(), manifests.close()


def test_a_run_killed_while_writing_resumes_from_the_checkpoint_before(tmp_path, held_writes):
    """The folder as a SIGKILL during the background write leaves it (copied while the writes are held): no files
    or a temporary one, no marker, no manifest; resume takes the checkpoint before."""
    live, killed = tmp_path / "live", tmp_path / "killed"
    fake_checkpoint(live, 4)
    writer, manifests = checkpoint.BackgroundWriter(), checkpoint.ManifestWriter()
    release = held_writes
    try:
        checkpoint.save(FakeEngine(), live, 8, {}, keep_last=1, manifests=manifests, writer=writer)
        (live / "step_00000008" / ".zero_pp_rank_0_mp_rank_00_model_states.pt.tmp-0123abcd").write_bytes(b"half")
        shutil.copytree(live, killed)
        warnings = []
        assert checkpoint.find_resumable(killed, warn=warnings.append).step == 4
        assert "step_00000008: no manifest.json" in warnings[0]
        release.set()
        writer.wait(), manifests.wait()
        assert [f.step for f in checkpoint.checkpoints(live, complete_only=False)] == [8]  # rotated once complete
    finally:
        release.set()
        writer.close(), manifests.close()


def test_a_checkpoint_completes_only_once_every_rank_has_written(tmp_path):
    """Rank 0 hashes only when every rank's marker is there (two ranks here, rank 1's files late)."""
    path = fake_checkpoint(tmp_path, 4, complete=False)
    (path / f"{checkpoint.WRITTEN}0").touch()
    manifests = checkpoint.ManifestWriter()
    try:
        manifests.submit(path, 4, {}, keep_last=2, written_by=2)
        for _ in range(10):  # half a second: it is still waiting
            time.sleep(0.05)
            assert not (path / checkpoint.MANIFEST).exists()
        (path / f"{checkpoint.WRITTEN}1").touch()
        manifests.wait()
        assert checkpoint.verify(path) is None and not list(path.glob(".written-*"))
        assert sorted(checkpoint.read_manifest(path)["files"]) == sorted(p.name for p in path.glob("*.pt"))
    finally:
        manifests.close()


def test_a_failing_run_stops_waiting_for_other_ranks(tmp_path):
    path = fake_checkpoint(tmp_path, 4, complete=False)
    manifests = checkpoint.ManifestWriter()
    manifests.submit(path, 4, {}, keep_last=2, written_by=2)  # no rank ever writes its marker
    manifests.abandon()
    with pytest.raises(RuntimeError, match="rank.s. 0, 1 did not finish writing"):
        manifests.wait()
    manifests.close()
    assert not (path / checkpoint.MANIFEST).exists()


def _check_folder_as_rank(rank: int, tmp_path: Path, folders: list[str]) -> None:
    """One rank of a two-process gloo world (torch.multiprocessing.spawn): check_shared_folder on `folders[rank]`;
    what happened goes to rank-<rank>.txt."""
    from training_jobs.setup import Dist, check_shared_folder

    torch.distributed.init_process_group("gloo", init_method=f"file://{tmp_path / 'rendezvous'}", rank=rank,
                                         world_size=2)
    try:
        check_shared_folder(Dist(rank, 2, torch.device("cpu")), tmp_path / folders[rank])
        outcome = "shared"
    except RuntimeError as exc:
        outcome = f"refused: {type(exc).__name__}: {exc}"
    (tmp_path / f"rank-{rank}.txt").write_text(outcome)
    torch.distributed.destroy_process_group()


@pytest.mark.parametrize("folders", [["ckpt", "ckpt"], ["node-a/ckpt", "node-b/ckpt"]])
def test_ranks_that_do_not_see_one_checkpoint_folder_refuse_before_training(tmp_path, folders):
    """Two machines without a shared filesystem (here each rank's folder is another folder): rank 1's files would be
    where rank 0 never finds its marker, so no checkpoint could complete. Both ranks refuse at start, with rank 1's
    reason; one folder for both passes and leaves nothing in it."""
    import socket

    torch.multiprocessing.spawn(_check_folder_as_rank, args=(tmp_path, folders), nprocs=2)
    said = [(tmp_path / f"rank-{rank}.txt").read_text() for rank in (0, 1)]
    if folders[0] == folders[1]:
        assert said == ["shared", "shared"] and not list((tmp_path / "ckpt").iterdir())
    else:
        host = socket.gethostname()
        assert said[0] == said[1] == (
            f"refused: UnsharedFolder: rank 1 on {host} does not see the checkpoint folder {tmp_path / folders[1]} "
            f"that rank 0 on {host} writes (a file rank 0 left there is not there): every rank writes its part of "
            f"each checkpoint into one folder rank 0 reads, so on several machines KILN_HOME (or "
            f"training.checkpoint.dir) must be one shared filesystem (NFS, EFS, Lustre) mounted at the same path on "
            f"each"), said
        assert not list((tmp_path / folders[0]).iterdir())  # rank 0's probe removed
        from training_jobs.setup import UnsharedFolder
        from training_jobs.train import REFUSALS

        assert issubclass(UnsharedFolder, REFUSALS)  # Ray Train's restarts would meet it again: not restarted


def test_a_failed_background_write_is_raised_and_the_checkpoint_never_completes(tmp_path, held_writes):
    held_writes.failing = True
    writer, manifests = checkpoint.BackgroundWriter(), checkpoint.ManifestWriter()
    checkpoint.save(FakeEngine(), tmp_path, 4, {}, keep_last=2, manifests=manifests, writer=writer)
    held_writes.set()  # after save returned: the disk fills while the thread writes
    with pytest.raises(OSError, match="No space left"):
        writer.wait()
    with pytest.raises(OSError, match="No space left"):  # rank 0's manifest waited on its own writes
        manifests.wait()
    writer.close(), manifests.close()
    assert checkpoint.find_resumable(tmp_path, warn=lambda _: None) is None


def test_without_the_host_memory_for_a_copy_the_file_is_written_at_once(tmp_path, monkeypatch):
    import psutil

    engine, writer, manifests = FakeEngine(), checkpoint.BackgroundWriter(local_ranks=8), checkpoint.ManifestWriter()
    # 4,000 B of weights x 8 ranks on this host against half of 40,000 B available: too much to copy
    monkeypatch.setattr(psutil, "virtual_memory", lambda: type("Memory", (), {"available": 40_000})())
    path = checkpoint.save(engine, tmp_path, 4, {}, keep_last=2, manifests=manifests, writer=writer)
    assert (path / "zero_pp_rank_0_mp_rank_00_model_states.pt").is_file()  # written before save returned
    assert "x 8 rank(s) on this host is more than 50% of the 0.0 GiB" in writer.synchronous_because
    writer.wait(), manifests.wait()
    assert checkpoint.verify(path) is None
    writer.close(), manifests.close()


def test_to_host_copies_tensors_keeps_containers_and_ties():
    weight = torch.arange(6.0)
    flat = torch.arange(10.0)
    state = OrderedDict(embed=weight, head=weight.detach(), view=flat[2:5], meta={"step": 3, "names": ("a", "b")})
    copied = checkpoint.to_host(state)
    weight += 100  # the original changes; the copy does not
    assert type(copied) is OrderedDict and copied["meta"] == {"step": 3, "names": ("a", "b")}
    assert torch.equal(copied["embed"], torch.arange(6.0)) and copied["embed"] is copied["head"]  # a tie stays one
    assert torch.equal(copied["view"], torch.tensor([2.0, 3.0, 4.0]))
    assert copied["view"].untyped_storage().nbytes() == 12  # the view alone, not its flat buffer


def saved_steps(cadence, steps, seconds_per_step):
    saved = []
    for step in range(1, steps + 1):
        now = step * seconds_per_step
        if cadence.due(step, now):
            cadence.saved(now)
            saved.append(step)
    return saved


def test_the_wall_time_cadence_saves_at_the_expected_steps():
    # 7 s a step, a save due after 60 s, checked every 5 steps: at step 10 (70 s since the start), 20 (70 s since
    # step 10), 30; every_steps 12 as well: 10, 12 (by steps), then 20 is 56 s after step 12 (no), 24 (by steps),
    # 25 and 30 are 7 s and 42 s after step 24 (no).
    asked = []

    def rank0(wanted):
        asked.append(wanted)
        return wanted

    assert saved_steps(checkpoint.Cadence(None, 1.0, 5, now=0.0), 30, 7.0) == [10, 20, 30]
    assert saved_steps(checkpoint.Cadence(12, 1.0, 5, now=0.0, agree=rank0), 30, 7.0) == [10, 12, 24]
    assert asked == [False, True, False, False, False, False]  # steps 5, 10, ... 30 ask; 12 and 24 need not
    assert saved_steps(checkpoint.Cadence(12, None, 5, now=0.0, agree=rank0), 30, 7.0) == [12, 24]
    assert len(asked) == 6  # without every_minutes there is nothing to agree on
    # Every rank takes rank 0's decision: a rank whose own clock says "not yet" still saves.
    assert saved_steps(checkpoint.Cadence(None, 1.0, 5, now=0.0, agree=lambda wanted: True), 12, 0.1) == [5, 10]


def test_peak_flops_table_matches_device_names():
    assert peak_flops_for("NVIDIA H100 80GB HBM3") == 989e12
    assert peak_flops_for("NVIDIA H100 PCIe") == 756e12
    assert peak_flops_for("NVIDIA H200") == 989e12
    assert peak_flops_for("NVIDIA H200 NVL") == 835e12  # 1,671 TFLOP/s with 2:4 sparsity on its datasheet
    assert peak_flops_for("NVIDIA A100-SXM4-80GB") == 312e12
    assert peak_flops_for("NVIDIA L40S") == 362e12
    assert peak_flops_for("NVIDIA A10G") == 70e12 and peak_flops_for("NVIDIA A10") == 125e12
    assert peak_flops_for("Some New Accelerator") is None


def test_mfu_is_none_without_a_peak():
    assert mfu(1e9, 1000.0, None, 2) is None
    assert mfu(6e9, 100_000.0, 989e12, 8) == pytest.approx(6e9 * 1e5 / (989e12 * 8))


def test_a_checkpoint_of_another_model_tokenizer_or_number_of_ranks_is_not_resumed(tmp_path):
    """A checkpoint.dir shared by two runs, or an output_dir reused with other settings or on other GPUs: resuming
    would fail deep in DeepSpeed on a shape or a ZeRO partition count, or load another rope_theta without a word. The
    manifest records the model, tokenizer and number of ranks."""
    from dataclasses import replace

    from training_jobs.model import ModelConfig

    cfg = ModelConfig(vocab_size=512, d_model=64, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden=192, max_seq_len=32)
    path = tmp_path / checkpoint.tag_for(4)
    path.mkdir()
    (path / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"model")
    checkpoint.write_manifest(path, 4, {"model": cfg.to_dict(), "tokenizer_sha256": "a" * 64, "world_size": 2})
    assert checkpoint.not_this_run(path, cfg.to_dict(), "a" * 64, 2) is None
    problem = checkpoint.not_this_run(path, replace(cfg, n_layers=3, rope_theta=5e5).to_dict(), "a" * 64, 2)
    assert "n_layers: 2 there, 3 here" in problem and "rope_theta: 10000.0 there, 500000.0 here" in problem
    assert "give this run another output_dir or checkpoint.dir" in problem
    assert "tokenizer_sha256: 'aaaaaaaaaaaa' there, 'bbbbbbbbbbbb' here" in \
        checkpoint.not_this_run(path, cfg.to_dict(), "b" * 64, 2)
    # a checkpoint written before a model field existed (its default then) still resumes
    older = {k: v for k, v in cfg.to_dict().items() if k != "rope_scaling_factor"}
    checkpoint.write_manifest(path, 4, {"model": older, "tokenizer_sha256": "a" * 64, "world_size": 2})
    assert checkpoint.not_this_run(path, cfg.to_dict(), "a" * 64, 2) is None
    # written by 2 ranks, resumed by 1: refused here, before DeepSpeed's load fails on its ZeRO partitions
    problem = checkpoint.not_this_run(path, cfg.to_dict(), "a" * 64, 1)
    assert "was written by 2 ranks and this launch has 1" in problem and "Launch it with 2" in problem


def test_the_stage_a_run_resumes_with_is_the_checkpoint_it_will_resume(tmp_path):
    """The layout keeps the ZeRO stage of the checkpoint it resumes (DeepSpeed loads into that stage only). The newest
    checkpoint has lost a file, so resume will set it aside and take the one before: its stage is the one kept."""
    from training_jobs.setup import checkpointed_stage

    for step, stage in ((4, 1), (8, 3)):
        path = tmp_path / checkpoint.tag_for(step)
        path.mkdir()
        (path / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"model" * step)
        checkpoint.write_manifest(path, step, {"model": {}, "layout": {"zero_stage": stage}})
    assert checkpointed_stage(tmp_path, 0)[0] == 3
    (tmp_path / checkpoint.tag_for(8) / "zero_pp_rank_0_mp_rank_00_model_states.pt").unlink()
    stage, why = checkpointed_stage(tmp_path, 0)
    assert (stage, why) == (1, f"the stage {checkpoint.tag_for(4)} was saved with, which this run resumes")
    assert checkpoint.find_resumable(tmp_path).step == 4  # the one resume takes: the same
