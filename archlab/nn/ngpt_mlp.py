"""``ngpt``: nGPT's gated MLP (Loshchilov et al. 2024, arXiv:2410.01131): ``down(up·s_u ⊙ SiLU(gate·s_v))``
with s_u and s_v learned per hidden dim (scaled parameters; s_v's default value sqrt(d_model), the paper's
factor), optionally the product L2-normed before ``down`` (Dory's ``ffn_sub_norm``)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar, Optional

import torch.nn.functional as F
from torch import Tensor

from archlab import checks
from archlab.config import ModelConfig, mlp_config
from archlab.nn.mlp import MLPS, Gate, GatedMLP, GatedWidthConfig, d_ff
from archlab.nn.norms import unit_norm
from archlab.nn.scaled import ScaledVector, unit_along


@mlp_config("ngpt")
@dataclass
class NGPTMLPConfig(GatedWidthConfig):
    """``model.mlp`` with kind ngpt: the SiLU-gated MLP with learned scales on its two projections."""

    kind: str = "ngpt"
    bias: bool = False
    # s_u (the up projection's) and s_v (the gate's), d_ff each, starting at *_init and stored as s·scale/init
    up_scale_init: float = 1.0
    up_scale_scale: float = 1.0
    gate_scale_init: Optional[float] = None  # None = sqrt(d_model) (the paper's s_v·sqrt(d_model), s_v from 1)
    gate_scale_scale: float = 1.0
    hidden_norm: bool = False  # the SiLU product L2-normed before the down projection (Dory's ffn_sub_norm)


def gate_scale_init(cfg: ModelConfig) -> float:
    """s_v's value at init: ``gate_scale_init``, else sqrt(d_model)."""
    init = cfg.mlp.gate_scale_init
    return math.sqrt(cfg.d_model) if init is None else init


@MLPS.register("ngpt")
class NGPTMLP(GatedMLP):
    """``gate_up`` ([gate | up]) and ``down`` as SwiGLU's; the gate times s_v and the up projection times s_u
    before SiLU's product (transformers' ``DoryMLP``)."""

    takes_bitlinear: ClassVar[bool] = False  # weights on the unit sphere: not quantised

    def __init__(self, cfg: ModelConfig, layer: int = 0, width: Optional[int] = None):
        super().__init__(cfg, layer, width)
        m, f = cfg.mlp, d_ff(cfg) if width is None else width
        self.up_scale = ScaledVector(f, m.up_scale_init, m.up_scale_scale)
        self.gate_scale = ScaledVector(f, gate_scale_init(cfg), m.gate_scale_scale)
        self.hidden_norm, self.eps = m.hidden_norm, cfg.norm.eps

    def to_sphere(self) -> None:
        """The gate and up rows and the down projection's columns unit vectors along d_model (nGPT §2.4)."""
        unit_along(self.gate_up.weight, 1)
        unit_along(self.down.weight, 0)

    @staticmethod
    def activation_of(cfg: ModelConfig) -> Gate:
        return Gate("silu")

    def forward(self, x: Tensor) -> Tensor:
        gate, up = self.gate_up(x).chunk(2, dim=-1)
        h = F.silu(gate * self.gate_scale().to(x.dtype)) * (up * self.up_scale().to(x.dtype))
        return self.down(unit_norm(h, self.eps) if self.hidden_norm else h)

    @staticmethod
    def params_at(cfg: ModelConfig, width: int) -> int:
        """SwiGLU's three matrices (and biases), and s_u and s_v: 2·width."""
        return GatedMLP.params_at(cfg, width) + 2 * width

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        own = {"up_scale_init", "up_scale_scale", "gate_scale_init", "gate_scale_scale", "hidden_norm"}
        return super().reads(cfg) | own

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        super().validate(cfg)
        m = cfg.mlp
        for name in ("up_scale_init", "up_scale_scale", "gate_scale_scale"):
            checks.positive(f"model.mlp.{name}", getattr(m, name))
        if m.gate_scale_init is not None:
            checks.positive(
                "model.mlp.gate_scale_init", m.gate_scale_init, "a positive number, or null (sqrt(d_model))"
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        norm = ", l2 hidden-norm" if cfg.mlp.hidden_norm else ""
        return f"ngpt d_ff={d_ff(cfg)}, s_u {cfg.mlp.up_scale_init:g}, s_v {gate_scale_init(cfg):g}{norm}"
