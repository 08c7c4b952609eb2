"""A training run's checkpoints kept in the store's S3 bucket as well as on the machine that trains
(`storage.backend: s3`, `storage.mirror_runs`), so that a run stopped on one machine resumes on another: a spot
instance reclaimed, a node replaced, a Dagster run retried on a fresh pod.

What S3 holds, under `<storage.prefix>/_runs/<run key>/`:
- `checkpoints/step_N/...`: each complete checkpoint's files, its manifest.json uploaded last, so that a checkpoint
  on S3 counts as complete only once all of it is there, as on disk (checkpoint.py); the newest
  `training.checkpoint.keep_last` are kept, as on disk;
- `run/metrics.jsonl` and `run/mlflow_run_id`: the rows logged so far and the MLflow run, so a resumed run's loss
  curve and MLflow run go on where they stopped;
- `run/export/...` and `run/exports.json`: a finished run's exports (safetensors, Hugging Face), listed once all
  are up, so the checkpoint asset runs on another machine than the training (a Dagster run of its own, another pod).

The launching process uploads (`RunMirror.pushing`: a thread that looks for new complete checkpoints while the ranks
train; the ranks never wait on S3) and downloads before a launch (`RunMirror.pull`): when S3 holds a complete
checkpoint newer than any here, its files are fetched, each checked against the sha256 its manifest records, and
renamed into place whole. The launch then resumes from it as from one of its own.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import threading
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from kiln.common.manifest import sha256_file, write_file_atomic
from kiln.common.remote import CorruptRemoteFile, MissingRemoteFile, S3Remote
from training_jobs.checkpoint import MANIFEST, TAG, checkpoints, move_aside
from training_jobs.settings import CheckpointSettings

RUNS = "_runs"  # beside the datasets' folders in the bucket; no asset has this name
RUN_FILES = ("metrics.jsonl", "mlflow_run_id")  # what a resumed run continues besides its checkpoint
EXPORTS = "exports.json"  # a finished run's export files, listed once all of them are uploaded
PUSH_EVERY_S = 15.0  # how often the pushing thread looks for a new complete checkpoint
_PULLING = ".pulling-"  # a download in progress: not a step_N name, so never taken for a checkpoint


def _step(tag: str) -> int:
    return int(TAG.match(tag).group(1))


def _clear_stale_downloads(folder: Path) -> None:
    """Remove the staging folders of downloads into `folder` that a killed process left (the caller holds the run
    folder, so none is in progress)."""
    folder.mkdir(parents=True, exist_ok=True)
    for stale in folder.glob(_PULLING + "*"):
        shutil.rmtree(stale, ignore_errors=True)


@dataclass
class RunMirror:
    """One run folder's copy on S3 (see the module docstring). The folder's name is the run key (assets/training.py:
    `$KILN_HOME/runs/<key>`), the same on every machine whatever its KILN_HOME."""

    remote: S3Remote
    run_dir: Path
    checkpoint_dir: Path | None = None  # None: <run_dir>/checkpoints (training.checkpoint.dir unset)
    keep_last: int = CheckpointSettings.model_fields["keep_last"].default  # training.checkpoint.keep_last
    _on_s3: dict[str, bytes] | None = field(default=None, repr=False)  # tag -> manifest bytes of complete ones

    def __post_init__(self) -> None:
        self.run_dir = Path(self.run_dir)
        self.checkpoint_dir = Path(self.checkpoint_dir or self.run_dir / "checkpoints")

    def key(self, *parts: str) -> str:
        return self.remote.key(RUNS, self.run_dir.name, *parts)

    def url(self) -> str:
        return self.remote.url(self.key())

    def holding(self) -> contextlib.AbstractContextManager:
        """This machine's claim on the run across machines, for a launch's length: a lease on S3 (`launch.lock`,
        renewed while held). `LockHeld`, naming the host, while another machine's launch holds it: two machines
        training one run would each upload their checkpoints over the other's. A holder that dies loses it once it
        has not renewed it for two minutes (kiln.common.remote.LEASE_S)."""
        return self.remote.lock(self.key("launch.lock"), wait=False)

    def complete_on_s3(self) -> dict[str, bytes]:
        """Tag -> manifest bytes of every complete checkpoint on S3 (read once, then kept up to date by push)."""
        if self._on_s3 is None:
            self._on_s3 = {}
            for tag in self.remote.listing(self.key("checkpoints"))[1]:
                if TAG.match(tag) and (data := self.remote.get_bytes(self.key("checkpoints", tag, MANIFEST))):
                    self._on_s3[tag] = data
        return self._on_s3

    # ------------------------------------------------------------------------------------------------ push

    def push(self) -> list[str]:
        """Upload each of the newest keep_last complete checkpoints here that S3 lacks (or holds other bytes of:
        a step saved again after a rollback), newest first (the one a resume wants), the run's files with it, then
        delete from S3 the checkpoints older than its newest keep_last complete ones. Returns the tags uploaded."""
        on_s3, new = self.complete_on_s3(), []
        for found in reversed(checkpoints(self.checkpoint_dir)[-self.keep_last:]):
            try:
                manifest = (found.path / MANIFEST).read_bytes()
            except FileNotFoundError:  # rotated away since it was listed
                continue
            if on_s3.get(found.path.name) != manifest:
                new.append((found, manifest))
        if new:  # before any manifest: a complete checkpoint on S3 has its steps' rows there
            present = [name for name in RUN_FILES if (self.run_dir / name).is_file()]
            self.remote.upload_files([(self.run_dir / name, self.key("run", name)) for name in present])
        uploaded = []
        for found, manifest in new:
            tag = found.path.name
            if tag in on_s3:  # other bytes under the same step: incomplete on S3 until all of this one is there
                self.remote.delete_keys([self.key("checkpoints", tag, MANIFEST)])
                del on_s3[tag]
            names = json.loads(manifest)["files"]
            try:
                self.remote.upload_files([(found.path / name, self.key("checkpoints", tag, name)) for name in names])
            except Exception:
                if found.path.exists():
                    raise
                continue  # keep_last rotated it away mid-upload: a newer complete one is here
            self.remote.put_bytes(self.key("checkpoints", tag, MANIFEST), manifest)
            on_s3[tag] = manifest
            uploaded.append(tag)
        if uploaded:
            self._prune()
        return uploaded

    def _prune(self) -> None:
        """Delete every checkpoint on S3 (complete or not) older than the newest keep_last complete ones; each
        manifest first, so a checkpoint half deleted is an incomplete one, never a complete one with files missing."""
        on_s3 = self.complete_on_s3()
        kept = sorted(on_s3, key=_step)[-self.keep_last:]
        if not kept:
            return
        oldest_kept = _step(kept[0])
        self.delete_checkpoints([t for t in self.remote.listing(self.key("checkpoints"))[1]
                                 if TAG.match(t) and _step(t) < oldest_kept])

    def delete_checkpoints(self, tags: list[str] | None = None) -> None:
        """Delete checkpoints from S3: `tags`, or None for all of them (complete or not, and anything else under
        `checkpoints/`); each manifest first, so a checkpoint half deleted is an incomplete one, never a complete one
        with files missing."""
        listed = self.remote.listing(self.key("checkpoints"))[1] if tags is None else tags
        self.remote.delete_keys([self.key("checkpoints", t, MANIFEST) for t in listed])
        for tag in listed:
            (self._on_s3 or {}).pop(tag, None)
        prefixes = [self.key("checkpoints")] if tags is None else [self.key("checkpoints", t) for t in tags]
        for prefix in prefixes:
            self.remote.delete_keys(self.remote.list_keys(prefix))

    @contextlib.contextmanager
    def pushing(self, info: Callable[[str], None], warn: Callable[[str], None],
                every_s: float = PUSH_EVERY_S) -> Iterator[None]:
        """Push every `every_s` seconds on a thread for the block, and once more at its end (the run's last
        checkpoint). A failed push is reported and tried again at the next look: S3 being away for a while does not
        stop the training, it only leaves S3 behind."""
        stop = threading.Event()

        def push_reporting() -> None:
            try:
                if uploaded := self.push():
                    info(f"checkpoint(s) {', '.join(uploaded)} copied to {self.url()}")
            except Exception as exc:  # noqa: BLE001: any failure of S3 or the network; the next look tries again
                warn(f"copying checkpoints to {self.url()} failed ({type(exc).__name__}: {exc}); trying again")

        def loop() -> None:
            while not stop.wait(every_s):
                push_reporting()

        thread = threading.Thread(target=loop, daemon=True, name="kiln-run-mirror")
        thread.start()
        try:
            yield
        finally:
            stop.set()
            thread.join()
            push_reporting()

    def push_exports(self, exports: dict[str, str]) -> None:
        """A finished run's exports ({format: folder} under the run folder, training_jobs/export.py), for the
        checkpoint asset on a machine without the run folder; the list of their files (sha256, bytes) last."""
        files = {}
        for folder in exports.values():
            for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
                files[path.relative_to(self.run_dir).as_posix()] = {"sha256": sha256_file(path),
                                                                     "bytes": path.stat().st_size}
        self.remote.delete_keys([self.key("run", EXPORTS)])  # a run exported again: incomplete until all is there
        self.remote.upload_files([(self.run_dir / name, self.key("run", name)) for name in files])
        self.remote.put_bytes(self.key("run", EXPORTS), json.dumps(files, indent=2).encode("utf-8"))

    # ------------------------------------------------------------------------------------------------ pull

    def pull(self, warn: Callable[[str], None]) -> str | None:
        """When S3 holds a complete checkpoint newer than the newest complete one here, download it (every file
        checked against its manifest's sha256) and rename it into place, with the run's files; a corrupt or
        incomplete copy on S3 is reported and the next older one tried. Returns the tag brought here, or None.
        Call while holding the run folder (no launch writes there meanwhile)."""
        _clear_stale_downloads(self.checkpoint_dir)
        here = checkpoints(self.checkpoint_dir)
        newest_here = here[-1].step if here else -1
        for tag in sorted(self.complete_on_s3(), key=_step, reverse=True):
            if _step(tag) <= newest_here:
                return None
            manifest = self.complete_on_s3()[tag]
            staging = self.checkpoint_dir / f"{_PULLING}{tag}-{uuid.uuid4().hex[:8]}"
            try:
                files = json.loads(manifest)["files"]
                self.remote.download_files([(self.key("checkpoints", tag, name), staging / name, info["sha256"])
                                            for name, info in files.items()])
            except (CorruptRemoteFile, MissingRemoteFile, ValueError, KeyError, TypeError) as exc:
                shutil.rmtree(staging, ignore_errors=True)
                warn(f"not resuming from {self.url()}/checkpoints/{tag}: {exc}; trying an older one")
                continue
            write_file_atomic(staging / MANIFEST, lambda f: f.write(manifest))  # last, as a save writes it
            target = self.checkpoint_dir / tag
            if target.exists():  # this machine's copy, incomplete: a crash while it was saved
                move_aside(target, f"incomplete; the complete copy of {tag} was downloaded from {self.url()}")
            os.replace(staging, target)
            self._pull_run_files()
            return tag
        return None

    def _pull_run_files(self) -> None:
        """The run's files as S3 has them (newer than this machine's: they went up with a newer checkpoint)."""
        self.run_dir.mkdir(parents=True, exist_ok=True)
        for name in RUN_FILES:
            data = self.remote.get_bytes(self.key("run", name))
            if data is not None:
                write_file_atomic(self.run_dir / name, lambda f, data=data: f.write(data))

    def pull_exports(self) -> bool:
        """The run's exports from S3 into the run folder, each file checked against its sha256, in place whole
        (those here before are replaced: an export is derived from the checkpoint, nothing is lost). False when S3
        has none (the run did not finish, or was not mirrored)."""
        data = self.remote.get_bytes(self.key("run", EXPORTS))
        if data is None:
            return False
        _clear_stale_downloads(self.run_dir)
        staging = self.run_dir / f"{_PULLING}export-{uuid.uuid4().hex[:8]}"
        try:
            self.remote.download_files([(self.key("run", name), staging / name, info["sha256"])
                                        for name, info in json.loads(data).items()])
            for folder in sorted({Path(name).parts[0] for name in json.loads(data)}):
                target = self.run_dir / folder
                if target.exists():
                    shutil.rmtree(target)
                os.replace(staging / folder, target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        return True
