"""Activation sparsity of the gated MLPs (``model.mlp.activation_sparsity``, archlab/nn/sparsity.py): a GeGLU
with it against transformers' ``Gemma3nTextMLP`` (every weight randomised), its cutoff against the normal
quantile by hand; per layer through a layer kind; no parameters; the refusals."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import randomise

from archlab import ConfigError, compose_model, count_params
from archlab.config.layers import layer_configs
from archlab.nn.mlp import build_mlp
from archlab.nn.sparsity import gaussian_topk

pytestmark = pytest.mark.usefixtures("single_thread")

D, F = 32, 64
TINY = ["model=nano", "model.d_model=32", "model.n_layer=2", "model.attention.n_head=4", "model.vocab_size=64"]
GEGLU = [*TINY, "model/mlp=geglu", "model.mlp.approximate=tanh", f"model.mlp.d_ff={F}", "model.mlp.bias=false"]


@pytest.mark.parametrize("s", [0.95, 0.3])
def test_a_sparse_geglu_is_gemma3n_s_mlp(s):
    """Gemma3nTextMLP with activation_sparsity_pattern s: the same output, float32, every weight random; most
    of the gate's activations are zero at 0.95."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.gemma3n.modeling_gemma3n import Gemma3nTextMLP

    ours = randomise(build_mlp(compose_model([*GEGLU, f"model.mlp.activation_sparsity={s}"])), seed=1)
    config = transformers.Gemma3nTextConfig(
        hidden_size=D, intermediate_size=F, num_hidden_layers=2, activation_sparsity_pattern=[s, 0.0]
    )
    theirs = Gemma3nTextMLP(config, layer_idx=0)
    with torch.no_grad():
        theirs.gate_proj.weight.copy_(ours.gate_up.weight[:F])
        theirs.up_proj.weight.copy_(ours.gate_up.weight[F:])
        theirs.down_proj.weight.copy_(ours.down.weight)
    x = torch.randn(2, 7, D, generator=torch.Generator().manual_seed(2))
    torch.testing.assert_close(ours(x), theirs(x), rtol=1e-5, atol=1e-5)
    if s == 0.95:
        gate = ours.gate_up(x)[..., :F]
        assert (gaussian_topk(gate, s) == 0).float().mean() > 0.85


def test_the_cutoff_is_the_mean_plus_the_std_times_the_normal_quantile():
    """Φ⁻¹(0.975) = 1.959964: a row of mean 1 and (biased) std 2 keeps what exceeds 1 + 2·1.96."""
    x = torch.tensor([[-1.0, 3.0, -1.0, 3.0]])  # mean 1, biased std 2
    wide = torch.cat([x, torch.tensor([[1.0 + 2 * 1.959964 + 0.5]])], dim=-1)
    mean, std = wide.mean(), wide.std(unbiased=False)
    expected = torch.relu(wide - (mean + std * 1.959964))
    torch.testing.assert_close(gaussian_topk(wide, 0.975), expected, rtol=1e-6, atol=1e-6)
    assert torch.equal(gaussian_topk(x, 0.5), torch.relu(x - 1.0))  # Φ⁻¹(0.5) = 0: the mean


def test_it_is_per_layer_through_a_layer_kind_and_holds_no_parameters():
    cfg = compose_model(
        [*GEGLU, "+model.layers.kinds.sparse.mlp.activation_sparsity=0.95", "model.layers.first=[sparse]"]
    )
    assert [c.mlp.activation_sparsity for c in layer_configs(cfg)] == [0.95, 0.0]
    assert count_params(cfg) == count_params(compose_model(GEGLU))


@pytest.mark.parametrize("value", [1.0, -0.1])
def test_bad_settings_name_the_field(value):
    with pytest.raises(ConfigError) as err:
        compose_model([*GEGLU, f"model.mlp.activation_sparsity={value}"])
    assert err.value.field == "model.mlp.activation_sparsity"
