"""Hugging Face parity of PhiMoE (archlab/interop/families/phimoe.py): Mixtral's layout with LayerNorms, one
``attention_bias`` flag, a head bias, and SparseMixer's top-2 routing (``routing.sparsemixer_eps``).

Tiny random models (every parameter redrawn, router logits spread so that the 2ε mask cuts some experts and
keeps others) give HF eager's float32 logits and map back to the family; every token's experts and weights
are HF's router's; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and left-padded
generation equal HF ``generate``; a save_pretrained directory (each expert saved apart) loads; the SparseMixer
weights move the logits against plain top-2; what the record cannot hold is refused both ways."""

import pytest
import torch
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, from_hf
from archlab.nn.moe import sparsemixer

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF = dict(HF_SIZES, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2, **NO_TOKENS)
HF |= dict(intermediate_size=32, num_local_experts=6, num_experts_per_tok=2, router_jitter_noise=0.3)
CLASSES = ("PhimoeForCausalLM", "PhimoeConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "phimoe": (*CLASSES, HF),
    "phimoe-biases-window": (
        *CLASSES,
        dict(HF, attention_bias=True, lm_head_bias=True, sliding_window=4, router_jitter_noise=0.05),
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
    parity.check_routed_as_hf(hf_model(case), router="router")


def test_sparsemixer_equals_transformers_function_and_its_mask_cuts():
    """archlab's SparseMixer equals transformers' ``sparsemixer`` in eval (ε 0.01 and 0.3) on random logits,
    and its weights differ from the plain softmax's at the same experts (the mask drops far experts)."""
    from transformers.models.phimoe.modeling_phimoe import sparsemixer as hf_sparsemixer

    logits = torch.randn(64, 8, generator=torch.Generator().manual_seed(0)) * 2
    for eps in (0.01, 0.3):
        weights, indices = sparsemixer(logits, 2, eps)
        hf_weights, hf_indices = hf_sparsemixer(logits, eps, training=False)
        assert torch.equal(indices, hf_indices)
        torch.testing.assert_close(weights, hf_weights, rtol=0, atol=0)
    assert (weights != logits.softmax(-1).gather(-1, indices)).any()


def test_sparsemixer_moves_the_logits_against_plain_top_2():
    model = from_hf(hf_model("phimoe"))
    plain = parity.changed_cfg(model.cfg, mlp__routing__sparsemixer_eps=None)
    parity.check_changes_logits(model, plain)


def test_config_from_hf_refuses_other_than_two_experts():
    c = parity.hf_config(HF_CASES, "phimoe", num_experts_per_tok=3)
    parity.check_refuses(lambda: config_from_hf(c), "PhimoeConfig.num_experts_per_tok")


@pytest.mark.parametrize(
    "change, field",
    [
        (dict(mlp__routing__sparsemixer_eps=None), "model.mlp.routing.sparsemixer_eps"),
        (dict(mlp__routing__top_k=3), "model.mlp.routing.top_k"),
        (dict(norm__bias=False), "model.norm.bias"),
        (dict(attention__out_bias=False), "model.attention.out_bias"),
    ],
)
def test_the_record_refuses_a_layout_it_cannot_hold(change, field):
    cfg = parity.changed_cfg(from_hf(hf_model("phimoe-biases-window")).cfg, **change)
    parity.check_family_refuses("phimoe", cfg, field)
