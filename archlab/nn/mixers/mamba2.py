"""Mamba-2, ``mamba2`` (Dao and Gu 2024, *Transformers are SSMs*, arXiv:2405.21060), as Mamba2ForCausalLM,
Bamba and Nemotron-H use it: a token mixer in attention's slot whose memory is one ``head_dim × state_size``
state per head, decayed by a scalar per head and token and written along an input-dependent B, so its
decoding state is constant in the context.

Per head ``h`` (of group ``g``, whose B and C it shares) and token ``t``: ``S_t = exp(dt_t·A_h)·S_{t−1} +
dt_t·x_t·B_tᵀ``, ``y_t = S_t·C_t + D_h·x_t``, with ``dt_t = clamp(softplus(dt_raw + dt_bias))`` and ``A_h =
−exp(A_log_h)``. Training and prefill run the chunked parallel form, SSD (``chunked_ssd``; on a GPU mamba_ssm's
kernel where installed, nn/mixers/ops/kernels.py), decoding the recurrence itself (``recurrent_ssd``); both in float32
(float64 in a float64 model)."""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass
from typing import Optional, Protocol

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.config.fields import choice
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.ops import kernels
from archlab.nn.mixers.ops.conv import causal_conv, init_conv
from archlab.nn.mixers.ops.ssd import chunked_ssd, recurrent_ssd


@mixer_config("mamba2")
@dataclass
class Mamba2Config(MixerConfig):
    """``model.attention`` with kind mamba2 (Mamba-2's SSD, Dao & Gu 2024): n_head heads of head_dim channels,
    each channel a state_size state decayed by exp(dt·A) and written along B, read by C. Its defaults are
    Mamba2ForCausalLM's but the sizes: no projection biases, a bias on the convolution."""

    kind: str = "mamba2"
    head_dim: Optional[int] = None  # channels per head; None = 2·d_model/n_head (Mamba's expand 2)
    qkv_bias: bool = False  # a bias on the in-projection (transformers' use_bias)
    out_bias: bool = False  # a bias on the out-projection (use_bias)
    state_size: int = 128  # state dims per channel (N), the width of B and C
    groups: int = 1  # B/C groups, each shared by n_head/groups heads; also the gated norm's groups
    conv_kernel: int = 4  # width of the causal depthwise convolution of x, B and C
    conv_bias: bool = True  # a bias on the causal convolution
    scan_chunk: int = 64  # positions per chunk of the parallel form (speed and memory only)
    dt_min: float = 0.001  # init: dt log-uniform in [dt_min, dt_max] (floored at dt_init_floor), dt_bias =
    dt_max: float = 0.1  # softplus⁻¹(dt)
    dt_init_floor: float = 1e-4
    dt_limit_min: float = 0.0  # dt = softplus(dt + dt_bias) clamped to [dt_limit_min, dt_limit_max]
    dt_limit_max: Optional[float] = None  # None = no upper bound (transformers' time_step_limit (0, inf))
    # the gated norm: norm(y·silu(z)) (Mamba-2's) | norm(y)·silu(z) (Falcon-H1's mamba_norm_before_gate) | y·silu(z),
    # no norm and no scale (Falcon-H1's mamba_rms_norm false)
    gate_norm: str = choice("after", "before", "none")


def drawn_dt_bias(n: int, dt_min: float, dt_max: float, floor: float, device: torch.device) -> Tensor:
    """Mamba's dt bias init, ``n`` of them (Mamba-2: one per head; Mamba-1: per channel): softplus⁻¹ of a dt
    log-uniform in [dt_min, dt_max], at least ``floor``."""
    u = torch.rand(n, dtype=torch.float32, device=device)
    dt = (u * (math.log(dt_max) - math.log(dt_min)) + math.log(dt_min)).exp().clamp(min=floor)
    return dt + torch.log(-torch.expm1(-dt))  # softplus⁻¹(dt)


class DtDraw(Protocol):
    """The fields of ``drawn_dt_bias``'s range, which Mamba-2 and Gated DeltaNet's configs share."""

    dt_min: float
    dt_max: float
    dt_init_floor: float


def check_dt_init(a: DtDraw) -> None:
    """``drawn_dt_bias``'s fields: 0 < dt_min <= dt_max, dt_init_floor >= 0, all finite."""
    checks.positive("model.attention.dt_min", a.dt_min)
    if not a.dt_min <= a.dt_max < math.inf:
        raise ConfigError("model.attention.dt_max", a.dt_max, f"a number >= model.attention.dt_min={a.dt_min}")
    if not 0 <= a.dt_init_floor < math.inf:
        raise ConfigError("model.attention.dt_init_floor", a.dt_init_floor, "a number >= 0")


def head_dim(cfg: ModelConfig) -> int:
    """Channels per head: ``attention.head_dim``, else 2·d_model / n_head (Mamba's expand 2)."""
    a = cfg.attention
    return a.head_dim if a.head_dim is not None else 2 * cfg.d_model // a.n_head


def inner(cfg: ModelConfig) -> int:
    """The inner width n_head·head_dim (transformers' intermediate_size, expand·hidden_size)."""
    return cfg.attention.n_head * head_dim(cfg)


def conv_channels(cfg: ModelConfig) -> int:
    """Channels of the convolution: x, B and C, inner + 2·groups·state_size."""
    a = cfg.attention
    return inner(cfg) + 2 * a.groups * a.state_size


@MIXERS.register("mamba2")
class Mamba2(Mixer):
    """One in-projection to z (the gate, inner wide), x, B, C (through a causal depthwise convolution of
    ``conv_kernel``, with an optional bias, and SiLU) and dt (one per head); the SSD scan over ``n_head``
    states plus the D skip; the gated RMSNorm ``norm(y·silu(z))`` over ``groups`` groups of inner/groups
    channels with one inner-wide scale (transformers' MambaRMSNormGated, eps model.norm.eps; ``gate_norm``
    before: ``norm(y)·silu(z)``, none: ``y·silu(z)`` unnormed, both Falcon-H1's); the output
    projection. No position reaches it: the recurrence orders the tokens. Its ``mask`` (``Tokens``) gives the
    padding of the new positions: padded positions enter the convolution as zeros and have dt = 0, so they
    neither decay nor write the state and a left-padded row computes what it would alone; and the starts
    of packed documents, where the state and the convolution's window begin empty. The KV cache keeps, per such layer, the last ``conv_kernel − 1`` convolution inputs ``[B,
    channels, conv_kernel − 1]`` and the states ``[B, n_head, head_dim, state_size]``."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.n_head, self.head_dim, self.groups, self.state_size = a.n_head, head_dim(cfg), a.groups, a.state_size
        self.inner, self.channels = inner(cfg), conv_channels(cfg)
        self.kernel, self.scan_chunk = a.conv_kernel, a.scan_chunk
        self.dt_limit = (a.dt_limit_min, math.inf if a.dt_limit_max is None else a.dt_limit_max)
        self.dt_init = (a.dt_min, a.dt_max, a.dt_init_floor)
        self.in_proj = nn.Linear(d, self.inner + self.channels + a.n_head, bias=a.qkv_bias)
        self.conv_weight = nn.Parameter(torch.empty(self.channels, 1, a.conv_kernel))  # nn.Conv1d's depthwise shape
        self.conv_bias = nn.Parameter(torch.empty(self.channels)) if a.conv_bias else None
        self.dt_bias = nn.Parameter(torch.empty(a.n_head))
        self.A_log = nn.Parameter(torch.empty(a.n_head))
        self.D = nn.Parameter(torch.empty(a.n_head))
        self.gate_norm = a.gate_norm
        self.norm_weight = nn.Parameter(torch.empty(self.inner)) if a.gate_norm != "none" else None
        self.norm_eps = cfg.norm.eps
        self.proj = residual_projection(nn.Linear(self.inner, d, bias=a.out_bias))

    def param_roles(self) -> dict[str, Role]:
        # in_proj also holds B, C and dt's rows (the state size and heads stay fixed as the width grows):
        # one matrix, one rule, as Gated DeltaNet's
        per_channel = ("conv_weight", "conv_bias", "dt_bias", "A_log", "D", "norm_weight", "in_proj.bias", "proj.bias")
        return {"in_proj.weight": Role.HIDDEN, "proj.weight": Role.HIDDEN, **{n: Role.VECTOR for n in per_channel}}

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        b, T, _ = x.shape
        f = torch.promote_types(x.dtype, torch.float32)  # the scan's dtype: float32, or a float64 model's own
        H, P, G, N = self.n_head, self.head_dim, self.groups, self.state_size
        present, starts = mask or Tokens()
        z, xBC, dt = self.in_proj(x).split((self.inner, self.channels, H), dim=-1)
        if present is not None:
            xBC = xBC * present[..., None].to(xBC.dtype)
        xBC = causal_conv(xBC.transpose(1, 2), self.conv_weight, self.conv_bias, cache, layer, starts)
        xBC = F.silu(xBC).transpose(1, 2)
        xs, B, C = xBC.to(f).split((self.inner, G * N, G * N), dim=-1)
        xs, B, C = xs.unflatten(-1, (H, P)), B.unflatten(-1, (G, N)), C.unflatten(-1, (G, N))
        dt = F.softplus(dt.to(f) + self.dt_bias.to(f)).clamp(*self.dt_limit)
        if present is not None:  # a padded position keeps the state as it is: no decay, no write
            dt = dt * present[..., None]
        A = -self.A_log.to(f).exp()
        state = None if cache is None else cache.recurrent_state[layer]
        state = None if state is None else state.to(f)
        if T == 1:
            y, state = recurrent_ssd(xs, dt, A, B, C, state)  # one position: no document starts within it
        elif kernels.ssd_applies(xs) and starts is None:
            y, state = kernels.ssd(xs, dt, A, B, C, self.scan_chunk, state)
        else:
            y, state = chunked_ssd(xs, dt, A, B, C, self.scan_chunk, state, starts)
        if cache is not None:
            cache.recurrent_state[layer] = state.to(cache.dtype or state.dtype)
        y = (y + xs * self.D.to(f)[:, None]).flatten(2)
        gate = F.silu(z.to(f))
        if self.norm_weight is None:
            return self.proj((y * gate).to(x.dtype))
        if self.gate_norm == "after":
            y = y * gate
        y = y.unflatten(-1, (G, self.inner // G))
        y = (y * torch.rsqrt(y.pow(2).mean(-1, keepdim=True) + self.norm_eps)).flatten(2) * self.norm_weight.to(f)
        return self.proj((y if self.gate_norm == "after" else y * gate).to(x.dtype))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """What no Linear holds (``Decoder.init_weights`` calls it), as transformers and mamba_ssm initialise
        it: the convolution as nn.Conv1d (uniform within 1/sqrt(conv_kernel)), its bias 0; dt_bias the
        inverse softplus of dt, log-uniform in [dt_min, dt_max] and at least dt_init_floor; A_log = log(1..H),
        so the heads decay at rates 1 to H; D 1; the norm's scale 1."""
        init_conv(self.conv_weight, self.conv_bias)
        self.dt_bias.copy_(drawn_dt_bias(self.n_head, *self.dt_init, self.dt_bias.device))
        self.A_log.copy_(torch.arange(1, self.n_head + 1, dtype=torch.float32, device=self.A_log.device).log())
        nn.init.ones_(self.D)
        if self.norm_weight is not None:
            nn.init.ones_(self.norm_weight)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """``state_size``: what C and B multiply over."""
        return cfg.attention.state_size

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """In-projection d·(2·I + 2·G·N + H) (z, x, B, C, dt; + as many biases with qkv_bias), the
        convolution (I + 2·G·N)·K (+ I + 2·G·N with conv_bias), dt_bias, A_log and D H each, the gated
        norm's scale I (none with gate_norm none), the output projection I·d (+ d with out_bias);
        I = n_head·head_dim."""
        a, d, H, width = cfg.attention, cfg.d_model, cfg.attention.n_head, inner(cfg)
        channels = conv_channels(cfg)
        in_proj = (d + a.qkv_bias) * (width + channels + H)
        conv = channels * (a.conv_kernel + a.conv_bias)
        norm = width if a.gate_norm != "none" else 0
        return in_proj + conv + 3 * H + norm + width * d + a.out_bias * d

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: the last conv_kernel − 1 convolution inputs of every channel and
        n_head states of head_dim × state_size."""
        a = cfg.attention
        return conv_channels(cfg) * (a.conv_kernel - 1) + a.n_head * head_dim(cfg) * a.state_size

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The recurrence's cost per token, at any length: two products with each head's head_dim ×
        state_size state (written along B, read by C), 2·P·N FLOPs each, forward and backward: 12·H·P·N.
        The convolution's weights count among the parameters; the chunked form's work within a chunk, a
        way of computing the same recurrence, is not counted."""
        a = cfg.attention
        return 12 * a.n_head * head_dim(cfg) * a.state_size

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 1, "a positive integer (heads, one state each)")
        if a.head_dim is None:
            if (2 * cfg.d_model) % a.n_head:
                raise ConfigError(
                    "model.attention.n_head",
                    a.n_head,
                    f"a divisor of 2·model.d_model={2 * cfg.d_model} (head_dim null: expand 2), or set head_dim",
                )
        else:
            checks.integer("model.attention.head_dim", a.head_dim, 1, "a positive integer, or null (2·d_model/n_head)")
        checks.integer("model.attention.groups", a.groups, 1)
        if a.n_head % a.groups:
            raise ConfigError(
                "model.attention.groups",
                a.groups,
                f"a divisor of model.attention.n_head={a.n_head} (each group's B and C serve n_head/groups heads)",
            )
        for name in ("state_size", "conv_kernel", "scan_chunk"):
            checks.integer(f"model.attention.{name}", getattr(a, name), 1)
        for name in ("qkv_bias", "out_bias", "conv_bias"):
            checks.choice(f"model.attention.{name}", getattr(a, name), (True, False))
        check_dt_init(a)
        if not 0 <= a.dt_limit_min < math.inf:
            raise ConfigError("model.attention.dt_limit_min", a.dt_limit_min, "a number >= 0")
        if a.dt_limit_max is not None and not a.dt_limit_min < a.dt_limit_max < math.inf:
            raise ConfigError(
                "model.attention.dt_limit_max",
                a.dt_limit_max,
                f"a number > model.attention.dt_limit_min={a.dt_limit_min}, or null (no upper bound)",
            )

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``mamba2 <H>h x <P>, state <N>, <G> groups, conv <K>``, then ``norm before gate`` or ``no norm``
        where ``gate_norm`` is not after."""
        a = cfg.attention
        norm = {"after": "", "before": ", norm before gate", "none": ", no norm"}[a.gate_norm]
        sizes = f"{a.n_head}h x {head_dim(cfg)}, state {a.state_size}, {a.groups} groups, conv {a.conv_kernel}"
        return f"mamba2 {sizes}{norm}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its heads and sizes, biases, convolution, scan and time steps: all its fields."""
        return frozenset(f.name for f in dataclasses.fields(Mamba2Config)) - {"kind"}
