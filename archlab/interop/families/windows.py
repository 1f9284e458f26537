"""Sliding windows both ways: transformers' ``layer_types`` and ``sliding_window`` <-> each layer's
``model.attention.window``."""

from __future__ import annotations

from typing import Any

from archlab.config import (
    ModelConfig,
)
from archlab.interop.families.values import refuse_hf

# ---------------------------------------------------------------- sliding windows both ways


def layer_types(layers: list[ModelConfig]) -> list[str]:
    """transformers' layer_types of each layer's config (``config.layers.layer_configs``): sliding where the
    layer has a window."""
    return ["full_attention" if lc.attention.window is None else "sliding_attention" for lc in layers]


def sliding_window(cfg: ModelConfig, layers: list[ModelConfig]) -> int:
    """transformers' one sliding_window: the sliding layers' (the families refuse two); where no layer
    slides, the context (transformers builds the sliding mask in some families whether or not a layer uses it)."""
    return next((lc.attention.window for lc in layers if lc.attention.window is not None), cfg.context_length)


def sliding_to_hf(cfg: ModelConfig, layers: list[ModelConfig]) -> dict[str, Any]:
    """transformers' ``sliding_window`` and ``layer_types`` of each layer's config."""
    return {"sliding_window": sliding_window(cfg, layers), "layer_types": layer_types(layers)}


SLIDING, FULL = "sliding_attention", "full_attention"  # transformers' layer_types


def checked_types(c: Any, other: str = SLIDING) -> list[str]:
    """transformers' layer_types (every layer full where absent), each 'full_attention' or ``other``
    (Llama 4: 'chunked_attention'); sliding layers need a ``sliding_window``."""
    n: int = c.num_hidden_layers
    types = list(getattr(c, "layer_types", None) or [FULL] * n)
    if len(types) != n or set(types) - {FULL, other}:
        refuse_hf(c, "layer_types", f"{n} entries, each {FULL!r} or {other!r}", types)
    if other == SLIDING and SLIDING in types and getattr(c, "sliding_window", None) is None:
        refuse_hf(c, "sliding_window", f"the window of the {SLIDING} layers")
    return types


def uniform_window(c: Any) -> int | None:
    """The window of a config whose layers all slide or none does (``layer_types``; a record whose layers may
    differ, ``layered.LayeredFamily``, reads the others): ``sliding_window``, or None."""
    types = checked_types(c)
    if SLIDING not in types:
        return None
    if FULL in types:
        refuse_hf(c, "layer_types", "every layer alike (a layered record reads the others)", types)
    return c.sliding_window
