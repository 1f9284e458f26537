"""Qwen2 (``Qwen2ForCausalLM``): its record, whose layers may differ in their windows (its parts in ``qwen``)."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.base import (
    LAYERS,
    Family,
)
from archlab.interop.families.layered import _Windowed
from archlab.interop.families.qwen import Qwen2
from archlab.interop.families.windows import layer_types


class _LayeredQwen(_Windowed):
    """Qwen2 and Qwen3 with sliding windows on some layers, written as ``layer_types`` (every layer of
    the window's, ``max_window_layers`` 0, where some layer slides)."""

    def layers_to_hf(self, cfg: ModelConfig, lcs: list[ModelConfig]) -> dict[str, Any]:
        window = next((lc.attention.window for lc in lcs if lc.attention.window is not None), None)
        return dict(
            use_sliding_window=window is not None,
            sliding_window=window,
            max_window_layers=0 if window is not None else cfg.n_layer,
            layer_types=layer_types(lcs),
        )


class LayeredQwen2(_LayeredQwen, Qwen2):
    """Qwen2ForCausalLM with sliding windows on some layers; ``llama.Qwen2`` holds the rest."""

    features = Qwen2.features | LAYERS


RECORDS: tuple[Family, ...] = (LayeredQwen2(),)
