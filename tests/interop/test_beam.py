"""Hugging Face parity of Beam (archlab/interop/families/beam.py): sandwich blocks with depth-scaled adds
(``block.residual_rule: depth``), an elementwise output gate with a bias per head (``gate_head_bias``),
per-head QK-norm, sliding RoPE layers beside full NoPE ones whose queries are scaled by (1 + (p + 1)/2048)^0.1
at each row's position (``query_scale_form: power``, ``query_scale_by: position``), dense SwiGLU layers beside
DeepSeek-V3-routed MoE ones, a final logit soft-cap.

Tiny random models (every parameter, the gate biases and correction biases redrawn) give HF eager's
float32 logits and map back to the family; every token's experts are HF's; archlab -> HF -> archlab gives
back every tensor bit for bit; greedy and left-padded generation equal HF ``generate`` (the padded rows'
query scales at their own positions); a save_pretrained directory loads; what the record cannot hold is
refused both ways. The gate bias and the query scale are held to BeamAttention in tests/test_gate_head_bias.py."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF = dict(HF_SIZES, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, **NO_TOKENS)
HF |= dict(intermediate_size=96, moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, n_group=2)
HF |= dict(topk_group=1, sliding_window=WINDOW, routed_scaling_factor=2.5, final_logit_softcapping=3.0)
HF |= dict(layer_types=["sliding_attention", "full_attention", "sliding_attention"])
HF |= dict(mlp_layer_types=["dense", "sparse", "sparse"])
CLASSES = ("BeamForCausalLM", "BeamConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "beam": (*CLASSES, HF),
    "beam-full-first-ungrouped": (
        *CLASSES,
        dict(
            HF,
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            mlp_layer_types=["sparse", "dense", "sparse"],
            n_group=1,
            topk_group=1,
            norm_topk_prob=False,
            final_logit_softcapping=None,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        impl=EAGER,
        only=(*parity.MAPPED_TESTS, "test_padded_batch_generation_matches_hf_generate"),
    )
)


@pytest.mark.parametrize("case", list(HF_CASES))
def test_every_token_s_experts_and_weights_are_hf_s(case):
    """At routed_scaling_factor 1: HF scales after the experts, archlab the weights."""
    model, classes, keys = HF_CASES[case]
    parity.check_routed_as_hf(
        parity.hf_case({case: (model, classes, dict(keys, routed_scaling_factor=1.0))}, case, **EAGER)
    )


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(attention_bias=True), "BeamConfig.attention_bias"),
        (
            dict(
                rope_parameters={
                    "sliding_attention": {"rope_type": "default", "rope_theta": 1e4},
                    "full_attention": {"rope_type": "default", "rope_theta": 1e4},
                }
            ),
            "BeamConfig.rope_parameters.full_attention",
        ),
        (dict(mlp_layer_types=["dense"] * 3), "BeamConfig.mlp_layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "beam", **changes)), field)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(attention__gate_head_bias=False), "model.attention.gate_head_bias"),
        (dict(block__residual_rule="constant"), "model.block.residual_rule"),
        (dict(kinds__full__attention__query_scale_offset=0), "model.layers.kinds.full.attention.query_scale_offset"),
        (
            dict(kinds__full__attention__query_scale_form="log"),
            "model.layers.kinds.full.attention.query_scale_form",
        ),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(from_hf(hf_model("beam")).cfg, **change)
    parity.check_family_refuses("beam", cfg, field)
