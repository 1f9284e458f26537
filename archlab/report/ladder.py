"""Scaling ladders for archlab-report (``scaling=ND``): every completed run of a sweep over model sizes and
token budgets is one point (N non-embedding parameters, D training tokens, its final loss), fitted with
L(N, D) = E + A/N^α + B/D^β (``archlab.report.ladder_fit``), bootstrapped over runs, and solved for the
compute-optimal N and D per budget C = 6ND: the report's section, ladder.csv and ladder.png."""

from __future__ import annotations

import csv
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

import numpy as np

from archlab.errors import ConfigError
from archlab.figures import pyplot, save_figure
from archlab.report.ladder_fit import CONFIDENCE, PARAMETERS, Bootstrap, Law, bootstrap
from archlab.report.runs import finite_number

if TYPE_CHECKING:
    from archlab.report.runs import Variant

LADDER = "ND"  # scaling=ND: the two-variable fit, where scaling=<axis> fits one axis per variant
N_FIELD, D_FIELD = "parameters.analytic.non_embedding", "throughput.tokens"  # in each run's summary.json
BUDGETS = 4  # compute budgets, log-spaced over the runs' own 6ND
EXTRAPOLATE = (10.0, 100.0)  # and these multiples of the largest, where a ladder is read
SYMBOLS = {"E": "E", "A": "A", "B": "B", "alpha": "α", "beta": "β"}


@dataclass(frozen=True)
class Point:
    run: Path
    n: float
    d: float
    loss: float


@dataclass
class Ladder:
    """The runs' points, the fit with its bootstrap, and the compute budgets it is solved at."""

    points: list[Point]
    fit: Bootstrap
    budgets: list[float]

    @property
    def law(self) -> Law:
        return self.fit.law

    @property
    def largest_run(self) -> float:
        return max(6 * p.n * p.d for p in self.points)


def _figure(summary: dict, dotted: str) -> Optional[float]:
    node = summary
    for key in dotted.split("."):
        node = node.get(key) if isinstance(node, dict) else None
    return finite_number(node)


def ladder_points(variants: list[Variant], metric: str) -> list[Point]:
    """One point per completed run of ``variants`` (every seed its own point), refusing, before any fit, a
    metric that is no loss, a run without N or D in its summary.json, fewer runs than parameters, or a
    single N or D."""
    if not metric.endswith("/loss"):
        raise ConfigError("metric", metric, "a loss for scaling=ND (L(N, D) = E + A/N^α + B/D^β): e.g. val/loss")
    points = []
    for run in (r for v in variants for r in v.completed):
        summary = run.summary or {}
        n, d = _figure(summary, N_FIELD), _figure(summary, D_FIELD)
        loss = finite_number(((summary.get("metrics") or {}).get("final") or {}).get(metric))
        if n is None or n <= 0:
            raise ConfigError("scaling", LADDER, f"runs whose summary.json records {N_FIELD} (N): {run.path} does not")
        if d is None or d <= 0:
            raise ConfigError(
                "scaling",
                LADDER,
                f"runs whose summary.json records {D_FIELD} (D, the tokens trained: callbacks.throughput counts "
                f"them): {run.path} does not",
            )
        if loss is not None and loss > 0:
            points.append(Point(run.path, n, d, loss))
    if len(points) < len(PARAMETERS):
        raise ConfigError(
            "scaling",
            LADDER,
            f"at least {len(PARAMETERS)} completed runs with a final {metric}, one per parameter "
            f"(E, A, B, α, β): this sweep has {len(points)}",
        )
    for name, field, values in (("N", N_FIELD, {p.n for p in points}), ("D", D_FIELD, {p.d for p in points})):
        if len(values) < 2:
            raise ConfigError(
                "scaling",
                LADDER,
                f"runs at 2 or more values of {name} ({field}): every run has {name} = {values.pop():,.0f}",
            )
    return points


def fit_ladder(variants: list[Variant], metric: str) -> Ladder:
    """The ladder of every completed run of ``variants``: the fit, its bootstrap and the budgets."""
    points = ladder_points(variants, metric)
    try:
        fit = bootstrap([p.n for p in points], [p.d for p in points], [p.loss for p in points])
    except RuntimeError as err:
        raise ConfigError("scaling", LADDER, f"runs whose final {metric} L(N, D) fits ({err})") from None
    compute = [6 * p.n * p.d for p in points]
    budgets = [*np.geomspace(min(compute), max(compute), BUDGETS), *(max(compute) * x for x in EXTRAPOLATE)]
    return Ladder(points, fit, [float(c) for c in budgets])


def _g(value: float) -> str:
    """3 significant digits, a power of ten as e4 or e-5 (not e+04)."""
    return f"{value:.3g}".replace("e+0", "e").replace("e+", "e").replace("e-0", "e-")


def _between(low: float, high: float) -> str:
    return f"[{_g(low)}, {_g(high)}]"


def ladder_section(ladder: Ladder, metric: str, plot: Optional[Path]) -> list[str]:
    law, fit = ladder.law, ladder.fit
    level = f"{CONFIDENCE:.0%}"
    lines = [
        "",
        "## Scaling ladder: L(N, D)",
        "",
        f"L(N, D) = E + A/N^α + B/D^β fitted to the final {metric} of {len(ladder.points)} runs (N: non-embedding "
        f"parameters, {N_FIELD}; D: training tokens, {D_FIELD}), Chinchilla's third approach (Hoffmann et al. "
        "2022): Huber loss (δ = 1e-3) on log L, L-BFGS from the best points of their grid of initialisations. "
        f"Intervals: the central {level} of {len(fit.laws)} bootstrap refits over runs (resampled with "
        "replacement). Every figure: ladder.csv." + (f" {plot.name}: the fit and its isoFLOP curves." if plot else ""),
        "",
        "| parameter | fit | " + level + " bootstrap |",
        "|---|---|---|",
    ]
    for name in PARAMETERS:
        lines.append(f"| {SYMBOLS[name]} | {_g(getattr(law, name))} | {_between(*fit.parameter(name))} |")
    if not law.falls:
        return [
            *lines,
            "",
            f"No compute-optimal allocation: the fit has α = {_g(law.alpha)}, β = {_g(law.beta)}, and L has a "
            "minimum along C = 6ND only where it falls with both N and D (α, β > 0).",
        ]
    kept = len(fit.falling)
    lines += [
        "",
        "Compute-optimal allocation at C = 6ND (N_opt = G·(C/6)^(β/(α+β)), D_opt = (C/6)^(α/(α+β))/G, "
        f"G = (αA/(βB))^(1/(α+β))); the last {len(EXTRAPOLATE)} budgets lie beyond the largest run "
        f"({_g(ladder.largest_run)} FLOPs): extrapolated."
        + (f" Intervals over the {kept} refits with α, β > 0." if kept < len(fit.laws) else ""),
        "",
        f"| C (FLOPs) | N_opt | {level} | D_opt | {level} | D/N | L at the optimum |",
        "|---|---|---|---|---|---|---|",
    ]
    for c in ladder.budgets:
        n, d = law.optimum(c)
        n_range, d_range = fit.optimum(c)
        lines.append(
            f"| {_g(c)} | {_g(n)} | {_between(*n_range)} | {_g(d)} | {_between(*d_range)} | {_g(d / n)} | "
            f"{float(law(n, d)):.4f} |"
        )
    return lines


def write_ladder_csv(ladder: Ladder, path: Path) -> Path:
    """ladder.csv, one figure a row (quantity, C, value, the bootstrap interval): the five parameters, then
    N_opt, D_opt and the loss at each budget (where the fit has them), then every run's point and its
    fitted loss."""
    law, fit = ladder.law, ladder.fit
    with path.open("w", newline="") as out:
        writer = csv.writer(out)
        writer.writerow(["quantity", "C", "value", "ci low", "ci high", "run"])
        for name in PARAMETERS:
            writer.writerow([name, "", getattr(law, name), *fit.parameter(name), ""])
        for c in ladder.budgets if law.falls else []:
            n, d = law.optimum(c)
            (n_low, n_high), (d_low, d_high) = fit.optimum(c)
            writer.writerow(["N_opt", c, n, n_low, n_high, ""])
            writer.writerow(["D_opt", c, d, d_low, d_high, ""])
            writer.writerow(["L_opt", c, float(law(n, d)), "", "", ""])
        for p in ladder.points:
            for quantity, value in (("N", p.n), ("D", p.d), ("L", p.loss), ("L fitted", float(law(p.n, p.d)))):
                writer.writerow([quantity, 6 * p.n * p.d, value, "", "", str(p.run)])
    return path


def plot_ladder(ladder: Ladder, metric: str, out: Path) -> Path:
    """ladder.png: left, each size's final loss against D with the fitted L(N, ·); right, isoFLOP curves,
    L along C = 6ND against N at each budget, the runs at their own C and each curve's optimum marked."""
    law = ladder.law
    fig, (left, right) = pyplot().subplots(1, 2, figsize=(11, 4.5))
    sizes = sorted({p.n for p in ladder.points})
    d_all = np.geomspace(min(p.d for p in ladder.points) / 1.5, max(p.d for p in ladder.points) * 1.5, 80)
    for n in sizes:
        (line,) = left.plot(d_all, law(n, d_all), label=f"N = {_g(n)}")
        pts = [(p.d, p.loss) for p in ladder.points if p.n == n]
        left.plot(*zip(*pts), "o", ms=4, color=line.get_color())
    left.set(xscale="log", xlabel=f"D: training tokens ({D_FIELD})", ylabel=f"final {metric}")
    left.set_title(f"E={_g(law.E)}, A={_g(law.A)}, B={_g(law.B)}, α={_g(law.alpha)}, β={_g(law.beta)}", fontsize=9)
    n_all = np.geomspace(min(sizes) / 4, max(sizes) * 30, 120)
    cmap = pyplot().get_cmap("viridis")
    for i, c in enumerate(ladder.budgets):
        colour = cmap(i / max(1, len(ladder.budgets) - 1))
        right.plot(n_all, law(n_all, c / (6 * n_all)), color=colour, label=f"C = {_g(c)}")
        if law.falls:
            n_opt, d_opt = law.optimum(c)
            right.plot([n_opt], [law(n_opt, d_opt)], "*", ms=10, color=colour)
    right.scatter(
        [p.n for p in ladder.points],
        [p.loss for p in ladder.points],
        c="k",
        s=12,
        zorder=3,
        label="runs (each at its own C)",
    )
    right.set(xscale="log", xlabel=f"N: non-embedding parameters ({N_FIELD})", ylabel=f"{metric} at C = 6ND")
    right.set_title("isoFLOP curves (★: compute-optimal N)", fontsize=9)
    optima = [float(law(*law.optimum(c))) for c in ladder.budgets if law.falls]
    right.set_ylim(min(*optima, *(p.loss for p in ladder.points)) * 0.9, max(p.loss for p in ladder.points) * 1.15)
    for ax in (left, right):
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    fig.suptitle(f"Scaling ladder: final {metric} = E + A/N^α + B/D^β ({len(ladder.points)} runs)")
    return save_figure(fig, out / "ladder.png")
