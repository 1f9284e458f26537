"""nGPT's scaled parameter (Loshchilov et al. 2024, §2.6): a learned vector stored at ``scale`` and used as
its value times ``init / scale``, so it starts at ``init`` while the optimizer steps it at the stored scale; and
nGPT's matrices put back on the sphere along d_model (§2.1, ``unit_along``), which its parts do after a step."""

from __future__ import annotations

import math
from typing import Optional

import torch
from torch import Tensor, nn


def scale_or_default(scale: Optional[float], d_model: int) -> float:
    """A scaled parameter's ``scale``: the one set, else 1/sqrt(d_model) (the paper's default)."""
    return 1 / math.sqrt(d_model) if scale is None else scale


@torch.no_grad()
def unit_along(weight: Tensor, dim: int) -> None:
    """``weight`` divided in place by its norm along ``dim`` (the d_model dimension): each vector of d_model
    values a unit vector (zero vectors left as they are)."""
    norm = weight.norm(dim=dim, keepdim=True)
    weight.div_(torch.where(norm > 0, norm, torch.ones_like(norm)))


class ScaledVector(nn.Module):
    """``weight`` ``[n]``, initialised to ``scale``; ``self()`` is ``weight · (init / scale)``."""

    def __init__(self, n: int, init: float, scale: float):
        super().__init__()
        self.init, self.scale = init, scale
        self.weight = nn.Parameter(torch.full((n,), scale))

    @torch.no_grad()
    def init_parameters(self, std: float, residual_std: float) -> None:
        """The stored value at its scale (``Decoder.init_weights`` calls it): the used value is ``init``."""
        self.weight.fill_(self.scale)

    def forward(self) -> Tensor:
        return self.weight * (self.init / self.scale)
