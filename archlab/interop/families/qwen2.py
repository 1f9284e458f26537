"""Qwen2 (``Qwen2ForCausalLM``: Qwen2, Qwen2.5): LLaMA's layers with q/k/v biases, sliding windows on any
layers; and how Qwen2 and Qwen3 write their windows."""

from __future__ import annotations

from typing import Any

from archlab.config import ModelConfig
from archlab.interop.families.base import LAYERS, Family, Rule, out_bias
from archlab.interop.families.layered import LayeredFamily
from archlab.interop.families.llama import _LlamaStyle
from archlab.interop.families.windows import layer_types


def windows_to_hf(cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
    """Qwen2's and Qwen3's window keys of layer configs ``lcs``: where some layer slides, its window and every
    layer of the window's (``max_window_layers`` 0), ``layer_types`` saying which slide."""
    window = next((lc.attention.window for lc in lcs if lc.attention.window is not None), None)
    return dict(
        use_sliding_window=window is not None,
        sliding_window=window,
        max_window_layers=0 if window is not None else cfg.n_layer,
        layer_types=layer_types(lcs),
    )


class Qwen2(LayeredFamily, _LlamaStyle):
    """Qwen2ForCausalLM (Qwen2, Qwen2.5): LLaMA's layers with biases on q/k/v only; sliding windows on the
    layers ``layer_types`` marks sliding."""

    parts = "LLaMA's layers with q/k/v biases; sliding windows"

    model_type, title, model_class, config_class = "qwen2", "Qwen2", "Qwen2ForCausalLM", "Qwen2Config"
    features = frozenset({"model.position.scaling.kind", "model.attention.window"}) | LAYERS

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (True,), " (q/k/v always have biases)"),
            out_bias(False, " (o_proj has no bias)"),
            ("model.mlp.bias", (False,), ""),
        ]

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        kwargs = super().uniform_to_hf(rep)
        del kwargs["attention_bias"]
        return kwargs

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        cfg = super().uniform_from_hf(c)
        cfg.attention.qkv_bias, cfg.attention.out_bias = True, False
        return cfg

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return windows_to_hf(cfg, lcs)


RECORDS: tuple[Family, ...] = (Qwen2(),)
