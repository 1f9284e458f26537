"""Hugging Face parity of EXAONE 3 (archlab/interop/families/aliases.py): LLaMA's class and layout (MQA) under
its own config class: an alias, whose layout exports as LLaMA.

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
HF_CASES = {"exaone": ("LlamaForCausalLM", "ExaoneConfig", dict(SMALL, head_dim=16, num_key_value_heads=1))}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "exaone", seed, **ATTN)


def test_the_family_converts_both_ways(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "llama", **ATTN)
