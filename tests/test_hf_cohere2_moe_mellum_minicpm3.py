"""Per-family Hugging Face parity of Cohere2-MoE, Mellum and MiniCPM3, and mla's ``latent_norm_eps``.

Cohere2-MoE: Cohere 2's parallel layers (local RoPE, global NoPE, logit scale) with a top-k MoE, summed
shared experts and a dense first layer that rotates though full (``prefix_dense_sliding_window_pattern`` 1).
Mellum: Qwen3-MoE's layers whose sliding and full layers have their own RoPE bases, a dense layer between
MoE ones. MiniCPM3: multi-head latent attention over a dense MLP with embedding, residual and logit
multipliers, LongRoPE, and latent norms at 1e-6 beside ``rms_norm_eps`` 1e-5.

One tiny random model each (every parameter redrawn; GQA where the family has it; a window of 4 under 12
tokens) gives HF eager's float32 logits in archlab, exports to its own family and back bit for bit, and
loads from a save_pretrained directory; Cohere2-MoE decodes as HF ``generate`` does. What a record cannot
hold is refused both ways, naming the field. ``latent_norm_eps`` moves the logits, is validated, is
refused for causal attention, and DeepSeek's records read any ``rms_norm_eps`` (null where it is 1e-6).
"""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, logits, max_diff

from archlab import ConfigError, build_model, compose_model
from archlab.config.layers import layer_configs
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf, hf_family

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

LAYERS = dict(num_hidden_layers=3, num_attention_heads=4, sliding_window=parity.WINDOW, **NO_TOKENS)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "cohere2_moe": (
        "Cohere2MoeForCausalLM",
        "Cohere2MoeConfig",
        dict(
            HF_SIZES,
            **LAYERS,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=32,
            prefix_dense_intermediate_size=96,
            num_experts=4,
            num_experts_per_tok=2,
            num_shared_experts=2,
            shared_expert_combination_strategy="sum",
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse"],
            attention_bias=True,
            logit_scale=0.3,
            tie_word_embeddings=False,
        ),
    ),
    "mellum": (
        "MellumForCausalLM",
        "MellumConfig",
        dict(
            HF_SIZES,
            **LAYERS,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_experts=4,
            num_experts_per_tok=2,
            layer_types=["sliding_attention", "full_attention", "sliding_attention"],
            mlp_layer_types=["sparse", "dense", "sparse"],
            attention_bias=True,
            norm_topk_prob=False,
            rope_parameters={
                "full_attention": {"rope_type": "default", "rope_theta": 500000.0},
                "sliding_attention": {"rope_type": "default", "rope_theta": 100.0},
            },
        ),
    ),
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


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_family_gives_hf_logits_and_round_trips(case, tmp_path):
    hf = hf_model(case)
    model = from_hf(hf)
    if case != "minicpm3":  # the MoE families: their dense layers where HF builds a dense MLP
        dense = [not hasattr(layer.mlp, "experts") for layer in hf.model.layers]
        assert [lc.mlp.kind != "moe" for lc in layer_configs(model.cfg)] == dense
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == case
    parity.check_back_and_again(hf, model, **EAGER)
    parity.check_directory_round_trip(hf, tmp_path, **EAGER)


def test_read_values():
    """The values each record reads: Cohere2-MoE's rotating dense full layer and logit scale, Mellum's
    local RoPE base beside the global one, MiniCPM3's multipliers and latent eps."""
    cohere = config_from_hf(hf_model("cohere2_moe").config)
    assert [lc.position.kind for lc in layer_configs(cohere)] == ["rope", "rope", "none"]
    assert cohere.head.logit_scale == 0.3
    mellum = config_from_hf(hf_model("mellum").config)
    assert [lc.position.theta for lc in layer_configs(mellum)] == [100.0, 500000.0, 100.0]
    cpm = config_from_hf(hf_model("minicpm3").config)
    assert (cpm.embedding_multiplier, cpm.head.logit_scale) == (12.0, 0.25)
    assert cpm.block.residual_multiplier == 1.4 / 2**0.5
    assert (cpm.norm.eps, cpm.attention.latent_norm_eps) == (1e-5, 1e-6)


def test_cohere2_moe_generation_matches_hf_generate():
    hf = hf_model("cohere2_moe", seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


def _hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("cohere2_moe", dict(shared_expert_combination_strategy="average"), "shared_expert_combination_strategy"),
        ("cohere2_moe", dict(num_experts=0), "num_experts"),
        ("mellum", dict(hidden_act="relu"), "hidden_act"),
        ("mellum", dict(rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e4}}), "rope"),
        ("minicpm3", dict(mlp_bias=True), "mlp_bias"),
        ("minicpm3", dict(num_key_value_heads=2), "num_key_value_heads"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    config = _hf_config(case, **changes)
    with pytest.raises(ConfigError) as err:
        config_from_hf(config)
    assert err.value.field.startswith(f"{type(config).__name__}.{field}")


def test_cohere2_moe_holds_average_without_shared_experts():
    """'average' (its default) combines nothing where there are no shared experts: read as any other."""
    cfg = config_from_hf(_hf_config("cohere2_moe", num_shared_experts=0, shared_expert_combination_strategy="average"))
    assert cfg.mlp.n_shared_experts == 0


@pytest.mark.parametrize(
    "case, fields, field",
    [
        ("cohere2_moe", dict(kinds__full__position__kind="rope"), "model.layers.kinds.full.position.kind"),
        ("cohere2_moe", dict(mlp__routing__routed_scale=2.0), "model.mlp.routing.routed_scale"),
        ("mellum", dict(mlp__n_shared_experts=1), "model.mlp.n_shared_experts"),
        ("mellum", dict(attention__qk_norm="none"), "model.attention.qk_norm"),
        ("minicpm3", dict(head__logit_scale=0.3), "model.head.logit_scale"),
        ("minicpm3", dict(attention__latent_norm_eps=None), "model.attention.latent_norm_eps"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(case, fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model(case)).cfg, **fields)
    with pytest.raises(ConfigError) as err:
        FAMILIES[case].check(cfg)
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)


def test_dense_layer_after_a_moe_one_exports_to_mellum():
    """Qwen3-MoE's dense layers come first (mlp_only_layers): a dense layer after a MoE one, which it
    refuses, Mellum holds (mlp_layer_types), so the layout exports there."""
    overrides = ["model=qwen3-30b-a3b", "model/layers=dense_first", "model.layers.first=[moe,dense]"]
    cfg = compose_model([*overrides, "+model.layers.kinds.moe={}"])
    with pytest.raises(ConfigError) as err:
        FAMILIES["qwen3_moe"].check(cfg)
    assert err.value.field == "model.layers.kinds.dense.mlp.kind"
    assert hf_family(cfg) == "mellum"
    assert FAMILIES["mellum"].to_hf(cfg)["mlp_layer_types"][:2] == ["sparse", "dense"]


MLA = [
    "model=nano",
    "model/attention=mla",
    "model/position=rope",
    "model.attention.kv_lora_rank=16",
    "model.attention.q_lora_rank=16",
    "model.attention.qk_nope_head_dim=8",
    "model.attention.qk_rope_head_dim=8",
    "model.attention.v_head_dim=8",
    "model.vocab_size=96",
]


def test_latent_norm_eps_sets_the_latent_norms_and_moves_the_logits():
    cfg = compose_model([*MLA, "model.attention.latent_norm_eps=10.0"])
    torch.manual_seed(0)
    model = build_model(cfg).eval()
    attn = model.blocks[0].attn
    assert (attn.q_norm.eps, attn.kv_norm.eps) == (10.0, 10.0)
    assert model.blocks[0].attn_norm.eps == cfg.norm.eps  # the block's norms keep model.norm.eps
    parity.check_changes_logits(model, parity.changed_cfg(cfg, attention__latent_norm_eps=None), "latent_norm_eps")


@pytest.mark.parametrize(
    "overrides",
    [
        [*MLA, "model.attention.latent_norm_eps=0.0"],
        [*MLA, "model.attention.latent_norm_eps=-1e-6"],
    ],
)
def test_latent_norm_eps_is_validated(overrides):
    with pytest.raises(ConfigError) as err:
        build_model(compose_model(overrides), device="meta")
    assert err.value.field == "model.attention.latent_norm_eps"


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
