"""Setting up a training process: the environment DeepSpeed reads at import, the process group (Dist), the
precision and the DeepSpeed config (ZeRO stage, tensor-parallel split), the model and its DeepSpeed engine, and
the run's inputs (tokenizer check, training and validation loaders, objective, this rank's data shard, the layout
check). training_jobs.train's Trainer calls these in its constructor. deepspeed is imported inside the functions
that use it, so default_environment runs first."""

from __future__ import annotations

import contextlib
import json
import math
import os
import sys
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training_jobs import checkpoint
from training_jobs.base import BaseWeights, load_into
from kiln.tokens.shard_format import ShardError, read_shard_set
from kiln.planning.memory import DEEPSPEED_BUCKETS, ZERO3_LIVE
from training_jobs.layout import Layout, choose_layout, overlaps_communication, uses_autocast
from training_jobs.loader import DatasetReplaced, ReplayLoader, ShardLoader
from training_jobs.model import Block, ModelConfig, Transformer, param_count
from training_jobs.monitor import StabilityMonitor
from training_jobs.objectives import Objective, make_objective
from training_jobs.schedule import lambda_lr
from training_jobs.settings import DEFAULT_MICRO_BATCH, RunConfig, TrainingSettings, load_deepspeed_config
from training_jobs.tokenizer_files import model_file

# DeepSpeed's ZeRO-3 calls these on every step; the warning says nothing a user can act on.
warnings.filterwarnings("ignore",
                        message=r".*torch\.distributed\.(reduce_scatter_tensor|all_gather_into_tensor)` is deprecated")


def default_environment() -> None:
    """Environment DeepSpeed reads at import; set before importing it. Explicit settings win."""
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")  # deepspeed imports mlflow
    if not torch.cuda.is_available():
        os.environ.setdefault("DS_ACCELERATOR", "cpu")
    if os.environ.get("KILN_HOME"):
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


# --------------------------------------------------------------------------------------- the process

@dataclass
class Dist:
    rank: int
    world_size: int
    device: torch.device
    host_group: Any = None  # gloo, for the ranks' host-side agreements (broadcast_object); None: the default group

    @property
    def main(self) -> bool:
        return self.rank == 0


def import_deepspeed():
    """`import deepspeed`, without the MLflow import DeepSpeed's autotuner (which Kiln never runs) makes at import
    time if it can: 2.7 s of CPU in every rank on the 2-core VM, where only rank 0 of a tracked run logs to MLflow
    (and imports it then, training_jobs/reporting.py). The autotuner reads a missing MLflow as `has_mlflow = False`."""
    if "deepspeed" in sys.modules or "mlflow" in sys.modules:
        import deepspeed
        return deepspeed
    sys.modules["mlflow"] = None  # makes `import mlflow` raise ImportError
    try:
        import deepspeed
    finally:
        del sys.modules["mlflow"]
    return deepspeed


def init_distributed() -> Dist:
    deepspeed = import_deepspeed()
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
    world_size = torch.distributed.get_world_size()
    # A gloo group even on CPU, where the default group is gloo already: one code path, the one CI runs.
    host_group = torch.distributed.new_group(backend="gloo") if world_size > 1 else None
    return Dist(torch.distributed.get_rank(), world_size, device, host_group)


def resolve_precision(precision: str) -> str:
    if precision != "auto":
        return precision
    return "bf16" if torch.cuda.is_available() and torch.cuda.is_bf16_supported() else "fp32"


def resolve_compile(t: TrainingSettings) -> tuple[bool, str]:
    """Whether the model is compiled (training.compile; compile_model), and why: the run records both."""
    layout = t.parallelism
    split = "pp" if layout.pp > 1 else "tp" if layout.tp > 1 else None  # compile: true with one: refused at load
    if t.compile != "auto":
        return t.compile, "set by training.compile"
    if split:
        return False, f"auto: off with parallelism.{split} > 1"
    if torch.cuda.is_available():
        return True, "auto: on when training on CUDA"
    return False, "auto: off on CPU (compilation takes minutes that a CPU run does not win back)"


# ---------------------------------------------------------------------------------------- the engine

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
    stage = zero_stage(t)
    autocast = uses_autocast(stage if stage is not None else ds.get("zero_optimization", {}).get("stage", 0), precision)
    # bf16 at ZeRO-0: fp32 weights under torch autocast instead of DeepSpeed's bf16 weights (layout.uses_autocast)
    fill(ds.setdefault("bf16", {}), "enabled", precision == "bf16" and not autocast, "bf16.enabled")
    if autocast:
        fill(ds.setdefault("torch_autocast", {}), "enabled", True, "torch_autocast.enabled")
        fill(ds["torch_autocast"], "dtype", "bfloat16", "torch_autocast.dtype")
    ds.pop("train_batch_size", None) if ds.get("train_batch_size") == "auto" else None
    # DeepSpeed's throughput timer, on by default for an engine without its own data loader, synchronizes the device
    # at every forward and every step, so the host never ran ahead of the GPU; Kiln measures throughput itself. A JSON
    # that turns it on keeps it.
    ds.setdefault("timers", {}).setdefault("throughput", {}).setdefault("enabled", False)
    # DeepSpeed's bf16 overflow check (ZeRO-1 and 2) reads a flag from the device every step to skip a step with
    # inf/NaN gradients; Kiln's stability monitor reads every step's grad norm anyway, a step late, and rolls a
    # non-finite one back. A JSON that turns the check on keeps it.
    if ds["bf16"]["enabled"]:
        ds["bf16"].setdefault("check_grad_overflow", False)
    zero = ds.setdefault("zero_optimization", {})
    for key, value in zero_buckets(cfg).items():
        if zero.get(key) == "auto":
            zero[key] = value
    if t.parallelism.tp > 1:  # DeepSpeed AutoTP, with Kiln's split (it knows HF models' names, not ours)
        section = ds.setdefault("tensor_parallel", {})
        fill(section, "autotp_size", t.parallelism.tp, "tensor_parallel.autotp_size")
        section.setdefault("partition_config", {"use_default_specs": False, "layer_specs": [
            {"patterns": [rf".*\.{name}\.weight$" for name in TP_COLUMN], "partition_type": "column"},
            {"patterns": [rf".*\.{name}\.weight$" for name in TP_ROW], "partition_type": "row"}]})
    if stage is not None:
        if t.deepspeed_config is None:  # the shipped JSON's stage 3 is Kiln's default, not a choice to defend
            zero["stage"] = "auto"
        fill(zero, "stage", stage, "zero_optimization.stage")
    if zero.get("overlap_comm", "auto") == "auto":
        zero["overlap_comm"] = overlaps_communication(zero.get("stage", 0), resolve_compile(t)[0])
    if zero.get("stage", 0) < 3:  # the stage-3 knobs mean nothing below it
        for key in [k for k in zero if k.startswith("stage3_")]:
            del zero[key]
    return ds


def zero_buckets(cfg: ModelConfig) -> dict[str, int]:
    """The "auto" ZeRO bucket sizes for a model (see DEEPSPEED_BUCKETS)."""
    n = param_count(cfg)
    return {"reduce_bucket_size": min(DEEPSPEED_BUCKETS["reduce_bucket_size"], n),
            "stage3_prefetch_bucket_size": min(DEEPSPEED_BUCKETS["stage3_prefetch_bucket_size"], n),
            "stage3_param_persistence_threshold": DEEPSPEED_BUCKETS["stage3_param_persistence_threshold"]}


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


# Devices with torch's fused AdamW kernel (CUDA, and CPU since torch 2.4): one kernel updates every parameter of a
# group, where the default runs a dozen ops per tensor. Elsewhere the multi-tensor (foreach) path.
FUSED_ADAMW_DEVICES = ("cuda", "cpu")


def adamw(groups: list[dict[str, Any]], t: TrainingSettings, device_type: str) -> torch.optim.AdamW:
    """The run's AdamW, fused where torch has the kernel for the device. DeepSpeed steps it on fp32 tensors (its
    master copies under bf16), which the kernel takes."""
    kernel = {"fused": True} if device_type in FUSED_ADAMW_DEVICES else {"foreach": True}
    return torch.optim.AdamW(groups, lr=t.schedule.lr, betas=t.betas, eps=t.adam_eps, **kernel)


def compile_model(model: Transformer, zero3: bool) -> None:
    """torch.compile the model in place: its whole forward at ZeRO stages 0-2; each transformer block's forward and
    the head's (the output projection with the chunked loss) at ZeRO-3.

    Whole: the embedding, RoPE, the masks, the blocks, the head and the chunked loss in one graph, the region the
    reference loop compiles (bench/train_bench.py); nothing hooks into the forward at these stages. Inductor fuses
    the loss's softmax and gradient arithmetic (eager, each is a pass over a chunk's fp32 logits), and the host
    makes one compiled call a step instead of one per block: each region's call costs host time (guards, the
    autograd wrapper), which a small model on a fast GPU waits for. Measured on CPU with an 8-layer toy model, where
    the host is all there is: 7.0 ms a step whole, 10.4 ms by region, 14.0 ms eager. The price is compilation
    growing with depth, once per run (26.9 s at 2 layers, 35.8 s at 8, against a flat 23-27 s by region, there).

    Regional at ZeRO-3, as torchtitan compiles its blocks and its loss, rather than DeepSpeed's engine.compile() of
    the whole module: every submodule carries gather/release hooks that DeepSpeed marks torch.compiler.disable, so
    a whole-model graph breaks at each Linear and norm (measured on a 2-block model: 33 graphs and ~30 breaks). Here
    each Block is a ZeRO-3 leaf module (its hooks gather the block's parameters at once, its children get none), the
    head has no children, and only `forward` is compiled, so the hooks run eagerly around the compiled code and its
    guards see gathered parameters: no graph break, and the blocks share one graph per variant. The embedding, the
    final norm, the masks and RoPE stay eager there.

    One graph per variant either way (causal or prefix-LM mask; training or no_grad validation). dynamic=False:
    micro_batch_size and seq_len fix the shapes, so a dynamic graph would only be slower (another batch size compiles
    once more; the loss probe's batch of 1 runs eager). `forward` is replaced on the module itself, with no wrapper
    module, so parameter names (checkpoints, exports) are unchanged. KILN_COMPILE_BACKEND overrides inductor (the CPU
    tests use aot_eager: inductor's C++ build takes minutes on two cores)."""
    backend = os.environ.get("KILN_COMPILE_BACKEND", "inductor")
    if not zero3:
        model.forward = torch.compile(model.forward, backend=backend, dynamic=False)
        return
    from deepspeed.utils import set_z3_leaf_modules

    set_z3_leaf_modules(model, [Block])
    for module in (*model.layers, model.lm_head):
        module.forward = torch.compile(module.forward, backend=backend, dynamic=False)


def build_engine(cfg: ModelConfig, t: TrainingSettings, ds_config: dict[str, Any], total_steps: int,
                 monitor: StabilityMonitor, base: BaseWeights | None = None, model: Transformer | None = None,
                 compiled: bool = False):
    """The model (build_model, unless given; with parallelism.pp > 1 the pipeline stages of this rank), compiled if
    `compiled` (resolve_compile, compile_model), AdamW and LR schedule, wrapped by DeepSpeed (a PipelineEngine for
    stages). Called again for a rollback: ZeRO-3 loads checkpoints into fresh engines only; the fresh model reuses the
    graphs compiled for the first (the same code and guards), so a rollback compiles nothing again."""
    import deepspeed
    from deepspeed.runtime.zero.stage_1_and_2 import DeepSpeedZeroOptimizer

    if model is None and t.parallelism.pp > 1:
        from training_jobs.pipeline import pipeline_module

        model = pipeline_module(cfg, t.seed, t.parallelism.pp, t.model.activation_checkpointing, base)
    model = model if model is not None else build_model(cfg, t, ds_config, base)
    if compiled:  # before deepspeed.initialize, which sets the ZeRO-3 hooks by leaf modules
        compile_model(model, zero3=ds_config.get("zero_optimization", {}).get("stage") == 3)
    # Decay the matrices (and the embedding); norm gains stay out of weight decay. ds_shape: a partitioned
    # parameter's whole shape (built under zero.Init, its own is an empty placeholder).
    params = [p for p in model.parameters() if p.requires_grad]
    matrix = [len(getattr(p, "ds_shape", p.shape)) >= 2 for p in params]
    groups = [{"params": [p for p, m in zip(params, matrix) if m], "weight_decay": t.weight_decay},
              {"params": [p for p, m in zip(params, matrix) if not m], "weight_decay": 0.0}]
    optimizer = adamw(groups, t, deepspeed.get_accelerator().device_name())
    scheduler = lambda_lr(optimizer, t.resolved_schedule(), total_steps, scale=monitor.lr_scale)
    engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, lr_scheduler=scheduler,
                                           config=ds_config, dist_init_required=False)
    if not engine.zero_optimization() and not engine.bfloat16_enabled():
        torch_step_parts(engine, params)
    if isinstance(engine.optimizer, DeepSpeedZeroOptimizer):  # ZeRO-1 and 2
        clip_without_reading(engine.optimizer)
    if not engine.zero_optimization() and engine.dp_world_size == 1:
        # ZeRO-0 all-reduces the gradients after backward even over one data-parallel rank: each step it copied
        # them into flat buffers of up to 5e8 elements (2 GB in fp32, uncounted by the layout) and back
        engine.enable_backward_allreduce = False
    return engine


def torch_step_parts(engine, params: list[torch.nn.Parameter]) -> None:
    """At ZeRO-0 without DeepSpeed's bf16 (fp32, or bf16 autocast), two parts of DeepSpeed's optimizer step loop over
    the tensors in Python where torch does them at once: the clipping, whose norm DeepSpeed then drops (so
    get_global_grad_norm() would be None and the stability monitor blind to it), and dropping the gradients, through
    module.named_parameters() at every step (about 1 ms of host time a step with 125m's 110 tensors on the 2-core VM).
    torch's get_total_norm and clip_grads_with_norm_ (foreach kernels, the two halves of clip_grad_norm_) take the norm
    and clip, on the device, and the engine then reports the norm (with training.grad_clip 0, where DeepSpeed calls no
    clipping, the norm is taken before the optimizer step); the gradients are set to None over the parameter list.
    DeepSpeed calls both at each optimizer step, after the gradients are averaged over the accumulation and the
    data-parallel ranks.

    With pipeline stages or tensor parallelism (global_grad_norm) the norm is the whole model's, summed over the
    ranks that hold its parts: a rank's own gradients give a smaller norm, another on each rank. (DeepSpeed's own
    clipping, which pipelines had, counted the first stage's gradients only, its model-parallel rank 0, and reported
    no norm.)"""
    split = engine.pipeline_parallelism or engine.autotp_size() > 1
    norm = global_grad_norm(engine, params) if split else (
        lambda: torch.nn.utils.get_total_norm([p.grad for p in params if p.grad is not None], foreach=True))

    def clip() -> None:
        engine._global_grad_norm = total = norm()
        torch.nn.utils.clip_grads_with_norm_(params, engine.gradient_clipping(), total, foreach=True)

    def zero_grad() -> None:
        for p in params:
            p.grad = None

    engine.clip_fp32_gradients = clip
    engine.zero_grad = zero_grad
    if engine.gradient_clipping() == 0:  # training.grad_clip 0: DeepSpeed calls no clipping, so nothing took the norm
        take_model_step = engine._take_model_step

        def measure_then_step(*args: Any, **kwargs: Any) -> Any:
            engine._global_grad_norm = norm()
            return take_model_step(*args, **kwargs)

        engine._take_model_step = measure_then_step


def global_grad_norm(engine, params: list[torch.nn.Parameter]) -> Callable[[], torch.Tensor]:
    """The gradient norm of the whole model where its parameters are split over ranks, the same on each of them: the
    sum of squares of the gradients this rank counts, all-reduced over the ranks of one model copy (on the device, no
    host read), then the root. Pipeline stages: each stage counts its layers; a tied weight (the embedding, also the
    last stage's head) has the same summed gradient on each stage that holds it, and DeepSpeed marks it
    ds_pipe_replicated on all but the first, where alone it is counted. Tensor parallelism: each rank counts its
    slices of the split weights (AutoTP marks them tensor_model_parallel), tp rank 0 alone the unsplit ones (their
    gradients are the same on every tp rank). Data-parallel replicas hold the same averaged gradients, so each copy's
    sum is the model's."""
    from deepspeed.runtime.utils import is_model_parallel_parameter

    if engine.pipeline_parallelism:
        counted = [p for p in params if not getattr(p, "ds_pipe_replicated", False)]
        group = engine.grid.get_pipe_parallel_group()
    else:
        first = engine.mpu.get_tensor_model_parallel_rank() == 0
        counted = [p for p in params if first or is_model_parallel_parameter(p)]
        group = engine.mpu.get_tensor_model_parallel_group()

    def norm() -> torch.Tensor:
        grads = [p.grad for p in counted if p.grad is not None]
        squares = torch.zeros((), dtype=torch.float64, device=engine.device)  # no overflow of a large norm squared
        if grads:
            squares += torch.nn.utils.get_total_norm(grads, foreach=True).double().square()
        torch.distributed.all_reduce(squares, group=group)
        return squares.sqrt().float()

    return norm


def clip_without_reading(optimizer) -> None:
    """ZeRO-1 and 2 clip the gradient partitions with a norm that DeepSpeed first checks on the host (`if
    is_invalid_grad_norm(norm)`, a read that waits for the device) to replace a non-finite one by inf. The same
    arithmetic, with the replacement made on the device: the clip factor is max(1, (norm + 1e-6) / max_norm), inf
    for a non-finite norm, as in DeepSpeed's unscale_and_clip_grads; the stability monitor then rolls the step back
    (it reads the same norm, from get_global_grad_norm())."""
    def unscale_and_clip_grads(grad_groups_flat: list, total_norm) -> None:
        if optimizer.clip_grad == 0.0 and optimizer.loss_scale == 1.0:
            return
        combined_scale = optimizer.loss_scale
        if optimizer.clip_grad > 0.0:
            norm = torch.as_tensor(total_norm, dtype=torch.float, device=optimizer.device)
            norm = torch.where(torch.isfinite(norm) & (norm >= 0), norm, math.inf)
            clip = torch.clamp(((norm / optimizer.loss_scale) + 1e-6) / optimizer.clip_grad, min=1.0)
            combined_scale = clip * optimizer.loss_scale
        for grad in grad_groups_flat:
            for g in grad if isinstance(grad, list) else [grad]:
                g.data.mul_(1. / combined_scale)

    optimizer.unscale_and_clip_grads = unscale_and_clip_grads


# ---------------------------------------------------------------------------------- the run's inputs

class TokenizerMismatch(ValueError):
    """tokenizer_dir holds another model file than the one the run config (and its shards) were made with."""


def check_tokenizer(run: RunConfig) -> None:
    if run.tokenizer_dir is None:
        return
    try:
        model = model_file(run.tokenizer_dir)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"tokenizer_dir: {exc}; point it at the tokenizer asset's folder or leave it "
                                f"out") from None
    sha = checkpoint.sha256_file(model)
    if sha != run.tokenizer_sha256.lower():
        raise TokenizerMismatch(f"{model} has sha256 {sha[:12]}…, the run config says {run.tokenizer_sha256[:12]}…; "
                                f"write the run config from the same tokenizer asset the shards were made with")


def pin_data_versions(run: RunConfig, dist: Dist) -> RunConfig:
    """The run config with the shard sets' versions every loader of every rank must find: the launching asset's
    (the ones it checked), or where it names none, the current ones as rank 0 reads them. A dataset materialized
    again while the ranks start is then refused (training_jobs.loader), never read as two versions."""
    versions = refusal = None
    if dist.main:
        def current(folder: str) -> str | None:
            return read_shard_set(Path(folder)).data_version

        try:
            versions = (run.dataset_data_version or current(run.dataset_dir),
                        run.replay and (run.replay.data_version or current(run.replay.dataset_dir)))
        except ShardError as exc:
            refusal = exc
    refuse_together(dist, refusal)
    main, replay = broadcast_object(dist, versions)
    return run.model_copy(update={"dataset_data_version": main,
                                  "replay": run.replay and run.replay.model_copy(update={"data_version": replay})})


def open_training(run: RunConfig, dist: Dist) -> ShardLoader | ReplayLoader:
    """The training batches: the run's shards, or with mixture.replay a share of every batch from the base's."""
    t = run.training
    if run.replay is None:
        return ShardLoader(run.dataset_dir, "train", t.seq_len, t.micro_batch_size, dist.rank, dist.world_size,
                           run.tokenizer_sha256, seed=t.seed, phases=t.phases,
                           expected_data_version=run.dataset_data_version)
    main = ShardLoader(run.dataset_dir, "train", t.seq_len, 1, dist.rank, dist.world_size, run.tokenizer_sha256,
                       seed=t.seed, phases=t.phases, expected_data_version=run.dataset_data_version)
    replay = ShardLoader(run.replay.dataset_dir, "train", main.seq_len, 1, dist.rank, dist.world_size,
                         run.tokenizer_sha256, seed=t.seed, exclude=run.replay.exclude,
                         expected_data_version=run.replay.data_version)
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


def refuse_together(dist: Dist, refusal: Exception | None) -> None:
    """Raise, on every rank, the refusal of the lowest rank that met one (None: this rank met none). Ranks read their
    inputs each on its own and can disagree (shards materialized again between two ranks' reads): a rank refusing
    alone would leave the others waiting in their next collective until it timed out."""
    if dist.world_size > 1:
        refusals = [None] * dist.world_size
        torch.distributed.all_gather_object(refusals, refusal, group=dist.host_group)
        refusal = next((r for r in refusals if r is not None), None)
    if refusal is not None:
        raise refusal


class UnsharedFolder(RuntimeError):
    """The ranks do not see one checkpoint folder (several machines without a shared filesystem)."""


def check_shared_folder(dist: Dist, folder: Path) -> None:
    """Refuse, on every rank, a checkpoint folder the ranks do not all see as one. Rank 0 writes each checkpoint's
    manifest over every rank's files once their markers are there (checkpoint.py): a rank writing where rank 0
    cannot read (machines without a shared filesystem) never completes a checkpoint, and every save waited an hour
    (`ManifestWriter.MARKER_TIMEOUT_S`) for it before it failed. Rank 0 leaves a file there; every rank reads it."""
    if dist.world_size == 1:
        return
    import socket
    import uuid

    token, host = broadcast_object(dist, (uuid.uuid4().hex, socket.gethostname()))
    probe = folder / f".shared-probe-{token}"
    if dist.main:
        folder.mkdir(parents=True, exist_ok=True)
        probe.touch()
    torch.distributed.barrier(group=dist.host_group)
    refusal = None if probe.is_file() else UnsharedFolder(
        f"rank {dist.rank} on {socket.gethostname()} does not see the checkpoint folder {folder} that rank 0 on "
        f"{host} writes (a file rank 0 left there is not there): every rank writes its part of each checkpoint "
        f"into one folder rank 0 reads, so on several machines KILN_HOME (or training.checkpoint.dir) must be one "
        f"shared filesystem (NFS, EFS, Lustre) mounted at the same path on each")
    try:
        refuse_together(dist, refusal)
    finally:
        if dist.main:
            probe.unlink(missing_ok=True)


def open_data(run: RunConfig, dist: Dist, shard: Dist) -> tuple[ShardLoader | ReplayLoader, ShardLoader | None]:
    """This rank's training and validation loaders (`shard`: its data-parallel place), or on every rank the refusal
    (ShardError, DatasetReplaced among them) of the lowest rank that met one (refuse_together)."""
    opened, refusal = None, None
    try:
        train = open_training(run, shard)
        opened = train, open_validation(run, train.seq_len, shard)
    except ShardError as exc:
        refusal = exc
    refuse_together(dist, refusal)
    return opened


def open_validation(run: RunConfig, seq_len: int, dist: Dist) -> ShardLoader | None:
    t = run.training
    try:
        return ShardLoader(run.dataset_dir, "val", seq_len, t.micro_batch_size, dist.rank, dist.world_size,
                           run.tokenizer_sha256, seed=t.seed, shuffle_epochs=False,
                           expected_data_version=run.dataset_data_version)
    except DatasetReplaced:
        raise
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
    if layout.tp > 1:  # with pp 1: both at once is refused when the settings load (Parallelism)
        uneven = {k: v for k, v in {"n_heads": cfg.n_heads, "n_kv_heads": cfg.n_kv_heads,
                                    "ffn_hidden": cfg.ffn_hidden}.items() if v % layout.tp}
        if uneven:
            raise ValueError(f"training.parallelism.tp {layout.tp} does not divide the model's {uneven}: each rank "
                             f"holds whole heads and an equal slice of the MLP; pick a tp that divides them")


def resolve_layout(run: RunConfig, dist: Dist, shard: Dist) -> tuple[RunConfig, Layout]:
    """The run config with the ZeRO stage, micro-batch and grad_accum the settings leave open filled in from
    training_jobs.layout, and that layout. Every rank computes it and rank 0's is used, so ranks agree. A run that
    resumes keeps the stage its checkpoint was written with: DeepSpeed loads a checkpoint into that stage only."""
    t = run.training
    shard_set = read_shard_set(Path(run.dataset_dir))
    seq_len = int(t.seq_len or shard_set.stats.get("seq_len") or 0)
    cfg = ModelConfig(**t.model.architecture(shard_set.vocab_size, seq_len))
    ds = load_deepspeed_config(t.deepspeed_config_path())
    zero, own_json = ds.get("zero_optimization", {}), t.deepspeed_config
    stage, stage_from = t.parallelism.zero_stage, "training.parallelism.zero_stage"
    if stage is None and own_json is not None and isinstance(zero.get("stage"), int):
        stage, stage_from = zero["stage"], f"zero_optimization.stage of {own_json}"
    settled = stage is not None  # by the user: deepspeed_config() fills and checks it
    if stage is None and t.checkpoint.resume:
        stage, stage_from = checkpointed_stage(run.checkpoint_dir(), zero.get("stage"))
    micro, micro_from = t.micro_batch_size, "training.micro_batch_size"
    if micro == "auto":  # a micro-batch or accumulation written in the DeepSpeed JSON cannot be re-split
        json_micro, json_accum = ds.get("train_micro_batch_size_per_gpu"), ds.get("gradient_accumulation_steps")
        if isinstance(json_micro, int):
            micro, micro_from = json_micro, f"train_micro_batch_size_per_gpu of {own_json}"
        elif isinstance(json_accum, int):
            micro, micro_from = DEFAULT_MICRO_BATCH, f"gradient_accumulation_steps of {own_json}"
        else:
            micro = None
    # the JSON's sizes where it gives numbers, else the "auto" ones (buckets) and DeepSpeed's defaults (live limits)
    sizes = {k: zero[k] if isinstance(zero.get(k), (int, float)) else v
             for k, v in {**zero_buckets(cfg), **ZERO3_LIVE}.items()}
    json_overlap = zero.get("overlap_comm")  # "auto" (the shipped JSON's): overlaps_communication, per stage
    device_memory = (torch.cuda.get_device_properties(dist.device).total_memory if dist.device.type == "cuda"
                     else None)
    layout = choose_layout(
        cfg, seq_len=seq_len, precision=resolve_precision(t.precision), device_memory=device_memory,
        dp=shard.world_size, sequences_per_rank=(micro or DEFAULT_MICRO_BATCH) * t.grad_accum,
        tp=t.parallelism.tp, pp=t.parallelism.pp, zero_stage=stage, micro_batch=micro,
        activation_checkpointing=t.model.activation_checkpointing,
        reduce_bucket_size=sizes["reduce_bucket_size"], compiled=resolve_compile(t)[0],
        overlap_comm=json_overlap if isinstance(json_overlap, bool) else None,
        max_live_parameters=sizes["stage3_max_live_parameters"], max_reuse_distance=sizes["stage3_max_reuse_distance"],
        zero_stage_from=stage_from, micro_batch_from=micro_from)
    layout = broadcast_object(dist, layout)
    update: dict[str, Any] = {"micro_batch_size": layout.micro_batch, "grad_accum": layout.grad_accum}
    if not settled and layout.zero_stage is not None:
        update["parallelism"] = t.parallelism.model_copy(update={"zero_stage": layout.zero_stage})
    return run.model_copy(update={"training": t.model_copy(update=update)}), layout


def checkpointed_stage(root: Path, json_stage: Any) -> tuple[int | None, str]:
    """(stage, why) of the newest complete checkpoint under root, or (None, "") when there is none. One written
    before layouts were chosen (no "layout" in its manifest) was written with the DeepSpeed JSON's stage."""
    # the one find_resumable will take: the newest whose files are all there (the hashes it checks later)
    newest = next((c.path for c in reversed(checkpoint.checkpoints(root))
                   if checkpoint.verify(c.path, hashes=False) is None), None)
    if newest is None:
        return None, ""
    kept = checkpoint.read_manifest(newest).get("layout")
    if kept is None:
        return (json_stage if isinstance(json_stage, int) else None,
                f"the DeepSpeed JSON's, which {newest.name} (written before layouts were chosen) was saved with")
    return kept["zero_stage"], f"the stage {newest.name} was saved with, which this run resumes"


def broadcast_object(dist: Dist, obj: Any) -> Any:
    """Rank 0's `obj` on every rank, over the host group: over NCCL, broadcast_object_list copies the pickle to the
    device and its size back, which waits for every kernel queued before it. The time-based checkpoint cadence asks
    at each logging interval, and the loop would drain there. A world of one asks no one."""
    if dist.world_size == 1:
        return obj
    box = [obj if dist.main else None]
    torch.distributed.broadcast_object_list(box, src=0, group=dist.host_group)
    return box[0]
