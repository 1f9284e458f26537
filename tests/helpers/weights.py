"""A tiny LitModel with its weights set at will, for the weight-averaging tests (test_ema.py,
test_average.py)."""

from __future__ import annotations

import functools

import torch

from archlab import compose_model
from archlab.config import model_config_dict
from archlab.training.module import LitModel

TINY = ["model=nano", "model.n_layer=1", "model.d_model=16", "model.attention.n_head=2", "model.vocab_size=32"]


@functools.cache
def tiny_config() -> dict:
    return model_config_dict(compose_model(TINY))


def tiny_lit() -> LitModel:
    lit = LitModel(model=tiny_config(), optim={}, scheduler={})
    lit.configure_model()
    return lit


def set_weights(lit: LitModel, seed: int) -> dict[str, torch.Tensor]:
    """Give every parameter new random values; returns them (float64 copies)."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in lit.decoder.parameters():
            p.copy_(torch.randn(p.shape, generator=generator))
    return {n: p.detach().double().clone() for n, p in lit.decoder.named_parameters()}
