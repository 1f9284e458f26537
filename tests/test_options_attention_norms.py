"""Effect tests of the parts today's open models use (QK-norm, attention scale and soft-capping, sliding
windows, Gemma's unit-offset RMSNorm and Nemotron's unit-offset LayerNorm, post-sublayer and sandwich norms, scaled embeddings, logit
soft-capping): each compares the built model with an independent expression written out here, checks
its closed-form count, and trains it a few steps."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from helpers.parts import short_fit
from omegaconf import OmegaConf

from archlab import build_model, compose_model, count_params
from archlab.config import to_model_config

pytestmark = pytest.mark.usefixtures("single_thread")

F64 = torch.float64


def tiny(**overrides):
    """d_model 32, 4 heads of 8, 2 layers, vocab 48, context 16, RMSNorm, no position (unless set)."""
    base = {
        "vocab_size": 48,
        "context_length": 16,
        "n_layer": 2,
        "d_model": 32,
        "norm": {"kind": "rmsnorm"},
        "position": {"kind": "none"},
        "attention": {"n_head": 4},
    }
    return to_model_config(OmegaConf.merge(base, overrides))


# layers 1, 3, ... global, the others the model's window: Gemma 2's layout (conf/model/layers/every_other_global)
EVERY_OTHER_GLOBAL = {"kinds": {"local": {}, "global": {"attention": {"window": None}}}, "pattern": ["local", "global"]}


def build(cfg, seed=0):
    """A float64 model with every weight random, norm scales included (far from their init of 1 or 0)."""
    torch.manual_seed(seed)
    model = build_model(cfg, dtype=F64).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.copy_(torch.randn_like(p) * 0.3 + (0.5 if p.ndim == 1 else 0.0))
    return model


def tokens(cfg, T=None, B=2, seed=0):
    T = T or cfg.context_length
    return torch.randint(0, cfg.vocab_size, (B, T), generator=torch.Generator().manual_seed(seed))


def rms(x, w, eps):
    return x / torch.sqrt(x.pow(2).mean(-1, keepdim=True) + eps) * w


def attention(q, k, v, scale, softcap=None, visible=None):
    """softmax(cap(q·k·scale) masked) · v, queries and keys ``[B, H, T, hd]`` (keys repeated for GQA)."""
    s = q @ k.transpose(-2, -1) * scale
    if softcap is not None:
        s = softcap * torch.tanh(s / softcap)
    T = q.shape[2]
    visible = torch.ones(T, T, dtype=torch.bool).tril() if visible is None else visible
    return torch.softmax(s.masked_fill(~visible, float("-inf")), dim=-1) @ v


def reference_attention(attn, x, norm_eps, qk_norm="none", softcap=None, scale=None, visible=None):
    """The attention sublayer written out from its weights: project, QK-norm, attend, project back."""
    B, T, _ = x.shape
    H, KV, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    qkv = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    q, k, v = qkv.split((H * hd, KV * hd, KV * hd), dim=-1)
    if qk_norm == "full":
        q, k = rms(q, attn.q_norm.weight, norm_eps), rms(k, attn.k_norm.weight, norm_eps)
    q, k, v = (t.view(B, T, -1, hd).transpose(1, 2) for t in (q, k, v))
    if qk_norm == "head":
        q, k = rms(q, attn.q_norm.weight, norm_eps), rms(k, attn.k_norm.weight, norm_eps)
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    y = attention(q, k, v, scale if scale is not None else 1 / math.sqrt(hd), softcap, visible)
    return y.transpose(1, 2).reshape(B, T, H * hd) @ attn.proj.weight.T + (
        attn.proj.bias if attn.proj.bias is not None else 0
    )


@pytest.mark.parametrize(
    "settings",
    [
        {"qk_norm": "head"},
        {"qk_norm": "full", "n_kv_head": 2},
        {"scale": 0.05},
        {"softcap": 2.0, "n_kv_head": 1},
        {"softcap": 2.0, "scale": 0.3, "qk_norm": "head"},
    ],
    ids=["qk-norm-head", "qk-norm-full-gqa", "scale", "softcap-mqa", "softcap-scale-qknorm"],
)
def test_attention_equals_its_formula(settings):
    cfg = tiny(attention=settings)
    attn = build(cfg).blocks[0].attn
    x = torch.randn(2, 7, 32, dtype=F64)
    with torch.no_grad():
        expected = reference_attention(attn, x, cfg.norm.eps, settings.get("qk_norm", "none"),
                                       settings.get("softcap"), settings.get("scale"))  # fmt: skip
        torch.testing.assert_close(attn(x), expected)


def test_qk_norm_comes_before_rope():
    """With RoPE, QK-norm normalises the projection and RoPE rotates the normalised heads (Qwen3): a
    rotation keeps a head's norm, so every rotated query head has the RMS its norm's scale gives it."""
    cfg = tiny(position={"kind": "rope"}, attention={"qk_norm": "head"})
    model = build(cfg)
    attn, x = model.blocks[0].attn, torch.randn(2, 7, 32, dtype=F64)
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.7)
        rotation = model.position.rotary(torch.arange(7), F64)
        q, _, _ = attn.project(x, rotation)
    torch.testing.assert_close(q.pow(2).mean(-1).sqrt(), torch.full((2, 7, 4), 1.7, dtype=F64), atol=1e-4, rtol=0)


def test_qk_norm_count():
    """Per head: two norms of head_dim; over the projections: one of H·hd and one of KV·hd (RMSNorm: a scale each)."""
    base = count_params(tiny())["attention"]
    assert count_params(tiny(attention={"qk_norm": "head"}))["attention"] - base == 2 * 2 * 8
    gqa = tiny(attention={"n_kv_head": 2})
    assert count_params(tiny(attention={"n_kv_head": 2, "qk_norm": "full"}))["attention"] - count_params(gqa)[
        "attention"
    ] == 2 * (4 * 8 + 2 * 8)


@pytest.mark.parametrize("window, alternating", [(3, False), (4, True)])
def test_sliding_window_sees_exactly_the_window(window, alternating):
    """A local layer's output at t depends only on positions t-window+1..t; a global one on all of them.
    Checked through the attention sublayer written out with that visibility."""
    layers = EVERY_OTHER_GLOBAL if alternating else {}
    cfg = tiny(attention={"window": window, "n_kv_head": 2}, layers=layers)
    model = build(cfg)
    x = torch.randn(2, 9, 32, dtype=F64)
    pos = torch.arange(9)
    distance = pos[:, None] - pos[None, :]
    for layer, block in enumerate(model.blocks):
        local = not alternating or layer % 2 == 0
        visible = (distance >= 0) & (distance < window) if local else distance >= 0
        assert block.attn.window == (window if local else None)
        with torch.no_grad():
            expected = reference_attention(block.attn, x, cfg.norm.eps, visible=visible)
            masks = model.mask(model.position, 0, 9, 0, block.attn.window, F64, x.device)
            torch.testing.assert_close(block.attn(x, None, masks), expected)


def test_sliding_window_model_output_depends_only_on_the_window():
    """One layer, relative positions (RoPE): the logits at t equal those of the window alone."""
    cfg = tiny(n_layer=1, position={"kind": "rope"}, attention={"window": 4})
    model, idx = build(cfg), tokens(cfg, T=12)
    with torch.no_grad():
        full = model(idx)
        for t in range(3, 12):
            torch.testing.assert_close(full[:, t], model(idx[:, t - 3 : t + 1])[:, -1])


def test_a_window_layer_caches_only_its_window():
    cfg = tiny(attention={"window": 3}, layers=EVERY_OTHER_GLOBAL)
    model = build(cfg)
    cache = model.new_cache(2, 16)
    with torch.no_grad():
        model(tokens(cfg, T=10), cache)
        model(tokens(cfg, T=1), cache)
    assert cache.k[0].shape[2] == 2 and cache.k[1].shape[2] == 16  # layer 0 local (window - 1 kept), 1 global


def test_windows_cut_attention_flops():
    """12·H·hd per key a query sees: T keys in a global layer, the window in a local one."""
    T, H, hd = 16, 4, 8
    full = count_params(tiny(n_layer=2))["flops_per_token"]
    windowed = count_params(tiny(n_layer=2, attention={"window": 4}, layers=EVERY_OTHER_GLOBAL))["flops_per_token"]
    assert full - windowed == 12 * H * hd * (T - 4)


def test_unit_offset_rmsnorm_scales_by_one_plus_w():
    cfg = tiny(norm={"unit_offset": True})
    fresh = build_model(cfg, dtype=F64)
    assert torch.equal(fresh.final_norm.weight, torch.zeros(32, dtype=F64))  # starts as the identity scale
    norm, x = build(cfg).final_norm, torch.randn(3, 32, dtype=F64)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), rms(x, 1 + norm.weight, cfg.norm.eps))


def test_unit_offset_layernorm_scales_by_one_plus_w_and_keeps_its_bias():
    """Nemotron's LayerNorm1P: (x - mean) / sqrt(var + eps) · (1 + w) + b, w starting at 0; the count as
    LayerNorm's (d scales and d shifts)."""
    cfg = tiny(norm={"kind": "layernorm", "unit_offset": True, "eps": 1e-3})
    fresh = build_model(cfg, dtype=F64)
    assert torch.equal(fresh.final_norm.weight, torch.zeros(32, dtype=F64))
    norm, x = build(cfg).final_norm, torch.randn(3, 32, dtype=F64)
    mean, var = x.mean(-1, keepdim=True), x.var(-1, unbiased=False, keepdim=True)
    with torch.no_grad():
        torch.testing.assert_close(norm(x), (x - mean) / torch.sqrt(var + 1e-3) * (1 + norm.weight) + norm.bias)
    assert count_params(cfg)["final_norm"] == 2 * 32


def test_post_sublayer_and_sandwich_blocks_equal_their_formulas():
    x = torch.randn(2, 5, 32, dtype=F64)
    for kind in ("post_sublayer", "sandwich"):
        cfg = tiny(block={"kind": kind}, mlp={"kind": "swiglu", "bias": False})
        block = build(cfg).blocks[0]
        eps = cfg.norm.eps
        with torch.no_grad():
            h = x if kind == "post_sublayer" else rms(x, block.attn_norm.weight, eps)
            h = x + rms(reference_attention(block.attn, h, eps), block.attn_out_norm.weight, eps)
            m = h if kind == "post_sublayer" else rms(h, block.mlp_norm.weight, eps)
            gate, up = (m @ block.mlp.gate_up.weight.T).chunk(2, dim=-1)
            expected = h + rms((F.silu(gate) * up) @ block.mlp.down.weight.T, block.mlp_out_norm.weight, eps)
            torch.testing.assert_close(block(x), expected)
        norms = {"post_sublayer": 2, "sandwich": 4}[kind]
        assert count_params(cfg)["norms"] == cfg.n_layer * norms * 32  # RMSNorm: d scales each
        assert count_params(cfg)["final_norm"] == 32


def test_scaled_embedding_and_logit_softcap():
    cfg = tiny(n_layer=1, scale_embedding=True, head={"softcap": 3.0, "tied": False})
    model, idx = build(cfg), tokens(cfg, T=6)
    captured = {}
    model.blocks[0].register_forward_pre_hook(lambda module, args: captured.setdefault("x", args[0]))
    with torch.no_grad():
        out = model(idx)
        raw = model.final_norm(model.blocks[0](captured["x"])) @ model.head.weight.T
    torch.testing.assert_close(captured["x"], model.tok_emb.weight[idx] * math.sqrt(32))
    torch.testing.assert_close(out, 3.0 * torch.tanh(raw / 3.0))
    assert out.abs().max() < 3.0


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.attention.qk_norm=head", "model/norm=rmsnorm"],
        ["model.attention.qk_norm=full"],
        ["model.attention.softcap=5.0", "model.head.softcap=10.0"],
        ["model.attention.window=8", "model/layers=every_other_global", "model/position=rope"],
        ["model/norm=rmsnorm", "model.norm.unit_offset=true", "model.scale_embedding=true"],
        ["model.norm.unit_offset=true"],
        ["model/block=post_sublayer"],
        ["model/block=sandwich", "model/mlp=geglu", "model.mlp.approximate=tanh"],
    ],
    ids=[
        "qk-norm-head",
        "qk-norm-full",
        "softcaps",
        "window",
        "gemma-norm-embed",
        "layernorm-unit-offset",
        "post-sublayer",
        "sandwich",
    ],
)
def test_each_part_trains(overrides):
    """A few AdamW steps on one repeated batch lower the loss: gradients reach every part."""
    cfg = compose_model(["model=nano", "model.n_layer=2", "model.d_model=32", "model.context_length=32", *overrides])
    torch.manual_seed(0)
    model = build_model(cfg)
    losses = short_fit(model, cfg.vocab_size, 32, steps=25)
    assert all(p.grad is not None for p in model.parameters() if p.requires_grad)
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.window=0"], "model.attention.window"),
        (["model/layers=every_other_global", "model.layers.pattern=[local,globl]"], "model.layers.pattern"),
        (["model.attention.softcap=-1"], "model.attention.softcap"),
        (["model.attention.scale=0"], "model.attention.scale"),
        (["model.head.softcap=0"], "model.head.softcap"),
        (["model.attention.qk_norm=layer"], "model.attention.qk_norm"),
    ],
)
def test_bad_settings_name_their_field(overrides, field):
    from archlab import ConfigError

    with pytest.raises(ConfigError) as info:
        compose_model(["model=nano", *overrides])
    assert info.value.field == field


def llama3_frequency(i, dim, theta, factor, low, high, original):
    """Llama 3.1's rescaled frequency of rotated pair i, one scalar at a time (Meta's reference recipe)."""
    freq = 1.0 / theta ** (2 * i / dim)
    wavelength = 2 * math.pi / freq
    if wavelength < original / high:
        return freq
    if wavelength > original / low:
        return freq / factor
    smooth = (original / wavelength - low) / (high - low)
    return (1 - smooth) * freq / factor + smooth * freq


def test_rope_scaling_frequencies():
    from archlab.nn.rope import inverse_frequencies

    cfg = tiny(position={"kind": "rope", "theta": 500000.0, "scaling": {"kind": "llama3", "factor": 8.0, "original_context": 8192}}, attention={"n_head": 1, "head_dim": 128})  # fmt: skip
    got = inverse_frequencies(cfg.position, 128)
    expected = [llama3_frequency(i, 128, 500000.0, 8.0, 1.0, 4.0, 8192) for i in range(64)]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=0)
    unscaled = inverse_frequencies(tiny(position={"kind": "rope", "theta": 500000.0}).position, 128)
    assert got[0] == unscaled[0] and torch.isclose(got[-1], unscaled[-1] / 8)  # high kept, low divided by 8
    linear = inverse_frequencies(
        tiny(position={"kind": "rope", "scaling": {"kind": "linear", "factor": 4.0}}).position, 8
    )
    torch.testing.assert_close(linear, 1 / 10000.0 ** (torch.arange(0, 8, 2) / 8) / 4)


def test_linear_rope_scaling_interpolates_positions():
    """Scaled by 4, position p is rotated by the angles the unscaled scheme gives position p / 4."""
    scaled = build(tiny(position={"kind": "rope", "scaling": {"kind": "linear", "factor": 4.0}})).position
    plain = build(tiny(position={"kind": "rope"})).position
    pos = torch.arange(0, 32, 4)
    a, b = scaled.rotary(pos, F64), plain.rotary(pos // 4, F64)
    torch.testing.assert_close((a.cos, a.sin), (b.cos, b.sin))


def left_padded(prompts, pad=0):
    """A batch of prompts of different lengths, padded on the left, and its attention mask."""
    width = max(len(p) for p in prompts)
    ids = torch.tensor([[pad] * (width - len(p)) + p for p in prompts])
    mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts])
    return ids, mask


@pytest.mark.parametrize(
    "overrides",
    [
        {"position": {"kind": "learned"}},
        {"position": {"kind": "sinusoidal"}},
        {"position": {"kind": "rope"}, "attention": {"n_kv_head": 2}},
        {"position": {"kind": "alibi"}},
        {"position": {"kind": "rope"}, "attention": {"window": 3, "softcap": 5.0}, "layers": EVERY_OTHER_GLOBAL},
    ],
    ids=["learned", "sinusoidal", "rope-gqa", "alibi", "window-softcap"],
)
def test_a_padded_batch_computes_each_prompt_as_alone(overrides):
    """Left padding plus its attention mask: every row's logits at its real tokens, and its greedy
    continuation, equal those of its prompt run alone."""
    from archlab.generate import generate

    cfg = tiny(**overrides, context_length=32)
    model = build(cfg)
    prompts = [[5, 9, 2, 7, 1, 3, 8], [4, 4], [11, 3, 6, 2]]
    ids, mask = left_padded(prompts)
    with torch.no_grad():
        batch = model(ids, attention_mask=mask)
        for row, prompt in enumerate(prompts):
            alone = model(torch.tensor([prompt]))
            torch.testing.assert_close(batch[row, -len(prompt) :], alone[0], rtol=1e-9, atol=1e-9)
    together = generate(model, ids, max_new_tokens=12, attention_mask=mask)
    for row, prompt in enumerate(prompts):
        alone = generate(model, torch.tensor([prompt]), max_new_tokens=12)
        assert together[row, ids.shape[1] :].tolist() == alone[0, len(prompt) :].tolist()


def test_generate_refuses_a_mask_of_another_shape():
    from archlab import ConfigError
    from archlab.generate import generate

    model = build(tiny())
    with pytest.raises(ConfigError, match="attention_mask"):
        generate(model, torch.ones(2, 4, dtype=torch.long), 3, attention_mask=torch.ones(2, 5))


def test_unit_offset_rmsnorm_in_bf16_adds_the_offset_in_float32():
    """Gemma computes 1 + w in float32: in bf16 a small w would be rounded away (1 + 1e-3 is 1 in bf16)."""
    norm = build_model(tiny(norm={"unit_offset": True}), dtype=torch.bfloat16).final_norm
    with torch.no_grad():
        norm.weight.copy_(torch.full((32,), 1e-3))
        x = torch.randn(4, 32).to(torch.bfloat16)
        expected = (rms(x.float(), 1 + norm.weight.float(), 1e-5)).to(torch.bfloat16)
        assert torch.equal(norm(x), expected)


def test_kv_cache_bytes_count_only_the_window_of_a_local_layer():
    """2·KV·hd values per position kept, per layer; a local layer keeps at most its window. Checked
    against the cache a full-context prefill actually allocates (global) or keeps (local, window - 1)."""
    from archlab.accounting import kv_cache_bytes

    cfg = tiny(attention={"n_kv_head": 2, "window": 4}, layers=EVERY_OTHER_GLOBAL)  # layer 0 local, layer 1 global
    assert kv_cache_bytes(cfg, 16) == 4 * 2 * 2 * 8 * (4 + 16)
    assert kv_cache_bytes(tiny(attention={"n_kv_head": 2}), 16) == 4 * 2 * 2 * 8 * (16 + 16)
    model = build(cfg)
    cache = model.new_cache(1, 16)
    with torch.no_grad():
        model(tokens(cfg, T=16, B=1), cache)
    held = sum(t.numel() for t in (*cache.k, *cache.v))
    assert held == 2 * 2 * 8 * (3 + 16)  # the window layer keeps window - 1 for the next query, plus its own
