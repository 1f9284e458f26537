"""Hand-written backward passes for the elementwise layers autograd would otherwise decompose.

Eager autograd records RMSNorm, RoPE and gated activations as chains of small ops (pow, mean,
rsqrt, mul, neg, cat...), each a full pass over the activations with its own temporary and its own
backward. These functions compute the same values in fewer passes; results agree with the plain
formulas to float rounding (tests/test_fused.py).
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor


def _needs_grad(*tensors: Tensor) -> bool:
    """Use the hand-written backward? Not when nothing records gradients (the Function machinery
    costs more than the arithmetic when decoding one token), nor under ``torch.compile``, which
    derives and fuses the backward of the plain formula itself."""
    return torch.is_grad_enabled() and any(t.requires_grad for t in tensors) and not torch.compiler.is_compiling()


class _RMSNorm(torch.autograd.Function):
    """``x / sqrt(mean(x²) + eps) * weight`` over the last dim, statistics in at least float32.

    The backward is aten's fused LayerNorm backward run with mean 0 and RMSNorm's rstd, which gives
    ``rstd·(g·w - mean(g·w) - xhat·mean(g·w·xhat))`` and the weight gradient ``Σ g·xhat`` in one
    kernel; RMSNorm subtracted no mean, so ``rstd·mean(g·w)`` is added back."""

    @staticmethod
    def forward(ctx, x: Tensor, weight: Tensor, eps: float) -> Tensor:
        xf = x if x.dtype in (torch.float32, torch.float64) else x.float()
        # ||x||² / d in one read of x (no x² temporary)
        rstd = torch.linalg.vector_norm(xf, dim=-1, keepdim=True).square_().div_(x.shape[-1]).add_(eps).rsqrt_()
        ctx.save_for_backward(x, rstd, weight)
        y = torch.mul(xf, rstd).to(x.dtype)
        return y.mul_(weight) if weight.dtype == y.dtype else y * weight

    @staticmethod
    def backward(ctx, *grads: Tensor):  # Function.backward's signature: one gradient per output
        (grad,) = grads
        x, rstd, weight = ctx.saved_tensors
        xf = x if x.dtype == rstd.dtype else x.float()
        g, w = grad.to(rstd.dtype), weight.to(rstd.dtype)
        d = x.shape[-1]
        mean = torch.zeros_like(rstd)
        grad_x, grad_w, _ = torch.ops.aten.native_layer_norm_backward(
            g, xf, [d], mean, rstd, w, None, [True, ctx.needs_input_grad[1], False]
        )
        grad_x.add_(
            torch.matmul(g, w).unsqueeze_(-1).mul_(rstd).div_(d)
        )  # [N, 1] row terms: cheaper than an addcmul_ of two
        return grad_x.to(x.dtype), None if grad_w is None else grad_w.to(weight.dtype), None


def rms_norm(x: Tensor, weight: Tensor, eps: float) -> Tensor:
    """RMSNorm whose backward is one fused kernel and a correction (autograd's decomposition: about ten passes)."""
    if _needs_grad(x, weight):
        return _RMSNorm.apply(x, weight, eps)
    return F.rms_norm(x, (x.shape[-1],), weight, eps)


def _rotate(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, out: Tensor | None = None) -> Tensor:
    """``x`` with each pair of its first ``2·cos.shape[-1]`` dims rotated by the angles of ``cos``/``sin``;
    pairs are (i, i + r/2) or, ``interleaved``, (2i, 2i + 1). The result is written straight into ``out``
    (a new tensor by default; no ``cat``); ``x`` and ``out`` may be strided views of larger tensors."""
    r = 2 * cos.shape[-1]
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device) if out is None else out
    if interleaved and x.dtype in _COMPLEX and _complex_view_ok(x) and _complex_view_ok(out):
        # adjacent pairs are complex numbers: one multiply, one pass (four real ops make five)
        turn = torch.complex(cos, sin).to(_COMPLEX[x.dtype])
        torch.mul(_as_complex(x[..., :r]), turn, out=_as_complex(out[..., :r]))
    else:
        pairs = (slice(0, r, 2), slice(1, r, 2)) if interleaved else (slice(0, r // 2), slice(r // 2, r))
        x1, x2, y1, y2 = x[..., pairs[0]], x[..., pairs[1]], out[..., pairs[0]], out[..., pairs[1]]
        torch.mul(x1, cos, out=y1).addcmul_(x2, sin, value=-1)  # x1·cos - x2·sin
        torch.mul(x2, cos, out=y2).addcmul_(x1, sin)  # x2·cos + x1·sin
    if r < x.shape[-1]:
        out[..., r:] = x[..., r:]
    return out


_COMPLEX = {torch.float32: torch.complex64, torch.float64: torch.complex128}


def rotates_as_complex(dtype: torch.dtype, head_dim: int) -> bool:
    """Does ``rotary_qkv`` rotate the interleaved pairs of a contiguous projection with this dtype and
    head size as complex numbers? (bf16/fp16 and an odd head size use four real products instead.)"""
    return dtype in _COMPLEX and head_dim % 2 == 0


def _complex_view_ok(x: Tensor) -> bool:
    """Can ``x``'s pairs be viewed as complex numbers: unit last stride, even strides and offset?"""
    return x.stride(-1) == 1 and x.storage_offset() % 2 == 0 and all(s % 2 == 0 for s in x.stride()[:-1])


def _as_complex(x: Tensor) -> Tensor:
    """``x`` ``[..., 2n]`` viewed as ``n`` complex numbers (2i real, 2i + 1 imaginary); no copy."""
    return torch.view_as_complex(x.unflatten(-1, (x.shape[-1] // 2, 2)))


def _rotate_traceable(x: Tensor, cos: Tensor, sin: Tensor, interleaved: bool) -> Tensor:
    """The same rotation as one expression, for ``torch.compile``: ``out=`` has no autograd there, and
    inductor fuses this into one kernel anyway."""
    r = 2 * cos.shape[-1]
    x1, x2 = (x[..., 0:r:2], x[..., 1:r:2]) if interleaved else (x[..., : r // 2], x[..., r // 2 : r])
    y1, y2 = x1 * cos - x2 * sin, x2 * cos + x1 * sin
    rotated = torch.stack((y1, y2), dim=-1).flatten(-2) if interleaved else torch.cat((y1, y2), dim=-1)
    return rotated if r == x.shape[-1] else torch.cat((rotated, x[..., r:]), dim=-1)


def _split_rotated(qk: Tensor, v: Tensor, n_head: int) -> tuple[Tensor, Tensor, Tensor]:
    return qk[:, :, :n_head], qk[:, :, n_head:], v


class _RotaryQKV(torch.autograd.Function):
    """Rotated queries, rotated keys and values of a fused projection. The backward rotates the first
    two gradients back (the rotation by minus the angles) straight into one gradient of the projection,
    beside the values' gradient: no ``cat`` to gather them."""

    @staticmethod
    def forward(ctx, qkv: Tensor, cos: Tensor, sin: Tensor, n_head: int, n_kv_head: int, interleaved: bool):
        ctx.save_for_backward(cos, sin)
        ctx.shape, ctx.dtype, ctx.heads, ctx.interleaved = qkv.shape, qkv.dtype, (n_head, n_kv_head), interleaved
        qk = _rotate(qkv[:, :, : n_head + n_kv_head], cos, sin, interleaved)
        return _split_rotated(qk, qkv[:, :, n_head + n_kv_head :], n_head)

    @staticmethod
    def backward(ctx, *grads: Tensor | None):  # Function.backward's signature: one gradient per output
        grad_q, grad_k, grad_v = grads
        cos, sin = ctx.saved_tensors
        back = -sin  # the rotation by minus the angles, for both gradients
        H, KV = ctx.heads
        grad = torch.empty(ctx.shape, dtype=ctx.dtype, device=cos.device)
        parts = grad[:, :, :H], grad[:, :, H : H + KV], grad[:, :, H + KV :]
        for g, part in zip((grad_q, grad_k), parts):
            if g is None:
                part.zero_()
            else:
                _rotate(g, cos, back, ctx.interleaved, out=part)
        if grad_v is None:
            parts[2].zero_()
        else:
            parts[2].copy_(grad_v)
        return grad, None, None, None, None, None


def rotary_qkv(
    qkv: Tensor, cos: Tensor, sin: Tensor, interleaved: bool, n_head: int, n_kv_head: int
) -> tuple[Tensor, Tensor, Tensor]:
    """Queries, keys and values ``[B, T, heads, head_dim]`` of a fused projection ``[B, T, H + 2·KV,
    head_dim]``, queries and keys rotated by RoPE with ``cos``/``sin`` ``[T, 1, r/2]`` (one angle per
    pair), in one pass over both; values are a view of the projection."""
    qk, v = qkv[:, :, : n_head + n_kv_head], qkv[:, :, n_head + n_kv_head :]
    if torch.compiler.is_compiling():
        return _split_rotated(_rotate_traceable(qk, cos, sin, interleaved), v, n_head)
    if _needs_grad(qkv):
        return _RotaryQKV.apply(qkv, cos, sin, n_head, n_kv_head, interleaved)
    return _split_rotated(_rotate(qk, cos, sin, interleaved), v, n_head)


# activation -> (forward, its aten backward writing into a given tensor)
_GATE_ACTIVATIONS = {
    "silu": (F.silu, lambda grad, x, out: torch.ops.aten.silu_backward.grad_input(grad, x, grad_input=out)),
    "gelu": (F.gelu, lambda grad, x, out: torch.ops.aten.gelu_backward.grad_input(grad, x, grad_input=out)),
    "gelu_tanh": (
        functools.partial(F.gelu, approximate="tanh"),
        lambda grad, x, out: torch.ops.aten.gelu_backward.grad_input(grad, x, approximate="tanh", grad_input=out),
    ),
    # relu(x)², whose derivative is 2·relu(x)
    "relu2": (lambda x: F.relu(x).square(), lambda grad, x, out: torch.mul(grad, 2 * F.relu(x), out=out)),
}


class _Gated(torch.autograd.Function):
    """``act(gate) * up`` of ``h = [gate | up]``; the backward writes both halves of the gradient in
    place, so no concatenation follows (autograd's chunk backward would copy them into one tensor), and
    allocates nothing else."""

    @staticmethod
    def forward(ctx, h: Tensor, activation: str) -> Tensor:
        gate, up = h.chunk(2, dim=-1)
        act = _GATE_ACTIVATIONS[activation][0](gate)
        ctx.save_for_backward(gate, up, act)
        ctx.activation = activation
        return act * up

    @staticmethod
    def backward(ctx, *grads: Tensor):  # Function.backward's signature: one gradient per output
        (grad,) = grads
        gate, up, act = ctx.saved_tensors
        f = gate.shape[-1]
        grad_h = grad.new_empty((*grad.shape[:-1], 2 * f))
        grad_gate = torch.mul(grad, up, out=grad_h[..., :f])  # the activation's upstream gradient, then
        _GATE_ACTIVATIONS[ctx.activation][1](grad_gate, gate, grad_gate)  # its backward in place: no temporary
        torch.mul(grad, act, out=grad_h[..., f:])
        return grad_h, None


def glu(h: Tensor, activation: str) -> Tensor:
    """``activation(gate) * up`` for ``h = [gate | up]`` along the last dim (SwiGLU: silu, GeGLU: gelu or gelu_tanh,
    relu2_glu: relu2)."""
    if _needs_grad(h):
        return _Gated.apply(h, activation)
    gate, up = h.chunk(2, dim=-1)
    return _GATE_ACTIVATIONS[activation][0](gate) * up
