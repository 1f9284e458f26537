"""Qwen3 (``Qwen3ForCausalLM``): LLaMA's layers with a per-head QK-norm, sliding windows on any layers
(written as Qwen2's, ``qwen2.windows_to_hf``)."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Rule
from archlab.interop.families.layered import LayeredFamily
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.qwen2 import Qwen2, windows_to_hf


class Qwen3(LayeredFamily, _LlamaStyle):
    """Qwen3ForCausalLM: LLaMA's layers with a per-head RMSNorm of q and k before RoPE, an explicit head_dim;
    sliding windows on the layers ``layer_types`` marks sliding."""

    parts = "LLaMA's layers with per-head QK RMSNorm; sliding windows"

    model_type, title, model_class, config_class = "qwen3", "Qwen3", "Qwen3ForCausalLM", "Qwen3Config"
    features = Qwen2.features | {"model.attention.qk_norm"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)")]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        cfg = super().uniform_from_hf(c)
        cfg.attention.qk_norm = "head"
        return cfg

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return windows_to_hf(cfg, lcs)


RECORDS: tuple[Family, ...] = (Qwen3(),)
