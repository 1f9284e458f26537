"""Hugging Face parity of CWM (archlab/interop/families/relatives.py): LLaMA's relative with sliding and full
layers (by layer_types), MLP biases and Llama 3's RoPE scaling; its layout (Ministral's sliding layers with
LLaMA's MLP biases) is SmolLM3's, which comes first in FAMILIES.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives the same float32
logits in archlab and in transformers' eager implementation; its layout exports to SmolLM3's class, and this
record still writes its own config class with the same logits and reads back bit for bit; its save_pretrained
directory (its own tensor names) loads; greedy decoding, alone and in a left-padded batch, equals HF
``generate``; what the record cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WINDOW

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

TYPES = ["sliding_attention", "full_attention"]
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "cwm": (
        "CwmForCausalLM",
        "CwmConfig",
        dict(
            SMALL,
            head_dim=16,
            num_key_value_heads=2,
            mlp_bias=True,
            sliding_window=WINDOW,
            layer_types=TYPES,
            bos_token_id=0,
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "cwm", seed, **ATTN)


def test_the_family_converts_both_ways(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "smollm3", **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_generation_matches_hf_generate",)))


def test_the_record_reads_the_family_s_parts():
    c = from_hf(hf_model()).cfg
    assert (c.position.scaling.kind, c.mlp.bias, c.layers.pattern) == ("llama3", True, ["local", "global"])


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "cwm", layer_types=["full_attention", "chunked_attention"])
    parity.check_refuses(lambda: config_from_hf(config), "CwmConfig.layer_types")


def test_the_record_refuses_a_layout_it_cannot_hold():
    """The record's problems name the archlab field."""
    parity.check_problem(
        "cwm", config_from_hf(parity.hf_config(HF_CASES, "cwm")), "model.attention.qkv_bias", attention__qkv_bias=True
    )
