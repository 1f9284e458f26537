"""Hugging Face parity of Laguna (archlab/interop/families/laguna.py): a softplus output gate per head or per
value dim (``gate_activation: softplus``), per-head QK-norm, sliding layers and full ones each with their
own RoPE (the full ones rotating half of each head), any layer its own head count, dense SwiGLU layers
beside sigmoid-routed MoE ones with a correction bias, a routed scale and a shared expert.

Tiny random models (every parameter and correction bias redrawn; GQA; a window of 4 under 12 tokens) give
HF eager's float32 logits and map back to the family; every token's experts are HF's; archlab -> HF ->
archlab gives back every tensor bit for bit; greedy and left-padded generation equal HF ``generate``; a
save_pretrained directory (its checkpoint names, each expert apart) loads and saves again; the softplus
moves the logits against a sigmoid; what the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

ROPE = {
    "full_attention": {"rope_type": "default", "rope_theta": 500000.0, "partial_rotary_factor": 0.5},
    "sliding_attention": {"rope_type": "default", "rope_theta": 10000.0, "partial_rotary_factor": 1.0},
}
HF = dict(HF_SIZES, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=16, **NO_TOKENS)
HF |= dict(intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8)
HF |= dict(num_experts_per_tok=2, sliding_window=WINDOW, rope_parameters=ROPE)
HF |= dict(layer_types=["sliding_attention", "full_attention", "sliding_attention"])
CLASSES = ("LagunaForCausalLM", "LagunaConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "laguna-per-head": (*CLASSES, HF),  # its first layer dense, as LagunaConfig's default
    "laguna-per-element-heads-by-layer": (
        *CLASSES,
        dict(
            HF,
            gating="per-element",
            num_attention_heads_per_layer=[4, 8, 4],
            mlp_layer_types=["sparse", "dense", "sparse"],
            moe_routed_scaling_factor=2.5,
        ),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, impl=EAGER, only=parity.ROUTED_MOE_TESTS))


def test_every_token_s_experts_and_weights_are_hf_s():
    parity.check_routed_as_hf(hf_model("laguna-per-head"))  # unscaled: HF scales after the experts


@pytest.mark.parametrize("case", list(HF_CASES))
def test_the_softplus_gate_moves_the_logits_against_a_sigmoid(case):
    model = from_hf(hf_model(case))
    parity.check_changes_logits(model, parity.changed_cfg(model.cfg, attention__gate_activation="sigmoid"))


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(attention_bias=True), "LagunaConfig.attention_bias"),
        (dict(moe_router_logit_softcapping=30.0), "LagunaConfig.moe_router_logit_softcapping"),
        (dict(shared_expert_intermediate_size=48), "LagunaConfig.shared_expert_intermediate_size"),
        (dict(mlp_layer_types=["dense"] * 3), "LagunaConfig.mlp_layer_types"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "laguna-per-head", **changes)), field)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(attention__gate_activation="sigmoid"), "model.attention.gate_activation"),
        (dict(attention__gate="none"), "model.attention.gate"),
        (dict(kinds__sliding__attention__window=6), "model.attention.window"),  # two windows
        (dict(kinds__sliding__position__theta=5e4), "model.layers.kinds.sliding.position.theta"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "laguna-per-head")), **change)
    parity.check_family_refuses("laguna", cfg, field)
