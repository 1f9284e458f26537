"""Granite (GraniteForCausalLM: IBM Granite 3.x dense): LLaMA's layers with four multipliers, each an
archlab field: ``embedding_multiplier`` (``model.embedding_multiplier``), ``residual_multiplier``
(``model.block.residual_multiplier``), ``attention_multiplier`` (the score scale ``model.attention.scale``)
and ``logits_scaling`` (``model.head.logit_scale``, its reciprocal)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Problem, Rule
from archlab.interop.families.llama import Llama
from archlab.interop.families.phi3 import fixed_head_dim, head_dim_rule
from archlab.interop.families.values import refuse_hf
from archlab.nn.mixers.base import head_dim

LOGITS_WANTS = "a scale s with 1 / (1 / s) == s (Granite stores logits_scaling = 1 / s; powers of two and most others)"


def multiplier_problems(cfg: ModelConfig) -> list[Problem]:
    """The logit scale Granite's reciprocal ``logits_scaling`` cannot hold exactly."""
    s = cfg.head.logit_scale
    return [] if 1 / (1 / s) == s else [Problem("model.head.logit_scale", s, LOGITS_WANTS)]


def multipliers_to_hf(cfg: ModelConfig) -> dict[str, Any]:
    """Granite's four multipliers: the score scale written out (1/sqrt(head_dim) where archlab's is null)
    and the logits divided by the reciprocal of ``model.head.logit_scale``."""
    scale = cfg.attention.scale
    return dict(
        embedding_multiplier=cfg.embedding_multiplier,
        residual_multiplier=cfg.block.residual_multiplier,
        attention_multiplier=head_dim(cfg) ** -0.5 if scale is None else scale,
        logits_scaling=1 / cfg.head.logit_scale,
    )


def check_multipliers(c: Any) -> None:
    """Refuse a multiplier that is not a positive number, and a ``logits_scaling`` whose reciprocal does
    not read back as itself."""
    for name in ("embedding_multiplier", "residual_multiplier", "attention_multiplier", "logits_scaling"):
        value = getattr(c, name)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
            refuse_hf(c, name, "a positive number")
    if 1 / (1 / c.logits_scaling) != c.logits_scaling:
        refuse_hf(
            c, "logits_scaling", "a number L with 1 / (1 / L) == L (archlab holds 1 / L as model.head.logit_scale)"
        )


def granite_to_hf(kwargs: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
    """LLaMA's config keys ``kwargs`` as Granite's: no head_dim (GraniteConfig has none: hidden_size / heads),
    the multipliers."""
    del kwargs["head_dim"]
    return dict(kwargs, **multipliers_to_hf(cfg))


def multipliers_from_hf(c: Any, cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with Granite's multipliers (``check_multipliers`` passed): a score scale of 1/sqrt(head_dim)
    reads as archlab's default, a null one."""
    cfg.embedding_multiplier = float(c.embedding_multiplier)
    cfg.block.residual_multiplier = float(c.residual_multiplier)
    scale = float(c.attention_multiplier)
    cfg.attention.scale = None if scale == fixed_head_dim(c) ** -0.5 else scale
    cfg.head.logit_scale = 1 / c.logits_scaling
    return cfg


# Granite's multipliers, each an archlab field
MULTIPLIER_FEATURES = frozenset(
    {"model.embedding_multiplier", "model.block.residual_multiplier", "model.attention.scale", "model.head.logit_scale"}
)
CHECKS = (Family.full_rotary, multiplier_problems)  # a Granite record's problems beyond its rules


class Granite(Llama):
    """GraniteForCausalLM: LLaMA's layers and biases (``attention_bias``, ``mlp_bias``) with embeddings
    times ``embedding_multiplier``, each sublayer's output times ``residual_multiplier``, scores times
    ``attention_multiplier`` (1/sqrt(head_dim) reads as archlab's default, a null scale) and the logits
    divided by ``logits_scaling``. archlab multiplies them by s = 1 / logits_scaling: the config round
    trip is exact where 1 / (1 / x) == x in float64 (other values are refused both ways); the logits
    agree bit for bit where the scaling is a power of two (Granite's 8 and 16), else to the last bit of
    a float product."""

    model_type, title, model_class, config_class = "granite", "Granite", "GraniteForCausalLM", "GraniteConfig"
    features = Llama.features | MULTIPLIER_FEATURES
    parts = "LLaMA's layers with embedding, residual, attention-score and logit multipliers"
    checks = CHECKS

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [*super().rules(cfg), head_dim_rule(cfg, self.title)]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return granite_to_hf(super().to_hf(cfg), cfg)

    def from_hf(self, c: Any) -> ModelConfig:
        check_multipliers(c)
        cfg = super().from_hf(c)
        cfg.attention.head_dim = None
        return multipliers_from_hf(c, cfg)


RECORDS: tuple[Family, ...] = (Granite(),)
