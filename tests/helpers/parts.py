"""What the effect tests of model parts share: a tiny config to vary, and a short fit on one repeated batch
(the check that a part trains)."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from archlab.config import ModelConfig, to_model_config


def tiny(**overrides) -> ModelConfig:
    """d_model 32, 4 heads of 8 (2 key/value heads), 2 layers, vocab 48, context 24, RMSNorm (eps 1e-3), no
    positions; ``overrides`` merged in (``attention={"sinks": True}``; an attention of another kind in place
    of the causal one, keeping its 4 heads)."""
    attention = {"n_head": 4, "n_kv_head": 2}
    if overrides.get("attention", {}).get("kind", "causal") != "causal":
        attention = {"n_head": 4}  # the causal kind's key/value heads are no field of another mixer
    base = {
        "vocab_size": 48,
        "context_length": 24,
        "n_layer": 2,
        "d_model": 32,
        "norm": {"kind": "rmsnorm", "eps": 1e-3},
        "position": {"kind": "none"},
        "attention": attention,
    }
    return to_model_config(OmegaConf.merge(base, overrides))


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
