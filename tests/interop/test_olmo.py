"""Hugging Face parity of OLMo 1 (archlab/interop/families/olmo.py): LLaMA's layout with a LayerNorm that
learns nothing (``model.norm.affine`` false: tests/test_norms.py checks the part itself) and q, k and v
clipped (``clip_qkv``).

A tiny random model (every weight redrawn: biases far from 0; GQA) gives the same float32 logits in archlab
and in transformers' eager implementation, on 12 tokens and 24; archlab -> HF -> archlab is bit for bit;
greedy decoding, alone and in a left-padded batch, equals HF ``generate``; a save_pretrained directory
loads; an archlab layout exports to OLMo; what it cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, IDS, LLAMA, LONG_IDS, SMALL, TOL, logits, max_diff

from archlab import compose_model, count_params
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF_CASES = {
    "olmo": ("OlmoForCausalLM", "OlmoConfig", dict(SMALL, num_key_value_heads=2, clip_qkv=0.8, attention_bias=True)),
}
LAYOUT = [*LLAMA, "model/norm=layernorm", "model.norm.affine=false", "model.attention.clip_qkv=0.5"]


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "olmo", seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        ids=(IDS, LONG_IDS),
        only=parity.ONE_MODEL_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    o = from_hf(hf_model()).cfg
    assert (o.norm.kind, o.norm.affine, o.norm.eps, o.attention.clip_qkv) == ("layernorm", False, 1e-5, 0.8)
    assert count_params(o)["norms"] == count_params(o)["final_norm"] == 0


def test_an_archlab_layout_exports_to_its_family_and_back_bit_for_bit():
    model, hf = parity.check_exports(compose_model(LAYOUT), "OlmoForCausalLM", **ATTN)
    assert max_diff(logits(model, LONG_IDS), logits(hf, LONG_IDS)) <= TOL


@pytest.mark.parametrize(
    "overrides, field",
    [(["model.norm.eps=1e-6"], "model.norm.eps"), (["model.norm.affine=true"], "model.norm.affine")],
)
def test_the_family_refuses_what_it_cannot_hold(overrides, field):
    cfg = compose_model([*LAYOUT, *overrides])
    assert field in [p.field for p in FAMILIES["olmo"].problems(cfg)]
    parity.check_family_refuses("olmo", cfg, field)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    rope = {"rope_type": "linear", "rope_theta": 1e4, "factor": 2.0, "partial_rotary_factor": 0.5}
    config = parity.hf_config(HF_CASES, "olmo", rope_parameters=rope)
    parity.check_refuses(lambda: config_from_hf(config), "OlmoConfig.rope_parameters.partial_rotary_factor")
