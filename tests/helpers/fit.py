"""A short fit of a built model on one repeated batch: the effect tests' check that a part trains."""

from __future__ import annotations

import torch
import torch.nn.functional as F


def short_fit(model: torch.nn.Module, vocab: int, length: int, steps: int = 15, lr: float = 3e-3) -> list[float]:
    """Losses of ``steps`` AdamW steps on 4 seeded sequences of ``length`` + 1 tokens (next-token targets);
    the gradients of the last step stay on the parameters for the caller to inspect."""
    idx = torch.randint(0, vocab, (4, length + 1), generator=torch.Generator().manual_seed(0))
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses
