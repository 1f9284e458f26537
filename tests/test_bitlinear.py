"""BitLinear (archlab/nn/bitlinear.py, ``model.linear.kind: bitlinear``) against transformers' own modules
(integrations/bitnet.py): the offline layer against ``BitLinear`` holding the packed weights, the online one
against ``AutoBitLinear(online_quant=True)``, a fused projection against one transformers layer per part;
the 2-bit packing against ``pack_weights``/``unpack_weights``; transformers' quantisers run uncompiled (the
``eager_bitnet`` fixture), and compiled as transformers runs them in the slow test of bf16 and fp16 (a first
run compiles them, about a minute on the CPU); the straight-through gradients against autograd
through a plain Linear at the quantised values; training steps; the closed-form counts; the refusals."""

from typing import cast

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import decode_in_pieces
from torch import nn

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.bitlinear import BitLinear, absmean_ternary, pack, unpack
from archlab.nn.validation import ignored, without_ignored

transformers = pytest.importorskip("transformers")
bitnet = pytest.importorskip("transformers.integrations.bitnet")

pytestmark = pytest.mark.usefixtures("single_thread")

TINY = ["model=llama2-7b", "model.n_layer=2", "model.d_model=64", "model.attention.n_head=4"]
TINY += ["model.attention.n_kv_head=2", "model.vocab_size=97", "model.mlp.d_ff=96", "model.context_length=32"]


def grad(t: torch.Tensor) -> torch.Tensor:
    assert t.grad is not None
    return t.grad


def ternary(rows: int, cols: int, seed: int) -> torch.Tensor:
    return torch.randint(-1, 2, (rows, cols), generator=torch.Generator().manual_seed(seed)).float()


def hf_offline(t: torch.Tensor, scale: float, bias: torch.Tensor) -> nn.Module:
    """transformers' offline BitLinear holding ``t`` packed, its weight_scale and bias."""
    layer = bitnet.BitLinear(t.shape[1], t.shape[0], bias=True, dtype=torch.float32)
    layer.weight.copy_(bitnet.pack_weights(t.clone()))
    layer.weight_scale.fill_(scale)
    layer.bias.copy_(bias)
    return layer


def archlab_layer(weight: torch.Tensor, bias: torch.Tensor, widths: tuple[int, ...], offline: bool) -> BitLinear:
    linear = nn.Linear(weight.shape[1], weight.shape[0])
    with torch.no_grad():
        linear.weight.copy_(weight)
        linear.bias.copy_(bias)
    return BitLinear(linear, widths, offline)


@pytest.mark.usefixtures("eager_bitnet")  # transformers' code uncompiled: the slow test compiles it
def test_packing_is_transformers_layout_and_round_trips():
    for rows in (4, 16, 96):
        t = ternary(rows, 7, rows)
        packed = pack(t)
        assert packed.dtype == torch.uint8 and torch.equal(packed, bitnet.pack_weights(t.clone()))
        assert torch.equal(unpack(packed, torch.float32), t)
        assert torch.equal(unpack(packed, torch.bfloat16), bitnet.unpack_weights(packed, dtype=torch.bfloat16))


@pytest.mark.usefixtures("eager_bitnet")  # transformers' code uncompiled: the slow test compiles it
def test_offline_layer_equals_transformers_bitlinear():
    """q, k, v fused (widths 16, 8, 8) against three transformers BitLinear layers, each its own scale."""
    g = torch.Generator().manual_seed(0)
    widths, parts = (16, 8, 8), [ternary(w, 24, i) for i, w in enumerate((16, 8, 8))]
    scales, bias = [3.7, 0.61, 12.5], torch.randn(32, generator=g) * 2
    x = torch.randn(3, 5, 24, generator=g) * 4
    hf = [hf_offline(t, s, b) for t, s, b in zip(parts, scales, bias.split(widths))]
    ours = archlab_layer(torch.cat(parts), bias, widths, offline=True)
    ours.weight_scale.copy_(torch.tensor(scales))
    with torch.no_grad():
        expected = torch.cat([layer(x) for layer in hf], dim=-1)
        assert torch.equal(ours(x), expected)


@pytest.mark.usefixtures("eager_bitnet")  # transformers' code uncompiled: the slow test compiles it
def test_online_layer_equals_transformers_autobitlinear():
    """gate and up fused (widths 12, 12) against two AutoBitLinear(online_quant=True), outputs and gradients."""
    g = torch.Generator().manual_seed(1)
    weight, bias = torch.randn(24, 20, generator=g) * 0.3, torch.randn(24, generator=g)
    x = torch.randn(2, 6, 20, generator=g) * 3
    hf = []
    for w, b in zip(weight.split(12), bias.split(12)):
        layer = bitnet.AutoBitLinear(20, 12, bias=True, online_quant=True)
        with torch.no_grad():
            layer.weight.copy_(w)
            layer.bias.copy_(b)
        hf.append(layer)
    ours = archlab_layer(weight, bias, (12, 12), offline=False)
    x_hf, x_ours = x.clone().requires_grad_(), x.clone().requires_grad_()
    expected, got = torch.cat([layer(x_hf) for layer in hf], dim=-1), ours(x_ours)
    assert (got - expected).abs().max() <= 1e-5
    up = torch.randn(got.shape, generator=g)
    (expected * up).sum().backward()
    (got * up).sum().backward()
    assert torch.allclose(grad(ours.weight), torch.cat([grad(layer.weight) for layer in hf]), atol=1e-5)
    assert torch.allclose(grad(x_ours), grad(x_hf), atol=1e-5)


@pytest.mark.usefixtures("eager_bitnet")  # transformers' code uncompiled: the slow test compiles it
def test_unfused_layers_equal_transformers():
    """One projection (one scale): offline bit for bit, online to 1e-5."""
    g = torch.Generator().manual_seed(2)
    t, bias, x = ternary(8, 16, 5), torch.randn(8, generator=g), torch.randn(4, 16, generator=g)
    ours = archlab_layer(t, bias, (8,), offline=True)
    ours.weight_scale.fill_(2.5)
    with torch.no_grad():
        assert torch.equal(ours(x), hf_offline(t, 2.5, bias)(x))
    weight = torch.randn(8, 16, generator=g)
    online = bitnet.AutoBitLinear(16, 8, bias=True, online_quant=True)
    with torch.no_grad():
        online.weight.copy_(weight)
        online.bias.copy_(bias)
        assert (archlab_layer(weight, bias, (8,), offline=False)(x) - online(x)).abs().max() <= 1e-5


@pytest.mark.slow  # transformers' quantisers compiled, as it runs them: 10-40 s each on a cold cache
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_layers_equal_transformers(dtype):
    """In bf16 and fp16, bit for bit: transformers' compiled quantisers compute in float32, the activations'
    scale rounded to the input's dtype between (held as BitLinear returns it)."""
    g = torch.Generator().manual_seed(6)
    t, x = ternary(64, 256, 6), (torch.randn(4, 9, 256, generator=g) * 3).to(dtype)
    bias = torch.randn(64, generator=g)
    hf = hf_offline(t, 7.3, bias).to(dtype)
    hf.dtype = dtype  # BitLinear unpacks its weights to the dtype it was built with
    ours = archlab_layer(t, bias, (64,), offline=True).to(dtype)
    ours.weight_scale.fill_(7.3)
    with torch.no_grad():
        assert torch.equal(ours(x), hf(x))
    weight = torch.randn(64, 256, generator=g)
    online = bitnet.AutoBitLinear(256, 64, bias=True, online_quant=True).to(dtype)
    with torch.no_grad():
        online.weight.copy_(weight)
        online.bias.copy_(bias)
        assert torch.equal(archlab_layer(weight, bias, (64,), offline=False).to(dtype)(x), online(x))


def test_straight_through_gradients():
    """d loss/dW is the gradient of a plain Linear taken at the quantised weights and activations."""
    g = torch.Generator().manual_seed(3)
    weight, x = torch.randn(6, 10, generator=g), torch.randn(4, 10, generator=g)
    layer = archlab_layer(weight, torch.zeros(6), (6,), offline=False)
    layer(x).square().sum().backward()
    t, s = absmean_ternary(weight, (6,))
    scale = 127 / x.abs().amax(-1, keepdim=True)
    w_q = (t / s).requires_grad_()
    F.linear((x * scale).round().clamp(-128, 127) / scale, w_q).square().sum().backward()
    assert torch.allclose(grad(layer.weight), grad(w_q), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("weights", ["online", "offline"])
def test_counts_unchanged_and_only_block_projections_quantised(weights):
    cfg = compose_model([*TINY, "model.linear.kind=bitlinear", f"model.linear.weights={weights}"])
    dense = compose_model(TINY)
    model = build_model(cfg)  # checks every component against its closed form
    assert count_params(cfg) == count_params(dense)
    assert sum(p.numel() for p in model.parameters()) == count_params(dense)["total"]
    quantised = {n for n, m in model.named_modules() if isinstance(m, BitLinear)}
    expected = {f"blocks.{i}.{p}" for i in range(2) for p in ("attn.qkv", "attn.proj", "mlp.gate_up", "mlp.down")}
    assert quantised == expected
    if weights == "offline":  # drawn, then held ternary with each projection's 1/mean|W|
        qkv = cast(BitLinear, model.get_submodule("blocks.0.attn.qkv"))
        assert set(qkv.weight.unique().tolist()) <= {-1.0, 0.0, 1.0} and qkv.weight_scale.shape == (3,)


def test_offline_equals_online_at_the_same_draw():
    """An online model's weights ternarised into an offline one give the same logits (integer products)."""
    online = build_model(compose_model([*TINY, "model.linear.kind=bitlinear"]))
    offline = build_model(compose_model([*TINY, "model.linear.kind=bitlinear", "model.linear.weights=offline"]))
    state = online.state_dict()
    for name, module in offline.named_modules():
        if isinstance(module, BitLinear):
            t, s = absmean_ternary(state[f"{name}.weight"], module.widths)
            state[f"{name}.weight"], state[f"{name}.weight_scale"] = t, s
    offline.load_state_dict(state)
    idx = torch.randint(0, 97, (2, 12), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        assert (offline(idx) - online(idx)).abs().max() <= 1e-4


def test_training_steps_lower_the_loss():
    torch.manual_seed(5)
    model = build_model(compose_model([*TINY, "model.linear.kind=bitlinear"]))
    idx = torch.randint(0, 97, (4, 16))
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for _ in range(8):
        loss = F.cross_entropy(model(idx[:, :-1]).flatten(0, 1), idx[:, 1:].flatten())
        opt.zero_grad()
        loss.backward()
        assert all(grad(m.weight).abs().sum() > 0 for m in model.modules() if isinstance(m, BitLinear))
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < losses[0] - 0.1


@pytest.mark.parametrize("weights", ["online", "offline"])
def test_decoding_in_pieces_equals_the_whole(weights):
    """Each token's activations are quantised by their own absmax: the KV cache's pieces give the whole's logits."""
    model = build_model(compose_model([*TINY, "model.linear.kind=bitlinear", f"model.linear.weights={weights}"]))
    idx = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(7))
    with torch.no_grad():
        whole = model.eval()(idx)
    torch.testing.assert_close(decode_in_pieces(model, idx, [10, 11, 12, 24]), whole, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize(
    "overrides, why",
    [
        (["model/attention=mamba2"], "model.attention.kind=mamba2"),
        (["model/mlp=moe"], "model.mlp.kind=moe"),
        (["model.head.mtp.depth=1"], "model.head.mtp.depth"),
    ],
)
def test_refused_where_the_parts_cannot_take_it(overrides, why):
    with pytest.raises(ConfigError) as err:
        compose_model([*TINY, "model.linear.kind=bitlinear", *overrides])
    assert err.value.field == "model.linear.kind" and why in str(err.value)


def test_weights_ignored_with_dense_projections_is_said_so():
    base, cfg = compose_model(TINY), compose_model([*TINY, "model.linear.weights=offline"])
    found = [i for i in ignored(cfg) if i not in ignored(base)]
    assert [(i.field, i.value) for i in found] == [("model.linear.weights", "offline")]
    assert "model.linear.kind=dense" in str(found[0])
    assert without_ignored(cfg) == without_ignored(base)
    quantised = compose_model([*TINY, "model.linear.kind=bitlinear", "model.linear.weights=offline"])
    assert ignored(quantised) == ignored(base)
