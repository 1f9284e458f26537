"""Hugging Face parity of JetMoE (archlab/interop/families/jetmoe.py): ``moa`` attention (routed query/output
projections over shared keys and values) and a softmax top-k MoE with an output bias (``model.mlp.out_bias``).

Tiny random models (every parameter redrawn: biases and norm scales away from 0 and 1) give HF eager's float32
logits and map back to the family; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and
left-padded generation equal HF ``generate``; a save_pretrained directory loads; what the record cannot hold
is refused both ways."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

HF = dict(HF_SIZES, num_hidden_layers=2, num_key_value_heads=2, kv_channels=12, intermediate_size=32, **NO_TOKENS)
HF |= dict(num_local_experts=4, num_experts_per_tok=2)
CLASSES = ("JetMoeForCausalLM", "JetMoeConfig")
# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "jetmoe": (*CLASSES, HF),
    "jetmoe-untied-top3": (*CLASSES, dict(HF, tie_word_embeddings=False, num_experts_per_tok=3, kv_channels=8)),
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


def test_config_from_hf_refuses_another_norm_eps():
    """Its layers' RMSNorms stay at 1e-6 whatever rms_norm_eps says; archlab has one eps."""
    c = parity.hf_config(HF_CASES, "jetmoe", rms_norm_eps=1e-5)
    parity.check_refuses(lambda: config_from_hf(c), "JetMoeConfig.rms_norm_eps")


def test_an_mlp_of_other_experts_than_the_attention_s_is_refused():
    """One num_local_experts serves both routers: an MLP with its own count is refused, naming it."""
    model = from_hf(hf_model("jetmoe"))
    cfg = parity.changed_cfg(model.cfg, mlp__routing__n_experts=3)
    parity.check_refuses(lambda: config_to_hf(cfg), "model.mlp.routing.n_experts", "JetMoE")


MIXTRAL = dict(HF_SIZES, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2)
MIXTRAL |= dict(intermediate_size=32, num_local_experts=4)


def test_a_moe_output_bias_is_refused_by_mixtral():
    """``model.mlp.out_bias`` is a part other MoE families refuse, naming it."""
    cases = {"mixtral": ("MixtralForCausalLM", "MixtralConfig", MIXTRAL | NO_TOKENS)}
    cfg = parity.changed_cfg(from_hf(parity.hf_case(cases, "mixtral", **EAGER)).cfg, mlp__out_bias=True)
    parity.check_refuses(lambda: config_to_hf(cfg), "model.mlp.out_bias", "Mixtral")
