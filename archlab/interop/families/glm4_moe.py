"""GLM-4.5 (``Glm4MoeForCausalLM``): LLaMA's attention with q/k/v biases but none on the output
(``attention_bias``), an optional per-head QK-norm before RoPE (``use_qk_norm``), half-paired partial RoPE
(``partial_rotary_factor``, 0.5 as published), over DeepSeek-V3's routing with shared experts and dense
first layers (``dots.SigmoidRouted``). Its multi-token-prediction layers are no part of the causal LM: a
checkpoint's layers past ``num_hidden_layers`` (the MTP module, ``model.layers.46`` of GLM-4.5) are read and
written beside it as DeepSeek-V3's (``families/mtp.py``), and left out where the checkpoint lacks them.
Sarvam MoE (``sigmoid_moe``) states GLM-4.5's rules, keys and reading too."""

from __future__ import annotations

import re
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.interop.families.base import LAYERS, Family, Rule, out_bias
from archlab.interop.families.dots import SigmoidRouted
from archlab.interop.families.mtp import MTP_FEATURES, MTP_RULE
from archlab.interop.families.rope import rope_fraction, rope_to_hf

_LAYER = re.compile(r"model\.layers\.(\d+)\.")


FEATURES = frozenset({"model.position.scaling.kind", "model.attention.qk_norm"}) | LAYERS


def glm_attention_rules() -> list[Rule]:
    """What GLM-4.5's attention requires: an optional per-head QK-norm, no output bias."""
    return [
        ("model.attention.qk_norm", ("none", "head"), " (use_qk_norm: q_norm and k_norm span one head)"),
        out_bias(False, " (o_proj has no bias)"),
    ]


def glm_to_hf(kwargs: dict[str, Any], cfg: ModelConfig) -> dict[str, Any]:
    """``dots.SigmoidRouted``'s keys ``kwargs`` as GLM-4.5's: partial RoPE, the QK-norm flag, the MTP layers."""
    return dict(
        kwargs,
        rope_parameters=rope_to_hf(cfg, rope_fraction(cfg)),
        use_qk_norm=cfg.attention.qk_norm == "head",
        num_mtp_layers=cfg.head.mtp.depth,
    )


def glm_from_hf(family: SigmoidRouted, c: Any) -> ModelConfig:
    """archlab's config of a GLM-4.5 config: its QK-norm as ``use_qk_norm`` says, no output bias."""
    return family.routed_from_hf(c, qk_norm="head" if c.use_qk_norm else "none", out_bias=False)


def without_mtp(cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
    """A checkpoint's tensors less the layers past ``n_layer`` (MTP layers archlab is not reading: a config
    ``families.mtp.extended`` counts those it reads)."""
    return {k: v for k, v in state.items() if not ((m := _LAYER.match(k)) and int(m.group(1)) >= cfg.n_layer)}


class Glm4Moe(SigmoidRouted):
    """Glm4MoeForCausalLM (GLM-4.5, GLM-4.6): see the module docstring."""

    model_type, title, model_class, config_class = "glm4_moe", "GLM-4-MoE", "Glm4MoeForCausalLM", "Glm4MoeConfig"
    features = FEATURES | MTP_FEATURES
    mtp_keys = ("num_mtp_layers",)
    partial = True
    parts = "LLaMA's layers (q/k/v biases, optional per-head QK-norm, partial RoPE) over a sigmoid top-k MoE with correction bias, groups, shared experts, dense first layers"

    def attention_rules(self, cfg: ModelConfig) -> list[Rule]:
        return glm_attention_rules()

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super().rules(cfg) + [MTP_RULE]

    def to_hf(self, cfg: ModelConfig) -> dict[str, Any]:
        return glm_to_hf(super().to_hf(cfg), cfg)

    def from_hf(self, c: Any) -> ModelConfig:
        return glm_from_hf(self, c)

    def from_checkpoint(self, cfg: ModelConfig, state: dict[str, Tensor]) -> dict[str, Tensor]:
        """The saved experts stacked (``SigmoidRouted``), the layers past ``n_layer`` left out (a config with
        the modules' layers counted keeps them)."""
        return super().from_checkpoint(cfg, without_mtp(cfg, state))


RECORDS: tuple[Family, ...] = (Glm4Moe(),)
