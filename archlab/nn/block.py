"""Residual wiring of one transformer block: ``pre``, ``post`` and ``parallel``."""

from __future__ import annotations

from typing import Optional

from torch import Tensor, nn

from archlab.config import ModelConfig
from archlab.nn.attention import KVCache, build_attention
from archlab.nn.component import MEMBERS, Base
from archlab.nn.mlp import build_mlp
from archlab.nn.norms import build_norm
from archlab.registry import Registry

BLOCKS: Registry[type] = Registry("model.block.kind", MEMBERS + ("norms_per_block", "final_norm"))


class Block(Base, nn.Module):
    """Holds a block's parts; subclasses say how they are wired into the residual stream."""

    final_norm = True  # does the model need a norm after the last block?

    def __init__(self, cfg: ModelConfig, layer: int):
        super().__init__()
        self.layer = layer
        self.attn_norm = build_norm(cfg)
        self.attn = build_attention(cfg)
        self.mlp_norm = build_norm(cfg) if self.norms_per_block(cfg) == 2 else None
        self.mlp = build_mlp(cfg)
        self.drop = nn.Dropout(cfg.dropout)

    def attend(self, x: Tensor, rotary, mask: Optional[Tensor], cache: Optional[KVCache]) -> Tensor:
        return self.drop(self.attn(x, rotary, mask, cache, self.layer))

    @staticmethod
    def norms_per_block(cfg: ModelConfig) -> int:
        """How many norms one block holds (the wiring's, beyond its attention and MLP)."""
        return 2


@BLOCKS.register("pre")
class PreNorm(Block):
    """``x + attn(norm(x))`` then ``x + mlp(norm(x))``, final norm after the last block (GPT-2, LLaMA)."""

    def forward(self, x, rotary=None, mask=None, cache=None):
        x = x + self.attend(self.attn_norm(x), rotary, mask, cache)
        return x + self.drop(self.mlp(self.mlp_norm(x)))


@BLOCKS.register("post")
class PostNorm(Block):
    """``norm(x + attn(x))`` then ``norm(x + mlp(x))`` (Vaswani et al. 2017); no final norm."""

    final_norm = False

    def forward(self, x, rotary=None, mask=None, cache=None):
        x = self.attn_norm(x + self.attend(x, rotary, mask, cache))
        return self.mlp_norm(x + self.drop(self.mlp(x)))


@BLOCKS.register("parallel")
class Parallel(Block):
    """``x + attn(n1(x)) + mlp(n2(x))``; with ``shared_norm`` n1 is n2 (GPT-J), else two norms."""

    def forward(self, x, rotary=None, mask=None, cache=None):
        h = self.attn_norm(x)
        h_mlp = h if self.mlp_norm is None else self.mlp_norm(x)
        return x + self.attend(h, rotary, mask, cache) + self.drop(self.mlp(h_mlp))

    @staticmethod
    def norms_per_block(cfg: ModelConfig) -> int:
        return 1 if cfg.block.shared_norm else 2


def build_block(cfg: ModelConfig, layer: int) -> Block:
    return BLOCKS.get(cfg.block.kind)(cfg, layer)
