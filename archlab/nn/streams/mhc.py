"""``mhc``: manifold-constrained hyper-connections (Xie et al. 2026, arXiv:2512.24880), as DeepSeek-V4 has
them (transformers' ``DeepseekV4HyperConnection`` and ``DeepseekV4HyperHead``). The blocks carry ``n``
residual streams ``H`` ``[B, T, n, d]``, the embeddings copied into each. Every sublayer F reads and writes
them through weights computed from the streams themselves: with ``x = rms(vec(H))`` (no learned scale),
``pre = σ(s₀·x·W_pre + b_pre) + ε``, ``post = 2σ(s₁·x·W_post + b_post)`` and ``comb`` the Sinkhorn-Knopp
projection of ``softmax(s₂·x·W_comb + b_comb) + ε`` onto the doubly stochastic matrices,
``H ← post ⊗ F(Σᵢ preᵢ Hᵢ) + combᵀ H``, so the residual mix keeps its norm however deep the stack. Before the
final norm the streams are merged by weights computed likewise (``pre`` alone). HY V4's independent form
(``mix: none``) drops ``comb``, ``H ← post ⊗ F(Σᵢ preᵢ Hᵢ) + H``, with its own post scale and ε on post, and
``init: hy_v4`` starts the biases and scales as HY V4 does."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, StreamConfig, stream_config
from archlab.config.fields import choice
from archlab.nn.component import Component, Role
from archlab.nn.norms import l2_norm
from archlab.nn.streams.base import STREAMS, Stream, Sublayer, check_streams


@stream_config("mhc")
@dataclass
class MHCConfig(StreamConfig):
    """``model.stream`` with kind mhc: DeepSeek-V4's defaults (hc_mult, hc_sinkhorn_iters, hc_eps)."""

    kind: str = "mhc"
    n: int = 4  # residual streams (hc_mult)
    sinkhorn_iters: int = 20  # row and column normalisations of the mixing matrix (hc_sinkhorn_iters)
    eps: float = 1e-6  # added to pre and to comb, and to each normalisation's denominator (hc_eps)
    mix: str = choice("sinkhorn", "none")  # the streams mixed by comb (DeepSeek-V4) | carried as they are (HY V4)
    post_scale: float = 2.0  # post = post_scale·σ(·) (DeepSeek-V4: 2; HY V4's hc_magnitude)
    post_eps: bool = False  # eps added to post too (HY V4)
    # start-up biases and scales: 0 and 1 (DeepSeek-V4) | pre's biases -log(n - 1), scales 0.01: pre ≈ 1/n (HY V4)
    init: str = choice("deepseek_v4", "hy_v4")


def start_values(n: int, init: str) -> tuple[float, float]:
    """(pre's bias, every scale) at start-up, as transformers' ``_init_weights`` sets them: DeepSeek-V4's
    (0, 1); HY V4's (-log(max(n - 1, 1)), 0.01), σ of which is 1/n (n ≥ 2): every read starts as the streams' mean."""
    return (-math.log(max(n - 1, 1)), 0.01) if init == "hy_v4" else (0.0, 1.0)


def connection_rows(cfg: ModelConfig) -> int:
    """A connection's logits: pre and post, n each, and comb's n² where it mixes."""
    n = cfg.stream.n
    return (2 + n) * n if cfg.stream.mix == "sinkhorn" else 2 * n


def _collapse(h: Tensor, pre: Tensor) -> Tensor:
    """The streams ``h`` ``[B, T, n, d]`` summed by their weights ``pre`` ``[B, T, n]``, in ``h``'s dtype."""
    return (pre.unsqueeze(-1) * h).sum(2).to(h.dtype)


class MHCConnection(Component, nn.Module):
    """One sublayer's connection: the projection ``fn`` ``[(2 + n)·n, n·d]`` of the normed streams to the
    pre, post and comb logits, their biases ``base`` and the three scales ``scale``, in float32 (``mix:
    none``: ``[2n, n·d]``, pre and post alone, two scales)."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        s = cfg.stream
        self.n, self.iters, self.eps, self.norm_eps = s.n, s.sinkhorn_iters, s.eps, cfg.norm.eps
        self.mixes, self.post_scale, self.post_eps = s.mix == "sinkhorn", s.post_scale, s.eps if s.post_eps else 0.0
        self.start = start_values(s.n, s.init)
        rows = connection_rows(cfg)
        self.fn = nn.Parameter(torch.empty(rows, s.n * cfg.d_model))
        self.base = nn.Parameter(torch.empty(rows))
        self.scale = nn.Parameter(torch.empty(3 if self.mixes else 2))

    def param_roles(self) -> dict[str, Role]:
        # fn reads the width and writes a fixed number of weights: an output matrix, as a router
        return {"fn": Role.OUTPUT, "base": Role.VECTOR, "scale": Role.VECTOR}

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """fn N(0, init_std); pre's biases and the scales ``model.stream.init``'s (``start_values``), the other
        biases 0."""
        pre_bias, scale = self.start
        nn.init.normal_(self.fn, 0.0, std)
        nn.init.zeros_(self.base)
        self.base[: self.n].fill_(pre_bias)
        nn.init.constant_(self.scale, scale)

    def weights(self, h: Tensor) -> tuple[Tensor, Tensor, Optional[Tensor]]:
        """``pre`` and ``post`` ``[B, T, n]`` and ``comb`` ``[B, T, n, n]`` (doubly stochastic; None with
        ``mix: none``) of the streams ``h`` ``[B, T, n, d]``, in float32."""
        n = self.n
        logits = F.linear(l2_norm(h.flatten(2).float(), self.norm_eps), self.fn.float())
        pre_w, post_w = logits[..., :n], logits[..., n : 2 * n]
        pre_b, post_b = self.base.float()[:n], self.base.float()[n : 2 * n]
        s_pre, s_post = self.scale.float()[0], self.scale.float()[1]
        pre = torch.sigmoid(pre_w * s_pre + pre_b) + self.eps
        post = self.post_scale * torch.sigmoid(post_w * s_post + post_b) + self.post_eps
        if not self.mixes:
            return pre, post, None
        comb_w, comb_b, s_comb = logits[..., 2 * n :], self.base.float()[2 * n :], self.scale.float()[2]
        comb = torch.softmax(comb_w.unflatten(-1, (n, n)) * s_comb + comb_b.view(n, n), dim=-1) + self.eps
        comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        for _ in range(self.iters - 1):  # Sinkhorn-Knopp: rows, then columns, sum to 1
            comb = comb / (comb.sum(-1, keepdim=True) + self.eps)
            comb = comb / (comb.sum(-2, keepdim=True) + self.eps)
        return pre, post, comb

    def forward(self, h: Tensor, sublayer: Sublayer) -> Tensor:
        """The streams ``h`` ``[B, T, n, d]`` after ``sublayer`` read their ``pre``-weighted sum and its
        output was written by ``post``, beside the streams mixed by ``comb``."""
        pre, post, comb = self.weights(h)
        y = sublayer(_collapse(h, pre))
        mixed = h if comb is None else comb.to(h.dtype).transpose(-1, -2) @ h
        return post.to(h.dtype).unsqueeze(-1) * y.unsqueeze(-2) + mixed


@STREAMS.register("mhc")
class MHC(Stream):
    """The model's part: the embeddings copied into the ``n`` streams, and merged before the final norm by
    ``Σᵢ preᵢ Hᵢ``, ``pre = σ(s·rms(vec(H))·W + b) + ε`` (``hc_fn`` ``[n, n·d]``, ``hc_base`` ``[n]``,
    ``hc_scale`` ``[1]``: DeepSeek-V4's ``hc_head``)."""

    @staticmethod
    def connection(cfg: ModelConfig, index: int) -> nn.Module:
        return MHCConnection(cfg)

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        s = cfg.stream
        self.eps, self.norm_eps, self.start = s.eps, cfg.norm.eps, start_values(s.n, s.init)
        self.hc_fn = nn.Parameter(torch.empty(s.n, s.n * cfg.d_model))
        self.hc_base = nn.Parameter(torch.empty(s.n))
        self.hc_scale = nn.Parameter(torch.empty(1))

    def param_roles(self) -> dict[str, Role]:
        return {"hc_fn": Role.OUTPUT, "hc_base": Role.VECTOR, "hc_scale": Role.VECTOR}

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """hc_fn N(0, init_std); hc_base pre's bias and hc_scale the scale of ``model.stream.init``
        (``start_values``)."""
        pre_bias, scale = self.start
        nn.init.normal_(self.hc_fn, 0.0, std)
        nn.init.constant_(self.hc_base, pre_bias)
        nn.init.constant_(self.hc_scale, scale)

    def merge(self, h: Tensor) -> Tensor:
        logits = F.linear(l2_norm(h.flatten(2).float(), self.norm_eps), self.hc_fn.float())
        return _collapse(h, torch.sigmoid(logits * self.hc_scale.float() + self.hc_base.float()) + self.eps)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """The merge: hc_fn n·(n·d), hc_base n, hc_scale 1."""
        n = cfg.stream.n
        return n * n * cfg.d_model + n + 1

    @classmethod
    def connection_params(cls, cfg: ModelConfig) -> int:
        """fn (2 + n)·n·(n·d), base (2 + n)·n, scale 3; ``mix: none``: 2n rows, scale 2."""
        n, mixes = cfg.stream.n, cfg.stream.mix == "sinkhorn"
        return connection_rows(cfg) * (n * cfg.d_model + 1) + (3 if mixes else 2)

    @classmethod
    def connection_flops(cls, cfg: ModelConfig) -> int:
        """The collapse and the expansion (n·d multiply-adds each) and the mix (n²·d); forward and backward,
        6 FLOPs per multiply-add. Sinkhorn's n²·iters per token does not grow with the width: left out.
        ``mix: none``: no mix."""
        n, d = cfg.stream.n, cfg.d_model
        return 6 * d * ((n * n if cfg.stream.mix == "sinkhorn" else 0) + 2 * n)

    @classmethod
    def merge_flops(cls, cfg: ModelConfig) -> int:
        """The merge's collapse (n·d multiply-adds), forward and backward."""
        return 6 * cfg.d_model * cfg.stream.n

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``mhc ×<n>, sinkhorn <iters>`` (or ``no mix``), post's scale where not 2, and HY V4's start-up
        values where chosen."""
        s = cfg.stream
        mix = f"sinkhorn {s.sinkhorn_iters}" if s.mix == "sinkhorn" else "no mix"
        post = ""
        if (s.post_scale, s.post_eps) != (2.0, False):
            post = f", post {s.post_scale:g}·σ" + (" + eps" if s.post_eps else "")
        start = ", HY V4 init" if s.init == "hy_v4" else ""
        return f"mhc ×{s.n}, {mix}{post}{start}"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        check_streams(cfg)
        checks.integer("model.stream.sinkhorn_iters", cfg.stream.sinkhorn_iters, 1)
        checks.positive("model.stream.eps", cfg.stream.eps)
        checks.positive("model.stream.post_scale", cfg.stream.post_scale)
