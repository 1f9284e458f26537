"""The ``ngpt`` block wiring (nGPT, Loshchilov et al. 2024, arXiv:2410.01131): the states on the unit sphere,
each sublayer's output normed and the state moved toward it by a learned step size per dim,
``h ← norm(h + |α|·(norm(f(h)) − h))``, the norms weightless (``model.norm.kind=l2``)."""

from __future__ import annotations

import torch
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn import laurel
from archlab.nn.block import BLOCKS, Block
from archlab.nn.component import Role
from archlab.nn.mlp import MLPS
from archlab.nn.scaled import ScaledVector, scale_or_default


@BLOCKS.register("ngpt")
class NGPT(Block):
    """``h = n1(x)``, ``h + |α_A|·(n3(attn(h)) − h)``, then ``h = n2(h)``, ``h + |α_M|·(n4(mlp(h)) − h)``: each
    sublayer reads a state of norm 1 and the next block's first norm (or the final one) puts the interpolation
    back on the sphere (transformers' ``DoryDecoderLayer``). α_A and α_M (``attn_alpha``, ``mlp_alpha``, d_model
    each) are scaled parameters: stored at ``alpha_scale``, used times ``alpha_init / alpha_scale``."""

    mup_refusal = (
        "holds nGPT's step sizes, whose scaled-parameter form (stored value x init/scale) takes the place of "
        "muP's width rules: use param.kind=sp"
    )

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__(cfg, layer)
        b, d = cfg.block, cfg.d_model
        scale = scale_or_default(b.alpha_scale, d)
        self.attn_alpha = ScaledVector(d, b.alpha_init, scale)
        self.mlp_alpha = ScaledVector(d, b.alpha_init, scale) if self.mlp is not None else None

    def forward(self, x, rotary=None, mask=None, cache=None):
        assert self.attn_norm is not None and self.attn_out_norm is not None  # built: this wiring's norm_names
        h = self.attn_norm(x)
        h = self.step(h, self.drop(self.attn_out_norm(self.attn(h, rotary, mask, cache, self.layer))), self.attn_alpha)
        if self.mlp is None or self.mlp_alpha is None:
            return h
        assert self.mlp_norm is not None and self.mlp_out_norm is not None
        h = self.mlp_norm(h)
        return self.step(h, self.drop(self.mlp_out_norm(self.feed(h, mask, cache))), self.mlp_alpha)

    @staticmethod
    def step(h: Tensor, y: Tensor, alpha: ScaledVector) -> Tensor:
        """``h + |α|·(y − h)``: the state moved toward the sublayer's normed output."""
        return h + alpha().abs().to(h.dtype) * (y - h)

    @staticmethod
    def unit_weights(cfg: ModelConfig) -> bool:
        """Whether training renormalises the nGPT parts' matrices after each step (``unit_weights``)."""
        return cfg.block.unit_weights

    def param_roles(self) -> dict[str, Role]:
        return {"attn_alpha.weight": Role.VECTOR, "mlp_alpha.weight": Role.VECTOR}  # μP refused: mup_refusal

    @staticmethod
    def norm_names(cfg: ModelConfig) -> tuple[str, ...]:
        return ("attn_norm", "mlp_norm", "attn_out_norm", "mlp_out_norm")

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Its norms' (none with l2) and a step size per dim and sublayer: 2·d_model (d_model without an MLP)."""
        return super().num_params(cfg, layer) + cfg.d_model * (2 if MLPS.get(cfg.mlp.kind).present else 1)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        b = cfg.block
        checks.positive("model.block.alpha_init", b.alpha_init)
        laurel.validate(cfg, takes=False)  # its skips are its own
        checks.choice("model.block.unit_weights", b.unit_weights, (True, False))
        if b.alpha_scale is not None:
            checks.positive("model.block.alpha_scale", b.alpha_scale, "a positive number, or null (1/sqrt(d_model))")
        if cfg.norm.kind != "l2":
            raise ConfigError("model.norm.kind", cfg.norm.kind, "l2 with block kind ngpt (its states on the sphere)")
        if b.attn_norm is not True:
            raise ConfigError("model.block.attn_norm", b.attn_norm, "true with block kind ngpt")
        if b.residual_rule != "constant":
            raise ConfigError("model.block.residual_rule", b.residual_rule, "constant with block kind ngpt")
        if cfg.stream.kind != "plain":
            raise ConfigError(
                "model.stream.kind", cfg.stream.kind, "plain with block kind ngpt (one state on the sphere)"
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``ngpt α 0.05``."""
        return f"ngpt α {cfg.block.alpha_init:g}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its step sizes' init and scale (not residual_multiplier: the step sizes weigh the sublayers)."""
        return frozenset({"alpha_init", "alpha_scale", "unit_weights"})


@torch.no_grad()
def renormalise(model: nn.Module, cfg: ModelConfig) -> None:
    """After an optimizer step: where the block is nGPT's with ``unit_weights``, every part of ``model`` that
    holds nGPT's matrices (``to_sphere``: the ngpt attention, MLP and head) puts them back on the sphere."""
    if not BLOCKS.get(cfg.block.kind).unit_weights(cfg):
        return
    for module in model.modules():
        if (to_sphere := getattr(module, "to_sphere", None)) is not None:
            to_sphere()
