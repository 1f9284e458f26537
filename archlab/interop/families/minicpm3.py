"""MiniCPM3 (``minicpm3``): Youtu-LLM's layers (LLaMA's pre-norm RMSNorm block with DeepSeek's multi-head
latent attention over a dense gated MLP) with the three μP multipliers MiniCPM reads from its config:
``scale_emb`` times the embeddings, ``scale_depth / sqrt(num_hidden_layers)`` times each sublayer's output
as it joins the residual stream, and the final hidden states divided by ``hidden_size / dim_model_base``
before the head. Its latent norms are at 1e-6 while ``rms_norm_eps`` (1e-5 in MiniCPM3-4B) sets the others:
archlab's ``model.attention.latent_norm_eps``. Nothing here imports transformers."""

from __future__ import annotations

import math
from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Problem, Rule
from archlab.interop.families.layered import view
from archlab.interop.families.mla import Youtu
from archlab.interop.families.values import refuse_hf

_MULTIPLIERS = ("model.embedding_multiplier", "model.block.residual_multiplier", "model.head.logit_scale")
_LONGROPE = (
    "model.position.scaling.short_factor",
    "model.position.scaling.long_factor",
    "model.position.scaling.attention_factor",
)


class MiniCPM3(Youtu):
    """MiniCPM3ForCausalLM: Youtu's parts with RoPE on halves (transformers' ``apply_rotary_pos_emb``, no
    ``rope_interleave``), LongRoPE as well (MiniCPM3-4B's), and archlab's ``model.embedding_multiplier`` =
    ``scale_emb``, ``model.block.residual_multiplier`` = ``scale_depth / sqrt(num_hidden_layers)`` and
    ``model.head.logit_scale`` = ``dim_model_base / hidden_size`` (transformers divides the hidden states by
    its reciprocal before the head, archlab multiplies the logits: equal up to float rounding). The other
    way, ``scale_depth`` is written as residual_multiplier·sqrt(layers) and ``dim_model_base`` as
    logit_scale·d_model: values that do not read back as themselves are refused."""

    model_type, title, model_class, config_class = "minicpm3", "MiniCPM3", "MiniCPM3ForCausalLM", "MiniCPM3Config"
    features = Youtu.features | {*_MULTIPLIERS, *_LONGROPE}
    scalings = ("none", "linear", "llama3", "longrope", "yarn")
    parts = "MLA over a dense gated MLP (Youtu's), embedding, residual and logit multipliers, latent norms at 1e-6"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return [*super().rules(cfg), ("model.position.pairing", ("half",), " (it rotates halves)")]

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        found = super().part_problems(cfg)
        m, root = cfg.block.residual_multiplier, math.sqrt(cfg.n_layer)
        if m * root / root != m:
            wants = (
                f"a multiplier m with m·sqrt({cfg.n_layer}) / sqrt({cfg.n_layer}) == m (scale_depth = m·sqrt(layers))"
            )
            found.append(Problem("model.block.residual_multiplier", m, wants))
        s, d = cfg.head.logit_scale, cfg.d_model
        base = round(s * d)
        if base < 1 or base / d != s:
            wants = f"an integer over d_model={d} (dim_model_base / hidden_size, dim_model_base an integer)"
            found.append(Problem("model.head.logit_scale", s, wants))
        return found

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["rope_interleave"]  # MiniCPM3Config has none: it always rotates halves
        return dict(
            kwargs,
            mlp_bias=False,
            scale_emb=cfg.embedding_multiplier,
            scale_depth=cfg.block.residual_multiplier * math.sqrt(cfg.n_layer),
            dim_model_base=round(cfg.head.logit_scale * cfg.d_model),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        if c.mlp_bias:
            refuse_hf(c, "mlp_bias", "false (archlab's gated MLP here has no biases)")
        for name in ("scale_emb", "scale_depth", "dim_model_base"):
            value = getattr(c, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value > 0:
                refuse_hf(c, name, "a positive number")
        cfg = super().from_hf(view(c, rope_interleave=False))
        cfg.embedding_multiplier = float(c.scale_emb)
        cfg.block.residual_multiplier = c.scale_depth / math.sqrt(c.num_hidden_layers)
        cfg.head.logit_scale = c.dim_model_base / c.hidden_size
        return cfg


RECORDS: tuple[Family, ...] = (MiniCPM3(),)
