"""What a proxy's sweep hands on to a larger run (``archlab-train lr_from=<sweep dir>``): the value of its
one swept axis with the best mean final metric over its seeds, with the grid-edge warning ``best`` gives.

archlab-train sets the run's ``optim.lr`` with ``transfer_lr`` before it trains: the sweep is read as the
report reads it, and training imports nothing of the report."""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig

from archlab.config.fields import plain_dict
from archlab.errors import ConfigError
from archlab.report.best import EdgeWarning, grid_edges
from archlab.report.compare import choose_best
from archlab.report.runs import group_variants, load_runs, swept_axes
from archlab.report.text import number

log = logging.getLogger("archlab.train")  # archlab-train's log: the line saying where the rate came from


@dataclass
class ProxyBest:
    """The value a proxy's sweep hands on for ``axis``: the one with the best mean final ``metric`` over
    its seeds, the grid it was chosen from, and the proxy's parametrisation (summary ``config.param``)."""

    axis: str
    value: str
    metric: str
    mean: float
    seeds: int
    grid: list[str]
    param: dict[str, Any]
    edge: Optional[EdgeWarning]

    @property
    def text(self) -> str:
        line = (
            f"{self.axis}={self.value}: the best of {', '.join(self.grid)} by final {self.metric} "
            f"(mean of {self.seeds} seed{'s' * (self.seeds != 1)}: {number(self.mean)})"
        )
        return line if self.edge is None else f"{line}; warning: {self.edge.text}"


def transferred(sweep_dir: str | Path, axis: str, metric: str, field: str) -> ProxyBest:
    """What ``sweep_dir``, a proxy's sweep over ``axis`` (and seeds) alone, hands on; ConfigError naming
    ``field`` where it is no such sweep or no run completed."""
    try:
        runs = load_runs(sweep_dir)
    except ConfigError as err:
        raise ConfigError(field, str(sweep_dir), err.allowed) from None
    axes = swept_axes(runs)
    if axes != [axis]:
        raise ConfigError(
            field,
            str(sweep_dir),
            f"a sweep over {axis} (and seeds) alone; this one sweeps {', '.join(axes) or 'nothing'} "
            "(give the directory of one group of its runs)",
        )
    choices = choose_best(group_variants(runs, axes), axis, metric)
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
    )


def transfer_lr(cfg: DictConfig) -> None:
    """With ``lr_from``, set ``optim.lr`` to the best rate of that proxy sweep (by ``objective``, default the
    validation loss), which must have run under this run's parametrisation; log where it came from."""
    if cfg.lr_from is None:
        return
    found = transferred(cfg.lr_from, "optim.lr", cfg.objective or "val/loss", "lr_from")
    mine = plain_dict(cfg.param, resolve=True)
    if any(found.param.get(k) != v for k, v in mine.items()):
        raise ConfigError(
            "lr_from",
            cfg.lr_from,
            f"a proxy sweep run under this run's parametrisation (it ran param={found.param}; this run: param={mine})",
        )
    cfg.optim.lr = float(found.value)
    log.info("lr_from=%s: %s", cfg.lr_from, found.text)
