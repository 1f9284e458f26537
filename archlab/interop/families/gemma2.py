"""Gemma 2 (``Gemma2ForCausalLM``): sandwich blocks, soft-capping, sliding and full layers (its parts in ``gemma``)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import (
    LAYERS,
    Family,
)
from archlab.interop.families.gemma import Gemma2
from archlab.interop.families.layered import _Windowed
from archlab.interop.families.windows import sliding_to_hf


class LayeredGemma2(_Windowed, Gemma2):
    """Gemma2ForCausalLM with sliding windows on some layers (the published models: layers 0, 2, ...,
    kinds ``local`` and ``global``); ``llama.Gemma2`` holds the rest."""

    features = Gemma2.features | LAYERS

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        return sliding_to_hf(cfg, lcs)


RECORDS: tuple[Family, ...] = (LayeredGemma2(),)
