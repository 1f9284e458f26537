"""``gated``: gated residual streams, as Qwen4-Exp has them (transformers' ``Qwen4ExpTextGatedResidual``). The
blocks carry ``n`` residual streams ``H`` ``[B, T, n, d]``, the embeddings copied into each. Every sublayer F
reads the mean over the streams of the normed streams ``H̄`` (each stream RMS-normed alone, one scale per
stream and channel) gated channel by channel, ``g = σ(U·silu(D·vec(H̄)/n))`` through a rank-``rank``
bottleneck, and writes its output into each stream through ``c = 2σ(C·vec(H̄)/n)``:
``H ← H + c ⊗ F(mean_i g_i ⊙ H̄_i)``. Before the final norm the streams are merged by the same read (its
own weights, no write)."""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, StreamConfig, stream_config
from archlab.nn.component import Component, Role
from archlab.nn.norms import l2_norm
from archlab.nn.streams.base import STREAMS, Stream, Sublayer, check_streams


@stream_config("gated")
@dataclass
class GatedConfig(StreamConfig):
    """``model.stream`` with kind gated: Qwen4-Exp's defaults (hc_count, hc_lowrank)."""

    kind: str = "gated"
    n: int = 4  # residual streams (hc_count)
    rank: int = 320  # the read gate's bottleneck (hc_lowrank)


def stream_rms(h: Tensor, weight: Tensor, eps: float, unit_offset: bool) -> Tensor:
    """Each stream of ``h`` ``[..., n, d]`` RMS-normed alone and scaled by ``weight`` ``[n, d]`` (``1 + weight``
    with ``unit_offset``), in float32, back in ``h``'s dtype."""
    x = l2_norm(h.float(), eps)
    return (x * (weight.float() + 1.0 if unit_offset else weight.float())).to(h.dtype)


class GatedRead(Component, nn.Module):
    """The read of the streams (a connection's, and the merge's): the streams' norm scale ``norm_weight``
    ``[n, d]`` (applied as ``1 + w`` with ``model.norm.unit_offset``, as Qwen4-Exp's), the gate's ``down``
    ``[rank, n·d]`` and ``up`` ``[n·d, rank]``; with ``write``, also ``inject`` ``[n, n·d]``."""

    def __init__(self, cfg: ModelConfig, write: bool):
        super().__init__()
        n, d, r = cfg.stream.n, cfg.d_model, cfg.stream.rank
        self.n, self.eps, self.unit_offset = n, cfg.norm.eps, cfg.norm.unit_offset
        self.norm_weight = nn.Parameter(torch.empty(n, d))
        self.down = nn.Linear(n * d, r, bias=False)
        self.up = nn.Linear(r, n * d, bias=False)
        self.inject = nn.Linear(n * d, n, bias=False) if write else None

    def param_roles(self) -> dict[str, Role]:
        # down and inject read the width and write a fixed number (a bottleneck, a weight per stream): output
        # matrices; up reads the fixed bottleneck and writes the width: an input matrix (LAuReL's pair)
        roles = {"norm_weight": Role.VECTOR, "down.weight": Role.OUTPUT, "up.weight": Role.INPUT}
        return roles | ({"inject.weight": Role.OUTPUT} if self.inject is not None else {})

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """Qwen4-Exp's: the norm scale 1 (stored 0 with the unit offset); the matrices are the model's Linears."""
        self.norm_weight.fill_(0.0 if self.unit_offset else 1.0)

    def read(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """What the sublayer reads, ``[B, T, d]``, and the normed streams flattened ``[B, T, n·d]``."""
        flat = stream_rms(h, self.norm_weight, self.eps, self.unit_offset).flatten(-2)
        gate = torch.sigmoid(self.up(F.silu(self.down(flat) / self.n))).unflatten(-1, h.shape[-2:])
        return (gate * flat.unflatten(-1, h.shape[-2:])).mean(-2), flat


class GatedConnection(GatedRead):
    """One sublayer's connection: the read, and the write ``2σ(inject·vec(H̄)/n)`` of its output."""

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg, write=True)

    def forward(self, h: Tensor, sublayer: Sublayer) -> Tensor:
        """The streams ``h`` ``[B, T, n, d]`` after ``sublayer`` read their gated mean and its output was
        added to each stream by its own weight."""
        x, flat = self.read(h)
        assert self.inject is not None
        weights = 2 * torch.sigmoid(self.inject(flat) / self.n)
        return h + weights.unsqueeze(-1) * sublayer(x).unsqueeze(-2)


@STREAMS.register("gated")
class Gated(Stream):
    """The model's part: the embeddings copied into the ``n`` streams, merged before the final norm by a read
    of its own (Qwen4-Exp's ``hyper_connection_mixer``)."""

    @staticmethod
    def connection(cfg: ModelConfig, index: int) -> nn.Module:
        return GatedConnection(cfg)

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        self.mixer = GatedRead(cfg, write=False)

    def param_roles(self) -> dict[str, Role]:
        return {}  # the mixer, a component, declares its own

    def merge(self, h: Tensor) -> Tensor:
        return self.mixer.read(h)[0]

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """The merge's read: the norm scale n·d, down and up 2·rank·n·d."""
        n, d, r = cfg.stream.n, cfg.d_model, cfg.stream.rank
        return n * d * (1 + 2 * r)

    @classmethod
    def connection_params(cls, cfg: ModelConfig) -> int:
        """The read's n·d·(1 + 2·rank) and the write's n·(n·d)."""
        n, d, r = cfg.stream.n, cfg.d_model, cfg.stream.rank
        return n * d * (1 + 2 * r + n)

    @classmethod
    def connection_flops(cls, cfg: ModelConfig) -> int:
        """The read's gating and mean (n·d multiply-adds each) and the write (n·d); forward and backward, 6
        FLOPs per multiply-add (the weights' 6 are counted apart)."""
        return 6 * cfg.stream.n * cfg.d_model * 3

    @classmethod
    def merge_flops(cls, cfg: ModelConfig) -> int:
        """The merge's read: the gating and the mean, forward and backward."""
        return 6 * cfg.stream.n * cfg.d_model * 2

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``gated ×<n>, rank <rank>``."""
        return f"gated ×{cfg.stream.n}, rank {cfg.stream.rank}"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        check_streams(cfg)
        checks.integer("model.stream.rank", cfg.stream.rank, 1, "a positive integer (the read gate's rank)")
