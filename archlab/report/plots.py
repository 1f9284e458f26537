"""The report's figures, drawn to stay readable at dozens of variants: small multiples (one panel per
variant, the learning rate or another tuned axis as colour), a distinct colour per key, legends outside
the axes, few tick labels, and a final-value figure sized to its labels; in the look every figure of
archlab shares (``archlab.figures``)."""

from __future__ import annotations

import math
import textwrap
from dataclasses import dataclass
from typing import Optional

from archlab.figures import PANEL, colours, ordered, pyplot

SINGLE_PANEL = 8  # up to this many lines share one panel; more get a panel each
COLUMNS = 4  # panels per row
SINGLE = (6.0, 4.0)  # inches of a figure's only panel
ROW = 0.26  # inches per row of the final-value figure


def log_scale(values: list[float]) -> bool:
    """A log axis for values that are all positive and span more than 10x (learning rates, sizes)."""
    return min(values) > 0 and max(values) > 10 * min(values)


@dataclass
class Line:
    """One line of a small-multiples figure: the panel it is drawn in ("" for a single unnamed panel), its
    colour key ("" for none), its points, error bars (half-widths) and a point to ring (a chosen value)."""

    panel: str
    key: str
    xs: list[float]
    ys: list[float]
    errors: Optional[list[float]] = None
    ring: Optional[tuple[float, float]] = None


def small_multiples(
    lines: list[Line],
    *,
    title: str,
    xlabel: str,
    ylabel: str,
    key_title: str = "",
    x_names: Optional[list[str]] = None,
):
    """One panel per distinct ``panel`` (shared axes, 4 to a row), each line coloured by its key, the keys'
    legend to the right of every panel; a log x axis where the xs are positive and span more than 10x.
    ``x_names``: names for x = 0, 1, ... where the axis is not numeric."""
    plt = pyplot()
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator, NullFormatter

    panels = list(dict.fromkeys(line.panel for line in lines))
    keys = ordered(list(dict.fromkeys(line.key for line in lines)))
    palette = colours(keys)
    ncols = min(COLUMNS, len(panels))
    nrows = math.ceil(len(panels) / ncols)
    width, height = (PANEL[0] * ncols, PANEL[1] * nrows) if len(panels) > 1 else SINGLE
    legend = 1.8 if keys != [""] else 0.0
    fig, axes = plt.subplots(
        nrows,
        ncols,
        sharex=True,
        sharey=True,
        squeeze=False,
        figsize=(width + legend, height + 0.8),
        layout="constrained",
    )
    flat = list(axes.flat)
    for index, (ax, panel) in enumerate(zip(flat, panels)):
        for line in (line for line in lines if line.panel == panel):
            colour = palette[line.key]
            if line.errors is not None:
                ax.errorbar(line.xs, line.ys, yerr=line.errors, marker="o", ms=3, capsize=2, color=colour)
            else:
                ax.plot(line.xs, line.ys, marker=".", ms=4, color=colour)
            if line.ring is not None:
                ax.plot(*line.ring, "o", ms=10, mfc="none", color=colour)
        if panel:
            ax.set_title(panel, fontsize=8)
        ax.grid(alpha=0.3)
        ax.tick_params(labelsize=7)
        if index + ncols >= len(panels):  # the lowest panel of its column: its x tick labels show
            ax.xaxis.set_tick_params(labelbottom=True)
    for ax in flat[len(panels) :]:
        ax.set_visible(False)
    xs = [x for line in lines for x in line.xs]
    first = flat[0]
    if x_names is not None:
        first.set_xticks(range(len(x_names)), x_names)
        for ax in flat[: len(panels)]:
            ax.tick_params(axis="x", labelrotation=30)
    elif xs and log_scale(xs):
        first.set_xscale("log")
        first.xaxis.set_minor_formatter(NullFormatter())  # decades only: minor labels crowd a small panel
    else:
        first.xaxis.set_major_locator(MaxNLocator(4))
    first.yaxis.set_major_locator(MaxNLocator(5))
    fig.suptitle(_wrap(title, width + legend, 10), fontsize=10)
    fig.supxlabel(xlabel, fontsize=9)
    fig.supylabel(ylabel, fontsize=9)
    if keys != [""]:
        handles = [Line2D([], [], color=palette[k], marker="o", label=k) for k in keys]
        fig.legend(handles=handles, title=key_title or None, loc="outside right", fontsize=7, title_fontsize=8)
    return fig


def _wrap(text: str, inches: float, points: float) -> str:
    """``text`` broken into lines that fit ``inches`` at a font of ``points`` (a character: about 0.6 em)."""
    return textwrap.fill(text, width=max(20, int(inches * 72 / (0.6 * points))))


@dataclass
class Point:
    """One point of the final-value figure: its row's label, its colour key ("" for none), mean and spread."""

    row: str
    key: str
    mean: float
    spread: float


def final_figure(points: list[Point], *, title: str, xlabel: str, key_title: str = ""):
    """One row per distinct ``row`` label, read left to right at any count (the labels horizontal, the
    figure as tall as its rows and as wide as its longest label needs); several keys on a row are set a
    little apart and coloured, their legend outside the axes."""
    plt = pyplot()
    from matplotlib.lines import Line2D

    rows = list(dict.fromkeys(p.row for p in points))
    keys = ordered(list(dict.fromkeys(p.key for p in points)))
    palette = colours(keys)
    height = ROW * len(rows) + 1.4
    fig, ax = plt.subplots(figsize=(6.0, height), layout="constrained")
    step = 0.6 / len(keys)
    for p in points:
        y = rows.index(p.row) + (keys.index(p.key) - (len(keys) - 1) / 2) * step
        ax.errorbar([p.mean], [y], xerr=[p.spread], fmt="o", ms=4, capsize=2, color=palette[p.key])
    ax.set_yticks(range(len(rows)), rows, fontsize=7)
    ax.set_ylim(len(rows) - 0.5, -0.5)  # the first row on top, as in the table
    ax.tick_params(axis="x", labelsize=7)
    ax.set_xlabel(xlabel)
    ax.grid(axis="x", alpha=0.3)
    if keys != [""]:
        handles = [Line2D([], [], color=palette[k], marker="o", ls="", label=k) for k in keys]
        fig.legend(handles=handles, title=key_title or None, loc="outside right", fontsize=7, title_fontsize=8)
    fig.canvas.draw()  # measure the labels, then make room for them beside a 4.5-inch plot
    labels = max(t.get_window_extent().width for t in ax.get_yticklabels()) / fig.dpi
    width = labels + 4.5 + (1.5 if keys != [""] else 0.0)
    fig.set_size_inches(width, height)
    fig.suptitle(_wrap(title, width, 9), fontsize=9)
    return fig
