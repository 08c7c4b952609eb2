"""The fast model's parts against their plain versions: the chunked linear + cross-entropy against
F.cross_entropy on whole fp32 logits (value, gradients, memory), the cached RoPE tables against fresh ones,
fused AdamW against torch's unfused one."""

from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.utils._python_dispatch import TorchDispatchMode

import kiln.planning.memory
from training_jobs import model as model_module
from training_jobs.model import IGNORE, ModelConfig, Transformer, linear_cross_entropy, lm_loss, rope_tables
from training_jobs.settings import TrainingSettings
from training_jobs.setup import adamw

TINY = ModelConfig(vocab_size=128, d_model=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_hidden=96, max_seq_len=16)


def reference(hidden, weight, targets):
    """The plain loss: whole logits, copied to fp32."""
    return F.cross_entropy(F.linear(hidden, weight).float(), targets, ignore_index=IGNORE)


def loss_and_grads(loss_fn, hidden, weight, targets, scale=1.0):
    hidden, weight = hidden.detach().requires_grad_(), weight.detach().requires_grad_()
    loss = loss_fn(hidden, weight, targets)
    (loss * scale).backward()  # a grad_output other than 1, as DeepSpeed's 1/grad_accum gives
    return loss.detach(), hidden.grad, weight.grad


def problem(dtype, tokens=50, d=24, vocab=300, seed=0):
    gen = torch.Generator().manual_seed(seed)
    hidden = torch.randn(tokens, d, generator=gen).to(dtype)
    weight = (torch.randn(vocab, d, generator=gen) * 0.2).to(dtype)
    targets = torch.randint(0, vocab, (tokens,), generator=gen)
    targets[::4] = IGNORE  # every fourth token left out
    return hidden, weight, targets


@pytest.mark.parametrize("dtype, tol", [(torch.float32, 1e-6),
                                        # bf16: the two paths round the logits' gradient to bf16 at different
                                        # points (before vs after the 1/n_valid and grad_output scaling): a few
                                        # bf16 ulps (2^-8 relative) of the largest gradient
                                        (torch.bfloat16, 2e-2)])
def test_chunked_loss_equals_cross_entropy_on_whole_logits(dtype, tol):
    hidden, weight, targets = problem(dtype)
    chunked = loss_and_grads(lambda h, w, t: linear_cross_entropy(h, w, t, chunk_tokens=7), hidden, weight, targets,
                             scale=0.25)  # 7 does not divide 50
    plain = loss_and_grads(reference, hidden, weight, targets, scale=0.25)
    assert chunked[0].dtype == plain[0].dtype == torch.float32
    assert chunked[1].dtype == hidden.dtype and chunked[2].dtype == weight.dtype
    for ours, theirs in zip(chunked, plain):
        assert torch.allclose(ours.float(), theirs.float(), rtol=tol, atol=tol * theirs.float().abs().max().item())
    # the ignored tokens get no gradient and add nothing to the loss
    assert torch.all(chunked[1][::4] == 0)
    kept = targets != IGNORE
    assert torch.allclose(chunked[0], reference(hidden[kept].float(), weight.float(), targets[kept]),
                          rtol=tol, atol=tol)


def test_a_hand_worked_loss():
    """Two tokens, vocabulary 2, weight = identity: logits = hidden. Token 0: logits (0, 0), target 1 -> log 2.
    Token 1: logits (log 3, 0), target 0 -> -log(3/4) = log(4/3). Token 2 is ignored. Mean over the two."""
    hidden = torch.tensor([[0.0, 0.0], [torch.log(torch.tensor(3.0)), 0.0], [5.0, -5.0]])
    loss = linear_cross_entropy(hidden, torch.eye(2), torch.tensor([1, 0, IGNORE]), chunk_tokens=2)
    expected = (torch.log(torch.tensor(2.0)) + torch.log(torch.tensor(4 / 3))) / 2
    assert torch.allclose(loss, expected)


@pytest.mark.parametrize("tied", [True, False])
def test_the_models_loss_and_gradients_match_the_plain_loss(tied, monkeypatch):
    cfg = ModelConfig(**{**TINY.to_dict(), "tied_embeddings": tied})
    # 5 tokens a chunk, over 3 x 16 = 48 tokens: the last chunk is short
    monkeypatch.setattr(kiln.planning.memory, "LOSS_CHUNK_BYTES", 5 * 4 * cfg.vocab_size)
    x = torch.randint(0, cfg.vocab_size, (3, 16))
    y = torch.randint(0, cfg.vocab_size, (3, 16))
    y[:, :4] = IGNORE
    fused, plain = Transformer(cfg, seed=2), Transformer(cfg, seed=2)
    assert (fused.lm_head.weight is fused.embed_tokens.weight) == tied
    loss = fused(x, y)
    loss.backward()
    expected = lm_loss(plain(x), y)
    expected.backward()
    assert torch.allclose(loss, expected, rtol=1e-6)
    for (name, a), b in zip(fused.named_parameters(), plain.parameters()):
        assert torch.allclose(a.grad, b.grad, rtol=1e-5, atol=1e-7), name
    with torch.no_grad():  # without gradients (the export's probe): the same value
        assert torch.allclose(fused(x, y), expected, rtol=1e-6)
    assert list(fused.state_dict()) == list(plain.state_dict())  # names unchanged: lm_head.weight
    assert "lm_head.weight" in fused.state_dict()


class LargestWithLastDim(TorchDispatchMode):
    """Records the largest tensor any op makes (views of others left out) whose last dimension is `width`."""

    def __init__(self, width: int):
        super().__init__()
        self.width, self.largest = width, 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for t in out if isinstance(out, (tuple, list)) else [out]:
            if isinstance(t, torch.Tensor) and not func.is_view and t.dim() >= 1 and t.shape[-1] == self.width:
                self.largest = max(self.largest, t.numel())
        return out


def test_the_chunked_loss_never_holds_the_whole_logits():
    hidden, weight, targets = problem(torch.float32, tokens=64, d=16, vocab=1000)
    peaks = {}
    for name, fn in {"chunked": lambda h, w, t: linear_cross_entropy(h, w, t, chunk_tokens=8),
                     "plain": reference}.items():
        with LargestWithLastDim(1000) as mode:
            loss_and_grads(fn, hidden, weight, targets)
        peaks[name] = mode.largest
    assert peaks["chunked"] == 8 * 1000  # one chunk's logits
    assert peaks["plain"] == 64 * 1000  # the check sees whole logits when they are made


def test_the_default_chunk_keeps_fp32_logits_under_the_budget():
    for vocab in (500, 32_000, 128_256):
        tokens = model_module.loss_chunk_tokens(vocab)
        assert tokens * vocab * 4 <= model_module.LOSS_CHUNK_BYTES < (tokens + 1) * vocab * 4
    assert model_module.loss_chunk_tokens(32_000) == 2097


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_rope_tables_equal_fresh_ones(dtype):
    cfg = ModelConfig(**{**TINY.to_dict(), "rope_scaling_factor": 2.0})
    model = Transformer(cfg)
    cos, sin = model.rope(12, torch.device("cpu"), dtype)
    fresh_cos, fresh_sin = rope_tables(12, cfg.head_dim, cfg.rope_theta, torch.device("cpu"), 2.0)
    assert cos.dtype == dtype and torch.equal(cos, fresh_cos.to(dtype)) and torch.equal(sin, fresh_sin.to(dtype))
    again = model.rope(12, torch.device("cpu"), dtype)
    assert again[0] is cos and again[1] is sin  # computed once
    assert model.rope(8, torch.device("cpu"), dtype)[0].shape == (8, cfg.head_dim)
    assert "rope" not in " ".join(model.state_dict())  # not a buffer: nothing for DeepSpeed to cast


def test_tables_first_made_under_inference_mode_still_serve_training():
    model = Transformer(TINY)
    x = torch.randint(0, TINY.vocab_size, (1, 8))
    with torch.inference_mode():
        model(x)
    model(x, x).backward()  # an inference tensor would refuse to be saved for backward


def test_fused_adamw_steps_like_the_unfused_one():
    t = TrainingSettings()
    x = torch.randint(0, TINY.vocab_size, (2, 16))
    models, optimizers = [], []
    for device_type in ("cpu", "unknown"):  # fused; foreach (a device without the fused kernel)
        m = Transformer(TINY, seed=1)
        groups = [{"params": [p for p in m.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                  {"params": [p for p in m.parameters() if p.dim() < 2], "weight_decay": 0.0}]
        models.append(m)
        optimizers.append(adamw(groups, t, device_type))
    assert optimizers[0].defaults["fused"] and optimizers[1].defaults["foreach"]
    plain = copy.deepcopy(models[0])
    plain_opt = torch.optim.AdamW([{"params": [p for p in plain.parameters() if p.dim() >= 2], "weight_decay": 0.1},
                                   {"params": [p for p in plain.parameters() if p.dim() < 2], "weight_decay": 0.0}],
                                  lr=t.schedule.lr, betas=t.betas, eps=t.adam_eps, foreach=False)
    start = [p.detach().clone() for p in plain.parameters()]
    for _ in range(3):
        for m, opt in [*zip(models, optimizers), (plain, plain_opt)]:
            opt.zero_grad()
            m(x, x).backward()
            opt.step()
    for m in models:
        for (name, a), b, s in zip(m.named_parameters(), plain.parameters(), start):
            # 3 steps move a weight by up to 3·lr; the paths differ only in float rounding
            assert not torch.equal(b, s), name
            assert torch.allclose(a, b, rtol=0, atol=1e-6), name
