"""Checkpoints: DeepSpeed's sharded directories, plus Kiln's client state and a manifest written last.

    <checkpoint dir>/
      step_00000100/                                    one checkpoint ("tag"), written by every rank
        zero_pp_rank_<r>_mp_rank_00_model_states.pt     DeepSpeed, per rank: module placeholders, LR scheduler,
                                                        counters and (rank 0's) client_state
        [bf16_]zero_pp_rank_<r>_mp_rank_00_optim_states.pt   DeepSpeed, per rank: fp32 master weights + Adam
                                                        moments (the bf16_ prefix when training in bf16)
        manifest.json                                   Kiln: sha256 of every file above; written last, atomically
      _rejected/step_00000200/                          a checkpoint that failed verification, moved aside
      zero_to_fp32.py, zero_to_torch.py                 DeepSpeed's recovery scripts

A pipeline-parallel run (training_jobs.pipeline) writes DeepSpeed's pipeline layout instead:
layer_<i>-model_states.pt (each pipeline layer's weights, written by its stage), mp_rank_<stage>_model_states.pt
(counters and client_state per stage) and zero_pp_rank_<dp>_mp_rank_<stage>_optim_states.pt (ZeRO-1).

A tensor-parallel run (DeepSpeed AutoTP) adds consolidated_model_states.pt: the whole weights in the training
dtype, gathered over the tp slices (and ZeRO-3 partitions) by DeepSpeed, for the export.

A checkpoint without manifest.json is incomplete (the run died while saving, or while rank 0 was still hashing it).
Hashing is off the training loop's critical path: `save` returns once every rank's files are on disk, and rank 0's
`ManifestWriter` thread hashes them, writes the manifest and only then rotates (`prune` counts complete checkpoints
only, so neither the one being hashed nor the newest complete one is ever deleted). At resume the newest
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
import hashlib
import json
import os
import random
import re
import shutil
import time
import uuid
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch

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

def sha256_file(path: Path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def _atomic_write_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def write_manifest(ckpt: Path, step: int, meta: dict[str, Any],
                   hash_file: Callable[[Path], str] = sha256_file) -> dict[str, Any]:
    """Hash every file of a checkpoint and write manifest.json last: from then on it counts as complete."""
    files = {}
    for path in sorted(p for p in ckpt.rglob("*") if p.is_file() and p.name != MANIFEST):
        files[path.relative_to(ckpt).as_posix()] = {"sha256": hash_file(path), "bytes": path.stat().st_size}
    manifest = {"format": CHECKPOINT_FORMAT, "tag": ckpt.name, "step": step,
                "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), **meta, "files": files}
    _atomic_write_text(ckpt / MANIFEST, json.dumps(manifest, indent=2))
    return manifest


def verify(ckpt: Path) -> str | None:
    """None if the checkpoint is complete and every file matches its manifest, else what is wrong."""
    path = ckpt / MANIFEST
    if not path.is_file():
        return f"no {MANIFEST} (the run stopped while saving it)"
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError) as exc:
        return f"unreadable {MANIFEST}: {exc}"
    if manifest.get("format") != CHECKPOINT_FORMAT:
        return f"{MANIFEST} has format {manifest.get('format')!r}, expected {CHECKPOINT_FORMAT!r}"
    for name, info in manifest["files"].items():
        file = ckpt / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != info["bytes"]:
            return f"{name} is {file.stat().st_size} bytes, the manifest says {info['bytes']}"
        if sha256_file(file) != info["sha256"]:
            return f"{name} does not match its sha256 in the manifest"
    return None


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


def find_resumable(root: Path, warn=print) -> Found | None:
    """The newest checkpoint that verifies. Newer ones that do not (incomplete, corrupt) are moved aside
    with a warning. Call on one rank, once its ManifestWriter has no pending work (a checkpoint still being hashed
    would be moved aside), and broadcast the result."""
    for found in reversed(checkpoints(root, complete_only=False)):
        problem = verify(found.path)
        if problem is None:
            return found
        moved = move_aside(found.path, problem)
        warn(f"skipping checkpoint {found.path.name}: {problem}; moved to {moved} (an older checkpoint is used)")
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


class ManifestWriter:
    """Rank 0's background thread that completes saved checkpoints: it hashes one's files, writes its manifest and
    then rotates, while training goes on. One thread, so checkpoints complete in the order they were saved.

    An error in the thread (a full disk) is raised on the training thread at the next `submit` or `wait`.
    `hash_file` is for tests (one that blocks keeps a checkpoint incomplete for as long as a test needs)."""

    def __init__(self, hash_file: Callable[[Path], str] = sha256_file):
        self.hash_file = hash_file
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="kiln-manifest")
        self.pending: list[Future] = []

    def submit(self, ckpt: Path, step: int, meta: dict[str, Any], keep_last: int) -> None:
        self._reap(block=False)
        self.pending.append(self.pool.submit(self._complete, Path(ckpt), step, meta, keep_last))

    def _complete(self, ckpt: Path, step: int, meta: dict[str, Any], keep_last: int) -> None:
        write_manifest(ckpt, step, meta, self.hash_file)
        prune(ckpt.parent, keep_last)  # after the manifest: the new checkpoint counts among the kept ones

    def wait(self) -> float:
        """Block until every submitted checkpoint is complete (or its completion failed: raised here); returns
        the seconds this waited."""
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
         manifest_meta: dict[str, Any] | None = None, manifests: ManifestWriter | None = None) -> Path:
    """Save a checkpoint on every rank (all must call, all with a ManifestWriter or none); then rank 0 writes the
    manifest and prunes: in its writer's thread, returning at once, or without one before every rank returns."""
    root = Path(root)
    tag = tag_for(step)
    if _is_main():
        root.mkdir(parents=True, exist_ok=True)
        if (root / tag).exists():  # leftovers under this tag (a rolled-back branch, an earlier attempt)
            move_aside(root / tag, "replaced by a new save under the same tag")
    _barrier()
    client_state = {"kiln": {"format": CLIENT_STATE_FORMAT, "step": step, "rng": gather_rng_states(), **kiln_state}}
    engine.save_checkpoint(str(root), tag, client_state=client_state, save_latest=False)
    if engine.autotp_size() > 1:  # zero_to_fp32 cannot join tensor-parallel slices: DeepSpeed gathers them here
        whole = engine._consolidated_16bit_state_dict()  # every rank takes part; rank 0 receives the weights
        if _is_main():
            torch.save(whole, root / tag / CONSOLIDATED)
    _barrier()  # every rank's files are on disk before they are hashed
    if _is_main():
        meta = {"world_size": torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1,
                **(manifest_meta or {})}
        if manifests is not None:
            manifests.submit(root / tag, step, meta, keep_last)
        else:
            write_manifest(root / tag, step, meta)
            prune(root, keep_last)
    if manifests is None:
        _barrier()  # the manifest is there before any rank goes on
    return root / tag


def load(engine, root: Path, found: Found) -> dict[str, Any]:
    """Load a verified checkpoint into a freshly initialized engine (all ranks) and return Kiln's client
    state; this rank's RNG states are restored."""
    with weights_only_loads():
        load_path, client_state = engine.load_checkpoint(str(root), found.path.name)
    if load_path is None:
        raise RuntimeError(f"DeepSpeed could not load checkpoint {found.path}; see its log above")
    kiln = (client_state or {}).get("kiln")
    if not kiln or kiln.get("format") != CLIENT_STATE_FORMAT:
        raise RuntimeError(f"checkpoint {found.path} has no Kiln client state; it was not written by "
                           f"training_jobs.train, so it cannot be resumed (start a fresh run in another folder)")
    rank = torch.distributed.get_rank() if torch.distributed.is_initialized() else 0
    if len(kiln["rng"]) != (torch.distributed.get_world_size() if torch.distributed.is_initialized() else 1):
        raise RuntimeError(f"checkpoint {found.path} was written by {len(kiln['rng'])} ranks; resume with the same "
                           f"number (another world size needs DeepSpeed's universal checkpoint conversion)")
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


__all__ = ["CHECKPOINT_FORMAT", "CONSOLIDATED", "Cadence", "Found", "MANIFEST", "ManifestWriter", "checkpoints",
           "check_weights_only",
           "find_resumable", "load", "move_aside", "prune", "read_manifest", "rng_state", "save", "set_rng_state",
           "tag_for", "verify", "weights_only_loads", "write_manifest"]
