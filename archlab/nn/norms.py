"""Normalisation layers: ``layernorm`` (bias on/off) and ``rmsnorm``."""

from __future__ import annotations

from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.nn.component import MEMBERS, Base
from archlab.nn.fused import rms_norm
from archlab.registry import Registry

NORMS: Registry[type] = Registry("model.norm.kind", MEMBERS)


class Norm(Base):
    """What every norm checks: a positive ``eps``."""

    @staticmethod
    def validate(cfg: ModelConfig) -> None:
        checks.positive("model.norm.eps", cfg.norm.eps)


@NORMS.register("layernorm")
class LayerNorm(Norm, nn.LayerNorm):
    """LayerNorm (Ba et al. 2016): scale, and a shift when ``bias``."""

    def __init__(self, cfg: ModelConfig):
        nn.LayerNorm.__init__(self, cfg.d_model, eps=cfg.norm.eps, bias=cfg.norm.bias)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return cfg.d_model * (2 if cfg.norm.bias else 1)


@NORMS.register("rmsnorm")
class RMSNorm(Norm, nn.RMSNorm):
    """RMSNorm (Zhang & Sennrich 2019): scale only, no mean subtraction, no bias."""

    def __init__(self, cfg: ModelConfig):
        nn.RMSNorm.__init__(self, cfg.d_model, eps=cfg.norm.eps)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return cfg.d_model


def build_norm(cfg: ModelConfig) -> nn.Module:
    return NORMS.get(cfg.norm.kind)(cfg)
