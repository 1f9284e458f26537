"""Hugging Face parity of ERNIE 4.5, dense (archlab/interop/families/ernie.py, model_type ernie4_5): biases
on every projection, RoPE pairing adjacent dims, grouped heads.

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

# case -> (model class, config class, config keys): biases on every projection
HF_CASES = {
    "ernie4_5": (
        "Ernie4_5ForCausalLM",
        "Ernie4_5Config",
        dict(SMALL, num_key_value_heads=2, head_dim=16, use_bias=True),
    )
}
# the archlab layout ERNIE 4.5 holds, and only it among the converted families
LAYOUT = [
    *LLAMA,
    "model.position.pairing=interleaved",
    "model.attention.qkv_bias=true",
    "model.attention.out_bias=true",
    "model.mlp.bias=true",
]


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "ernie4_5", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        generation_seed=3,
        only=parity.AND_BACK_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    ernie = config_from_hf(parity.hf_config(HF_CASES, "ernie4_5"))
    assert (ernie.position.pairing, ernie.attention.qkv_bias, ernie.attention.out_bias, ernie.mlp.bias) == (
        "interleaved",
        True,
        True,
        True,
    )


def test_save_pretrained_directory_round_trip(tmp_path):
    parity.check_directory_round_trip(hf_model(seed=4), tmp_path, **ATTN)


def test_an_archlab_layout_exports_to_the_family_that_holds_it():
    parity.check_exports(compose_model(LAYOUT), "Ernie4_5ForCausalLM", "ernie4_5", seed=6, **ATTN)


def test_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "ernie4_5", rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5))
    parity.check_refuses(lambda: config_from_hf(config), "Ernie4_5Config.rope_parameters.partial_rotary_factor")


@pytest.mark.parametrize(
    "overrides, field",
    [(["model.mlp.bias=false"], "model.mlp.bias"), (["model.attention.dropout=0.1"], "model.attention.dropout")],
)
def test_the_family_refuses_what_it_cannot_hold(overrides, field):
    parity.check_family_refuses("ernie4_5", validate(compose_model([*LAYOUT, *overrides])), field)
