"""A norm's output gated by a low-rank MLP of it, ``y·sigmoid(up(silu(down(y))))`` (A.X K2's
``AXK2GatedRMSNorm``, Megatron's GatedNormWrapper): the pre block's ``attn_norm_gate`` and ``mlp_norm_gate``."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from archlab.nn.component import Role


class NormGate(nn.Module):
    """``down`` d_model -> rank, SiLU, ``up`` rank -> d_model, no biases; the normed ``y`` times the sigmoid of
    that, computed in float32 at least (as transformers' A.X K2 does)."""

    def __init__(self, d_model: int, rank: int):
        super().__init__()
        self.down = nn.Linear(d_model, rank, bias=False)
        self.up = nn.Linear(rank, d_model, bias=False)

    def forward(self, y: Tensor) -> Tensor:
        gate = torch.sigmoid(self.up(F.silu(self.down(y))).to(torch.promote_types(y.dtype, torch.float32)))
        return (y * gate).to(y.dtype)

    @staticmethod
    def num_params(d_model: int, rank: int) -> int:
        """2·d_model·rank: its two matrices."""
        return 2 * d_model * rank

    @staticmethod
    def param_roles(prefix: str) -> dict[str, Role]:
        """Both hidden: the rank is a width a width sweep grows with d_model (as mla's low-rank projections)."""
        return {f"{prefix}.down.weight": Role.HIDDEN, f"{prefix}.up.weight": Role.HIDDEN}
