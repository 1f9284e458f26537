"""The hand-written backward passes of archlab.nn.fused against autograd through the plain formulas."""

import math

import pytest
import torch

from archlab.nn.fused import glu, rms_norm, rotary_qkv

F64 = torch.float64


def _grads(fn, *inputs):
    """Output and input gradients of ``fn`` for a fixed random upstream gradient."""
    leaves = [t.detach().clone().requires_grad_(True) for t in inputs]
    out = fn(*leaves)
    upstream = torch.randn(out.shape, generator=torch.Generator().manual_seed(1), dtype=F64).to(out.dtype)
    grads = torch.autograd.grad(out, leaves, upstream)
    return out.detach(), grads


def _reference_rms_norm(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def _reference_rotary(x, cos, sin, interleaved):
    """RoPE as in the papers: pairs (i, i + r/2) or (2i, 2i + 1), each rotated by its angle."""
    r = 2 * cos.shape[-1]
    if interleaved:
        x1, x2 = x[..., 0:r:2], x[..., 1:r:2]
        rot = torch.stack((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1).flatten(-2)
    else:
        x1, x2 = x[..., : r // 2], x[..., r // 2 : r]
        rot = torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)
    return torch.cat((rot, x[..., r:]), dim=-1)


def test_rms_norm_matches_the_formula_and_its_gradients():
    torch.manual_seed(0)
    x, w = 3 * torch.randn(2, 5, 16, dtype=F64), torch.randn(16, dtype=F64)
    out, grads = _grads(lambda x, w: rms_norm(x, w, 1e-5), x, w)
    ref_out, ref_grads = _grads(lambda x, w: _reference_rms_norm(x, w, 1e-5), x, w)
    torch.testing.assert_close(out, ref_out, rtol=1e-12, atol=1e-12)
    for g, ref in zip(grads, ref_grads):
        torch.testing.assert_close(g, ref, rtol=1e-10, atol=1e-10)


def test_rms_norm_keeps_low_precision_dtypes_and_computes_statistics_in_float32():
    torch.manual_seed(0)
    x, w = torch.randn(4, 64).bfloat16(), torch.randn(64).bfloat16()
    out, (gx, gw) = _grads(lambda x, w: rms_norm(x, w, 1e-6), x, w)
    assert out.dtype == gx.dtype == gw.dtype == torch.bfloat16
    ref, (rx, rw) = _grads(lambda x, w: _reference_rms_norm(x.double(), w.double(), 1e-6), x, w)
    torch.testing.assert_close(out.double(), ref, rtol=2e-2, atol=2e-2)  # bf16 rounding only
    torch.testing.assert_close(gx.double(), rx.double(), rtol=5e-2, atol=5e-2)
    torch.testing.assert_close(gw.double(), rw.double(), rtol=5e-2, atol=5e-2)


T, H, KV = 6, 3, 1


def _qkv_shapes(head_dim=8):
    """Shapes of q, k and v: batch 2, T positions, H query heads and KV key/value heads."""
    return [(2, T, n, head_dim) for n in (H, KV, KV)]


def _reference_rotary_qkv(qkv, cos, sin, interleaved, n_head, n_kv_head):
    q, k, v = qkv.split((n_head, n_kv_head, n_kv_head), dim=2)
    return _reference_rotary(q, cos, sin, interleaved), _reference_rotary(k, cos, sin, interleaved), v


def _qkv_loss(fn, head_dim=8):
    """One scalar of q, k and v with different random weights, so each part's gradient is checked."""
    shapes = _qkv_shapes(head_dim)
    weights = [torch.randn(s, generator=torch.Generator().manual_seed(i), dtype=F64) for i, s in enumerate(shapes)]
    return lambda qkv: sum((part * w).sum() for part, w in zip(fn(qkv), weights))


@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("rotated", [8, 4])  # the whole head, or the first 4 of 8 dims
def test_rotary_qkv_matches_the_formula_and_its_gradient(interleaved, rotated):
    torch.manual_seed(0)
    angle = torch.arange(T, dtype=F64)[:, None, None] * torch.rand(rotated // 2, dtype=F64)  # [T, 1, r/2]
    cos, sin = angle.cos(), angle.sin()
    qkv = torch.randn(2, T, H + 2 * KV, 8, dtype=F64)  # a fused projection's output
    ours = lambda t: rotary_qkv(t, cos, sin, interleaved, H, KV)  # noqa: E731
    ref = lambda t: _reference_rotary_qkv(t, cos, sin, interleaved, H, KV)  # noqa: E731
    for part, expected, shape in zip(ours(qkv), ref(qkv), _qkv_shapes()):
        assert part.shape == shape
        torch.testing.assert_close(part, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(part.norm(dim=-1), expected.norm(dim=-1))  # a rotation keeps lengths
    _, (g,) = _grads(_qkv_loss(ours), qkv)
    _, (ref_g,) = _grads(_qkv_loss(ref), qkv)
    torch.testing.assert_close(g, ref_g, rtol=1e-12, atol=1e-12)
    assert torch.autograd.gradcheck(_qkv_loss(ours), (qkv.clone().requires_grad_(True),))


@pytest.mark.parametrize("dtype, head_dim", [(torch.bfloat16, 8), (F64, 9)], ids=["bfloat16", "odd-head-dim"])
def test_rotary_qkv_without_a_complex_view_rotates_the_same_pairs(dtype, head_dim):
    """Interleaved pairs are rotated as complex numbers where the dtype and strides allow; else (bf16, an
    odd head_dim) by real products over the same pairs."""
    torch.manual_seed(0)
    angle = torch.arange(T, dtype=F64)[:, None, None] * torch.rand(2, dtype=F64)  # 4 of the dims rotated
    cos, sin = angle.cos(), angle.sin()
    qkv = torch.randn(2, T, H + 2 * KV, head_dim, dtype=F64)
    ours = lambda t: rotary_qkv(t, cos.to(dtype), sin.to(dtype), True, H, KV)  # noqa: E731
    ref = lambda t: _reference_rotary_qkv(t, cos, sin, True, H, KV)  # noqa: E731
    tol = 1e-12 if dtype == F64 else 2e-2
    for part, expected in zip(ours(qkv.to(dtype)), ref(qkv)):
        assert part.dtype == dtype
        torch.testing.assert_close(part.double(), expected, rtol=tol, atol=tol)
    _, (g,) = _grads(_qkv_loss(ours, head_dim), qkv.to(dtype))
    _, (ref_g,) = _grads(_qkv_loss(ref, head_dim), qkv)
    assert g.dtype == dtype
    torch.testing.assert_close(g.double(), ref_g, rtol=tol * 2, atol=tol * 2)


def test_rotary_qkv_gradient_with_an_unused_output():
    """An output that takes no part in the loss (its gradient arrives as None) gets a zero gradient."""
    torch.manual_seed(0)
    angle = torch.arange(T, dtype=F64)[:, None, None] * torch.rand(4, dtype=F64)
    qkv = torch.randn(2, T, H + 2 * KV, 8, dtype=F64, requires_grad=True)
    q, k, v = rotary_qkv(qkv, angle.cos(), angle.sin(), False, H, KV)
    (q.sum() + v.sum()).backward()
    assert qkv.grad[:, :, H : H + KV].abs().max() == 0
    assert qkv.grad[:, :, H + KV :].eq(1).all() and qkv.grad[:, :, :H].abs().min() > 0


@pytest.mark.parametrize("interleaved", [False, True])
def test_rotary_under_torch_compile_uses_a_formula_with_the_same_values(interleaved, monkeypatch):
    """Compiled code cannot write through ``out=`` with autograd; its formula must agree with eager's."""
    angle = torch.arange(T, dtype=F64)[:, None, None] * torch.rand(2, dtype=F64)
    cos, sin = angle.cos(), angle.sin()
    qkv = torch.randn(2, T, H + 2 * KV, 8, dtype=F64)
    eager = rotary_qkv(qkv, cos, sin, interleaved, H, KV)
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: True)
    compiled_path = lambda t: rotary_qkv(t, cos, sin, interleaved, H, KV)  # noqa: E731
    for part, expected, ref in zip(compiled_path(qkv), eager, _reference_rotary_qkv(qkv, cos, sin, interleaved, H, KV)):
        torch.testing.assert_close(part, expected, rtol=1e-12, atol=1e-12)
        torch.testing.assert_close(part, ref, rtol=1e-12, atol=1e-12)
    _, (g,) = _grads(_qkv_loss(compiled_path), qkv)
    monkeypatch.undo()
    _, (ref_g,) = _grads(_qkv_loss(lambda t: _reference_rotary_qkv(t, cos, sin, interleaved, H, KV)), qkv)
    torch.testing.assert_close(g, ref_g, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(
    "activation, act",
    [("silu", lambda g: g * torch.sigmoid(g)), ("gelu", lambda g: 0.5 * g * (1 + torch.erf(g / math.sqrt(2))))],
)
def test_glu_matches_the_formula_and_its_gradient(activation, act):
    torch.manual_seed(0)
    h = 2 * torch.randn(3, 4, 2 * 10, dtype=F64)
    out, (g,) = _grads(lambda h: glu(h, activation), h)
    ref, (ref_g,) = _grads(lambda h: act(h[..., :10]) * h[..., 10:], h)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(g, ref_g, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", ["rms_norm", "rotary", "glu"])
def test_inference_path_equals_the_autograd_path(name):
    """Without autograd (decoding) the functions skip the Function machinery; values agree."""
    torch.manual_seed(0)
    cos, sin = torch.rand(3, 1, 4, dtype=F64), torch.rand(3, 1, 4, dtype=F64)
    fn, shape = {
        "rms_norm": (lambda t: rms_norm(t, torch.linspace(0.5, 2, 8, dtype=F64), 1e-5), (2, 3, 5, 8)),
        "rotary": (lambda t: torch.cat(rotary_qkv(t, cos, sin, False, 3, 1), dim=2), (2, 3, 5, 8)),
        "glu": (lambda t: glu(t, "silu"), (2, 5, 8)),
    }[name]
    x = torch.randn(shape, dtype=F64, requires_grad=True)
    recorded = fn(x)
    with torch.inference_mode():
        plain = fn(x.detach())
    assert recorded.grad_fn is not None and plain.grad_fn is None
    torch.testing.assert_close(plain, recorded.detach(), rtol=1e-12, atol=1e-12)
