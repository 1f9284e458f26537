"""Gemma (``GemmaForCausalLM``): LLaMA's layers with (1 + w) RMSNorms and scaled embeddings, the parts Gemma 2's
record (``gemma2``) states too."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.llama import _LlamaStyle

# what Gemma's parts require, and Gemma 2's and its relatives'
GEMMA_RULES: tuple[Rule, ...] = (
    ("model.norm.unit_offset", (True,), " (norm scales are 1 + w)"),
    ("model.scale_embedding", (True,), " (embeddings are multiplied by sqrt(d_model))"),
)


def gemma_from_hf(cfg: ModelConfig) -> ModelConfig:
    """``cfg`` with Gemma's (1 + w) norm scales and scaled embeddings."""
    cfg.norm.unit_offset, cfg.scale_embedding = True, True
    return cfg


class Gemma(_LlamaStyle):
    """GemmaForCausalLM: LLaMA's layers with RMSNorm scales stored as w and applied as (1 + w), token
    embeddings times sqrt(d_model), and (in the published models) a tanh-approximate GeGLU."""

    parts = "RMSNorm (1 + w), scaled embeddings, GeGLU, MQA/GQA, tied head"

    model_type, title, model_class, config_class = "gemma", "Gemma", "GemmaForCausalLM", "GemmaConfig"
    features = frozenset({"model.position.scaling.kind", "model.norm.unit_offset", "model.scale_embedding"})

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + list(GEMMA_RULES)

    def from_hf(self, c: Any) -> ModelConfig:
        return gemma_from_hf(super().from_hf(c))


RECORDS: tuple[Family, ...] = (Gemma(),)
