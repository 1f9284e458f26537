"""Softmax attention, ``causal``: self-attention with ``n_kv_head`` key/value heads (MHA, GQA or MQA),
optionally QK-normed, sliding-window, chunked, soft-capped, with sinks, an output gate or query
scaling; and the softmax scale it shares with ``mla``."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import ClassVar, Optional, Sequence, cast

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config, n_kv_head
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import (
    MIXERS,
    KVCache,
    Mixer,
    ScoreStats,
    chunk_of,
    head_dim,
    positions_seen,
    scores_of,
    split_head_dim,
    visible_keys,
)
from archlab.nn.mixers.ops import cpu_attention
from archlab.nn.mixers.shared_kv import SharedKV
from archlab.nn.norms import NORMS, l2_norm
from archlab.nn.positions import POSITIONS, Rotation


@mixer_config("causal")
@dataclass
class AttentionConfig(MixerConfig):
    """``model.attention`` with kind causal: softmax self-attention, its heads and projections."""

    kind: str = "causal"
    n_kv_head: Optional[int] = None  # None = n_head (MHA); divides n_head (GQA); 1 (MQA)
    head_dim: Optional[int] = None  # None = d_model // n_head
    v_head_dim: Optional[int] = None  # value heads' width; None = head_dim (MiMo-V2-Flash: 128 beside 192)
    qkv_bias: bool = True
    out_bias: bool = True
    dropout: float = 0.0
    qk_norm: str = choice(
        "none", "head", "full", "l2"
    )  # norm q and k: per head (Qwen3) | whole projection (OLMo 2), before RoPE unless qk_norm_after_rope; l2: per
    # head, no weight, always after RoPE (Llama 4)
    qk_norm_after_rope: bool = False  # head and full: norm the rotated q and k instead (HunYuan dense)
    qk_norm_per_head_scale: bool = False  # head: a scale (and shift) per head, H·hd and KV·hd wide (Cohere, StableLM 2)
    qk_norm_bias: Optional[bool] = None  # head, full with layernorm: the QK-norms' shift; None = model.norm.bias
    clip_qkv: Optional[float] = None  # q, k and v clamped to [-c, c] as projected, before QK-norm and RoPE (OLMo: 8)
    scale: Optional[float] = None  # score multiplier; None = 1/sqrt(head_dim) (Gemma 2: query_pre_attn_scalar^-0.5)
    softcap: Optional[float] = None  # scores -> softcap·tanh(scores/softcap) (Gemma 2: 50)
    window: Optional[int] = None  # sliding window: a query sees itself and the window-1 positions before it (Mistral)
    chunk: Optional[int] = None  # chunked attention: a query sees the earlier keys of its chunk (Llama 4: 8192)
    sinks: bool = False  # a learned logit per head joins each softmax's denominator, a key with no value (gpt-oss)
    gate: str = choice(
        "none", "elementwise", "head"
    )  # output times sigmoid(W·x) before proj: per dim of each head (AFMoE, Qwen3-Next) | per head (Step-3.5)
    gate_activation: str = choice("sigmoid", "softplus")  # the gate's σ, or softplus in float32 (Laguna)
    gate_head_bias: bool = False  # a learned bias per head added to the gate's logits, over its dims (Beam's gate_bias)
    sub_norm: bool = False  # a norm of model.norm's kind over the heads' output (H·vd) before proj (BitNet)
    # queries at position p times 1 + beta·log(1 + floor((p + offset) / length)) (Llama 4's attention temperature:
    # attn_scale 0.1, floor_scale 8192, offset 1; Ministral 3: llama_4_scaling_beta, original_max_position_embeddings, 0)
    query_scale_beta: Optional[float] = None  # None = queries unscaled
    query_scale_length: int = 8192  # positions per step of the floor
    query_scale_offset: int = 0  # added to the position before the floor (Llama 4 counts from 1)
    query_scale_by: str = choice(
        "index", "position"
    )  # p: the cache index (Llama 4) | each row's position (Ministral 3)
    # the factor's form: 1 + beta·log(1 + floor((p + offset) / length)) (Llama 4) | (1 + (p + offset) / length)^beta
    # (Beam's NoPE layers: beta 0.1, length 2048, offset 1)
    query_scale_form: str = choice("log", "power")
    # value residual learning (ResFormer): every layer after the first mixes its values with the first layer's,
    # λ₁·v₁ + λ₂·vₙ, two learned λ per layer starting at 0.5
    value_residual: bool = False
    v_norm: bool = False  # each value head RMS-normed without a scale, at model.norm.eps (Gemma 4's v_norm)
    v_from_k: bool = False  # values are the keys' projection before QK-norm and RoPE: no value weights (Gemma 4)
    # no key/value projections: attend over the keys and values of the last earlier layer with the same window
    # that computes its own (Gemma 4's num_kv_shared_layers); that layer caches them, this one nothing
    kv_shared: bool = False


def v_head_dim(cfg: ModelConfig) -> int:
    """The value heads' width: ``attention.v_head_dim``, else the query/key heads' (``head_dim``)."""
    v = cfg.attention.v_head_dim
    return v if v is not None else split_head_dim(cfg)


def softmax_scale(cfg: ModelConfig) -> float:
    """The score multiplier: ``attention.scale``, else 1/sqrt(head_dim), times the factor the position
    scheme implies (YaRN RoPE with ``mscale_all_dim`` and ``softmax_mscale``: ``yarn_mscale(factor, mscale_all_dim)``²,
    DeepSeek-V2/V3; 1 for every other scheme)."""
    a = cfg.attention
    scale = a.scale if a.scale is not None else 1 / math.sqrt(head_dim(cfg))
    return scale * POSITIONS.get(cfg.position.kind).softmax_factor(cfg)


def sink_key(
    q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], sinks: Tensor, scale: float
) -> tuple[Tensor, Tensor, Tensor, Optional[Tensor]]:
    """gpt-oss's sinks as one more key, first, that every query sees and whose value is zero: its score
    is each head's sink, so the softmax adds e^sink to its denominator and nothing to its sum. The sink
    rides in one more head dimension (sink / scale in each query of head h, 1 in the sink key, 0 in the
    others: a per-head score through keys shared by a GQA group), padded to a multiple of 8 with zeros.
    A mask gets the sink's column (visible, or a 0 bias); plain causal attention stays ``is_causal``
    with a zero first query, which the caller drops. Masks keep their dtype, so SDPA keeps its flash
    kernels (a float bias would rule them out)."""
    B, H, Tq, hd = q.shape
    pad = 8 - hd % 8  # 1 to 8 more dims: one holds the sink
    q = torch.cat(
        (q, (sinks / scale).to(q.dtype).view(1, H, 1, 1).expand(B, H, Tq, 1), q.new_zeros(B, H, Tq, pad - 1)), -1
    )
    k, v = F.pad(k, (0, pad)), F.pad(v, (0, pad))
    key = k.new_zeros(B, k.shape[1], 1, hd + pad)
    key[..., hd] = 1.0
    k, v = torch.cat((key, k), dim=2), torch.cat((v.new_zeros(*v.shape[:2], 1, v.shape[3]), v), dim=2)
    if mask is not None:
        column = torch.ones if mask.dtype == torch.bool else torch.zeros
        mask = torch.cat((column(*mask.shape[:-1], 1, dtype=mask.dtype, device=mask.device), mask), dim=-1)
    elif Tq > 1:  # causal over queries ending with the keys: a first query lines them up again
        q = torch.cat((q.new_zeros(B, H, 1, hd + pad), q), dim=2)
    return q, k, v, mask


def query_scales(
    start: int, length: int, beta: float, every: int, offset: int, device: torch.device, form: str = "log"
) -> Tensor:
    """The factor ``1 + beta·log(1 + ⌊(p + offset) / every⌋)`` of the queries at positions ``p`` = start,
    ..., start + length - 1, float32 ``[1, 1, length, 1]`` (Llama 4's attention temperature, offset 1;
    Ministral 3's ``llama_4_scaling_beta``, offset 0); ``form="power"``: ``(1 + (p + offset) / every)^beta``
    (Beam's, computed as exp(beta·log1p(·)) as transformers' ``compute_attention_scaling``)."""
    return query_scales_at(torch.arange(start, start + length, device=device), beta, every, offset, form)


def query_scales_at(p: Tensor, beta: float, every: int, offset: int, form: str = "log") -> Tensor:
    """``query_scales`` at positions ``p`` ``[T]`` or ``[B, T]``: float32 ``[1 or B, 1, T, 1]``."""
    p = p.to(torch.float32)
    if form == "power":
        return torch.exp(beta * torch.log1p((p + offset) / every)).view(-1, 1, p.shape[-1], 1)
    return (1 + beta * torch.log1p(torch.floor((p + offset) / every))).view(-1, 1, p.shape[-1], 1)


class FirstValues:
    """The first attention layer's values of the latest forward, which every later layer's mixes its own with
    (value residual learning, Zhou et al. 2024, arXiv:2410.17897); one per model, held by the first layer and
    handed to the others by ``Decoder``. A cached step's are its new positions' (the cache keeps mixed values)."""

    def __init__(self) -> None:
        self.v: Optional[Tensor] = None

    def mix(self, v: Tensor, weights: Optional[Tensor]) -> Tensor:
        """The first layer's ``v`` (``weights`` None: kept for the others), else λ₁·v₁ + λ₂·v."""
        if weights is None:
            self.v = v
            return v
        assert self.v is not None, "the first layer runs first"
        return weights[0].to(v.dtype) * self.v + weights[1].to(v.dtype) * v


def link_first_values(mixers: Sequence[Mixer]) -> None:
    """Hand the first layer's ``FirstValues`` to every later attention layer of a value-residual model (those
    that hold ``value_mix``)."""
    first = next((f for m in mixers if isinstance(f := getattr(m, "first_values", None), FirstValues)), None)
    for m in mixers:
        if first is not None and isinstance(getattr(m, "value_mix", None), nn.Parameter):
            vars(m)["first_values"] = first


class CausalSelfAttention(Mixer):
    """One fused q/k/v projection (optionally clipped), optional QK-norm and query scaling, scaled dot-product attention over
    the causal (or sliding, or chunked) window, optionally soft-capped or with sinks, an optional output
    gate, one output projection. SDPA runs it unless soft-capping asks for the scores themselves, or bf16
    on the CPU is faster as plain matmuls (cpu_attention.py); sinks reach SDPA as one more key column."""

    takes_bitlinear: ClassVar[bool] = True  # its projections may be BitLinear (model.linear): bitlinear_segments

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a = cfg.attention
        self.n_head, self.n_kv_head, self.head_dim = a.n_head, n_kv_head(cfg), self.qk_head_dim(cfg)
        self.v_head_dim = v_head_dim(cfg)
        self.dropout, self.softcap, self.scale = a.dropout, a.softcap, softmax_scale(cfg)
        self.window, self.chunk = cfg.attention.window, chunk_of(cfg, layer)
        self.widths = projected_widths(cfg)  # queries, keys, values: 0 for what the layer does not project
        qkv_width = sum(self.widths)
        self.qkv = nn.Linear(cfg.d_model, qkv_width, bias=a.qkv_bias)
        self.proj = residual_projection(nn.Linear(self.n_head * self.v_head_dim, cfg.d_model, bias=a.out_bias))
        # a gate is projected as the queries are, with their bias (Qwen3-Next's q_proj holds both)
        gate_width = {"none": 0, "elementwise": self.n_head * self.v_head_dim, "head": self.n_head}[a.gate]
        self.gate = nn.Linear(cfg.d_model, gate_width, bias=a.qkv_bias) if gate_width else None
        self.gate_head_bias = nn.Parameter(torch.empty(self.n_head)) if a.gate_head_bias else None
        self.softplus_gate = a.gate_activation == "softplus"
        self.sub_norm = NORMS.get(cfg.norm.kind)(cfg, self.n_head * self.v_head_dim) if a.sub_norm else None
        self.sinks = nn.Parameter(torch.empty(self.n_head)) if a.sinks else None
        self.query_scale = (a.query_scale_beta, a.query_scale_length, a.query_scale_offset, a.query_scale_form)
        self.query_scale_by = a.query_scale_by
        self.norm_eps = cfg.norm.eps  # l2 QK-norm's and v_norm's (Llama 4, Gemma 4: rms_norm_eps, the norms' own)
        self.v_norm, self.v_from_k, self.kv_shared = a.v_norm, a.v_from_k, a.kv_shared
        # KV sharing (shared_kv.link_shared_kv): where this layer hands its keys and values on, or reads them
        self.kv_store: Optional[SharedKV] = None
        self.kv_source: Optional[SharedKV] = None
        # value residual: the first layer's values, shared by the model's layers (Decoder links them), and
        # every later layer's two weights λ₁, λ₂
        self.first_values: Optional[FirstValues] = FirstValues() if a.value_residual and layer == 0 else None
        self.value_mix = nn.Parameter(torch.empty(2)) if a.value_residual and layer > 0 else None
        self.qk_norm, self.clip = a.qk_norm, a.clip_qkv
        # the weighted norms (head, full) before RoPE unless asked after it; l2 is after it always (Llama 4)
        self.norm_first = a.qk_norm in ("head", "full") and not a.qk_norm_after_rope
        self.scale_per_head = a.qk_norm == "head" and a.qk_norm_per_head_scale
        if a.qk_norm in ("head", "full"):
            norm, norm_cfg = NORMS.get(cfg.norm.kind), qk_norm_config(cfg)
            shared = a.qk_norm == "head" and not a.qk_norm_per_head_scale  # one hd-wide scale for every head
            self.q_norm = norm(norm_cfg, self.head_dim if shared else self.n_head * self.head_dim)
            if not a.kv_shared:  # a layer that projects no keys norms none
                self.k_norm = norm(norm_cfg, self.head_dim if shared else self.n_kv_head * self.head_dim)

    def project(self, x: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values ``[B, T, heads, hd]``: projected, clamped to ±clip_qkv (OLMo 1, as
        projected), then QK-normed and rotated, in that order (Qwen3, OLMo 2) or the other
        (``qk_norm_after_rope``: HunYuan dense; the l2 QK-norm always, where Llama 4 applies it: a
        rotation keeps the RMS, so either order gives the same heads but for rounding). Values are the
        keys as projected where ``v_from_k``, then RMS-normed without a scale where ``v_norm``. A
        ``kv_shared`` layer projects queries alone: its keys and values are ``empty`` (an earlier layer's)."""
        if self.kv_shared:
            q = self.split(self.qkv(x))[0]
            q = self.normed(q, q)[0] if self.norm_first else q
            q = rotary.rotate(q) if rotary is not None else q
            q = q if self.norm_first else self.normed(q, q)[0]
            return q, q.new_empty(0), q.new_empty(0)
        if self.v_from_k:
            q, k, _ = self.split(self.qkv(x))
            v = l2_norm(k, self.norm_eps) if self.v_norm else k
            q, k = self.rotated(q, k, rotary)
            return q, k, v
        if (
            self.qk_norm in ("none", "l2")
            and self.v_head_dim == self.head_dim
            and not self.v_norm
            and not self.bitlinear
        ):
            # no weight per dim, heads of one width: RoPE's one pass may reorder each head's dims
            if rotary is not None:
                q, k, v = rotary.project(x, self.qkv, self.n_head, self.n_kv_head, self.head_dim, self.clip)
            else:
                q, k, v = self.split(self.qkv(x))
            return *self.normed(q, k), v
        q, k, v = self.split(self.qkv(x))
        q, k = self.rotated(q, k, rotary)
        return q, k, l2_norm(v, self.norm_eps) if self.v_norm else v

    def rotated(self, q: Tensor, k: Tensor, rotary: Optional[Rotation]) -> tuple[Tensor, Tensor]:
        """Queries and keys QK-normed and rotated, in the order ``project`` says."""
        if self.norm_first:
            q, k = self.normed(q, k)
        if rotary is not None:
            q, k = rotary.rotate(q), rotary.rotate(k)
        if not self.norm_first:
            q, k = self.normed(q, k)
        return q, k

    def split(self, qkv: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """The projection's output clamped to ±clip_qkv (if set): queries, keys and values ``[B, T, heads, hd]``
        (a part the layer does not project: ``[B, T, heads, 0]``)."""
        if self.clip is not None:
            qkv = qkv.clamp(-self.clip, self.clip)
        H, KV, hd, vd = self.n_head, self.n_kv_head, self.head_dim, self.v_head_dim
        if self.v_from_k or self.kv_shared:
            q, k, v = qkv.split(self.widths, dim=-1)
            return q.unflatten(-1, (H, hd)), k.unflatten(-1, (-1, hd)), v.unflatten(-1, (-1, vd))
        if vd == hd:
            q, k, v = qkv.unflatten(-1, (H + 2 * KV, hd)).split((H, KV, KV), dim=2)
            return q, k, v
        q, k, v = qkv.split((H * hd, KV * hd, KV * vd), dim=-1)
        return q.unflatten(-1, (H, hd)), k.unflatten(-1, (KV, hd)), v.unflatten(-1, (KV, vd))

    def normed(self, q: Tensor, k: Tensor) -> tuple[Tensor, Tensor]:
        """Queries and keys ``[B, T, heads, hd]`` through the QK-norm: per head with one hd-wide scale
        (Qwen3) or a scale per head (Cohere, StableLM 2), over each whole projection (OLMo 2), l2 without a
        weight (Llama 4), or none."""
        if self.qk_norm == "l2":
            return l2_norm(q, self.norm_eps), l2_norm(k, self.norm_eps)
        k_norm = getattr(self, "k_norm", None)  # none where the layer projects no keys (kv_shared: k is q, unread)
        if self.qk_norm == "head":
            if self.scale_per_head:
                return self.q_norm.per_head(q), k if k_norm is None else k_norm.per_head(k)
            return self.q_norm(q), k if k_norm is None else k_norm(k)
        if self.qk_norm == "full":
            q_heads, k_heads = q.shape[-2:], k.shape[-2:]
            k = k if k_norm is None else k_norm(k.flatten(-2)).unflatten(-1, k_heads)
            return self.q_norm(q.flatten(-2)).unflatten(-1, q_heads), k
        return q, k

    @property
    def bitlinear(self) -> bool:
        """Whether the projections are BitLinear (``model.linear``): they compute their own weights, unreordered."""
        return getattr(self.qkv, "widths", None) is not None

    def bitlinear_segments(self) -> dict[str, tuple[int, ...]]:
        """Each projection BitLinear may replace and the widths of its parts (q, k, v: a weight scale each)."""
        gate = () if self.gate is None else (self.gate.out_features,)
        return {"qkv": tuple(w for w in self.widths if w), "proj": (self.proj.out_features,), "gate": gate}

    def param_roles(self) -> dict[str, Role]:
        # a gate per head reads the width into one value per head: an output; a gate per value dim is hidden
        gate = Role.OUTPUT if self.gate is not None and self.gate.out_features == self.n_head else Role.HIDDEN
        projections = {"qkv": Role.HIDDEN, "proj": Role.HIDDEN, "gate": gate}
        return {
            **{f"{n}.weight": r for n, r in projections.items()},
            **{f"{n}.bias": Role.VECTOR for n in projections},
            "sinks": Role.VECTOR,
            "value_mix": Role.VECTOR,
            "gate_head_bias": Role.VECTOR,
        }

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, _ = x.shape
        q, k, v = self.project(x, rotary)
        q = self.scaled(q.transpose(1, 2), rotary, cache)
        if self.kv_source is not None:  # kv_shared: the earlier layer's, as it attended to them (its cache's)
            k, v = self.kv_source.k, self.kv_source.v
            assert k is not None and v is not None, "its server runs first"
        else:
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            if self.first_values is not None:  # value residual: the first layer's values, or these mixed with them
                v = self.first_values.mix(v, self.value_mix)
            if cache is not None:
                k, v = cache.update(layer, k, v)
            if self.kv_store is not None:
                self.kv_store.k, self.kv_store.v = k, v
        if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # autocast runs q in bf16; SDPA wants the bias in q's dtype
        dropout = self.dropout if self.training else 0.0
        if self.softcap is not None:
            y = self.explicit_attention(q, k, v, mask, dropout, self.softcap)
        else:
            vd = v.shape[-1]
            if self.sinks is not None:
                q, k, v, mask = sink_key(q, k, v, mask, cast(Tensor, self.sinks), self.scale)
            if cpu_attention.applies(q, k, v, mask, dropout):
                y = cpu_attention.matmul_attention(q, k, v, mask, self.scale)
            else:
                y = F.scaled_dot_product_attention(
                    q, k, v, attn_mask=mask, dropout_p=dropout, is_causal=mask is None and q.shape[2] > 1,
                    scale=self.scale, enable_gqa=self.n_kv_head != self.n_head,
                )  # fmt: skip
            y = y[:, :, y.shape[2] - T :, :vd]  # less sink_key's first query and padding, if any
        y = y.transpose(1, 2)  # [B, T, H, vd]
        if self.gate is not None:  # one gate per value dim, or per head (broadcast over its dims)
            y = y * self.gate_of(x, B, T)
        y = y.reshape(B, T, self.n_head * self.v_head_dim)
        return self.proj(y if self.sub_norm is None else self.sub_norm(y))

    def gate_of(self, x: Tensor, B: int, T: int) -> Tensor:
        """The output gate ``[B, T, H, 1 or vd]`` of the sublayer's input ``x``: sigmoid(gate(x)), or
        softplus(gate(x)) computed in float32 at least and cast back (Laguna's ``g_proj``); with
        ``gate_head_bias``, each head's bias added to its logits first (Beam's ``gate_bias``)."""
        g = cast(nn.Linear, self.gate)(x).view(B, T, self.n_head, -1)
        if self.gate_head_bias is not None:
            g = g + self.gate_head_bias.to(g.dtype).view(self.n_head, 1)
        if not self.softplus_gate:
            return torch.sigmoid(g)
        return F.softplus(g.to(torch.promote_types(g.dtype, torch.float32))).to(g.dtype)

    def scaled(self, q: Tensor, rotary: Optional[Rotation], cache: Optional[KVCache]) -> Tensor:
        """Queries ``[B, H, T, hd]`` times the query scale where ``query_scale_beta`` is set."""
        beta, every, offset, form = self.query_scale
        if beta is not None and self.query_scale_by == "position":  # each row's own (Ministral 3, Beam)
            assert rotary is not None and rotary.positions is not None, "RoPE or none hands attention the positions"
            return q * query_scales_at(rotary.positions, beta, every, offset, form).to(q.dtype)
        if beta is not None:  # by index, counted on from the cache (Llama 4's cache_position)
            start = cache.length if cache is not None else 0
            return q * query_scales(start, q.shape[2], beta, every, offset, q.device, form).to(q.dtype)
        return q

    @torch.no_grad()
    def score_stats(self, x, rotary=None, mask=None) -> Optional[ScoreStats]:  # typed as Mixer.score_stats
        """From the queries and keys the forward computes: QK-norm, RoPE, query scale, soft-cap, mask
        (window, chunk, padding, documents, ALiBi's bias) and sinks as the forward has them; None for a
        ``kv_shared`` layer, whose keys are another layer's."""
        if self.kv_shared:
            return None
        q, k, _ = (t.transpose(1, 2) for t in self.project(x, rotary))
        return scores_of(self.scaled(q, rotary, None), k, mask, self.scale, self.softcap, self.sinks)

    def explicit_attention(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout: float, softcap: float
    ) -> Tensor:
        """Attention with scores soft-capped to ``softcap·tanh(s / softcap)`` before masking (Gemma 2),
        sinks joining the softmax after it: explicit matmuls, as SDPA cannot cap its scores."""
        groups = self.n_head // self.n_kv_head
        if groups > 1:
            k, v = k.repeat_interleave(groups, dim=1), v.repeat_interleave(groups, dim=1)
        scores = torch.matmul(q, k.transpose(-2, -1)) * self.scale
        scores = torch.tanh(scores / softcap) * softcap
        mask = visible_keys(mask, q.shape[2], k.shape[2], q.device)
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
        if self.sinks is not None:  # one more logit per head and query, dropped after the softmax
            sinks = self.sinks.to(scores.dtype).view(1, -1, 1, 1).expand(*scores.shape[:-1], 1)
            scores = torch.cat((scores, sinks), dim=-1)
        weights = torch.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32))
        if self.sinks is not None:
            weights = weights[..., :-1]
        weights = F.dropout(weights.to(q.dtype), dropout)
        return torch.matmul(weights, v)

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The init of what no Linear holds (``Decoder.init_weights`` calls it): sinks N(0, std), as
        Hugging Face's gpt-oss."""
        if self.sinks is not None:
            nn.init.normal_(self.sinks, 0.0, std)
        if self.value_mix is not None:  # ResFormer's equal halves
            nn.init.constant_(self.value_mix, 0.5)
        if self.gate_head_bias is not None:  # Beam's zeros: the gates start at σ(W·x)
            nn.init.zeros_(self.gate_head_bias)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``attention.head_dim``, else d_model / n_head."""
        return split_head_dim(cfg)

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """q, k, v and output projections: d·((H + KV)·hd + KV·vd) + H·vd·d (vd = v_head_dim, else hd),
        plus the biases asked for, plus the QK-norms (per head: two norms of hd, or with a scale per head one
        of H·hd and one of KV·hd, as over the whole projection; l2: none), the gate (d·g, and g biases with
        qkv_bias; g = H·vd elementwise, H per head) and its H head biases, H sinks, the sub-norm (a norm over
        H·vd) and, after the first layer, the value residual's two weights. Clipping and the norm's order add
        none; v_from_k drops the values' KV·vd rows, kv_shared the keys' and values' rows and the key norm;
        v_norm has no weight."""
        a, d, hd, kv, vd = cfg.attention, cfg.d_model, cls.qk_head_dim(cfg), n_kv_head(cfg), v_head_dim(cfg)
        qkv_out = sum(projected_widths(cfg))
        params = d * qkv_out + a.qkv_bias * qkv_out + a.n_head * vd * d + a.out_bias * d
        gate = {"none": 0, "elementwise": a.n_head * vd, "head": a.n_head}[a.gate]
        params += (d + a.qkv_bias) * gate + a.sinks * a.n_head + 2 * (a.value_residual and layer > 0)
        params += a.gate_head_bias * a.n_head
        norm, norm_cfg = NORMS.get(cfg.norm.kind).num_params, qk_norm_config(cfg)
        if a.qk_norm == "head" and not a.qk_norm_per_head_scale:
            params += (2 - a.kv_shared) * norm(norm_cfg, hd)
        elif a.qk_norm in ("head", "full"):
            params += norm(norm_cfg, a.n_head * hd) + (0 if a.kv_shared else norm(norm_cfg, kv * hd))
        return params + (norm(cfg, a.n_head * vd) if a.sub_norm else 0)

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """Keys and values layer ``layer`` caches for one sequence of ``length`` tokens: KV·(hd + vd) per
        position kept (vd = v_head_dim, else hd: 2·KV·hd), every position in a global layer, at most the
        window (chunk) in a sliding (chunked) one; none in a ``kv_shared`` layer (the earlier layer's serve).
        Sinks and gates add nothing: a sink is a parameter, not a cached position."""
        if cfg.attention.kv_shared:
            return 0
        widths = CausalSelfAttention.qk_head_dim(cfg) + v_head_dim(cfg)
        return n_kv_head(cfg) * widths * positions_seen(cfg, length, layer)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Scores q·k and the weighted sum of values, forward and backward: 6·H·(hd + vd) per key a query
        sees (12·H·hd where vd = hd), T keys (PaLM, appendix B), or at most the window (chunk) in a sliding
        (chunked) layer. A gate's projection counts among the weights; a sink's one logit per head, the
        gate's product, the l2 norm and the query scale are elementwise, uncounted as the softmax and norms
        are."""
        widths = CausalSelfAttention.qk_head_dim(cfg) + v_head_dim(cfg)
        return 6 * cfg.attention.n_head * widths * positions_seen(cfg, seq_len, layer)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        validate_shared(cfg)
        if a.head_dim is None:
            if cfg.d_model % a.n_head:
                raise ConfigError(
                    "model.attention.n_head",
                    a.n_head,
                    f"a divisor of model.d_model={cfg.d_model}, or set model.attention.head_dim",
                )
        else:
            checks.positive("model.attention.head_dim", a.head_dim)
        if a.v_head_dim is not None:
            checks.integer("model.attention.v_head_dim", a.v_head_dim, 1, "a positive integer, or null (head_dim)")
        if a.n_kv_head is not None:
            checks.positive("model.attention.n_kv_head", a.n_kv_head)
            if a.n_head % a.n_kv_head:
                raise ConfigError(
                    "model.attention.n_kv_head",
                    a.n_kv_head,
                    f"a divisor of model.attention.n_head={a.n_head} (1 = MQA, n_head = MHA)",
                )
        if a.softcap is not None:
            checks.positive("model.attention.softcap", a.softcap, "a positive number, or null")
        if a.query_scale_beta is not None:
            checks.positive("model.attention.query_scale_beta", a.query_scale_beta, "a positive number, or null")
            checks.integer("model.attention.query_scale_length", a.query_scale_length, 1)
            checks.integer("model.attention.query_scale_offset", a.query_scale_offset, 0)
        if a.query_scale_by == "position" and (a.query_scale_beta is None or cfg.position.kind not in ("rope", "none")):
            raise ConfigError(
                "model.attention.query_scale_by",
                a.query_scale_by,
                "index unless query_scale_beta is set and model.position.kind is rope or none (which hand attention "
                "each row's positions)",
            )
        if a.gate_head_bias and a.gate == "none":
            raise ConfigError("model.attention.gate_head_bias", True, "false unless model.attention.gate is set")
        if a.v_from_k and a.v_head_dim not in (None, split_head_dim(cfg)):
            raise ConfigError(
                "model.attention.v_head_dim",
                a.v_head_dim,
                "null with model.attention.v_from_k=true (the values are the keys' projection, head_dim wide)",
            )
        if a.kv_shared and a.value_residual:
            raise ConfigError(
                "model.attention.kv_shared", True, "false with value_residual (a shared layer has no values to mix)"
            )
        if a.clip_qkv is not None:
            checks.positive("model.attention.clip_qkv", a.clip_qkv, "a positive number (OLMo 1: 8.0), or null")
        if a.qk_norm_after_rope and a.qk_norm not in ("head", "full"):
            raise ConfigError(
                "model.attention.qk_norm_after_rope",
                True,
                f"false unless model.attention.qk_norm is head or full (qk_norm={a.qk_norm}: "
                + ("l2 is after RoPE always)" if a.qk_norm == "l2" else "no QK-norm to move)"),
            )
        if a.qk_norm_bias is not None and a.qk_norm not in ("head", "full"):
            raise ConfigError(
                "model.attention.qk_norm_bias",
                a.qk_norm_bias,
                f"null unless model.attention.qk_norm is head or full (qk_norm={a.qk_norm}: no QK-norm with a shift)",
            )
        if a.qk_norm_bias is not None and cfg.norm.kind != "layernorm":
            raise ConfigError(
                "model.attention.qk_norm_bias",
                a.qk_norm_bias,
                f"null unless model.norm.kind is layernorm ({cfg.norm.kind} has no shift)",
            )
        if a.qk_norm_per_head_scale and a.qk_norm != "head":
            raise ConfigError(
                "model.attention.qk_norm_per_head_scale",
                True,
                f"false unless model.attention.qk_norm is head (qk_norm={a.qk_norm}: "
                + ("its scale spans every head already)" if a.qk_norm == "full" else "no per-head scale)"),
            )

    @staticmethod
    def validate_rotary(cfg: ModelConfig) -> None:
        """A whole head rotated (no ``rotary_dim`` / ``rotary_fraction``) is an even number of dims."""
        p, hd = cfg.position, CausalSelfAttention.qk_head_dim(cfg)
        if p.rotary_dim is None and p.rotary_fraction is None and hd % 2:
            raise ConfigError(
                "model.attention.head_dim",
                hd,
                "an even number for rope, which rotates pairs of dims (or rotate part of the head: "
                "model.position.rotary_dim / rotary_fraction)",
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``<H>q/<KV>kv x <head_dim>``, then the parts beyond plain attention: ``values x V``, ``window W``, ``chunk C``,
        ``clip qkv C``, ``l2 qk-norm``, ``qk-norm scale per head``, ``qk-norm after rope``, ``qk-norm bias B``,
        ``sinks``, ``<gate> gate``, ``query scale β``, ``value residual``, ``sub-norm``."""
        a = cfg.attention
        parts = [f"{a.n_head}q/{n_kv_head(cfg)}kv x {CausalSelfAttention.qk_head_dim(cfg)}"]
        parts += [f"values x {a.v_head_dim}"] if a.v_head_dim is not None else []
        parts += [f"window {a.window}"] if a.window is not None else []
        parts += [f"chunk {a.chunk}"] if a.chunk is not None else []
        parts += [f"clip qkv {a.clip_qkv}"] if a.clip_qkv is not None else []
        parts += ["l2 qk-norm"] if a.qk_norm == "l2" else []
        parts += ["qk-norm scale per head"] if a.qk_norm_per_head_scale else []
        parts += ["qk-norm after rope"] if a.qk_norm_after_rope else []
        parts += [f"qk-norm bias {str(a.qk_norm_bias).lower()}"] if a.qk_norm_bias is not None else []
        parts += ["sinks"] if a.sinks else []
        parts += (
            [f"{a.gate} {a.gate_activation} gate" + (" with head biases" * a.gate_head_bias)]
            if a.gate != "none"
            else []
        )
        parts += [f"query scale {a.query_scale_beta}"] if a.query_scale_beta is not None else []
        parts += ["value residual"] if a.value_residual else []
        parts += ["sub-norm"] if a.sub_norm else []
        parts += ["values = keys"] if a.v_from_k and not a.kv_shared else []
        parts += ["value norm"] if a.v_norm and not a.kv_shared else []
        parts += ["earlier layer's keys/values"] if a.kv_shared else []
        return ", ".join(parts)

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """All but multi-head latent attention's ranks and head parts; the query scale's length and
        offset where its beta is set."""
        scale = (
            {"query_scale_length", "query_scale_offset", "query_scale_by", "query_scale_form"}
            if cfg.attention.query_scale_beta is not None
            else set()
        )
        return frozenset(
            {"n_head", "n_kv_head", "head_dim", "v_head_dim", "qkv_bias", "out_bias", "dropout", "qk_norm", "scale"}
            | {"softcap", "window", "chunk", "sinks", "gate", "query_scale_beta", "clip_qkv", "value_residual"}
            | {"sub_norm"}
            | ({"kv_shared"} if cfg.attention.kv_shared else {"kv_shared", "v_from_k", "v_norm"})
            # refused by validate where they cannot apply
            | {"qk_norm_after_rope", "qk_norm_per_head_scale", "qk_norm_bias"}
            | scale
            | ({"gate_activation", "gate_head_bias"} if cfg.attention.gate != "none" else set())
        )


MIXERS.register("causal")(CausalSelfAttention)  # after the class: the name keeps its own type (ngpt's base)


def projected_widths(cfg: ModelConfig) -> tuple[int, int, int]:
    """The widths of the queries, keys and values the fused projection gives: H·hd, KV·hd and KV·vd, the
    values' 0 with ``v_from_k`` (the keys serve) and the keys' and values' 0 with ``kv_shared``."""
    a, hd, kv = cfg.attention, CausalSelfAttention.qk_head_dim(cfg), n_kv_head(cfg)
    keys = 0 if a.kv_shared else kv * hd
    values = 0 if a.kv_shared or a.v_from_k else kv * v_head_dim(cfg)
    return a.n_head * hd, keys, values


def qk_norm_config(cfg: ModelConfig) -> ModelConfig:
    """The config the QK-norms are built from: ``cfg``, its norm's bias replaced by
    ``attention.qk_norm_bias`` where that is set (StableLM 2's per-head LayerNorms have none while its
    other LayerNorms have one)."""
    bias = cfg.attention.qk_norm_bias
    if bias is None or bias == cfg.norm.bias:
        return cfg
    return dataclasses.replace(cfg, norm=dataclasses.replace(cfg.norm, bias=bias))


def validate_shared(cfg: ModelConfig) -> None:
    """The fields every attention kind reads alike: ``n_head``, ``dropout``, ``scale``, ``window`` and
    ``chunk``."""
    a = cfg.attention
    checks.positive("model.attention.n_head", a.n_head)
    checks.probability("model.attention.dropout", a.dropout)
    if a.scale is not None:
        checks.positive("model.attention.scale", a.scale, "a positive number, or null")
    if a.window is not None:
        checks.integer("model.attention.window", a.window, 1, "a positive integer (keys a query sees), or null")
    if a.chunk is not None:
        checks.integer("model.attention.chunk", a.chunk, 1, "a positive integer (positions per chunk), or null")
        if a.window is not None:
            raise ConfigError(
                "model.attention.chunk", a.chunk, "null when model.attention.window is set (one or the other)"
            )
