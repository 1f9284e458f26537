"""archlab-report's options beyond the table (``baseline``, ``best_over``, ``scaling``): each checked against
the sweep before any file is written, then computed in the order they depend on each other."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Optional

from archlab.config.commands import ReportConfig
from archlab.errors import ConfigError
from archlab.report import compare
from archlab.report import ladder as ladders
from archlab.report import scaling as scaling_fits
from archlab.report import transfer as transfer_along
from archlab.report.best import EdgeWarning, grid_edges

if TYPE_CHECKING:
    from archlab.report.runs import Variant


@dataclass
class Analysis:
    """What the report's options ask beyond the table, worked out (and every option checked) before any
    file is written: best_over's choices (and those at the edge of their grid), baseline comparisons (with best_over also at each of its values),
    scaling fits and compute multipliers, or with ``scaling=ND`` the ladder's L(N, D)."""

    metric: Optional[str]
    tuned: Optional[str] = None
    choices: list[compare.Choice] = field(default_factory=list)
    edges: list[EdgeWarning] = field(default_factory=list)  # choices at their grid's lowest or highest value
    baseline: Optional[tuple[str, str]] = None
    comparisons: list[compare.Comparison] = field(default_factory=list)
    by_value: list[compare.Comparison] = field(default_factory=list)  # with best_over: at each of its values
    transfer: Optional[tuple[str, str]] = None  # (best_over's axis, the axis it is followed along)
    transfers: list[transfer_along.Transfer] = field(default_factory=list)
    scaling: Optional[str] = None
    fits: list[scaling_fits.ScalingFit] = field(default_factory=list)
    multipliers: list[scaling_fits.Multiplier] = field(default_factory=list)
    ladder: Optional[ladders.Ladder] = None  # scaling=ND: L(N, D) over every run


def analyse(variants: list[Variant], axes: list[str], metric: Optional[str], cfg: ReportConfig) -> Analysis:
    """Check the options ``cfg`` asks (``baseline``, ``best_over``, ``scaling``, ``transfer``) against the
    sweep (one ConfigError naming the first bad one) and compute them: best_over first (each variant at its
    best value), then the baseline comparisons and the scaling fits on the variants so chosen. ``metric``:
    the report's leading metric, None where no run completed."""
    baseline, best_over, scaling, transfer = cfg.baseline, cfg.best_over, cfg.scaling, cfg.transfer
    ladder = scaling == ladders.LADDER
    scaling = None if ladder else scaling  # an axis, for the one-variable fits
    found = Analysis(metric, tuned=best_over, scaling=scaling)
    given = {"best_over": best_over, "scaling": cfg.scaling, "baseline": baseline, "transfer": transfer}
    if metric is None:  # nothing to compare: no option may be given
        if any(given.values()):
            option = next(k for k, v in given.items() if v)
            raise ConfigError(option, given[option], "a sweep with completed runs to compare: none of these completed")
        return found
    if best_over is not None:
        compare.check_axis("best_over", best_over, axes, {})
    if scaling is not None:
        compare.check_axis("scaling", scaling, axes, {"best_over": best_over})
    if baseline is not None:
        taken = tuple(a for a in (best_over, scaling) if a)
        found.baseline = compare.parse_baseline(baseline, axes, variants, taken)
    if scaling is not None:
        scaling_fits.check_scaling(scaling, variants, metric)
    if ladder:
        ladders.ladder_points(variants, metric)  # refused here, before any fit
    if transfer is not None:
        axis, proxy = transfer_along.parse(transfer, axes, variants, best_over)
        assert best_over is not None  # parse refuses transfer without it
        found.transfer = (best_over, axis)
        found.transfers = transfer_along.transfers(variants, best_over, axis, proxy, metric)
    chosen = variants
    if best_over is not None:
        found.choices = compare.choose_best(variants, best_over, metric)
        found.edges = grid_edges(found.choices, best_over)
        chosen = [c.chosen for c in found.choices]
    if found.baseline is not None:
        found.comparisons = compare.compare_to_baseline(chosen, *found.baseline, tuned=best_over)
        if best_over is not None:  # every variant, so each against the baseline at the same value
            found.by_value = compare.compare_to_baseline(variants, *found.baseline, tuned=None)
    if scaling is not None:
        found.fits = scaling_fits.fit_scaling(chosen, scaling, metric, tuned=best_over)
        if found.baseline is not None:
            found.multipliers = scaling_fits.multipliers(found.fits, *found.baseline)
    if ladder:
        found.ladder = ladders.fit_ladder(chosen, metric)
    return found
