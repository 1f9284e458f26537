"""What a proxy's sweep hands on to a larger run (``archlab-train lr_from=<sweep dir>``): the value of its
swept axis with the best mean final metric over its seeds, and, where the sweep tuned them with it, the
values of the base hyperparameters μTransfer tunes at the proxy (``TUNABLE``: the init stds and the
input, output, attention and residual multipliers), the best combination of all of them (of one group of
its runs, where it sweeps more axes: ``lr_from_group``, else the group sharing the run's command line),
with ``best``'s grid-edge warning per tuned axis.

archlab-train sets the run's ``optim.lr`` and those fields with ``transfer_lr`` before it trains: the sweep
is read as the report reads it, and training imports nothing of the report."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from archlab.config.fields import plain_dict
from archlab.errors import ConfigError
from archlab.report.best import EdgeWarning, grid_edges
from archlab.report.compare import choose_best, interval
from archlab.report.runs import figure_of, group_variants, load_runs, swept_axes
from archlab.report.stats import best_setting, higher_is_better
from archlab.report.text import number

log = logging.getLogger("archlab.train")  # archlab-train's log: the line saying where the rate came from


DEFAULT = "(default)"  # a run's value of an axis its command line did not set, as report/runs.py groups it
# The base hyperparameters a proxy's sweep may tune beside optim.lr and lr_from hands on: fields of the proxy's
# width (and depth) that param=mup|completep scales as μP's rules say (training/parametrization.py), and plain
# constants under sp
TUNABLE = (
    "model.init_std",
    "model.embedding_init_std",
    "model.embedding_multiplier",
    "model.head.logit_scale",
    "model.attention.scale",
    "model.block.residual_multiplier",
)


@dataclass
class ProxyBest:
    """What a proxy's sweep hands on: the value of ``axis`` and of each other tuned axis (``values``, ``axis``
    first) of the setting with the best mean final ``metric`` over its seeds, the grid of ``axis`` it was
    chosen from (at the others' best values), the group of the sweep's runs it came from (its values of the
    sweep's other axes; none for a sweep of the tuned axes alone), the proxy's parametrisation (summary
    ``config.param``) and a warning for each tuned axis whose best value is its grid's edge."""

    axis: str
    values: dict[str, str]
    metric: str
    mean: float
    seeds: int
    grid: list[str]
    param: dict[str, Any]
    edges: list[EdgeWarning]
    group: dict[str, str]

    @property
    def value(self) -> str:
        return self.values[self.axis]

    @property
    def text(self) -> str:
        of = f" of the group {_spelled(self.group)}" if self.group else ""
        also = "".join(f", {k}={v}" for k, v in self.values.items() if k != self.axis)
        line = (
            f"{self.axis}={self.value}{also}: the best of {', '.join(self.grid)}{of} by final {self.metric} "
            f"(mean of {self.seeds} seed{'s' * (self.seeds != 1)}: {number(self.mean)})"
        )
        return "; warning: ".join([line, *(edge.text for edge in self.edges)])

    def record(self, sweep_dir: str) -> dict[str, Any]:
        """What summary.json records of it (``transferred``)."""
        return {
            "from": str(Path(sweep_dir).resolve()),
            "values": self.values,
            "metric": self.metric,
            "mean": self.mean,
            "seeds": self.seeds,
            "group": self.group,
            "warnings": [edge.text for edge in self.edges],
        }


def _spelled(settings: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in settings.items())


def _same(a: Any, b: Any) -> bool:
    """Two spellings of one override value: equal as text, or as numbers (``3e-3`` and ``0.003``)."""
    if str(a) == str(b):
        return True
    try:
        return float(a) == float(b)
    except (TypeError, ValueError):
        return False


def transferred(
    sweep_dir: str | Path,
    axis: str,
    metric: str,
    field: str,
    shared: Optional[dict[str, str]] = None,
    group: Optional[dict[str, Any]] = None,
    tunable: tuple[str, ...] = (),
) -> ProxyBest:
    """What ``sweep_dir``, a proxy's sweep over ``axis`` (and seeds), hands on: the best value of ``axis`` and
    of each axis of ``tunable`` it sweeps too that ``shared`` and ``group`` leave free, chosen together.
    Where it sweeps other axes (a multi-axis ``-m`` sweep), from one group of its runs: the one ``group``
    names ({axis: value}), its other axes at the values of ``shared`` (the new run's command-line overrides;
    an axis it does not set at the sweep's default). ConfigError naming ``field`` (``group``'s: ``field``_group)
    where there is no such sweep, group or completed run."""
    try:
        runs = load_runs(sweep_dir)
    except ConfigError as err:
        raise ConfigError(field, str(sweep_dir), err.allowed) from None
    axes = swept_axes(runs)
    if axis not in axes:
        raise ConfigError(
            field, str(sweep_dir), f"a sweep over {axis} (and seeds); this one sweeps {', '.join(axes) or 'nothing'}"
        )
    group = dict(group or {})
    tuned = [axis] + [a for a in axes if a in tunable and a not in group and a not in (shared or {})]
    others = [a for a in axes if a not in tuned]
    unknown = [k for k in group if k not in others]
    if unknown:
        allowed = f"axes of the sweep but {axis}: {', '.join(others)}" if others else f"null: it sweeps {axis} alone"
        raise ConfigError(f"{field}_group", group, allowed)
    wanted = {k: group[k] if k in group else (shared or {}).get(k, DEFAULT) for k in others}
    chosen = [r for r in runs if all(_same(r.overrides.get(k, DEFAULT), v) for k, v in wanted.items())]
    if not chosen:
        groups = "; ".join(dict.fromkeys(_spelled(v.settings) for v in group_variants(runs, others)))
        raise ConfigError(
            f"{field}_group" if group else field,
            group or str(sweep_dir),
            f"a group of the sweep's runs; none has {_spelled(wanted)} (its groups: {groups}): pick one with "
            f"{field}_group={{axis: value}}, or set those values on this run's command line as the proxy did",
        )
    variants = group_variants(chosen, tuned)
    tried = {k: i for k, v in enumerate(variants) if (i := interval(v, figure_of(metric)))}
    if not tried:
        raise ConfigError(field, str(sweep_dir), f"a sweep with a completed run that recorded final {metric}")
    index = best_setting({k: i.mean for k, i in tried.items()}, higher_is_better(metric))
    best, at_best = variants[index], tried[index]
    grids, edges = {}, []
    for name in tuned:  # each tuned axis at the others' best values: its grid, and whether the best is its edge
        rest = {k: v for k, v in best.settings.items() if k != name}
        choice = next(c for c in choose_best(variants, name, metric) if c.settings == rest)
        grids[name] = choice.grid
        edges += [dataclasses.replace(e, settings={**wanted, **rest}) for e in grid_edges([choice], name)]
    param = ((best.completed[0].summary or {}).get("config") or {}).get("param") or {"kind": "sp"}
    return ProxyBest(
        axis,
        dict(best.settings),
        metric,
        at_best.mean,
        at_best.n,
        grids[axis],
        param,
        edges,
        {k: str(v) for k, v in wanted.items()},
    )


def _command_line(cfg: DictConfig) -> dict[str, str]:
    """This run's command-line overrides, key -> value (Hydra's task overrides: of the ``hydra`` node of a
    config composed with it, else of the running job; none where neither is known)."""
    from hydra.core.hydra_config import HydraConfig

    task = OmegaConf.select(cfg, "hydra.overrides.task", default=None)
    if task is None and HydraConfig.initialized():
        task = HydraConfig.get().overrides.task
    pairs = (str(o).split("=", 1) for o in task or [])
    return {k.lstrip("+~"): v for k, v in (p for p in pairs if len(p) == 2)}


def transfer_lr(cfg: DictConfig) -> Optional[dict[str, Any]]:
    """With ``lr_from``, set ``optim.lr`` to the best rate of that proxy sweep (by ``objective``, default the
    validation loss; of its group ``lr_from_group``, else the one sharing this run's command line), and each
    ``TUNABLE`` field the sweep tuned with it and this run's command line leaves free to its value in the same
    best setting; the sweep must have run under this run's parametrisation. Logs where they came from and
    returns summary.json's record of them (None without ``lr_from``)."""
    if cfg.lr_from is None:
        return None
    group = plain_dict(cfg.lr_from_group) if cfg.get("lr_from_group") is not None else None
    found = transferred(
        cfg.lr_from, "optim.lr", cfg.objective or "val/loss", "lr_from", _command_line(cfg), group, TUNABLE
    )
    mine = plain_dict(cfg.param, resolve=True)
    if any(found.param.get(k) != v for k, v in mine.items()):
        raise ConfigError(
            "lr_from",
            cfg.lr_from,
            f"a proxy sweep run under this run's parametrisation (it ran param={found.param}; this run: param={mine})",
        )
    for key, value in found.values.items():
        if value != DEFAULT:  # a value the proxy's runs left at the default: this run's default too
            OmegaConf.update(cfg, key, None if value in ("null", "None") else float(value), merge=False)
    log.info("lr_from=%s: %s", cfg.lr_from, found.text)
    return found.record(cfg.lr_from)
