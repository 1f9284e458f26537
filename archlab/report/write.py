"""Turn a sweep directory into an ablation table (report.md, report.csv) and plots.

The runs come from ``archlab.report.runs``, which reads each from its ``summary.json`` and
``.hydra/overrides.yaml``; the swept axes are the overrides whose values differ between runs, and runs
that differ only in ``seed`` are one variant.
Validation curves come from each run's summary history: the optimizer step of every validation, kept
whole across resumes. The options beyond the table (baseline comparisons, best_over, scaling fits) are
checked and computed in ``archlab.report.analysis``, written out by ``archlab.report.compare`` and
``archlab.report.scaling``; their arithmetic is ``archlab.report.stats``.
"""

from __future__ import annotations

import csv
import json
import re
import statistics
from pathlib import Path
from typing import Callable, Optional

from archlab.config.commands import ReportConfig
from archlab.errors import ConfigError
from archlab.figures import save_figure
from archlab.report import best, compare, health, stability, training_eval
from archlab.report import ladder as ladders
from archlab.report import scaling as scaling_fits
from archlab.report import transfer as transfer_along
from archlab.report.analysis import Analysis, analyse
from archlab.report.plots import SINGLE_PANEL, Line, Point, final_figure, small_multiples
from archlab.report.runs import (
    EVAL_FIGURE,
    Run,
    Variant,
    figure_of,
    finite_number,
    group_variants,
    load_runs,
    run_figures,
    swept_axes,
    training_evaluations,
)
from archlab.report.stability import Stability
from archlab.report.text import label, plus_minus, values_label


def aggregate(variant: Variant) -> dict[str, tuple[float, float, int]]:
    """Mean, sample standard deviation (0 for one run) and count of every figure over the completed seeds."""
    per_run = [run_figures(r) for r in variant.completed]
    keys = sorted({k for figures in per_run for k in figures})
    out = {}
    for key in keys:
        values = [f[key] for f in per_run if key in f]
        out[key] = (statistics.fmean(values), statistics.stdev(values) if len(values) > 1 else 0.0, len(values))
    return out


def metric_columns(variants: list[Variant], metric: Optional[str] = None) -> list[str]:
    """Final metrics first (``metric``, else the runs' primary metric, leading), then the final metrics of
    the weights' moving average (``ema ...``), best metrics, then cost figures."""
    keys = {k for v in variants for k in aggregate(v)}
    primary = (
        figure_of(metric)
        if metric
        else next(
            (
                f"final {r.summary['primary_metric']['name']}"
                for v in variants
                for r in v.completed
                if r.summary and r.summary.get("primary_metric")
            ),
            None,
        )
    )
    order = [primary] if primary in keys else []
    order += sorted(k for k in keys if k.startswith("final ") and k != primary)
    order += sorted(k for k in keys if k.startswith("ema "))
    order += sorted(k for k in keys if k.startswith("best "))
    order += sorted(k for k in keys if k.startswith(EVAL_FIGURE) and k != primary)
    order += sorted(k for k in keys if k.startswith("matched ")) + (
        ["match residual"] if "match residual" in keys else []
    )
    order += [
        k
        for k in (
            "params total",
            "params non_embedding",
            "params active",
            "params active_non_embedding",
            "flops/token",
            "training FLOPs",
            "KV cache bytes/token",
            "tokens/s",
            "wall time (s)",
            "router max/mean",
            "router cv",
        )
        if k in keys
    ]
    return order


def validation_curve(run: Run, metric: str) -> list[tuple[int, float]]:
    """(optimizer steps done, value) of ``metric`` at every validation, from the run's summary history."""
    history = ((run.summary or {}).get("metrics") or {}).get("history") or []
    history = training_evaluations(run.summary or {}) if metric.startswith("eval/") else history
    return [(h["step"], float(h[metric])) for h in history if finite_number(h.get(metric)) is not None]


def _cell(figure: tuple[float, float, int], seeds: int) -> str:
    """One table cell: the value where the seeds agree (or there is one seed), else mean ± sample std;
    ``(n=k)`` where only k of the variant's ``seeds`` completed seeds have the figure."""
    mean, std, n = figure
    text = plus_minus(mean, std)
    return text if n == seeds else f"{text} (n={n})"


PER_SOURCE = re.compile(r"final val/[^/]+/loss")  # a data mixture's source's own validation loss
TABLE_COSTS = {
    "params total": "params",
    "params active": "active params",
    "flops/token": "FLOPs/token",
    "tokens/s": "tokens/s",
    "router max/mean": "router max/mean",
}


def table_columns(columns: list[str], stats: list[dict]) -> dict[str, str]:
    """The markdown table's figures (key -> header): the leading metric, final (beside it the final of the
    weights' moving average, where the runs kept one: callbacks.ema) and best, each data mixture source's
    final loss (``val/<source>/loss``), archlab-eval's metrics and the final ones evaluated during training,
    then parameters (active ones beside them where some variant, a mixture of experts, has fewer active than
    total), FLOPs/token as trained, tokens/s and a mixture of experts' load max/mean; every other figure is
    in the CSV only."""
    primary = next((c.removeprefix("final ") for c in columns if c.startswith(("final ", EVAL_FIGURE))), None)
    wanted = {f: f for f in compare.figures_of(primary)} if primary else {}
    if primary and f"ema {primary}" in columns:
        wanted = {f"final {primary}": f"final {primary}", f"ema {primary}": f"EMA final {primary}", **wanted}
    wanted.update({c: c for c in columns if PER_SOURCE.fullmatch(c)})
    wanted.update({c: c for c in columns if c.startswith(("final eval/", EVAL_FIGURE))})
    sparse = any(st.get("params active") != st.get("params total") for st in stats)
    return {
        k: header
        for k, header in {**wanted, **TABLE_COSTS}.items()
        if k in columns and (k != "params active" or sparse)
    }


def _csv_header(axes: list[str], columns: list[str], analysis: Analysis, found: Stability) -> list[str]:
    header = [*axes, "runs", "completed", "failed"]
    for c in columns:
        header += [f"{c} mean", f"{c} std", *(compare.interval_columns(c) if _is_metric(c) else [])]
    if analysis.tuned:
        header += [f"{analysis.tuned} chosen", f"{analysis.tuned} at grid edge"]
    metrics = [c for c in columns if _is_metric(c)]
    if analysis.baseline:
        header += compare.comparison_columns(metrics)
    if analysis.by_value:
        header += compare.comparison_columns(metrics, f"at same {analysis.tuned}")
    return header + stability.stability_columns(found)


def _csv_row(v: Variant, figures: dict, columns: list[str], analysis: Analysis, found: Stability) -> list[object]:
    failed = sum(r.status == "failed" for r in v.runs)
    row: list[object] = [*v.settings.values(), len(v.runs), len(v.completed), failed]
    for c in columns:
        row += [figures[c][0], figures[c][1]] if c in figures else ["", ""]
        if _is_metric(c):
            row += compare.interval_cells(v, c)
    if analysis.tuned:
        chosen = {id(c.chosen) for c in analysis.choices}
        edge = next((w.edge for w in analysis.edges if w.settings == _less(v.settings, analysis.tuned)), "")
        row += ["yes" if id(v) in chosen else "no" if v.per_seed else "", edge if id(v) in chosen else ""]
    metrics = [c for c in columns if _is_metric(c)]
    if analysis.baseline:
        mine = next((c for c in analysis.comparisons if c.variant is v), None)
        row += compare.comparison_cells(mine, metrics, analysis.tuned)
    if analysis.by_value:
        mine = next((c for c in analysis.by_value if c.variant is v), None)
        row += compare.comparison_cells(mine, metrics, None)
    return row + stability.stability_cells(found, v)


def _less(settings: dict[str, str], axis: Optional[str]) -> dict[str, str]:
    return {k: x for k, x in settings.items() if k != axis}


def _is_metric(column: str) -> bool:
    return column.startswith((*(f"{kind} " for kind in compare.METRIC_KINDS), EVAL_FIGURE))


def write_report(cfg: ReportConfig) -> dict[str, Path]:
    """Write report.md (a compact table, then the statistics, best runs and stability), report.csv (every
    figure), report.json (best runs, warnings, stability) and PNG plots for the sweep in ``cfg.sweep_dir``,
    into ``cfg.out`` (default: the sweep's directory); return their paths. ``cfg.metric`` (e.g. ``val/loss``)
    leads them and is plotted; default: the runs' primary metric. ``baseline``, ``best_over``, ``scaling``
    and ``transfer``: see ``analyse``; scaling also writes scaling.csv and scaling.png (``scaling=ND``: ladder.csv
    and ladder.png). ``spike_factor``,
    ``spike_window``, ``lr_tolerance``: see ``stability.assess``. ``ignore``: override keys that do not make
    variants (where a run ran: ``trainer.accelerator``); the report names them and the values they took."""
    stability.check_settings(cfg)
    sweep_dir, ignore = cfg.sweep_dir, _ignored_keys(cfg)
    runs = load_runs(sweep_dir)
    if not runs:
        raise ConfigError(
            "sweep_dir", str(sweep_dir), "a directory holding runs (summary.json or .hydra/overrides.yaml)"
        )
    out = Path(cfg.out or sweep_dir)
    if out.exists() and not out.is_dir():
        raise ConfigError(
            "out", str(out), "a directory for report.md, report.csv, report.json and the plots (this path is a file)"
        )
    axes = swept_axes(runs, ignore)
    variants = group_variants(runs, axes)
    pooled = {k: sorted({r.overrides.get(k, "(default)") for r in runs}) for k in ignore}
    stats = [aggregate(v) for v in variants]
    finals = sorted({c.removeprefix("final ") for st in stats for c in st if c.startswith("final ")})
    scores = sorted({c for st in stats for c in st if c.startswith(EVAL_FIGURE)})  # archlab-eval's
    if cfg.metric and (finals or scores) and cfg.metric not in finals + scores:
        raise ConfigError(
            "metric",
            cfg.metric,
            f"a final metric of these runs: {', '.join(finals)}"
            + (f"; or a score: {', '.join(scores)}" if scores else ""),
        )
    columns = metric_columns(variants, cfg.metric)
    leading = next((c.removeprefix("final ") for c in columns if c.startswith(("final ", EVAL_FIGURE))), None)
    analysis = analyse(variants, axes, leading, cfg)
    found = stability.assess(variants, leading, cfg)
    winners = best.best_runs(variants, leading, analysis.tuned) if leading else []
    out.mkdir(parents=True, exist_ok=True)

    csv_path = out / "report.csv"
    with csv_path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(_csv_header(axes, columns, analysis, found))
        for v, st in zip(variants, stats):
            writer.writerow(_csv_row(v, st, columns, analysis, found))
    json_path = out / "report.json"
    record = {
        "metric": leading,
        "best_runs": [b.record(leading) for b in winners] if leading else [],
        "warnings": [
            {"variant": w.settings, "axis": w.axis, "value": w.value, "edge": w.edge, "text": w.text}
            for w in analysis.edges
        ],
        "stability": found.record(),
        **({"transfer": transfer_along.record(analysis.transfers)} if analysis.transfer else {}),
    }
    json_path.write_text(json.dumps(record, indent=2) + "\n")
    written = {"markdown": out / "report.md", "csv": csv_path, "json": json_path}

    colour_axis = analysis.tuned or (stability.LR_AXIS if stability.LR_AXIS in axes else None)
    plots = _plots(variants, stats, columns, colour_axis, out)
    plots |= health.plot_health(variants, out)  # the runs' per-layer health (callbacks.health), where recorded
    # choices and fits come of best_over and scaling (analysis.tuned and .scaling), which analyse refuses
    # unless a run completed: leading is known
    if leading and analysis.tuned and analysis.choices:
        plots["sensitivity"] = compare.plot_sensitivity(analysis.choices, analysis.tuned, leading, out)
    if leading and analysis.transfer and analysis.transfers:
        plots["transfer"] = transfer_along.plot_transfer(analysis.transfers, *analysis.transfer, leading, out)
    if leading and analysis.scaling and analysis.fits:
        plots["scaling"] = scaling_fits.plot_scaling(analysis.fits, analysis.scaling, leading, out)
        written["scaling csv"] = scaling_fits.write_scaling_csv(
            analysis.fits, analysis.multipliers, out / "scaling.csv"
        )
    if leading and analysis.ladder:
        plots["ladder"] = ladders.plot_ladder(analysis.ladder, leading, out)
        written["ladder csv"] = ladders.write_ladder_csv(analysis.ladder, out / "ladder.csv")
    table = table_columns(columns, stats)
    md = [
        f"# Sweep report: `{Path(sweep_dir)}`",
        "",
        f"{len(runs)} runs, {len(variants)} variants, swept: {', '.join(axes) or 'nothing'}"
        + "".join(f"; not a variant (ignore): {k} ({', '.join(v)})" for k, v in pooled.items())
        + ". seeds: completed / all "
        "runs of the variant. A cell is the value where the completed seeds agree, else their mean ± sample std. Every "
        f"figure (each final and best metric, KV-cache bytes/token, wall time...): [{csv_path.name}]({csv_path.name}).",
        "",
        "| " + " | ".join([*axes, "seeds", *table.values()]) + " |",
        "|" + "---|" * (len(axes) + 1 + len(table)),
    ]
    for v, st in zip(variants, stats):
        cells = [_cell(st[c], len(v.completed)) if c in st else "-" for c in table]
        md.append("| " + " | ".join([*v.settings.values(), f"{len(v.completed)}/{len(v.runs)}", *cells]) + " |")
    md += best.warnings_section(analysis.edges)
    if leading:  # without it analyse refuses every option
        md += compare.interval_section(variants, leading)
        if analysis.tuned:
            md += compare.best_over_section(analysis.choices, analysis.tuned, leading, plots.get("sensitivity"))
        if analysis.baseline:
            name = "=".join(analysis.baseline)
            md += compare.baseline_section(analysis.comparisons, name, leading, analysis.tuned)
            if analysis.tuned:
                md += compare.baseline_by_value_section(analysis.by_value, name, leading, analysis.tuned)
        if analysis.transfer:
            md += transfer_along.transfer_section(
                analysis.transfers, *analysis.transfer, leading, plots.get("transfer")
            )
        if analysis.scaling:
            md += scaling_fits.scaling_section(
                analysis.fits, analysis.multipliers, analysis.scaling, leading, plots.get("scaling")
            )
        if analysis.ladder:
            md += ladders.ladder_section(analysis.ladder, leading, plots.get("ladder"))
        md += best.best_runs_section(winners, leading)
    md += stability.stability_section(found)
    problems = [r for r in runs if r.status != "completed"]
    if problems:
        md += ["", "## Runs that did not complete", ""]
        for r in problems:
            error = (r.summary or {}).get("error") or (
                "planned in multirun.yaml, no directory (the sweep stopped first)"
                if not r.started
                else "no summary.json (killed, or still running)"
                if r.summary is None
                else ""
            )
            md.append(
                f"- `{r.path.relative_to(Path(sweep_dir)) if r.path.is_relative_to(Path(sweep_dir)) else r.path}` "
                f"({label(r.overrides)}): **{r.status}** — {error}"
            )
    md += _training_evals(variants, columns, leading, out, plots, written)
    if plots:
        md += ["", "## Plots", ""] + [f"![{p.stem}]({p.name})" for p in plots.values()]
    written["markdown"].write_text("\n".join(md) + "\n")
    return {**written, **plots}


def _training_evals(
    variants: list[Variant],
    columns: list[str],
    leading: Optional[str],
    out: Path,
    plots: dict[str, Path],
    written: dict[str, Path],
) -> list[str]:
    """The evaluations during training: their curves beside a validation metric's (the leading one, else the
    first loss) in eval_curves.png, every step in eval_curves.csv, and report.md's section; nothing where no
    run evaluated during training."""
    metrics = training_eval.eval_metrics(variants)
    if not metrics:
        return []
    validation = [c.removeprefix("final ") for c in columns if c.startswith("final ") and "final eval/" not in c]
    losses = [m for m in validation if m.endswith("/loss")]
    beside = leading if leading in validation else (losses or validation or [None])[0]
    panels = [beside, *metrics] if beside else metrics
    found = training_eval.curves(variants, panels)
    plots["eval_curves"] = training_eval.plot(found, panels, out)
    written["eval curves csv"] = training_eval.write_csv(
        [c for c in found if c.metric in metrics], out / "eval_curves.csv"
    )
    return training_eval.section(found, metrics, plots["eval_curves"], written["eval curves csv"])


def _ignored_keys(cfg: ReportConfig) -> tuple[str, ...]:
    """``cfg.ignore``'s comma-separated override keys, blanks dropped."""
    return tuple(k.strip() for k in (cfg.ignore or "").split(",") if k.strip())


def _plots(
    variants: list[Variant], stats: list[dict], columns: list[str], colour_axis: Optional[str], out: Path
) -> dict[str, Path]:
    """curves.png (the validation curves, mean over seeds) and final.png (the final metric, mean ± std), both
    readable at dozens of variants: see ``_layout``."""
    plots: dict[str, Path] = {}
    primary = next((c for c in columns if c.startswith("final ")), None)
    if primary is None or not variants:
        return plots
    metric = primary[len("final ") :]
    place, panels, key_title = _layout(variants, colour_axis)
    lines = []
    for v in variants:
        curves = [c for c in (validation_curve(r, metric) for r in v.completed) if c]
        if curves:
            steps = sorted(set.intersection(*(set(s for s, _ in c) for c in curves)))
            means = [statistics.fmean(dict(c)[s] for c in curves) for s in steps]
            lines.append(Line(*place(v), xs=[float(s) for s in steps], ys=means))
    if lines:
        title = f"{metric} during training (mean over seeds)" + (f"; panels: {panels}" if panels else "")
        fig = small_multiples(lines, title=title, xlabel="step", ylabel=metric, key_title=key_title)
        plots["curves"] = save_figure(fig, out / "curves.png")
    axes = [k for k in variants[0].settings if k != colour_axis]
    points = [
        Point(
            values_label(_less(v.settings, colour_axis)),
            v.settings[colour_axis] if colour_axis else "",
            *st[primary][:2],
        )
        for v, st in zip(variants, stats)
        if primary in st
    ]
    if points:
        title = f"final {metric} (mean ± std over seeds)" + (f"; rows: {', '.join(axes)}" if axes else "")
        fig = final_figure(points, title=title, xlabel=f"final {metric}", key_title=colour_axis or "")
        plots["final"] = save_figure(fig, out / "final.png")
    return plots


def _layout(
    variants: list[Variant], colour_axis: Optional[str]
) -> tuple[Callable[[Variant], tuple[str, str]], str, str]:
    """Where each variant's curve goes, as (panel, colour key), with the axes the panels and the colours
    stand for: a panel per variant less ``colour_axis`` (the tuned axis, else optim.lr where swept), its
    values as colour; without one, up to 8 variants share a panel, more get a panel per value of the first
    axis (the other axes as colour), or per variant where only one axis was swept."""
    axes = list(variants[0].settings)
    if colour_axis is not None:
        rest = [a for a in axes if a != colour_axis]
        return (
            (lambda v: (values_label(_less(v.settings, colour_axis)), v.settings[colour_axis])),
            ", ".join(rest),
            colour_axis,
        )
    if len(variants) <= SINGLE_PANEL:
        return (lambda v: ("", values_label(v.settings))), "", ", ".join(axes)
    if len(axes) > 1:
        first = axes[0]
        return (lambda v: (v.settings[first], values_label(_less(v.settings, first)))), first, ", ".join(axes[1:])
    return (lambda v: (values_label(v.settings), "")), ", ".join(axes), ""
