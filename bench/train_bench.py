"""Training throughput: tokens/s and MFU (on GPUs), steps/s on CPU, for a model preset, through the real
entry point (torchrun + DeepSpeed ZeRO-3 + training_jobs.train), and the same model in a plain PyTorch loop
(one process, AdamW, no DeepSpeed) for comparison.

    .venv/bin/python bench/train_bench.py                                   # CPU: tiny, 2 ranks
    .venv/bin/python bench/train_bench.py --preset 125m,350m --seq-len 2048 --micro-batch 8 --steps 50   # GPUs
    .venv/bin/python bench/train_bench.py --launcher deepspeed,ray --no-plain    # the launchers side by side

--launcher: torchrun (default), deepspeed, ray (training_jobs/ray_launch.py on an embedded local Ray, or on
RAY_ADDRESS's cluster); each one trains the same run in turn.

Data: random tokens in a synthetic shard set (a 32k vocabulary), so the figures are about compute, not
learning. Throughput is the steady state reported in summary.json (the first step, which pays for
warm-up, is left out); validation, checkpoint and export time are not in it. MFU counts
6·(N_non_embedding + V·d) + 12·L·d·T FLOPs per token (training_jobs.model.flops_per_token) against the
dense bf16 peak of the GPU (training_jobs.flops), or --peak-tflops. Figures are for the machine printed
first; quote them with it.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import numpy as np  # noqa: E402
import torch  # noqa: E402

from kiln.tokens.shard_format import ShardInfo, describe_shard_set, write_shard  # noqa: E402
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
    folder.mkdir(parents=True, exist_ok=True)
    rng = np.random.default_rng(seed)
    infos = []
    for name, split, n in (("shard-00000.bin", "train", tokens), ("shard-00001.bin", "val", max(tokens // 50, 20_000))):
        write_shard(folder / name, rng.integers(3, VOCAB, n, dtype=np.uint16), np.array([0, n]), SHA)
        infos.append(ShardInfo(name, split, "main" if split == "train" else "val", 0, n, 1))
    (folder / "_manifest.json").write_text(json.dumps({"stats": describe_shard_set(SHA, VOCAB, 2, infos)}))
    return folder


def plain_pytorch(settings: TrainingSettings, seq_len: int, micro_batch: int, steps: int) -> dict:
    """The same model and optimizer in a bare loop on one device: what DeepSpeed's machinery costs."""
    from training_jobs.flops import device_peak_flops, mfu
    from training_jobs.model import ModelConfig, Transformer, flops_per_token

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cfg = ModelConfig(**settings.model.architecture(VOCAB, seq_len))
    model = Transformer(cfg, seed=0).to(device)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    bf16 = device == "cuda" and torch.cuda.is_bf16_supported() and settings.precision != "fp32"
    gen = torch.Generator(device="cpu").manual_seed(0)
    timings = []
    for _ in range(steps):
        batch = torch.randint(3, VOCAB, (micro_batch, seq_len + 1), generator=gen).to(device)
        t0 = time.perf_counter()
        with torch.autocast(device_type=device, dtype=torch.bfloat16, enabled=bf16):
            loss = model(batch[:, :-1], batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device == "cuda":
            torch.cuda.synchronize()
        timings.append(time.perf_counter() - t0)
    steady = timings[1:] or timings
    tokens_per_s = micro_batch * seq_len * len(steady) / sum(steady)
    _, peak = device_peak_flops(settings.peak_tflops)
    return {"tokens_per_s": tokens_per_s, "mfu": mfu(flops_per_token(cfg, seq_len), tokens_per_s, peak, 1),
            "device": torch.cuda.get_device_name(0) if device == "cuda" else "cpu",
            "precision": "bf16" if bf16 else "fp32"}


def main() -> None:
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="125m,350m" if on_gpu else "tiny,small",
                        help="comma-separated presets: tiny, small, 125m, 350m, 1b")
    parser.add_argument("--seq-len", type=int, default=2048 if on_gpu else 256)
    parser.add_argument("--micro-batch", type=int, default=8)
    parser.add_argument("--grad-accum", type=int, default=1)
    parser.add_argument("--steps", type=int, default=40 if on_gpu else 30)
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count() if on_gpu else 2)
    parser.add_argument("--precision", default="auto", choices=["auto", "bf16", "fp32"])
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--peak-tflops", type=float, default=None, help="per device; default: the GPU table")
    parser.add_argument("--json", action="store_true", help="also print the summary as one JSON line")
    parser.add_argument("--launcher", default="torchrun", help="comma-separated: torchrun, deepspeed, ray")
    parser.add_argument("--no-plain", dest="plain", action="store_false", help="skip the plain PyTorch loop")
    args = parser.parse_args()

    print(f"machine: {machine()}")
    for preset in args.preset.split(","):
        args.preset = preset.strip()
        summary = None
        for launcher in args.launcher.split(","):
            summary = bench_preset(args, on_gpu, launcher.strip())
        if args.plain:
            plain_line(args, on_gpu, summary)


def launch_command(launcher: str, nproc: int, run: Path) -> list[str]:
    bin_dir = Path(sys.executable).parent
    entry = ["training_jobs.train", "--run-config", str(run)]
    if launcher == "torchrun":
        return [str(bin_dir / "torchrun"), "--standalone", f"--nproc_per_node={nproc}", "-m", *entry]
    if launcher == "deepspeed":
        binary = shutil.which("deepspeed", path=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}")
        return [binary or "deepspeed", "--num_gpus", str(nproc), "--module", *entry]
    if launcher == "ray":
        return [sys.executable, "-m", "training_jobs.ray_launch", "--run-config", str(run), "--num-workers",
                str(nproc), "--max-failures", "0"]
    sys.exit(f"--launcher {launcher!r}: expected torchrun, deepspeed or ray")


def bench_settings(args) -> TrainingSettings:
    return TrainingSettings(
        model={"preset": args.preset, "activation_checkpointing": args.activation_checkpointing},
        seq_len=args.seq_len, micro_batch_size=args.micro_batch, grad_accum=args.grad_accum, max_steps=args.steps,
        precision=args.precision, log_every_steps=max(1, args.steps // 5), val_batches=2, peak_tflops=args.peak_tflops,
        schedule={"warmup_steps": 5}, checkpoint={"every_steps": None, "keep_last": 1, "resume": False},
        monitor={"enabled": False}, export=[])


def bench_preset(args, on_gpu: bool, launcher: str) -> dict:
    """One launch of the real entry point; prints its figures and returns its summary.json."""
    settings = bench_settings(args)
    with tempfile.TemporaryDirectory(prefix="kiln-train-bench-") as tmp:
        tmp = Path(tmp)
        tokens = settings.tokens_per_step(args.nproc, args.seq_len) * (args.steps + 2) + args.seq_len + 1
        data = synthetic_shards(tmp / "shards", tokens)
        run = settings.to_run_config(dataset_dir=data, tokenizer_sha256=SHA, output_dir=tmp / "out")
        run = run.write(tmp / "run.json")
        env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
        env.pop("MLFLOW_TRACKING_URI", None)  # a benchmark is not an experiment
        if not on_gpu:
            env.setdefault("DS_ACCELERATOR", "cpu")
            env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // args.nproc)))
        env.setdefault("TORCH_EXTENSIONS_DIR", str(Path(os.environ.get("KILN_HOME", REPO / ".kiln")).resolve()
                                                   / "torch_extensions"))
        cmd = launch_command(launcher, args.nproc, run)
        t0 = time.perf_counter()
        done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
        wall = time.perf_counter() - t0
        if done.returncode != 0:
            sys.exit(f"training failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
        s = json.loads((tmp / "out" / "summary.json").read_text())

    steps_per_s = s["tokens_per_s"] / s["tokens_per_step"]
    mfu = f"{s['mfu']:.1%}" if s["mfu"] is not None else "n/a (no peak for this device; --peak-tflops to set one)"
    print(f"model: {args.preset}, {s['n_params'] / 1e6:.1f}M parameters ({s['n_params_non_embedding'] / 1e6:.2f}M "
          f"non-embedding), {s['flops_per_token'] / 1e9:.3f} GFLOP/token at seq_len {args.seq_len}")
    print(f"run ({launcher} launcher): {s['world_size']} x {s['device']}, {s['precision']}, micro-batch {args.micro_batch} x accum "
          f"{args.grad_accum} = {s['tokens_per_step']:,} tokens/step, {s['steps']} steps, ZeRO-3"
          f"{', activation checkpointing' if args.activation_checkpointing else ''}")
    print(f"throughput: {steps_per_s:.2f} steps/s, {s['tokens_per_s']:,.0f} tokens/s "
          f"({s['tokens_per_s'] / s['world_size']:,.0f} per rank), MFU {mfu}")
    print(f"wall: {wall:.1f} s for the whole launch (imports, DeepSpeed init, {s['steps']} steps, final checkpoint)")
    if args.json:
        print(json.dumps({"preset": args.preset, "launcher": launcher, "steps_per_s": steps_per_s, **{k: s[k] for k in (
            "tokens_per_s", "mfu", "world_size", "device", "precision", "tokens_per_step", "n_params",
            "flops_per_token", "peak_flops_per_device")}}))
    return s


def plain_line(args, on_gpu: bool, s: dict) -> None:
    """The same model in a bare PyTorch loop, against the last launch's figures."""
    plain = plain_pytorch(bench_settings(args), args.seq_len, args.micro_batch, min(args.steps, 20))
    plain_mfu = f"{plain['mfu']:.1%}" if plain["mfu"] is not None else "n/a"
    # On GPUs compare one device with one device; on CPU the plain loop has every core in one process,
    # the DeepSpeed ranks split them, so compare the machine's totals.
    ours = s["tokens_per_s"] / s["world_size"] if on_gpu else s["tokens_per_s"]
    print(f"plain PyTorch (1 x {plain['device']}, {plain['precision']}, no DeepSpeed): {plain['tokens_per_s']:,.0f} "
          f"tokens/s, MFU {plain_mfu}; DeepSpeed ZeRO-3 / plain = {ours / plain['tokens_per_s']:.2f} "
          f"({'per device' if on_gpu else 'whole machine'})")
    print()


if __name__ == "__main__":
    main()
