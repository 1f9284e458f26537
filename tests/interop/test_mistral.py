"""Hugging Face parity of Mistral (archlab/interop/families/llama.py, model_type mistral): LLaMA's layout with
one sliding window on every layer.

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has
it; sequences longer than every window of 4) gives the same float32 logits in archlab and in transformers'
eager implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF
``generate``; what the family cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, GQA, SMALL, WINDOW

from archlab import compose_model
from archlab.interop.hf import from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "mistral": ("MistralForCausalLM", "MistralConfig", dict(SMALL, num_key_value_heads=2, sliding_window=WINDOW)),
}

# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    "mistral-7b": ("mistral-7b", "MistralForCausalLM", [*GQA, f"model.attention.window={WINDOW}"]),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    mistral = from_hf(hf_model("mistral")).cfg
    assert (mistral.attention.window, parity.windows(mistral)) == (WINDOW, [WINDOW] * 2)


@pytest.mark.parametrize(
    "overrides, field",
    [
        # windows of two sizes route to Mistral (one window on every layer of it): it holds no layers
        (
            ["model=mistral-7b", "model/layers=every_other_global", "+model.layers.kinds.global.attention.window=8"],
            "model.layers.pattern",
        ),
        (
            ["model=mistral-7b", "model.attention.qkv_bias=true", "model.attention.out_bias=true"],
            "model.attention.qkv_bias",
        ),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    parity.check_routed_family_refuses("mistral", compose_model(overrides), field)
