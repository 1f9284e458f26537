"""The interface every registry entry implements (norms, positions, attention, MLPs, blocks, heads)."""

from __future__ import annotations

from typing import Protocol

from archlab.config import ModelConfig


class Component(Protocol):
    """A registry entry: an ``nn.Module`` class built as ``Entry(cfg)`` (blocks, attention and MLPs:
    ``Entry(cfg, layer)``), whose closed forms read the config alone, never a module."""

    @staticmethod
    def num_params(cfg: ModelConfig, layer: int = 0) -> int:
        """Parameters of one instance built from ``cfg`` (attention and MLPs: the one of ``layer``)."""

    @staticmethod
    def active_params(cfg: ModelConfig, layer: int = 0) -> int:
        """Of those, the parameters one token's forward pass goes through (a mixture of experts: only
        the experts it is routed to); all of them unless the entry says otherwise."""

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int) -> int:
        """Training FLOPs per token of all its instances in the model beyond 6 per weight (attention's scores)."""

    @staticmethod
    def validate(cfg: ModelConfig) -> None:
        """Raise ``ConfigError`` naming the first field of ``cfg`` this variant cannot honour."""


MEMBERS = ("num_params", "active_params", "extra_flops", "validate")


class Base:
    """Defaults for the Component members: no parameters, every one active, no extra FLOPs, nothing to check."""

    @staticmethod
    def num_params(cfg: ModelConfig, layer: int = 0) -> int:
        return 0

    @classmethod
    def active_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        return cls.num_params(cfg, layer)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int) -> int:
        return 0

    @staticmethod
    def validate(cfg: ModelConfig) -> None:
        pass
