"""Keys and values shared across layers (``model.attention.kv_shared``, Gemma 4's ``num_kv_shared_layers``): a
shared layer projects queries alone and attends over the keys and values of the last earlier layer with the
same window and chunk that computes its own, as that layer attended to them (its cache's, when decoding). Which
layer serves which (``kv_sources``), the checks a layout must pass, and the holder a serving layer fills."""

from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor, nn

from archlab.config import ModelConfig, n_kv_head
from archlab.config.layers import kind_config, layer_kind
from archlab.errors import ConfigError
from archlab.nn.mixers.base import chunk_of, head_dim


class SharedKV:
    """The keys and values ``[B, KV, T, hd]`` a serving layer attended to in the latest forward, which the
    layers sharing them read; one per serving layer, handed out by ``link_shared_kv``."""

    def __init__(self) -> None:
        self.k: Optional[Tensor] = None
        self.v: Optional[Tensor] = None


def _shares(lc: ModelConfig) -> bool:
    return bool(getattr(lc.attention, "kv_shared", False))


def kv_sources(layers: Sequence[ModelConfig]) -> list[Optional[int]]:
    """For each layer, the layer whose keys and values it attends over where it is ``kv_shared``: the last
    earlier one with the same window and chunk that projects its own (None: none such, or not shared)."""
    out: list[Optional[int]] = []
    for i, lc in enumerate(layers):
        span = (lc.attention.window, chunk_of(lc, i)) if hasattr(lc.attention, "window") else None
        found = None
        if _shares(lc):
            found = next(
                (
                    j
                    for j in range(i - 1, -1, -1)
                    if not _shares(layers[j])
                    and layers[j].attention.kind == "causal"
                    and (layers[j].attention.window, chunk_of(layers[j], j)) == span
                ),
                None,
            )
        out.append(found)
    return out


def check_shared_kv(cfg: ModelConfig, layers: Sequence[ModelConfig]) -> None:
    """Every ``kv_shared`` layer has an earlier layer to serve it, of as many key/value heads of the same
    width; no looped layers or multi-token prediction modules beside it (each would read a pass's or the
    model's keys it does not see)."""
    mtp = cfg.head.mtp
    if mtp.depth and mtp.layer is not None and _shares(kind_config(cfg, mtp.layer)):
        raise ConfigError("model.head.mtp.layer", mtp.layer, "a layer kind whose attention is not kv_shared")
    if not any(_shares(lc) for lc in layers):
        return
    for i, (lc, j) in enumerate(zip(layers, kv_sources(layers))):
        if not _shares(lc):
            continue
        kind = layer_kind(cfg, i)
        field = "model.attention.kv_shared" if kind is None else f"model.layers.kinds.{kind}.attention.kv_shared"
        if j is None:
            raise ConfigError(
                field,
                True,
                f"false on layer {i}: no earlier causal layer with its window projects its own keys and values",
            )
        mine, theirs = (n_kv_head(lc), head_dim(lc)), (n_kv_head(layers[j]), head_dim(layers[j]))
        if mine != theirs:
            raise ConfigError(
                field,
                True,
                f"false on layer {i}: its {mine[0]} key/value heads x {mine[1]} differ from layer {j}'s "
                f"{theirs[0]} x {theirs[1]}, whose keys and values it would read",
            )
    if cfg.layers.loop.passes != 1:
        raise ConfigError("model.layers.loop.passes", cfg.layers.loop.passes, "1 with kv_shared layers")
    if cfg.head.mtp.depth:
        raise ConfigError("model.head.mtp.depth", cfg.head.mtp.depth, "0 with kv_shared layers")


def link_shared_kv(mixers: Sequence[nn.Module], layers: Sequence[ModelConfig]) -> None:
    """Give each serving layer a ``SharedKV`` holder (``kv_store``) and each sharing layer its server's
    (``kv_source``): plain attributes, set past ``nn.Module.__setattr__``, which takes tensors and modules."""
    for i, j in enumerate(kv_sources(layers)):
        if j is None:
            continue
        store = vars(mixers[j]).get("kv_store")
        if store is None:
            store = vars(mixers[j])["kv_store"] = SharedKV()
        vars(mixers[i])["kv_source"] = store
