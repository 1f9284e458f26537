"""``altup``: Alternating Updates (Baykal et al. 2023, arXiv:2301.13310), as Gemma 3n has them (transformers'
``Gemma3nTextAltUp``). The blocks carry ``n`` copies of the hidden state ``H`` ``[B, T, n, d]``: the embeddings
in the first (the active one) and their projections, each rescaled to its RMS, in the others. Every layer runs
its whole block on the active copy alone: before it, each copy is predicted as ``Hᵢ + Σⱼ Pᵢⱼ Hⱼ``; after it,
each is corrected by ``(Cᵢ + 1)·(y − predicted₀)``, y the block's output; P ``[n, n]`` and C ``[n]`` are
computed per token from the active copy by a router, ``tanh(W·norm(x)/d)``. What a layer adds after its
block (its per-layer input, ``model.per_layer_input``) reads the active copy times a learned scale and is
added to the other copies. Before the final norm the other copies are projected back, rescaled to the
active copy's RMS, and all are averaged.

A stream, not a block option: the copies live from the embeddings to the final norm, as hyper-connections'
streams do; but the prediction and correction wrap a whole layer, not each sublayer, so AltUp answers
``layer_connection`` (a module around a block) rather than ``connection``, and any block wiring runs inside."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, ClassVar, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, StreamConfig, stream_config
from archlab.nn.component import Component, Role
from archlab.nn.norms import NORMS, build_norm
from archlab.nn.streams.base import STREAMS, LayerConnection, Stream

MIN_SQUARE = 1e-5  # a projected copy's mean square floor before its rescaling (Gemma 3n's clamp)


@stream_config("altup")
@dataclass
class AltUpConfig(StreamConfig):
    """``model.stream`` with kind altup: Gemma 3n's defaults (altup_num_inputs, altup_coef_clip)."""

    kind: str = "altup"
    n: int = 4  # copies of the hidden state, the first active (altup_num_inputs)
    # training: the prediction coefficients clamped in place to [-clip, clip], the correction ones as read
    # (altup_coef_clip); None = no clamp
    coef_clip: Optional[float] = 120.0


def _rescaled(x: Tensor, like: Tensor) -> Tensor:
    """``x`` ``[..., d]`` rescaled to the RMS of ``like`` (its own mean square floored at ``MIN_SQUARE``)."""
    target = like.pow(2).mean(-1, keepdim=True) ** 0.5
    return x * target / torch.sqrt(x.pow(2).mean(-1, keepdim=True).clamp(min=MIN_SQUARE))


class AltUpLayer(Component, LayerConnection):
    """One layer's prediction and correction: the router ``router`` ``[n, d]`` after its norm, the prediction
    coefficients ``predict`` ``[n², n]``, the correction ones ``correct`` ``[n, n]`` and, with per-layer
    inputs, the active copy's ``output_scale`` ``[d]`` they read."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        n, d = cfg.stream.n, cfg.d_model
        self.n, self.d, self.clip = n, d, cfg.stream.coef_clip
        self.router_norm = build_norm(cfg)
        self.router = nn.Linear(d, n, bias=False)
        self.predict = nn.Linear(n, n * n, bias=False)
        self.correct = nn.Linear(n, n, bias=False)
        self.output_scale = nn.Parameter(torch.empty(d)) if cfg.per_layer_input.dim else None

    def param_roles(self) -> dict[str, Role]:
        # the router reads the width into n weights (an output matrix, as a MoE's router); the coefficients
        # have no width-sized dim
        roles = {"router.weight": Role.OUTPUT, "predict.weight": Role.VECTOR, "correct.weight": Role.VECTOR}
        return roles | ({"output_scale": Role.VECTOR} if self.output_scale is not None else {})

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """Gemma 3n's: the output scale 0 (the per-layer inputs start silent); the Linears are the model's."""
        if self.output_scale is not None:
            self.output_scale.zero_()

    def modalities(self, x: Tensor) -> Tensor:
        """The router's ``tanh(W·norm(x)/d)`` ``[..., n]`` of the active copy ``x``."""
        return torch.tanh(self.router(self.router_norm(x) * (1.0 / self.d)).float()).type_as(x)

    def forward(self, h: Tensor, block: Callable[[Tensor], Tensor]) -> Tensor:
        """The copies ``h`` ``[B, T, n, d]`` after ``block`` ran on the active one's prediction."""
        if self.training and self.clip is not None:
            with torch.no_grad():
                self.predict.weight.clamp_(-self.clip, self.clip)
        coefs = self.predict(self.modalities(h[..., 0, :])).unflatten(-1, (self.n, self.n))
        predicted = (h + coefs.to(h.dtype) @ h).type_as(h)
        y = block(predicted[..., 0, :])
        weight = self.correct.weight
        if self.training and self.clip is not None:
            weight = weight.clamp(-self.clip, self.clip)
        gains = F.linear(self.modalities(y), weight) + 1.0  # [B, T, n]
        return (predicted + gains.unsqueeze(-1) * (y - predicted[..., 0, :]).unsqueeze(-2)).type_as(y)

    def add(self, h: Tensor, late: Callable[[Tensor], Tensor]) -> Tensor:
        """``h`` with what ``late`` makes of the active copy times ``output_scale`` added to the other copies."""
        assert self.output_scale is not None, "built with per-layer inputs, the only late addition"
        active = h[..., 0, :]
        y = late((active.type_as(self.output_scale) * self.output_scale).type_as(active))
        return torch.cat([h[..., :1, :], h[..., 1:, :] + y.unsqueeze(-2)], dim=-2)


@STREAMS.register("altup")
class AltUp(Stream):
    """The model's part: ``projections`` (n − 1 of d × d) making the other copies from the embeddings, and
    ``unembed`` (n − 1 of d × d) projecting them back before their mean."""

    wraps_layers: ClassVar[bool] = True

    def __init__(self, cfg: ModelConfig):
        super().__init__(cfg)
        d = cfg.d_model
        self.projections = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(self.n - 1))
        self.unembed = nn.ModuleList(nn.Linear(d, d, bias=False) for _ in range(self.n - 1))

    def param_roles(self) -> dict[str, Role]:
        return {n: Role.HIDDEN for n, _ in self.named_parameters()}

    def widen(self, x: Tensor) -> Tensor:
        copies = [x, *(_rescaled(p(x).to(x.dtype), x) for p in self.projections)]
        return torch.stack(copies, dim=2)

    def merge(self, h: Tensor) -> Tensor:
        active = h[..., 0, :]
        copies = [active, *(_rescaled(u(h[..., i + 1, :]), active) for i, u in enumerate(self.unembed))]
        return torch.stack(copies).mean(0)

    @staticmethod
    def layer_connection(cfg: ModelConfig, layer: int) -> LayerConnection:
        return AltUpLayer(cfg)

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """The projections in and out, 2·(n − 1)·d²."""
        return 2 * (cfg.stream.n - 1) * cfg.d_model**2

    @classmethod
    def layer_params(cls, cfg: ModelConfig) -> int:
        """The router n·d and its norm, the coefficients n³ + n², the output scale d with per-layer inputs."""
        n, d = cfg.stream.n, cfg.d_model
        scale = d if cfg.per_layer_input.dim else 0
        return n * d + NORMS.get(cfg.norm.kind).num_params(cfg) + n**3 + n**2 + scale

    @classmethod
    def layer_extra_flops(cls, cfg: ModelConfig) -> int:
        """Per layer run the prediction's mix (n²·d multiply-adds) and the correction (n·d); forward and
        backward, 6 FLOPs per multiply-add."""
        n, d = cfg.stream.n, cfg.d_model
        return 6 * d * (n * n + n)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``altup ×<n>``."""
        return f"altup ×{cfg.stream.n}"

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        checks.integer("model.stream.n", cfg.stream.n, 1, "a positive integer (copies of the hidden state)")
        clip = cfg.stream.coef_clip
        if clip is not None:
            checks.positive("model.stream.coef_clip", clip, "a positive number or null (no clamp)")
