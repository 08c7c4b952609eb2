"""Perplexity of documents under a reference language model (CCNet): a Kiln checkpoint trained on
reference text scores how "reference-like" each document reads.

A document is scored the way training streams see it: after an EOS (documents are joined with EOS),
its first `max_tokens` tokens are predicted one by one; its perplexity is exp of the mean negative
log-likelihood per token. Documents are batched by length (right padding, padded targets ignored),
on CPU or GPU.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F

from kiln.common.manifest import sha256_file
from kiln.tokens.tokenizer import Tokenizer
from training_jobs.tokenizer_files import HF_FILE, SENTENCEPIECE_FILE


def resolve_device(device: str) -> str:
    if device == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    return device


@dataclass
class ReferenceModel:
    model: torch.nn.Module
    tokenizer: Tokenizer
    device: str
    model_sha256: str

    @staticmethod
    def files(path: str | Path) -> tuple[Path, Path]:
        """(weights folder, tokenizer model file) of a checkpoint folder as the `checkpoint` asset writes it
        (`safetensors/` + `hf/tokenizer.model`), or of one folder holding `model.safetensors`,
        `model_config.json` and `tokenizer.model`; a clear error when either is missing."""
        from training_jobs.export import MODEL_FILE

        path = Path(path)
        weights = path / "safetensors" if (path / "safetensors").is_dir() else path
        folder = path / "hf" if (path / "hf").is_dir() else path
        # tokenizer.model (SentencePiece) or, for a brought `tokenizers` tokenizer, tokenizer.json
        tokenizer = next((folder / n for n in (SENTENCEPIECE_FILE, HF_FILE) if (folder / n).is_file()),
                         folder / SENTENCEPIECE_FILE)
        missing = [str(p) for p in (weights / MODEL_FILE, tokenizer) if not p.is_file()]
        if missing:
            raise FileNotFoundError(f"quality.perplexity.model = {str(path)!r} is not a Kiln checkpoint: missing "
                                    f"{', '.join(missing)}; point it at a checkpoint folder (the checkpoint asset's "
                                    "output) or a folder with model.safetensors, model_config.json, tokenizer.model "
                                    "(or tokenizer.json)")
        return weights, tokenizer

    @classmethod
    def identity(cls, path: str | Path) -> dict[str, str]:
        """The sha256 of the model's weights and of its tokenizer, without loading either."""
        from training_jobs.export import MODEL_FILE

        weights, tokenizer = cls.files(path)
        return {"reference_model_sha256": sha256_file(weights / MODEL_FILE),
                "reference_tokenizer_sha256": sha256_file(tokenizer)}

    @classmethod
    def load(cls, path: str | Path, device: str = "auto") -> ReferenceModel:
        """From a checkpoint folder (see `files`), on `device` (auto: cuda when available, else cpu)."""
        from training_jobs.export import MODEL_FILE, load_model

        weights, tokenizer = cls.files(path)
        device = resolve_device(device)
        model = load_model(weights).to(device)
        tok = Tokenizer.load(tokenizer)
        if tok.vocab_size > model.cfg.vocab_size:  # the embedding may be padded beyond the tokenizer, not below
            raise ValueError(f"{tokenizer} has {tok.vocab_size} pieces but the model at {weights} has only "
                             f"{model.cfg.vocab_size} embeddings: the tokenizer is not the one the model was trained with")
        return cls(model, tok, device, sha256_file(weights / MODEL_FILE))

    @torch.no_grad()
    def perplexities(self, texts: Sequence[str], max_tokens: int = 512, batch_size: int = 16) -> np.ndarray:
        """Per-document perplexity (NaN for a document without tokens), in the order given."""
        limit = min(max_tokens, self.model.cfg.max_seq_len)
        encoded = [ids[:limit] for ids in self.tokenizer.encode_batch(list(texts))]
        out = np.full(len(encoded), np.nan)
        order = sorted((i for i in range(len(encoded)) if encoded[i]), key=lambda i: len(encoded[i]))
        eos, pad = self.tokenizer.eos_id, self.tokenizer.pad_id
        autocast = torch.autocast("cuda", dtype=torch.bfloat16) if self.device == "cuda" else nullcontext()
        for start in range(0, len(order), batch_size):
            batch = order[start:start + batch_size]
            width = max(len(encoded[i]) for i in batch)
            inputs = torch.full((len(batch), width), pad, dtype=torch.long)
            targets = torch.full((len(batch), width), -100, dtype=torch.long)
            for row, i in enumerate(batch):
                ids = encoded[i]
                inputs[row, :len(ids)] = torch.tensor([eos, *ids[:-1]])
                targets[row, :len(ids)] = torch.tensor(ids)
            inputs, targets = inputs.to(self.device), targets.to(self.device)
            with autocast:
                logits = self.model(inputs)
            nll = F.cross_entropy(logits.float().transpose(1, 2), targets, ignore_index=-100, reduction="none")
            per_doc = (nll.sum(1) / (targets != -100).sum(1)).cpu().numpy()
            for row, i in enumerate(batch):
                out[i] = math.exp(min(float(per_doc[row]), 50.0))
        return out

