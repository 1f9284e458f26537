"""The selective scan's two forms (archlab/nn/mixers/ops/selective_scan.py), ``h_t = a_t ⊙ h_{t−1} + u_t``,
``y_t = h_t · C_t``: the chunked parallel one (chunks that do and do not divide the length) and the
position-by-position one with its backward written out, against the recurrence written in the test in
float64, from zeros and from a given state; the written backward against finite differences
(``gradcheck``) and against autograd through the chunked form; ``scan`` picks by device."""

from __future__ import annotations

import pytest
import torch

from archlab.nn.mixers.ops import selective_scan
from archlab.nn.mixers.ops.selective_scan import chunked_scan, scan

B, T, D, N = 2, 11, 3, 4


def inputs(seed: int = 0, start: bool = True) -> tuple[torch.Tensor, ...]:
    """Decays in (0.05, 0.95), writes, readouts and a starting state (zeros where not ``start``), float64."""
    g = torch.Generator().manual_seed(seed)
    a = torch.rand(B, T, D, N, generator=g, dtype=torch.float64) * 0.9 + 0.05
    u, C = torch.randn(B, T, D, N, generator=g, dtype=torch.float64), torch.randn(B, T, N, generator=g).double()
    state = torch.randn(B, D, N, generator=g, dtype=torch.float64) if start else torch.zeros(B, D, N).double()
    return a, u, C, state


def by_hand(a, u, C, state):
    h, ys = state, []
    for t in range(a.shape[1]):
        h = a[:, t] * h + u[:, t]
        ys.append((h * C[:, t, None, :]).sum(-1))
    return torch.stack(ys, dim=1), h


def sequential(a, u, C, state):
    return scan(a, u, C, 4, state)  # on the CPU: position by position


@pytest.mark.parametrize("form", ["sequential", "chunk 1", "chunk 4", "chunk 16"])
@pytest.mark.parametrize("start", [False, True])
def test_each_form_is_the_recurrence(form, start):
    a, u, C, state = inputs(start=start)
    if form == "sequential":
        got = sequential(a, u, C, state)
    else:
        got = chunked_scan(a, u, C, int(form.split()[1]), state)
    for ours, expected in zip(got, by_hand(a, u, C, state)):
        torch.testing.assert_close(ours, expected, rtol=0, atol=1e-12)


def test_the_written_backward_is_the_gradient():
    """Finite differences of every input (the starting state too), and the gradients autograd takes through
    the chunked form, of a loss reading both the outputs and the last state."""
    args = [t.requires_grad_() for t in inputs(seed=1)]
    assert torch.autograd.gradcheck(sequential, args)

    def grads(fn):
        y, h = fn(*args)
        w = torch.linspace(-1, 1, h.numel(), dtype=h.dtype).view_as(h)
        return torch.autograd.grad((y**2).sum() + (h * w).sum(), args)

    for ours, chunked in zip(grads(sequential), grads(lambda a, u, C, s: chunked_scan(a, u, C, 4, s))):
        torch.testing.assert_close(ours, chunked, rtol=0, atol=1e-12)


def test_scan_runs_position_by_position_on_the_cpu_else_in_chunks(monkeypatch):
    a, u, C, state = (t.requires_grad_() for t in inputs())
    assert type(scan(a, u, C, 4, state)[0].grad_fn).__name__ == "_SequentialScanBackward"
    monkeypatch.setattr(selective_scan, "SEQUENTIAL_DEVICES", set())
    assert type(scan(a, u, C, 4, state)[0].grad_fn).__name__ != "_SequentialScanBackward"
    one = scan(a[:, :1], u[:, :1], C[:, :1], 4, state)[0]  # decoding's one position: the recurrence anywhere
    assert type(one.grad_fn).__name__ == "_SequentialScanBackward"


@pytest.mark.parametrize("sequential_devices", [{"cpu"}, set()])
def test_bf16_autocast_leaves_the_scan_in_float32(monkeypatch, sequential_devices):
    """Trained under bf16-mixed (``trainer.precision=auto`` on a CPU with native bf16), the scan gives what
    it gives in float32, readout included, and its backward runs (the readout's gradient reaching the
    written backward in bf16 once failed there)."""
    monkeypatch.setattr(selective_scan, "SEQUENTIAL_DEVICES", sequential_devices)
    args = [t.float().requires_grad_() for t in inputs(seed=2)]
    y, h = scan(*args[:3], 4, args[3])
    expected = torch.autograd.grad((y**2).sum() + h.sum(), args)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y_mixed, h_mixed = scan(*args[:3], 4, args[3])
    assert y_mixed.dtype == h_mixed.dtype == torch.float32
    torch.testing.assert_close((y_mixed, h_mixed), (y, h), rtol=0, atol=0)
    got = torch.autograd.grad((y_mixed**2).sum() + h_mixed.sum(), args)
    torch.testing.assert_close(got, expected, rtol=0, atol=0)
