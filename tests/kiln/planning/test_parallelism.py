import pytest

from kiln.planning.hardware import lookup_gpu
from kiln.planning.memory import ModelShape, shape_for_params
from kiln.planning.parallelism import (
    Cluster,
    pipeline_bubble_fraction,
    recommend_parallelism,
    tensor_parallel_candidates,
)

GPT3 = ModelShape(n_layers=96, d_model=12288, n_heads=96, vocab_size=50257)


def plan_for(shape, gpu, nodes, **kwargs):
    cluster = Cluster(lookup_gpu(gpu), nodes=nodes, gpus_per_node=8)
    args = dict(seq_len=2048, global_batch_tokens=2**22, flops_per_token=6.0 * shape.n_params, mfu=0.4) | kwargs
    return recommend_parallelism(shape, cluster, **args)


def test_bubble():
    assert pipeline_bubble_fraction(1, 8) == 0.0
    assert pipeline_bubble_fraction(4, 12) == pytest.approx(3 / 15)  # (p-1)/(m+p-1)


def test_tensor_parallel_candidates():
    assert tensor_parallel_candidates(96, 8) == [1, 2, 4, 8]
    assert tensor_parallel_candidates(12, 8) == [1, 2, 4]
    assert tensor_parallel_candidates(96, 4) == [1, 2, 4]  # never across nodes


def test_small_model_is_pure_data_parallel():
    plan = plan_for(shape_for_params(1e9, 32000), "H100", nodes=1)
    assert (plan.tp, plan.pp, plan.dp, plan.zero_stage) == (1, 1, 8, 3) and plan.fits
    assert plan.global_batch_tokens == 2**22
    assert plan.micro_batch * plan.grad_accum * plan.dp * 2048 == plan.global_batch_tokens


def test_pipeline_only_when_nothing_else_fits():
    plan = plan_for(GPT3, "A100-80GB", nodes=8, zero_stage=2)
    assert plan.fits and plan.pp > 1 and plan.tp == 8
    assert plan.zero_stage == 1  # DeepSpeed pipelines run ZeRO-0/1 only
    assert plan.bubble_fraction == pytest.approx((plan.pp - 1) / (plan.grad_accum + plan.pp - 1))
    assert any("Pipeline parallelism" in line and "drops to 1" in line for line in plan.explanation)
    with_fewer_stages = plan_for(GPT3, "A100-80GB", nodes=8, zero_stage=1)
    assert with_fewer_stages.pp == plan.pp
    # By hand (Rajbhandari et al. 2020, Sec. 3-5, mixed-precision Adam K = 12): each GPU holds Ψ' = Ψ/(TP·PP) of
    # the model; ZeRO-1 keeps fp16 weights and gradients whole (2Ψ' + 2Ψ') and shards the optimizer (12Ψ'/DP).
    # GPT-3 (Brown et al. 2020: 175.0B), TP 8, PP 2, DP 4: Ψ' = 10.94e9, states = 43.75e9 + 32.81e9 = 76.56e9 bytes.
    assert (plan.tp, plan.pp, plan.dp) == (8, 2, 4) and plan.n_params == pytest.approx(175.0e9, rel=0.01)
    assert plan.memory.model_states == pytest.approx(76.56e9, rel=0.01)


def test_zero3_fits_gpt3_without_pipeline():
    plan = plan_for(GPT3, "A100-80GB", nodes=8, zero_stage=3)
    assert plan.fits and plan.pp == 1
    # By hand: ZeRO-3 shards all of (2 + 2 + 12)Ψ over the TP x DP = 64 GPUs: 16 x 175.0e9 / 64 = 43.75e9 bytes each,
    # which leaves room for activations in 80 GB.
    assert plan.tp * plan.dp == 64 and plan.memory.model_states == pytest.approx(43.75e9, rel=0.01)


def test_prefers_a_layout_whose_traffic_hides_behind_compute():
    plan = plan_for(shape_for_params(30e9, 32000), "H100", nodes=16, global_batch_tokens=2**21)
    assert plan.fits and plan.pp == 1
    assert plan.dp_comm_seconds_per_step <= plan.compute_seconds_per_step
    assert plan.tp > 1 and any("would not hide" in line for line in plan.explanation)


def test_zero2_reduces_gradients_in_every_micro_batch():
    """DeepSpeed's ZeRO-2 reduce-scatters the partitioned gradients in each backward, not once a step
    (stage_1_and_2.reduce_ready_partitions_and_remove_grads: `partition_gradients or
    is_gradient_accumulation_boundary()`), then all-gathers the weights after the step: Ψ per micro-batch + Ψ, which
    is the 2Ψ of plain data parallelism (ZeRO Sec. 7.2.1) only without accumulation. By hand: bf16 on the wire, ring
    collectives moving (dp - 1)/dp, the node's 450 GB/s per direction; ZeRO-1 reduces once a step: 2Ψ."""
    shape = shape_for_params(1e9, 32000)
    for stage, micro_batches_per_step in ((2, lambda plan: plan.grad_accum + 1), (1, lambda plan: 2)):
        plan = plan_for(shape, "H100", nodes=1, zero_stage=stage, global_batch_tokens=2**23)
        assert (plan.dp, plan.zero_stage) == (8, stage) and plan.grad_accum > 1
        payload = 2 * plan.n_params * 7 / 8
        assert plan.dp_comm_seconds_per_step == pytest.approx(payload * micro_batches_per_step(plan) / 450e9)


def test_nothing_fits_is_reported():
    plan = plan_for(shape_for_params(70e9, 32000), "A100-40GB", nodes=1)
    assert not plan.fits
    assert plan.explanation[0].startswith("Nothing fits")
