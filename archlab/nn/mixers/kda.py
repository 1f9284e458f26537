"""Kimi Delta Attention, ``kda`` (Kimi Team 2025, *Kimi Linear*, arXiv:2510.26692), as Kimi-Linear uses it:
Gated DeltaNet's memory with a decay per key channel instead of one per head, so each head forgets each
key direction at its own rate; its decoding state is one ``head_dim × head_dim`` matrix per head.

Per head and token (``k_t``, ``q_t`` L2-normed, ``q_t`` scaled by 1/sqrt(head_dim)):
``S_t = D_t·S_{t−1} + k_t·u_tᵀ`` with ``D_t = diag(exp(g_t))``, ``u_t = β_t·(v_t − (D_t·S_{t−1})ᵀ·k_t)``, output
``o_t = S_tᵀ·q_t``; ``g_t = −exp(A_log)·softplus(f_b(f_a(x_t)) + dt_bias)`` per channel, ``β_t = sigmoid(b_t)``.
Training and prefill run the chunked form (``ops/kda_rule.chunked_kda_rule``), decoding the recurrence
(``recurrent_kda_rule``); both in float32 (float64 in a float64 model)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.mamba2 import check_dt_init, drawn_dt_bias
from archlab.nn.mixers.ops.conv import causal_conv
from archlab.nn.mixers.ops.delta_rule import l2_normalise
from archlab.nn.mixers.ops.kda_rule import chunked_kda_rule, recurrent_kda_rule


@mixer_config("kda")
@dataclass
class KDAConfig(MixerConfig):
    """``model.attention`` with kind kda (Kimi-Linear's linear layers): n_head heads of head_dim queries, keys
    and values (each a head_dim x head_dim state), through a short causal convolution; a low-rank decay per
    key channel and a low-rank sigmoid output gate."""

    kind: str = "kda"
    head_dim: int = 128  # query, key and value dims per head (transformers' linear_head_dim)
    gate_rank: Optional[int] = None  # rank of the decay's and output gate's factorisation; None = head_dim; 0 = full
    # the decay from its input u = f(x) + dt_bias: softplus, −exp(A_log)·softplus(u) (Kimi-Linear); bounded,
    # decay_lower_bound·sigmoid(exp(A_log)·u), in (decay_lower_bound, 0) (Bailing's kda_safe_gate)
    decay: str = "softplus"
    decay_lower_bound: float = -5.0  # bounded's least log-decay per position (Bailing's kda_lower_bound)
    conv_kernel: int = 4  # width of the causal depthwise convolution of q, k and v
    scan_chunk: int = 64  # positions per chunk of the parallel form (speed and memory only)
    dt_min: float = 0.001  # init: softplus(dt_bias) log-uniform in [dt_min, dt_max], floored (as fla's KDA)
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4


def gate_rank(cfg: ModelConfig) -> int:
    """The rank of the decay's and output gate's factorisation: ``gate_rank``, else ``head_dim``; 0: none,
    each a full d_model x n_head·head_dim projection."""
    a = cfg.attention
    return a.gate_rank if a.gate_rank is not None else a.head_dim


def gate_inputs(cfg: ModelConfig) -> int:
    """The in-projection's rows for each of the decay and the output gate: the rank, or n_head·head_dim."""
    return gate_rank(cfg) or cfg.attention.n_head * cfg.attention.head_dim


@MIXERS.register("kda")
class KimiDeltaAttention(Mixer):
    """One bias-free in-projection to q, k, v (through a causal depthwise convolution of ``conv_kernel``
    and SiLU), the decay's and output gate's low-rank inputs and β's input b; the decay's up-projection
    ``f_b`` (plus ``dt_bias``, one per key channel) and the gate's ``g_b`` (at gate rank 0 none: the
    in-projection gives both whole, as Bailing's f_proj and g_proj); the rule over ``n_head`` states;
    an RMSNorm of each head's output with one ``head_dim`` scale, times sigmoid(gate); the output projection.
    No position reaches it (Kimi-Linear's MLA layers take none either). Its ``mask`` (``Tokens``): padded
    positions enter the convolution as zeros and neither decay nor write the state; a packed document's
    first position starts from an empty state and convolution window. The KV cache keeps, per such layer,
    the last ``conv_kernel − 1`` convolution inputs ``[B, 3·n_head·head_dim, conv_kernel − 1]`` and the
    states ``[B, n_head, head_dim, head_dim]``."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.n_head, self.head_dim, self.rank = a.n_head, a.head_dim, gate_inputs(cfg)
        self.scan_chunk, self.bound = a.scan_chunk, a.decay_lower_bound if a.decay == "bounded" else None
        width = a.n_head * a.head_dim
        self.in_proj = nn.Linear(d, 3 * width + 2 * self.rank + a.n_head, bias=False)  # q, k, v, f_a, g_a, b
        self.conv_weight = nn.Parameter(torch.empty(3 * width, a.conv_kernel))
        low_rank = gate_rank(cfg) > 0  # else in_proj's f_a and g_a rows are the decay's and gate's inputs
        self.f_b = nn.Linear(self.rank, width, bias=False) if low_rank else nn.Identity()
        self.g_b = nn.Linear(self.rank, width, bias=False) if low_rank else nn.Identity()
        self.A_log = nn.Parameter(torch.empty(a.n_head))
        self.dt_bias = nn.Parameter(torch.empty(width))
        self.norm_weight = nn.Parameter(torch.empty(a.head_dim))
        self.norm_eps = cfg.norm.eps
        self.dt_init = (a.dt_min, a.dt_max, a.dt_init_floor)
        self.proj = residual_projection(nn.Linear(width, d, bias=False))

    def param_roles(self) -> dict[str, Role]:
        # the low-rank factors too (where the gates have them): their rank is a width a sweep grows, as mla's
        factors = [f"{n}.weight" for n in ("f_b", "g_b") if isinstance(getattr(self, n), nn.Linear)]
        hidden = ("in_proj.weight", "proj.weight", *factors)
        per_channel = ("conv_weight", "A_log", "dt_bias", "norm_weight")
        return {**{n: Role.HIDDEN for n in hidden}, **{n: Role.VECTOR for n in per_channel}}

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, _ = x.shape
        f = torch.promote_types(x.dtype, torch.float32)  # the scan's dtype: float32, or a float64 model's own
        H, dk, r = self.n_head, self.head_dim, self.rank
        present, starts = mask or Tokens()
        mixed, f_a, g_a, b = self.in_proj(x).split((3 * H * dk, r, r, H), dim=-1)
        if present is not None:
            mixed = mixed * present[..., None].to(mixed.dtype)
        mixed = causal_conv(mixed.transpose(1, 2), self.conv_weight[:, None], None, cache, layer, starts)
        q, k, v = F.silu(mixed).transpose(1, 2).to(f).unflatten(-1, (3 * H, dk)).split(H, dim=2)
        q, k = l2_normalise(q) * dk**-0.5, l2_normalise(k)
        beta = torch.sigmoid(b.to(f))
        u, A = (self.f_b(f_a).to(f) + self.dt_bias.to(f)).unflatten(-1, (H, dk)), self.A_log.to(f).exp()[:, None]
        g = -A * F.softplus(u) if self.bound is None else self.bound * torch.sigmoid(A * u)
        if present is not None:  # a padded position keeps the state as it is: no decay (g = 0), no write
            beta, g = beta * present[..., None], g * present[..., None, None]
        q, k, v, beta, g = (t.transpose(1, 2) for t in (q, k, v, beta, g))  # heads first
        state = None if cache is None else cache.recurrent_state[layer]
        state = None if state is None else state.to(f)
        if T == 1:
            o, state = recurrent_kda_rule(q, k, v, g, beta, state)  # one position: no document starts within it
        else:
            o, state = chunked_kda_rule(q, k, v, g, beta, self.scan_chunk, state, starts)
        if cache is not None:
            cache.recurrent_state[layer] = state.to(cache.dtype or state.dtype)
        o = o.transpose(1, 2)  # [B, T, H, dk]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.norm_weight.to(f)
        o = o * torch.sigmoid(self.g_b(g_a).to(f).unflatten(-1, (H, dk)))
        return self.proj(o.to(x.dtype).flatten(2))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """What no Linear holds (``Decoder.init_weights`` calls it), as transformers' Kimi-Linear (after
        flash-linear-attention) initialises it: the convolution N(0, std), A_log the log of U(1, 16), dt_bias
        softplus⁻¹ of a dt log-uniform in [dt_min, dt_max] per channel (Mamba-2's draw), the norm's scale 1."""
        nn.init.normal_(self.conv_weight, 0.0, std)
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(1, 16).log())
        self.dt_bias.copy_(drawn_dt_bias(self.dt_bias.numel(), *self.dt_init, self.dt_bias.device))
        nn.init.ones_(self.norm_weight)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``attention.head_dim``: what a query and a key multiply over."""
        return cfg.attention.head_dim

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """With W = n_head·head_dim and rank r: the in-projection d·(3W + 2r + H), the convolution 3W·K, f_b
        and g_b r·W each, dt_bias W, A_log H, the gated norm's scale head_dim, the output W·d (no biases);
        at rank 0 the in-projection d·(3W + 2W + H) and no f_b, g_b."""
        a, d, H = cfg.attention, cfg.d_model, cfg.attention.n_head
        W, r = H * a.head_dim, gate_rank(cfg)
        gates = 2 * d * r + 2 * r * W if r else 2 * d * W
        return d * (3 * W + H) + gates + 3 * W * a.conv_kernel + W + H + a.head_dim + W * d

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: the last conv_kernel − 1 inputs of the 3·n_head·head_dim
        convolution channels and n_head states of head_dim × head_dim."""
        a = cfg.attention
        return 3 * a.n_head * a.head_dim * (a.conv_kernel - 1) + a.n_head * a.head_dim**2

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The recurrence's cost per token, at any length, as gated_deltanet's: three products with each
        head's dk × dv state (read by the key, written along it, read by the query), 2·dk·dv FLOPs each,
        forward and backward: 18·H·dk·dv (dk = dv = head_dim). The per-channel decay's elementwise work and
        the chunked form's within-chunk products, ways of computing the same recurrence, are not counted."""
        a = cfg.attention
        return 18 * a.n_head * a.head_dim**2

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 1, "a positive integer (heads, one state each)")
        for name in ("head_dim", "conv_kernel", "scan_chunk"):
            checks.integer(f"model.attention.{name}", getattr(a, name), 1)
        if a.gate_rank is not None:
            checks.integer("model.attention.gate_rank", a.gate_rank, 0, "an integer >= 0 (0: full rank), or null")
        checks.choice("model.attention.decay", a.decay, ("softplus", "bounded"))
        if a.decay == "bounded" and not -math.inf < a.decay_lower_bound < 0:
            raise ConfigError("model.attention.decay_lower_bound", a.decay_lower_bound, "a finite number < 0")
        check_dt_init(a)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``kda <H> x <head_dim>, gate rank <r>, conv <K>``."""
        a = cfg.attention
        return f"kda {a.n_head} x {a.head_dim}, gate rank {gate_rank(cfg)}, conv {a.conv_kernel}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Every field of its config; decay_lower_bound where the decay is bounded."""
        bound = {"decay_lower_bound"} if cfg.attention.decay == "bounded" else set()
        return frozenset(
            {"n_head", "head_dim", "gate_rank", "decay", "conv_kernel", "scan_chunk", "dt_min", "dt_max"}
            | {"dt_init_floor"}
            | bound
        )
