"""Fair comparisons: size one field of a variant so a quantity of it matches a reference model: its
total parameters, its active parameters per token (a mixture of experts against a dense model at equal
compute) or its training FLOPs per token.

Counts come from the closed-form formulas (``archlab.accounting.count``), so matching costs no memory
and works for any size. Each quantity grows monotonically with every sizing field matched here, so a
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

MATCHABLE = ("mlp.d_ff", "mlp.expert_d_ff", "d_model", "n_layer")
QUANTITIES = ("total", "active", "flops_per_token")  # keys of archlab.accounting.count
LIMIT = 2**40  # no sizing field goes this far: a field that never reaches the target leaves the quantity alone


@dataclass
class MatchResult:
    """The sized config, the value found, and how far its count is from the target."""

    config: ModelConfig
    field: str
    value: int
    params: int  # the matched quantity: parameters, or FLOPs per token
    target: int
    quantity: str = "total"

    @property
    def relative_difference(self) -> float:
        return (self.params - self.target) / self.target

    def as_dict(self) -> dict[str, Any]:
        return {
            "field": self.field,
            "value": self.value,
            "params": self.params,
            "target": self.target,
            "quantity": self.quantity,
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
    cfg: Any,
    target: int | Any,
    field: str = "mlp.d_ff",
    tolerance: float = 0.005,
    step: int = 1,
    quantity: str = "total",
) -> MatchResult:
    """Return ``cfg`` with ``field`` set so its ``quantity`` (total or active parameters, or FLOPs per
    token) is closest to ``target`` (a number, or a reference config whose quantity is used); raise if
    the best is off by > ``tolerance``.

    ``step`` restricts the field to multiples of it (e.g. ``d_model`` to multiples of ``n_head``).
    """
    cfg = to_model_config(cfg)
    checks.choice("match.field", field, MATCHABLE)
    checks.choice("match.quantity", quantity, QUANTITIES)
    checks.integer("match.step", step)
    goal = target if isinstance(target, int) else count(target)[quantity]

    def measure(k: int) -> int:  # the quantity at field value k * step
        return count(_with(cfg, field, k * step))[quantity]

    lo, hi = 1, 1
    while measure(hi) < goal:  # grow until the bracket holds the target
        if hi * step > LIMIT:
            raise ConfigError("match.field", field, f"a field that changes the {quantity} of this model")
        lo, hi = hi, hi * 2
    while lo < hi:  # smallest k with measure(k) >= goal
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if measure(mid) < goal else (lo, mid)
    best = min((k for k in (lo - 1, lo) if k >= 1), key=lambda k: abs(measure(k) - goal))
    result = MatchResult(_with(cfg, field, best * step), field, best * step, measure(best), goal, quantity)
    if abs(result.relative_difference) > tolerance:
        raise ConfigError(
            "match.tolerance",
            tolerance,
            f"a tolerance the closest {field}={best * step} meets: it gives {result.params:,} ({quantity}) "
            f"against the target's {goal:,} ({result.relative_difference:+.2%}); match another field or loosen it",
        )
    return result


def matched_steps(cfg: Any, reference: Any, steps: int) -> int:
    """Training steps at which ``cfg`` spends the training FLOPs ``reference`` spends in ``steps``
    (same batch and sequence length: FLOPs per token scale the steps), rounded to the nearest step."""
    return max(1, round(steps * count(reference)["flops_per_token"] / count(cfg)["flops_per_token"]))
