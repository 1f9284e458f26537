"""Per-family Hugging Face parity of the mixture-of-experts families: Mixtral, Qwen3-MoE, DeepSeek-V2 and DeepSeek-V3.

Tiny random models of each (a dense first layer where the family has one, GQA and a sliding window,
shared experts, low-rank queries, group-limited routing, YaRN) give the same float32 logits in archlab
and in transformers' eager attention and experts, from HF to archlab and from each shrunk preset to HF;
every MoE layer routes every token to the same experts with the same weights; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy decoding (padded batches too) equals HF ``generate``. Every
parameter is redrawn (matrices N(0, 0.2²), norm scales 0.5 + N(0, 0.3²)) and DeepSeek-V3's correction
bias N(0, 0.3²), which changes the experts chosen (checked), as the expert groups do.
"""

import math

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, WINDOW, logits, max_diff, randomize

from archlab import ConfigError, build_model, compose_model
from archlab.config.layers import layer_configs
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, hf_family
from archlab.nn.moe import MoE

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
    "mixtral-window": (
        "MixtralForCausalLM",
        "MixtralConfig",
        dict(
            SMALL,
            intermediate_size=48,
            num_key_value_heads=2,
            num_local_experts=4,
            num_experts_per_tok=2,
            sliding_window=WINDOW,
        ),
    ),
    "qwen3_moe-dense-first-biases": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(
            SMALL,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_key_value_heads=2,
            head_dim=24,
            attention_bias=True,
            num_experts=6,
            num_experts_per_tok=3,
            norm_topk_prob=False,
            mlp_only_layers=[0],
        ),
    ),
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


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_from_hf_gives_hf_logits(case):
    hf = hf_model(case)
    model = from_hf(hf)
    assert max_diff(logits(hf), logits(model)) <= TOL
    assert hf_family(model.cfg) == hf.config.model_type  # the layout read maps back to the same family


def test_from_hf_reads_each_family_s_parts():
    cfgs = {case: from_hf(hf_model(case)).cfg for case in HF_CASES}
    mixtral = cfgs["mixtral-window"]
    assert (
        mixtral.attention.window,
        mixtral.mlp.routing.n_experts,
        mixtral.mlp.expert_d_ff,
        mixtral.mlp.routing.normalize_top_k,
    ) == (
        WINDOW,
        4,
        48,
        True,
    )
    qwen = cfgs["qwen3_moe-dense-first-biases"]
    assert (qwen.attention.qk_norm, qwen.attention.head_dim, qwen.attention.qkv_bias, qwen.attention.out_bias) == (
        "head",
        24,
        True,
        True,
    )
    assert (mlp_kinds(qwen), qwen.mlp.d_ff, qwen.mlp.expert_d_ff, qwen.mlp.routing.normalize_top_k) == (
        ["swiglu", "moe", "moe"],  # mlp_only_layers [0]: a layer kind of one SwiGLU
        96,
        32,
        False,
    )
    v2 = cfgs["deepseek_v2-yarn"]
    assert (v2.attention.kind, v2.attention.q_lora_rank, v2.position.pairing) == ("mla", None, "interleaved")
    assert (
        v2.mlp.routing.scoring,
        v2.mlp.n_shared_experts,
        v2.mlp.routing.routed_scale,
        v2.mlp.routing.normalize_top_k,
    ) == (
        "softmax",
        2,
        1.5,
        False,
    )
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
    v3 = cfgs["deepseek_v3-yarn-groups"]
    assert v3.position.scaling.truncate is False
    assert (
        v3.attention.q_lora_rank,
        v3.mlp.routing.scoring,
        v3.mlp.routing.correction_bias,
        v3.mlp.routing.n_groups,
        v3.mlp.routing.top_groups,
    ) == (
        24,
        "sigmoid",
        True,
        4,
        2,
    )
    halves = cfgs["deepseek_v3-halves-tied"]
    assert (halves.position.pairing, halves.position.scaling.kind, halves.head.tied, "moe" in mlp_kinds(halves)) == (
        "half",
        "none",
        True,
        True,
    )
    assert "swiglu" not in mlp_kinds(halves)  # first_k_dense_replace 0: no dense layer
    assert mlp_kinds(cfgs["deepseek_v2-yarn"])[0] == "swiglu"  # first_k_dense_replace 1


def mlp_kinds(cfg) -> list[str]:
    """Each layer's MLP kind: a dense layer is a layer kind setting it to the experts' kind."""
    return [lc.mlp.kind for lc in layer_configs(cfg)]


def moe_layers(hf, model) -> list[tuple[torch.nn.Module, MoE]]:
    """(HF router, archlab MoE) of every MoE layer."""
    pairs = [(hf.model.layers[i].mlp, block.mlp) for i, block in enumerate(model.blocks)]
    return [(h.gate, a) for h, a in pairs if isinstance(a, MoE)]


def by_expert(indices: torch.Tensor, weights: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each token's chosen experts in ascending order, with their weights (DeepSeek's top-k is unsorted)."""
    order = indices.argsort(dim=-1)
    return indices.gather(-1, order), weights.gather(-1, order)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_every_token_is_routed_as_hf_routes_it(case):
    """In every MoE layer, the experts archlab's forward chooses for every token (from its own hidden
    states) are HF's, and on HF's hidden states its router gives HF's weights."""
    hf = hf_model(case, seed=8)
    model = from_hf(hf)
    layers = moe_layers(hf, model)
    assert layers and len(layers) == mlp_kinds(model.cfg).count("moe")
    seen_hf, seen_ours, hooks = {}, {}, []
    for n, (gate, moe) in enumerate(layers):
        hooks.append(gate.register_forward_hook(lambda m, args, out, n=n: seen_hf.__setitem__(n, (args[0], out))))
        hooks.append(moe.register_forward_pre_hook(lambda m, args, n=n: seen_ours.__setitem__(n, args[0])))
    logits(hf)
    logits(model)
    for h in hooks:
        h.remove()
    for n, (_, moe) in enumerate(layers):
        hf_input, (_, hf_weights, hf_indices) = seen_hf[n]
        hf_indices, hf_weights = by_expert(hf_indices, hf_weights)
        with torch.no_grad():
            _, _, ours = moe.route(seen_ours[n].reshape(-1, model.cfg.d_model))
            _, weights, indices = moe.route(hf_input.reshape(-1, model.cfg.d_model))
        assert torch.equal(ours.sort(dim=-1).values, hf_indices)  # all 24 tokens
        indices, weights = by_expert(indices, weights)
        assert torch.equal(indices, hf_indices)
        torch.testing.assert_close(weights, hf_weights, rtol=1e-6, atol=1e-7)


def test_deepseek_v3_s_correction_bias_and_groups_change_the_choice():
    """The routing test above could not tell a dropped correction bias or ignored groups: here each
    changes some token's experts."""
    hf = hf_model("deepseek_v3-yarn-groups", seed=8)
    model = from_hf(hf)
    x = torch.randn(64, model.cfg.d_model, generator=torch.Generator().manual_seed(9))
    for _, moe in moe_layers(hf, model):
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


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_to_archlab_to_hf_and_back(case):
    """The archlab model converts back to the same HF class with the same logits, and from there to an
    archlab model with the same config and bit-identical tensors (the correction bias included)."""
    hf = hf_model(case, seed=2)
    parity.check_back_and_again(hf, from_hf(hf), **EAGER)


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
    "mixtral-8x7b": (
        "mixtral-8x7b",
        "MixtralForCausalLM",
        ["model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2", "model.mlp.expert_d_ff=48"],
    ),
    "qwen3-30b-a3b": (
        "qwen3-30b-a3b",
        "Qwen3MoeForCausalLM",
        [
            "model.d_model=64",
            "model.attention.n_head=4",
            "model.attention.n_kv_head=2",
            "model.attention.head_dim=24",
            "model.mlp.routing.n_experts=6",
            "model.mlp.routing.top_k=3",
            "model.mlp.expert_d_ff=32",
        ],
    ),
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


@pytest.mark.parametrize("case", list(PRESET_CASES))
def test_archlab_to_hf_to_archlab_is_bit_identical(case):
    """A shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit."""
    preset, expected_class, sizes = PRESET_CASES[case]
    model = randomize(build_model(compose_model([f"model={preset}", *TINY, *sizes])), seed=3)
    parity.check_to_hf_and_back(model, expected_class, **EAGER)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_greedy_generation_matches_hf_generate(case):
    """20 new tokens after a 5-token prompt, past every window of 4: the same ids as HF ``generate``, and
    at every step archlab's logits through its KV cache (mla: the latent) equal the logits HF decoded with."""
    hf = hf_model(case, seed=4)
    parity.check_greedy_generation(hf)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_padded_batch_generation_matches_hf_generate(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch, with their attention mask: archlab's
    greedy continuation of each row, and its logits at every step, equal HF ``generate``'s on the same batch."""
    hf = hf_model(case, seed=6)
    parity.check_padded_generation(hf)


@pytest.mark.parametrize("case", ["mixtral-window", "deepseek_v3-yarn-groups"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout (the
    stacked experts and the correction bias stored and read back)."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **EAGER)


# ---------------------------------------------------------------- which family, and what is refused


@pytest.mark.parametrize(
    "overrides, config_class",
    [
        (["model=mixtral-8x7b"], "MixtralConfig"),
        (["model=qwen3-30b-a3b"], "Qwen3MoeConfig"),
        (["model=deepseek-v2-lite"], "DeepseekV2Config"),
        (["model=deepseek-v3"], "DeepseekV3Config"),
        # a moe MLP on causal attention is Mixtral, with a per-head QK-norm Qwen3-MoE; mla with sigmoid
        # scores or a correction bias is DeepSeek-V3, else V2
        (["model=llama2-7b", "model/mlp=moe", "model.attention.qkv_bias=false"], "MixtralConfig"),
        (["model=qwen3-30b-a3b", "model.attention.qk_norm=none"], "MixtralConfig"),
        (
            ["model=mixtral-8x7b", "model.attention.qk_norm=head", "model.mlp.routing.normalize_top_k=false"],
            "Qwen3MoeConfig",
        ),
        (
            ["model=deepseek-v2-lite", "model.mlp.routing.scoring=sigmoid", "model.mlp.routing.correction_bias=true"],
            "DeepseekV3Config",
        ),
    ],
)
def test_the_layout_picks_the_family(overrides, config_class):
    assert type(config_to_hf(compose_model(overrides))).__name__ == config_class


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model=mixtral-8x7b", "model.mlp.routing.normalize_top_k=false"], "model.mlp.routing.normalize_top_k"),
        (["model=mixtral-8x7b", "model/layers=dense_first"], "model.layers.first"),
        (["model=deepseek-v2-lite", "model.layers.kinds.dense.mlp.kind=geglu"], "model.layers.kinds.dense.mlp.kind"),
        (["model=deepseek-v3", "+model.layers.kinds.dense.mlp.d_ff=64"], "model.layers.kinds.dense.mlp.d_ff"),
        (["model=mixtral-8x7b", "model.mlp.routing.scoring=sigmoid"], "model.mlp.routing.scoring"),
        (["model=mixtral-8x7b", "model.mlp.expert=gelu"], "model.mlp.expert"),
        (["model=mixtral-8x7b", "model.mlp.bias=true"], "model.mlp.bias"),
        (
            ["model=mixtral-8x7b", "model/layers=every_other_global", "model.attention.window=8"],
            "model.layers.pattern",
        ),
        (
            ["model=mixtral-8x7b", "model/position=yarn", "model.position.scaling.original_context=4096"],
            "model.position.scaling.kind",
        ),
        (
            ["model=mixtral-8x7b", "model.position.scaling.truncate=false"],
            "model.position.scaling.truncate",
        ),  # no YaRN to read it
        (["model=qwen3-30b-a3b", "model.mlp.routing.routed_scale=2.0"], "model.mlp.routing.routed_scale"),
        (
            ["model=qwen3-30b-a3b", "model.mlp.routing.n_groups=8", "model.mlp.routing.top_groups=4"],
            "model.mlp.routing.n_groups",
        ),
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
    with pytest.raises(ConfigError) as err:
        config_to_hf(compose_model(overrides))
    assert err.value.field == field
    assert "Hugging Face" in str(err.value)


@pytest.mark.parametrize(
    "overrides, family, field, holder",
    [
        (
            ["model=mixtral-8x7b", "model.mlp.n_shared_experts=1"],
            "mixtral",
            "model.mlp.n_shared_experts",
            "granitemoeshared",
        ),
        (
            ["model=llama3.1-8b", "model.position.scaling.kind=yarn"],
            "llama",
            "model.position.scaling.kind",
            "ministral3",
        ),
    ],
)
def test_a_layout_its_family_refuses_exports_to_a_family_that_holds_it(overrides, family, field, holder):
    """Mixtral has no shared experts and LLaMA no YaRN: each refuses naming the field, and the layout
    exports to the family that holds it (GraniteMoeShared, Ministral 3's generic YaRN)."""
    cfg = compose_model(overrides)
    assert field in [p.field for p in FAMILIES[family].problems(cfg)]
    assert hf_family(cfg) == holder


def _hf_config(case: str, **changes):
    _, config_class, keys = HF_CASES[case]
    return getattr(transformers, config_class)(**{**keys, **changes})


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("mixtral-window", dict(router_jitter_noise=0.1), "MixtralConfig.router_jitter_noise"),
        ("mixtral-window", dict(hidden_act="relu"), "MixtralConfig.hidden_act"),
        (
            "mixtral-window",
            dict(rope_parameters=dict(YARN, rope_theta=10000.0)),
            "MixtralConfig.rope_parameters.rope_type",
        ),
        ("qwen3_moe-dense-first-biases", dict(decoder_sparse_step=2), "Qwen3MoeConfig.decoder_sparse_step"),
        ("qwen3_moe-dense-first-biases", dict(mlp_only_layers=[1]), "Qwen3MoeConfig.mlp_only_layers"),
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
    with pytest.raises(ConfigError) as err:
        config_from_hf(_hf_config(case, **changes))
    assert err.value.field == field


def test_yarn_attention_factor_that_transformers_would_derive_is_read():
    """An explicit attention_factor equal to the one derived from factor and the mscales is no change."""
    derived = (0.1 * 1.0 * math.log(4.0) + 1) / (0.1 * 0.8 * math.log(4.0) + 1)
    config = _hf_config("deepseek_v3-yarn-groups", rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=0.8))
    with_factor = _hf_config(
        "deepseek_v3-yarn-groups", rope_parameters=dict(YARN, mscale=1.0, mscale_all_dim=0.8, attention_factor=derived)
    )
    assert config_from_hf(with_factor) == config_from_hf(config)
