"""Hugging Face parity of OpenAI's GPT-1 (archlab/interop/families/openai_gpt.py, model_type openai-gpt):
post-norm LayerNorm blocks, learned positions, GPT-2's Conv1D layers with biases.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives HF eager's float32
logits; its layout maps back to the family; archlab -> HF -> archlab gives back every tensor bit for bit; a
save_pretrained directory loads; what the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

GPT = dict(vocab_size=96, n_positions=64, n_embd=64, n_layer=2, n_head=4, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "openai-gpt": ("OpenAIGPTLMHeadModel", "OpenAIGPTConfig", GPT),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "openai-gpt", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_from_hf_gives_hf_logits_maps_back_and_loads_saved",)))


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "openai-gpt", afn="silu")
    parity.check_refuses(lambda: config_from_hf(config), "OpenAIGPTConfig.afn")


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "openai-gpt")), mlp__approximate="none")
    parity.check_family_refuses("openai-gpt", cfg, "model.mlp.approximate")
