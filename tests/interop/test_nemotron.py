"""Hugging Face parity of Nemotron (archlab/interop/families/nemotron.py): a squared-ReLU up/down MLP, the
(1 + w) LayerNorm with a bias (LayerNorm1P, tests/test_norms.py), partial RoPE, attention and MLP biases.

A tiny random model (GQA; every parameter redrawn: matrices N(0, 0.2²), biases and norm scales
0.5 + N(0, 0.3²)) gives the same float32 logits in archlab and in transformers' eager attention; greedy
decoding (a padded batch too) equals HF ``generate``; archlab -> HF -> archlab gives back every tensor bit
for bit; a save_pretrained directory loads; a pre-norm (1 + w) LayerNorm layout with RoPE and a plain MLP
exports to it; what the family cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import build_model, compose_model
from archlab.interop.hf import config_from_hf, from_hf, to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "nemotron": (
        "NemotronForCausalLM",
        "NemotronConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            **NO_TOKENS,
            head_dim=24,
            intermediate_size=96,
            attention_bias=True,
            mlp_bias=True,
            norm_eps=1e-3,
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "nemotron", seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        impl=EAGER,
        only=parity.MAPPED_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    nemotron = from_hf(hf_model()).cfg
    assert (nemotron.norm.kind, nemotron.norm.unit_offset, nemotron.norm.bias, nemotron.mlp.kind) == (
        "layernorm",
        True,
        True,
        "relu2",
    )
    assert (nemotron.position.rotary_fraction, nemotron.attention.head_dim) == (0.5, 24)


def test_the_layout_picks_the_family():
    """A pre-norm (1 + w) LayerNorm with RoPE and a plain MLP."""
    overrides = ["model.n_layer=2", "model.d_model=64", "model.attention.n_head=4", "model=pythia-160m"]
    overrides += ["model.block.kind=pre", "model/mlp=relu2", "model.norm.unit_offset=true"]
    assert type(to_hf(build_model(compose_model(overrides)))).__name__ == "NemotronForCausalLM"


def test_config_to_hf_refuses_what_the_family_cannot_hold():
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, norm__bias=False)
    parity.check_family_refuses("nemotron", cfg, "model.norm.bias")


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "nemotron", hidden_act="swish")
    parity.check_refuses(lambda: config_from_hf(config), "NemotronConfig.hidden_act")
