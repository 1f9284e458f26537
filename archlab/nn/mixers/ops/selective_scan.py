"""Mamba-1's selective scan, ``h_t = a_t ⊙ h_{t−1} + u_t``, ``y_t = h_t · C_t``, over states ``[b, T, D, N]``
(a decay and a write per channel and state dim), in two forms that ``scan`` picks between by device: a
chunked parallel one, and the recurrence position by position with its backward written out (the CPU's,
and decoding's). Every product is of decays in (0, 1], so the parallel form is as stable as the recurrence."""

from __future__ import annotations

from typing import Any, Optional

import torch
from torch import Tensor

from archlab.nn.mixers.ops.float32 import without_autocast

SEQUENTIAL_DEVICES = {"cpu"}  # device types whose scans run position by position (the tests empty it to run chunks)


def chunked_scan(a: Tensor, u: Tensor, C: Tensor, chunk: int, state: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``y`` ``[b, T, D]`` and the last state ``[b, D, N]`` of the scan from ``state`` (None: zeros), for decays
    ``a`` and writes ``u`` ``[b, T, D, N]`` and readouts ``C`` ``[b, T, N]``. Within each chunk of ``chunk``
    positions, all chunks at once, a Hillis–Steele scan (log2 chunk doubling steps) gives each position's
    state from the chunk's start and the decay since it; one step per chunk then carries the state across."""
    b, T, D, N = u.shape
    pad = -T % chunk
    if pad:  # decay 1 and write 0: the padded tail leaves the last state as it was
        a = torch.cat((a, a.new_ones(b, pad, D, N)), dim=1)
        u = torch.cat((u, u.new_zeros(b, pad, D, N)), dim=1)
    a, h = a.unflatten(1, (-1, chunk)), u.unflatten(1, (-1, chunk))  # [b, chunks, chunk, D, N]
    step = 1
    while step < chunk:  # position t takes in t − step: after it, each covers the 2·step positions up to it
        h = torch.cat((h[:, :, :step], h[:, :, step:] + a[:, :, step:] * h[:, :, :-step]), dim=2)
        a = torch.cat((a[:, :, :step], a[:, :, step:] * a[:, :, :-step]), dim=2)
        step *= 2
    carry = u.new_zeros(b, D, N) if state is None else state
    carried = []
    for k in range(h.shape[1]):  # the state entering chunk k, then the one leaving it
        carried.append(carry)
        carry = a[:, k, -1] * carry + h[:, k, -1]
    h = h + a * torch.stack(carried, dim=1)[:, :, None]
    h = h.flatten(1, 2)[:, :T]
    return torch.einsum("btdn,btn->btd", h, C), carry


class _SequentialScan(torch.autograd.Function):
    """The recurrence position by position, with its adjoint written out: the forward keeps every state
    ``H`` (one ``[b, T, D, N]`` tensor) and nothing per step, and the backward runs the recurrence in reverse,
    ``G_t = C_t ⊗ dy_t + a_{t+1} ⊙ G_{t+1}``, whence ``du = G``, ``da_t = G_t ⊙ h_{t−1}`` and
    ``dC_t = Σ_d dy_t[d] h_t[d]``: a few ops on ``[b, D, N]`` per position, where autograd through the loop
    would save each step's tensors and the chunked form makes log2 chunk passes over the whole sequence."""

    @staticmethod
    def forward(ctx: Any, a: Tensor, u: Tensor, C: Tensor, state: Tensor) -> tuple[Tensor, Tensor]:
        H = torch.empty_like(u)
        h = state
        for t in range(u.shape[1]):
            h = torch.addcmul(u[:, t], a[:, t], h)
            H[:, t] = h
        ctx.save_for_backward(a, C, H, state)
        return torch.einsum("btdn,btn->btd", H, C), h

    @staticmethod
    def backward(ctx: Any, *grads: Tensor) -> tuple[Tensor, Tensor, Tensor, Tensor]:  # one gradient per output
        dy, dlast = grads
        a, C, H, state = ctx.saved_tensors
        G = dy[..., None] * C[:, :, None, :]  # the readout's share of each state's gradient, then the carried one
        G[:, -1] += dlast
        for t in range(G.shape[1] - 2, -1, -1):
            G[:, t].addcmul_(a[:, t + 1], G[:, t + 1])
        before = torch.cat((state[:, None], H[:, :-1]), dim=1)  # h_{t−1}
        return G * before, G, torch.einsum("btd,btdn->btn", dy, H), a[:, 0] * G[:, 0]


@without_autocast
def scan(a: Tensor, u: Tensor, C: Tensor, chunk: int, state: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """``y`` ``[b, T, D]`` and the last state ``[b, D, N]`` of the scan from ``state`` (None: zeros), by the
    form fastest where it runs: position by position on the CPU (``[b, D, N]`` per step is little work, and
    the whole-sequence passes of the chunked form cost more in memory traffic than they save), else chunked
    (a GPU runs the doubling steps' elementwise ops at once where a loop would launch kernels per position).
    Without autocast, the readout keeps the state's dtype, and the written backward gets its gradient in it."""
    if a.device.type in SEQUENTIAL_DEVICES or u.shape[1] == 1:
        return _SequentialScan.apply(a, u, C, u.new_zeros(u.shape[0], *u.shape[2:]) if state is None else state)
    return chunked_scan(a, u, C, chunk, state)
