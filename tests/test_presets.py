"""Every preset reproduces its published parameter count (tests/helpers/published.py) three ways: the closed-form
count, the archlab model built on the meta device (no storage), and the Hugging Face model of the config
that ``config_to_hf`` writes, built by transformers on the meta device (the independent reference); and
the closed forms below, written out by hand from each layout's tensor shapes, agree with count_params block
by block."""

import pytest
import torch
from helpers.published import ACTIVE, LAYOUT_CONFIGS, PUBLISHED

from archlab import build_model, compose_model, count_params
from archlab.accounting import built_counts
from archlab.nn.validation import ignored
from archlab.training.parametrization import roles

# Closed forms (f = d_ff), each returning (parameters per block, total); docs/reference.md gives the GPT-2 one.


def gpt2_total(V, ctx, L, d, f):
    block = 4 * d * d + 2 * d * f + 9 * d + f  # qkv + out (4d² + 4d), MLP (2df + f + d), two LayerNorms (4d)
    return block, (V + ctx) * d + L * block + 2 * d


def gptj_total(V, L, d, f):
    block = 4 * d * d + 2 * d * f + f + 3 * d  # no attention biases; MLP biases; one shared LayerNorm
    return block, V * d + L * block + 2 * d + V * d + V  # untied head with a bias


def llama_total(V, L, d, H, KV, hd, f):
    block = 2 * d * H * hd + 2 * d * KV * hd + 3 * d * f + 2 * d  # q, o; k, v; gate, up, down; two RMSNorms
    return block, 2 * V * d + L * block + d


CLOSED_FORMS = {
    "gpt2": gpt2_total(V=50257, ctx=1024, L=12, d=768, f=3072),
    "gpt2-medium": gpt2_total(V=50257, ctx=1024, L=24, d=1024, f=4096),
    "gpt2-large": gpt2_total(V=50257, ctx=1024, L=36, d=1280, f=5120),
    "gpt2-xl": gpt2_total(V=50257, ctx=1024, L=48, d=1600, f=6400),
    "gptj-6b": gptj_total(V=50400, L=28, d=4096, f=16384),
    "llama-7b": llama_total(V=32000, L=32, d=4096, H=32, KV=32, hd=128, f=11008),
    "llama-13b": llama_total(V=32000, L=40, d=5120, H=40, KV=40, hd=128, f=13824),
    "llama-65b": llama_total(V=32000, L=80, d=8192, H=64, KV=64, hd=128, f=22016),
    "llama2-7b": llama_total(V=32000, L=32, d=4096, H=32, KV=32, hd=128, f=11008),
    "llama2-70b": llama_total(V=32000, L=80, d=8192, H=64, KV=8, hd=128, f=28672),
    "llama3-8b": llama_total(V=128256, L=32, d=4096, H=32, KV=8, hd=128, f=14336),
    "llama3-70b": llama_total(V=128256, L=80, d=8192, H=64, KV=8, hd=128, f=28672),
}


def hf_meta_count(cfg) -> int:
    """Parameters of the transformers model of ``cfg``'s layout, built on the meta device (skips without transformers)."""
    transformers = pytest.importorskip("transformers")
    from archlab.interop.hf import config_to_hf

    with torch.device("meta"):
        model = transformers.AutoModelForCausalLM.from_config(config_to_hf(cfg))
    return sum(p.numel() for p in model.parameters())  # a tied tensor is listed once


@pytest.mark.parametrize("preset", PUBLISHED)
def test_preset_on_meta_matches_published_count(preset):
    cfg = compose_model([f"model={preset}"])
    assert ignored(cfg) == []  # no preset sets a field its variant ignores (tests/test_ignored_settings.py)
    assert count_params(cfg)["total"] == PUBLISHED[preset]
    model = build_model(cfg, device="meta")
    assert all(p.is_meta for p in model.parameters())  # nothing allocated
    assert built_counts(model)["total"] == PUBLISHED[preset]
    assert sum(p.numel() for p in model.parameters()) == PUBLISHED[preset]
    assert set(roles(model)) == {id(p) for p in model.parameters()}  # param=mup|completep can scale each


@pytest.mark.parametrize("preset", ACTIVE)
def test_mixture_of_experts_preset_has_the_published_active_count(preset):
    cfg = compose_model([f"model={preset}"])
    assert count_params(cfg)["active"] == ACTIVE[preset] < PUBLISHED[preset]


@pytest.mark.parametrize("preset", [p for p in PUBLISHED if p not in LAYOUT_CONFIGS])
def test_hugging_face_model_of_the_preset_has_the_published_count(preset):
    assert hf_meta_count(compose_model([f"model={preset}"])) == PUBLISHED[preset]


@pytest.mark.parametrize("preset", LAYOUT_CONFIGS)
def test_hugging_face_model_of_the_published_layout_has_the_preset_count(preset):
    """A preset whose layers differ is held to the published config itself, not to one archlab's
    converters write (not every such family has one, and the published values are the independent
    check): transformers builds it on the meta device, and its count, plus what the class leaves out
    (Step3p7TextModel: the LM head), is the preset's closed-form count."""
    transformers = pytest.importorskip("transformers")
    model_class, config_class, keys, left_out = LAYOUT_CONFIGS[preset]
    config = getattr(transformers, config_class)(**keys)
    with torch.device("meta"):
        model = getattr(transformers, model_class)(config)
    built = sum(p.numel() for p in model.parameters()) + left_out
    assert built == PUBLISHED[preset] == count_params(compose_model([f"model={preset}"]))["total"]


@pytest.mark.parametrize("preset", CLOSED_FORMS)
def test_closed_forms_equal_count_params(preset):
    block, total = CLOSED_FORMS[preset]
    counts = count_params(compose_model([f"model={preset}"]))
    assert counts["per_block"] == block
    assert counts["total"] == total == PUBLISHED[preset]


def test_nano_matches_gpt2_closed_form_and_hf():
    cfg = compose_model(["model=nano"])
    assert ignored(cfg) == []
    _, expected = gpt2_total(V=256, ctx=256, L=4, d=128, f=512)
    assert count_params(cfg)["total"] == expected == 858_880
    assert hf_meta_count(cfg) == expected


def test_mamba_codestral_7b_breakdown_by_hand():
    """Mamba-Codestral written out from transformers' Mamba2Mixer tensor shapes: in_proj to z, x, B, C and dt,
    the depthwise conv1d and its bias over x, B and C, dt_bias, A_log and D, the gated norm, out_proj; one
    RMSNorm a layer, no MLP; the final norm and an untied head."""
    V, L, d, H, P, G, N, K = 32768, 64, 4096, 128, 64, 8, 128, 4
    inner, channels = H * P, H * P + 2 * G * N
    mixer = d * (inner + channels + H) + channels * (K + 1) + 3 * H + inner + inner * d
    counts = count_params(compose_model(["model=mamba-codestral-7b"]))
    assert counts["attention"] == L * mixer and counts["mlp"] == 0 and counts["norms"] == L * d
    assert counts["total"] == 2 * V * d + L * (mixer + d) + d == PUBLISHED["mamba-codestral-7b"]


def test_every_published_preset_has_its_reference_and_nano_none():
    from archlab.cli.check import REFERENCE_COUNTS, presets

    assert set(presets()) == set(PUBLISHED) | {"nano"}
    assert REFERENCE_COUNTS == PUBLISHED  # nano, not a published model, has no reference to be checked against


def test_preset_with_fewer_layers_follows_closed_form():
    # llama2-70b: d 8192, 64 heads, 8 KV heads of 128, f = 28672 (docs/reference.md: Meta's width rule), two layers.
    cfg = compose_model(["model=llama2-70b", "model.n_layer=2"])
    _, expected = llama_total(V=32000, L=2, d=8192, H=64, KV=8, hd=128, f=28672)
    assert count_params(cfg)["total"] == expected
    assert hf_meta_count(cfg) == expected


def test_gpt2_with_rope_drops_only_the_position_table():
    cfg = compose_model(["model=gpt2", "model/position=rope"])
    assert (cfg.n_layer, cfg.d_model, cfg.attention.n_head, cfg.head.tied) == (12, 768, 12, True)  # sizes kept
    assert count_params(cfg)["total"] == PUBLISHED["gpt2"] - 1024 * 768
    assert sum(p.numel() for p in build_model(cfg, device="meta").parameters()) == PUBLISHED["gpt2"] - 1024 * 768


def test_llama2_70b_breakdown_by_hand():
    V, L, d, H, KV, hd, f = 32000, 80, 8192, 64, 8, 128, 28672
    counts = count_params(compose_model(["model=llama2-70b"]))
    assert {
        k: counts[k]
        for k in ("token_embedding", "position_embedding", "attention", "mlp", "norms", "final_norm", "head")
    } == {
        "token_embedding": V * d,
        "position_embedding": 0,  # rope has no parameters
        "attention": L * (d * H * hd + 2 * d * KV * hd + H * hd * d),
        "mlp": L * 3 * d * f,
        "norms": L * 2 * d,
        "final_norm": d,
        "head": V * d,
    }


def test_qwen3_next_80b_a3b_breakdown_by_hand():
    """Qwen3-Next's two layer kinds written out from transformers' tensor shapes: a gated attention layer's
    q_proj doubled (query and gate), k/v, o and two (1 + w) QK-norms of one head; a Gated DeltaNet layer's
    in_proj_qkvz and in_proj_ba, depthwise conv1d, A_log and dt_bias, the gated norm, out_proj; every MoE
    its router, 512 experts, the shared expert and its one-output gate; two norms a layer."""
    V, L, d, E, k, f = 151936, 48, 2048, 512, 10, 512
    H, KV, hd = 16, 2, 256  # attention layers: 12 of 48
    Hv, Hk, dk, dv, K = 32, 16, 128, 128, 4  # Gated DeltaNet layers: 36
    attention = 2 * d * H * hd + 2 * d * KV * hd + H * hd * d + 2 * hd
    channels = 2 * Hk * dk + Hv * dv
    deltanet = d * (channels + Hv * dv + 2 * Hv) + channels * K + 2 * Hv + dv + Hv * dv * d
    moe = E * d + E * 3 * d * f + 3 * d * f + d
    counts = count_params(compose_model(["model=qwen3-next-80b-a3b"]))
    assert counts["attention"] == 12 * attention + 36 * deltanet
    assert counts["mlp"] == L * moe
    total = 2 * V * d + 12 * attention + 36 * deltanet + L * (moe + 2 * d) + d
    assert counts["total"] == total == PUBLISHED["qwen3-next-80b-a3b"]
    assert counts["active"] == total - L * (E - k) * 3 * d * f == ACTIVE["qwen3-next-80b-a3b"]


def test_kimi_linear_48b_a3b_breakdown_by_hand():
    """Kimi-Linear-48B-A3B (KimiLinearConfig() defaults) written out from transformers' modules: 21 KDA layers
    (q, k, v; f_a, f_b, dt_bias, A_log; b; the q/k/v conv1d; g_a, g_b, the gated norm; o_proj), 6 MLA layers
    without low-rank queries (q_proj, kv_a_proj_with_mqa, its norm, kv_b_proj, o_proj); layer 0's dense
    SwiGLU, 26 MoE layers (router, 256 experts, one shared; the correction bias a buffer); two RMSNorms a
    layer, the final norm, an untied head."""
    V, L, d, H, dh, K, f, E, k, fe = 163840, 27, 2304, 32, 128, 4, 9216, 256, 8, 1024
    W = H * dh
    kda = 3 * d * W + d * dh + dh * W + W + H + d * H + 3 * W * K + d * dh + dh * W + dh + W * d
    mla = d * H * (128 + 64) + d * (512 + 64) + 512 + 512 * H * (128 + 128) + H * 128 * d
    moe = E * d + E * 3 * d * fe + 3 * d * fe
    counts = count_params(compose_model(["model=kimi-linear-48b-a3b"]))
    assert counts["attention"] == 21 * kda + 6 * mla and counts["mlp"] == 3 * d * f + 26 * moe
    total = 2 * V * d + 21 * kda + 6 * mla + 3 * d * f + 26 * moe + L * 2 * d + d
    assert counts["total"] == total == PUBLISHED["kimi-linear-48b-a3b"]
    assert counts["active"] == total - 26 * (E - k) * 3 * d * fe == ACTIVE["kimi-linear-48b-a3b"]


def test_lfm3_1_7b_breakdown_by_hand():
    """LFM3-1.7B written out from transformers' Lfm3ShortConv, Lfm3Attention and Lfm3MLP tensor shapes: a conv
    layer's in_proj to B, C, x, its depthwise kernel of 7 and out_proj; an attention layer's q, k, v and o
    projections, its per-head gate g_proj and two QK-norms; every layer's gate, up and down projections and
    four RMSNorms (sandwich); the final norm and the tied embedding. Layers 2, 6, ... attend in full, 4, 8, ...
    slide: 13 conv layers, 11 attention layers."""
    V, L, d, f, H, KV, hd, K = 128000, 24, 2048, 7680, 16, 4, 128, 7
    conv, attention = 4 * d * d + K * d, 2 * H * hd * d + 2 * KV * hd * d + H * d + 2 * hd
    n_attention = sum(i % 4 == 2 or (i % 4 == 0 and i > 0) for i in range(L))
    counts = count_params(compose_model(["model=lfm3-1.7b"]))
    assert n_attention == 11 and counts["mlp"] == L * 3 * d * f
    total = V * d + (L - n_attention) * conv + n_attention * attention + L * (3 * d * f + 4 * d) + d
    assert counts["total"] == total == PUBLISHED["lfm3-1.7b"]


def test_ling_3_0_flash_breakdown_by_hand():
    """Ling-3.0-Flash written out from transformers' BailingHybrid tensor shapes: a KDA layer's q, k, v,
    f_proj, g_proj (each d x 4096), b_proj, the convolution of 4 over q, k, v, A_log per head, dt_bias per
    channel, the gated norm of 128, o_proj; an MLA layer's q_proj, kv_a_proj_with_mqa, its norm, kv_b_proj,
    o_proj and the per-head gate g_proj; two dense layers, then the router, 512 experts and the shared one;
    two norms per layer, the final norm, embedding and untied head. Layers 5, 11, ..., 41 are MLA."""
    V, L, d, H, hd, K, f, E, k, fe = 157184, 42, 2560, 32, 128, 4, 6144, 512, 8, 768
    W = H * hd
    kda = 5 * d * W + d * H + 3 * W * K + H + W + hd + W * d
    mla = d * H * (128 + 64) + d * (512 + 64) + 512 + 512 * H * (128 + 128) + H * 128 * d + d * H
    n_mla = sum((i + 1) % 6 == 0 for i in range(L))
    moe = E * d + E * 3 * d * fe + 3 * d * fe
    total = 2 * V * d + (L - n_mla) * kda + n_mla * mla + 2 * 3 * d * f + (L - 2) * moe + L * 2 * d + d
    counts = count_params(compose_model(["model=ling-3.0-flash"]))
    assert n_mla == 7 and counts["total"] == total == PUBLISHED["ling-3.0-flash"]
    assert counts["active"] == total - (L - 2) * (E - k) * 3 * d * fe == ACTIVE["ling-3.0-flash"]


def test_bamba_9b_breakdown_by_hand():
    """Bamba-9B written out from transformers' BambaMixer and BambaMLP tensor shapes: in_proj to z, x, B, C
    and dt, the depthwise conv1d and its bias over x, B and C, dt_bias, A_log and D, the gated norm, out_proj;
    gate, up and down projections; two RMSNorms a layer; the final norm and an untied head."""
    V, L, d, f, H, P, G, N, K = 128000, 32, 4096, 14336, 128, 64, 1, 256, 4
    inner, channels = H * P, H * P + 2 * G * N
    mixer = d * (inner + channels + H) + channels * (K + 1) + 3 * H + inner + inner * d
    counts = count_params(compose_model(["model=bamba-9b"]))
    assert counts["attention"] == L * mixer and counts["mlp"] == L * 3 * d * f and counts["norms"] == L * 2 * d
    assert counts["total"] == 2 * V * d + L * (mixer + 3 * d * f + 2 * d) + d == PUBLISHED["bamba-9b"]


def test_xlstm_7b_breakdown_by_hand():
    """xLSTM-7B written out from transformers' xLSTMLayer and xLSTMFeedForward tensor shapes: q and k 2048
    wide, v and the output gate 4096, the input and forget gates 8 each with biases, the multi-head norm's
    scale, out_proj; the SwiGLU's two up projections and its down projection (10944); two RMSNorms a block;
    the final norm and an untied head."""
    V, L, d, H, qk, v, f = 50304, 32, 4096, 8, 2048, 4096, 10944
    mixer = d * (2 * qk + 2 * v) + 2 * H * (d + 1) + v + v * d
    counts = count_params(compose_model(["model=xlstm-7b"]))
    assert counts["attention"] == L * mixer and counts["mlp"] == L * 3 * d * f
    assert counts["total"] == 2 * V * d + L * (mixer + 3 * d * f + 2 * d) + d == PUBLISHED["xlstm-7b"]


def test_recurrentgemma_2b_breakdown_by_hand():
    """RecurrentGemma-2B written out from transformers' tensor shapes: a recurrent block's linear_y, linear_x
    and linear_out with biases, the depthwise conv_1d with its bias, the RG-LRU's two block-diagonal gates
    with biases and Λ; an attention block's q, one head's k and v, o_proj with its bias; every layer's gated
    MLP with biases and two RMSNorms; 18 recurrent and 8 attention layers; the final norm, a tied head."""
    V, L, d, f, H, hd, W, K = 256000, 26, 2560, 7680, 10, 256, 2560, 4
    recurrent = 2 * (d * W + W) + (W * d + d) + W * (K + 1) + 2 * (H * (W // H) ** 2 + W) + W
    attention = d * H * hd + 2 * d * hd + H * hd * d + d
    mlp = 2 * (d * f + f) + f * d + d
    counts = count_params(compose_model(["model=recurrentgemma-2b"]))
    assert counts["attention"] == 18 * recurrent + 8 * attention and counts["mlp"] == L * mlp
    assert counts["total"] == V * d + 18 * recurrent + 8 * attention + L * (mlp + 2 * d) + d
    assert counts["total"] == PUBLISHED["recurrentgemma-2b"]


def test_jamba_v0_1_breakdown_by_hand():
    """Jamba-v0.1 written out from transformers' JambaMambaMixer, JambaAttention, JambaMLP and
    JambaSparseMoeBlock tensor shapes: a Mamba layer's in_proj, depthwise conv1d and its bias, x_proj to Δ's
    rank and B, C, dt_proj and its bias, A_log, D, the three norm scales, out_proj; an attention layer's q, k,
    v, o (no biases, no positions); a dense layer's gate, up and down, a MoE layer's router and 16 of them;
    two RMSNorms a layer; the final norm and an untied head."""
    V, L, d, f, H, KV, hd, E, k = 65536, 32, 4096, 14336, 32, 8, 128, 16, 2
    W, N, R, K = 2 * d, 16, 256, 4  # Mamba (W channels): 28 layers; attention: 4 (i % 8 == 4); MoE: 16 (odd i)
    mamba = d * 2 * W + W * (K + 1) + W * (R + 2 * N) + (R + 1) * W + W * N + W + (R + 2 * N) + W * d
    attention = 2 * d * H * hd + 2 * d * KV * hd
    dense, moe = 3 * d * f, E * d + E * 3 * d * f
    counts = count_params(compose_model(["model=jamba-v0.1"]))
    assert counts["attention"] == 28 * mamba + 4 * attention
    assert counts["mlp"] == 16 * dense + 16 * moe
    total = 2 * V * d + 28 * mamba + 4 * attention + 16 * (dense + moe) + L * 2 * d + d
    assert counts["total"] == total == PUBLISHED["jamba-v0.1"]
    assert counts["active"] == total - 16 * (E - k) * 3 * d * f == ACTIVE["jamba-v0.1"]


def test_deepseek_v32_exp_is_deepseek_v3_plus_its_indexers():
    """DeepSeek-V3.2-Exp is DeepSeek-V3's layout (671,026,404,352; 37,552,282,624 active) with a lightning
    indexer in each of its 61 attention layers: wq_b 1536·64·128, wk 7168·128, its LayerNorm 2·128 and
    weights_proj 7168·64, 13,959,424 a layer, which every token passes."""
    indexer = 1536 * 64 * 128 + 7168 * 128 + 2 * 128 + 7168 * 64
    counts = count_params(compose_model(["model=deepseek-v3.2-exp"]))
    v3 = count_params(compose_model(["model=deepseek-v3"]))
    assert counts["attention"] - v3["attention"] == 61 * indexer == 61 * 13_959_424
    assert counts["total"] == PUBLISHED["deepseek-v3"] + 61 * indexer == PUBLISHED["deepseek-v3.2-exp"]
    assert counts["active"] == ACTIVE["deepseek-v3"] + 61 * indexer == ACTIVE["deepseek-v3.2-exp"]
