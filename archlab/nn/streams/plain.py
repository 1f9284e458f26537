"""``plain``: one residual stream, each sublayer's output added to it (every model before hyper-connections)."""

from __future__ import annotations

from dataclasses import dataclass

from archlab.config import ModelConfig, StreamConfig, stream_config
from archlab.nn.streams.base import STREAMS, Stream


@stream_config("plain")
@dataclass
class PlainConfig(StreamConfig):
    """``model.stream`` with kind plain: no fields of its own."""

    kind: str = "plain"


@STREAMS.register("plain")
class Plain(Stream):
    """One stream: the block adds each sublayer's output to it; no module, no parameters."""

    multiple = False

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        return "plain"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        return frozenset()
