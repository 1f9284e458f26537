"""The order a decoder runs its layers in (``model.layers.loop``: a range of them again, pass after pass, with
the same weights), each layer run with its pass's KV cache, the auxiliary losses of a looped layer's
earlier passes, which its latest pass replaces in its parts, and the input injected at each pass's start
(``inject``, Dory's)."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.loop import looped, schedule
from archlab.errors import ConfigError
from archlab.nn.block import Block
from archlab.nn.mixers.base import KVCache
from archlab.nn.norms import NORMS, build_norm


class Loop:
    """``Decoder``'s walk over its layers: ``steps`` yields each layer to run and the cache it reads."""

    def __init__(self, cfg: ModelConfig):
        self.order = schedule(cfg)
        self.last = {layer: p for layer, p in self.order}  # each layer's last pass
        # name -> (weight, loss) of each part's auxiliary losses in the passes before its last, latest forward
        self.earlier_losses: list[dict[str, tuple[float, Tensor]]] = []
        inside = looped(cfg)
        # input injection: the first looped layer, the weightless norm, the normed state entering the loop
        self.injected = inside.start if cfg.layers.loop.inject and inside else None
        self.norm = build_norm(cfg) if self.injected is not None else None
        self.entering: Optional[Tensor] = None

    def steps(self, blocks: Sequence[Block], cache: Optional[KVCache]) -> Iterator[tuple[int, Optional[KVCache]]]:
        """(layer, its pass's cache) of each layer run, in order; after a pass that is not the layer's last, its
        parts' auxiliary losses are kept in ``earlier_losses`` (emptied as the walk starts)."""
        self.earlier_losses = []
        for layer, p in self.order:
            yield layer, None if cache is None else cache.of_pass(p)
            if p < self.last[layer]:
                block = blocks[layer]
                for part in (block.attn, block.mlp):
                    if aux := getattr(part, "aux_losses", None):
                        self.earlier_losses.append(dict(aux))

    def enter(self, step: int, x: Tensor) -> Tensor:
        """The state step ``step`` of the walk reads: at the start of each pass of an injecting loop, norm(x) +
        norm(e), e the state that entered the loop's first pass (transformers' ``DoryModel``); else ``x``."""
        layer, p = self.order[step]
        if layer != self.injected or self.norm is None:
            return x
        if p == 0:
            self.entering = self.norm(x)
        assert self.entering is not None  # pass 0 runs first
        return self.norm(x) + self.entering


def validate_injection(cfg: ModelConfig) -> None:
    """An injecting loop's norms hold no weights (they are the model's norm kind, held by no module)."""
    if cfg.layers.loop.inject and NORMS.get(cfg.norm.kind).num_params(cfg):
        raise ConfigError(
            "model.layers.loop.inject",
            True,
            f"false with model.norm.kind={cfg.norm.kind} holding weights (the injection's norms have none: "
            "model.norm.kind=l2 or model.norm.affine=false)",
        )
