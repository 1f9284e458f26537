"""Looped layers (``model.layers.loop``): a contiguous range of layers run again, pass after pass, with one set
of weights (Universal Transformers, Huginn, Ouro). Its check, and the order the layers run in, which the
model, the closed-form counts and the KV cache read: each pass of a looped layer runs, costs and caches as
a layer of its own, while its weights are held once."""

from __future__ import annotations

from typing import Any

from archlab import checks
from archlab.config.model import LoopConfig, ModelConfig
from archlab.errors import ConfigError


def looped(cfg: ModelConfig) -> range:
    """The layers the loop runs again (empty for one pass: no loop)."""
    loop = cfg.layers.loop
    if loop.passes == 1:
        return range(0)
    return range(loop.start, cfg.n_layer if loop.end is None else loop.end)


def schedule(cfg: ModelConfig) -> list[tuple[int, int]]:
    """(layer, pass) of each layer run, in order: the layers before the loop, the looped ones pass after pass,
    the rest; the model's ``n_layer`` layers once each where there is no loop."""
    inside = looped(cfg)
    if not inside:
        return [(layer, 0) for layer in range(cfg.n_layer)]
    before = [(layer, 0) for layer in range(inside.start)]
    passes = [(layer, p) for p in range(cfg.layers.loop.passes) for layer in inside]
    return before + passes + [(layer, 0) for layer in range(inside.stop, cfg.n_layer)]


def check_loop(cfg: ModelConfig) -> None:
    """``passes`` a positive integer, and ``start`` and ``end`` a non-empty range of the model's layers; a
    value-residual model loops only layers after the first (whose values the others mix in); ``inject`` a
    boolean, on one residual stream."""
    loop, n = cfg.layers.loop, cfg.n_layer
    checks.integer("model.layers.loop.passes", loop.passes, allowed="a positive integer (1: no loop)")
    checks.integer("model.layers.loop.start", loop.start, 0, f"an integer in [0, model.n_layer={n})")
    if loop.start >= n:
        raise ConfigError("model.layers.loop.start", loop.start, f"an integer in [0, model.n_layer={n})")
    if loop.end is not None:
        checks.integer("model.layers.loop.end", loop.end, loop.start + 1, _end_allowed(loop.start, n))
        if loop.end > n:
            raise ConfigError("model.layers.loop.end", loop.end, _end_allowed(loop.start, n))
    checks.choice("model.layers.loop.inject", loop.inject, (False, True))
    if loop.inject and cfg.stream.kind != "plain":
        raise ConfigError(
            "model.layers.loop.inject", True, f"false with model.stream.kind={cfg.stream.kind} (one state to inject)"
        )
    if getattr(cfg.attention, "value_residual", False) and loop.passes > 1 and loop.start == 0:
        raise ConfigError(
            "model.layers.loop.start",
            loop.start,
            "1 or more with model.attention.value_residual=true (every layer mixes in the first layer's values, "
            "which a loop over it would replace)",
        )


def unread_loop(cfg: ModelConfig) -> list[tuple[str, Any]]:
    """(field, value) of ``start``, ``end`` and ``inject`` where set away from their defaults while one pass makes no loop
    (a sweep over ``passes`` from 1 sets them for every run): ``nn.validation.ignored`` reports them."""
    loop, default = cfg.layers.loop, LoopConfig()
    if loop.passes != 1:
        return []
    changed = [name for name in ("start", "end", "inject") if getattr(loop, name) != getattr(default, name)]
    return [(f"model.layers.loop.{name}", getattr(loop, name)) for name in changed]


def _end_allowed(start: int, n: int) -> str:
    return f"null (model.n_layer) or an integer in [{start + 1}, model.n_layer={n}] (after model.layers.loop.start)"


def describe_loop(cfg: ModelConfig) -> str:
    """The loop in a few words, for ``archlab-check``'s layout line: ``layers 1-2 x3 (8 deep)``; '' for none."""
    inside = looped(cfg)
    if not inside:
        return ""
    layers = f"layer {inside.start}" if len(inside) == 1 else f"layers {inside.start}-{inside.stop - 1}"
    inject = ", input injected" if cfg.layers.loop.inject else ""
    return f"{layers} x{cfg.layers.loop.passes} ({len(schedule(cfg))} deep{inject})"
