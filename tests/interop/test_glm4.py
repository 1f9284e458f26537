"""Hugging Face parity of GLM-4 (archlab/interop/families/glm4.py): four norms per block (sandwich), half of
each head of 24 rotated pairing adjacent dims, q/k/v biases, grouped heads.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1) gives the same float32 logits in archlab and in transformers' eager implementation;
archlab -> HF -> archlab gives back every tensor bit for bit; greedy decoding, alone and in a left-padded
batch, equals HF ``generate``; a save_pretrained directory loads; an archlab layout exports to it; what it
cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, LLAMA, SMALL

from archlab import compose_model
from archlab.interop.hf import config_from_hf
from archlab.nn.validation import validate

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (model class, config class, config keys): half of each head of 24 rotated, q/k/v biases
HF_CASES = {
    "glm4": (
        "Glm4ForCausalLM",
        "Glm4Config",
        dict(
            SMALL,
            num_key_value_heads=2,
            head_dim=24,
            rope_parameters=dict(rope_type="default", rope_theta=10000.0, partial_rotary_factor=0.5),
        ),
    ),
}
# the archlab layout GLM-4 holds, and only it among the converted families
LAYOUT = [
    *LLAMA,
    "model/block=sandwich",
    "model.position.pairing=interleaved",
    "model.position.rotary_fraction=0.5",
    "model.attention.qkv_bias=true",
]


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "glm4", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        generation_seed=3,
        only=parity.AND_BACK_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    glm = config_from_hf(parity.hf_config(HF_CASES, "glm4"))
    assert (glm.block.kind, glm.position.pairing, glm.position.rotary_fraction, glm.attention.head_dim) == (
        "sandwich",
        "interleaved",
        0.5,
        24,
    )
    assert (glm.attention.qkv_bias, glm.attention.out_bias, glm.mlp.bias, glm.attention.n_kv_head) == (
        True,
        False,
        False,
        2,
    )


def test_save_pretrained_directory_round_trip(tmp_path):
    parity.check_directory_round_trip(hf_model(seed=4), tmp_path, **ATTN)


def test_an_archlab_layout_exports_to_the_family_that_holds_it():
    parity.check_exports(compose_model(LAYOUT), "Glm4ForCausalLM", "glm4", seed=6, **ATTN)


def test_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "glm4", rope_parameters=dict(rope_type="dynamic", rope_theta=1e4, factor=2.0))
    parity.check_refuses(lambda: config_from_hf(config), "Glm4Config.rope_parameters.rope_type")


def test_the_family_refuses_what_it_cannot_hold():
    cfg = validate(compose_model([*LAYOUT, "model.attention.out_bias=true"]))
    parity.check_family_refuses("glm4", cfg, "model.attention.out_bias")
