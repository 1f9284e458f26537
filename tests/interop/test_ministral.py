"""Hugging Face parity of Ministral and Ministral 3 (archlab/interop/families/ministral.py): Ministral's
sliding and full layers by layer_types; Ministral 3's one window on every layer, transformers' generic YaRN
with mscales that differ (so cos and sin are scaled, the softmax not) and queries scaled by position from
position 8.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1; grouped heads; sequences longer than the windows of 4) give the same float32 logits in
archlab and in transformers' eager implementation; archlab -> HF -> archlab gives back every tensor bit
for bit; greedy decoding, alone and in a left-padded batch, equals HF ``generate``; save_pretrained
directories load; archlab layouts export to each; what each cannot hold is refused both ways, naming the
field."""

import math

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, GQA, SMALL, TINY, WINDOW

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf
from archlab.nn.mixers.attention import softmax_scale
from archlab.nn.validation import validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

S, F = "sliding_attention", "full_attention"
# transformers' generic YaRN as Ministral 3 publishes it, shrunk: a 4x longer context than 8 positions,
# mscales that differ, and queries scaled by 1 + 0.3·log(1 + ⌊p / 8⌋)
YARN = dict(
    rope_type="yarn",
    rope_theta=10000.0,
    factor=4.0,
    original_max_position_embeddings=8,
    max_position_embeddings=32,
    beta_fast=8.0,
    beta_slow=1.0,
    mscale=1.0,
    mscale_all_dim=0.5,
    llama_4_scaling_beta=0.3,
)
# case -> (model class, config class, config keys)
HF_CASES = {
    # sliding, full, sliding
    "ministral": (
        "MinistralForCausalLM",
        "MinistralConfig",
        dict(
            SMALL,
            num_key_value_heads=2,
            head_dim=16,
            num_hidden_layers=3,
            sliding_window=WINDOW,
            layer_types=[S, F, S],
        ),
    ),
    "ministral3": (
        "Ministral3ForCausalLM",
        "Ministral3Config",
        dict(SMALL, num_key_value_heads=2, head_dim=16, sliding_window=WINDOW, rope_parameters=YARN),
    ),
}
MISTRAL = ["model=mistral-7b", *TINY, *GQA]
# an archlab layout -> the class that holds it (and only it, among the converted families)
LAYOUT_CASES = {
    "ministral": (
        [*MISTRAL, "model.n_layer=3", "model/layers=every_other_global", f"model.attention.window={WINDOW}"],
        "MinistralForCausalLM",
    ),
    "ministral3": (
        [
            *MISTRAL,
            f"model.attention.window={WINDOW}",
            "model.attention.query_scale_beta=0.2",
            "model.attention.query_scale_length=8",
            "model.attention.query_scale_by=position",
            "model/position=yarn",
            "model.position.scaling.factor=4.0",
            "model.position.scaling.original_context=8",
            "model.position.scaling.mscale=0.8",
            "model.position.scaling.mscale_all_dim=0.6",
            "model.position.scaling.softmax_mscale=false",
        ],
        "Ministral3ForCausalLM",
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        generation_seed=3,
        only=parity.AND_BACK_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    ministral = config_from_hf(parity.hf_config(HF_CASES, "ministral"))
    assert (ministral.layers.first, ministral.layers.pattern) == ([], ["local", "global"])
    assert ministral.layers.kinds["local"] == {"attention": {"window": WINDOW}}
    assert (ministral.attention.window, ministral.attention.qkv_bias, ministral.attention.out_bias) == (
        None,
        False,
        False,
    )
    m3 = config_from_hf(parity.hf_config(HF_CASES, "ministral3"))
    p, a = m3.position.scaling, m3.attention
    assert (p.kind, p.factor, p.original_context, p.mscale, p.mscale_all_dim, p.softmax_mscale) == (
        "yarn",
        4.0,
        8,
        1.0,
        0.5,
        False,
    )
    assert (a.window, a.query_scale_beta, a.query_scale_length, a.query_scale_offset, a.query_scale_by) == (
        WINDOW,
        0.3,
        8,
        0,
        "position",
    )
    # Ministral 3 without the query scale (β 0) and with its mscales equal: cos, sin and softmax unscaled
    plain = config_from_hf(
        parity.hf_config(
            HF_CASES, "ministral3", rope_parameters=dict(YARN, llama_4_scaling_beta=0.0, mscale_all_dim=1.0)
        )
    )
    assert plain.attention.query_scale_beta is None
    assert softmax_scale(plain) == 1 / math.sqrt(16)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_save_pretrained_directory_round_trip(case, tmp_path):
    parity.check_directory_round_trip(hf_model(case, seed=4), tmp_path, **ATTN)


@pytest.mark.parametrize("case", list(LAYOUT_CASES))
def test_an_archlab_layout_exports_to_the_family_that_holds_it(case):
    overrides, hf_class = LAYOUT_CASES[case]
    parity.check_exports(compose_model(overrides), hf_class, case, seed=6, **ATTN)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("ministral", dict(layer_types=[S, "chunked_attention", S]), "MinistralConfig.layer_types"),
        (
            "ministral3",
            dict(rope_parameters=dict(YARN, llama_4_scaling_beta=-0.1)),
            "Ministral3Config.rope_parameters.llama_4_scaling_beta",
        ),
        ("ministral3", dict(rope_parameters=dict(YARN, truncate="yes")), "Ministral3Config.rope_parameters.truncate"),
    ],
)
def test_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


@pytest.mark.parametrize(
    "case, overrides, field",
    [
        ("ministral", ["+model.layers.kinds.global.attention.window=8"], "model.layers.kinds.global.attention.window"),
        ("ministral3", ["model.attention.query_scale_offset=1"], "model.attention.query_scale_offset"),
        ("ministral3", ["model.attention.query_scale_length=16"], "model.attention.query_scale_length"),
        ("ministral3", ["model.attention.query_scale_by=index"], "model.attention.query_scale_by"),
        ("ministral3", ["model.position.scaling.softmax_mscale=true"], "model.position.scaling.softmax_mscale"),
    ],
)
def test_each_family_refuses_what_it_cannot_hold(case, overrides, field):
    parity.check_family_refuses(case, validate(compose_model([*LAYOUT_CASES[case][0], *overrides])), field)


def test_config_to_hf_writes_ministral3_s_query_scale_and_yarn():
    cfg = compose_model(LAYOUT_CASES["ministral3"][0])
    rope = config_to_hf(cfg).rope_parameters
    assert (rope["llama_4_scaling_beta"], rope["original_max_position_embeddings"], rope["mscale_all_dim"]) == (
        0.2,
        8,
        0.6,
    )
