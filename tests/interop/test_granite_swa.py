"""Hugging Face parity of Granite SWA (archlab/interop/families/granite_variants.py): Granite's multipliers over
sliding RoPE layers with attention sinks and global NoPE ones (layer_rope_theta 0), MQA.

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
MULTIPLIERS = dict(embedding_multiplier=3.0, residual_multiplier=0.4, attention_multiplier=0.3)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "granite_swa": (
        "GraniteSWAForCausalLM",
        "GraniteSWAConfig",
        dict(
            SMALL,
            num_key_value_heads=1,
            **MULTIPLIERS,
            logits_scaling=8.0,
            sliding_window=WINDOW,
            layer_types=TYPES,
            layer_rope_theta=[5e4, 0],
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "granite_swa", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        only=parity.BOTH_WAYS_TESTS,
    )
)


def test_the_record_reads_the_family_s_parts():
    w = from_hf(hf_model()).cfg
    assert (w.attention.sinks, w.head.logit_scale, w.layers.pattern) == (True, 0.125, ["local", "global"])
    assert (w.position.theta, w.layers.kinds["global"]) == (5e4, {"position": {"kind": "none"}})


def test_from_hf_refuses_what_the_record_cannot_hold():
    config = parity.hf_config(HF_CASES, "granite_swa", layer_rope_theta=[5e4, 1e4])
    parity.check_refuses(lambda: config_from_hf(config), "GraniteSWAConfig.layer_rope_theta")


def test_the_record_refuses_a_layout_it_cannot_hold():
    """The record's problems name the archlab field."""
    parity.check_problem(
        "granite_swa",
        config_from_hf(parity.hf_config(HF_CASES, "granite_swa")),
        "model.attention.sinks",
        attention__sinks=False,
    )
