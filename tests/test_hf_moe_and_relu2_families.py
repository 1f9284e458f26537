"""Per-family Hugging Face parity of dots.llm1, GLM-4-MoE and MiniMax-M2 (sigmoid-routed mixtures of
experts with a correction bias) and of Arcee AFM and Nemotron (dense, a squared-ReLU up/down MLP).

Tiny random models of each (GQA everywhere; dots.llm1 with q/k/v/o biases, a sliding window, groups, a
dense first layer; GLM-4-MoE with q/k/v biases, a per-head QK-norm, partial RoPE, two shared experts;
MiniMax-M2 with its QK-norm over the projection and partial RoPE read from the legacy ``rotary_dim``;
Arcee and Nemotron with attention and MLP biases; Nemotron's (1 + w) LayerNorm with a bias) give the same
float32 logits in archlab and in transformers' eager attention and experts; greedy decoding (padded
batches too) equals HF ``generate``; archlab -> HF -> archlab gives back every tensor bit for bit; a
save_pretrained directory (each expert saved apart) loads. Every parameter is redrawn (matrices N(0, 0.2²),
biases and norm scales 0.5 + N(0, 0.3²)) and the correction biases N(0, 0.3²).
"""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, WINDOW, logits, max_diff

from archlab import ConfigError, build_model, compose_model
from archlab.config.layers import layer_configs
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, hf_family, to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

SMALL = dict(HF_SIZES, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
SIGMOID_MOE = dict(intermediate_size=96, moe_intermediate_size=32, first_k_dense_replace=1)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "dots1": (
        "Dots1ForCausalLM",
        "Dots1Config",
        dict(
            SMALL,
            **SIGMOID_MOE,
            n_routed_experts=8,
            num_experts_per_tok=3,
            n_shared_experts=1,
            n_group=4,
            topk_group=2,
            norm_topk_prob=True,
            routed_scaling_factor=2.5,
            attention_bias=True,
            sliding_window=WINDOW,
            max_window_layers=0,  # every layer slides
        ),
    ),
    "glm4_moe": (
        "Glm4MoeForCausalLM",
        "Glm4MoeConfig",
        dict(
            SMALL,
            **SIGMOID_MOE,
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
    "minimax_m2": (
        "MiniMaxM2ForCausalLM",
        "MiniMaxM2Config",
        dict(
            SMALL,
            head_dim=16,
            rotary_dim=8,  # the published configs' key: partial_rotary_factor 0.5
            intermediate_size=32,
            num_local_experts=6,
            num_experts_per_tok=2,
        ),
    ),
    "arcee": (
        "ArceeForCausalLM",
        "ArceeConfig",
        dict(SMALL, intermediate_size=96, attention_bias=True, mlp_bias=True),
    ),
    "nemotron": (
        "NemotronForCausalLM",
        "NemotronConfig",
        dict(SMALL, head_dim=24, intermediate_size=96, attention_bias=True, mlp_bias=True, norm_eps=1e-3),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits_and_maps_back_to_the_family(case):
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == hf.config.model_type  # to_hf of the layout read picks this class


def test_from_hf_reads_each_family_s_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}
    dots = cfgs["dots1"]
    assert (dots.attention.qk_norm, dots.attention.window, dots.attention.out_bias, dots.attention.n_kv_head) == (
        "head",
        WINDOW,
        True,
        2,
    )
    m = dots.mlp
    assert (
        m.routing.scoring,
        m.routing.correction_bias,
        m.routing.n_groups,
        m.routing.top_groups,
        m.routing.routed_scale,
        m.n_shared_experts,
    ) == (
        "sigmoid",
        True,
        4,
        2,
        2.5,
        1,
    )
    assert [lc.mlp.kind for lc in layer_configs(dots)] == ["swiglu", "moe", "moe"]
    glm = cfgs["glm4_moe"]
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
    mm = cfgs["minimax_m2"]
    assert (
        mm.attention.qk_norm,
        mm.position.rotary_fraction,
        mm.mlp.routing.correction_bias,
        mm.mlp.routing.normalize_top_k,
    ) == (
        "full",
        0.5,
        True,
        True,
    )
    arcee, nemotron = cfgs["arcee"], cfgs["nemotron"]
    assert (arcee.mlp.kind, arcee.mlp.bias, arcee.norm.kind, arcee.position.rotary_fraction) == (
        "relu2",
        True,
        "rmsnorm",
        None,
    )
    assert (nemotron.norm.kind, nemotron.norm.unit_offset, nemotron.norm.bias, nemotron.mlp.kind) == (
        "layernorm",
        True,
        True,
        "relu2",
    )
    assert (nemotron.position.rotary_fraction, nemotron.attention.head_dim) == (0.5, 24)


@pytest.mark.parametrize("case", ["dots1", "glm4_moe", "minimax_m2"])
def test_correction_bias_changes_the_experts_chosen(case):
    """The logits parity could not tell a dropped correction bias: here zeroing it moves the logits."""
    model = from_hf(hf_model(case))
    before = logits(model)
    with torch.no_grad():
        for block in model.blocks:
            if getattr(block.mlp, "router_bias", None) is not None:
                block.mlp.router_bias.zero_()
    assert max_diff(before, logits(model)) > 1e-3


def test_unit_offset_layernorm_is_nemotron_s_layernorm1p():
    """archlab's LayerNorm with unit_offset equals transformers' NemotronLayerNorm1P on the same w and b."""
    from transformers.models.nemotron.modeling_nemotron import NemotronLayerNorm1P

    hf = parity.randomize(NemotronLayerNorm1P(64, eps=1e-3), seed=5)
    model = build_model(
        compose_model(["model=nano", "model.d_model=64", "model.norm.unit_offset=true", "model.norm.eps=1e-3"])
    )
    norm = model.final_norm
    norm.load_state_dict(hf.state_dict())
    x = torch.randn(3, 7, 64, generator=torch.Generator().manual_seed(6)) * 3 + 1
    with torch.no_grad():
        assert max_diff(norm(x), hf(x)) <= 1e-6
        assert max_diff(norm(x), torch.nn.functional.layer_norm(x, (64,), hf.weight, hf.bias, 1e-3)) > 0.1


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_to_archlab_to_hf_and_back(case):
    """The archlab model converts back to the same HF class with the same logits, and from there to an
    archlab model with the same config and bit-identical tensors (the correction biases included)."""
    hf = hf_model(case, seed=2)
    parity.check_back_and_again(hf, from_hf(hf), **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_generation_matches_hf_generate(case):
    """Greedy decoding after one prompt, and of left-padded prompts of 7, 3 and 5 tokens in one batch: the
    same ids as HF ``generate`` and, at every step, the logits HF decoded with."""
    hf = hf_model(case, seed=4)
    model = from_hf(hf)
    parity.check_greedy_generation(hf, model)
    parity.check_padded_generation(hf, model)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained (each expert saved apart) -> load_hf_dir -> save_hf_dir -> from_pretrained: the
    same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **EAGER)


# ---------------------------------------------------------------- which family, and what is refused


@pytest.mark.parametrize(
    "overrides, model_class",
    [
        (["model=llama2-7b", "model/mlp=relu2"], "ArceeForCausalLM"),  # LLaMA's layout with a plain MLP
        # pre-norm (1 + w) LayerNorm with RoPE and a plain MLP
        (
            ["model=pythia-160m", "model.block.kind=pre", "model/mlp=relu2", "model.norm.unit_offset=true"],
            "NemotronForCausalLM",
        ),
    ],
)
def test_the_layout_picks_the_family(overrides, model_class):
    model = build_model(compose_model(["model.n_layer=2", "model.d_model=64", "model.attention.n_head=4", *overrides]))
    assert type(to_hf(model)).__name__ == model_class


def _archlab_cfg(case: str, **fields):
    return parity.changed_cfg(from_hf(hf_model(case)).cfg, **fields)


@pytest.mark.parametrize(
    "case, fields, field",
    [
        ("dots1", dict(attention__out_bias=False), "model.attention.out_bias"),
        ("dots1", dict(mlp__n_shared_experts=0), "model.mlp.n_shared_experts"),
        ("glm4_moe", dict(attention__out_bias=True), "model.attention.out_bias"),
        ("glm4_moe", dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
        ("minimax_m2", dict(mlp__routing__n_groups=2, mlp__routing__top_groups=1), "model.mlp.routing.n_groups"),
        ("minimax_m2", dict(mlp__routing__normalize_top_k=False), "model.mlp.routing.normalize_top_k"),
        ("arcee", dict(position__pairing="interleaved"), "model.position.pairing"),
        ("nemotron", dict(norm__bias=False), "model.norm.bias"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(case, fields, field):
    family = hf_model(case).config.model_type
    from archlab.interop.families import FAMILIES

    with pytest.raises(ConfigError) as err:
        FAMILIES[family].check(_archlab_cfg(case, **fields))
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)


def _hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("dots1", dict(n_shared_experts=0), "Dots1Config.n_shared_experts"),
        ("dots1", dict(max_window_layers=1), "Dots1Config.layer_types"),
        ("glm4_moe", dict(hidden_act="relu"), "Glm4MoeConfig.hidden_act"),
        ("minimax_m2", dict(router_jitter_noise=0.1), "MiniMaxM2Config.router_jitter_noise"),
        ("minimax_m2", dict(scoring_func="softmax"), "MiniMaxM2Config.scoring_func"),
        ("arcee", dict(hidden_act="silu"), "ArceeConfig.hidden_act"),
        ("nemotron", dict(hidden_act="swish"), "NemotronConfig.hidden_act"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(_hf_config(case, **changes))
    assert err.value.field == field


def test_config_to_hf_names_the_family_s_keys():
    """The configs written carry the keys each class reads: GLM's partial rotary and QK-norm switch,
    dots.llm1's window on every layer, MiniMax-M2's expert count."""
    glm = config_to_hf(from_hf(hf_model("glm4_moe")).cfg)
    assert (glm.rope_parameters["partial_rotary_factor"], glm.use_qk_norm, glm.head_dim) == (0.5, True, 24)
    dots = config_to_hf(from_hf(hf_model("dots1")).cfg)
    assert (dots.sliding_window, set(dots.layer_types)) == (WINDOW, {"sliding_attention"})
    assert config_to_hf(from_hf(hf_model("minimax_m2")).cfg).num_local_experts == 6
