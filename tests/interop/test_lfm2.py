"""Hugging Face parity of LFM2 and LFM2-MoE (archlab/interop/families/lfm2.py, model_types lfm2, lfm2_moe):
gated short-convolution layers beside GQA layers with a per-head QK-norm, as ``layer_types`` says; LFM2's MLP
width from its ``block_auto_adjust_ff_dim`` rule; LFM2-MoE's sigmoid router with a selection-only expert bias
and dense first layers.

Tiny random models (every parameter redrawn: matrices N(0, 0.2²), norm scales and the convolutions' biases
0.5 + N(0, 0.3²), far from 0 and 1; LFM2-MoE's ``expert_bias`` buffers N(0, 0.3²)) give HF's float32 eager
logits; archlab -> HF -> archlab is bit-identical; a save_pretrained directory (LFM2-MoE's experts saved
apart as w1, w3, w2) reads back; greedy and left-padded batched generation equal HF ``generate`` (its conv
layers zero the padded inputs, as archlab's short_conv does); what the families cannot hold is refused both
ways, naming the field."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.config.layers import layer_configs
from archlab.interop.families import FAMILIES
from archlab.interop.hf import config_from_hf, from_hf
from archlab.nn.validation import ignored

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

CONV, FULL = "conv", "full_attention"
BASE = dict(HF_SIZES, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
# case -> (model class, config class, config keys)
HF_CASES = {
    # the width rule at work: int(2·100/3) = 66, ·1.5 = 99, up to a multiple of 16: 112
    "lfm2": (
        "Lfm2ForCausalLM",
        "Lfm2Config",
        dict(
            BASE,
            num_hidden_layers=4,
            layer_types=[CONV, CONV, FULL, CONV],
            intermediate_size=100,
            block_ffn_dim_multiplier=1.5,
            block_multiple_of=16,
        ),
    ),
    # attention first, the convolutions' biases, a wider kernel, linear RoPE scaling, an untied head; heads
    # of 8 (a head_dim the class reads where set: 4 · 8 < hidden 64); the width rule off: intermediate_size
    "lfm2-biases": (
        "Lfm2ForCausalLM",
        "Lfm2Config",
        dict(
            BASE,
            num_hidden_layers=3,
            layer_types=[FULL, CONV, CONV],
            conv_bias=True,
            conv_L_cache=4,
            head_dim=8,
            intermediate_size=96,
            block_auto_adjust_ff_dim=False,
            rope_parameters=dict(rope_type="linear", rope_theta=1e4, factor=2.0),
            tie_word_embeddings=False,
        ),
    ),
    # a dense first layer, then MoE: expert bias, renormalised, scaled by 1.5
    "lfm2-moe": (
        "Lfm2MoeForCausalLM",
        "Lfm2MoeConfig",
        dict(
            BASE,
            num_hidden_layers=4,
            layer_types=[CONV, FULL, CONV, FULL],
            intermediate_size=48,
            moe_intermediate_size=16,
            num_experts=6,
            num_experts_per_tok=2,
            num_dense_layers=1,
            routed_scaling_factor=1.5,
        ),
    ),
    # every layer MoE, no expert bias, the top-k weights as scored, convolution biases
    "lfm2-moe-plain": (
        "Lfm2MoeForCausalLM",
        "Lfm2MoeConfig",
        dict(
            BASE,
            num_hidden_layers=3,
            layer_types=[CONV, CONV, FULL],
            intermediate_size=48,
            moe_intermediate_size=16,
            num_experts=4,
            num_experts_per_tok=2,
            num_dense_layers=0,
            use_expert_bias=False,
            norm_topk_prob=False,
            conv_bias=True,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    """The case's model, every parameter redrawn, and LFM2-MoE's ``expert_bias`` buffers too."""
    hf = parity.hf_case(HF_CASES, case, seed, **EAGER)
    g = torch.Generator().manual_seed(seed + 100)
    with torch.no_grad():
        for name, b in hf.named_buffers():
            if name.endswith("expert_bias"):
                b.copy_(torch.randn(b.shape, generator=g) * 0.3)
    return hf


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name; left-padded generation where
# the convolutions have no biases (see test_hf_s_padding_leaks_the_convolutions_biases)
BOTH_WAYS = ("test_the_family_converts_both_ways", "test_greedy_generation_matches_hf_generate")
globals().update(parity.family_tests(hf_model, HF_CASES, impl=EAGER, only=BOTH_WAYS))
UNBIASED = {case: v for case, v in HF_CASES.items() if not v[2].get("conv_bias")}
globals().update(parity.family_tests(hf_model, UNBIASED, only=("test_padded_batch_generation_matches_hf_generate",)))


def test_hf_s_padding_leaks_the_convolutions_biases():
    """With conv_bias, HF zeroes a padded position's layer input, not its gated product: in_proj's biases
    reach the convolution, so a left-padded row's logits differ from the row alone. archlab's short_conv
    zeroes the gated product: its padded row gives HF's logits of the row alone."""
    hf = hf_model("lfm2-biases")
    model = from_hf(hf)
    row = parity.IDS[:1, :8]
    ids, mask = torch.cat((torch.zeros(1, 4, dtype=torch.long), row), 1), torch.tensor([[0] * 4 + [1] * 8])
    with torch.no_grad():
        alone = hf(row).logits
        hf_padded = hf(ids, attention_mask=mask).logits[:, 4:]
        ours = model(ids, attention_mask=mask)[:, 4:]
    assert parity.max_diff(hf_padded, alone) > 1e-3
    assert parity.max_diff(ours, alone) <= parity.TOL


def test_the_expert_bias_changes_the_experts_chosen():
    parity.check_correction_bias_moves_logits(from_hf(hf_model("lfm2-moe")))


def test_the_layer_kinds_and_width_read_from_the_config():
    """layer_types become kinds (conv: short_conv of conv_L_cache; _dense on LFM2-MoE's first
    num_dense_layers), in the shortest first and pattern; LFM2's d_ff is its width rule's; no field is set
    that its part does not read."""
    lfm2 = config_from_hf(parity.hf_config(HF_CASES, "lfm2"))
    assert ignored(lfm2) == []
    assert (lfm2.layers.first, lfm2.layers.pattern, lfm2.mlp.d_ff) == ([], ["conv", "conv", "attention"], 112)
    assert lfm2.layers.kinds["conv"] == {"attention": {"kind": "short_conv", "conv_kernel": 3, "bias": False}}
    assert config_from_hf(parity.hf_config(HF_CASES, "lfm2-biases")).mlp.d_ff == 96
    # int(2·100/3) = 66, times 1.0, up to a multiple of 256
    assert (
        config_from_hf(parity.hf_config(HF_CASES, "lfm2", block_ffn_dim_multiplier=1.0, block_multiple_of=256)).mlp.d_ff
        == 256
    )
    moe = config_from_hf(parity.hf_config(HF_CASES, "lfm2-moe"))
    assert ignored(moe) == []
    assert (moe.layers.first, moe.layers.pattern) == (["conv_dense"], ["attention", "conv"])
    assert [lc.mlp.kind for lc in layer_configs(moe)] == ["swiglu", "moe", "moe", "moe"]
    r = moe.mlp.routing
    assert (r.scoring, r.correction_bias, r.normalize_top_k, r.routed_scale) == ("sigmoid", True, True, 1.5)


def test_config_to_hf_writes_the_width_itself():
    """The width rule's d_ff goes back as intermediate_size with the rule off, and HF builds it."""
    hf = parity.record_to_hf(from_hf(hf_model("lfm2")), "lfm2", **EAGER)
    assert (hf.config.intermediate_size, hf.config.block_auto_adjust_ff_dim) == (112, False)
    assert hf.model.layers[0].feed_forward.w1.out_features == 112


@pytest.mark.parametrize(
    "case, field, value",
    [
        ("lfm2-moe", "mlp__routing__routed_scale", 1.0),
        ("lfm2-moe", "mlp__routing__normalize_top_k", False),
    ],
)
def test_each_part_changes_the_logits(case, field, value):
    model = from_hf(hf_model(case))
    parity.check_changes_logits(model, parity.changed_cfg(model.cfg, **{field: value}))


@pytest.mark.parametrize(
    "case, changes, field",
    [
        ("lfm2", dict(layer_types=[CONV, "sliding_attention", FULL, CONV]), "Lfm2Config.layer_types"),
        (
            "lfm2",
            dict(rope_parameters=dict(rope_type="default", rope_theta=1e4, partial_rotary_factor=0.5)),
            "Lfm2Config.rope_parameters.partial_rotary_factor",
        ),
        ("lfm2-moe", dict(layer_types=None), "Lfm2MoeConfig.layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(case, changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, case, **changes)), field)


@pytest.mark.parametrize(
    "case, fields, field",
    [
        ("lfm2", dict(kinds__conv__attention__conv_kernel=5), None),  # one kind: any kernel
        ("lfm2-moe", dict(kinds__conv__attention__conv_kernel=5), "model.layers.kinds.conv.attention.conv_kernel"),
        ("lfm2", dict(attention__qk_norm="none"), "model.attention.qk_norm"),
        ("lfm2", dict(attention__qkv_bias=True), "model.attention.qkv_bias"),
        ("lfm2", dict(kinds__attention__attention__window=4), "model.layers.kinds.attention.attention.window"),
        ("lfm2", dict(mlp__bias=True), "model.mlp.bias"),
        ("lfm2-moe", dict(mlp__n_shared_experts=1), "model.mlp.n_shared_experts"),
        ("lfm2-moe", dict(mlp__routing__scoring="softmax"), "model.mlp.routing.scoring"),
        ("lfm2-moe", dict(kinds__conv__mlp__kind="swiglu"), "model.layers.kinds.conv.mlp.kind"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(case, fields, field):
    """Each field the record cannot hold is named (the conv kinds of LFM2-MoE's dense and MoE layers hold
    one kernel between them; a dense layer after a MoE one is named by its kind's MLP)."""
    model_type = HF_CASES[case][1].removesuffix("Config").lower().replace("moe", "_moe")
    cfg = config_from_hf(parity.hf_config(HF_CASES, case))
    problems = [p.field for p in FAMILIES[model_type].problems(parity.changed_cfg(cfg, **fields))]
    assert problems == ([] if field is None else [field])
