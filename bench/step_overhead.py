"""Host time per optimizer step that is framework overhead, not compute: Kiln's DeepSpeed engine at each ZeRO stage
against the plain PyTorch loop, on a model with the 125m preset's depth and tensor count (12 blocks, 110 parameter
tensors) but so narrow (d_model 48, seq_len 16, micro-batch 1) that the arithmetic is negligible. What remains is
Python and dispatch: DeepSpeed's per-parameter gradient hooks, bucket copies and per-tensor norms, and the loop's
own. On a GPU that host time is what runs ahead of the kernels; where it is longer than a step's kernels (small
models, small micro-batches) the GPU waits for it.

    .venv/bin/python bench/step_overhead.py                   # ZeRO 0, 1, 2, 3 and the plain loop, fp32 on CPU
    .venv/bin/python bench/step_overhead.py --stages 0,1 --steps 200
    .venv/bin/python bench/step_overhead.py --stages 0 --compile     # compiled, as on a GPU: what is left of the host

With --compile both are compiled as on a GPU (inductor, or KILN_COMPILE_BACKEND): the plain model's whole forward as
the reference loop compiles it, Kiln's by training_jobs.setup.compile_model. Compilation comes first, untimed.

One process, a world of one (gloo), one intra-op thread. Each figure is the fastest of --repeats runs of --steps
steps (after --warmup steps), as timeit advises: on a shared host the slower runs measure the neighbours, and the
median moved by +-30% between runs on the 2-core VM where the minimum held. The plain loop and the engines take
turns in every repeat. Quote the ratio with the machine.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from training_jobs.model import ModelConfig, Transformer  # noqa: E402
from training_jobs.monitor import StabilityMonitor  # noqa: E402
from training_jobs.settings import TrainingSettings  # noqa: E402
from training_jobs.setup import build_engine, deepspeed_config, default_environment, init_distributed  # noqa: E402
from training_jobs.step import StepFigures  # noqa: E402

SEQ, VOCAB = 16, 256


def settings(stage: int, compiled: bool = False) -> TrainingSettings:
    return TrainingSettings(model={"preset": "125m", "d_model": 48, "n_heads": 12}, seq_len=SEQ, micro_batch_size=1,
                            precision="fp32", parallelism={"zero_stage": stage}, compile=compiled)


def kiln_step(stage: int, compiled: bool):
    t = settings(stage, compiled)  # the DeepSpeed config the trainer builds for it (overlap_comm off when compiled)
    cfg = ModelConfig(**t.model.architecture(VOCAB, SEQ))
    engine = build_engine(cfg, t, deepspeed_config(t, "fp32", cfg), 10_000, StabilityMonitor(t.monitor),
                          compiled=compiled)
    x, y = (torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(i)) for i in range(2))

    def step() -> None:  # what training_jobs.step.train_step and Trainer.launch do for one micro-batch
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()
        StepFigures(loss.detach().double(), engine.get_global_grad_norm())

    return step, sum(1 for _ in engine.module.parameters())


def plain_step(compiled: bool):
    cfg = ModelConfig(**settings(0).model.architecture(VOCAB, SEQ))
    model = Transformer(cfg, seed=0)
    params = list(model.parameters())
    opt = torch.optim.AdamW(params, lr=1e-4, fused=True)
    x, y = (torch.randint(0, VOCAB, (1, SEQ), generator=torch.Generator().manual_seed(i)) for i in range(2))
    forward = torch.compile(model, backend=os.environ.get("KILN_COMPILE_BACKEND", "inductor")) if compiled else model

    def step() -> None:  # bench/train_bench.py's reference loop, one micro-batch
        forward(x, y).backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)

    return step


def ms_per_step(step, steps: int, warmup: int) -> float:
    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--stages", default="0,1,2,3", help="comma-separated ZeRO stages")
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--compile", action="store_true", help="compile the plain model and Kiln's, as on a GPU")
    args = parser.parse_args()
    os.environ.setdefault("MLFLOW_DISABLE_TELEMETRY", "true")
    default_environment()
    init_distributed()
    torch.set_num_threads(1)
    import logging

    logging.getLogger("DeepSpeed").setLevel(logging.WARNING)
    plain = plain_step(args.compile)
    engines = {int(s): kiln_step(int(s), args.compile) for s in args.stages.split(",")}
    times: dict[str, list[float]] = {"plain": [], **{f"ZeRO-{s}": [] for s in engines}}
    for _ in range(args.repeats):
        for stage, (step, _) in engines.items():
            times["plain"].append(ms_per_step(plain, args.steps, args.warmup))
            times[f"ZeRO-{stage}"].append(ms_per_step(step, args.steps, args.warmup))
    tensors = next(iter(engines.values()))[1]
    compiled = f"compiled ({os.environ.get('KILN_COMPILE_BACKEND', 'inductor')})" if args.compile else "eager"
    print(f"machine: {os.cpu_count()} cores, torch {torch.__version__}; 12 blocks, {tensors} parameter tensors, fp32, "
          f"{compiled}, {args.steps} steps x {args.repeats} repeats (fastest; median in brackets)")
    base = min(times["plain"])
    for name, values in times.items():
        ms = min(values)
        print(f"  {name:8s} {ms:7.2f} ms/step  {ms / base:5.2f} x plain  ({ms - base:+.2f} ms)  "
              f"[{statistics.median(values):.2f}]")
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
