"""RWKV-4's WKV (Peng et al. 2023, arXiv:2305.13048): per channel, a decayed average of the values weighted by
``exp(key)``, the current token's key raised by the bonus ``u``. With ``w = −exp(time_decay)`` and the state
``(a, b)`` after ``t − 1``, ``wkv_t = (a + e^(u+k_t) v_t) / (b + e^(u+k_t))``, then ``a ← e^w a + e^k_t v_t``,
``b ← e^w b + e^k_t``. Both forms keep every sum as a mantissa and a running maximum exponent ``p`` (the state
``(num, den, p)`` means ``num·e^p``, ``den·e^p``), so no exp overflows whatever the keys or the length: the
recurrence position by position (decoding), and a chunked parallel form (training)."""

from __future__ import annotations

from typing import Optional

import torch
from torch import Tensor

from archlab.nn.mixers.ops.float32 import without_autocast

EMPTY = -1e30  # the exponent of an empty state (num = den = 0), finite so that every difference of two is


def _fold(exps: Tensor, values: Tensor, weights: Tensor, dim: int) -> tuple[Tensor, Tensor, Tensor]:
    """``Σ e^exps·values``, ``Σ e^exps·weights`` over ``dim`` as mantissas beside their shared exponent (the
    maximum, at least EMPTY: an all −inf sum is the empty state)."""
    top = exps.amax(dim).clamp(min=EMPTY).detach()  # any shift gives the same sums: no gradient through it
    e = torch.exp(exps - top.unsqueeze(dim))
    return (e * values).sum(dim), (e * weights).sum(dim), top


def wkv_recurrent(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Optional[Tensor],
    fresh: Optional[Tensor],
    state: Optional[Tensor],
) -> tuple[Tensor, Tensor]:
    """``wkv`` ``[B, T, C]`` and the last state ``[B, C, 3]`` (num, den, p) for decay ``w`` and bonus ``u``
    ``[C]``, keys and values ``[B, T, C]``, from ``state`` (None: empty), position by position. ``keep``
    ``[B, T]`` (False: padding, which neither decays nor writes the state) and ``fresh`` ``[B, T]`` (True: a
    document starts, its state empty before it), each None for none."""
    B, T, C = k.shape
    if state is None:
        state = torch.stack((k.new_zeros(B, C), k.new_zeros(B, C), k.new_full((B, C), EMPTY)), dim=-1)
    num, den, p = state.unbind(-1)
    out = []
    for t in range(T):
        if fresh is not None:
            start = fresh[:, t, None]
            num, den = num.masked_fill(start, 0.0), den.masked_fill(start, 0.0)
            p = p.masked_fill(start, EMPTY)
        kt, vt = k[:, t], v[:, t]
        top = torch.maximum(p, u + kt)
        e_state, e_now = torch.exp(p - top), torch.exp(u + kt - top)
        out.append((e_state * num + e_now * vt) / (e_state * den + e_now))
        top = torch.maximum(p + w, kt)
        e_state, e_now = torch.exp(p + w - top), torch.exp(kt - top)
        step = (e_state * num + e_now * vt, e_state * den + e_now, top)
        if keep is not None:
            present = keep[:, t, None]
            step = tuple(torch.where(present, new, old) for new, old in zip(step, (num, den, p)))
        num, den, p = step
    return torch.stack(out, dim=1), torch.stack((num, den, p), dim=-1)


def wkv_chunked(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Optional[Tensor],
    fresh: Optional[Tensor],
    state: Optional[Tensor],
    chunk: int,
) -> tuple[Tensor, Tensor]:
    """What ``wkv_recurrent`` gives, in chunks of ``chunk`` positions: within every chunk at once, each
    position's sum over the chunk's earlier tokens (exponent ``k_i`` plus the decay between) and its own
    token's, as a log-sum-exp per channel; one step per chunk carries the state across; each position then
    adds the state entering its chunk, decayed to it (none after a document start in its chunk)."""
    B, T, C = k.shape
    pad = -T % chunk
    keep = k.new_ones(B, T, dtype=torch.bool) if keep is None else keep
    fresh = torch.zeros_like(keep) if fresh is None else fresh
    if pad:  # padded positions: they neither decay nor write, so the last state is the real last one's
        k, v = (torch.cat((x, x.new_zeros(B, pad, C)), dim=1) for x in (k, v))
        keep = torch.cat((keep, keep.new_zeros(B, pad)), dim=1)
        fresh = torch.cat((fresh, fresh.new_zeros(B, pad)), dim=1)
    n = k.shape[1] // chunk
    k, v = k.view(B, n, chunk, C), v.view(B, n, chunk, C)
    keep, fresh = keep.view(B, n, chunk), fresh.view(B, n, chunk)
    decay = torch.cumsum(w * keep[..., None].to(k.dtype), dim=2)  # [B, n, L, C]: decay through each position
    before = decay - w * keep[..., None].to(k.dtype)  # ...through the one before it (0 at the chunk's first)
    doc = fresh.long().cumsum(-1)  # [B, n, L]: documents begun in the chunk up to each position
    idx = torch.arange(chunk, device=k.device)
    # exps[t, i]: key i seen from t (earlier, present, same document), then t's own key with the bonus
    earlier = (idx[:, None] > idx[None, :]) & keep[:, :, None, :] & (doc[..., :, None] == doc[..., None, :])
    exps = before[:, :, :, None] - decay[:, :, None, :] + k[:, :, None]  # [B, n, t, i, C]
    exps = exps.masked_fill(~earlier[..., None], float("-inf"))
    exps = torch.cat((exps, (u + k)[:, :, :, None]), dim=3)
    values = torch.cat((v[:, :, None].expand(-1, -1, chunk, -1, -1), v[:, :, :, None]), dim=3)
    num, den, top = _fold(exps, values, torch.ones_like(values), dim=3)  # [B, n, L, C]
    # each chunk's own contribution to the state leaving it: its last document's present keys, decayed to the end
    last = keep & (doc == doc[..., -1:])
    ends = (decay[:, :, -1:] - decay + k).masked_fill(~last[..., None], float("-inf"))
    c_num, c_den, c_top = _fold(ends, v, torch.ones_like(v), dim=2)  # [B, n, C]
    carried_in = ~fresh.any(-1)  # [B, n]: the state entering the chunk survives it
    if state is None:
        state = torch.stack((k.new_zeros(B, C), k.new_zeros(B, C), k.new_full((B, C), EMPTY)), dim=-1)
    entering = []
    # chunk by chunk through unbind: its backward stacks the chunks' gradients once, where indexing chunk j
    # would zero-fill a whole-sequence gradient per chunk (quadratic in the chunks of a sequence)
    chunks = zip(*(t.unbind(1) for t in (carried_in, decay[:, :, -1], c_num, c_den, c_top)), strict=True)
    for carried_j, decay_j, c_num_j, c_den_j, c_top_j in chunks:  # the state entering chunk j, then leaving it
        entering.append(state)
        s_num, s_den, s_top = state.unbind(-1)
        s_top = torch.where(carried_j[:, None], s_top + decay_j, EMPTY)
        both = torch.stack((s_top, c_top_j), dim=-1)
        state = torch.stack(_fold(both, torch.stack((s_num, c_num_j), -1), torch.stack((s_den, c_den_j), -1), -1), -1)
    s_num, s_den, s_top = torch.stack(entering, dim=1)[:, :, None].unbind(-1)  # [B, n, 1, C]
    s_top = torch.where((doc == 0)[..., None], s_top + before, float("-inf"))  # no state after a start
    both = torch.stack((s_top.expand_as(top), top), dim=-1)
    o_num, o_den, _ = _fold(
        both, torch.stack((s_num.expand_as(num), num), -1), torch.stack((s_den.expand_as(den), den), -1), -1
    )
    return (o_num / o_den).flatten(1, 2)[:, :T], state


@without_autocast
def wkv(
    w: Tensor,
    u: Tensor,
    k: Tensor,
    v: Tensor,
    keep: Optional[Tensor],
    fresh: Optional[Tensor],
    state: Optional[Tensor],
    chunk: int,
) -> tuple[Tensor, Tensor]:
    """The WKV of ``k``, ``v`` ``[B, T, C]``: the recurrence for a step of one position (decoding), else chunks."""
    if k.shape[1] == 1:
        return wkv_recurrent(w, u, k, v, keep, fresh, state)
    return wkv_chunked(w, u, k, v, keep, fresh, state, chunk)
