"""Hugging Face parity of Solar Open (archlab/interop/families/sigmoid_moe.py, model_type solar_open): a
sigmoid-routed mixture of experts with a correction bias, groups and a shared expert under LLaMA-style
attention with biases; its layout is GLM-4.5's (glm4_moe), which exports it.

A tiny random model (every parameter and correction bias redrawn; GQA where the family has it) gives HF
eager's float32 logits in archlab; its layout exports to GLM-4.5's (glm4_moe) family, and this record still
holds it: its own class, built from the archlab model by this record's config and tensor maps, gives the same
logits and reads back bit for bit; a save_pretrained directory loads; what the record cannot hold is refused
both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "solar_open": (
        "SolarOpenForCausalLM",
        "SolarOpenConfig",
        dict(
            SMALL,
            num_key_value_heads=2,
            head_dim=16,
            moe_intermediate_size=32,
            num_experts_per_tok=2,
            n_routed_experts=6,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            routed_scaling_factor=1.5,
            attention_bias=True,
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "solar_open", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "glm4_moe", **EAGER)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "solar_open", rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5))
    parity.check_refuses(lambda: config_from_hf(config), "SolarOpenConfig.rope_parameters.partial_rotary_factor")


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(attention__out_bias=True), "model.attention.out_bias"),
        (dict(attention__qk_norm="head"), "model.attention.qk_norm"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(fields, field):
    parity.check_family_refuses("solar_open", parity.changed_cfg(from_hf(hf_model()).cfg, **fields), field)
