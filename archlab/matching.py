"""Fair comparisons: size one field of a variant so its parameter count matches a reference model.

Counts come from the closed-form formulas (``archlab.accounting.count``), so matching costs no memory
and works for any size. The count grows monotonically with every sizing field matched here, so a
binary search over the field's allowed values finds the closest one.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

from archlab import checks
from archlab.accounting import count
from archlab.config import ModelConfig, to_model_config
from archlab.errors import ConfigError

MATCHABLE = ("mlp.d_ff", "d_model", "n_layer")


@dataclass
class MatchResult:
    """The sized config, the value found, and how far its count is from the target."""

    config: ModelConfig
    field: str
    value: int
    params: int
    target: int

    @property
    def relative_difference(self) -> float:
        return (self.params - self.target) / self.target

    def as_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "value": self.value,
            "params": self.params,
            "target": self.target,
            "relative_difference": self.relative_difference,
        }


def _with(cfg: ModelConfig, field: str, value: int) -> ModelConfig:
    out = copy.deepcopy(cfg)
    *path, leaf = field.split(".")
    node = out
    for part in path:
        node = getattr(node, part)
    setattr(node, leaf, value)
    return out


def match_params(
    cfg: Any, target: int | Any, field: str = "mlp.d_ff", tolerance: float = 0.005, step: int = 1
) -> MatchResult:
    """Return ``cfg`` with ``field`` set so its total parameter count is closest to ``target``
    (a count, or a reference config whose count is used); raise if the best is off by > ``tolerance``.

    ``step`` restricts the field to multiples of it (e.g. ``d_model`` to multiples of ``n_head``).
    """
    cfg = to_model_config(cfg)
    checks.choice("match.field", field, MATCHABLE)
    checks.integer("match.step", step)
    goal = target if isinstance(target, int) else count(target)["total"]

    def total(k: int) -> int:  # count at field value k * step
        return count(_with(cfg, field, k * step))["total"]

    lo, hi = 1, 1
    while total(hi) < goal:  # grow until the bracket holds the target
        lo, hi = hi, hi * 2
    while lo < hi:  # smallest k with total(k) >= goal
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if total(mid) < goal else (lo, mid)
    best = min((k for k in (lo - 1, lo) if k >= 1), key=lambda k: abs(total(k) - goal))
    result = MatchResult(_with(cfg, field, best * step), field, best * step, total(best), goal)
    if abs(result.relative_difference) > tolerance:
        raise ConfigError(
            "match.tolerance",
            tolerance,
            f"a tolerance the closest {field}={best * step} meets: it gives {result.params:,} parameters "
            f"against the target's {goal:,} ({result.relative_difference:+.2%}); match another field or loosen it",
        )
    return result
