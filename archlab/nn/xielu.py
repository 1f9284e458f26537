"""``xielu``: a plain MLP (two matrices) around xIELU (Huang et al. 2024, arXiv:2411.13010), Apertus's
activation, as transformers' ``XIELUActivation`` computes it: per layer two learned scalars,
``α_p = softplus(a_p)`` and ``α_n = β + softplus(a_n)``; ``x > 0``: ``α_p·x² + β·x``, else
``α_n·(expm1(min(x, ε)) − x) + β·x``, with β and ε fixed."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

import torch
from torch import Tensor, nn

from archlab.config import ModelConfig, mlp_config
from archlab.errors import ConfigError
from archlab.nn.mlp import MLPS, PlainMLP, WidthConfig


@mlp_config("xielu")
@dataclass
class XIELUConfig(WidthConfig):
    """``model.mlp`` with kind xielu: transformers' defaults (Apertus's)."""

    kind: str = "xielu"
    alpha_p_init: float = 0.8  # α_p at init (the squared branch's scale)
    alpha_n_init: float = 0.8  # α_n at init (the negative branch's scale), above beta
    beta: float = 0.5  # the linear term's slope, on both branches
    eps: float = -1e-6  # the negative branch's expm1 reads min(x, eps)


class XIELU(nn.Module):
    """The activation: ``alpha_p`` and ``alpha_n`` ``[1]`` (transformers' names and shapes), softplus-encoded."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        m = cfg.mlp
        self.alpha_p_init, self.alpha_n_init, self.beta, self.eps = m.alpha_p_init, m.alpha_n_init, m.beta, m.eps
        self.alpha_p = nn.Parameter(torch.empty(1))
        self.alpha_n = nn.Parameter(torch.empty(1))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """softplus⁻¹ of α_p and of α_n − β at their init values, as transformers writes them."""
        self.alpha_p.fill_(math.log(math.expm1(self.alpha_p_init)))
        self.alpha_n.fill_(math.log(math.expm1(self.alpha_n_init - self.beta)))

    def forward(self, x: Tensor) -> Tensor:
        alpha_p = nn.functional.softplus(self.alpha_p)
        alpha_n = self.beta + nn.functional.softplus(self.alpha_n)
        negative = (torch.expm1(torch.clamp(x, max=self.eps)) - x) * alpha_n
        return torch.where(x > 0, alpha_p * x * x, negative) + self.beta * x


@MLPS.register("xielu")
class XIELUMLP(PlainMLP):
    """Two matrices around xIELU: Apertus's MLP (``up_proj``, ``down_proj``); the plain width rule. α_p and
    α_n are vectors to μP (DenseMLP's rule: what is not a matrix's weight), as a norm's scale."""

    refuses_tanh = "none for xielu (only GELU has a tanh form)"

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Callable[[Tensor], Tensor]:
        return XIELU(cfg)

    @staticmethod
    def params_at(cfg: ModelConfig, width: int) -> int:
        """The two matrices (and biases), and α_p and α_n."""
        return PlainMLP.params_at(cfg, width) + 2

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return super().reads(cfg) | {"alpha_p_init", "alpha_n_init", "beta", "eps"}

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        m = cfg.mlp
        if not m.alpha_p_init > 0:
            raise ConfigError("model.mlp.alpha_p_init", m.alpha_p_init, "a positive number (softplus's range)")
        if not m.alpha_n_init > m.beta:
            raise ConfigError("model.mlp.alpha_n_init", m.alpha_n_init, f"a number above model.mlp.beta={m.beta}")
        if not m.eps <= 0:
            raise ConfigError("model.mlp.eps", m.eps, "a number <= 0 (the negative branch's bound)")
