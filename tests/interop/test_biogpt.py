"""Hugging Face parity of BioGPT (archlab/interop/families/biogpt.py): pre-norm LayerNorm blocks, token
embeddings scaled by √d_model, OPT's learned positions (two leading rows no token reads), biases.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives HF eager's float32
logits; its layout maps back to the family; archlab -> HF -> archlab gives back every tensor bit for bit; a
save_pretrained directory loads; what the record cannot hold is refused both ways, naming the field."""

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
    "biogpt": ("BioGptForCausalLM", "BioGptConfig", dict(HF, intermediate_size=96)),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "biogpt", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_from_hf_gives_hf_logits_maps_back_and_loads_saved",)))


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(activation_dropout=0.1), "BioGptConfig.activation_dropout"),
        (dict(layerdrop=0.1), "BioGptConfig.layerdrop"),
    ],
)
def test_from_hf_refuses_what_the_record_cannot_hold(change, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "biogpt", **change)), field)


def test_the_record_refuses_a_layout_it_cannot_hold():
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "biogpt")), norm__eps=1e-6)
    parity.check_family_refuses("biogpt", cfg, "model.norm.eps")
