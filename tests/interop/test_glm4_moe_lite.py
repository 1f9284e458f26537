"""Hugging Face parity of GLM-4.7-Flash (archlab/interop/families/mla.py, model_type glm4_moe_lite): multi-head
latent attention over DeepSeek-V3's sigmoid-routed mixture of experts; its layout is DeepSeek-V3's, which
exports it.

A tiny random model (every parameter and correction bias redrawn; GQA where the family has it) gives HF
eager's float32 logits in archlab; its layout exports to DeepSeek-V3's family, and this record still holds it:
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
MLA_SIZES = dict(kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rms_norm_eps=1e-6)
MOE_SIZES = dict(intermediate_size=96, moe_intermediate_size=32, num_experts_per_tok=2)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "glm4_moe_lite": (
        "Glm4MoeLiteForCausalLM",
        "Glm4MoeLiteConfig",
        dict(
            SMALL,
            **MLA_SIZES,
            **MOE_SIZES,
            num_key_value_heads=4,
            q_lora_rank=32,
            n_routed_experts=4,
            n_shared_experts=1,
            routed_scaling_factor=1.8,
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "glm4_moe_lite", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "deepseek_v3", **EAGER)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(mlp_layer_types=["sparse", "dense"]), "Glm4MoeLiteConfig.mlp_layer_types"),
        (dict(num_key_value_heads=2), "Glm4MoeLiteConfig.num_key_value_heads"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "glm4_moe_lite", **changes)), field)
