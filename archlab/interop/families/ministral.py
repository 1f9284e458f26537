"""Ministral (``MinistralForCausalLM``: Mistral's layers, sliding or full as ``layer_types`` says) and
Ministral 3 (``Ministral3ForCausalLM``: Mistral's layers with transformers' generic YaRN and the queries
scaled by position, as Llama 4's)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import LAYERS, Family, Rule
from archlab.interop.families.layered import LayeredFamily, view
from archlab.interop.families.llama import Mistral
from archlab.interop.families.rope import rope_from_hf
from archlab.interop.families.values import config_head_dim, refuse_hf


class Ministral(LayeredFamily, Mistral):
    """MinistralForCausalLM (Ministral 8B): Mistral's layers without biases, each sliding or full as
    ``layer_types`` says (the published model: every other layer sliding), kinds ``local`` and ``global``;
    ``llama.Mistral`` holds the rest."""

    model_type, title, model_class, config_class = "ministral", "Ministral", "MinistralForCausalLM", "MinistralConfig"
    features = Mistral.features | LAYERS
    parts = "pre-norm RMSNorm, RoPE, SwiGLU, no biases, `window` on any layers (`model.layers`), GQA"


class Ministral3(Mistral):
    """Ministral3ForCausalLM: Mistral's layers (one ``sliding_window`` on every layer, or none), RoPE with
    transformers' generic YaRN (``mscale`` and ``mscale_all_dim`` scale cos and sin alone: archlab's
    ``softmax_mscale`` false), and the rotated queries at position p times
    1 + β·log(1 + ⌊p / original_max_position_embeddings⌋), β = ``rope_parameters.llama_4_scaling_beta`` (0:
    unscaled), p each row's RoPE position (``position_ids``): archlab's ``query_scale_*`` with offset 0 and
    ``query_scale_by: position``."""

    model_type, title = "ministral3", "Ministral 3"
    model_class, config_class = "Ministral3ForCausalLM", "Ministral3Config"
    features = Mistral.features | {
        "model.attention.query_scale_beta",
        "model.attention.query_scale_by",
        "model.position.scaling.softmax_mscale",
    }
    scalings = ("none", "linear", "llama3", "yarn")
    parts = "Mistral's parts with generic YaRN (`softmax_mscale: false`) and `query_scale_*` (offset 0)"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        a, scaling = cfg.attention, getattr(cfg.position, "scaling", None)  # None: not RoPE, refused by the base rules
        rules = super().rules(cfg) + [("model.attention.query_scale_offset", (0,), " (Ministral 3 floors p / length)")]
        if a.query_scale_beta is not None:
            why = " (Ministral 3 scales a query by its position_ids, as RoPE rotates it)"
            rules.append(("model.attention.query_scale_by", ("position",), why))
        if scaling is None:
            return rules
        if a.query_scale_beta is not None and scaling.kind in ("llama3", "yarn"):
            why = " (original_max_position_embeddings is both RoPE's original context and the query scale's length)"
            rules.append(("model.attention.query_scale_length", (scaling.original_context,), why))
        if scaling.mscale_all_dim is not None:
            why = " (transformers' generic YaRN scales cos and sin alone)"
            rules.append(("model.position.scaling.softmax_mscale", (False,), why))
        return rules

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs, a = super().to_hf(cfg), cfg.attention
        scaled = a.query_scale_beta is not None
        original = kwargs["rope_parameters"].get("original_max_position_embeddings")
        if original is None:  # the query scale's length (read whatever β, so always given)
            original = a.query_scale_length if scaled else cfg.context_length
        return dict(
            kwargs,
            rope_parameters=dict(
                kwargs["rope_parameters"],
                original_max_position_embeddings=original,
                llama_4_scaling_beta=a.query_scale_beta if scaled else 0.0,
            ),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        rope = dict(getattr(c, "rope_parameters", None) or {})
        beta, original = rope.pop("llama_4_scaling_beta", None), rope.get("original_max_position_embeddings")
        rope.pop("max_position_embeddings", None)  # read by nothing
        if not isinstance(beta, (int, float)) or isinstance(beta, bool) or beta < 0:
            refuse_hf(c, "rope_parameters.llama_4_scaling_beta", "a number >= 0 (0: queries unscaled)", beta)
        if rope.get("rope_type", rope.get("type")) in ("default", "linear", None):
            rope.pop("original_max_position_embeddings", None)  # the query scale's alone
        hd = config_head_dim(c)
        c = view(c, rope_parameters=rope)
        cfg = super().from_hf(view(c, rope_parameters=None))
        cfg.position = rope_from_hf(c, hd, partial=False, scalings=("default", *self.scalings[1:]), yarn_softmax=False)
        if beta:
            if not isinstance(original, int) or isinstance(original, bool) or original < 1:
                name = "rope_parameters.original_max_position_embeddings"
                refuse_hf(c, name, "a positive integer (the query scale's length)", original)
            a = cfg.attention
            a.query_scale_beta, a.query_scale_length, a.query_scale_offset = float(beta), original, 0
            a.query_scale_by = "position"
        return cfg


RECORDS: tuple[Family, ...] = (Ministral(), Ministral3())
