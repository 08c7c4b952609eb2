"""Training: a DeepSpeed ZeRO-3 run launched through Dagster Pipes, its checkpoint, and its evaluation."""

import contextlib
import hashlib
import json
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import dagster as dg

from assets.partitions import FOLLOW_TRAINING, follow_only
from assets.quality import QUALITY_FILTERED
from assets.tokens import ALL_SOURCES, SHARDS, TOKENIZER
from kiln.common.config import ConfigError, ProjectConfig, kiln_home, merge_config, parse_config
from kiln.common.manifest import applied_requests, code_version, git_commit, read_json_or_empty, write_json_atomic
from kiln.common.plots import figure_markdown, pyplot
from kiln.common.remote import LockHeld
from kiln.common.run_folders import prune_old_runs
from kiln.common.secrets import redact, redact_url
from kiln.common.storage import IncompleteDataset
from kiln.governance.audit import trained_on
from kiln.governance.catalog import AuditError
from kiln.governance.exposure import EXPOSURE_FILE, held_versions, measure_exposure
from kiln.governance.forget import (
    REQUESTS,
    ForgetError,
    first_match,
    load_requests,
    raw_partitions,
    unapplied_requests,
    with_intake_urls,
)
from kiln.governance.refresh import latest, load_refreshes, materialized, upto
from kiln.governance.replay import ReplayError, named_places, trained_validation, val_fraction_of, write_removed
from kiln.tokens.shard_format import VAL
from kiln.tokens.shard_writer import is_validation
from kiln.tokens.tokenizer import Tokenizer, read_documents
from resources import KilnConfig, KilnEngine, KilnStorage, MlflowTracking, TrainingLauncher
from training_jobs.launch import MATERIALIZING, RunFolderBusy, busy, run_folder_lock
from training_jobs.settings import RunConfig
from training_jobs.span_lengths import sentinel_problem

if TYPE_CHECKING:
    from kiln.common.storage import Store
    from kiln.common.run_mirror import RunMirror

RUN, CHECKPOINT, EVALUATION = "training_run", "checkpoint", "evaluation"
REPO = Path(__file__).resolve().parents[1]
PROBES = REPO / "training_jobs" / "probes.json"


def run_key(shards_version: str, tokenizer_version: str, settings_json: str, world_size: int) -> str:
    """Same data, settings and number of ranks, same run folder: a materialization after a crash resumes that run.
    Another number of ranks is another run (another global batch, and checkpoints only that many ranks can load):
    its own folder, so a finished run is not resumed on it nor refused."""
    return hashlib.sha256(
        f"{shards_version}\0{tokenizer_version}\0{settings_json}\0{world_size}".encode()).hexdigest()[:12]


def continued_run(base: dict | None, replay: dict | None) -> str:
    """What a continued run adds to its run key: the base's identity and the replay it reads (share, folder, that
    folder's version and the documents excluded from it). Another version of the replayed shards, or a new
    exclusion, is another run: a checkpoint's loader position means nothing in another version (the loader refuses
    it), so that run starts afresh in a folder of its own instead of failing on every retry."""
    return json.dumps({"base": base["sha256"], "replay": replay}) if base else ""


class TrainingLaunch(dg.Config):
    """One run's changes to the project config's training recipe, from the launchpad (every field left empty keeps
    the project's value). The names are the project config's keys; the result is validated like the config."""

    base_checkpoint: Optional[str] = None  # training.base_checkpoint: a checkpoint folder, or "latest"
    rewarmup_steps: Optional[int] = None  # training.rewarmup_steps
    objective: Optional[str] = None  # training.objective: clm | prefix_lm | span_corruption
    seq_len: Optional[int] = None  # training.seq_len
    max_steps: Optional[int] = None  # training.max_steps
    rope_theta: Optional[float] = None  # training.model.rope_theta
    rope_scaling_factor: Optional[float] = None  # training.model.rope_scaling: {type: linear, factor: ...}
    replay_share: Optional[float] = None  # mixture.replay.share
    replay_from: Optional[str] = None  # mixture.replay.from
    launcher: Optional[str] = None  # training.launcher: deepspeed | torchrun | ray

    def apply(self, config: ProjectConfig) -> ProjectConfig:
        training = {k: getattr(self, k) for k in ("base_checkpoint", "rewarmup_steps", "objective", "seq_len",
                                                  "max_steps", "launcher") if getattr(self, k) is not None}
        scaling = None if self.rope_scaling_factor is None else {"type": "linear", "factor": self.rope_scaling_factor}
        model = {k: v for k, v in {"rope_theta": self.rope_theta, "rope_scaling": scaling}.items() if v is not None}
        replay = {k: v for k, v in {"share": self.replay_share, "from": self.replay_from}.items() if v is not None}
        change = {"training": {**training, **({"model": model} if model else {})},
                  **({"mixture": {"replay": replay}} if replay else {})}
        if not training and not model and not replay:
            return config
        try:
            return parse_config(merge_config(config.model_dump(mode="json", by_alias=True), change),
                                origin="training_run launch config")
        except ConfigError as exc:
            renamed = [f"{field} is {key}" for field, key in LAUNCH_KEYS.items() if getattr(self, field) is not None]
            raise dg.Failure(description=str(exc) + (f"\n(launch config: {'; '.join(renamed)})" if renamed else "")
                             ) from None


# The launch config's fields whose config key has another name: an error names the key.
LAUNCH_KEYS = {"rope_theta": "training.model.rope_theta", "rope_scaling_factor": "training.model.rope_scaling.factor",
               "replay_share": "mixture.replay.share", "replay_from": "mixture.replay.from"}


def check_sentinels(settings, tokenizer_card: dict, shards_seq_len: int | None) -> None:
    """Span corruption needs a sentinel per noise span of a window: the tokenizer this KILN_HOME fitted (once, and
    kept: the config's tokenizer.sentinel_tokens may have changed since) must have them at the seq_len the run reads,
    or the run fails at step 1 after launching."""
    if settings.objective != "span_corruption":
        return
    have = sum(k.startswith("sentinel_") for k in tokenizer_card["special_tokens"])
    seq_len, key = ((settings.seq_len, "training.seq_len") if settings.seq_len
                    else (shards_seq_len, "the token shards' seq_len, shards.seq_len"))
    if tokenizer_card.get("source", "train") == "train":
        have_text, fix = ("the tokenizer of this KILN_HOME was fitted " + (f"with {have}" if have else "without them")
                          + " (it is fitted once and kept)", "re-materialize `tokenizer` and `token_shards` with "
                          "tokenizer.sentinel_tokens ≥ {need}, or use a fresh KILN_HOME")
    else:  # brought: its sentinels are the <extra_id_0>, <extra_id_1>, ... tokens of the file
        have_text, fix = (f"the brought tokenizer (tokenizer.source {tokenizer_card['source']!r}) has {have} "
                          f"<extra_id_N> tokens", "add {need} of them, <extra_id_0> onwards, to it "
                          "(tokenizers: add_special_tokens) and re-materialize `tokenizer` and `token_shards`")
    problem = sentinel_problem(seq_len, key, have, have_text, fix)
    if problem:
        raise dg.Failure(description=problem)


def continued_from(config: ProjectConfig, store, tokenizer_sha256: str, shards) -> tuple[dict | None, dict | None]:
    """A continued run's base checkpoint (its folder, identity and the chain it was built from) and replay data,
    checked before anything launches; (None, None) for a run from scratch."""
    from training_jobs.base import BaseCheckpointError, check_compatible, load_base
    from training_jobs.model import ModelConfig

    t = config.training
    if t.base_checkpoint is None:
        return None, None
    version = None
    if t.base_checkpoint == "latest":  # the newest checkpoint of this KILN_HOME (its `loads` check is blocking)
        try:
            ckpt = store.manifest(CHECKPOINT)
        except IncompleteDataset:
            raise dg.Failure(description="training.base_checkpoint is `latest`, but no checkpoint has been "
                                         "materialized in this KILN_HOME: train a base run first, or give a "
                                         "checkpoint folder") from None
        version, chain = ckpt.data_version, base_chain(store, store.dataset_dir(CHECKPOINT))
        # The base run's own export (its run folder stays): the checkpoint asset's folder is replaced by this run's.
        deepspeed_dir = Path(ckpt.stats["deepspeed_checkpoint"])
        export = deepspeed_dir.parents[1] / "export" / "safetensors"
        folder = export if export.is_dir() else deepspeed_dir
    else:
        folder = Path(t.base_checkpoint).expanduser().resolve()
        chain = base_chain(store, folder)
    try:
        info = load_base(folder, weights=False)
        seq_len = t.seq_len or shards.stats["seq_len"]
        check_compatible(info, ModelConfig(**t.model.architecture(shards.stats["vocab_size"], seq_len)),
                         tokenizer_sha256)
    except (BaseCheckpointError, FileNotFoundError) as exc:
        raise dg.Failure(description=str(exc)) from None
    base = {**info.describe(), "checkpoint_data_version": version, "chain": chain}
    replay = None
    if config.mixture.replay is not None:
        source = config.mixture.replay.from_ or info.trained_on
        if source is None:
            raise dg.Failure(description=f"mixture.replay.from is needed: base checkpoint {folder} does not record the "
                                         f"token shards it was trained on; give a token_shards folder")
        replay = {"share": config.mixture.replay.share, "dataset_dir": str(source)}
    return base, replay


def replay_removals(store, replay: dict | None, val_fraction: float | None):
    """The replayed documents the removal requests recorded so far name, and those in the run's validation split
    (`val_fraction`: the run's shards', as written) (kiln.governance.replay), and the requests' data version; (None,
    None) without replay, or for a folder that is no shard set (the training job refuses it)."""
    from kiln.governance.replay import ReplayError, plan_replay

    if replay is None or not (Path(replay["dataset_dir"]) / "_manifest.json").is_file():
        return None, None
    requests, version = load_requests(store)
    try:
        return plan_replay(store, replay["dataset_dir"], requests, val_fraction), version
    except ReplayError as exc:
        raise dg.Failure(description=str(exc)) from None


def launch_layout(settings, training_launcher: TrainingLauncher) -> tuple[str, int]:
    """The launcher this run uses and the ranks it starts, refused before launch when training.parallelism does
    not fit them."""
    launcher = training_launcher.chosen(settings.launcher)
    try:
        world_size = training_launcher.world_size(settings.launcher)
        settings.parallelism.data_parallel(world_size)
    except ValueError as exc:
        raise dg.Failure(description=f"{exc} (the {launcher} launcher)") from None
    return launcher, world_size


def ray_reachable(training_launcher: TrainingLauncher, engine_address: str | None) -> None:
    """A Ray address nobody answers at fails here in seconds, naming the setting, as the data engine's does
    (the launched driver would retry for a minute); unset means RAY_ADDRESS or an embedded Ray."""
    from kiln.engine import EngineError, check_reachable

    named = [(training_launcher.ray_address, "TrainingLauncher.ray_address"), (engine_address, "engine.ray_address"),
             (os.environ.get("RAY_ADDRESS"), "RAY_ADDRESS")]
    address, origin = next(((a, o) for a, o in named if a), (None, None))
    if address is not None:
        try:
            check_reachable(address, origin)
        except EngineError as exc:
            raise dg.Failure(description=str(exc)) from None


def base_chain(store, folder: Path) -> dict | None:
    """What the base checkpoint was built from, as its lineage stood when this run started (the checkpoint asset
    is replaced by the continued run's own later, so the chain is kept here); None for a base from elsewhere."""
    from kiln.governance.audit import lineage
    from kiln.governance.catalog import AuditError
    from kiln.governance.render import render_lineage

    try:
        chain = lineage(store, str(folder))
    except AuditError:
        return None
    return {"target": chain.target, "text": render_lineage(chain, files_per_node=1),
            "nodes": [{"key": n.key, "data_version": n.data_version, "created_at": n.created_at, "inputs": n.inputs}
                      for n in chain.nodes]}


def _mlflow_run(tracking: MlflowTracking, run_dir: Path, name: str, tags: dict[str, str]) -> tuple[str, str]:
    """The MLflow run of this run folder: the interrupted attempt's, or a new one tagged with lineage."""
    with tracking.calls("training_run: the MLflow experiment"):
        experiment_id = tracking.prepare()
    id_file = run_dir / "mlflow_run_id"
    if id_file.is_file():
        return experiment_id, id_file.read_text().strip()
    with tracking.calls("training_run: creating the MLflow run"):
        run = tracking.client().create_run(experiment_id, run_name=name, tags=tags)
    run_dir.mkdir(parents=True, exist_ok=True)
    write_json_atomic(id_file, run.info.run_id)  # a retry reads it back: never an empty id after a crash
    return experiment_id, run.info.run_id


def _end_mlflow_run(context: dg.AssetExecutionContext, tracking: MlflowTracking, run_id: str, status: str) -> None:
    """The MLflow run of a launch that failed or was stopped, ended as `status` unless its ranks ended it; a tracking
    server that cannot be reached now is logged (by the error's kind: its text may hold the URI's credentials), not
    raised over the launch's own error."""
    try:
        if tracking.end_unfinished(run_id, status):
            context.log.warning(f"MLflow run {run_id} was still RUNNING after the launch ended; marked {status}")
    except Exception as exc:  # noqa: BLE001: any MLflow or network error
        context.log.warning(f"could not end MLflow run {run_id} as {status} at {redact_url(tracking.tracking_uri)}: "
                            f"{type(exc).__name__}")


@dg.asset(
    key=RUN, deps=[SHARDS, TOKENIZER], group_name="training", kinds={"pytorch", "deepspeed", "mlflow"},
    automation_condition=FOLLOW_TRAINING,  # only with `refresh.train: true`: training is never started by surprise
    pool="training",  # GPU concurrency: `concurrency.pools` in dagster.yaml caps how many runs train at once
    code_version=code_version("training_jobs", "kiln.governance.exposure", "kiln.governance.replay",
                              "kiln.tokens.shard_format", "kiln.planning.memory", "kiln.common.splitmix"),
)
def training_run(context: dg.AssetExecutionContext, config: TrainingLaunch, kiln_config: KilnConfig,
                 storage: KilnStorage,
                 training_launcher: TrainingLauncher, mlflow_tracking: MlflowTracking,
                 pipes_subprocess_client: dg.PipesSubprocessClient, engine: KilnEngine) -> dg.MaterializeResult:
    """A DeepSpeed pretraining run (the ZeRO stage its layout chooses) on the newest refresh's token shards, tracked
    in MLflow; a crashed or stopped run resumes from its newest complete checkpoint when materialized again."""
    project, store = config.apply(kiln_config.load()), storage.store()
    refresh, shards = latest(store, SHARDS)
    if pending := unapplied_requests(store, shards):
        raise dg.Failure(description=(
            f"{SHARDS}/{refresh} hold documents that removal request(s) {', '.join(r.request_id for r in pending)} "
            f"name, recorded after they were written: materialize {SHARDS} again first (the UI shows it stale; "
            f"quality_filtered_documents too), so that no run reads them"))
    tok = store.manifest(TOKENIZER)
    settings = project.training
    check_sentinels(settings, tok.stats["card"], shards.stats.get("seq_len"))
    launcher, world_size = launch_layout(settings, training_launcher)
    base, replay = continued_from(project, store, tok.stats["card"]["sha256"], shards)
    removals, requests_version = replay_removals(store, replay, val_fraction_of(shards))
    if removals is not None and removals.exclude:  # the loader skips them; a new exclusion is a new run folder
        replay = {**replay, "exclude": removals.exclude}
    if removals is not None and removals.held_out:
        held = removals.describe()["validation_held_out"]
        context.log.warning(f"mixture.replay: {held['documents']:,} replayed train document(s) ({held['tokens']:,} "
                            f"tokens) are in this run's validation split (shards.val_fraction {held['val_fraction']}, "
                            f"the replayed set's {held['replayed_val_fraction']}): left out of the replay")
    if base is not None and (overlap := trained_validation(base.get("trained_on"), store.dataset_dir(SHARDS, refresh),
                                                           shards)):
        base = {**base, "trained_on_validation": overlap}
        context.log.warning(
            f"the base checkpoint's training shards were written at shards.val_fraction {overlap['base_val_fraction']}"
            f", this run's at {overlap['val_fraction']}: the base trained on "
            + (f"{overlap['documents']:,}" if overlap["documents"] is not None else "some (no member list to count)")
            + " of this run's validation documents, so its validation loss (and the base's) is optimistic there")
    # The versions checked here are the ones every rank reads: a partition materialized again before the loaders
    # open it is refused, not read unchecked.
    pinned_replay = replay and {**replay, "data_version": removals and removals.data_version}
    key = run_key(shards.data_version, tok.data_version,
                  settings.model_dump_json() + continued_run(base, pinned_replay), world_size)
    run_dir = kiln_home() / "runs" / key
    # This materialization's claim on the folder, from the check to the launch's end: a second one of the same run
    # key would else pass the check before this launch holds the folder (LOCK) and rewrite its run_config.json and
    # MLflow run id under it.
    claim, holds = contextlib.ExitStack(), contextlib.ExitStack()
    try:
        claim.enter_context(run_folder_lock(run_dir, MATERIALIZING))
    except RunFolderBusy as exc:
        raise dg.Failure(description=f"training_run: {exc}",
                         metadata={"run_dir": dg.MetadataValue.path(str(run_dir))}) from None
    with claim:
        if reason := busy(run_dir):  # before anything is written there (the launch itself is refused too)
            raise dg.Failure(description=f"training_run: {reason}",
                             metadata={"run_dir": dg.MetadataValue.path(str(run_dir))})
        tags = {"kiln.dagster_run_id": context.run.run_id, "kiln.token_shards.data_version": shards.data_version,
                "kiln.refresh": refresh,
                "kiln.tokenizer.data_version": tok.data_version, "kiln.tokenizer.sha256": tok.stats["card"]["sha256"],
                "kiln.git_commit": git_commit() or "unknown", "kiln.run_key": key,
                **({"kiln.base_checkpoint.sha256": base["sha256"], "kiln.base_checkpoint": base["path"]}
                   if base else {})}
        launch_config = settings.to_run_config(
            dataset_dir=store.dataset_dir(SHARDS, refresh), tokenizer_sha256=tok.stats["card"]["sha256"],
            output_dir=run_dir, tokenizer_dir=store.dataset_dir(TOKENIZER), experiment=mlflow_tracking.experiment,
            run_name=f"kiln-{key}", tags=tags, base_checkpoint=base and base["path"], replay=pinned_replay,
            dataset_data_version=shards.data_version)
        if (mirror := _run_mirror(store, project, run_dir, launch_config)) is not None:
            try:
                claim.enter_context(mirror.holding())  # the run folder's lock above is this machine's only
            except LockHeld as exc:
                raise dg.Failure(description=f"training_run: {exc}: another machine is training this run. Wait "
                                             f"for it to end (materializing then resumes from its checkpoints, or "
                                             f"trains nothing when it finished), or stop it there") from None
            if settings.checkpoint.resume and (pulled := mirror.pull(context.log.warning)):
                context.log.info(f"training_run: resuming from {pulled}, downloaded from {mirror.url()}")
        experiment_id, mlflow_run_id = _mlflow_run(mlflow_tracking, run_dir, f"kiln-{key}", tags)
        run_config = launch_config.write(run_dir / "run_config.json")
        # Kept on disk until what the run read of them is measured below, then read there: a removal request applied
        # while it trains materializes the shards again, and removes the version replaced once nobody holds it.
        claim.push(lambda failed, *_: holds.close() if failed else None)  # a launch that failed lets go at once
        read_folders = held_versions(run_config, holds)
        env = {**training_launcher.env(), **mlflow_tracking.env(), "MLFLOW_RUN_ID": mlflow_run_id}
        ray_address = engine.ray_address or project.engine.ray_address  # the data engine's cluster, for `ray`
        if launcher == "ray":
            ray_reachable(training_launcher, ray_address)
        command = training_launcher.command(run_config, settings.launcher, ray_address)
        try:
            with mirror.pushing(context.log.info, context.log.warning) if mirror else contextlib.nullcontext():
                reported = pipes_subprocess_client.run(command=command, context=context,
                                                       env=env, cwd=str(REPO)).get_materialize_result()
        except Exception as exc:  # noqa: BLE001: Dagster's Pipes error (not exported by `dagster`); why: summary.json
            if reason := busy(run_dir):  # another launch took the folder after the check above: not our summary
                raise dg.Failure(description=f"training_run: {reason}",
                                 metadata={"run_dir": dg.MetadataValue.path(str(run_dir))}) from None
            _end_mlflow_run(context, mlflow_tracking, mlflow_run_id, "FAILED")
            summary = read_json_or_empty(run_dir / "summary.json")
            why = redact(summary.get("error") or str(exc))  # the ranks' traceback may quote the tracking URI's password
            raise dg.Failure(description=f"training {summary.get('status', 'failed')}: {why}",
                             metadata={"run_dir": dg.MetadataValue.path(str(run_dir))}) from None
        except BaseException:  # the step interrupted (Terminate in the UI): Pipes stopped the launch with it
            _end_mlflow_run(context, mlflow_tracking, mlflow_run_id, "KILLED")
            raise
    with holds:
        summary = read_json_or_empty(run_dir / "summary.json")
        if mirror is not None and summary.get("exports"):  # for the checkpoint asset on another machine
            mirror.push_exports(summary["exports"])
        metrics = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
        # What the run read, from its loader's final cursor (the last checkpoint's): membership and the data card
        # answer from it, not from the shards' member list alone.
        exposed = measure_exposure(run_config, summary["loader"], run_dir / EXPOSURE_FILE, read_folders) \
            if summary.get("loader") else None
    with store.staging(RUN) as writer:
        for name in ("summary.json", "run_config.json", "metrics.jsonl"):
            shutil.copy2(run_dir / name, writer.dir / name)
        inputs = {f"{SHARDS}/{refresh}": shards.data_version, TOKENIZER: tok.data_version}
        if removals is not None:  # the replayed shards (and the requests applied to them) are inputs too
            write_removed(writer.dir, removals)
            inputs |= {k: v for k, v in removals.inputs(requests_version).items() if k not in inputs}
        if exposed is not None:
            shutil.move(run_dir / EXPOSURE_FILE, writer.dir / EXPOSURE_FILE)
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"training": settings.model_dump(mode="json"),
                    "replay": replay and {k: v for k, v in replay.items() if k != "exclude"},
                    "launcher": {"name": launcher, "world_size": world_size}},
            inputs=inputs,
            counts={"steps": summary["steps"], "tokens_seen": summary["tokens_seen"]},
            stats={"summary": summary, "run_dir": str(run_dir), "base_checkpoint": base,
                   "mlflow": {"experiment_id": experiment_id, "run_id": mlflow_run_id},
                   **({"replay": removals.describe()} if removals is not None else {}),
                   **({"exposure": exposed} if exposed is not None else {})})
    pruned = _prune_old_runs(context, store, project)
    return dg.MaterializeResult(
        metadata={
            **reported.metadata,
            **pruned,
            "loss_curve": dg.MetadataValue.md(loss_plot_markdown(metrics)),
            "time_breakdown": dg.MetadataValue.md(time_plot_markdown(summary)),
            "mlflow_run": dg.MetadataValue.url(mlflow_tracking.run_url(experiment_id, mlflow_run_id)),
            "stability_events": dg.MetadataValue.json(summary["stability_events"]),
            # the ZeRO stage and micro-batch the run chose (or was given) and why (training_jobs/layout.py)
            **({"layout": dg.MetadataValue.json(summary["layout"])} if summary.get("layout") else {}),
            "refresh": refresh, "run_dir": dg.MetadataValue.path(str(run_dir)), "data_version": manifest.data_version,
            # the run's checkpoints on S3, which another machine resumes from (kiln/common/run_mirror.py)
            **({"run_copy": dg.MetadataValue.text(mirror.url())} if mirror is not None else {}),
            **({"base_checkpoint": dg.MetadataValue.json({k: base[k] for k in ("path", "kind", "sha256",
                                                                                "checkpoint_data_version")}),
                "replay": dg.MetadataValue.json(replay and {k: v for k, v in replay.items() if k != "exclude"})}
               if base else {}),
            **({"exposure": dg.MetadataValue.json({role: {n: {k: v[k] for k in ("tokens_read", "share", "passes")}
                                                          for n, v in r.get("per_source", {}).items()}
                                                   for role, r in exposed["roles"].items()})} if exposed else {}),
            **({"replay_removed": dg.MetadataValue.json({k: removals.describe()[k] for k in (
                "removal_requests", "removed_documents", "removed_tokens", "validation_held_out")})}
               if removals is not None else {}),
            **({"base_trained_on_validation": dg.MetadataValue.json(base["trained_on_validation"])}
               if base and base.get("trained_on_validation") else {}),
        },
        data_version=dg.DataVersion(manifest.data_version))


def _run_mirror(store: "Store", project: ProjectConfig, run_dir: Path,
                run: RunConfig | None = None) -> Optional["RunMirror"]:
    """The run folder's copy in the store's bucket (storage.mirror_runs), or None on local storage. `run`: the
    launch's config, for where its checkpoints go and how many are kept."""
    if store.remote is None or not project.storage.mirror_runs:
        return None
    from kiln.common.run_mirror import RunMirror  # imports torch: only where a run is mirrored

    if run is None:
        return RunMirror(store.remote, run_dir)
    return RunMirror(store.remote, run_dir, run.checkpoint_dir(), run.training.checkpoint.keep_last)


def loss_curve(metrics: list[dict]) -> list[tuple[int, float, float]]:
    """(step, train loss, lr) per step, from metrics.jsonl's rows: a step logged again (trained again after a resume
    from an earlier checkpoint, or after a rollback) by its last row, the one the run kept, in step order. File order
    drew the curve doubling back at every resume."""
    last = {m["step"]: (m["train/loss"], m["train/lr"]) for m in metrics if m.get("train/loss") is not None}
    return [(step, loss, lr) for step, (loss, lr) in sorted(last.items())]


def loss_plot_markdown(metrics: list[dict]) -> str:
    """Training loss (and learning rate) per step: a curve reads faster than a table."""
    curve = loss_curve(metrics)
    if not curve:
        return "no steps logged"
    steps, losses, lrs = zip(*curve)
    fig, ax = pyplot().subplots(figsize=(6, 3), dpi=100)
    ax.plot(steps, losses, lw=1, label="train loss")
    ax.set_xlabel("step")
    ax.set_ylabel("loss")
    lr_ax = ax.twinx()
    lr_ax.plot(steps, lrs, lw=0.8, color="tab:orange", label="lr")
    lr_ax.set_ylabel("learning rate")
    return figure_markdown(fig, "training loss")


def time_plot_markdown(summary: dict) -> str:
    """Where the run's wall time went (summary.json's `time`), longest part first: what stands between the step
    throughput and the goodput."""
    spent = summary.get("time") or {}
    wall = spent.get("wall_s")
    parts = {k.removesuffix("_s"): v for k, v in spent.items() if k != "wall_s" and v > 0}
    if not wall or not parts:
        return "no time recorded"
    names = sorted(parts, key=parts.get)
    fig, ax = pyplot().subplots(figsize=(6, 1 + 0.25 * len(names)), dpi=100)
    ax.barh(names, [parts[n] for n in names])
    for i, name in enumerate(names):
        ax.text(parts[name], i, f" {parts[name]:,.1f} s ({parts[name] / wall:.0%})", va="center", fontsize=7)
    ax.set_xlim(0, max(parts.values()) * 1.3)
    ax.set_xlabel("seconds")
    ax.tick_params(axis="y", labelsize=7)
    step, goodput, steady = (summary.get(k) for k in ("tokens_per_s", "goodput_tokens_per_s",
                                                      "steady_goodput_tokens_per_s"))
    share = f": goodput {goodput / step:.0%} of step throughput" if step and goodput else ""
    share += f" (steady {steady / step:.0%})" if share and steady else ""
    ax.set_title(f"Wall time {wall:,.1f} s{share}", fontsize=9)
    return figure_markdown(fig, "where the wall time went")


@dg.asset(key=CHECKPOINT, deps=[RUN], group_name="training", kinds={"pytorch", "safetensors"},
          automation_condition=follow_only(RUN),
          code_version=code_version("training_jobs.export"),
          check_specs=[dg.AssetCheckSpec("loads", asset=CHECKPOINT, blocking=True,
                                         description="the safetensors export, reloaded, gives the loss the trained "
                                                     "model had on a held-back sequence (recorded at save time)")])
def checkpoint(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
               mlflow_tracking: MlflowTracking) -> dg.MaterializeResult:
    """The trained model: consolidated fp32 safetensors, a Hugging Face Llama export with the tokenizer, hashed."""
    import torch

    from training_jobs.export import load_model, probe_check

    store, project = storage.store(), kiln_config.load()
    run = store.manifest(RUN)
    summary = run.stats["summary"]
    with store.staging(CHECKPOINT) as writer:
        for fmt, folder in _exports_here(store, project, run.stats).items():
            for f in Path(folder).rglob("*"):
                if f.is_file():
                    target = writer.dir / fmt / f.relative_to(folder)
                    target.parent.mkdir(parents=True, exist_ok=True)
                    _link_or_copy(f, target)
        model = load_model(writer.dir / "safetensors")
        if summary.get("loss_probe"):
            loads = probe_check(model, summary["loss_probe"], summary["precision"])
        else:  # a run without validation data: nothing recorded to compare with; the logits must be finite
            with torch.no_grad():
                logits = model(torch.arange(min(16, model.cfg.max_seq_len)).unsqueeze(0) % model.cfg.vocab_size)
            loads = {"passed": bool(torch.isfinite(logits).all()), "recorded": "none: the run had no validation data"}
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"formats": sorted(summary["exports"])}, inputs={RUN: run.data_version},
            counts={"parameters": summary["n_params"], "steps": summary["steps"]},
            stats={"model": summary["model"], "deepspeed_checkpoint": summary["checkpoint"],
                   "checkpoint_manifest_sha256": summary["checkpoint_sha256"], "mlflow": run.stats["mlflow"]})
    pruned = _prune_old_runs(context, store, project)
    base = store.dataset_dir(CHECKPOINT)
    mlflow_run = run.stats["mlflow"]["run_id"]
    with mlflow_tracking.calls(f"checkpoint: logging the exports to MLflow run {mlflow_run}"):
        client = mlflow_tracking.client()
        for fmt in summary["exports"]:  # this version's exports, whatever is committed meanwhile
            client.log_artifacts(mlflow_run, str(writer.committed.folder / fmt), artifact_path=f"checkpoint/{fmt}")
    return dg.MaterializeResult(
        metadata={"parameters": summary["n_params"], "steps": summary["steps"], "formats": sorted(summary["exports"]),
                  "files": dg.MetadataValue.json({f.path: f.sha256[:16] for f in manifest.files}),
                  "mlflow_run": dg.MetadataValue.url(mlflow_tracking.run_url(run.stats["mlflow"]["experiment_id"],
                                                                             mlflow_run)),
                  "data_card": dg.MetadataValue.path(str(store.root / "data_card" / "_all" / "data_card.md")),
                  "path": dg.MetadataValue.path(str(base)), "data_version": manifest.data_version, **pruned},
        check_results=[dg.AssetCheckResult(check_name="loads", passed=loads["passed"],
                                           metadata={k: v for k, v in loads.items() if k != "passed"})],
        data_version=dg.DataVersion(manifest.data_version))


def _prune_old_runs(context: dg.AssetExecutionContext, store: "Store", project: ProjectConfig) -> dict:
    """`storage.keep_old_run_checkpoints`: once a commit may have moved the store past a run, that run's checkpoints
    go (kiln/common/run_folders.py). The metadata saying which went; a deletion that fails is a warning, not a
    failure: the commit stands, and the next materialization (or `kiln runs prune`) tries again."""
    keep = project.storage.keep_old_run_checkpoints
    if keep is None:
        return {}
    try:
        pruned, freed = prune_old_runs(kiln_home(), store, project.storage.mirror_runs, keep)
    except Exception as exc:  # noqa: BLE001: disk or S3; the materialization it follows has succeeded
        context.log.warning(f"storage.keep_old_run_checkpoints: deleting the checkpoints of old runs failed "
                            f"({redact(str(exc))}); they stay until the next materialization or `kiln runs prune`")
        return {}
    if pruned:
        context.log.info(f"storage.keep_old_run_checkpoints: {keep}: deleted the checkpoints of {len(pruned)} old "
                         f"run(s) ({', '.join(r.key for r in pruned)}), {freed / 1e6:,.1f} MB here"
                         + (" and their copies on S3" if any(r.on_s3 for r in pruned) else ""))
    return {"pruned_runs": dg.MetadataValue.json(
        {"runs": {r.key: {"checkpoints": r.checkpoints, "on_s3": r.on_s3} for r in pruned}, "freed_bytes": freed})}


def _exports_here(store: "Store", project: ProjectConfig, run: dict) -> dict[str, Path]:
    """The run's export folders ({format: folder}) on this machine: where the run wrote them, or, where the run
    trained elsewhere (another pod, another KILN_HOME), downloaded from its copy in the bucket into this KILN_HOME's
    folder of the run."""
    trained_in = Path(run["run_dir"])
    recorded = {fmt: Path(folder) for fmt, folder in run["summary"]["exports"].items()}
    if all(folder.is_dir() for folder in recorded.values()):
        return recorded
    here = kiln_home() / "runs" / trained_in.name
    exports = {fmt: here / folder.relative_to(trained_in) for fmt, folder in recorded.items()}
    if all(folder.is_dir() for folder in exports.values()):
        return exports
    if (mirror := _run_mirror(store, project, here)) is None or not mirror.pull_exports():
        raise dg.Failure(description=(
            f"checkpoint: the exports of the training run ({', '.join(map(str, recorded.values()))}) are not on this "
            "machine" + ("" if mirror is None else f" nor at {mirror.url()}") + ": materialize checkpoint where "
            "training_run ran, or train with storage.backend: s3 and storage.mirror_runs: true (the default there)"))
    return exports


def _link_or_copy(src: Path, dst: Path) -> None:
    try:
        os.link(src, dst)  # same filesystem: no second copy of the weights
    except OSError:
        shutil.copy2(src, dst)


@dg.asset(key=EVALUATION, deps=[CHECKPOINT, SHARDS, TOKENIZER, ALL_SOURCES], group_name="training",
          kinds={"pytorch"}, code_version=code_version("training_jobs.evaluate", "training_jobs.model", "training_jobs.export", "training_jobs.base",
                                    "kiln.tokens.shard_writer", "kiln.tokens.tokenizer",  # the forward pass, the split
                                    "kiln.governance.audit", "kiln.governance.catalog",  # the versions it reads
                                    "kiln.governance.forget", "kiln.governance.replay"),  # what it may not read
          automation_condition=follow_only(CHECKPOINT))
def evaluation(context: dg.AssetExecutionContext, kiln_config: KilnConfig, storage: KilnStorage,
               mlflow_tracking: MlflowTracking) -> dg.MaterializeResult:
    """Validation loss and perplexity overall and per source, probe-set perplexity, sampled continuations, and
    the change since the previous evaluated checkpoint. After continued pretraining, also the base checkpoint's
    loss per domain on the same tokens: forgetting/<domain> in MLflow."""
    from training_jobs.base import base_model
    from training_jobs.evaluate import forgetting_by_domain, generate, stream, stream_loss, validation_stream
    from training_jobs.export import load_model

    config, store = kiln_config.load(), storage.store()
    settings = config.evaluation
    # The checkpoint's own run, shards and tokenizer (the store's newest run may be a later one not exported yet, the
    # tokenizer and shards fitted again since), each pinned: what is read is the version recorded below.
    try:
        trained = trained_on(store)
    except AuditError as exc:
        raise dg.Failure(description=f"evaluation: {exc}") from None
    ckpt, tok, run, refresh, shards = (trained.checkpoint, trained.tokenizer, trained.run, trained.refresh,
                                       trained.shards)
    model = load_model(ckpt.folder / "safetensors")
    base_info = run.stats.get("base_checkpoint")
    base = base_model(base_info["path"]) if base_info else None
    tokenizer = Tokenizer.load(tok.folder)
    # Both models read the same windows: a long-context run is compared at the length its base can read.
    seq_len = min(model.cfg.max_seq_len, shards.manifest.stats["seq_len"],
                  *([base.cfg.max_seq_len] if base else []))
    # A removal request recorded since the shards were written (a run in flight then, its checkpoint published since)
    # may name validation documents: never read here either, from the shards or from the documents.
    requests, requests_version = load_requests(store)
    included = upto(load_refreshes(store), refresh)
    try:
        held = [r for r in requests if r.request_id not in applied_requests(shards.manifest)]
        places = named_places(store, shards.folder, shards.manifest, held, VAL, shards.folder, "evaluation",
                              "validation")
        removed, exclude = places.removed, places.exclude
        matchers = with_intake_urls(store, requests, raw_partitions(store, [s.name for s in config.sources], included))
    except (ReplayError, ForgetError) as exc:
        raise dg.Failure(description=str(exc)) from None
    result = {"validation": stream_loss(model, validation_stream(shards.folder, tokenizer.sha256,
                                                                  settings.max_val_tokens, exclude),
                                        seq_len, settings.batch_size),
              "removed_by_request": {"documents": len(removed),
                                     "tokens": sum(r["copies"] * r["tokens"] for r in removed)},
              # validation documents the base checkpoint trained on (its shards' val_fraction was lower): the loss
              # is optimistic on them (training_run's stats.base_checkpoint.trained_on_validation)
              "base_trained_on_validation": (base_info or {}).get("trained_on_validation")}
    result["per_source"], base_per_source, documents = {}, {}, {}
    val_fraction = val_fraction_of(shards.manifest)  # the split the run trained on, not the config's now
    for s in config.sources:
        docs, n = [], 0
        parts = materialized(store, QUALITY_FILTERED, [s.name], included)  # the current documents, recorded below
        documents |= {f"{QUALITY_FILTERED}/{p}": m.manifest.data_version for p, m in parts.items()}
        for doc in read_documents([f for m in parts.values() for f in m.files("documents")]):
            if is_validation(doc.doc_id, val_fraction) and first_match(matchers, doc.doc_id, doc.source, None) is None:
                docs.append(tokenizer.encode(doc.text))
                n += len(docs[-1]) + 1
                if n >= settings.max_tokens_per_source:
                    break
        tokens = stream(docs, tokenizer.eos_id)[:settings.max_tokens_per_source]
        result["per_source"][s.name] = stream_loss(model, tokens, seq_len, settings.batch_size)
        if base is not None:
            base_per_source[s.name] = stream_loss(base, tokens, seq_len, settings.batch_size)
    result["forgetting"] = forgetting_by_domain(result["per_source"], base_per_source,
                                                {s.name: s.domain for s in config.sources}) if base else None
    probes = json.loads(PROBES.read_text())
    result["probes"] = {p["name"]: stream_loss(model, stream([tokenizer.encode(p["text"])], tokenizer.eos_id), seq_len)
                        for p in probes["probes"]}
    result["samples"] = [{"prompt": prompt, "continuation": tokenizer.decode(generate(
        model, tokenizer.encode(prompt), settings.sample_tokens, eos_id=tokenizer.eos_id))}
        for prompt in probes["prompts"]]
    try:
        previous = store.manifest(EVALUATION)
        result["previous"] = {"checkpoint": previous.inputs.get(CHECKPOINT),
                              "validation_loss": previous.stats["validation"]["loss"]}
    except IncompleteDataset:
        result["previous"] = None
    with store.staging(EVALUATION) as writer:
        (writer.dir / "evaluation.json").write_text(json.dumps(result, indent=2, ensure_ascii=False))
        manifest = writer.commit(
            code_version=context.assets_def.code_versions_by_key[context.asset_key],
            config={"evaluation": settings.model_dump()},
            inputs={CHECKPOINT: ckpt.manifest.data_version, f"{SHARDS}/{refresh}": shards.manifest.data_version,
                    TOKENIZER: tok.manifest.data_version, **documents,
                    **({REQUESTS: requests_version} if requests_version else {})},
            counts={"validation_tokens": result["validation"]["tokens"]}, stats=result)
    if result["forgetting"]:
        with mlflow_tracking.calls(f"evaluation: logging forgetting to MLflow run {run.stats['mlflow']['run_id']}"):
            client = mlflow_tracking.client()
            for domain, f in result["forgetting"].items():
                client.log_metric(run.stats["mlflow"]["run_id"], f"forgetting/{domain}", f["forgetting"],
                                  step=run.stats["summary"]["steps"])
    val = result["validation"]["loss"]
    prev = result["previous"]["validation_loss"] if result["previous"] else None
    return dg.MaterializeResult(
        metadata={
            "validation_loss": val, "validation_perplexity": result["validation"]["perplexity"],
            "change_since_previous": round(val - prev, 5) if val is not None and prev is not None else None,
            "per_source": dg.MetadataValue.md(_loss_table(result["per_source"], "source")),
            "probes": dg.MetadataValue.md(_loss_table(result["probes"], "probe")),
            "samples": dg.MetadataValue.md("\n\n".join(f"**{s['prompt']!r}** → `{s['continuation']!r}`"
                                                       for s in result["samples"])),
            **({"forgetting": dg.MetadataValue.md(_forgetting_table(result["forgetting"]))} if result["forgetting"]
               else {}),
            "data_version": manifest.data_version,
        },
        data_version=dg.DataVersion(manifest.data_version))


def _forgetting_table(forgetting: dict[str, dict]) -> str:
    lines = ["| domain | tokens | base loss | loss | forgetting |", "|---|---:|---:|---:|---:|"]
    for domain, f in forgetting.items():
        lines.append(f"| {domain} | {f['tokens']:,} | {f['base_loss']} | {f['loss']} | {f['forgetting']} |")
    return "\n".join(lines)


def _loss_table(rows: dict[str, dict], label: str) -> str:
    lines = [f"| {label} | tokens | loss | perplexity |", "|---|---:|---:|---:|"]
    for name, r in rows.items():
        lines.append(f"| {name} | {r['tokens']:,} | {r['loss']} | {r['perplexity']} |")
    return "\n".join(lines)
