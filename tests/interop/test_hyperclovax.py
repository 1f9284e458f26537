"""Hugging Face parity of HyperCLOVA X (archlab/interop/families/granite_variants.py): Granite's multipliers over
a sandwich block (four norms), heads of 8, attention biases.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives the same float32
logits in archlab and in transformers' eager implementation; archlab -> HF -> archlab is bit for bit; a
save_pretrained directory loads and saves again; what the record cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

MULTIPLIERS = dict(embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.3)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "hyperclovax": (
        "HyperCLOVAXForCausalLM",
        "HyperCLOVAXConfig",
        dict(SMALL, num_key_value_heads=2, head_dim=8, **MULTIPLIERS, logits_scaling=0.3, attention_bias=True),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "hyperclovax", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_the_family_converts_both_ways",)))


def test_the_record_reads_the_family_s_parts():
    x = from_hf(hf_model()).cfg
    assert (x.block.kind, x.attention.head_dim, x.attention.scale, x.head.logit_scale) == ("sandwich", 8, 0.3, 0.3)


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "hyperclovax", logits_scaling=-1.0)
    parity.check_refuses(lambda: config_from_hf(config), "HyperCLOVAXConfig.logits_scaling")


def test_the_record_refuses_a_layout_it_cannot_hold():
    """The record's problems name the archlab field."""
    parity.check_problem(
        "hyperclovax",
        config_from_hf(parity.hf_config(HF_CASES, "hyperclovax")),
        "model.block.kind",
        block__kind="post_sublayer",
    )
