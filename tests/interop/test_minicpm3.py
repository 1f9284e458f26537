"""Hugging Face parity of MiniCPM3 (archlab/interop/families/minicpm3.py): multi-head latent attention over
a dense MLP with embedding, residual and logit multipliers, LongRoPE, and latent norms at 1e-6 beside
``rms_norm_eps`` 1e-5.

A tiny random model (every parameter redrawn) gives HF eager's float32 logits in archlab, exports to its
own family and back bit for bit, and loads from a save_pretrained directory. What the record cannot hold is
refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "minicpm3": (
        "MiniCPM3ForCausalLM",
        "MiniCPM3Config",
        dict(
            HF_SIZES,
            num_hidden_layers=2,
            num_attention_heads=4,
            num_key_value_heads=4,
            intermediate_size=96,
            q_lora_rank=24,
            kv_lora_rank=16,
            qk_nope_head_dim=8,
            qk_rope_head_dim=8,
            v_head_dim=12,
            rms_norm_eps=1e-5,
            scale_emb=12,
            scale_depth=1.4,
            dim_model_base=16,
            rope_parameters=dict(
                rope_type="longrope",
                rope_theta=10000.0,
                factor=8.0,
                original_max_position_embeddings=8,
                short_factor=[1.0, 1.5, 2.0, 3.0],
                long_factor=[2.0, 3.0, 4.0, 5.0],
            ),
            **NO_TOKENS,
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "minicpm3", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF's logits; archlab -> HF -> archlab bit for bit; a save_pretrained directory loads and saves again."""
    hf = hf_model()
    parity.check_back_and_again(hf, parity.check_from_hf(hf), **EAGER)
    parity.check_directory_round_trip(hf, tmp_path, **EAGER)


def test_read_values():
    """The multipliers and the latent eps."""
    cpm = config_from_hf(hf_model().config)
    assert (cpm.embedding_multiplier, cpm.head.logit_scale) == (12.0, 0.25)
    assert cpm.block.residual_multiplier == 1.4 / 2**0.5
    assert (cpm.norm.eps, cpm.attention.latent_norm_eps) == (1e-5, 1e-6)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(mlp_bias=True), "MiniCPM3Config.mlp_bias"),
        (dict(num_key_value_heads=2), "MiniCPM3Config.num_key_value_heads"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "minicpm3", **changes)), field)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(head__logit_scale=0.3), "model.head.logit_scale"),
        (dict(attention__latent_norm_eps=None), "model.attention.latent_norm_eps"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, **fields)
    parity.check_family_refuses("minicpm3", cfg, field)
