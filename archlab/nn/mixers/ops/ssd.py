"""Mamba-2's state space duality (SSD) in its two numerical forms: the chunked parallel form that
training and prefill run and the recurrence that decoding runs."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from archlab.nn.mixers.ops.float32 import without_autocast


@without_autocast
def chunked_ssd(
    x: Tensor,
    dt: Tensor,
    A: Tensor,
    B: Tensor,
    C: Tensor,
    chunk: int,
    state: Optional[Tensor] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The SSD scan over ``T`` positions, ``chunk`` at a time: outputs ``[b, T, H, P]`` (without the D skip)
    and the final state ``[b, H, P, N]`` from inputs ``x`` ``[b, T, H, P]``, time steps ``dt`` ``[b, T, H]``,
    decay rates ``A`` ``[H]`` (negative), ``B`` and ``C`` ``[b, T, G, N]`` (head h reads group h·G/H) and an
    initial ``state`` (None: zeros).

    Within a chunk, with L_t = Σ_{s≤t} dt_s·A: ``y_t = Σ_{s≤t} exp(L_t − L_s)·(C_t·B_s)·dt_s·x_s +
    exp(L_t)·S₀·C_t`` and the next state ``exp(L_C)·S₀ + Σ_s exp(L_C − L_s)·dt_s·x_s·B_sᵀ``: every chunk's
    quadratic part and its own contribution to the state at once, then only the states pass from chunk
    to chunk. A sequence shorter than ``chunk`` is one chunk of its own length; a longer one is padded at
    the end with positions of dt = 0, which neither decay nor write. ``starts`` ``[b, T]`` (True: a document
    begins): the state is empty there, so nothing written before it reaches it or later positions."""
    b, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    r = H // G
    L = min(chunk, T)
    pad = -T % L
    if pad:
        x, dt, B, C = (F.pad(t, (0, 0) * (t.ndim - 2) + (0, pad)) for t in (x, dt, B, C))
    n = (T + pad) // L
    # heads as [group, head within it], positions as [chunk, position within it]; dt·x made contiguous in
    # that layout once (every product below reads it)
    dts = dt.view(b, n, L, G, r).permute(0, 3, 4, 1, 2)  # [b, G, r, n, L]
    xdt = (x.view(b, n, L, G, r, P).permute(0, 3, 4, 1, 2, 5) * dts[..., None]).contiguous()  # [b, G, r, n, L, P]
    Bs, Cs = (t.view(b, n, L, G, N).permute(0, 3, 1, 2, 4) for t in (B, C))  # [b, G, n, L, N]
    log_decay = (dts * A.view(G, r, 1, 1)).cumsum(-1)  # L_t within each chunk
    causal = torch.ones(L, L, dtype=torch.bool, device=x.device).tril()
    # exp(L_t − L_s) for s <= t, 0 above the diagonal (masked before exp: the differences there are positive)
    decay = (log_decay[..., :, None] - log_decay[..., None, :]).masked_fill_(~causal, float("-inf")).exp_()
    fresh, tail = None, None  # with starts: positions the chunk's initial state reaches; writes reaching its end
    if starts is not None:
        seg = torch.cat((starts, starts.new_zeros(b, pad)), dim=1).view(b, n, L).cumsum(-1)  # documents begun
        decay = decay * (seg[..., :, None] == seg[..., None, :])[:, None, None]
        fresh, tail = (seg == 0)[:, None, None], (seg == seg[..., -1:])[:, None, None]  # [b, 1, 1, n, L]
    y = ((Cs @ Bs.transpose(-1, -2))[:, :, None] * decay) @ xdt  # C_t·B_s per group, decayed per head
    to_end = (log_decay[..., -1:] - log_decay).exp()  # each position's decay to the chunk's end
    if tail is not None:
        to_end = to_end * tail
    written = (xdt * to_end[..., None]).transpose(-1, -2) @ Bs[:, :, None]  # [b, G, r, n, P, N]
    from_start = log_decay.exp() if fresh is None else log_decay.exp() * fresh  # the initial state's decay
    chunk_decay = from_start[..., -1, None, None]  # [b, G, r, n, 1, 1]
    S = x.new_zeros(b, G, r, P, N) if state is None else state.view(b, G, r, P, N)
    entering = []
    for decay_i, written_i in zip(chunk_decay.unbind(3), written.unbind(3), strict=True):  # unbind: see delta_rule.py
        entering.append(S)
        S = S * decay_i + written_i
    start = torch.stack(entering, dim=3)  # [b, G, r, n, P, N]: the state each chunk begins from
    y = y + (Cs[:, :, None] @ start.transpose(-1, -2)) * from_start[..., None]
    y = y.permute(0, 3, 4, 1, 2, 5).reshape(b, n * L, H, P)[:, :T]
    return y, S.reshape(b, H, P, N)


@without_autocast
def recurrent_ssd(
    x: Tensor, dt: Tensor, A: Tensor, B: Tensor, C: Tensor, state: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """The SSD recurrence one position at a time (decoding), with ``chunked_ssd``'s arguments and results:
    decay the state by exp(dt·A), write dt·x·Bᵀ, read it with C."""
    b, T, H, P = x.shape
    G, N = B.shape[2], B.shape[3]
    B, C = (t.repeat_interleave(H // G, dim=2) for t in (B, C))  # [b, T, H, N]
    S = x.new_zeros(b, H, P, N) if state is None else state
    out = []
    for t in range(T):
        step = dt[:, t, :, None, None]  # [b, H, 1, 1]
        S = S * (step * A[:, None, None]).exp() + step * x[:, t, :, :, None] * B[:, t, :, None, :]
        out.append((S * C[:, t, :, None, :]).sum(-1))
    return torch.stack(out, dim=1), S
