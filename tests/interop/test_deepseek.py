"""Hugging Face parity of DeepSeek-V2 and DeepSeek-V3 (archlab/interop/families/deepseek.py): multi-head
latent attention (low-rank queries or none) with YaRN, over a mixture of experts with shared experts, a
dense first layer and a routed scale; V3's sigmoid routing with a correction bias and expert groups.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), norm scales 0.5 + N(0, 0.3²), V3's
correction bias N(0, 0.3²), which changes the experts chosen (checked), as the expert groups do) give the
same float32 logits in archlab and in transformers' eager attention and experts, from HF to archlab and
from each shrunk preset to HF; every MoE layer routes every token to the same experts with the same
weights; archlab -> HF -> archlab gives back every tensor bit for bit; greedy decoding (padded batches too)
equals HF ``generate``; a save_pretrained directory (stacked experts, the correction bias) loads; what each
cannot hold is refused both ways, naming the field; their latent norms are at 1e-6 whatever
``rms_norm_eps`` says."""

import math

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import compose_model
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=3, num_attention_heads=4, **NO_TOKENS)
MLA = dict(kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12, num_key_value_heads=4)
# YaRN over 8 rotated dims, base 100, original context 64: the ramp runs over pairs 0-4, so pair 0 keeps
# its frequency, pairs 1-3 are blended (1/4, 1/2, 3/4 interpolated) and none is fully divided by the factor
YARN = dict(rope_type="yarn", rope_theta=100.0, factor=4.0, original_max_position_embeddings=64, beta_fast=4.0)
YARN["beta_slow"] = 0.25
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "deepseek_v2-yarn": (
        "DeepseekV2ForCausalLM",
        "DeepseekV2Config",
        dict(
            SMALL,
            **MLA,
            q_lora_rank=None,
            intermediate_size=96,
            moe_intermediate_size=32,
            n_routed_experts=6,
            num_experts_per_tok=2,
            n_shared_experts=2,
            first_k_dense_replace=1,
            routed_scaling_factor=1.5,
            rope_parameters=dict(YARN, mscale=0.707, mscale_all_dim=0.707),
        ),
    ),
    "deepseek_v3-yarn-groups": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        dict(
            SMALL,
            **MLA,
            q_lora_rank=24,
            intermediate_size=96,
            moe_intermediate_size=32,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            first_k_dense_replace=1,
            n_group=4,
            topk_group=2,
            routed_scaling_factor=2.5,
            # cos/sin x1.04, scores x1.23²; the ramp's ends as computed (pairs 0.81 to 3.22, not 0 to 4)
            rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=0.8, truncate=False),
        ),
    ),
    "deepseek_v3-halves-tied": (
        "DeepseekV3ForCausalLM",
        "DeepseekV3Config",
        dict(
            SMALL,
            **MLA,
            q_lora_rank=None,
            intermediate_size=96,
            moe_intermediate_size=32,
            n_routed_experts=4,
            num_experts_per_tok=2,
            n_shared_experts=1,
            first_k_dense_replace=0,
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            rope_interleave=False,
            rope_parameters=dict(rope_type="default", rope_theta=500.0),
            tie_word_embeddings=True,
        ),
    ),
}
TINY = ["model.vocab_size=96", "model.context_length=64", "model.n_layer=3", "model.mlp.d_ff=96"]
MLA_SIZES = [
    "model.d_model=64",
    "model.attention.n_head=4",
    "model.attention.kv_lora_rank=16",
    "model.attention.qk_nope_head_dim=8",
    "model.attention.qk_rope_head_dim=8",
    "model.attention.v_head_dim=12",
    "model.mlp.expert_d_ff=32",
    "model.layers.first=[dense]",
    "model.position.scaling.original_context=16",
    "model.position.scaling.factor=4.0",  # the context over the original one, as transformers expects
]
# case -> (preset, the HF class it maps to, sizes): each preset shrunk, its routing and RoPE kept
PRESET_CASES = {
    "deepseek-v2-lite": (
        "deepseek-v2-lite",
        "DeepseekV2ForCausalLM",
        [*MLA_SIZES, "model.mlp.routing.n_experts=6", "model.mlp.routing.top_k=2"],
    ),
    "deepseek-v3": (
        "deepseek-v3",
        "DeepseekV3ForCausalLM",
        [
            *MLA_SIZES,
            "model.attention.q_lora_rank=24",
            "model.mlp.routing.n_experts=8",
            "model.mlp.routing.top_k=3",
            "model.mlp.routing.n_groups=4",
            "model.mlp.routing.top_groups=2",
        ],
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES, impl=EAGER))


def test_from_hf_reads_the_family_s_parts():
    v2 = from_hf(hf_model("deepseek_v2-yarn")).cfg
    assert (v2.attention.kind, v2.attention.q_lora_rank, v2.position.pairing) == ("mla", None, "interleaved")
    assert (
        v2.mlp.routing.scoring,
        v2.mlp.n_shared_experts,
        v2.mlp.routing.routed_scale,
        v2.mlp.routing.normalize_top_k,
    ) == ("softmax", 2, 1.5, False)
    p = v2.position.scaling
    assert (p.kind, p.factor, p.original_context, p.beta_fast, p.beta_slow, p.mscale, p.mscale_all_dim) == (
        "yarn",
        4.0,
        64,
        4.0,
        0.25,
        0.707,
        0.707,
    )
    assert p.truncate is True  # absent: transformers' default
    v3 = from_hf(hf_model("deepseek_v3-yarn-groups")).cfg
    assert v3.position.scaling.truncate is False
    assert (
        v3.attention.q_lora_rank,
        v3.mlp.routing.scoring,
        v3.mlp.routing.correction_bias,
        v3.mlp.routing.n_groups,
        v3.mlp.routing.top_groups,
    ) == (24, "sigmoid", True, 4, 2)
    halves = from_hf(hf_model("deepseek_v3-halves-tied")).cfg
    kinds = parity.mlp_kinds(halves)
    assert (halves.position.pairing, halves.position.scaling.kind, halves.head.tied, "moe" in kinds) == (
        "half",
        "none",
        True,
        True,
    )
    assert "swiglu" not in kinds  # first_k_dense_replace 0: no dense layer
    assert parity.mlp_kinds(v2)[0] == "swiglu"  # first_k_dense_replace 1


@pytest.mark.parametrize("case", list(HF_CASES))
def test_every_token_is_routed_as_hf_routes_it(case):
    """In every MoE layer, the experts archlab's forward chooses for every token (from its own hidden
    states) are HF's, and on HF's hidden states its router gives HF's weights."""
    parity.check_routed_as_hf(hf_model(case, seed=8))


def test_deepseek_v3_s_correction_bias_and_groups_change_the_choice():
    """The routing test above could not tell a dropped correction bias or ignored groups: here each
    changes some token's experts."""
    hf = hf_model("deepseek_v3-yarn-groups", seed=8)
    model = from_hf(hf)
    x = torch.randn(64, model.cfg.d_model, generator=torch.Generator().manual_seed(9))
    for _, moe in parity.moe_layers(hf, model):
        with torch.no_grad():
            chosen = moe.route(x)[2].sort(dim=-1).values
            bias = moe.router_bias.clone()
            moe.router_bias.zero_()
            unbiased = moe.route(x)[2].sort(dim=-1).values
            moe.router_bias.copy_(bias)
            moe.n_groups = 1
            ungrouped = moe.route(x)[2].sort(dim=-1).values
            moe.n_groups = 4
        assert not torch.equal(chosen, unbiased)
        assert not torch.equal(chosen, ungrouped)


@pytest.mark.parametrize("case", ["deepseek_v3-yarn-groups"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout (the
    stacked experts and the correction bias stored and read back)."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **EAGER)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model=deepseek-v2-lite", "model.layers.kinds.dense.mlp.kind=geglu"], "model.layers.kinds.dense.mlp.kind"),
        (["model=deepseek-v3", "+model.layers.kinds.dense.mlp.d_ff=64"], "model.layers.kinds.dense.mlp.d_ff"),
        (
            ["model=deepseek-v2-lite", "model.mlp.routing.n_groups=8", "model.mlp.routing.top_groups=4"],
            "model.mlp.routing.n_groups",
        ),
        (["model=deepseek-v2-lite", "model.mlp.routing.normalize_top_k=true"], "model.mlp.routing.normalize_top_k"),
        (["model=deepseek-v2-lite", "model.position.pairing=half"], "model.position.pairing"),
        (["model=deepseek-v2-lite", "model.mlp.n_shared_experts=0"], "model.mlp.n_shared_experts"),
        (["model=deepseek-v2-lite", "model.norm.eps=1e-5"], "model.attention.latent_norm_eps"),  # latents at 1e-6
        (["model=deepseek-v2-lite", "model/mlp=swiglu"], "model.mlp.kind"),
        (["model=deepseek-v2-lite", "model.attention.window=128"], "model.attention.window"),
        (["model=deepseek-v3", "model.mlp.routing.correction_bias=false"], "model.mlp.routing.correction_bias"),
        (["model=deepseek-v3", "model.mlp.routing.scoring=softmax"], "model.mlp.routing.scoring"),
        (["model=deepseek-v3", "model/position=alibi"], "model.position.kind"),
        (
            [
                "model=deepseek-v3",
                "model.position.scaling.kind=linear",
                "model.position.scaling.mscale=null",
                "model.position.scaling.mscale_all_dim=null",
            ],
            "model.position.scaling.kind",
        ),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(overrides, field):
    parity.check_refuses(lambda: config_to_hf(compose_model(overrides)), field, "Hugging Face")


@pytest.mark.parametrize(
    "case, changes, field",
    [
        (
            "deepseek_v2-yarn",
            dict(topk_method="group_limited_greedy", n_group=2, topk_group=1),
            "DeepseekV2Config.topk_method",
        ),
        ("deepseek_v2-yarn", dict(norm_topk_prob=True), "DeepseekV2Config.norm_topk_prob"),
        ("deepseek_v2-yarn", dict(mlp_bias=True), "DeepseekV2Config.mlp_bias"),
        ("deepseek_v2-yarn", dict(attention_bias=True), "DeepseekV2Config.attention_bias"),
        ("deepseek_v2-yarn", dict(n_shared_experts=0), "DeepseekV2Config.n_shared_experts"),
        ("deepseek_v3-yarn-groups", dict(scoring_func="softmax"), "DeepseekV3Config.scoring_func"),
        ("deepseek_v3-yarn-groups", dict(num_key_value_heads=2), "DeepseekV3Config.num_key_value_heads"),
        (
            "deepseek_v3-yarn-groups",
            dict(rope_parameters=dict(YARN, mscale_all_dim=0.8)),
            "DeepseekV3Config.rope_parameters.mscale_all_dim",
        ),
        (
            "deepseek_v3-yarn-groups",
            dict(rope_parameters=dict(YARN, truncate="no")),
            "DeepseekV3Config.rope_parameters.truncate",
        ),
        (
            "deepseek_v3-yarn-groups",
            dict(rope_parameters=dict(YARN, attention_factor=1.5)),
            "DeepseekV3Config.rope_parameters.attention_factor",
        ),
        (
            "deepseek_v3-yarn-groups",
            dict(rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0)),
            "DeepseekV3Config.rope_parameters.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


def test_yarn_attention_factor_that_transformers_would_derive_is_read():
    """An explicit attention_factor equal to the one derived from factor and the mscales is no change."""
    derived = (0.1 * 1.0 * math.log(4.0) + 1) / (0.1 * 0.8 * math.log(4.0) + 1)
    config = parity.hf_config(
        HF_CASES, "deepseek_v3-yarn-groups", rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=0.8)
    )
    with_factor = parity.hf_config(
        HF_CASES,
        "deepseek_v3-yarn-groups",
        rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=0.8, attention_factor=derived),
    )
    assert config_from_hf(with_factor) == config_from_hf(config)


@pytest.mark.parametrize("eps, latent", [(1e-6, None), (1e-5, 1e-6)])
def test_deepseek_reads_any_rms_norm_eps(eps, latent):
    """DeepSeek-V3's latent norms are at 1e-6 whatever rms_norm_eps says: latent_norm_eps 1e-6 beside
    another eps, null beside 1e-6 (its presets' spelling); written back as the rms_norm_eps it read."""
    keys = dict(
        HF_SIZES,
        num_hidden_layers=1,
        num_attention_heads=4,
        num_key_value_heads=4,
        n_routed_experts=4,
        num_experts_per_tok=2,
        n_group=1,
        topk_group=1,
    )
    cfg = config_from_hf(transformers.DeepseekV3Config(**keys, rms_norm_eps=eps))
    assert (cfg.norm.eps, cfg.attention.latent_norm_eps) == (eps, latent)
    FAMILIES["deepseek_v3"].check(cfg)
    assert FAMILIES["deepseek_v3"].to_hf(cfg)["rms_norm_eps"] == eps
