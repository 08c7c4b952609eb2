"""How big a model, on how many tokens: published scaling laws and inference-aware sizing.

All compute here is in the scaling-law convention C = 6·N·D (see `compute.training_flops`).

* Chinchilla rule of thumb: ~20 tokens per parameter (Hoffmann et al. 2022, Table 3).
* Hoffmann et al. 2022 parametric fit (Approach 3), L(N, D) = E + A/N^α + B/D^β with the published
  E=1.69, A=406.4, B=410.7, α=0.34, β=0.28 (their Eq. 10), minimised under C = 6ND in closed form
  (their Eq. 4 / App. D.2).
* Kaplan et al. 2020: N_opt = 1.3e9 · C_min^0.73 non-embedding parameters with C_min in PF-days
  (their Fig. 14 and Table 6); tokens here are then D = C / 6N so the budget is spent.
* Inference-aware (Sardana & Frankle 2023): minimise 6·N·D + 2·N·D_inf along the iso-loss curve of
  the Hoffmann fit through the Chinchilla-optimal point.

Own fits to finished runs (L(C) and L(N, D) of the Hoffmann form) live in `fits`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

from kiln.planning.compute import PF_DAY, training_flops

TOKENS_PER_PARAM_CHINCHILLA = 20.0
INFERENCE_FLOPS_PER_PARAM_TOKEN = 2.0  # forward pass only (Sardana & Frankle 2023, Sec. 2)
GOLDEN = (math.sqrt(5.0) - 1.0) / 2.0


@dataclass(frozen=True)
class Allocation:
    """A model size and a token count for a budget, and which rule produced them."""

    method: str
    n_params: float
    tokens: float

    @property
    def flops(self) -> float:
        return training_flops(self.n_params, self.tokens)

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.n_params

    def to_dict(self) -> dict[str, float | str]:
        return {
            "method": self.method,
            "n_params": self.n_params,
            "tokens": self.tokens,
            "tokens_per_param": self.tokens_per_param,
            "flops": self.flops,
        }


def _require_positive_flops(flops: float) -> None:
    if not flops > 0:
        raise ValueError(f"compute budget must be > 0 FLOPs, got {flops}")


def chinchilla_allocation(flops: float, tokens_per_param: float = TOKENS_PER_PARAM_CHINCHILLA) -> Allocation:
    """D = r·N with C = 6·N·D ⇒ N = sqrt(C / 6r) (Hoffmann et al. 2022, Table 3: r ≈ 20)."""
    _require_positive_flops(flops)
    n_params = math.sqrt(flops / (6.0 * tokens_per_param))
    return Allocation(f"chinchilla ({tokens_per_param:g} tok/param)", n_params, tokens_per_param * n_params)


@dataclass(frozen=True)
class ParametricLoss:
    """L(N, D) = E + A/N^α + B/D^β (Hoffmann et al. 2022, Eq. 2), loss in nats per token."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def loss(self, n_params: float, tokens: float) -> float:
        return self.E + self.A / n_params**self.alpha + self.B / tokens**self.beta

    def optimal_allocation(self, flops: float, method: str = "hoffmann fit") -> Allocation:
        """argmin L(N, D) s.t. 6ND = C (Hoffmann et al. 2022, Eq. 4 and App. D.2):
        N_opt = G·(C/6)^a, D_opt = G^-1·(C/6)^b,
        G = (αA/βB)^(1/(α+β)), a = β/(α+β), b = α/(α+β)."""
        _require_positive_flops(flops)
        total = self.alpha + self.beta
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / total)
        return Allocation(
            method, g * (flops / 6.0) ** (self.beta / total), (flops / 6.0) ** (self.alpha / total) / g
        )

    def min_params_for_loss(self, loss: float) -> float:
        """Smallest N that can reach `loss` at all (infinite data): E + A/N^α = loss."""
        if not loss > self.E:
            raise ValueError(f"loss {loss} is not above the irreducible loss E={self.E}")
        return (self.A / (loss - self.E)) ** (1.0 / self.alpha)

    def tokens_for_loss(self, loss: float, n_params: float) -> float:
        """The iso-loss curve: D such that L(N, D) = loss; inf when N is too small to get there."""
        gap = loss - self.E - self.A / n_params**self.alpha
        return (self.B / gap) ** (1.0 / self.beta) if gap > 0 else math.inf

    def to_dict(self) -> dict[str, float]:
        return {"E": self.E, "A": self.A, "B": self.B, "alpha": self.alpha, "beta": self.beta}


# Hoffmann et al. 2022, Eq. 10 (Approach 3), as printed. The constants are rounded to 2-4 significant
# digits; N_opt is sensitive to α and β (see tests/kiln/planning/test_scaling.py).
HOFFMANN_2022 = ParametricLoss(E=1.69, A=406.4, B=410.7, alpha=0.34, beta=0.28)


def hoffmann_allocation(flops: float, law: ParametricLoss = HOFFMANN_2022) -> Allocation:
    return law.optimal_allocation(flops)


# Kaplan et al. 2020, Fig. 14 (left) and Table 6: N_opt = 1.3e9 · C_min^0.73, C_min in PF-days, N the
# *non-embedding* parameter count. Their tokens D_opt ≈ 2e10·C_min^0.27 do not satisfy C = 6ND
# exactly (C_min is compute at the critical batch size), so we spend the budget: D = C / 6N.
KAPLAN_N_COEFFICIENT = 1.3e9
KAPLAN_N_EXPONENT = 0.73


def kaplan_allocation(flops: float) -> Allocation:
    _require_positive_flops(flops)
    n_params = KAPLAN_N_COEFFICIENT * (flops / PF_DAY) ** KAPLAN_N_EXPONENT
    return Allocation("kaplan 2020", n_params, flops / (6.0 * n_params))


# ---------------------------------------------------------------------------------------------
# Inference-aware sizing (Sardana & Frankle 2023, "Beyond Chinchilla-Optimal")
# ---------------------------------------------------------------------------------------------


def _golden_section_min(f: Callable[[float], float], lo: float, hi: float, tol: float = 1e-10) -> float:
    """Minimiser of a unimodal f on [lo, hi] (golden-section search)."""
    a, b = lo, hi
    c, d = b - GOLDEN * (b - a), a + GOLDEN * (b - a)
    fc, fd = f(c), f(d)
    while b - a > tol * max(1.0, abs(a) + abs(b)):
        if fc < fd:
            b, d, fd = d, c, fc
            c = b - GOLDEN * (b - a)
            fc = f(c)
        else:
            a, c, fc = c, d, fd
            d = a + GOLDEN * (b - a)
            fd = f(d)
    return (a + b) / 2.0


@dataclass(frozen=True)
class InferenceAwareAllocation:
    n_params: float
    tokens: float
    inference_tokens: float
    loss: float  # Hoffmann-fit loss of this model
    reference: Allocation  # the Hoffmann-fit compute-optimal model for the same budget

    @property
    def tokens_per_param(self) -> float:
        return self.tokens / self.n_params

    @property
    def training_flops(self) -> float:
        return training_flops(self.n_params, self.tokens)

    @property
    def inference_flops(self) -> float:
        return INFERENCE_FLOPS_PER_PARAM_TOKEN * self.n_params * self.inference_tokens

    @property
    def total_flops(self) -> float:
        return self.training_flops + self.inference_flops

    @property
    def reference_total_flops(self) -> float:
        inference = INFERENCE_FLOPS_PER_PARAM_TOKEN * self.reference.n_params * self.inference_tokens
        return self.reference.flops + inference

    def to_dict(self) -> dict[str, float | dict]:
        return {
            "n_params": self.n_params,
            "tokens": self.tokens,
            "tokens_per_param": self.tokens_per_param,
            "inference_tokens": self.inference_tokens,
            "loss": self.loss,
            "training_flops": self.training_flops,
            "inference_flops": self.inference_flops,
            "total_flops": self.total_flops,
            "reference": self.reference.to_dict(),
            "reference_total_flops": self.reference_total_flops,
            "tokens_per_param_vs_reference": self.tokens_per_param / self.reference.tokens_per_param,
            "tokens_per_param_vs_20": self.tokens_per_param / TOKENS_PER_PARAM_CHINCHILLA,
            "total_flops_saved_fraction": 1.0 - self.total_flops / self.reference_total_flops,
        }


def _cheapest_on_iso_loss(law: ParametricLoss, loss: float, inference_tokens: float) -> tuple[float, float]:
    """(N, D) on L(N, D) = loss minimising 6ND + 2N·D_inf (golden-section search over log N).

    Along the iso-loss curve D(N) falls from ∞ at the smallest feasible N, N_min = (A/(loss-E))^(1/α),
    and training cost 6N·D(N) has a single minimum, the compute-optimal model for this loss, where
    d log(N·D)/d log N = 0, i.e. at log N = log N_min + (1/α)·log(1 + α/β). The inference term
    2N·D_inf only grows with N, so the minimum of the total lies between those two points."""
    log_n_min = math.log(law.min_params_for_loss(loss))
    log_n_compute_optimal = log_n_min + math.log1p(law.alpha / law.beta) / law.alpha

    def log_total(log_n: float) -> float:
        n = math.exp(log_n)
        return math.log(6.0 * n * law.tokens_for_loss(loss, n) + 2.0 * n * inference_tokens)

    log_n = _golden_section_min(log_total, log_n_min + 1e-12, log_n_compute_optimal)
    n_params = math.exp(log_n)
    return n_params, law.tokens_for_loss(loss, n_params)


def inference_aware_allocation(
    flops: float, inference_tokens: float, law: ParametricLoss = HOFFMANN_2022
) -> InferenceAwareAllocation:
    """Same loss as the compute-optimal model for `flops`, minimum training + inference FLOPs.

    Sardana & Frankle 2023, Sec. 2: minimise 6·N·D + 2·N·D_inf s.t. L(N, D) = L(N*, D*). The result
    trains a smaller model on more tokens, so it needs *more* than `flops` to train."""
    if inference_tokens < 0:
        raise ValueError(f"inference_tokens must be >= 0, got {inference_tokens}")
    reference = law.optimal_allocation(flops)
    target = law.loss(reference.n_params, reference.tokens)
    n_params, tokens = _cheapest_on_iso_loss(law, target, inference_tokens)
    return InferenceAwareAllocation(n_params, tokens, inference_tokens, target, reference)


def inference_aware_for_budget(
    flops: float, inference_tokens: float, law: ParametricLoss = HOFFMANN_2022
) -> InferenceAwareAllocation:
    """The Sardana-optimal model whose *training* costs exactly `flops`.

    Bisect on the target loss: at the compute-optimal loss for `flops` the inference-aware model
    trains with ≥ `flops`; at higher losses it gets cheaper. `reference` stays the compute-optimal
    model for `flops` (which reaches a lower loss)."""
    if inference_tokens < 0:
        raise ValueError(f"inference_tokens must be >= 0, got {inference_tokens}")
    reference = law.optimal_allocation(flops)
    if inference_tokens == 0:
        loss = law.loss(reference.n_params, reference.tokens)
        return InferenceAwareAllocation(reference.n_params, reference.tokens, 0.0, loss, reference)

    def training_cost(loss: float) -> float:
        return training_flops(*_cheapest_on_iso_loss(law, loss, inference_tokens))

    low = law.loss(reference.n_params, reference.tokens)
    high = law.E + 2.0 * (low - law.E)
    while training_cost(high) > flops:
        high = law.E + 2.0 * (high - law.E)
    for _ in range(200):
        mid = (low + high) / 2.0
        if training_cost(mid) > flops:
            low = mid
        else:
            high = mid
        if high - low < 1e-12 * high:
            break
    n_params, tokens = _cheapest_on_iso_loss(law, high, inference_tokens)
    return InferenceAwareAllocation(n_params, tokens, inference_tokens, high, reference)
