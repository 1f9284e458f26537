"""Qwen3 (``Qwen3ForCausalLM``): its record, whose layers may differ in their windows (its parts in ``qwen``)."""

from __future__ import annotations

from archlab.interop.families.base import (
    LAYERS,
    Family,
)
from archlab.interop.families.qwen import Qwen3
from archlab.interop.families.qwen2 import _LayeredQwen


class LayeredQwen3(_LayeredQwen, Qwen3):
    """Qwen3ForCausalLM with sliding windows on some layers; ``llama.Qwen3`` holds the rest."""

    features = Qwen3.features | LAYERS


RECORDS: tuple[Family, ...] = (LayeredQwen3(),)
