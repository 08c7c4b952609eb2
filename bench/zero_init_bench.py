"""Peak memory of building a model for ZeRO-3 training, with and without deepspeed.zero.Init: two processes
(torchrun, gloo on CPU or NCCL on GPUs) each build the preset through training_jobs.setup.build_engine
(the model, AdamW, the LR schedule, deepspeed.initialize) and report their peak resident memory (VmHWM;
on GPUs also the peak allocated device memory). Without zero.Init every rank holds the whole fp32 model before
DeepSpeed partitions it; with it, each rank only ever holds its partition (plus one parameter being initialized).

    .venv/bin/python bench/zero_init_bench.py --preset 1b          # CPU: the largest preset that fits 24 GiB

AdamW's moments are allocated at the first step, after this measurement, in both cases alike.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

VOCAB = 32_000


def worker(preset: str, zero_init: bool) -> None:
    from training_jobs.setup import default_environment

    default_environment()
    import torch

    from kiln.common.memory import peak_rss_bytes
    from training_jobs.model import ModelConfig, param_count
    from training_jobs.monitor import StabilityMonitor
    from training_jobs.settings import TrainingSettings
    from training_jobs.setup import build_engine, build_model, deepspeed_config, init_distributed, resolve_precision

    def peaks() -> dict:
        """Peak resident memory so far (`peak_rss_bytes`: the launcher's not included) and, on GPUs, peak allocated
        device memory, in GiB."""
        rss = peak_rss_bytes() / 2**30
        device = torch.cuda.max_memory_allocated() / 2**30 if torch.cuda.is_available() else None
        return {"rss_gib": round(rss, 3), "device_gib": None if device is None else round(device, 3)}

    dist = init_distributed()
    # The layout fixed, as the trainer's resolve_layout would leave it: ZeRO-3 (what zero.Init is for), micro-batch 8.
    t = TrainingSettings(model={"preset": preset}, seq_len=2048, max_steps=10, zero_init=zero_init,
                         micro_batch_size=8, parallelism={"zero_stage": 3})
    cfg = ModelConfig(**t.model.architecture(VOCAB, 2048))
    precision = resolve_precision(t.precision)
    ds = deepspeed_config(t, precision, cfg)
    t0 = time.perf_counter()
    model = build_model(cfg, t, ds)
    built = peaks()
    seconds = time.perf_counter() - t0
    engine = build_engine(cfg, t, ds, 10, StabilityMonitor(t.monitor), model=model)
    out = [None] * dist.world_size
    torch.distributed.all_gather_object(out, {"rank": dist.rank, "build": built, "initialized": peaks(),
                                              "build_s": round(seconds, 1)})
    if dist.main:
        print("RESULT " + json.dumps({"preset": preset, "zero_init": zero_init, "n_params": param_count(cfg),
                                      "precision": precision, "ranks": out}))
    del engine
    torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def run(preset: str, zero_init: bool, nproc: int) -> dict:
    env = {**os.environ, "MLFLOW_DISABLE_TELEMETRY": "true", "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}", __file__,
           "--worker", "--preset", preset] + ([] if zero_init else ["--no-zero-init"])
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True)
    lines = [line for line in done.stdout.splitlines() if line.startswith("RESULT ")]
    if done.returncode != 0 or not lines:
        sys.exit(f"build failed ({done.returncode}):\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}")
    return json.loads(lines[-1][len("RESULT "):])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="1b")
    parser.add_argument("--nproc", type=int, default=2)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--no-zero-init", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    if args.worker:
        return worker(args.preset, not args.no_zero_init)
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from train_bench import machine

    print(f"machine: {machine()}")
    results = [run(args.preset, zero_init, args.nproc) for zero_init in (False, True)]
    for r in results:
        for phase, what in (("build", "model built"), ("initialized", "after deepspeed.initialize")):
            ranks = [x[phase] for x in r["ranks"]]
            device = (f", device {', '.join(str(x['device_gib']) for x in ranks)} GiB"
                      if ranks[0]["device_gib"] is not None else "")
            print(f"{r['preset']} ({r['n_params'] / 1e9:.2f}B parameters, {r['precision']}), {len(ranks)} processes, "
                  f"zero.Init {'on ' if r['zero_init'] else 'off'}, {what}: peak RSS per rank "
                  f"{', '.join(str(x['rss_gib']) for x in ranks)} GiB{device}")
    for phase in ("build", "initialized"):
        off, on = (max(x[phase]["rss_gib"] for x in r["ranks"]) for r in results)
        print(f"largest rank's peak RSS, {phase}: {off} GiB without zero.Init, {on} GiB with it ({on / off:.2f}x)")
    if args.json:
        args.json.write_text(json.dumps({"machine": machine(), "results": results}, indent=2))


if __name__ == "__main__":
    main()
