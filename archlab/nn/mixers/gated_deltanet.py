"""Gated DeltaNet, ``gated_deltanet`` (Yang, Kautz and Hatamizadeh 2024, arXiv:2412.06464), as Qwen3-Next
uses it: a token mixer in attention's slot whose memory is one ``key_head_dim × v_head_dim`` state per
head, decayed and corrected by the gated delta rule, so its decoding state is constant in the context.

Per head ``h`` and token ``t`` (``k_t``, ``q_t`` L2-normed, ``q_t`` scaled by 1/sqrt(key_head_dim)):
``S_t = α_t·S_{t−1} + k_t·u_tᵀ`` with ``u_t = β_t·(v_t − α_t·S_{t−1}ᵀ·k_t)``, output ``o_t = S_tᵀ·q_t``;
``α_t = exp(g_t)``, ``g_t = −exp(A_log)·softplus(a_t + dt_bias)``, ``β_t = sigmoid(b_t)`` (``2·sigmoid(b_t)``
with ``allow_neg_eigval``: the transition ``α_t·(I − β_t·k_t·k_tᵀ)`` then has an eigenvalue in (−α_t, α_t] along
``k_t``, a reflection the (0, 1) range cannot make; Grazzi et al. 2024, arXiv:2411.12537). Training and
prefill run the chunked parallel form (``chunked_delta_rule``; on a GPU flash-linear-attention's kernel
where installed, nn/mixers/ops/kernels.py), decoding the recurrence itself (``recurrent_delta_rule``); both in
float32 (float64 in a float64 model)."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.mamba2 import check_dt_init, drawn_dt_bias
from archlab.nn.mixers.ops import kernels
from archlab.nn.mixers.ops.conv import causal_conv
from archlab.nn.mixers.ops.delta_rule import chunked_delta_rule, l2_normalise, recurrent_delta_rule


@mixer_config("gated_deltanet")
@dataclass
class GatedDeltaNetConfig(MixerConfig):
    """``model.attention`` with kind gated_deltanet (Qwen3-Next's linear layers): n_head value heads, each a
    key_head_dim x v_head_dim state read and written by the gated delta rule; q, k and v pass a short causal
    convolution first."""

    kind: str = "gated_deltanet"
    key_heads: Optional[int] = None  # query/key heads, each serving n_head/key_heads; None = n_head
    key_head_dim: int = 128  # query/key dims per head
    v_head_dim: int = 128  # value dims per head
    conv_kernel: int = 4  # width of the causal depthwise convolution of q, k and v
    scan_chunk: int = 64  # positions per chunk of the parallel form (speed and memory only)
    # init: dt_bias starts at this value (1.0: transformers' Qwen3-Next); None: softplus⁻¹ of a dt drawn as
    # mamba2's (dt_min, dt_max, dt_init_floor), as flash-linear-attention's GatedDeltaNet
    dt_bias_init: Optional[float] = 1.0
    dt_min: float = 0.001  # init, where dt_bias_init is None: dt log-uniform in [dt_min, dt_max], floored
    dt_max: float = 0.1
    dt_init_floor: float = 1e-4
    allow_neg_eigval: bool = False  # β = 2·sigmoid(b) in (0, 2), not (0, 1) (OLMo Hybrid's linear_allow_neg_eigval)
    norm_eps: Optional[float] = None  # the output norm's epsilon; None = model.norm.eps (OLMo Hybrid: 1e-5, fixed)
    output_gate: str = choice("silu", "sigmoid")  # the normed output times act(z) (Qwen4-Exp's output_gate_type)


def key_heads(cfg: ModelConfig) -> int:
    """Query/key heads: ``attention.key_heads``, else ``n_head`` (one per value head)."""
    a = cfg.attention
    return a.key_heads if a.key_heads is not None else a.n_head


def conv_channels(cfg: ModelConfig) -> int:
    """Channels of the short convolution: queries, keys and values, 2·key_heads·key_head_dim + n_head·v_head_dim."""
    a = cfg.attention
    return 2 * key_heads(cfg) * a.key_head_dim + a.n_head * a.v_head_dim


@MIXERS.register("gated_deltanet")
class GatedDeltaNet(Mixer):
    """One bias-free in-projection to q, k, v (through a causal depthwise convolution of ``conv_kernel``
    and SiLU), the output gate z and each head's β and decay inputs b and a; the gated delta rule over
    ``n_head`` states (each query/key head serving ``n_head / key_heads`` consecutive value heads); an
    RMSNorm of each head's output with one ``v_head_dim`` scale, times silu(z) (``norm(o)·silu(z)``; σ(z) with
    ``output_gate: sigmoid``, Qwen4-Exp's); the
    output projection. No position reaches it: a rotary scheme's rotation is left unused and a score
    bias never computed for its layers (Qwen3-Next's linear layers take none beside its RoPE attention),
    the recurrence itself ordering the tokens. Its ``mask`` (``Tokens``): padded positions enter the
    convolution as zeros and neither decay nor write the state, so a left-padded row computes what it
    would alone; a packed document's first position starts from an empty state and convolution window. The KV cache keeps, per such layer, the
    last ``conv_kernel − 1`` convolution inputs ``[B, channels, conv_kernel − 1]`` and the states
    ``[B, n_head, key_head_dim, v_head_dim]``."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.n_head, self.key_heads = a.n_head, key_heads(cfg)
        self.key_dim, self.value_dim, self.kernel, self.scan_chunk = (
            a.key_head_dim,
            a.v_head_dim,
            a.conv_kernel,
            a.scan_chunk,
        )
        self.channels = conv_channels(cfg)
        self.in_proj = nn.Linear(d, self.channels + a.n_head * a.v_head_dim + 2 * a.n_head, bias=False)
        self.conv_weight = nn.Parameter(torch.empty(self.channels, a.conv_kernel))
        self.A_log = nn.Parameter(torch.empty(a.n_head))
        self.dt_bias = nn.Parameter(torch.empty(a.n_head))
        self.norm_weight = nn.Parameter(torch.empty(a.v_head_dim))
        self.norm_eps = cfg.norm.eps if a.norm_eps is None else a.norm_eps
        self.dt_init = (a.dt_bias_init, a.dt_min, a.dt_max, a.dt_init_floor)
        self.beta_scale = 2.0 if a.allow_neg_eigval else 1.0
        self.gate = torch.sigmoid if a.output_gate == "sigmoid" else F.silu
        self.proj = residual_projection(nn.Linear(a.n_head * a.v_head_dim, d, bias=False))

    def param_roles(self) -> dict[str, Role]:
        # in_proj also holds the per-head decay and write-strength rows (outputs by shape): one matrix, one
        # rule; under Adam the two rules share the learning rate and differ in the init only
        per_channel = ("conv_weight", "A_log", "dt_bias", "norm_weight")
        return {"in_proj.weight": Role.HIDDEN, "proj.weight": Role.HIDDEN, **{n: Role.VECTOR for n in per_channel}}

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        B, T, _ = x.shape
        f = torch.promote_types(x.dtype, torch.float32)  # the scan's dtype: float32, or a float64 model's own
        H, Hk, dk, dv = self.n_head, self.key_heads, self.key_dim, self.value_dim
        present, starts = mask or Tokens()
        mixed, z, b, a = self.in_proj(x).split((self.channels, H * dv, H, H), dim=-1)
        if present is not None:
            mixed = mixed * present[..., None].to(mixed.dtype)
        mixed = causal_conv(mixed.transpose(1, 2), self.conv_weight[:, None], None, cache, layer, starts)
        mixed = F.silu(mixed).transpose(1, 2)
        q, k, v = mixed.to(f).split((Hk * dk, Hk * dk, H * dv), dim=-1)
        q = l2_normalise(q.unflatten(-1, (Hk, dk))) * dk**-0.5
        k = l2_normalise(k.unflatten(-1, (Hk, dk)))
        if Hk != H:  # each query/key head serves H / Hk consecutive value heads
            q, k = q.repeat_interleave(H // Hk, dim=2), k.repeat_interleave(H // Hk, dim=2)
        v = v.unflatten(-1, (H, dv))
        beta = torch.sigmoid(b.to(f)) * self.beta_scale
        g = -self.A_log.to(f).exp() * F.softplus(a.to(f) + self.dt_bias.to(f))
        if present is not None:  # a padded position keeps the state as it is: no decay (g = 0), no write
            beta, g = beta * present[..., None], g * present[..., None]
        q, k, v, beta, g = (t.transpose(1, 2) for t in (q, k, v, beta, g))  # heads first
        state = None if cache is None else cache.recurrent_state[layer]
        state = None if state is None else state.to(f)
        if T == 1:
            o, state = recurrent_delta_rule(q, k, v, g, beta, state)  # one position: no document starts within it
        elif kernels.delta_rule_applies(q) and starts is None:
            o, state = kernels.delta_rule(q, k, v, g, beta, state)
        else:
            o, state = chunked_delta_rule(q, k, v, g, beta, self.scan_chunk, state, starts)
        if cache is not None:
            cache.recurrent_state[layer] = state.to(cache.dtype or state.dtype)
        o = o.transpose(1, 2)  # [B, T, H, dv]
        o = o * torch.rsqrt(o.pow(2).mean(-1, keepdim=True) + self.norm_eps) * self.norm_weight.to(f)
        o = o * self.gate(z.to(f).unflatten(-1, (H, dv)))
        return self.proj(o.to(x.dtype).flatten(2))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """What no Linear holds (``Decoder.init_weights`` calls it), as Qwen3-Next initialises it: the
        convolution N(0, std), dt_bias ``dt_bias_init`` (transformers' 1) or, where that is None, drawn as
        Mamba-2's (flash-linear-attention's GatedDeltaNet), A_log the log of U(0.01, 16), the norm's scale 1.
        With dt_bias 1 a head of A = 16 keeps exp(−16·softplus(1)) ≈ 1e-9 of its state per token at a = 0."""
        nn.init.normal_(self.conv_weight, 0.0, std)
        start, dt_min, dt_max, floor = self.dt_init
        if start is None:
            self.dt_bias.copy_(drawn_dt_bias(self.n_head, dt_min, dt_max, floor, self.dt_bias.device))
        else:
            nn.init.constant_(self.dt_bias, start)
        self.A_log.copy_(torch.empty_like(self.A_log).uniform_(0.01, 16).log())
        nn.init.ones_(self.norm_weight)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``attention.key_head_dim``: what a query and a key multiply over."""
        return cfg.attention.key_head_dim

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """In-projection d·(2·Hk·dk + 2·H·dv + 2·H) (q, k, v, z, b, a), the convolution (2·Hk·dk + H·dv)·K,
        A_log and dt_bias H each, the gated norm's scale dv, the output projection H·dv·d (no biases)."""
        a, d, H = cfg.attention, cfg.d_model, cfg.attention.n_head
        channels = conv_channels(cfg)
        in_proj = d * (channels + H * a.v_head_dim + 2 * H)
        return in_proj + channels * a.conv_kernel + 2 * H + a.v_head_dim + H * a.v_head_dim * d

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: the last conv_kernel − 1 convolution inputs of every channel and
        n_head states of key_head_dim × v_head_dim."""
        a = cfg.attention
        return conv_channels(cfg) * (a.conv_kernel - 1) + a.n_head * a.key_head_dim * a.v_head_dim

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The recurrence's cost per token, at any length: three products with each head's dk × dv state
        (read by the key, written along it, read by the query), 2·dk·dv FLOPs each, forward and backward:
        18·H·dk·dv. The convolution's weights count among the parameters; the chunked form's work within
        a chunk, a way of computing the same recurrence, is not counted."""
        a = cfg.attention
        return 18 * a.n_head * a.key_head_dim * a.v_head_dim

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 1, "a positive integer (value heads, one state each)")
        if a.key_heads is not None:
            checks.integer("model.attention.key_heads", a.key_heads, 1, "a positive integer, or null (n_head)")
            if a.n_head % a.key_heads:
                raise ConfigError(
                    "model.attention.key_heads",
                    a.key_heads,
                    f"a divisor of model.attention.n_head={a.n_head} (each query/key head serves n_head/key_heads)",
                )
        for name in ("key_head_dim", "v_head_dim", "conv_kernel", "scan_chunk"):
            checks.integer(f"model.attention.{name}", getattr(a, name), 1)
        checks.choice("model.attention.allow_neg_eigval", a.allow_neg_eigval, (True, False))
        checks.choice("model.attention.output_gate", a.output_gate, ("silu", "sigmoid"))
        if a.norm_eps is not None:
            checks.positive("model.attention.norm_eps", a.norm_eps)
        if a.dt_bias_init is None:
            check_dt_init(a)
        elif math.isnan(checks.finite(a.dt_bias_init)):
            raise ConfigError(
                "model.attention.dt_bias_init", a.dt_bias_init, "a number, or null (drawn as mamba2's dt)"
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``gated_deltanet <H>v/<Hk>qk x (<dk> k, <dv> v), conv <K>`` (``, β in (0, 2)`` with allow_neg_eigval)."""
        a = cfg.attention
        sizes = f"{a.n_head}v/{key_heads(cfg)}qk x ({a.key_head_dim} k, {a.v_head_dim} v), conv {a.conv_kernel}"
        return (
            f"gated_deltanet {sizes}" + ", β in (0, 2)" * a.allow_neg_eigval + ", σ gate" * (a.output_gate == "sigmoid")
        )

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its heads and sizes, its convolution and scan, β's range, its dt_bias init; the dt draw's fields where
        it draws."""
        drawn = {"dt_min", "dt_max", "dt_init_floor"} if cfg.attention.dt_bias_init is None else set()
        own = {"n_head", "key_heads", "key_head_dim", "v_head_dim", "conv_kernel", "scan_chunk", "dt_bias_init"}
        return frozenset(own | {"allow_neg_eigval", "norm_eps", "output_gate"} | drawn)
