"""The arithmetic of a scaling ladder: L(N, D) = E + A/N^α + B/D^β fitted as Chinchilla's third approach
(Hoffmann et al. 2022, Sec. 3.3 and D.2: Huber loss on log L, L-BFGS from a grid of initialisations), its
bootstrap over runs, and the compute-optimal N and D for a budget C = 6ND in closed form.

Pure numpy and scipy (no files), so every figure of the ladder report can be checked by hand.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass
from typing import Optional, Sequence, Union

import numpy as np

PARAMETERS = ("E", "A", "B", "alpha", "beta")
HUBER_DELTA = 1e-3  # Hoffmann et al.'s δ
# Hoffmann et al.'s grid: α, β ∈ {0, 0.5, ..., 2}, e ∈ {−1, −0.5, ..., 1}, a, b ∈ {0, 5, ..., 25}
GRID = {
    "e": np.arange(-1.0, 1.01, 0.5),
    "a": np.arange(0.0, 25.1, 5.0),
    "b": np.arange(0.0, 25.1, 5.0),
    "alpha": np.arange(0.0, 2.01, 0.5),
    "beta": np.arange(0.0, 2.01, 0.5),
}
STARTS = 8  # L-BFGS runs from this many of the grid's best points (by the objective), not all 4500
LBFGS = {"maxiter": 2000, "ftol": 1e-15, "gtol": 1e-12}  # the objective is ~1e-4: scipy's defaults stop at once
LOG_LIMIT = 700.0  # |log E|, |log A|, |log B| beyond this overflow a float: such a start has diverged
BOOTSTRAP = 200
Values = Union[Sequence[float], np.ndarray]  # one per run
ATTEMPTS = 20  # resamples drawn per one kept, at most
CONFIDENCE = 0.95


@dataclass(frozen=True)
class Law:
    """L(N, D) = E + A/N^α + B/D^β."""

    E: float
    A: float
    B: float
    alpha: float
    beta: float

    def __call__(self, n, d):
        return self.E + self.A / np.power(n, self.alpha) + self.B / np.power(d, self.beta)

    @property
    def falls(self) -> bool:
        """Whether L falls with both N and D (α, β > 0): only then has C = 6ND a compute-optimal N and D."""
        return self.alpha > 0 and self.beta > 0

    def optimum(self, compute):
        """The N and D that minimise L at training compute C = 6ND (Hoffmann et al. eq. 4):
        N_opt = G·(C/6)^(β/(α+β)), D_opt = G⁻¹·(C/6)^(α/(α+β)), G = (αA/(βB))^(1/(α+β))."""
        total = self.alpha + self.beta
        g = (self.alpha * self.A / (self.beta * self.B)) ** (1.0 / total)
        c = np.asarray(compute, dtype=float) / 6.0
        return g * c ** (self.beta / total), c ** (self.alpha / total) / g


def _objective(theta: np.ndarray, log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray) -> tuple[float, np.ndarray]:
    """Σ Huber_δ(LSE(a − α log N, b − β log D, e) − log L) and its gradient in θ = (e, a, b, α, β)."""
    e, a, b, alpha, beta = theta
    terms = np.stack([a - alpha * log_n, b - beta * log_d, np.full_like(log_n, e)])
    top = terms.max(axis=0)
    weights = np.exp(terms - top)
    total = weights.sum(axis=0)
    r = top + np.log(total) - log_l
    small = np.abs(r) <= HUBER_DELTA
    loss = np.where(small, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA)).sum()
    dr = np.where(small, r, HUBER_DELTA * np.sign(r))
    p = weights / total  # softmax: d LSE / d term
    grad = np.array(
        [
            (dr * p[2]).sum(),
            (dr * p[0]).sum(),
            (dr * p[1]).sum(),
            -(dr * p[0] * log_n).sum(),
            -(dr * p[1] * log_d).sum(),
        ]
    )
    return float(loss), grad


def _grid_losses(log_n: np.ndarray, log_d: np.ndarray, log_l: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Every grid point θ and the objective there, in one array operation."""
    thetas = np.array(list(itertools.product(*GRID.values())))
    e, a, b, alpha, beta = (thetas[:, i : i + 1] for i in range(5))
    r = np.logaddexp(np.logaddexp(a - alpha * log_n, b - beta * log_d), e) - log_l
    huber = np.where(np.abs(r) <= HUBER_DELTA, 0.5 * r**2, HUBER_DELTA * (np.abs(r) - 0.5 * HUBER_DELTA))
    return thetas, huber.sum(axis=1)


def _minimise(theta0: np.ndarray, data: tuple[np.ndarray, ...]) -> Optional[tuple[float, np.ndarray]]:
    """L-BFGS from ``theta0``, in coordinates centred on the mean log N and log D (a − α·log N as
    (a − α·mean) − α·(log N − mean)): uncentred, a and α move together and L-BFGS stops far from the optimum."""
    from scipy.optimize import minimize

    log_n, log_d, log_l = data
    mid_n, mid_d = log_n.mean(), log_d.mean()

    def uncentre(t: np.ndarray) -> np.ndarray:
        return t + np.array([0.0, t[3] * mid_n, t[4] * mid_d, 0.0, 0.0])

    start = theta0 - np.array([0.0, theta0[3] * mid_n, theta0[4] * mid_d, 0.0, 0.0])
    centred = (log_n - mid_n, log_d - mid_d, log_l)
    found = minimize(_objective, start, args=centred, jac=True, method="L-BFGS-B", options=LBFGS)
    theta = uncentre(found.x)
    if not np.all(np.isfinite(theta)) or np.any(np.abs(theta[:3]) > LOG_LIMIT):  # E, A or B past a float
        return None
    return float(found.fun), theta


def check_points(n: Values, d: Values, loss: Values) -> None:
    """Refuse points that cannot determine the five parameters: fewer than five, a single N or a single D
    (A and α, or B and β, then have nothing to fit), or any that is not a positive finite number."""
    if not len(n) == len(d) == len(loss):
        raise ValueError(f"N, D and L must have one value per run: {len(n)}, {len(d)} and {len(loss)}")
    for name, values in (("N", n), ("D", d), ("L", loss)):
        if not all(math.isfinite(v) and v > 0 for v in values):
            raise ValueError(f"{name}: every value a positive finite number, got {list(values)}")
    if len(n) < len(PARAMETERS):
        raise ValueError(f"runs: at least {len(PARAMETERS)} (one per parameter: E, A, B, α, β), got {len(n)}")
    for name, values in (("N", n), ("D", d)):
        if len(set(values)) < 2:
            raise ValueError(f"{name}: at least 2 distinct values (every run has {name} = {values[0]:g})")


def fit_law(
    n: Values,
    d: Values,
    loss: Values,
    starts: int = STARTS,
    extra_starts: Sequence[np.ndarray] = (),
) -> Law:
    """The fit of L(N, D) to the runs' (N, D, L): L-BFGS from the ``starts`` best points of Hoffmann et
    al.'s grid (and any ``extra_starts``, θ = (log E, log A, log B, α, β)), the lowest objective kept."""
    check_points(n, d, loss)
    data = tuple(np.log(np.asarray(x, dtype=float)) for x in (n, d, loss))
    thetas, losses = _grid_losses(*data)
    chosen = [*thetas[np.argsort(losses)[:starts]], *extra_starts]
    results = [r for r in (_minimise(np.asarray(t, dtype=float), data) for t in chosen) if r is not None]
    if not results:
        raise RuntimeError("no L-BFGS start converged to finite E, A and B")
    e, a, b, alpha, beta = min(results, key=lambda r: r[0])[1]
    return Law(math.exp(e), math.exp(a), math.exp(b), float(alpha), float(beta))


def theta(law: Law) -> np.ndarray:
    return np.array([math.log(law.E), math.log(law.A), math.log(law.B), law.alpha, law.beta])


@dataclass
class Bootstrap:
    """The fit to every run, and the fits to ``draws`` resamples of the runs (with replacement; a resample
        with a single N or D, or fewer than five distinct runs, is drawn again, up to ``ATTEMPTS`` times as many
    as asked)."""

    law: Law
    laws: list[Law]

    def interval(self, values: Sequence[float]) -> tuple[float, float]:
        """The central ``CONFIDENCE`` percentile interval of a figure's values over the resamples."""
        tail = 100 * (1 - CONFIDENCE) / 2
        low, high = np.percentile(np.asarray(values, dtype=float), [tail, 100 - tail])
        return float(low), float(high)

    def parameter(self, name: str) -> tuple[float, float]:
        return self.interval([getattr(law, name) for law in self.laws])

    @property
    def falling(self) -> list[Law]:
        """The refits whose L falls with both N and D: those with a compute-optimal allocation."""
        return [law for law in self.laws if law.falls]

    def optimum(self, compute: float) -> tuple[tuple[float, float], tuple[float, float]]:
        """The intervals of N_opt and D_opt at ``compute`` over the ``falling`` refits (nan: none)."""
        found = [law.optimum(compute) for law in self.falling]
        if not found:
            return (math.nan, math.nan), (math.nan, math.nan)
        return self.interval([f[0] for f in found]), self.interval([f[1] for f in found])


def bootstrap(n: Values, d: Values, loss: Values, draws: Optional[int] = None, seed: int = 0) -> Bootstrap:
    """``fit_law`` on every run, then on ``draws`` (null: ``BOOTSTRAP``) resamples of the runs (seeded: the
    same intervals each time), each started from the full fit and the grid's best point."""
    draws = BOOTSTRAP if draws is None else draws
    law = fit_law(n, d, loss)
    rng = np.random.default_rng(seed)
    n_, d_, l_ = (np.asarray(x, dtype=float) for x in (n, d, loss))
    laws: list[Law] = []
    for _ in range(ATTEMPTS * draws):  # a ladder so small that most resamples are degenerate stops here
        if len(laws) == draws:
            break
        pick = rng.integers(0, len(n_), len(n_))
        if len(set(pick)) < len(PARAMETERS) or len(set(n_[pick])) < 2 or len(set(d_[pick])) < 2:
            continue
        try:
            laws.append(fit_law(n_[pick], d_[pick], l_[pick], starts=1, extra_starts=[theta(law)]))
        except RuntimeError:
            continue
    return Bootstrap(law, laws)
