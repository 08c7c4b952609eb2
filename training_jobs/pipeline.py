"""Pipeline parallelism: Kiln's Transformer as a DeepSpeed `PipelineModule` (training.parallelism.pp > 1).

    layer 0          the token embedding                   (tied: TiedLayerSpec "embed", shared with the head)
    layers 1..n      the Blocks (each keeps its RoPE tables by sequence length, as Transformer does)
    layer n+1        the final RMSNorm
    layer n+2        the output projection's weight        (tied: the embedding matrix, on the last stage); the layer
                     passes the hidden states through, and
    loss_fn          HeadLoss applies the projection: linear_cross_entropy, as Transformer's LMHead, so the
                     logits are never whole; targets of IGNORE left out

Stages are balanced over the Blocks (partition_method "type:BlockPipe"). The model starts from exactly the
weights of `Transformer(cfg, seed)` (built on the CPU, each stage copies its layers' tensors, the rest is freed),
so a pipeline run and a data-parallel run with the same seed start equal. Every layer's parameters keep their
Transformer names below the layer, so a checkpoint's `layer_XX-model_states.pt` files map back to the
Transformer's state dict with a prefix per layer (`transformer_state`).

DeepSpeed's pipeline engine trains with `engine.train_batch(iterator)` (grad_accum micro-batches per call) and
runs ZeRO stage 0 or 1 only; the first stage reads the inputs, the last the targets. Only the causal LM
objective is wired (prefix-LM masks and span corruption would have to travel between stages).
"""

from __future__ import annotations

from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from training_jobs.base import BaseWeights, load_into
from training_jobs.model import (
    Block,
    ModelConfig,
    RMSNorm,
    RopeTables,
    Transformer,
    linear_cross_entropy,
    loss_sums_by_position,
)

LAYER_FILE = "layer_{:02d}-model_states.pt"  # DeepSpeed's name for a layer's weights (one pipeline, no tp)


class Weights(dict):
    """The Transformer's initial tensors by name, shared by the layer specs. DeepSpeed prints every spec with its
    arguments: a short repr, not the tensors."""

    def __repr__(self) -> str:
        return f"<{len(self)} tensors>"


class Embedding(nn.Embedding):
    """Layer 0 (and, tied, the head's matrix): tokens -> hidden states."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor]):
        super().__init__(cfg.vocab_size, cfg.d_model)
        with torch.no_grad():
            self.weight.copy_(weights["embed_tokens.weight"])


def tied_head(embedding: Embedding, x: torch.Tensor) -> torch.Tensor:
    return x  # the projection by embedding.weight is HeadLoss's


class BlockPipe(Block):
    """A Block that takes only the hidden states: the RoPE tables are its own (computed once per shape, and nothing
    but one tensor then crosses a stage boundary)."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor], index: int):
        super().__init__(cfg)
        self.rope = RopeTables(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling_factor)
        prefix = f"layers.{index}."
        self.load_state_dict({k[len(prefix):]: v for k, v in weights.items() if k.startswith(prefix)})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x, *self.rope(x.shape[1], x.device, x.dtype))


class Norm(RMSNorm):
    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor]):
        super().__init__(cfg.d_model, cfg.norm_eps)
        self.load_state_dict({"weight": weights["norm.weight"]})


class Head(nn.Linear):
    """The untied output projection's weight; HeadLoss applies it."""

    def __init__(self, cfg: ModelConfig, weights: dict[str, torch.Tensor]):
        super().__init__(cfg.d_model, cfg.vocab_size, bias=False)
        self.load_state_dict({"weight": weights["lm_head.weight"]})

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x


class HeadLoss:
    """The pipeline's loss_fn, on the last stage: the output projection and the loss in one, from the final hidden
    states (DeepSpeed hands a loss_fn the last layer's output and the targets, nothing else, so the head's layer
    passes the hidden states through). Training: linear_cross_entropy. Validation (per_position): the logits'
    token losses summed by position. The weight is whole here: the pipeline engine runs ZeRO stage 0 or 1."""

    def __init__(self, weight: nn.Parameter | None, per_position: bool = False):
        self.weight, self.per_position = weight, per_position

    def __call__(self, hidden: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        if self.per_position:
            return loss_sums_by_position(F.linear(hidden, self.weight), targets)
        return linear_cross_entropy(hidden, self.weight, targets)


def layer_prefixes(cfg: ModelConfig) -> dict[int, str]:
    """Pipeline layer index -> the Transformer name prefix of its parameters (the tied head has none)."""
    prefixes = {0: "embed_tokens.", **{i + 1: f"layers.{i}." for i in range(cfg.n_layers)},
                cfg.n_layers + 1: "norm."}
    if not cfg.tied_embeddings:
        prefixes[cfg.n_layers + 2] = "lm_head."
    return prefixes


def pipeline_module(cfg: ModelConfig, seed: int, stages: int, activation_checkpointing: bool,
                    base: BaseWeights | None = None):
    """The PipelineModule of a run, starting from Transformer(cfg, seed)'s weights (or the base's)."""
    from deepspeed.pipe import LayerSpec, PipelineModule, TiedLayerSpec

    model = Transformer(cfg, seed=seed)
    if base is not None:
        load_into(model, base)
    weights = Weights(model.state_dict())
    del model
    if cfg.tied_embeddings:
        first = TiedLayerSpec("embed", Embedding, cfg, weights, tied_weight_attr=["weight"])
        last = TiedLayerSpec("embed", Embedding, cfg, weights, forward_fn=tied_head, tied_weight_attr=["weight"])
    else:
        first, last = LayerSpec(Embedding, cfg, weights), LayerSpec(Head, cfg, weights)
    specs = [first, *(LayerSpec(BlockPipe, cfg, weights, i) for i in range(cfg.n_layers)),
             LayerSpec(Norm, cfg, weights), last]
    module = PipelineModule(specs, num_stages=stages, partition_method="type:BlockPipe",
                            activation_checkpoint_interval=1 if activation_checkpointing else 0,
                            checkpointable_layers=["BlockPipe"])  # never the embedding: its input needs no grad
    weights.clear()  # the specs keep a reference; the other stages' tensors are not needed on this rank
    module.loss_fn = HeadLoss(head_weight(module, cfg))
    return module


def head_weight(module, cfg: ModelConfig) -> nn.Parameter | None:
    """The output projection's weight where this stage holds the head (the last), else None."""
    last = module.forward_funcs[-1] if module.forward_funcs else None
    if cfg.tied_embeddings:
        return module.tied_modules["embed"].weight if getattr(last, "func", None) is tied_head else None
    return last.weight if isinstance(last, Head) else None


# ------------------------------------------------------------------------------------------ the loop

@torch.no_grad()
def position_sums(engine, batches: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor | None:
    """Per-position sums of the token losses over the batches, (T,) float64 on the last stage, None elsewhere."""
    module = engine.module
    train_loss = module.loss_fn
    module.loss_fn = HeadLoss(train_loss.weight, per_position=True)
    try:
        engine.reset_activation_shape()  # the batches may be shaped unlike the training ones
        engine.total_loss = None  # eval_batch adds to what train_batch left
        out = engine.eval_batch(iter(batches), reduce_output=None, bcast_loss=False, num_micro_batches=len(batches))
    finally:
        module.loss_fn = train_loss
        engine.reset_activation_shape()
        engine.train()
    return torch.stack(out).sum(0) if engine.is_last_stage() else None


def probe_loss(engine, x: torch.Tensor, y: torch.Tensor) -> float:
    """The mean loss of one batch, on every rank. Every replica's last stage computes the same value and the others
    0: a MAX all-reduce hands it to all ranks unchanged (losses are >= 0)."""
    sums = position_sums(engine, [(x, y)])
    loss = torch.zeros((), dtype=torch.float64, device=engine.device)
    if sums is not None:
        loss += sums.sum() / y.numel()
    torch.distributed.all_reduce(loss, op=torch.distributed.ReduceOp.MAX)
    return loss.item()


# ------------------------------------------------------------------------------------------ export

def is_pipeline_checkpoint(ckpt: Path) -> bool:
    return (Path(ckpt) / LAYER_FILE.format(0)).is_file()


def transformer_state(ckpt: Path, cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """A pipeline checkpoint's weights under the Transformer's names, in fp32, read from its per-layer files
    (the module's weights: in a bf16 run they are the bf16 ones, not the optimizer's fp32 masters)."""
    state = {}
    for index, prefix in layer_prefixes(cfg).items():
        path = Path(ckpt) / LAYER_FILE.format(index)
        if not path.is_file():
            raise FileNotFoundError(f"{ckpt} is a pipeline checkpoint without {path.name}: written by another "
                                    f"model shape (n_layers {cfg.n_layers}, tied {cfg.tied_embeddings})?")
        for name, tensor in torch.load(path, map_location="cpu", weights_only=True).items():
            state[prefix + name] = tensor.float()
    if cfg.tied_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    return state


__all__ = ["BlockPipe", "HeadLoss", "is_pipeline_checkpoint", "layer_prefixes", "pipeline_module", "position_sums",
           "probe_loss", "transformer_state"]
