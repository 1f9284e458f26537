"""Gemma (``GemmaForCausalLM``) and the parts of Gemma 2 that its record in ``gemma2`` extends."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import (
    Family,
    Problem,
    Rule,
)
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.windows import sliding_to_hf, uniform_window
from archlab.nn.mixers.base import head_dim


class Gemma(_LlamaStyle):
    """GemmaForCausalLM: LLaMA's layers with RMSNorm scales stored as w and applied as (1 + w), token
    embeddings times sqrt(d_model), and (in the published models) a tanh-approximate GeGLU."""

    parts = "RMSNorm (1 + w), scaled embeddings, GeGLU, MQA/GQA, tied head"

    model_type, title, model_class, config_class = "gemma", "Gemma", "GemmaForCausalLM", "GemmaConfig"
    features = frozenset({"model.position.scaling.kind", "model.norm.unit_offset", "model.scale_embedding"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [
            ("model.norm.unit_offset", (True,), " (norm scales are 1 + w)"),
            ("model.scale_embedding", (True,), " (embeddings are multiplied by sqrt(d_model))"),
        ]

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.norm.unit_offset, cfg.scale_embedding = True, True
        return cfg


class Gemma2(Gemma):
    """Gemma2ForCausalLM: Gemma with a norm before and after each sublayer (sandwich), an attention scale
    query_pre_attn_scalar^-0.5, attention and final logits soft-capped, sliding windows on some layers."""

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
    features = Gemma.features | {
        "model.attention.scale",
        "model.attention.softcap",
        "model.head.softcap",
        "model.attention.window",
    }

    # what model.attention.scale must be: Gemma 2 stores the scale as query_pre_attn_scalar
    SCALE_WANTS = "null, or n^-0.5 for a whole number n (Gemma 2's query_pre_attn_scalar)"

    def part_problems(self, cfg: ModelConfig) -> list[Problem]:
        scale = cfg.attention.scale
        if self._query_scalar(cfg) is None:
            return [*super().part_problems(cfg), Problem("model.attention.scale", scale, self.SCALE_WANTS)]
        return super().part_problems(cfg)

    @staticmethod
    def _query_scalar(cfg: ModelConfig) -> int | None:
        """query_pre_attn_scalar n, whose n^-0.5 is the attention scale (head_dim when scale is null);
        None when the scale is no such power."""
        scale = cfg.attention.scale
        if scale is None:
            return head_dim(cfg)
        n = round(scale**-2)
        return n if n >= 1 and n**-0.5 == scale else None

    def query_scalar(self, cfg: ModelConfig) -> int:
        """``_query_scalar``, refusing a scale that is no n^-0.5."""
        n = self._query_scalar(cfg)
        if n is None:
            raise self.refusal(Problem("model.attention.scale", cfg.attention.scale, self.SCALE_WANTS))
        return n

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        a = cfg.attention
        return dict(
            super().to_hf(cfg),
            query_pre_attn_scalar=self.query_scalar(cfg),
            attn_logit_softcapping=a.softcap,
            final_logit_softcapping=cfg.head.softcap,
            # transformers builds the sliding mask even when no layer slides: give it the context then
            **sliding_to_hf(cfg, [cfg] * cfg.n_layer),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        a = cfg.attention
        a.scale = c.query_pre_attn_scalar**-0.5
        a.softcap, cfg.head.softcap = c.attn_logit_softcapping, c.final_logit_softcapping
        a.window = uniform_window(c)
        return cfg


RECORDS: tuple[Family, ...] = (Gemma(),)
