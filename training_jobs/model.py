"""A Llama-style decoder: RoPE, RMSNorm, SwiGLU, no biases, optional grouped-query attention and tied
embeddings. Small enough to read in one sitting.

RoPE uses the "rotate half" layout (dimension i pairs with i + head_dim/2), the layout of Hugging Face's
Llama, so q/k weights export to `LlamaForCausalLM` without a permutation (Meta's original checkpoints pair
neighbouring dimensions, which is why HF's converter permutes them).

Parameter names follow HF's Llama minus the `model.` prefix, so the export is a rename table, not a
re-interpretation.
"""

from __future__ import annotations

import contextlib
import functools
import importlib.util
import math
from dataclasses import asdict, dataclass, fields
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from kiln.planning.memory import LOSS_CHUNK_BYTES, loss_chunk_tokens


@dataclass(frozen=True)
class ModelConfig:
    vocab_size: int
    d_model: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_hidden: int
    max_seq_len: int
    rope_theta: float = 10_000.0
    norm_eps: float = 1e-5
    tied_embeddings: bool = True
    init_std: float = 0.02
    rope_scaling_factor: float = 1.0  # linear position interpolation (Chen et al. 2023): positions / factor

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_heads

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> ModelConfig:
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"model config has unknown keys {unknown}; it was written by other code "
                             f"(known keys: {sorted(known)})")
        return cls(**data)


def whole(param: nn.Parameter):
    """A context in which a parameter is whole: a ZeRO-3 partitioned one (built under deepspeed.zero.Init) is
    gathered, one at a time, and rank 0's changes are written back to every rank's partition."""
    if not hasattr(param, "ds_id"):
        return contextlib.nullcontext()
    import deepspeed

    return deepspeed.zero.GatheredParameters([param], modifier_rank=0)


IGNORE = -100  # a target left out of the loss (F.cross_entropy's default ignore_index)


def prefix_lm_mask(prefix_len: torch.Tensor, seq_len: int) -> torch.Tensor:
    """Which keys each query may attend to, (B, 1, T, T) bool: causal, plus every query inside row b's first
    prefix_len[b] positions sees the whole prefix (Raffel et al. 2020, "prefix LM"). prefix_len 0 is causal."""
    pos = torch.arange(seq_len, device=prefix_len.device)
    causal = pos[None, :] <= pos[:, None]  # [query, key]
    in_prefix = pos[None, :] < prefix_len[:, None]  # (B, T)
    both = in_prefix[:, :, None] & in_prefix[:, None, :]
    return (causal[None] | both)[:, None]


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Statistics in fp32 even when training in bf16 (as HF's LlamaRMSNorm).
        h = x.float()
        h = h * torch.rsqrt(h.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * h.to(x.dtype)


def rope_tables(seq_len: int, head_dim: int, theta: float, device: torch.device,
                scaling_factor: float = 1.0) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin, (seq_len, head_dim), in fp32. A scaling factor s > 1 is position interpolation: position p is
    rotated as p / s, so a longer context reuses the angles trained on (HF's rope_type "linear" divides inv_freq
    by s, the same product)."""
    inv_freq = 1.0 / theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64, device=device).float() / head_dim)
    angles = torch.outer(torch.arange(seq_len, device=device).float(), inv_freq / scaling_factor)
    angles = torch.cat((angles, angles), dim=-1)
    return angles.cos(), angles.sin()


class RopeTables:
    """rope_tables for one model, computed once per (seq_len, device, dtype) and kept, rounded to the dtype the
    activations have (what apply_rope did to them on every call). A plain dict, not a registered buffer:
    DeepSpeed casts buffers to bf16, and the angles must be computed in fp32 before the cos and sin are rounded."""

    def __init__(self, head_dim: int, theta: float, scaling_factor: float):
        self.head_dim, self.theta, self.scaling_factor = head_dim, theta, scaling_factor
        self.tables: dict[tuple[int, torch.device, torch.dtype], tuple[torch.Tensor, torch.Tensor]] = {}

    def __call__(self, seq_len: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        if torch.compiler.is_compiling():
            # In a compiled graph (setup.compile_model) the graph computes them, fused, in microseconds. Looking them
            # up here would make the dict's contents a guard, which fails once the first call fills it: a recompile.
            return self.make(seq_len, device, dtype)
        key = (seq_len, device, dtype)
        if key not in self.tables:
            with torch.inference_mode(False):  # tables made first under inference_mode must serve training too
                self.tables[key] = self.make(seq_len, device, dtype)
        return self.tables[key]

    def make(self, seq_len: int, device: torch.device, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        cos, sin = rope_tables(seq_len, self.head_dim, self.theta, device, self.scaling_factor)
        return cos.to(dtype), sin.to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate (B, H, T, head_dim) by position: pairs are (i, i + head_dim/2)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos.to(x.dtype) + rotated * sin.to(x.dtype)


class Attention(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.n_heads, self.n_kv_heads, self.head_dim = cfg.n_heads, cfg.n_kv_heads, cfg.head_dim
        self.q_proj = nn.Linear(cfg.d_model, cfg.n_heads * cfg.head_dim, bias=False)
        self.k_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.v_proj = nn.Linear(cfg.d_model, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.o_proj = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        B, T, _ = x.shape
        # Heads from the projections' widths: under tensor parallelism (AutoTP) each rank holds a slice of them.
        q = self.q_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Flash / memory-efficient kernels on GPU; each kv head serves n_heads / n_kv_heads query heads. An explicit
        # mask (prefix-LM) rules out the flash kernel: the memory-efficient one reads the (B, 1, T, T) mask.
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=mask is None,
                                           enable_gqa=self.n_kv_heads != self.n_heads)
        return self.o_proj(y.transpose(1, 2).reshape(B, T, -1))


class MLP(nn.Module):
    """SwiGLU (Shazeer 2020): down(silu(gate(x)) * up(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.gate_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.up_proj = nn.Linear(cfg.d_model, cfg.ffn_hidden, bias=False)
        self.down_proj = nn.Linear(cfg.ffn_hidden, cfg.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    """Pre-norm residual block: x + attn(norm(x)), then x + mlp(norm(x))."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        self.input_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.self_attn = Attention(cfg)
        self.post_attention_layernorm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.mlp = MLP(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor,
                mask: torch.Tensor | None = None) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x), cos, sin, mask)
        return x + self.mlp(self.post_attention_layernorm(x))


class Transformer(nn.Module):
    def __init__(self, cfg: ModelConfig, seed: int = 0, activation_checkpointing: bool = False):
        super().__init__()
        self.cfg = cfg
        self.activation_checkpointing = activation_checkpointing
        self.embed_tokens = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.layers = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.d_model, cfg.norm_eps)
        self.lm_head = LMHead(cfg.d_model, cfg.vocab_size)
        self.rope = RopeTables(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor)
        if cfg.tied_embeddings:
            self.lm_head.weight = self.embed_tokens.weight  # one Parameter, two uses
        self.reset_parameters(seed)

    @torch.no_grad()
    def reset_parameters(self, seed: int) -> None:
        """GPT-2 init from a private generator, so the same seed gives the same weights on every rank and
        in every process: N(0, init_std) for matrices and the embedding, the residual output projections
        scaled by 1/sqrt(2·n_layers) (one per residual branch), norm gains 1."""
        gen = torch.Generator().manual_seed(seed)
        residual_std = self.cfg.init_std / math.sqrt(2 * self.cfg.n_layers)
        for name, p in self.named_parameters():  # a tied matrix appears once
            with whole(p):
                if name.endswith("norm.weight"):
                    p.fill_(1.0)
                else:
                    std = residual_std if name.endswith(("o_proj.weight", "down_proj.weight")) else self.cfg.init_std
                    # Drawn in fp32 on the CPU from a Tensor method: under zero.Init, torch.randn & co. are patched
                    # to build on the accelerator in the training dtype, which the CPU generator cannot feed.
                    p.copy_(p.new_empty(p.shape, dtype=torch.float32, device="cpu").normal_(generator=gen) * std)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None,
                prefix_len: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (B, T, vocab), or the mean next-token cross-entropy when targets are given (targets of
        IGNORE are left out). `prefix_len` (B,): prefix-LM attention, bidirectional over each row's first
        prefix_len tokens (see prefix_lm_mask); None is causal."""
        T = tokens.shape[1]
        if T > self.cfg.max_seq_len:
            raise ValueError(f"sequence of {T} tokens is longer than max_seq_len {self.cfg.max_seq_len}")
        mask = None if prefix_len is None else prefix_lm_mask(prefix_len.to(tokens.device), T)
        x = self.embed_tokens(tokens)
        cos, sin = self.rope(T, x.device, x.dtype)
        for layer in self.layers:
            if self.activation_checkpointing and self.training:
                x = checkpoint(layer, x, cos, sin, mask, use_reentrant=False)
            else:
                x = layer(x, cos, sin, mask)
        return self.lm_head(self.norm(x), targets)

    def param_count(self, non_embedding: bool = False) -> int:
        """Unique parameters (a tied matrix counts once). `non_embedding` leaves out the embedding table and
        the output projection: Kaplan et al.'s N, the one scaling laws use."""
        return param_count(self.cfg, non_embedding)

    def flops_per_token(self, seq_len: int | None = None) -> float:
        return flops_per_token(self.cfg, seq_len or self.cfg.max_seq_len)




class LinearCrossEntropy(torch.autograd.Function):
    """mean cross-entropy of (hidden @ weight.T, targets), IGNORE targets left out: the value of
    F.cross_entropy(F.linear(hidden, weight).float(), targets), computed chunk by chunk over the tokens.

    The gradients are computed in the same pass (the design of Liger Kernel's fused linear cross-entropy, Hsu et
    al. 2024): for a chunk, d loss / d logits = (softmax - one_hot(target)) / n_valid, from which the chunk's
    rows of d/d hidden and its share of d/d weight follow; the logits are then dropped. Backward only scales the
    stored gradients by grad_output. The weight's gradient is summed in fp32 across chunks and rounded once."""

    @staticmethod
    def forward(ctx, hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                chunk_tokens: int) -> torch.Tensor:
        want_hidden, want_weight = ctx.needs_input_grad[:2]
        valid = targets != IGNORE
        n_valid = valid.sum().float()
        loss_sum = torch.zeros((), dtype=torch.float32, device=hidden.device)
        grad_hidden = torch.empty_like(hidden) if want_hidden else None
        grad_weight = torch.zeros(weight.shape, dtype=torch.float32, device=weight.device) if want_weight else None
        for start in range(0, hidden.shape[0], chunk_tokens):
            rows = slice(start, start + chunk_tokens)
            h, t, keep = hidden[rows], targets[rows].masked_fill(~valid[rows], 0), valid[rows]
            logits = (h @ weight.T).float()  # in the compute dtype, as nn.Linear would; then fp32 for the softmax
            logsumexp = logits.logsumexp(-1)
            loss_sum += ((logsumexp - logits.gather(1, t[:, None]).squeeze(1)) * keep).sum()
            if not (want_hidden or want_weight):
                continue
            grad = logits.sub_(logsumexp[:, None]).exp_()  # softmax, in place of the logits
            grad.scatter_add_(1, t[:, None], -keep[:, None].float())
            grad = grad.mul_((keep / n_valid)[:, None]).to(hidden.dtype)
            if want_hidden:
                grad_hidden[rows] = grad @ weight
            if want_weight:
                grad_weight += (grad.T @ h).float()
        ctx.save_for_backward(grad_hidden, grad_weight)
        ctx.weight_dtype = weight.dtype
        return loss_sum / n_valid

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):
        grad_hidden, grad_weight = ctx.saved_tensors
        if grad_hidden is not None:
            grad_hidden = grad_hidden * grad_output.to(grad_hidden.dtype)
        if grad_weight is not None:
            grad_weight = (grad_weight * grad_output).to(ctx.weight_dtype)
        return grad_hidden, grad_weight, None, None


# Looked up once, without importing it: inside a compiled forward, calling the cached liger_loss() makes Dynamo trace
# its import attempt (and warn that it ignores the cache) in every process that compiles on a GPU.
HAS_LIGER = importlib.util.find_spec("liger_kernel") is not None


@functools.cache
def liger_loss():
    """Liger Kernel's fused linear cross-entropy (Triton, CUDA only) when it is installed, else None."""
    try:
        from liger_kernel.transformers import LigerFusedLinearCrossEntropyLoss
    except ImportError:
        return None
    return LigerFusedLinearCrossEntropyLoss(ignore_index=IGNORE)


def linear_cross_entropy(hidden: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                         chunk_tokens: int | None = None) -> torch.Tensor:
    """lm_loss(F.linear(hidden, weight), targets) without the whole logits: hidden (..., d), targets (...).
    On CUDA with liger-kernel installed, its Triton kernel (the same numbers within bf16 rounding); otherwise
    LinearCrossEntropy, chunk_tokens tokens at a time (default: LOSS_CHUNK_BYTES of fp32 logits)."""
    hidden, targets = hidden.reshape(-1, hidden.shape[-1]), targets.reshape(-1)
    if hidden.is_cuda and chunk_tokens is None and HAS_LIGER and liger_loss() is not None:
        return liger_loss()(weight, hidden, targets)
    if not torch.is_grad_enabled():  # no gradients wanted: do not compute them
        hidden, weight = hidden.detach(), weight.detach()
    return LinearCrossEntropy.apply(hidden, weight, targets, chunk_tokens or loss_chunk_tokens(weight.shape[0]))


class LMHead(nn.Linear):
    """The output projection: logits, or, given targets, the loss straight from the hidden states
    (linear_cross_entropy). The loss is computed here, inside the module that owns the weight, because ZeRO-3
    gathers a partitioned weight only for its module's forward."""

    def __init__(self, d_model: int, vocab_size: int):
        super().__init__(d_model, vocab_size, bias=False)

    def forward(self, x: torch.Tensor, targets: torch.Tensor | None = None) -> torch.Tensor:
        return F.linear(x, self.weight) if targets is None else linear_cross_entropy(x, self.weight, targets)


def lm_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy in fp32, IGNORE targets left out, from whole logits: the plain form of the
    training loss, which linear_cross_entropy computes without them."""
    return F.cross_entropy(logits.float().view(-1, logits.shape[-1]), targets.reshape(-1), ignore_index=IGNORE)


def loss_sums_by_position(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Token losses summed over the batch per position, (T,) float64: validation's perplexity by position."""
    return F.cross_entropy(logits.float().transpose(1, 2), targets, reduction="none").double().sum(0)


def param_count(cfg: ModelConfig, non_embedding: bool = False) -> int:
    """Exact count from the shapes (the same as summing the module's parameters; no model needed)."""
    d, hd = cfg.d_model, cfg.head_dim
    attention = d * cfg.n_heads * hd * 2 + d * cfg.n_kv_heads * hd * 2  # q, o; k, v
    mlp = 3 * d * cfg.ffn_hidden
    per_layer = attention + mlp + 2 * d  # two norm gains
    body = cfg.n_layers * per_layer + d  # final norm
    if non_embedding:
        return body
    return body + cfg.vocab_size * d * (1 if cfg.tied_embeddings else 2)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs per token, forward + backward, as used for MFU:

        6 · (N_non_embedding + vocab·d_model)  +  12 · n_layers · d_model · seq_len

    The first term: 2 FLOPs per weight per token forward, 4 backward, for every weight in a matmul — the
    output projection included, the embedding lookup (no FLOPs) excluded (as torchtitan and nanoGPT).
    The second: attention's QK^T and AV products, PaLM (Chowdhery et al. 2022), App. B, without a
    causal-mask discount. Norms and softmax are left out, as there.
    """
    n = param_count(cfg, non_embedding=True) + cfg.vocab_size * cfg.d_model
    return 6.0 * n + 12.0 * cfg.n_layers * cfg.d_model * seq_len


__all__ = ["IGNORE", "LMHead", "LOSS_CHUNK_BYTES", "LinearCrossEntropy", "ModelConfig", "RopeTables", "Transformer",
           "apply_rope", "flops_per_token", "linear_cross_entropy", "lm_loss", "loss_sums_by_position", "param_count",
           "prefix_lm_mask", "rope_tables"]
