"""How a data mixture shares each training batch among its sources: a deterministic allocation by weight.

Of a batch of ``N`` rows, source ``i`` (weight share ``w_i``) gets ``floor(N·w_i)`` rows and, with
``f_i = N·w_i − floor(N·w_i)``, possibly one more: the ``R = Σ f_i`` rows left over go by systematic
sampling, the points ``u_k, u_k + 1, ..., u_k + R − 1`` each giving a row to the source whose interval
``[F_{i−1}, F_i)`` of the cumulative remainders ``F_i = f_1 + ... + f_i`` holds it. The offset of batch
``k`` is ``u_k = frac(u_0 + k/φ)`` (φ the golden ratio; ``u_0`` drawn from the seed), a Weyl sequence:
each batch gives every source ``floor(N·w_i)`` or ``ceil(N·w_i)`` rows, ``N·w_i`` in expectation over a
uniform ``u``, and any ``K`` consecutive batches give it ``K·N·w_i`` rows to within O(log K). Batch
``k``'s counts are a function of ``(seed, k, N)`` alone, and the counts of many batches are computed at
once (the realised totals a run records).
"""

from __future__ import annotations

import math
from fractions import Fraction
from itertools import accumulate
from typing import Sequence

import numpy as np

STEP = (math.sqrt(5) - 1) / 2  # 1/φ: the Weyl step with the lowest discrepancy
OFFSET_STREAM = 1 << 30  # the seed sequence ``[seed, OFFSET_STREAM]`` draws u_0, apart from every batch's
CHUNK = 1 << 20  # batches counted per numpy pass in ``totals``


class Allocation:
    """Rows per source of each batch of ``rows`` rows, for sources of relative ``weights`` (positive)."""

    def __init__(self, weights: Sequence[float], rows: int, seed: int):
        total = sum(Fraction(w) for w in weights)
        quotas = [Fraction(w) * rows / total for w in weights]  # exact: the leftover R is a whole number
        self.base = np.array([math.floor(q) for q in quotas], dtype=np.int64)
        # the intervals [F_{i-1}, F_i) of the leftover rows; F_0 = 0 and F_m = R exactly
        self.bounds = np.array([0.0, *(float(f) for f in accumulate(q - math.floor(q) for q in quotas))])
        self.start = float(np.random.default_rng([seed, OFFSET_STREAM]).random())

    def counts(self, indices: np.ndarray) -> np.ndarray:
        """``[len(indices), sources]``: the rows each source gets in each of these batches."""
        offsets = (self.start + np.asarray(indices, dtype=np.int64) * STEP) % 1.0
        below = np.ceil(self.bounds[None, :] - offsets[:, None])  # the points u + j below each bound
        return self.base + np.diff(below, axis=1).astype(np.int64)

    def rows_of(self, index: int) -> np.ndarray:
        """The rows each source gets in batch ``index``."""
        return self.counts(np.array([index]))[0]

    def totals(self, batches: int) -> np.ndarray:
        """The rows each source gets in batches ``0 .. batches − 1`` together."""
        total = np.zeros(len(self.base), dtype=np.int64)
        for first in range(0, batches, CHUNK):
            total += self.counts(np.arange(first, min(first + CHUNK, batches))).sum(axis=0)
        return total
