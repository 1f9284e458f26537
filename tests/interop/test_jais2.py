"""Hugging Face parity of Jais 2 (archlab/interop/families/relatives.py): LLaMA's relative with LayerNorms with a
bias, a squared-ReLU MLP with biases and an output bias.

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
HF_CASES = {"jais2": ("Jais2ForCausalLM", "Jais2Config", dict(SMALL, head_dim=16, num_key_value_heads=2))}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "jais2", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_the_family_converts_both_ways",)))


def test_the_record_reads_the_family_s_parts():
    j = from_hf(hf_model()).cfg
    assert (j.norm.kind, j.norm.bias, j.mlp.kind, j.mlp.bias, j.attention.out_bias) == (
        "layernorm",
        True,
        "relu2",
        True,
        True,
    )


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "jais2", hidden_act="silu")
    parity.check_refuses(lambda: config_from_hf(config), "Jais2Config.hidden_act")


def test_the_record_refuses_a_layout_it_cannot_hold():
    """The record's problems name the archlab field."""
    parity.check_problem(
        "jais2", config_from_hf(parity.hf_config(HF_CASES, "jais2")), "model.norm.bias", norm__bias=False
    )
