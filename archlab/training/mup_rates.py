"""μP's learning rates for Muon and SGD (``param=mup|completep`` beside ``optim=muon``, ``param=mup`` beside
``optim=sgd``); AdamW's are ``parametrization.scale_groups``. Both from the spectral condition of Yang, Simon
and Bernstein 2023 ("A Spectral Condition for Feature Learning"): a matrix's update has spectral norm
Θ(sqrt(fan_out / fan_in)).

- Muon: the orthogonalised update has every singular value 1, times torch's ``adjust_lr_fn`` ratio
  (``original`` sqrt(max(1, A/B)), ``match_rms_adamw`` 0.2·sqrt(max(A, B)), A × B the matrix), so each
  matrix's rate is scaled by sqrt(A/B)/ratio(A, B) over the same at the proxy's shape (a hidden matrix:
  both dims / m; an output one: its fan-in / m; an input one: its fan-out / m): 1 for hidden matrices under
  ``original``, 1/sqrt(m) under ``match_rms_adamw``. Under completep the decay × the inverse (η·λ fixed),
  as AdamW's; its AdamW part (tables, head, norms, biases, stacked experts) takes AdamW's rules.
- SGD (Yang et al. 2022, Table 3, in the multiplier form archlab's model takes: the head's weight trains as
  an input table, its 1/m the logit multiplier): input tables and vectors × m, hidden matrices × 1,
  output matrices × 1/m.
"""

from __future__ import annotations

import math
from typing import Any

from torch import nn

from archlab.nn.component import Role
from archlab.nn.model import Decoder
from archlab.training.parametrization import roles, scale_groups, width_ratio

# the dims of a matrix [fan_out, fan_in] that grow with width, by role: (fan_out, fan_in)
_GROWS = {Role.HIDDEN: (True, True), Role.OUTPUT: (False, True), Role.INPUT: (True, False), Role.VECTOR: (False, False)}
SGD_FACTOR = {Role.INPUT: 1.0, Role.VECTOR: 1.0, Role.HIDDEN: 0.0, Role.OUTPUT: -1.0}  # the rate × m ** this


def muon_ratio(adjust_lr_fn: str, fan_out: float, fan_in: float) -> float:
    """torch.optim.Muon's rate multiplier for an update of this shape (``torch.optim._muon._adjust_lr``)."""
    if adjust_lr_fn == "match_rms_adamw":
        return 0.2 * math.sqrt(max(fan_out, fan_in))
    return math.sqrt(max(1.0, fan_out / fan_in))


def muon_factor(adjust_lr_fn: str, shape: tuple[int, ...], role: Role, m: float) -> float:
    """The μP factor on Muon's rate for a matrix of ``shape`` and ``role`` at width ratio ``m``: the spectral
    target over Muon's ratio, here over the same at the proxy's shape."""
    fan_out, fan_in = float(shape[0]), float(shape[1])
    grows_out, grows_in = _GROWS[role]
    base_out, base_in = fan_out / (m if grows_out else 1.0), fan_in / (m if grows_in else 1.0)

    def spectral(a: float, b: float) -> float:
        return math.sqrt(a / b) / muon_ratio(adjust_lr_fn, a, b)

    return spectral(fan_out, fan_in) / spectral(base_out, base_in)


def scale_muon_groups(
    model: Decoder,
    hidden: list[dict[str, Any]],
    other: list[dict[str, Any]],
    optim: dict[str, Any],
    adamw_lr: float,
    param: Any,
) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """Muon's groups (``hidden``) split by their μP rate and decay, and the AdamW part's (``other``) under
    AdamW's rules at ``adamw_lr``."""
    m, kind = width_ratio(model.cfg, param), param["kind"]
    by_id = roles(model, kind)
    scaled: dict[tuple[float, float], list[nn.Parameter]] = {}
    for group in hidden:
        for p in group["params"]:
            factor = muon_factor(optim["adjust_lr_fn"], tuple(p.shape), by_id[id(p)], m)
            decay = group["weight_decay"] / (factor if kind == "completep" else 1.0)
            scaled.setdefault((optim["lr"] * factor, decay), []).append(p)
    muon = [{"params": ps, "lr": lr, "weight_decay": wd} for (lr, wd), ps in scaled.items()]
    return muon, scale_groups(model, other, {**optim, "lr": adamw_lr}, param)


def scale_sgd_groups(model: Decoder, groups: list[dict[str, Any]], lr: float, param: Any) -> list[dict[str, Any]]:
    """SGD's groups (``param_groups``' decaying and non-decaying) split by their μP rate."""
    m = width_ratio(model.cfg, param)
    by_id = roles(model, param["kind"])
    scaled: dict[tuple[float, float], list[nn.Parameter]] = {}
    for group in groups:
        for p in group["params"]:
            scaled.setdefault((lr * m ** SGD_FACTOR[by_id[id(p)]], group["weight_decay"]), []).append(p)
    return [{"params": ps, "lr": g_lr, "weight_decay": wd} for (g_lr, wd), ps in scaled.items()]
