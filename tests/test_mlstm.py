"""The mLSTM (``mlstm``), each against an independent expectation: the rule written per token in float64
from the xLSTM paper's stabilised equations, transformers' ``xLSTMLayer`` with the same weights (its chunkwise
and recurrent native kernels), hand-written counts and cache sizes, and the refusals. What every mixer passes
(cached decoding, a left-padded batch, packed documents, gradients, counts, μP roles, a hybrid layout) is
test_mixer_contract.py's."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.mixers import randomise

from archlab import build_model, count_params
from archlab.accounting import kv_cache_bytes
from archlab.config.layers import layer_configs
from archlab.errors import ConfigError
from archlab.nn.mixers.mlstm import MLSTM
from archlab.nn.mixers.ops.mlstm_rule import chunked_mlstm_rule, recurrent_mlstm_rule
from archlab.nn.validation import ignored, validate
from tests.helpers.parts import short_fit, tiny

pytestmark = pytest.mark.usefixtures("single_thread")

# 4 heads of 4 query/key and 8 value dims (d_model 32), chunks of 5
MLSTM_CFG = {"kind": "mlstm", "n_head": 4, "scan_chunk": 5}
# three mlstm layers, then one causal layer (4 heads of 8, 2 key/value heads) with RoPE
HYBRID = {
    "n_layer": 4,
    "position": {"kind": "rope"},
    "attention": {"qkv_bias": False, "out_bias": False},
    "layers": {"kinds": {"m": {"attention": MLSTM_CFG}, "attention": {}}, "pattern": ["m"] * 3 + ["attention"]},
}
EPS = 1e-6


# ---- the rule: chunked, recurrent and a per-token reference ----


def naive_mlstm_rule(q, k, v, i, log_f, state):
    """xLSTM (arXiv:2405.04517) eqs. (19)-(27) with the stabiliser, in float64, one head and token at a time:
    m_t = max(log f_t + m_{t−1}, i_t), i'_t = exp(i_t − m_t), f'_t = exp(log f_t + m_{t−1} − m_t),
    C_t = f'·C + i'·k vᵀ, n_t = f'·n + i'·k, h_t = Cᵀq / (max(|nᵀq|, exp(−m_t)) + eps). Python floats for m,
    so nothing here is vectorised like the forms under test."""
    B, H, T, dk = k.shape
    dv = v.shape[-1]
    out = torch.zeros(B, H, T, dv, dtype=torch.float64)
    finals = []
    for b in range(B):
        for h in range(H):
            C, n, m = state[0][b, h].double(), state[1][b, h].double(), float(state[2][b, h])
            for t in range(T):
                lf, it = float(log_f[b, h, t]), float(i[b, h, t])
                m_new = max(lf + m, it)
                fa, ia = math.exp(lf + m - m_new), math.exp(it - m_new) if it > -math.inf else 0.0
                k_t, v_t, q_t = k[b, h, t].double(), v[b, h, t].double(), q[b, h, t].double()
                C = fa * C + ia * torch.outer(k_t, v_t)
                n = fa * n + ia * k_t
                m = m_new
                out[b, h, t] = C.T @ q_t / (max(abs(float(n @ q_t)), math.exp(-m)) + EPS)
            finals.append((C, n, m))
    C = torch.stack([c for c, _, _ in finals]).reshape(B, H, dk, dv)
    n = torch.stack([x for _, x, _ in finals]).reshape(B, H, dk)
    m = torch.tensor([x for _, _, x in finals], dtype=torch.float64).reshape(B, H)
    return out, (C, n, m)


def random_inputs(T, seed, B=2, H=3, dk=4, dv=6, gates=3.0):
    """Scaled queries, keys, values, input-gate preactivations N(0, gates²) (gates > 10: the first one 100,
    whose exp is past float32's largest, e^88.7), forget-gate log-sigmoids of N(2, gates²), and a nonzero initial state (m ≠ 0)."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(B, H, T, dk, generator=gen) * dk**-0.5
    k, v = torch.randn(B, H, T, dk, generator=gen), torch.randn(B, H, T, dv, generator=gen)
    i = torch.randn(B, H, T, generator=gen) * gates
    if gates > 10:
        i[:, :, 0] = 100.0
    log_f = F.logsigmoid(2 + torch.randn(B, H, T, generator=gen) * gates)
    state = (
        torch.randn(B, H, dk, dv, generator=gen),
        torch.randn(B, H, dk, generator=gen),
        torch.randn(B, H, generator=gen),
    )
    return q, k, v, i, log_f, state


def assert_state(got, expected, atol):
    for a, b in zip(got, expected, strict=True):
        torch.testing.assert_close(a.double(), b, rtol=1e-5, atol=atol)


CASES = [(1, 4), (3, 4), (4, 4), (8, 4), (13, 4), (20, 4), (30, 12), (9, 64)]


@pytest.mark.parametrize("gates", [3.0, 40.0])
@pytest.mark.parametrize("T,chunk", CASES)
def test_chunked_and_recurrent_forms_equal_the_per_token_rule(T, chunk, gates):
    q, k, v, i, log_f, state = random_inputs(T, seed=T, gates=gates)
    if gates > 10:  # a naive exp(i) overflows float32 here
        assert torch.exp(i).isinf().any()
    expected, expected_state = naive_mlstm_rule(q, k, v, i, log_f, state)
    forms = (
        chunked_mlstm_rule(q, k, v, i, log_f, chunk, EPS, state),
        recurrent_mlstm_rule(q, k, v, i, log_f, EPS, state),
    )
    for out, final in forms:
        assert out.isfinite().all()
        torch.testing.assert_close(out.double(), expected, rtol=1e-4, atol=1e-5)
        assert_state(final, expected_state, 1e-4)


def test_a_prefill_then_tokens_one_by_one_equals_the_per_token_rule():
    """The chunked form over the first 9 positions (chunks of 4), then the recurrent form one position at a
    time from the state it left: the outputs and the last state of the whole sequence."""
    q, k, v, i, log_f, state = random_inputs(15, seed=1)
    expected, expected_state = naive_mlstm_rule(q, k, v, i, log_f, state)
    head = (x[:, :, :9] for x in (q, k, v, i, log_f))
    out, S = chunked_mlstm_rule(*head, 4, EPS, state)
    outs = [out]
    for t in range(9, 15):
        out, S = recurrent_mlstm_rule(*(x[:, :, t : t + 1] for x in (q, k, v, i, log_f)), EPS, S)
        outs.append(out)
    torch.testing.assert_close(torch.cat(outs, dim=2).double(), expected, rtol=1e-4, atol=1e-5)
    assert_state(S, expected_state, 1e-4)


def test_a_padded_position_leaves_the_state_as_it_is():
    """i = −inf and log f = 0 at positions 2 and 5: the rest of the outputs and the final state equal the rule
    over the sequence without them."""
    q, k, v, i, log_f, state = random_inputs(9, seed=3)
    i, log_f = i.clone(), log_f.clone()
    i[:, :, [2, 5]], log_f[:, :, [2, 5]] = -math.inf, 0.0
    kept = [0, 1, 3, 4, 6, 7, 8]
    expected, expected_state = naive_mlstm_rule(*(x[:, :, kept] for x in (q, k, v, i, log_f)), state)
    for out, final in (
        chunked_mlstm_rule(q, k, v, i, log_f, 4, EPS, state),
        recurrent_mlstm_rule(q, k, v, i, log_f, EPS, state),
    ):
        torch.testing.assert_close(out[:, :, kept].double(), expected, rtol=1e-4, atol=1e-5)
        assert_state(final, expected_state, 1e-4)


@pytest.mark.parametrize("chunk", [4, 32])
def test_a_document_start_empties_the_state(chunk):
    """Documents starting at 0, 6 and 19 of 23 positions (row 0: each from the empty state, m = 0) and at 11
    (row 1: positions 0 to 10 continue the initial state): each document's outputs are the per-token rule's
    from there, in both forms, and the final state the last document's."""
    q, k, v, i, log_f, state = random_inputs(23, seed=2, gates=8.0)
    starts = torch.zeros(2, 23, dtype=torch.bool)
    starts[0, [0, 6, 19]], starts[1, 11] = True, True
    forms = (
        chunked_mlstm_rule(q, k, v, i, log_f, chunk, EPS, state, starts),
        recurrent_mlstm_rule(q, k, v, i, log_f, EPS, state, starts),
    )
    for out, final in forms:
        for row, bounds in ((0, [0, 6, 19, 23]), (1, [0, 11, 23])):
            for n, (a, b) in enumerate(zip(bounds, bounds[1:])):
                init = tuple(s[row : row + 1] for s in state)
                if not (row == 1 and n == 0):
                    init = tuple(torch.zeros_like(s) for s in init)
                part = (x[row : row + 1, :, a:b] for x in (q, k, v, i, log_f))
                expected, expected_state = naive_mlstm_rule(*part, init)
                torch.testing.assert_close(out[row : row + 1, :, a:b].double(), expected, rtol=1e-4, atol=1e-5)
            assert_state(tuple(s[row : row + 1] for s in final), expected_state, 1e-4)


# ---- the layer against Hugging Face's xLSTM ----


def hf_layer(chunk_size, use_bias, weight_mode="single"):
    """transformers' xLSTMLayer (its native torch kernels) at d 32, 4 heads, qk 16 and v 32 wide; norm eps 1e-6."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.xlstm.modeling_xlstm import xLSTMLayer

    config = transformers.xLSTMConfig(
        hidden_size=32, num_heads=4, use_bias=use_bias, chunk_size=chunk_size, weight_mode=weight_mode,
        norm_eps=1e-6, eps=EPS, gate_soft_cap=15.0, num_hidden_layers=1, vocab_size=48,
    )  # fmt: skip
    return xLSTMLayer(config)


def load_from_hf(ours: MLSTM, hf) -> None:
    """HF's q, k, v and ogate_preact are our in-projection's rows in that order, its igate and fgate our
    gates'; the multi-head norm and the output projection one to one."""
    rows = (hf.q, hf.k, hf.v, hf.ogate_preact)
    with torch.no_grad():
        ours.in_proj.weight.copy_(torch.cat([p.weight for p in rows]))
        if ours.in_proj.bias is not None:
            ours.in_proj.bias.copy_(torch.cat([p.bias for p in rows]))
            ours.norm_bias.copy_(hf.multihead_norm.bias)  # pyright: ignore[reportOptionalMemberAccess]
            ours.proj.bias.copy_(hf.out_proj.bias)
        ours.gate_weight.copy_(torch.cat((hf.igate_preact.weight, hf.fgate_preact.weight)))
        ours.gate_bias.copy_(torch.cat((hf.igate_preact.bias, hf.fgate_preact.bias)))
        ours.norm_weight.copy_(hf.multihead_norm.weight)
        ours.proj.weight.copy_(hf.out_proj.weight)


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("T", [13, 16])
def test_the_layer_equals_transformers_xlstm_layer(T, bias):
    """Every weight random, the gates' weights scaled up so the soft cap and the stabiliser act; HF in
    chunks of 4 (13: three chunks, then its recurrent kernel for the last one), ours in chunks of 5, and one
    token at a time from the state of a prefill of T − 1."""
    hf = randomise(hf_layer(4, bias), seed=T)
    with torch.no_grad():
        for gate in (hf.igate_preact, hf.fgate_preact):
            gate.weight.mul_(20)
    cfg = tiny(attention=MLSTM_CFG | {"bias": bias}, norm={"eps": 1e-6})
    validate(cfg)
    ours = MLSTM(cfg)
    load_from_hf(ours, hf)
    assert sum(p.numel() for p in hf.parameters()) == MLSTM.num_params(cfg)
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        expected, (C, n, m) = hf(x)
        got = ours(x)
        assert (hf.igate_preact(x).abs() > 15).any()  # the soft cap bends some gate
    assert expected.abs().max() > 0.1  # not a near-zero output that any layer would match
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    model_cfg = tiny(attention=MLSTM_CFG, n_layer=1, norm={"eps": 1e-6})
    cache = build_model(model_cfg).new_cache(2, T)
    with torch.no_grad():
        ours(x[:, : T - 1], cache=cache)
        last = ours(x[:, T - 1 :], cache=cache)
    torch.testing.assert_close(last, expected[:, T - 1 :], rtol=1e-5, atol=1e-5)
    held = cache.recurrent_state[0]
    assert held is not None
    torch.testing.assert_close(held[..., -1], m[..., 0], rtol=1e-5, atol=1e-5)  # HF's stabiliser is ours


# ---- counts, FLOPs and the cache ----


def per_layer(d, H, dk, dv, bias):
    """q and k H·dk each, v and the output gate H·dv each; input and forget gate per head with biases; the
    norm's scale; out; with bias: those projections', the norm's and out's biases."""
    Q, W = H * dk, H * dv
    extra = 2 * Q + 2 * W + W + d if bias else 0
    return d * (2 * Q + 2 * W) + 2 * H * (d + 1) + W + W * d + extra


def test_counts_by_hand_and_transformers_xlstm_7b_layer():
    """xLSTM-7B's layer (d 4096, 8 heads of 256 qk and 512 v dims, no biases): 67,178,512 parameters, as
    transformers' module at its default config holds."""
    assert per_layer(4096, 8, 256, 512, False) == 67_178_512
    seven = tiny(d_model=4096, attention={"kind": "mlstm", "n_head": 8})
    assert MLSTM.num_params(seven) == 67_178_512
    transformers = pytest.importorskip("transformers")
    from transformers.models.xlstm.modeling_xlstm import xLSTMLayer

    with torch.device("meta"):
        hf = xLSTMLayer(transformers.xLSTMConfig())
    assert sum(p.numel() for p in hf.parameters()) == 67_178_512


def test_the_hybrid_counts_builds_and_trains():
    """Three mlstm layers and one causal layer: the built count is the hand-written one, the FLOPs
    12·H·dk·(dv + 1) per recurrent layer and 12·H·hd·T for the attention layer, and a short fit lowers the
    loss with gradients reaching every recurrent parameter."""
    cfg = tiny(**HYBRID)
    assert [c.attention.kind for c in layer_configs(cfg)] == ["mlstm"] * 3 + ["causal"]
    model = build_model(cfg)  # compares every component with the closed form
    attention = 3 * per_layer(32, 4, 4, 8, False) + 32 * (4 + 2 * 2) * 8 + 4 * 8 * 32
    mlp = 4 * (2 * 32 * 128 + 128 + 32)  # gelu, 4·d wide, with biases
    total = 48 * 32 + attention + mlp + 4 * 2 * 32 + 32  # embedding (tied), norms, final norm
    counts = count_params(cfg)
    assert counts["attention"] == attention and counts["total"] == total
    assert sum(p.numel() for p in model.parameters()) == total
    assert counts["flops_per_token"] == 6 * counts["non_embedding"] + 3 * 12 * 4 * 4 * 9 + 12 * 4 * 8 * 24
    losses = short_fit(model, 48, 16, steps=12)
    assert losses[-1] < 0.8 * losses[0]
    for name in ("in_proj.weight", "gate_weight", "gate_bias", "norm_weight", "proj.weight"):
        grad = model.blocks[0].attn.get_parameter(name).grad
        assert grad is not None and grad.abs().max() > 0, name


def test_the_cache_of_a_recurrent_layer_is_constant_in_the_context():
    """Per mlstm layer [B, 4, 4·8 + 4 + 1]: 148 values at any length; the causal layer's 2·2·8 per position.
    kv_cache_bytes counts what is held."""
    cfg = tiny(**HYBRID)
    model = build_model(cfg).eval()
    for T in (4, 9, 24):
        assert kv_cache_bytes(cfg, T) == 4 * (3 * 148 + 2 * 2 * 8 * T)
    cache = model.new_cache(1, 9)
    with torch.no_grad():
        model(torch.zeros(1, 9, dtype=torch.long), cache)
    assert [tuple(t.shape) for t in cache.recurrent_state[:3]] == [(1, 4, 37)] * 3
    held = [t for t in (*cache.k, *cache.v, *cache.conv_state, *cache.recurrent_state) if t is not None]
    assert sum(t.numel() * t.element_size() for t in held) == kv_cache_bytes(cfg, 9)


# ---- init and validation ----


def test_the_init_sets_the_gates_as_transformers_xlstm():
    """Gate weights 0, input-gate biases −10, forget-gate biases 3 to 6 over the heads, the norm's scale 1."""
    cfg = tiny(attention=MLSTM_CFG | {"bias": True})
    layers = [m for m in build_model(cfg).modules() if isinstance(m, MLSTM)]
    for m in layers:
        assert torch.equal(m.gate_weight, torch.zeros(8, 32))
        assert torch.equal(m.gate_bias, torch.tensor([-10.0] * 4 + [3.0, 4.0, 5.0, 6.0]))
        assert torch.equal(m.norm_weight, torch.ones(32)) and torch.equal(m.norm_bias, torch.zeros(32))
    assert ignored(cfg) == []


REFUSED = [
    ({"attention": MLSTM_CFG | {"n_kv_head": 2}}, "model.attention.n_kv_head"),
    ({"attention": MLSTM_CFG | {"n_head": 0}}, "model.attention.n_head"),
    ({"attention": MLSTM_CFG | {"n_head": 5}}, "model.attention.head_dim"),  # 32 splits into no 5 heads
    ({"attention": MLSTM_CFG | {"head_dim": 0}}, "model.attention.head_dim"),
    ({"attention": MLSTM_CFG | {"qk_head_dim": 0}}, "model.attention.qk_head_dim"),
    ({"attention": MLSTM_CFG | {"head_dim": 1}}, "model.attention.qk_head_dim"),  # head_dim // 2 = 0
    ({"attention": MLSTM_CFG | {"scan_chunk": 0}}, "model.attention.scan_chunk"),
    ({"attention": MLSTM_CFG | {"eps": 0.0}}, "model.attention.eps"),
    ({"attention": MLSTM_CFG | {"gate_soft_cap": -1.0}}, "model.attention.gate_soft_cap"),
    ({"attention": {"gate_soft_cap": 2.0}}, "model.attention.gate_soft_cap"),  # the causal kind refuses it
]  # fmt: skip


@pytest.mark.parametrize("overrides,field", REFUSED, ids=[f for _, f in REFUSED])
def test_each_refused_setting_names_its_field(overrides, field):
    with pytest.raises(ConfigError) as error:
        validate(tiny(**overrides))
    assert error.value.field == field
