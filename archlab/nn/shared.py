"""Shared blocks (``model.layers.shared``, Zamba's): ``blocks`` transformer blocks whose weights every use of
them shares, each use with its own low-rank adapters and output linear. A use before layer i reads the
layer's input x and the embeddings e: norm([x, e]) (2·d_model) through attention (heads of 2·d_model/n_head,
scores scaled as heads of d_model/n_head, Zamba's form), a norm, a gated MLP act(gate)·up, then the use's
linear; the decoder adds that to layer i's input before the layer's norm, not to the residual stream. Each use
caches its own keys and values (``KVCache`` slots after the layers'). The closed-form counts are here too."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.config import ModelConfig
from archlab.config.shared import shared_d_ff, shared_head_dim, shared_kv_head, shared_uses
from archlab.nn.component import Role
from archlab.nn.mixers.base import KVCache
from archlab.nn.norms import NORMS
from archlab.nn.positions import Position
from archlab.nn.rope import RoPERotation, rope_angles

ACTIVATIONS = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "silu": F.silu,
    "relu": F.relu,
}


class Adapter(nn.Module):
    """A low-rank adapter (LoRA's form, added to a shared projection's output): ``up(down(x))``, no biases."""

    def __init__(self, n_in: int, rank: int, n_out: int):
        super().__init__()
        self.down = nn.Linear(n_in, rank, bias=False)
        self.up = nn.Linear(rank, n_out, bias=False)

    def forward(self, x: Tensor) -> Tensor:
        return self.up(self.down(x))


class SharedBlock(nn.Module):
    """One shared block's weights: the norm of [x, e], q/k/v from 2·d_model, the projection back to d_model,
    the MLP's norm, its fused gate/up and its down projection."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        s, d, hd = cfg.layers.shared, cfg.d_model, shared_head_dim(cfg)
        norm, f = NORMS.get(cfg.norm.kind), shared_d_ff(cfg)
        self.attn_norm = norm(cfg, 2 * d)
        self.q = nn.Linear(2 * d, s.n_head * hd, bias=False)
        self.k = nn.Linear(2 * d, shared_kv_head(cfg) * hd, bias=False)
        self.v = nn.Linear(2 * d, shared_kv_head(cfg) * hd, bias=False)
        self.proj = nn.Linear(s.n_head * hd, d, bias=False)
        self.mlp_norm = norm(cfg, d)
        self.gate_up = nn.Linear(d, 2 * f, bias=s.mlp_bias)  # [gate | up]
        self.down = nn.Linear(f, d, bias=s.mlp_bias)


class SharedUse(nn.Module):
    """One use's own weights: the adapters (gate/up's, and q/k/v's with ``attention_adapters``) and the
    linear whose output joins the layer's input."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        s, d, hd, r = cfg.layers.shared, cfg.d_model, shared_head_dim(cfg), cfg.layers.shared.adapter_rank
        kv = shared_kv_head(cfg) * hd
        self.gate_up = Adapter(d, r, 2 * shared_d_ff(cfg)) if r else None
        on = s.attention_adapters
        self.q = Adapter(2 * d, r, s.n_head * hd) if on else None
        self.k = Adapter(2 * d, r, kv) if on else None
        self.v = Adapter(2 * d, r, kv) if on else None
        self.out = nn.Linear(d, d, bias=False)


def _adapted(x: Tensor, shared: nn.Linear, adapter: Optional[Adapter]) -> Tensor:
    return shared(x) if adapter is None else shared(x) + adapter(x)


class SharedBlocks(nn.Module):
    """The model's shared blocks and their uses; ``__call__(layer, x, e, ...)`` is the use before ``layer``."""

    def __init__(self, cfg: ModelConfig):
        super().__init__()
        s = cfg.layers.shared
        self.blocks = nn.ModuleList(SharedBlock(cfg) for _ in range(s.blocks))
        self.uses = nn.ModuleList(SharedUse(cfg) for _ in s.layers)
        self.use_of = {layer: (u, block) for u, (layer, block) in enumerate(shared_uses(cfg))}
        self.n_head, self.n_kv_head, self.head_dim = s.n_head, shared_kv_head(cfg), shared_head_dim(cfg)
        self.scale = (self.head_dim / 2) ** -0.5
        self.act = ACTIVATIONS[s.activation]
        self.slot = cfg.n_layer  # use u caches in KVCache slot n_layer + u
        self.rope_theta = s.rope_theta if s.rope else None  # RoPE on whole heads, at this base
        self.unbiased = Position(cfg)  # the uses' mask: causal and padding, no score bias of the model's scheme

    def param_roles(self) -> dict[str, Role]:
        """μP roles of its projections (by name under it; its norms are entries that answer for themselves)."""
        return {n: Role.HIDDEN if p.ndim == 2 else Role.VECTOR for n, p in self.named_parameters() if "norm" not in n}

    def forward(
        self,
        layer: int,
        x: Tensor,
        e: Tensor,
        mask: Optional[Tensor],
        positions: Tensor,
        cache: Optional[KVCache] = None,
    ) -> Tensor:
        """What the use before ``layer`` adds to its input ``x`` ``[B, T, d]``, with the embeddings ``e``, the
        attention ``mask`` (None: causal) and the queries' ``positions`` ``[T]`` or ``[B, T]`` (RoPE's)."""
        u, b = self.use_of[layer]
        block, use = self.blocks[b], self.uses[u]
        assert isinstance(block, SharedBlock) and isinstance(use, SharedUse)
        B, T, _ = x.shape
        h = block.attn_norm(torch.cat((x, e), dim=-1))
        q = _adapted(h, block.q, use.q).view(B, T, self.n_head, self.head_dim)
        k = _adapted(h, block.k, use.k).view(B, T, self.n_kv_head, self.head_dim)
        v = _adapted(h, block.v, use.v).view(B, T, self.n_kv_head, self.head_dim)
        if self.rope_theta is not None:  # the frequencies computed here: a model built on meta has no buffer to fill
            pairs = torch.arange(0, self.head_dim, 2, dtype=torch.float32, device=x.device) / self.head_dim
            cos, sin = rope_angles(positions, 1.0 / self.rope_theta**pairs)
            rotation = RoPERotation(cos.to(q.dtype), sin.to(q.dtype), self.head_dim, False, may_reorder=False)
            q, k = rotation.rotate(q), rotation.rotate(k)
        q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
        if cache is not None:
            k, v = cache.update(self.slot + u, k, v)
        if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)
        y = F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, is_causal=mask is None and T > 1, scale=self.scale,
            enable_gqa=self.n_kv_head != self.n_head,
        )  # fmt: skip
        h = block.mlp_norm(block.proj(y.transpose(1, 2).reshape(B, T, -1)))
        gate, up = _adapted(h, block.gate_up, use.gate_up).chunk(2, dim=-1)
        return use.out(block.down(self.act(gate) * up))


def build_shared(cfg: ModelConfig) -> Optional[SharedBlocks]:
    """The model's shared blocks, or None where no layer has a use."""
    return SharedBlocks(cfg) if cfg.layers.shared.layers else None


# ---- closed forms, from the config alone ----


def block_params(cfg: ModelConfig) -> int:
    """One shared block's weights: its two norms, q/k/v from 2·d, the projection to d, the MLP (biases too)."""
    s, d, hd, f = cfg.layers.shared, cfg.d_model, shared_head_dim(cfg), shared_d_ff(cfg)
    norm = NORMS.get(cfg.norm.kind)
    attention = 2 * d * (s.n_head + 2 * shared_kv_head(cfg)) * hd + s.n_head * hd * d
    mlp = 3 * d * f + (2 * f + d if s.mlp_bias else 0)
    return norm.num_params(cfg, 2 * d) + norm.num_params(cfg, d) + attention + mlp


def use_params(cfg: ModelConfig) -> int:
    """One use's own weights: its adapters (rank r: r·(n_in + n_out) each) and its d × d linear."""
    s, d, hd, r = cfg.layers.shared, cfg.d_model, shared_head_dim(cfg), cfg.layers.shared.adapter_rank
    adapters = r * (d + 2 * shared_d_ff(cfg)) if r else 0
    if s.attention_adapters:
        adapters += r * (2 * d + s.n_head * hd) + 2 * r * (2 * d + shared_kv_head(cfg) * hd)
    return adapters + d * d


def shared_params(cfg: ModelConfig) -> int:
    """The shared blocks' parameters: each block once, each use's own."""
    s = cfg.layers.shared
    return s.blocks * block_params(cfg) + len(s.layers) * use_params(cfg) if s.layers else 0


def shared_run_params(cfg: ModelConfig) -> int:
    """The parameters one token passes through in all the uses: its block's and its own, per use."""
    return len(cfg.layers.shared.layers) * (block_params(cfg) + use_params(cfg))


def shared_extra_flops(cfg: ModelConfig, seq_len: int) -> int:
    """Training FLOPs per token of the uses' attention scores: 12·H·hd per key (PaLM's 12·L·H·Q·T) per use."""
    s = cfg.layers.shared
    return 12 * len(s.layers) * s.n_head * shared_head_dim(cfg) * seq_len if s.layers else 0


def shared_kv_values(cfg: ModelConfig, length: int) -> int:
    """Values the uses' KV cache slots hold for one sequence of ``length`` tokens: keys and values per use."""
    return 2 * len(cfg.layers.shared.layers) * shared_kv_head(cfg) * shared_head_dim(cfg) * length
