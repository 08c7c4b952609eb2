"""training.compile: the compiled blocks (setup.compile_blocks) train as the eager model does, inside a real DeepSpeed
engine built in this process (a world of one, gloo), at ZeRO stage 0 and at stage 3 with activation checkpointing.

The backend is aot_eager (KILN_COMPILE_BACKEND): Dynamo's capture, guards and AOTAutograd's joint graph and partition,
which is where ZeRO-3's hooks, the masks and the recompiles meet the compiler, without inductor's C++ build (minutes
on two cores). Inductor was checked by hand at stage 3 (see /work/notes/docs-compile.md): the same losses."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
import torch

from training_jobs import checkpoint
from training_jobs.model import ModelConfig
from training_jobs.monitor import StabilityMonitor
from training_jobs.settings import TrainingSettings
from training_jobs.setup import build_engine, deepspeed_config, init_distributed

# DeepSpeed's ZeRO-3 calls torch.distributed's old collective names each step (the trainer filters these too).
pytestmark = pytest.mark.filterwarnings("ignore:.*torch.distributed.*is deprecated:FutureWarning")

CFG = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=64, max_seq_len=16)
STEPS = 20
# fp32 throughout. The compiled graph runs the same ATen ops, but AOTAutograd decomposes some (RMSNorm's mean and rsqrt,
# SiLU's and SDPA's backward) and may order the sums differently, so each loss can move by a few float32 roundings
# (eps 1.2e-7), compounded through 20 AdamW updates: measured |diff| <= 2e-6 at losses ~4.8. 1e-5 relative is ~80 ulps;
# a real fault is far above it: a block that dropped the prefix mask would move those steps' losses by 1e-4 to 3e-2
# relative on this trajectory (measured with the eager model).
RTOL = 1e-5


@pytest.fixture(scope="module")
def world_of_one():
    """torch.distributed for one process, as the trainer sets it up, torn down after this module; the environment
    it needs is restored (later tests launch ranks that read it)."""
    with pytest.MonkeyPatch.context() as env:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        for key, value in {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1",
                           "MASTER_PORT": str(port), "KILN_COMPILE_BACKEND": "aot_eager"}.items():
            env.setenv(key, value)
        owned = not torch.distributed.is_initialized()
        init_distributed()
        # One intra-op thread: on a model this small a second one only waits, and on a busy CI machine its spinning
        # cost 16 ms per 2 x 16 x 32 matmul (measured), several times the whole test's compute.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        yield
        torch.set_num_threads(threads)
        if owned:
            torch.distributed.destroy_process_group()


def graphs() -> tuple[int, int]:
    """Dynamo's count of compiled graphs and of graph breaks so far in this process."""
    from torch._dynamo.utils import counters

    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def train(stage: int, compiled: bool, checkpoints: Path, resume: bool = False) -> tuple[list[float], list[str]]:
    """STEPS optimizer steps on four batches in turn (the model memorises them, so the loss falls and the runs have a
    trajectory to agree on), the prefix-LM mask on every other step, a checkpoint at the half (Trainer.save's), then a
    validation loss (eval, no_grad). `resume`: a fresh engine, as Trainer.resume and Trainer.roll_back build one, loads
    the checkpoint and does the second half. Returns the losses from where it started and the parameter names."""
    t = TrainingSettings(micro_batch_size=2, compile=compiled, parallelism={"zero_stage": stage},
                         model={"activation_checkpointing": stage == 3},
                         schedule={"lr": 1e-2, "min_lr": 1e-3, "warmup_steps": 2})
    engine = build_engine(CFG, t, deepspeed_config(t, "fp32", CFG), STEPS, StabilityMonitor(t.monitor),
                          compiled=compiled)
    first = 0
    if resume:
        found = checkpoint.find_resumable(checkpoints)
        checkpoint.load(engine, checkpoints, found)
        first = found.step
    gen = torch.Generator().manual_seed(0)
    batches = [torch.randint(0, CFG.vocab_size, (2, CFG.max_seq_len + 1), generator=gen) for _ in range(4)]
    losses = []
    for step in range(first, STEPS):
        if step == STEPS // 2 and not resume:
            checkpoint.save(engine, checkpoints, step, {}, keep_last=1)
        tokens = batches[step % 4]
        prefix = torch.tensor([5, 0]) if step % 2 else None  # a prefix on row 0; row 1 causal
        loss = engine(tokens[:, :-1], tokens[:, 1:], prefix)
        engine.backward(loss)
        engine.step()
        losses.append(loss.item())
    engine.eval()
    with torch.no_grad():
        losses.append(engine(batches[0][:, :-1], batches[0][:, 1:]).item())
    engine.train()
    return losses, list(engine.module.state_dict())


@pytest.mark.parametrize("stage", [0, 3])
def test_compiled_blocks_train_as_eager_does_and_resume_from_its_checkpoints(world_of_one, tmp_path, stage):
    eager, eager_names = train(stage, False, tmp_path / "eager")
    graphs_before, breaks_before = graphs()
    compiled, compiled_names = train(stage, True, tmp_path / "compiled")
    graphs_after, breaks_after = graphs()
    assert eager[-2] < eager[0] - 0.5  # it learned: the comparison is over a moving trajectory
    assert compiled == pytest.approx(eager, rel=RTOL)
    assert compiled_names == eager_names  # no `_orig_mod.`: checkpoints and exports see the same names
    # No graph break (ZeRO-3's hooks stay outside the compiled forward); at most one graph per variant, shared by
    # both blocks: causal, prefix mask, no_grad validation (fewer when an earlier test compiled them already).
    assert breaks_after == breaks_before and graphs_after - graphs_before <= 3
    # The eager run's checkpoint, resumed by a fresh compiled engine (as a resume or a rollback builds it), continues
    # the eager run; its blocks reuse the graphs: nothing compiles again.
    resumed, _ = train(stage, True, tmp_path / "eager", resume=True)
    assert resumed == pytest.approx(eager[STEPS // 2:], rel=RTOL) and graphs() == (graphs_after, breaks_after)
