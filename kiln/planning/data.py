"""Is there enough data? Tokens needed per source under the mixture vs tokens available.

Muennighoff et al. 2023 ("Scaling Data-Constrained Language Models", abstract and Fig. 1): up to ~4
epochs of repeated data change the loss negligibly compared with unique data; with more repetition
the value of extra compute decays towards zero. So each source is flagged past `max_epochs` (4).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field

MAX_USEFUL_EPOCHS = 4.0


@dataclass(frozen=True)
class SourceUsage:
    source: str
    available_tokens: float
    weight: float  # normalised mixture weight
    needed_tokens: float

    @property
    def epochs(self) -> float:
        if self.needed_tokens == 0:
            return 0.0
        return self.needed_tokens / self.available_tokens if self.available_tokens > 0 else float("inf")

    def to_dict(self) -> dict[str, float | str | None]:
        # a source asked for tokens it has none of needs infinitely many epochs: JSON (strict, as `kiln plan --json`
        # prints it) has no infinity, so null there; the warning says why
        epochs = self.epochs
        return {**asdict(self), "epochs": epochs if math.isfinite(epochs) else None}


@dataclass(frozen=True)
class DataSufficiency:
    tokens_needed: float
    sources: list[SourceUsage]
    max_epochs: float
    warnings: list[str] = field(default_factory=list)

    @property
    def tokens_available(self) -> float:
        return sum(s.available_tokens for s in self.sources)

    @property
    def sufficient(self) -> bool:
        return all(s.epochs <= self.max_epochs for s in self.sources)

    def to_dict(self) -> dict:
        return {
            "tokens_needed": self.tokens_needed,
            "tokens_available": self.tokens_available,
            "max_epochs": self.max_epochs,
            "sufficient": self.sufficient,
            "sources": [s.to_dict() for s in self.sources],
            "warnings": list(self.warnings),
        }


def data_sufficiency(
    tokens_needed: float,
    available_tokens: Mapping[str, float],
    mixture_weights: Mapping[str, float] | None = None,
    max_epochs: float = MAX_USEFUL_EPOCHS,
) -> DataSufficiency:
    """Epochs each source must be repeated to supply `tokens_needed` with the given mixture.

    Without weights the mixture is the natural one (proportional to what is available, i.e. every
    source is seen the same number of times). Weights are normalised; sources without a weight get 0."""
    if tokens_needed < 0:
        raise ValueError(f"tokens_needed must be >= 0, got {tokens_needed}")
    if not available_tokens:
        raise ValueError("available_tokens is empty: give tokens per source")
    negative = {k: v for k, v in available_tokens.items() if v < 0}
    if negative:
        raise ValueError(f"available_tokens must be >= 0 per source, got {negative}")
    if not mixture_weights and sum(available_tokens.values()) <= 0:
        raise ValueError(f"available_tokens sum to 0 ({dict(available_tokens)}): without mixture_weights the mixture "
                         "is by tokens available, so give some source tokens > 0")
    weights = dict(mixture_weights) if mixture_weights else dict(available_tokens)
    unknown = sorted(set(weights) - set(available_tokens))
    if unknown:
        raise ValueError(
            f"mixture_weights name sources with no available_tokens: {unknown}; "
            f"known sources: {sorted(available_tokens)}"
        )
    if any(w < 0 for w in weights.values()) or sum(weights.values()) <= 0:
        raise ValueError(f"mixture_weights must be >= 0 with a positive sum, got {weights}")
    total_weight = sum(weights.values())
    sources = [
        SourceUsage(name, float(available), weights.get(name, 0.0) / total_weight,
                    tokens_needed * weights.get(name, 0.0) / total_weight)
        for name, available in available_tokens.items()
    ]
    warnings = [
        f"source {s.source!r} has no tokens available but a mixture weight of {s.weight:.2f}: it cannot supply its "
        f"{s.needed_tokens:.3g} tokens at any number of epochs; add data to it or set its weight to 0"
        if s.available_tokens == 0 else
        f"source {s.source!r} would be repeated {s.epochs:.1f} times (> {max_epochs:g} epochs; "
        "Muennighoff et al. 2023 find returns from repeated data diminish past ~4): add data, "
        "lower its weight or train fewer tokens"
        for s in sources
        if s.epochs > max_epochs
    ]
    return DataSufficiency(float(tokens_needed), sources, max_epochs, warnings)
