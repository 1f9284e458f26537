"""One test per model option that would fail if the option silently did nothing: each compares the
built model with an independent expectation (a formula written out here, a hand-written forward
pass over the model's own submodules, or a published constant)."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from omegaconf import OmegaConf

from archlab import build_model, count_params
from archlab.config import to_model_config
from archlab.nn.mlp import d_ff
from archlab.nn.positions import alibi_slopes, build_position

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def tiny(**overrides):
    """A small float64-friendly config: d_model 32, 4 heads of 8, 2 layers, vocab 48, context 16."""
    base = {"vocab_size": 48, "context_length": 16, "n_layer": 2, "d_model": 32, "attention": {"n_head": 4}}
    return to_model_config(OmegaConf.merge(base, overrides))


def build(cfg, seed=0):
    torch.manual_seed(seed)
    return build_model(cfg, dtype=F64).eval()


def tokens(cfg, T=None, B=2, seed=0):
    T = T or cfg.context_length
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def same_weights(cfg_a, cfg_b, seed=0):
    """Two models of the same shapes (e.g. differing only in a parameter-free option), equal weights."""
    a, b = build(cfg_a, seed), build(cfg_b, seed + 1)
    b.load_state_dict(a.state_dict())
    return a, b


def logits(model, idx):
    with torch.no_grad():
        return model(idx)


def differ(x, y, at_least=1e-6):
    return (x - y).abs().max().item() > at_least


# ---------------------------------------------------------------- independent reference math


def reference_rope(x, pos, theta, rotated, interleaved):
    """RoPE as complex multiplication (Su et al. 2021, eq. 34), in float64: dims pair as (2i, 2i+1)
    (interleaved, GPT-J/Meta) or (i, i + r/2) (half, GPT-NeoX/HF LLaMA); frequency theta^(-2i/r)."""
    r = rotated
    freq = theta ** (-torch.arange(0, r, 2, dtype=F64) / r)
    turn = torch.polar(torch.ones(len(pos), r // 2, dtype=F64), pos.to(F64)[:, None] * freq[None])
    head, rest = x[..., :r].to(F64), x[..., r:]
    if interleaved:
        z = torch.view_as_complex(head.reshape(*head.shape[:-1], r // 2, 2).contiguous()) * turn
        out = torch.view_as_real(z).flatten(-2)
    else:
        z = torch.complex(head[..., : r // 2], head[..., r // 2 :]) * turn
        out = torch.cat((z.real, z.imag), dim=-1)
    return torch.cat((out.to(x.dtype), rest), dim=-1)


def reference_attention(attn, x, q_fn=None, bias=None):
    """Causal attention written out: q/k/v from the fused weight [Q | K | V], each K/V head repeated
    for its n_head/n_kv_head query heads, softmax(q·k/sqrt(hd) + bias) with future keys masked."""
    B, T, _ = x.shape
    H, KV, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    qkv = F.linear(x, attn.qkv.weight, attn.qkv.bias)
    q, k, v = qkv.split((H * hd, KV * hd, KV * hd), dim=-1)
    q, k, v = (t.reshape(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
    if q_fn is not None:
        q, k = q_fn(q), q_fn(k)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    scores = q @ k.transpose(-1, -2) / math.sqrt(hd)
    if bias is not None:
        scores = scores + bias
    future = torch.ones(T, T, dtype=torch.bool).triu(1)
    y = scores.masked_fill(future, float("-inf")).softmax(-1) @ v
    return F.linear(y.transpose(1, 2).reshape(B, T, H * hd), attn.proj.weight, attn.proj.bias)


def reference_forward(model, idx, embed=None, q_fn=None, bias=None):
    """A pre-norm decoder written out over the model's own submodules."""
    x = model.tok_emb(idx)
    if embed is not None:
        x = x + embed
    for block in model.blocks:
        x = x + reference_attention(block.attn, block.attn_norm(x), q_fn, bias)
        x = x + block.mlp(block.mlp_norm(x))
    return model.head(model.final_norm(x))


def vaswani_table(T, d):
    """PE(p, 2i) = sin(p / 10000^(2i/d)), PE(p, 2i+1) = cos(p / 10000^(2i/d)) (Vaswani et al. 2017)."""
    return torch.tensor(
        [[(math.sin if j % 2 == 0 else math.cos)(p / 10000 ** ((j - j % 2) / d)) for j in range(d)] for p in range(T)],
        dtype=F64,
    )


# ---------------------------------------------------------------- positions


@pytest.mark.parametrize(
    "position",
    [
        {"kind": "none"},
        {"kind": "learned"},
        {"kind": "sinusoidal"},
        {"kind": "alibi"},
        {"kind": "rope", "pairing": "half"},
        {"kind": "rope", "pairing": "interleaved", "theta": 100.0, "rotary_dim": 4},
    ],
    ids=lambda p: "-".join(str(v) for v in p.values()),
)
def test_model_forward_equals_reference_for_each_position_scheme(position):
    cfg = tiny(position=position)
    model, idx = build(cfg), tokens(cfg)
    T, kind = idx.shape[1], position["kind"]
    pos = torch.arange(T)
    embed = q_fn = bias = None
    if kind == "learned":
        embed = model.position.table.weight[:T]
    elif kind == "sinusoidal":
        embed = vaswani_table(T, cfg.d_model)
    elif kind == "rope":
        theta, r = position.get("theta", 10000.0), position.get("rotary_dim", 8)

        def q_fn(t):
            return reference_rope(t, pos, theta, r, interleaved=position["pairing"] == "interleaved")
    elif kind == "alibi":  # head h adds -slope_h * (query - key) to its scores
        slopes = torch.tensor([2.0 ** -(2 * (h + 1)) for h in range(4)], dtype=F64)  # n=4: 2^-2, 2^-4, ...
        bias = -slopes[:, None, None] * (pos[:, None] - pos[None, :]).to(F64)
    with torch.no_grad():
        torch.testing.assert_close(model(idx), reference_forward(model, idx, embed, q_fn, bias), rtol=1e-5, atol=1e-6)


def test_rope_pairings_differ_for_the_same_weights():
    half, inter = same_weights(
        tiny(position={"kind": "rope", "pairing": "half"}), tiny(position={"kind": "rope", "pairing": "interleaved"})
    )
    idx = tokens(half.cfg)
    assert differ(logits(half, idx), logits(inter, idx))


def test_rope_theta_changes_outputs():
    a, b = same_weights(
        tiny(position={"kind": "rope", "theta": 10000.0}), tiny(position={"kind": "rope", "theta": 10.0})
    )
    idx = tokens(a.cfg)
    assert differ(logits(a, idx), logits(b, idx))


def rotate_projection(rotation, qkv, n_head, n_kv_head):
    """Queries, keys and values as attention gets them from a position scheme's ``rotation`` when the
    fused projection's output is ``qkv`` ``[B, T, heads, hd]`` itself: the projection is the identity
    (whose rows the rotation may reorder, as it may attention's)."""
    width, hd = qkv.shape[-2] * qkv.shape[-1], qkv.shape[-1]
    identity = torch.nn.Linear(width, width, bias=False, dtype=qkv.dtype)
    identity.weight = torch.nn.Parameter(torch.eye(width, dtype=qkv.dtype), requires_grad=False)
    return rotation.project(qkv.flatten(-2), identity, n_head, n_kv_head, hd)


def scores(q, k):
    """Every q·k of ``[B, T, heads, hd]`` queries and keys: ``[B, heads, Tq, Tk]``."""
    return torch.einsum("bthd,bshd->bhts", q, k)


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("interleaved", [False, True])
@pytest.mark.parametrize("position", [{"rotary_dim": 4}, {"rotary_fraction": 0.25}])
def test_partial_rotary_rotates_only_the_first_dims(position, interleaved, cached):
    hd = 16  # d_model 64 / 4 heads
    cfg = tiny(d_model=64, position={"kind": "rope", "pairing": "interleaved" if interleaved else "half", **position})
    rotated = 4
    T = 12
    rotate = build_position(cfg).rotary(torch.arange(T), F64, cached=cached)
    x = torch.randn(1, T, 4, hd, dtype=F64)  # [B, T, heads, hd]
    q, k, v = rotate_projection(rotate, torch.cat((x, x[:, :, :1]), dim=2), 3, 1)  # 3 query, 1 key, 1 value head
    assert v.equal(x[:, :, :1])  # values pass through unrotated
    y = torch.cat((q, k), dim=2)  # every head of x, rotated
    torch.testing.assert_close(y[..., rotated:], x[..., rotated:], rtol=0, atol=0)  # position-independent
    expected = reference_rope(x.transpose(1, 2), torch.arange(T), 10000.0, rotated, interleaved).transpose(1, 2)
    # attention sees only q·k: equal to the reference's for every pair of positions, whatever the dims' order
    torch.testing.assert_close(scores(y, y), scores(expected, expected), rtol=1e-5, atol=1e-5)
    if interleaved or cached:  # the projection's own order of dims
        torch.testing.assert_close(y, expected, rtol=1e-6, atol=1e-6)
    else:  # half pairs (i, i + r/2) rotated as adjacent dims (2i, 2i + 1)
        half = expected[..., :rotated].unflatten(-1, (2, rotated // 2)).transpose(-1, -2).flatten(-2)
        torch.testing.assert_close(y[..., :rotated], half, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(y.norm(dim=-1), x.norm(dim=-1))  # a rotation keeps lengths


@pytest.mark.parametrize("cached", [False, True])
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rope_scores_depend_only_on_the_offset(pairing, cached):
    cfg = tiny(position={"kind": "rope", "pairing": pairing})
    T = 16
    rotate = build_position(cfg).rotary(torch.arange(T), F64, cached=cached)
    qkv = torch.randn(1, 1, 3, 8, dtype=F64).expand(1, T, 3, 8)  # one query, key and value at every position
    q, k, _ = rotate_projection(rotate, qkv, 1, 1)
    s = scores(q, k)[0, 0]  # s[m, n] = <R_m q, R_n k>
    for offset in range(-3, 4):
        diagonal = torch.diagonal(s, offset)
        torch.testing.assert_close(diagonal, diagonal[:1].expand_as(diagonal), rtol=1e-5, atol=1e-5)
    assert differ(torch.diagonal(s, 0)[:1], torch.diagonal(s, 3)[:1], 1e-4)


def peak_attention(model):
    """Scale every q/k/v projection up: attention then peaks at a few keys, so that positions matter
    (at init scale it is near uniform, and RoPE barely moves the logits)."""
    with torch.no_grad():
        for block in model.blocks:
            block.attn.qkv.weight.mul_(30)


@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_rope_under_bf16_autocast_matches_float32(pairing):
    """Under autocast the projection is bf16, which has no complex view: the rotation takes the real
    products, in the weight's own order. Logits agree with float32's to bf16 rounding (a model without
    any rotation is off by more than the largest logit)."""
    cfg = tiny(position={"kind": "rope", "pairing": pairing})
    torch.manual_seed(0)
    model, idx = build_model(cfg).eval(), tokens(cfg)
    peak_attention(model)
    with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16):
        low = model(idx)
    high = logits(model, idx)
    assert low.dtype == torch.bfloat16
    assert (low.float() - high).abs().max() < 0.2 * high.abs().max()


@pytest.mark.slow
@pytest.mark.parametrize("pairing", ["half", "interleaved"])
def test_whole_model_torch_compile_matches_eager(pairing):
    """``torch.compile`` of the whole model (the RoPE tables an opaque op, the rotation traced) gives
    eager's logits and gradients."""
    cfg = tiny(position={"kind": "rope", "pairing": pairing}, mlp={"kind": "swiglu"}, norm={"kind": "rmsnorm"})
    torch.manual_seed(0)
    model, idx = build_model(cfg), tokens(cfg)
    peak_attention(model)
    compiled = torch.compile(model, fullgraph=True)  # one graph: no break at the tables or the rotation
    results = []
    for run in (model, compiled):
        model.zero_grad()
        out = run(idx)
        out.square().mean().backward()
        results.append((out.detach(), [p.grad.clone() for p in model.parameters()]))
    (eager_out, eager_grads), (out, grads) = results
    torch.testing.assert_close(out, eager_out, rtol=1e-4, atol=1e-5)
    for g, ref in zip(grads, eager_grads):
        torch.testing.assert_close(g, ref, rtol=1e-3, atol=1e-5)


def test_alibi_slopes_follow_press_et_al():
    # n a power of two: the geometric sequence 2^(-8/n), 2^(-16/n), ..., 2^-8
    assert alibi_slopes(8).tolist() == [2.0**-k for k in range(1, 9)]
    torch.testing.assert_close(alibi_slopes(16), torch.tensor([2.0 ** (-k / 2) for k in range(1, 17)]))
    # n = 12: the 8 slopes of n = 8, then every other slope of n = 16 (2^-0.5, 2^-1.5, ...), first 4
    expected_12 = [2.0**-k for k in range(1, 9)] + [2.0**-0.5, 2.0**-1.5, 2.0**-2.5, 2.0**-3.5]
    torch.testing.assert_close(alibi_slopes(12), torch.tensor(expected_12))
    # n = 6: slopes of n = 4 (2^-2, 2^-4, 2^-6, 2^-8), then 2^-1, 2^-3 from n = 8
    torch.testing.assert_close(alibi_slopes(6), torch.tensor([2.0**-2, 2.0**-4, 2.0**-6, 2.0**-8, 2.0**-1, 2.0**-3]))


def test_alibi_bias_is_minus_slope_times_distance():
    cfg = tiny(attention={"n_head": 8}, position={"kind": "alibi"})
    q_pos, k_pos = torch.arange(3, 7), torch.arange(7)  # a chunk after a 3-token prefix
    bias = build_position(cfg).bias(q_pos, k_pos)
    assert bias.shape == (8, 4, 7)
    for h in range(8):
        for i, q in enumerate(q_pos.tolist()):
            for j in range(q + 1):  # visible keys
                assert bias[h, i, j].item() == pytest.approx(-(2.0 ** -(h + 1)) * (q - j))


def test_sinusoidal_table_equals_vaswani_formula():
    cfg = tiny(d_model=32, position={"kind": "sinusoidal"})
    T = 40  # longer than context_length: the table is not limited to it
    table = build_position(cfg).embed(torch.zeros(T, 32, dtype=F64), torch.arange(T))
    torch.testing.assert_close(table, vaswani_table(T, 32), rtol=1e-5, atol=1e-5)


def test_learned_positions_refuse_sequences_past_context_length():
    cfg = tiny(position={"kind": "learned"})
    model = build(cfg)
    with pytest.raises(ValueError, match=r"model\.context_length=16"):
        logits(model, tokens(cfg, T=17))
    cache = model.new_cache(1, 32)  # also when decoding with a cache walks past the table
    with torch.no_grad():
        model(tokens(cfg, T=16, B=1), cache)
        with pytest.raises(ValueError, match=r"model\.context_length=16"):
            model(tokens(cfg, T=1, B=1), cache)


@pytest.mark.parametrize("kind", ["rope", "alibi", "sinusoidal", "none"])
def test_other_position_schemes_accept_longer_sequences(kind):
    cfg = tiny(position={"kind": kind})
    out = logits(build(cfg), tokens(cfg, T=cfg.context_length + 8))
    assert out.shape == (2, 24, cfg.vocab_size) and torch.isfinite(out).all()


# ---------------------------------------------------------------- norms


def test_layernorm_bias_changes_count_module_and_output():
    with_bias, without = tiny(norm={"kind": "layernorm", "bias": True}), tiny(norm={"kind": "layernorm", "bias": False})
    n_norms = 2 * 2 + 1  # two per pre-norm block, plus the final norm
    assert count_params(with_bias)["total"] - count_params(without)["total"] == n_norms * 32
    assert build(without).final_norm.bias is None
    model = build(with_bias)
    x = torch.randn(3, 32, dtype=F64)
    norm = model.final_norm
    before = norm(x)
    with torch.no_grad():
        norm.bias.fill_(0.5)
    torch.testing.assert_close(norm(x), before + 0.5)


@pytest.mark.parametrize("eps", [1e-5, 0.5])
def test_layernorm_equals_hand_formula(eps):
    norm = build(tiny(norm={"kind": "layernorm", "eps": eps})).final_norm
    with torch.no_grad():
        norm.weight.normal_()
        norm.bias.normal_()
    x = torch.randn(5, 32, dtype=F64)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    torch.testing.assert_close(norm(x), (x - mean) / torch.sqrt(var + eps) * norm.weight + norm.bias)


@pytest.mark.parametrize("eps", [1e-6, 0.5])
def test_rmsnorm_equals_hand_formula(eps):
    cfg = tiny(norm={"kind": "rmsnorm", "eps": eps})
    norm = build(cfg).final_norm
    assert [n for n, _ in norm.named_parameters()] == ["weight"]  # scale only, no bias
    with torch.no_grad():
        norm.weight.normal_()
    x = torch.randn(5, 32, dtype=F64) * 3 + 1  # a non-zero mean: RMSNorm must not subtract it
    rms = torch.sqrt((x**2).mean(-1, keepdim=True) + eps)
    torch.testing.assert_close(norm(x), x / rms * norm.weight)


# ---------------------------------------------------------------- block wiring


def _block_and_input(block_cfg, norm="layernorm"):
    cfg = tiny(block=block_cfg, norm={"kind": norm}, position={"kind": "none"})
    model = build(cfg)
    for p in model.parameters():  # make norms non-trivial so a swapped norm would show
        with torch.no_grad():
            p.add_(0.1 * torch.randn_like(p))
    return model, model.blocks[0], torch.randn(2, 10, 32, dtype=F64)


def test_pre_block_wiring():
    model, b, x = _block_and_input({"kind": "pre"})
    with torch.no_grad():
        h = x + b.attn(b.attn_norm(x))
        torch.testing.assert_close(b(x), h + b.mlp(b.mlp_norm(h)))
    assert model.final_norm is not None


def test_post_block_wiring():
    model, b, x = _block_and_input({"kind": "post"})
    with torch.no_grad():
        h = b.attn_norm(x + b.attn(x))
        torch.testing.assert_close(b(x), b.mlp_norm(h + b.mlp(h)))
    assert model.final_norm is None  # the last block already ends in a norm
    assert count_params(model.cfg)["final_norm"] == 0


def test_parallel_shared_norm_wiring():
    model, b, x = _block_and_input({"kind": "parallel", "shared_norm": True})
    assert b.mlp_norm is None
    assert sum(isinstance(m, torch.nn.LayerNorm) for m in b.modules()) == 1
    with torch.no_grad():
        h = b.attn_norm(x)
        torch.testing.assert_close(b(x), x + b.attn(h) + b.mlp(h))


def test_parallel_two_norms_wiring():
    model, b, x = _block_and_input({"kind": "parallel", "shared_norm": False}, norm="rmsnorm")
    assert sum(isinstance(m, torch.nn.RMSNorm) for m in b.modules()) == 2
    with torch.no_grad():
        torch.testing.assert_close(b(x), x + b.attn(b.attn_norm(x)) + b.mlp(b.mlp_norm(x)))
        assert differ(b(x), x + b.attn(b.attn_norm(x)) + b.mlp(b.attn_norm(x)))  # the second norm is used
    shared = count_params(tiny(block={"kind": "parallel", "shared_norm": True}, norm={"kind": "rmsnorm"}))
    assert count_params(model.cfg)["norms"] - shared["norms"] == 2 * 32  # one more RMSNorm per block


# ---------------------------------------------------------------- MLPs


def _gelu_exact(x):
    return 0.5 * x * (1 + torch.erf(x / math.sqrt(2)))


def _gelu_tanh(x):
    return 0.5 * x * (1 + torch.tanh(math.sqrt(2 / math.pi) * (x + 0.044715 * x**3)))


def _gate(m, x):  # the gate matrix: the first d_ff rows of the fused [gate | up] weight
    f = m.down.in_features
    return F.linear(x, m.gate_up.weight[:f], None if m.gate_up.bias is None else m.gate_up.bias[:f])


def _up(m, x):  # the up matrix: the last d_ff rows
    f = m.down.in_features
    return F.linear(x, m.gate_up.weight[f:], None if m.gate_up.bias is None else m.gate_up.bias[f:])


@pytest.mark.parametrize(
    "mlp, formula",
    [
        ({"kind": "gelu", "approximate": "none"}, lambda m, x: m.proj(_gelu_exact(m.fc(x)))),
        ({"kind": "gelu", "approximate": "tanh"}, lambda m, x: m.proj(_gelu_tanh(m.fc(x)))),
        ({"kind": "relu"}, lambda m, x: m.proj(m.fc(x).clamp(min=0))),
        ({"kind": "relu2"}, lambda m, x: m.proj(m.fc(x).clamp(min=0) ** 2)),
        ({"kind": "swiglu"}, lambda m, x: m.down(_gate(m, x) * torch.sigmoid(_gate(m, x)) * _up(m, x))),
        ({"kind": "geglu"}, lambda m, x: m.down(_gelu_exact(_gate(m, x)) * _up(m, x))),
        ({"kind": "geglu", "approximate": "tanh"}, lambda m, x: m.down(_gelu_tanh(_gate(m, x)) * _up(m, x))),
    ],
    ids=["gelu", "gelu-tanh", "relu", "relu2", "swiglu", "geglu", "geglu-tanh"],
)
def test_mlp_equals_hand_formula(mlp, formula):
    m = build(tiny(mlp=mlp, init_std=0.5)).blocks[0].mlp  # a large init puts pre-activations far from 0
    x = torch.randn(3, 5, 32, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(m(x), formula(m, x))


@pytest.mark.parametrize("clamp", ["gate", "activation"])
def test_clamped_swiglu_equals_hand_formula(clamp):
    """gpt-oss's form, (clamp(up, -L, L) + 1) · g·σ(1.702·g) with g = min(gate, L), and Step-3.5's clamp
    of the activated gate, min(g·σ(α·g), L): random weights and biases far from 0 put gate and up on
    both sides of the limit, so a skipped clamp, α or offset fails."""
    L, alpha, offset = 0.5, 1.702, 1.0
    mlp = {"kind": "swiglu", "bias": True, "swiglu_limit": L, "swiglu_clamp": clamp}
    m = build(tiny(mlp={**mlp, "swiglu_alpha": alpha, "up_offset": offset}, init_std=0.5)).blocks[0].mlp
    with torch.no_grad():
        m.gate_up.bias.copy_(
            torch.randn(m.gate_up.bias.shape, dtype=F64, generator=torch.Generator().manual_seed(1)) + 1
        )
        m.down.bias.fill_(-2.0)
    x = torch.randn(3, 5, 32, dtype=F64)
    gate, up = _gate(m, x), _up(m, x)
    assert (gate > L).any() and (gate < -L).any() and (up > L).any() and (up < -L).any()
    g = torch.minimum(gate, torch.tensor(L)) if clamp == "gate" else gate
    act = g * torch.sigmoid(alpha * g)
    act = torch.minimum(act, torch.tensor(L)) if clamp == "activation" else act
    with torch.no_grad():
        torch.testing.assert_close(m(x), m.down(act * (torch.clamp(up, -L, L) + offset)))


@pytest.mark.parametrize("shared_limit", [None, 0.0, 0.7])
def test_shared_experts_clamp_at_their_own_limit(shared_limit):
    """A MoE's shared SwiGLU clamps min(silu(g), L)·clamp(up, -L, L) at ``shared_swiglu_limit`` (0: not at
    all), at the routed experts' ``swiglu_limit`` where it is null (every earlier config), against the hand
    formula; random weights with biases far from 0 put gate and up on both sides of both limits."""
    L = 0.4
    mlp = {
        "kind": "moe",
        "expert": "swiglu",
        "routing": {"n_experts": 2, "top_k": 1},
        "n_shared_experts": 1,
        "bias": True,
    }
    mlp |= {"swiglu_limit": L, "swiglu_clamp": "activation", "shared_swiglu_limit": shared_limit}
    shared = build(tiny(mlp=mlp, init_std=0.5)).blocks[0].mlp.shared
    with torch.no_grad():
        shared.gate_up.bias.copy_(
            torch.randn(shared.gate_up.bias.shape, dtype=F64, generator=torch.Generator().manual_seed(1)) + 1
        )
    x = torch.randn(3, 5, 32, dtype=F64)
    gate, up = _gate(shared, x), _up(shared, x)
    limit = L if shared_limit is None else shared_limit or math.inf
    act = gate * torch.sigmoid(gate)
    assert (act > max(L, 0.7)).any() and (up.abs() > max(L, 0.7)).any()
    expected = shared.down(torch.minimum(act, torch.tensor(limit)) * torch.clamp(up, -limit, limit))
    with torch.no_grad():
        torch.testing.assert_close(shared(x), expected)


def test_gelu_approximations_differ():
    exact, tanh = same_weights(
        tiny(mlp={"kind": "gelu", "approximate": "none"}, init_std=0.5),
        tiny(mlp={"kind": "gelu", "approximate": "tanh"}, init_std=0.5),
    )
    x = torch.randn(3, 5, 32, dtype=F64)
    with torch.no_grad():
        assert differ(exact.blocks[0].mlp(x), tanh.blocks[0].mlp(x), 1e-5)


@pytest.mark.parametrize("kind, extra", [("gelu", 128 + 32), ("swiglu", 2 * 85 + 32)])
def test_mlp_bias_on_off(kind, extra):
    on, off = tiny(mlp={"kind": kind, "bias": True}), tiny(mlp={"kind": kind, "bias": False})
    assert count_params(on)["mlp"] - count_params(off)["mlp"] == 2 * extra  # per block, two blocks
    assert all(layer.bias is None for layer in build(off).blocks[0].mlp.children())
    assert all(layer.bias is not None for layer in build(on).blocks[0].mlp.children())


@pytest.mark.parametrize(
    "mlp, d, expected",
    [
        ({"kind": "gelu"}, 768, 3072),  # plain: 4d
        ({"kind": "relu", "multiplier": 2.5}, 64, 160),  # int(2.5 * 64)
        ({"kind": "swiglu", "d_ff": 100, "multiple_of": 256}, 64, 100),  # explicit d_ff wins over every rule
        ({"kind": "swiglu", "multiplier": 3.0}, 64, 192),
        ({"kind": "swiglu"}, 48, 128),  # int(2·4·48/3) = 128
        ({"kind": "swiglu", "multiple_of": 256}, 4096, 11008),  # LLaMA 7B: 10922 -> 43·256
        ({"kind": "swiglu", "multiple_of": 256}, 5120, 13824),  # LLaMA 13B: 13653 -> 54·256
        ({"kind": "swiglu", "multiple_of": 256}, 8192, 22016),  # LLaMA 65B: 21845 -> 86·256
        (
            {"kind": "swiglu", "ffn_dim_multiplier": 1.3, "multiple_of": 1024},
            4096,
            14336,
        ),  # int(1.3·10922)=14198 -> 14·1024
        ({"kind": "swiglu", "ffn_dim_multiplier": 1.3, "multiple_of": 4096}, 8192, 28672),  # 28398 -> 7·4096
        ({"kind": "geglu", "ffn_dim_multiplier": 0.5, "multiple_of": 10}, 48, 70),  # int(0.5·128) = 64 -> 70
        (
            {"kind": "moe", "expert": "gelu", "ffn_dim_multiplier": 1.3, "multiple_of": 256},
            48,
            192,
        ),  # the LLaMA rule is for gated MLPs only (a gelu MLP has no such field; experts of gelu ignore it)
    ],
)
def test_hidden_width_rules(mlp, d, expected):
    cfg = tiny(d_model=d, attention={"n_head": 4}, mlp=mlp, vocab_size=8, n_layer=1)
    assert d_ff(cfg) == expected
    mlp = build_model(cfg, device="meta").blocks[0].mlp
    # proj / down: d_ff -> d; of experts, the first's
    last = mlp.experts.matrices()[1][0] if cfg.mlp.kind == "moe" else list(mlp.children())[-1].weight
    assert last.shape == (d, expected)


# ---------------------------------------------------------------- attention


@pytest.mark.parametrize("n_kv_head", [2, 1], ids=["gqa", "mqa"])
@pytest.mark.parametrize("position", ["rope", "alibi"])
def test_grouped_kv_equals_mha_with_repeated_kv_heads(n_kv_head, position):
    """GQA/MQA with K/V heads k is exactly MHA whose query head h uses K/V head h // (H / KV)."""
    H, hd = 4, 8
    grouped_cfg = tiny(attention={"n_head": H, "n_kv_head": n_kv_head}, position={"kind": position})
    mha_cfg = tiny(attention={"n_head": H, "n_kv_head": H}, position={"kind": position})
    grouped, mha = build(grouped_cfg), build(mha_cfg, seed=1)
    state = grouped.state_dict()

    def repeat(t):  # [KV·hd, ...] -> [H·hd, ...], K/V head j serving query heads j·H/KV ... (j+1)·H/KV - 1
        rows = t.reshape(n_kv_head, hd, *t.shape[1:]).repeat_interleave(H // n_kv_head, dim=0)
        return rows.reshape(H * hd, *t.shape[1:])

    for name in list(state):
        if name.endswith("attn.qkv.weight") or name.endswith("attn.qkv.bias"):
            q, k, v = state[name].split((H * hd, n_kv_head * hd, n_kv_head * hd))
            state[name] = torch.cat((q, repeat(k), repeat(v)))
    mha.load_state_dict(state)
    idx = tokens(grouped_cfg)
    torch.testing.assert_close(logits(grouped, idx), logits(mha, idx), rtol=1e-10, atol=1e-10)
    assert count_params(mha_cfg)["attention"] - count_params(grouped_cfg)["attention"] == 2 * 2 * (
        H - n_kv_head
    ) * hd * (32 + 1)


@pytest.mark.parametrize("n_kv_head", [4, 2, 1])
def test_explicit_head_dim_attention(n_kv_head):
    cfg = tiny(d_model=32, attention={"n_head": 4, "n_kv_head": n_kv_head, "head_dim": 12})  # 4·12 != 32
    attn = build(cfg).blocks[0].attn
    assert attn.qkv.weight.shape == ((4 + 2 * n_kv_head) * 12, 32)
    assert attn.proj.weight.shape == (32, 48)
    x = torch.randn(2, 7, 32, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference_attention(attn, x))


@pytest.mark.parametrize(
    "field, module, extra",
    [
        ("qkv_bias", lambda m: m.blocks[0].attn.qkv, 3 * 32),
        ("out_bias", lambda m: m.blocks[0].attn.proj, 32),
    ],
)
def test_attention_biases_on_off(field, module, extra):
    on = tiny(attention={"n_head": 4, "qkv_bias": True, "out_bias": True})
    off = tiny(attention={"n_head": 4, field: False})
    assert count_params(on)["attention"] - count_params(off)["attention"] == 2 * extra
    assert module(build(off)).bias is None
    model = build(on)
    layer = module(model)
    assert layer.bias is not None and layer.bias.shape == (extra,)
    idx = tokens(on)
    before = logits(model, idx)
    with torch.no_grad():
        layer.bias.normal_()
    assert differ(logits(model, idx), before)  # the bias takes part in the forward


# ---------------------------------------------------------------- head


def test_tied_head_shares_storage_with_the_token_embedding():
    cfg = tiny(head={"tied": True})
    for dtype in (None, F64):
        model = build_model(cfg, dtype=dtype)
        assert model.head.weight is model.tok_emb.weight
        assert model.head.weight.data_ptr() == model.tok_emb.weight.data_ptr()
    meta = build_model(cfg, device="meta")
    assert meta.head.weight is meta.tok_emb.weight
    idx = torch.randint(1, cfg.vocab_size, (2, 16))  # token 0 never read: its row matters only as output
    before = logits(model, idx)
    with torch.no_grad():
        model.tok_emb.weight[0].add_(torch.randn(32, dtype=F64))  # not constant: LayerNorm output sums to 0
    after = logits(model, idx)
    assert differ(after[..., 0], before[..., 0])
    torch.testing.assert_close(after[..., 1:], before[..., 1:], rtol=0, atol=0)


def test_untied_head_has_its_own_matrix():
    cfg = tiny(head={"tied": False})
    model = build_model(cfg)
    assert model.head.weight.data_ptr() != model.tok_emb.weight.data_ptr()
    assert count_params(cfg)["head"] == 48 * 32
    assert count_params(cfg)["total"] - count_params(tiny(head={"tied": True}))["total"] == 48 * 32


def test_head_bias_on_off():
    on, off = tiny(head={"bias": True}), tiny(head={"bias": False})
    assert count_params(on)["head"] - count_params(off)["head"] == 48
    assert build(off).head.bias is None
    a = build(on)
    idx = tokens(on)
    before = logits(a, idx)
    with torch.no_grad():
        a.head.bias.copy_(torch.arange(48, dtype=F64))
    torch.testing.assert_close(logits(a, idx), before + torch.arange(48, dtype=F64))


# ---------------------------------------------------------------- dropout


def test_embedding_and_residual_dropout_only_in_train_mode():
    cfg = tiny(dropout=0.5)
    model, plain = same_weights(cfg, tiny(dropout=0.0))
    idx = tokens(cfg)
    seen = []
    model.blocks[0].register_forward_pre_hook(lambda module, args: seen.append(args[0].detach()))
    model.train()
    a, b = model(idx), model(idx)
    assert differ(a, b)
    zeros = torch.cat([(s == 0).double().mean().reshape(1) for s in seen])
    assert ((zeros > 0.4) & (zeros < 0.6)).all()  # embedding dropout zeroes about half the inputs
    # residual dropout alone (embedding dropout disabled) still makes training forwards random
    model.drop.p = 0.0
    assert differ(model(idx), model(idx))
    model.eval()
    seen.clear()
    torch.testing.assert_close(logits(model, idx), logits(plain, idx), rtol=0, atol=0)
    assert (seen[0] != 0).all()


def test_attention_dropout_only_in_train_mode():
    cfg = tiny(attention={"n_head": 4, "dropout": 0.5})
    model = build(cfg)
    assert model.drop.p == 0.0 and model.blocks[0].drop.p == 0.0  # only attention can be random here
    attn, x = model.blocks[0].attn, torch.randn(2, 10, 32, dtype=F64)
    attn.train()
    assert differ(attn(x), attn(x))
    attn.eval()
    with torch.no_grad():
        torch.testing.assert_close(attn(x), reference_attention(attn, x))
    deterministic = build(tiny()).train()
    idx = tokens(cfg)
    torch.testing.assert_close(deterministic(idx), deterministic(idx), rtol=0, atol=0)


# ---------------------------------------------------------------- initialisation


@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_gpt2_initialisation(mlp):
    L, std = 4, 0.05
    cfg = tiny(
        vocab_size=512,
        context_length=256,
        n_layer=L,
        d_model=256,
        init_std=std,
        attention={"n_head": 4},
        mlp={"kind": mlp, "d_ff": 1024},
        head={"tied": False, "bias": True},
    )
    torch.manual_seed(0)
    model = build_model(cfg)
    residual = std / math.sqrt(2 * L)
    expected = {"tok_emb.weight": std, "position.table.weight": std, "head.weight": std}
    for i in range(L):
        expected[f"blocks.{i}.attn.qkv.weight"] = std
        expected[f"blocks.{i}.attn.proj.weight"] = residual
        for name in ("fc", "gate_up"):
            expected[f"blocks.{i}.mlp.{name}.weight"] = std
        for name in ("proj", "down"):
            expected[f"blocks.{i}.mlp.{name}.weight"] = residual
    checked = 0
    for name, p in model.named_parameters():
        if name.endswith(".bias"):
            assert (p == 0).all(), name
        elif "norm" in name:
            assert (p == 1).all(), name
        else:
            # each matrix has >= 65k entries: the sample std is within ~0.3% of the true one (1 sigma)
            assert p.std().item() == pytest.approx(expected[name], rel=0.03), name
            assert abs(p.mean().item()) < 0.02 * expected[name], name
            checked += 1
    assert checked == 3 + L * 4  # every matrix met its expectation (gate and up are one gate_up matrix)
