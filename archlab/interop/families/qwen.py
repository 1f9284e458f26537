"""Qwen2 and Qwen3: the parts of their records (LLaMA's with q/k/v biases or a per-head QK-norm, sliding windows on later layers); the records are at the end."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import (
    Rule,
    out_bias,
)
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.windows import layer_types, uniform_window


class _Sliding(_LlamaStyle):
    """Qwen2 and Qwen3: a sliding window on every layer or none (``hf_layered``'s records of these
    families read and write layers that differ, from ``layer_types``)."""

    features = frozenset({"model.position.scaling.kind", "model.attention.window"})

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        window = cfg.attention.window
        return dict(
            super().to_hf(cfg),
            use_sliding_window=window is not None,
            sliding_window=window,
            max_window_layers=0 if window is not None else cfg.n_layer,
            layer_types=layer_types([cfg] * cfg.n_layer),
        )

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.window = uniform_window(c)
        return cfg


class Qwen2(_Sliding):
    """Qwen2ForCausalLM (Qwen2, Qwen2.5): LLaMA's layers with biases on q/k/v only; sliding windows."""

    parts = "LLaMA's layers with q/k/v biases; sliding windows"

    model_type, title, model_class, config_class = "qwen2", "Qwen2", "Qwen2ForCausalLM", "Qwen2Config"

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (True,), " (q/k/v always have biases)"),
            out_bias(False, " (o_proj has no bias)"),
            ("model.mlp.bias", (False,), ""),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        kwargs = super().to_hf(cfg)
        del kwargs["attention_bias"]
        return kwargs

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.qkv_bias, cfg.attention.out_bias = True, False
        return cfg


class Qwen3(_Sliding):
    """Qwen3ForCausalLM: LLaMA's layers with a per-head RMSNorm of q and k before RoPE, an explicit
    head_dim; sliding windows."""

    parts = "LLaMA's layers with per-head QK RMSNorm; sliding windows"

    model_type, title, model_class, config_class = "qwen3", "Qwen3", "Qwen3ForCausalLM", "Qwen3Config"
    features = _Sliding.features | {"model.attention.qk_norm"}

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)")]

    def from_hf(self, c: Any) -> ModelConfig:
        cfg = super().from_hf(c)
        cfg.attention.qk_norm = "head"
        return cfg
