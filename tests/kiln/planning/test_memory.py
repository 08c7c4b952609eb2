"""Model-state memory against the ZeRO paper; activations against Korthikanti et al. 2022."""

import pytest

from kiln.planning.memory import (
    ModelShape,
    activation_bytes_per_layer,
    estimate_memory,
    model_state_bytes_per_param,
    shape_for_params,
)

GB = 1e9  # the ZeRO paper's unit


def test_sixteen_bytes_per_parameter_with_adam_in_mixed_precision():
    assert sum(model_state_bytes_per_param(0, 1)) == 16  # 2 (bf16 weights) + 2 (grads) + 12 (fp32 Adam)


@pytest.mark.parametrize(
    "stage, per_param, paper_gb",
    [(0, 16.0, 120.0), (1, 4 + 12 / 64, 31.4), (2, 2 + 14 / 64, 16.6), (3, 16 / 64, 1.9)],
)
def test_zero_paper_7_5b_on_64_gpus(stage, per_param, paper_gb):
    # Rajbhandari et al. 2020, Fig. 1: Ψ = 7.5B, K = 12, Nd = 64.
    assert sum(model_state_bytes_per_param(stage, 64)) == pytest.approx(per_param)
    assert round(7.5e9 * per_param / GB, 1) == paper_gb


def test_estimate_memory_shards_model_states():
    shape = ModelShape(n_layers=32, d_model=4096, n_heads=32, vocab_size=32000)
    # Bytes per parameter over dp = 16 (the ZeRO paper's accounting, K = 12, by hand): stage 0 keeps all 2 + 2 + 12;
    # stage 1 shards the optimizer (2 + 2 + 12/16), stage 2 also the gradients (2 + 14/16), stage 3 everything.
    by_hand = {0: 16.0, 1: 4.75, 2: 2.875, 3: 1.0}
    for stage in (0, 1, 2, 3):
        memory = estimate_memory(shape, seq_len=2048, micro_batch=1, dp=16, tp=2, pp=1, zero_stage=stage)
        assert memory.model_states == pytest.approx(shape.n_params / 2 * by_hand[stage])  # tp = 2 halves them
        assert (memory.zero3_working_set > 0) == (stage == 3)


def test_zero3_keeps_deepspeeds_live_parameters_gathered():
    """ZeRO-3's working set with DeepSpeed's defaults (stage3_max_live_parameters and stage3_max_reuse_distance 1e9,
    as Kiln's JSON keeps them), by hand: Llama 2 7B's shape (GELU width 4d here) over 8 GPUs; the largest layer is
    the embedding, 32,000 x 4096 = 131,072,000 parameters. The prefetcher keeps up to 1e9 parameters gathered, plus
    the layer being fetched, in bf16: (1e9 + 131,072,000) x 2 B, and that layer's gradient, 131,072,000 x 2 B:
    2,524,288,000 B, where DeepSpeed's own estimator counts only the layer, 4 x 131,072,000 = 524,288,000 B. A model
    under 1e9 parameters stays gathered whole: 125m's shape, its parameters and the embedding's gradient."""
    shape = ModelShape(n_layers=32, d_model=4096, n_heads=32, vocab_size=32000)
    memory = estimate_memory(shape, seq_len=2048, micro_batch=1, dp=8, zero_stage=3)
    assert memory.zero3_working_set == 2 * (1_000_000_000 + 131_072_000) + 2 * 131_072_000 == 2_524_288_000
    small = ModelShape(n_layers=12, d_model=768, n_heads=12, vocab_size=32000)
    assert estimate_memory(small, seq_len=2048, micro_batch=1, dp=8, zero_stage=3).zero3_working_set == (
        2 * small.n_params + 2 * 32000 * 768)


def test_cpu_offload_moves_optimizer_and_parameters():
    shape = ModelShape(n_layers=32, d_model=4096, n_heads=32, vocab_size=32000)
    base = dict(seq_len=2048, micro_batch=1, dp=8, zero_stage=3)
    plain = estimate_memory(shape, **base)
    optimizer_off = estimate_memory(shape, **base, offload_optimizer=True)
    both_off = estimate_memory(shape, **base, offload_optimizer=True, offload_params=True)
    assert optimizer_off.optimizer == 0 and optimizer_off.cpu_offloaded == pytest.approx(plain.optimizer)
    assert both_off.weights == 0 and both_off.cpu_offloaded == pytest.approx(plain.optimizer + plain.weights)
    assert both_off.total < optimizer_off.total < plain.total
    with pytest.raises(ValueError, match="ZeRO-3"):
        estimate_memory(shape, **(base | {"zero_stage": 2}), offload_params=True)


def test_korthikanti_activations_gpt3():
    # GPT-3 175B: s=2048, h=12288, a=96 → 5as/h = 80 (Korthikanti et al. 2022, Table 2 / Sec. 4).
    s, b, h, a, t = 2048, 1, 12288, 96, 8
    assert activation_bytes_per_layer(s, b, h, a) == s * b * h * (34 + 80)
    assert activation_bytes_per_layer(s, b, h, a, tp=t, sequence_parallel=False) == s * b * h * (10 + 24 / t + 80 / t)
    assert activation_bytes_per_layer(s, b, h, a, tp=t) == pytest.approx(s * b * h * (34 + 80) / t)
    assert activation_bytes_per_layer(s, b, h, a, tp=t, recompute="selective") == pytest.approx(34 * s * b * h / t)
    assert activation_bytes_per_layer(s, b, h, a, recompute="full") == 2 * s * b * h


def test_pipeline_first_stage_holds_the_whole_models_worth():
    shape = ModelShape(n_layers=32, d_model=4096, n_heads=32, vocab_size=32000)
    common = dict(seq_len=2048, micro_batch=1, dp=1, zero_stage=1)
    one_stage = estimate_memory(shape, pp=1, **common)
    four_stages = estimate_memory(shape, pp=4, microbatches_in_flight=16, **common)
    assert four_stages.activations == pytest.approx(one_stage.activations)
    assert estimate_memory(shape, pp=4, microbatches_in_flight=2, **common).activations == pytest.approx(
        one_stage.activations / 2
    )


def test_parameter_count_of_gpt3():
    gpt3 = ModelShape(n_layers=96, d_model=12288, n_heads=96, vocab_size=50257, tie_embeddings=True)
    assert gpt3.n_params == pytest.approx(175e9, rel=0.01)


@pytest.mark.parametrize("n_params", [1e8, 1e9, 7e9, 7e10, 1e12])
def test_shape_for_params(n_params):
    shape = shape_for_params(n_params, vocab_size=32000)
    assert shape.n_params == pytest.approx(n_params, rel=0.05)
    if shape.n_heads >= 16:
        assert shape.n_heads % 8 == 0
