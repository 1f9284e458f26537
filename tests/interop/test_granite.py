"""Hugging Face parity of Granite (archlab/interop/families/granite.py): LLaMA's layout with its four
multipliers (embeddings, residual, attention scores, logits as 1 / logits_scaling) and biases.

A tiny random model (every weight redrawn: biases and norm scales far from 0 and 1; GQA) gives the same
float32 logits in archlab and in transformers' eager implementation, on 12 tokens and 24; archlab -> HF ->
archlab is bit for bit; greedy decoding, alone and in a left-padded batch, equals HF ``generate``; a
save_pretrained directory loads; an archlab layout exports to Granite; what it cannot hold is refused,
naming the field; logits_scaling round-trips as its reciprocal."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, IDS, LLAMA, LONG_IDS, SMALL, TOL, logits, max_diff

from archlab import compose_model
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF_CASES = {
    "granite": (
        "GraniteForCausalLM",
        "GraniteConfig",
        dict(
            SMALL,
            num_key_value_heads=2,
            embedding_multiplier=3.0,
            residual_multiplier=0.4,
            attention_multiplier=0.3,
            logits_scaling=8.0,
            attention_bias=True,
            mlp_bias=True,
        ),
    ),
}
LAYOUT = [
    *LLAMA,
    "model.embedding_multiplier=12.0",
    "model.block.residual_multiplier=0.22",
    "model.attention.scale=0.0078125",
    "model.head.logit_scale=0.125",
]


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "granite", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        ids=(IDS, LONG_IDS),
        only=parity.ONE_MODEL_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    g = from_hf(hf_model()).cfg
    assert (g.embedding_multiplier, g.block.residual_multiplier, g.attention.scale, g.head.logit_scale) == (
        3.0,
        0.4,
        0.3,
        0.125,
    )


def test_an_archlab_layout_exports_to_its_family_and_back_bit_for_bit():
    model, hf = parity.check_exports(compose_model(LAYOUT), "GraniteForCausalLM", **ATTN)
    assert max_diff(logits(model, LONG_IDS), logits(hf, LONG_IDS)) <= TOL


def test_the_family_refuses_what_it_cannot_hold():
    cfg = compose_model([*LAYOUT, "model.head.logit_scale=0.030927835051546393"])  # 1/(1/s) != s
    field = "model.head.logit_scale"
    assert field in [p.field for p in FAMILIES["granite"].problems(cfg)]
    parity.check_family_refuses("granite", cfg, field)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "granite", logits_scaling=49.0)  # 1/(1/49) != 49
    parity.check_refuses(lambda: config_from_hf(config), "GraniteConfig.logits_scaling")


def test_granite_s_logits_scaling_round_trips_as_its_reciprocal():
    """logits_scaling L is held as logit_scale 1/L and written back as 1/(1/L) == L."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, "granite"))
    assert config_to_hf(cfg).logits_scaling == 8.0
    cfg = config_from_hf(parity.hf_config(HF_CASES, "granite", logits_scaling=3.0))
    assert (cfg.head.logit_scale, config_to_hf(cfg).logits_scaling) == (1 / 3.0, 3.0)
