"""Hugging Face parity of GLM-4-MoE (archlab/interop/families/glm4_moe.py): a sigmoid-routed mixture of
experts with a correction bias, expert groups, two shared experts and a dense first layer, under q/k/v
biases, a per-head QK-norm and partial RoPE.

A tiny random model (GQA; every parameter redrawn: matrices N(0, 0.2²), biases and norm scales
0.5 + N(0, 0.3²), the correction biases N(0, 0.3²)) gives the same float32 logits in archlab and in
transformers' eager attention and experts; zeroing the correction bias moves them; greedy decoding (a
padded batch too) equals HF ``generate``; archlab -> HF -> archlab gives back every tensor bit for bit; a
save_pretrained directory (each expert saved apart) loads; what the family cannot hold is refused both
ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "glm4_moe": (
        "Glm4MoeForCausalLM",
        "Glm4MoeConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            **NO_TOKENS,
            intermediate_size=96,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
            head_dim=24,
            n_routed_experts=6,
            num_experts_per_tok=2,
            n_shared_experts=2,
            n_group=2,
            topk_group=1,
            norm_topk_prob=False,
            routed_scaling_factor=1.5,
            use_qk_norm=True,
            attention_bias=True,
            num_mtp_layers=0,
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "glm4_moe", seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        impl=EAGER,
        only=parity.ROUTED_MOE_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    glm = from_hf(hf_model()).cfg
    assert (glm.attention.qkv_bias, glm.attention.out_bias, glm.attention.head_dim, glm.position.rotary_fraction) == (
        True,
        False,
        24,
        0.5,
    )
    assert (glm.mlp.n_shared_experts, glm.mlp.routing.normalize_top_k, glm.mlp.expert_d_ff, glm.mlp.d_ff) == (
        2,
        False,
        32,
        96,
    )


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(attention__out_bias=True), "model.attention.out_bias"),
        (dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(fields, field):
    parity.check_family_refuses("glm4_moe", parity.changed_cfg(from_hf(hf_model()).cfg, **fields), field)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "glm4_moe", hidden_act="relu")
    parity.check_refuses(lambda: config_from_hf(config), "Glm4MoeConfig.hidden_act")


def test_config_to_hf_names_the_family_s_keys():
    """The config written carries the keys the class reads: the partial rotary and the QK-norm switch."""
    glm = config_to_hf(from_hf(hf_model()).cfg)
    assert (glm.rope_parameters["partial_rotary_factor"], glm.use_qk_norm, glm.head_dim) == (0.5, True, 24)
