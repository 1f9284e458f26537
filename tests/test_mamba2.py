"""Mamba-2 (``mamba2``) and ``mlp.kind: none``, each against an independent expectation: the SSD recurrence
written per head and token from the paper's equations, transformers' ``Mamba2Mixer`` with the same weights,
hand-written counts and cache sizes, and the refusals. What every mixer passes (cached decoding, a
left-padded batch, gradients, counts, μP roles, a hybrid layout) is test_mixer_contract.py's."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.mixers import randomise

from archlab import build_model, compose_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.nn.mixers.base import Tokens
from archlab.nn.mixers.mamba2 import Mamba2, chunked_ssd, recurrent_ssd
from archlab.nn.validation import ignored, validate
from tests.helpers.parts import short_fit, tiny

pytestmark = pytest.mark.usefixtures("single_thread")

# 4 heads of 8 channels, B and C of 6 in 2 groups (each serving two heads), conv 4, chunks of 5
M2 = {"kind": "mamba2", "n_head": 4, "head_dim": 8, "state_size": 6, "groups": 2}
M2 |= {"qkv_bias": False, "out_bias": False, "scan_chunk": 5}
# a pure Mamba-2 model: no MLP, no positions
PURE = {"attention": M2, "mlp": {"kind": "none"}}


# ---- the scan: chunked, recurrent and a per-token reference ----


def naive_ssd(x, dt, A, B, C, state):
    """Dao and Gu 2024, eq. (1) with Mamba-2's scalar A, in float64, one head and token at a time:
    h_t = exp(Δ_t·a)·h_{t−1} + Δ_t·x_t·B_tᵀ, y_t = h_t·C_t; head h reads B and C of group h // (H / G)."""
    b, T, H, P = x.shape
    G = B.shape[2]
    out = torch.zeros(b, T, H, P, dtype=torch.float64)
    final = torch.zeros(state.shape, dtype=torch.float64)
    for i in range(b):
        for h in range(H):
            g = h // (H // G)
            S = state[i, h].double().clone()
            for t in range(T):
                step = dt[i, t, h].double()
                S = math.exp(step.item() * A[h].item()) * S + step * torch.outer(
                    x[i, t, h].double(), B[i, t, g].double()
                )
                out[i, t, h] = S @ C[i, t, g].double()
            final[i, h] = S
    return out, final


def random_inputs(T, seed, b=2, H=4, P=3, G=2, N=5):
    """Inputs, time steps in (0, 1), decay rates in (−2, 0), B and C, and a nonzero initial state."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(b, T, H, P, generator=gen)
    dt = torch.rand(b, T, H, generator=gen)
    A = -2 * torch.rand(H, generator=gen)
    B, C = torch.randn(b, T, G, N, generator=gen), torch.randn(b, T, G, N, generator=gen)
    state = torch.randn(b, H, P, N, generator=gen) * 0.5
    return x, dt, A, B, C, state


@pytest.mark.parametrize("T", [1, 3, 4, 8, 13, 20])
def test_chunked_and_recurrent_forms_equal_the_per_token_scan(T):
    """Chunks of 4 over lengths that are (4, 8, 20) and are not (1, 3, 13) multiples of it; 2 groups."""
    x, dt, A, B, C, state = random_inputs(T, seed=T)
    expected, expected_state = naive_ssd(x, dt, A, B, C, state)
    for out, final in (chunked_ssd(x, dt, A, B, C, 4, state), recurrent_ssd(x, dt, A, B, C, state)):
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(final.double(), expected_state, rtol=0, atol=1e-5)


def test_a_prefill_then_tokens_one_by_one_equals_the_per_token_scan():
    """The chunked form over the first 9 positions (chunks of 4), then the recurrent form one position at
    a time from the state it left: the outputs and the last state of the whole sequence."""
    x, dt, A, B, C, state = random_inputs(15, seed=1)
    expected, expected_state = naive_ssd(x, dt, A, B, C, state)
    out, S = chunked_ssd(x[:, :9], dt[:, :9], A, B[:, :9], C[:, :9], 4, state)
    outs = [out]
    for t in range(9, 15):
        s = slice(t, t + 1)
        out, S = recurrent_ssd(x[:, s], dt[:, s], A, B[:, s], C[:, s], S)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=1).double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(S.double(), expected_state, rtol=0, atol=1e-5)


# ---- the layer against Hugging Face's Mamba2Mixer ----


def hf_mixer(bias: bool, limit=(0.0, float("inf"))):
    """transformers' Mamba2Mixer (its PyTorch path) at the sizes of ``M2``, RMSNorm eps 1e-5."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    config = transformers.Mamba2Config(
        hidden_size=32, num_heads=4, head_dim=8, expand=1, state_size=6, n_groups=2, conv_kernel=4,
        use_bias=bias, use_conv_bias=True, layer_norm_epsilon=1e-5, num_hidden_layers=1, time_step_limit=limit,
    )  # fmt: skip
    return Mamba2Mixer(config, 0).eval()


def load_from_hf(ours: Mamba2, hf) -> None:
    """The same tensors: in_proj [z | x, B, C | dt] in both, the convolution's weight [channels, 1, K]."""
    with torch.no_grad():
        ours.in_proj.weight.copy_(hf.in_proj.weight)
        ours.conv_weight.copy_(hf.conv1d.weight)
        for name in ("dt_bias", "A_log", "D"):
            getattr(ours, name).copy_(getattr(hf, name))
        ours.norm_weight.copy_(hf.norm.weight)
        ours.proj.weight.copy_(hf.out_proj.weight)
        assert ours.conv_bias is not None
        ours.conv_bias.copy_(hf.conv1d.bias)
        if hf.in_proj.bias is not None:
            assert ours.in_proj.bias is not None and ours.proj.bias is not None
            ours.in_proj.bias.copy_(hf.in_proj.bias)
            ours.proj.bias.copy_(hf.out_proj.bias)


@pytest.mark.parametrize("bias,limit", [(True, (0.0, float("inf"))), (True, (0.9, 1.6)), (False, (0.0, float("inf")))])
def test_the_layer_equals_transformers_mamba2_mixer(bias, limit):
    """Every weight random (vectors in [0.3, 2.3]); 13 positions in chunks of 5 (HF: one chunk of 256);
    biases on the projections and the convolution; dt clamped to (0.9, 1.6), which the softplus of
    biases in [0.3, 2.3] crosses on both sides. Without projection biases a left-padded batch too: HF
    zeroes the padded inputs, we their convolution inputs and time steps, the same for the tokens."""
    hf = randomise(hf_mixer(bias, limit))
    dt_limit = {} if limit[1] == float("inf") else {"dt_limit_min": limit[0], "dt_limit_max": limit[1]}
    cfg = tiny(attention=M2 | {"qkv_bias": bias, "out_bias": bias} | dt_limit, norm={"eps": 1e-5})
    validate(cfg)
    ours = Mamba2(cfg)
    load_from_hf(ours, hf)
    assert sum(p.numel() for p in hf.parameters()) == Mamba2.num_params(cfg)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = hf(x), ours(x)
    assert expected.abs().max() > 0.1  # not a near-zero output that any layer would match
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    if not bias:
        padding = torch.ones(2, 13, dtype=torch.bool)
        padding[0, :4] = False
        with torch.no_grad():
            expected_padded, got_padded = hf(x, attention_mask=padding.long()), ours(x, mask=Tokens(padding))
        torch.testing.assert_close(got_padded[padding], expected_padded[padding], rtol=1e-5, atol=1e-5)


# ---- counts, FLOPs and the cache ----


def per_layer(d, H, P, G, N, K, bias=False, conv_bias=True):
    """In-projection z, x, B, C, dt; the convolution over x, B, C; dt_bias, A_log and D; the norm; out."""
    inner, channels = H * P, H * P + 2 * G * N
    projections = (d + bias) * (inner + channels + H) + inner * d + bias * d
    return projections + channels * (K + conv_bias) + 3 * H + inner


def test_counts_by_hand_and_transformers():
    """Mamba-Codestral's layer (d 4096, 128 heads of 64, 8 groups of 128, conv 4 with a bias): 109,635,968
    parameters, as transformers' module at Mamba2Config's defaults holds."""
    assert per_layer(4096, 128, 64, 8, 128, 4) == 109_635_968
    codestral = tiny(d_model=4096, attention=M2 | {"n_head": 128, "head_dim": 64, "groups": 8, "state_size": 128})
    assert Mamba2.num_params(codestral) == 109_635_968
    transformers = pytest.importorskip("transformers")
    from transformers.models.mamba2.modeling_mamba2 import Mamba2Mixer

    with torch.device("meta"):
        hf = Mamba2Mixer(transformers.Mamba2Config(), 0)
    assert sum(p.numel() for p in hf.parameters()) == 109_635_968


def test_a_pure_mamba2_model_counts_builds_and_trains():
    """Two mamba2 layers and no MLP: the built count is the hand-written one (one norm per block), the
    FLOPs 12·H·P·N per layer beyond the weights, and a short fit lowers the loss with gradients reaching
    every parameter outside the projections."""
    cfg = tiny(**PURE)
    model = build_model(cfg)  # compares every component with the closed form
    attention = 2 * per_layer(32, 4, 8, 2, 6, 4)
    total = 48 * 32 + attention + 2 * 32 + 32  # embedding (tied), a norm per block, the final norm
    counts = count_params(cfg)
    assert counts["attention"] == attention and counts["mlp"] == 0 and counts["total"] == total
    assert sum(p.numel() for p in model.parameters()) == total
    assert all(block.mlp is None and block.mlp_norm is None for block in model.blocks)
    assert counts["flops_per_token"] == 6 * counts["non_embedding"] + 2 * 12 * 4 * 8 * 6
    assert ignored(cfg) == []
    losses = short_fit(model, 48, 16, steps=12)
    assert losses[-1] < 0.8 * losses[0]
    for name in ("conv_weight", "conv_bias", "dt_bias", "A_log", "D", "norm_weight"):
        grad = getattr(model.blocks[0].attn, name).grad
        assert grad is not None and grad.abs().max() > 0, name


@pytest.mark.parametrize(
    "block,norms", [("pre", 1), ("post", 1), ("parallel", 1), ("post_sublayer", 1), ("sandwich", 2)]
)
def test_mlp_none_leaves_each_wiring_its_attention_norms_alone(block, norms):
    """With ``mlp.kind: none`` every wiring keeps only the norms of its attention (parallel with two norms:
    one), the closed form equal to the built module, and the block's output is its attention step's alone."""
    cfg = tiny(block={"kind": block, "shared_norm": False}, mlp={"kind": "none"})
    model = build_model(cfg)
    assert count_params(cfg)["norms"] == 2 * norms * 32
    block0 = model.blocks[0]
    assert block0.mlp is None and block0.mlp_norm is None and block0.mlp_out_norm is None
    x = torch.randn(1, 5, 32)
    with torch.no_grad():
        if block == "post":
            expected = block0.attn_norm(x + block0.attn(x))
        elif block == "post_sublayer":
            expected = x + block0.attn_out_norm(block0.attn(x))
        elif block == "sandwich":
            expected = x + block0.attn_out_norm(block0.attn(block0.attn_norm(x)))
        else:
            expected = x + block0.attn(block0.attn_norm(x))
        torch.testing.assert_close(block0(x), expected)


def test_init_follows_transformers():
    """A_log = log(1..H), D = 1, the norm's scale 1, the convolution's bias 0, and softplus(dt_bias) within
    [dt_min, dt_max] = [0.01, 0.02] as set."""
    cfg = tiny(**PURE | {"attention": M2 | {"dt_min": 0.01, "dt_max": 0.02}})
    mixer = build_model(cfg).blocks[1].attn
    torch.testing.assert_close(mixer.A_log.exp(), torch.arange(1.0, 5.0))
    assert torch.equal(mixer.D, torch.ones(4)) and torch.equal(mixer.norm_weight, torch.ones(32))
    assert torch.equal(mixer.conv_bias, torch.zeros(56))
    dt = torch.nn.functional.softplus(mixer.dt_bias)
    assert ((dt >= 0.01 - 1e-6) & (dt <= 0.02 + 1e-6)).all()


@pytest.mark.parametrize(
    "overrides,kinds",
    [
        (["model/attention=mamba2", "model/mlp=none"], ["mamba2"] * 8),
        (["model/layers=mamba2_3_1"], (["mamba2"] * 3 + ["causal"]) * 2),
    ],
)
def test_the_options_compose_on_a_preset(overrides, kinds):
    """``model/attention=mamba2 model/mlp=none`` and ``model/layers=mamba2_3_1`` on a preset with biases,
    learned positions and a tanh GELU: nothing reported ignored, the count equal to the meta build."""
    cfg = compose_model(["model=nano", "model.n_layer=8", *overrides])
    assert [c.attention.kind for c in layer_configs(cfg)] == kinds
    assert ignored(cfg) == []
    build_model(cfg, device="meta")


def test_the_cache_of_a_mamba2_layer_is_constant_in_the_context():
    """Per layer a [B, 56, 3] convolution state (32 + 2·2·6 channels) and [B, 4, 8, 6] states: 56·3 +
    4·8·6 = 360 values at any length. kv_cache_bytes counts what is held."""
    cfg = tiny(**PURE)
    model = build_model(cfg).eval()
    for T in (4, 9, 24):
        assert kv_cache_bytes(cfg, T) == 4 * 2 * 360
    cache = model.new_cache(1, 9)
    with torch.no_grad():
        model(torch.zeros(1, 9, dtype=torch.long), cache)
    assert [tuple(t.shape) for t in cache.conv_state] == [(1, 56, 3)] * 2
    assert [tuple(t.shape) for t in cache.recurrent_state] == [(1, 4, 8, 6)] * 2
    held = [t for t in (*cache.conv_state, *cache.recurrent_state) if t is not None]
    assert sum(t.numel() * t.element_size() for t in held) == kv_cache_bytes(cfg, 9)


# ---- validation ----

REFUSED = [
    ({"attention": M2 | {"n_kv_head": 2}}, "model.attention.n_kv_head"),
    ({"attention": M2 | {"qk_norm": "head"}}, "model.attention.qk_norm"),
    ({"attention": M2 | {"window": 4}}, "model.attention.window"),
    ({"attention": M2 | {"gate": "elementwise"}}, "model.attention.gate"),
    ({"attention": M2 | {"head_dim": 0}}, "model.attention.head_dim"),
    ({"attention": M2 | {"head_dim": None, "n_head": 5}}, "model.attention.n_head"),
    ({"attention": M2 | {"groups": 3}}, "model.attention.groups"),
    ({"attention": M2 | {"groups": 0}}, "model.attention.groups"),
    ({"attention": M2 | {"state_size": 0}}, "model.attention.state_size"),
    ({"attention": M2 | {"conv_kernel": 0}}, "model.attention.conv_kernel"),
    ({"attention": M2 | {"scan_chunk": 0}}, "model.attention.scan_chunk"),
    ({"attention": M2 | {"dt_min": 0.0}}, "model.attention.dt_min"),
    ({"attention": M2 | {"dt_max": 0.0001}}, "model.attention.dt_max"),
    ({"attention": M2 | {"dt_init_floor": -1.0}}, "model.attention.dt_init_floor"),
    ({"attention": M2 | {"dt_limit_min": -1.0}}, "model.attention.dt_limit_min"),
    ({"attention": M2 | {"dt_limit_min": 0.5, "dt_limit_max": 0.5}}, "model.attention.dt_limit_max"),
    ({"attention": M2 | {"dt_bias_init": None}}, "model.attention.dt_bias_init"),  # gated_deltanet's field
    ({"attention": {"state_size": 16}}, "model.attention.state_size"),  # the causal kind refuses its fields
    ({"attention": {"groups": 2}}, "model.attention.groups"),
    ({"attention": {"dt_limit_max": 1.0}}, "model.attention.dt_limit_max"),
]  # fmt: skip


@pytest.mark.parametrize("overrides,field", REFUSED, ids=[f"{f}-{i}" for i, (_, f) in enumerate(REFUSED)])
def test_each_refused_setting_names_its_field(overrides, field):
    with pytest.raises(ConfigError) as error:
        validate(tiny(**overrides))
    assert error.value.field == field
