"""Cohere Compass's text decoder (``CohereCompassForCausalLM``): Cohere2's parallel blocks with half-paired
RoPE per layer type (or none), its multimodal RoPE sections (``mrope_section``) idle on text. Text alone
gives every M-RoPE axis the same position (its 2-D ``position_ids`` expanded over the three), so each
section turns at the token's position: plain RoPE. The sections are dropped on reading (an exported model
gets transformers' default ones), which changes nothing for text."""

from __future__ import annotations

import dataclasses
from typing import Any

from torch import Tensor

from archlab.config import ModelConfig
from archlab.interop.families.base import Family, Problem, Rule
from archlab.interop.families.cohere2 import Cohere2
from archlab.interop.families.layered import Layer, rope_of, view
from archlab.interop.families.rope import rope_to_hf
from archlab.interop.families.softmax_moe import replaced
from archlab.interop.families.values import refuse_hf
from archlab.interop.families.windows import SLIDING, checked_types, layer_types, sliding_to_hf

MROPE = ("mrope_section", "mrope_interleaved")  # the image axes' sections: idle on text, written back as absent


class CohereCompass(Cohere2):
    """CohereCompassForCausalLM (Command A Vision's and North's text decoder): Cohere2's layers (one LayerNorm
    without bias feeding attention and MLP, one ``attention_bias`` flag, a gated MLP, tied or untied head,
    the logits times ``logit_scale``, folded into the final norm) with RoPE half-paired, per layer type as
    ``rope_parameters`` keys it (null: no positions on that type's layers)."""

    parts = "Cohere2's parallel blocks, half-paired RoPE per layer type or none, logit scale"

    model_type, title = "cohere_compass_text", "Cohere Compass (text)"
    model_class, config_class = "CohereCompassForCausalLM", "CohereCompassTextConfig"
    rope_per_type = True
    layout_why = " (Cohere Compass gives all the layers of a type RoPE, or none)"

    def rules(self, cfg: ModelConfig) -> list[Rule]:
        return replaced(super().rules(cfg), ("model.position.pairing", ("half",), ""))

    def layer_problems(self, lcs: list[ModelConfig]) -> list[tuple[int, Problem]]:
        """Some layer with RoPE; the layers of one type (sliding or full) all with RoPE or all without."""
        if all(lc.position.kind != "rope" for lc in lcs):
            return [(0, Problem("model.position.kind", lcs[0].position.kind, "rope", " (on some layer type)"))]
        first: dict[bool, str] = {}
        for i, lc in enumerate(lcs):
            kind = first.setdefault(lc.attention.window is None, lc.position.kind)
            if lc.position.kind != kind:
                return [(i, Problem("model.position.kind", lc.position.kind, kind, self.layout_why))]
        return []

    def uniform_to_hf(self, rep: ModelConfig) -> dict[str, Any]:
        return {k: v for k, v in super().uniform_to_hf(rep).items() if k != "rope_parameters"}

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        by_type = {t: (rope_to_hf(lc) if lc.position.kind == "rope" else None) for t, lc in zip(layer_types(lcs), lcs)}
        return dict(sliding_to_hf(cfg, lcs), rope_parameters=by_type)

    def hf_layers(self, c: Any) -> list[Layer]:
        types, params, hd = checked_types(c), c.rope_parameters or {}, c.hidden_size // c.num_attention_heads
        ropes = {}
        for t in sorted(set(types)):
            if params.get(t) is not None and not isinstance(params[t], dict):
                refuse_hf(c, f"rope_parameters.{t}", f"the RoPE parameters of the {t} layers, or null", params[t])
            text = None if params.get(t) is None else {k: v for k, v in params[t].items() if k not in MROPE}
            ropes[t] = None if text is None else rope_of(c, text, hd, t)
        some = next((r for r in ropes.values() if r is not None), None)
        if some is None:
            refuse_hf(c, "rope_parameters", "RoPE parameters for some layer type", params)
        nope = dataclasses.replace(some, kind="none")
        return [Layer(c.sliding_window if t == SLIDING else None, ropes[t] or nope) for t in types]

    def uniform_from_hf(self, c: Any) -> ModelConfig:
        return super().uniform_from_hf(view(c, logit_scale=1.0 if c.logit_scale is None else c.logit_scale))

    def hf_weights(self, c: Any, state: dict[str, Tensor]) -> dict[str, Tensor]:
        return super().hf_weights(view(c, logit_scale=1.0 if c.logit_scale is None else c.logit_scale), state)


RECORDS: tuple[Family, ...] = (CohereCompass(),)
