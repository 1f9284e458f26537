"""Hugging Face parity of DeepSeek-V3.2 and GLM-5 (archlab/interop/families/deepseek_v32.py, model_types
deepseek_v32 and glm_moe_dsa): DeepSeek-V3's layout whose latent attention keeps the keys a lightning
indexer picks (archlab's ``dsa``); V3.2's indexer rotates halves beside its mla's interleaved pairs, GLM-5's
interleaved pairs.

Tiny random models (every parameter and buffer redrawn: the indexer's projections and LayerNorm, the
correction biases) over 12 tokens, each query keeping 4 keys, give HF eager's float32 logits in archlab;
the choice is sparse and matters (checked: more keys give other logits); archlab -> HF -> archlab is bit for
bit; greedy and left-padded decoding equal HF ``generate``; a save_pretrained directory loads; the shrunk
preset exports; what each cannot hold is refused both ways, naming the field."""

import copy

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import compose_model
from archlab.config.layers import layer_configs, layer_kind
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=4, **NO_TOKENS)
MLA = dict(q_lora_rank=24, kv_lora_rank=16, qk_nope_head_dim=8, qk_rope_head_dim=8, v_head_dim=12)
# 16 indexer heads of 16 (8 rotated). A key whose every head's relu is 0 scores exactly 0, and two such keys at
# the top-4 boundary tie: archlab gives a tie to the earlier key, HF's topk as its kernel happens to order
# them. Randomised LayerNorm biases make the keys alike, so with 8 heads a seed in 10 tied (0.57 apart);
# with 16, none of 30 seeds of either case did (at most 3.4e-6 apart)
INDEXER = dict(index_n_heads=16, index_head_dim=16, index_topk=4)
MOE = dict(intermediate_size=96, moe_intermediate_size=32, n_routed_experts=8, num_experts_per_tok=3)
MOE |= dict(n_shared_experts=1, first_k_dense_replace=1, routed_scaling_factor=2.5)
YARN = dict(rope_type="yarn", rope_theta=100.0, factor=4.0, original_max_position_embeddings=16, beta_fast=4.0)
YARN |= dict(beta_slow=0.25, mscale=1.0, mscale_all_dim=0.8)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "deepseek_v32-yarn-groups": (
        "DeepseekV32ForCausalLM",
        "DeepseekV32Config",
        dict(SMALL, **MLA, **INDEXER, **MOE, n_group=4, topk_group=2, rope_parameters=YARN),
    ),
    "glm_moe_dsa": (
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaConfig",
        dict(
            SMALL,
            **MLA,
            **INDEXER,
            **MOE,
            n_group=1,
            topk_group=1,
            rms_norm_eps=1e-5,  # GLM-5's; its latent norms stay at 1e-6
            rope_parameters=dict(rope_type="default", rope_theta=500.0),
        ),
    ),
    # layer 2 keeps layer 1's choice (dsa's index_shared), layer 0 dense
    "glm_moe_dsa-shared": (
        "GlmMoeDsaForCausalLM",
        "GlmMoeDsaConfig",
        dict(
            SMALL,
            **MLA,
            **INDEXER,
            **MOE,
            n_group=1,
            topk_group=1,
            indexer_types=["full", "full", "shared"],
            rope_parameters=dict(rope_type="default", rope_theta=500.0),
        ),
    ),
}
TINY_MLA = [
    "model.d_model=64",
    "model.attention.n_head=4",
    "model.attention.q_lora_rank=24",
    "model.attention.kv_lora_rank=16",
    "model.attention.qk_nope_head_dim=8",
    "model.attention.qk_rope_head_dim=8",
    "model.attention.v_head_dim=12",
    "model.attention.index_n_heads=16",
    "model.attention.index_head_dim=16",
    "model.attention.index_topk=4",
    "model.mlp.expert_d_ff=32",
    "model.mlp.routing.n_experts=8",
    "model.mlp.routing.top_k=3",
    "model.mlp.routing.n_groups=4",
    "model.mlp.routing.top_groups=2",
    "model.layers.first=[dense]",
    "model.position.scaling.original_context=16",
    "model.position.scaling.factor=4.0",
]
# the preset shrunk, and with the indexer's pairs interleaved: GLM-5's layout
PRESET_CASES = {
    "deepseek-v3.2-exp": ("deepseek-v3.2-exp", "DeepseekV32ForCausalLM", TINY_MLA),
    "glm-5-layout": (
        "deepseek-v3.2-exp",
        "GlmMoeDsaForCausalLM",
        [*TINY_MLA, "model.attention.index_pairing=interleaved"],
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        PRESET_CASES,
        impl=EAGER,
        only=(
            "test_from_hf_gives_hf_logits",
            "test_hf_to_archlab_to_hf_and_back",
            "test_archlab_to_hf_to_archlab_is_bit_identical",
            "test_greedy_generation_matches_hf_generate",
            "test_padded_batch_generation_matches_hf_generate",
            "test_save_pretrained_directories_round_trip",
            "test_correction_bias_changes_the_experts_chosen",
        ),
    )
)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_reads_the_indexer(case):
    cfg = from_hf(hf_model(case)).cfg
    a = cfg.attention
    pairing = "half" if case.startswith("deepseek") else "interleaved"
    assert (a.kind, a.index_n_heads, a.index_head_dim, a.index_topk, a.index_pairing) == ("dsa", 16, 16, 4, pairing)
    assert (cfg.position.pairing, a.q_lora_rank) == ("interleaved", 24)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_the_choice_is_sparse_and_matters(case):
    """The same weights keeping every key (index_topk 12) give other logits than keeping 4: the parity above
    compared sparse attention, not a dense one."""
    model = from_hf(hf_model(case))
    dense = parity.changed_cfg(model.cfg, attention__index_topk=12)
    parity.check_changes_logits(model.eval(), dense, "index_topk")


@pytest.mark.parametrize("case", list(HF_CASES))
def test_the_indexer_pairs_matter(case):
    """V3.2's indexer read with GLM-5's pairs (and the reverse) gives other logits."""
    model = from_hf(hf_model(case))
    other = "interleaved" if model.cfg.attention.index_pairing == "half" else "half"
    parity.check_changes_logits(model.eval(), parity.changed_cfg(model.cfg, attention__index_pairing=other))


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.attention.q_lora_rank=null"], "model.attention.q_lora_rank"),
        (["model.position.pairing=half"], "model.position.pairing"),
        (["model.attention.window=8"], "model.attention.window"),
        (["model.norm.eps=1e-5"], "model.attention.latent_norm_eps"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(overrides, field):
    cfg = compose_model(["model=deepseek-v3.2-exp", *overrides])
    parity.check_refuses(lambda: config_to_hf(cfg), field, "Hugging Face")


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("deepseek_v32-yarn-groups", dict(attention_bias=True), "DeepseekV32Config.attention_bias"),
        ("deepseek_v32-yarn-groups", dict(num_key_value_heads=2), "DeepseekV32Config.num_key_value_heads"),
        (
            "deepseek_v32-yarn-groups",
            dict(mlp_layer_types=["sparse", "dense", "sparse"]),
            "DeepseekV32Config.mlp_layer_types",
        ),
        ("glm_moe_dsa", dict(indexer_types=["shared", "full", "full"]), "GlmMoeDsaConfig.indexer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


def test_the_indexer_loss_weight_is_not_layout():
    """A model trained with another index_loss_weight exports as the same HF config."""
    cfg = compose_model(["model=deepseek-v3.2-exp"])
    other = compose_model(["model=deepseek-v3.2-exp", "model.attention.index_loss_weight=0.25"])
    assert config_to_hf(other).to_dict() == config_to_hf(cfg).to_dict()


def test_glm5_reads_its_shared_layers_and_deepseek_v32_refuses_them():
    """GLM-5's indexer_types "shared" is a layer kind of dsa's index_shared, written back as it was read;
    the parity above held its logits, and the shared layer's choice moves them (seeing every key instead);
    DeepSeek-V3.2, whose layers each run an indexer, refuses the kind's field."""
    from archlab.interop.families import FAMILIES
    from archlab.nn.mixers.shared_index import SharedChoice

    model = from_hf(hf_model("glm_moe_dsa-shared")).eval()
    layers = layer_configs(model.cfg)
    assert [lc.attention.index_shared for lc in layers] == [False, False, True]
    assert [lc.mlp.kind for lc in layers] == ["swiglu", "moe", "moe"]
    assert config_to_hf(model.cfg).indexer_types == ["full", "full", "shared"]
    other = copy.deepcopy(model)
    vars(other.blocks[2].attn)["choice_source"] = SharedChoice()
    assert parity.max_diff(parity.logits(model), parity.logits(other)) > 1e-3
    kind = layer_kind(model.cfg, 2)
    v32 = parity.changed_cfg(model.cfg, attention__index_pairing="half")  # V3.2's indexer pairs
    parity.check_family_refuses("deepseek_v32", v32, f"model.layers.kinds.{kind}.attention.index_shared")
    assert FAMILIES["glm_moe_dsa"].problems(model.cfg) == []
