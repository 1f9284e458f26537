"""The RG-LRU recurrent block, ``rglru`` (De et al. 2024, *Griffin*, arXiv:2402.19427), as RecurrentGemma's
temporal block: a GeLU branch times a real-gated linear recurrence over a causal convolution, each channel
of ``width`` one number of state, so its decoding state is constant in the context.

Per channel and token: ``a_t = exp(−8·r_t·softplus(Λ))``, ``h_t = a_t·h_{t−1} + sqrt(1 − a_t²)·(i_t·x_t)``,
with the recurrence gate ``r_t`` and the input gate ``i_t`` sigmoids of block-diagonal projections of ``x_t``
(``n_head`` blocks); a sequence's (and a packed document's) first token enters unscaled, as Griffin's reset.
The scan is Mamba-1's with one state dim per channel (nn/mixers/ops/selective_scan.py)."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.errors import ConfigError
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.ops.conv import causal_conv, init_conv
from archlab.nn.mixers.ops.selective_scan import scan

GATE_SCALE = 8.0  # Griffin's c: a_t = a^(c·r_t), with a = exp(−softplus(Λ))


@mixer_config("rglru")
@dataclass
class RGLRUConfig(MixerConfig):
    """``model.attention`` with kind rglru (Griffin's recurrent block): width channels, n_head blocks of the
    two gates' block-diagonal projections; RecurrentGemma's defaults but the sizes."""

    kind: str = "rglru"
    width: Optional[int] = None  # channels of the recurrence (lru_width); None = d_model
    conv_kernel: int = 4  # width of the causal depthwise convolution before it (conv1d_width)
    scan_chunk: int = 16  # positions per chunk of the parallel scan off the CPU (speed and memory only)


def width(cfg: ModelConfig) -> int:
    """Channels of the recurrence: ``attention.width``, else d_model."""
    a = cfg.attention
    return a.width if a.width is not None else cfg.d_model


class _BoundedSqrt(torch.autograd.Function):
    """sqrt whose gradient is at most 1000, as Griffin's (1 − a² near 0 would otherwise blow it up)."""

    @staticmethod
    def forward(ctx, x: Tensor) -> Tensor:  # pyright: ignore[reportIncompatibleMethodOverride]
        ctx.save_for_backward(x)
        return x.sqrt()

    @staticmethod
    def backward(ctx, grad: Tensor) -> Tensor:  # pyright: ignore[reportIncompatibleMethodOverride]
        (x,) = ctx.saved_tensors
        return grad / (4 * x).clamp(min=1e-6).sqrt()


@MIXERS.register("rglru")
class RGLRU(Mixer):
    """``linear_y`` through tanh-GeLU (the gate branch); ``linear_x`` through the causal depthwise
    convolution (with its bias) and the RG-LRU; their product through ``linear_out``. Every projection has a
    bias. No position reaches it. Its ``mask`` (``Tokens``): a padded position enters the convolution as a
    zero and keeps the state (a = 1, no write); a sequence's first token, and a packed document's, enters
    unscaled from an empty state. The KV cache keeps, per such layer, the last ``conv_kernel − 1``
    convolution inputs ``[B, width, conv_kernel − 1]`` and the state ``[B, width, 1]``."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.width, self.n_head, self.scan_chunk = width(cfg), a.n_head, a.scan_chunk
        block = self.width // a.n_head
        self.linear_y = nn.Linear(d, self.width)
        self.linear_x = nn.Linear(d, self.width)
        self.conv_weight = nn.Parameter(torch.empty(self.width, 1, a.conv_kernel))  # nn.Conv1d's depthwise shape
        self.conv_bias = nn.Parameter(torch.empty(self.width))
        self.input_gate_weight = nn.Parameter(torch.empty(a.n_head, block, block))
        self.input_gate_bias = nn.Parameter(torch.empty(a.n_head, block))
        self.recurrent_gate_weight = nn.Parameter(torch.empty(a.n_head, block, block))
        self.recurrent_gate_bias = nn.Parameter(torch.empty(a.n_head, block))
        self.recurrent_param = nn.Parameter(torch.empty(self.width))
        self.linear_out = residual_projection(nn.Linear(self.width, d))

    def param_roles(self) -> dict[str, Role]:
        # the gates' blocks are width/n_head square: hidden matrices, as the projections
        hidden = (
            "linear_y.weight",
            "linear_x.weight",
            "linear_out.weight",
            "input_gate_weight",
            "recurrent_gate_weight",
        )
        vectors = ("linear_y.bias", "linear_x.bias", "linear_out.bias", "conv_weight", "conv_bias")
        vectors += ("input_gate_bias", "recurrent_gate_bias", "recurrent_param")
        return {**{n: Role.HIDDEN for n in hidden}, **{n: Role.VECTOR for n in vectors}}

    def _gate(self, x: Tensor, weight: Tensor, bias: Tensor) -> Tensor:
        """sigmoid of the block-diagonal projection of ``x`` ``[b, T, width]``: block h by weight[h] and bias[h]."""
        blocks = x.unflatten(-1, (self.n_head, -1))
        return torch.sigmoid(torch.einsum("bthi,hij->bthj", blocks, weight.to(x.dtype)) + bias.to(x.dtype)).flatten(2)

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        f = torch.promote_types(x.dtype, torch.float32)  # the scan's dtype: float32, or a float64 model's own
        present, starts = mask or Tokens()
        y = F.gelu(self.linear_y(x), approximate="tanh")
        xs = self.linear_x(x)
        if present is not None:
            xs = xs * present[..., None].to(xs.dtype)
        xs = causal_conv(xs.transpose(1, 2), self.conv_weight, self.conv_bias, cache, layer, starts)
        xs = xs.transpose(1, 2).to(f)
        log_a = -GATE_SCALE * self._gate(xs, self.recurrent_gate_weight, self.recurrent_gate_bias)
        log_a = log_a * F.softplus(self.recurrent_param.to(f))
        gated = xs * self._gate(xs, self.input_gate_weight, self.input_gate_bias)
        fresh = self._fresh(xs, present, starts, cache is None or cache.length == 0)  # [b, T]: from an empty state
        scale = torch.where(fresh[..., None], 1.0, _BoundedSqrt.apply(1 - torch.exp(2 * log_a)))
        decay = torch.exp(log_a) * ~fresh[..., None]
        write = gated * scale
        if present is not None:  # a padded position keeps the state as it is: no decay, no write
            decay = torch.where(present[..., None], decay, 1.0)
            write = write * present[..., None]
        ones = decay.new_ones(*decay.shape[:2], 1)  # the state's one dim, read whole
        state = None if cache is None else cache.recurrent_state[layer]
        state = None if state is None else state.to(f)
        h, state = scan(decay[..., None], write[..., None], ones, self.scan_chunk, state)
        if cache is not None:
            cache.recurrent_state[layer] = state.to(cache.dtype or state.dtype)
        return self.linear_out((h * y.to(f)).to(x.dtype))

    @staticmethod
    def _fresh(x: Tensor, present: Optional[Tensor], starts: Optional[Tensor], from_start: bool) -> Tensor:
        """``[b, T]``: True at the first token of a sequence seen ``from_start`` (its first present one under
        padding) and at every packed document's first token."""
        b, T = x.shape[:2]
        fresh = torch.zeros(b, T, dtype=torch.bool, device=x.device)
        if from_start:
            tokens = torch.ones_like(fresh) if present is None else present
            fresh = tokens & (tokens.long().cumsum(-1) == 1)
        return fresh if starts is None else fresh | starts

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """What RecurrentGemma initialises its own way: the convolution as nn.Conv1d (uniform within
        1/sqrt(conv_kernel)), the biases 0, the gates' blocks N(0, 1/block), and Λ so that a = exp(−softplus(Λ))
        lies in [0.9, 0.999] at r = 1/8 (uniform a² in [0.81, 0.998])."""
        init_conv(self.conv_weight, self.conv_bias)
        for bias in (self.input_gate_bias, self.recurrent_gate_bias):
            nn.init.zeros_(bias)
        block = self.width // self.n_head
        for weight in (self.input_gate_weight, self.recurrent_gate_weight):
            nn.init.normal_(weight, 0.0, block**-0.5)
        squared = torch.empty_like(self.recurrent_param, dtype=torch.float32).uniform_(0.9**2 + 1e-8, 0.999**2 + 1e-8)
        self.recurrent_param.copy_((squared.log() * -0.5).exp().sub(1.0).log())  # softplus⁻¹(−ln a)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """1: each channel's state is one number."""
        return 1

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """linear_y and linear_x (d + 1)·W each, the convolution W·(K + 1), the two gates W²/H + W each, Λ W,
        linear_out (W + 1)·d; W = width, H = n_head."""
        a, d, w = cfg.attention, cfg.d_model, width(cfg)
        return 2 * (d + 1) * w + w * (a.conv_kernel + 1) + 2 * (w * w // a.n_head + w) + w + (w + 1) * d

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: the last conv_kernel − 1 inputs and the state of every channel."""
        return width(cfg) * cfg.attention.conv_kernel

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The recurrence's cost per token, at any length: per channel a decay and a write (2 multiply-adds),
        forward and backward: 12·W. The weights (gates included) count among the parameters."""
        return 12 * width(cfg)

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        a = cfg.attention
        checks.integer("model.attention.n_head", a.n_head, 1, "a positive integer (blocks of the gates)")
        if a.width is not None:
            checks.integer("model.attention.width", a.width, 1, "a positive integer, or null (d_model)")
        if width(cfg) % a.n_head:
            raise ConfigError(
                "model.attention.n_head", a.n_head, f"a divisor of the width {width(cfg)} (the gates' blocks)"
            )
        for name in ("conv_kernel", "scan_chunk"):
            checks.integer(f"model.attention.{name}", getattr(a, name), 1)

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``rglru <W> wide, <H> gate blocks, conv <K>``."""
        a = cfg.attention
        return f"rglru {width(cfg)} wide, {a.n_head} gate blocks, conv {a.conv_kernel}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """All its fields."""
        return frozenset(f.name for f in dataclasses.fields(RGLRUConfig)) - {"kind"}
