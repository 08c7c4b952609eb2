"""Exports of a DeepSpeed ZeRO checkpoint: one consolidated safetensors file, and Hugging Face Llama format.

    export/safetensors/               Kiln's own: reload with `load_model(dir)`
      model.safetensors               fp32 weights under Kiln's parameter names
      model_config.json               training_jobs.model.ModelConfig
    export/hf/                        `transformers.AutoModelForCausalLM.from_pretrained(dir)`
      config.json                     LlamaConfig fields, architectures ["LlamaForCausalLM"]
      model.safetensors               HF parameter names ("model.layers.0.self_attn.q_proj.weight", ...)
      generation_config.json
      tokenizer.model                 the sentencepiece model, copied (its sha256 is the tokenizer's identity)
      tokenizer.json                  HF's fast tokenizer built from it (sentencepiece_as_hf), or a brought
                                      `tokenizers` file, copied
      tokenizer_config.json, special_tokens_map.json   (PreTrainedTokenizerFast, split_special_tokens:
                                      `AutoTokenizer.from_pretrained(dir)` gives Kiln's ids; docs/training.md
                                      says where they can still differ)
      kiln_tokenizer.json             Kiln's tokenizer card (HF reserves the name tokenizer.json)

Consolidation uses DeepSpeed's `get_fp32_state_dict_from_zero_checkpoint` (no huggingface_hub needed),
with its reads forced to `torch.load(weights_only=True)` (checkpoint.weights_only_loads). A pipeline-parallel
checkpoint (layer_XX-model_states.pt files, one per pipeline layer) is read layer by layer instead and renamed
to the Transformer's names (training_jobs.pipeline.transformer_state); a tensor-parallel one is read from the
whole weights checkpoint.save adds to it (checkpoint.CONSOLIDATED); a ZeRO-0 one (no optimizer-states files: the
module's own fp32 weights, in fp32 or under bf16 autocast) from DeepSpeed's model-states file. Every layout
exports the same names and shapes. Everything written here is pickle-free (safetensors and JSON).

No permutation of q/k is needed: the model already applies RoPE in HF's rotate-half layout.

Command line: python -m training_jobs.export CHECKPOINT_DIR/step_00000100 OUT_DIR [--tokenizer-dir DIR]
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from training_jobs.checkpoint import (CONSOLIDATED, read_manifest, verify, weights_only_loads,
                                      write_path_atomically)
from training_jobs.model import ModelConfig, Transformer
from training_jobs.tokenizer_files import CARD_FILE, EXPORT_CARD_FILE, HF_FILE, SENTENCEPIECE_FILE, model_file

MODEL_FILE, CONFIG_FILE = "model.safetensors", "model_config.json"
ZERO0_MODEL_STATES = "mp_rank_00_model_states.pt"  # DeepSpeed's name for the whole module and optimizer at ZeRO-0
# Kiln tokenizers reserve these ids (kiln.tokens.tokenizer.SPECIAL_TOKENS); used when no tokenizer card is at hand.
DEFAULT_SPECIALS = {"pad": ("<pad>", 0), "bos": ("<s>", 1), "eos": ("<|endoftext|>", 2), "unk": ("<unk>", 3)}
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def consolidate(ckpt: Path, cfg: ModelConfig | None = None) -> dict[str, torch.Tensor]:
    """The full fp32 state dict of a ZeRO checkpoint folder (<root>/<tag>), gathered from every rank's shards; of
    a pipeline-parallel run's, from its per-layer files, renamed to the Transformer's names (cfg: the manifest's
    model when not given)."""
    from deepspeed.utils.zero_to_fp32 import get_fp32_state_dict_from_zero_checkpoint

    from training_jobs.pipeline import is_pipeline_checkpoint, transformer_state

    ckpt = Path(ckpt)
    if is_pipeline_checkpoint(ckpt):
        return transformer_state(ckpt, cfg or ModelConfig.from_dict(read_manifest(ckpt)["model"]))
    if (ckpt / CONSOLIDATED).is_file():  # tensor-parallel: DeepSpeed's consolidation reads no tp slices
        whole = torch.load(ckpt / CONSOLIDATED, map_location="cpu", weights_only=True)
        return {k: v.float() for k, v in whole.items()}
    if not any(ckpt.glob("*optim_states.pt")):  # ZeRO-0 in fp32 or under autocast: the module's weights are fp32
        with weights_only_loads():
            module = torch.load(ckpt / ZERO0_MODEL_STATES, map_location="cpu")["module"]
        return {k: v.float() for k, v in module.items()}
    with weights_only_loads():
        return get_fp32_state_dict_from_zero_checkpoint(str(ckpt.parent), tag=ckpt.name)


def _untie(state_dict: dict[str, torch.Tensor], cfg: ModelConfig) -> dict[str, torch.Tensor]:
    """safetensors refuses tensors that share memory: a tied output projection is stored once, as the
    embedding (loading ties it again)."""
    out = {k: v.contiguous() for k, v in state_dict.items()}
    if cfg.tied_embeddings:
        out.pop("lm_head.weight", None)
    return out


# Every file of an export is written under a temporary name and renamed: the checkpoint asset publishes the export by
# hard links, so a file rewritten in place (an export made again into the same run folder) would change, or be cut
# short by a crash, in a published dataset too.
def _save_tensors(tensors: dict[str, torch.Tensor], path: Path) -> None:
    write_path_atomically(path, lambda tmp: save_file(tensors, str(tmp), metadata={"format": "pt"}))


def _write_json(path: Path, data: Any) -> None:
    write_path_atomically(path, lambda tmp: tmp.write_text(json.dumps(data, indent=2), encoding="utf-8"))


def _copy(source: Path, path: Path) -> None:
    write_path_atomically(path, lambda tmp: shutil.copyfile(source, tmp))


def save_safetensors(state_dict: dict[str, torch.Tensor], cfg: ModelConfig, out_dir: Path,
                     metadata: dict[str, Any] | None = None) -> Path:
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    _save_tensors(_untie(state_dict, cfg), out_dir / MODEL_FILE)
    _write_json(out_dir / CONFIG_FILE, {"model": cfg.to_dict(), **(metadata or {})})
    return out_dir


def load_model(export_dir: Path) -> Transformer:
    """A Transformer from a Kiln safetensors export (fp32, eval mode)."""
    export_dir = Path(export_dir)
    cfg = ModelConfig.from_dict(json.loads((export_dir / CONFIG_FILE).read_text(encoding="utf-8"))["model"])
    state = load_file(str(export_dir / MODEL_FILE))
    if cfg.tied_embeddings:
        state["lm_head.weight"] = state["embed_tokens.weight"]
    model = Transformer(cfg)
    model.load_state_dict(state)
    return model.eval()


def probe_check(model: Transformer, probe: dict[str, Any], precision: str) -> dict[str, Any]:
    """Does a reloaded model reproduce the loss the trained model had on the probe sequence (see
    training_jobs.train's `loss_probe`)? Tolerance: 0.1% after fp32 training; 3% after bf16 (the reload runs in
    fp32). A model whose weights are not the trained ones misses by far more."""
    with torch.no_grad():
        loss = model(torch.tensor([probe["inputs"]]), torch.tensor([probe["targets"]])).float().item()
    tolerance = 1e-3 if precision == "fp32" else 3e-2
    return {"passed": abs(loss - probe["loss"]) <= tolerance * max(1.0, abs(probe["loss"])),
            "recorded_loss": probe["loss"], "reloaded_loss": loss, "relative_tolerance": tolerance,
            "tokens": len(probe["targets"])}


# ------------------------------------------------------------------------------------------ Hugging Face

def hf_name(name: str) -> str:
    """Kiln's parameter names are HF Llama's without the decoder's `model.` prefix."""
    return name if name == "lm_head.weight" else f"model.{name}"


def _special_tokens(tokenizer_dir: Path | None) -> dict[str, tuple[str, int]]:
    """bos, eos, pad (always on a card: a brought tokenizer's stand in with eos) and unk where the tokenizer has one,
    from Kiln's card in `tokenizer_dir` (the tokenizer asset's tokenizer.json, or an export's kiln_tokenizer.json)."""
    for card in ([tokenizer_dir / EXPORT_CARD_FILE, tokenizer_dir / CARD_FILE] if tokenizer_dir else []):
        data = json.loads(card.read_text(encoding="utf-8")) if card.is_file() else {}
        if str(data.get("format", "")).startswith("kiln-tokenizer"):  # an export's tokenizer.json is HF's own
            return {k: (v["piece"], v["id"]) for k, v in data["special_tokens"].items() if k in DEFAULT_SPECIALS}
    return dict(DEFAULT_SPECIALS)


def hf_config(cfg: ModelConfig, dtype: str, specials: dict[str, tuple[str, int]]) -> dict[str, Any]:
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "hidden_size": cfg.d_model,
        "intermediate_size": cfg.ffn_hidden,
        "num_hidden_layers": cfg.n_layers,
        "num_attention_heads": cfg.n_heads,
        "num_key_value_heads": cfg.n_kv_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": "silu",
        "rms_norm_eps": cfg.norm_eps,
        **hf_rope(cfg),
        "vocab_size": cfg.vocab_size,
        "max_position_embeddings": cfg.max_seq_len,
        "tie_word_embeddings": cfg.tied_embeddings,
        "attention_bias": False,
        "mlp_bias": False,
        "attention_dropout": 0.0,
        "initializer_range": cfg.init_std,
        "bos_token_id": specials["bos"][1],
        "eos_token_id": specials["eos"][1],
        "pad_token_id": specials["pad"][1],
        "torch_dtype": dtype,
        "use_cache": True,
    }


def hf_rope(cfg: ModelConfig) -> dict[str, Any]:
    """RoPE settings where transformers reads them: `rope_theta` and `rope_scaling` (< 5), `rope_parameters`
    (5.x). Position interpolation is rope_type "linear" there."""
    if cfg.rope_scaling_factor == 1.0:
        return {"rope_theta": cfg.rope_theta, "rope_parameters": {"rope_type": "default", "rope_theta": cfg.rope_theta}}
    scaling = {"rope_type": "linear", "factor": cfg.rope_scaling_factor}
    return {"rope_theta": cfg.rope_theta, "rope_scaling": scaling,
            "rope_parameters": {**scaling, "rope_theta": cfg.rope_theta}}


def save_hf(state_dict: dict[str, torch.Tensor], cfg: ModelConfig, out_dir: Path,
            tokenizer_dir: Path | None = None, dtype: str = "float32") -> Path:
    """A folder `transformers.AutoModelForCausalLM.from_pretrained` loads as a LlamaForCausalLM."""
    if dtype not in DTYPES:
        raise ValueError(f"export dtype {dtype!r} is not one of {sorted(DTYPES)}")
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    tokenizer_dir = Path(tokenizer_dir) if tokenizer_dir else None
    specials = _special_tokens(tokenizer_dir)
    tensors = {hf_name(k): v.to(DTYPES[dtype]).contiguous() for k, v in _untie(state_dict, cfg).items()}
    _save_tensors(tensors, out_dir / MODEL_FILE)
    _write_json(out_dir / "config.json", hf_config(cfg, dtype, specials))
    generation = {"bos_token_id": specials["bos"][1], "eos_token_id": specials["eos"][1],
                  "pad_token_id": specials["pad"][1]}
    _write_json(out_dir / "generation_config.json", generation)
    if tokenizer_dir is not None:
        _write_hf_tokenizer(tokenizer_dir, out_dir, specials, cfg.max_seq_len)
    return out_dir


def _write_hf_tokenizer(tokenizer_dir: Path, out_dir: Path, specials: dict[str, tuple[str, int]],
                        max_len: int) -> None:
    try:
        model = model_file(tokenizer_dir)
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{exc}; point tokenizer_dir at the tokenizer asset's folder") from None
    # The model file byte for byte (its sha256 is the tokenizer's identity), under the name transformers reads.
    sentencepiece = model.name == SENTENCEPIECE_FILE
    _copy(model, out_dir / (SENTENCEPIECE_FILE if sentencepiece else HF_FILE))
    if sentencepiece:  # and HF's own tokenizer.json beside it: what AutoTokenizer reads (see sentencepiece_as_hf)
        hf = sentencepiece_as_hf(model.read_bytes(), {piece for piece, _ in specials.values()})
        write_path_atomically(out_dir / HF_FILE, lambda tmp: hf.save(str(tmp)))
    if (tokenizer_dir / CARD_FILE).is_file() and model.name != CARD_FILE:
        _copy(tokenizer_dir / CARD_FILE, out_dir / EXPORT_CARD_FILE)
    tokens = {f"{k}_token": piece for k, (piece, _) in specials.items()}
    # split_special_tokens: text that spells a special token is text, as Kiln encodes it (a document cannot end
    # itself with a literal "<|endoftext|>").
    config = {"tokenizer_class": "PreTrainedTokenizerFast", **tokens, "add_bos_token": False, "add_eos_token": False,
              "model_max_length": max_len, "clean_up_tokenization_spaces": False, "split_special_tokens": True}
    _write_json(out_dir / "tokenizer_config.json", config)
    _write_json(out_dir / "special_tokens_map.json", tokens)


# SentencePiece's piece types (sentencepiece_model.proto, ModelProto.SentencePiece.Type)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6


def sentencepiece_as_hf(model: bytes, special_pieces: set[str] = frozenset()):
    """A SentencePiece model (BPE, unigram or char) as a Hugging Face `tokenizers` Tokenizer that encodes as
    SentencePiece does, built from the model's own pieces, scores and normalizer spec. transformers' Llama conversion
    fits neither kind in full: from transformers 5 it builds every model as BPE (a unigram model has no merges, so
    every text came out as single characters), and it leaves out the model's normalization (NFKC, extra whitespace
    removed).

    - normalizer, in SentencePiece's order: the precompiled character map (NFKC; none under `identity`), leading,
      trailing and repeated spaces removed (remove_extra_whitespaces), '▁' put before a non-empty text
      (add_dummy_prefix), spaces written '▁'. No pre-tokenizer: SentencePiece segments the whole text;
    - unigram: the pieces with their scores; the pieces SentencePiece never matches in text (unknown, control,
      unused, byte) score below any segmentation into ordinary pieces. `tokenizers` cannot leave them out of its
      lattice, so one still wins where every other path needs a character the vocabulary lacks (docs/training.md);
    - BPE: a merge for every split of an ordinary piece into two ordinary pieces, ranked by the piece's score
      (SentencePiece merges the adjacent pair whose union scores highest);
    - byte fallback as the model has it; control and unknown pieces (and `special_pieces`) special tokens, and
      user-defined pieces added tokens matched whole, as SentencePiece matches them.
    """
    from sentencepiece import sentencepiece_model_pb2
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString(model)
    trainer, spec, pieces = proto.trainer_spec, proto.normalizer_spec, proto.pieces
    if trainer.model_type in (trainer.UNIGRAM, trainer.CHAR):  # a char model: unigram with one way to segment
        # A user-defined piece Kiln gives a meaning (a brought model's EOS) is text in a document, as Kiln reads it
        matched = [p.type == NORMAL or p.type == USER_DEFINED and p.piece not in special_pieces for p in pieces]
        unmatched = 1000.0 * min(-1.0, *(p.score for p, m in zip(pieces, matched) if m))  # below 1000 pieces
        vocab = [(p.piece, p.score if m else unmatched) for p, m in zip(pieces, matched)]
        tokenizer = Tokenizer(models.Unigram(vocab, unk_id=trainer.unk_id, byte_fallback=trainer.byte_fallback))
    elif trainer.model_type == trainer.BPE:
        normal = {p.piece: i for i, p in enumerate(pieces) if p.type == NORMAL}
        merges = sorted((-pieces[i].score, i, k, (piece[:k], piece[k:])) for piece, i in normal.items()
                        for k in range(1, len(piece)) if piece[:k] in normal and piece[k:] in normal)
        tokenizer = Tokenizer(models.BPE({p.piece: i for i, p in enumerate(pieces)}, [m[-1] for m in merges],
                                         unk_token=pieces[trainer.unk_id].piece, fuse_unk=True,
                                         byte_fallback=trainer.byte_fallback))
    else:
        raise ValueError("a SentencePiece word model has no Hugging Face tokenizer here (BPE, unigram and char "
                         "models have): bring one of those (tokenizer.source), or leave hf out of training.export")
    steps = [normalizers.Precompiled(spec.precompiled_charsmap)] if spec.precompiled_charsmap else []
    if spec.remove_extra_whitespaces:
        steps += [normalizers.Replace(Regex(r"\A +| +\z"), ""), normalizers.Replace(Regex(" {2,}"), " ")]
    if spec.add_dummy_prefix:
        steps.append(normalizers.Prepend("\u2581"))
    if spec.escape_whitespaces:
        steps.append(normalizers.Replace(" ", "\u2581"))
    tokenizer.normalizer = normalizers.Sequence(steps)
    # SentencePiece drops the first piece's '▁' where it adds a prefix or removes extra whitespace.
    strip = [decoders.Strip(" ", 1, 0)] if spec.add_dummy_prefix or spec.remove_extra_whitespaces else []
    tokenizer.decoder = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                           decoders.Fuse(), *strip])
    tokenizer.add_special_tokens([AddedToken(p.piece, special=True, normalized=False) for p in pieces
                                  if p.type in (UNKNOWN, CONTROL) or p.piece in special_pieces])
    tokenizer.add_tokens([AddedToken(p.piece, normalized=False) for p in pieces
                          if p.type == USER_DEFINED and p.piece not in special_pieces])
    return tokenizer


def export_checkpoint(ckpt: Path, out_dir: Path, cfg: ModelConfig, formats: list[str] = ("safetensors", "hf"),
                      tokenizer_dir: Path | None = None, metadata: dict[str, Any] | None = None) -> dict[str, str]:
    """Consolidate once, write each requested format under out_dir/<format>; returns {format: folder}."""
    state = consolidate(ckpt, cfg)
    written = {}
    if "safetensors" in formats:
        written["safetensors"] = str(save_safetensors(state, cfg, Path(out_dir) / "safetensors",
                                                      {"checkpoint": str(ckpt), **(metadata or {})}))
    if "hf" in formats:
        written["hf"] = str(save_hf(state, cfg, Path(out_dir) / "hf", tokenizer_dir))
    return written


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description="Export a Kiln DeepSpeed checkpoint to safetensors / HF Llama.")
    parser.add_argument("checkpoint", type=Path, help="a checkpoint folder, e.g. checkpoints/step_00000100")
    parser.add_argument("out_dir", type=Path)
    parser.add_argument("--tokenizer-dir", type=Path, default=None)
    parser.add_argument("--format", action="append", choices=["safetensors", "hf"], default=None)
    args = parser.parse_args(argv)
    problem = verify(args.checkpoint)
    if problem:
        parser.error(f"{args.checkpoint} cannot be exported: {problem}")
    cfg = ModelConfig.from_dict(read_manifest(args.checkpoint)["model"])
    print(json.dumps(export_checkpoint(args.checkpoint, args.out_dir, cfg, args.format or ["safetensors", "hf"],
                                       args.tokenizer_dir), indent=2))


if __name__ == "__main__":
    main()


__all__ = ["consolidate", "export_checkpoint", "hf_config", "hf_name", "load_model", "save_hf", "save_safetensors"]
