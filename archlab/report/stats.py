"""The arithmetic behind archlab-report's statistics: Student t intervals, seed-paired differences, the
best value of a tuned axis, power-law fits L = a·x^(−b) + e and compute multipliers between two fits.

Pure numpy and scipy (no torch, no files), so every figure a report states can be checked by hand.
"""

from __future__ import annotations

import math
import re
import statistics
import warnings
from dataclasses import dataclass
from typing import Hashable, Iterable, Mapping, Optional, Sequence, TypeVar

import numpy as np

CONFIDENCE = 0.95
K = TypeVar("K", bound=Hashable)


@dataclass(frozen=True)
class Interval:
    """A mean with its sample standard deviation, count and the half-width of its two-sided Student t
    interval (``nan`` for one value: one value gives no interval)."""

    mean: float
    std: float
    n: int
    half_width: float

    @property
    def low(self) -> float:
        return self.mean - self.half_width

    @property
    def high(self) -> float:
        return self.mean + self.half_width

    @property
    def excludes_zero(self) -> bool:
        return self.n > 1 and (self.low > 0 or self.high < 0)


def t_interval(values: Iterable[float], confidence: float = CONFIDENCE) -> Interval:
    """Mean ± t_{(1+confidence)/2, n−1} · s/√n of ``values`` (s the sample standard deviation)."""
    from scipy.stats import t

    xs = [float(v) for v in values]
    if not xs:
        raise ValueError("an interval needs at least one value")
    n, mean = len(xs), statistics.fmean(xs)
    if n == 1:
        return Interval(mean, 0.0, 1, math.nan)
    std = statistics.stdev(xs)
    return Interval(mean, std, n, float(t.ppf((1 + confidence) / 2, n - 1)) * std / math.sqrt(n))


def paired_difference(values: Mapping[K, float], baseline: Mapping[K, float]) -> Optional[Interval]:
    """The t interval of ``values[s] − baseline[s]`` over the seeds ``s`` present in both (pairing removes
    what a seed does to every variant alike); None when they share no seed."""
    common = [s for s in values if s in baseline]
    return t_interval(values[s] - baseline[s] for s in common) if common else None


LOWER_IS_BETTER = ("loss", "ppl", "nll", "perplexity", "word_perplexity", "byte_perplexity", "bits_per_byte")


def higher_is_better(metric: str) -> bool:
    """Accuracies are better higher; losses and perplexities lower. An evaluation's metric (archlab-eval's
    ``eval <task> <metric>``, ``eval/<task>/<metric>`` during training: lm-eval's acc, acc_norm,
    exact_match, f1...) is better higher unless it is a loss or perplexity (``LOWER_IS_BETTER``)."""
    if metric.startswith(("eval ", "eval/")):
        name = re.split(r"[/ ]", metric)[-1]
        return re.split(r"[,.]", name)[0] not in LOWER_IS_BETTER
    return metric.rsplit("/", 1)[-1] == "acc"


def best_setting(means: Mapping[K, float], higher: bool) -> K:
    """The key with the best mean (the first one on a tie)."""
    if not means:
        raise ValueError("no setting to choose from")
    pick = max if higher else min
    return pick(means, key=lambda k: means[k])


@dataclass(frozen=True)
class PowerLaw:
    """L(x) = a·x^(−b) + e; ``stderr`` holds the standard errors of (a, b, e) from the fit's covariance
    (inf where the points leave a parameter undetermined, e.g. three points for three parameters), and
    ``at_bound`` the parameters the fit pushed to a bound that no power law in the data would need (b at 0
    or at its maximum, e at the lowest loss): points that do not fall as a power law."""

    a: float
    b: float
    e: float
    stderr: tuple[float, float, float] = (math.nan, math.nan, math.nan)
    at_bound: tuple[str, ...] = ()

    def __call__(self, x: float | np.ndarray) -> float | np.ndarray:
        return self.a * np.power(x, -self.b) + self.e

    def inverse(self, loss: float) -> float:
        """The x at which the curve reaches ``loss``; inf where it never does (``loss`` at or below the
        asymptote e, or a flat curve)."""
        if loss <= self.e or self.b <= 0 or self.a <= 0:
            return math.inf
        return float(((loss - self.e) / self.a) ** (-1.0 / self.b))


MAX_EXPONENT = 3.0  # b's upper bound: measured data and parameter exponents lie well below 1


def fit_power_law(x: Sequence[float], y: Sequence[float]) -> PowerLaw:
    """Least-squares fit of log y = log(a·x^(−b) + e) with a > 0, 0 ≤ b ≤ 3 and 0 ≤ e ≤ min(y).

    In log space, so a 1e20-FLOP point weighs as much as a 1e12 one; x is scaled by its geometric mean
    (a = A·x0^b) so the optimiser sees numbers near 1. Several starting asymptotes; the best fit is kept."""
    from scipy.optimize import OptimizeWarning, curve_fit

    xs, ys = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
    if len(xs) != len(ys) or len(np.unique(xs)) < 3:
        raise ValueError("a power law with an offset (a, b, e) needs points at 3 or more distinct x")
    if np.any(xs <= 0) or np.any(ys <= 0):
        raise ValueError("a power-law fit needs positive x and y")
    log_x0 = float(np.mean(np.log(xs)))
    u, target = np.log(xs) - log_x0, np.log(ys)
    ceiling = float(ys.min())

    def model(u: np.ndarray, log_amplitude: float, b: float, e: float) -> np.ndarray:
        return np.log(np.exp(log_amplitude - b * u) + e)

    best = None
    for fraction in (0.1, 0.5, 0.9):
        e0 = fraction * ceiling
        slope, intercept = np.polyfit(u, np.log(ys - e0), 1)
        p0 = [intercept, float(np.clip(-slope, 0.01, MAX_EXPONENT - 0.01)), e0]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", OptimizeWarning)  # an exactly determined fit has no covariance
            params, cov = curve_fit(
                model,
                u,
                target,
                p0=p0,
                bounds=([-np.inf, 0.0, 0.0], [np.inf, MAX_EXPONENT, ceiling]),
                maxfev=20_000,
            )
        residual = float(np.sum((model(u, *params) - target) ** 2))
        if best is None or residual < best[0]:
            best = (residual, params, cov)
    _, (log_amplitude, b, e), cov = best
    a = math.exp(log_amplitude + b * log_x0)
    # a = exp(log A + b·log x0): its relative error by the delta method, from the covariance of (log A, b)
    var_log_a = cov[0, 0] + log_x0**2 * cov[1, 1] + 2 * log_x0 * cov[0, 1]

    def standard_error(variance: float) -> float:
        return math.inf if not math.isfinite(variance) or variance < 0 else math.sqrt(variance)

    stderr = (standard_error(a * a * var_log_a), standard_error(cov[1, 1]), standard_error(cov[2, 2]))
    at_bound = ("b",) if b < 1e-6 or b > MAX_EXPONENT - 1e-6 else ()
    at_bound += ("e",) if e > ceiling * (1 - 1e-9) else ()
    return PowerLaw(a, float(b), float(e), stderr, at_bound)


def compute_multipliers(
    variant: PowerLaw, baseline: PowerLaw, xs: Iterable[float], reach: tuple[float, float] = (0.0, math.inf)
) -> list[Optional[float]]:
    """At each x: the x the baseline's curve needs to reach the variant's loss at x, divided by x (above 1:
    the baseline needs that much more); None where the baseline's curve does not reach that loss within
    ``reach`` (the range of x the baseline was observed at; beyond it the ratio is an extrapolation)."""
    out: list[Optional[float]] = []
    for x in xs:
        needed = baseline.inverse(float(variant(x)))
        inside = math.isfinite(needed) and reach[0] * (1 - 1e-9) <= needed <= reach[1] * (1 + 1e-9)
        out.append(needed / x if inside else None)
    return out


def geometric_mean(values: Sequence[float]) -> float:
    return math.exp(statistics.fmean(math.log(v) for v in values))
