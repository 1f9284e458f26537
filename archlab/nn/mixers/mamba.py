"""Mamba-1, ``mamba`` (Gu and Dao 2023, *Mamba: Linear-Time Sequence Modeling with Selective State Spaces*,
arXiv:2312.00752), as MambaForCausalLM, FalconMamba and Jamba use it: a token mixer whose memory is a
``state_size`` state per inner channel, each decayed at its own rate ``A`` and written along an
input-dependent B, so its decoding state is constant in the context.

Per inner channel ``c``, state dim ``n`` and token ``t``: ``h_t = exp(Δ_t,c·A_c,n)·h_{t−1} + Δ_t,c·B_t,n·x_t,c``,
``y_t,c = Σ_n h_t,n·C_t,n + D_c·x_t,c``, with ``Δ = softplus(dt_proj(dt_low) + bias)`` and ``A = −exp(A_log)``
(FalconMamba: dt_low, B and C RMS-normed without a scale first; Jamba: each norm with a learned scale). The
scan (nn/mixers/ops/selective_scan.py) runs position by position on the CPU and in decoding, as a chunked
parallel scan elsewhere; in float32 (float64 in a float64 model)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.mamba2 import check_dt_init, drawn_dt_bias
from archlab.nn.mixers.ops.conv import causal_conv, init_conv
from archlab.nn.mixers.ops.selective_scan import scan


@mixer_config("mamba")
@dataclass
class MambaConfig(MixerConfig):
    """``model.attention`` with kind mamba (Mamba-1's selective scan): an inner width of channels, each
    with a state_size state; MambaConfig's defaults (transformers). n_head is not read."""

    kind: str = "mamba"
    inner: Optional[int] = None  # channels of the scan (intermediate_size); None = 2·d_model (expand 2)
    state_size: int = 16  # state dims per channel (N), the width of B and C
    conv_kernel: int = 4  # width of the causal depthwise convolution of x
    conv_bias: bool = True  # a bias on the convolution (use_conv_bias)
    bias: bool = False  # biases on the in- and out-projections (use_bias)
    # the channels split into this many heads, each with its own x_proj and dt_proj, so its own Δ, B and C
    # (Zamba's n_mamba_heads); 1: Mamba's
    heads: int = 1
    dt_rank: Optional[int] = None  # the low rank of Δ's projection (time_step_rank); None = ceil(d_model / 16)
    bc_dt_norm: bool = False  # RMS-norm B, C and Δ's low-rank input without a scale (FalconMamba)
    bc_dt_norm_eps: float = 1e-6  # that norm's epsilon (mixer_rms_eps)
    bc_dt_norm_scale: bool = False  # those three norms with a learned scale each (Jamba's dt/b/c_layernorm)
    scan_chunk: int = 16  # positions per chunk of the parallel scan off the CPU (speed and memory only)
    dt_min: float = 0.001  # init: Δ log-uniform in [dt_min, dt_max] (floored at dt_init_floor) through the
    dt_max: float = 0.1  # projection's bias, softplus⁻¹(Δ)
    dt_init_floor: float = 1e-4
    dt_init: str = choice(
        "random", "constant"
    )  # Δ's projection weight: uniform in ±std, or std (time_step_init_scheme)
    dt_scale: float = 1.0  # that std is dt_scale / sqrt(dt_rank) (time_step_scale)


def inner(cfg: ModelConfig) -> int:
    """Channels of the scan: ``attention.inner``, else 2·d_model."""
    a = cfg.attention
    return a.inner if a.inner is not None else 2 * cfg.d_model


def dt_rank(cfg: ModelConfig) -> int:
    """Δ's low rank: ``attention.dt_rank``, else ceil(d_model / 16) (Mamba's "auto")."""
    a = cfg.attention
    return a.dt_rank if a.dt_rank is not None else math.ceil(cfg.d_model / 16)


def _rms(x: Tensor, eps: float, scale: Optional[Tensor]) -> Tensor:
    """``x`` over its last dim divided by its root mean square, times ``scale`` where there is one (Jamba's;
    FalconMamba's norm has none)."""
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps)
    return x if scale is None else x * scale.to(x.dtype)


@MIXERS.register("mamba")
class Mamba(Mixer):
    """``in_proj`` to x and the gate z (inner each); x through the causal depthwise convolution and SiLU;
    ``x_proj`` to Δ's low-rank input, B and C; ``dt_proj`` to Δ per channel; the selective scan plus the D
    skip, times silu(z); ``out_proj``. No position reaches it: the recurrence orders the tokens. Its
    ``mask`` (``Tokens``): padded positions enter the convolution as zeros and have Δ = 0, so they neither
    decay nor write the state and a left-padded row computes what it would alone; a packed document's
    first position starts from an empty state and convolution window. The KV cache keeps, per such layer, the last ``conv_kernel − 1``
    convolution inputs ``[B, inner, conv_kernel − 1]`` and the states ``[B, inner, state_size]``."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.inner, self.state_size, self.rank, self.heads = inner(cfg), a.state_size, dt_rank(cfg), a.heads
        self.scan_chunk = a.scan_chunk
        self.norm_eps = a.bc_dt_norm_eps if a.bc_dt_norm else None
        scaled = a.bc_dt_norm and a.bc_dt_norm_scale
        self.dt_norm_weight, self.b_norm_weight, self.c_norm_weight = (
            nn.Parameter(torch.empty(n)) if scaled else None for n in (self.rank, a.state_size, a.state_size)
        )
        self.dt_init = (a.dt_min, a.dt_max, a.dt_init_floor, a.dt_init, a.dt_scale)
        self.in_proj = nn.Linear(d, 2 * self.inner, bias=a.bias)
        self.conv_weight = nn.Parameter(torch.empty(self.inner, 1, a.conv_kernel))  # nn.Conv1d's depthwise shape
        self.conv_bias = nn.Parameter(torch.empty(self.inner)) if a.conv_bias else None
        # per head [R + 2N rows] from its inner/heads channels, the heads' rows stacked
        self.x_proj = nn.Linear(self.inner // a.heads, a.heads * (self.rank + 2 * a.state_size), bias=False)
        self.dt_proj = nn.Linear(self.rank, self.inner)
        self.A_log = nn.Parameter(torch.empty(self.inner, a.state_size))
        self.D = nn.Parameter(torch.empty(self.inner))
        self.out_proj = residual_projection(nn.Linear(self.inner, d, bias=a.bias))

    def param_roles(self) -> dict[str, Role]:
        # x_proj and dt_proj map between the inner width and the fixed rank and state: hidden, as in_proj's
        # B/C rows in Mamba-2; every per-channel vector alike
        hidden = ("in_proj.weight", "x_proj.weight", "dt_proj.weight", "out_proj.weight")
        vectors = ("conv_weight", "conv_bias", "dt_proj.bias", "A_log", "D", "in_proj.bias", "out_proj.bias")
        vectors += ("dt_norm_weight", "b_norm_weight", "c_norm_weight")
        return {**{n: Role.HIDDEN for n in hidden}, **{n: Role.VECTOR for n in vectors}}

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        f = torch.promote_types(x.dtype, torch.float32)  # the scan's dtype: float32, or a float64 model's own
        present, starts = mask or Tokens()
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        if present is not None:
            xs = xs * present[..., None].to(xs.dtype)
        xs = F.silu(causal_conv(xs.transpose(1, 2), self.conv_weight, self.conv_bias, cache, layer, starts))
        xs = xs.transpose(1, 2)
        H, (b, T) = self.heads, xs.shape[:2]
        if H == 1:
            projected = self.x_proj(xs)
        else:  # each head's x_proj on its own channels: [b, T, H, R + 2N]
            weight = self.x_proj.weight.view(H, -1, self.inner // H)
            projected = torch.einsum("bthi,hoi->btho", xs.reshape(b, T, H, -1), weight)
        low, B, C = projected.to(f).split((self.rank, self.state_size, self.state_size), dim=-1)
        if self.norm_eps is not None:
            scales = (self.dt_norm_weight, self.b_norm_weight, self.c_norm_weight)
            low, B, C = (_rms(t, self.norm_eps, w) for t, w in zip((low, B, C), scales))
        if H == 1:
            dt = low @ self.dt_proj.weight.to(f).T
        else:  # each head's dt_proj to its own channels
            dt = torch.einsum("bthr,hir->bthi", low, self.dt_proj.weight.to(f).view(H, -1, self.rank)).flatten(2)
        dt = F.softplus(dt + self.dt_proj.bias.to(f))  # [b, T, inner]
        xs = xs.to(f)
        if present is not None:  # a padded position keeps the state as it is: no decay, no write
            dt = dt * present[..., None]
        A = -self.A_log.to(f).exp()
        decay = torch.exp(dt[..., None] * A)  # [b, T, inner, N]
        if starts is not None:  # a document's first position starts from an empty state
            decay = decay * ~starts[..., None, None]
        B = B[:, :, None] if H == 1 else B.repeat_interleave(self.inner // H, dim=2)  # each channel its head's
        write = (dt * xs)[..., None] * B
        state = None if cache is None else cache.recurrent_state[layer]
        state = None if state is None else state.to(f)
        if H == 1:
            y, state = scan(decay, write, C, self.scan_chunk, state)
        else:  # a scan per head, each reading its own C
            w = self.inner // H
            parts = [
                scan(
                    decay[:, :, s], write[:, :, s], C[:, :, h], self.scan_chunk, None if state is None else state[:, s]
                )
                for h, s in enumerate(slice(h * w, (h + 1) * w) for h in range(H))
            ]
            y, state = torch.cat([p[0] for p in parts], dim=-1), torch.cat([p[1] for p in parts], dim=1)
        if cache is not None:
            cache.recurrent_state[layer] = state.to(cache.dtype or state.dtype)
        y = (y + xs * self.D.to(f)) * F.silu(z.to(f))
        return self.out_proj(y.to(x.dtype))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """What Mamba initialises its own way (transformers, mamba_ssm): the convolution as nn.Conv1d
        (uniform within 1/sqrt(conv_kernel)), its bias 0; dt_proj's weight uniform in ±dt_scale/sqrt(dt_rank)
        (or that constant), its bias softplus⁻¹ of a Δ log-uniform in [dt_min, dt_max], at least dt_init_floor;
        A_log = log(1..N) for every channel; D 1; the norms' scales 1."""
        dt_min, dt_max, floor, scheme, scale = self.dt_init
        init_conv(self.conv_weight, self.conv_bias)
        bound = scale * self.rank**-0.5
        if scheme == "constant":
            nn.init.constant_(self.dt_proj.weight, bound)
        else:
            nn.init.uniform_(self.dt_proj.weight, -bound, bound)
        self.dt_proj.bias.copy_(drawn_dt_bias(self.inner, dt_min, dt_max, floor, self.dt_proj.bias.device))
        A = torch.arange(1, self.state_size + 1, dtype=torch.float32, device=self.A_log.device)
        self.A_log.copy_(A.log().expand(self.inner, -1))
        nn.init.ones_(self.D)
        for w in (self.dt_norm_weight, self.b_norm_weight, self.c_norm_weight):
            if w is not None:
                nn.init.ones_(w)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``state_size``: what C and B multiply over."""
        return cfg.attention.state_size

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """In-projection (d + bias)·2I, the convolution I·(K + conv_bias), x_proj I·(R + 2N), dt_proj
        (R + 1)·I, A_log I·N, D I, the out-projection (I + bias)·d, the norms' scales R + 2N where learned;
        I = inner, R = dt_rank, N = state_size."""
        a, d, width, rank = cfg.attention, cfg.d_model, inner(cfg), dt_rank(cfg)
        conv = width * (a.conv_kernel + a.conv_bias)
        selective = width * (rank + 2 * a.state_size) + (rank + 1) * width + width * a.state_size + width
        scales = (rank + 2 * a.state_size) * (a.bc_dt_norm and a.bc_dt_norm_scale)
        return (d + a.bias) * 2 * width + conv + selective + scales + width * d + a.bias * d

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: the last conv_kernel − 1 inputs of every inner channel and its
        state of state_size."""
        a = cfg.attention
        return inner(cfg) * (a.conv_kernel - 1 + a.state_size)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The recurrence's cost per token, at any length: per inner channel and state dim a decay, a write
        and a read (3 multiply-adds), forward and backward: 18·I·N. The convolution's and projections'
        weights count among the parameters; the chunked form's doubling steps, a way of computing the same
        recurrence, are not counted."""
        return 18 * inner(cfg) * cfg.attention.state_size

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        for name in ("inner", "dt_rank"):
            if getattr(a, name) is not None:
                checks.integer(f"model.attention.{name}", getattr(a, name), 1, "a positive integer, or null")
        for name in ("state_size", "conv_kernel", "scan_chunk"):
            checks.integer(f"model.attention.{name}", getattr(a, name), 1)
        checks.integer("model.attention.heads", a.heads, allowed=f"a positive integer dividing inner={inner(cfg)}")
        if inner(cfg) % a.heads:
            raise ConfigError("model.attention.heads", a.heads, f"a positive integer dividing inner={inner(cfg)}")
        for name in ("conv_bias", "bias", "bc_dt_norm", "bc_dt_norm_scale"):
            checks.choice(f"model.attention.{name}", getattr(a, name), (True, False))
        checks.positive("model.attention.bc_dt_norm_eps", a.bc_dt_norm_eps)
        checks.positive("model.attention.dt_scale", a.dt_scale)
        check_dt_init(a)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``mamba <I> x state <N>, dt rank <R>, conv <K>`` (``, bc/dt normed`` for FalconMamba's, ``, bc/dt
        normed with scales`` for Jamba's)."""
        a = cfg.attention
        normed = (", bc/dt normed" + " with scales" * a.bc_dt_norm_scale) if a.bc_dt_norm else ""
        heads = f" in {a.heads} heads" if a.heads > 1 else ""
        return f"mamba {inner(cfg)}{heads} x state {a.state_size}, dt rank {dt_rank(cfg)}, conv {a.conv_kernel}{normed}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its sizes, biases, convolution, scan and Δ's init; the norm's epsilon and scales only with the norm;
        not n_head."""
        unread = {"kind", "n_head"} | (set() if cfg.attention.bc_dt_norm else {"bc_dt_norm_eps", "bc_dt_norm_scale"})
        return frozenset(f.name for f in dataclasses.fields(MambaConfig)) - unread
