"""Fitting your own scaling law to finished runs, with bootstrap uncertainty.

* L(C) = a·C^-b + e (a pure power law when the floor e is not identified), compute C = 6·N·D unless a
  run logged its own FLOPs (see `compute.training_flops`).
* L(N, D) = E + A/N^α + B/D^β, the Hoffmann et al. 2022 form (their Eq. 2; `scaling.ParametricLoss`),
  whose optimum under C = 6ND is their Eq. 4 / App. D.2.
* `runs_from_mlflow` reads the runs.

The published laws these are compared with live in `scaling`.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from kiln.common.secrets import redact_url
from kiln.planning.compute import training_flops
from kiln.planning.scaling import Allocation, ParametricLoss

MIN_RUNS_COMPUTE_LAW = 3
MIN_RUNS_PARAMETRIC_LAW = 5
MIN_RUNS_FOR_FLOOR = 4  # L(C) = a·C^-b + e has 3 parameters: identify e only with ≥ 1 residual dof
MIN_DISTINCT_LEVELS = 3  # of N and of D for L(N, D): each power law with its share of E needs three


class NotEnoughRuns(ValueError):
    """Too few (distinct) finished runs to fit the requested law."""


class LawNotIdentified(NotEnoughRuns):
    """The runs do not pin a term of the law down: its fitted coefficient is 0, or its exponent is at the edge of
    the range searched (the optimum then divides by 0 or extrapolates from a bound, not from the runs)."""


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


def _fit_parametric(n: np.ndarray, d: np.ndarray, loss: np.ndarray) -> tuple[ParametricLoss, float, str | None]:
    """L = E + A/N^α + B/D^β by least squares: E, A, B ≥ 0 are linear given (α, β), so search a
    grid of exponents (then two finer grids around the best) and solve the rest exactly. Also why the law is not
    identified, or None: A or B is 0 (that term has no support in the runs), or the coarse grid's best α or β is
    its first or last point (the least squares would go on past it)."""
    n_ref, d_ref = float(np.exp(np.mean(np.log(n)))), float(np.exp(np.mean(np.log(d))))
    centre, half_width, points = np.array([0.5, 0.5]), 0.48, 25
    not_identified = []
    for round_ in range(3):
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
        if round_ == 0:
            not_identified = [f"{name} = {value:g}, the edge of the range searched [{grid[0]:g}, {grid[-1]:g}]"
                              for name, value, grid in (("α", grid_a[best], alphas), ("β", grid_b[best], betas))
                              if value in (grid[0], grid[-1])]
        centre = np.array([grid_a[best], grid_b[best]])
        half_width, points = 2.0 * half_width / (points - 1), 11  # ± two old grid steps, finer
    alpha, beta = centre
    e, a_ref, b_ref = coefs[best]
    law = ParametricLoss(E=float(e), A=float(a_ref * n_ref**alpha), B=float(b_ref * d_ref**beta),
                         alpha=float(alpha), beta=float(beta))
    not_identified += [f"{name} = 0 (the loss does not fall with {what} in these runs)"
                       for name, value, what in (("A", law.A, "model size"), ("B", law.B, "tokens")) if value == 0]
    return law, float(sse[best]), "; ".join(not_identified) or None


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
            out["predicted_loss"] = self.predict(n_params, tokens)
            if self.samples:  # none when no resample's law was identified
                out["interval_90"] = list(self.interval(n_params, tokens))
        if flops is not None:
            out["optimal"] = self.optimal_allocation(flops).to_dict()
            if self.samples:
                out["optimal_params_interval_90"] = list(self.optimal_params_interval(flops))
        return out


def fit_parametric_law(runs: Sequence[RunPoint], n_bootstrap: int = 50, seed: int = 0) -> ParametricLawFit:
    """Fit L(N, D) = E + A/N^α + B/D^β (Hoffmann form) to ≥ 5 runs spanning ≥ 3 sizes and ≥ 3 token
    counts (with two levels of D any β fits exactly: B/D^β is then only a difference).

    Least squares on the loss (Hoffmann et al. use a Huber loss on log L; with a handful of clean
    runs the difference is small). Uncertainty: bootstrap over runs, leaving out resamples whose law is not
    identified. Raises LawNotIdentified when the runs' own law is not (a term at 0 or an exponent at the search's
    edge): its optimum would divide by 0 or come from the bound."""
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
    law, sse, not_identified = _fit_parametric(n, d, loss)
    if not_identified:
        raise LawNotIdentified(
            f"L(N, D) is not identified by these {len(runs)} runs: {not_identified}; runs spanning a wider range "
            f"of model sizes and token counts pin it down"
        )
    rng = np.random.default_rng(seed)
    samples = []
    for _ in range(n_bootstrap):
        idx = rng.integers(0, len(runs), len(runs))
        if min(len(set(n[idx])), len(set(d[idx]))) >= MIN_DISTINCT_LEVELS:
            sample, _, sample_not_identified = _fit_parametric(n[idx], d[idx], loss[idx])
            if not sample_not_identified:
                samples.append(sample)
    return ParametricLawFit(law, len(runs), math.sqrt(sse / len(runs)), tuple(samples))


# ---------------------------------------------------------------------------------------------
# Reading runs from MLflow
# ---------------------------------------------------------------------------------------------

def runs_from_mlflow(tracking_uri: str, experiment_name: str) -> list[RunPoint]:
    """Finished runs of an MLflow experiment as `RunPoint`s, under the names every Kiln training run logs
    (`training_jobs.scaling_names`): param `model.n_params`, metrics `scaling/tokens`, `scaling/flops` and
    `scaling/final_val_loss`. Runs that are not FINISHED or lack any of these (no validation data) are skipped, and
    so are continued and non-CLM runs by their params (`names.is_scaling_point`: runs logged before training left
    scaling/* out for them have it); a diverged run's NaN loss is read as it is, and the plan leaves it out, counted
    (plan._own_fit)."""
    from mlflow.tracking import MlflowClient  # optional dependency, only needed here

    from training_jobs import scaling_names as names

    client = MlflowClient(tracking_uri=tracking_uri)
    experiment = client.get_experiment_by_name(experiment_name)
    if experiment is None:
        raise ValueError(f"no MLflow experiment named {experiment_name!r} at {redact_url(tracking_uri)}")
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
            if not names.is_scaling_point(params.get(names.OBJECTIVE), params.get(names.BASE_CHECKPOINT)):
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
