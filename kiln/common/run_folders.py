"""Training runs' folders (`$KILN_HOME/runs/<run key>/`, and with `storage.mirror_runs` their copies on S3,
`<prefix>/_runs/<run key>/`): which runs the store has moved past, and their checkpoints deleted.

A run's checkpoints (ZeRO-3 partitions: weights, fp32 master weights and Adam's moments, about 14 bytes a parameter)
are what it resumes from; once another run has replaced it in the store they are only disk and bucket space that
nothing reads: every new run key (new shards, a new tokenizer, other settings) starts a folder of its own. `prune`
deletes them, on this machine and on S3, for every run but the ones the store's `training_run` and `checkpoint` name,
the `keep` newest others (a failed run that may still be retried) and any a launch or a materialization holds. What a
run is and did stays: its summary, metrics, run config, MLflow run id and exports (the model a base checkpoint or an
older model card names). `kiln runs prune` does it on demand; `storage.keep_old_run_checkpoints` after each
`training_run` and `checkpoint` the store takes."""

from __future__ import annotations

import contextlib
import json
import shutil
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

# The training code (checkpoint.py imports torch) is imported inside the functions: the Dagster code location and the
# CLI import this module when they start, and need torch only once they survey or prune runs.
PRUNED = "checkpoints_pruned.json"  # in a pruned run's folder: when, and which checkpoints went
TRASH = ".pruned-"  # a run's checkpoints folder renamed so, then deleted


@dataclass
class Run:
    key: str
    status: str  # the summary's (completed, failed, stopped...), or "no summary" (never reached the end of a launch)
    steps: int | None
    modified: float  # the newest time any of its files was written here (seconds since the epoch), 0: only on S3
    checkpoints: list[str] = field(default_factory=list)  # complete ones here, oldest first
    checkpoint_bytes: int = 0
    on_s3: list[str] = field(default_factory=list)  # complete ones on S3
    kept_because: str | None = None  # why prune leaves it (None: its checkpoints go)

    @property
    def doomed(self) -> bool:
        """prune deletes its checkpoints (here or on S3)."""
        return self.kept_because is None and bool(self.checkpoints or self.on_s3)


def survey(runs_dir: Path, store, mirrored: bool, keep: int) -> list[Run]:
    """Every run here (and on S3 when runs are mirrored there), newest first, each with why prune keeps it."""
    from kiln.common.manifest import read_json_or_empty
    from kiln.common.storage import disk_bytes
    from training_jobs.checkpoint import checkpoints
    from training_jobs.launch import busy

    remote = store.remote if store is not None and mirrored else None
    keys = {p.name for p in runs_dir.iterdir() if p.is_dir() and not p.name.startswith(".")} \
        if runs_dir.is_dir() else set()
    if remote is not None:
        from kiln.common.run_mirror import RUNS

        keys |= set(remote.listing(remote.key(RUNS))[1])
    named = _named_by_the_store(store) if store is not None else {}
    runs = []
    for key in keys:
        folder = runs_dir / key
        summary = read_json_or_empty(folder / "summary.json")
        mine = _checkpoint_dir(folder).is_relative_to(folder)
        found = checkpoints(_checkpoint_dir(folder)) if folder.is_dir() else []
        # what the run wrote: not the locks (a check takes them) nor prune's own record
        files = [p for p in folder.rglob("*") if p.is_file() and p.name != PRUNED
                 and not any(part.startswith(".") for part in p.relative_to(folder).parts)] if folder.is_dir() else []
        run = Run(key, summary.get("status", "no summary"), summary.get("steps"),
                  max((p.stat().st_mtime for p in files), default=0.0), [f.path.name for f in found],
                  disk_bytes(_checkpoint_dir(folder)) if mine else 0)
        if remote is not None:
            run.on_s3 = sorted(_mirror(remote, folder).complete_on_s3())
        if key in named:
            run.kept_because = named[key]
        elif folder.is_dir() and (reason := busy(folder)):
            run.kept_because = f"in use: {reason}"
        elif not mine:
            run.kept_because = f"its checkpoints are outside its folder ({_checkpoint_dir(folder)}, " \
                               f"training.checkpoint.dir), perhaps shared with other runs"
        runs.append(run)
    runs.sort(key=lambda r: (r.modified, r.key), reverse=True)
    for run in [r for r in runs if r.kept_because is None][:keep]:
        run.kept_because = f"one of the {keep} newest others"
    return runs


def prune(runs_dir: Path, runs: list[Run], remote) -> int:
    """Delete the checkpoints of every run `survey` did not keep, each while holding the run (`_holding`); on S3
    every manifest first, so a half-deleted checkpoint is an incomplete one, never taken for complete. The bytes
    freed here."""
    from kiln.common.manifest import write_json_atomic
    from kiln.common.remote import LockHeld
    from kiln.common.storage import disk_bytes
    from training_jobs.launch import RunFolderBusy

    freed = 0
    for folder in {left.parent for left in runs_dir.glob(f"*/{TRASH}*")}:  # what a prune killed mid-deletion left
        with contextlib.suppress(RunFolderBusy), _holding(folder, None):  # held: another prune is deleting it now
            for left in folder.glob(f"{TRASH}*"):
                freed += disk_bytes(left)
                shutil.rmtree(left, ignore_errors=True)
    for run in [r for r in runs if r.doomed]:
        folder = runs_dir / run.key
        with contextlib.ExitStack() as held:
            try:
                mirror = held.enter_context(_holding(folder, remote))
            except (RunFolderBusy, LockHeld) as exc:  # a launch (or another prune) began since the survey
                run.kept_because = f"in use: {exc}"
                continue
            if mirror is not None:
                mirror.delete_checkpoints()
            if _checkpoint_dir(folder).is_dir():  # every step, complete or not, and the ones moved aside
                trash = folder / f"{TRASH}{uuid.uuid4().hex[:8]}"
                _checkpoint_dir(folder).rename(trash)  # first: never a half-deleted checkpoint where a launch looks
                freed += disk_bytes(trash)
                shutil.rmtree(trash)
            if folder.is_dir():
                write_json_atomic(folder / PRUNED, json.dumps(
                    {"at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "checkpoints": run.checkpoints,
                     "on_s3": run.on_s3}) + "\n")
    return freed


@contextlib.contextmanager
def _holding(folder: Path, remote) -> Iterator:
    """The run to ourselves: its folder's materialization and launch locks (a launch or a prune starting meanwhile
    is refused until we let go) and, with `remote`, its lease on S3 (no machine trains it meanwhile). Yields the
    run's mirror (None without `remote`); RunFolderBusy or LockHeld while another holds one."""
    from training_jobs.launch import LOCK, MATERIALIZING, run_folder_lock

    with contextlib.ExitStack() as held:
        if folder.is_dir():
            held.enter_context(run_folder_lock(folder, MATERIALIZING))
            held.enter_context(run_folder_lock(folder, LOCK))
        mirror = _mirror(remote, folder) if remote is not None else None
        if mirror is not None:
            held.enter_context(mirror.holding())
        yield mirror


def _named_by_the_store(store) -> dict[str, str]:
    """Run key -> why: the run of the store's current training_run, and the run its current checkpoint came from."""
    named = {}
    run = store.published_manifest("training_run")
    if run is not None and run.stats.get("run_dir"):
        named[Path(run.stats["run_dir"]).name] = "the store's current training_run"
    checkpoint = store.published_manifest("checkpoint")
    if checkpoint is not None and "training_run" in checkpoint.inputs:
        source = store.manifest_at("training_run", None, checkpoint.inputs["training_run"])
        if source is not None and source.stats.get("run_dir"):
            named.setdefault(Path(source.stats["run_dir"]).name, "the run of the store's current checkpoint")
    return named


def _checkpoint_dir(folder: Path) -> Path:
    """Where the run saves its checkpoints: its run config's training.checkpoint.dir, else <folder>/checkpoints (the
    run config's output_dir is where the folder was when it was written, perhaps another machine's KILN_HOME)."""
    from training_jobs.settings import RunConfig

    try:
        configured = RunConfig.read(folder / "run_config.json").training.checkpoint.dir
    except (OSError, ValueError):
        configured = None
    return Path(configured) if configured else folder / "checkpoints"


def _mirror(remote, folder: Path):
    from kiln.common.run_mirror import RunMirror

    return RunMirror(remote, folder, _checkpoint_dir(folder))



def prune_old_runs(home: Path, store, mirror_runs: bool, keep: int) -> tuple[list[Run], int]:
    """`storage.keep_old_run_checkpoints`: survey and prune `home/runs` (and, with `mirror_runs`, the runs on S3)
    against `store`, keeping the `keep` newest runs it does not name. The runs whose checkpoints went, and the bytes
    freed here."""
    runs = survey(home / "runs", store, mirror_runs, keep)
    doomed = [r for r in runs if r.doomed]
    freed = prune(home / "runs", runs, store.remote if mirror_runs else None)
    return [r for r in doomed if r.kept_because is None], freed
