"""Multi-head latent attention (``mla``, DeepSeek-V2; archlab/nn/mixers/mla.py) and YaRN RoPE scaling, each
against an independent expectation: DeepSeek's published per-layer counts worked by hand, the meta build,
Hugging Face's YaRN frequencies and DeepSeek-V2/V3 attention modules, hand-computed values, the full
forward (for the KV cache) and PyTorch's FLOP counter; the latent norms' own eps (``latent_norm_eps``)
moves the logits and is validated."""

from __future__ import annotations

import math

import pytest
import torch
from helpers.hf import changed_cfg, check_changes_logits
from helpers.mixers import randomise
from omegaconf import OmegaConf
from torch.nn.attention import SDPBackend, sdpa_kernel
from torch.utils.flop_counter import FlopCounterMode

from archlab import build_model, compose_model, count_params
from archlab.accounting import check_build, kv_cache_bytes
from archlab.config import to_model_config
from archlab.errors import ConfigError
from archlab.nn.mixers.attention import CausalSelfAttention, softmax_scale
from archlab.nn.mixers.mla import MultiHeadLatentAttention
from archlab.nn.rope import RoPE, attention_factor, inverse_frequencies, rotary_dim
from archlab.nn.validation import validate

pytestmark = pytest.mark.usefixtures("single_thread")

MLA = {"kind": "mla", "n_head": 4, "kv_lora_rank": 16}
MLA |= {"qk_nope_head_dim": 6, "qk_rope_head_dim": 4, "v_head_dim": 5}
YARN = {
    "kind": "rope",
    "scaling": {"kind": "yarn", "factor": 4.0, "original_context": 8, "beta_fast": 8.0, "beta_slow": 2.0},
}


def tiny(**overrides):
    """d_model 32, 2 layers, vocab 48, context 16, RMSNorm (eps 1e-6, as DeepSeek), mla with 4 heads of
    nope 6 + rope 4 (v 5) from a 16-dim latent, YaRN RoPE (factor 4 over 8 positions); an attention of
    another kind in place of mla, keeping its 4 heads; a position scheme of another kind in place of RoPE."""
    swapped = overrides.get("attention", {}).get("kind", "mla") != "mla"
    rope = overrides.get("position", {}).get("kind", "rope") == "rope"
    base = {
        "vocab_size": 48,
        "context_length": 16,
        "n_layer": 2,
        "d_model": 32,
        "norm": {"kind": "rmsnorm", "eps": 1e-6, "bias": False},
        "position": YARN if rope else {},
        "attention": {"n_head": 4} if swapped else MLA,
        "mlp": {"kind": "swiglu", "bias": False},
        "head": {"tied": False},
    }
    return to_model_config(OmegaConf.merge(base, overrides))


# ---- parameter counts ----


def deepseek(d, H, q_rank):
    return tiny(d_model=d, attention={"n_head": H, "q_lora_rank": q_rank, "kv_lora_rank": 512,
                                      "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128})  # fmt: skip


def test_per_layer_count_is_deepseeks():
    """DeepSeek-V2-Lite (d 2048, 16 heads, direct queries) and V3 (d 7168, 128 heads, query rank 1536),
    kv rank 512, heads of 128 + 64 (v 128): 13,763,072 and 187,107,328 per layer (HF meta builds)."""
    v2_lite = 2048 * 16 * 192 + (2048 * 576 + 512 + 512 * 16 * 256) + 16 * 128 * 2048
    v3 = (7168 * 1536 + 1536 + 1536 * 128 * 192) + (7168 * 576 + 512 + 512 * 128 * 256) + 128 * 128 * 7168
    assert (v2_lite, v3) == (13_763_072, 187_107_328)
    assert MultiHeadLatentAttention.num_params(deepseek(2048, 16, None)) == v2_lite
    assert MultiHeadLatentAttention.num_params(deepseek(7168, 128, 1536)) == v3


@pytest.mark.parametrize("q_rank", [None, 8])
@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
def test_count_equals_the_meta_build(q_rank, norm):
    cfg = tiny(attention={"q_lora_rank": q_rank}, norm={"kind": norm, "bias": True})
    model = build_model(cfg, device="meta")
    check_build(cfg, model)
    attn = model.blocks[0].attn
    names = {n.split(".")[0] for n, _ in attn.named_parameters()}
    queries = {"q_down", "q_norm", "q_up"} if q_rank else {"q_proj"}
    assert names == queries | {"kv_down", "kv_norm", "kv_up", "proj"}
    norm_params = (2 if norm == "layernorm" else 1) * (16 + (q_rank or 0))
    matrices = (32 * 8 + 8 * 40 if q_rank else 32 * 40) + 32 * 20 + 16 * 44 + 20 * 32
    assert sum(p.numel() for p in attn.parameters()) == matrices + norm_params


# ---- YaRN ----


def test_yarn_frequencies_by_hand():
    """dim 64, theta 10^4, 4096 positions, beta 32 / 1, factor 40: pair 64·ln(4096/(2π·32))/(2·ln 10^4)
    = 10.47 turns 32 times, 22.51 once, so the ramp runs from pair 10 to 23. Pair 16 is 6/13 along it:
    10^-2·(6/13 / 40 + 7/13) = 0.0055; pair 5 keeps 10^(-4·10/64), pair 30 is 10^(-4·60/64) / 40."""
    p = tiny(
        position={"scaling": {"factor": 40.0, "original_context": 4096, "beta_fast": 32.0, "beta_slow": 1.0}}
    ).position
    inv = inverse_frequencies(p, 64).double()
    assert inv[16].item() == pytest.approx(0.0055, rel=1e-6)
    assert inv[5].item() == pytest.approx(10 ** (-40 / 64), rel=1e-6)
    assert inv[30].item() == pytest.approx(10 ** (-240 / 64) / 40, rel=1e-6)
    assert attention_factor(p.scaling) == pytest.approx(0.1 * math.log(40) + 1)  # no mscale: YaRN's 0.1·ln s + 1
    p.scaling.mscale, p.scaling.mscale_all_dim = 0.707, 0.707
    assert attention_factor(p.scaling) == 1.0  # DeepSeek-V2-Lite's equal pair cancels


YARN_CASES = {
    "deepseek-v3": dict(dim=64, theta=10000.0, factor=40.0, orig=4096, fast=32.0, slow=1.0, m=1.0, m_all=1.0),
    "mscales-differ": dict(dim=16, theta=500.0, factor=4.0, orig=64, fast=16.0, slow=2.0, m=0.9, m_all=0.4),
    "no-mscale": dict(dim=32, theta=10000.0, factor=8.0, orig=2048, fast=32.0, slow=1.0, m=None, m_all=None),
    "band-clipped": dict(dim=8, theta=10000.0, factor=2.0, orig=16, fast=4.0, slow=1.0, m=None, m_all=None),
}


@pytest.mark.parametrize("case", YARN_CASES)
def test_yarn_frequencies_and_attention_factor_equal_hugging_faces(case):
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    c = YARN_CASES[case]
    rope = {"rope_type": "yarn", "rope_theta": c["theta"], "factor": c["factor"]}
    rope |= {"original_max_position_embeddings": c["orig"], "beta_fast": c["fast"], "beta_slow": c["slow"]}
    rope |= {k: v for k, v in (("mscale", c["m"]), ("mscale_all_dim", c["m_all"])) if v is not None}
    hf_cfg = transformers.DeepseekV3Config(
        hidden_size=64, num_attention_heads=4, qk_rope_head_dim=c["dim"], max_position_embeddings=c["orig"],
        rope_parameters=rope,
    )  # fmt: skip
    hf_inv, hf_factor = _compute_yarn_parameters(hf_cfg)
    scaling = {"factor": c["factor"], "original_context": c["orig"], "beta_fast": c["fast"], "beta_slow": c["slow"],
               "mscale": c["m"], "mscale_all_dim": c["m_all"]}  # fmt: skip
    ours = tiny(position={"theta": c["theta"], "scaling": scaling}, attention={"qk_rope_head_dim": c["dim"]})
    validate(ours)
    torch.testing.assert_close(inverse_frequencies(ours.position, rotary_dim(ours)), hf_inv, rtol=1e-6, atol=0)
    assert attention_factor(ours.position.scaling) == pytest.approx(hf_factor, rel=1e-12)


@pytest.mark.parametrize("truncate", [True, False])
def test_yarn_truncate_by_hand_and_as_hugging_face(truncate):
    """dim 8 (pairs 0-3), theta 100, 16 positions, beta 1 / 1/8, factor 4: the ramp's ends are the pairs
    8·ln(16/(2π·beta))/(2·ln 100), 0.812 and 2.618; ``truncate`` rounds them outward to 0 and 3 (ramp 0,
    1/3, 2/3, 1 over the pairs), false keeps them (0, 0.104, 0.658, 1). Pair i is 100^(-i/4)·((1 - r) +
    r/4) for its ramp r; transformers' ``_compute_yarn_parameters`` gives the same table for each value."""
    transformers = pytest.importorskip("transformers")
    from transformers.modeling_rope_utils import _compute_yarn_parameters

    low, high = (8 * math.log(16 / (2 * math.pi * beta)) / (2 * math.log(100)) for beta in (1.0, 0.125))
    assert (round(low, 3), round(high, 3)) == (0.812, 2.618)
    if truncate:
        low, high = math.floor(low), math.ceil(high)
    ramp = [min(max((i - low) / (high - low), 0.0), 1.0) for i in range(4)]
    assert ramp == (pytest.approx([0, 1 / 3, 2 / 3, 1]) if truncate else pytest.approx([0, 0.104, 0.658, 1], abs=1e-3))
    expected = torch.tensor([100 ** (-i / 4) * ((1 - r) + r / 4) for i, r in enumerate(ramp)], dtype=torch.float64)
    scaling = {"factor": 4.0, "original_context": 16, "beta_fast": 1.0, "beta_slow": 0.125, "truncate": truncate}
    p = tiny(position={"theta": 100.0, "scaling": scaling}).position
    torch.testing.assert_close(inverse_frequencies(p, 8).double(), expected, rtol=1e-6, atol=0)
    rope = {"rope_type": "yarn", "rope_theta": 100.0, "factor": 4.0, "original_max_position_embeddings": 16}
    rope |= {"beta_fast": 1.0, "beta_slow": 0.125, "truncate": truncate}
    hf_cfg = transformers.GptOssConfig(
        hidden_size=32, num_attention_heads=4, num_key_value_heads=4, head_dim=8, max_position_embeddings=64,
        rope_parameters=rope,
    )  # fmt: skip
    hf_inv, _ = _compute_yarn_parameters(hf_cfg)
    torch.testing.assert_close(hf_inv.double(), expected, rtol=1e-6, atol=0)


def test_yarn_truncate_is_a_bool():
    cfg = tiny()
    cfg.position.scaling.truncate = "no"  # type: ignore[assignment]  # a Python-built config: OmegaConf's would convert it
    with pytest.raises(ConfigError) as error:
        validate(cfg)
    assert (error.value.field, error.value.allowed) == ("model.position.scaling.truncate", "true or false")


def test_yarn_attention_factor_scales_cos_and_sin():
    cfg = tiny(position={"scaling": {"mscale": 0.9, "mscale_all_dim": 0.4}})
    factor = (0.09 * math.log(4) + 1) / (0.04 * math.log(4) + 1)
    rotation = RoPE(cfg).rotary(torch.arange(5), torch.float32)
    angle = torch.arange(5.0)[:, None, None] * inverse_frequencies(cfg.position, 4)
    torch.testing.assert_close(rotation.cos, angle.cos() * factor)
    torch.testing.assert_close(rotation.sin, angle.sin() * factor)


def test_causal_softmax_scale_takes_yarns_mscale_all_dim():
    """A causal layer with YaRN and mscale_all_dim 0.5, factor 4: 1/sqrt(8)·(0.05·ln 4 + 1)², the same
    output as that scale given explicitly; without mscale_all_dim plain 1/sqrt(8)."""
    causal = {"kind": "causal", "n_head": 4, "head_dim": None, "qkv_bias": True}
    cfg = tiny(attention=causal, position={"scaling": {"mscale": 0.5, "mscale_all_dim": 0.5}})
    expected = (0.05 * math.log(4) + 1) ** 2 / math.sqrt(8)
    assert softmax_scale(cfg) == pytest.approx(expected, rel=1e-12)
    assert softmax_scale(tiny(attention=causal)) == 1 / math.sqrt(8)
    explicit = tiny(attention=causal | {"scale": expected}, position={"kind": "none"})
    x = torch.randn(2, 7, 32)
    ours, reference = randomise(CausalSelfAttention(cfg)), randomise(CausalSelfAttention(explicit))
    with torch.no_grad():
        torch.testing.assert_close(ours(x), reference(x))  # no rotation passed: only the scale differs
        assert not torch.allclose(ours(x), randomise(CausalSelfAttention(tiny(attention=causal)))(x))


def test_mla_rotates_qk_rope_head_dim():
    assert rotary_dim(tiny()) == 4
    assert rotary_dim(tiny(attention={"qk_rope_head_dim": 8})) == 8


# ---- against Hugging Face's DeepSeek attention ----


def hf_deepseek(version: str, q_rank, interleave: bool):
    """A tiny Hugging Face DeepSeek attention (eager, float32) and its rotary embedding, with YaRN
    whose mscales differ (so the cos/sin factor is not 1 and the softmax scale takes mscale_all_dim)."""
    transformers = pytest.importorskip("transformers")
    rope = {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0, "original_max_position_embeddings": 8}
    rope |= {"beta_fast": 8.0, "beta_slow": 2.0, "mscale": 0.9, "mscale_all_dim": 0.6}
    sizes = dict(hidden_size=32, num_attention_heads=4, num_key_value_heads=4, q_lora_rank=q_rank, kv_lora_rank=16)
    sizes |= dict(qk_nope_head_dim=6, qk_rope_head_dim=4, v_head_dim=5, rope_parameters=rope, attention_bias=False)
    sizes |= dict(max_position_embeddings=32, rms_norm_eps=1e-6)
    if version == "v3":
        from transformers.models.deepseek_v3 import modeling_deepseek_v3 as m

        config = transformers.DeepseekV3Config(**sizes, rope_interleave=interleave)
        config._attn_implementation = "eager"
        return m.DeepseekV3Attention(config, 0), m.DeepseekV3RotaryEmbedding(config)
    from transformers.models.deepseek_v2 import modeling_deepseek_v2 as m

    config = transformers.DeepseekV2Config(**sizes)
    config._attn_implementation = "eager"
    return m.DeepseekV2Attention(config, 0), m.DeepseekV2RotaryEmbedding(config)


HF_CASES = {
    "v3-low-rank-q-interleaved": ("v3", 12, True),
    "v3-direct-q-half": ("v3", None, False),
    "v2-direct-q": ("v2", None, True),
    "v2-low-rank-q": ("v2", 12, True),
}


@pytest.mark.parametrize("case", HF_CASES)
def test_forward_equals_hugging_faces_deepseek_attention(case):
    version, q_rank, interleave = HF_CASES[case]
    hf, hf_rotary = hf_deepseek(version, q_rank, interleave)
    randomise(hf)
    cfg = tiny(
        position={
            "pairing": "interleaved" if interleave else "half",
            "scaling": {"mscale": 0.9, "mscale_all_dim": 0.6},
        },
        attention={"q_lora_rank": q_rank},
    )
    validate(cfg)
    ours = MultiHeadLatentAttention(cfg)
    names = {"kv_down": "kv_a_proj_with_mqa", "kv_norm": "kv_a_layernorm", "kv_up": "kv_b_proj", "proj": "o_proj"}
    names |= {"q_down": "q_a_proj", "q_norm": "q_a_layernorm", "q_up": "q_b_proj"} if q_rank else {"q_proj": "q_proj"}
    hf_params = dict(hf.named_parameters())
    with torch.no_grad():
        for name, p in ours.named_parameters():
            module, leaf = name.split(".")
            p.copy_(hf_params[f"{names[module]}.{leaf}"])
    assert sum(p.numel() for p in hf.parameters()) == MultiHeadLatentAttention.num_params(cfg)

    T = 12  # past original_context (8): YaRN's interpolated frequencies are reached
    x = torch.randn(2, T, 32, generator=torch.Generator().manual_seed(1))
    positions = torch.arange(T)[None]
    causal = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        embeddings = hf_rotary(x, positions)
        expected = hf(x, attention_mask=causal, position_embeddings=embeddings)[0]
        got = ours(x, RoPE(cfg).rotary(torch.arange(T), torch.float32))
    assert ours.scale == pytest.approx(hf.scaling, rel=1e-12)
    torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-5)


# ---- the whole model: KV cache, FLOPs ----


@pytest.mark.parametrize(
    "overrides",
    [
        {},
        {
            "attention": {"q_lora_rank": 8, "window": 3},
            "position": {"pairing": "interleaved"},
            "layers": {
                "kinds": {"local": {}, "global": {"attention": {"window": None}}},
                "pattern": ["local", "global"],
            },
        },
        {"position": {"kind": "alibi"}, "block": {"kind": "sandwich"}},
    ],
    ids=["yarn", "low-rank-q-window", "alibi"],
)
def test_cached_decoding_equals_the_full_forward(overrides):
    cfg = tiny(**overrides)
    model = randomise(build_model(cfg)).eval()
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        full = model(idx)
        cache = model.new_cache(2, 16)
        steps = [model(idx[:, :5], cache)] + [model(idx[:, t : t + 1], cache) for t in range(5, 16)]
    # fp32 rounding of another summation order, scaled to the logits (random weights give |logit| up to ~8)
    torch.testing.assert_close(torch.cat(steps, dim=1), full, rtol=1e-5, atol=1e-5 * full.abs().max().item())


def test_a_left_padded_batch_generates_as_each_prompt_alone():
    """Padding hidden and positions numbered per row: the rotated shared key of each row is its own."""
    from archlab.generate import generate

    model = randomise(build_model(tiny(attention={"q_lora_rank": 8}))).eval()
    short, long = torch.tensor([[5, 9, 2]]), torch.tensor([[7, 1, 3, 3, 8, 4]])
    batch = torch.cat((torch.cat((torch.zeros(1, 3, dtype=torch.long), short), dim=1), long))
    mask = torch.tensor([[0, 0, 0, 1, 1, 1], [1] * 6])
    together = generate(model, batch, 6, attention_mask=mask)
    assert torch.equal(together[0, 3:], generate(model, short, 6)[0])
    assert torch.equal(together[1], generate(model, long, 6)[0])


def test_the_cache_holds_the_latent_and_the_shared_key():
    """Per layer, [B, 1, T, kv_lora_rank] and [B, 1, T, qk_rope_head_dim]: kv_cache_bytes in float32."""
    cfg = tiny()
    model = build_model(cfg).eval()
    cache = model.new_cache(1, 16)
    with torch.no_grad():
        model(torch.zeros(1, 16, dtype=torch.long), cache)
    assert [tuple(t.shape) for t in cache.k] == [(1, 1, 16, 16)] * 2
    assert [tuple(t.shape) for t in cache.v] == [(1, 1, 16, 4)] * 2
    held = sum(t.numel() * t.element_size() for t in (*cache.k, *cache.v))
    assert held == kv_cache_bytes(cfg, 16) == 4 * 2 * 16 * (16 + 4)


def test_flops_per_token_match_the_flop_counter():
    """Exactly 6·(N − vector params) + 6·L·H·(nope + rope + v)·T: the counter counts matmuls only, so
    norm scales are left out; SDPA's MATH backend runs scores and values as bmm ops it counts."""
    cfg = tiny(attention={"q_lora_rank": 8})
    model = build_model(cfg).train()
    idx = torch.randint(0, cfg.vocab_size, (2, 16), generator=torch.Generator().manual_seed(0))
    counter = FlopCounterMode(display=False)
    with sdpa_kernel(SDPBackend.MATH), counter:
        model(idx).sum().backward()
    vector_params = sum(p.numel() for p in model.parameters() if p.ndim == 1)
    counts = count_params(cfg)
    scores = 6 * 2 * 4 * (6 + 4 + 5) * 16
    assert counter.get_total_flops() / 32 == 6 * (counts["non_embedding"] - vector_params) + scores
    assert counts["flops_per_token"] == 6 * counts["non_embedding"] + scores


def test_extra_flops_equal_causals_when_heads_match():
    """12·H·hd per key seen is 6·H·(qk + v) with qk = v = hd."""
    mla = tiny(attention={"qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 8})
    causal = tiny(attention={"kind": "causal", "qkv_bias": False}, position={"kind": "rope"})
    assert MultiHeadLatentAttention.extra_flops(mla, 16, 0) == CausalSelfAttention.extra_flops(causal, 16, 0) > 0


# ---- validation ----

REFUSED = [
    ({"attention": {"n_kv_head": 2}}, "model.attention.n_kv_head"),
    ({"attention": {"head_dim": 8}}, "model.attention.head_dim"),
    ({"attention": {"qkv_bias": True}}, "model.attention.qkv_bias"),
    ({"attention": {"out_bias": True}}, "model.attention.out_bias"),
    ({"attention": {"qk_norm": "head"}}, "model.attention.qk_norm"),
    ({"attention": {"softcap": 50.0}}, "model.attention.softcap"),
    ({"attention": {"q_lora_rank": 0}}, "model.attention.q_lora_rank"),
    ({"attention": {"kv_lora_rank": 0}}, "model.attention.kv_lora_rank"),
    ({"attention": {"qk_nope_head_dim": 0}}, "model.attention.qk_nope_head_dim"),
    ({"attention": {"v_head_dim": -1}}, "model.attention.v_head_dim"),
    ({"attention": {"qk_rope_head_dim": 3}}, "model.attention.qk_rope_head_dim"),
    ({"attention": {"dropout": 1.0}}, "model.attention.dropout"),
    ({"position": {"rotary_dim": 2}}, "model.position.rotary_dim"),
    ({"position": {"rotary_fraction": 0.5}}, "model.position.rotary_fraction"),
    ({"position": {"scaling": {"original_context": None}}}, "model.position.scaling.original_context"),
    ({"position": {"scaling": {"factor": 0.5}}}, "model.position.scaling.factor"),
    ({"position": {"scaling": {"beta_fast": 2.0}}}, "model.position.scaling.beta_fast"),
    ({"position": {"scaling": {"beta_slow": 0.0, "beta_fast": 1.0}}}, "model.position.scaling.beta_slow"),
    ({"position": {"scaling": {"mscale": -1.0, "mscale_all_dim": 1.0}}}, "model.position.scaling.mscale"),
    ({"position": {"scaling": {"mscale": 1.0}}}, "model.position.scaling.mscale_all_dim"),
    ({"position": {"scaling": {"mscale_all_dim": 1.0}}}, "model.position.scaling.mscale"),
    ({"position": {"theta": 1.0}}, "model.position.theta"),
    (
        {"position": {"scaling": {"kind": "linear", "mscale": 1.0, "mscale_all_dim": 1.0}}},
        "model.position.scaling.mscale",
    ),
]


@pytest.mark.parametrize("overrides,field", REFUSED, ids=[f for _, f in REFUSED])
def test_each_refused_setting_names_its_field(overrides, field):
    with pytest.raises(ConfigError) as error:
        validate(tiny(**overrides))
    assert error.value.field == field


# ---- latent_norm_eps: the latent norms' own eps (MiniCPM3's 1e-6 beside rms_norm_eps 1e-5)

NANO_MLA = [
    "model=nano",
    "model/attention=mla",
    "model/position=rope",
    "model.attention.kv_lora_rank=16",
    "model.attention.q_lora_rank=16",
    "model.attention.qk_nope_head_dim=8",
    "model.attention.qk_rope_head_dim=8",
    "model.attention.v_head_dim=8",
    "model.vocab_size=96",
]


def test_latent_norm_eps_sets_the_latent_norms_and_moves_the_logits():
    cfg = compose_model([*NANO_MLA, "model.attention.latent_norm_eps=10.0"])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    attn = model.blocks[0].attn
    assert (attn.q_norm.eps, attn.kv_norm.eps) == (10.0, 10.0)
    assert model.blocks[0].attn_norm.eps == cfg.norm.eps  # the block's norms keep model.norm.eps
    check_changes_logits(model, changed_cfg(cfg, attention__latent_norm_eps=None), "latent_norm_eps")


@pytest.mark.parametrize(
    "overrides",
    [
        [*NANO_MLA, "model.attention.latent_norm_eps=0.0"],
        [*NANO_MLA, "model.attention.latent_norm_eps=-1e-6"],
    ],
)
def test_latent_norm_eps_is_validated(overrides):
    with pytest.raises(ConfigError) as err:
        build_model(compose_model(overrides), device="meta")
    assert err.value.field == "model.attention.latent_norm_eps"
