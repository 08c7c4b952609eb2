"""How big a model, on how many tokens: published scaling laws, inference-aware sizing, own fits.

All compute here is in the scaling-law convention C = 6·N·D (see `compute.training_flops`).

* Chinchilla rule of thumb: ~20 tokens per parameter (Hoffmann et al. 2022, Table 3).
* Hoffmann et al. 2022 parametric fit (Approach 3), L(N, D) = E + A/N^α + B/D^β with the published
  E=1.69, A=406.4, B=410.7, α=0.34, β=0.28 (their Eq. 10), minimised under C = 6ND in closed form
  (their Eq. 4 / App. D.2).
* Kaplan et al. 2020: N_opt = 1.3e9 · C_min^0.73 non-embedding parameters with C_min in PF-days
  (their Fig. 14 and Table 6); tokens here are then D = C / 6N so the budget is spent.
* Inference-aware (Sardana & Frankle 2023): minimise 6·N·D + 2·N·D_inf along the iso-loss curve of
  the Hoffmann fit through the Chinchilla-optimal point.
* Own fits to finished runs: L(C) = a·C^-b + e and L(N, D) of the Hoffmann form, with bootstrap
  uncertainty. `runs_from_mlflow` reads the runs.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import numpy as np

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
# digits; N_opt is sensitive to α and β (see tests/planning/test_scaling.py).
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


# ---------------------------------------------------------------------------------------------
# Fitting your own scaling law to finished runs
# ---------------------------------------------------------------------------------------------

MIN_RUNS_COMPUTE_LAW = 3
MIN_RUNS_PARAMETRIC_LAW = 5
MIN_RUNS_FOR_FLOOR = 4  # L(C) = a·C^-b + e has 3 parameters: identify e only with ≥ 1 residual dof
MIN_DISTINCT_LEVELS = 3  # of N and of D for L(N, D): each power law with its share of E needs three


class NotEnoughRuns(ValueError):
    """Too few (distinct) finished runs to fit the requested law."""


@dataclass(frozen=True)
class RunPoint:
    """One finished training run: its size, data, final validation loss, and compute."""

    n_params: float
    tokens: float
    loss: float
    flops: float | None = None  # None: 6·N·D
    run_id: str = ""

    @property
    def compute(self) -> float:
        return self.flops if self.flops is not None else training_flops(self.n_params, self.tokens)


def _interval(values: np.ndarray, level: float) -> tuple[float, float]:
    tail = (1.0 - level) / 2.0 * 100.0
    low, high = np.percentile(values, [tail, 100.0 - tail])
    return float(low), float(high)


def _power_law_given_floors(
    log_c: np.ndarray, loss: np.ndarray, floors: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each floor e: least squares of log(L - e) = log a - b·log C; returns (log a, b, SSE in L)."""
    x = log_c - log_c.mean()
    y = np.log(loss[None, :] - floors[:, None])
    slope = (y - y.mean(axis=1, keepdims=True)) @ x / (x @ x)
    log_a = y.mean(axis=1) - slope * log_c.mean()
    predicted = np.exp(log_a[:, None] + slope[:, None] * log_c[None, :]) + floors[:, None]
    return log_a, -slope, np.sum((loss[None, :] - predicted) ** 2, axis=1)


def _fit_floor(log_c: np.ndarray, loss: np.ndarray) -> tuple[float, bool]:
    """Profile the SSE over the floor e ∈ [0, min L); (best e, whether the minimum is interior)."""
    top = float(loss.min())
    grid = np.concatenate([[0.0], top * (1.0 - np.geomspace(1.0, 1e-4, 80))[1:]])
    sse = _power_law_given_floors(log_c, loss, grid)[2]
    k = int(np.argmin(sse))
    if k == 0 or k == len(grid) - 1:
        return float(grid[k]), False
    fine = np.linspace(grid[k - 1], grid[k + 1], 101)
    return float(fine[np.argmin(_power_law_given_floors(log_c, loss, fine)[2])]), True


@dataclass(frozen=True)
class ComputeLawFit:
    """L(C) = a·C^-b + e fitted to runs; e = 0 (a pure power law) when the floor is not identified."""

    a: float
    b: float
    e: float
    saturating: bool
    n_runs: int
    rmse: float
    samples: tuple[tuple[float, float, float], ...] = field(repr=False)  # bootstrap (a, b, e)

    @staticmethod
    def _evaluate(a: float, b: float, e: float, flops: float) -> float:
        return a * flops ** (-b) + e

    def predict(self, flops: float) -> float:
        return self._evaluate(self.a, self.b, self.e, flops)

    def interval(self, flops: float, level: float = 0.9) -> tuple[float, float]:
        return _interval(np.array([self._evaluate(a, b, e, flops) for a, b, e in self.samples]), level)

    def formula(self) -> str:
        floor = f" + {self.e:.3f}" if self.saturating else ""
        return f"L(C) = {self.a:.4g}·C^-{self.b:.4f}{floor}"

    def to_dict(self, flops: float | None = None) -> dict:
        out = {"form": self.formula(), "a": self.a, "b": self.b, "e": self.e, "saturating": self.saturating,
               "n_runs": self.n_runs, "rmse": self.rmse, "n_bootstrap": len(self.samples)}
        if flops is not None:
            low, high = self.interval(flops)
            out.update({"at_flops": flops, "predicted_loss": self.predict(flops), "interval_90": [low, high]})
        return out


def fit_compute_law(runs: Sequence[RunPoint], n_bootstrap: int = 200, seed: int = 0) -> ComputeLawFit:
    """Fit L(C) = a·C^-b + e to finished runs (≥ 3 with distinct compute), bootstrap uncertainty.

    Choice of form: with ≥ 4 distinct compute values we profile the least-squares error over the
    floor e ∈ [0, min L); if its minimum is interior, e is identified and kept. Otherwise (3 runs,
    or the best floor is 0 or pinned at the lowest observed loss) we fit the log-linear power law
    L = a·C^-b, which extrapolates optimistically (it never flattens). Uncertainty: refit the
    chosen form on `n_bootstrap` resamples of the runs (with replacement) and report percentiles."""
    distinct = len({run.compute for run in runs})
    if distinct < MIN_RUNS_COMPUTE_LAW:
        raise NotEnoughRuns(
            f"fitting L(C) needs at least {MIN_RUNS_COMPUTE_LAW} finished runs with different compute; "
            f"got {len(runs)} runs with {distinct} distinct compute values"
        )
    log_c = np.log([run.compute for run in runs])
    loss = np.array([run.loss for run in runs], dtype=float)

    def fit(idx: np.ndarray, saturating: bool) -> tuple[float, float, float]:
        floor = _fit_floor(log_c[idx], loss[idx])[0] if saturating else 0.0
        log_a, b, _ = _power_law_given_floors(log_c[idx], loss[idx], np.array([floor]))
        return math.exp(log_a[0]), float(b[0]), floor

    everything = np.arange(len(runs))
    saturating = distinct >= MIN_RUNS_FOR_FLOOR and _fit_floor(log_c, loss)[1]
    a, b, e = fit(everything, saturating)
    needed = MIN_RUNS_FOR_FLOOR if saturating else 2
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_bootstrap):
        idx = rng.integers(0, len(runs), len(runs))
        if len(set(log_c[idx])) >= needed:
            samples.append(fit(idx, saturating))
    rmse = math.sqrt(float(np.mean((loss - (a * np.exp(-b * log_c) + e)) ** 2)))
    return ComputeLawFit(a, b, e, saturating, len(runs), rmse, tuple(samples))


def _nnls_batched(design: np.ndarray, target: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Non-negative least squares for a stack of small designs (G, n, k) by trying every support."""
    stacks, _, k = design.shape
    best_sse = np.full(stacks, np.inf)
    best = np.zeros((stacks, k))
    for size in range(1, k + 1):
        for support in itertools.combinations(range(k), size):
            sub = design[:, :, support]
            gram = np.einsum("gnk,gnj->gkj", sub, sub)
            moments = np.einsum("gnk,n->gk", sub, target)[..., None]
            try:
                coef = np.linalg.solve(gram, moments)[..., 0]
            except np.linalg.LinAlgError:  # a degenerate resample: fall back to the pseudo-inverse
                coef = (np.linalg.pinv(gram) @ moments)[..., 0]
            sse = np.sum((target - np.einsum("gnk,gk->gn", sub, coef)) ** 2, axis=1)
            better = np.all(coef >= 0, axis=1) & (sse < best_sse)
            best_sse[better] = sse[better]
            best[better] = 0.0
            best[np.ix_(better, support)] = coef[better]
    return best, best_sse


def _fit_parametric(n: np.ndarray, d: np.ndarray, loss: np.ndarray) -> tuple[ParametricLoss, float]:
    """L = E + A/N^α + B/D^β by least squares: E, A, B ≥ 0 are linear given (α, β), so search a
    grid of exponents (then two finer grids around the best) and solve the rest exactly."""
    n_ref, d_ref = float(np.exp(np.mean(np.log(n)))), float(np.exp(np.mean(np.log(d))))
    centre, half_width, points = np.array([0.5, 0.5]), 0.48, 25
    for _ in range(3):
        alphas = np.clip(np.linspace(centre[0] - half_width, centre[0] + half_width, points), 0.01, 2.0)
        betas = np.clip(np.linspace(centre[1] - half_width, centre[1] + half_width, points), 0.01, 2.0)
        grid_a, grid_b = (g.ravel() for g in np.meshgrid(alphas, betas, indexing="ij"))
        design = np.stack(
            [np.ones((grid_a.size, n.size)), (n / n_ref)[None, :] ** -grid_a[:, None],
             (d / d_ref)[None, :] ** -grid_b[:, None]],
            axis=2,
        )
        coefs, sse = _nnls_batched(design, loss)
        best = int(np.argmin(sse))
        centre = np.array([grid_a[best], grid_b[best]])
        half_width, points = 2.0 * half_width / (points - 1), 11  # ± two old grid steps, finer
    alpha, beta = centre
    e, a_ref, b_ref = coefs[best]
    law = ParametricLoss(E=float(e), A=float(a_ref * n_ref**alpha), B=float(b_ref * d_ref**beta),
                         alpha=float(alpha), beta=float(beta))
    return law, float(sse[best])


@dataclass(frozen=True)
class ParametricLawFit:
    law: ParametricLoss
    n_runs: int
    rmse: float
    samples: tuple[ParametricLoss, ...] = field(repr=False)

    def predict(self, n_params: float, tokens: float) -> float:
        return self.law.loss(n_params, tokens)

    def interval(self, n_params: float, tokens: float, level: float = 0.9) -> tuple[float, float]:
        return _interval(np.array([law.loss(n_params, tokens) for law in self.samples]), level)

    def optimal_allocation(self, flops: float) -> Allocation:
        return self.law.optimal_allocation(flops, method="own L(N,D) fit")

    def optimal_params_interval(self, flops: float, level: float = 0.9) -> tuple[float, float]:
        return _interval(np.array([law.optimal_allocation(flops).n_params for law in self.samples]), level)

    def to_dict(
        self, n_params: float | None = None, tokens: float | None = None, flops: float | None = None
    ) -> dict:
        out: dict = {"law": self.law.to_dict(), "n_runs": self.n_runs, "rmse": self.rmse,
                     "n_bootstrap": len(self.samples)}
        if n_params is not None and tokens is not None:
            out.update({"predicted_loss": self.predict(n_params, tokens),
                        "interval_90": list(self.interval(n_params, tokens))})
        if flops is not None:
            out.update({"optimal": self.optimal_allocation(flops).to_dict(),
                        "optimal_params_interval_90": list(self.optimal_params_interval(flops))})
        return out


def fit_parametric_law(runs: Sequence[RunPoint], n_bootstrap: int = 50, seed: int = 0) -> ParametricLawFit:
    """Fit L(N, D) = E + A/N^α + B/D^β (Hoffmann form) to ≥ 5 runs spanning ≥ 3 sizes and ≥ 3 token
    counts (with two levels of D any β fits exactly: B/D^β is then only a difference).

    Least squares on the loss (Hoffmann et al. use a Huber loss on log L; with a handful of clean
    runs the difference is small). Uncertainty: bootstrap over runs."""
    sizes, token_counts = {run.n_params for run in runs}, {run.tokens for run in runs}
    if len(runs) < MIN_RUNS_PARAMETRIC_LAW or min(len(sizes), len(token_counts)) < MIN_DISTINCT_LEVELS:
        raise NotEnoughRuns(
            f"fitting L(N, D) needs at least {MIN_RUNS_PARAMETRIC_LAW} finished runs spanning at least "
            f"{MIN_DISTINCT_LEVELS} model sizes and {MIN_DISTINCT_LEVELS} token counts; got {len(runs)} runs, "
            f"{len(sizes)} sizes, {len(token_counts)} token counts"
        )
    n = np.array([run.n_params for run in runs], dtype=float)
    d = np.array([run.tokens for run in runs], dtype=float)
    loss = np.array([run.loss for run in runs], dtype=float)
    law, sse = _fit_parametric(n, d, loss)
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_bootstrap):
        idx = rng.integers(0, len(runs), len(runs))
        if min(len(set(n[idx])), len(set(d[idx]))) >= MIN_DISTINCT_LEVELS:
            samples.append(_fit_parametric(n[idx], d[idx], loss[idx])[0])
    return ParametricLawFit(law, len(runs), math.sqrt(sse / len(runs)), tuple(samples))


# ---------------------------------------------------------------------------------------------
# Reading runs from MLflow
# ---------------------------------------------------------------------------------------------

def runs_from_mlflow(tracking_uri: str, experiment_name: str) -> list[RunPoint]:
    """Finished runs of an MLflow experiment as `RunPoint`s, under the names every Kiln training run logs
    (`training_jobs.scaling_names`): param `model.n_params`, metrics `scaling/tokens`, `scaling/flops` and
    `scaling/final_val_loss`. Runs that are not FINISHED or lack any of these (no validation data) are skipped."""
    from mlflow.tracking import MlflowClient  # optional dependency, only needed here

    from training_jobs import scaling_names as names

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ValueError(f"no MLflow experiment named {experiment_name!r} at {tracking_uri}")
    points: list[RunPoint] = []
    page_token = None
    while True:
        page = client.search_runs(
            [experiment.experiment_id], filter_string="attributes.status = 'FINISHED'", page_token=page_token
        )
        for run in page:
            params, metrics = run.data.params, run.data.metrics
            if names.N_PARAMS not in params or not {names.TOKENS, names.FINAL_VAL_LOSS} <= set(metrics):
                continue
            points.append(
                RunPoint(
                    n_params=float(params[names.N_PARAMS]),
                    tokens=metrics[names.TOKENS],
                    loss=metrics[names.FINAL_VAL_LOSS],
                    flops=metrics.get(names.FLOPS),
                    run_id=run.info.run_id,
                )
            )
        page_token = page.token
        if not page_token:
            return points
