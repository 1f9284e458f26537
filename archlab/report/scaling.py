"""Scaling fits for archlab-report (``scaling=<axis>``): per variant, the final loss against training compute C
and against non-embedding parameters N, L = a·X^(−b) + e fitted seed by seed, and how much more compute
the baseline needs to reach each variant's loss. The arithmetic is ``archlab.report.stats``."""

from __future__ import annotations

import csv
import math
import statistics
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from archlab.errors import ConfigError
from archlab.figures import pyplot, save_figure
from archlab.report.stats import Interval, PowerLaw, compute_multipliers, fit_power_law, geometric_mean, t_interval
from archlab.report.text import label, plus_minus

if TYPE_CHECKING:
    from archlab.report.runs import Variant

# what each fit's x is: the figure archlab.report.runs.run_figures reads from each run's summary
X_FIGURES = {"C": "training FLOPs", "N": "params non_embedding"}
MULTIPLIER_POINTS = 5  # compute values, log-spaced over the variant's observed range, the multiplier is taken at
PARAMETERS = ("a", "b", "e")


def check_scaling(axis: str, variants: list[Variant], metric: str) -> None:
    """Refuse, before any work, a scaling report that cannot fit: an accuracy (a power law falling to an
    offset is a loss's shape), fewer than 3 sizes (three parameters), or runs without training FLOPs."""
    if metric.rsplit("/", 1)[-1] not in ("loss", "ppl"):
        raise ConfigError(
            "metric", metric, "a loss or perplexity for scaling= (L = a·C^(−b) + e is a loss's shape): e.g. val/loss"
        )
    sizes = {v.settings[axis] for v in variants if v.per_seed}
    if len(sizes) < 3:
        raise ConfigError(
            "scaling", axis, f"an axis with completed runs at 3 or more values (a, b and e): this one has {len(sizes)}"
        )
    if not any(X_FIGURES["C"] in v.per_seed for v in variants):
        raise ConfigError(
            "scaling", axis, "runs whose summary.json records throughput (flops_per_s, train_seconds): none here do"
        )


@dataclass
class ScalingFit:
    """One variant's fit against one x (``C`` or ``N``): each seed's points and fit, and a, b, e over seeds."""

    settings: dict[str, str]
    x: str
    points: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    fits: dict[str, PowerLaw] = field(default_factory=dict)

    def parameter(self, name: str) -> Interval:
        return t_interval(getattr(f, name) for f in self.fits.values())

    @cached_property
    def curve(self) -> PowerLaw:
        """The curve the report draws, solves and gives a, b, e of: one fit to every seed's points together
        (one seed: its own fit). Not the seeds' mean a, b and e: with three sizes each seed's fit is exact,
        and where one seed's e sits at its bound and another's does not, their mean curve misses the data."""
        if len(self.fits) == 1:
            return next(iter(self.fits.values()))
        try:
            return fit_power_law(*zip(*(p for pts in self.points.values() for p in pts)))
        except (ValueError, RuntimeError):  # no convergence on the pooled points: the seeds' mean parameters
            a, b, e = (self.parameter(p).mean for p in PARAMETERS)
            return PowerLaw(a, b, e)

    @property
    def x_range(self) -> tuple[float, float]:
        xs = [x for pts in self.points.values() for x, _ in pts]
        return min(xs), max(xs)


def fit_scaling(variants: list[Variant], axis: str, metric: str, tuned: Optional[str] = None) -> list[ScalingFit]:
    """For each group of variants that differ only in ``axis`` (and ``tuned``, best_over's axis, each size at
    its own best value), and each x: a fit per seed with points at 3 or more distinct x (seeds with fewer,
    or whose fit fails to converge, are left out)."""
    groups: dict[tuple, list[Variant]] = {}
    for v in variants:
        groups.setdefault(tuple((k, x) for k, x in v.settings.items() if k not in (axis, tuned)), []).append(v)
    fits = []
    for rest, members in groups.items():
        for x, figure in X_FIGURES.items():
            found = ScalingFit(dict(rest), x)
            for v in members:
                xs, losses = v.per_seed.get(figure, {}), v.per_seed.get(f"final {metric}", {})
                for seed in (s for s in xs if s in losses):
                    found.points.setdefault(seed, []).append((xs[seed], losses[seed]))
            for seed, pts in found.points.items():
                try:
                    found.fits[seed] = fit_power_law(*zip(*pts))
                except (ValueError, RuntimeError):  # too few sizes for this seed, or no convergence
                    continue
            found.points = {s: p for s, p in found.points.items() if s in found.fits}
            if found.fits:
                fits.append(found)
    return fits


@dataclass
class Multiplier:
    """How much more compute the baseline's fit needs for the variant's fitted loss, at log-spaced compute
    values over the variant's range; None at a point where the baseline's fit does not reach that loss
    within the baseline's observed compute."""

    fit: ScalingFit
    baseline: ScalingFit
    at: list[float]
    ratios: list[Optional[float]]

    @property
    def inside(self) -> list[float]:
        return [r for r in self.ratios if r is not None]


def multipliers(fits: list[ScalingFit], key: str, value: str) -> list[Multiplier]:
    """Each compute fit whose ``key`` is not ``value`` against the fit with ``value`` and the same other settings."""
    compute = [f for f in fits if f.x == "C"]
    out = []
    for f in compute:
        if f.settings[key] == value:
            continue
        others = {k: x for k, x in f.settings.items() if k != key}
        base = next(
            (
                b
                for b in compute
                if b.settings[key] == value and {k: x for k, x in b.settings.items() if k != key} == others
            ),
            None,
        )
        if base is not None:
            at = list(np.geomspace(*f.x_range, MULTIPLIER_POINTS))
            out.append(Multiplier(f, base, at, compute_multipliers(f.curve, base.curve, at, base.x_range)))
    return out


def _parameter_text(fit: ScalingFit, name: str) -> str:
    """The pooled fit's value ± the 95% half-width of the seeds' own fits; for one seed the fit's value ± its
    standard error, marked (SE)."""
    bounded = sum(name in f.at_bound for f in fit.fits.values())
    flag = f" (at its bound in {bounded} of {len(fit.fits)} seeds: no power law)" if bounded else ""
    if len(fit.fits) == 1:
        only = next(iter(fit.fits.values()))
        value, spread = getattr(only, name), only.stderr[PARAMETERS.index(name)]
        return _value(value, spread) + (" (SE)" if math.isfinite(spread) else " (exact fit: no SE)") + flag
    return _value(getattr(fit.curve, name), fit.parameter(name).half_width) + flag


def _value(value: float, spread: float) -> str:
    if value != 0 and not 1e-3 <= abs(value) < 1e5:
        return f"{value:.3g}" + (f" ± {spread:.2g}" if math.isfinite(spread) and spread > 0 else "")
    return plus_minus(value, spread)


def _times(r: float) -> str:
    return f"{r:.3g}×"


def multiplier_text(m: Multiplier) -> str:
    base = label(m.baseline.settings)
    span = f"C = {m.at[0]:.3g} to {m.at[-1]:.3g}"
    inside = m.inside
    if not inside:
        return f"outside range: {base}'s fit does not reach its fitted loss within {base}'s observed compute ({span})"
    text = (
        f"{base} needs {_times(geometric_mean(inside))} the compute for the same loss (geometric mean over "
        f"{len(inside)} points, {span}; median {_times(statistics.median(inside))}, range {_times(min(inside))} to "
        f"{_times(max(inside))})"
    )
    missed = len(m.ratios) - len(inside)
    return text + (f"; {missed} of {len(m.ratios)} points outside range" if missed else "")


def scaling_section(
    fits: list[ScalingFit], found: list[Multiplier], axis: str, metric: str, plot: Optional[Path]
) -> list[str]:
    rest = list(fits[0].settings) if fits else []
    lines = [
        "",
        f"## Scaling with {axis}",
        "",
        f"L = a·X^(−b) + e fitted to the final {metric} of each seed's runs across {axis}, in log space with "
        "e ≥ 0: X = C, training FLOPs (the analytic FLOPs per token × the tokens trained, as the run's throughput "
        "record gives them: FLOP/s × training seconds), or N, non-embedding parameters. "
        "a, b, e: one fit to every seed's points together (the curve drawn and solved for multipliers) ± the 95% t "
        "half-width of the seeds' own fits; with one seed, the fit's standard error (SE). "
        "Every seed's fit: scaling.csv." + (f" {plot.name}: the points and fits." if plot else ""),
        "",
        "| " + " | ".join([*rest, "X", "seeds", "a", "b", "e"]) + " |",
        "|" + "---|" * (len(rest) + 5),
    ]
    for f in fits:
        cells = [_parameter_text(f, p) for p in PARAMETERS]
        lines.append("| " + " | ".join([*f.settings.values(), f.x, str(len(f.fits)), *cells]) + " |")
    if found:
        lines += ["", "Compute multipliers (how much more training compute the baseline needs):", ""]
        lines += [f"- {label(m.fit.settings)}: {multiplier_text(m)}" for m in found]
    return lines


def write_scaling_csv(fits: list[ScalingFit], found: list[Multiplier], path: Path) -> Path:
    """scaling.csv: every seed's fit (with its standard errors) and each variant's fit to all seeds' points
    (seed ``all``, with the 95% half-width of the seeds' fits), its compute multiplier against the baseline on
    that row."""
    rest = list(fits[0].settings) if fits else []
    by_fit = {id(m.fit): m for m in found}
    header = [*rest, "X", "seed", "points", *[f"{p}{s}" for p in PARAMETERS for s in ("", " se", " ci95")]]
    header += [
        "multiplier geomean",
        "multiplier median",
        "multiplier min",
        "multiplier max",
        "multiplier points",
        "multiplier at C",
        "at bound",
    ]
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(header)
        for f in fits:
            for seed, fit in f.fits.items():
                cells = [x for p in PARAMETERS for x in (getattr(fit, p), fit.stderr[PARAMETERS.index(p)], "")]
                bound = " ".join(fit.at_bound)
                writer.writerow([*f.settings.values(), f.x, seed, len(f.points[seed]), *cells, *[""] * 6, bound])
            cells = []
            for p in PARAMETERS:
                i = f.parameter(p)
                cells += [getattr(f.curve, p), "", i.half_width if math.isfinite(i.half_width) else ""]
            m = by_fit.get(id(f))
            inside = m.inside if m else []
            summary = (
                [geometric_mean(inside), statistics.median(inside), min(inside), max(inside)] if inside else [""] * 4
            )
            points = f"{len(inside)}/{len(m.ratios)}" if m else ""
            each = (
                " ".join(f"{c:.4g}:{'outside' if r is None else f'{r:.4g}'}" for c, r in zip(m.at, m.ratios))
                if m
                else ""
            )
            n_points = sum(len(p) for p in f.points.values())
            writer.writerow([*f.settings.values(), f.x, "all", n_points, *cells, *summary, points, each, ""])
    return path


def plot_scaling(fits: list[ScalingFit], axis: str, metric: str, out: Path) -> Path:
    """scaling.png: log-log, final ``metric`` against C and against N, each seed's points and the fit to all of them."""
    from matplotlib.ticker import FormatStrFormatter

    fig, axes = pyplot().subplots(1, 2, figsize=(11, 4.5))
    for ax, (x, figure) in zip(axes, X_FIGURES.items()):
        for f in (f for f in fits if f.x == x):
            xs = np.geomspace(*f.x_range, 50)
            (line,) = ax.plot(xs, f.curve(xs), label=label(f.settings))
            pts = [p for seed_points in f.points.values() for p in seed_points]
            ax.plot(*zip(*pts), "o", ms=4, alpha=0.6, color=line.get_color())
        ax.set(xscale="log", yscale="log", xlabel=f"{x}: {figure}", ylabel=f"final {metric}")
        for axis_format in (ax.yaxis.set_major_formatter, ax.yaxis.set_minor_formatter):  # 2.5, not 2.5×10⁰
            axis_format(FormatStrFormatter("%.3g"))
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"final {metric} across {axis}: L = a·X^(−b) + e per variant (points: every seed)")
    return save_figure(fig, out / "scaling.png")
