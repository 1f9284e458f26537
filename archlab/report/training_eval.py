"""The evaluation during training (``callbacks.evaluation``) in the report: each variant's curve of every
``eval/<set or task>/<metric>`` beside a validation metric's, the mean over its seeds with the 95% t
interval at each step, drawn (eval_curves.png), tabulated (report.md, at a few steps) and written whole
(eval_curves.csv)."""

from __future__ import annotations

import csv
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from archlab.figures import PANEL, colours, pyplot, save_figure
from archlab.report.runs import Run, Variant, finite_number, training_evaluations
from archlab.report.stats import Interval, t_interval
from archlab.report.text import label, plus_minus, values_label

TABLE_STEPS = 6  # steps per metric in report.md's table (the last always among them); the CSV has every one


def eval_metrics(variants: list[Variant]) -> list[str]:
    """Every metric the completed runs evaluated during training, sorted."""
    found = {
        key
        for v in variants
        for r in v.completed
        for entry in training_evaluations(r.summary or {})
        for key in entry
        if key.startswith("eval/")
    }
    return sorted(found)


def run_curve(run: Run, metric: str) -> dict[int, float]:
    """Step -> value of ``metric`` in one run: its evaluations during training for an ``eval/`` metric,
    else its validations (summary.json's history)."""
    summary = run.summary or {}
    history = (
        training_evaluations(summary)
        if metric.startswith("eval/")
        else ((summary.get("metrics") or {}).get("history") or [])
    )
    return {int(h["step"]): float(h[metric]) for h in history if finite_number(h.get(metric)) is not None}


@dataclass
class Curve:
    """A variant's ``metric`` at each step every one of its completed runs reached: the interval over runs."""

    variant: Variant
    metric: str
    points: dict[int, Interval]


def curve(variant: Variant, metric: str) -> Optional[Curve]:
    runs = [c for c in (run_curve(r, metric) for r in variant.completed) if c]
    if not runs:
        return None
    steps = sorted(set.intersection(*(set(c) for c in runs)))
    return Curve(variant, metric, {s: t_interval(c[s] for c in runs) for s in steps})


def curves(variants: list[Variant], metrics: list[str]) -> list[Curve]:
    return [c for metric in metrics for v in variants if (c := curve(v, metric)) is not None]


def _shown_steps(steps: list[int]) -> list[int]:
    """Up to ``TABLE_STEPS`` of ``steps``, evenly spread, the last among them."""
    if len(steps) <= TABLE_STEPS:
        return steps
    picks = {round(i * (len(steps) - 1) / (TABLE_STEPS - 1)) for i in range(TABLE_STEPS)}
    return [steps[i] for i in sorted(picks)]


def section(found: list[Curve], metrics: list[str], plot: Optional[Path], table: Path) -> list[str]:
    """Markdown: per metric, each variant's mean ± 95% CI half-width at a few steps."""
    lines = [
        "",
        "## Evaluation during training",
        "",
        "Each variant's metrics of `callbacks.evaluation` at the steps every one of its completed runs was "
        "evaluated: mean ± the half-width of the 95% t interval over its runs (n runs; one run: no interval)."
        + (f" {plot.name}: the curves beside the validation's." if plot else "")
        + f" Every step: {table.name}.",
    ]
    for metric in metrics:
        mine = [c for c in found if c.metric == metric]
        steps = _shown_steps(sorted({s for c in mine for s in c.points}))
        lines += ["", f"### {metric}", "", "| variant | n | " + " | ".join(f"step {s}" for s in steps) + " |"]
        lines.append("|" + "---|" * (2 + len(steps)))
        for c in mine:
            n = max(i.n for i in c.points.values()) if c.points else 0
            cells = [_cell(c.points[s]) if s in c.points else "-" for s in steps]
            lines.append(f"| {label(c.variant.settings)} | {n} | " + " | ".join(cells) + " |")
    return lines


def _cell(i: Interval) -> str:
    return plus_minus(i.mean, i.half_width if math.isfinite(i.half_width) else 0.0)


def write_csv(found: list[Curve], path: Path) -> Path:
    """One row per variant, metric and step: its settings, n, mean, std and ci95 (blank for one run)."""
    axes = list(found[0].variant.settings) if found else []
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow([*axes, "metric", "step", "n", "mean", "std", "ci95"])
        for c in found:
            for step, i in c.points.items():
                ci = i.half_width if math.isfinite(i.half_width) else ""
                writer.writerow([*c.variant.settings.values(), c.metric, step, i.n, i.mean, i.std, ci])
    return path


def plot(found: list[Curve], panels: list[str], out: Path) -> Path:
    """eval_curves.png: a panel per metric (the validation metric first), each with its own y axis, a line
    per variant (mean over runs) in a band of its 95% interval."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    names = list(dict.fromkeys(values_label(c.variant.settings) for c in found))
    palette = colours(names)
    ncols = min(4, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    fig, axes = plt.subplots(
        nrows,
        ncols,
        sharex=True,
        squeeze=False,
        figsize=(PANEL[0] * ncols + 1.8, PANEL[1] * nrows + 0.8),
        layout="constrained",
    )
    flat = list(axes.flat)
    for ax, metric in zip(flat, panels):
        for c in (c for c in found if c.metric == metric):
            steps = list(c.points)
            means = [i.mean for i in c.points.values()]
            widths = [i.half_width if math.isfinite(i.half_width) else 0.0 for i in c.points.values()]
            colour = palette[values_label(c.variant.settings)]
            ax.plot(steps, means, marker=".", ms=4, color=colour)
            ax.fill_between(
                steps,
                [m - w for m, w in zip(means, widths)],
                [m + w for m, w in zip(means, widths)],
                color=colour,
                alpha=0.2,
            )
        ax.set_title(metric, fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
    for ax in flat[len(panels) :]:
        ax.set_visible(False)
    axis_names = ", ".join(found[0].variant.settings) if found else ""
    fig.suptitle("evaluation during training beside validation (mean over seeds, 95% CI band)", fontsize=10)
    fig.supxlabel("step", fontsize=9)
    handles = [Line2D([], [], color=palette[n], marker="o", label=n) for n in names]
    fig.legend(handles=handles, title=axis_names or None, loc="outside right", fontsize=7, title_fontsize=8)
    return save_figure(fig, out / "eval_curves.png")
