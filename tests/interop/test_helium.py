"""Hugging Face parity of Helium (archlab/interop/families/relatives.py): LLaMA's relative with RoPE pairing
adjacent dims, q/k/v and MLP biases and no output bias.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives the same float32
logits in archlab and in transformers' eager implementation; archlab -> HF -> archlab is bit for bit; a
save_pretrained directory loads and saves again; what the record cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "helium": (
        "HeliumForCausalLM",
        "HeliumConfig",
        dict(SMALL, head_dim=16, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "helium", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_the_family_converts_both_ways",)))


def test_the_record_reads_the_family_s_parts():
    h = from_hf(hf_model()).cfg
    assert (h.position.pairing, h.attention.qkv_bias, h.attention.out_bias, h.mlp.bias) == (
        "interleaved",
        True,
        False,
        True,
    )


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "helium", rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5))
    parity.check_refuses(lambda: config_from_hf(config), "HeliumConfig.rope_parameters.partial_rotary_factor")


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(position__pairing="half"), "model.position.pairing"),
        (dict(attention__out_bias=True), "model.attention.out_bias"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    """The record's problems name the archlab field."""
    parity.check_problem("helium", config_from_hf(parity.hf_config(HF_CASES, "helium")), field, **change)
