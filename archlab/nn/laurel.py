"""LAuReL (Menghani et al. 2024, arXiv:2411.07501), low-rank, as Gemma 3n has it (transformers'
``Gemma3nTextLaurelBlock``; ``model.block.laurel_rank``): beside attention, the normed input ``n`` it reads goes
through a rank-r pair of matrices and a norm, and the stream after attention's add becomes
``(x + attn(n) + n + norm(B·A·n))/√2``. Its count in closed form, its μP roles and its checks."""

from __future__ import annotations

import math

from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig
from archlab.errors import ConfigError
from archlab.nn.component import Component, Role, residual_projection
from archlab.nn.norms import NORMS, build_norm
from archlab.nn.streams.base import STREAMS


def params(cfg: ModelConfig) -> int:
    """One layer's: A d × r, B r × d and the norm over d; 0 without (rank 0)."""
    r = cfg.block.laurel_rank
    return 2 * cfg.d_model * r + NORMS.get(cfg.norm.kind).num_params(cfg) if r else 0


def validate(cfg: ModelConfig, takes: bool) -> None:
    """A whole number; where set, a block wiring that reads a normed input (``takes``: pre with its norm,
    sandwich) on one stream or AltUp's active copy (not joined per sublayer)."""
    r = cfg.block.laurel_rank
    checks.integer("model.block.laurel_rank", r, 0, "a whole number >= 0 (0: no LAuReL)")
    if not r:
        return
    if not takes:
        why = f"0 with block kind {cfg.block.kind} (LAuReL reads attention's normed input: pre or sandwich)"
        raise ConfigError("model.block.laurel_rank", r, why)
    stream = STREAMS.get(cfg.stream.kind)
    if stream.multiple and not stream.wraps_layers:
        raise ConfigError("model.block.laurel_rank", r, f"0 with model.stream.kind={cfg.stream.kind}")


class Laurel(Component, nn.Module):
    """``left`` (A, d → r), ``right`` (B, r → d, into the residual) and ``norm``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        r, d = cfg.block.laurel_rank, cfg.d_model
        self.left = nn.Linear(d, r, bias=False)
        self.right = residual_projection(nn.Linear(r, d, bias=False))
        self.norm = build_norm(cfg)

    def param_roles(self) -> dict[str, Role]:
        # A reads the width into r (an output's rule, as the per-layer gate); B writes r into it (an input's)
        return {"left.weight": Role.OUTPUT, "right.weight": Role.INPUT}

    def forward(self, x: Tensor, normed: Tensor) -> Tensor:
        """The stream ``x`` after attention's add, joined with the normed input ``normed`` attention read."""
        return (x + normed + self.norm(self.right(self.left(normed)))) / math.sqrt(2)
