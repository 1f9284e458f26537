"""Causal attention in bf16 on the CPU as two batched matmuls and one softmax, with a hand-written
backward (the FlashAttention gradient identities over a stored probability matrix).

On CPUs with native bf16, SDPA's attention kernels compute in float32 and gain nothing from bf16, while
batched bf16 matmuls run at the bf16 rate; autograd's own backward of the explicit formula spends more in
elementwise passes than in the matmuls. Scores are rounded to bf16 before the softmax, as in Hugging
Face's eager attention under autocast. Grouped key/value heads are never repeated: each KV head's query
group forms one ``[G·Tq, hd]`` operand. tests/test_cpu_attention.py checks values and gradients against
float64 SDPA, no further from it than SDPA's own bf16 kernel (within a small factor).
"""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

# Longest key sequence this path takes, when training and when not: beyond it the [Tq, Tk] probabilities
# outgrow the caches and SDPA's blocked kernel is faster (docs/performance.md, "bf16 on the CPU").
MAX_KEYS_TRAINING, MAX_KEYS_INFERENCE = 512, 256


def applies(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], dropout: float) -> bool:
    """This path, rather than SDPA, for these operands (``takes`` on what they are; values as wide as the
    queries and keys)?"""
    return takes(
        q.device.type,
        q.dtype if k.dtype == v.dtype == q.dtype and v.shape[-1] == q.shape[-1] else None,
        dropout,
        q.shape[2],
        k.shape[2],
        training=torch.is_grad_enabled() and q.requires_grad,
        shared_bool_mask=mask is None or (mask.dtype == torch.bool and mask.dim() == 2),
    )


def takes(
    device: str,
    dtype: Optional[torch.dtype],
    dropout: float,
    queries: int,
    keys: int,
    training: bool,
    shared_bool_mask: bool,
) -> bool:
    """The rule: bf16 operands (all three) on the CPU, several queries and not too many keys, no dropout,
    and plain causal masking or one ``[Tq, Tk]`` boolean mask shared by every row and head (a sliding
    window); float biases (ALiBi), per-row padding masks and decoding one token stay with SDPA.
    ``archlab-bench`` asks it of the configured layout to name the path it times."""
    return (
        device == "cpu"
        and dtype == torch.bfloat16
        and dropout == 0.0
        and 1 < queries
        and keys <= (MAX_KEYS_TRAINING if training else MAX_KEYS_INFERENCE)
        and shared_bool_mask
    )


def matmul_attention(q: Tensor, k: Tensor, v: Tensor, mask: Optional[Tensor], scale: float) -> Tensor:
    """softmax(q·kᵀ·scale, hidden keys -inf)·v for ``q [B, H, Tq, hd]``, ``k, v [B, KV, Tk, hd]``
    (query head h reads KV head h // (H / KV), as SDPA's ``enable_gqa``). ``mask`` ``[Tq, Tk]`` is True
    where a key is visible; None means causal with queries and keys starting together."""
    if mask is None:
        hidden = torch.ones(q.shape[2], k.shape[2], dtype=torch.bool, device=q.device).triu_(1)
    else:
        hidden = ~mask
    return _MatmulAttention.apply(q, k, v, hidden, scale)


class _MatmulAttention(torch.autograd.Function):
    """Forward keeps the probabilities P (bf16, ``[B·KV, G·Tq, Tk]``) and the output O; backward:
    dV = Pᵀ·dO, dP = dO·Vᵀ, dS = P ∘ (dP − rowsum(dO ∘ O)), dQ = scale·dS·K, dK = dSᵀ·(scale·Q)."""

    @staticmethod
    def forward(ctx, q: Tensor, k: Tensor, v: Tensor, hidden: Tensor, scale: float) -> Tensor:
        with torch.autocast("cpu", enabled=False):  # every operand is bf16 already; keep P in bf16
            return _MatmulAttention._forward(ctx, q, k, v, hidden, scale)

    @staticmethod
    def _forward(ctx, q: Tensor, k: Tensor, v: Tensor, hidden: Tensor, scale: float) -> Tensor:
        B, H, Tq, hd = q.shape
        KV, Tk = k.shape[1], k.shape[2]
        G = H // KV
        qs = (q * scale).reshape(B * KV, G * Tq, hd)
        k, v = k.reshape(B * KV, Tk, hd), v.reshape(B * KV, Tk, hd)
        scores = torch.bmm(qs, k.transpose(1, 2))
        scores.view(B * KV, G, Tq, Tk).masked_fill_(hidden, float("-inf"))
        p = torch.softmax(scores, dim=-1)  # accumulates in float32, stores bf16
        o = torch.bmm(p, v)
        ctx.save_for_backward(qs, k, v, p, o)
        ctx.scale, ctx.shape = scale, (B, H, KV, Tq, Tk, hd)
        return o.view(B, H, Tq, hd)

    @staticmethod
    def backward(ctx, *grads: Tensor):  # Function.backward's signature: one gradient per output
        (grad,) = grads
        with torch.autocast("cpu", enabled=False):
            return _MatmulAttention._backward(ctx, grad)

    @staticmethod
    def _backward(ctx, grad: Tensor):
        qs, k, v, p, o = ctx.saved_tensors
        B, H, KV, Tq, Tk, hd = ctx.shape
        do = grad.to(o.dtype).reshape(o.shape)
        # Pᵀ·dO and dSᵀ·Q as (dOᵀ·P)ᵀ and (Qᵀ·dS)ᵀ: CPU bf16 matmuls copy a transposed operand first,
        # and the [Tq, Tk] matrices are the large ones
        dv = torch.bmm(do.transpose(1, 2), p).transpose(1, 2)
        dp = torch.bmm(do, v.transpose(1, 2))
        delta = (do.float() * o.float()).sum(-1, keepdim=True)  # rowsum(dP ∘ P) = rowsum(dO ∘ O)
        ds = dp.sub_(delta.to(dp.dtype)).mul_(p)  # a float32 operand would take a slower mixed-dtype kernel
        dq = torch.bmm(ds, k).mul_(ctx.scale)
        dk = torch.bmm(qs.transpose(1, 2), ds).transpose(1, 2)
        return dq.view(B, H, Tq, hd), dk.unflatten(0, (B, KV)), dv.unflatten(0, (B, KV)), None, None
