"""The interface every registry entry implements (norms, positions, attention, MLPs, blocks, heads)."""

from __future__ import annotations

from typing import Protocol

from archlab.config import ModelConfig


class Component(Protocol):
    """A registry entry: an ``nn.Module`` class built as ``Entry(cfg)`` (blocks: ``Entry(cfg, layer)``),
    whose closed forms read the config alone, never a module."""

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """Parameters of one instance built from ``cfg``."""

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int) -> int:
        """Training FLOPs per token of all its instances in the model beyond 6 per weight (attention's scores)."""

    @staticmethod
    def validate(cfg: ModelConfig) -> None:
        """Raise ``ConfigError`` naming the first field of ``cfg`` this variant cannot honour."""


MEMBERS = ("num_params", "extra_flops", "validate")


class Base:
    """Defaults for the Component members: no parameters, no extra FLOPs, nothing to check."""

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        return 0

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int) -> int:
        return 0

    @staticmethod
    def validate(cfg: ModelConfig) -> None:
        pass
