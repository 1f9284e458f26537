"""Differential attention, ``differential`` (Ye et al. 2024, "Differential Transformer", arXiv:2410.05258;
transformers' DiffLlama): heads in pairs, each pair's output the difference of two softmax maps over the
values, ``(softmax(Q₁K₁ᵀ) − λ·softmax(Q₂K₂ᵀ))·V``, so noise the two maps share cancels. λ is learned,
re-parametrised per layer as ``exp(λq₁·λk₁) − exp(λq₂·λk₂) + λ_init`` with ``λ_init = 0.8 − 0.6·exp(−0.3·l)``
for layer ``l``; each pair's output passes an RMSNorm without a weight and is scaled by ``1 − λ_init``.

The layout is DiffLlama's: query head ``i`` and ``i + H/2`` are a pair, and a pair reads, side by side,
the values of key/value head ``j`` of the first half of the key/value heads and of the second half
(``j = i·KV/H mod KV/2``), so a pair's output is ``2·head_dim`` wide and ``H/2`` pairs fill the output
projection's ``H·head_dim`` inputs."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, positions_seen, split_head_dim
from archlab.nn.positions import POSITIONS


@mixer_config("differential")
@dataclass
class DifferentialConfig(MixerConfig):
    """``model.attention`` with kind differential: n_head query heads in H/2 pairs over n_kv_head key/value
    heads (both even), q/k/v and output projections, four λ vectors of head_dim per layer, and the scores'
    multiplier (``scale``, which param=mup sets as the causal kind's)."""

    kind: str = "differential"
    n_kv_head: Optional[int] = None  # None = n_head; an even divisor of n_head (the values split in two halves)
    head_dim: Optional[int] = None  # None = d_model // n_head
    qkv_bias: bool = False  # biases on q, k and v (DiffLlama's attention_bias, which sets out_bias too)
    out_bias: bool = False
    lambda_std: float = 0.1  # init: the λ vectors drawn from N(0, lambda_std) (DiffLlama's lambda_std_dev)
    scale: Optional[float] = None  # the scores' multiplier; None = 1/sqrt(head_dim) (param=mup: 1/head_dim's)


def lambda_init(layer: int) -> float:
    """λ_init of layer ``layer`` (counted from 0): 0.8 − 0.6·exp(−0.3·layer), the paper's and DiffLlama's."""
    return 0.8 - 0.6 * math.exp(-0.3 * layer)


def kv_heads(cfg: ModelConfig) -> int:
    """Key/value heads: ``n_kv_head``, else ``n_head``."""
    a = cfg.attention
    return a.n_kv_head if a.n_kv_head is not None else a.n_head


@MIXERS.register("differential")
class DifferentialAttention(Mixer):
    """One fused q/k/v projection (rotated by the position scheme, as the causal kind's), one softmax map
    per query head over the values of two key/value heads side by side (one SDPA call), the pairs'
    differences by the layer's λ, a weightless RMSNorm of each pair, ``1 − λ_init``, the output projection."""

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a = cfg.attention
        self.n_head, self.n_kv_head, self.head_dim = a.n_head, kv_heads(cfg), self.qk_head_dim(cfg)
        scale = a.scale if a.scale is not None else 1 / math.sqrt(self.head_dim)
        self.scale = POSITIONS.get(cfg.position.kind).softmax_factor(cfg) * scale
        self.eps, self.lambda_init, self.lambda_std = cfg.norm.eps, lambda_init(layer), a.lambda_std
        self.qkv = nn.Linear(cfg.d_model, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=a.qkv_bias)
        self.proj = residual_projection(nn.Linear(self.n_head * self.head_dim, cfg.d_model, bias=a.out_bias))
        self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2 = (
            nn.Parameter(torch.empty(self.head_dim)) for _ in range(4)
        )

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, _ = x.shape
        H, KV, hd = self.n_head, self.n_kv_head, self.head_dim
        if rotary is not None:
            q, k, v = rotary.project(x, self.qkv, H, KV, hd, None)
        else:
            q, k, v = self.qkv(x).unflatten(-1, (H + 2 * KV, hd)).split((H, KV, KV), dim=2)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, k, v)
        if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # autocast runs q in bf16; SDPA wants the bias in q's dtype
        half = KV // 2  # key/value head j reads, side by side, the values of j mod KV/2 and of KV/2 + j mod KV/2
        values = torch.cat((v[:, :half], v[:, half:]), dim=-1).repeat(1, 2, 1, 1)
        y = F.scaled_dot_product_attention(
            q, k, values, attn_mask=mask, is_causal=mask is None and q.shape[2] > 1, scale=self.scale,
            enable_gqa=KV != H,
        )  # fmt: skip
        # the exponents summed in float32 at least, as DiffLlama (float64 in a float64 model)
        wide = torch.promote_types(y.dtype, torch.float32)
        lam_1, lam_2 = (torch.exp((a * b).sum(dtype=wide)).to(y.dtype) for a, b in self.lambda_pairs())
        pairs = y[:, : H // 2] - (lam_1 - lam_2 + self.lambda_init) * y[:, H // 2 :]  # [B, H/2, T, 2·hd]
        pairs = F.rms_norm(pairs, (2 * hd,), eps=self.eps) * (1 - self.lambda_init)
        return self.proj(pairs.transpose(1, 2).reshape(B, T, H * hd))

    def lambda_pairs(self) -> tuple[tuple[Tensor, Tensor], tuple[Tensor, Tensor]]:
        """(λq₁, λk₁) and (λq₂, λk₂): λ = exp(λq₁·λk₁) − exp(λq₂·λk₂) + λ_init."""
        return (self.lambda_q1, self.lambda_k1), (self.lambda_q2, self.lambda_k2)

    def param_roles(self) -> dict[str, Role]:
        lambdas = {f"lambda_{v}": Role.VECTOR for v in ("q1", "k1", "q2", "k2")}
        biases = {"qkv.bias": Role.VECTOR, "proj.bias": Role.VECTOR}
        return {"qkv.weight": Role.HIDDEN, "proj.weight": Role.HIDDEN} | biases | lambdas

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The λ vectors, which no Linear holds (``Decoder.init_weights`` calls it): N(0, lambda_std)."""
        for p in (self.lambda_q1, self.lambda_k1, self.lambda_q2, self.lambda_k2):
            nn.init.normal_(p, 0.0, self.lambda_std)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``attention.head_dim``, else d_model / n_head."""
        return split_head_dim(cfg)

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """q, k, v and output projections, d·(H + 2·KV)·hd + H·hd·d, the biases asked for, and four λ
        vectors of hd; the pairs' RMSNorm has no weight."""
        a, d, hd, kv = cfg.attention, cfg.d_model, cls.qk_head_dim(cfg), kv_heads(cfg)
        qkv_out = (a.n_head + 2 * kv) * hd
        return d * qkv_out + a.qkv_bias * qkv_out + a.n_head * hd * d + a.out_bias * d + 4 * hd

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """Keys and values, 2·KV·hd per position (every position: it has no window)."""
        return 2 * kv_heads(cfg) * DifferentialAttention.qk_head_dim(cfg) * positions_seen(cfg, length, layer)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Per key a query sees, forward and backward: scores over H heads of hd (6·H·hd) and the weighted
        sum of values two heads wide (12·H·hd): 18·H·hd."""
        a = cfg.attention
        return 18 * a.n_head * DifferentialAttention.qk_head_dim(cfg) * positions_seen(cfg, seq_len, layer)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 2)
        if a.n_head % 2:
            raise ConfigError("model.attention.n_head", a.n_head, "an even number (heads come in pairs)")
        if a.head_dim is None and cfg.d_model % a.n_head:
            raise ConfigError(
                "model.attention.n_head", a.n_head, f"a divisor of model.d_model={cfg.d_model}, or set head_dim"
            )
        if a.head_dim is not None:
            checks.integer("model.attention.head_dim", a.head_dim, 1, "a positive integer, or null")
        kv = kv_heads(cfg)
        if a.n_kv_head is not None:
            checks.integer("model.attention.n_kv_head", a.n_kv_head, 1, "a positive integer, or null")
        if kv % 2 or a.n_head % kv:
            raise ConfigError(
                "model.attention.n_kv_head",
                a.n_kv_head,
                f"an even divisor of model.attention.n_head={a.n_head}, or null (the values split in two halves)",
            )
        checks.positive("model.attention.lambda_std", a.lambda_std)
        if a.scale is not None:
            checks.positive("model.attention.scale", a.scale, "a positive number, or null")

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``differential <H>q/<KV>kv x <head_dim>``."""
        a = cfg.attention
        return f"differential {a.n_head}q/{kv_heads(cfg)}kv x {DifferentialAttention.qk_head_dim(cfg)}"
