"""Kimi Delta Attention's rule (the gated delta rule with a decay per key channel): the chunked parallel form
that training and prefill run and the recurrence that decoding runs, on ``[B, H, T, d]`` operands."""

from __future__ import annotations

import math
from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from archlab.nn.mixers.ops.float32 import without_autocast

SUB = 8  # positions per block inside a chunk whose pairs take the per-channel decay difference directly


def decayed_products(a: Tensor, b: Tensor, G: Tensor, sub: int) -> Tensor:
    """``P_ts = Σ_c a_tc·b_sc·exp(G_tc − G_sc)`` for ``s ≤ t``, 0 above, from ``a`` ``[..., C, dk]`` and ``b``,
    ``G`` (cumulative log-decays, non-increasing along C) ``[..., C, dk]``; ``a`` may carry extra leading
    dims. Every exponent is a difference ``≤ 0``, never ``exp(G)·exp(−G)`` (which overflows once a chunk
    decays by more than float32 holds): pairs within one block of ``sub`` positions take ``G_t − G_s``
    itself ([sub, sub, dk] per block); a pair across blocks splits at the position before the row's block,
    ``r``: ``exp(G_t − G_r)·exp(G_r − G_s)``, both ≤ 1, so it is one matmul."""
    C, dk = G.shape[-2:]
    m = C // sub
    blocks = a.unflatten(-2, (m, sub)), b.unflatten(-2, (m, sub)), G.unflatten(-2, (m, sub))  # [..., m, sub, dk]
    ref = torch.cat((G[..., :1, :], G[..., sub - 1 : C - 1 : sub, :]), dim=-2)  # [..., m, dk]; block 0: unused
    index = torch.arange(C, device=G.device)
    earlier = index < index[::sub, None]  # [m, C]: column s lies in a block before row block i
    toward = (ref[..., :, None, :] - G[..., None, :, :]).masked_fill(~earlier[..., None], -math.inf)
    left = blocks[0] * (blocks[2] - ref[..., None, :]).exp()  # [..., m, sub, dk]
    cross = left @ (b[..., None, :, :] * toward.exp()).transpose(-1, -2)  # [..., m, sub, C]
    causal = torch.ones(sub, sub, dtype=torch.bool, device=G.device).tril()
    within = (blocks[2][..., :, None, :] - blocks[2][..., None, :, :]).masked_fill(~causal[..., None], -math.inf)
    diag = (blocks[0][..., :, None, :] * blocks[1][..., None, :, :] * within.exp()).sum(-1)  # [..., m, sub, sub]
    eye = torch.eye(m, dtype=diag.dtype, device=G.device)[:, None, :, None]  # block i's columns in row block i
    return (cross.unflatten(-1, (m, sub)) + diag[..., :, :, None, :] * eye).flatten(-2).flatten(-3, -2)


@without_autocast
def chunked_kda_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk: int,
    state: Optional[Tensor] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The rule over ``T`` positions, ``chunk`` at a time: outputs ``[B, H, T, dv]`` and the final state
    ``[B, H, dk, dv]`` from ``q``, ``k`` ``[B, H, T, dk]``, ``v`` ``[B, H, T, dv]``, log-decays ``g``
    ``[B, H, T, dk]`` (one per key channel), write strengths ``beta`` ``[B, H, T]`` and an initial ``state``
    (None: zeros). ``delta_rule.chunked_delta_rule``'s algebra with the scalar γ_t/γ_s a diagonal: within a
    chunk, with Γ_t = exp(G_t), G_t = g_1 + ... + g_t per channel, ``U = (I + A)⁻¹·(β·V − β·(Γ·K)·S₀)``,
    ``A_ts = β_t·Σ_c k_tc·k_sc·Γ_tc/Γ_sc`` for s < t; ``O = (Γ·Q)·S₀ + P(Q, K)·U``; the next state
    ``Γ_C·S₀ + (K·Γ_C/Γ)ᵀ·U`` (``decayed_products`` computes the pair terms stably). A sequence shorter than
    ``chunk`` is one chunk of it rounded up to ``SUB``; positions padded at the end neither decay nor write.
    ``starts`` ``[B, T]`` (True: a document begins): the state is empty there."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    C = min(chunk, -(-T // SUB) * SUB)
    sub = math.gcd(C, SUB)
    pad = -T % C
    if pad:
        q, k, v, g = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v, g))
        beta = F.pad(beta, (0, pad))
    n = (T + pad) // C
    q, k, v, g = (x.unflatten(2, (n, C)) for x in (q, k, v, g))  # [B, H, n, C, d]
    beta = beta.unflatten(2, (n, C))
    G = g.cumsum(-2)  # [B, H, n, C, dk]
    k_beta = k * beta[..., None]
    system, scores = decayed_products(torch.stack((k_beta, q)), k, G, sub).unbind(0)
    gamma, to_end = G.exp(), (G[..., -1:, :] - G).exp()  # from the chunk's start, to its end
    if starts is not None:  # documents begun within the chunk up to each position
        seg = torch.cat((starts, starts.new_zeros(B, pad)), dim=1).unflatten(1, (n, C)).cumsum(-1)[:, None]
        same = seg[..., :, None] == seg[..., None, :]
        system, scores = system * same, scores * same
        gamma, to_end = gamma * (seg == 0)[..., None], to_end * (seg == seg[..., -1:])[..., None]
    rhs = torch.cat((v * beta[..., None], k_beta * gamma), dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u_free, w = solved.split((dv, dk), dim=-1)  # U = u_free − w·S₀
    q_read, k_write = q * gamma, k * to_end
    chunk_decay = gamma[..., -1, :, None]  # [B, H, n, dk, 1]
    S = q.new_zeros(B, H, dk, dv) if state is None else state
    out = []
    chunks = zip(*(t.unbind(2) for t in (u_free, w, q_read, scores, chunk_decay, k_write)), strict=True)
    for u_free_i, w_i, q_read_i, scores_i, decay_i, k_write_i in chunks:
        u = u_free_i - w_i @ S
        out.append(q_read_i @ S + scores_i @ u)
        S = S * decay_i + k_write_i.transpose(-1, -2) @ u
    return torch.cat(out, dim=2)[:, :, :T], S


@without_autocast
def recurrent_kda_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """The rule one position at a time (decoding), with ``chunked_kda_rule``'s arguments and results: decay
    each key channel's row of the state, write β·(v − Sᵀk) along k, read it with q."""
    B, H, T, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        k_t = k[:, :, t, :, None]  # [B, H, dk, 1]
        S = S * g[:, :, t, :, None].exp()
        u = beta[:, :, t, None] * (v[:, :, t] - (S * k_t).sum(-2))  # [B, H, dv]
        S = S + k_t * u[:, :, None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, dim=2), S
