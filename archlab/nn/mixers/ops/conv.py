"""The causal depthwise convolution the recurrent mixers run over their inputs (Mamba-2's x, B and C, Gated
DeltaNet's q, k and v, a short convolution's gated input), continuing after what a KV cache kept."""

from __future__ import annotations

import math
from typing import TYPE_CHECKING, Optional

import torch
import torch.nn.functional as F
from torch import Tensor, nn

if TYPE_CHECKING:
    from archlab.nn.mixers.base import KVCache


@torch.no_grad()
def init_conv(weight: Tensor, bias: Optional[Tensor]) -> None:
    """The depthwise convolution as nn.Conv1d initialises it (uniform within 1/sqrt(kernel)), its bias 0."""
    nn.init.kaiming_uniform_(weight, a=math.sqrt(5))
    if bias is not None:
        nn.init.zeros_(bias)


def causal_conv(
    x: Tensor,
    weight: Tensor,
    bias: Optional[Tensor],
    cache: Optional[KVCache],
    layer: int,
    starts: Optional[Tensor] = None,
) -> Tensor:
    """The causal depthwise convolution of ``x`` ``[B, channels, T]`` by ``weight`` ``[channels, 1, K]`` (and
    ``bias``), continuing after layer ``layer``'s cached inputs (zeros without a cache); the cache then keeps
    the last ``K − 1`` inputs. ``starts`` ``[B, T]`` (True: a document begins): a position reads no input
    from before its document's first, as the document alone would."""
    channels, kernel = weight.shape[0], weight.shape[-1]
    past = None if cache is None else cache.conv_state[layer]
    if past is None:
        past = x.new_zeros(x.shape[0], channels, kernel - 1)
    inputs = torch.cat((past.to(x.dtype), x), dim=-1)
    if cache is not None:
        cache.conv_state[layer] = inputs[:, :, inputs.shape[-1] - (kernel - 1) :].to(cache.dtype or x.dtype)
    bias = None if bias is None else bias.to(inputs.dtype)
    if starts is None:
        return F.conv1d(inputs, weight.to(inputs.dtype), bias, groups=channels)
    T = x.shape[-1]
    index = torch.arange(T, device=x.device)
    first = torch.where(starts, index, -kernel).cummax(-1).values  # its document's first (−K: none began here)
    taps = inputs.unfold(-1, kernel, 1)  # [B, channels, T, K]: tap j reads position t − (K − 1) + j
    reach = index[:, None] - (kernel - 1) + torch.arange(kernel, device=x.device)  # [T, K]
    seen = reach >= first[..., None]  # a document begun before these positions reads the cache too
    out = (taps * seen[:, None].to(x.dtype) * weight.to(inputs.dtype)[:, 0][None, :, None]).sum(-1)
    return out if bias is None else out + bias[:, None]
