"""FLOP counts and their cost, checked against published training runs."""

import pytest

from kiln.planning.compute import (
    attention_flops_per_token,
    estimate_compute,
    flops_for_budget_usd,
    gpu_hours_for_flops,
    training_flops,
    training_flops_with_attention,
)


def test_gpt3_training_flops():
    # Brown et al. 2020, Table D.1: GPT-3 175B on 300B tokens took 3.14e23 FLOPs.
    assert training_flops(175e9, 300e9) == pytest.approx(3.14e23, rel=0.01)


def test_chinchilla_spends_gophers_budget():
    # Hoffmann et al. 2022: Chinchilla (70B, 1.4T tokens) used Gopher's 5.76e23 FLOPs.
    assert training_flops(70e9, 1.4e12) == pytest.approx(5.76e23, rel=0.03)


def test_attention_term_is_palms():
    # Chowdhery et al. 2022, App. B: 6N + 12·L·H·Q·T per token with H·Q = d_model.
    layers, d_model, seq = 96, 12288, 2048
    assert attention_flops_per_token(layers, d_model, seq) == 12 * layers * d_model * seq
    with_attention = training_flops_with_attention(175e9, 300e9, layers, d_model, seq)
    assert with_attention == pytest.approx(training_flops(175e9, 300e9) + 12 * layers * d_model * seq * 300e9)
    assert 0.02 < with_attention / training_flops(175e9, 300e9) - 1 < 0.04  # ~3% for GPT-3 at 2k context


def test_cost_and_days():
    estimate = estimate_compute(1e21, peak_flops=989e12, mfu=0.5, n_gpus=8, price_per_gpu_hour=2.0)
    hours = 1e21 / (989e12 * 0.5) / 3600
    assert estimate.gpu_hours == pytest.approx(hours)
    assert estimate.cost_usd == pytest.approx(2.0 * hours)
    assert estimate.wall_clock_days == pytest.approx(hours / 8 / 24)


def test_dollar_budget_round_trips():
    flops = flops_for_budget_usd(1e6, 2.5, 989e12, 0.4)
    # By hand: $1e6 / $2.5 = 4e5 GPU-hours = 1.44e9 GPU-seconds, x 989e12 FLOP/s x 0.4 = 5.697e23 FLOPs.
    assert flops == pytest.approx(5.697e23, rel=1e-3)
    estimate = estimate_compute(flops, peak_flops=989e12, mfu=0.4, n_gpus=256, price_per_gpu_hour=2.5)
    assert estimate.cost_usd == pytest.approx(1e6)


@pytest.mark.parametrize("kwargs", [dict(flops=-1.0), dict(peak_flops=0.0), dict(mfu=0.0)])
def test_non_positive_inputs_are_rejected(kwargs):
    args = dict(flops=1e21, peak_flops=989e12, mfu=0.4) | kwargs
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        gpu_hours_for_flops(**args)
