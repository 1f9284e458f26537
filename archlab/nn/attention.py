"""Attention variants (``causal``: softmax self-attention with ``n_kv_head`` key/value heads, i.e.
MHA, GQA or MQA, over SDPA) and the KV cache they decode with."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import ModelConfig, head_dim, n_kv_head
from archlab.errors import ConfigError
from archlab.nn.component import MEMBERS, Base
from archlab.nn.positions import Rotation
from archlab.registry import Registry

ATTENTIONS: Registry[type] = Registry("model.attention.kind", MEMBERS)


class KVCache:
    """Keys and values of every layer, pre-allocated for ``max_len`` positions of a batch."""

    def __init__(self, cfg: ModelConfig, batch_size: int, max_len: int, device=None, dtype=None):
        shape = (cfg.n_layer, batch_size, n_kv_head(cfg), max_len, head_dim(cfg))
        self.k = torch.zeros(shape, device=device, dtype=dtype)
        self.v = torch.zeros(shape, device=device, dtype=dtype)
        self.length = 0  # positions already stored; advanced by the model after each forward

    @property
    def max_len(self) -> int:
        return self.k.shape[3]

    def update(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this step's k/v of ``layer`` after the cached ones; return all of them."""
        end = self.length + k.shape[2]
        if end > self.max_len:
            raise ValueError(f"KV cache holds {self.max_len} positions; this step needs {end}")
        self.k[layer, :, :, self.length : end] = k
        self.v[layer, :, :, self.length : end] = v
        return self.k[layer, :, :, :end], self.v[layer, :, :, :end]


def attention_mask(q_pos: Tensor, k_pos: Tensor, bias: Optional[Tensor]) -> Optional[Tensor]:
    """The mask SDPA needs beyond ``is_causal``: None when plain causal (or one query) suffices."""
    if bias is None:
        if len(q_pos) == 1 or len(q_pos) == len(k_pos):
            return None
        return k_pos[None, :] <= q_pos[:, None]
    return bias.masked_fill(k_pos[None, :] > q_pos[:, None], float("-inf"))


@ATTENTIONS.register("causal")
class CausalSelfAttention(Base, nn.Module):
    """One fused q/k/v projection, SDPA over the causal window, one output projection."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        a = cfg.attention
        self.n_head, self.n_kv_head, self.head_dim = a.n_head, n_kv_head(cfg), head_dim(cfg)
        self.dropout = a.dropout
        self.qkv = nn.Linear(cfg.d_model, (self.n_head + 2 * self.n_kv_head) * self.head_dim, bias=a.qkv_bias)
        self.proj = nn.Linear(self.n_head * self.head_dim, cfg.d_model, bias=a.out_bias)
        self.proj.residual = True  # scaled at init (GPT-2)

    def forward(
        self,
        x: Tensor,
        rotary: Optional[Rotation] = None,
        mask: Optional[Tensor] = None,
        cache: Optional[KVCache] = None,
        layer: int = 0,
    ) -> Tensor:
        B, T, _ = x.shape
        H, KV, hd = self.n_head, self.n_kv_head, self.head_dim
        if rotary is None:
            q, k, v = self.qkv(x).view(B, T, H + 2 * KV, hd).split((H, KV, KV), dim=2)
        else:  # the scheme may reorder the projection's rows into a layout it rotates faster
            weight, bias, arranged = rotary.arrange(self.qkv.weight, self.qkv.bias, H + KV, hd)
            qkv = F.linear(x, weight, bias).unflatten(-1, (H + 2 * KV, hd))
            q, k, v = rotary.rotate(qkv, H, KV, arranged)
        q, k, v = (t.transpose(1, 2) for t in (q, k, v))
        if cache is not None:
            k, v = cache.update(layer, k, v)
        if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # autocast runs q in bf16; SDPA wants the bias in q's dtype
        y = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=self.dropout if self.training else 0.0,
            is_causal=mask is None and T > 1,
            enable_gqa=KV != H,
        )
        return self.proj(y.transpose(1, 2).reshape(B, T, H * hd))

    @staticmethod
    def num_params(cfg: ModelConfig) -> int:
        """q, k, v and output projections: d·(H + 2·KV)·hd + H·hd·d, plus the biases asked for."""
        a, d, hd, kv = cfg.attention, cfg.d_model, head_dim(cfg), n_kv_head(cfg)
        qkv_out = (a.n_head + 2 * kv) * hd
        return d * qkv_out + a.qkv_bias * qkv_out + a.n_head * hd * d + a.out_bias * d

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int) -> int:
        """Scores q·k and the weighted sum of values, forward and backward: 12·H·hd·T (PaLM, appendix B)."""
        return 12 * cfg.attention.n_head * head_dim(cfg) * seq_len

    @staticmethod
    def validate(cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.positive("model.attention.n_head", a.n_head)
        if a.head_dim is None:
            if cfg.d_model % a.n_head:
                raise ConfigError(
                    "model.attention.n_head",
                    a.n_head,
                    f"a divisor of model.d_model={cfg.d_model}, or set model.attention.head_dim",
                )
        else:
            checks.positive("model.attention.head_dim", a.head_dim)
        if a.n_kv_head is not None:
            checks.positive("model.attention.n_kv_head", a.n_kv_head)
            if a.n_head % a.n_kv_head:
                raise ConfigError(
                    "model.attention.n_kv_head",
                    a.n_kv_head,
                    f"a divisor of model.attention.n_head={a.n_head} (1 = MQA, n_head = MHA)",
                )
        checks.probability("model.attention.dropout", a.dropout)


def build_attention(cfg: ModelConfig) -> nn.Module:
    return ATTENTIONS.get(cfg.attention.kind)(cfg)
