"""Hugging Face parity of InternLM3 (archlab/interop/families/aliases.py): LLaMA's class and layout with
attention and MLP biases under its own config class: an alias, whose layout exports as LLaMA.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives the same float32
logits in archlab and in transformers' eager implementation; its layout exports to LLaMA's class, and this
record still writes its own config class with the same logits and reads back bit for bit; its save_pretrained
directory (its own tensor names) loads; what the record cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "internlm3": (
        "LlamaForCausalLM",
        "InternLM3Config",
        dict(SMALL, head_dim=16, num_key_value_heads=2, attention_bias=True, mlp_bias=True),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "internlm3", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, family="llama", only=("test_the_family_converts_both_ways",)))


def test_the_record_refuses_a_layout_it_cannot_hold():
    """The record's problems name the archlab field."""
    parity.check_problem(
        "internlm3", config_from_hf(parity.hf_config(HF_CASES, "internlm3")), "model.mlp.bias", mlp__bias=False
    )
