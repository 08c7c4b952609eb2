"""The model: shapes, parameter counts, the FLOPs formula, determinism, causality, activation checkpointing."""

from __future__ import annotations

import pytest
import torch

from training_jobs.model import IGNORE, ModelConfig, Transformer, flops_per_token, param_count, prefix_lm_mask
from training_jobs.settings import ModelSettings

TINY = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=4, ffn_hidden=96, max_seq_len=16)
VARIANTS = {
    "tied": TINY,
    "untied": ModelConfig(**{**TINY.to_dict(), "tied_embeddings": False}),
    "gqa": ModelConfig(**{**TINY.to_dict(), "n_kv_heads": 2}),
}


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_shapes_and_loss(name):
    model = Transformer(VARIANTS[name], seed=0)
    x = torch.randint(0, 128, (3, 16))
    assert model(x).shape == (3, 16, 128)
    loss = model(x, torch.randint(0, 128, (3, 16)))
    assert loss.shape == () and abs(loss.item() - torch.log(torch.tensor(128.0)).item()) < 0.3  # ~uniform at init


@pytest.mark.parametrize("name", sorted(VARIANTS))
def test_param_count_formula_matches_the_module(name):
    cfg = VARIANTS[name]
    model = Transformer(cfg)
    assert model.param_count() == param_count(cfg) == sum(p.numel() for p in model.parameters())
    tables = cfg.vocab_size * cfg.d_model * (1 if cfg.tied_embeddings else 2)
    assert model.param_count(non_embedding=True) == param_count(cfg) - tables
    assert (model.lm_head.weight is model.embed_tokens.weight) == cfg.tied_embeddings


def test_no_biases_anywhere():
    assert not [n for n, _ in Transformer(TINY).named_parameters() if n.endswith("bias")]


def test_flops_per_token_is_6n_plus_palm_attention():
    # tiny preset, vocabulary 500 -> 512: N_non_embedding = 2 layers x (4·64² + 3·64·192 + 2·64) + 64 = 106,816
    cfg = ModelConfig(**ModelSettings(preset="tiny").architecture(vocab_size=500, max_seq_len=32))
    assert param_count(cfg, non_embedding=True) == 106_816
    expected = 6 * (106_816 + 512 * 64) + 12 * 2 * 64 * 32  # output projection counted, embedding lookup not
    assert flops_per_token(cfg, 32) == expected == 886_656
    assert flops_per_token(cfg, 64) - flops_per_token(cfg, 32) == 12 * 2 * 64 * 32  # only attention grows with T


@pytest.mark.parametrize("preset, non_embedding_millions", [("small", 25.7), ("125m", 85.0), ("350m", 303.6),
                                                            ("1b", 973.1)])
def test_preset_sizes(preset, non_embedding_millions):
    cfg = ModelConfig(**ModelSettings(preset=preset).architecture(vocab_size=32_000, max_seq_len=2048))
    assert param_count(cfg, non_embedding=True) / 1e6 == pytest.approx(non_embedding_millions, abs=0.1)


def test_init_is_deterministic_from_the_seed():
    a, b, c = Transformer(TINY, seed=3), Transformer(TINY, seed=3), Transformer(TINY, seed=4)
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        assert torch.equal(pa, pb), name
        if not name.endswith("norm.weight"):
            assert not torch.equal(pa, pc), name
    torch.manual_seed(0)  # the global RNG plays no part
    assert torch.equal(Transformer(TINY, seed=3).embed_tokens.weight, a.embed_tokens.weight)


def test_residual_projections_get_the_scaled_init():
    cfg = ModelConfig(**{**TINY.to_dict(), "d_model": 256, "ffn_hidden": 768, "n_layers": 8})
    model = Transformer(cfg, seed=0)
    assert model.layers[0].self_attn.q_proj.weight.std().item() == pytest.approx(0.02, rel=0.05)
    assert model.layers[0].self_attn.o_proj.weight.std().item() == pytest.approx(0.02 / 4, rel=0.05)  # 1/sqrt(2·8)


def test_attention_is_causal():
    model = Transformer(VARIANTS["gqa"], seed=1).eval()
    x = torch.randint(0, 128, (1, 16))
    y = x.clone()
    y[0, 10:] = (y[0, 10:] + 1) % 128
    with torch.no_grad():
        a, b = model(x), model(y)
    assert torch.allclose(a[:, :10], b[:, :10], atol=1e-6)
    assert not torch.allclose(a[:, 10:], b[:, 10:])


def test_activation_checkpointing_changes_memory_not_math():
    x = torch.randint(0, 128, (2, 16))
    grads = []
    for ac in (False, True):
        model = Transformer(TINY, seed=5, activation_checkpointing=ac)
        loss = model(x, x)
        loss.backward()
        grads.append((loss.detach(), [p.grad.clone() for p in model.parameters()]))
    assert torch.equal(grads[0][0], grads[1][0])
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(grads[0][1], grads[1][1]))


def test_longer_than_max_seq_len_is_refused():
    with pytest.raises(ValueError, match="longer than max_seq_len 16"):
        Transformer(TINY)(torch.zeros(1, 17, dtype=torch.long))


def test_prefix_lm_mask_by_hand():
    """Rows are queries, columns keys; prefix of 3 in a sequence of 5 (1 = may attend)."""
    mask = prefix_lm_mask(torch.tensor([3, 0]), 5)
    assert mask.shape == (2, 1, 5, 5)
    assert mask[0, 0].int().tolist() == [[1, 1, 1, 0, 0],
                                         [1, 1, 1, 0, 0],
                                         [1, 1, 1, 0, 0],
                                         [1, 1, 1, 1, 0],
                                         [1, 1, 1, 1, 1]]
    assert torch.equal(mask[1, 0], torch.ones(5, 5).tril().bool())  # no prefix: causal


def test_prefix_lm_attention_sees_the_whole_prefix_and_only_the_past_after_it():
    model = Transformer(VARIANTS["gqa"], seed=1).eval()
    x = torch.randint(0, 128, (1, 16))
    prefix = torch.tensor([6])

    def changed_at(position: int) -> torch.Tensor:
        y = x.clone()
        y[0, position] = (y[0, position] + 1) % 128
        with torch.no_grad():
            a, b = model(x, prefix_len=prefix), model(y, prefix_len=prefix)
        return (a - b)[0].abs().amax(-1) > 1e-5  # which positions' logits moved

    assert changed_at(4)[:4].all()  # a prefix token sees later prefix tokens
    assert not changed_at(6)[:6].any()  # ... but not the suffix
    moved = changed_at(10)
    assert not moved[:10].any() and moved[10:].all()  # a suffix token sees no later token
    with torch.no_grad():  # a prefix of 0 is the causal model
        torch.testing.assert_close(model(x, prefix_len=torch.tensor([0])), model(x), atol=1e-5, rtol=0)


def test_ignored_targets_leave_the_loss():
    model = Transformer(TINY, seed=2).eval()
    x = torch.randint(0, 128, (1, 16))
    targets = x.roll(-1, 1)
    kept = targets.clone()
    kept[0, :10] = IGNORE
    with torch.no_grad():
        logits = model(x)
        expected = torch.nn.functional.cross_entropy(logits[0, 10:], targets[0, 10:])
        assert model(x, kept).item() == pytest.approx(expected.item(), rel=1e-6)
