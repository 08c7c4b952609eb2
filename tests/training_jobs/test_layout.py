"""The layout chosen for speed (training_jobs/layout.py): the ZeRO stage and micro-batch from the memory estimate, on
hand-worked cases; what the user sets is kept; the DeepSpeed config that results."""

from __future__ import annotations

import json
import re
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from kiln.tokens.shard_format import read_shard_set
from training_jobs import checkpoint, setup
from training_jobs.layout import choose_layout, estimate
from training_jobs.model import ModelConfig, param_count
from training_jobs.settings import ModelSettings, RunConfig, TrainingSettings
from training_jobs.setup import Dist, deepspeed_config, resolve_layout

GIB = 2**30
# 125m (GPT-3 Small's shape) over a 32,000-token vocabulary, tied: 12 x (4·768² + 3·768·2048 + 2·768) + 768
# + 32,000·768 = 109,529,856 parameters.
GPT_SMALL = ModelConfig(**ModelSettings(preset="125m").architecture(32_000, 2048))
# Llama 2 7B's shape: 32 x (4·4096² + 3·4096·11,008 + 2·4096) + 4096 + 2·32,000·4096 = 6,738,415,616 parameters.
LLAMA_7B = ModelConfig(vocab_size=32_000, d_model=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_hidden=11_008,
                       max_seq_len=2048, tied_embeddings=False)
N_SMALL = 109_529_856
# Per sequence of 2048 tokens, 125m in bf16: activations 2048 x (12 layers x (16·768 + 6·768 + 4·768 + 8·2048
# = 36,352) + 8·768 for the final norm and lm_head input) = 905,969,664 B; loss 12 B x 2048 x 32,000 logits
# = 786,432,000 B.
SMALL_PER_SEQUENCE = 905_969_664 + 786_432_000
# ZeRO-1 over two ranks: 10 B per parameter (bf16 weights and gradients 2 + 2, the fp32 master and Adam m, v split
# in two: 12 / 2) and one reduce bucket of min(5e8, N) = N bf16 elements (compiled, so overlap_comm is off and
# DeepSpeed keeps one buffer): 10 N + 2 N.
SMALL_FIXED_ZERO1_DP2 = 10 * N_SMALL + 2 * N_SMALL
# ZeRO-0 in bf16 is fp32 weights under autocast: 16 B per parameter (4 + 4 + 8: weights, gradients, Adam m and v),
# no buckets; per sequence 4·768 more per layer (the two norms' outputs in fp32) and 2·768 for the final norm:
# 2048 x (12 x (36,352 + 3,072) + 8·768 + 2·768) = 984,612,864 B of activations, the same 786,432,000 B of loss.
SMALL_FIXED_ZERO0 = 16 * N_SMALL
SMALL_PER_SEQUENCE_AUTOCAST = 984_612_864 + 786_432_000


@pytest.mark.parametrize("dp, stage, total, reason", [
    # One rank: 16 x 109,529,856 + 8 x 1,771,044,864 = 15,920,836,608 B (14.8 GiB). ZeRO-0 reaches micro-batch 8 as
    # ZeRO-1 and 2 do, and with one data-parallel rank there is nothing for them to partition: ZeRO-0 under autocast.
    (1, 0, SMALL_FIXED_ZERO0 + 8 * SMALL_PER_SEQUENCE_AUTOCAST,
     "ZeRO-0: model states 1.6 GiB per rank fit .*fp32 weights under bf16 autocast; .*14.8 GiB"),
    # Two ranks: 12 x 109,529,856 + 8 x 1,692,401,664 = 14,853,571,584 B (13.8 GiB). ZeRO-0 would keep the whole
    # optimizer state on each rank and reduce only after backward: ZeRO-1, the lowest stage over more than one rank.
    (2, 1, SMALL_FIXED_ZERO1_DP2 + 8 * SMALL_PER_SEQUENCE, "ZeRO-1: model states 1.0 GiB per rank fit .*13.8 GiB"),
])
def test_a_model_that_fits_takes_the_lowest_stage_with_the_whole_batch_in_one_micro_batch(dp, stage, total, reason):
    """125m on an 80 GiB GPU at micro-batch 8, far inside 0.9 x 80 GiB = 72 GiB: no accumulation. Compiled, as
    training on CUDA is by default."""
    kwargs = dict(seq_len=2048, precision="bf16", dp=dp, reduce_bucket_size=N_SMALL, whole_logits=True, compiled=True)
    assert total == {1: 15_920_836_608, 2: 14_853_571_584}[dp]
    assert estimate(GPT_SMALL, micro_batch=8, zero_stage=stage, **kwargs).total == total
    layout = choose_layout(GPT_SMALL, device_memory=80 * GIB, sequences_per_rank=8, **kwargs)
    assert (layout.zero_stage, layout.micro_batch, layout.grad_accum) == (stage, 8, 1)
    assert layout.chosen == ("zero_stage", "micro_batch")
    assert re.match(reason, layout.reason), layout.reason


@pytest.mark.parametrize("autocast", [False, True])
def test_the_activation_count_covers_what_autograd_keeps_for_an_eager_block(autocast):
    """The second implementation: autograd's saved tensors. One of Kiln's blocks, eager, on CPU: in bf16 (ZeRO-1/2/3)
    or with fp32 weights under bf16 autocast (ZeRO-0), every distinct storage saved for backward (the weights and
    RoPE tables aside, which the estimate counts elsewhere or not at all), against the layout's count per token and
    layer, plus, under eager autocast, the block matrices' bf16 copies (2 B a parameter). The count is a bound: it
    also holds a reshaped copy of the attention output that CPU's (and flash's) output layout makes a view, and leaves
    out the per-row statistics (the norms' rsqrt, the softmax's logsumexp). It fails if the block comes to keep more
    than counted, or if the count drifts more than 6% above what is kept."""
    from training_jobs.layout import activation_bytes_per_token_layer, kiln_model
    from training_jobs.model import Block

    cfg = ModelConfig(vocab_size=512, d_model=128, n_layers=1, n_heads=4, n_kv_heads=2, ffn_hidden=352,
                      max_seq_len=256)
    torch.manual_seed(0)
    block = Block(cfg) if autocast else Block(cfg).bfloat16()
    batch, seq = 4, 256
    x = torch.randn(batch, seq, cfg.d_model, dtype=torch.float32 if autocast else torch.bfloat16, requires_grad=True)
    cos, sin = torch.randn(seq, cfg.head_dim).bfloat16(), torch.randn(seq, cfg.head_dim).bfloat16()
    counted_elsewhere = {t.untyped_storage().data_ptr() for t in [*block.parameters(), cos, sin]}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in counted_elsewhere:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            out = block(x, cos, sin)
    out.float().sum().backward()  # what was kept is what backward needs
    weight_copies = 2 * sum(p.numel() for p in block.parameters()) if autocast else 0
    counted = batch * seq * activation_bytes_per_token_layer(kiln_model(cfg), "bf16", autocast=autocast,
                                                                  compiled=False)
    assert sum(kept.values()) <= counted + weight_copies <= 1.06 * sum(kept.values())


def test_the_estimate_agrees_with_the_h200_measurement():
    """docs/bench/long_context_125m_h200.json: 125m at seq_len 2048, micro-batch 8, ZeRO-3 on one H200 with the old
    buckets (d² = 589,824 reduce) peaked at 14.046 GiB allocated (estimated 14.49: the whole model stays gathered,
    as DeepSpeed's defaults keep a model under a billion parameters)."""
    use = estimate(GPT_SMALL, seq_len=2048, micro_batch=8, precision="bf16", zero_stage=3, dp=1,
                   reduce_bucket_size=768 * 768, whole_logits=True)
    assert use.zero3_working_set == (N_SMALL + 32_000 * 768) * 2  # every weight gathered, the embedding's gradient
    assert use.total / GIB == pytest.approx(14.046, rel=0.05)


def test_the_micro_batch_is_the_largest_split_of_the_per_rank_batch_that_fits():
    """125m on a 24 GiB GPU at ZeRO-1 (16 N + 4 N of states and buckets over one rank) with grad_accum 4
    (per-rank batch 4 x 8 = 32): usable 0.9 x 24 GiB = 23,192,823,398 B;
    micro-batch 16 needs 2,190,597,120 + 16 x 1,692,401,664 = 29,269,023,744 B (too much), 8 needs 15,729,810,432 B:
    micro-batch 8 x grad_accum 4, the same 32 sequences per step."""
    layout = choose_layout(GPT_SMALL, seq_len=2048, precision="bf16", device_memory=24 * GIB, dp=1,
                           sequences_per_rank=32, reduce_bucket_size=N_SMALL, whole_logits=True,
                           zero_stage=1)
    assert (layout.zero_stage, layout.micro_batch, layout.grad_accum) == (1, 8, 4)
    assert "16 would need 27.3 GiB" in layout.reason and "grad_accum 4 keeps the global batch" in layout.reason


def test_the_chunked_loss_leaves_room_for_twice_the_micro_batch():
    """The same case with the trainer's loss, linear_cross_entropy in chunks of 268,435,456 / (4 x 32,000) = 2,097
    tokens. At micro-batch 16 (32,768 tokens) the loss holds 8 x 2,097 x 32,000 (a chunk's fp32 logits and their
    gradient) + 32,768 x 768 x 2 (the hidden states' gradient) + 4 x 32,000 x 768 (the weight's fp32 gradient)
    = 685,467,648 B, where whole logits took 12 x 32,768 x 32,000 = 12,582,912,000. With the states and buckets
    (2,190,597,120) and the activations (16 x 905,969,664) that is 17,371,579,392 B, inside the usable 23,192,823,398:
    micro-batch 16 x grad_accum 2 (32 needs 2,190,597,120 + 32 x 905,969,664 = 31,181,626,368 B before its loss)."""
    layout = choose_layout(GPT_SMALL, seq_len=2048, precision="bf16", device_memory=24 * GIB, dp=1,
                           sequences_per_rank=32, reduce_bucket_size=N_SMALL, zero_stage=1)
    assert (layout.zero_stage, layout.micro_batch, layout.grad_accum) == (1, 16, 2)
    assert layout.memory.loss == 685_467_648
    assert layout.memory.total == 2_190_597_120 + 16 * 905_969_664 + 685_467_648 == 17_371_579_392


def test_a_model_that_does_not_fit_otherwise_takes_zero3():
    """7B on 24 GiB GPUs, 8 ranks, activation checkpointing. ZeRO-2's model states alone, (2 + 14/8) x 6,738,415,616
    = 25,269,058,560 B, exceed the usable 23,192,823,398 B (ZeRO-1's, 5.5 B per parameter, more so). ZeRO-3:
    16/8 x 6,738,415,616 = 13,476,831,232 B of states + one reduce bucket of 5e8 x 2 B (ZeRO-3 allocates one,
    overlap_comm or not) + the gathered weights: DeepSpeed's defaults keep up to 1e9 parameters live, plus the block
    being fetched (6,476,271,616 / 32 = 202,383,488 parameters, larger than the 131,072,000 of the embedding), and
    that block's gradient: (1e9 + 2 x 202,383,488) x 2 B = 2,809,533,952 B; in all 17,286,365,184 B. Per sequence
    2048 x (32 x 8192 (each block's bf16 input) + 194,560 (one block recomputed) + 8·4096) + 786,432,000 (loss)
    = 1,788,870,656 B. Micro-batch 2: 20,864,106,496 B fits; 4: 24,441,847,808 B does not."""
    layout = choose_layout(LLAMA_7B, seq_len=2048, precision="bf16", device_memory=24 * GIB, dp=8,
                           sequences_per_rank=8, activation_checkpointing=True,
                           reduce_bucket_size=500_000_000, whole_logits=True)
    assert (layout.zero_stage, layout.micro_batch, layout.grad_accum) == (3, 2, 4)
    assert layout.memory.buckets == 500_000_000 * 2
    assert layout.memory.zero3_working_set == (1_000_000_000 + 2 * 202_383_488) * 2
    assert layout.memory.total == 17_286_365_184 + 2 * 1_788_870_656 == 20_864_106_496
    assert layout.reason.startswith("ZeRO-3: ZeRO-2 needs")


def test_a_zero3_layout_that_does_not_fit_names_the_limits_that_keep_weights_gathered():
    """7B over 8 ranks of 16 GiB at ZeRO-3 (usable 15,461,882,265 B): the states alone are 13,476,831,232 B and the
    gathered weights (1e9 + 2 x 202,383,488) x 2 B = 2,809,533,952 B more, so not even micro-batch 1 fits; the
    reason names DeepSpeed's two limits and what they keep, besides more GPUs and a shorter sequence.
    2,809,533,952 B is 2.6 GiB."""
    layout = choose_layout(LLAMA_7B, seq_len=2048, precision="bf16", device_memory=16 * GIB, dp=8,
                           sequences_per_rank=8, activation_checkpointing=True, reduce_bucket_size=500_000_000)
    assert (layout.zero_stage, layout.micro_batch) == (3, 1)
    assert "does not fit by this estimate" in layout.reason
    assert layout.reason.endswith(
        "expect out-of-memory: use more GPUs, a shorter seq_len or lower zero_optimization.stage3_max_live_parameters "
        "and stage3_max_reuse_distance (1e+09 and 1e+09) in the DeepSpeed JSON (training.deepspeed_config), within "
        "which ZeRO-3's working set is 2.6 GiB")  # activation checkpointing is on already: not suggested


@pytest.mark.parametrize("stage, compiled, json_overlap, buckets", [
    (1, False, None, 2),  # eager: overlap_comm "auto" is on, DeepSpeed double-buffers the reduction
    (1, True, None, 1),   # the whole model compiled: "auto" is off, one buffer
    (2, True, None, 1),
    (1, True, True, 2),   # a JSON that sets overlap_comm keeps it, and its second buffer is counted
    (3, False, None, 1),  # ZeRO-3: one buffer whatever overlap_comm
    (3, True, True, 1),
    (0, True, None, 0),   # ZeRO-0 reduces nothing (one rank)
])
def test_the_estimate_counts_the_reduce_buckets_deepspeed_allocates(stage, compiled, json_overlap, buckets):
    """125m over two ranks (one at ZeRO-0) with reduce_bucket_size N = 109,529,856 bf16 elements: N x 2 B per
    bucket, as DeepSpeed allocates them with contiguous_gradients (stage_1_and_2.py setup_buckets: a second buffer
    only with overlap_comm; stage3.py: one)."""
    layout = choose_layout(GPT_SMALL, seq_len=2048, precision="bf16", device_memory=80 * GIB, dp=1 if stage == 0 else 2,
                           sequences_per_rank=8, zero_stage=stage, reduce_bucket_size=N_SMALL, compiled=compiled,
                           overlap_comm=json_overlap)
    assert layout.memory.buckets == buckets * N_SMALL * 2


def test_what_the_user_sets_is_kept():
    common = dict(seq_len=2048, precision="bf16", device_memory=80 * GIB, dp=1, sequences_per_rank=8,
                  reduce_bucket_size=N_SMALL)
    both = choose_layout(GPT_SMALL, zero_stage=3, micro_batch=2, **common)
    assert (both.zero_stage, both.micro_batch, both.grad_accum, both.chosen) == (3, 2, 4, ())
    assert both.reason.startswith("ZeRO-3: training.parallelism.zero_stage")
    micro_only = choose_layout(GPT_SMALL, micro_batch=4, **common)
    assert (micro_only.zero_stage, micro_only.micro_batch, micro_only.chosen) == (0, 4, ("zero_stage",))
    with pytest.raises(ValueError, match="not a multiple of the micro-batch 3"):
        choose_layout(GPT_SMALL, micro_batch=3, **common)
    piped = choose_layout(GPT_SMALL, pp=2, **{**common, "sequences_per_rank": 32})
    # DeepSpeed's pipeline engine runs ZeRO-0/1 only; 4·pp = 8 micro-batches per step keep the bubble small: 32 / 8
    assert (piped.zero_stage, piped.micro_batch, piped.grad_accum) == (1, 4, 8)


def test_cpu_keeps_the_json_stage_and_micro_batch_8():
    layout = choose_layout(GPT_SMALL, seq_len=2048, precision="fp32", device_memory=None, dp=2, sequences_per_rank=24)
    assert (layout.zero_stage, layout.micro_batch, layout.grad_accum, layout.memory) == (None, 8, 3, None)
    assert "no accelerator" in layout.reason and layout.chosen == ("micro_batch",)


# ---------------------------------------------------------------------- through the run config

@pytest.fixture
def on_gpu(monkeypatch):
    """resolve_layout as on one GPU of `memory` bytes, without one: one rank, no process group (a world of one asks no
    one: test_a_world_of_one_agrees_without_a_collective)."""
    def device(memory: int = 80 * GIB) -> Dist:
        monkeypatch.setattr(torch.cuda, "get_device_properties", lambda _: SimpleNamespace(total_memory=memory))
        return Dist(0, 1, torch.device("cuda", 0))

    return device


def test_a_world_of_one_agrees_without_a_collective(monkeypatch):
    """setup.broadcast_object: a collective over NCCL waits for the device, which one rank need not do (the
    time-based checkpoint cadence asks at every logging interval)."""
    def collective(*args, **kwargs):
        raise AssertionError("broadcast_object_list called")

    monkeypatch.setattr(torch.distributed, "broadcast_object_list", collective)
    found = {"step": 12}
    assert setup.broadcast_object(Dist(0, 1, torch.device("cpu")), found) is found
    with pytest.raises(AssertionError, match="broadcast_object_list called"):  # two ranks do ask
        setup.broadcast_object(Dist(0, 2, torch.device("cpu")), found)


def run_config(token_dataset, tmp_path, **training) -> RunConfig:
    return TrainingSettings(precision="bf16", **training).to_run_config(
        dataset_dir=token_dataset.dir, tokenizer_sha256=token_dataset.tokenizer_sha256, output_dir=tmp_path / "out")


def resolved(run: RunConfig, dist: Dist):
    """The resolved settings, the layout, and the DeepSpeed config the trainer would build from them."""
    run, layout = resolve_layout(run, dist, dist)
    cfg = ModelConfig(**run.training.model.architecture(read_shard_set(Path(run.dataset_dir)).vocab_size, 32))
    return run.training, layout, deepspeed_config(run.training, "bf16", cfg)


def test_a_chosen_layout_fills_the_settings_and_the_deepspeed_config(token_dataset, tmp_path, on_gpu):
    t, layout, ds = resolved(run_config(token_dataset, tmp_path, seq_len=32, grad_accum=2), on_gpu())
    assert (t.micro_batch_size, t.grad_accum, t.parallelism.zero_stage) == (16, 1, 0)  # 8 x 2 in one micro-batch
    assert (ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]) == (16, 1)
    assert ds["zero_optimization"]["stage"] == 0 and not any(k.startswith("stage3_") for k in ds["zero_optimization"])
    # one rank in bf16: fp32 weights under torch autocast, not DeepSpeed's bf16 weights
    assert ds["bf16"]["enabled"] is False and ds["torch_autocast"] == {"enabled": True, "dtype": "bfloat16"}
    cfg = ModelConfig(**ModelSettings().architecture(token_dataset.vocab_size, 32))
    assert ds["zero_optimization"]["reduce_bucket_size"] == param_count(cfg)  # the tiny model is far below 5e8

    forced = run_config(token_dataset, tmp_path, seq_len=32, parallelism={"zero_stage": 3})
    t, layout, ds = resolved(forced, on_gpu())
    zero = ds["zero_optimization"]
    assert zero["stage"] == 3 and layout.chosen == ("micro_batch",)
    assert ds["bf16"]["enabled"] is True and "torch_autocast" not in ds
    buckets = ("reduce_bucket_size", "stage3_prefetch_bucket_size", "stage3_param_persistence_threshold")
    assert tuple(zero[k] for k in buckets) == (param_count(cfg), param_count(cfg), 100_000)  # 5e8, 5e7 capped; 1e5
    assert zero["overlap_comm"] is zero["contiguous_gradients"] is True


def test_user_settings_are_never_overridden(token_dataset, tmp_path, on_gpu):
    given = run_config(token_dataset, tmp_path, seq_len=32, micro_batch_size=2, grad_accum=3)
    t, layout, ds = resolved(given, on_gpu())
    assert (t.micro_batch_size, t.grad_accum, ds["train_micro_batch_size_per_gpu"]) == (2, 3, 2)
    own = tmp_path / "ds.json"  # a stage in the user's DeepSpeed JSON is theirs
    own.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    t, layout, ds = resolved(run_config(token_dataset, tmp_path, seq_len=32, deepspeed_config=str(own)), on_gpu())
    assert t.parallelism.zero_stage is None and layout.zero_stage == 2 and ds["zero_optimization"]["stage"] == 2
    assert layout.chosen == ("micro_batch",) and f"zero_optimization.stage of {own}" in layout.reason
    own.write_text(json.dumps({"train_micro_batch_size_per_gpu": 2}))  # and so is a micro-batch written there
    t, layout, ds = resolved(run_config(token_dataset, tmp_path, seq_len=32, deepspeed_config=str(own)), on_gpu())
    assert (t.micro_batch_size, ds["train_micro_batch_size_per_gpu"], layout.chosen) == (2, 2, ("zero_stage",))


def test_a_resumed_run_keeps_the_stage_of_its_checkpoint(token_dataset, tmp_path, on_gpu):
    run = run_config(token_dataset, tmp_path, seq_len=32)
    ckpt = run.checkpoint_dir() / checkpoint.tag_for(4)
    ckpt.mkdir(parents=True)
    (ckpt / "zero_pp_rank_0_mp_rank_00_model_states.pt").write_bytes(b"model")  # a checkpoint holds files
    checkpoint.write_manifest(ckpt, 4, {"layout": {"zero_stage": 3, "micro_batch": 8}})
    t, layout, ds = resolved(run, on_gpu())
    assert ds["zero_optimization"]["stage"] == 3 and "step_00000004 was saved with" in layout.reason
    checkpoint.write_manifest(ckpt, 4, {})  # written before layouts were chosen: with the shipped JSON's ZeRO-3
    t, layout, ds = resolved(run, on_gpu())
    assert ds["zero_optimization"]["stage"] == 3 and "written before layouts were chosen" in layout.reason
    fresh = run_config(token_dataset, tmp_path, seq_len=32, checkpoint={"resume": False})  # the checkpoint is ignored
    assert resolved(fresh, on_gpu())[0].parallelism.zero_stage == 0
