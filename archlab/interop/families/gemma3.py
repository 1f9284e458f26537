"""Gemma 3's text decoder (``Gemma3ForCausalLM``): Gemma 2's record (``gemma2``) with QK-norms, local and global
layers each with its own RoPE."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.gemma2 import Gemma2
from archlab.interop.families.layered import Layer, per_type_rope, rope_per_type_to_hf, view
from archlab.interop.families.values import refuse_hf
from archlab.interop.families.windows import FULL, SLIDING, checked_types, sliding_to_hf


class Gemma3(Gemma2):
    """Gemma3ForCausalLM (text, ``gemma3_text``): Gemma 2's sandwich block, (1 + w) RMSNorms, scaled
    embeddings, tanh-GeGLU and query_pre_attn_scalar, with a (1 + w) RMSNorm of q and k per head before
    RoPE, RoPE parameters per layer type (local base 10⁴, global 10⁶ and a scaling in the published
    models), sliding windows by ``layer_types``, and no attention soft-capping (transformers' Gemma 3
    attention does not apply ``attn_logit_softcapping``); the final logits may be soft-capped."""

    parts = "Gemma 2's parts with QK RMSNorm, local/global layers each with their own RoPE"

    model_type, title, model_class, config_class = "gemma3_text", "Gemma 3", "Gemma3ForCausalLM", "Gemma3TextConfig"
    features = (Gemma2.features - {"model.attention.softcap"}) | {"model.attention.qk_norm"}
    rope_per_type = True

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)")]

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        ropes = per_type_rope(c, types, c.head_dim)
        return [Layer(c.sliding_window if t == SLIDING else None, ropes[t]) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        if getattr(c, "attn_logit_softcapping", None) is not None:
            refuse_hf(c, "attn_logit_softcapping", "null (transformers' Gemma 3 attention does not apply it)")
        full = (c.rope_parameters or {}).get(FULL)
        cfg = super().uniform_from_hf(view(c, rope_parameters=full))
        cfg.attention.qk_norm = "head"
        return cfg

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return dict(
            **sliding_to_hf(cfg, lcs),
            rope_parameters=rope_per_type_to_hf(lcs),
        )


RECORDS: tuple[Family, ...] = (Gemma3(),)
