"""Mixture math: how many tokens each source contributes, and which documents supply them.

Pure functions over counts and arrays, so the arithmetic is testable without files. Weights are shares
of *training tokens*. A source whose share needs more than it has is repeated: documents are taken in a
fixed pseudo-random order (by doc_id hash), cycling, so a source gets whole passes plus a deterministic
subset; one that needs less is subsampled the same way. Curriculum phases continue the cycle where the
previous phase stopped, so a phase repeats a document only after every other one has been used; a phase with a
length floor (`min_document_tokens`) draws the long documents drawn least so far first (the shard writer keeps each
document's count), so it does not repeat what an earlier phase drew while long ones nobody drew wait.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np


class MixtureError(ValueError):
    """A mixture that cannot be met with the data at hand; the message says which source and what to change."""


@dataclass(frozen=True)
class SourceParts:
    """One source as the tokenizer and shard writers see it: a name, a domain and its document parts."""

    name: str
    domain: str
    parts: tuple[Path, ...]  # Parquet files in DOCUMENT_SCHEMA (any list of paths is accepted)

    def __post_init__(self):
        object.__setattr__(self, "parts", tuple(Path(p) for p in self.parts))


def hash_unit(*key: object) -> int:
    """A stable 64-bit integer from a key (not Python's salted hash): same key, same value, every run."""
    digest = hashlib.blake2b("\x1f".join(map(str, key)).encode("utf-8", "surrogatepass"), digest_size=8).digest()
    return int.from_bytes(digest, "little")


def shares(names: list[str], weights: dict[str, float], natural: dict[str, int]) -> dict[str, float]:
    """Target share per source, summing to 1. Empty weights mean natural proportions."""
    if not weights:
        total = sum(natural.get(n, 0) for n in names)
        if total == 0:
            raise MixtureError(f"no source has any tokens ({names}); check that the upstream datasets are not empty")
        return {n: natural.get(n, 0) / total for n in names}
    missing = [n for n in names if n not in weights]
    if missing:
        raise MixtureError(f"weights give no weight to {missing}; list every source (0 leaves one out)")
    total = sum(weights[n] for n in names)
    if total <= 0:
        raise MixtureError("every weight is 0; give at least one source a positive weight")
    result = {n: weights[n] / total for n in names}
    for n in names:
        if result[n] > 0 and natural.get(n, 0) == 0:
            raise MixtureError(f"source {n!r} has weight {weights[n]} but no tokens to draw from; give it weight 0 "
                               f"or check its upstream dataset")
    return result


def split_budget(budget: int, source_shares: dict[str, float]) -> dict[str, int]:
    """Integer token targets that sum exactly to the budget (largest remainder rounding)."""
    raw = {n: budget * s for n, s in source_shares.items()}
    targets = {n: math.floor(v) for n, v in raw.items()}
    short = budget - sum(targets.values())
    for n in sorted(raw, key=lambda n: (raw[n] - targets[n], n), reverse=True)[:short]:
        targets[n] += 1
    return targets


def select_documents(lengths: np.ndarray, target: int, cursor: int = 0) -> tuple[np.ndarray, int]:
    """Documents (indices into `lengths`, in the given order, cycling) whose tokens come closest to `target`.

    `lengths` are the documents' token counts in their selection order; `cursor` is how many documents
    earlier draws took (it may exceed len(lengths): whole passes). Returns the indices, repeats included,
    and the cursor after this draw. The total misses the target by at most half a document.
    """
    n = len(lengths)
    if target <= 0 or n == 0:
        if target > 0:
            raise MixtureError(f"asked for {target} tokens from a source with no documents")
        return np.zeros(0, np.int64), cursor
    cum = np.zeros(n + 1, np.int64)
    np.cumsum(lengths, out=cum[1:])
    total = int(cum[-1])
    if total == 0:
        raise MixtureError(f"asked for {target} tokens from a source whose documents are all empty")
    start = cursor % n

    def taken(q: int) -> int:  # tokens from absolute position `start` up to absolute position q
        return (q // n) * total + int(cum[q % n]) - int(cum[start])

    wanted = target + int(cum[start])
    passes, rest = divmod(wanted, total)
    q = passes * n + int(np.searchsorted(cum, rest, side="left"))  # first position reaching the target
    if q > start and abs(taken(q - 1) - target) <= abs(taken(q) - target):
        q -= 1
    count = q - start
    return (start + np.arange(count, dtype=np.int64)) % n, cursor + count


@dataclass
class SourceDraw:
    """What one source gives one phase."""

    natural_tokens: int
    target_tokens: int
    tokens: int = 0
    documents: int = 0

    @property
    def epochs(self) -> float:
        return self.tokens / self.natural_tokens if self.natural_tokens else 0.0


@dataclass
class PhasePlan:
    name: str
    index: int
    budget: int
    shares: dict[str, float]
    draws: dict[str, SourceDraw] = field(default_factory=dict)

    def to_dict(self) -> dict:
        tokens = sum(d.tokens for d in self.draws.values()) or 1
        return {"name": self.name, "index": self.index, "budget": self.budget,
                "tokens": sum(d.tokens for d in self.draws.values()),
                "documents": sum(d.documents for d in self.draws.values()),
                "sources": {n: {"target_share": round(self.shares[n], 6), "share": round(d.tokens / tokens, 6),
                                "natural_tokens": d.natural_tokens, "target_tokens": d.target_tokens,
                                "tokens": d.tokens, "documents": d.documents, "epochs": round(d.epochs, 4)}
                            for n, d in self.draws.items()}}


def plan_phases(natural: dict[str, int], weights: dict[str, float], token_budget: int | None,
                phases: list[tuple]) -> list[PhasePlan]:
    """Per phase, the token target of every source. No phases: one phase "main" with `token_budget`
    (None: the natural total). A phase is (name, tokens, weights[, natural]): empty weights use `weights`
    (empty: natural proportions); its own `natural` counts, if given, are what it can draw from (a phase of
    long documents only), else `natural`."""
    names = list(natural)
    configured = bool(phases)
    if not phases:
        phases = [("main", token_budget if token_budget is not None else sum(natural.values()), {})]
    plans = []
    for index, (name, budget, phase_weights, *own) in enumerate(phases):
        floored = bool(own) and bool(own[0])  # counted from the phase's long documents only
        available = own[0] if floored else natural
        try:
            s = shares(names, phase_weights or weights, available)
        except MixtureError as exc:
            if not configured:
                raise
            if not floored:
                raise MixtureError(f"mixture.phases[{index}] ({name!r}): {exc}") from None
            raise MixtureError(f"mixture.phases[{index}] ({name!r}, counting only its documents of at least "
                               f"min_document_tokens tokens): {exc}, or lower mixture.phases[{index}]"
                               ".min_document_tokens") from None
        targets = split_budget(budget, s)
        plans.append(PhasePlan(name, index, budget, s, {n: SourceDraw(available[n], targets[n]) for n in names}))
    return plans


def epoch_warnings(plans: list[PhasePlan], natural_tokens: Mapping[str, int], max_epochs: float) -> list[str]:
    """One warning per source repeated more than `max_epochs` times over all phases together, against its natural
    training tokens (all its documents: a phase's own `natural_tokens` counts only those past its floor)."""
    warnings = []
    for name in plans[0].draws if plans else []:
        natural = natural_tokens[name]
        used = sum(p.draws[name].tokens for p in plans)
        if natural and used / natural > max_epochs:
            warnings.append(f"source {name!r} is repeated {used / natural:.1f} times (over {max_epochs:g}): "
                            f"{used:,} training tokens from {natural:,} natural ones; repeating data this often "
                            f"brings little (Muennighoff et al. 2023) - lower its weight or the token budget, "
                            f"or add data")
    return warnings
