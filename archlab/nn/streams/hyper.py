"""``hyper``: hyper-connections (Zhu et al. 2024, arXiv:2409.19606). The blocks carry ``n`` residual streams
``H`` ``[B, T, n, d]``, the embeddings copied into each. Every sublayer F reads ``A_mᵀH`` (a weighted sum of
the streams) and ``H ← Bᵀ F(A_mᵀH) + A_rᵀH``: its output written to the streams by ``B`` ``[n]``, the streams
mixed by ``A_r`` ``[n, n]``. Static (``dynamic: false``) those are learned as they are; dynamic ones add
``s_α·tanh(H̄W_m)``, ``s_α·tanh(H̄W_r)`` and ``s_β·tanh(H̄W_β)`` of the normed streams ``H̄``. At their init
(``A_m`` the sublayer's own stream, ``A_r = I``, ``B = 1``, the dynamic matrices 0) every stream holds the
plain residual stream, so the model starts as its plain-stream twin; the streams are summed before the
final norm."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from archlab.config import ModelConfig, StreamConfig, stream_config
from archlab.errors import ConfigError
from archlab.nn.component import Component, Role
from archlab.nn.norms import NORMS, build_norm
from archlab.nn.streams.base import STREAMS, Stream, Sublayer, check_streams

DYNAMIC_SCALE = 0.01  # s_α and s_β at init: the dynamic terms' gradient scale (W starts at 0, so no output change)


@stream_config("hyper")
@dataclass
class HyperConfig(StreamConfig):
    """``model.stream`` with kind hyper: the paper's expansion rate 4, dynamic (DHC)."""

    kind: str = "hyper"
    n: int = 4  # residual streams (the expansion rate)
    dynamic: bool = True  # false: static hyper-connections (SHC), no weights computed from the streams


class HyperConnection(Component, nn.Module):
    """One sublayer's connection: ``static_alpha`` ``[n, 1 + n]`` (A_m beside A_r), ``static_beta`` ``[n]``
    (B); dynamic, also the model's norm of the streams, ``dynamic_alpha`` ``[d, 1 + n]`` (W_m beside W_r),
    ``dynamic_beta`` ``[d]`` (W_β) and the scalars ``alpha_scale``, ``beta_scale``."""

    def __init__(self, cfg: ModelConfig, index: int):
        super().__init__()
        n, d = cfg.stream.n, cfg.d_model
        self.n, self.index = n, index  # index: the sublayer's count from the first, whose stream A_m starts on
        self.static_alpha = nn.Parameter(torch.empty(n, 1 + n))
        self.static_beta = nn.Parameter(torch.empty(n))
        self.dynamic = cfg.stream.dynamic
        if self.dynamic:
            self.norm = build_norm(cfg)
            self.dynamic_alpha = nn.Parameter(torch.empty(d, 1 + n))
            self.dynamic_beta = nn.Parameter(torch.empty(d))
            self.alpha_scale = nn.Parameter(torch.empty(()))
            self.beta_scale = nn.Parameter(torch.empty(()))

    def param_roles(self) -> dict[str, Role]:
        # the dynamic matrices read the width and write a fixed number of weights: output matrices
        roles = {"static_alpha": Role.VECTOR, "static_beta": Role.VECTOR}
        if self.dynamic:
            roles |= {"dynamic_alpha": Role.OUTPUT, "dynamic_beta": Role.OUTPUT}
            roles |= {"alpha_scale": Role.VECTOR, "beta_scale": Role.VECTOR}
        return roles

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The paper's: A_m the one-hot of stream ``index mod n``, A_r the identity, B ones; W 0, s 0.01."""
        self.static_alpha.zero_()
        self.static_alpha[self.index % self.n, 0] = 1.0
        self.static_alpha[:, 1:] = torch.eye(self.n)
        self.static_beta.fill_(1.0)
        if self.dynamic:
            self.dynamic_alpha.zero_()
            self.dynamic_beta.zero_()
            self.alpha_scale.fill_(DYNAMIC_SCALE)
            self.beta_scale.fill_(DYNAMIC_SCALE)

    def weights(self, h: Tensor) -> tuple[Tensor, Tensor]:
        """``alpha`` ``[..., n, 1 + n]`` (A_m beside A_r) and ``beta`` ``[..., n]`` of the streams ``h``."""
        if not self.dynamic:
            return self.static_alpha, self.static_beta
        normed = self.norm(h)
        alpha = self.alpha_scale * torch.tanh(normed @ self.dynamic_alpha) + self.static_alpha
        beta = self.beta_scale * torch.tanh(normed @ self.dynamic_beta) + self.static_beta
        return alpha, beta

    def forward(self, h: Tensor, sublayer: Sublayer) -> Tensor:
        """The streams ``h`` ``[B, T, n, d]`` after ``sublayer`` read ``A_mᵀH`` and its output was written by B."""
        alpha, beta = self.weights(h)
        mixed = alpha.transpose(-1, -2) @ h  # [..., 1 + n, d]: the sublayer's input, then the mixed streams
        y = sublayer(mixed[..., 0, :])
        return beta.unsqueeze(-1) * y.unsqueeze(-2) + mixed[..., 1:, :]


@STREAMS.register("hyper")
class Hyper(Stream):
    """The model's part: no parameters; the embeddings copied into the ``n`` streams, summed at the end."""

    @staticmethod
    def connection(cfg: ModelConfig, index: int) -> nn.Module:
        return HyperConnection(cfg, index)

    def param_roles(self) -> dict[str, Role]:
        return {}

    def merge(self, h: Tensor) -> Tensor:
        return h.sum(2)

    @classmethod
    def connection_params(cls, cfg: ModelConfig) -> int:
        """Static: A_m and A_r n·(1 + n), B n; dynamic, also W_m and W_r d·(1 + n), W_β d, the two scales and
        the norm's."""
        n, d = cfg.stream.n, cfg.d_model
        static = n * (1 + n) + n
        return static + (d * (2 + n) + 2 + NORMS.get(cfg.norm.kind).num_params(cfg) if cfg.stream.dynamic else 0)

    @classmethod
    def connection_flops(cls, cfg: ModelConfig) -> int:
        """The read and the mix ((1 + n)·n·d multiply-adds) and the write (n·d); forward and backward, 6 FLOPs
        per multiply-add. The merge's sum (n·d additions) is left out."""
        n, d = cfg.stream.n, cfg.d_model
        return 6 * d * ((1 + n) * n + n)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``hyper ×<n>, dynamic`` or ``static``."""
        return f"hyper ×{cfg.stream.n}, {'dynamic' if cfg.stream.dynamic else 'static'}"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        check_streams(cfg)
        if not isinstance(cfg.stream.dynamic, bool):
            raise ConfigError("model.stream.dynamic", cfg.stream.dynamic, "true or false")
