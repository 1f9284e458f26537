"""The norms (archlab/nn/norms.py): Nemotron's (1 + w) LayerNorm against transformers' NemotronLayerNorm1P."""

import pytest
import torch
from helpers.hf import max_diff, randomize

from archlab import build_model, compose_model


def test_unit_offset_layernorm_is_nemotron_s_layernorm1p():
    """archlab's LayerNorm with unit_offset equals transformers' NemotronLayerNorm1P on the same w and b."""
    pytest.importorskip("transformers")
    from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P

    hf = randomize(NemotronLayerNorm1P(64, eps=1e-3), seed=5)
    model = build_model(
        compose_model(["model=nano", "model.d_model=64", "model.norm.unit_offset=true", "model.norm.eps=1e-3"])
    )
    norm = model.final_norm
    norm.load_state_dict(hf.state_dict())
    x = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(6)) * 3 + 1
    with torch.no_grad():
        assert max_diff(norm(x), hf(x)) <= 1e-6
        assert max_diff(norm(x), torch.nn.functional.layer_norm(x, (64,), hf.weight, hf.bias, 1e-3)) > 0.1
