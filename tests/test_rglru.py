"""Griffin's RG-LRU recurrent block (archlab/nn/mixers/rglru.py): one layer against its recurrence written out
token by token in float64 (chunks that do and do not divide the length), against transformers'
``RecurrentGemmaRecurrentBlock`` with every weight randomised, its count by hand, the bounded square
root's gradient, and the refusals. Registering it gives it tests/test_mixer_contract.py's tests."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import mixer_config, randomise

from archlab import ConfigError, count_params
from archlab.config import to_model_config
from archlab.nn.mixers.ops import selective_scan
from archlab.nn.mixers.rglru import RGLRU, _BoundedSqrt
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

D, W, H, K, T = 8, 12, 3, 4, 11  # width of the model, of the recurrence, gate blocks, conv kernel, length


def layer(chunk: int = 4) -> RGLRU:
    attention = {"kind": "rglru", "n_head": H, "width": W, "conv_kernel": K, "scan_chunk": chunk}
    return randomise(RGLRU(mixer_config("rglru", d_model=D, attention=attention)).double(), seed=1)


def by_hand(m: RGLRU, x: torch.Tensor) -> torch.Tensor:
    """Token by token: y = gelu_tanh(linear_y x); u = conv(linear_x x) (+ bias); per block h the gates
    r = σ(u_h·R_h + b), i = σ(u_h·I_h + b); a = exp(−8·r·softplus(Λ)); h_t = a·h_{t−1} + sqrt(1 − a²)·i·u,
    the first token unscaled; out = linear_out(h ⊙ y)."""
    y = F.gelu(F.linear(x, m.linear_y.weight, m.linear_y.bias), approximate="tanh")
    xs = F.linear(x, m.linear_x.weight, m.linear_x.bias)
    w = m.conv_weight[:, 0]
    h = torch.zeros(x.shape[0], W, dtype=x.dtype)
    out = []
    for t in range(x.shape[1]):
        u = sum(w[:, j] * xs[:, t - K + 1 + j] for j in range(K) if t - K + 1 + j >= 0) + m.conv_bias
        blocks = u.view(-1, H, W // H)
        r = torch.sigmoid(torch.einsum("bhi,hij->bhj", blocks, m.recurrent_gate_weight) + m.recurrent_gate_bias)
        i = torch.sigmoid(torch.einsum("bhi,hij->bhj", blocks, m.input_gate_weight) + m.input_gate_bias)
        a = torch.exp(-8.0 * r.flatten(1) * F.softplus(m.recurrent_param))
        scale = 1.0 if t == 0 else torch.sqrt(1 - a**2)
        h = a * h + scale * i.flatten(1) * u
        out.append(F.linear(h * y[:, t], m.linear_out.weight, m.linear_out.bias))
    return torch.stack(out, dim=1)


@pytest.mark.parametrize("chunk", [None, 1, 4, 16])
def test_a_layer_is_its_recurrence_token_by_token(chunk, monkeypatch):
    """The position-by-position scan (chunk None, the CPU's) and the chunked one equal the recurrence."""
    m = layer(chunk or 4)
    if chunk is not None:
        monkeypatch.setattr(selective_scan, "SEQUENTIAL_DEVICES", set())
    x = torch.randn(2, T, D, dtype=torch.float64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), by_hand(m, x), rtol=0, atol=1e-12)


def test_a_layer_equals_transformers_recurrent_gemma_block():
    """transformers' ``RecurrentGemmaRecurrentBlock`` (its torch path, no cache) with the same randomised
    weights gives the same output, within 1e-6 (it runs the scan in float32 in a float64 model)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.recurrent_gemma.modeling_recurrent_gemma import RecurrentGemmaRecurrentBlock

    m = layer()
    c = transformers.RecurrentGemmaConfig(hidden_size=D, lru_width=W, num_attention_heads=H, conv1d_width=K,
                                          num_hidden_layers=1, hidden_activation="gelu_pytorch_tanh")  # fmt: skip
    hf = RecurrentGemmaRecurrentBlock(c, 0).double()
    with torch.no_grad():
        for name in ("linear_y", "linear_x", "linear_out"):
            getattr(hf, name).weight.copy_(getattr(m, name).weight)
            getattr(hf, name).bias.copy_(getattr(m, name).bias)
        hf.conv_1d.weight.copy_(m.conv_weight)
        hf.conv_1d.bias.copy_(m.conv_bias)
        for name in ("input_gate_weight", "input_gate_bias", "recurrent_gate_weight", "recurrent_gate_bias"):
            getattr(hf.rg_lru, name).copy_(getattr(m, name))
        hf.rg_lru.recurrent_param.copy_(m.recurrent_param)
        x = torch.randn(2, T, D, dtype=torch.float64)
        positions = torch.arange(T)[None].expand(2, T)
        expected, _ = hf(x, positions, None, use_cache=False)
        torch.testing.assert_close(m(x), expected, rtol=1e-6, atol=1e-6)


def test_its_count_by_hand():
    """d 16, width 16 (d_model), 4 blocks, conv 4: linear_y and linear_x 17·16 each, conv 16·5, gates
    2·(16·16/4 + 16), Λ 16, linear_out 17·16 = 1072."""
    cfg = to_model_config({"vocab_size": 8, "n_layer": 1, "d_model": 16, "position": {"kind": "none"},
                           "attention": {"kind": "rglru", "n_head": 4}, "mlp": {"kind": "none"}})  # fmt: skip
    assert count_params(cfg)["attention"] == 2 * 17 * 16 + 16 * 5 + 2 * (64 + 16) + 16 + 17 * 16 == 1072
    assert RGLRU.kv_cache_values(cfg, 1000, 0) == 16 * (3 + 1)


def test_the_square_roots_gradient_is_bounded():
    """d sqrt(x)/dx = 1/(2·sqrt(x)), at most 1000 (at x ≤ 2.5e-7, Griffin's bound)."""
    x = torch.tensor([0.25, 1e-12], dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(_BoundedSqrt.apply(x).sum(), x)
    assert grad.tolist() == pytest.approx([1.0, 1000.0])


@pytest.mark.parametrize(
    ("attention", "field"),
    [
        ({"kind": "rglru", "n_head": 5}, "model.attention.n_head"),  # 5 blocks of a width of 8
        ({"kind": "rglru", "width": 0}, "model.attention.width"),
        ({"kind": "rglru", "n_head": 4, "conv_kernel": 0}, "model.attention.conv_kernel"),
        ({"kind": "rglru", "n_kv_head": 2}, "model.attention.n_kv_head"),  # attention's, not its own
    ],
)
def test_bad_settings_name_their_field(attention, field):
    with pytest.raises(ConfigError) as err:
        validate(to_model_config({"d_model": D, "attention": attention}))
    assert err.value.field == field
