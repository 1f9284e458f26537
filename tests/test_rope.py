"""RoPE's frequency scaling (archlab/nn/rope.py): YaRN's ``softmax_mscale``, against the softmax scale
written out here, its validation and a short fit; the scaling's ``attention_factor`` (LongRoPE's and
YaRN's), against transformers' Phi3RotaryEmbedding and YaRN's derived factor, and its validation."""

import math
from typing import cast

import pytest
import torch
from helpers import hf as parity
from helpers.hf import SMALL, randomize
from helpers.parts import short_fit, tiny

from archlab import ConfigError, build_model
from archlab.interop.hf import config_from_hf
from archlab.nn.mixers.attention import softmax_scale
from archlab.nn.rope import RoPE, RoPERotation
from archlab.nn.validation import validate

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
