"""archlab-report's ``transfer=<axis>[=<proxy>]`` (with ``best_over``): how the best value of the tuned axis
(a learning rate) moves along another swept axis (the width, the depth), per group of the other settings
(sp, mup): the best by the mean over seeds, a per-seed optimum between grid points, the drift of its log
against the axis' log, and what training at the proxy's best value costs at every value of the axis.
Yang et al. 2022's Fig. 1 is this figure."""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from archlab.errors import ConfigError
from archlab.figures import as_numbers, ordered
from archlab.report.compare import check_axis
from archlab.report.runs import figure_of
from archlab.report.stats import Interval, higher_is_better, paired_difference, t_interval
from archlab.report.text import label, plus_minus

if TYPE_CHECKING:
    from archlab.report.runs import Variant


@dataclass
class Point:
    """One value of the axis within a group: the tuned value with the best mean, the per-seed optimum (of
    log2 of the tuned value: mean and 95% interval over seeds), whether the best mean sits at the grid's
    edge, and the metric at the proxy's best tuned value minus at this value's own, paired by seed."""

    value: str
    best: str
    optimum: Interval
    at_edge: bool
    cost: Optional[Interval]


@dataclass
class Transfer:
    """One group of the other settings: its points along the axis, the proxy's best tuned value, and the
    drift, the per-seed slope of log2(optimum) against log2(axis value) (0: it transfers)."""

    settings: dict[str, str]
    proxy: str
    proxy_best: str
    points: list[Point]
    drift: Optional[Interval]
    curves: dict[str, dict[str, Interval]]  # axis value -> tuned value -> the metric's interval over seeds


def parse(option: str, axes: list[str], variants: list[Variant], tuned: Optional[str]) -> tuple[str, Optional[str]]:
    """``transfer``'s axis and proxy value (None: the smallest), checked against the sweep."""
    axis, _, proxy = option.partition("=")
    if tuned is None:
        raise ConfigError("transfer", option, "with best_over=<the tuned axis>, e.g. best_over=optim.lr")
    check_axis("transfer", axis, axes, {"best_over": tuned})
    values = ordered(list(dict.fromkeys(v.settings[axis] for v in variants)))
    if as_numbers(values) is None or as_numbers(list(dict.fromkeys(v.settings[tuned] for v in variants))) is None:
        raise ConfigError("transfer", option, f"an axis whose values and {tuned}'s are numbers ({axis}: {values})")
    if proxy and proxy not in values:
        raise ConfigError("transfer", option, f"{axis}=<one of {', '.join(values)}> (the proxy), or {axis} alone")
    return axis, proxy or None


def _log_optimum(xs: list[float], ys: list[float]) -> Optional[float]:
    """The minimum of ``ys`` over ``xs`` (log2 of the tuned values): the vertex of the parabola through the
    best point and its two neighbours, kept between them; the best point itself at the grid's edge or
    beside a run that did not complete (inf); None where no run completed."""
    i = min(range(len(ys)), key=lambda k: ys[k])
    if not math.isfinite(ys[i]):
        return None
    if i in (0, len(ys) - 1) or not all(math.isfinite(y) for y in ys[i - 1 : i + 2]):
        return xs[i]
    (x0, x1, x2), (y0, y1, y2) = xs[i - 1 : i + 2], ys[i - 1 : i + 2]
    denominator = (x1 - x0) * (y1 - y2) - (x1 - x2) * (y1 - y0)
    if denominator == 0:
        return x1
    vertex = x1 - 0.5 * ((x1 - x0) ** 2 * (y1 - y2) - (x1 - x2) ** 2 * (y1 - y0)) / denominator
    return min(max(vertex, x0), x2)


def transfers(variants: list[Variant], tuned: str, axis: str, proxy: Optional[str], metric: str) -> list[Transfer]:
    """Per group of the settings other than ``tuned`` and ``axis``: how the best ``tuned`` value moves
    along ``axis`` by the final ``metric`` (a diverged run counts as the worst)."""
    sign = -1.0 if higher_is_better(metric) else 1.0
    figure = figure_of(metric)
    groups: dict[tuple, dict[str, dict[str, Variant]]] = {}
    for v in variants:
        rest = tuple((k, x) for k, x in v.settings.items() if k not in (tuned, axis))
        groups.setdefault(rest, {}).setdefault(v.settings[axis], {})[v.settings[tuned]] = v
    found = []
    for rest, along in groups.items():
        values = ordered(list(along))
        proxy_value = proxy or values[0]
        curves: dict[str, dict[str, Interval]] = {}
        optima: dict[str, dict[str, float]] = {}  # axis value -> seed -> log2 optimum
        points = []
        for value in values:
            grid = ordered(list(along[value]))
            per_seed = {t: along[value][t].per_seed.get(figure, {}) for t in grid}
            curves[value] = {t: t_interval(s.values()) for t, s in per_seed.items() if s}
            if not curves[value]:
                continue
            best = min(curves[value], key=lambda t: sign * curves[value][t].mean)
            seeds = sorted({s for by_seed in per_seed.values() for s in by_seed})
            xs = [math.log2(float(t)) for t in grid]
            # per seed, what to minimise at each grid point; a seed with no completed run there: the worst
            found_optima = {
                s: _log_optimum(xs, [sign * per_seed[t][s] if s in per_seed[t] else math.inf for t in grid])
                for s in seeds
            }
            optima[value] = {s: o for s, o in found_optima.items() if o is not None}
            at_edge = best in (grid[0], grid[-1]) and len(grid) > 1
            points.append(Point(value, best, t_interval(optima[value].values()), at_edge, None))
        proxy_best = next((p.best for p in points if p.value == proxy_value), None)
        if proxy_best is None:
            continue
        for p in points:
            own, at_proxy = along[p.value].get(p.best), along[p.value].get(proxy_best)
            if own is not None and at_proxy is not None:
                cost = paired_difference(at_proxy.per_seed.get(figure, {}), own.per_seed.get(figure, {}))
                p.cost = None if cost is None else Interval(sign * cost.mean, cost.std, cost.n, cost.half_width)
        seeds = sorted({s for by_seed in optima.values() for s in by_seed})
        slopes = []
        for s in seeds:
            pts = [(math.log2(float(v)), o[s]) for v, o in optima.items() if s in o]
            if len(pts) > 1:
                slopes.append(statistics.linear_regression([x for x, _ in pts], [y for _, y in pts]).slope)
        drift = t_interval(slopes) if slopes else None
        found.append(Transfer(dict(rest), proxy_value, proxy_best, points, drift, curves))
    return found


def _lr(log2_value: float) -> str:
    return f"{2**log2_value:.3g}"


def transfer_section(found: list[Transfer], tuned: str, axis: str, metric: str, plot: Optional[Path]) -> list[str]:
    """Markdown: per group, the best value at each point of the axis, the per-seed optimum, the cost of the
    proxy's value, and the drift."""
    if not found:
        return []
    rest = list(found[0].settings)
    lines = [
        "",
        f"## Transfer of {tuned} across {axis}",
        "",
        f"At each {axis}: the {tuned} with the best mean final {metric} over seeds (as best_over chooses; *: at "
        f"the grid's edge), and per seed the optimum between grid points (the vertex of a parabola through the "
        f"best value and its neighbours in log2 {tuned}), mean and 95% interval over seeds. Cost: final {metric} "
        f"at the proxy's best {tuned} minus at this {axis}'s own best, paired by seed (0: nothing lost by "
        f"transferring; {'lower' if higher_is_better(metric) else 'higher'} is worse). Drift: the slope of "
        f"log2(optimum) against log2({axis}), per seed (0: the best {tuned} stays put; -1: it halves each "
        f"time {axis} doubles).",
        "",
        "| "
        + " | ".join([*rest, axis, f"best {tuned} (mean)", "per-seed optimum (95% CI)", "cost of the proxy's"])
        + " |",
        "|" + "---|" * (len(rest) + 4),
    ]
    for t in found:
        for p in t.points:
            o = p.optimum
            interval = f"{_lr(o.mean)} ({_lr(o.low)}–{_lr(o.high)})" if math.isfinite(o.half_width) else _lr(o.mean)
            cost = "-" if p.cost is None else _cost(p.cost)
            name = f"{p.value} (proxy)" if p.value == t.proxy else p.value
            lines.append(
                "| "
                + " | ".join([*t.settings.values(), name, p.best + ("*" if p.at_edge else ""), interval, cost])
                + " |"
            )
    lines.append("")
    for t in found:
        who = label(t.settings) or "all runs"
        if t.drift is None:
            lines.append(f"- {who}: no drift (one value of {axis} with a completed run)")
            continue
        lines.append(
            f"- {who}: drift {plus_minus(t.drift.mean, t.drift.half_width)} ({t.drift.n} seeds); the proxy ({axis}={t.proxy}) chose "
            f"{tuned}={t.proxy_best}"
        )
    if plot is not None:
        lines += ["", f"![transfer]({plot.name})"]
    return lines


def _cost(c: Interval) -> str:
    return plus_minus(c.mean, c.half_width)


def record(found: list[Transfer]) -> list[dict]:
    """report.json's entries."""
    return [
        {
            "settings": t.settings,
            "proxy": t.proxy,
            "proxy_best": t.proxy_best,
            "drift": None if t.drift is None else {"mean": t.drift.mean, "half_width": t.drift.half_width},
            "points": [
                {
                    "value": p.value,
                    "best": p.best,
                    "at_edge": p.at_edge,
                    "log2_optimum": {"mean": p.optimum.mean, "half_width": p.optimum.half_width},
                    "cost": None if p.cost is None else {"mean": p.cost.mean, "half_width": p.cost.half_width},
                }
                for p in t.points
            ],
        }
        for t in found
    ]


def plot_transfer(found: list[Transfer], tuned: str, axis: str, metric: str, out: Path) -> Path:
    """transfer.png: the final ``metric`` against ``tuned``, a panel per group and a line per ``axis`` value
    (mean, 95% interval; ringed: its best), as Yang et al.'s Fig. 1."""
    from archlab.figures import save_figure
    from archlab.report.plots import Line, small_multiples

    lines = []
    for t in found:
        panel = label(t.settings)
        for value, curve in t.curves.items():
            best = next((p.best for p in t.points if p.value == value), None)
            xs = [float(x) for x in curve]
            lines.append(
                Line(
                    panel=panel,
                    key=value,
                    xs=xs,
                    ys=[i.mean for i in curve.values()],
                    errors=[i.half_width if math.isfinite(i.half_width) else 0.0 for i in curve.values()],
                    ring=(float(best), curve[best].mean) if best is not None else None,
                )
            )
    fig = small_multiples(
        lines,
        title=f"final {metric} against {tuned} at each {axis} (mean, 95% CI; ringed: best)",
        xlabel=tuned,
        ylabel=f"final {metric}",
        key_title=axis,
    )
    return save_figure(fig, out / "transfer.png")
