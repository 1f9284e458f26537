"""Hugging Face parity of Step-3.5 (``model_type`` step3p5, transformers' ``Step3p7TextConfig``).

transformers 5.24 has no causal-LM class of its own for the text model: archlab converts to and from
``Step3p5ForCausalLM`` (``families.step.causal_lm_class``: transformers' ``Step3p7TextModel`` and an
``lm_head``), and every logit and generated token is compared with transformers' own
``Step3p7ForConditionalGeneration`` (its text model and head; the tiny vision tower never runs) holding
the same tensors. Tiny random models (full and sliding layers with their own head counts and RoPE,
partial llama3 RoPE on the full ones, GQA, a dense first layer, clamps on the routed experts, the shared
expert and the dense layer, a correction bias; every parameter redrawn, norm weights 0.5 ± 0.3, so
(1 + w) scales far from 0 and 1) give HF's float32 logits over 12 tokens, past the window of 4; archlab ->
HF -> archlab is bit-identical; greedy and left-padded generation equal HF ``generate``.
"""

import copy

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, TOL, WINDOW, changed_cfg, logits, max_diff, randomize
from helpers.published import LAYOUT_CONFIGS
from safetensors.torch import load_file, save_file

from archlab import ConfigError, build_model, compose_model, count_params
from archlab.config.layers import layer_configs
from archlab.interop.families.step import causal_lm_class
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

FULL, SLIDING = "full_attention", "sliding_attention"
STEP = dict(
    HF_SIZES,
    num_key_value_heads=2,
    head_dim=16,
    n_routed_experts=4,
    num_experts_per_tok=2,
    moe_intermediate_size=16,
    intermediate_size=48,
    sliding_window=WINDOW,
)
CASES = {
    # layer 0 full and dense (its clamp from swiglu_limits_shared), 1-2 sliding with 6 heads, 3 full; routed
    # clamps on 2 and 3, the shared expert's on 3 alone; llama3 RoPE on half of each full layer's heads
    "mixed-clamped": dict(
        STEP,
        num_hidden_layers=4,
        num_attention_heads=4,
        num_sliding_attention_heads=6,
        layer_types=[FULL, SLIDING, SLIDING, FULL],
        mlp_layer_types=["dense", "sparse", "sparse", "sparse"],
        share_expert_dim=16,
        moe_router_scaling_factor=2.5,
        rope_theta=[100.0, 10.0, 10.0, 100.0],
        partial_rotary_factors=[0.5, 1.0, 1.0, 0.5],
        rope_scaling=dict(
            rope_type="llama3",
            factor=4.0,
            low_freq_factor=1.0,
            high_freq_factor=4.0,
            original_max_position_embeddings=16,
        ),
        swiglu_limits=[0, 0, 0.5, 0.5],
        swiglu_limits_shared=[0.6, 0, 0, 0.8],
    ),
    # every layer sliding and MoE, two shared experts' width, linear RoPE on whole heads, a tied head
    "sliding-tied": dict(
        STEP,
        num_hidden_layers=2,
        num_attention_heads=4,
        layer_types=[SLIDING, SLIDING],
        mlp_layer_types=["sparse", "sparse"],
        share_expert_dim=32,
        rope_parameters={SLIDING: dict(rope_type="linear", rope_theta=50.0, factor=2.0, partial_rotary_factor=1.0)},
        tie_word_embeddings=True,
    ),
}
# a tiny vision tower for Step3p7ForConditionalGeneration, transformers' class with Step's head
VISION = dict(hidden_size=32, intermediate_size=32, num_hidden_layers=1, num_attention_heads=2, image_size=28)


def hf_config(case: str, **changes):
    return transformers.Step3p7TextConfig(**{**CASES[case], **changes}, **EAGER)


def hf_model(case: str, seed: int = 1):
    """The LM-head wrapper archlab converts, every parameter and the correction bias redrawn."""
    return randomize(causal_lm_class()(hf_config(case)), seed)


def reference(hf):
    """transformers' Step3p7ForConditionalGeneration holding ``hf``'s text model and head."""
    config = transformers.Step3p7Config(text_config=hf.config.to_dict(), vision_config=VISION)
    config.text_config._attn_implementation = config.text_config._experts_implementation = "eager"
    ref = transformers.Step3p7ForConditionalGeneration(config).eval()
    ref.model.language_model.load_state_dict(hf.model.state_dict())
    ref.lm_head.weight = torch.nn.Parameter(hf.lm_head.weight.detach().clone())
    return ref


def test_from_hf_reads_each_layer_into_a_kind():
    cfg = config_from_hf(hf_config("mixed-clamped"))
    llama3 = dict(kind="llama3", factor=4.0, low_freq_factor=1.0, high_freq_factor=4.0, original_context=16)
    full_rope = dict(theta=100.0, rotary_fraction=0.5, scaling=llama3)
    sliding = {"position": {"theta": 10.0}, "attention": {"window": WINDOW, "n_head": 6}}
    clamp = {"swiglu_clamp": "activation"}
    assert cfg.layers.kinds == {
        "full_dense_clamp0p6": {"position": full_rope, "mlp": {"kind": "swiglu", "swiglu_limit": 0.6, **clamp}},
        "sliding": sliding,
        "sliding_clamp0p5": {**sliding, "mlp": {"swiglu_limit": 0.5, "shared_swiglu_limit": 0.0, **clamp}},
        "full_clamp0p5_shared0p8": {
            "position": full_rope,
            "mlp": {"swiglu_limit": 0.5, "shared_swiglu_limit": 0.8, **clamp},
        },
    }
    assert (cfg.norm.unit_offset, cfg.attention.qk_norm, cfg.attention.gate, cfg.attention.n_head) == (
        True,
        "head",
        "head",
        4,
    )
    m = cfg.mlp
    assert (
        m.routing.scoring,
        m.routing.correction_bias,
        m.routing.normalize_top_k,
        m.routing.routed_scale,
        m.n_shared_experts,
        m.d_ff,
    ) == (
        "sigmoid",
        True,
        True,
        2.5,
        1,
        48,
    )
    tied = config_from_hf(hf_config("sliding-tied"))  # one kind for every layer: the model's own parts
    assert (tied.layers.kinds, tied.attention.window, tied.mlp.n_shared_experts, tied.head.tied) == (None, 4, 2, True)
    assert (tied.position.scaling.kind, tied.position.scaling.factor) == ("linear", 2.0)


@pytest.mark.parametrize("case", list(CASES))
def test_hf_logits_and_hf_to_archlab_to_hf_and_back(case):
    """archlab's logits equal transformers' (its own class and the wrapper); back to the wrapper with the
    same per-layer lists and logits, and from there to the same archlab config and tensors, bit for bit."""
    hf = hf_model(case)
    model = from_hf(hf)
    ref = reference(hf)
    assert max_diff(logits(ref), logits(model)) <= TOL
    assert max_diff(logits(ref), logits(hf)) <= TOL
    back = parity.check_back_and_again(hf, model, **EAGER)
    for key in ("layer_types", "mlp_layer_types", "rope_parameters", "sliding_window", "share_expert_dim"):
        assert getattr(back.config, key) == getattr(hf.config, key), key
    for key in ("swiglu_limits", "swiglu_limits_shared"):
        assert [x or 0 for x in getattr(back.config, key) or []] == [x or 0 for x in CASES[case].get(key, [0, 0])]
    assert [c.num_attention_heads for c in back.config.per_layer_config] == [
        c.num_attention_heads for c in hf.config.per_layer_config
    ]


TINY = ["model.vocab_size=96", "model.context_length=64", "model.d_model=64", "model.attention.n_head=4"]
TINY += [
    "model.attention.n_kv_head=2",
    "model.attention.head_dim=16",
    "model.mlp.routing.n_experts=4",
    "model.mlp.routing.top_k=2",
]
TINY += ["model.mlp.expert_d_ff=16", "model.mlp.d_ff=48", "model.n_layer=5"]
TINY += [
    f"model.layers.kinds.{k}.attention.{f}" for k in ("sliding", "sliding_dense") for f in ("window=4", "n_head=6")
]
TINY += [f"model.layers.kinds.{k}.position.scaling.original_context=16" for k in ("full", "full_dense")]


def test_the_preset_converts_to_hf_and_back():
    """The preset shrunk to 5 layers (a full and two sliding dense layers, then MoE ones) gives HF's logits
    and comes back with the same layer configs, every tensor bit for bit and the same counts."""
    model = randomize(build_model(compose_model(["model=step-3.5-flash", *TINY])), seed=3)
    hf, back = parity.check_to_hf_and_back(model, "Step3p5ForCausalLM", reference, **EAGER)
    assert hf.config.mlp_layer_types == ["dense"] * 3 + ["sparse"] * 2
    assert layer_configs(back.cfg) == layer_configs(model.cfg)


def test_published_config_loads_as_the_preset_and_back():
    """stepfun-ai/Step-3.5-Flash's config.json reads into the preset exactly (its clamps on layers 43-44
    included) and writes back the same per-layer lists."""
    _, config_class, keys, _ = LAYOUT_CONFIGS["step-3.5-flash"]
    published = getattr(transformers, config_class)(**keys)
    cfg = config_from_hf(published)
    assert cfg == compose_model(["model=step-3.5-flash"])
    assert count_params(cfg)["total"] == 196_956_118_272
    back = config_to_hf(cfg)
    for key in ("layer_types", "mlp_layer_types", "swiglu_limits", "swiglu_limits_shared", "rope_parameters"):
        assert getattr(back, key) == getattr(published, key), key


PARTS = [
    ("kinds__sliding__attention__window", None),  # the sliding layers' window
    ("kinds__sliding_clamp0p5__mlp__swiglu_limit", None),  # layer 2's routed clamp
    ("kinds__full_clamp0p5_shared0p8__mlp__shared_swiglu_limit", None),  # layer 3's own shared clamp
    ("kinds__full_dense_clamp0p6__mlp__swiglu_limit", None),  # the dense layer's clamp
    ("kinds__full_dense_clamp0p6__position__rotary_fraction", None),  # partial RoPE on a full layer
    ("norm__unit_offset", False),  # (1 + w) norms
    ("mlp__routing__routed_scale", 1.0),  # moe_router_scaling_factor
]


@pytest.mark.parametrize("field, value", PARTS, ids=[p[0] for p in PARTS])
def test_each_part_changes_the_logits(field, value):
    """The same weights with one part taken away give other logits: the parity above depends on each."""
    model = from_hf(hf_model("mixed-clamped"))
    parity.check_changes_logits(model, changed_cfg(model.cfg, **{field: value}))


def test_the_correction_bias_moves_the_choice():
    model = from_hf(hf_model("mixed-clamped"))
    changed = copy.deepcopy(model)
    for block in changed.blocks[1:]:
        block.mlp.router_bias.zero_()
    assert max_diff(logits(changed), logits(model)) > 1e-3


@pytest.mark.parametrize("case", list(CASES))
def test_generation_matches_hf_generate(case):
    """Greedy decoding past the window, and left-padded prompts in one batch: the ids and every step's
    logits of transformers' Step3p7ForConditionalGeneration.generate."""
    hf = hf_model(case, seed=4)
    model, ref = from_hf(hf), reference(hf)
    parity.check_greedy_generation(ref, model)
    parity.check_padded_generation(ref, model)


def test_save_pretrained_directories_round_trip(tmp_path):
    """save_pretrained (with a multi-token-prediction layer after the model's, as the published checkpoint
    holds) -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""

    def add_mtp_layer(directory):
        path = directory / "model.safetensors"
        save_file({**load_file(path), "model.layers.4.eh_proj.weight": torch.zeros(64, 128)}, path)

    hf = hf_model("mixed-clamped", seed=7)
    parity.check_directory_round_trip(hf, tmp_path, causal_lm_class(), add_mtp_layer, **EAGER)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(norm__unit_offset=False), "model.norm.unit_offset"),
        (dict(attention__qk_norm="none"), "model.attention.qk_norm"),
        (dict(attention__gate="elementwise"), "model.attention.gate"),
        (dict(attention__qkv_bias=True, attention__out_bias=True), "model.attention.qkv_bias"),
        (dict(attention__sinks=True), "model.attention.sinks"),
        (dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
        (dict(mlp__routing__correction_bias=False), "model.mlp.routing.correction_bias"),
        (dict(mlp__n_shared_experts=0), "model.mlp.n_shared_experts"),
        (dict(mlp__swiglu_alpha=1.702), "model.mlp.swiglu_alpha"),
        (
            dict(kinds__sliding_clamp0p5__mlp__swiglu_clamp="gate"),
            "model.layers.kinds.sliding_clamp0p5.mlp.swiglu_clamp",
        ),
        (dict(kinds__full_dense_clamp0p6__mlp={"kind": "geglu"}), "model.layers.kinds.full_dense_clamp0p6.mlp.kind"),
        (dict(kinds__sliding__attention__window=8), "model.attention.window"),  # two windows
        # one head count and one RoPE per layer type: the first sliding layer's, and another kind's differs
        (dict(kinds__sliding__attention__n_head=8), "model.layers.kinds.sliding_clamp0p5.attention.n_head"),
        (dict(kinds__sliding__position__theta=20.0), "model.layers.kinds.sliding_clamp0p5.position.theta"),
        (dict(kinds__sliding__attention__n_kv_head=1), "model.layers.kinds.sliding.attention.n_kv_head"),
        (dict(kinds__sliding__position__kind="none"), "model.layers.kinds.sliding.position.kind"),
    ],
)
def test_config_to_hf_refuses_what_step_cannot_hold(fields, field):
    cfg = changed_cfg(config_from_hf(hf_config("mixed-clamped")), **fields)
    with pytest.raises(ConfigError) as err:
        config_to_hf(cfg)
    assert err.value.field == field
    assert "Hugging Face Step-3.5" in str(err.value)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(attention_bias=True), "Step3p7TextConfig.attention_bias"),
        (dict(mlp_bias=True), "Step3p7TextConfig.mlp_bias"),
        (dict(use_bidirectional_attention=True), "Step3p7TextConfig.use_bidirectional_attention"),
        (dict(gating="elementwise"), "Step3p7TextConfig.gating"),
        (dict(share_expert_dim=24), "Step3p7TextConfig.share_expert_dim"),
        (dict(mlp_layer_types=["dense"] * 4), "Step3p7TextConfig.mlp_layer_types"),
        (
            dict(rope_scaling=dict(rope_type="yarn", factor=2.0, original_max_position_embeddings=16)),
            "Step3p7TextConfig.rope_parameters.full_attention.rope_type",
        ),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    with pytest.raises(ConfigError) as err:
        config_from_hf(hf_config("mixed-clamped", **changes))
    assert err.value.field == field


def test_a_full_dense_layer_beside_sliding_moe_ones_converts_back():
    """Two layers, the full one dense and the sliding one MoE: the router's keys are read from the MoE layer
    (from the full layer, dense, they raised AttributeError), and the config converts back as it came."""
    config = hf_config(
        "mixed-clamped",
        num_hidden_layers=2,
        layer_types=[FULL, SLIDING],
        mlp_layer_types=["dense", "sparse"],
        rope_theta=[100.0, 10.0],
        partial_rotary_factors=[0.5, 1.0],
        swiglu_limits=None,
        swiglu_limits_shared=None,
    )
    cfg = config_from_hf(config)
    back = config_from_hf(config_to_hf(cfg))
    assert back == cfg
