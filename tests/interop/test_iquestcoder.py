"""Hugging Face parity of IQuest-Coder (archlab/interop/families/aliases.py): LLaMA's class and layout with
linear RoPE scaling under its own config class: an alias, whose layout exports as LLaMA.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives the same float32
logits in archlab and in transformers' eager implementation; its layout exports to LLaMA's class, and this
record still writes its own config class with the same logits and reads back bit for bit; its save_pretrained
directory (its own tensor names) loads."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "iquestcoder": (
        "LlamaForCausalLM",
        "IQuestCoderConfig",
        dict(
            SMALL,
            head_dim=16,
            num_key_value_heads=2,
            rope_parameters=dict(rope_type="linear", rope_theta=500000.0, factor=2.0),
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "iquestcoder", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, family="llama", only=("test_the_family_converts_both_ways",)))
