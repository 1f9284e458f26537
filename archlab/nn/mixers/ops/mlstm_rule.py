"""The mLSTM's rule (xLSTM's matrix memory with exponential gates, stabilised by a running max): the chunked
parallel form that training and prefill run and the recurrence that decoding runs, on ``[B, H, T, d]``
operands. The state of a head is ``(C, n, m)``: the ``dk × dv`` memory, the ``dk`` normaliser and the scalar
stabiliser, packed flat by ``pack_state`` as the KV cache keeps it."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from archlab.nn.mixers.ops.float32 import without_autocast

State = tuple[Tensor, Tensor, Tensor]  # C [B, H, dk, dv], n [B, H, dk], m [B, H]


def empty_state(B: int, H: int, dk: int, dv: int, like: Tensor) -> State:
    """The state before any token: C and n zero and the stabiliser m = 0 (xLSTM's, not −inf)."""
    return like.new_zeros(B, H, dk, dv), like.new_zeros(B, H, dk), like.new_zeros(B, H)


def pack_state(state: State) -> Tensor:
    """``(C, n, m)`` as one ``[B, H, dk·dv + dk + 1]`` tensor (what the KV cache holds per layer)."""
    C, n, m = state
    return torch.cat((C.flatten(2), n, m[..., None]), dim=-1)


def unpack_state(packed: Tensor, dk: int, dv: int) -> State:
    """``pack_state``'s inverse."""
    C, n, m = packed.split((dk * dv, dk, 1), dim=-1)
    return C.unflatten(-1, (dk, dv)), n, m[..., 0]


def read(num: Tensor, den: Tensor, m: Tensor, eps: float) -> Tensor:
    """``h = num / (max(|den|, exp(−m)) + eps)``: the stabilised numerator over the normaliser's read,
    floored at 1 in the unstabilised scale (``exp(−m)`` here)."""
    return num / (torch.maximum(den.abs(), torch.exp(-m)) + eps)[..., None]


@without_autocast
def chunked_mlstm_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    i: Tensor,
    log_f: Tensor,
    chunk: int,
    eps: float,
    state: Optional[State] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, State]:
    """Outputs ``[B, H, T, dv]`` and the final state from ``q`` (already scaled), ``k`` ``[B, H, T, dk]``,
    ``v`` ``[B, H, T, dv]``, input-gate preactivations ``i`` and forget-gate log-sigmoids ``log_f``
    ``[B, H, T]`` (a padded position: i = −inf, log_f = 0, which leaves the state as it is). Within a chunk,
    with ``b_t`` the cumulative ``log_f``, token j reaches t ≥ j with log-weight ``b_t − b_j + i_j``, and the
    state carried in with ``b_t + m₀``; ``m_t`` is their max, each weight is ``exp(· − m_t)`` (≤ 1: no
    overflow however large the gates). ``starts`` ``[B, T]``: a document's first position sees neither the
    earlier tokens nor the carried state, but an empty state (m = 0) decayed from there, as alone."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    C = min(chunk, T)
    pad = -T % C
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        i, log_f = F.pad(i, (0, pad), value=-torch.inf), F.pad(log_f, (0, pad))
    n = (T + pad) // C
    q, k, v = (x.unflatten(2, (n, C)) for x in (q, k, v))  # [B, H, n, C, d]
    i, log_f = i.unflatten(2, (n, C)), log_f.unflatten(2, (n, C))
    b = log_f.cumsum(-1)  # [B, H, n, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    log_w = b[..., :, None] - b[..., None, :] + i[..., None, :]  # [B, H, n, C(t), C(j)]
    base = torch.zeros_like(b)  # b before the position's document began within the chunk (0: none began)
    carried = torch.ones_like(b, dtype=torch.bool)  # the state carried into the chunk reaches the position
    if starts is not None:
        s = F.pad(starts, (0, pad)).unflatten(1, (n, C))[:, None]  # [B, 1, n, C]
        seg = s.cumsum(-1)
        causal = causal & (seg[..., :, None] == seg[..., None, :])
        index = torch.arange(C, device=q.device).expand_as(s)
        last = torch.where(s, index, -1).cummax(-1).values  # the last start at or before each position
        before = (b - log_f).expand(B, H, n, C)  # b just before each position
        base = torch.where(last >= 0, before.gather(-1, last.clamp(min=0).expand(B, H, n, C)), base)
        carried = (last < 0).expand(B, H, n, C)
    log_w = log_w.masked_fill(~causal, -torch.inf)
    intra_max = log_w.amax(-1)  # [B, H, n, C]
    scores = (q @ k.transpose(-1, -2)).masked_fill(~causal, 0.0)
    carry_base = b - base  # the carried (or emptied) state's log-decay to each position, before its m₀
    Cs, ns, ms = state if state is not None else empty_state(B, H, dk, dv, q)
    states = []  # the state entering each chunk: a sequential pass over the chunks' last positions
    # chunk by chunk through unbind: its backward stacks the chunks' gradients once, where indexing chunk c
    # would zero-fill a whole-sequence gradient per chunk (quadratic in the chunks of a sequence)
    ends = (carry_base[..., -1], carried[..., -1], intra_max[..., -1], log_w[..., -1, :], k, v)
    for base_c, carried_c, intra_c, log_w_c, k_c, v_c in zip(*(t.unbind(2) for t in ends), strict=True):
        states.append((Cs, ns, ms))
        carry = base_c + torch.where(carried_c, ms, torch.zeros_like(ms))
        m_end = torch.maximum(carry, intra_c)
        keep_end = torch.exp(carry - m_end) * carried_c
        k_end = k_c * torch.exp(log_w_c - m_end[..., None])[..., None]
        Cs = keep_end[..., None, None] * Cs + k_end.transpose(-1, -2) @ v_c
        ns = keep_end[..., None] * ns + k_end.sum(-2)
        ms = m_end
    C0, n0, m0 = (torch.stack(t, dim=2) for t in zip(*states, strict=True))  # [B, H, n, ...]
    carry = carry_base + torch.where(carried, m0[..., None], torch.zeros_like(m0[..., None]))
    m = torch.maximum(carry, intra_max)  # [B, H, n, C]
    weighted = scores * torch.exp(log_w - m[..., None])
    keep = torch.exp(carry - m) * carried
    num = keep[..., None] * (q @ C0) + weighted @ v
    den = keep * (q @ n0[..., None])[..., 0] + weighted.sum(-1)
    return read(num, den, m, eps).flatten(2, 3)[:, :, :T], (Cs, ns, ms)


@without_autocast
def recurrent_mlstm_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    i: Tensor,
    log_f: Tensor,
    eps: float,
    state: Optional[State] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, State]:
    """The rule one position at a time (decoding), with ``chunked_mlstm_rule``'s arguments and results:
    ``m_t = max(log_f_t + m_{t−1}, i_t)``, ``C_t = exp(log_f_t + m_{t−1} − m_t)·C_{t−1} + exp(i_t − m_t)·k_t·v_tᵀ``
    (n_t alike with k_t), ``h_t = C_tᵀq_t / (max(|n_t·q_t|, exp(−m_t)) + eps)``."""
    B, H, T, dk = k.shape
    Cs, ns, ms = state if state is not None else empty_state(B, H, dk, v.shape[-1], q)
    out = []
    for t in range(T):
        if starts is not None:  # a document begins: the empty state
            fresh = ~starts[:, None, t]  # [B, 1]
            Cs, ns, ms = Cs * fresh[..., None, None], ns * fresh[..., None], ms * fresh
        m = torch.maximum(log_f[:, :, t] + ms, i[:, :, t])
        keep, write = torch.exp(log_f[:, :, t] + ms - m), torch.exp(i[:, :, t] - m)
        k_t = k[:, :, t] * write[..., None]
        Cs = keep[..., None, None] * Cs + k_t[..., :, None] * v[:, :, t, None, :]
        ns = keep[..., None] * ns + k_t
        ms = m
        q_t = q[:, :, t]
        out.append(read((q_t[..., None] * Cs).sum(-2), (q_t * ns).sum(-1), m, eps))
    return torch.stack(out, dim=2), (Cs, ns, ms)
