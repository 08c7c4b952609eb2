"""Long-context extension, measured: a model trained at a short context, then continued from that checkpoint
at a 4x longer one with a larger RoPE base (Code Llama's recipe: base 10,000 -> 1,000,000), both through the real
entry point (DeepSpeed ZeRO-3, training_jobs.train with training.base_checkpoint). Prints tokens/s and MFU of
each phase at the same tokens per step, and the extended model's validation perplexity by position.

    .venv/bin/python bench/long_context_bench.py                       # GPU: 125m, 2048 -> 8192
    .venv/bin/python bench/long_context_bench.py --preset tiny --short 128 --long 512 --steps 6 --micro-batch 8

Data: random tokens (train_bench.synthetic_shards), so the figures are about compute, not learning: the
perplexities show the phases run and report, not that the extension helps. MFU counts 6·N + 12·L·d·T FLOPs
per token (training_jobs.model.flops_per_token), so the longer context's attention counts as work.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

import torch  # noqa: E402
from train_bench import REPO, SHA, machine, synthetic_shards  # noqa: E402

from training_jobs.settings import TrainingSettings  # noqa: E402


def launch(run: Path, nproc: int, on_gpu: bool) -> tuple[dict, float]:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1"}
    env.pop("MLFLOW_TRACKING_URI", None)
    if not on_gpu:
        env.setdefault("DS_ACCELERATOR", "cpu")
        env.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // nproc)))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "training_jobs.train", "--run-config", str(run)]
    t0 = time.perf_counter()
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    summary_path = Path(json.loads(run.read_text())["output_dir"]) / "summary.json"
    if done.returncode != 0:
        sys.exit(f"training failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return json.loads(summary_path.read_text()), wall


def main() -> None:
    on_gpu = torch.cuda.is_available()
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="125m" if on_gpu else "tiny")
    parser.add_argument("--short", type=int, default=2048, help="phase 1 seq_len")
    parser.add_argument("--long", type=int, default=8192, help="phase 2 seq_len")
    parser.add_argument("--rope-theta", type=float, default=1_000_000.0, help="phase 2 RoPE base (phase 1: 10,000)")
    parser.add_argument("--micro-batch", type=int, default=8, help="phase 1; phase 2 takes short/long of it")
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--nproc", type=int, default=torch.cuda.device_count() if on_gpu else 2)
    parser.add_argument("--activation-checkpointing", action="store_true")
    parser.add_argument("--json", type=Path, default=None, help="write the figures here too")
    args = parser.parse_args()
    long_batch = max(1, args.micro_batch * args.short // args.long)

    print(f"machine: {machine()}")
    phases = []
    with tempfile.TemporaryDirectory(prefix="kiln-long-context-") as tmp:
        tmp = Path(tmp)
        tokens = args.nproc * args.micro_batch * args.short * (args.steps + 4) + args.long + 1
        data = synthetic_shards(tmp / "shards", tokens)
        base = None
        for name, seq_len, batch, theta in (("short", args.short, args.micro_batch, 10_000.0),
                                            ("long", args.long, long_batch, args.rope_theta)):
            settings = TrainingSettings(
                model={"preset": args.preset, "rope_theta": theta,
                       "activation_checkpointing": args.activation_checkpointing},
                seq_len=seq_len, micro_batch_size=batch, max_steps=args.steps, val_batches=2,
                log_every_steps=max(1, args.steps // 4), schedule={"warmup_steps": 5}, base_checkpoint=base,
                rewarmup_steps=5 if base else None, checkpoint={"every_steps": None, "keep_last": 1},
                monitor={"enabled": False}, export=[])
            run = settings.to_run_config(dataset_dir=data, tokenizer_sha256=SHA,
                                         output_dir=tmp / name).write(tmp / f"{name}.json")
            s, wall = launch(run, args.nproc, on_gpu)
            base = s["checkpoint"]
            phases.append({"phase": name, "seq_len": seq_len, "micro_batch": batch, "rope_theta": theta,
                           "wall_s": round(wall, 1), **{k: s[k] for k in (
                               "tokens_per_s", "mfu", "tokens_per_step", "steps", "world_size", "device", "precision",
                               "flops_per_token", "n_params", "val_loss", "val_ppl_pos", "base_val_loss")},
                           "peak_memory_gib": _peak_memory(tmp / name)})
    for p in phases:
        mfu = f"{p['mfu']:.1%}" if p["mfu"] is not None else "n/a"
        print(f"{p['phase']:>5}: seq_len {p['seq_len']:>5}, rope_theta {p['rope_theta']:>9,.0f}, micro-batch "
              f"{p['micro_batch']} ({p['tokens_per_step']:,} tokens/step): {p['tokens_per_s']:,.0f} tokens/s, "
              f"MFU {mfu}, {p['flops_per_token'] / 1e9:.3f} GFLOP/token, peak memory {p['peak_memory_gib']} GiB; "
              f"val ppl by position {p['val_ppl_pos']}")
    short, long = phases
    print(f"long / short: tokens/s x{long['tokens_per_s'] / short['tokens_per_s']:.2f}"
          + (f", MFU x{long['mfu'] / short['mfu']:.2f}" if short["mfu"] and long["mfu"] else ""))
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "preset": args.preset, "phases": phases}, indent=2))


def _peak_memory(output_dir: Path) -> float | None:
    rows = [json.loads(line) for line in (output_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    values = [r["train/peak_memory_gib"] for r in rows if "train/peak_memory_gib" in r]
    return max(values) if values else None


if __name__ == "__main__":
    main()
