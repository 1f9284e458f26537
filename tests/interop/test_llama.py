"""Hugging Face parity of LLaMA with RoPE scaling (archlab/interop/families/llama.py): Llama 3.1's and linear
RoPE scaling, MQA with attention and MLP biases (tests/interop/test_hf.py shows the conversion machinery on
LLaMA itself).

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²), far
from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has it;
sequences longer than every window of 4) give the same float32 logits in archlab and in transformers' eager
implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab gives
back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF ``generate``; what
the family cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, GQA, SMALL

from archlab import compose_model
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # original context 32: of the 8 wavelengths of a 16-dim head (2π·10⁴^(i/8)), 6.3 is kept, 19.9 blended and the six from 62.8 on divided by the factor
    "llama-llama3-scaling": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            SMALL,
            num_key_value_heads=2,
            rope_parameters={
                "rope_type": "llama3",
                "rope_theta": 10000.0,
                "factor": 8.0,
                "low_freq_factor": 1.0,
                "high_freq_factor": 4.0,
                "original_max_position_embeddings": 32,
            },
        ),
    ),
    "llama-linear-scaling-biases": (
        "LlamaForCausalLM",
        "LlamaConfig",
        dict(
            SMALL,
            num_key_value_heads=1,
            attention_bias=True,
            mlp_bias=True,
            rope_parameters={"rope_type": "linear", "rope_theta": 10000.0, "factor": 2.0},
        ),
    ),
}

# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    "llama3.1-8b": ("llama3.1-8b", "LlamaForCausalLM", [*GQA, "model.position.scaling.original_context=32"]),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    p = from_hf(hf_model("llama-llama3-scaling")).cfg.position.scaling
    assert (p.kind, p.factor, p.low_freq_factor, p.high_freq_factor, p.original_context) == (
        "llama3",
        8.0,
        1.0,
        4.0,
        32,
    )
    linear = from_hf(hf_model("llama-linear-scaling-biases")).cfg
    assert (linear.position.scaling.kind, linear.mlp.bias) == ("linear", True)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model=llama3.1-8b", "model.dropout=0.1"], "model.dropout"),
        (["model=llama3.1-8b", "model.position.rotary_dim=64"], "model.position.rotary_dim"),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    parity.check_routed_family_refuses("llama", compose_model(overrides), field)


@pytest.mark.parametrize(
    "case, changes, field",
    [
        (
            "llama-llama3-scaling",
            dict(rope_parameters={"rope_type": "yarn", "rope_theta": 1e4, "factor": 2.0}),
            "LlamaConfig.rope_parameters.rope_type",
        ),
        (
            "llama-llama3-scaling",
            dict(rope_parameters={"rope_type": "default", "rope_theta": 1e4, "partial_rotary_factor": 0.5}),
            "LlamaConfig.rope_parameters.partial_rotary_factor",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)
