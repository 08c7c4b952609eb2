"""Evaluating an exported checkpoint on CPU or GPU: loss and perplexity on token streams, and sampling.

A token stream (documents joined, EOS after each) is cut into windows of seq_len + 1 tokens; the loss
is the token-weighted mean next-token cross-entropy over all windows, perplexity its exponential.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

import numpy as np
import torch
import torch.nn.functional as F

from kiln.tokens.shard_format import open_shard, read_shard_set


def stream(documents: Iterable[list[int] | np.ndarray], eos_id: int) -> np.ndarray:
    """Documents' tokens joined with EOS after each, as the shards store them."""
    parts = []
    for ids in documents:
        parts.append(np.asarray(ids, dtype=np.int64))
        parts.append(np.array([eos_id], dtype=np.int64))
    return np.concatenate(parts) if parts else np.empty(0, np.int64)


def validation_stream(shard_dir, expected_tokenizer_sha256: str | None = None, max_tokens: int | None = None,
                      exclude: dict[str, list[int]] | None = None) -> np.ndarray:
    """The validation split of a token-shards dataset (in shard order), verified against the tokenizer; `exclude`:
    documents left out (shard -> places in its document-offset index: those a removal request names)."""
    shard_set = read_shard_set(shard_dir)
    out, total = [], 0
    for info in shard_set.split("val"):
        shard = open_shard(shard_set.dir / info.path, expected_tokenizer_sha256)
        tokens = np.asarray(shard.tokens, dtype=np.int64)
        if (exclude or {}).get(info.path):
            offsets = np.asarray(shard.offsets, dtype=np.int64)
            keep = np.ones(len(tokens), bool)
            for index in exclude[info.path]:
                keep[offsets[index]:offsets[index + 1]] = False
            tokens = tokens[keep]
        out.append(tokens)
        total += len(tokens)
        if max_tokens and total >= max_tokens:
            break
    tokens = np.concatenate(out) if out else np.empty(0, np.int64)
    return tokens[:max_tokens] if max_tokens else tokens


@torch.no_grad()
def stream_loss(model: torch.nn.Module, tokens: np.ndarray, seq_len: int, batch_size: int = 8,
                device: str = "cpu") -> dict[str, float | int | None]:
    """Token-weighted mean loss over non-overlapping windows of seq_len + 1 tokens (the tail counts too)."""
    tokens = np.asarray(tokens, dtype=np.int64)
    full = (len(tokens) - 1) // seq_len
    windows = [tokens[i * seq_len: (i + 1) * seq_len + 1] for i in range(full)]
    batches = [np.stack(windows[i:i + batch_size]) for i in range(0, full, batch_size)]
    tail = tokens[full * seq_len:]
    if len(tail) >= 2:
        batches.append(tail[None, :])
    total_loss, total_tokens = 0.0, 0
    for batch in batches:
        x = torch.as_tensor(batch[:, :-1], device=device)
        y = torch.as_tensor(batch[:, 1:], device=device)
        logits = model(x).float()
        total_loss += F.cross_entropy(logits.reshape(-1, logits.shape[-1]), y.reshape(-1), reduction="sum").item()
        total_tokens += y.numel()
    if total_tokens == 0:
        return {"loss": None, "perplexity": None, "tokens": 0}
    loss = total_loss / total_tokens
    return {"loss": round(loss, 5), "perplexity": round(math.exp(min(loss, 50.0)), 3), "tokens": total_tokens}


def forgetting_by_domain(per_source: dict[str, dict], base_per_source: dict[str, dict],
                         domains: dict[str, str]) -> dict[str, dict]:
    """Per domain: the token-weighted validation loss of both models over that domain's sources (the same
    tokens for both), and forgetting = loss - base loss (positive: the continued model got worse there)."""
    out: dict[str, dict] = {}
    for name, r in per_source.items():
        b = base_per_source.get(name) or {}
        if not r.get("tokens") or r.get("loss") is None or b.get("loss") is None:
            continue
        d = out.setdefault(domains.get(name, name), {"tokens": 0, "loss_sum": 0.0, "base_sum": 0.0})
        d["tokens"] += r["tokens"]
        d["loss_sum"] += r["loss"] * r["tokens"]
        d["base_sum"] += b["loss"] * r["tokens"]
    return {domain: {"tokens": d["tokens"], "loss": round(d["loss_sum"] / d["tokens"], 5),
                     "base_loss": round(d["base_sum"] / d["tokens"], 5),
                     "forgetting": round((d["loss_sum"] - d["base_sum"]) / d["tokens"], 5)}
            for domain, d in sorted(out.items())}


@torch.no_grad()
def generate(model: torch.nn.Module, prompt: list[int], max_new_tokens: int, eos_id: int | None = None,
             temperature: float = 0.0, top_k: int | None = None, seed: int = 0, device: str = "cpu") -> list[int]:
    """Continue `prompt`: greedy at temperature 0, else top-k sampling from a seeded generator."""
    gen = torch.Generator(device=device).manual_seed(seed)
    ids = list(prompt)
    limit = model.cfg.max_seq_len
    for _ in range(max_new_tokens):
        x = torch.as_tensor(ids[-limit:], device=device).unsqueeze(0)
        logits = model(x)[0, -1].float()
        if temperature <= 0:
            nxt = int(logits.argmax())
        else:
            logits = logits / temperature
            if top_k:
                kth = torch.topk(logits, min(top_k, logits.numel())).values[-1]
                logits = logits.masked_fill(logits < kth, float("-inf"))
            nxt = int(torch.multinomial(torch.softmax(logits, -1), 1, generator=gen))
        ids.append(nxt)
        if eos_id is not None and nxt == eos_id:
            break
    return ids[len(prompt):]
