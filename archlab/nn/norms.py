"""Normalisation layers: ``layernorm`` (bias on/off) and ``rmsnorm``, each with its scale stored as w or
1 + w (``unit_offset``); ``l2``, onto the unit sphere with no weight (nGPT's)."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn.component import Component, Role
from archlab.nn.fused import rms_norm
from archlab.registry import Registry


class Norm(Component, nn.Module):
    """A norm entry, built as ``Entry(cfg, dim)`` over ``dim`` features (default ``d_model``; QK-norm
    builds them over a head or a whole projection, mla over its latents). Every norm checks a positive
    ``eps``."""

    def __init__(self, cfg: ModelConfig, dim: Optional[int] = None):
        super().__init__()

    @staticmethod
    def num_params(cfg: ModelConfig, dim: Optional[int] = None) -> int:
        """Parameters of one norm over ``dim`` features (default ``d_model``)."""
        raise NotImplementedError

    def per_head(self, x: Tensor) -> Tensor:
        """This norm over the last dim of ``x`` ``[..., heads, hd]`` alone, each head scaled (and shifted)
        by its own hd of this norm's heads·hd parameters: QK-norm with a scale per head (Cohere's
        ``q_norm`` of weight [H, hd]; StableLM 2's one LayerNorm per head). Statistics in at least
        float32; the result in ``x``'s dtype."""
        raise NotImplementedError

    def param_roles(self) -> dict[str, Role]:
        return {name: Role.VECTOR for name, _ in self.named_parameters()}  # a scale, and LayerNorm's shift

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        checks.positive("model.norm.eps", cfg.norm.eps)
        checks.choice("model.norm.affine", cfg.norm.affine, (True, False))
        if not cfg.norm.affine and cfg.norm.unit_offset:
            raise ConfigError("model.norm.unit_offset", True, "false when model.norm.affine is false (no scale)")

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        return cfg.norm.kind


NORMS: Registry[type[Norm]] = Registry("model.norm.kind", base=Norm)


@NORMS.register("layernorm")
class LayerNorm(Norm, nn.LayerNorm):
    """LayerNorm (Ba et al. 2016): scale, and a shift when ``bias``. With ``unit_offset`` the scale is
    ``1 + w`` and ``w`` starts at 0 (Nemotron's LayerNorm1P), so weight decay pulls it toward 1."""

    def __init__(self, cfg: ModelConfig, dim: Optional[int] = None):
        nn.LayerNorm.__init__(
            self, dim or cfg.d_model, eps=cfg.norm.eps, elementwise_affine=cfg.norm.affine, bias=cfg.norm.bias
        )
        self.unit_offset = cfg.norm.unit_offset
        if self.unit_offset:
            self.reset_parameters()

    @staticmethod
    def num_params(cfg: ModelConfig, dim: Optional[int] = None) -> int:
        if not cfg.norm.affine:
            return 0
        return (dim or cfg.d_model) * (2 if cfg.norm.bias else 1)

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return frozenset({"eps", "affine", "unit_offset"} | ({"bias"} if cfg.norm.affine else set()))

    def reset_parameters(self) -> None:
        super().reset_parameters()
        if getattr(self, "unit_offset", False):
            nn.init.zeros_(self.weight)

    def scale(self, dtype: torch.dtype) -> Tensor:
        """The applied scale in ``dtype``: w, or 1 + w."""
        w = self.weight.to(dtype)
        return 1 + w if self.unit_offset else w

    def forward(self, input: Tensor) -> Tensor:  # input: nn.LayerNorm's name for it
        if self.unit_offset:  # 1 + w in at least float32: bf16 would round a small w away
            wide = torch.promote_types(input.dtype, torch.float32)
            bias = None if self.bias is None else self.bias.to(wide)
            y = F.layer_norm(input.to(wide), self.normalized_shape, self.scale(wide), bias, self.eps)
            return y.to(input.dtype)
        return super().forward(input)

    def per_head(self, x: Tensor) -> Tensor:
        wide = torch.promote_types(x.dtype, torch.float32)
        y = F.layer_norm(x.to(wide), x.shape[-1:], eps=self.eps)
        if self.weight is None:  # affine false: the norm alone
            return y.to(x.dtype)
        y = y * self.scale(wide).view(x.shape[-2:])
        if self.bias is not None:
            y = y + self.bias.to(wide).view(x.shape[-2:])
        return y.to(x.dtype)


@NORMS.register("rmsnorm")
class RMSNorm(Norm, nn.RMSNorm):
    """RMSNorm (Zhang & Sennrich 2019): scale only, no mean subtraction, no bias. With ``unit_offset``
    the scale is ``1 + w`` and ``w`` starts at 0 (Gemma), so weight decay pulls it toward 1."""

    def __init__(self, cfg: ModelConfig, dim: Optional[int] = None):
        nn.RMSNorm.__init__(self, dim or cfg.d_model, eps=cfg.norm.eps, elementwise_affine=cfg.norm.affine)
        self.unit_offset = cfg.norm.unit_offset
        if self.unit_offset:
            self.reset_parameters()

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return frozenset({"eps", "affine", "unit_offset"})  # no bias

    def reset_parameters(self) -> None:
        if getattr(self, "unit_offset", False):
            nn.init.zeros_(self.weight)
        else:
            super().reset_parameters()

    def forward(self, x: Tensor) -> Tensor:
        eps = self.eps
        assert eps is not None  # built with cfg.norm.eps (nn.RMSNorm's None would mean the dtype's eps)
        if self.unit_offset:  # 1 + w in at least float32, as Gemma computes it: bf16 would round w away
            wide = torch.promote_types(x.dtype, torch.float32)
            return rms_norm(x.to(wide), 1 + self.weight.to(wide), eps).to(x.dtype)
        if self.weight is None:  # affine false: the norm alone
            return F.rms_norm(x, x.shape[-1:], eps=eps)
        return rms_norm(x, self.weight, eps)

    def per_head(self, x: Tensor) -> Tensor:
        eps = self.eps
        assert eps is not None
        wide = torch.promote_types(x.dtype, torch.float32)
        if self.weight is None:  # affine false: the norm alone
            return F.rms_norm(x.to(wide), x.shape[-1:], eps=eps).to(x.dtype)
        scale = self.weight.to(wide).view(x.shape[-2:])
        y = F.rms_norm(x.to(wide), x.shape[-1:], eps=eps) * (1 + scale if self.unit_offset else scale)
        return y.to(x.dtype)

    @staticmethod
    def num_params(cfg: ModelConfig, dim: Optional[int] = None) -> int:
        return (dim or cfg.d_model) if cfg.norm.affine else 0


def l2_norm(x: Tensor, eps: float) -> Tensor:
    """``x / sqrt(mean(x²) + eps)`` over the last dim, in float32 at least, without a weight (Llama 4's
    Llama4TextL2Norm, an RMSNorm with no scale: its l2 QK-norm, Gemma 4's value norm and router input)."""
    y = x.to(torch.promote_types(x.dtype, torch.float32))
    return (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def unit_norm(x: Tensor, eps: float) -> Tensor:
    """``x / sqrt(sum(x²) + eps)`` over the last dim, in float32 at least: onto the unit sphere (nGPT)."""
    y = x.to(torch.promote_types(x.dtype, torch.float32))
    return (y * torch.rsqrt(y.pow(2).sum(-1, keepdim=True) + eps)).to(x.dtype)


@NORMS.register("l2")
class L2Norm(Norm):
    """Onto the unit sphere, ``x / sqrt(sum(x²) + eps)``, with no weight: nGPT's normalisation (Loshchilov et
    al. 2024), its states of norm 1, not RMS 1 (transformers' ``DoryL2Norm``)."""

    def __init__(self, cfg: ModelConfig, dim: Optional[int] = None):
        super().__init__(cfg, dim)
        self.eps = cfg.norm.eps

    def forward(self, x: Tensor) -> Tensor:
        return unit_norm(x, self.eps)

    def per_head(self, x: Tensor) -> Tensor:
        return unit_norm(x, self.eps)

    @staticmethod
    def num_params(cfg: ModelConfig, dim: Optional[int] = None) -> int:
        return 0

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        checks.positive("model.norm.eps", cfg.norm.eps)

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return frozenset({"eps"})  # no weight: neither affine, bias nor unit_offset


def build_norm(cfg: ModelConfig) -> Norm:
    return NORMS.get(cfg.norm.kind)(cfg)
