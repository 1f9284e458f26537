"""What a proxy's sweep hands on to a larger run (``archlab-train lr_from=<sweep dir>``): the value of its
swept axis with the best mean final metric over its seeds (of one group of its runs, where it sweeps more
axes: ``lr_from_group``, else the group sharing the run's command line), with ``best``'s grid-edge warning.

archlab-train sets the run's ``optim.lr`` with ``transfer_lr`` before it trains: the sweep is read as the
report reads it, and training imports nothing of the report."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from archlab.config.fields import plain_dict
from archlab.errors import ConfigError
from archlab.report.best import EdgeWarning, grid_edges
from archlab.report.compare import choose_best
from archlab.report.runs import group_variants, load_runs, swept_axes
from archlab.report.text import number

log = logging.getLogger("archlab.train")  # archlab-train's log: the line saying where the rate came from


DEFAULT = "(default)"  # a run's value of an axis its command line did not set, as report/runs.py groups it


@dataclass
class ProxyBest:
    """The value a proxy's sweep hands on for ``axis``: the one with the best mean final ``metric`` over
    its seeds, the grid it was chosen from, the group of the sweep's runs it came from (its values of the
    sweep's other axes; none for a sweep of ``axis`` alone) and the proxy's parametrisation (summary
    ``config.param``)."""

    axis: str
    value: str
    metric: str
    mean: float
    seeds: int
    grid: list[str]
    param: dict[str, Any]
    edge: Optional[EdgeWarning]
    group: dict[str, str]

    @property
    def text(self) -> str:
        of = f" of the group {_spelled(self.group)}" if self.group else ""
        line = (
            f"{self.axis}={self.value}: the best of {', '.join(self.grid)}{of} by final {self.metric} "
            f"(mean of {self.seeds} seed{'s' * (self.seeds != 1)}: {number(self.mean)})"
        )
        return line if self.edge is None else f"{line}; warning: {self.edge.text}"


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
) -> ProxyBest:
    """What ``sweep_dir``, a proxy's sweep over ``axis`` (and seeds), hands on. Where it sweeps other axes
    too (a multi-axis ``-m`` sweep), from one group of its runs: the one ``group`` names ({axis: value}),
    its other axes at the values of ``shared`` (the new run's command-line overrides; an axis it does not
    set at the sweep's default). ConfigError naming ``field`` (``group``'s: ``field``_group) where there is
    no such sweep, group or completed run."""
    try:
        runs = load_runs(sweep_dir)
    except ConfigError as err:
        raise ConfigError(field, str(sweep_dir), err.allowed) from None
    axes = swept_axes(runs)
    if axis not in axes:
        raise ConfigError(
            field, str(sweep_dir), f"a sweep over {axis} (and seeds); this one sweeps {', '.join(axes) or 'nothing'}"
        )
    others = [a for a in axes if a != axis]
    group = dict(group or {})
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
    choices = choose_best(group_variants(chosen, [axis]), axis, metric)
    if not choices:
        raise ConfigError(field, str(sweep_dir), f"a sweep with a completed run that recorded final {metric}")
    choice = choices[0]
    interval = choice.tried[choice.chosen.settings[axis]]
    edges = grid_edges(choices, axis)
    param = ((choice.chosen.completed[0].summary or {}).get("config") or {}).get("param") or {"kind": "sp"}
    return ProxyBest(
        axis,
        choice.chosen.settings[axis],
        metric,
        interval.mean,
        interval.n,
        choice.grid,
        param,
        edges[0] if edges else None,
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


def transfer_lr(cfg: DictConfig) -> None:
    """With ``lr_from``, set ``optim.lr`` to the best rate of that proxy sweep (by ``objective``, default the
    validation loss; of its group ``lr_from_group``, else the one sharing this run's command line), which
    must have run under this run's parametrisation; log where it came from."""
    if cfg.lr_from is None:
        return
    group = plain_dict(cfg.lr_from_group) if cfg.get("lr_from_group") is not None else None
    found = transferred(cfg.lr_from, "optim.lr", cfg.objective or "val/loss", "lr_from", _command_line(cfg), group)
    mine = plain_dict(cfg.param, resolve=True)
    if any(found.param.get(k) != v for k, v in mine.items()):
        raise ConfigError(
            "lr_from",
            cfg.lr_from,
            f"a proxy sweep run under this run's parametrisation (it ran param={found.param}; this run: param={mine})",
        )
    cfg.optim.lr = float(found.value)
    log.info("lr_from=%s: %s", cfg.lr_from, found.text)
