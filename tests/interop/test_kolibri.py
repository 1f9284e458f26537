"""Hugging Face parity of Kolibri-1 (archlab/interop/families/kolibri.py): EXAONE 4's attention (per-head
QK-norm, sliding layers with RoPE, full layers without positions) in sandwich blocks, a sigmoid MoE on every
layer whose correction bias is added to the router's logits (``correction_on: logits``), shared experts.

Tiny random models (every parameter and correction bias redrawn; GQA; a window of 4 under 12 tokens) give
HF eager's float32 logits and map back to the family; every token's experts are HF's; zeroing the
correction bias moves the logits; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and
left-padded generation equal HF ``generate``; a save_pretrained directory (its checkpoint names,
``moe.router.expert_bias``, ``post_attn_norm``, ``post_ffn_norm``, each expert apart) loads and saves
again; what the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab.interop.hf import config_from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF = dict(HF_SIZES, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2, head_dim=32, **NO_TOKENS)
HF |= dict(moe_intermediate_size=32, shared_expert_intermediate_size=32, num_experts=8, num_experts_per_tok=2)
HF |= dict(sliding_window=WINDOW, layer_types=["sliding_attention", "full_attention", "sliding_attention"])
CLASSES = ("Kolibri1ForCausalLM", "Kolibri1Config")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "kolibri1": (*CLASSES, HF),
    "kolibri1-normalized-two-shared": (*CLASSES, dict(HF, norm_topk_prob=True, shared_expert_intermediate_size=64)),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, impl=EAGER, only=parity.ROUTED_MOE_TESTS))


@pytest.mark.parametrize("case", list(HF_CASES))
def test_every_token_s_experts_and_weights_are_hf_s(case):
    parity.check_routed_as_hf(hf_model(case))


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(shared_expert_intermediate_size=48), "Kolibri1Config.shared_expert_intermediate_size"),
        (dict(sliding_window=None, layer_types=["full_attention"] * 3), "Kolibri1Config.sliding_window"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "kolibri1", **changes)), field)


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(mlp__routing__correction_on="scores"), "model.mlp.routing.correction_on"),
        (dict(mlp__routing__routed_scale=2.5), "model.mlp.routing.routed_scale"),
        (dict(block__kind="pre"), "model.block.kind"),
        (dict(kinds__full__mlp__kind="swiglu"), "model.layers.kinds.full.mlp.kind"),  # a dense layer
        (dict(kinds__full__position__kind="rope"), "model.layers.kinds.full.position.kind"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(config_from_hf(parity.hf_config(HF_CASES, "kolibri1")), **change)
    parity.check_family_refuses("kolibri1", cfg, field)


def test_every_other_family_refuses_the_logits_correction():
    cfg = config_from_hf(parity.hf_config(HF_CASES, "kolibri1"))
    assert parity.families_holding(cfg, {"model.mlp.routing.correction_on"}) == {"kolibri1"}
