"""Normalisation layers: ``layernorm`` (bias on/off) and ``rmsnorm``."""

from __future__ import annotations

from torch import Tensor, nn

from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn.fused import rms_norm
from archlab.registry import Registry

NORMS: Registry[type] = Registry("model.norm.kind")


def _check_eps(cfg: ModelConfig) -> None:
    if not cfg.norm.eps > 0:
        raise ConfigError("model.norm.eps", cfg.norm.eps, "a positive number")


@NORMS.register("layernorm")
class LayerNorm(nn.LayerNorm):
    """LayerNorm (Ba et al. 2016): scale, and a shift when ``bias``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.d_model, eps=cfg.norm.eps, bias=cfg.norm.bias)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return cfg.d_model * (2 if cfg.norm.bias else 1)

    validate = staticmethod(_check_eps)


@NORMS.register("rmsnorm")
class RMSNorm(nn.RMSNorm):
    """RMSNorm (Zhang & Sennrich 2019): scale only, no mean subtraction, no bias."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg.d_model, eps=cfg.norm.eps)

    def forward(self, x: Tensor) -> Tensor:
        return rms_norm(x, self.weight, self.eps)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return cfg.d_model

    validate = staticmethod(_check_eps)


def build_norm(cfg: ModelConfig) -> nn.Module:
    return NORMS.get(cfg.norm.kind)(cfg)
