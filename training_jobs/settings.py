"""Training settings: the project YAML's `training:` section, and the run config the launched processes read.

`TrainingSettings` is the one config object for training. The training_run asset validates it as part of
the project config, adds what only it knows (dataset folder, tokenizer, output folder, MLflow names) with
`settings.to_run_config(...)`, writes that as JSON, and launches `python -m training_jobs.train
--run-config run.json` on every rank. Ranks read it back with `RunConfig.read(path)`.

Imports pydantic, the standard library and kiln.common.strict only, so the project config can import it without torch.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import Field, PositiveInt, field_validator, model_validator

from kiln.common.manifest import write_json_atomic
from kiln.common.strict import Strict

RUN_CONFIG_FORMAT = "kiln-run-config/1"
DEFAULT_DEEPSPEED_CONFIG = Path(__file__).resolve().parent / "configs" / "zero3.json"
# micro_batch_size "auto" keeps the 8 x grad_accum sequences per rank per step that micro-batch 8 gave, and splits
# them into the largest micro-batch that fits the device (training_jobs.layout); on CPU into 8 x grad_accum.
DEFAULT_MICRO_BATCH = 8


# Llama-like shapes. Non-embedding parameters (vocabulary 32k adds 32k x d_model, once when tied):
#   tiny ~0.1M (CPU tests and demos), small ~26M, 125m ~85M (GPT-3 Small's shape), 350m ~300M
#   (GPT-3 Medium's shape), 1b ~0.97B (Llama 3.2 1B's shape: grouped-query attention, 4x MLP).
PRESETS: dict[str, dict[str, int]] = {
    "tiny": {"d_model": 64, "n_layers": 2, "n_heads": 4},
    "small": {"d_model": 512, "n_layers": 8, "n_heads": 8},
    "125m": {"d_model": 768, "n_layers": 12, "n_heads": 12},
    "350m": {"d_model": 1024, "n_layers": 24, "n_heads": 16},
    "1b": {"d_model": 2048, "n_layers": 16, "n_heads": 32, "n_kv_heads": 8, "ffn_hidden": 8192},
}


def llama_ffn_hidden(d_model: int, multiple_of: int = 64) -> int:
    """SwiGLU width: 2/3 of 4·d_model (three matrices cost what a 4x GELU MLP's two do), rounded up."""
    return multiple_of * math.ceil(8 * d_model / 3 / multiple_of)


class RopeScaling(Strict):
    """Position interpolation (Chen et al. 2023): positions are divided by `factor`, so a model trained at
    length L reads L x factor with the angles it knows. Exported to HF as rope_type "linear"."""

    type: Literal["linear"] = "linear"
    factor: float = Field(gt=1)


class ModelSettings(Strict):
    """A preset shape plus overrides; `architecture()` resolves it to the model's config fields."""

    preset: Literal["tiny", "small", "125m", "350m", "1b"] = "tiny"
    d_model: int | None = Field(None, gt=0)
    n_layers: int | None = Field(None, gt=0)
    n_heads: int | None = Field(None, gt=0)
    n_kv_heads: int | None = Field(None, gt=0)  # < n_heads: grouped-query attention
    ffn_hidden: int | None = Field(None, gt=0)  # None: 8/3 d_model rounded up to a multiple of 64
    vocab_size: int | None = Field(None, gt=0)  # None: the shard set's vocabulary
    pad_vocab_to_multiple_of: int = Field(64, ge=1)  # embedding rows beyond the tokenizer: faster matmuls on GPU
    rope_theta: float = Field(10_000.0, gt=0)  # RoPE base; long-context extension raises it (Code Llama: 1e6)
    rope_scaling: RopeScaling | None = None  # or position interpolation, e.g. {type: linear, factor: 4}
    norm_eps: float = Field(1e-5, gt=0)
    tied_embeddings: bool = True
    init_std: float = Field(0.02, gt=0)
    activation_checkpointing: bool = False  # recompute each block in backward: less memory, ~30% more compute

    @model_validator(mode="after")
    def _shape_works(self):
        self.architecture(vocab_size=1, max_seq_len=8)  # its checks need the shape only: at load, not after launch
        return self

    def architecture(self, vocab_size: int, max_seq_len: int) -> dict[str, Any]:
        """The model config fields (training_jobs.model.ModelConfig) for a tokenizer vocabulary and seq_len."""
        shape = {**PRESETS[self.preset], **{k: getattr(self, k) for k in
                                            ("d_model", "n_layers", "n_heads", "n_kv_heads", "ffn_hidden")
                                            if getattr(self, k) is not None}}
        d, heads = shape["d_model"], shape["n_heads"]
        kv = shape.get("n_kv_heads") or heads
        if d % heads:
            raise ValueError(f"training.model: d_model {d} is not divisible by n_heads {heads}; "
                             f"pick n_heads dividing d_model")
        if (d // heads) % 2:
            raise ValueError(f"training.model: head size d_model/n_heads = {d // heads} is odd; RoPE needs it even")
        if heads % kv:
            raise ValueError(f"training.model: n_heads {heads} is not a multiple of n_kv_heads {kv}")
        vocab = self.vocab_size or vocab_size
        if vocab < vocab_size:
            raise ValueError(f"training.model.vocab_size {vocab} is smaller than the tokenizer's {vocab_size}; "
                             f"remove the override or raise it")
        m = self.pad_vocab_to_multiple_of
        return {"vocab_size": m * math.ceil(vocab / m), "d_model": d, "n_layers": shape["n_layers"],
                "n_heads": heads, "n_kv_heads": kv, "ffn_hidden": shape.get("ffn_hidden") or llama_ffn_hidden(d),
                "max_seq_len": max_seq_len, "rope_theta": self.rope_theta, "norm_eps": self.norm_eps,
                "tied_embeddings": self.tied_embeddings, "init_std": self.init_std,
                "rope_scaling_factor": self.rope_scaling.factor if self.rope_scaling else 1.0}


class ScheduleSettings(Strict):
    """Learning rate: linear warmup, then cosine to min_lr, or WSD (warmup-stable-decay: constant, then a
    linear decay to min_lr over the last decay_fraction of the steps)."""

    kind: Literal["cosine", "wsd"] = "cosine"
    lr: float = Field(3e-4, gt=0)
    min_lr: float = Field(3e-5, ge=0)
    warmup_steps: int = Field(100, ge=0)
    decay_fraction: float = Field(0.2, gt=0, le=1)  # wsd only
    total_steps: int | None = Field(None, gt=0)  # the steps the curve spans; None: max_steps. Set it to
    # extend a run later (a higher max_steps) without changing the learning rates already used.

    @model_validator(mode="after")
    def _min_below_peak(self):
        if self.min_lr > self.lr:
            raise ValueError(f"min_lr {self.min_lr} is above lr {self.lr}; min_lr is where the decay ends")
        return self


class CheckpointSettings(Strict):
    every_steps: int | None = Field(None, gt=0)  # None: by every_minutes only (and at the end)
    # Save once this many minutes have passed since the last save (checked every log_every_steps steps). By time,
    # not steps, by default: a step takes 1,000 times longer on a CPU demo than a 125m step on an H200, and a
    # fixed 100 steps cost a 1b run on one H200 half its time (a 26 s save every 25 s of steps, docs/bench). A save
    # stalls training only while the state is copied to host memory (writing and hashing run in the background).
    # Young's interval sqrt(2 x stall x MTBF), with a 5 s stall and kiln plan's failure rates (Llama 3's, 50,700 h
    # per GPU), is about 4 h on one 8-GPU node and 22 minutes on 1,000 GPUs: 30 errs towards saving often up to a few
    # hundred GPUs; `kiln plan` prints the interval for a cluster. None: by steps only.
    every_minutes: float | None = Field(30.0, gt=0)
    keep_last: int = Field(3, ge=1)  # complete checkpoints kept; older ones are deleted
    dir: str | None = None  # None: <output_dir>/checkpoints
    resume: bool = True  # continue from the newest complete checkpoint in dir, if any

    @model_validator(mode="after")
    def _some_cadence(self):
        if self.every_steps is None and self.every_minutes is None:
            raise ValueError("training.checkpoint: every_steps and every_minutes are both null, so a run would save "
                             "only at its end (a crash loses all of it, and a loss spike has nothing to roll back "
                             "to); set one of them (every_minutes: 30 is the default)")
        return self


class MonitorSettings(Strict):
    """Training stability: what counts as a loss spike, a gradient explosion or a plateau, and the response."""

    enabled: bool = True
    window: int = Field(50, ge=2)  # rolling window (steps) for the loss and grad-norm means
    min_history: int = Field(20, ge=1)  # spikes are judged once this many healthy steps are in the window
    spike_factor: float = Field(1.5, gt=1)  # loss > factor x rolling mean loss
    grad_factor: float = Field(10.0, gt=1)  # grad norm > factor x rolling mean grad norm
    grad_norm_max: float | None = Field(None, gt=0)  # an absolute ceiling as well, if set
    plateau_window: int = Field(500, ge=2)  # warn when the loss mean over this many steps ...
    plateau_min_improvement: float = Field(0.001, ge=0)  # ... improved by less than this fraction
    rollback: bool = True  # False: record events only
    max_rollbacks: int = Field(3, ge=0)  # then the run stops as diverged
    lr_factor: float = Field(0.5, gt=0, le=1)  # after a rollback the LR is multiplied by this ...
    lr_reduced_steps: int = Field(100, ge=0)  # ... for this many steps

    @model_validator(mode="after")
    def _history_fits_the_window(self):
        if self.min_history > self.window:
            raise ValueError(f"training.monitor.min_history {self.min_history} is more than its window {self.window}: "
                             f"the window never holds that many steps, so no spike would ever be judged; lower "
                             f"min_history or raise window")
        return self


class Parallelism(Strict):
    """The 3D layout of a run: tensor x pipeline x data parallel ranks, ZeRO stage, batch split. `kiln plan --json`
    emits this block (under `training:`) and a run accepts it as is. tp * pp * dp must equal the world size;
    dp None: whatever the world size leaves. micro_batch / grad_accum / zero_stage None: training.micro_batch_size,
    training.grad_accum and the DeepSpeed JSON's stage."""

    tp: int = Field(1, gt=0)
    pp: int = Field(1, gt=0)
    dp: int | None = Field(None, gt=0)
    zero_stage: Literal[0, 1, 2, 3] | None = None
    micro_batch: int | None = Field(None, gt=0)
    grad_accum: int | None = Field(None, gt=0)

    @model_validator(mode="after")
    def _pipeline_zero(self):
        if self.tp > 1 and self.pp > 1:
            raise ValueError(f"training.parallelism: tp {self.tp} with pp {self.pp}: the trainer runs tensor or "
                             f"pipeline parallelism, not both (DeepSpeed AutoTP shards a plain module, the pipeline "
                             f"engine its own); set tp: 1 or pp: 1 (`kiln plan` names the best layout Kiln runs)")
        if self.pp > 1 and self.zero_stage is not None and self.zero_stage > 1:
            raise ValueError(f"training.parallelism: pp {self.pp} with zero_stage {self.zero_stage}: DeepSpeed's "
                             f"pipeline engine runs ZeRO stage 0 or 1 only; set zero_stage: 1 (or pp: 1)")
        return self

    def data_parallel(self, world_size: int) -> int:
        """The data-parallel degree at this world size; a layout that does not divide it is refused."""
        model_parallel = self.tp * self.pp
        if world_size % model_parallel or (self.dp is not None and self.dp * model_parallel != world_size):
            layout = (f"tp {self.tp} x pp {self.pp} x dp {self.dp} = {self.dp * model_parallel} ranks" if self.dp
                      else f"tp {self.tp} x pp {self.pp} = {model_parallel} ranks per data-parallel replica")
            raise ValueError(f"training.parallelism ({layout}) does not fit the {world_size} training processes: "
                             f"launch tp*pp*dp processes (training_launcher nproc_per_node / num_workers) or change "
                             f"the layout (dp: null takes whatever the world size leaves)")
        return world_size // model_parallel


def schedule_too_short(total_steps: int | None, max_steps: int | None) -> str | None:
    """What is wrong with a learning-rate curve that ends before the run does (None: nothing)."""
    if total_steps is None or max_steps is None or total_steps >= max_steps:
        return None
    return (f"training.schedule.total_steps {total_steps} is below the run's {max_steps} steps (training.max_steps, "
            f"or training.token_budget / tokens per step): the learning rate would sit at min_lr for the last "
            f"{max_steps - total_steps}; total_steps only extends a curve (>= max_steps), or leave it unset")


def profile_window_problem(profile_steps: tuple[int, int] | None, max_steps: int | None) -> str | None:
    """What is wrong with a profile window that ends after the run's last step (None: nothing): it would never close,
    so nothing would be written while the profiler recorded the rest of the run."""
    if profile_steps is None or max_steps is None or profile_steps[1] <= max_steps:
        return None
    return (f"training.profile_steps {list(profile_steps)} ends after the run's {max_steps} steps (training.max_steps, "
            f"or training.token_budget / tokens per step): the window would never close and no profile would be "
            f"written; give a window within steps 1..{max_steps}, e.g. [{min(profile_steps[0], max_steps)}, "
            f"{max_steps}]")


class TrainingSettings(Strict):
    """Everything about a training run that belongs in the project config."""

    model: ModelSettings = ModelSettings()
    seq_len: int | None = Field(None, ge=8)  # None: the shard set's seq_len
    # Sequences per rank per forward pass. "auto": the largest that fits the device, the global batch kept at
    # 8 x grad_accum x dp (grad_accum recomputed to make it up; training_jobs.layout); 8 on CPU.
    micro_batch_size: Annotated[int, Field(gt=0)] | Literal["auto"] = "auto"
    grad_accum: int = Field(1, gt=0)  # micro-batches per optimizer step
    max_steps: int | None = Field(None, gt=0)  # optimizer steps; default 1000 unless token_budget is set
    token_budget: int | None = Field(None, gt=0)  # training tokens; max_steps = ceil(budget / tokens per step)
    schedule: ScheduleSettings = ScheduleSettings()
    weight_decay: float = Field(0.1, ge=0)  # on weight matrices and the embedding, not on norm gains
    betas: tuple[Annotated[float, Field(ge=0, lt=1)], Annotated[float, Field(ge=0, lt=1)]] = (0.9, 0.95)  # AdamW's
    adam_eps: float = Field(1e-8, gt=0)
    grad_clip: float = Field(1.0, ge=0)  # global norm; 0 disables
    precision: Literal["auto", "bf16", "fp32"] = "auto"  # auto: bf16 on GPUs that support it, else fp32
    # torch.compile of the model (training_jobs.setup.compile_model: whole, or by block at ZeRO-3). auto: on for CUDA,
    # off on CPU (minutes of compilation a short CPU run never wins back) and with pipeline or tensor parallelism.
    compile: Literal["auto"] | bool = "auto"
    seed: int = Field(1337, ge=0)  # numpy's generators take non-negative seeds
    log_every_steps: int = Field(10, gt=0)  # progress lines and MLflow metrics
    val_every_steps: int | None = Field(None, gt=0)  # None: validation loss at the end only
    val_batches: int | None = Field(50, gt=0)  # micro-batches per rank per validation; None: the whole split
    # [first, last]: torch.profiler over these optimizer steps on rank 0, written to <output_dir>/profile/ with the
    # GPU's busy fraction in summary.json (training_jobs/profiling.py); None: no profiling
    profile_steps: tuple[PositiveInt, PositiveInt] | None = None
    checkpoint: CheckpointSettings = CheckpointSettings()
    monitor: MonitorSettings = MonitorSettings()
    peak_tflops: float | None = Field(None, gt=0)  # per device, for MFU; None: looked up from the GPU name
    deepspeed_config: str | None = None  # a DeepSpeed JSON; None: training_jobs/configs/zero3.json
    zero_init: bool = True  # ZeRO-3: build the model partitioned (deepspeed.zero.Init), never whole on one rank
    export: list[Literal["safetensors", "hf"]] = ["safetensors", "hf"]  # written from the final checkpoint
    objective: Literal["clm", "prefix_lm", "span_corruption"] = "clm"  # validation is CLM loss for all three
    phases: list[str] | None = Field(None, min_length=1)  # the shard set's curriculum phases this run reads, in
    # order; None: all
    # Continued pretraining: start from these weights (a checkpoint folder, an export, or `latest`: the checkpoint
    # asset of this KILN_HOME) with a new schedule; the architecture must match, except the context settings.
    base_checkpoint: str | None = None
    rewarmup_steps: int | None = Field(None, ge=0)  # with base_checkpoint: the warmup of the new schedule
    # How training processes start: torchrun or the deepspeed launcher on this machine, or Ray Train workers on the
    # Ray cluster (engine.ray_address / RAY_ADDRESS; an embedded local Ray when unset). The resource may override.
    # torchrun by default: the same ranks and losses, started and ended several seconds sooner than by the deepspeed
    # launcher, whose runner and launch.py each import DeepSpeed first (docs/training.md#speed, bench/launch_bench.py).
    launcher: Literal["deepspeed", "torchrun", "ray"] = "torchrun"
    parallelism: Parallelism = Parallelism()  # the 3D layout; `kiln plan --json` writes it

    @model_validator(mode="after")
    def _profile_window(self):
        if self.profile_steps and self.profile_steps[0] > self.profile_steps[1]:
            raise ValueError(f"training.profile_steps {list(self.profile_steps)}: the first step comes after the last; "
                             f"give [first, last], e.g. [20, 24]")
        if problem := profile_window_problem(self.profile_steps, self.max_steps):
            raise ValueError(problem)
        return self

    @model_validator(mode="after")
    def _curve_spans_the_run(self):
        short = schedule_too_short(self.schedule.total_steps, self.max_steps)
        if short:
            raise ValueError(short)
        return self

    @model_validator(mode="before")
    @classmethod
    def _steps_or_budget(cls, data: Any) -> Any:
        if isinstance(data, dict):
            if data.get("max_steps") is not None and data.get("token_budget") is not None:
                raise ValueError("set training.max_steps or training.token_budget, not both")
        return data

    @model_validator(mode="before")
    @classmethod
    def _batch_from_layout(cls, data: Any) -> Any:
        """The layout's micro_batch / grad_accum fill micro_batch_size / grad_accum; both set and different is
        an error, not a silent choice."""
        if not isinstance(data, dict) or not isinstance(data.get("parallelism"), dict):
            return data
        data = dict(data)
        for layout_key, key in (("micro_batch", "micro_batch_size"), ("grad_accum", "grad_accum")):
            value = data["parallelism"].get(layout_key)
            if value is None:
                continue
            if data.get(key) not in (None, "auto") and data[key] != value:
                raise ValueError(f"training.{key} is {data[key]} but training.parallelism.{layout_key} is {value}; "
                                 f"set one of them")
            data[key] = value
        return data

    @model_validator(mode="after")
    def _compile_runs(self):
        layout = self.parallelism
        split = "pp" if layout.pp > 1 else "tp" if layout.tp > 1 else None
        if self.compile is True and split:
            raise ValueError(f"training.compile: true with training.parallelism.{split} > 1: the trainer compiles the "
                             f"blocks of a plain model, not pipeline stages or tensor-parallel slices (untested "
                             f"there); set training.compile: auto or false, or {split}: 1")
        return self

    @field_validator("base_checkpoint")
    @classmethod
    def _base_named(cls, value: str | None) -> str | None:
        if value is not None and not value.strip():  # not a folder: it would resolve to the working directory
            raise ValueError("training.base_checkpoint is empty: give a checkpoint folder or `latest` (this KILN_HOME's "
                             "checkpoint), or leave it unset to train from scratch")
        return value

    @model_validator(mode="after")
    def _rewarmup_needs_a_base(self):
        if self.rewarmup_steps is not None and self.base_checkpoint is None:
            raise ValueError("training.rewarmup_steps is the warmup of a continued run: set training.base_checkpoint "
                             "as well, or use schedule.warmup_steps for a run from scratch")
        return self

    def resolved_schedule(self) -> ScheduleSettings:
        """The LR schedule of this run: a continued run warms up again over rewarmup_steps."""
        if self.rewarmup_steps is None:
            return self.schedule
        return self.schedule.model_copy(update={"warmup_steps": self.rewarmup_steps})

    def resolved_max_steps(self, world_size: int, seq_len: int) -> int:
        if self.max_steps is not None:
            return self.max_steps
        if self.token_budget is None:
            return 1000
        return math.ceil(self.token_budget / self.tokens_per_step(world_size, seq_len))

    def tokens_per_step(self, world_size: int, seq_len: int) -> int:
        return self.sequences_per_rank * world_size * seq_len

    @property
    def sequences_per_rank(self) -> int:
        """Sequences per rank per optimizer step: the global batch / dp, however "auto" splits it."""
        micro = DEFAULT_MICRO_BATCH if self.micro_batch_size == "auto" else self.micro_batch_size
        return micro * self.grad_accum

    def deepspeed_config_path(self) -> Path:
        return Path(self.deepspeed_config) if self.deepspeed_config else DEFAULT_DEEPSPEED_CONFIG

    def to_run_config(self, *, dataset_dir: str | Path, tokenizer_sha256: str, output_dir: str | Path,
                      tokenizer_dir: str | Path | None = None, experiment: str = "kiln",
                      run_name: str | None = None, tags: dict[str, str] | None = None,
                      base_checkpoint: str | Path | None = None, replay: Replay | None = None,
                      dataset_data_version: str | None = None) -> RunConfig:
        """These settings plus what the launching asset knows: the run config every rank reads.
        `base_checkpoint`: the resolved folder (the asset resolves `latest`); default training.base_checkpoint."""
        base = base_checkpoint or self.base_checkpoint
        if base == "latest":
            raise ValueError("training.base_checkpoint 'latest' is resolved by the training_run asset (the checkpoint "
                             "asset of this KILN_HOME); outside Dagster give a checkpoint folder")
        return RunConfig(training=self, dataset_dir=str(dataset_dir), tokenizer_sha256=tokenizer_sha256,
                         output_dir=str(output_dir), experiment=experiment, run_name=run_name, tags=tags or {},
                         tokenizer_dir=None if tokenizer_dir is None else str(tokenizer_dir),
                         base_checkpoint=None if base is None else str(base), replay=replay,
                         dataset_data_version=dataset_data_version)


class Replay(Strict):
    """Continued pretraining's guard against forgetting: this share of the training sequences is drawn from
    the base run's token shards (Ibrahim et al. 2024 replay 1-5% when the shift is weak, more when strong)."""

    share: float = Field(gt=0, lt=1)
    dataset_dir: str  # a token_shards folder made with the same tokenizer
    # Replayed documents a removal request names since those shards were written: shard (its path in the folder)
    # -> places in its document-offset index; no sequence holding one of their tokens is read
    # (kiln.governance.replay computes them, the training_run asset fills them in).
    exclude: dict[str, list[int]] = {}
    data_version: str | None = None  # the version of dataset_dir those places are in; the loader refuses another


class RunConfig(Strict):
    """What one training run needs; the JSON file passed as `--run-config`."""

    format: Literal["kiln-run-config/1"] = RUN_CONFIG_FORMAT
    training: TrainingSettings = TrainingSettings()
    dataset_dir: str  # a token_shards dataset folder (with _manifest.json)
    # The store's version of dataset_dir the launching asset checked (lineage, removal requests). Every loader of
    # every rank refuses another, so one run reads one version whatever is materialized while it starts; None: the
    # version rank 0 reads at start (training_jobs.setup.pin_data_versions).
    dataset_data_version: str | None = None
    tokenizer_sha256: str = Field(pattern=r"^[0-9a-fA-F]{64}$")  # the shards must have been made with it
    tokenizer_dir: str | None = None  # the tokenizer asset folder (model file + card): checked, copied to the HF export
    output_dir: str  # summary.json, checkpoints/, export/
    experiment: str = "kiln"  # MLflow experiment
    run_name: str | None = None  # MLflow run name
    tags: dict[str, str] = {}  # MLflow tags
    base_checkpoint: str | None = None  # continued pretraining from this folder (training_jobs.base)
    replay: Replay | None = None  # with a base: mix in the base's training data

    def to_json(self) -> str:
        return self.model_dump_json(indent=2)

    @classmethod
    def from_json(cls, text: str) -> RunConfig:
        return cls.model_validate_json(text)

    def write(self, path: str | Path) -> Path:
        """Atomically (temporary name, then rename): a rank never reads half a file."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        write_json_atomic(path, self.to_json(), flush=False)
        return path

    @classmethod
    def read(cls, path: str | Path) -> RunConfig:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except FileNotFoundError:
            raise FileNotFoundError(f"run config {path} not found; the launching asset writes it "
                                    f"(TrainingSettings.to_run_config(...).write(path))") from None
        try:
            return cls.from_json(text)
        except ValueError as exc:
            raise ValueError(f"run config {path} is invalid:\n{exc}") from None

    def checkpoint_dir(self) -> Path:
        return Path(self.training.checkpoint.dir or Path(self.output_dir) / "checkpoints")


def load_deepspeed_config(path: str | Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise FileNotFoundError(f"DeepSpeed config {path} not found; fix training.deepspeed_config or remove it "
                                f"to use the shipped {DEFAULT_DEEPSPEED_CONFIG.name}") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"DeepSpeed config {path} is not valid JSON: {exc}") from None


__all__ = ["CheckpointSettings", "DEFAULT_DEEPSPEED_CONFIG", "DEFAULT_MICRO_BATCH", "ModelSettings", "MonitorSettings",
           "PRESETS", "Parallelism", "RopeScaling", "RUN_CONFIG_FORMAT", "Replay", "RunConfig", "ScheduleSettings",
           "TrainingSettings", "llama_ffn_hidden", "load_deepspeed_config", "profile_window_problem"]
