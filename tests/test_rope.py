"""RoPE's frequency scaling (archlab/nn/rope.py): YaRN's ``softmax_mscale``, against the softmax scale
written out here, its validation and a short fit."""

import math

import pytest
from helpers import hf as parity
from helpers.hf import randomize
from helpers.parts import short_fit, tiny

from archlab import ConfigError, build_model
from archlab.nn.mixers.attention import softmax_scale
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
