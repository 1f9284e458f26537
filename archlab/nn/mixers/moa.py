"""Mixture of attention heads, ``moa`` (Zhang et al. 2022, "Mixture of Attention Heads", arXiv:2210.05144;
JetMoE's ``JetMoeMoA``): a router picks for each token ``top_k`` of ``n_experts`` experts, each a query
projection into ``n_head`` heads of ``head_dim`` and an output projection back; every chosen expert's
queries attend over one set of keys and values all experts share (so the KV cache is causal attention's),
and the experts' outputs are summed, weighted by the softmax of the router's top-k logits, plus one bias.

Query head ``j`` of every chosen expert reads key/value head ``j`` (grouped as GQA's ``j·top_k + slot``).
The router's logits and weights are computed in float32 (float64 in a float64 model), as JetMoE's gating.
Dispatch is dropless and sorted by expert, as the MoE MLP's (``archlab/nn/moe.py``)."""

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
from archlab.nn.component import Role
from archlab.nn.mixers.base import MIXERS, Mixer, ScoreStats, positions_seen, scores_of, split_head_dim
from archlab.nn.positions import POSITIONS


@mixer_config("moa")
@dataclass
class MoAConfig(MixerConfig):
    """``model.attention`` with kind moa: n_head key/value heads of head_dim shared by ``n_experts`` query
    and output projections of n_head heads each, ``top_k`` of them per token, the output's bias, and the
    router's load-balancing loss weight."""

    kind: str = "moa"
    head_dim: Optional[int] = None  # None = d_model // n_head
    n_experts: int = 8  # query/output projection pairs per layer (JetMoE's num_local_experts)
    top_k: int = 2  # experts each token goes through (JetMoE's num_experts_per_tok)
    out_bias: bool = True  # one bias of d_model after the experts' weighted sum (JetMoE's)
    aux_loss_weight: float = 0.0  # weight of the router's load-balancing loss, moa_balance (JetMoE: 0.01)


@MIXERS.register("moa")
class MixtureOfAttention(Mixer):
    """``router`` [E, d], one fused key/value projection ``kv`` (keys, then values), the experts' stacked
    query matrices ``q_experts`` [E, H·hd, d] and output matrices ``o_experts`` [E, d, H·hd] (Hugging Face's
    ``[E, out, in]``), the output ``bias``. In training it keeps ``moa_balance`` (the Switch Transformer
    load-balancing loss, as the MoE MLP's ``moe_balance``) in ``aux_losses`` where its weight is not zero."""

    bias: Optional[Tensor]  # the output's, or None
    aux_losses: dict[str, tuple[float, Tensor]]  # name -> (weight, loss) of the latest training forward

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.n_head, self.head_dim, self.n_experts, self.top_k = a.n_head, self.qk_head_dim(cfg), a.n_experts, a.top_k
        self.scale = POSITIONS.get(cfg.position.kind).softmax_factor(cfg) / math.sqrt(self.head_dim)
        width = self.n_head * self.head_dim
        self.router = nn.Linear(d, a.n_experts, bias=False)
        self.kv = nn.Linear(d, 2 * width, bias=False)
        self.q_experts = nn.Parameter(torch.empty(a.n_experts, width, d))
        self.o_experts = nn.Parameter(torch.empty(a.n_experts, d, width))
        self.bias = nn.Parameter(torch.empty(d)) if a.out_bias else None
        self.aux_weight = a.aux_loss_weight
        self.aux_losses = {}

    def param_roles(self) -> dict[str, Role]:
        return {
            "router.weight": Role.OUTPUT,
            "kv.weight": Role.HIDDEN,
            "q_experts": Role.HIDDEN,
            "o_experts": Role.HIDDEN,
            "bias": Role.VECTOR,
        }

    def route(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Router logits [N, E], weights [N, k] (softmax of the top-k logits) and experts [N, k] of ``x``
        [N, d], in float32 at least."""
        dtype = torch.promote_types(x.dtype, torch.float32)
        with torch.autocast(x.device.type, enabled=False):
            logits = F.linear(x.to(dtype), self.router.weight.to(dtype))
        top, indices = logits.topk(self.top_k, dim=-1)
        return logits, top.softmax(dim=-1), indices

    @staticmethod
    def through(rows: Tensor, weights: Tensor, order: Tensor, counts: list[int]) -> Tensor:
        """Rows [N·k, in] in (token, slot) order, each through its expert's matrix of ``weights`` [E, out, in]
        (``order`` sorts them by expert, ``counts`` per expert), back in (token, slot) order."""
        sorted_rows, outs = rows[order], []
        for e, group in enumerate(sorted_rows.split(counts)):
            if counts[e]:
                outs.append(F.linear(group, weights[e]))
        out = torch.cat(outs)
        return torch.empty_like(out).index_copy_(0, order, out)

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, d = x.shape
        H, hd, k = self.n_head, self.head_dim, self.top_k
        flat = x.reshape(-1, d)
        logits, weights, indices = self.route(flat)
        self.aux_losses = self.auxiliary(logits, indices) if self.training else {}
        assignments = indices.flatten()
        order = assignments.argsort(stable=True)
        counts = torch.bincount(assignments, minlength=self.n_experts).tolist()
        q, keys, values = self.project(x, flat, order, counts, rotary)
        if cache is not None:
            keys, values = cache.update(layer, keys, values)
        if mask is not None and mask.is_floating_point() and mask.dtype != q.dtype:
            mask = mask.to(q.dtype)  # autocast runs q in bf16; SDPA wants the bias in q's dtype
        if mask is not None and mask.dim() >= 3 and mask.shape[-3] == H and H > 1:
            mask = mask.repeat_interleave(k, dim=-3)  # a per-head bias (ALiBi's): head j's for every expert's head j
        y = F.scaled_dot_product_attention(
            q, keys, values, attn_mask=mask, is_causal=mask is None and T > 1, scale=self.scale,
            enable_gqa=k > 1,
        )  # fmt: skip
        y = y.view(B, H, k, T, hd).permute(0, 3, 2, 1, 4).reshape(B * T * k, H * hd)  # (token, slot) rows
        out = self.through(y, self.o_experts, order, counts).view(B * T, k, d)
        out = (out * weights.unsqueeze(-1).to(out.dtype)).sum(dim=1)
        if self.bias is not None:
            out = out + self.bias
        return out.view(B, T, d)

    def project(
        self, x: Tensor, flat: Tensor, order: Tensor, counts: list[int], rotary=None
    ) -> tuple[Tensor, Tensor, Tensor]:
        """Queries [B, H·k, T, hd] (head ``j·k + slot``: the chosen experts' head j), keys and values
        [B, H, T, hd], rotated where a rotary scheme is given."""
        B, T, d = x.shape
        H, hd, k = self.n_head, self.head_dim, self.top_k
        q = self.through(flat.repeat_interleave(k, dim=0), self.q_experts, order, counts).view(B, T, k * H, hd)
        keys, values = self.kv(x).view(B, T, 2 * H, hd).chunk(2, dim=2)
        if rotary is not None:
            q, keys = rotary.rotate(q), rotary.rotate(keys)
        q = q.view(B, T, k, H, hd).permute(0, 3, 2, 1, 4).reshape(B, H * k, T, hd)
        return q, keys.transpose(1, 2), values.transpose(1, 2)

    def auxiliary(self, logits: Tensor, indices: Tensor) -> dict[str, tuple[float, Tensor]]:
        """``moa_balance``, E·Σ_i f_i·P_i (f_i: the fraction of tokens with expert i among their top-k, P_i:
        its mean softmax probability), where its weight is not zero."""
        if self.aux_weight <= 0:
            return {}
        probs = logits.softmax(dim=-1)
        chose = torch.zeros_like(probs).scatter_(-1, indices, 1.0).mean(dim=0)
        return {"moa_balance": (self.aux_weight, self.n_experts * (chose * probs.mean(dim=0)).sum())}

    @torch.no_grad()
    def score_stats(self, x, rotary=None, mask=None) -> Optional[ScoreStats]:  # typed as Mixer.score_stats
        """Of the chosen experts' queries over the shared keys, as the forward computes them."""
        flat = x.reshape(-1, x.shape[-1])
        assignments = self.route(flat)[2].flatten()
        order = assignments.argsort(stable=True)
        counts = torch.bincount(assignments, minlength=self.n_experts).tolist()
        q, keys, _ = self.project(x, flat, order, counts, rotary)
        return scores_of(q, keys, mask, self.scale)

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The stacked experts (no Linear holds them): queries N(0, std), outputs N(0, residual_std) as a
        projection into the residual stream; the bias zero."""
        nn.init.normal_(self.q_experts, 0.0, std)
        nn.init.normal_(self.o_experts, 0.0, residual_std)
        if self.bias is not None:
            nn.init.zeros_(self.bias)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``attention.head_dim``, else d_model / n_head."""
        return split_head_dim(cfg)

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """The router d·E, keys and values 2·d·H·hd, E experts' query and output matrices 2·E·d·H·hd, the
        bias d."""
        a, d = cfg.attention, cfg.d_model
        width = a.n_head * cls.qk_head_dim(cfg)
        return d * a.n_experts + 2 * d * width * (1 + a.n_experts) + a.out_bias * d

    @classmethod
    def active_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """Those one token goes through: top_k experts' matrices of the E."""
        a, d = cfg.attention, cfg.d_model
        width = a.n_head * cls.qk_head_dim(cfg)
        return d * a.n_experts + 2 * d * width * (1 + a.top_k) + a.out_bias * d

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """Keys and values, 2·H·hd per position: the experts share them."""
        hd = MixtureOfAttention.qk_head_dim(cfg)
        return 2 * cfg.attention.n_head * hd * positions_seen(cfg, length, layer)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """Scores and the weighted sum of values for top_k·H query heads, forward and backward: 12·k·H·hd per
        key a query sees."""
        a = cfg.attention
        hd = MixtureOfAttention.qk_head_dim(cfg)
        return 12 * a.top_k * a.n_head * hd * positions_seen(cfg, seq_len, layer)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 1)
        if a.head_dim is None and cfg.d_model % a.n_head:
            raise ConfigError(
                "model.attention.n_head", a.n_head, f"a divisor of model.d_model={cfg.d_model}, or set head_dim"
            )
        if a.head_dim is not None:
            checks.integer("model.attention.head_dim", a.head_dim, 1, "a positive integer, or null")
        checks.integer("model.attention.n_experts", a.n_experts, 1)
        if not isinstance(a.top_k, int) or not 1 <= a.top_k <= a.n_experts:
            raise ConfigError(
                "model.attention.top_k", a.top_k, f"an integer from 1 to model.attention.n_experts={a.n_experts}"
            )
        checks.non_negative("model.attention.aux_loss_weight", a.aux_loss_weight)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``moa <k> of <E> experts, <H> heads x <head_dim>``."""
        a = cfg.attention
        return f"moa {a.top_k} of {a.n_experts} experts, {a.n_head} heads x {MixtureOfAttention.qk_head_dim(cfg)}"
