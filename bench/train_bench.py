"""Training throughput in one run: Kiln's trainer through its real launcher, and a reference loop written to be
as fast as plain PyTorch can be, on the same device, with the same model, data and tokens per step; the ratio,
MFU and goodput of each.

    .venv/bin/python bench/train_bench.py                                        # CPU: tiny and small
    .venv/bin/python bench/train_bench.py --preset 125m,350m,1b --json-out docs/bench/train_bench_h200.json
    .venv/bin/python bench/train_bench.py --preset 1b --zero-stage 3 --no-reference      # ZeRO-3 forced
    .venv/bin/python bench/train_bench.py --launcher deepspeed,ray --no-reference     # the launchers side by side

Kiln: `training_jobs.train` under --launcher (torchrun by default, deepspeed, or ray: training_jobs/ray_launch.py)
with the run's default layout (ZeRO stage, micro-batch, compile: what a user gets) unless --zero-stage,
--micro-batch or --compile set them. Its step throughput is summary.json's `tokens_per_s` (optimizer steps; the
first, which pays for warm-up and compilation, left out); its goodput is the run's tokens over the whole wall time
of fit() (`goodput_tokens_per_s`: compilation, logging, validation, checkpoints at --checkpoint-every and at the end,
export, all included), and its steady goodput the same without what a run pays once whatever its length
(training_jobs.reporting.ONE_TIME_PARTS: startup, the first step, a --profile window, the last checkpoint, the final
validation, the export) and their steps' tokens, which a long run approaches and a bench of a few dozen steps cannot
show otherwise. At the default cadence (a save every 30 minutes, none inside a bench) it also prints the goodput a
long run would get, projected from the steady goodput and the stall of the run's one save (goodput_at_cadence).

Reference: nanoGPT's train loop (Karpathy, train.py) around the same `training_jobs.model.Transformer`: one
process per device, fp32 weights under bf16 autocast on GPUs, `torch.compile`, fused AdamW, SDPA's flash kernel,
batches read from the same shards into pinned memory and copied without blocking while the previous micro-batch
computes, the loss read back only once at the end. It trains Kiln's micro-batch × accumulation (the same tokens per
step), or --ref-micro-batch. Timed between two synchronizations after --warmup steps.

On CPU both run on the same cores: Kiln with --nproc ranks (default 1, so both are one process), the reference in
one process. Data: random tokens in a synthetic shard set (a 32k vocabulary), so the figures are about compute,
not learning. MFU counts 6·(N_non_embedding + V·d) + 12·L·d·T FLOPs per token
(training_jobs.model.flops_per_token) against the dense bf16 peak of the GPU (training_jobs.flops), or
--peak-tflops. Figures are for the machine printed first; quote them with it.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import math
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Callable

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kiln.tokens.shard_format import open_shard, write_random_shard_set  # noqa: E402
from training_jobs.launch import launch_command  # noqa: E402
from training_jobs.reporting import ONE_TIME_PARTS  # noqa: E402
from training_jobs.settings import TrainingSettings  # noqa: E402

SHA = "00" * 32
VOCAB = 32_000


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in Path("/proc/cpuinfo").read_text().splitlines()
                   if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
    versions = f"torch {torch.__version__}, deepspeed {importlib.metadata.version('deepspeed')}"
    return (f"{cpu}, {os.cpu_count()} cores; GPUs: {', '.join(gpus) if gpus else 'none'}; "
            f"Python {platform.python_version()}, {versions}")


def synthetic_shards(folder: Path, tokens: int, seed: int = 0) -> Path:
    """Random-token shards: one train shard of `tokens`, one small val shard."""
    return write_random_shard_set(folder, tokens, max(tokens // 50, 20_000), VOCAB, seed, SHA)


# ------------------------------------------------------------------------------------------ the reference loop

def reference_loop(settings: TrainingSettings, data: Path, seq_len: int, micro_batch: int, grad_accum: int,
                   steps: int, warmup: int, compile_model: bool, profile_dir: Path | None = None) -> dict:
    """nanoGPT's loop around Kiln's model, on one device: as fast as plain PyTorch goes without a framework.
    With `profile_dir`, PROFILED_STEPS more steps after the timed ones under training_jobs.profiling's profiler."""
    from training_jobs.flops import device_peak_flops, mfu
    from training_jobs.model import ModelConfig, Transformer, flops_per_token
    from training_jobs.profiling import StepProfiler

    on_gpu = torch.cuda.is_available()
    device = torch.device("cuda", 0) if on_gpu else torch.device("cpu")
    bf16 = on_gpu and torch.cuda.is_bf16_supported() and settings.precision != "fp32"
    if on_gpu:
        torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = True
        torch.cuda.reset_peak_memory_stats()  # this run's peak, not an earlier preset's
    cfg = ModelConfig(**settings.model.architecture(VOCAB, seq_len))
    model = Transformer(cfg, seed=0, activation_checkpointing=settings.model.activation_checkpointing).to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": 0.1},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=3e-4, betas=(0.9, 0.95), fused=on_gpu)
    step_model = torch.compile(model) if compile_model else model

    tokens = open_shard(data / "shard-00000.bin").tokens
    sequences = (len(tokens) - 1) // seq_len
    cursor = 0

    def next_batch() -> tuple[torch.Tensor, torch.Tensor]:
        nonlocal cursor
        rows = [(cursor + i) % sequences for i in range(micro_batch)]
        cursor += micro_batch
        batch = torch.from_numpy(np.stack([tokens[r * seq_len: r * seq_len + seq_len + 1] for r in rows])
                                 .astype(np.int64))
        if on_gpu:
            batch = batch.pin_memory().to(device, non_blocking=True)
        return batch[:, :-1], batch[:, 1:]

    def sync() -> None:
        if on_gpu:
            torch.cuda.synchronize()

    x, y = next_batch()
    loss = None

    def train_step() -> None:
        nonlocal x, y, loss
        for _ in range(grad_accum):
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=bf16):
                loss = step_model(x, y) / grad_accum
            x, y = next_batch()  # the next micro-batch's copy overlaps this one's backward
            loss.backward()
        torch.nn.utils.clip_grad_norm_(params, settings.grad_clip)
        opt.step()
        opt.zero_grad(set_to_none=True)

    for step in range(warmup + steps):
        if step == warmup:
            sync()
            t0 = time.perf_counter()
        train_step()
    sync()
    seconds = time.perf_counter() - t0
    profile = None
    if profile_dir is not None:  # after the timed steps: the profiler's overhead is not in the figures above
        window = (warmup + steps + 1, warmup + steps + PROFILED_STEPS)
        profiler = StepProfiler(window, profile_dir, active=True)
        for step in range(window[0], window[1] + 1):
            profiler.before_launch(step)
            train_step()
            profiler.after(step)
        profiler.report()
        profile = profiler.result
    final_loss = float(loss.detach()) * grad_accum
    if not math.isfinite(final_loss):
        raise RuntimeError(f"the reference loop diverged (loss {final_loss})")
    tokens_per_s = micro_batch * grad_accum * seq_len * steps / seconds
    name, peak = device_peak_flops(settings.peak_tflops)
    return {"tokens_per_s": tokens_per_s, "mfu": mfu(flops_per_token(cfg, seq_len), tokens_per_s, peak, 1),
            "device": name, "precision": "bf16" if bf16 else "fp32", "micro_batch": micro_batch,
            "grad_accum": grad_accum, "compile": compile_model, "steps_timed": steps, "final_loss": final_loss,
            "peak_memory_gib": torch.cuda.max_memory_allocated() / 2**30 if on_gpu else None, "profile": profile}


def release_device_memory() -> None:
    """Give back what a reference loop held on the device: this process lives on, and the next preset's Kiln run
    chooses its layout from the device's memory. Dynamo's caches hold the compiled model, so they go first."""
    if torch.cuda.is_available():
        gc.collect()
        torch._dynamo.reset()
        torch.cuda.empty_cache()


# ---------------------------------------------------------------------------------------------- Kiln's trainer

PROFILED_STEPS = 2  # with --profile: Kiln's last steps but one (left out of its step throughput), the reference's
# steps after its timed ones


def profile_window(args) -> tuple[int, int] | None:
    if not args.profile:
        return None
    last = args.steps - 1  # not the last step: the run's end (its checkpoint, the drain) is not a step's work
    if last - PROFILED_STEPS + 1 < 3:
        sys.exit(f"--profile needs --steps of at least {PROFILED_STEPS + 3} (the profiled steps come after warm-up)")
    return last - PROFILED_STEPS + 1, last


def bench_settings(args) -> TrainingSettings:
    """The run a user gets, on synthetic data: what the bench does not set stays the trainer's default."""
    optional = {"micro_batch_size": args.micro_batch, "compile": args.compile, "profile_steps": profile_window(args)}
    checkpoint = {"keep_last": 1, "resume": False}
    if args.checkpoint_every is not None:
        checkpoint["every_steps"] = args.checkpoint_every or None
    return TrainingSettings(
        model={"preset": args.preset, "activation_checkpointing": args.activation_checkpointing},
        seq_len=args.seq_len, grad_accum=args.grad_accum, max_steps=args.steps, precision=args.precision,
        val_batches=2, peak_tflops=args.peak_tflops,
        schedule={"warmup_steps": 5}, checkpoint=checkpoint, monitor={"enabled": False}, export=[],
        **({"parallelism": {"zero_stage": args.zero_stage}} if args.zero_stage is not None else {}),
        **{k: v for k, v in optional.items() if v is not None})


def goodput_at_cadence(steady: float, stall_s: float, cadence_s: float) -> float:
    """The goodput a long run at a cadence of `cadence_s` would get: the steady goodput, with no save inside a bench
    this short, less one save's stall a cadence. The stall is the bench's one save, its last, which also pinned its
    host buffers, as only a run's first save does: the slowest save a run makes."""
    return steady * cadence_s / (cadence_s + stall_s)


class BenchRunFailed(RuntimeError):
    """Kiln's run for one preset failed; the message ends with its log's tail."""


def stop_tree(proc: subprocess.Popen, grace_s: float = 15.0) -> None:
    """SIGTERM `proc` and every process under it, SIGKILL what is left after `grace_s`. torchrun starts each rank in
    a session of its own, so a time limit's signal to the bench's process group never reaches them, and a rank left
    running holds the GPU (its memory included) into the next part of the suite."""
    import psutil  # a dependency of DeepSpeed

    try:
        procs = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.terminate()
        except psutil.NoSuchProcess:
            pass
    _, alive = psutil.wait_procs(procs, timeout=grace_s)
    for p in alive:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def kiln_run(args, settings: TrainingSettings, launcher: str, data: Path, tmp: Path, log: Path) -> dict:
    """One launch of the real entry point, its output into `log`; its summary.json plus the launch's wall time."""
    run = settings.to_run_config(dataset_dir=data, tokenizer_sha256=SHA, output_dir=tmp / "out").write(tmp / "run.json")
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)  # a benchmark is not an experiment
    if not torch.cuda.is_available():
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
    env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(os.environ.get("KILN_HOME", REPO / ".kiln")).resolve()
                                               / "torch_extensions"))
    t0 = time.perf_counter()
    with open(log, "wb") as out:  # written as it runs: a run cut short by a time limit still says how far it got
        proc = subprocess.Popen(launch_command(launcher, run, args.nproc, max_failures=0), cwd=REPO, env=env,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        code = proc.wait()
    except BaseException:  # the suite's time limit (SIGINT), Ctrl-C
        stop_tree(proc)
        raise
    wall = time.perf_counter() - t0
    if code != 0:
        tail = log.read_bytes()[-6000:].decode("utf-8", "replace")
        raise BenchRunFailed(f"training failed ({code}); the end of {log}:\n{tail}")
    shutil.rmtree(tmp / "out" / "checkpoints", ignore_errors=True)
    summary = json.loads((tmp / "out" / "summary.json").read_text())
    summary["profile"] = kept_profile(summary.get("profile"), args.profile, f"{args.preset}_kiln_{launcher}_ops.txt")
    return {**summary, "launch_wall_s": wall}


def kept_profile(profile: dict | None, folder: Path | None, name: str) -> dict | None:
    """A profile's operator table copied out of the temporary folder to folder/name (the trace is left behind)."""
    if not profile:
        return None
    table = folder / name
    shutil.copyfile(profile["ops"], table)
    return {**profile, "ops": str(table), "trace": None}


def pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.1%}"


def profile_line(profile: dict) -> str:
    first, last = profile["steps"]
    waits = profile.get("host_waits")
    return (f"  profile of steps {first}-{last}: {profile['wall_s']:.3f} s, the device busy "
            f"{pct(profile['device_busy_fraction'])} of it; operators in {profile['ops']}"
            + (f"; host waits: {', '.join(f'{k} {v}' for k, v in waits.items())}" if waits else ""))


def bench_preset(args, launcher: str, result: dict, save: Callable[[], None]) -> None:
    """Kiln's trainer, then (unless --no-reference) the reference loop on the same data and tokens per step, into
    `result`; `save()` after each, so a time limit during the reference keeps Kiln's figures."""
    settings = bench_settings(args)
    with tempfile.TemporaryDirectory(prefix="kiln-train-bench-") as tmp:
        tmp = Path(tmp)
        # the loaders wrap into a new epoch when the shard runs out: it needs only hold the largest batch a layout
        # may choose (512 sequences), or the steps at the settings' batch, whichever is more
        sequences = max(512, settings.tokens_per_step(args.nproc, args.seq_len) // args.seq_len
                        * (args.steps + args.warmup + 2))
        data = synthetic_shards(tmp / "shards", sequences * args.seq_len + 1)
        log = (args.json_out.with_name(f"{args.json_out.stem}_{args.preset}_{launcher}.log") if args.json_out
               else tmp / "kiln.log")
        s = kiln_run(args, settings, launcher, data, tmp, log)
        layout = s.get("layout") or {}
        micro = layout.get("micro_batch", settings.micro_batch_size)
        accum = layout.get("grad_accum", settings.grad_accum)
        print(f"model: {args.preset}, {s['n_params'] / 1e6:.1f}M parameters ({s['n_params_non_embedding'] / 1e6:.2f}M "
              f"non-embedding), {s['flops_per_token'] / 1e9:.3f} GFLOP/token at seq_len {args.seq_len}")
        print(f"kiln ({launcher}): {s['world_size']} x {s['device']}, {s['precision']}, micro-batch {micro} x accum "
              f"{accum} = {s['tokens_per_step']:,} tokens/step, ZeRO-{s['parallelism']['zero_stage']}, "
              f"compile {(s.get('compile') or {}).get('enabled', 'n/a')}, {s['steps']} steps"
              f"{', activation checkpointing' if args.activation_checkpointing else ''}")
        goodput = s.get("goodput_tokens_per_s")  # None: a trainer from before goodput was reported
        steady = s.get("steady_goodput_tokens_per_s")
        steady_share = f"{steady / s['tokens_per_s']:.2f}" if steady else "n/a"
        print(f"  step throughput {s['tokens_per_s']:,.0f} tokens/s ({s['tokens_per_s'] / s['world_size']:,.0f} per "
              f"rank), MFU {pct(s['mfu'])}; goodput "
              + (f"{goodput:,.0f} tokens/s, MFU {pct(s['goodput_mfu'])} ({goodput / s['tokens_per_s']:.2f} of step; "
                 f"{steady_share} without the one-time parts: {', '.join(ONE_TIME_PARTS)})" if goodput else "n/a"))
        if goodput:
            print(f"  wall {s['time']['wall_s']:.1f} s: " + ", ".join(f"{k[:-2]} {v:.1f}" for k, v in s["time"].items()
                                                                       if k != "wall_s")
                  + f"; checkpoint stall {s['checkpoint_stall']['total_s']:.2f} s over "
                  f"{s['checkpoint_stall']['count']}; launch {s['launch_wall_s']:.0f} s")
        at_cadence = None
        cadence_min = settings.checkpoint.every_minutes
        if steady and settings.checkpoint.every_steps is None and cadence_min and s["checkpoint_stall"]["count"] == 1:
            at_cadence = goodput_at_cadence(steady, s["checkpoint_stall"]["max_s"], 60 * cadence_min)
            print(f"  at the default cadence (a save every {cadence_min:g} minutes, each stalling "
                  f"{s['checkpoint_stall']['max_s']:.2f} s as this run's did): goodput {at_cadence:,.0f} tokens/s, "
                  f"{at_cadence / s['tokens_per_s']:.3f} of step throughput (projected)")
        estimated = (layout.get("memory_gib") or {}).get("total")
        if estimated and s.get("peak_memory_gib"):  # the layout estimates device memory only (None on CPU)
            print(f"  peak memory {s['peak_memory_gib']:.2f} GiB allocated, the layout estimated {estimated:.2f} GiB "
                  f"(measured / estimated {s['peak_memory_gib'] / estimated:.2f})")
        if s.get("profile"):
            print(profile_line(s["profile"]))
        result["kiln"] = {
            **{k: s.get(k) for k in (
                "tokens_per_s", "mfu", "goodput_tokens_per_s", "goodput_mfu", "time", "checkpoint_stall", "world_size",
                "device", "precision", "tokens_per_step", "steps", "parallelism", "layout", "compile",
                "peak_flops_per_device", "n_params", "flops_per_token", "launch_wall_s", "profile",
                "steady_goodput_tokens_per_s", "peak_memory_gib")},
            "goodput_at_default_cadence_tokens_per_s": at_cadence}
        save()
        if args.reference:
            ref_micro = args.ref_micro_batch or micro
            ref_accum = max(1, micro * accum // ref_micro)
            try:
                ref = reference_loop(settings, data, args.seq_len, ref_micro, ref_accum, args.steps, args.warmup,
                                     torch.cuda.is_available() if args.ref_compile is None else args.ref_compile,
                                     tmp / "reference_profile" if args.profile else None)
            finally:
                release_device_memory()
            ref["profile"] = kept_profile(ref["profile"], args.profile, f"{args.preset}_reference_ops.txt")
            per_device = s["tokens_per_s"] / s["world_size"]
            ratio = per_device / ref["tokens_per_s"]
            print(f"reference (nanoGPT loop, 1 x {ref['device']}, {ref['precision']}, micro-batch {ref_micro} x accum "
                  f"{ref_accum}, compile {ref['compile']}): {ref['tokens_per_s']:,.0f} tokens/s, MFU {pct(ref['mfu'])}")
            if ref["profile"]:
                print(profile_line(ref["profile"]))
            print(f"  kiln / reference = {ratio:.2f} per device (step throughput)"
                  + (f", {goodput / s['world_size'] / ref['tokens_per_s']:.2f} by goodput" if goodput else "")
                  + (f", {steady / s['world_size'] / ref['tokens_per_s']:.2f} by steady goodput" if steady else ""))
            result.update(reference=ref, kiln_over_reference=ratio)
        print()


def main() -> None:
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="125m,350m,1b" if on_gpu else "tiny,small",
                        help="comma-separated presets: tiny, small, 125m, 350m, 1b")
    parser.add_argument("--seq-len", type=int, default=2048 if on_gpu else 256)
    parser.add_argument("--micro-batch", type=int, default=None, help="default: the trainer's layout choice")
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=60 if on_gpu else 20,
                        help="optimizer steps; the run checkpoints at its end (a one-time cost, kept apart in the "
                             "steady goodput) and at the default cadence (every 30 minutes) or --checkpoint-every")
    parser.add_argument("--warmup", type=int, default=5 if on_gpu else 2, help="reference steps before timing")
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count() if on_gpu else 1)
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument("--zero-stage", type=int, choices=[0, 1, 2, 3], default=None,
                        help="force a ZeRO stage (default: the trainer's layout choice)")
    parser.add_argument("--compile", default=None, choices=["auto", "true", "false"],
                        help="training.compile (default: the trainer's default)")
    parser.add_argument("--checkpoint-every", type=int, default=None,
                        help="checkpoint.every_steps (0: only at the end; default: the trainer's default cadence)")
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=None, help="per device; default: the GPU table")
    parser.add_argument("--launcher", default="torchrun", help="comma-separated: torchrun, deepspeed, ray")
    parser.add_argument("--no-reference", dest="reference", action="store_false", help="skip the reference loop")
    parser.add_argument("--ref-micro-batch", type=int, default=None, help="default: Kiln's micro-batch")
    parser.add_argument("--ref-compile", type=lambda v: v == "true", default=None, metavar="true|false",
                        help="torch.compile in the reference (default: on GPUs)")
    parser.add_argument("--json-out", type=Path, default=None, help="write every figure to this JSON file")
    parser.add_argument("--profile", type=Path, default=None, metavar="DIR",
                        help=f"profile {PROFILED_STEPS} steps of Kiln's run (training.profile_steps; left out of its "
                             f"step throughput) and of the reference (after its timed steps): operator tables into "
                             f"DIR, the device's busy fraction in the figures")
    args = parser.parse_args()
    if args.profile:
        args.profile.mkdir(parents=True, exist_ok=True)
    unknown = set(map(str.strip, args.launcher.split(","))) - {"torchrun", "deepspeed", "ray"}
    if unknown:
        parser.error(f"--launcher {', '.join(sorted(unknown))}: expected torchrun, deepspeed or ray")

    print(f"machine: {machine()}")
    report = {"machine": machine(), "command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d"), "runs": []}

    def save() -> None:  # after every part of every run: a suite cut short keeps what it measured
        if args.json_out:
            tmp = args.json_out.with_suffix(".tmp")
            tmp.write_text(json.dumps(report, indent=1, default=str) + "\n")
            tmp.replace(args.json_out)

    failed = []
    for preset in args.preset.split(","):
        args.preset = preset.strip()
        for i, launcher in enumerate(args.launcher.split(",")):
            reference = args.reference
            args.reference = reference and i == len(args.launcher.split(",")) - 1  # one reference per preset
            result = {"preset": args.preset, "seq_len": args.seq_len, "launcher": launcher.strip()}
            report["runs"].append(result)
            try:
                bench_preset(args, launcher.strip(), result, save)
            except Exception as exc:  # noqa: BLE001 - one preset's failure (a crash, out of memory) is its figure
                first_line = next(iter(str(exc).splitlines()), "")  # a failed run's names its log
                result["error"] = f"{type(exc).__name__}: {first_line}"
                failed.append(args.preset)
                print(f"{args.preset} ({launcher.strip()}) failed: {type(exc).__name__}: {exc}\n", file=sys.stderr)
            args.reference = reference
            save()
    if failed:
        sys.exit(f"failed: {', '.join(failed)} (each recorded with its error; the others measured)")


if __name__ == "__main__":
    main()
