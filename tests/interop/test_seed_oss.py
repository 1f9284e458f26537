"""Hugging Face parity of Seed-OSS (archlab/interop/families/relatives.py): LLaMA's relative with q/k/v and
output biases, MLP biases and a residual dropout apart from the embeddings'.

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
    "seed_oss": (
        "SeedOssForCausalLM",
        "SeedOssConfig",
        dict(SMALL, head_dim=16, num_key_value_heads=2, attention_out_bias=True, mlp_bias=True, residual_dropout=0.1),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "seed_oss", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
# a layout of dropout at the attention's rate is Emu3's too, which is listed first (both hold the same model)
globals().update(parity.family_tests(hf_model, only=("test_the_family_converts_both_ways",), family="emu3_text_model"))


def test_the_record_reads_the_family_s_parts():
    s = from_hf(hf_model()).cfg
    assert (s.attention.qkv_bias, s.attention.out_bias, s.dropout, s.embedding_dropout) == (True, True, 0.1, 0.0)


def test_the_record_refuses_a_layout_it_cannot_hold():
    """The record's problems name the archlab field."""
    parity.check_problem(
        "seed_oss",
        config_from_hf(parity.hf_config(HF_CASES, "seed_oss")),
        "model.embedding_dropout",
        embedding_dropout=0.1,
    )
