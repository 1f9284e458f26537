"""Hugging Face parity of Youtu-LLM (archlab/interop/families/mla.py, model_type youtu): multi-head latent
attention (its latents normed at 1e-6) over a dense gated MLP, with YaRN.

A tiny random model (every parameter and correction bias redrawn; GQA where the family has it) gives HF
eager's float32 logits in archlab; archlab -> HF -> archlab gives back every tensor bit for bit; a
save_pretrained directory loads and saves again; greedy decoding, alone and in a left-padded batch, equals HF
``generate``; what the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
MLA_SIZES = dict(kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rms_norm_eps=1e-6)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "youtu": (
        "YoutuForCausalLM",
        "YoutuConfig",
        dict(
            SMALL,
            **MLA_SIZES,
            num_key_value_heads=4,
            intermediate_size=96,
            q_lora_rank=32,
            rope_parameters=dict(
                rope_type="yarn",
                rope_theta=10000.0,
                factor=4.0,
                original_max_position_embeddings=16,
                mscale=1.0,
                mscale_all_dim=1.0,
            ),
        ),
    )
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "youtu", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF -> archlab logits and the family the layout maps to; HF -> archlab -> HF -> archlab bit for bit;
    a save_pretrained directory through load_hf_dir and save_hf_dir back."""
    parity.check_converts_both_ways(hf_model(), tmp_path, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_generation_matches_hf_generate",)))


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "youtu", attention_bias=True)
    parity.check_refuses(lambda: config_from_hf(config), "YoutuConfig.attention_bias")


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(mlp__bias=True), "model.mlp.bias"),
        (dict(norm__eps=1e-5), "model.attention.latent_norm_eps"),  # its latents at 1e-6
    ],
)
def test_records_refuse_layouts_they_cannot_hold(fields, field):
    parity.check_family_refuses("youtu", parity.changed_cfg(from_hf(hf_model()).cfg, **fields), field)
