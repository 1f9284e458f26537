"""The gated short convolution (archlab/nn/mixers/short_conv.py): one layer against its formula written out
position by position, and against transformers' ``Lfm2ShortConv`` (every weight randomised, biases on);
the refusals. Registering it gives it tests/test_mixer_contract.py's tests."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import mixer_config, randomise

from archlab import ConfigError
from archlab.config import to_model_config
from archlab.nn.mixers.short_conv import ShortConv
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

D, K, T = 8, 3, 6


def layer(bias: bool) -> ShortConv:
    cfg = mixer_config("short_conv", d_model=D, attention={"kind": "short_conv", "conv_kernel": K, "bias": bias})
    return randomise(ShortConv(cfg).double(), seed=1)


@pytest.mark.parametrize("bias", [False, True])
def test_a_layer_is_its_formula_position_by_position(bias):
    """y_t = out(C_t ⊙ (Σ_j w_j ⊙ (B ⊙ x)_{t−K+1+j} + b)), the positions before the first zero."""
    m = layer(bias)
    x = torch.randn(2, T, D, dtype=torch.float64)
    with torch.no_grad():
        got = m(x)
        proj = x @ m.in_proj.weight.T + (m.in_proj.bias if bias else 0)
        b, c, h = proj[..., :D], proj[..., D : 2 * D], proj[..., 2 * D :]
        gated = b * h
        w = m.conv_weight[:, 0]  # [D, K]
        rows = []
        for t in range(T):
            conv = sum(w[:, j] * gated[:, t - K + 1 + j] for j in range(K) if t - K + 1 + j >= 0)
            conv = conv + (m.conv_bias if bias else 0)
            rows.append((c[:, t] * conv) @ m.out_proj.weight.T + (m.out_proj.bias if bias else 0))
    torch.testing.assert_close(got, torch.stack(rows, dim=1), rtol=0, atol=1e-12)


@pytest.mark.parametrize("bias", [False, True])
def test_a_layer_equals_transformers_lfm2_short_convolution(bias):
    """LFM2's ``Lfm2ShortConv`` (its torch path) with the same weights gives the same output."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.lfm2.modeling_lfm2 import Lfm2ShortConv

    m = layer(bias)
    config = transformers.Lfm2Config(
        hidden_size=D, conv_L_cache=K, conv_bias=bias, num_hidden_layers=1, layer_types=["conv"]
    )
    hf = Lfm2ShortConv(config, 0).double()
    with torch.no_grad():
        hf.in_proj.weight.copy_(m.in_proj.weight)
        hf.out_proj.weight.copy_(m.out_proj.weight)
        hf.conv.weight.copy_(m.conv_weight)
        if bias:
            hf.in_proj.bias.copy_(m.in_proj.bias)
            hf.out_proj.bias.copy_(m.out_proj.bias)
            hf.conv.bias.copy_(m.conv_bias)
        x = torch.randn(2, T, D, dtype=torch.float64)
        torch.testing.assert_close(m(x), hf(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize(
    ("attention", "field"),
    [
        ({"kind": "short_conv", "conv_kernel": 0}, "model.attention.conv_kernel"),
        ({"kind": "short_conv", "n_kv_head": 2}, "model.attention.n_kv_head"),  # attention's, not its own
    ],
)
def test_bad_settings_name_their_field(attention, field):
    with pytest.raises(ConfigError) as err:
        validate(to_model_config({"d_model": D, "attention": attention}))
    assert err.value.field == field
