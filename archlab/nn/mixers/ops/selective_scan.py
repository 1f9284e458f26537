"""Mamba-1's selective scan, ``h_t = a_t ⊙ h_{t−1} + u_t``, ``y_t = h_t · C_t``, over states ``[b, T, D, N]``
(a decay and a write per channel and state dim): a chunked parallel form for training and prefill, and the
one-step recurrence for decoding. Every product is of decays in (0, 1], so the parallel form is as stable as
the recurrence."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor


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


def recurrent_scan(a: Tensor, u: Tensor, C: Tensor, state: Optional[Tensor]) -> tuple[Tensor, Tensor]:
    """The same scan one position at a time (decoding): ``y`` ``[b, T, D]`` and the last state."""
    h = u.new_zeros(u.shape[0], u.shape[2], u.shape[3]) if state is None else state
    ys = []
    for t in range(u.shape[1]):
        h = a[:, t] * h + u[:, t]
        ys.append(torch.einsum("bdn,bn->bd", h, C[:, t]))
    return torch.stack(ys, dim=1), h
