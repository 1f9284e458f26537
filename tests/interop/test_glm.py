"""Hugging Face parity of GLM (v1) (archlab/interop/families/relatives.py): LLaMA's relative rotating half of
each head, pairing adjacent dims, with q/k/v biases.

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
HF_CASES = {"glm": ("GlmForCausalLM", "GlmConfig", dict(SMALL, head_dim=16, num_key_value_heads=2))}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "glm", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_the_family_converts_both_ways",)))


def test_the_record_reads_the_family_s_parts():
    g = from_hf(hf_model()).cfg
    assert (g.block.kind, g.position.pairing, g.position.rotary_fraction, g.attention.out_bias) == (
        "pre",
        "interleaved",
        0.5,
        False,
    )


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "glm", rope_parameters=dict(rope_type="yarn", rope_theta=1e4, factor=2.0))
    parity.check_refuses(lambda: config_from_hf(config), "GlmConfig.rope_parameters.rope_type")
