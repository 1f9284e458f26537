"""Gated DeltaNet (``gated_deltanet``), each against an independent expectation: the delta rule written
per token from the paper's equations, transformers' ``Qwen3NextGatedDeltaNet`` with the same weights,
hand-written counts and cache sizes, and the refusals. What every mixer passes (cached decoding, a
left-padded batch, gradients, counts, μP roles, a hybrid layout) is test_mixer_contract.py's."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import randomise

from archlab import build_model, compose_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.nn.mixers.base import Tokens
from archlab.nn.mixers.gated_deltanet import GatedDeltaNet, chunked_delta_rule, l2_normalise, recurrent_delta_rule
from archlab.nn.validation import ignored, validate
from tests.helpers.parts import short_fit, tiny

pytestmark = pytest.mark.usefixtures("single_thread")

# 4 value heads of 6, 2 query/key heads of 8 (each serving two value heads), conv 4, chunks of 5
GDN = {"kind": "gated_deltanet", "n_head": 4}
GDN |= {"key_heads": 2, "key_head_dim": 8, "v_head_dim": 6, "scan_chunk": 5}
# three gated_deltanet layers, then one causal layer (4 heads of 8, 2 key/value heads) with RoPE
HYBRID = {
    "n_layer": 4,
    "position": {"kind": "rope"},
    "attention": {"qkv_bias": False, "out_bias": False},
    "layers": {"kinds": {"deltanet": {"attention": GDN}, "attention": {}}, "pattern": ["deltanet"] * 3 + ["attention"]},
}


# ---- the delta rule: chunked, recurrent and a per-token reference ----


def naive_delta_rule(q, k, v, g, beta, state):
    """Yang et al. 2024, eq. (10), in float64, one head and token at a time: S_t = S_{t−1}·α_t·(I −
    β_t·k_t·k_tᵀ) + β_t·v_t·k_tᵀ with α_t = exp(g_t), o_t = S_t·q_t; S is dv × dk here."""
    B, H, T, dk = k.shape
    out = torch.zeros(B, H, T, v.shape[-1], dtype=torch.float64)
    final = torch.zeros(B, H, dk, v.shape[-1], dtype=torch.float64)
    eye = torch.eye(dk, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = state[b, h].double().T.clone()
            for t in range(T):
                k_t, q_t, v_t = k[b, h, t].double(), q[b, h, t].double(), v[b, h, t].double()
                a_t, b_t = g[b, h, t].double().exp(), beta[b, h, t].double()
                S = S @ (a_t * (eye - b_t * torch.outer(k_t, k_t))) + b_t * torch.outer(v_t, k_t)
                out[b, h, t] = S @ q_t
            final[b, h] = S.T
    return out, final


def random_inputs(T, seed, B=2, H=3, dk=8, dv=6, beta_max=1.0):
    """Normed keys and scaled normed queries, values, log-decays from -3 to 0, write strengths in
    (0, beta_max) and a nonzero initial state."""
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalise(torch.randn(B, H, T, dk, generator=gen)) * dk**-0.5
    k = l2_normalise(torch.randn(B, H, T, dk, generator=gen))
    v = torch.randn(B, H, T, dv, generator=gen)
    g = -3 * torch.rand(B, H, T, generator=gen)
    beta = torch.rand(B, H, T, generator=gen) * beta_max
    state = torch.randn(B, H, dk, dv, generator=gen) * 0.5
    return q, k, v, g, beta, state


@pytest.mark.parametrize("T", [1, 3, 4, 8, 13, 20])
@pytest.mark.parametrize("beta_max", [1.0, 2.0])
def test_chunked_and_recurrent_forms_equal_the_per_token_rule(T, beta_max):
    """Chunks of 4 over lengths that are (4, 8, 20) and are not (1, 3, 13) multiples of it; β in (0, 1), and in
    (0, 2) (``allow_neg_eigval``: where β > 1 the transition's eigenvalue along k, α·(1 − β), is negative)."""
    q, k, v, g, beta, state = random_inputs(T, seed=T, beta_max=beta_max)
    assert (beta > 1).any() == (beta_max == 2.0)
    expected, expected_state = naive_delta_rule(q, k, v, g, beta, state)
    for out, final in (chunked_delta_rule(q, k, v, g, beta, 4, state), recurrent_delta_rule(q, k, v, g, beta, state)):
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(final.double(), expected_state, rtol=0, atol=1e-5)


def test_a_prefill_then_tokens_one_by_one_equals_the_per_token_rule():
    """The chunked form over the first 9 positions (chunks of 4), then the recurrent form one position
    at a time from the state it left: the outputs and the last state of the whole sequence."""
    q, k, v, g, beta, state = random_inputs(15, seed=1)
    expected, expected_state = naive_delta_rule(q, k, v, g, beta, state)
    out, S = chunked_delta_rule(q[:, :, :9], k[:, :, :9], v[:, :, :9], g[:, :, :9], beta[:, :, :9], 4, state)
    outs = [out]
    for t in range(9, 15):
        step = slice(t, t + 1)
        out, S = recurrent_delta_rule(q[:, :, step], k[:, :, step], v[:, :, step], g[:, :, step], beta[:, :, step], S)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2).double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(S.double(), expected_state, rtol=0, atol=1e-5)


# ---- the layer against Hugging Face's Qwen3-Next ----


def hf_gated_deltanet():
    """transformers' Qwen3NextGatedDeltaNet (its PyTorch fallback) at the sizes of ``GDN``, RMSNorm eps 1e-6."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    config = transformers.Qwen3NextConfig(
        hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, rms_norm_eps=1e-6, num_hidden_layers=1,
        layer_types=["linear_attention"],
    )  # fmt: skip
    return Qwen3NextGatedDeltaNet(config, 0)


def load_from_hf(ours: GatedDeltaNet, hf) -> None:
    """Qwen3-Next's projections are grouped per query/key head ([q, k, v, z] and [b, a] of each group);
    ours is one in-projection [q | k | v | z | b | a] over all heads: the same rows, regrouped."""
    Hk, dk, r, dv = 2, 8, 2, 6
    qkvz = hf.in_proj_qkvz.weight.unflatten(0, (Hk, 2 * dk + 2 * r * dv)).split((dk, dk, r * dv, r * dv), dim=1)
    ba = hf.in_proj_ba.weight.unflatten(0, (Hk, 2 * r)).split((r, r), dim=1)
    with torch.no_grad():
        ours.in_proj.weight.copy_(torch.cat([part.flatten(0, 1) for part in (*qkvz, *ba)]))
        ours.conv_weight.copy_(hf.conv1d.weight[:, 0])
        ours.A_log.copy_(hf.A_log)
        ours.dt_bias.copy_(hf.dt_bias)
        ours.norm_weight.copy_(hf.norm.weight)
        ours.proj.weight.copy_(hf.out_proj.weight)


def test_the_layer_equals_qwen3_nexts_gated_deltanet():
    """Every weight random (A_log, dt_bias and the norm's scale in [0.3, 2.3]); 13 positions in chunks of
    5 (HF: one chunk of 64); a left-padded batch too, HF zeroing the padded inputs."""
    hf = randomise(hf_gated_deltanet())
    cfg = tiny(attention=GDN, norm={"eps": 1e-6})
    validate(cfg)
    ours = GatedDeltaNet(cfg)
    load_from_hf(ours, hf)
    assert sum(p.numel() for p in hf.parameters()) == GatedDeltaNet.num_params(cfg)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[0, :4] = False
    with torch.no_grad():
        expected, got = hf(x), ours(x)
        expected_padded, got_padded = hf(x, attention_mask=padding.long()), ours(x, mask=Tokens(padding))
    assert expected.abs().max() > 0.1  # not a near-zero output that any layer would match
    # outputs up to ~9: float32 rounding of another summation order (measured: at most 8e-6)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_padded[padding], expected_padded[padding], rtol=1e-5, atol=1e-5)


def test_with_negative_eigenvalues_the_layer_equals_olmo_hybrids_gated_deltanet():
    """``allow_neg_eigval``: transformers' OlmoHybridGatedDeltaNet (linear_allow_neg_eigval, its q, k, v, g, b
    and a projected apart: our in-projection's rows) with the same random weights, 13 positions in chunks of 5,
    within 1e-5 (its output norm's epsilon is 1e-5 whatever rms_norm_eps: ours ``norm_eps``, the model's 1e-6); with
    β in (0, 1) instead the outputs move (the doubling is not lost)."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.olmo_hybrid.modeling_olmo_hybrid import OlmoHybridGatedDeltaNet

    config = transformers.OlmoHybridConfig(
        hidden_size=32, linear_num_key_heads=2, linear_num_value_heads=4, linear_key_head_dim=8,
        linear_value_head_dim=6, linear_conv_kernel_dim=4, num_hidden_layers=2, linear_allow_neg_eigval=True,
    )  # fmt: skip
    hf = randomise(OlmoHybridGatedDeltaNet(config, 0))
    cfg = tiny(attention=GDN | {"allow_neg_eigval": True, "norm_eps": 1e-5}, norm={"eps": 1e-6})
    validate(cfg)
    ours = GatedDeltaNet(cfg)
    assert sum(p.numel() for p in hf.parameters()) == GatedDeltaNet.num_params(cfg)
    with torch.no_grad():
        rows = [getattr(hf, f"{n}_proj").weight for n in ("q", "k", "v", "g", "b", "a")]
        ours.in_proj.weight.copy_(torch.cat(rows))
        ours.conv_weight.copy_(hf.conv1d.weight[:, 0])
        for name in ("A_log", "dt_bias"):
            getattr(ours, name).copy_(getattr(hf, name))
        ours.norm_weight.copy_(hf.o_norm.weight)
        ours.proj.weight.copy_(hf.o_proj.weight)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, got = hf(x), ours(x)
        ours.beta_scale = 1.0
        unscaled = ours(x)
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (unscaled - expected).abs().max() > 1e-2


# ---- counts, FLOPs and the cache ----


def per_layer(d, Hk, dk, H, dv, K):
    """In-projection q, k, v, z, b, a; the convolution over q, k, v; A_log and dt_bias; the norm; out."""
    channels = 2 * Hk * dk + H * dv
    return d * (channels + H * dv + 2 * H) + channels * K + 2 * H + dv + H * dv * d


def test_counts_by_hand_and_qwen3_nexts():
    """Qwen3-Next-80B-A3B's linear layer (d 2048, 16 query/key heads and 32 value heads of 128, conv 4):
    33,718,464 parameters, as transformers' module at its default config holds."""
    assert per_layer(2048, 16, 128, 32, 128, 4) == 33_718_464
    qwen = tiny(d_model=2048, attention=GDN | {"n_head": 32, "key_heads": 16, "key_head_dim": 128, "v_head_dim": 128})
    assert GatedDeltaNet.num_params(qwen) == 33_718_464
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3_next.modeling_qwen3_next import Qwen3NextGatedDeltaNet

    with torch.device("meta"):
        hf = Qwen3NextGatedDeltaNet(transformers.Qwen3NextConfig(), 0)
    assert sum(p.numel() for p in hf.parameters()) == 33_718_464


def test_the_hybrid_counts_builds_and_trains():
    """Three gated_deltanet layers and one causal layer: the built count is the hand-written one, the
    FLOPs 18·H·dk·dv per recurrent layer and 12·H·hd·T for the attention layer, and a short fit lowers
    the loss with gradients reaching every recurrent parameter."""
    cfg = tiny(**HYBRID)
    assert [c.attention.kind for c in layer_configs(cfg)] == ["gated_deltanet"] * 3 + ["causal"]
    model = build_model(cfg)  # compares every component with the closed form
    attention = 3 * per_layer(32, 2, 8, 4, 6, 4) + 32 * (4 + 2 * 2) * 8 + 4 * 8 * 32
    mlp = 4 * (2 * 32 * 128 + 128 + 32)  # gelu, 4·d wide, with biases
    total = 48 * 32 + attention + mlp + 4 * 2 * 32 + 32  # embedding (tied), norms, final norm
    counts = count_params(cfg)
    assert counts["attention"] == attention and counts["total"] == total
    assert sum(p.numel() for p in model.parameters()) == total
    assert counts["flops_per_token"] == 6 * counts["non_embedding"] + 3 * 18 * 4 * 8 * 6 + 12 * 4 * 8 * 24
    losses = short_fit(model, 48, 16, steps=12)
    assert losses[-1] < 0.8 * losses[0]
    for name in ("conv_weight", "A_log", "dt_bias", "norm_weight"):
        grad = getattr(model.blocks[0].attn, name).grad
        assert grad is not None and grad.abs().max() > 0, name


def test_the_layers_option_composes_three_to_one():
    """``model/layers=deltanet_3_1`` on a preset with biases and learned positions: 8 layers, every
    fourth causal, nothing reported ignored, the count equal to the meta build."""
    cfg = compose_model(["model=nano", "model/layers=deltanet_3_1", "model.n_layer=8"])
    kinds = [c.attention.kind for c in layer_configs(cfg)]
    assert kinds == (["gated_deltanet"] * 3 + ["causal"]) * 2
    assert ignored(cfg) == []
    build_model(cfg, device="meta")


def test_the_cache_of_a_recurrent_layer_is_constant_in_the_context():
    """Per gated_deltanet layer a [B, 56, 3] convolution state and [B, 4, 8, 6] states: 56·3 + 4·8·6 =
    360 values at any length; the causal layer's 2·2·8 per position. kv_cache_bytes counts what is held."""
    cfg = tiny(**HYBRID)
    model = build_model(cfg).eval()
    for T in (4, 9, 24):
        assert kv_cache_bytes(cfg, T) == 4 * (3 * 360 + 2 * 2 * 8 * T)
    cache = model.new_cache(1, 9)
    with torch.no_grad():
        model(torch.zeros(1, 9, dtype=torch.long), cache)
    assert [tuple(t.shape) for t in cache.conv_state[:3]] == [(1, 56, 3)] * 3
    assert [tuple(t.shape) for t in cache.recurrent_state[:3]] == [(1, 4, 8, 6)] * 3
    held = [t for t in (*cache.k, *cache.v, *cache.conv_state, *cache.recurrent_state) if t is not None]
    assert sum(t.numel() * t.element_size() for t in held) == kv_cache_bytes(cfg, 9)


# ---- validation ----

REFUSED = [
    ({"attention": GDN | {"n_kv_head": 2}}, "model.attention.n_kv_head"),
    ({"attention": GDN | {"head_dim": 8}}, "model.attention.head_dim"),
    ({"attention": GDN | {"qkv_bias": True}}, "model.attention.qkv_bias"),
    ({"attention": GDN | {"qk_norm": "head"}}, "model.attention.qk_norm"),
    ({"attention": GDN | {"window": 4}}, "model.attention.window"),
    ({"attention": GDN | {"gate": "elementwise"}}, "model.attention.gate"),
    ({"attention": GDN | {"key_heads": 3}}, "model.attention.key_heads"),
    ({"attention": GDN | {"key_head_dim": 0}}, "model.attention.key_head_dim"),
    ({"attention": GDN | {"v_head_dim": 0}}, "model.attention.v_head_dim"),
    ({"attention": GDN | {"conv_kernel": 0}}, "model.attention.conv_kernel"),
    ({"attention": GDN | {"scan_chunk": 0}}, "model.attention.scan_chunk"),
    ({"attention": GDN | {"norm_eps": 0.0}}, "model.attention.norm_eps"),
    ({"attention": GDN | {"dt_bias_init": float("nan")}}, "model.attention.dt_bias_init"),
    ({"attention": GDN | {"dt_bias_init": None, "dt_min": 0.0}}, "model.attention.dt_min"),
    ({"attention": {"key_heads": 2}}, "model.attention.key_heads"),  # the causal kind refuses its fields
    ({"attention": {"dt_bias_init": None}}, "model.attention.dt_bias_init"),
    ({"attention": {"conv_kernel": 2}}, "model.attention.conv_kernel"),
    (HYBRID | {"layers": {"kinds": {"d": {"attention": GDN | {"scan_chunk": -1}}}, "pattern": ["d"]}},
     "model.layers.kinds.d.attention.scan_chunk"),
]  # fmt: skip


@pytest.mark.parametrize("overrides,field", REFUSED, ids=[f for _, f in REFUSED])
def test_each_refused_setting_names_its_field(overrides, field):
    with pytest.raises(ConfigError) as error:
        validate(tiny(**overrides))
    assert error.value.field == field


def test_dt_bias_starts_at_its_value_or_is_drawn_as_mamba2s():
    """transformers' Qwen3-Next init by default (dt_bias 1 in every head); with dt_bias_init null, softplus(dt_bias)
    = dt log-uniform in [dt_min, dt_max] (flash-linear-attention's GatedDeltaNet), floored at dt_init_floor; the
    mamba2 fields are then read, and ignored (reported) otherwise."""
    torch.manual_seed(0)
    fixed = build_model(tiny(attention=GDN | {"n_head": 64, "key_heads": 64, "dt_bias_init": 0.5}))
    assert all(torch.equal(m.dt_bias, torch.full((64,), 0.5)) for m in fixed.modules() if isinstance(m, GatedDeltaNet))
    drawn_cfg = tiny(
        attention=GDN | {"n_head": 64, "key_heads": 64, "dt_bias_init": None, "dt_min": 0.01, "dt_max": 0.2}
    )
    dts = [
        torch.nn.functional.softplus(m.dt_bias)
        for m in build_model(drawn_cfg).modules()
        if isinstance(m, GatedDeltaNet)
    ]
    dt = torch.cat(dts)
    assert 0.01 - 1e-6 <= dt.min() and dt.max() <= 0.2 + 1e-6 and dt.log().std() > 0.5  # spread over the log range
    floored = tiny(attention=GDN | {"dt_bias_init": None, "dt_min": 1e-4, "dt_max": 2e-4, "dt_init_floor": 0.05})
    for m in build_model(floored).modules():
        if isinstance(m, GatedDeltaNet):
            torch.testing.assert_close(torch.nn.functional.softplus(m.dt_bias), torch.full((4,), 0.05))
    assert [i.field for i in ignored(tiny(attention=GDN | {"dt_min": 0.01}))] == ["model.attention.dt_min"]
    assert ignored(drawn_cfg) == []
