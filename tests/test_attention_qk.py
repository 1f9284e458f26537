"""What the causal attention (archlab/nn/mixers/attention.py) does to q and k before the scores: the QK-norm
(per head or over the whole projection; before RoPE, or after it as HunYuan dense's; one scale or a scale per
head, Cohere's and StableLM 2's; its shift, ``qk_norm_bias``, which StableLM 2's per-head LayerNorms have not)
and q, k and v clipped to ±c (OLMo 1's ``clip_qkv``). Each is compared with a formula written out here and
with transformers' own module on the same random weights, counted in closed form, refused by every Hugging
Face family but those that hold it, validated, read (never reported as ignored), described and trained a few
steps."""

from __future__ import annotations

import math
from typing import cast

import pytest
import torch
from helpers import hf as parity
from helpers import parts
from helpers.hf import layout, logits, max_diff, randomize
from helpers.parts import F64, inputs, plain, randomise, rms, short_fit

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.nn.mixers.attention import CausalSelfAttention
from archlab.nn.norms import NORMS, LayerNorm
from archlab.nn.rope import RoPE
from archlab.nn.validation import entries, ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")


def tiny(**overrides):
    """helpers.parts' tiny config, validated (the refusals below are validation's)."""
    return validate(parts.tiny(**overrides))


def build(cfg, seed=0):
    return randomise(build_model(cfg, dtype=F64).eval(), seed)


def causal(T):
    return torch.full((T, T), float("-inf")).triu(1)[None, None]


# ---------------------------------------------------------------- the QK-norm's place and count


def test_qk_norm_comes_before_rope():
    """With RoPE, QK-norm normalises the projection and RoPE rotates the normalised heads (Qwen3): a
    rotation keeps a head's norm, so every rotated query head has the RMS its norm's scale gives it."""
    cfg = plain(position={"kind": "rope"}, attention={"qk_norm": "head"})
    model = parts.build(cfg)
    attn, x = model.blocks[0].attn, torch.randn(2, 7, 32, dtype=F64)
    with torch.no_grad():
        attn.q_norm.weight.fill_(1.7)
        rotation = model.position.rotary(torch.arange(7), F64)
        q, _, _ = attn.project(x, rotation)
    torch.testing.assert_close(q.pow(2).mean(-1).sqrt(), torch.full((2, 7, 4), 1.7, dtype=F64), atol=1e-4, rtol=0)


def test_qk_norm_count():
    """Per head: two norms of head_dim; over the projections: one of H·hd and one of KV·hd (RMSNorm: a scale each)."""
    base = count_params(plain())["attention"]
    assert count_params(plain(attention={"qk_norm": "head"}))["attention"] - base == 2 * 2 * 8
    gqa = plain(attention={"n_kv_head": 2})
    assert count_params(plain(attention={"n_kv_head": 2, "qk_norm": "full"}))["attention"] - count_params(gqa)[
        "attention"
    ] == 2 * (4 * 8 + 2 * 8)


@pytest.mark.parametrize(
    "overrides",
    [["model.attention.qk_norm=head", "model/norm=rmsnorm"], ["model.attention.qk_norm=full"]],
    ids=["qk-norm-head", "qk-norm-full"],
)
def test_qk_norms_train(overrides):
    """A few AdamW steps on one repeated batch lower the loss: gradients reach every part."""
    parts.check_trains(overrides, n_layer=2, length=32, steps=25)


# ---------------------------------------------------------------- clip_qkv, QK-norm order and scale per head


def layer_norm(x, w, b, eps):
    centred = x - x.mean(-1, keepdim=True)
    return centred / torch.sqrt(centred.pow(2).mean(-1, keepdim=True) + eps) * w + (0 if b is None else b)


def rotate(x, pos, theta=10000.0):
    """RoPE with rotate_half pairing (i, i + hd/2) over whole heads ``[B, T, heads, hd]``."""
    hd = x.shape[-1]
    angle = pos[:, None].to(F64) / theta ** (torch.arange(0, hd, 2, dtype=F64) / hd)  # [T, hd/2]
    cos, sin = angle.cos()[:, None], angle.sin()[:, None]
    x1, x2 = x[..., : hd // 2], x[..., hd // 2 :]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def reference(attn, x, cfg):
    """The attention sublayer from its weights: project, clamp to ±clip_qkv, QK-norm (per head with one
    scale or a scale per head, RMSNorm or LayerNorm) before or after RoPE, softmax, project back."""
    a, n = cfg.attention, cfg.norm
    B, T, _ = x.shape
    H, KV, hd = attn.n_head, attn.n_kv_head, attn.head_dim
    qkv = x @ attn.qkv.weight.T + (attn.qkv.bias if attn.qkv.bias is not None else 0)
    if a.clip_qkv is not None:
        qkv = qkv.clamp(-a.clip_qkv, a.clip_qkv)
    q, k, v = (t.view(B, T, -1, hd) for t in qkv.split((H * hd, KV * hd, KV * hd), dim=-1))

    def norm(t, module, heads):
        if a.qk_norm == "none":
            return t
        if a.qk_norm == "full":  # over the whole projection: each head's dims side by side
            return norm_full(t.flatten(-2), module).view(t.shape)
        w = module.weight if not a.qk_norm_per_head_scale else module.weight.view(heads, hd)
        w = 1 + w if n.unit_offset else w
        if n.kind == "rmsnorm":
            return rms(t, w, n.eps)
        b = None if module.bias is None else module.bias.view(w.shape)
        return layer_norm(t, w, b, n.eps)

    def norm_full(t, module):
        if n.kind == "rmsnorm":
            return rms(t, module.weight, n.eps)
        return layer_norm(t, module.weight, module.bias, n.eps)

    def rope(t):
        return rotate(t, torch.arange(T)) if cfg.position.kind == "rope" else t

    if a.qk_norm_after_rope:
        q, k = norm(rope(q), attn.q_norm, H), norm(rope(k), attn.k_norm, KV)
    else:
        q, k = rope(norm(q, getattr(attn, "q_norm", None), H)), rope(norm(k, getattr(attn, "k_norm", None), KV))
    q, k, v = (t.transpose(1, 2) for t in (q, k, v))
    k, v = k.repeat_interleave(H // KV, dim=1), v.repeat_interleave(H // KV, dim=1)
    s = (q @ k.transpose(-2, -1) / math.sqrt(hd)).masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), -math.inf)
    y = (torch.softmax(s, -1) @ v).transpose(1, 2).reshape(B, T, H * hd)
    return y @ attn.proj.weight.T + (attn.proj.bias if attn.proj.bias is not None else 0)


ROPE = {"kind": "rope"}
LN = {"kind": "layernorm", "eps": 1e-3, "bias": True}
CASES = {
    "clip": ({"clip_qkv": 0.4}, ROPE, None),
    "clip-qk-norm-head": ({"clip_qkv": 0.4, "qk_norm": "head"}, ROPE, None),
    "clip-no-rope": ({"clip_qkv": 0.4}, {"kind": "none"}, None),
    "head-after-rope": ({"qk_norm": "head", "qk_norm_after_rope": True}, ROPE, None),
    "full-after-rope-layernorm": ({"qk_norm": "full", "qk_norm_after_rope": True}, ROPE, LN),
    "per-head-scale-rmsnorm": ({"qk_norm": "head", "qk_norm_per_head_scale": True}, ROPE, None),
    "per-head-scale-layernorm-bias": ({"qk_norm": "head", "qk_norm_per_head_scale": True}, ROPE, LN),
    "per-head-scale-unit-offset": (
        {"qk_norm": "head", "qk_norm_per_head_scale": True},
        ROPE,
        {"kind": "rmsnorm", "unit_offset": True},
    ),
    "all": ({"clip_qkv": 0.4, "qk_norm": "head", "qk_norm_per_head_scale": True, "qk_norm_after_rope": True}, ROPE, LN),
}


@pytest.mark.parametrize("case", CASES)
def test_attention_part_equals_its_formula(case):
    attention, position, norm = CASES[case]
    cfg = tiny(attention=attention, position=position, norm=norm or {})
    attn, x = build(cfg).blocks[0].attn, inputs()
    rotary = RoPE(cfg).rotary(torch.arange(9), F64) if position == ROPE else None
    with torch.no_grad():
        if cfg.attention.clip_qkv is not None:  # the clip bites: some of q, k and v lie beyond it
            assert (attn.qkv(x).abs() > cfg.attention.clip_qkv).float().mean() > 0.2
        # RoPE's angles are float32 (as transformers computes them): float64 elsewhere, ~1e-7 apart
        torch.testing.assert_close(attn(x, rotary), reference(attn, x, cfg), rtol=1e-6, atol=1e-6)


def test_each_part_changes_the_output():
    """Against the same weights without the part, clipping and the norm after RoPE move the output; with
    a scale per head, every head given the shared scale is the shared-scale model, and scales that differ
    per head move it."""
    x, rotary = inputs(), RoPE(tiny(position=ROPE)).rotary(torch.arange(9), F64)

    def out(attention, weights=None):
        attn = build(tiny(attention=attention, position=ROPE)).blocks[0].attn
        if weights is not None:
            attn.load_state_dict(weights)
        with torch.no_grad():
            return attn(x, rotary), attn.state_dict()

    plain, weights = out({})
    assert (out({"clip_qkv": 0.4}, weights)[0] - plain).abs().max() > 1e-3
    shared, weights = out({"qk_norm": "head"})
    assert (out({"qk_norm": "head", "qk_norm_after_rope": True}, weights)[0] - shared).abs().max() > 1e-3
    tiled = weights | {
        "q_norm.weight": weights["q_norm.weight"].repeat(4),
        "k_norm.weight": weights["k_norm.weight"].repeat(2),
    }
    per_head = {"qk_norm": "head", "qk_norm_per_head_scale": True}
    torch.testing.assert_close(out(per_head, tiled)[0], shared)
    assert (out(per_head)[0] - shared).abs().max() > 1e-3


def test_l2_qk_norm_is_after_rope_as_before():
    """l2 keeps its order (after RoPE, Llama 4): qk_norm_after_rope stays false and refuses l2."""
    cfg = tiny(attention={"qk_norm": "l2"}, position=ROPE)
    attn, x = build(cfg).blocks[0].attn, inputs()
    H, KV, hd = 4, 2, 8
    with torch.no_grad():
        q, k, _ = (t.view(2, 9, -1, hd) for t in attn.qkv(x).split((H * hd, KV * hd, KV * hd), -1))
        got_q, got_k, _ = attn.project(x, RoPE(cfg).rotary(torch.arange(9), F64, cached=True))  # dims unreordered
    eps = cfg.norm.eps
    tolerance = dict(rtol=1e-6, atol=1e-6)  # RoPE's angles are float32, as transformers computes them
    torch.testing.assert_close(got_q, rms(rotate(q, torch.arange(9)), 1.0, eps), **tolerance)
    torch.testing.assert_close(got_k, rms(rotate(k, torch.arange(9)), 1.0, eps), **tolerance)
    with pytest.raises(ConfigError) as err:
        tiny(attention={"qk_norm": "l2", "qk_norm_after_rope": True})
    assert err.value.field == "model.attention.qk_norm_after_rope" and "l2 is after RoPE always" in str(err.value)


# ---- against transformers' modules on the same random weights


def _copy_qkvo(ours, hf):
    """HF's q/k/v/o projections into archlab's fused qkv and proj."""
    with torch.no_grad():
        ours.qkv.weight.copy_(torch.cat([hf.q_proj.weight, hf.k_proj.weight, hf.v_proj.weight]))
        if ours.qkv.bias is not None:
            ours.qkv.bias.copy_(torch.cat([hf.q_proj.bias, hf.k_proj.bias, hf.v_proj.bias]))
        ours.proj.load_state_dict(hf.o_proj.state_dict())


SIZES = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=2, head_dim=8, max_position_embeddings=64)


@pytest.mark.parametrize("bias", [False, True])
def test_clip_equals_hugging_faces_olmo_attention(bias):
    """OLMo 1: q, k and v clamped to ±clip_qkv as projected, then RoPE."""
    import transformers as tf
    from transformers.models.olmo import modeling_olmo as m

    hf_cfg = tf.OlmoConfig(**SIZES, clip_qkv=0.4, attention_bias=bias)
    hf_cfg._attn_implementation = "eager"
    hf, rotary = randomise(m.OlmoAttention(hf_cfg, 0)), m.OlmoRotaryEmbedding(hf_cfg)
    cfg = tiny(attention={"clip_qkv": 0.4, "qkv_bias": bias, "out_bias": bias, "head_dim": 8}, position=ROPE)
    ours = CausalSelfAttention(cfg)
    _copy_qkvo(ours, hf)
    x = inputs(T=12, dtype=torch.float32)
    with torch.no_grad():
        assert (hf.q_proj(x).abs() > 0.4).any()
        expected = hf(x, rotary(x, torch.arange(12)[None]), causal(12))[0]
        got = ours(x, RoPE(cfg).rotary(torch.arange(12), torch.float32))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert sum(p.numel() for p in hf.parameters()) == CausalSelfAttention.num_params(cfg)


def test_qk_norm_after_rope_equals_hugging_faces_hunyuan_dense():
    """HunYuan dense: query_layernorm and key_layernorm (RMSNorm over hd) on the rotated heads."""
    import transformers as tf
    from transformers.models.hunyuan_v1_dense import modeling_hunyuan_v1_dense as m

    hf_cfg = tf.HunYuanDenseV1Config(**SIZES, rms_norm_eps=1e-3, attention_bias=False)
    hf_cfg._attn_implementation = "eager"
    hf, rotary = randomise(m.HunYuanDenseV1Attention(hf_cfg, 0)), m.HunYuanDenseV1RotaryEmbedding(hf_cfg)
    attention = {"qk_norm": "head", "qk_norm_after_rope": True, "qkv_bias": False, "out_bias": False}
    cfg = tiny(attention=attention, position=ROPE)
    ours = CausalSelfAttention(cfg)
    _copy_qkvo(ours, hf)
    with torch.no_grad():
        ours.q_norm.weight.copy_(hf.query_layernorm.weight)
        ours.k_norm.weight.copy_(hf.key_layernorm.weight)
    x = inputs(T=12, dtype=torch.float32)
    with torch.no_grad():
        expected = hf(x, rotary(x, torch.arange(12)[None]), causal(12))[0]
        got = ours(x, RoPE(cfg).rotary(torch.arange(12), torch.float32))
        before = tiny(attention={**attention, "qk_norm_after_rope": False}, position=ROPE)
        ours_before = CausalSelfAttention(before)
        ours_before.load_state_dict(ours.state_dict())
        other = ours_before(x, RoPE(before).rotary(torch.arange(12), torch.float32))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert (other - expected).abs().max() > 1e-3  # the order matters with a weight that is not all ones
    assert sum(p.numel() for p in hf.parameters()) == CausalSelfAttention.num_params(cfg)


@pytest.mark.parametrize("holder", ["stablelm", "stablelm-bias", "cohere"])
def test_per_head_scale_norm_equals_hugging_faces(holder):
    """StableLM 2's StableLmLayerNormPerHead (one LayerNorm of hd per head, bias=False as it builds it; with
    bias=True against model.norm.bias) and Cohere's CohereLayerNorm of weight [H, hd] (no bias), on the
    same random weights, over q ``[B, H, T, hd]`` (StableLM) or ``[B, T, H, hd]`` (Cohere)."""
    from transformers.models.cohere.modeling_cohere import CohereLayerNorm
    from transformers.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead

    H, hd, eps, bias = 4, 8, 1e-3, holder == "stablelm-bias"
    cfg = tiny(norm={"kind": "layernorm", "eps": eps, "bias": bias})
    ours = randomise(NORMS.get("layernorm")(cfg, H * hd).double())
    if holder == "cohere":
        hf = CohereLayerNorm((H, hd), eps=eps).double()
        with torch.no_grad():
            hf.weight.copy_(ours.weight.view(H, hd))
        x = inputs(T=5 * H * hd, d=1).view(2, 5, H, hd)
        hf = hf.float()  # CohereLayerNorm computes in float32 whatever its input: compare there
        ours, x = ours.float(), x.float()
    else:
        hf = StableLmLayerNormPerHead(hd, H, eps=eps, bias=bias).double()
        with torch.no_grad():
            for h, norm in enumerate(hf.norms):
                norm.weight.copy_(ours.weight[h * hd : (h + 1) * hd])
                if bias:
                    norm.bias.copy_(ours.bias[h * hd : (h + 1) * hd])
        x = inputs(T=5 * H * hd, d=1).view(2, H, 5, hd)
    assert sum(p.numel() for p in hf.parameters()) == sum(p.numel() for p in ours.parameters())
    with torch.no_grad():
        if holder == "cohere":
            torch.testing.assert_close(ours.per_head(x), hf(x))
        else:  # StableLM's heads come before the positions: archlab's per_head norms the last two dims
            torch.testing.assert_close(ours.per_head(x.transpose(1, 2)).transpose(1, 2), hf(x))


def test_per_head_scale_norm_equals_hugging_faces_cohere_attention():
    """Cohere's attention: q_norm and k_norm ([H, hd] and [KV, hd], no bias) before its interleaved RoPE."""
    import transformers as tf
    from transformers.models.cohere import modeling_cohere as m

    hf_cfg = tf.CohereConfig(**SIZES, use_qk_norm=True, layer_norm_eps=1e-3, attention_bias=False)
    hf_cfg._attn_implementation = "eager"
    hf, rotary = randomise(m.CohereAttention(hf_cfg, 0)), m.CohereRotaryEmbedding(hf_cfg)
    cfg = tiny(
        attention={"qk_norm": "head", "qk_norm_per_head_scale": True, "qkv_bias": False, "out_bias": False},
        position={"kind": "rope", "pairing": "interleaved", "theta": hf_cfg.rope_parameters["rope_theta"]},
        norm={"kind": "layernorm", "eps": 1e-3, "bias": False},
    )
    ours = CausalSelfAttention(cfg)
    _copy_qkvo(ours, hf)
    with torch.no_grad():
        ours.q_norm.weight.copy_(hf.q_norm.weight.flatten())
        ours.k_norm.weight.copy_(hf.k_norm.weight.flatten())
    x = inputs(T=12, dtype=torch.float32)
    with torch.no_grad():
        expected = hf(x, rotary(x, torch.arange(12)[None]), causal(12))[0]
        got = ours(x, RoPE(cfg).rotary(torch.arange(12), torch.float32))
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)
    assert sum(p.numel() for p in hf.parameters()) == CausalSelfAttention.num_params(cfg)


def test_per_head_scale_norm_in_bf16_computes_in_float32():
    """Statistics and scale in float32, the result rounded once to bf16 (as Cohere's CohereLayerNorm)."""
    cfg = tiny(attention={"qk_norm": "head", "qk_norm_per_head_scale": True})
    attn = build_model(cfg, dtype=torch.bfloat16).blocks[0].attn
    with torch.no_grad():
        attn.q_norm.weight.copy_(torch.linspace(0.5, 1.5, 32))
        q = torch.randn(2, 3, 4, 8).to(torch.bfloat16)
        expected = rms(q.float(), attn.q_norm.weight.float().view(4, 8), 1e-3).to(torch.bfloat16)
        assert torch.equal(attn.q_norm.per_head(q), expected)


# ---- counts, families, validation, reads, training


@pytest.mark.parametrize(
    "norm, per_layer",
    [
        ({"kind": "rmsnorm"}, (4 + 2) * 8 - 2 * 8),  # H·hd + KV·hd scales, less the two shared hd-wide ones
        ({"kind": "layernorm", "bias": True}, 2 * ((4 + 2) * 8 - 2 * 8)),  # and as many shifts
        ({"kind": "layernorm", "bias": False}, (4 + 2) * 8 - 2 * 8),
    ],
    ids=["rmsnorm", "layernorm-bias", "layernorm"],
)
def test_per_head_scale_count(norm, per_layer):
    """Per layer H·hd (+ H·hd shifts) for q and KV·hd (+ KV·hd) for k, in place of two hd-wide norms;
    clipping and the norm's order add nothing."""
    shared = count_params(tiny(norm=norm, attention={"qk_norm": "head"}))
    per_head = count_params(tiny(norm=norm, attention={"qk_norm": "head", "qk_norm_per_head_scale": True}))
    assert per_head["attention"] - shared["attention"] == 2 * per_layer
    assert per_head["total"] - shared["total"] == 2 * per_layer
    moved = {"qk_norm": "head", "qk_norm_after_rope": True, "clip_qkv": 1.0}
    assert count_params(tiny(norm=norm, attention=moved))["total"] == shared["total"]
    built = build_model(tiny(norm=norm, attention={"qk_norm": "head", "qk_norm_per_head_scale": True}), device="meta")
    assert built.blocks[0].attn.q_norm.weight.shape == (4 * 8,) and built.blocks[0].attn.k_norm.weight.shape == (2 * 8,)


@pytest.mark.parametrize(
    "settings, fields, holders",
    [
        ({"attention": {"clip_qkv": 8.0}}, {"model.attention.clip_qkv"}, {"olmo", "mpt", "dbrx"}),
        (
            {"attention": {"qk_norm": "head", "qk_norm_after_rope": True}},
            {"model.attention.qk_norm_after_rope"},
            {"hunyuan_v1_dense", "hunyuan_v1_moe"},
        ),
        (
            {"attention": {"qk_norm": "head", "qk_norm_per_head_scale": True}},
            {"model.attention.qk_norm_per_head_scale"},
            {"cohere", "stablelm"},
        ),
    ],
    ids=["clip_qkv", "qk_norm_after_rope", "qk_norm_per_head_scale"],
)
def test_only_the_hugging_face_families_with_them_hold_them(settings, fields, holders):
    """Every other family names the field it cannot hold (OLMo, MPT and DBRX hold clip_qkv, Cohere and
    StableLM the per-head QK-norm scale)."""
    assert parity.families_holding(tiny(position=ROPE, **settings), fields) == holders


@pytest.mark.parametrize(
    "overrides, field, allowed",
    [
        (["model.attention.clip_qkv=0"], "model.attention.clip_qkv", "a positive number (OLMo 1: 8.0), or null"),
        (["model.attention.clip_qkv=-8"], "model.attention.clip_qkv", "a positive number"),
        (["model.attention.clip_qkv=inf"], "model.attention.clip_qkv", "a positive number"),
        (["model.attention.qk_norm_after_rope=true"], "model.attention.qk_norm_after_rope", "no QK-norm to move"),
        (
            ["model.attention.qk_norm_per_head_scale=true", "model.attention.qk_norm=full"],
            "model.attention.qk_norm_per_head_scale",
            "its scale spans every head already",
        ),
        (
            ["model.attention.qk_norm_per_head_scale=true", "model.attention.qk_norm=l2"],
            "model.attention.qk_norm_per_head_scale",
            "false unless model.attention.qk_norm is head",
        ),
    ],
)
def test_bad_settings_name_their_field(overrides, field, allowed):
    with pytest.raises(ConfigError) as err:
        compose_model(["model=nano", *overrides])
    assert err.value.field == field and allowed in str(err.value)


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.attention.clip_qkv=8"],
        ["model.attention.qk_norm=head", "model.attention.qk_norm_after_rope=true", "model/position=rope"],
        ["model.attention.qk_norm=full", "model.attention.qk_norm_after_rope=true"],
        ["model.attention.qk_norm=head", "model.attention.qk_norm_per_head_scale=true"],
    ],
)
def test_the_parts_are_read_not_ignored(overrides):
    """Each field set is one the chosen variant reads (so no run calls it ignored); the preset's tanh GELU
    stays."""
    cfg = compose_model(["model=gpt2", "model.n_layer=2", *overrides])
    assert ignored(cfg) == []
    assert getattr(cfg.mlp, "approximate", "none") == "tanh"


def test_layout_line_names_the_parts():
    a = {"clip_qkv": 8.0, "qk_norm": "head", "qk_norm_per_head_scale": True, "qk_norm_after_rope": True}
    cfg = tiny(attention=a, mlp={"kind": "moe", "expert": "relu2"})
    described = entries(cfg).attention.describe(cfg)
    assert "clip qkv 8.0" in described and "qk-norm scale per head" in described and "qk-norm after rope" in described


@pytest.mark.parametrize(
    "overrides",
    [
        ["model.attention.clip_qkv=0.5", "model/position=rope"],
        ["model.attention.qk_norm=head", "model.attention.qk_norm_after_rope=true", "model/position=rope"],
        ["model.attention.qk_norm=head", "model.attention.qk_norm_per_head_scale=true", "model/position=rope"],
        ["model.attention.qk_norm=head", "model.attention.qk_norm_per_head_scale=true", "model/norm=rmsnorm"],
    ],
    ids=["clip", "after-rope", "per-head-layernorm", "per-head-rmsnorm"],
)
def test_each_part_trains(overrides):
    """A few AdamW steps on one repeated batch lower the loss, every parameter reached by a gradient."""
    parts.check_trains(overrides, n_layer=1, length=16, steps=15)


# ---------------------------------------------------------------- model.attention.qk_norm_bias

QK = ["model.attention.qk_norm=head", "model.attention.qk_norm_per_head_scale=true", "model/position=rope"]


def test_qk_norm_bias_false_drops_the_qk_norms_shift_alone():
    """qk_norm_bias=false: the QK-norms have no bias while every other LayerNorm keeps its own; H·hd + KV·hd
    fewer parameters per layer (per-head scale) or 2·hd (shared), in the closed form and the model built."""
    for per_head, removed in ((True, (4 + 2) * 16), (False, 2 * 16)):
        base = ["model.attention.n_kv_head=2", "model.attention.qk_norm=head"]
        base += [f"model.attention.qk_norm_per_head_scale={str(per_head).lower()}"]
        cfg, without = layout(*base), layout(*base, "model.attention.qk_norm_bias=false")
        model = build_model(without, device="meta")
        attn = cast(CausalSelfAttention, model.blocks[0].attn)
        q_norm, k_norm = cast(LayerNorm, attn.q_norm), cast(LayerNorm, attn.k_norm)
        assert (
            q_norm.bias is None and k_norm.bias is None and cast(LayerNorm, model.blocks[0].attn_norm).bias is not None
        )
        assert count_params(cfg)["total"] - count_params(without)["total"] == 2 * removed
        assert count_params(without)["total"] == sum(p.numel() for p in model.parameters())
        kept = layout(*base, "model.attention.qk_norm_bias=true")  # as model.norm.bias: the same count
        assert count_params(kept)["total"] == count_params(cfg)["total"]


def test_qk_norm_bias_equals_stablelm_s_per_head_layernorms():
    """The attention's QK-norm with qk_norm_bias=false equals transformers' StableLmLayerNormPerHead
    (bias=False, as StableLM 2 builds it) on every head; with the bias kept (null, beside model.norm.bias)
    it adds the shift, and the output moves."""
    pytest.importorskip("transformers")
    from transformers.models.stablelm.modeling_stablelm import StableLmLayerNormPerHead

    cfg = layout(*QK, "model.attention.qk_norm_bias=false")
    model = build_model(cfg)
    randomize(model, seed=5)
    q_norm = cast(LayerNorm, cast(CausalSelfAttention, model.blocks[0].attn).q_norm)
    hf = StableLmLayerNormPerHead(16, 4, eps=cfg.norm.eps)
    with torch.no_grad():
        for h, norm in enumerate(hf.norms):
            cast(torch.nn.LayerNorm, norm).weight.copy_(cast(torch.nn.LayerNorm, q_norm).weight.view(4, 16)[h])
    x = torch.randn(2, 4, 7, 16, generator=torch.Generator().manual_seed(0))  # [B, H, T, hd], as StableLM's
    torch.testing.assert_close(q_norm.per_head(x.transpose(1, 2)).transpose(1, 2), hf(x))
    with_bias = randomize(build_model(layout(*QK)), seed=5)
    without = build_model(cfg, device="meta")
    state = {k: v for k, v in with_bias.state_dict().items() if not k.endswith(("q_norm.bias", "k_norm.bias"))}
    without.load_state_dict(state, assign=True)
    assert max_diff(logits(with_bias), logits(without.eval())) > 1e-3


@pytest.mark.parametrize(
    "overrides, allowed",
    [
        (["model.attention.qk_norm_bias=false"], "null unless model.attention.qk_norm is head or full"),
        (["model.attention.qk_norm=l2", "model.attention.qk_norm_bias=false"], "qk_norm=l2"),
        (["model.attention.qk_norm=head", "model/norm=rmsnorm", "model.attention.qk_norm_bias=false"], "rmsnorm"),
    ],
)
def test_qk_norm_bias_refusals_name_the_field(overrides, allowed):
    with pytest.raises(ConfigError) as err:
        layout(*overrides)
    assert err.value.field == "model.attention.qk_norm_bias" and allowed in str(err.value)


def test_qk_norm_bias_is_read_described_and_trains():
    cfg = layout(*QK, "model.attention.qk_norm_bias=false")
    assert ignored(cfg) == []
    assert "qk-norm bias false" in entries(cfg).attention.describe(cfg)
    torch.manual_seed(0)
    model = build_model(parity.changed_cfg(cfg, n_layer=1, context_length=16))
    losses = short_fit(model, cfg.vocab_size, 16)
    assert losses[-1] < 0.9 * losses[0]
