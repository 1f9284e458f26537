"""Hugging Face parity of Sarvam MoE (archlab/interop/families/sigmoid_moe.py, model_type sarvam_moe): a
sigmoid-routed mixture of experts with a shared expert and a dense first layer, in GLM-4-MoE's class; its
QK-norm, no biases and full RoPE are dots.llm1's layout, which exports it.

A tiny random model (every parameter and correction bias redrawn; GQA where the family has it) gives HF
eager's float32 logits in archlab; its layout exports to dots.llm1's family, and this record still holds it:
its own class, built from the archlab model by this record's config and tensor maps, gives the same logits and
reads back bit for bit; a save_pretrained directory loads; what the record cannot hold is refused both ways,
naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
MOE_SIZES = dict(intermediate_size=96, moe_intermediate_size=32, num_experts_per_tok=2)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "sarvam_moe": (
        "Glm4MoeForCausalLM",
        "SarvamMoEConfig",
        dict(
            SMALL,
            **MOE_SIZES,
            num_key_value_heads=2,
            head_dim=16,
            n_routed_experts=4,
            n_shared_experts=1,
            first_k_dense_replace=1,
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "sarvam_moe", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "dots1", **EAGER)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "sarvam_moe", n_shared_experts=0)
    parity.check_refuses(lambda: config_from_hf(config), "SarvamMoEConfig.n_shared_experts")
