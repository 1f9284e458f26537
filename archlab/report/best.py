"""What a sweep hands on, for archlab-report: the best run per variant and overall (its directory, its
checkpoint and the command that exports it), and a warning wherever a ``best_over`` choice sits at the
edge of its grid, where the true optimum may lie outside what was swept."""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from archlab.figures import as_numbers
from archlab.report.runs import figure_of, run_figures, run_file
from archlab.report.stats import higher_is_better
from archlab.report.text import label, number

if TYPE_CHECKING:
    from archlab.report.compare import Choice
    from archlab.report.runs import Run, Variant


@dataclass
class BestRun:
    """The completed run with the best final metric among a variant's runs (``settings``; empty for the
    whole sweep), with its checkpoint and the ``archlab-export`` line for it (``out=`` named after it)."""

    settings: Optional[dict[str, str]]  # None: the best of every run
    run: Run
    value: float

    @property
    def name(self) -> str:
        return "overall" if self.settings is None else label(self.settings)

    @property
    def checkpoint(self) -> Optional[Path]:
        return run_file(self.run, ((self.run.summary or {}).get("paths") or {}).get("checkpoint"))

    @property
    def export_command(self) -> str:
        words = "_".join(self.settings.values()) if self.settings else "best"
        out = re.sub(r"[^A-Za-z0-9._-]+", "-", words).strip("-") or "best"
        return f"archlab-export {self.run.path} out=exports/{out}"

    def record(self, metric: str) -> dict[str, Any]:
        """The entry report.json gives it."""
        return {
            "variant": self.settings,
            "run": str(self.run.path),
            f"final {metric}": self.value,
            "checkpoint": str(self.checkpoint) if self.checkpoint else None,
            "export": self.export_command,
        }


def final_value(run: Run, metric: str) -> Optional[float]:
    """The run's final ``metric`` (an archlab-eval metric: its score in eval/results.json)."""
    return run_figures(run).get(figure_of(metric))


def best_runs(variants: list[Variant], metric: str, tuned: Optional[str]) -> list[BestRun]:
    """The best run of the whole sweep first, then of each variant (with ``tuned``, the best_over axis, each
    variant less that axis: its best run at any value); variants with no completed run are left out."""
    groups: dict[tuple, list[Run]] = {}
    for v in variants:
        rest = tuple((k, x) for k, x in v.settings.items() if k != tuned)
        groups.setdefault(rest, []).extend(v.completed)
    found = [b for rest, runs in groups.items() if (b := _best(runs, metric, dict(rest)))]
    overall = _best([b.run for b in found], metric, None)
    return ([overall] if overall else []) + found


def _best(runs: list[Run], metric: str, settings: Optional[dict[str, str]]) -> Optional[BestRun]:
    scored = [(value, r) for r in runs if (value := final_value(r, metric)) is not None]
    if not scored:
        return None
    pick = max if higher_is_better(metric) else min
    value, run = pick(scored, key=lambda pair: pair[0])
    return BestRun(settings, run, value)


def best_runs_section(found: list[BestRun], metric: str) -> list[str]:
    """Markdown: the run to take forward per variant and overall, and how to export it."""
    if not found:
        return []
    lines = [
        "",
        "## Best runs",
        "",
        f"The completed run with the best final {metric} of each variant (of any seed"
        " and, with best_over, at any value of that axis) and overall; the export line writes a Hugging Face "
        "directory. Also in report.json.",
        "",
    ]
    for b in found:
        checkpoint = f"`{b.checkpoint}`" if b.checkpoint else "none kept"
        lines.append(
            f"- {b.name}: `{b.run.path}`, final {metric} {number(b.value)}; checkpoint {checkpoint}; "
            f"export: `{b.export_command}`"
        )
    return lines


@dataclass
class EdgeWarning:
    """A best_over choice at the lowest or highest value swept for its variant."""

    settings: dict[str, str]
    axis: str
    value: str
    edge: str  # "lowest" or "highest"

    @property
    def text(self) -> str:
        return f"the best {self.axis} of {label(self.settings)} is the grid's {self.edge}, {self.value}: widen the grid"


def grid_edges(choices: list[Choice], axis: str) -> list[EdgeWarning]:
    """Each variant whose best value of a numeric ``axis`` is the lowest or highest of two or more it was
    swept at (failed values count: a higher rate that diverged bounds the grid)."""
    warnings = []
    for c in choices:
        value = c.chosen.settings[axis]
        if len(c.grid) > 1 and as_numbers(c.grid) is not None and value in (c.grid[0], c.grid[-1]):
            warnings.append(EdgeWarning(c.settings, axis, value, "lowest" if value == c.grid[0] else "highest"))
    return warnings


def warnings_section(warnings: list[EdgeWarning]) -> list[str]:
    if not warnings:
        return []
    return ["", "## Warnings", "", *[f"- {w.text}" for w in warnings]]
