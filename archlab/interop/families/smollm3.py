"""SmolLM3 (``SmolLM3ForCausalLM``): LLaMA's parts, RoPE on some layers and none on others (the layered
machinery in ``layered``)."""

from __future__ import annotations

import dataclasses
from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import LAYERS, Family
from archlab.interop.families.layered import Layer, LayeredFamily, rope_of
from archlab.interop.families.llama import Llama
from archlab.interop.families.values import config_head_dim, refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, layer_types, sliding_window


class SmolLM3(LayeredFamily, Llama):
    """SmolLM3ForCausalLM: LLaMA's layers (biases by ``attention_bias`` and ``mlp_bias``), RoPE on the
    layers ``no_rope_layers`` marks 1 and none on those it marks 0 (every 4th in the published model), and
    sliding windows where ``layer_types`` says (with ``use_sliding_window``; none in the published model)."""

    parts = "LLaMA's layers with NoPE on chosen layers (model.layers)"

    model_type, title, model_class, config_class = "smollm3", "SmolLM3", "SmolLM3ForCausalLM", "SmolLM3Config"
    features = Llama.features | {"model.attention.window", *LAYERS}
    nope = True

    def hf_layers(self, c: Any) -> list[Layer]:
        n = c.num_hidden_layers
        types = checked_types(c)
        if SLIDING in types and not c.use_sliding_window:
            refuse_hf(
                c,
                "use_sliding_window",
                "true where layer_types has sliding_attention layers (else transformers' attention kernels differ "
                "on which layers slide)",
            )
        flags = list(c.no_rope_layers or [])
        if len(flags) < n or set(flags[:n]) - {0, 1}:
            refuse_hf(c, "no_rope_layers", f"at least {n} entries, each 1 (RoPE) or 0 (NoPE)", flags)
        hd = config_head_dim(c)
        rope = rope_of(c, c.rope_parameters, hd)
        nope = dataclasses.replace(rope, kind="none")
        return [Layer(c.sliding_window if t == SLIDING else None, rope if f else nope) for t, f in zip(types, flags)]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        return Llama.from_hf(self, c)

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        types = layer_types(lcs)
        sliding = SLIDING in types
        return dict(
            layer_types=types,
            no_rope_layers=[int(lc.position.kind == "rope") for lc in lcs],
            use_sliding_window=sliding,
            sliding_window=sliding_window(cfg, lcs) if sliding else None,
        )


RECORDS: tuple[Family, ...] = (SmolLM3(),)
