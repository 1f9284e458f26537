"""Gemma 2 (``Gemma2ForCausalLM``): Gemma's parts in sandwich blocks with soft-capping, a query scale and
sliding and full layers, the record Gemma 3's and VaultGemma's extend."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import LAYERS, Family, Problem, Rule
from archlab.interop.families.gemma import GEMMA_RULES, Gemma, gemma_from_hf
from archlab.interop.families.layered import LayeredFamily
from archlab.interop.families.llama import _LlamaStyle
from archlab.nn.mixers.base import head_dim

# what model.attention.scale must be: Gemma 2 stores the scale as query_pre_attn_scalar
SCALE_WANTS = "null, or n^-0.5 for a whole number n (Gemma 2's query_pre_attn_scalar)"


def query_scalar(cfg: ModelConfig) -> int | None:
    """query_pre_attn_scalar n, whose n^-0.5 is the attention scale (head_dim when scale is null); None when
    the scale is no such power."""
    scale = cfg.attention.scale
    if scale is None:
        return head_dim(cfg)
    n = round(scale**-2)
    return n if n >= 1 and n**-0.5 == scale else None


def scale_problems(cfg: ModelConfig) -> list[Problem]:
    """The attention scale query_pre_attn_scalar cannot hold."""
    return [] if query_scalar(cfg) is not None else [Problem("model.attention.scale", cfg.attention.scale, SCALE_WANTS)]


class Gemma2(LayeredFamily, _LlamaStyle):
    """Gemma2ForCausalLM: Gemma's parts (``gemma``: (1 + w) RMSNorms, scaled embeddings) with a norm before
    and after each sublayer (sandwich), an attention scale query_pre_attn_scalar^-0.5, attention and final
    logits soft-capped, sliding windows on some layers (the published models: layers 0, 2, ..., kinds
    ``local`` and ``global``)."""

    parts = "Gemma's parts in a sandwich block, soft-capping, query scale, local/global windows"

    model_type, title, model_class, config_class = "gemma2", "Gemma 2", "Gemma2ForCausalLM", "Gemma2Config"
    block = "sandwich"
    norms = {
        "attn_norm": "input_layernorm",
        "attn_out_norm": "post_attention_layernorm",
        "mlp_norm": "pre_feedforward_layernorm",
        "mlp_out_norm": "post_feedforward_layernorm",
    }
    activation = "hidden_activation"
    features = (
        Gemma.features
        | {
            "model.attention.scale",
            "model.attention.softcap",
            "model.head.softcap",
            "model.attention.window",
        }
        | LAYERS
    )
    checks = (Family.full_rotary, scale_problems)

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + list(GEMMA_RULES)

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        kwargs, n = super().uniform_to_hf(rep), query_scalar(rep)
        if n is None:
            raise self.refusal(scale_problems(rep)[0])
        return dict(
            kwargs,
            query_pre_attn_scalar=n,
            attn_logit_softcapping=rep.attention.softcap,
            final_logit_softcapping=rep.head.softcap,
        )

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        cfg = gemma_from_hf(super().uniform_from_hf(c))
        a = cfg.attention
        a.scale = c.query_pre_attn_scalar**-0.5
        a.softcap, cfg.head.softcap = c.attn_logit_softcapping, c.final_logit_softcapping
        return cfg


RECORDS: tuple[Family, ...] = (Gemma2(),)
