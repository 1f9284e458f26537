"""The order a decoder runs its layers in (``model.layers.loop``: a range of them again, pass after pass, with
the same weights), each layer run with its pass's KV cache, and the auxiliary losses of a looped layer's
earlier passes, which its latest pass replaces in its parts."""

from __future__ import annotations

from typing import Iterator, Optional, Sequence

from torch import Tensor

from archlab.config import ModelConfig
from archlab.config.loop import schedule
from archlab.nn.block import Block
from archlab.nn.mixers.base import KVCache


class Loop:
    """``Decoder``'s walk over its layers: ``steps`` yields each layer to run and the cache it reads."""

    def __init__(self, cfg: ModelConfig):
        self.order = schedule(cfg)
        self.last = {layer: p for layer, p in self.order}  # each layer's last pass
        # name -> (weight, loss) of each part's auxiliary losses in the passes before its last, latest forward
        self.earlier_losses: list[dict[str, tuple[float, Tensor]]] = []

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
