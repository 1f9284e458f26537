"""Activation sparsity of a gated MLP (``model.mlp.activation_sparsity``, Gemma 3n's
``activation_sparsity_pattern``, per layer through layer kinds): the gate's pre-activations less a cutoff,
their mean plus their standard deviation times Φ⁻¹(s), floored at 0, so that about a fraction s of them is
zero where they are Gaussian (transformers' ``Gemma3nTextMLP._gaussian_topk``). No parameters."""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor

from archlab.config import ModelConfig
from archlab.errors import ConfigError


@dataclass
class SparsityField:
    """The gated kinds' activation sparsity."""

    # s in [0, 1): the gate's pre-activations x → relu(x − mean(x) − std(x)·Φ⁻¹(s)) over the hidden width
    # (Gemma 3n's first 10 layers: 0.95); 0 = none
    activation_sparsity: float = 0.0


def sparsity(cfg: ModelConfig) -> float:
    """The MLP's s (0 for a kind without the field)."""
    return getattr(cfg.mlp, "activation_sparsity", 0.0)


def gaussian_topk(x: Tensor, s: float) -> Tensor:
    """``relu(x − mean − std·Φ⁻¹(s))`` over the last dim, std biased; Φ⁻¹(s) in float32, then ``x``'s dtype."""
    target = torch.tensor(s, dtype=torch.float32, device=x.device)
    multiplier = (torch.erfinv(2 * target - 1) * math.sqrt(2)).to(x.dtype)  # Φ⁻¹(s), as torch's Normal.icdf
    cutoff = x.mean(-1, keepdim=True) + x.std(-1, keepdim=True, unbiased=False) * multiplier
    return F.relu(x - cutoff)


def validate(cfg: ModelConfig) -> None:
    """s is a number in [0, 1)."""
    s = sparsity(cfg)
    if isinstance(s, bool) or not isinstance(s, (int, float)) or not 0 <= s < 1:
        raise ConfigError("model.mlp.activation_sparsity", s, "a number in [0, 1) (0: dense)")
