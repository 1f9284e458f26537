"""A gated short convolution, ``short_conv`` (LFM2's ``Lfm2ShortConv``, Liquid AI 2025; the gated causal
convolutions of H3 and Hyena at a short kernel): three projections of the input, ``B``, ``C`` and ``x``, and
``out(C ⊙ conv(B ⊙ x))`` with a causal depthwise convolution of ``conv_kernel`` positions. A token sees
the ``conv_kernel − 1`` positions before it and no further, so decoding keeps those inputs and nothing
that grows with the context."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import torch
from torch import nn

from archlab import checks
from archlab.config import MixerConfig, ModelConfig, mixer_config
from archlab.nn.component import Role, residual_projection
from archlab.nn.mixers.base import MIXERS, Mixer, Tokens
from archlab.nn.mixers.ops.conv import causal_conv, init_conv


@mixer_config("short_conv")
@dataclass
class ShortConvConfig(MixerConfig):
    """``model.attention`` with kind short_conv: d_model channels gated before and after a causal depthwise
    convolution (LFM2's defaults); n_head is not read."""

    kind: str = "short_conv"
    conv_kernel: int = 3  # positions the convolution spans, the token's own among them (LFM2's conv_L_cache)
    bias: bool = False  # biases on the three projections, the convolution and the output (LFM2's conv_bias)


@MIXERS.register("short_conv")
class ShortConv(Mixer):
    """``in_proj`` to ``[B | C | x]`` (3·d_model), the causal depthwise convolution of ``B·x``, times ``C``,
    ``out_proj``. No position reaches it: the convolution orders the tokens. Its ``mask`` (``Tokens``): a
    padded position enters the convolution as a zero, as the positions before the first do, so a
    left-padded row computes what it would alone; a packed document's convolution reads nothing before it. The KV cache
    keeps, per such layer, the last ``conv_kernel − 1`` convolution inputs ``[B, d_model, conv_kernel − 1]``."""

    recurrent = True

    def __init__(self, cfg: ModelConfig, layer: int = 0):
        super().__init__(cfg, layer)
        a, d = cfg.attention, cfg.d_model
        self.in_proj = nn.Linear(d, 3 * d, bias=a.bias)
        self.conv_weight = nn.Parameter(torch.empty(d, 1, a.conv_kernel))  # nn.Conv1d's depthwise shape
        self.conv_bias = nn.Parameter(torch.empty(d)) if a.bias else None
        self.out_proj = residual_projection(nn.Linear(d, d, bias=a.bias))

    def param_roles(self) -> dict[str, Role]:
        per_channel = ("conv_weight", "conv_bias", "in_proj.bias", "out_proj.bias")
        return {"in_proj.weight": Role.HIDDEN, "out_proj.weight": Role.HIDDEN, **{n: Role.VECTOR for n in per_channel}}

    def forward(self, x, rotary=None, mask=None, cache=None, layer=0):  # typed as Mixer.forward
        present, starts = mask or Tokens()
        b, c, h = self.in_proj(x).chunk(3, dim=-1)
        gated = b * h
        if present is not None:
            gated = gated * present[..., None].to(gated.dtype)
        mixed = causal_conv(gated.transpose(1, 2), self.conv_weight, self.conv_bias, cache, layer, starts)
        mixed = mixed.transpose(1, 2)
        return self.out_proj(c * mixed)

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The convolution as nn.Conv1d initialises it (uniform within 1/sqrt(conv_kernel)), its bias 0."""
        init_conv(self.conv_weight, self.conv_bias)

    @staticmethod
    def qk_head_dim(cfg: ModelConfig) -> int:
        """d_model: it mixes each channel apart, over positions, with no heads."""
        return cfg.d_model

    @classmethod
    def num_params(cls, cfg: ModelConfig, layer: int = 0) -> int:
        """In-projection (d + bias)·3d, the convolution d·(conv_kernel + bias), out-projection (d + bias)·d."""
        a, d = cfg.attention, cfg.d_model
        return (d + a.bias) * 3 * d + d * (a.conv_kernel + a.bias) + (d + a.bias) * d

    @staticmethod
    def kv_cache_values(cfg: ModelConfig, length: int, layer: int) -> int:
        """A constant, whatever ``length``: the last conv_kernel − 1 inputs of every channel."""
        return cfg.d_model * (cfg.attention.conv_kernel - 1)

    @staticmethod
    def extra_flops(cfg: ModelConfig, seq_len: int, layer: int) -> int:
        """The two gating products, a multiply per channel each, forward and backward: 6·d per token (the
        convolution's weights count among the parameters)."""
        return 6 * cfg.d_model

    @classmethod
    def validate(cls, cfg: ModelConfig) -> None:
        checks.integer("model.attention.conv_kernel", cfg.attention.conv_kernel, 1)
        checks.choice("model.attention.bias", cfg.attention.bias, (True, False))

    @staticmethod
    def describe(cfg: ModelConfig) -> str:
        """``short_conv d=<d>, conv <K>``."""
        return f"short_conv d={cfg.d_model}, conv {cfg.attention.conv_kernel}"

    @classmethod
    def reads(cls, cfg: ModelConfig) -> frozenset[str]:
        """Its kernel and biases; not n_head, which it has no use for."""
        return frozenset(f.name for f in dataclasses.fields(ShortConvConfig)) - {"kind", "n_head"}
