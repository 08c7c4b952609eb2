"""The training entry point: one process per rank, launched by torchrun or the deepspeed launcher, or run
inside a Ray Train worker by training_jobs/ray_launch.py.

    torchrun --standalone --nproc_per_node 2 -m training_jobs.train --run-config run.json
    deepspeed --num_gpus 2 --module training_jobs.train --run-config run.json
    python -m training_jobs.ray_launch --num-workers 2 --run-config run.json   # on a Ray cluster
    python -m training_jobs.train --run-config run.json          # one process, no launcher

On CPU set DS_ACCELERATOR=cpu (the default here when no GPU is visible). Training on CPU skips DeepSpeed's
shared-memory all-reduce op (see init_distributed), so nothing is JIT-built; TORCH_EXTENSIONS_DIR (default
$KILN_HOME/torch_extensions when KILN_HOME is set) keeps any op that a DeepSpeed config does build.

Writes into the run config's output_dir: checkpoints/ (see checkpoint.py), export/ (see export.py),
metrics.jsonl (every step, rank 0) and summary.json (at the end, atomically, also when the run fails).
Metrics go to MLflow when MLFLOW_TRACKING_URI is set, and the final figures to Dagster when launched
through Dagster Pipes.

Test-only fault injection: KILN_INJECT_FAULT="spike@12" multiplies the loss of step 12 by 100 (once per
process; "spike@12x5" by 5), "nan@12" makes it NaN, "hang@12" stops in step 12 (to be killed).
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import json
import logging
import math
import os
import sys
import time
import traceback
import uuid
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from training_jobs import checkpoint
from training_jobs.base import BaseWeights, check_compatible, load_base, load_into
from training_jobs.flops import device_peak_flops, mfu
from training_jobs.loader import ReplayLoader, ShardLoader
from training_jobs import scaling_names
from training_jobs.model import ModelConfig, Transformer, flops_per_token, loss_sums_by_position, param_count
from training_jobs.monitor import ROLLBACK, Event, StabilityMonitor, TrainingDiverged
from training_jobs.objectives import Objective, make_objective
from training_jobs.schedule import lambda_lr
from training_jobs.settings import RunConfig, TrainingSettings, load_deepspeed_config

SUMMARY_FORMAT = "kiln-training-summary/1"


# DeepSpeed's ZeRO-3 calls these on every step; the warning says nothing a user can act on.
warnings.filterwarnings("ignore",
                        message=r".*torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated")


def default_environment() -> None:
    """Environment DeepSpeed reads at import; set before importing it. Explicit settings win."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # deepspeed imports mlflow
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if "KILN_HOME" in os.environ:
        os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(Path(os.environ["KILN_HOME"]) / "torch_extensions"))
    # Always the same ninja for the JIT-built op: two ninja versions (the venv's, the system's) read each
    # other's build log as stale and rebuild it (~50 s) whenever the PATH differs between launches.
    venv_bin = Path(sys.executable).parent
    if (venv_bin / "ninja").exists() and not os.environ.get("PATH", "").startswith(str(venv_bin)):
        os.environ["PATH"] = f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}"
    # Without a launcher: a world of one.
    for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1"}.items():
        os.environ.setdefault(key, value)
    if "MASTER_PORT" not in os.environ:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            os.environ["MASTER_PORT"] = str(s.getsockname()[1])


# ---------------------------------------------------------------------------------------- components

@dataclass
class Dist:
    rank: int
    world_size: int
    device: torch.device

    @property
    def main(self) -> bool:
        return self.rank == 0


def init_distributed() -> Dist:
    import deepspeed
    import deepspeed.ops

    if not torch.cuda.is_available():
        # DeepSpeed's CPU shared-memory all-reduce serves inference_all_reduce only, never training. Its setup
        # costs a ~35 s JIT build and was seen spinning forever on /dev/shm flags at start (both ranks asleep in
        # its polling loop), so training on CPU does without it: gloo does the collectives.
        deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False
    deepspeed.init_distributed()  # nccl on GPUs; gloo on CPU without oneCCL
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    if torch.cuda.is_available():
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    return Dist(torch.distributed.get_rank(), torch.distributed.get_world_size(), device)


def resolve_precision(precision: str) -> str:
    if precision != "auto":
        return precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


# Tensor parallelism (Megatron's split of a block): these projections are cut by output rows (each rank computes
# some heads / hidden units), these by input columns (the ranks' partial products are summed); the rest is replicated.
TP_COLUMN = ("q_proj", "k_proj", "v_proj", "gate_proj", "up_proj")
TP_ROW = ("o_proj", "down_proj")


def deepspeed_config(t: TrainingSettings, precision: str, cfg: ModelConfig) -> dict[str, Any]:
    """The DeepSpeed JSON with its "auto" values filled from the training settings. A value that is set in
    the JSON and disagrees with the settings is an error, not a silent override."""
    path = t.deepspeed_config_path()
    ds = load_deepspeed_config(path)
    for key in ("optimizer", "scheduler"):
        if key in ds:
            raise ValueError(f"DeepSpeed config {path} has an {key!r} section; Kiln passes its own torch AdamW and LR "
                             f"schedule (training.schedule, weight_decay, betas): remove {key!r} from the JSON")
    if ds.get("fp16", {}).get("enabled") in (True, "auto"):
        raise ValueError(f"DeepSpeed config {path} enables fp16; Kiln trains in bf16 or fp32 (training.precision): "
                         f"remove the fp16 section")

    def fill(section: dict, key: str, value: Any, name: str) -> None:
        given = section.get(key, "auto")
        if given == "auto":
            section[key] = value
        elif given != value:
            raise ValueError(f"DeepSpeed config {path} sets {name} = {given!r} but the training settings give "
                             f"{value!r}; set it to \"auto\" (filled from training.*) or change the setting")

    fill(ds, "train_micro_batch_size_per_gpu", t.micro_batch_size, "train_micro_batch_size_per_gpu")
    fill(ds, "gradient_accumulation_steps", t.grad_accum, "gradient_accumulation_steps")
    fill(ds, "gradient_clipping", t.grad_clip, "gradient_clipping")
    fill(ds.setdefault("bf16", {}), "enabled", precision == "bf16", "bf16.enabled")
    ds.pop("train_batch_size", None) if ds.get("train_batch_size") == "auto" else None
    d = cfg.d_model  # size-dependent ZeRO buckets, the values HF's integration uses for "auto"
    zero = ds.setdefault("zero_optimization", {})
    for key, value in {"reduce_bucket_size": d * d, "stage3_prefetch_bucket_size": int(0.9 * d * d),
                       "stage3_param_persistence_threshold": 10 * d}.items():
        if zero.get(key) == "auto":
            zero[key] = value
    if t.parallelism.tp > 1:  # DeepSpeed AutoTP, with Kiln's split (it knows HF models' names, not ours)
        section = ds.setdefault("tensor_parallel", {})
        fill(section, "autotp_size", t.parallelism.tp, "tensor_parallel.autotp_size")
        section.setdefault("partition_config", {"use_default_specs": False, "layer_specs": [
            {"patterns": [rf".*\.{name}\.weight$" for name in TP_COLUMN], "partition_type": "column"},
            {"patterns": [rf".*\.{name}\.weight$" for name in TP_ROW], "partition_type": "row"}]})
    stage = zero_stage(t)
    if stage is not None:
        if t.deepspeed_config is None:  # the shipped JSON's stage 3 is Kiln's default, not a choice to defend
            zero["stage"] = "auto"
        fill(zero, "stage", stage, "zero_optimization.stage")
    if zero.get("stage", 0) < 3:  # the stage-3 knobs mean nothing below it
        for key in [k for k in zero if k.startswith("stage3_")]:
            del zero[key]
    return ds


def zero_stage(t: TrainingSettings) -> int | None:
    """The ZeRO stage the layout asks for: parallelism.zero_stage; with pipeline stages 1 when unset (DeepSpeed's
    pipeline engine runs stage 0 or 1 only); None leaves the DeepSpeed JSON's."""
    layout = t.parallelism
    if layout.zero_stage is not None:
        return layout.zero_stage
    return 1 if layout.pp > 1 else None


def build_model(cfg: ModelConfig, t: TrainingSettings, ds_config: dict[str, Any],
                base: BaseWeights | None = None) -> Transformer:
    """A fresh model: the same weights on every rank, from the seed, or the base checkpoint's. Under ZeRO-3 it is
    built partitioned (each parameter split across ranks as it is created), so no process ever holds it whole:
    what makes a preset fit where each rank's memory is a fraction of it."""
    import deepspeed

    zero3 = ds_config.get("zero_optimization", {}).get("stage") == 3
    with deepspeed.zero.Init(config_dict_or_path=ds_config) if zero3 and t.zero_init else contextlib.nullcontext():
        model = Transformer(cfg, seed=t.seed, activation_checkpointing=t.model.activation_checkpointing)
    if base is not None:
        load_into(model, base)
    return model


def build_engine(cfg: ModelConfig, t: TrainingSettings, ds_config: dict[str, Any], total_steps: int,
                 monitor: StabilityMonitor, base: BaseWeights | None = None, model: Transformer | None = None):
    """The model (build_model, unless given; with parallelism.pp > 1 the pipeline stages of this rank), AdamW and
    LR schedule, wrapped by DeepSpeed (a PipelineEngine for stages). Called again for a rollback: ZeRO-3 loads
    checkpoints into fresh engines only."""
    import deepspeed

    if model is None and t.parallelism.pp > 1:
        from training_jobs.pipeline import pipeline_module

        model = pipeline_module(cfg, t.seed, t.parallelism.pp, t.model.activation_checkpointing, base)
    model = model if model is not None else build_model(cfg, t, ds_config, base)
    # Decay the matrices (and the embedding); norm gains stay out of weight decay. ds_shape: a partitioned
    # parameter's whole shape (built under zero.Init, its own is an empty placeholder).
    params = [p for p in model.parameters() if p.requires_grad]
    matrix = [len(getattr(p, "ds_shape", p.shape)) >= 2 for p in params]
    groups = [{"params": [p for p, m in zip(params, matrix) if m], "weight_decay": t.weight_decay},
              {"params": [p for p, m in zip(params, matrix) if not m], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=t.schedule.lr, betas=t.betas, eps=t.adam_eps)
    scheduler = lambda_lr(optimizer, t.resolved_schedule(), total_steps, scale=monitor.lr_scale)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_config, dist_init_required=False)
    return engine


def refresh_lr(engine) -> None:
    """Set the LR for the next update from the schedule (after a load: it may now include a rollback's
    reduction)."""
    sched = engine.lr_scheduler
    for group, base, fn in zip(sched.optimizer.param_groups, sched.base_lrs, sched.lr_lambdas):
        group["lr"] = base * fn(sched.last_epoch)


def current_lr(engine) -> float:
    return float(engine.lr_scheduler.optimizer.param_groups[0]["lr"])


class FaultInjector:
    """KILN_INJECT_FAULT="spike@K[xF]" or "nan@K": corrupt the loss of step K once; "hang@K": stop in step K
    so a test can kill the processes mid-step; "slow@MS": sleep MS milliseconds in every step, so a test can
    kill a node while the run is under way (tests only)."""

    def __init__(self, spec: str | None):
        self.kind, self.step, self.factor = None, -1, 100.0
        if spec:
            kind, _, rest = spec.partition("@")
            step, _, factor = rest.partition("x")
            if kind not in ("spike", "nan", "hang", "slow") or not step.isdigit():
                raise ValueError(f"KILN_INJECT_FAULT={spec!r}: expected spike@STEP[xFACTOR], nan@STEP, hang@STEP "
                                 f"or slow@MILLISECONDS")
            self.kind, self.step, self.factor = kind, int(step), float(factor or 100)

    def __call__(self, step: int, loss: torch.Tensor) -> torch.Tensor:
        if self.kind == "slow":
            time.sleep(self.step / 1000)
            return loss
        if step != self.step:
            return loss
        self.step = -1  # once: after a rollback the same step number gets other data
        if self.kind == "hang":
            time.sleep(3600)
        return loss * float("nan") if self.kind == "nan" else loss * self.factor


def train_step(engine, loader: ShardLoader | ReplayLoader, grad_accum: int, step: int, fault: FaultInjector,
               objective: Objective) -> float:
    """One optimizer step over grad_accum micro-batches; returns the mean loss over every rank."""
    if engine.pipeline_parallelism:
        # Every stage reads the batches (only the first and last use them), so all ranks' loaders stay at the same
        # position. DeepSpeed returns the mean over micro-batches and replicas, on every stage. The fault corrupts
        # the reported loss only: the stages run their own backward passes.
        batches = [objective(*loader.next_batch(), step, micro)[:2] for micro in range(grad_accum)]
        return fault(step, engine.train_batch(iter(batches))).item()
    total = torch.zeros((), dtype=torch.float32, device=engine.device)
    for micro in range(grad_accum):
        x, y, prefix = objective(*loader.next_batch(), step, micro)
        d = engine.device
        loss = fault(step, engine(x.to(d), y.to(d), None if prefix is None else prefix.to(d)))
        engine.backward(loss)  # DeepSpeed divides by grad_accum itself
        engine.step()  # updates only at the accumulation boundary
        total += loss.detach().float()
    torch.distributed.all_reduce(total)
    return total.item() / (grad_accum * torch.distributed.get_world_size())


# Perplexity by position in the window (of the predicted token): a long-context extension should lower the
# far buckets. MLflow metric names allow no "+", hence "4k-up".
POSITION_BUCKETS = (("0-1k", 0, 1024), ("1k-4k", 1024, 4096), ("4k-up", 4096, None))


@torch.no_grad()
def evaluate(engine, val: ShardLoader | None, batches: int | None) -> dict[str, Any] | None:
    """Causal LM loss over the first `batches` validation micro-batches of every rank (the same ones each time),
    whatever the training objective: {"loss": mean, "ppl_pos": {bucket: perplexity}}."""
    if val is None:
        return None
    engine.eval()
    val.load_state_dict({**val.state_dict(), "epoch": 0, "position": 0})
    n = val.batches_per_epoch if batches is None else min(batches, val.batches_per_epoch)
    buckets = [(name, lo, hi) for name, lo, hi in POSITION_BUCKETS if lo < val.seq_len]
    sums = torch.zeros(len(buckets), dtype=torch.float64, device=engine.device)
    counts = torch.zeros(len(buckets), dtype=torch.float64, device=engine.device)

    def add(by_position: torch.Tensor, rows: int) -> None:  # (T,) summed over `rows` sequences
        for i, (_, lo, hi) in enumerate(buckets):
            sums[i] += by_position[lo:hi].sum()
            counts[i] += by_position[lo:hi].numel() * rows

    if engine.pipeline_parallelism:  # the last stage has the sums; the other stages add nothing
        from training_jobs.pipeline import position_sums

        by_position = position_sums(engine, [val.next_batch() for _ in range(n)])
        if by_position is not None:
            add(by_position.to(engine.device), n * val.batch_size)
    else:
        for _ in range(n):
            x, y = val.next_batch()
            add(loss_sums_by_position(engine(x.to(engine.device)), y.to(engine.device)), x.shape[0])
    torch.distributed.all_reduce(sums)
    torch.distributed.all_reduce(counts)
    engine.train()
    return {"loss": (sums.sum() / counts.sum()).item(),
            "ppl_pos": {name: math.exp(min((sums[i] / counts[i]).item(), 50.0))
                        for i, (name, _, _) in enumerate(buckets)}}


def agree(dist: Dist, *values: float | None) -> list[float | None]:
    """Rank 0's values on every rank, so every rank takes the same decision (rollback or not)."""
    t = torch.tensor([math.nan if v is None else float(v) for v in values], dtype=torch.float64)
    if dist.device.type == "cuda":
        t = t.to(dist.device)
    torch.distributed.broadcast(t, 0)
    return [float(v) for v in t.tolist()]


# ----------------------------------------------------------------------------------------- reporting

def _json_safe(value: Any) -> Any:
    """NaN/Inf as strings: summary.json stays strict JSON."""
    if isinstance(value, float) and not math.isfinite(value):
        return str(value)
    if isinstance(value, dict):
        return {k: _json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_json_safe(v) for v in value]
    return value


def write_json_atomic(path: Path, data: Any) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{uuid.uuid4().hex[:8]}")
    try:
        tmp.write_text(json.dumps(_json_safe(data), indent=2), encoding="utf-8")
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def flatten(prefix: str, value: Any) -> dict[str, Any]:
    if isinstance(value, dict):
        out = {}
        for k, v in value.items():
            out.update(flatten(f"{prefix}.{k}" if prefix else k, v))
        return out
    return {prefix: value}


class Reporter:
    """Rank 0's outputs: progress lines (stdout, and Dagster Pipes logs), metrics.jsonl, MLflow."""

    def __init__(self, run: RunConfig, dist: Dist, pipes):
        self.active = dist.main
        self.pipes = pipes
        self.metrics_file = Path(run.output_dir) / "metrics.jsonl"
        self.mlflow = None
        self.mlflow_run_id: str | None = None

    def start_mlflow(self, run: RunConfig, resume_run_id: str | None, params: dict[str, Any],
                     artifacts: dict[str, Any]) -> None:
        if not (self.active and os.environ.get("MLFLOW_TRACKING_URI")):
            return
        import mlflow

        self.mlflow = mlflow
        run_id = os.environ.get("MLFLOW_RUN_ID") or resume_run_id  # a run the launcher made, or the resumed one
        if run_id is None:
            mlflow.set_experiment(run.experiment)
        active = mlflow.start_run(run_id=run_id, run_name=None if run_id else run.run_name,
                                  tags=run.tags or None)
        self.mlflow_run_id = active.info.run_id
        # Params are immutable in MLflow: log them once, into a new run or one the launcher created (Dagster
        # makes the run to tag it); a resumed run keeps the ones it has.
        if not active.data.params:
            mlflow.log_params({k: str(v) for k, v in params.items()})
        for name, data in artifacts.items():
            mlflow.log_dict(data, name)

    def line(self, text: str) -> None:
        if self.active:
            print(text, flush=True)
            if self.pipes is not None:
                self.pipes.log.info(text)

    def step(self, step: int, metrics: dict[str, Any], to_mlflow: bool) -> None:
        if not self.active:
            return
        with open(self.metrics_file, "a", encoding="utf-8") as f:
            f.write(json.dumps(_json_safe({"step": step, **metrics})) + "\n")
        if to_mlflow and self.mlflow is not None:
            finite = {k: float(v) for k, v in metrics.items()
                      if isinstance(v, (int, float)) and math.isfinite(v)}
            self.mlflow.log_metrics(finite, step=step)

    def event(self, event: Event) -> None:
        self.line(f"stability: {event.kind} -> {event.action}: {event.message}")
        if self.active and self.mlflow is not None:
            self.mlflow.log_metric(f"stability/{event.kind}", 1.0, step=event.step)

    def finish(self, summary: dict[str, Any], failed: bool) -> None:
        if not self.active:
            return
        if self.mlflow is not None:
            self.mlflow.log_dict(_json_safe(summary), "summary.json")
            self.mlflow.log_dict(_json_safe(summary["stability_events"]), "stability_events.json")
            if summary.get("val_loss") is not None:
                self.mlflow.log_metrics({"val/loss": summary["val_loss"],
                                         **{f"val/ppl_pos/{k}": v for k, v in (summary["val_ppl_pos"] or {}).items()}},
                                        step=summary["steps"])
                if not failed:  # what `kiln plan --mlflow-uri` fits on (training_jobs.scaling_names)
                    self.mlflow.log_metrics({
                        scaling_names.TOKENS: float(summary["tokens_seen"]),
                        scaling_names.FLOPS: float(summary["flops_per_token"]) * summary["tokens_seen"],
                        scaling_names.FINAL_VAL_LOSS: float(summary["val_loss"])}, step=summary["steps"])
            self.mlflow.end_run(status="FAILED" if failed else "FINISHED")
        if self.pipes is not None and not failed:
            keys = ("status", "steps", "objective", "final_loss", "val_loss", "base_val_loss", "tokens_seen",
                    "tokens_per_s", "mfu", "n_params", "n_params_non_embedding", "world_size", "rollbacks",
                    "mlflow_run_id", "checkpoint", "summary_path")
            metadata = {k: _json_safe(summary[k]) for k in keys if summary.get(k) is not None}
            metadata["stability_events"] = len(summary["stability_events"])
            self.pipes.report_asset_materialization(metadata=metadata, data_version=summary.get("checkpoint_sha256"))


def open_pipes(dist: Dist, stack: contextlib.ExitStack):
    """Rank 0's Dagster Pipes context when launched through Pipes, else None."""
    from dagster_pipes import PipesEnvVarParamsLoader, open_dagster_pipes

    if dist.main and PipesEnvVarParamsLoader().is_dagster_pipes_process():
        return stack.enter_context(open_dagster_pipes())
    return None


@dataclass
class Host:
    """What a process manager around the entry point adds (the Ray launcher, training_jobs/ray_launch.py); the
    deepspeed launcher and torchrun need none of it."""

    pipes: Any = None  # rank 0's Pipes messages go here instead of through Pipes' own channel
    after_checkpoint: Callable[[int, Path], None] | None = None  # on every rank, after each complete checkpoint
    owns_process_group: bool = True  # False: the host set up torch.distributed and tears it down


# -------------------------------------------------------------------------------------------- the run

@dataclass
class Progress:
    """Where the run stands (the counters also go into checkpoints, see Trainer.kiln_state)."""

    step: int = 0
    tokens_seen: int = 0  # tokens of the optimizer steps that count (a rollback takes them back)
    tokens_skipped: int = 0  # tokens of data skipped by rollbacks
    last_checkpoint: Path | None = None
    resumed_from: str | None = None
    timings: list[float] = field(default_factory=list)  # seconds per step in this process
    last_loss: float | None = None


def check_tokenizer(run: RunConfig) -> None:
    if run.tokenizer_dir is None:
        return
    model = Path(run.tokenizer_dir) / "tokenizer.model"
    if not model.is_file():
        raise FileNotFoundError(f"tokenizer_dir {run.tokenizer_dir} has no tokenizer.model; point it at the "
                                f"tokenizer asset's folder or leave it out")
    sha = checkpoint.sha256_file(model)
    if sha != run.tokenizer_sha256.lower():
        raise ValueError(f"{model} has sha256 {sha[:12]}…, the run config says {run.tokenizer_sha256[:12]}…; "
                         f"write the run config from the same tokenizer asset the shards were made with")


def open_training(run: RunConfig, dist: Dist) -> ShardLoader | ReplayLoader:
    """The training batches: the run's shards, or with mixture.replay a share of every batch from the base's."""
    t = run.training
    if run.replay is None:
        return ShardLoader(run.dataset_dir, "train", t.seq_len, t.micro_batch_size, dist.rank, dist.world_size,
                           run.tokenizer_sha256, seed=t.seed, phases=t.phases)
    main = ShardLoader(run.dataset_dir, "train", t.seq_len, 1, dist.rank, dist.world_size, run.tokenizer_sha256,
                       seed=t.seed, phases=t.phases)
    replay = ShardLoader(run.replay.dataset_dir, "train", main.seq_len, 1, dist.rank, dist.world_size,
                         run.tokenizer_sha256, seed=t.seed)
    return ReplayLoader(main, replay, run.replay.share, t.micro_batch_size)


def objective_for(run: RunConfig, dist: Dist) -> Objective:
    """The training objective; span corruption takes its sentinel ids from the tokenizer card."""
    t = run.training
    sentinels, pad_id = [], 0
    if t.objective == "span_corruption":
        card = Path(run.tokenizer_dir or "") / "tokenizer.json"
        if run.tokenizer_dir is None or not card.is_file():
            raise FileNotFoundError("training.objective span_corruption reads the sentinel ids from the tokenizer "
                                    "card: the run config needs tokenizer_dir (the tokenizer asset's folder)")
        specials = json.loads(card.read_text(encoding="utf-8"))["special_tokens"]
        sentinels = [v["id"] for k, v in sorted(specials.items(), key=lambda kv: kv[1]["id"])
                     if k.startswith("sentinel_")]
        pad_id = specials["pad"]["id"]
    return make_objective(t.objective, t.seed, dist.rank, sentinels, pad_id)


def open_validation(run: RunConfig, seq_len: int, dist: Dist) -> ShardLoader | None:
    t = run.training
    try:
        return ShardLoader(run.dataset_dir, "val", seq_len, t.micro_batch_size, dist.rank, dist.world_size,
                           run.tokenizer_sha256, seed=t.seed, shuffle_epochs=False)
    except Exception as exc:  # noqa: BLE001: missing or too little validation data is not fatal
        if dist.main:
            print(f"warning: no validation loss: {exc}", flush=True)
        return None


def data_shard(dist: Dist, t: TrainingSettings) -> Dist:
    """This rank's place in the data-parallel split (rank = data-parallel rank, world_size = dp): the tp x pp ranks
    of one model replica read the same batches. DeepSpeed's pipeline topology numbers ranks stage-major (rank =
    stage * dp + data rank); AutoTP's groups are runs of tp consecutive ranks (rank = data rank * tp + tp rank)."""
    layout = t.parallelism
    dp = layout.data_parallel(dist.world_size)
    return Dist(dist.rank % dp if layout.pp > 1 else dist.rank // layout.tp, dp, dist.device)


def check_layout(t: TrainingSettings, cfg: ModelConfig) -> None:
    """What the trainer cannot run of a layout that divides the world, said before an engine is built."""
    layout = t.parallelism
    if layout.pp > 1:
        if t.objective != "clm":
            raise ValueError(f"training.objective {t.objective!r} with training.parallelism.pp {layout.pp}: the "
                             f"pipeline trains the causal LM objective only (prefix masks and span targets would have "
                             f"to cross stages); set training.objective: clm or parallelism.pp: 1")
        if layout.pp > cfg.n_layers:
            raise ValueError(f"training.parallelism.pp {layout.pp} is more than the model's {cfg.n_layers} blocks "
                             f"(a stage holds at least one); lower pp or use a deeper model")
    if layout.tp > 1:
        if layout.pp > 1:
            raise ValueError(f"training.parallelism tp {layout.tp} with pp {layout.pp}: the trainer runs tensor or "
                             f"pipeline parallelism, not both (DeepSpeed AutoTP shards a plain module, the pipeline "
                             f"engine its own); set tp: 1 or pp: 1")
        uneven = {k: v for k, v in {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                                    "ffn_hidden": cfg.ffn_hidden}.items() if v % layout.tp}
        if uneven:
            raise ValueError(f"training.parallelism.tp {layout.tp} does not divide the model's {uneven}: each rank "
                             f"holds whole heads and an equal slice of the MLP; pick a tp that divides them")


def broadcast_object(dist: Dist, obj: Any) -> Any:
    box = [obj if dist.main else None]
    torch.distributed.broadcast_object_list(box, src=0)
    return box[0]


class Trainer:
    """One run's components; `fit()` is the training loop."""

    def __init__(self, run: RunConfig, dist: Dist, report: Reporter, host: Host | None = None):
        t = self.t = run.training
        self.run, self.dist, self.report, self.host = run, dist, report, host or Host()
        self.shard = data_shard(dist, t)  # refuses a layout that does not fit the world, before anything is read
        check_tokenizer(run)
        torch.manual_seed(t.seed)
        self.loader = open_training(run, self.shard)
        self.objective = objective_for(run, self.shard)
        self.seq_len = self.loader.seq_len
        self.long_document_share = self.loader.long_document_share(self.seq_len)
        self.val = open_validation(run, self.seq_len, self.shard)
        self.cfg = ModelConfig(**t.model.architecture(self.loader.shard_set.vocab_size, self.seq_len))
        check_layout(t, self.cfg)
        self.max_steps = t.resolved_max_steps(self.shard.world_size, self.seq_len)
        self.total_steps = t.schedule.total_steps or self.max_steps
        self.tokens_per_step = t.tokens_per_step(self.shard.world_size, self.seq_len)
        self.precision = resolve_precision(t.precision)
        self.ds_config = deepspeed_config(t, self.precision, self.cfg)
        self.monitor = StabilityMonitor(t.monitor)
        base = None
        if run.base_checkpoint:  # continued pretraining: the base's weights, checked, then only its description kept
            base = load_base(run.base_checkpoint)
            check_compatible(base, self.cfg, run.tokenizer_sha256)
        self.base = base.describe() if base else None
        self.engine = build_engine(self.cfg, t, self.ds_config, self.total_steps, self.monitor, base)
        del base
        self.device_name, self.peak = device_peak_flops(t.peak_tflops)
        self.flops_per_token = flops_per_token(self.cfg, self.seq_len)
        self.n_params, self.n_non_embedding = param_count(self.cfg), param_count(self.cfg, non_embedding=True)
        self.ckpt_root = run.checkpoint_dir()
        self.progress = Progress()
        self.fault = FaultInjector(os.environ.get("KILN_INJECT_FAULT"))

    # ------------------------------------------------------------------ the loop

    def fit(self) -> float | None:
        """Train to max_steps (resuming if a checkpoint exists), then checkpoint, validate and export."""
        t, p, report = self.t, self.progress, self.report
        self.resume()
        self.start_tracking()
        if self.base is not None and p.step == 0:  # the base's loss on this run's held-back tokens, before any update
            self.base_val = self.validate(0)
        t_start = time.perf_counter()
        while p.step < self.max_steps:
            t0 = time.perf_counter()
            lr = current_lr(self.engine)  # the LR of this update (the scheduler moves on inside the step)
            loss = train_step(self.engine, self.loader, t.grad_accum, p.step + 1, self.fault, self.objective)
            norm = self.engine.get_global_grad_norm()
            loss, grad_norm = agree(self.dist, loss, None if norm is None else float(norm))
            p.step, p.tokens_seen = p.step + 1, p.tokens_seen + self.tokens_per_step
            event = self.monitor.observe(p.step, loss, grad_norm)
            if event is not None and event.action == ROLLBACK:
                self.roll_back(event)
                continue
            if event is not None:
                report.event(event)
            dt = time.perf_counter() - t0
            p.timings.append(dt)
            p.last_loss = loss
            tokens_per_s = self.tokens_per_step / dt
            metrics = {"train/loss": loss, self.objective.loss_name: loss, "train/grad_norm": grad_norm,
                       "train/lr": lr,
                       "train/tokens_per_s": tokens_per_s, "train/tokens_seen": p.tokens_seen,
                       "train/mfu": mfu(self.flops_per_token, tokens_per_s, self.peak, self.dist.world_size),
                       "train/peak_memory_gib": peak_memory_gib()}
            log_now = p.step % t.log_every_steps == 0 or p.step == self.max_steps
            report.step(p.step, metrics, to_mlflow=log_now)
            if log_now:
                report.line(progress_line(p.step, self.max_steps, metrics, dt))
            if t.val_every_steps and p.step % t.val_every_steps == 0:
                self.validate(p.step)
            if t.checkpoint.every_steps and p.step % t.checkpoint.every_steps == 0:
                self.save()
        self.train_seconds = time.perf_counter() - t_start
        if p.last_checkpoint is None or p.last_checkpoint.name != checkpoint.tag_for(p.step):
            self.save()
        self.final_val = self.validate()
        self.probe = self.loss_probe()
        self.export()
        return self.final_val["loss"] if self.final_val else None

    # ------------------------------------------------------------------ components

    def kiln_state(self) -> dict[str, Any]:
        p = self.progress
        return {"tokens_seen": p.tokens_seen, "tokens_skipped": p.tokens_skipped, "last_loss": p.last_loss,
                "loader": self.loader.state_dict(),
                "monitor": self.monitor.state_dict(), "mlflow_run_id": self.report.mlflow_run_id}

    def save(self) -> None:
        p = self.progress
        meta = {"model": self.cfg.to_dict(), "tokens_seen": p.tokens_seen, "loader": self.loader.state_dict(),
                "stability_events": len(self.monitor.events), **self.trained_on()}
        p.last_checkpoint = checkpoint.save(self.engine, self.ckpt_root, p.step, self.kiln_state(),
                                            self.t.checkpoint.keep_last, meta)
        self.report.line(f"step {p.step}: checkpoint {p.last_checkpoint}")
        if self.host.after_checkpoint is not None:
            self.host.after_checkpoint(p.step, p.last_checkpoint)

    def trained_on(self) -> dict[str, Any]:
        """What a later continued run checks and replays from (training_jobs.base reads it back)."""
        return {"tokenizer_sha256": self.run.tokenizer_sha256, "dataset_dir": self.run.dataset_dir,
                "base_checkpoint": self.base}

    def newest_checkpoint(self) -> checkpoint.Found | None:
        found = checkpoint.find_resumable(self.ckpt_root, warn=self.report.line) if self.dist.main else None
        return broadcast_object(self.dist, found)

    def load(self, found: checkpoint.Found) -> dict[str, Any]:
        state = checkpoint.load(self.engine, self.ckpt_root, found)
        p = self.progress
        p.step, p.tokens_seen, p.last_checkpoint = found.step, state["tokens_seen"], found.path
        return state

    def resume(self) -> None:
        if not self.t.checkpoint.resume:
            if checkpoint.checkpoints(self.ckpt_root, complete_only=False):
                raise FileExistsError(
                    f"{self.ckpt_root} already holds checkpoints and checkpoint.resume is false: a new run there would "
                    f"mix with them (rotation, rollbacks); set checkpoint.resume: true to continue that run, or give "
                    f"this one another output_dir / checkpoint.dir")
            return
        found = self.newest_checkpoint()
        if found is None:
            return
        state = self.load(found)
        self.loader.load_state_dict(state["loader"])
        self.monitor.load_state_dict(state["monitor"])
        self.progress.tokens_skipped, self.progress.resumed_from = state["tokens_skipped"], str(found.path)
        self.progress.last_loss = state["last_loss"]
        self.resume_run_id = state["mlflow_run_id"]
        refresh_lr(self.engine)
        self.report.line(f"resumed from {found.path} at step {found.step}")

    def roll_back(self, event: Event) -> None:
        """Back to the last good checkpoint in a fresh engine; the loader keeps its position, so the data
        between that checkpoint and the spike is skipped; the LR is lowered for a while."""
        found = self.newest_checkpoint()
        if found is None:
            if event.kind == "nan":
                raise TrainingDiverged(f"{event.message} before the first checkpoint, so there is nothing to roll "
                                       f"back to; lower schedule.lr or raise warmup_steps (and checkpoint earlier)")
            self.monitor.reduce_lr_without_rollback(event)
            self.report.event(event)
            return
        del self.engine
        gc.collect()
        self.engine = build_engine(self.cfg, self.t, self.ds_config, self.total_steps, self.monitor)
        spike_step = event.step
        state = self.load(found)
        self.monitor.rolled_back(event, found.step, state["monitor"])  # raises TrainingDiverged when out of retries
        self.progress.tokens_skipped += (spike_step - found.step) * self.tokens_per_step
        refresh_lr(self.engine)
        self.report.event(event)
        self.report.line(f"rolled back to step {found.step} ({found.path.name}); skipping the data of steps "
                         f"{found.step + 1}..{spike_step}; LR x{event.lr_factor} until step {event.lr_reduced_until}")

    @torch.no_grad()
    def loss_probe(self) -> dict[str, Any] | None:
        """The trained model's loss on one held-back sequence, recorded with the sequence itself: the checkpoint
        asset reloads the export and must reproduce it (a check that fails when the saved weights are not the
        trained ones). Every rank runs the forward (ZeRO-3 gathers parameters collectively); rank 0's is kept."""
        if self.val is None:
            return None
        self.val.load_state_dict({**self.val.state_dict(), "epoch": 0, "position": 0})
        x, y = (t[:1] for t in self.val.next_batch())
        if self.engine.pipeline_parallelism:
            from training_jobs.pipeline import probe_loss

            loss = probe_loss(self.engine, x, y)
        else:
            self.engine.eval()
            loss = self.engine(x.to(self.engine.device), y.to(self.engine.device)).float().item()
            self.engine.train()
        return {"inputs": x[0].tolist(), "targets": y[0].tolist(), "loss": loss}

    def validate(self, log_at_step: int | None = None) -> dict[str, Any] | None:
        """Validation loss and perplexity by position; logged as a step's metrics when log_at_step is given (the
        final figures go out with the summary instead)."""
        result = evaluate(self.engine, self.val, self.t.val_batches)
        if result is None:
            return None
        by_position = ", ".join(f"{k} {v:.2f}" for k, v in result["ppl_pos"].items())
        self.report.line(f"step {self.progress.step}: val loss {result['loss']:.4f}; perplexity by position "
                         f"{by_position}")
        if log_at_step is not None:
            self.report.step(log_at_step, {"val/loss": result["loss"],
                                           **{f"val/ppl_pos/{k}": v for k, v in result["ppl_pos"].items()}},
                             to_mlflow=True)
        return result

    def export(self) -> None:
        self.exports: dict[str, str] = {}
        if self.dist.main and self.t.export:
            from training_jobs.export import export_checkpoint

            self.exports = export_checkpoint(self.progress.last_checkpoint, Path(self.run.output_dir) / "export",
                                             self.cfg, self.t.export, self.run.tokenizer_dir,
                                             {"steps": self.progress.step, "tokens_seen": self.progress.tokens_seen,
                                              **self.trained_on()})
            self.report.line(f"exported {', '.join(f'{k}: {v}' for k, v in self.exports.items())}")
        torch.distributed.barrier()

    def start_tracking(self) -> None:
        t, cfg = self.t, self.cfg
        params = {**flatten("training", t.model_dump(mode="json")), **flatten("model", cfg.to_dict()),
                  scaling_names.N_PARAMS: self.n_params, "model.n_params_non_embedding": self.n_non_embedding,
                  "model.flops_per_token": self.flops_per_token, "world_size": self.dist.world_size,
                  "tokens_per_step": self.tokens_per_step, "max_steps": self.max_steps, "precision": self.precision,
                  "device": self.device_name, "dataset_dir": self.run.dataset_dir,
                  "tokenizer_sha256": self.run.tokenizer_sha256,
                  "data.long_document_token_share": round(self.long_document_share, 4),
                  **({"base_checkpoint": self.base["path"], "base_checkpoint.sha256": self.base["sha256"]}
                     if self.base else {}),
                  **({"replay.share": self.run.replay.share, "replay.dataset_dir": self.run.replay.dataset_dir}
                     if self.run.replay else {})}
        artifacts = {"deepspeed_config.json": self.ds_config, "run_config.json": self.run.model_dump(mode="json"),
                     "model_config.json": cfg.to_dict()}
        self.report.start_mlflow(self.run, getattr(self, "resume_run_id", None), params, artifacts)
        todo = (f"steps {self.progress.step + 1}..{self.max_steps} of {self.tokens_per_step:,} tokens"
                if self.progress.step < self.max_steps else f"nothing to train: already at step {self.progress.step}")
        if self.base is not None:
            self.report.line(f"continued pretraining from {self.base['path']} ({self.base['kind']})")
        self.report.line(f"training {self.n_params:,} parameters ({self.n_non_embedding:,} non-embedding) on "
                         f"{self.dist.world_size} x {self.device_name} in {self.precision}; {todo}")

    def summary(self, status: str, val_loss: float | None = None, error: str | None = None) -> dict[str, Any]:
        p = self.progress
        steady = p.timings[1:] or p.timings  # the first step pays for warm-up
        tokens_per_s = self.tokens_per_step * len(steady) / sum(steady) if steady else None
        ckpt = p.last_checkpoint
        manifest = ckpt / checkpoint.MANIFEST if ckpt is not None else None
        return {
            "format": SUMMARY_FORMAT, "status": status, "error": error,
            "steps": p.step, "max_steps": self.max_steps, "final_loss": p.last_loss, "val_loss": val_loss,
            "val_ppl_pos": (getattr(self, "final_val", None) or {}).get("ppl_pos"), "objective": self.t.objective,
            "base_checkpoint": self.base, "base_val_loss": (getattr(self, "base_val", None) or {}).get("loss"),
            "replay": self.run.replay.model_dump() if self.run.replay else None,
            "long_document_token_share": self.long_document_share,
            "loss_probe": getattr(self, "probe", None),
            "tokens_seen": p.tokens_seen, "tokens_skipped": p.tokens_skipped, "tokens_per_step": self.tokens_per_step,
            "tokens_per_s": tokens_per_s,
            "mfu": mfu(self.flops_per_token, tokens_per_s or 0.0, self.peak, self.dist.world_size),
            "steps_this_run": len(p.timings), "train_seconds": round(getattr(self, "train_seconds", 0.0), 3),
            "world_size": self.dist.world_size, "device": self.device_name, "precision": self.precision,
            "parallelism": {"tp": self.t.parallelism.tp, "pp": self.t.parallelism.pp, "dp": self.shard.world_size,
                            "zero_stage": self.ds_config["zero_optimization"].get("stage")},
            "peak_flops_per_device": self.peak, "n_params": self.n_params,
            "n_params_non_embedding": self.n_non_embedding, "flops_per_token": self.flops_per_token,
            "model": self.cfg.to_dict(), "stability_events": [e.to_dict() for e in self.monitor.events],
            "rollbacks": self.monitor.rollbacks, "mlflow_run_id": self.report.mlflow_run_id,
            "checkpoint": str(ckpt) if ckpt else None, "resumed_from": p.resumed_from,
            "checkpoint_sha256": checkpoint.sha256_file(manifest)
            if manifest is not None and manifest.is_file() else None,
            "exports": getattr(self, "exports", {}),
            "summary_path": str(Path(self.run.output_dir) / "summary.json"),
        }


def peak_memory_gib() -> float:
    """Peak memory of this rank: allocated device memory on a GPU, resident set size on CPU."""
    if torch.cuda.is_available():
        return round(torch.cuda.max_memory_allocated() / 2**30, 3)
    import resource

    return round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)  # Linux reports KiB


def progress_line(step: int, max_steps: int, m: dict[str, Any], dt: float) -> str:
    mfu_text = f" | mfu {m['train/mfu']:.1%}" if m["train/mfu"] is not None else ""
    grad = m["train/grad_norm"]
    return (f"step {step}/{max_steps} | loss {m['train/loss']:.4f} | grad {grad:.3f} | lr {m['train/lr']:.2e} | "
            f"{m['train/tokens_per_s']:,.0f} tok/s{mfu_text} | {dt:.2f} s/step")


def main(argv: list[str] | None = None, host: Host | None = None) -> int:
    parser = argparse.ArgumentParser(description="Train a Kiln model on token shards with DeepSpeed ZeRO-3.")
    parser.add_argument("--run-config", required=True, type=Path, help="the run config JSON (RunConfig)")
    parser.add_argument("--local_rank", "--local-rank", type=int, default=None,
                        help="set by the deepspeed launcher (torchrun sets LOCAL_RANK instead)")
    args = parser.parse_args(argv)
    if args.local_rank is not None:
        os.environ["LOCAL_RANK"] = str(args.local_rank)
    run = RunConfig.read(args.run_config)
    default_environment()
    dist = init_distributed()
    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    if dist.main:
        Path(run.output_dir).mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        host = host or Host()
        report = Reporter(run, dist, host.pipes if host.pipes is not None else open_pipes(dist, stack))
        trainer = None
        try:
            trainer = Trainer(run, dist, report, host)
            val_loss = trainer.fit()
            summary = trainer.summary("completed", val_loss)
        except TrainingDiverged as exc:
            if trainer is None:
                raise
            summary = trainer.summary("diverged", error=str(exc))
        except Exception:
            if dist.main:  # the launching asset reads why from summary.json
                error = traceback.format_exc(limit=5)
                failed = (trainer.summary("failed", error=error) if trainer is not None else
                          {"format": SUMMARY_FORMAT, "status": "failed", "error": error, "stability_events": []})
                write_json_atomic(Path(run.output_dir) / "summary.json", failed)
                if trainer is not None:
                    report.finish(failed, failed=True)
            raise
        if dist.main:
            write_json_atomic(Path(run.output_dir) / "summary.json", summary)
            report.finish(summary, failed=summary["status"] != "completed")
            report.line(f"done: {summary['status']}, {summary['steps']} steps, final loss {summary['final_loss']}, "
                        f"val loss {summary['val_loss']}; summary {Path(run.output_dir) / 'summary.json'}")
    torch.distributed.barrier()
    if host.owns_process_group:
        torch.distributed.destroy_process_group()
    return 0 if summary["status"] == "completed" else 3


if __name__ == "__main__":
    sys.exit(main())
