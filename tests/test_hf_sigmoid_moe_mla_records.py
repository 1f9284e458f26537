"""Per-family Hugging Face parity of Solar Open, Sarvam MoE, Hunyuan V3 (sigmoid-routed MoE under
LLaMA-style attention), GLM-4.7-Flash, Sarvam MLA (latent attention over DeepSeek-V3's MoE) and Youtu-LLM
(latent attention over a dense gated MLP).

One tiny random model each (every parameter and correction bias redrawn; GQA where the family has it)
gives HF eager's float32 logits in archlab; its layout exports to the family it routes to, and where that
is an earlier record's (Solar Open and Sarvam MoE: GLM-4.5's or dots.llm1's; Hunyuan V3: dots.llm1's;
GLM-4.7-Flash and Sarvam MLA: DeepSeek-V3's) this record still holds it: its own class, built from the
archlab model by this record's config and tensor maps, gives the same logits and reads back bit for bit.
A save_pretrained directory loads; two families decode as HF ``generate`` does; what a record cannot
hold is refused both ways, naming the field.
"""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, logits, max_diff

from archlab import ConfigError
from archlab.interop.families import FAMILIES
from archlab.interop.hf import (
    archlab_state_to_hf,
    config_from_hf,
    from_hf,
    hf_family,
    load_hf_dir,
)

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, **NO_TOKENS)
MLA_SIZES = dict(kv_lora_rank=16, qk_nope_head_dim=16, qk_rope_head_dim=8, v_head_dim=16, rms_norm_eps=1e-6)
MOE_SIZES = dict(intermediate_size=96, moe_intermediate_size=32, num_experts_per_tok=2)
# case -> (transformers model class, config class, config keys, the family its layout exports to)
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
        "glm4_moe",
    ),
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
        "dots1",  # its QK-norm, no biases and full RoPE are dots.llm1's layout
    ),
    "hy_v3": (
        "HYV3ForCausalLM",
        "HYV3Config",
        dict(
            SMALL,
            **MOE_SIZES,
            num_key_value_heads=2,
            head_dim=16,
            num_experts=6,
            num_shared_experts=2,
            router_scaling_factor=2.5,
            attention_bias=True,
            mlp_layer_types=["dense", "sparse"],
        ),
        "dots1",
    ),
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
        "deepseek_v3",
    ),
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
        "deepseek_v3",
    ),
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
        "youtu",
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def record_to_hf(model, family: str):
    """The transformers model of record ``family`` (its config class, model class and tensor maps) holding
    ``model``'s weights, whichever family the layout routes to."""
    record = FAMILIES[family]
    config = getattr(transformers, record.config_class)(**NO_TOKENS, **record.to_hf(model.cfg), **EAGER)
    hf = record.hf_class(transformers)(config).eval()
    result = hf.load_state_dict(archlab_state_to_hf(model.cfg, model.state_dict(), family=family), strict=False)
    assert set(result.missing_keys) <= ({"lm_head.weight"} if model.cfg.head.tied else set())
    assert not result.unexpected_keys
    return hf


@pytest.mark.parametrize("case", list(HF_CASES))
def test_family_gives_hf_logits_and_round_trips(case, tmp_path):
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == HF_CASES[case][3]
    record = FAMILIES[case]
    assert record.problems(model.cfg) == []  # this record holds the layout, wherever it exports
    back = record_to_hf(model, case)
    assert type(back) is type(hf)
    assert max_diff(logits(back), logits(model)) <= TOL
    again = from_hf(back)
    assert again.cfg == model.cfg
    parity.assert_same_tensors(model, again)
    if HF_CASES[case][3] == case:
        parity.check_back_and_again(hf, model, **EAGER)
    hf.save_pretrained(tmp_path / "hf")
    assert max_diff(logits(hf), logits(load_hf_dir(tmp_path / "hf"))) <= TOL


@pytest.mark.parametrize("case", ["hy_v3", "youtu"])
def test_generation_matches_hf_generate(case):
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


def _hf_config(case: str, **changes):
    _, config_class, keys, _ = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("solar_open", dict(rope_parameters=dict(rope_theta=1e4, partial_rotary_factor=0.5)), "rope_parameters"),
        ("sarvam_moe", dict(n_shared_experts=0), "n_shared_experts"),
        ("hy_v3", dict(num_shared_experts=0), "num_shared_experts"),
        ("hy_v3", dict(mlp_bias=True), "mlp_bias"),
        ("hy_v3", dict(mlp_layer_types=["sparse", "dense"]), "mlp_layer_types"),
        ("glm4_moe_lite", dict(mlp_layer_types=["sparse", "dense"]), "mlp_layer_types"),
        ("glm4_moe_lite", dict(num_key_value_heads=2), "num_key_value_heads"),
        ("youtu", dict(attention_bias=True), "attention_bias"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    config = _hf_config(case, **changes)
    with pytest.raises(ConfigError) as err:
        config_from_hf(config)
    assert err.value.field.startswith(f"{type(config).__name__}.{field}")


@pytest.mark.parametrize(
    "case, fields, field",
    [
        ("solar_open", dict(attention__out_bias=True), "model.attention.out_bias"),
        ("solar_open", dict(attention__qk_norm="head"), "model.attention.qk_norm"),
        ("hy_v3", dict(mlp__routing__normalize_top_k=False), "model.mlp.routing.normalize_top_k"),
        ("hy_v3", dict(mlp__routing__n_groups=2, mlp__routing__top_groups=1), "model.mlp.routing.n_groups"),
        ("youtu", dict(mlp__bias=True), "model.mlp.bias"),
        ("youtu", dict(norm__eps=1e-5), "model.attention.latent_norm_eps"),  # its latents at 1e-6
    ],
)
def test_records_refuse_layouts_they_cannot_hold(case, fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model(case)).cfg, **fields)
    with pytest.raises(ConfigError) as err:
        FAMILIES[case].check(cfg)
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)
