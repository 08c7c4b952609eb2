"""The weights a continued-pretraining run starts from (`training.base_checkpoint`).

A base is any of the three forms Kiln writes:

    <run>/checkpoints/step_00000300/    a DeepSpeed ZeRO checkpoint (verified against its manifest, consolidated)
    <checkpoint asset>/safetensors/     Kiln's safetensors export (model_config.json + model.safetensors)
    <checkpoint asset>/hf/              a Hugging Face Llama folder (config.json + model.safetensors)

(the checkpoint asset's folder itself, holding safetensors/, is read as its safetensors export). Each gives
the model config, an fp32 state dict under Kiln's parameter names, the sha256 of the tokenizer it was trained
with and, where recorded, the token-shard folder it was trained on (the default source of replay data).

`check_compatible` is the strict part: the new run's architecture must equal the base's in every field that
shapes or defines a weight, and the tokenizer must be the same file (token ids mean other strings otherwise).
Only the context settings (max_seq_len, rope_theta, rope scaling) may change: that is long-context extension.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from training_jobs import checkpoint
from training_jobs.model import ModelConfig, whole
from training_jobs.tokenizer_files import HF_FILE, SENTENCEPIECE_FILE

# Fields a continued run may change: the context length and how positions are encoded; init_std only seeds
# weights the base replaces.
CONTEXT_FIELDS = ("max_seq_len", "rope_theta", "rope_scaling_factor", "init_std")


class BaseCheckpointError(ValueError):
    """A base checkpoint that cannot be used; the message says why and what to change."""


@dataclass(frozen=True)
class BaseWeights:
    path: Path
    kind: str  # deepspeed | safetensors | hf
    cfg: ModelConfig
    state: dict[str, torch.Tensor]
    tokenizer_sha256: str | None
    trained_on: str | None  # the token_shards folder the base was trained on, where recorded
    sha256: str  # of its manifest (DeepSpeed) or weights file: the base's identity in lineage

    def describe(self) -> dict[str, Any]:
        """What lineage records about the base (no weights)."""
        return {"path": str(self.path), "kind": self.kind, "sha256": self.sha256, "model": self.cfg.to_dict(),
                "tokenizer_sha256": self.tokenizer_sha256, "trained_on": self.trained_on}


def _run_config_near(ckpt: Path) -> dict[str, Any]:
    """The run config of the run a DeepSpeed checkpoint belongs to (<output_dir>/checkpoints/<tag>), if there."""
    path = ckpt.parent.parent / "run_config.json"
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return {}


def from_hf_config(config: dict[str, Any]) -> ModelConfig:
    """The inverse of export.hf_config, for a LlamaForCausalLM config.json."""
    if config.get("model_type") != "llama":
        raise BaseCheckpointError(f"config.json has model_type {config.get('model_type')!r}; a base checkpoint in HF "
                                  f"form must be a Llama (Kiln's own HF export)")
    rope = config.get("rope_parameters") or config.get("rope_scaling") or {}
    factor = float(rope.get("factor", 1.0)) if rope.get("rope_type", rope.get("type")) == "linear" else 1.0
    return ModelConfig(vocab_size=config["vocab_size"], d_model=config["hidden_size"],
                       n_layers=config["num_hidden_layers"], n_heads=config["num_attention_heads"],
                       n_kv_heads=config.get("num_key_value_heads") or config["num_attention_heads"],
                       ffn_hidden=config["intermediate_size"], max_seq_len=config["max_position_embeddings"],
                       rope_theta=float(rope.get("rope_theta", config.get("rope_theta", 10_000.0))),
                       norm_eps=config["rms_norm_eps"], tied_embeddings=config.get("tie_word_embeddings", True),
                       init_std=config.get("initializer_range", 0.02), rope_scaling_factor=factor)


def _tokenizer_of_hf(folder: Path) -> str | None:
    """The sha256 of an HF folder's tokenizer: tokenizer.model (SentencePiece) or tokenizer.json (`tokenizers`)."""
    model = next((p for p in (folder / SENTENCEPIECE_FILE, folder / HF_FILE) if p.is_file()), None)
    return checkpoint.sha256_file(model) if model is not None else None


def load_base(path: str | Path, weights: bool = True) -> BaseWeights:
    """Read a base checkpoint in any of Kiln's forms (see the module docstring); `weights=False` reads only what
    describes it (the launching asset's view: no consolidation, no tensors). A folder whose description is not
    Kiln's (a config.json of another kind, a model_config.json without the model) is refused, saying so."""
    path = Path(path)
    try:
        return _load_base(path, weights)
    except BaseCheckpointError:
        raise
    except (json.JSONDecodeError, KeyError, TypeError, ValueError) as exc:
        raise BaseCheckpointError(f"training.base_checkpoint {path}: its description does not read as a Kiln or HF "
                                  f"Llama checkpoint ({type(exc).__name__}: {exc}); point it at a complete "
                                  f"checkpoint folder, a Kiln safetensors export or a Kiln HF export") from None


def _load_base(path: Path, weights: bool) -> BaseWeights:
    from safetensors.torch import load_file

    from training_jobs.export import CONFIG_FILE, MODEL_FILE, consolidate

    if (path / "safetensors" / CONFIG_FILE).is_file():  # the checkpoint asset's folder
        path = path / "safetensors"
    if not path.exists() or (path / checkpoint.MANIFEST).is_file() or checkpoint.TAG.match(path.name) \
            or checkpoint.checkpoints(path, complete_only=False):  # the last: a run's checkpoints folder
        problem = checkpoint.verify(path)
        if problem:
            raise BaseCheckpointError(f"base checkpoint {path} does not verify: {problem}; pick a complete checkpoint")
        manifest = checkpoint.read_manifest(path)
        run = _run_config_near(path)
        return BaseWeights(path, "deepspeed", ModelConfig.from_dict(manifest["model"]),
                           consolidate(path) if weights else {},
                           manifest.get("tokenizer_sha256") or run.get("tokenizer_sha256"),
                           manifest.get("dataset_dir") or run.get("dataset_dir"),
                           checkpoint.sha256_file(path / checkpoint.MANIFEST))
    if (path / CONFIG_FILE).is_file():
        meta = json.loads((path / CONFIG_FILE).read_text(encoding="utf-8"))
        cfg = ModelConfig.from_dict(meta["model"])
        state = _tie(load_file(str(path / MODEL_FILE)), cfg) if weights else {}
        tokenizer = meta.get("tokenizer_sha256") or _tokenizer_of_hf(path.parent / "hf")
        return BaseWeights(path, "safetensors", cfg, state, tokenizer, meta.get("dataset_dir"),
                           checkpoint.sha256_file(path / MODEL_FILE))
    if (path / "config.json").is_file():
        cfg = from_hf_config(json.loads((path / "config.json").read_text(encoding="utf-8")))
        state = _tie({k.removeprefix("model."): v.float() for k, v in load_file(str(path / MODEL_FILE)).items()},
                     cfg) if weights else {}
        return BaseWeights(path, "hf", cfg, state, _tokenizer_of_hf(path), None,
                           checkpoint.sha256_file(path / MODEL_FILE))
    raise BaseCheckpointError(f"training.base_checkpoint {path} is not a checkpoint: expected a DeepSpeed checkpoint "
                              f"folder (checkpoints/step_N with manifest.json), a Kiln safetensors export "
                              f"({CONFIG_FILE}) or an HF Llama folder (config.json)")


def _tie(state: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """Exports store a tied output projection once, as the embedding."""
    if cfg.tied_embeddings and "lm_head.weight" not in state and "embed_tokens.weight" in state:
        state = {**state, "lm_head.weight": state["embed_tokens.weight"]}
    return state


def check_compatible(base: BaseWeights, cfg: ModelConfig, tokenizer_sha256: str) -> None:
    """Refuse a base whose weights do not fit this run's model, or that was trained with another tokenizer."""
    if base.tokenizer_sha256 is None:
        raise BaseCheckpointError(
            f"base checkpoint {base.path} does not say which tokenizer it was trained with (no tokenizer.model or "
            f"tokenizer.json beside it, no record in its manifest), so continued pretraining cannot check that token ids mean the same "
            f"text; use the checkpoint asset's folder or a checkpoint written by Kiln")
    if base.tokenizer_sha256.lower() != tokenizer_sha256.lower():
        raise BaseCheckpointError(
            f"base checkpoint {base.path} was trained with tokenizer {base.tokenizer_sha256[:12]}…, but this run's "
            f"token shards were made with {tokenizer_sha256[:12]}…: the same ids would mean other text. Tokenize the "
            f"new data with the base's tokenizer (tokenizer.source: its tokenizer.model or tokenizer.json), or train from scratch (remove training.base_checkpoint)")
    ours, theirs = cfg.to_dict(), base.cfg.to_dict()
    differ = {k: (theirs[k], ours[k]) for k in ours if k not in CONTEXT_FIELDS and ours[k] != theirs[k]}
    if differ:
        listed = ", ".join(f"{k} {b} in the base vs {o} here" for k, (b, o) in differ.items())
        raise BaseCheckpointError(
            f"base checkpoint {base.path} has another architecture: {listed}. Set training.model to the base's shape "
            f"(preset and overrides) and keep the tokenizer's vocabulary; only seq_len, rope_theta and rope_scaling "
            f"may change in a continued run")


def load_into(model: torch.nn.Module, base: BaseWeights) -> None:
    """Copy the base's weights into a freshly built model, strictly: every parameter, with its shape."""
    # ds_shape: a ZeRO-3 partitioned parameter's whole shape (its .shape is its empty local placeholder).
    own = {name: tuple(getattr(p, "ds_shape", p.shape)) for name, p in model.named_parameters(remove_duplicate=False)}
    missing, extra = sorted(set(own) - set(base.state)), sorted(set(base.state) - set(own))
    wrong = [f"{k}: {tuple(base.state[k].shape)} vs {shape}" for k, shape in own.items()
             if k in base.state and tuple(base.state[k].shape) != shape]
    if missing or extra or wrong:
        raise BaseCheckpointError(f"base checkpoint {base.path} does not fit the model: missing {missing[:5]}, "
                                  f"unexpected {extra[:5]}, other shapes {wrong[:5]}")
    with torch.no_grad():
        for name, param in model.named_parameters():  # a tied matrix appears once
            with whole(param):
                param.copy_(base.state[name].to(param.dtype))


def base_model(path: str | Path):
    """The base as a plain model in eval mode (CPU, fp32): what the evaluation compares a continued run with."""
    from training_jobs.model import Transformer

    base = load_base(path)
    model = Transformer(base.cfg)
    load_into(model, base)
    return model.eval()


__all__ = ["BaseCheckpointError", "BaseWeights", "base_model", "check_compatible", "from_hf_config", "load_base",
           "load_into"]
