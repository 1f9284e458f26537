"""GLM-4.5 (``Glm4MoeForCausalLM``): LLaMA's attention with q/k/v biases but none on the output
(``attention_bias``), an optional per-head QK-norm before RoPE (``use_qk_norm``), half-paired partial RoPE
(``partial_rotary_factor``, 0.5 as published), over DeepSeek-V3's routing with shared experts and dense
first layers (``dots.SigmoidRouted``). Its multi-token-prediction layers are no part of the causal LM:
``num_mtp_layers`` is written 0, and a checkpoint's layers past ``num_hidden_layers`` (the MTP module,
``model.layers.46`` of GLM-4.5) are left out on loading, as transformers leaves them."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.interop.families.base import LAYERS, Family, Rule, out_bias
from archlab.interop.families.dots import SigmoidRouted
from archlab.interop.families.rope import rope_fraction, rope_to_hf

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


class Glm4Moe(SigmoidRouted):
    """Glm4MoeForCausalLM (GLM-4.5, GLM-4.6): see the module docstring."""

    model_type, title, model_class, config_class = "glm4_moe", "GLM-4-MoE", "Glm4MoeForCausalLM", "Glm4MoeConfig"
    features = frozenset({"model.position.scaling.kind", "model.attention.qk_norm"}) | LAYERS
    partial = True
    parts = "LLaMA's layers (q/k/v biases, optional per-head QK-norm, partial RoPE) over a sigmoid top-k MoE with correction bias, groups, shared experts, dense first layers"

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qk_norm", ("none", "head"), " (use_qk_norm: q_norm and k_norm span one head)"),
            out_bias(False, " (o_proj has no bias)"),
        ]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return dict(
            super().to_hf(cfg),
            rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
            use_qk_norm=cfg.attention.qk_norm == "head",
            num_mtp_layers=0,
        )

    def from_hf(self, c: Any) -> ModelConfig:
        return self.routed_from_hf(c, qk_norm="head" if c.use_qk_norm else "none", out_bias=False)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The saved experts stacked (``SigmoidRouted``), the MTP layers past ``n_layer`` left out."""
        kept = {k: v for k, v in state.items() if not ((m := _LAYER.match(k)) and int(m.group(1)) >= cfg.n_layer)}
        return super().from_checkpoint(cfg, kept)


RECORDS: tuple[Family, ...] = (Glm4Moe(),)
