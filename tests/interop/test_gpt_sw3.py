"""Hugging Face parity of GPT-SW3 (archlab/interop/families/aliases.py, model_type gpt-sw3): GPT-2's class and
layout under its own model_type: an alias, whose layout exports as GPT-2.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives the same float32
logits in archlab and in transformers' eager implementation; its layout exports to GPT-2's class, and this
record still writes its own config class with the same logits and reads back bit for bit; its save_pretrained
directory (its own tensor names) loads."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, V

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "gpt-sw3": (
        "GPT2LMHeadModel",
        "GPT2Config",
        dict(model_type="gpt-sw3", vocab_size=V, n_positions=64, n_embd=64, n_layer=2, n_head=4, **NO_TOKENS),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "gpt-sw3", seed, **ATTN)


def test_the_family_converts_both_ways(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "gpt2", **ATTN)
