"""Hugging Face parity of AFMoE (archlab/interop/families/afmoe.py), a mixture-of-experts family whose
layers differ: sliding RoPE layers and full NoPE ones read into ``model.layers`` kinds, dense first layers,
shared experts, sigmoid routing with a correction bias and a route scale, a per-head QK-norm, an output
gate, sandwich norms and muP's scaled embeddings.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), vectors (biases, norm scales, router
biases) 0.5 + N(0, 0.3²); 12 tokens past every window of 4) give the same float32 logits in archlab and in
transformers' eager attention and experts; archlab -> HF -> archlab gives back the config, the per-layer
description and every tensor bit for bit; an AFMoE layout written in archlab exports; greedy decoding
(left-padded batches too) equals HF ``generate``; each per-layer part changes the logits; a save_pretrained
directory loads; what AFMoE cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, TOL, WINDOW, changed_cfg, logits, max_diff, randomize

from archlab import build_model
from archlab.config.layers import layer_configs
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf, to_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# AFMoE counts its experts as num_experts, its routed width moe_intermediate_size; intermediate_size is its dense one
AFMOE = dict(HF_SIZES, num_attention_heads=4, num_key_value_heads=2, head_dim=16, num_experts_per_tok=2, **NO_TOKENS)
AFMOE |= dict(num_experts=4, moe_intermediate_size=32, intermediate_size=48)
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    # layers 0, 2 slide over 4 positions with RoPE, 1, 3 full without positions (global_attn_every_n_layers);
    # layer 0 dense, then MoE with two shared experts, a route scale, muP's scaled embeddings
    "afmoe-sliding-nope": (
        "AfmoeForCausalLM",
        "AfmoeConfig",
        dict(
            AFMOE,
            num_hidden_layers=4,
            num_dense_layers=1,
            num_shared_experts=2,
            route_scale=2.5,
            global_attn_every_n_layers=2,
            sliding_window=WINDOW,
            mup_enabled=True,
            rope_parameters=dict(rope_type="default", rope_theta=100.0),
        ),
    ),
    # layer by layer: a full NoPE layer first, then two sliding ones; every layer MoE, one shared expert,
    # tanh-GeGLU, linear RoPE scaling, a tied head, no muP
    "afmoe-listed-linear": (
        "AfmoeForCausalLM",
        "AfmoeConfig",
        dict(
            AFMOE,
            num_hidden_layers=3,
            num_dense_layers=0,
            num_shared_experts=1,
            hidden_act="gelu_pytorch_tanh",
            layer_types=["full_attention", "sliding_attention", "sliding_attention"],
            sliding_window=WINDOW,
            tie_word_embeddings=True,
            rope_parameters=dict(rope_type="linear", rope_theta=100.0, factor=2.0),
        ),
    ),
}
# YaRN as gpt-oss publishes it (tests/interop/test_gpt_oss.py), which AFMoE has not
GPT_OSS_YARN = dict(rope_type="yarn", rope_theta=100.0, factor=4.0, original_max_position_embeddings=16)
GPT_OSS_YARN |= dict(beta_fast=1.0, beta_slow=0.25, truncate=False)
# changed_cfg's field -> the value that takes the part away
PARTS = [
    ("kinds__sliding__attention__window", None),  # the sliding layers' window
    ("kinds__full__position__kind", "rope"),  # the full layers' missing RoPE
    ("scale_embedding", False),  # muP's sqrt(d_model)
    ("mlp__routing__routed_scale", 1.0),  # route_scale
]


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


def test_from_hf_reads_each_layer_into_a_kind():
    afmoe = config_from_hf(parity.hf_config(HF_CASES, "afmoe-sliding-nope"))
    assert afmoe.layers.kinds == {
        "sliding_dense": {"attention": {"window": WINDOW}, "mlp": {"kind": "swiglu"}},  # num_dense_layers 1
        "sliding": {"attention": {"window": WINDOW}},
        "full": {"position": {"kind": "none"}},
    }
    assert (afmoe.layers.first, afmoe.layers.pattern) == (["sliding_dense"], ["full", "sliding"])
    assert (afmoe.block.kind, afmoe.scale_embedding, afmoe.attention.qk_norm, afmoe.attention.gate) == (
        "sandwich",
        True,
        "head",
        "elementwise",
    )
    m = afmoe.mlp
    assert (
        m.routing.scoring,
        m.routing.correction_bias,
        m.routing.normalize_top_k,
        m.routing.routed_scale,
        m.n_shared_experts,
    ) == ("sigmoid", True, True, 2.5, 2)
    kinds = [lc.mlp.kind for lc in layer_configs(afmoe)]  # num_dense_layers 1: a layer kind of one SwiGLU
    assert (kinds, m.d_ff, m.expert_d_ff, m.routing.n_experts) == (["swiglu", "moe", "moe", "moe"], 48, 32, 4)
    listed = config_from_hf(parity.hf_config(HF_CASES, "afmoe-listed-linear"))
    assert (listed.layers.first, listed.layers.pattern) == (["full"], ["sliding"])
    assert (listed.mlp.expert, listed.mlp.approximate, listed.position.scaling.kind, listed.scale_embedding) == (
        "geglu",
        "tanh",
        "linear",
        False,
    )


@pytest.mark.parametrize("case", list(HF_CASES))
def test_hf_logits_and_hf_to_archlab_to_hf_and_back(case):
    """archlab's logits equal HF's; the archlab model converts back to the same HF class with the same
    per-layer description and logits, and from there to an archlab model with the same config and
    bit-identical tensors."""
    parity.check_per_layer_round_trip(hf_model(case), HF_CASES[case][2], **EAGER)


def test_each_per_layer_part_changes_the_logits():
    """The same weights with one part taken away (on a layer kind, or on every layer) give other logits:
    the parity above depends on each."""
    parity.check_each_part_changes_logits(from_hf(hf_model("afmoe-sliding-nope")), PARTS)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, only=("test_generation_matches_hf_generate",)))


def test_an_afmoe_layout_written_in_archlab_exports():
    """An AFMoE layout of archlab's own (a full NoPE layer, then sliding ones; two dense layers), its
    weights and correction bias drawn on archlab's side, gives HF's logits and the layer_types it says."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, "afmoe-sliding-nope"))
    kinds = cfg.layers.kinds
    kinds["full_dense"] = {**kinds["full"], "mlp": {"kind": "swiglu"}}
    cfg.layers.first, cfg.layers.pattern = ["full_dense", "sliding_dense"], ["sliding"]
    model = randomize(build_model(cfg), seed=3)
    hf = to_hf(model, **EAGER).eval()
    assert type(hf).__name__ == "AfmoeForCausalLM"
    assert hf.config.layer_types == ["full_attention"] + ["sliding_attention"] * 3
    assert (hf.config.num_dense_layers, hf.config.mup_enabled) == (2, True)
    assert max_diff(logits(model), logits(hf)) <= TOL


def test_save_pretrained_directories_round_trip(tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model("afmoe-sliding-nope", seed=7), tmp_path, **EAGER)


@pytest.mark.parametrize(
    "fields, field",
    [
        # RoPE exactly on the sliding layers
        (dict(kinds__full__position__kind="rope"), "model.layers.kinds.full.position.kind"),
        (dict(kinds__sliding__position__kind="none"), "model.layers.kinds.sliding.position.kind"),
        (dict(kinds__full__attention__window=8), "model.attention.window"),  # two windows
        (dict(kinds__full__attention__n_kv_head=4), "model.layers.kinds.full.attention.n_kv_head"),
        (dict(block__kind="pre"), "model.block.kind"),
        (dict(attention__qk_norm="none"), "model.attention.qk_norm"),
        (dict(attention__gate="head"), "model.attention.gate"),
        (dict(attention__qkv_bias=True, attention__out_bias=True), "model.attention.qkv_bias"),
        (dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
        (dict(mlp__routing__correction_bias=False), "model.mlp.routing.correction_bias"),
        (dict(mlp__routing__normalize_top_k=False), "model.mlp.routing.normalize_top_k"),
        (dict(mlp__routing__n_groups=2), "model.mlp.routing.n_groups"),
        (dict(mlp__n_shared_experts=0), "model.mlp.n_shared_experts"),
        (dict(kinds__full__mlp__kind="swiglu"), "model.layers.kinds.full.mlp.kind"),
    ],
)
def test_config_to_hf_refuses_what_afmoe_cannot_hold(fields, field):
    cfg = changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "afmoe-sliding-nope")), **fields)
    parity.check_refuses(lambda: config_to_hf(cfg), field, "Hugging Face AFMoE")


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(attention_bias=True), "AfmoeConfig.attention_bias"),
        (dict(num_shared_experts=0), "AfmoeConfig.num_shared_experts"),
        (dict(hidden_act="relu"), "AfmoeConfig.hidden_act"),
        (dict(rope_parameters=GPT_OSS_YARN), "AfmoeConfig.rope_parameters.rope_type"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "afmoe-sliding-nope", **changes)), field)
