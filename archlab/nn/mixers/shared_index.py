"""An indexer's choice shared across layers (``model.attention.index_shared``, HY V4's "shared" DSA layers): a
dsa layer without an indexer of its own attends over the keys that the last earlier dsa layer with one chose in
the same forward. Which layer serves which (``index_sources``), the checks a layout must pass, and the holder a
serving layer fills."""

from __future__ import annotations

from typing import Optional, Sequence

from torch import Tensor, nn

from archlab.config import ModelConfig
from archlab.config.layers import kind_config, layer_kind
from archlab.errors import ConfigError


class SharedChoice:
    """The keys ``[B, T, S]`` (bool) a serving layer's indexer chose in the latest forward, None where it chose
    every key it saw; one per serving layer, handed out by ``link_shared_index``."""

    def __init__(self) -> None:
        self.chosen: Optional[Tensor] = None


def _dsa(lc: ModelConfig) -> bool:
    return lc.attention.kind == "dsa"


def _shares(lc: ModelConfig) -> bool:
    return _dsa(lc) and bool(getattr(lc.attention, "index_shared", False))


def index_sources(layers: Sequence[ModelConfig]) -> list[Optional[int]]:
    """For each ``index_shared`` layer, the last earlier dsa layer that runs its own indexer (None: none
    such, or not shared)."""
    return [
        next((j for j in range(i - 1, -1, -1) if _dsa(layers[j]) and not _shares(layers[j])), None)
        if _shares(lc)
        else None
        for i, lc in enumerate(layers)
    ]


def check_shared_index(cfg: ModelConfig, layers: Sequence[ModelConfig]) -> None:
    """Every ``index_shared`` layer has an earlier dsa layer with an indexer; no looped layers or multi-token
    prediction module of such a layer (each would read a choice made for other positions or another pass)."""
    mtp = cfg.head.mtp
    if mtp.depth and _shares(kind_config(cfg, mtp.layer) if mtp.layer is not None else cfg):
        raise ConfigError("model.head.mtp.layer", mtp.layer, "a layer kind whose attention is not index_shared")
    if not any(_shares(lc) for lc in layers):
        return
    for i, j in enumerate(index_sources(layers)):
        if j is None and _shares(layers[i]):
            kind = layer_kind(cfg, i)
            field = "model.attention.index_shared"
            field = field if kind is None else f"model.layers.kinds.{kind}.attention.index_shared"
            raise ConfigError(field, True, f"false on layer {i}: no earlier dsa layer runs an indexer")
    if cfg.layers.loop.passes != 1:
        raise ConfigError("model.layers.loop.passes", cfg.layers.loop.passes, "1 with index_shared layers")


def link_shared_index(mixers: Sequence[nn.Module], layers: Sequence[ModelConfig]) -> None:
    """Give each serving layer a ``SharedChoice`` holder (``choice_store``) and each sharing layer its
    server's (``choice_source``): plain attributes, set past ``nn.Module.__setattr__``."""
    for i, j in enumerate(index_sources(layers)):
        if j is None:
            continue
        store = vars(mixers[j]).get("choice_store")
        if store is None:
            store = vars(mixers[j])["choice_store"] = SharedChoice()
        vars(mixers[i])["choice_source"] = store
