"""What a residual-stream entry (``model.stream``, registry ``STREAMS``) answers: how many streams the
blocks carry, how the embeddings are widened into them and merged back before the final norm (the model's
part, built once), and how each sublayer (a block's attention, its MLP) reads and writes them (a connection,
built per sublayer). ``plain`` is today's one stream, ``x + f(x)``, with no module at all."""

from __future__ import annotations

from typing import Callable, ClassVar, Optional

from torch import Tensor, nn

from archlab.config import ModelConfig
from archlab.nn.component import ModelPart
from archlab.registry import Registry

Sublayer = Callable[[Tensor], Tensor]  # a block's attention or MLP branch: [B, T, d] -> [B, T, d]


class Stream(ModelPart, nn.Module):
    """The model's part of a residual stream: ``widen`` after the embeddings (``[B, T, d]`` to the streams),
    ``merge`` before the final norm; ``connection`` builds what joins one sublayer to the streams. A plain
    stream's model builds neither (``multiple`` False), so its forward is today's, op for op."""

    multiple: ClassVar[bool] = True  # whether the blocks carry more than one stream (and the model this part)

    def __init__(self, cfg: ModelConfig):
        super().__init__()

    def widen(self, x: Tensor) -> Tensor:
        raise NotImplementedError

    def merge(self, h: Tensor) -> Tensor:
        raise NotImplementedError

    @staticmethod
    def connection(cfg: ModelConfig, index: int) -> Optional[nn.Module]:
        """The connection of sublayer ``index`` (counted from the first block's attention, 0, its MLP, 1, ...):
        a module ``(H, sublayer) -> H``; None joins nothing (one plain stream)."""
        return None

    @classmethod
    def connection_params(cls, cfg: ModelConfig) -> int:
        """Parameters of one sublayer's connection."""
        return 0

    @classmethod
    def extra_flops(cls, cfg: ModelConfig, connections: int) -> int:
        """Training FLOPs per token of the model's part and ``connections`` sublayer connections beyond 6
        per weight: what they do to the streams themselves."""
        return 0


STREAMS: Registry[type[Stream]] = Registry("model.stream.kind", base=Stream)


def build_stream(cfg: ModelConfig) -> Optional[Stream]:
    """The model's stream part, or None for one plain stream."""
    entry = STREAMS.get(cfg.stream.kind)
    return entry(cfg) if entry.multiple else None


def build_connection(cfg: ModelConfig, index: int) -> Optional[nn.Module]:
    """Sublayer ``index``'s connection to the streams, or None for one plain stream (``x + f(x)``)."""
    return STREAMS.get(cfg.stream.kind).connection(cfg, index)
