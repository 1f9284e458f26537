"""Hugging Face parity of GPT-Neo (archlab/interop/families/gpt_neo.py): GPT-2's pre-norm LayerNorm blocks with
bias-free q/k/v, unscaled scores, local layers of a window (4, under the 12 tokens) alternating with global
ones.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives HF eager's float32
logits; its layout maps back to the family; archlab -> HF -> archlab gives back every tensor bit for bit; a
save_pretrained directory loads; greedy decoding, alone and in a left-padded batch, equals HF ``generate``;
what the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF = dict(
    vocab_size=96, hidden_size=64, max_position_embeddings=64, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS
)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # local layers of window 4 < the 12 tokens, alternating with global ones
    "gpt_neo": (
        "GPTNeoForCausalLM",
        "GPTNeoConfig",
        dict(
            HF,
            num_layers=2,
            num_heads=4,
            intermediate_size=96,
            window_size=4,
            attention_types=[[["local", "global"], 1]],
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "gpt_neo", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_from_hf_gives_hf_logits_maps_back_and_loads_saved",)))


def test_greedy_and_padded_generation_match_hf_generate():
    parity.check_generation(hf_model(seed=4))


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "gpt_neo", attention_types=[[["local", "sparse"], 1]])
    parity.check_refuses(lambda: config_from_hf(config), "GPTNeoConfig.attention_types")


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "gpt_neo")), attention__scale=None)
    parity.check_family_refuses("gpt_neo", cfg, "model.attention.scale")
