"""Training stability, for archlab-report: per run, the loss spikes of its training log and its largest
gradient norm; per variant, those over its seeds and the largest learning rate whose final metric is
within a tolerance of the best one (how far the rate can be pushed before quality goes).

The settings' defaults (``ReportConfig``): a spike is a loss above 1.2 times its running median (healthy
runs of the committed studies stay within 1.06x of theirs), taken over the 10 logged losses before it
(500 steps at the default ``trainer.log_every_n_steps`` of 50); a rate is stable within 1% of the best
metric (0.02 of a loss near 2)."""

from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Optional

from archlab import checks
from archlab.config.commands import ReportConfig
from archlab.errors import ConfigError
from archlab.report.compare import choose_best
from archlab.report.runs import finite_number, training_losses
from archlab.report.stats import higher_is_better
from archlab.report.text import label, number

if TYPE_CHECKING:
    from archlab.report.runs import Run, Variant

LR_AXIS = "optim.lr"


@dataclass(frozen=True)
class Spike:
    """A logged training loss above ``factor`` times the median of the losses logged before it."""

    step: int
    loss: float
    median: float


def loss_spikes(losses: list[tuple[int, float]], factor: float, window: int) -> list[Spike]:
    """The (step, loss) points whose loss exceeds ``factor`` times the median of the ``window`` logged just
    before it (a running median: a falling loss never counts, one noisy neighbour does not hide a spike)."""
    spikes = []
    for i in range(1, len(losses)):
        median = statistics.median(loss for _, loss in losses[max(0, i - window) : i])
        step, loss = losses[i]
        if loss > factor * median:
            spikes.append(Spike(step, loss, median))
    return spikes


@dataclass
class RunStability:
    """One completed run's spikes among its ``logged`` training losses (0: no CSV log, spikes unknown) and
    its largest gradient norm (None where summary.json has none: runs before it was recorded)."""

    run: Run
    logged: int
    spikes: list[Spike]
    max_grad_norm: Optional[float]

    def record(self) -> dict[str, Any]:
        return {
            "run": str(self.run.path),
            "logged_losses": self.logged,
            "spikes": [{"step": s.step, "loss": s.loss, "median": s.median} for s in self.spikes],
            "max_grad_norm": self.max_grad_norm,
        }


@dataclass
class VariantStability:
    """A variant's runs' stability: their spikes counted together and the largest gradient norm of any."""

    variant: Variant
    runs: list[RunStability]

    @property
    def spikes(self) -> Optional[int]:
        return sum(len(r.spikes) for r in self.runs) if any(r.logged for r in self.runs) else None

    @property
    def max_grad_norm(self) -> Optional[float]:
        norms = [r.max_grad_norm for r in self.runs if r.max_grad_norm is not None]
        return max(norms) if norms else None


@dataclass
class StableRate:
    """For the variants that differ only in the learning rate: the rate with the best mean final metric and
    the largest rate whose mean is within ``tolerance`` (relative) of that best."""

    settings: dict[str, str]
    best: str
    largest: str


@dataclass
class Stability:
    settings: dict[str, float]  # spike_factor, spike_window, lr_tolerance
    variants: list[VariantStability]
    rates: list[StableRate]

    def record(self) -> dict[str, Any]:
        """report.json's ``stability``: the settings, every run, every variant and the stable rates."""
        return {
            "settings": self.settings,
            "runs": [r.record() for v in self.variants for r in v.runs],
            "variants": [
                {"variant": v.variant.settings, "spikes": v.spikes, "max_grad_norm": v.max_grad_norm}
                for v in self.variants
            ],
            f"largest {LR_AXIS} within tolerance": [
                {"variant": r.settings, "best": r.best, "largest": r.largest} for r in self.rates
            ],
        }


def check_settings(cfg: ReportConfig) -> None:
    """Refuse a spike factor not above 1, a window below one loss, a negative tolerance."""
    if not checks.finite(cfg.spike_factor) > 1:
        raise ConfigError(
            "spike_factor", cfg.spike_factor, "a number above 1 (a spike is a loss this many times its median)"
        )
    checks.integer("spike_window", cfg.spike_window)
    checks.non_negative("lr_tolerance", cfg.lr_tolerance, "a non-negative fraction of the best metric, e.g. 0.01")


def assess(variants: list[Variant], metric: Optional[str], cfg: ReportConfig) -> Stability:
    """Every completed run's spikes and gradient norm (``cfg.spike_factor``, ``cfg.spike_window``), and,
    where ``optim.lr`` is swept and a metric leads, the largest stable rate of each variant (within
    ``cfg.lr_tolerance`` of its best)."""
    spike_factor, spike_window, lr_tolerance = cfg.spike_factor, cfg.spike_window, cfg.lr_tolerance
    found = [
        VariantStability(v, [_run_stability(r, spike_factor, spike_window) for r in v.completed]) for v in variants
    ]
    rates = []
    if metric is not None and variants and LR_AXIS in variants[0].settings:
        higher = higher_is_better(metric)
        for c in choose_best(variants, LR_AXIS, metric):
            best = c.tried[c.chosen.settings[LR_AXIS]].mean
            bound = abs(best) * lr_tolerance
            within = [v for v, i in c.tried.items() if (i.mean >= best - bound if higher else i.mean <= best + bound)]
            rates.append(StableRate(c.settings, c.chosen.settings[LR_AXIS], within[-1]))  # tried: ascending
    settings = {"spike_factor": spike_factor, "spike_window": spike_window, "lr_tolerance": lr_tolerance}
    return Stability(settings, found, rates)


def _run_stability(run: Run, factor: float, window: int) -> RunStability:
    losses = training_losses(run)
    norm = finite_number(((run.summary or {}).get("grad_norm") or {}).get("max"))
    return RunStability(run, len(losses), loss_spikes(losses, factor, window), norm)


def stability_columns(found: Stability) -> list[str]:
    return ["loss spikes", "max grad norm", *([f"largest stable {LR_AXIS}"] if found.rates else [])]


def stability_cells(found: Stability, variant: Variant) -> list[object]:
    """CSV cells: the variant's spikes over its seeds, its largest gradient norm, and its group's largest
    stable learning rate."""
    mine = next(v for v in found.variants if v.variant is variant)
    cells: list[object] = [_blank(mine.spikes), _blank(mine.max_grad_norm)]
    if found.rates:
        rest = {k: x for k, x in variant.settings.items() if k != LR_AXIS}
        cells.append(next((r.largest for r in found.rates if r.settings == rest), ""))
    return cells


def _blank(value: Optional[float]) -> object:
    return "" if value is None else value


def stability_section(found: Stability) -> list[str]:
    """Markdown: spikes and the largest gradient norm per variant, the runs that spiked, and the largest
    stable learning rate per variant."""
    s = found.settings
    rows = [v for v in found.variants if v.runs]
    known = any(r.logged or r.max_grad_norm is not None for v in rows for r in v.runs)
    if not known and not found.rates:  # no training log, no gradient norm, no rate swept: nothing to say
        return []
    lines = ["", "## Stability"]
    if known:
        lines += _spikes_and_norms(rows, s)
    if found.rates:
        tolerance = f"{100 * s['lr_tolerance']:g}%"
        lines += [
            "",
            f"The largest {LR_AXIS} whose mean final metric is within {tolerance} of the variant's best (lr_tolerance):",
            "",
            f"| variant | best {LR_AXIS} | largest {LR_AXIS} within {tolerance} |",
            "|---|---|---|",
            *[f"| {label(r.settings)} | {r.best} | {r.largest} |" for r in found.rates],
        ]
    return lines


def _spikes_and_norms(rows: list[VariantStability], s: dict[str, float]) -> list[str]:
    """The spikes-and-gradient-norm table, then each run that spiked with its steps."""
    lines = [
        "",
        f"Loss spikes: logged training losses (train/loss in each run's metrics.csv, every "
        f"trainer.log_every_n_steps steps) above {number(s['spike_factor'])}× the median of the "
        f"{int(s['spike_window'])} logged before (spike_factor, spike_window). Max grad norm: the largest "
        "gradient norm of any step, before clipping, over the variant's seeds (summary.json's grad_norm).",
        "",
        "| variant | seeds | loss spikes | max grad norm |",
        "|---|---|---|---|",
    ]
    for v in rows:
        spikes = "-" if v.spikes is None else str(v.spikes)
        norm = "-" if v.max_grad_norm is None else number(v.max_grad_norm)
        lines.append(f"| {label(v.variant.settings)} | {len(v.runs)} | {spikes} | {norm} |")
    for v in rows:
        for r in v.runs:
            if r.spikes:
                where = ", ".join(f"step {x.step}: {number(x.loss)} (median {number(x.median)})" for x in r.spikes)
                lines.append(f"- `{r.run.path}` spiked at {where}")
    return lines
