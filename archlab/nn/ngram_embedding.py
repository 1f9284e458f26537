"""Hashed n-gram embeddings (Qwen4-Exp's ``Qwen4ExpTextNGramEmbedding``): each token's 2- to ``order``-grams
(the tokens before it, not across a document's end token) hashed by ``heads`` multiply-xor hashes per order
into prime-sized slices of one table, the rows concatenated. A module holds one table; ``index`` is the
ordinal that seeds its hashes and places its primes (Qwen4-Exp: the ordinal of the layer among those with
one). The ids reproduce transformers' exactly."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn

_MASK64 = (1 << 64) - 1
_GAMMA = 0x9E3779B97F4A7C15  # splitmix64's increment
_PRIME = 10007  # the step of the seed from one table to the next


def _splitmix64(value: int) -> int:
    value = (value + _GAMMA) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return (value ^ (value >> 31)) & _MASK64


def multipliers(vocab_size: int, order: int, index: int, seed: int) -> list[int]:
    """The ``order`` odd hash multipliers of table ``index``, each below 2⁶³ / ``vocab_size`` so that a token id
    times one stays inside int64."""
    half = max(1, ((1 << 63) - 1) // max(vocab_size, 1) // 2)
    base = seed + _PRIME * index
    return [2 * (_splitmix64((base + _GAMMA * (k + 1)) & _MASK64) % half) + 1 for k in range(order)]


def _is_prime(value: int) -> bool:
    if value < 2 or value % 2 == 0:
        return value == 2
    return all(value % divisor for divisor in range(3, math.isqrt(value) + 1, 2))


def head_sizes(base: int, heads: int, index: int) -> list[int]:
    """The prime row counts of table ``index``'s ``heads`` slices: the primes from ``base`` on, table after
    table (``index``·heads of them before this table's)."""
    sizes, value = [], base - 1
    for _ in range(index * heads + heads):
        value += 1
        while not _is_prime(value):
            value += 1
        sizes.append(value)
    return sizes[index * heads :]


def table_rows(base: int, heads: int, index: int, multiple: int) -> int:
    """Table ``index``'s rows: its slices' primes summed, rounded up to ``multiple``."""
    return math.ceil(sum(head_sizes(base, heads, index)) / multiple) * multiple


class NGramEmbedding(nn.Module):
    """One table ``table`` ``[rows, dim / heads_total]`` and its hash constants (buffers: ``multipliers``
    ``[order]``, the slices' ``sizes`` and ``offsets``); ``forward`` gives ``[B, T, dim]``."""

    def __init__(
        self, vocab_size: int, dim: int, order: int, heads: int, base: int, multiple: int, seed: int, index: int
    ):
        super().__init__()
        self.order, self.heads = order, heads  # heads per order: (order − 1)·heads slices in all
        total = (order - 1) * heads
        sizes = head_sizes(base, total, index)
        self.constants = (multipliers(vocab_size, order, index, seed), sizes, [sum(sizes[:i]) for i in range(total)])
        self.multipliers = nn.Buffer(torch.empty(order, dtype=torch.long), persistent=False)
        self.sizes = nn.Buffer(torch.empty(total, dtype=torch.long), persistent=False)
        self.offsets = nn.Buffer(torch.empty(total, dtype=torch.long), persistent=False)
        self.reset_constants()
        self.table = nn.Embedding(table_rows(base, total, index, multiple), dim // total)

    @torch.no_grad()
    def reset_constants(self) -> None:
        """The hash constants written into their buffers (again after a build on the meta device)."""
        for buffer, values in zip((self.multipliers, self.sizes, self.offsets), self.constants):
            buffer.copy_(torch.tensor(values))

    def ids(self, tokens: Tensor, boundary: int, documents: Optional[Tensor] = None) -> Tensor:
        """The rows ``[B, T, (order − 1)·heads]`` of the n-grams ending at each of ``tokens`` ``[B, T]``: a
        token k back is the token there, or ``boundary`` where that is before the row or before the token
        after a ``boundary`` (a document's end) that precedes the n-gram's last token, or (``documents``
        ``[B, T]``, True where a packed document begins) before the n-gram's document."""
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device)
        ends = torch.where(tokens == boundary, positions, -1).cummax(dim=1).values
        starts = torch.cat([ends.new_full((B, 1), -1), ends[:, :-1]], dim=1) + 1  # after the last end before
        if documents is not None:
            starts = torch.maximum(starts, torch.where(documents, positions, 0).cummax(dim=1).values)
        back = [tokens]
        for k in range(1, self.order):
            shifted = tokens.gather(1, (positions - k).clamp_min(0).expand(B, -1))
            back.append(torch.where(positions - k >= starts, shifted, boundary))
        rows, mixed = [], back[0] * self.multipliers[0]
        for n in range(2, self.order + 1):
            mixed = mixed ^ (back[n - 1] * self.multipliers[n - 1])
            heads = slice((n - 2) * self.heads, (n - 1) * self.heads)
            rows.append(torch.remainder(mixed.unsqueeze(-1), self.sizes[heads]) + self.offsets[heads])
        return torch.cat(rows, dim=-1)

    def forward(self, tokens: Tensor, context: Tensor, boundary: int, documents: Optional[Tensor] = None) -> Tensor:
        """The embeddings ``[B, T, dim]`` of ``tokens`` ``[B, T]`` after ``context`` ``[B, order − 1]``, the
        tokens before them (``boundary`` where there are none); ``documents`` as ``ids``'."""
        history = torch.cat([context, tokens], dim=1)
        if documents is not None:
            documents = torch.cat([documents.new_zeros(context.shape), documents], dim=1)
        return self.table(self.ids(history, boundary, documents)[:, -tokens.shape[1] :]).flatten(-2)
