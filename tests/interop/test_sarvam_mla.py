"""Hugging Face parity of Sarvam MLA (archlab/interop/families/mla.py, model_type sarvam_mla): multi-head latent
attention over DeepSeek-V3's mixture of experts with groups, in DeepSeek-V3's class, RoPE pairing halves; its
layout is DeepSeek-V3's, which exports it.

A tiny random model (every parameter and correction bias redrawn; GQA where the family has it) gives HF
eager's float32 logits in archlab; its layout exports to DeepSeek-V3's family, and this record still holds it:
its own class, built from the archlab model by this record's config and tensor maps, gives the same logits and
reads back bit for bit; a save_pretrained directory loads; what the record cannot hold is refused both ways,
naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
MLA_SIZES = dict(kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rms_norm_eps=1e-6)
MOE_SIZES = dict(intermediate_size=96, moe_intermediate_size=32, num_experts_per_tok=2)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "sarvam_mla": (
        "DeepseekV3ForCausalLM",
        "SarvamMLAConfig",
        dict(
            SMALL,
            **MLA_SIZES,
            **MOE_SIZES,
            n_routed_experts=8,
            n_shared_experts=1,
            n_group=2,
            topk_group=1,
            rope_interleave=False,
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "sarvam_mla", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit
    (through this record's own class: the layout maps to another family); a save_pretrained directory
    through load_hf_dir."""
    parity.check_converts_both_ways(hf_model(), tmp_path, "deepseek_v3", **EAGER)
