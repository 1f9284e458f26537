"""Kimi Delta Attention (``kda``), each against an independent expectation: the rule written per token in
float64 from the paper's equations, transformers' ``KimiLinearDeltaAttention`` with the same weights,
hand-written counts and cache sizes, and the refusals. What every mixer passes (cached decoding, a
left-padded batch, packed documents, gradients, counts, μP roles, a hybrid layout) is
test_mixer_contract.py's."""

from __future__ import annotations

import pytest
import torch
from helpers.mixers import randomise

from archlab import build_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.nn.mixers.base import Tokens
from archlab.nn.mixers.kda import KimiDeltaAttention
from archlab.nn.mixers.ops.delta_rule import l2_normalise
from archlab.nn.mixers.ops.kda_rule import chunked_kda_rule, recurrent_kda_rule
from archlab.nn.validation import ignored, validate
from tests.helpers.parts import short_fit, tiny

pytestmark = pytest.mark.usefixtures("single_thread")

# 4 heads of 8, decay and output gate of rank 3, conv 4, chunks of 5
KDA = {"kind": "kda", "n_head": 4, "head_dim": 8, "gate_rank": 3, "scan_chunk": 5}
# three kda layers, then one causal layer (4 heads of 8, 2 key/value heads) with RoPE
HYBRID = {
    "n_layer": 4,
    "position": {"kind": "rope"},
    "attention": {"qkv_bias": False, "out_bias": False},
    "layers": {"kinds": {"kda": {"attention": KDA}, "attention": {}}, "pattern": ["kda"] * 3 + ["attention"]},
}


# ---- the rule: chunked, recurrent and a per-token reference ----


def naive_kda_rule(q, k, v, g, beta, state):
    """Kimi Linear (arXiv:2510.26692) eq. (1), in float64, one head and token at a time:
    S_t = (I − β_t·k_t·k_tᵀ)·Diag(α_t)·S_{t−1} + β_t·k_t·v_tᵀ with α_t = exp(g_t) per key channel,
    o_t = S_tᵀ·q_t; S is dk × dv."""
    B, H, T, dk = k.shape
    out = torch.zeros(B, H, T, v.shape[-1], dtype=torch.float64)
    final = torch.zeros(B, H, dk, v.shape[-1], dtype=torch.float64)
    eye = torch.eye(dk, dtype=torch.float64)
    for b in range(B):
        for h in range(H):
            S = state[b, h].double().clone()
            for t in range(T):
                k_t, q_t, v_t = k[b, h, t].double(), q[b, h, t].double(), v[b, h, t].double()
                b_t = beta[b, h, t].double()
                S = (eye - b_t * torch.outer(k_t, k_t)) @ torch.diag(g[b, h, t].double().exp()) @ S
                S = S + b_t * torch.outer(k_t, v_t)
                out[b, h, t] = S.T @ q_t
            final[b, h] = S
    return out, final


def random_inputs(T, seed, B=2, H=3, dk=8, dv=6, decay=3.0):
    """Normed keys and scaled normed queries, values, log-decays per channel from −decay to 0, write
    strengths in (0, 1) and a nonzero initial state."""
    gen = torch.Generator().manual_seed(seed)
    q = l2_normalise(torch.randn(B, H, T, dk, generator=gen)) * dk**-0.5
    k = l2_normalise(torch.randn(B, H, T, dk, generator=gen))
    v = torch.randn(B, H, T, dv, generator=gen)
    g = -decay * torch.rand(B, H, T, dk, generator=gen)
    beta = torch.rand(B, H, T, generator=gen)
    state = torch.randn(B, H, dk, dv, generator=gen) * 0.5
    return q, k, v, g, beta, state


# chunks of 4 over lengths that are (4, 8, 20) and are not (1, 3, 13) multiples of it; chunks of 12 (blocks
# of 4 within) and 32 (blocks of 16) over lengths that cross them or are padded to them
CASES = [(1, 4), (3, 4), (4, 4), (8, 4), (13, 4), (20, 4), (30, 12), (40, 32), (70, 32), (9, 64)]


@pytest.mark.parametrize("T,chunk", CASES)
def test_chunked_and_recurrent_forms_equal_the_per_token_rule(T, chunk):
    q, k, v, g, beta, state = random_inputs(T, seed=T)
    expected, expected_state = naive_kda_rule(q, k, v, g, beta, state)
    forms = (chunked_kda_rule(q, k, v, g, beta, chunk, state), recurrent_kda_rule(q, k, v, g, beta, state))
    for out, final in forms:
        torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(final.double(), expected_state, rtol=0, atol=1e-5)


def test_the_chunked_form_is_finite_where_a_chunk_decays_past_float32():
    """Log-decays down to −60 per channel and position: over a chunk of 32 the cumulative decay reaches
    about −960, whose exp(−G) is beyond float32 (and float64); the chunked form still equals the rule."""
    q, k, v, g, beta, state = random_inputs(64, seed=5, decay=60.0)
    expected, expected_state = naive_kda_rule(q, k, v, g, beta, state)
    out, final = chunked_kda_rule(q, k, v, g, beta, 32, state)
    assert g.cumsum(2)[:, :, :32].min() < -800
    torch.testing.assert_close(out.double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(final.double(), expected_state, rtol=0, atol=1e-5)


def test_a_prefill_then_tokens_one_by_one_equals_the_per_token_rule():
    """The chunked form over the first 9 positions (chunks of 4), then the recurrent form one position
    at a time from the state it left: the outputs and the last state of the whole sequence."""
    q, k, v, g, beta, state = random_inputs(15, seed=1)
    expected, expected_state = naive_kda_rule(q, k, v, g, beta, state)
    out, S = chunked_kda_rule(q[:, :, :9], k[:, :, :9], v[:, :, :9], g[:, :, :9], beta[:, :, :9], 4, state)
    outs = [out]
    for t in range(9, 15):
        step = slice(t, t + 1)
        out, S = recurrent_kda_rule(q[:, :, step], k[:, :, step], v[:, :, step], g[:, :, step], beta[:, :, step], S)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2).double(), expected, rtol=0, atol=1e-5)
    torch.testing.assert_close(S.double(), expected_state, rtol=0, atol=1e-5)


@pytest.mark.parametrize("chunk", [4, 32])
def test_a_document_start_empties_the_state(chunk):
    """Documents starting at 0, 6 and 19 of 23 positions (row 0: each from an empty state) and at 11 (row 1:
    positions 0 to 10 continue the initial state): each document's outputs are the per-token rule's, and
    the final state the last document's."""
    q, k, v, g, beta, state = random_inputs(23, seed=2)
    starts = torch.zeros(2, 23, dtype=torch.bool)
    starts[0, [0, 6, 19]], starts[1, 11] = True, True
    out, final = chunked_kda_rule(q, k, v, g, beta, chunk, state, starts)
    for row, bounds in ((0, [0, 6, 19, 23]), (1, [0, 11, 23])):
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            init = state[row : row + 1] if row == 1 and i == 0 else torch.zeros_like(state[row : row + 1])
            part = (x[row : row + 1, :, a:b] for x in (q, k, v, g, beta))
            expected, expected_state = naive_kda_rule(*part, init)
            torch.testing.assert_close(out[row : row + 1, :, a:b].double(), expected, rtol=0, atol=1e-5)
        torch.testing.assert_close(final[row : row + 1].double(), expected_state, rtol=0, atol=1e-5)


# ---- the layer against Hugging Face's Kimi-Linear ----


def hf_kda():
    """transformers' KimiLinearDeltaAttention (its PyTorch fallback) at the sizes of ``KDA`` but its gate
    rank, which is head_dim there (8); RMSNorm eps 1e-6."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    config = transformers.KimiLinearConfig(
        hidden_size=32, linear_num_heads=4, linear_head_dim=8, linear_conv_kernel_dim=4, rms_norm_eps=1e-6,
        num_hidden_layers=1, layer_types=["linear_attention"],
    )  # fmt: skip
    return KimiLinearDeltaAttention(config, 0)


def load_from_hf(ours: KimiDeltaAttention, hf) -> None:
    """Kimi-Linear's separate q, k, v, f_a, g_a and b projections are ours' in-projection's rows in that
    order; the rest one to one (A_log [1, 1, H, 1] flattened)."""
    rows = (hf.q_proj, hf.k_proj, hf.v_proj, hf.forget_gate.f_a_proj, hf.g_a_proj, hf.b_proj)
    with torch.no_grad():
        ours.in_proj.weight.copy_(torch.cat([p.weight for p in rows]))
        ours.conv_weight.copy_(hf.conv1d.weight[:, 0])
        ours.f_b.weight.copy_(hf.forget_gate.f_b_proj.weight)
        ours.g_b.weight.copy_(hf.g_b_proj.weight)
        ours.A_log.copy_(hf.forget_gate.A_log.flatten())
        ours.dt_bias.copy_(hf.forget_gate.dt_bias)
        ours.norm_weight.copy_(hf.o_norm.weight)
        ours.proj.weight.copy_(hf.o_proj.weight)


def test_the_layer_equals_kimi_linears_delta_attention():
    """Every weight random (A_log, dt_bias and the norm's scale in [0.3, 2.3]); 13 positions in chunks of
    5 (HF: one chunk of 64); a left-padded batch too, HF zeroing the padded inputs."""
    hf = randomise(hf_kda())
    cfg = tiny(attention=KDA | {"gate_rank": None}, norm={"eps": 1e-6})
    validate(cfg)
    ours = KimiDeltaAttention(cfg)
    load_from_hf(ours, hf)
    assert sum(p.numel() for p in hf.parameters()) == KimiDeltaAttention.num_params(cfg)
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[0, :4] = False
    with torch.no_grad():
        expected, got = hf(x), ours(x)
        expected_padded, got_padded = hf(x, attention_mask=padding.long()), ours(x, mask=Tokens(padding))
    assert expected.abs().max() > 0.1  # not a near-zero output that any layer would match
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_padded[padding], expected_padded[padding], rtol=1e-5, atol=1e-5)


def hf_bailing_kda():
    """transformers' BailingHybridDeltaAttention (its PyTorch fallback) at the sizes of ``KDA``: full-rank
    f_proj and g_proj, the bounded decay (kda_safe_gate) at kda_lower_bound −3; RMSNorm eps 1e-6."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.bailing_hybrid.modeling_bailing_hybrid import BailingHybridDeltaAttention

    config = transformers.BailingHybridConfig(
        hidden_size=32, num_attention_heads=4, head_dim=8, short_conv_kernel_size=4, rms_norm_eps=1e-6,
        num_hidden_layers=1, layer_types=["linear_attention"], kda_lower_bound=-3.0,
    )  # fmt: skip
    return BailingHybridDeltaAttention(config, 0)


def test_the_full_rank_bounded_layer_equals_bailings_delta_attention():
    """Gate rank 0 and the bounded decay: Bailing's layer with the same weights (its q, k, v, f_proj, g_proj
    and b_proj as our in-projection's rows); every weight random, 13 positions, a left-padded batch too."""
    hf = randomise(hf_bailing_kda())
    cfg = tiny(attention=KDA | {"gate_rank": 0, "decay": "bounded", "decay_lower_bound": -3.0}, norm={"eps": 1e-6})
    validate(cfg)
    ours = KimiDeltaAttention(cfg)
    rows = (hf.q_proj, hf.k_proj, hf.v_proj, hf.forget_gate.f_proj, hf.g_proj, hf.b_proj)
    with torch.no_grad():
        ours.in_proj.weight.copy_(torch.cat([p.weight for p in rows]))
        ours.conv_weight.copy_(hf.conv1d.weight[:, 0])
        ours.A_log.copy_(hf.forget_gate.A_log)
        ours.dt_bias.copy_(hf.forget_gate.dt_bias)
        ours.norm_weight.copy_(hf.o_norm.weight)
        ours.proj.weight.copy_(hf.o_proj.weight)
    assert sum(p.numel() for p in hf.parameters()) == KimiDeltaAttention.num_params(cfg) == per_layer(32, 4, 8, 0, 4)
    build_model(cfg, device="meta")  # compares every component with the closed form
    x = torch.randn(2, 13, 32, generator=torch.Generator().manual_seed(1))
    padding = torch.ones(2, 13, dtype=torch.bool)
    padding[0, :4] = False
    with torch.no_grad():
        expected, got = hf(x), ours(x)
        expected_padded, got_padded = hf(x, attention_mask=padding.long()), ours(x, mask=Tokens(padding))
    assert expected.abs().max() > 0.1
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(got_padded[padding], expected_padded[padding], rtol=1e-5, atol=1e-5)


# ---- counts, FLOPs and the cache ----


def per_layer(d, H, dk, r, K):
    """In-projection q, k, v, f_a, g_a, b; the convolution over q, k, v; f_b and g_b; dt_bias per channel,
    A_log per head; the norm; out. r = 0: f and g straight from the in-projection, W rows each."""
    W = H * dk
    gates = 2 * d * r + 2 * r * W if r else 2 * d * W
    return d * (3 * W + H) + gates + 3 * W * K + W + H + dk + W * d


def test_counts_by_hand_and_kimi_linears():
    """Kimi-Linear-48B-A3B's linear layer (d 2304, 32 heads of 128, gate rank 128, conv 4): 39,514,272
    parameters, as transformers' module at its default config holds."""
    assert per_layer(2304, 32, 128, 128, 4) == 39_514_272
    kimi = tiny(d_model=2304, attention={"kind": "kda", "n_head": 32})
    assert KimiDeltaAttention.num_params(kimi) == 39_514_272
    transformers = pytest.importorskip("transformers")
    from transformers.models.kimi_linear.modeling_kimi_linear import KimiLinearDeltaAttention

    with torch.device("meta"):
        hf = KimiLinearDeltaAttention(transformers.KimiLinearConfig(), 1)
    assert sum(p.numel() for p in hf.parameters()) == 39_514_272


def test_the_hybrid_counts_builds_and_trains():
    """Three kda layers and one causal layer: the built count is the hand-written one, the FLOPs
    18·H·dk² per recurrent layer and 12·H·hd·T for the attention layer, and a short fit lowers the loss
    with gradients reaching every recurrent parameter."""
    cfg = tiny(**HYBRID)
    assert [c.attention.kind for c in layer_configs(cfg)] == ["kda"] * 3 + ["causal"]
    model = build_model(cfg)  # compares every component with the closed form
    attention = 3 * per_layer(32, 4, 8, 3, 4) + 32 * (4 + 2 * 2) * 8 + 4 * 8 * 32
    mlp = 4 * (2 * 32 * 128 + 128 + 32)  # gelu, 4·d wide, with biases
    total = 48 * 32 + attention + mlp + 4 * 2 * 32 + 32  # embedding (tied), norms, final norm
    counts = count_params(cfg)
    assert counts["attention"] == attention and counts["total"] == total
    assert sum(p.numel() for p in model.parameters()) == total
    assert counts["flops_per_token"] == 6 * counts["non_embedding"] + 3 * 18 * 4 * 8 * 8 + 12 * 4 * 8 * 24
    losses = short_fit(model, 48, 16, steps=12)
    assert losses[-1] < 0.8 * losses[0]
    for name in ("conv_weight", "A_log", "dt_bias", "norm_weight", "f_b.weight", "g_b.weight"):
        grad = model.blocks[0].attn.get_parameter(name).grad
        assert grad is not None and grad.abs().max() > 0, name


def test_the_cache_of_a_recurrent_layer_is_constant_in_the_context():
    """Per kda layer a [B, 96, 3] convolution state and [B, 4, 8, 8] states: 96·3 + 4·8·8 = 544 values at
    any length; the causal layer's 2·2·8 per position. kv_cache_bytes counts what is held."""
    cfg = tiny(**HYBRID)
    model = build_model(cfg).eval()
    for T in (4, 9, 24):
        assert kv_cache_bytes(cfg, T) == 4 * (3 * 544 + 2 * 2 * 8 * T)
    cache = model.new_cache(1, 9)
    with torch.no_grad():
        model(torch.zeros(1, 9, dtype=torch.long), cache)
    assert [tuple(t.shape) for t in cache.conv_state[:3]] == [(1, 96, 3)] * 3
    assert [tuple(t.shape) for t in cache.recurrent_state[:3]] == [(1, 4, 8, 8)] * 3
    held = [t for t in (*cache.k, *cache.v, *cache.conv_state, *cache.recurrent_state) if t is not None]
    assert sum(t.numel() * t.element_size() for t in held) == kv_cache_bytes(cfg, 9)


# ---- init and validation ----


def test_the_init_draws_a_log_and_dt_bias_as_kimi_linears():
    """A_log the log of U(1, 16) per head; softplus(dt_bias) log-uniform in [dt_min, dt_max] per channel."""
    torch.manual_seed(0)
    cfg = tiny(attention=KDA | {"n_head": 16, "dt_min": 0.01, "dt_max": 0.2})
    layers = [m for m in build_model(cfg).modules() if isinstance(m, KimiDeltaAttention)]
    A = torch.cat([m.A_log.exp() for m in layers])
    dt = torch.cat([torch.nn.functional.softplus(m.dt_bias) for m in layers])
    assert 1 <= A.min() and A.max() <= 16 and A.std() > 3
    assert 0.01 - 1e-6 <= dt.min() and dt.max() <= 0.2 + 1e-6 and dt.log().std() > 0.5
    assert all(torch.equal(m.norm_weight, torch.ones(8)) for m in layers)
    assert ignored(cfg) == []
    assert [i.field for i in ignored(tiny(attention=KDA | {"decay_lower_bound": -2.0}))] == [
        "model.attention.decay_lower_bound"
    ]  # read only by the bounded decay


REFUSED = [
    ({"attention": KDA | {"n_kv_head": 2}}, "model.attention.n_kv_head"),
    ({"attention": KDA | {"qkv_bias": True}}, "model.attention.qkv_bias"),
    ({"attention": KDA | {"key_heads": 2}}, "model.attention.key_heads"),
    ({"attention": KDA | {"n_head": 0}}, "model.attention.n_head"),
    ({"attention": KDA | {"head_dim": 0}}, "model.attention.head_dim"),
    ({"attention": KDA | {"gate_rank": -1}}, "model.attention.gate_rank"),
    ({"attention": KDA | {"decay": "sigmoid"}}, "model.attention.decay"),
    ({"attention": KDA | {"decay": "bounded", "decay_lower_bound": 0.0}}, "model.attention.decay_lower_bound"),
    ({"attention": KDA | {"conv_kernel": 0}}, "model.attention.conv_kernel"),
    ({"attention": KDA | {"scan_chunk": 0}}, "model.attention.scan_chunk"),
    ({"attention": KDA | {"dt_min": 0.0}}, "model.attention.dt_min"),
    ({"attention": KDA | {"dt_max": 1e-4}}, "model.attention.dt_max"),
    ({"attention": {"gate_rank": 2}}, "model.attention.gate_rank"),  # the causal kind refuses its fields
    (HYBRID | {"layers": {"kinds": {"d": {"attention": KDA | {"scan_chunk": -1}}}, "pattern": ["d"]}},
     "model.layers.kinds.d.attention.scan_chunk"),
]  # fmt: skip


@pytest.mark.parametrize("overrides,field", REFUSED, ids=[f for _, f in REFUSED])
def test_each_refused_setting_names_its_field(overrides, field):
    with pytest.raises(ConfigError) as error:
        validate(tiny(**overrides))
    assert error.value.field == field
