"""EXAONE 4 (``Exaone4ForCausalLM``): OLMo 2's post-sublayer norms and QK-norm, its layers sliding or global
(the layered machinery in ``layered``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import LAYERS, Family, Problem, Rule, out_bias
from archlab.interop.families.layered import Layer, LayeredFamily, rope_of, rule_problems
from archlab.interop.families.olmo2 import Olmo2
from archlab.interop.families.values import config_head_dim
from archlab.interop.families.windows import FULL, SLIDING, checked_types, layer_types, sliding_window


class Exaone4(LayeredFamily, Olmo2):
    """Exaone4ForCausalLM: OLMo 2's post-sublayer RMSNorms with q and k RMSNormed per head before RoPE, no
    biases; with a ``sliding_window``, the sliding layers (``layer_types``) have RoPE and the full ones none
    (the published hybrid models: three local layers, then a global NoPE one); without one, every layer is
    full with RoPE."""

    parts = "OLMo 2's block with per-head QK-norm, local RoPE and global NoPE layers"

    model_type, title, model_class, config_class = "exaone4", "EXAONE 4", "Exaone4ForCausalLM", "Exaone4Config"
    features = frozenset({"model.position.scaling.kind", "model.attention.qk_norm", "model.attention.window", *LAYERS})
    nope = True
    layout_why = " (with a sliding window, EXAONE 4's sliding layers have RoPE and its full layers none; without one, every layer has RoPE)"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return super(Olmo2, self).rules(cfg) + [
            ("model.attention.qk_norm", ("head",), " (q_norm and k_norm span one head)")
        ]

    def bias_rules(self, cfg: ModelConfig) -> list[Rule]:
        return [
            ("model.attention.qkv_bias", (False,), " (EXAONE 4 has no attention biases)"),
            out_bias(False, " (EXAONE 4 has no attention biases)"),
            ("model.mlp.bias", (False,), ""),
        ]

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        hd = config_head_dim(c)
        rope = rope_of(c, c.rope_parameters, hd)
        hybrid = c.sliding_window is not None
        return [
            Layer(
                c.sliding_window if t == SLIDING else None,
                rope if not hybrid or t == SLIDING else dataclasses.replace(rope, kind="none"),
            )
            for t in types
        ]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        cfg = Olmo2.from_hf(self, c)
        cfg.attention.qk_norm = "head"
        return cfg

    def layer_problems(self, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        if any(lc.attention.window is not None for lc in lcs):
            return rule_problems(lcs, lambda i, lc: "none" if lc.attention.window is None else "rope", self.layout_why)
        return rule_problems(lcs, lambda i, lc: lcs[0].position.kind, self.layout_why)

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        kwargs = super().uniform_to_hf(rep)
        del kwargs["attention_bias"]  # Exaone4Config has none
        return kwargs

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        types = layer_types(lcs)
        hybrid = SLIDING in types or lcs[0].position.kind == "none"  # NoPE full layers need a window set
        period = types.index(FULL) + 1 if FULL in types else None
        regular = period is not None and types == [SLIDING if (i + 1) % period else FULL for i in range(len(types))]
        return dict(
            layer_types=types,
            sliding_window=sliding_window(cfg, lcs) if hybrid else None,
            sliding_window_pattern=period if hybrid and regular else None,
        )


RECORDS: tuple[Family, ...] = (Exaone4(),)
