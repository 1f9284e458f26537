"""OLMo 3 (``Olmo3ForCausalLM``): OLMo 2's parts with sliding and full layers (the layered machinery in
``layered``)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import (
    LAYERS,
    Family,
)
from archlab.interop.families.layered import Layer, LayeredFamily, per_type_rope, rope_per_type_to_hf, view
from archlab.interop.families.olmo2 import Olmo2
from archlab.interop.families.windows import FULL, SLIDING, checked_types, sliding_to_hf


class Olmo3(LayeredFamily, Olmo2):
    """Olmo3ForCausalLM: OLMo 2's layers (post-sublayer RMSNorms, q and k RMSNormed over the whole
    projection) with sliding windows by ``layer_types`` (three of four layers in the published models) and
    RoPE parameters per layer type (the published long-context models scale the global layers' only)."""

    parts = "OLMo 2's parts with local/global layers, RoPE per layer type"

    model_type, title, model_class, config_class = "olmo3", "OLMo 3", "Olmo3ForCausalLM", "Olmo3Config"
    features = Olmo2.features | {"model.attention.window", *LAYERS}
    rope_per_type = True

    def hf_layers(self, c: Any) -> list[Layer]:
        types = checked_types(c)
        hd = c.hidden_size // c.num_attention_heads
        ropes = per_type_rope(c, types, getattr(c, "head_dim", None) or hd)
        return [Layer(c.sliding_window if t == SLIDING else None, ropes[t]) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        full = (c.rope_parameters or {}).get(FULL)
        return Olmo2.from_hf(self, view(c, rope_parameters=full))

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return dict(
            **sliding_to_hf(cfg, lcs),
            rope_parameters=rope_per_type_to_hf(lcs),
        )


RECORDS: tuple[Family, ...] = (Olmo3(),)
