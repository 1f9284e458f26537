"""Hugging Face parity of MiniMax-M2 (archlab/interop/families/minimax.py, model_type minimax_m2): a
sigmoid-routed mixture of experts with a correction bias, its QK-norm over the whole projection and partial
RoPE read from the legacy ``rotary_dim``.

A tiny random model (GQA; every parameter redrawn: matrices N(0, 0.2²), norm scales 0.5 + N(0, 0.3²), the
correction biases N(0, 0.3²)) gives the same float32 logits in archlab and in transformers' eager
attention and experts; zeroing the correction bias moves them; greedy decoding (a padded batch too)
equals HF ``generate``; archlab -> HF -> archlab gives back every tensor bit for bit; a save_pretrained
directory (each expert saved apart) loads; what the family cannot hold is refused both ways, naming the
field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "minimax_m2": (
        "MiniMaxM2ForCausalLM",
        "MiniMaxM2Config",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            num_key_value_heads=2,
            **NO_TOKENS,
            head_dim=16,
            rotary_dim=8,  # the published configs' key: partial_rotary_factor 0.5
            intermediate_size=32,
            num_local_experts=6,
            num_experts_per_tok=2,
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "minimax_m2", seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        impl=EAGER,
        only=parity.ROUTED_MOE_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    mm = from_hf(hf_model()).cfg
    assert (
        mm.attention.qk_norm,
        mm.position.rotary_fraction,
        mm.mlp.routing.correction_bias,
        mm.mlp.routing.normalize_top_k,
    ) == ("full", 0.5, True, True)


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(mlp__routing__n_groups=2, mlp__routing__top_groups=1), "model.mlp.routing.n_groups"),
        (dict(mlp__routing__normalize_top_k=False), "model.mlp.routing.normalize_top_k"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(fields, field):
    parity.check_family_refuses("minimax_m2", parity.changed_cfg(from_hf(hf_model()).cfg, **fields), field)


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(router_jitter_noise=0.1), "MiniMaxM2Config.router_jitter_noise"),
        (dict(scoring_func="softmax"), "MiniMaxM2Config.scoring_func"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "minimax_m2", **changes)), field)


def test_config_to_hf_names_the_family_s_keys():
    """The config written carries the keys the class reads: the expert count."""
    assert config_to_hf(from_hf(hf_model()).cfg).num_local_experts == 6
