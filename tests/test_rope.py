"""RoPE (archlab/nn/rope.py) and its frequency scaling, each against an independent expression and, where
one converts it, transformers' own code: Llama 3.1's and linear scaling's frequencies; LongRoPE (Phi-3), its
short and long frequencies and attention factor, the factors picked per forward, KV-cache decoding across its
switch, its validation, the short factors held at every length with two attention factors (PhiMoE's), ``reads`` and lists fitted to the layers that rotate, the Hugging Face families'
refusals and a short fit; YaRN's ``softmax_mscale``; the scaling's ``attention_factor`` (LongRoPE's and
YaRN's). ALiBi and the other schemes: tests/test_positions.py."""

from __future__ import annotations

import dataclasses
import math
from typing import cast

import pytest
import torch
from helpers import hf as parity
from helpers.hf import SMALL, families_of_its_mixers, randomize
from helpers.parts import F64, LONG, LONGROPE, SHORT, build, check_fits, longrope, nano, plain, short_fit, tiny

from archlab import ConfigError, build_model, compose_model
from archlab.config import POSITION_OPTIONS, to_model_config
from archlab.generate import generate
from archlab.interop.hf import config_from_hf
from archlab.nn.mixers.attention import softmax_scale
from archlab.nn.rope import RoPE, RoPERotation, attention_factor, inverse_frequencies
from archlab.nn.validation import ignored, validate

pytestmark = pytest.mark.usefixtures("single_thread")

# ---- Llama 3.1's and linear scaling


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
    cfg = plain(position={"kind": "rope", "theta": 500000.0, "scaling": {"kind": "llama3", "factor": 8.0, "original_context": 8192}}, attention={"n_head": 1, "head_dim": 128})  # fmt: skip
    got = inverse_frequencies(cfg.position, 128)
    expected = [llama3_frequency(i, 128, 500000.0, 8.0, 1.0, 4.0, 8192) for i in range(64)]
    torch.testing.assert_close(got, torch.tensor(expected, dtype=torch.float32), rtol=1e-5, atol=0)
    unscaled = inverse_frequencies(plain(position={"kind": "rope", "theta": 500000.0}).position, 128)
    assert got[0] == unscaled[0] and torch.isclose(got[-1], unscaled[-1] / 8)  # high kept, low divided by 8
    linear = inverse_frequencies(
        plain(position={"kind": "rope", "scaling": {"kind": "linear", "factor": 4.0}}).position, 8
    )
    torch.testing.assert_close(linear, 1 / 10000.0 ** (torch.arange(0, 8, 2) / 8) / 4)


def test_linear_rope_scaling_interpolates_positions():
    """Scaled by 4, position p is rotated by the angles the unscaled scheme gives position p / 4."""
    scaled = build(plain(position={"kind": "rope", "scaling": {"kind": "linear", "factor": 4.0}})).position
    unscaled = build(plain(position={"kind": "rope"})).position
    pos = torch.arange(0, 32, 4)
    a, b = scaled.rotary(pos, F64), unscaled.rotary(pos // 4, F64)
    torch.testing.assert_close((a.cos, a.sin), (b.cos, b.sin))


# ---- LongRoPE (Phi-3)


def hf_longrope(seq_len):
    """transformers' inverse frequencies and attention factor for LONGROPE's settings (Phi-3's config)."""
    from transformers import Phi3Config
    from transformers.modeling_rope_utils import _compute_longrope_parameters

    c = Phi3Config(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                   original_max_position_embeddings=16, rope_parameters={"rope_type": "longrope",
                   "rope_theta": 10000.0, "short_factor": SHORT, "long_factor": LONG})  # fmt: skip
    return c, _compute_longrope_parameters(c, None, seq_len=seq_len)


def test_longrope_frequencies_and_attention_factor():
    """Short and long inverse frequencies equal transformers' exactly and 1 / (factor_i · θ^(2i/d)) in
    float64; the attention factor is sqrt(1 + ln 4 / ln 16) (factor = 64 / 16, Phi-3's default)."""
    p = nano("rope", **LONGROPE).position
    for long, seq_len, factors in ((False, 16, SHORT), (True, 17, LONG)):
        _, (hf_inv, hf_factor) = hf_longrope(seq_len)
        got = inverse_frequencies(p, 16, long=long)
        assert torch.equal(got, hf_inv)
        hand = torch.tensor([1 / (f * 10000.0 ** (2 * i / 16)) for i, f in enumerate(factors)], dtype=F64)
        torch.testing.assert_close(got.double(), hand, rtol=1e-6, atol=0)
        assert attention_factor(p.scaling) == pytest.approx(hf_factor, rel=1e-15)
    assert attention_factor(p.scaling) == pytest.approx(math.sqrt(1 + math.log(4) / math.log(16)))


def test_longrope_picks_factors_per_forward_as_transformers():
    """cos and sin for 16 positions (the short factors) and for 17 (the long ones, every position) equal
    Phi-3's rotary embedding's; in a padded batch each row picks by its own highest position."""
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    c, _ = hf_longrope(None)
    hf, rope = Phi3RotaryEmbedding(c), RoPE(nano("rope", **LONGROPE))
    x = torch.zeros(1, dtype=torch.float32)
    for T in (16, 17, 30):
        cos, sin = hf(x, torch.arange(T)[None])
        r = rope.rotary(torch.arange(T), torch.float32)
        torch.testing.assert_close(r.cos[:, 0], cos[0, :, :8], rtol=0, atol=2e-7)
        torch.testing.assert_close(r.sin[:, 0], sin[0, :, :8], rtol=0, atol=2e-7)
    rows = torch.stack((torch.arange(20).clamp(max=15), torch.arange(20)))  # highest 15 and 19
    both = rope.rotary(rows, torch.float32)
    for row in range(2):
        alone = rope.rotary(torch.arange(int(rows[row].max()) + 1), torch.float32)
        torch.testing.assert_close(both.cos[row, :16], alone.cos[:16], rtol=0, atol=0)


def test_longrope_held_short_with_two_mscales_is_transformers_phimoe_s():
    """``switch_factors`` false and ``long_attention_factor``: cos and sin for 16 positions (short_mscale) and
    for 17 and 30 (long_mscale, the short factors still) equal PhiMoE's rotary embedding's; by hand, position
    p of pair i turns p / (short_i · θ^(2i/16)) at every length; in a padded batch each row picks its
    mscale by its own highest position."""
    from transformers import PhimoeConfig
    from transformers.models.phimoe.modeling_phimoe import PhimoeRotaryEmbedding

    mscales = dict(short_mscale=1.1, long_mscale=1.4)
    c = PhimoeConfig(hidden_size=64, num_attention_heads=4, num_key_value_heads=4, max_position_embeddings=64,
                     rope_parameters={"rope_type": "longrope", "rope_theta": 10000.0, "short_factor": SHORT,
                     "long_factor": LONG, "original_max_position_embeddings": 16, **mscales})  # fmt: skip
    hf = PhimoeRotaryEmbedding(c)
    rope = RoPE(nano("rope", **longrope(switch_factors=False, attention_factor=1.1, long_attention_factor=1.4)))
    for T, mscale in ((16, 1.1), (17, 1.4), (30, 1.4)):
        cos, sin = hf(torch.zeros(1), torch.arange(T)[None])
        r = cast(RoPERotation, rope.rotary(torch.arange(T), torch.float32))
        torch.testing.assert_close(r.cos[:, 0], cos[0, :, :8], rtol=0, atol=2e-7)
        torch.testing.assert_close(r.sin[:, 0], sin[0, :, :8], rtol=0, atol=2e-7)
        angle = torch.tensor([[p / (f * 10000.0 ** (2 * i / 16)) for i, f in enumerate(SHORT)] for p in range(T)])
        torch.testing.assert_close(r.cos[:, 0].double(), mscale * angle.double().cos(), rtol=0, atol=1e-5)
    rows = torch.stack((torch.arange(20).clamp(max=15), torch.arange(20)))  # highest 15 and 19
    both = cast(RoPERotation, rope.rotary(rows, torch.float32))
    torch.testing.assert_close(both.cos[0, 0, 0, 0], torch.tensor(1.1), rtol=0, atol=0)
    torch.testing.assert_close(both.cos[1, 0, 0, 0], torch.tensor(1.4), rtol=0, atol=0)


def test_long_attention_factor_and_switch_factors_validation_and_reads():
    """long_attention_factor outside longrope, or not positive, and a switch_factors that is not a bool are
    refused naming the field; both are longrope's fields (set under linear: reported unread)."""
    for scaling, field in [
        (dict(kind="linear", factor=2.0, long_attention_factor=1.2), "model.position.scaling.long_attention_factor"),
        ({**LONGROPE["scaling"], "long_attention_factor": 0.0}, "model.position.scaling.long_attention_factor"),
        ({**LONGROPE["scaling"], "switch_factors": "no"}, "model.position.scaling.switch_factors"),
    ]:
        with pytest.raises(ConfigError) as err:
            build_model(nano("rope", scaling=scaling))
        assert err.value.field == field
    assert ignored(nano("rope", **longrope(switch_factors=False, long_attention_factor=1.2))) == []
    names = [i.field for i in ignored(nano("rope", scaling=dict(kind="linear", factor=2.0, switch_factors=False)))]
    assert names == ["model.position.scaling.switch_factors"]


def test_longrope_validation_and_reads():
    with pytest.raises(ConfigError, match=r"model.position.scaling.short_factor.*a list of 8 positive numbers.*16 / 2"):
        build_model(nano("rope", **longrope(short_factor=[1.0, 2.0])))
    with pytest.raises(ConfigError, match="model.position.scaling.long_factor"):
        build_model(nano("rope", **longrope(long_factor=[0.0, *LONG[1:]])))
    with pytest.raises(ConfigError, match="model.position.scaling.original_context"):
        build_model(nano("rope", **longrope(original_context=None)))
    with pytest.raises(ConfigError, match="model.position.scaling.factor"):
        build_model(nano("rope", **longrope(factor=0.5)))
    with pytest.raises(ConfigError, match=r"model.position.scaling.long_factor.*a list of 4 "):
        build_model(nano("rope", rotary_dim=8, **longrope(short_factor=[1, 2, 3, 4])))  # 4 pairs when 8 dims rotate
    assert ignored(nano("rope", **LONGROPE)) == []
    names = [i.field for i in ignored(nano("rope", scaling=dict(kind="linear", short_factor=SHORT, long_factor=LONG)))]
    assert names == ["model.position.scaling.short_factor", "model.position.scaling.long_factor"]


def test_longrope_kv_cache_decoding_equals_the_full_forward_across_the_switch():
    """Greedy decoding with the cache from a 12-token prompt past original_context = 16: at every step
    the logits equal the full forward over the sequence so far (short factors up to 16 tokens, long after,
    the cache re-encoded once); without that re-encoding they would not."""
    torch.manual_seed(0)
    model = build_model(nano("rope", **LONGROPE), dtype=F64).eval()
    seen = []
    hook = model.head.register_forward_hook(lambda m, i, out: seen.append(out[:, -1]))
    prompt = torch.randint(0, 64, (2, 12), generator=torch.Generator().manual_seed(1))
    ids = generate(model, prompt, 10)
    hook.remove()
    assert len(seen) == 10  # prefill, 8 cached steps, one re-encoding at 16 -> 17 tokens
    with torch.no_grad():
        for step, logits in enumerate(seen):
            torch.testing.assert_close(logits, model(ids[:, : 12 + step])[:, -1], rtol=0, atol=1e-12)
        cache = model.new_cache(2, 32)
        model(ids[:, :16], cache)
        stale = model(ids[:, 16:17], cache)[:, -1]
    assert (stale - seen[5]).abs().max() > 1e-5  # short-rotated keys under long-rotated queries: far past rounding


def test_every_hf_family_refuses_longrope():
    """No family with RoPE but Phi-3, MiniCPM3 and PhiMoE converts longrope: each names the field; PhiMoE's
    record holds it with the short factors at every length alone, so names switch_factors."""
    cfg = nano("rope", **LONGROPE)
    fields_of_longrope = {
        "model.position.scaling.kind",
        "model.position.scaling.short_factor",
        "model.position.scaling.long_factor",
    }
    for name, family in families_of_its_mixers(cfg).items():
        fields = {p.field for p in family.problems(cfg)}
        holds_longrope = name in ("phi3", "minicpm3", "phimoe")
        assert fields_of_longrope.isdisjoint(fields) if holds_longrope else fields_of_longrope <= fields, name
        assert ("model.position.scaling.switch_factors" in fields) == (name == "phimoe"), name


def test_longrope_trains():
    """A few AdamW steps on one repeated batch of 32 tokens (past longrope's 16) lower the loss."""
    check_fits(nano("rope", **LONGROPE), 32)


def test_longrope_fits_its_lists_to_no_recurrent_mixer():
    """LongRoPE's lists hold one factor per rotated pair of the layers that rotate. A mamba2 layer kind among
    causal heads of 16 (its state of 6 is no head: no rotation reaches it) leaves them at 8 pairs, where it
    asked for 3; a model whose own mixer is mamba2 rotates nothing, its lists need only agree in length,
    and it runs past original_context (the long factors); lists that disagree are still refused."""
    nano_cfg = ["model=nano", "model.n_layer=4", "model.d_model=64", "model.attention.n_head=4"]
    nano_cfg += ["model.context_length=32", "model.vocab_size=64", "model/layers=mamba2_3_1"]
    hybrid = compose_model([*nano_cfg, "+model.layers.kinds.mamba2.attention.state_size=6"])
    hybrid = dataclasses.replace(hybrid, position=POSITION_OPTIONS.make(kind="rope", **LONGROPE))
    idx = torch.randint(0, 64, (2, 20), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.isfinite(build_model(hybrid).eval()(idx)).all()

    mamba2 = {"kind": "mamba2", "n_head": 2, "state_size": 6, "qkv_bias": False}
    pure = {"vocab_size": 64, "context_length": 32, "n_layer": 2, "d_model": 16, "mlp": {"kind": "none"}}
    pure |= {"attention": mamba2 | {"out_bias": False}}
    lists = longrope(short_factor=[1.0, 1.5], long_factor=[2.0, 3.0])
    cfg = to_model_config(pure | {"position": {"kind": "rope", **lists}})
    with torch.no_grad():
        assert torch.isfinite(build_model(cfg).eval()(idx)).all()
    refused = to_model_config(
        pure | {"position": {"kind": "rope", **longrope(short_factor=[1.0, 1.5], long_factor=[2.0])}}
    )
    with pytest.raises(ConfigError, match=r"model.position.scaling.long_factor.*long_factor as long as short_factor"):
        build_model(refused)


# ---- YaRN's softmax_mscale


def _yarn(**scaling):
    """A tiny model with YaRN (factor 4 over 8 positions) and these fields of its scaling."""
    return tiny(
        vocab_size=96, position=dict(kind="rope", scaling=dict(kind="yarn", factor=4.0, original_context=8, **scaling))
    )


def test_softmax_mscale_says_whether_mscale_all_dim_scales_the_softmax():
    """With mscale_all_dim 0.5 and factor 4 the softmax scale is hd^-0.5 · (0.1 · 0.5 · ln 4 + 1)² (DeepSeek),
    or hd^-0.5 with softmax_mscale false (transformers' generic yarn); the logits differ."""
    deepseek = validate(_yarn(mscale=1.0, mscale_all_dim=0.5))
    generic = validate(_yarn(mscale=1.0, mscale_all_dim=0.5, softmax_mscale=False))
    assert math.isclose(softmax_scale(deepseek), 8**-0.5 * (0.05 * math.log(4) + 1) ** 2, rel_tol=1e-12)
    assert softmax_scale(generic) == 1 / math.sqrt(8)
    model = randomize(build_model(deepseek), seed=2)
    parity.check_changes_logits(model, generic, "softmax_mscale")
    losses = short_fit(build_model(generic), generic.vocab_size, 16)
    assert losses[-1] < 0.9 * losses[0]


@pytest.mark.parametrize(
    "scaling", [dict(softmax_mscale=False), dict(mscale=None, mscale_all_dim=None, softmax_mscale=False)]
)
def test_softmax_mscale_false_needs_yarn_s_mscale_all_dim(scaling):
    cfg = _yarn(**scaling) if "mscale" in scaling else tiny(position=dict(kind="rope", scaling=scaling))
    with pytest.raises(ConfigError) as err:
        validate(cfg)
    assert err.value.field == "model.position.scaling.softmax_mscale"


# ---- the scaling's attention_factor (rope_parameters' attention_factor of LongRoPE and YaRN)


def test_attention_factor_replaces_longrope_s_and_yarn_s():
    """cos and sin times the given factor, short and long alike: transformers' Phi3RotaryEmbedding with
    rope_parameters' attention_factor; YaRN's cos and sin are its own factor's instead of the derived one."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.phi3.modeling_phi3 import Phi3RotaryEmbedding

    longrope = dict(rope_type="longrope", rope_theta=10000.0, partial_rotary_factor=0.5, factor=2.0)
    longrope |= dict(short_factor=[1.0, 1.1, 1.3, 1.7], long_factor=[1.5, 2.5, 4.0, 6.0], attention_factor=1.3)
    keys = dict(SMALL, num_key_value_heads=2, original_max_position_embeddings=16, rope_parameters=longrope)
    c = transformers.Phi3Config(**keys)
    hf = Phi3RotaryEmbedding(c)
    cfg = config_from_hf(c)
    rope = RoPE(cfg)
    for T in (16, 20):
        cos, sin = hf(torch.zeros(1), torch.arange(T)[None])
        r = cast(RoPERotation, rope.rotary(torch.arange(T), torch.float32))
        torch.testing.assert_close(r.cos[:, 0], cos[0, :, :4], rtol=0, atol=1e-6)
        torch.testing.assert_close(r.sin[:, 0], sin[0, :, :4], rtol=0, atol=1e-6)
    assert math.isclose(float(cos[0, 0, 0]), 1.3, rel_tol=1e-6)
    yarn = dict(kind="rope", scaling=dict(kind="yarn", factor=4.0, original_context=16))
    plain = cast(RoPERotation, RoPE(tiny(position=yarn)).rotary(torch.arange(8), torch.float32))
    given = cast(
        RoPERotation,
        RoPE(tiny(position=dict(yarn, scaling=dict(yarn["scaling"], attention_factor=2.0)))).rotary(
            torch.arange(8), torch.float32
        ),
    )
    torch.testing.assert_close(given.cos * (0.1 * math.log(4.0) + 1), plain.cos * 2.0, rtol=1e-6, atol=0)


def test_attention_factor_validation():
    for position, field in [
        (dict(kind="rope", scaling=dict(attention_factor=1.5)), "model.position.scaling.attention_factor"),  # no scaling
        (dict(kind="rope", scaling=dict(kind="yarn", factor=4.0, original_context=16, attention_factor=-1.0)),
         "model.position.scaling.attention_factor"),
    ]:  # fmt: skip
        with pytest.raises(ConfigError) as err:
            build_model(tiny(position=position))
        assert err.value.field == field


# ---- proportional RoPE (turning_fraction)


@pytest.mark.parametrize("fraction, theta", [(0.5, 1e6), (0.25, 1e4), (0.3, 500.0)])
def test_turning_fraction_gives_transformers_proportional_frequencies(fraction, theta):
    """The frequencies of transformers' ``proportional`` rope_type (Gemma 4, LFM3) over a head of 64: the first
    int(fraction · 64 / 2) pairs at theta^(-2i/64), the rest 0 (0.3 · 32 = 9.6: 9 pairs turn)."""
    from transformers import Lfm3Config
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    params = {"rope_type": "proportional", "rope_theta": theta, "partial_rotary_factor": fraction}
    config = Lfm3Config(hidden_size=64, num_attention_heads=1, head_dim=64, rope_parameters={"full_attention": params, "sliding_attention": params})  # fmt: skip
    expected, _ = ROPE_INIT_FUNCTIONS["proportional"](config, layer_type="full_attention")
    position = plain(position={"kind": "rope", "theta": theta, "turning_fraction": fraction}).position
    got = inverse_frequencies(position, 64)
    torch.testing.assert_close(got, expected, rtol=1e-6, atol=0)
    turning = int(fraction * 64 // 2)
    assert (got[turning:] == 0).all() and (got[:turning] > 0).all()
    by_hand = [1 / theta ** (2 * i / 64) for i in range(turning)]
    torch.testing.assert_close(got[:turning], torch.tensor(by_hand, dtype=torch.float32), rtol=1e-6, atol=0)


def test_turning_fraction_leaves_the_still_pairs_unrotated_and_is_validated():
    """Dims of pairs that do not turn come out of the rotation as they went in, at every position; a
    fraction outside (0, 1] is refused naming the field; it is a field rope reads."""
    cfg = nano("rope", turning_fraction=0.5)
    rope = RoPE(cfg)
    rotation = rope.rotary(torch.arange(7), torch.float32)
    x = torch.randn(1, 7, 2, rope.dim, generator=torch.Generator().manual_seed(0))
    y = rotation.rotate(x)
    half, turning = rope.dim // 2, rope.dim // 4
    still = [*range(turning, half), *range(half + turning, rope.dim)]
    assert torch.equal(y[..., still], x[..., still])
    assert not torch.allclose(y[:, 1:, :, :turning], x[:, 1:, :, :turning])
    assert ignored(cfg) == []
    for bad in (0.0, 1.5):
        with pytest.raises(ConfigError, match="model.position.turning_fraction"):
            build_model(nano("rope", turning_fraction=bad))
