"""Hugging Face parity of VaultGemma (archlab/interop/families/relatives.py): Gemma 2's relative with a pre-norm
block: (1 + w) RMSNorms, attention and final logit soft-capping, sliding and full layers, MQA.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1) gives the same float32
logits in archlab and in transformers' eager implementation; archlab -> HF -> archlab is bit for bit; a
save_pretrained directory loads and saves again; greedy decoding, alone and in a left-padded batch, equals HF
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
    "vaultgemma": (
        "VaultGemmaForCausalLM",
        "VaultGemmaConfig",
        dict(
            SMALL,
            head_dim=16,
            num_key_value_heads=1,
            query_pre_attn_scalar=8,
            attn_logit_softcapping=5.0,
            final_logit_softcapping=3.0,
            sliding_window=WINDOW,
            layer_types=TYPES,
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "vaultgemma", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        only=parity.BOTH_WAYS_TESTS,
    )
)


def test_the_record_reads_the_family_s_parts():
    v = from_hf(hf_model()).cfg
    assert (v.block.kind, v.norm.unit_offset, v.attention.softcap, v.head.softcap) == ("pre", True, 5.0, 3.0)


def test_the_record_refuses_a_layout_it_cannot_hold():
    """The record's problems name the archlab field."""
    parity.check_problem(
        "vaultgemma",
        config_from_hf(parity.hf_config(HF_CASES, "vaultgemma")),
        "model.block.kind",
        block__kind="sandwich",
    )
