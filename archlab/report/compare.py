"""What a reviewer asks of an ablation table, for archlab-report: each variant's 95% intervals, each
variant against a baseline paired by seed (``baseline=``), and each variant at the best value of a tuned
axis (``best_over=``). The arithmetic is ``archlab.report.stats``; this module picks the runs and writes it out."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Optional

from archlab.errors import ConfigError
from archlab.figures import as_numbers, ordered, save_figure
from archlab.report.plots import SINGLE_PANEL, Line, small_multiples
from archlab.report.runs import figure_of
from archlab.report.stats import Interval, best_setting, higher_is_better, paired_difference, t_interval
from archlab.report.text import difference, label, number, plus_minus, values_label

if TYPE_CHECKING:
    from archlab.report.runs import Variant

METRIC_KINDS = ("final", "best")  # the figures that get intervals: each metric's final and best value


def figures_of(metric: str) -> list[str]:
    """The figures of ``metric`` the report gives intervals: its final and best value, or the one value of
    an archlab-eval metric (``eval <task> <metric>``)."""
    figure = figure_of(metric)
    return [figure] if figure == metric else [f"{kind} {metric}" for kind in METRIC_KINDS]


def axis_values(variants: list[Variant], axis: str) -> list[str]:
    """The values ``axis`` takes among the variants, in first-seen order."""
    return list(dict.fromkeys(v.settings[axis] for v in variants))


def check_axis(option: str, axis: str, axes: list[str], taken: dict[str, Optional[str]]) -> None:
    """Refuse an axis option (``best_over``, ``scaling``) naming no swept axis, or one another option takes."""
    if axis not in axes:
        raise ConfigError(option, axis, f"a swept axis of these runs: {', '.join(axes) or 'none (nothing was swept)'}")
    for other, value in taken.items():
        if value == axis:
            left = ", ".join(a for a in axes if a not in taken.values()) or "none"
            raise ConfigError(option, axis, f"a swept axis other than {other}'s: {left}")


def parse_baseline(raw: str, axes: list[str], variants: list[Variant], taken: tuple[str, ...]) -> tuple[str, str]:
    """``<axis>=<value>`` (the first ``=`` splits) naming a swept axis, not one of the ``taken`` ones
    (best_over's, scaling's), and a value it takes in these runs."""
    free = [a for a in axes if a not in taken]
    key, sep, value = raw.partition("=")
    if not sep or key not in free or value not in axis_values(variants, key):
        choices = "; ".join(f"{a}={'|'.join(axis_values(variants, a))}" for a in free)
        raise ConfigError("baseline", raw, f"<axis>=<value> naming a variant: {choices or 'none (nothing swept)'}")
    return key, value


# ---------------------------------------------------------------- intervals


def interval(variant: Variant, figure: str) -> Optional[Interval]:
    """The t interval of ``figure`` over the variant's completed seeds; None where no seed has it."""
    seeds = variant.per_seed.get(figure)
    return t_interval(seeds.values()) if seeds else None


def interval_columns(figure: str) -> list[str]:
    return [f"{figure} n", f"{figure} ci95"]


def interval_cells(variant: Variant, figure: str) -> list[object]:
    """CSV cells: the count and the 95% half-width (blank for one seed) of a final or best metric."""
    i = interval(variant, figure)
    if i is None:
        return ["", ""]
    return [i.n, i.half_width if math.isfinite(i.half_width) else ""]


def interval_section(variants: list[Variant], metric: str) -> list[str]:
    """Markdown: each variant's final and best ``metric`` as mean ± 95% half-width, n stated."""
    lines = []
    for v in variants:
        found = {figure: interval(v, figure) for figure in figures_of(metric)}
        parts = [f"{figure} {plus_minus(i.mean, i.half_width)}" for figure, i in found.items() if i]
        if not parts:
            continue
        n = max(i.n for i in found.values() if i)
        lines.append(
            f"- {label(v.settings)}: {', '.join(parts)} "
            + (f"(95% CI, {n} seeds)" if n > 1 else "(1 seed: no interval)")
        )
    if not lines:
        return []
    return [
        "",
        "## 95% confidence intervals",
        "",
        "Mean ± the half-width of the two-sided 95% Student t interval over the completed seeds. Every final "
        "and best metric with its std, n and interval: report.csv.",
        "",
        *lines,
    ]


# ---------------------------------------------------------------- best_over


@dataclass
class Choice:
    """One variant of a ``best_over`` report: its settings less the tuned axis, the values swept for it
    (``grid``, failed ones included) and the interval of the leading metric at each value with a completed
    run (``tried``), both in ascending order, and the variant at the value with the best mean."""

    settings: dict[str, str]
    grid: list[str]
    tried: dict[str, Interval]
    chosen: Variant


def choose_best(variants: list[Variant], axis: str, metric: str) -> list[Choice]:
    """For each group of variants that differ only in ``axis``, the value with the best mean final ``metric``
    (lowest loss or perplexity, highest accuracy); groups with no completed run are left out."""
    order = ordered(axis_values(variants, axis))  # as plotted
    groups: dict[tuple, dict[str, Variant]] = {}
    for v in sorted(variants, key=lambda v: order.index(v.settings[axis])):
        rest = tuple((k, x) for k, x in v.settings.items() if k != axis)
        groups.setdefault(rest, {})[v.settings[axis]] = v
    choices = []
    for rest, members in groups.items():
        tried = {value: i for value, v in members.items() if (i := interval(v, figure_of(metric)))}
        if tried:
            value = best_setting({k: i.mean for k, i in tried.items()}, higher_is_better(metric))
            choices.append(Choice(dict(rest), list(members), tried, members[value]))
    return choices


def best_over_section(choices: list[Choice], axis: str, metric: str, plot: Optional[Path]) -> list[str]:
    rest = list(choices[0].settings) if choices else []
    figures = figures_of(metric)
    direction = "higher" if higher_is_better(metric) else "lower"
    lines = [
        "",
        f"## Best {axis} per variant",
        "",
        f"Each variant at the {axis} with the best mean {figures[0]} ({direction} is better) over its completed "
        f"seeds; baseline comparisons and scaling fits take each variant at that value. Cells: mean ± 95% CI "
        f"half-width." + (f" {plot.name}: {metric} against {axis}." if plot else ""),
        "",
        "| " + " | ".join([*rest, axis, "seeds", *figures, f"{figures[0]} by {axis}"]) + " |",
        "|" + "---|" * (len(rest) + 3 + len(figures)),
    ]
    for c in choices:
        cells = []
        for figure in figures:
            i = interval(c.chosen, figure)
            cells.append(plus_minus(i.mean, i.half_width) if i else "-")
        tried = ", ".join(f"{value}: {number(i.mean)}" for value, i in c.tried.items())
        n = len(c.chosen.per_seed.get(figures[0], {}))
        lines.append("| " + " | ".join([*c.settings.values(), c.chosen.settings[axis], str(n), *cells, tried]) + " |")
    return lines


def plot_sensitivity(choices: list[Choice], axis: str, metric: str, out: Path) -> Path:
    """sensitivity.png: the final ``metric`` (mean, 95% interval) against ``axis``, the chosen value ringed:
    the variants in one panel, coloured, up to 8 of them, a panel each beyond; a log x axis where the values
    are positive numbers spanning more than 10x."""
    values = ordered(list(dict.fromkeys(v for c in choices for v in c.tried)))
    numeric = as_numbers(values)
    position = dict(zip(values, numeric if numeric else range(len(values))))
    apart = len(choices) > SINGLE_PANEL
    lines = []
    for c in choices:
        name = values_label(c.settings)
        best = c.chosen.settings[axis]
        lines.append(
            Line(
                panel=name if apart else "",
                key="" if apart else name,
                xs=[position[v] for v in c.tried],
                ys=[i.mean for i in c.tried.values()],
                errors=[i.half_width if math.isfinite(i.half_width) else 0.0 for i in c.tried.values()],
                ring=(position[best], c.tried[best].mean),
            )
        )
    rest = ", ".join(choices[0].settings) if choices else ""
    fig = small_multiples(
        lines,
        title=f"final {metric} against {axis} (mean, 95% CI; ringed: best)"
        + (f"; {'panels' if apart else 'colours'}: {rest}" if rest else ""),
        xlabel=axis,
        ylabel=f"final {metric}",
        key_title="" if apart else rest,
        x_names=None if numeric else values,
    )
    return save_figure(fig, out / "sensitivity.png")


# ---------------------------------------------------------------- baseline


@dataclass
class Comparison:
    """A variant against its baseline: the paired difference (variant − baseline) of each figure the two
    share seeds for; ``baseline`` None where no variant with the baseline value matches it."""

    variant: Variant
    baseline: Optional[Variant]
    differences: dict[str, Interval]


def compare_to_baseline(variants: list[Variant], key: str, value: str, tuned: Optional[str]) -> list[Comparison]:
    """Every variant whose ``key`` is not ``value``, against the variant with ``value`` there and the same
    other settings (``tuned``, the best_over axis, aside: each side at its own best value)."""

    def others(v: Variant) -> dict[str, str]:
        return {k: x for k, x in v.settings.items() if k not in (key, tuned)}

    comparisons = []
    for v in variants:
        if v.settings[key] == value:
            continue
        base = next((b for b in variants if b.settings[key] == value and others(b) == others(v)), None)
        differences = {}
        if base is not None:
            for figure, seeds in v.per_seed.items():
                found = paired_difference(seeds, base.per_seed.get(figure, {}))
                if found:
                    differences[figure] = found
        comparisons.append(Comparison(v, base, differences))
    return comparisons


def comparison_columns(figures: list[str], scope: str = "") -> list[str]:
    """CSV headers of a comparison: the baseline's name, then each figure's paired difference, its n and
    its ci95; ``scope`` (e.g. ``at same optim.lr``) tells the per-value comparisons' columns apart."""
    baseline = f"baseline {scope}".strip()
    return [baseline, *[f"{f} vs {baseline} {s}" for f in figures for s in ("diff", "n", "ci95")]]


def comparison_cells(comparison: Optional[Comparison], figures: list[str], tuned: Optional[str]) -> list[object]:
    if comparison is None:
        return [""] * (1 + 3 * len(figures))
    cells: list[object] = [_name(comparison.baseline, tuned) if comparison.baseline else ""]
    for f in figures:
        d = comparison.differences.get(f)
        cells += ["", "", ""] if d is None else [d.mean, d.n, d.half_width if math.isfinite(d.half_width) else ""]
    return cells


def _name(v: Variant, tuned: Optional[str]) -> str:
    """A variant as the comparisons name it: its settings, the tuned axis's chosen value after them."""
    name = label({k: x for k, x in v.settings.items() if k != tuned})
    return f"{name} at {tuned}={v.settings[tuned]}" if tuned else name


def verdict(d: Interval, metric: str) -> str:
    if d.n < 2:
        return "no interval from one seed"
    if not d.excludes_zero:
        return "the interval includes 0: no difference shown"
    lower = d.high < 0
    better = lower != higher_is_better(metric)
    return f"{'lower' if lower else 'higher'} ({'better' if better else 'worse'})"


def baseline_section(comparisons: list[Comparison], baseline: str, metric: str, tuned: Optional[str]) -> list[str]:
    """Markdown: one line per variant, e.g. ``model/mlp=swiglu: −0.021 ± 0.008 vs model/mlp=gelu (95% CI,
    3 seeds, paired): lower (better)``."""
    lines = [
        "",
        f"## Against the baseline: {baseline}",
        "",
        f"The {figure_of(metric)} of each variant minus its baseline's (the variant with {baseline} and the same other "
        "settings" + (f", each at its own best {tuned}" if tuned else "") + "), paired by seed over the seeds "
        "both completed: mean difference ± the half-width of its 95% t interval, and which way it points where "
        "the interval excludes 0. Every final and best metric: report.csv.",
        "",
    ]
    return lines + [_comparison_line(c, baseline, metric, tuned) for c in comparisons]


def baseline_by_value_section(comparisons: list[Comparison], baseline: str, metric: str, axis: str) -> list[str]:
    """Markdown: with best_over, each variant against its baseline with both at the same value of the tuned
    axis, for every value (ascending): a stability question is answered there, not at the optimum."""
    values = ordered(list(dict.fromkeys(c.variant.settings[axis] for c in comparisons)))
    by_value = sorted(comparisons, key=lambda c: values.index(c.variant.settings[axis]))
    return [
        "",
        f"## Against the baseline at each {axis}",
        "",
        f"As above, with the variant and its baseline at the same {axis}, for every {axis} swept: where the "
        f"best {axis} hides a difference at the others (one variant tolerates a higher one). Columns "
        f"`... vs baseline at same {axis} ...` in report.csv.",
        "",
        *[_comparison_line(c, baseline, metric, axis) for c in by_value],
    ]


def _comparison_line(c: Comparison, baseline: str, metric: str, tuned: Optional[str]) -> str:
    """One variant against its baseline, e.g. ``- model/mlp=swiglu: −0.021 ± 0.008 vs model/mlp=gelu (95% CI,
    3 seeds, paired): lower (better)``."""
    name = _name(c.variant, tuned)
    d = c.differences.get(figure_of(metric))
    if c.baseline is None:
        return f"- {name}: no baseline variant ({baseline} with its other settings) in these runs"
    if d is None:
        return f"- {name}: no completed seed in common with {_name(c.baseline, tuned)}"
    scope = f"95% CI, {d.n} seeds, paired" if d.n > 1 else "1 seed, paired"
    return f"- {name}: {difference(d.mean, d.half_width)} vs {_name(c.baseline, tuned)} ({scope}): {verdict(d, metric)}"
