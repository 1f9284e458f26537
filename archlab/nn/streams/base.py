"""What a residual-stream entry (``model.stream``, registry ``STREAMS``) answers: how many streams the
blocks carry, how the embeddings are widened into them and merged back before the final norm (the model's
part, built once), and how each sublayer (a block's attention, its MLP) reads and writes them (a connection,
built per sublayer). ``plain`` is today's one stream, ``x + f(x)``, with no module at all."""

from __future__ import annotations

from typing import Callable, ClassVar, Optional

from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn.component import ModelPart
from archlab.registry import Registry

Sublayer = Callable[[Tensor], Tensor]  # a block's attention or MLP branch: [B, T, d] -> [B, T, d]


class LayerConnection(nn.Module):
    """A connection around a whole block (``Stream.layer_connection``): ``forward(H, block)`` runs the block on
    the stream it reads and gives the streams after it; ``add(H, f)`` adds what the layer makes after its block,
    ``f`` of the stream that reads."""

    def add(self, h: Tensor, late: Sublayer) -> Tensor:
        raise NotImplementedError


class Stream(ModelPart, nn.Module):
    """The model's part of a residual stream: ``widen`` after the embeddings (``[B, T, d]`` to the streams),
    ``merge`` before the final norm; ``connection`` builds what joins one sublayer to the streams. A plain
    stream's model builds neither (``multiple`` False), so its forward is today's, op for op."""

    multiple: ClassVar[bool] = True  # whether the blocks carry more than one stream (and the model this part)
    # whether each block runs whole on one stream, wrapped by a layer connection (AltUp's), not per sublayer
    wraps_layers: ClassVar[bool] = False

    def __init__(self, cfg: ModelConfig):
        """Built only where the blocks carry several streams (``multiple``): ``cfg.stream.n`` of them."""
        super().__init__()
        self.n = cfg.stream.n

    def widen(self, x: Tensor) -> Tensor:
        """The embeddings ``[B, T, d]`` copied into each of the ``n`` streams ``[B, T, n, d]``."""
        return x.unsqueeze(2).expand(-1, -1, self.n, -1).contiguous()

    def merge(self, h: Tensor) -> Tensor:
        raise NotImplementedError

    @staticmethod
    def connection(cfg: ModelConfig, index: int) -> Optional[nn.Module]:
        """The connection of sublayer ``index`` (counted from the first block's attention, 0, its MLP, 1, ...):
        a module ``(H, sublayer) -> H``; None joins nothing (one plain stream)."""
        return None

    @staticmethod
    def layer_connection(cfg: ModelConfig, layer: int) -> Optional[LayerConnection]:
        """The connection around layer ``layer``'s whole block (``wraps_layers``): a module ``(H, block) -> H``
        whose ``add(H, f)`` adds what the layer makes after its block (``f`` of the stream it reads); None
        where the blocks are joined per sublayer or carry one stream."""
        return None

    @classmethod
    def layer_params(cls, cfg: ModelConfig) -> int:
        """Parameters of one layer's ``layer_connection``."""
        return 0

    @classmethod
    def layer_extra_flops(cls, cfg: ModelConfig) -> int:
        """Training FLOPs per token of one run of a ``layer_connection`` beyond 6 per weight."""
        return 0

    @classmethod
    def connection_params(cls, cfg: ModelConfig) -> int:
        """Parameters of one sublayer's connection."""
        return 0

    @classmethod
    def connection_flops(cls, cfg: ModelConfig) -> int:
        """Training FLOPs per token of one run of a sublayer's connection beyond 6 per weight: what it does to
        the streams themselves."""
        return 0

    @classmethod
    def merge_flops(cls, cfg: ModelConfig) -> int:
        """Training FLOPs per token of the model's part (the widening and the merge) beyond 6 per weight."""
        return 0


STREAMS: Registry[type[Stream]] = Registry("model.stream.kind", base=Stream)


def check_streams(cfg: ModelConfig) -> None:
    """What every option of several streams needs: a positive ``n``, and pre-norm blocks (a connection reads
    each sublayer's input, which the other wirings do not take apart from the stream)."""
    checks.integer("model.stream.n", cfg.stream.n, 1, "a positive integer (residual streams)")
    if cfg.block.kind != "pre":
        why = f"pre with model.stream.kind={cfg.stream.kind} (it reads each sublayer's input)"
        raise ConfigError("model.block.kind", cfg.block.kind, why)


def check_layer_stream(model: ModelConfig, layer: ModelConfig, where: str) -> None:
    """A layer kind's stream (``layer.stream``; ``where``: ``model.layers.kinds.<kind>.stream``) joins its layers
    to the model's streams, which stay the model's (how many, widened and merged once): so the same number of
    them, joined alike (per sublayer, or around the whole layer), and one stream where the model has one."""
    ours = STREAMS.get(model.stream.kind)
    if _joins(STREAMS.get(layer.stream.kind)) != _joins(ours):
        alike = [k for k in STREAMS.names() if _joins(STREAMS.get(k)) == _joins(ours)]
        why = (
            "one stream; several are the model's, model.stream.kind"
            if not ours.multiple
            else "its copies wrap whole layers"
            if ours.wraps_layers
            else "a connection per sublayer to its streams"
        )
        allowed = f"{' or '.join(alike)} with model.stream.kind={model.stream.kind} ({why})"
        raise ConfigError(f"{where}.kind", layer.stream.kind, allowed)
    if ours.multiple and layer.stream.n != model.stream.n:
        raise ConfigError(
            f"{where}.n", layer.stream.n, f"{model.stream.n} (model.stream.n: its layers join the model's streams)"
        )


def _joins(entry: type[Stream]) -> tuple[bool, bool]:
    """How an entry joins the layers to the streams: whether there are several, and whether around whole layers."""
    return entry.multiple, entry.wraps_layers


def build_stream(cfg: ModelConfig) -> Optional[Stream]:
    """The model's stream part, or None for one plain stream."""
    entry = STREAMS.get(cfg.stream.kind)
    return entry(cfg) if entry.multiple else None


def build_layer_connection(cfg: ModelConfig, layer: int) -> Optional[LayerConnection]:
    """The connection around layer ``layer``'s block, or None where the stream does not wrap whole layers."""
    return STREAMS.get(cfg.stream.kind).layer_connection(cfg, layer)


def build_connection(cfg: ModelConfig, index: int) -> Optional[nn.Module]:
    """Sublayer ``index``'s connection to the streams, or None for one plain stream (``x + f(x)``)."""
    return STREAMS.get(cfg.stream.kind).connection(cfg, index)
