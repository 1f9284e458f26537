"""Hugging Face parity of dots.llm1 (archlab/interop/families/dots.py, model_type dots1): a sigmoid-routed
mixture of experts with a correction bias, expert groups, a shared expert and a dense first layer, under
q/k/v/o biases, a per-head QK-norm and a sliding window on every layer.

A tiny random model (GQA; every parameter redrawn: matrices N(0, 0.2²), biases and norm scales
0.5 + N(0, 0.3²), the correction biases N(0, 0.3²)) gives the same float32 logits in archlab and in
transformers' eager attention and experts; zeroing the correction bias moves them; greedy decoding (a
padded batch too) equals HF ``generate``; archlab -> HF -> archlab gives back every tensor bit for bit; a
save_pretrained directory (each expert saved apart) loads; what the family cannot hold is refused both
ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab.config.layers import layer_configs
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "dots1": (
        "Dots1ForCausalLM",
        "Dots1Config",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            **NO_TOKENS,
            intermediate_size=96,
            moe_intermediate_size=32,
            first_k_dense_replace=1,
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
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "dots1", seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        impl=EAGER,
        only=parity.ROUTED_MOE_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    dots = from_hf(hf_model()).cfg
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
    ) == ("sigmoid", True, 4, 2, 2.5, 1)
    assert [lc.mlp.kind for lc in layer_configs(dots)] == ["swiglu", "moe", "moe"]


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(attention__out_bias=False), "model.attention.out_bias"),
        (dict(mlp__n_shared_experts=0), "model.mlp.n_shared_experts"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(fields, field):
    parity.check_family_refuses("dots1", parity.changed_cfg(from_hf(hf_model()).cfg, **fields), field)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(n_shared_experts=0), "Dots1Config.n_shared_experts"),
        (dict(max_window_layers=1), "Dots1Config.layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "dots1", **changes)), field)


def test_config_to_hf_names_the_family_s_keys():
    """The config written carries the keys the class reads: the window on every layer."""
    dots = config_to_hf(from_hf(hf_model()).cfg)
    assert (dots.sliding_window, set(dots.layer_types)) == (WINDOW, {"sliding_attention"})
