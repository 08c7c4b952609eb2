"""Checkpoints: DeepSpeed's sharded directories, plus Kiln's client state and a manifest written last.

    <checkpoint dir>/
      step_00000100/                                    one checkpoint ("tag"), written by every rank
        zero_pp_rank_<r>_mp_rank_00_model_states.pt     DeepSpeed, per rank: module placeholders, LR scheduler,
                                                        counters and (rank 0's) client_state
        [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt   DeepSpeed, per rank: fp32 master weights + Adam
                                                        moments (the bf16_ prefix when training in bf16)
        manifest.json                                   Kiln: sha256 of every file above; written last, atomically
      _rejected/step_00000200/                          a checkpoint that failed verification, moved aside
      rolled_back.json                                  Kiln: the state the last rollback left the run in, for a run
                                                        that dies before its next checkpoint (record_rollback)
      zero_to_fp32.py, zero_to_torch.py                 DeepSpeed's recovery scripts

A pipeline-parallel run (training_jobs.pipeline) writes DeepSpeed's pipeline layout instead:
layer_<i>-model_states.pt (each pipeline layer's weights, written by its stage), mp_rank_<stage>_model_states.pt
(counters and client_state per stage) and zero_pp_rank_<dp>_mp_rank_<stage>_optim_states.pt (ZeRO-1).

A tensor-parallel run (DeepSpeed AutoTP) adds consolidated_model_states.pt: the whole weights in the training
dtype, gathered over the tp slices (and ZeRO-3 partitions) by DeepSpeed, for the export.

A checkpoint without manifest.json is incomplete (the run died while saving, or while rank 0 was still hashing it).
Writing and hashing are off the training loop's critical path: with a `BackgroundWriter` (the trainer's) `save`
returns once each rank's state is copied to host memory; each rank's thread writes its files (temporary name, then
rename) and leaves a `.written-rank-<r>` marker; rank 0's `ManifestWriter` thread waits for every rank's marker,
removes them, hashes the files, writes the manifest and only then rotates (`prune` counts complete checkpoints
only, so neither the one being written or hashed nor the newest complete one is ever deleted). At resume the newest
checkpoint whose manifest exists and whose files match it is loaded; newer incomplete or corrupt ones are
moved to `_rejected/` with a REJECTED.txt saying why (kept for inspection, and out of the way of a later
save under the same tag).

client_state holds `{"kiln": {...}}`: the data loader position, every rank's RNG states, tokens seen and
the monitor state, as JSON types and tensors only. DeepSpeed writes its files with torch.save (pickle
format) and reads them with `weights_only=False`; the model-states files load with `weights_only=True` as
they are, the optimizer-states files hold two DeepSpeed objects (ZeroStageEnum, LossScaler). Kiln routes
every DeepSpeed read through `weights_only_loads()`: `torch.load(weights_only=True)` with only DeepSpeed's
ZeRO-stage and loss-scaler classes allowed, so no other object can be unpickled.

Assumes every rank sees the same checkpoint folder (a shared filesystem on multi-node runs): rank 0
hashes all the files.
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import random
import re
import shutil
import threading
import time
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

from kiln.common.manifest import fsync_file, sha256_file, temporary_name, write_file_atomic

CHECKPOINT_FORMAT = "kiln-checkpoint/1"
CLIENT_STATE_FORMAT = "kiln-client-state/1"
MANIFEST = "manifest.json"
CONSOLIDATED = "consolidated_model_states.pt"  # tensor-parallel runs: the whole weights (training dtype), rank 0
REJECTED = "_rejected"
TAG = re.compile(r"^step_(\d{8,})$")


def tag_for(step: int) -> str:
    return f"step_{step:08d}"


# ----------------------------------------------------------------------------------------------- RNG

def rng_state() -> dict[str, Any]:
    """This process's RNG states as JSON types and tensors (no pickle needed to read them back)."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state()
    state: dict[str, Any] = {
        "python": {"version": version, "internal": list(internal), "gauss_next": gauss},
        "numpy": {"kind": kind, "keys": keys.tolist(), "pos": int(pos), "has_gauss": int(has_gauss),
                  "cached_gaussian": float(cached)},
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available():
        state["cuda"] = torch.cuda.get_rng_state_all()
    return state


def set_rng_state(state: dict[str, Any]) -> None:
    py = state["python"]
    random.setstate((py["version"], tuple(py["internal"]), py["gauss_next"]))
    npy = state["numpy"]
    np.random.set_state((npy["kind"], np.array(npy["keys"], dtype=np.uint32), npy["pos"], npy["has_gauss"],
                         npy["cached_gaussian"]))
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(state["cuda"])


# ------------------------------------------------------------------------------------------ manifest

def write_path_atomically(path: Path, write: Callable[[Path], object]) -> None:
    """write_file_atomic for a writer that takes a path (safetensors' save_file, a file copy): a crash leaves the old
    file or the new one, never half of one under the real name; a file hard-linked elsewhere (an export a published
    checkpoint links) keeps its old bytes there."""
    tmp = temporary_name(path)
    try:
        write(tmp)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_manifest(ckpt: Path, step: int, meta: dict[str, Any],
                   hash_file: Callable[[Path], str] = sha256_file) -> dict[str, Any]:
    """Hash every file of a checkpoint and write manifest.json last: from then on it counts as complete.
    Every file and folder of it is flushed to disk first, and the manifest's rename after: the rotation that follows
    deletes older checkpoints (with keep_last 1, the only other one), and after a power loss a durable manifest over
    files still in the page cache (empty or cut short) would leave nothing to resume from. The files were written
    without flushes (torch.save, DeepSpeed): the writes go to disk here, once, and are not read again."""
    files = {}
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(ckpt).as_posix()] = {"sha256": hash_file(path), "bytes": path.stat().st_size}
        fsync_file(path)
    for folder in sorted(p for p in ckpt.rglob("*") if p.is_dir()):
        fsync_file(folder)
    fsync_file(ckpt)
    manifest = {"format": CHECKPOINT_FORMAT, "tag": ckpt.name, "step": step,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **meta, "files": files}
    write_file_atomic(ckpt / MANIFEST, lambda f: f.write(json.dumps(manifest, indent=2).encode("utf-8")))
    fsync_file(ckpt)  # the manifest's name
    fsync_file(ckpt.parent)  # the checkpoint folder's own name
    return manifest


def verify(ckpt: Path, hashes: bool = True) -> str | None:
    """None if the checkpoint is complete and every file matches its manifest, else what is wrong. `hashes=False`:
    every file there at its size, not hashed (a look that costs no reading)."""
    ckpt = Path(ckpt)
    if not ckpt.exists():  # a typo, or a step keep_last rotated away
        beside = checkpoints(ckpt.parent, complete_only=False)
        return "it does not exist" + (_complete_ones(ckpt.parent) if beside else "")
    path = ckpt / MANIFEST
    if not path.is_file():
        if checkpoints(ckpt, complete_only=False):
            return f"it holds checkpoints: point at a step_N folder inside it{_complete_ones(ckpt)}"
        return f"no {MANIFEST} (the run stopped while saving it)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    if not isinstance(manifest, dict) or manifest.get("format") != CHECKPOINT_FORMAT:
        found = manifest.get("format") if isinstance(manifest, dict) else type(manifest).__name__
        return f"{MANIFEST} has format {found!r}, expected {CHECKPOINT_FORMAT!r}"
    files = manifest.get("files")
    if not isinstance(files, dict) or not files or not all(isinstance(i, dict) and {"bytes", "sha256"} <= set(i)
                                                           for i in files.values()):  # none: nothing to load
        return f"{MANIFEST} lists no files as Kiln writes them ({{name: {{sha256, bytes}}}})"
    for name, info in files.items():
        file = ckpt / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != info["bytes"]:
            return f"{name} is {file.stat().st_size} bytes, the manifest says {info['bytes']}"
        if hashes and sha256_file(file) != info["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None


def _complete_ones(root: Path) -> str:
    """The complete checkpoints in root, for a message that points the user at one."""
    complete = [found.path.name for found in checkpoints(root)]
    return f" (the complete ones there: {', '.join(complete)})" if complete else " (none there is complete)"


def read_manifest(ckpt: Path) -> dict[str, Any]:
    return json.loads((Path(ckpt) / MANIFEST).read_text(encoding="utf-8"))


# -------------------------------------------------------------------------------------- the folder

@dataclass(frozen=True)
class Found:
    step: int
    path: Path


def checkpoints(root: Path, complete_only: bool = True) -> list[Found]:
    """Checkpoints under root, oldest first (by step); complete = has a manifest (not verified)."""
    found = []
    for p in Path(root).glob("step_*"):
        m = TAG.match(p.name)
        if m and p.is_dir() and (not complete_only or (p / MANIFEST).is_file()):
            found.append(Found(int(m.group(1)), p))
    return sorted(found, key=lambda f: f.step)


def move_aside(ckpt: Path, reason: str) -> Path:
    """Move a bad checkpoint to <root>/_rejected/<tag>[-n] and leave a note saying why."""
    target_dir = ckpt.parent / REJECTED
    target_dir.mkdir(exist_ok=True)
    target, n = target_dir / ckpt.name, 1
    while target.exists():
        target, n = target_dir / f"{ckpt.name}-{n}", n + 1
    shutil.move(str(ckpt), str(target))
    (target / "REJECTED.txt").write_text(f"{reason}\n", encoding="utf-8")
    return target


class CheckpointFormatError(ValueError):
    """A complete checkpoint of another Kiln checkpoint format: neither resumable here nor damaged."""


def _written_format(ckpt: Path) -> str | None:
    """The `format` a readable manifest names (None: no manifest, unreadable, or not one Kiln wrote)."""
    try:
        manifest = json.loads((ckpt / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    found = manifest.get("format") if isinstance(manifest, dict) else None
    return found if isinstance(found, str) and found.startswith("kiln-checkpoint/") else None


def find_resumable(root: Path, warn=print) -> Found | None:
    """The newest checkpoint that verifies. Newer ones that do not (incomplete, corrupt) are moved aside
    with a warning. One of another Kiln checkpoint format is refused, and left where it is: resuming from an older
    checkpoint, or from none, would silently retrain what it holds. Call on one rank, once its ManifestWriter has no
    pending work (a checkpoint still being hashed would be moved aside), and broadcast the result."""
    for found in reversed(checkpoints(root, complete_only=False)):
        if (written := _written_format(found.path)) not in (None, CHECKPOINT_FORMAT):
            raise CheckpointFormatError(
                f"{found.path} is a checkpoint of format {written!r}; this Kiln resumes {CHECKPOINT_FORMAT!r} ones. "
                f"Resume it with the Kiln version that wrote it, or start this run in another output_dir / "
                f"checkpoint.dir (nothing was moved or deleted)")
        problem = verify(found.path)
        if problem is None:
            return found
        moved = move_aside(found.path, problem)
        warn(f"skipping checkpoint {found.path.name}: {problem}; moved to {moved} (trying an older one)")
    return None


def prune(root: Path, keep_last: int) -> list[Path]:
    """Delete all but the newest keep_last complete checkpoints (incomplete ones are left alone)."""
    doomed = [f.path for f in checkpoints(root)[:-keep_last]]
    for path in doomed:
        shutil.rmtree(path, ignore_errors=True)
    return doomed


# ------------------------------------------------------------------------------------------- save / load

def _is_main() -> bool:
    return not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0


def _barrier() -> None:
    if torch.distributed.is_initialized():
        torch.distributed.barrier()


def gather_rng_states() -> list[dict[str, Any]]:
    """Every rank's RNG states, in rank order (each rank's stream differs once anything draws per rank)."""
    state = rng_state()
    if not torch.distributed.is_initialized():
        return [state]
    out: list[Any] = [None] * torch.distributed.get_world_size()
    torch.distributed.all_gather_object(out, state)
    return out


class _OneThread:
    """One background thread that runs jobs in the order given; a job's error is raised on the caller's thread at
    the next `_reap` (every submit) or `wait`."""

    def __init__(self, name: str):
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix=name)
        self.pending: list[Future] = []

    def _submit(self, fn: Callable[..., Any], *args: Any) -> Future:
        self._reap(block=False)
        future = self.pool.submit(fn, *args)
        self.pending.append(future)
        return future

    def wait(self) -> float:
        """Block until every submitted job is done (or failed: raised here); returns the seconds this waited."""
        start = time.perf_counter()
        self._reap(block=True)
        return time.perf_counter() - start

    def _reap(self, block: bool) -> None:
        done = [f for f in self.pending if block or f.done()]
        self.pending = [f for f in self.pending if f not in done]
        for future in done:
            future.result()  # re-raises what the thread raised

    def close(self) -> None:
        self.pool.shutdown(wait=True)


# ------------------------------------------------------------------------------- writes off the loop

WRITTEN = ".written-rank-"  # + rank: this rank's files of a checkpoint are all on disk (BackgroundWriter)
HOST_MEMORY_SHARE = 0.5  # of the host's available memory, over the ranks of this host, that snapshots may hold


def to_host(obj: Any, memo: dict | None = None) -> Any:
    """A copy of a (nested) state dict whose tensors are in host memory and no longer change with training: CUDA
    tensors copied into pinned host memory without blocking (queued on the current stream, so the copy reads the
    values before any later kernel changes them; wait for it before reading, see BackgroundWriter.save), CPU tensors
    cloned, containers rebuilt, other values deep-copied. Tensors that are the same view of the same storage (a
    tied weight under two names) stay one tensor, as torch.save would keep them. torch's caching host allocator
    keeps the pinned blocks for the next checkpoint: only the first pays for pinning them."""
    memo = {} if memo is None else memo
    if isinstance(obj, torch.Tensor):
        key = (obj.untyped_storage().data_ptr(), obj.storage_offset(), tuple(obj.shape), tuple(obj.stride()),
               obj.dtype, obj.device)
        if key not in memo:
            if obj.is_cuda:
                memo[key] = torch.empty(obj.shape, dtype=obj.dtype, pin_memory=True)
                memo[key].copy_(obj.detach(), non_blocking=True)
            else:
                memo[key] = obj.detach().clone(memory_format=torch.contiguous_format)
        return memo[key]
    if isinstance(obj, dict):
        out = copy.copy(obj)  # keeps the dict's type (OrderedDict, defaultdict's factory)
        for k, v in obj.items():
            out[k] = to_host(v, memo)
        return out
    if isinstance(obj, list):
        return [to_host(v, memo) for v in obj]
    if isinstance(obj, tuple):
        items = [to_host(v, memo) for v in obj]
        return type(obj)(*items) if hasattr(obj, "_fields") else type(obj)(items)
    return copy.deepcopy(obj)


def tensor_bytes(obj: Any) -> int:
    if isinstance(obj, torch.Tensor):
        return obj.numel() * obj.element_size()
    if isinstance(obj, dict):
        return sum(tensor_bytes(v) for v in obj.values())
    if isinstance(obj, (list, tuple)):
        return sum(tensor_bytes(v) for v in obj)
    return 0


def save_atomically(obj: Any, path: Path, zipfile: bool = True) -> None:
    """torch.save under a temporary name, then a rename; flushed with the whole checkpoint by write_manifest."""
    write_file_atomic(path, lambda f: torch.save(obj, f, _use_new_zipfile_serialization=zipfile), flush=False)


class BackgroundWriter(_OneThread):
    """This rank's checkpoint files written on a thread, so that a save holds training up only while the state is
    copied to host memory (`to_host`), not while gigabytes go to disk: the copy is what the loop waits for (on a
    GPU only to queue it), then training changes the weights while the thread writes the copy (`save_atomically`),
    in order. After a checkpoint's last file, `mark_written` leaves an empty `.written-rank-<r>` in it; rank 0's
    ManifestWriter waits for every rank's marker before it hashes, and removes them. One snapshot at a time: `save`
    waits for the previous writes first, which bounds the host memory to one checkpoint's share of this rank.

    When a snapshot would take more than HOST_MEMORY_SHARE of the host's available memory (shared by the
    `local_ranks` on this host), that file is written on the caller's thread instead, as DeepSpeed would, and
    `synchronous_because` says why (the trainer reports it)."""

    def __init__(self, local_ranks: int = 1):
        super().__init__("kiln-checkpoint-write")
        self.local_ranks = max(1, local_ranks)
        self.synchronous_because: str | None = None

    def save(self, state: Any, path: str | Path, zipfile: bool = True) -> None:
        import psutil

        path, size = Path(path), tensor_bytes(state)
        available = psutil.virtual_memory().available
        if size * self.local_ranks > HOST_MEMORY_SHARE * available:
            self.synchronous_because = (
                f"{path.name}: {size / 2**30:.1f} GiB x {self.local_ranks} rank(s) on this host is more than "
                f"{HOST_MEMORY_SHARE:.0%} of the {available / 2**30:.1f} GiB of host memory available")
            self.wait()
            save_atomically(state, path, zipfile)
            return
        snapshot = to_host(state)
        copied = torch.cuda.Event() if torch.cuda.is_available() else None
        if copied is not None:
            copied.record()  # after the device-to-host copies to_host queued
        self._submit(self._write, snapshot, path, zipfile, copied)

    @staticmethod
    def _write(snapshot: Any, path: Path, zipfile: bool, copied: Any) -> None:
        if copied is not None:
            copied.synchronize()  # the copies are in host memory
        save_atomically(snapshot, path, zipfile)

    def mark_written(self, ckpt: Path, rank: int) -> None:
        self._submit((Path(ckpt) / f"{WRITTEN}{rank}").touch)


@contextlib.contextmanager
def writes_through(engine, writer: BackgroundWriter):
    """Within the block DeepSpeed's engine saves its files through `writer` (its checkpoint engine wrapped: every
    other call, load and commit included, goes to DeepSpeed's own)."""
    inner = engine.checkpoint_engine

    class Deferred:
        def __getattr__(self, name: str) -> Any:
            return getattr(inner, name)

        def save(self, state_dict: Any, path: str) -> None:
            writer.save(state_dict, path, getattr(inner, "zipfile_serialization", True))

    engine.checkpoint_engine = Deferred()
    try:
        yield
    finally:
        engine.checkpoint_engine = inner


class ManifestWriter(_OneThread):
    """Rank 0's background thread that completes saved checkpoints: it waits until every rank's files are written
    (their BackgroundWriter markers), hashes the files, writes the manifest and then rotates, while training goes
    on. One thread, so checkpoints complete in the order they were saved.

    An error in the thread (a full disk) is raised on the training thread at the next `submit` or `wait`.
    `hash_file` is for tests (one that blocks keeps a checkpoint incomplete for as long as a test needs)."""

    MARKER_TIMEOUT_S = 3600.0  # a rank still writing after this long is a failed save

    def __init__(self, hash_file: Callable[[Path], str] = sha256_file):
        super().__init__("kiln-manifest")
        self.hash_file = hash_file
        self.abandoned = threading.Event()

    def submit(self, ckpt: Path, step: int, meta: dict[str, Any], keep_last: int, written_by: int = 0,
               after: list[Future] = ()) -> None:
        """Complete `ckpt` once the jobs `after` (rank 0's own writes) are done and `written_by` ranks have left
        their markers (0: the files were written before this call)."""
        self._submit(self._complete, Path(ckpt), step, meta, keep_last, written_by, list(after))

    def _complete(self, ckpt: Path, step: int, meta: dict[str, Any], keep_last: int, written_by: int,
                  after: list[Future]) -> None:
        for future in after:
            future.result()  # rank 0's own write failed: so does the checkpoint, at once
        markers = [ckpt / f"{WRITTEN}{rank}" for rank in range(written_by)]
        deadline = time.monotonic() + self.MARKER_TIMEOUT_S
        while not all(m.exists() for m in markers):
            if self.abandoned.is_set() or time.monotonic() > deadline:
                missing = [m.name.removeprefix(WRITTEN) for m in markers if not m.exists()]
                raise RuntimeError(f"checkpoint {ckpt.name}: rank(s) {', '.join(missing)} did not finish writing "
                                   f"their files; the checkpoint stays incomplete")
            time.sleep(0.05)
        for marker in markers:
            marker.unlink()
        write_manifest(ckpt, step, meta, self.hash_file)
        prune(ckpt.parent, keep_last)  # after the manifest: the new checkpoint counts among the kept ones

    def abandon(self) -> None:
        """A failing run: stop waiting for other ranks' files (their processes may be gone)."""
        self.abandoned.set()


class Cadence:
    """When to save: every `every_steps` steps and/or once `every_minutes` have passed since the last save
    (rank 0's clock decides, at every `check_every`-th step only, so the decision's one collective stays off most
    steps; `agree` gives every rank rank 0's decision). Every rank calls `due` at every step and `saved` after
    each save, with its own clock."""

    def __init__(self, every_steps: int | None, every_minutes: float | None, check_every: int, now: float,
                 agree: Callable[[bool], bool] = lambda wanted: wanted):
        self.every_steps, self.every_minutes, self.check_every = every_steps, every_minutes, check_every
        self.agree = agree
        self.last_save = now

    def due(self, step: int, now: float) -> bool:
        if self.every_steps and step % self.every_steps == 0:
            return True  # every rank knows this without asking
        if self.every_minutes is None or step % self.check_every:
            return False
        return self.agree(now - self.last_save >= 60.0 * self.every_minutes)

    def saved(self, now: float) -> None:
        self.last_save = now


def save(engine, root: Path, step: int, kiln_state: dict[str, Any], keep_last: int,
         manifest_meta: dict[str, Any] | None = None, manifests: ManifestWriter | None = None,
         writer: BackgroundWriter | None = None) -> Path:
    """Save a checkpoint on every rank (all must call, all with the same helpers or none). With a BackgroundWriter
    each rank's files are written on its thread, and this returns once the state is copied to host memory; with a
    ManifestWriter rank 0 completes the checkpoint (manifest, rotation) on its thread once every rank's files are
    written. Without them, everything is done before any rank returns."""
    if writer is not None and manifests is None:
        raise ValueError("checkpoint.save: a BackgroundWriter needs a ManifestWriter, which completes the checkpoint "
                         "once every rank's files are written")
    root = Path(root)
    tag = tag_for(step)
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    world = torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1
    if writer is not None:
        writer.wait()  # the previous checkpoint's files are written: one snapshot in host memory at a time
    if _is_main():
        root.mkdir(parents=True, exist_ok=True)
        if (root / tag).exists():  # leftovers under this tag (a rolled-back branch, an earlier attempt)
            move_aside(root / tag, "replaced by a new save under the same tag")
    _barrier()
    client_state = {"kiln": {"format": CLIENT_STATE_FORMAT, "step": step, "rng": gather_rng_states(), **kiln_state}}
    with writes_through(engine, writer) if writer is not None else contextlib.nullcontext():
        engine.save_checkpoint(str(root), tag, client_state=client_state, save_latest=False)
    if engine.autotp_size() > 1:  # zero_to_fp32 cannot join tensor-parallel slices: DeepSpeed gathers them here
        whole = engine._consolidated_16bit_state_dict()  # every rank takes part; rank 0 receives the weights
        if _is_main() and writer is not None:
            writer.save(whole, root / tag / CONSOLIDATED)
        elif _is_main():
            torch.save(whole, root / tag / CONSOLIDATED)
    if writer is not None:
        writer.mark_written(root / tag, rank)
    else:
        _barrier()  # every rank's files are on disk before they are hashed
    if _is_main():
        meta = {"world_size": world, **(manifest_meta or {})}
        if manifests is not None:
            manifests.submit(root / tag, step, meta, keep_last, written_by=world if writer is not None else 0,
                             after=writer.pending if writer is not None else ())
        else:
            write_manifest(root / tag, step, meta)
            prune(root, keep_last)
    if manifests is None:
        _barrier()  # the manifest is there before any rank goes on
    return root / tag


ROLLBACK_RECORD = "rolled_back.json"  # in the checkpoint folder: the state a rollback left the run in (see below)
ROLLBACK_FORMAT = "kiln-rollback/1"


def record_rollback(root: Path, found: Found, kiln_state: dict[str, Any]) -> None:
    """Record, beside the checkpoints, the state a rollback to `found` left the run in (Kiln's client state as the
    trainer would checkpoint it: the loader past the skipped data, the monitor with the rollback counted and the LR
    reduction, tokens skipped). The checkpoint itself still holds the state before the rollback; a run that dies
    before its next checkpoint resumes from `found` with this over it (`rollback_record`), as the run with the
    rollback went on, instead of reading the skipped data again without the rollback. Rank 0, atomically; the record
    names the checkpoint and its manifest's sha256, so it applies to that very checkpoint only."""
    record = {"format": ROLLBACK_FORMAT, "checkpoint": found.path.name,
              "manifest_sha256": sha256_file(found.path / MANIFEST), "kiln": kiln_state}
    write_file_atomic(Path(root) / ROLLBACK_RECORD, lambda f: f.write(json.dumps(record, indent=2).encode("utf-8")))


def rollback_record(root: Path, found: Found) -> dict[str, Any] | None:
    """The client state a rollback to `found` left the run in (record_rollback), or None: no rollback to it recorded
    (the record names another checkpoint, a newer one having been written since, or it is unreadable)."""
    try:
        record = json.loads((Path(root) / ROLLBACK_RECORD).read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    if (not isinstance(record, dict) or record.get("format") != ROLLBACK_FORMAT
            or record.get("checkpoint") != found.path.name
            or record.get("manifest_sha256") != sha256_file(found.path / MANIFEST)):
        return None
    return record["kiln"]


class CheckpointMismatch(ValueError):
    """A complete checkpoint that is not this run's to continue (not_this_run says why): refused before loading."""


def not_this_run(ckpt: Path, model: dict[str, Any], tokenizer_sha256: str | None, world_size: int) -> str | None:
    """Why a resumable checkpoint is not this run's to continue (None: it is): written for another model, or with
    another tokenizer (a checkpoint.dir shared by two runs, an output_dir reused with other settings), or by another
    number of ranks. DeepSpeed would fail on a shape or a ZeRO partition count far into loading, or load a different
    rope_theta or norm_eps without a word."""
    manifest = read_manifest(ckpt)
    written = manifest.get("model") or {}
    differs = {k: (written.get(k), v) for k, v in model.items() if k in written and written[k] != v}
    differs |= {k: (written[k], None) for k in written if k not in model}
    tokenizer = manifest.get("tokenizer_sha256")
    if tokenizer and tokenizer_sha256 and tokenizer != tokenizer_sha256:
        differs["tokenizer_sha256"] = (tokenizer[:12], tokenizer_sha256[:12])
    if differs:
        return (f"{ckpt} was written by a run of another model or tokenizer ("
                + ", ".join(f"{k}: {there!r} there, {here!r} here" for k, (there, here) in differs.items())
                + "); a run resumes its own checkpoints only: give this run another output_dir or checkpoint.dir, or "
                  "train the model those checkpoints belong to")
    written_by = manifest.get("world_size")
    if written_by is not None and written_by != world_size:  # each rank's ZeRO partition, data position and RNG
        return (f"{ckpt} was written by {written_by} ranks and this launch has {world_size}: a run resumes only with "
                f"the number of ranks that wrote its checkpoints. Launch it with {written_by} (TrainingLauncher "
                f"nproc_per_node / num_workers, torchrun --nproc_per_node) to continue it, or give this run another "
                f"output_dir or checkpoint.dir to start afresh")
    return None


def load(engine, root: Path, found: Found) -> dict[str, Any]:
    """Load a verified checkpoint that not_this_run accepted (the same number of ranks) into a freshly initialized
    engine (all ranks) and return Kiln's client state; this rank's RNG states are restored."""
    with weights_only_loads():
        load_path, client_state = engine.load_checkpoint(str(root), found.path.name)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {found.path}; see its log above")
    kiln = (client_state or {}).get("kiln")
    if not kiln or kiln.get("format") != CLIENT_STATE_FORMAT:
        raise RuntimeError(f"checkpoint {found.path} has no Kiln client state; it was not written by "
                           f"training_jobs.train, so it cannot be resumed (start a fresh run in another folder)")
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    set_rng_state(kiln["rng"][rank])
    return kiln


def deepspeed_safe_globals() -> list[type]:
    """The non-tensor classes DeepSpeed puts into ZeRO checkpoints (checked for deepspeed 0.19); fragment_address
    (two ints) is in ZeRO-1/2 optimizer states, as a pipeline-parallel run writes them."""
    from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler, LossScaler
    from deepspeed.runtime.zero.config import ZeroStageEnum
    from deepspeed.utils.tensor_fragment import fragment_address

    return [ZeroStageEnum, LossScaler, DynamicLossScaler, fragment_address]


@contextlib.contextmanager
def weights_only_loads():
    """Within the block every torch.load (DeepSpeed's included, which asks for weights_only=False) reads with
    weights_only=True, allowing only tensors, plain containers and `deepspeed_safe_globals()`."""
    real_load = torch.load
    allowed = deepspeed_safe_globals()

    def safe_load(*args, **kwargs):
        kwargs["weights_only"] = True
        with torch.serialization.safe_globals(allowed):
            return real_load(*args, **kwargs)

    torch.load = safe_load
    try:
        yield
    finally:
        torch.load = real_load


def check_weights_only(ckpt: Path, allow_deepspeed: bool = False) -> dict[str, str | None]:
    """For each .pt file of a checkpoint: None if torch.load(weights_only=True) reads it (with DeepSpeed's
    classes allowed, if asked), else the error."""
    result = {}
    for path in sorted(Path(ckpt).glob("*.pt")):
        try:
            with weights_only_loads() if allow_deepspeed else contextlib.nullcontext():
                torch.load(path, map_location="cpu", weights_only=True)
            result[path.name] = None
        except Exception as exc:  # noqa: BLE001: report whatever the unpickler refuses
            refused = re.search(r"Unsupported global: GLOBAL (\S+)", str(exc))
            result[path.name] = f"needs {refused.group(1)}" if refused else f"{type(exc).__name__}: {exc}"
    return result


__all__ = ["BackgroundWriter", "CHECKPOINT_FORMAT", "CheckpointFormatError", "CONSOLIDATED", "Cadence", "Found", "MANIFEST", "ManifestWriter",
           "checkpoints", "save_atomically", "to_host", "write_path_atomically", "writes_through",
           "check_weights_only", "CheckpointMismatch", "record_rollback", "rollback_record",
           "find_resumable", "load", "move_aside", "prune", "read_manifest", "rng_state", "save", "set_rng_state",
           "tag_for", "verify", "weights_only_loads", "write_manifest"]
