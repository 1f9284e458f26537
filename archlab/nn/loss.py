"""The next-token loss every use scores with: mean cross-entropy in float32 over the scored positions, the
targets ``IGNORE`` marks left out (padding, a prompt, a position past its document)."""

from __future__ import annotations

import torch.nn.functional as F
from torch import Tensor

IGNORE = -100  # targets that are not scored (torch.nn.functional.cross_entropy's ignore_index)


def next_token_loss(logits: Tensor, targets: Tensor) -> Tensor:
    """Mean cross-entropy of ``logits`` ``[B, T, V]`` over the positions of ``targets`` ``[B, T]`` that
    are not IGNORE, computed in float32."""
    return F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten(), ignore_index=IGNORE)
