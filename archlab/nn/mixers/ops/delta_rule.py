"""The gated delta rule's numerical forms (Gated DeltaNet's memory): the chunked parallel form that
training and prefill run and the recurrence that decoding runs, each on ``[B, H, T, d]`` operands."""

from __future__ import annotations

from typing import Optional

import torch
import torch.nn.functional as F
from torch import Tensor

from archlab.nn.mixers.ops.float32 import without_autocast


def l2_normalise(x: Tensor, eps: float = 1e-6) -> Tensor:
    """``x / sqrt(Σx² + eps)`` over the last dim (the eps inside the root, as flash-linear-attention's)."""
    return x * torch.rsqrt(x.pow(2).sum(-1, keepdim=True) + eps)


@without_autocast
def chunked_delta_rule(
    q: Tensor,
    k: Tensor,
    v: Tensor,
    g: Tensor,
    beta: Tensor,
    chunk: int,
    state: Optional[Tensor] = None,
    starts: Optional[Tensor] = None,
) -> tuple[Tensor, Tensor]:
    """The gated delta rule over ``T`` positions, ``chunk`` at a time: outputs ``[B, H, T, dv]`` and the
    final state ``[B, H, dk, dv]`` from ``q``, ``k`` ``[B, H, T, dk]``, ``v`` ``[B, H, T, dv]``, log-decays
    ``g`` and write strengths ``beta`` ``[B, H, T]`` and an initial ``state`` (None: zeros).

    Within a chunk, with γ_t = exp(g_1 + ... + g_t), the values written are ``U = (I + A)⁻¹·(β·V − β·γ·K·S₀)``
    where ``A_ts = β_t·(γ_t/γ_s)·k_t·k_s`` for s < t (one triangular solve per chunk, all chunks at once);
    the outputs ``O = γ·Q·S₀ + ((Q·Kᵀ) ⊙ γ_t/γ_s)_{s≤t}·U`` and the next state ``γ_C·S₀ + (K·γ_C/γ)ᵀ·U``
    take one matmul each, so only the state passes from chunk to chunk. A sequence shorter than ``chunk``
    is one chunk of its own length; a longer one is padded at the end with positions that neither decay
    nor write. ``starts`` ``[B, T]`` (True: a document begins): the state is empty there, so nothing
    written before it reaches it or later positions."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    C = min(chunk, T)
    pad = -T % C
    if pad:
        q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
        g, beta = F.pad(g, (0, pad)), F.pad(beta, (0, pad))
    n = (T + pad) // C
    q, k, v = (x.unflatten(2, (n, C)) for x in (q, k, v))  # [B, H, n, C, d]
    g, beta = g.unflatten(2, (n, C)), beta.unflatten(2, (n, C))
    log_gamma = g.cumsum(-1)  # [B, H, n, C]
    causal = torch.ones(C, C, dtype=torch.bool, device=q.device).tril()
    # γ_t/γ_s for s <= t, 0 above the diagonal (masked before exp: the differences there are positive)
    decay = (log_gamma[..., :, None] - log_gamma[..., None, :]).masked_fill(~causal, float("-inf")).exp()
    gamma, to_end = log_gamma.exp(), (log_gamma[..., -1:] - log_gamma).exp()  # from the chunk's start, to its end
    if starts is not None:  # documents begun within the chunk up to each position
        seg = torch.cat((starts, starts.new_zeros(B, pad)), dim=1).unflatten(1, (n, C)).cumsum(-1)[:, None]
        decay = decay * (seg[..., :, None] == seg[..., None, :])
        gamma, to_end = gamma * (seg == 0), to_end * (seg == seg[..., -1:])
    k_beta = k * beta[..., None]
    system = (k_beta @ k.transpose(-1, -2)) * decay  # strictly lower part used: unitriangular below
    rhs = torch.cat((v * beta[..., None], k_beta * gamma[..., None]), dim=-1)
    solved = torch.linalg.solve_triangular(system, rhs, upper=False, unitriangular=True)
    u_free, w = solved.split((dv, dk), dim=-1)  # U = u_free − w·S₀
    scores = (q @ k.transpose(-1, -2)) * decay
    q_read = q * gamma[..., None]  # the queries reading the chunk's initial state
    k_write = k * to_end[..., None]  # the keys writing its final state
    chunk_decay = gamma[..., -1, None, None]  # [B, H, n, 1, 1]
    S = q.new_zeros(B, H, dk, dv) if state is None else state
    out = []
    # chunk by chunk through unbind: its backward stacks the chunks' gradients once, where indexing chunk i
    # would zero-fill a whole-sequence gradient per chunk (quadratic in the chunks of a sequence)
    chunks = zip(*(t.unbind(2) for t in (u_free, w, q_read, scores, chunk_decay, k_write)), strict=True)
    for u_free_i, w_i, q_read_i, scores_i, decay_i, k_write_i in chunks:
        u = u_free_i - w_i @ S
        out.append(q_read_i @ S + scores_i @ u)
        S = S * decay_i + k_write_i.transpose(-1, -2) @ u
    return torch.cat(out, dim=2)[:, :, :T], S


@without_autocast
def recurrent_delta_rule(
    q: Tensor, k: Tensor, v: Tensor, g: Tensor, beta: Tensor, state: Optional[Tensor] = None
) -> tuple[Tensor, Tensor]:
    """The gated delta rule one position at a time (decoding), with ``chunked_delta_rule``'s arguments
    and results: decay the state, write β·(v − Sᵀk) along k, read it with q."""
    B, H, T, dk = k.shape
    S = q.new_zeros(B, H, dk, v.shape[-1]) if state is None else state
    out = []
    for t in range(T):
        k_t = k[:, :, t, :, None]  # [B, H, dk, 1]
        S = S * g[:, :, t, None, None].exp()
        u = beta[:, :, t, None] * (v[:, :, t] - (S * k_t).sum(-2))  # [B, H, dv]
        S = S + k_t * u[:, :, None, :]
        out.append((S * q[:, :, t, :, None]).sum(-2))
    return torch.stack(out, dim=2), S
