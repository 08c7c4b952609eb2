"""The trainer's DeepSpeed engine built in this process (a world of one, gloo; one module, because DeepSpeed keeps
its process groups for the life of the process):

- training.compile: the compiled model (setup.compile_model) trains as the eager model does: the whole forward at ZeRO
  stages 0 and 1 (embedding, RoPE, blocks, head and chunked loss in one graph); each block, and the head with its chunked
  loss, at stage 3 with activation checkpointing;
- ZeRO-0, the layout of a run on one data-parallel rank (training_jobs/layout.py): in bf16 it trains fp32 weights
  under torch autocast with torch's fused AdamW, the gradient norm from torch's clip_grad_norm_
  (setup.torch_step_parts), checked against a second implementation, the plain PyTorch loop written out here (the
  math of bench/train_bench.py's reference loop); its checkpoint resumes exactly and exports the engine's weights;
- no step synchronizes the device or reads a value from it at ZeRO-0, 1 or 2 (DeepSpeed's throughput timer is off,
  its bf16 overflow check too, and ZeRO-1 and 2 clip without reading the norm: setup.clip_without_reading, checked
  against DeepSpeed's own clipping; a compiled model at ZeRO-1/2 reduces its gradients without overlap_comm, whose
  synchronize at the end of each backward would buy nothing there);
- the layout's memory estimate counts the reduce buffers a real engine allocates at each stage, and bounds the weights
  ZeRO-3 keeps gathered.

The backend is aot_eager (KILN_COMPILE_BACKEND): Dynamo's capture, guards and AOTAutograd's joint graph and partition,
which is where ZeRO-3's hooks, the masks and the recompiles meet the compiler, without inductor's C++ build (minutes
on two cores). Inductor was checked by hand at stage 3 (see /work/notes/docs-compile.md): the same losses."""

from __future__ import annotations

import contextlib
import math
import socket
import traceback
from pathlib import Path

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode

from training_jobs import checkpoint
from training_jobs.export import consolidate
from training_jobs.model import ModelConfig, Transformer
from training_jobs.monitor import StabilityMonitor
from training_jobs.settings import TrainingSettings
from training_jobs.setup import build_engine, deepspeed_config, init_distributed
from training_jobs.step import StepFigures

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


@pytest.mark.parametrize("stage", [0, 1, 3])  # 1: the default with several GPUs
def test_the_compiled_model_trains_as_eager_does_and_resumes_from_its_checkpoints(world_of_one, tmp_path, stage):
    eager, eager_names = train(stage, False, tmp_path / "eager")
    graphs_before, breaks_before = graphs()
    compiled, compiled_names = train(stage, True, tmp_path / "compiled")
    graphs_after, breaks_after = graphs()
    assert eager[-2] < eager[0] - 0.5  # it learned: the comparison is over a moving trajectory
    assert compiled == pytest.approx(eager, rel=RTOL)
    assert compiled_names == eager_names  # no `_orig_mod.`: checkpoints and exports see the same names
    # No graph break (nothing hooks the whole forward at stages 0 and 1; ZeRO-3's hooks stay outside the compiled forwards at
    # stage 3). One graph per variant: causal, prefix mask, no_grad validation; at stage 3 the blocks' three, shared
    # by both blocks, and the head's training and validation (fewer when an earlier test compiled them already). A
    # second graph for one variant would be a recompile: on a GPU, seconds of every run.
    assert breaks_after == breaks_before and graphs_after - graphs_before <= (5 if stage == 3 else 3)
    # The eager run's checkpoint, resumed by a fresh compiled engine (as a resume or a rollback builds it), continues
    # the eager run; it reuses the graphs: nothing compiles again.
    resumed, _ = train(stage, True, tmp_path / "eager", resume=True)
    assert resumed == pytest.approx(eager[STEPS // 2:], rel=RTOL) and graphs() == (graphs_after, breaks_after)


# ------------------------------------------------------------------------------ ZeRO-0 under autocast

ZERO0_STEPS = 6
LR = 1e-2
# Between this run's gradient norms (1.11 to 1.52): steps 1, 2 and 6 are clipped, the others not. Clipping every step
# would scale every gradient alike, which Adam's normalisation cancels; mixed, it moves the trajectory: without the
# clip the losses of steps 4 and 6 differ by 4e-5 and 1.4e-4 relative (measured), far above the 1e-6 checked.
CLIP = 1.4


def zero0_settings() -> TrainingSettings:
    # warmup 0 and min_lr = lr: the cosine schedule is a constant LR, which the plain loop below uses as is
    return TrainingSettings(micro_batch_size=2, precision="bf16", grad_clip=CLIP, parallelism={"zero_stage": 0},
                            schedule={"lr": LR, "min_lr": LR, "warmup_steps": 0})


def batches() -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(0)
    return [torch.randint(0, CFG.vocab_size, (2, CFG.max_seq_len + 1), generator=gen) for _ in range(ZERO0_STEPS)]


def engine_for(t: TrainingSettings, compiled: bool = False):
    return build_engine(CFG, t, deepspeed_config(t, "bf16", CFG), ZERO0_STEPS, StabilityMonitor(t.monitor),
                        compiled=compiled)


@pytest.mark.parametrize("compiled", [False, True])  # compiled: one GPU's default (the whole forward, under autocast)
def test_zero0_in_bf16_trains_as_the_plain_autocast_loop(world_of_one, compiled):
    t = zero0_settings()
    ds = deepspeed_config(t, "bf16", CFG)
    assert ds["bf16"]["enabled"] is False and ds["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    engine = engine_for(t, compiled)

    plain = Transformer(CFG, seed=t.seed)  # the same init (the seed's private generator)
    params = list(plain.parameters())
    matrix = [p for p in params if p.dim() >= 2]
    opt = torch.optim.AdamW([{"params": matrix, "weight_decay": t.weight_decay},
                             {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}],
                            lr=LR, betas=t.betas, eps=t.adam_eps, fused=True)
    norms = []
    for step, batch in enumerate(batches()):
        x, y = batch[:, :-1], batch[:, 1:]
        loss = engine(x, y)
        engine.backward(loss)
        engine.step()

        with torch.autocast("cpu", dtype=torch.bfloat16):
            expected = plain(x, y)
        expected.backward()
        # The global norm by hand, in float64 (sqrt of the sum of squares), checks the engine's. The clip is the plain
        # loop's usual one, torch's clip_grad_norm_: a factor rounded one ulp apart (as float64 arithmetic gives on
        # some CPUs) moves a weight one ulp, and under bf16 autocast that can flip an input's rounding a few steps
        # on (seen on an AVX-512-BF16 CPU: norms 1.5e-5 apart at step 3), which says nothing about the engine.
        norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in params))
        torch.nn.utils.clip_grad_norm_(params, CLIP, foreach=True)
        opt.step()
        opt.zero_grad(set_to_none=True)

        assert loss.dtype == torch.float32 and loss.item() == pytest.approx(expected.item(), rel=1e-6), step
        assert float(engine.get_global_grad_norm()) == pytest.approx(norm, rel=1e-5), step
        norms.append(norm)
    assert min(norms) < CLIP < max(norms)  # some steps clipped, some not: Adam does not cancel the clipping out
    assert not engine.enable_backward_allreduce  # one data-parallel rank: no gradient all-reduce to flat buffers
    for (name, ours), theirs in zip(engine.module.named_parameters(), params):
        assert ours.dtype == torch.float32, name  # fp32 weights; autocast rounds only the matmuls' inputs
        torch.testing.assert_close(ours.detach(), theirs.detach(), rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("precision", ["fp32", "bf16"])
def test_zero0_without_clipping_still_reports_the_gradient_norm(world_of_one, precision):
    """training.grad_clip 0 at ZeRO-0 without DeepSpeed's bf16 (fp32, or bf16 under autocast): DeepSpeed calls no
    clipping, so nothing took the norm and get_global_grad_norm() was None every step: the metric empty and the
    stability monitor blind to gradient explosions (grad_factor, grad_norm_max). The norm is taken before the step,
    and equals the root of the sum of squares, by hand in float64, of the gradients the step applies."""
    t = zero0_settings().model_copy(update={"grad_clip": 0.0, "precision": precision})
    engine = build_engine(CFG, t, deepspeed_config(t, precision, CFG), ZERO0_STEPS, StabilityMonitor(t.monitor))
    assert engine.gradient_clipping() == 0 and not engine.bfloat16_enabled()
    for step, batch in enumerate(batches()[:3]):
        loss = engine(batch[:, :-1], batch[:, 1:])
        engine.backward(loss)
        norm = math.sqrt(sum(float(p.grad.double().pow(2).sum()) for p in engine.module.parameters()))
        engine.step()
        _, reported = StepFigures(loss, engine.get_global_grad_norm()).read()
        assert reported == pytest.approx(norm, rel=1e-5), step


class HostReads(TorchDispatchMode):
    """Counts where a tensor's value is read on the host (`.item()`, `float()`, `bool()`, `if tensor:`): on a GPU each
    waits until the device has run everything queued before it."""

    def __init__(self):
        super().__init__()
        self.sites: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func in (torch.ops.aten._local_scalar_dense.default, torch.ops.aten.is_nonzero.default):
            caller = [f for f in traceback.extract_stack()[:-1] if "torch" not in Path(f.filename).parts][-1]
            self.sites.append(f"{caller.filename}:{caller.lineno}")
        return func(*args, **(kwargs or {}))


def zero_stage_settings(stage: int) -> TrainingSettings:
    base = zero0_settings()
    return base.model_copy(update={"parallelism": base.parallelism.model_copy(update={"zero_stage": stage})})


@pytest.mark.parametrize("stage", [0, 1, 2])
def test_a_step_never_waits_for_the_device(world_of_one, monkeypatch, stage):
    """The host runs ahead of the GPU only if nothing in a step synchronizes the device, explicitly or by reading a
    value. DeepSpeed's throughput timer, on by default for an engine without its own data loader, synchronized twice a
    micro-batch (at forward and at step), from the third step on; Kiln measures throughput itself. At ZeRO-1 and 2 in
    bf16 DeepSpeed read its overflow flag (`.item()`) and checked the norm before clipping (`bool()`), 4 reads a step
    with this model's two parameter groups. Counted on CPU: the accelerator's synchronize that DeepSpeed's own calls
    go through, and the reads of a value, through the dispatcher, over a step as the trainer runs it (the step's figures
    broadcast for reading a step later, step.StepFigures). DeepSpeed's waits on its CUDA path only (overlap_comm's) are
    in test_a_compiled_zero12_model_has_nothing_to_overlap_and_never_synchronizes."""
    from deepspeed.accelerator import get_accelerator

    engine = engine_for(zero_stage_settings(stage))
    synchronized, reads = [], HostReads()
    monkeypatch.setattr(get_accelerator(), "synchronize", lambda *args, **kwargs: synchronized.append(args))
    for i, batch in enumerate(batches()):
        with reads if i >= 2 else contextlib.nullcontext():  # after the first steps, which set things up once
            loss = engine(batch[:, :-1], batch[:, 1:])
            engine.backward(loss)
            engine.step()
            StepFigures(loss, engine.get_global_grad_norm())
    assert synchronized == []
    assert reads.sites == []


def accumulating_nodes(loss: torch.Tensor) -> list[str]:
    """The autograd nodes that hand parameters their gradients (whose next functions include an AccumulateGrad, where
    DeepSpeed's ZeRO-1/2 gradient hooks fire)."""
    found, seen, stack = [], set(), [loss.grad_fn]
    while stack:
        node = stack.pop()
        if node is None or node in seen:
            continue
        seen.add(node)
        children = [child for child, _ in node.next_functions]
        if any(type(child).__name__ == "AccumulateGrad" for child in children):
            found.append(type(node).__name__)
        stack.extend(children)
    return found


class NoStream:
    """What DeepSpeed's CUDA code path asks of a stream, on CPU (which has none)."""

    def wait_stream(self, *args):
        pass

    def wait_event(self, *args):
        pass


@pytest.mark.parametrize("stage", [1, 2])
def test_a_compiled_zero12_model_has_nothing_to_overlap_and_never_synchronizes(world_of_one, monkeypatch, stage):
    """overlap_comm "auto" (layout.overlaps_communication) is off at ZeRO-1/2 with the whole model compiled, several
    GPUs' default: every parameter gets its gradient from the one compiled backward, so DeepSpeed's hooks, which
    reduce the gradients, all run after it and there is no backward left to overlap; with overlap_comm on, DeepSpeed
    would still synchronize the device at the end of each backward. That synchronize is on its CUDA path only
    (`resolves_data_dependency()` is true on CPU), taken here with the streams stubbed: once a step with overlap_comm,
    never without. Eager, the hooks fire as backward reaches each parameter, and overlap_comm stays on."""
    from deepspeed.accelerator import get_accelerator

    compiled = zero_stage_settings(stage).model_copy(update={"compile": True})
    eager = compiled.model_copy(update={"compile": False})
    assert deepspeed_config(compiled, "bf16", CFG)["zero_optimization"]["overlap_comm"] is False
    assert deepspeed_config(eager, "bf16", CFG)["zero_optimization"]["overlap_comm"] is True
    zero3 = compiled.model_copy(update={"parallelism": compiled.parallelism.model_copy(update={"zero_stage": 3})})
    assert deepspeed_config(zero3, "bf16", CFG)["zero_optimization"]["overlap_comm"] is True  # block by block

    batch = batches()[0]
    assert len(accumulating_nodes(engine_for(eager)(batch[:, :-1], batch[:, 1:]))) > 1

    synchronized = []
    monkeypatch.setattr(get_accelerator(), "resolves_data_dependency", lambda: False)
    monkeypatch.setattr(get_accelerator(), "current_stream", lambda *args: NoStream())
    monkeypatch.setattr(get_accelerator(), "synchronize", lambda *args: synchronized.append(args))
    monkeypatch.setattr(torch.Tensor, "record_stream", lambda tensor, stream: None)
    for overlap in (False, True):
        ds = deepspeed_config(compiled, "bf16", CFG)
        ds["zero_optimization"]["overlap_comm"] = overlap
        engine = build_engine(CFG, compiled, ds, ZERO0_STEPS, StabilityMonitor(compiled.monitor), compiled=True)
        engine.optimizer.reduction_stream = NoStream()
        synchronized.clear()
        for batch in batches()[:4]:
            loss = engine(batch[:, :-1], batch[:, 1:])
            assert accumulating_nodes(loss) == ["CompiledFunctionBackward"]
            engine.backward(loss)
            engine.step()
        assert len(synchronized) == (4 if overlap else 0), overlap


@pytest.mark.parametrize("stage", [1, 2, 3])
def test_the_layout_counts_the_reduce_buffers_deepspeed_allocates(world_of_one, stage):
    """layout.reduce_buffers, which the memory estimate multiplies by reduce_bucket_size, against the buffers a real
    engine holds (ZeRO-1/2 allocate theirs as backward starts handing out gradients, setup_buckets, and release them
    at its end; ZeRO-3 keeps its own), with overlap_comm off and on: ZeRO-1/2 double-buffer with it, ZeRO-3 never."""
    from training_jobs.layout import reduce_buffers

    t = zero_stage_settings(stage)
    for overlap in (False, True):
        ds = deepspeed_config(t, "bf16", CFG)
        ds["zero_optimization"]["overlap_comm"] = overlap
        engine = build_engine(CFG, t, ds, ZERO0_STEPS, StabilityMonitor(t.monitor))
        batch = batches()[0]
        optimizer, seen = engine.optimizer, []

        def held() -> list[torch.Tensor]:
            return [b for bucket in optimizer.ipg_buckets.values()
                    for b in (bucket.buffer if isinstance(bucket.buffer, list) else [bucket.buffer])]

        if stage < 3:
            allocate = optimizer.setup_buckets
            optimizer.setup_buckets = lambda: (allocate(), seen.append(held()))
        engine.backward(engine(batch[:, :-1], batch[:, 1:]))
        engine.step()
        buffers = seen[-1] if stage < 3 else held()
        assert {b.numel() for b in buffers} == {ds["zero_optimization"]["reduce_bucket_size"]}
        assert len(buffers) == reduce_buffers(stage, overlap), overlap


# the embedding's hook fires on the gradients of its output: its input, the token ids, has none (the count is unaffected)
@pytest.mark.filterwarnings("ignore:Full backward hook is firing:UserWarning")
@pytest.mark.parametrize("live, reuse, prefetch", [(0.5, 0, 0.5), (3, 0, 1), (0, 4, 0), (2, 2, 2), (None, None, None)])
def test_the_layout_bounds_the_weights_zero3_keeps_gathered(world_of_one, live, reuse, prefetch):
    """layout.zero3_gathered_params against the parameters a real ZeRO-3 engine holds whole (`param.data` full, not an
    empty placeholder) at any module's forward or backward, over steps after the first (which records the trace the
    prefetcher follows). Limits in blocks of this 8-block model: stage3_max_live_parameters, max_reuse_distance,
    prefetch_bucket_size; None: the shipped JSON's (DeepSpeed's defaults), under which the whole model stays
    gathered. The persistence threshold is 0 here: at the shipped 1e5 every weight of this small model would be
    persistent, never partitioned."""
    from kiln.planning.memory import zero3_gathered_params

    cfg = ModelConfig(vocab_size=256, d_model=64, n_layers=8, n_heads=4, n_kv_heads=2, ffn_hidden=176, max_seq_len=16)
    block = sum(p.numel() for p in Transformer(cfg).layers[0].parameters())
    t = zero_stage_settings(3)
    ds = deepspeed_config(t, "bf16", cfg)
    zero = ds["zero_optimization"]
    zero["stage3_param_persistence_threshold"] = 0
    if live is not None:
        zero.update(stage3_max_live_parameters=int(live * block), stage3_max_reuse_distance=int(reuse * block),
                    stage3_prefetch_bucket_size=int(prefetch * block))
    engine = build_engine(cfg, t, ds, ZERO0_STEPS, StabilityMonitor(t.monitor))
    whole = sum(p.ds_numel for p in engine.module.parameters())
    peak = []

    def note(*_) -> None:
        peak.append(sum(p.data.numel() for p in engine.module.parameters()))

    for module in engine.module.modules():
        module.register_forward_hook(note)
        module.register_full_backward_hook(note)
    gen = torch.Generator().manual_seed(0)
    for step in range(3):
        tokens = torch.randint(0, cfg.vocab_size, (2, cfg.max_seq_len + 1), generator=gen)
        peak.clear()
        engine.backward(engine(tokens[:, :-1], tokens[:, 1:]))
        engine.step()
    leaf = max(block, cfg.vocab_size * cfg.d_model)
    bound = zero3_gathered_params(whole, leaf, zero["stage3_max_live_parameters"], zero["stage3_max_reuse_distance"])
    assert max(peak) <= bound
    if live is None:
        assert max(peak) == whole


def test_zero1_clips_as_deepspeed_does_without_reading_the_norm(world_of_one):
    """setup.clip_without_reading against DeepSpeed's own unscale_and_clip_grads (the second implementation, with its
    bf16 overflow check on, as DeepSpeed ships it): the same weights, bit for bit, over steps that clip and steps that
    do not. A non-finite gradient still reaches the norm the stability monitor reads, which rolls the step back."""
    ours, theirs = engine_for(zero_stage_settings(1)), engine_for(zero_stage_settings(1))
    assert "unscale_and_clip_grads" in vars(ours.optimizer) and ours.optimizer.check_grad_overflow is False
    del theirs.optimizer.unscale_and_clip_grads  # DeepSpeed's method again
    theirs.optimizer.check_grad_overflow = True
    norms = []
    for batch in batches():
        for engine in (ours, theirs):
            engine.backward(engine(batch[:, :-1], batch[:, 1:]))
            engine.step()
        norms.append(float(ours.get_global_grad_norm()))
        assert norms[-1] == float(theirs.get_global_grad_norm())
    assert min(norms) < CLIP < max(norms)  # some steps clipped, some not
    for (name, a), b in zip(ours.module.named_parameters(), theirs.module.parameters()):
        assert torch.equal(a, b), name
    batch = batches()[0]
    ours.backward(ours(batch[:, :-1], batch[:, 1:]) * float("nan"))
    ours.step()
    assert not math.isfinite(float(ours.get_global_grad_norm()))


def test_a_zero0_checkpoint_resumes_exactly_and_exports_the_trained_weights(world_of_one, tmp_path):
    t, data = zero0_settings(), batches()

    def run(engine, steps) -> list[float]:
        losses = []
        for batch in steps:
            loss = engine(batch[:, :-1], batch[:, 1:])
            engine.backward(loss)
            engine.step()
            losses.append(loss.item())
        return losses

    first = engine_for(t)
    run(first, data[:3])
    ckpt = checkpoint.save(first, tmp_path, 3, {}, keep_last=1, manifest_meta={"model": CFG.to_dict()})
    after = run(first, data[3:])
    trained = {k: v.detach().clone() for k, v in first.module.state_dict().items()}

    assert not list(ckpt.glob("*optim_states.pt"))  # ZeRO-0: the module and AdamW in one model-states file
    resumed = engine_for(t)
    checkpoint.load(resumed, tmp_path, checkpoint.Found(3, ckpt))
    assert run(resumed, data[3:]) == after  # the same losses, bit for bit

    # the export reads the checkpoint's fp32 weights: those of step 3, under the module's own names
    exported = consolidate(ckpt)
    again = engine_for(t)
    run(again, data[:3])
    assert list(exported) == list(again.module.state_dict())
    for name, value in again.module.state_dict().items():
        assert torch.equal(exported[name], value), name
    assert not torch.equal(exported["layers.0.mlp.up_proj.weight"], trained["layers.0.mlp.up_proj.weight"])
