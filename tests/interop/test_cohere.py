"""Hugging Face parity of Cohere, Command R (archlab/interop/families/cohere.py): a parallel block with one
LayerNorm without a bias, interleaved RoPE, a per-head QK-norm with a scale per head, and a logit scale.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1; GQA) gives the same
float32 logits in archlab and in transformers' eager implementation, on 12 tokens and 24; archlab -> HF ->
archlab is bit for bit; greedy decoding, alone and in a left-padded batch, equals HF ``generate``; a
save_pretrained directory loads; an archlab layout exports to Cohere; what it cannot hold is refused,
naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, GQA, IDS, LONG_IDS, SMALL, TINY, TOL, logits, max_diff

from archlab import compose_model
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF_CASES = {
    "cohere": (
        "CohereForCausalLM",
        "CohereConfig",
        dict(SMALL, num_key_value_heads=2, use_qk_norm=True, logit_scale=0.3, attention_bias=True),
    ),
}
LAYOUT = [
    "model=gptj-6b",
    *TINY,
    *GQA,
    "model.position.rotary_dim=null",
    "model.norm.bias=false",
    "model/mlp=swiglu",
    "model.mlp.bias=false",
    "model.head.bias=false",
    "model.head.logit_scale=0.0625",
    "model.attention.qk_norm=head",
    "model.attention.qk_norm_per_head_scale=true",
]


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "cohere", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        ids=(IDS, LONG_IDS),
        only=parity.ONE_MODEL_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    c = from_hf(hf_model()).cfg
    assert (c.block.kind, c.norm.bias, c.position.pairing, c.head.logit_scale) == (
        "parallel",
        False,
        "interleaved",
        0.3,
    )
    assert (c.attention.qk_norm, c.attention.qk_norm_per_head_scale, c.attention.out_bias) == ("head", True, True)


def test_an_archlab_layout_exports_to_its_family_and_back_bit_for_bit():
    model, hf = parity.check_exports(compose_model(LAYOUT), "CohereForCausalLM", **ATTN)
    assert max_diff(logits(model, LONG_IDS), logits(hf, LONG_IDS)) <= TOL


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.qk_norm_per_head_scale=false"], "model.attention.qk_norm_per_head_scale"),
        (["model.position.pairing=half"], "model.position.pairing"),
    ],
)
def test_the_family_refuses_what_it_cannot_hold(overrides, field):
    cfg = compose_model([*LAYOUT, *overrides])
    assert field in [p.field for p in FAMILIES["cohere"].problems(cfg)]
    parity.check_family_refuses("cohere", cfg, field)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "cohere", logit_scale=0.0)
    parity.check_refuses(lambda: config_from_hf(config), "CohereConfig.logit_scale")
