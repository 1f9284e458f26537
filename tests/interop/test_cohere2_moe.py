"""Hugging Face parity of Cohere2-MoE (archlab/interop/families/cohere2_moe.py): Cohere 2's parallel layers
(local RoPE, global NoPE, logit scale) with a top-k MoE, summed shared experts and a dense first layer that
rotates though full (``prefix_dense_sliding_window_pattern`` 1).

A tiny random model (every parameter redrawn; GQA; a window of 4 under 12 tokens) gives HF eager's float32
logits in archlab, exports to its own family and back bit for bit, loads from a save_pretrained directory
and decodes as HF ``generate`` does. What the record cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS, WINDOW

from archlab.config.layers import layer_configs
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "cohere2_moe": (
        "Cohere2MoeForCausalLM",
        "Cohere2MoeConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            sliding_window=WINDOW,
            **NO_TOKENS,
            num_key_value_heads=2,
            head_dim=16,
            intermediate_size=32,
            prefix_dense_intermediate_size=96,
            num_experts=4,
            num_experts_per_tok=2,
            num_shared_experts=2,
            shared_expert_combination_strategy="sum",
            layer_types=["full_attention", "sliding_attention", "full_attention"],
            mlp_layer_types=["dense", "sparse", "sparse"],
            attention_bias=True,
            logit_scale=0.3,
            tie_word_embeddings=False,
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "cohere2_moe", seed, **EAGER)


def test_family_gives_hf_logits_and_round_trips(tmp_path):
    """HF's logits, its dense layers where HF builds a dense MLP; archlab -> HF -> archlab bit for bit; a
    save_pretrained directory loads and saves again."""
    hf = hf_model()
    model = parity.check_from_hf(hf)
    parity.check_dense_layers_as_hf(hf, model)
    parity.check_back_and_again(hf, model, **EAGER)
    parity.check_directory_round_trip(hf, tmp_path, **EAGER)


def test_read_values():
    """The rotating dense full layer and the logit scale."""
    cohere = config_from_hf(hf_model().config)
    assert [lc.position.kind for lc in layer_configs(cohere)] == ["rope", "rope", "none"]
    assert cohere.head.logit_scale == 0.3


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, only=("test_generation_matches_hf_generate",)))


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(shared_expert_combination_strategy="average"), "Cohere2MoeConfig.shared_expert_combination_strategy"),
        (dict(num_experts=0), "Cohere2MoeConfig.num_experts"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    parity.check_refuses(lambda: config_from_hf(parity.hf_config(HF_CASES, "cohere2_moe", **changes)), field)


def test_holds_average_without_shared_experts():
    """'average' (its default) combines nothing where there are no shared experts: read as any other."""
    config = parity.hf_config(
        HF_CASES, "cohere2_moe", num_shared_experts=0, shared_expert_combination_strategy="average"
    )
    assert config_from_hf(config).mlp.n_shared_experts == 0


@pytest.mark.parametrize(
    "fields, field",
    [
        (dict(kinds__full__position__kind="rope"), "model.layers.kinds.full.position.kind"),
        (dict(mlp__routing__routed_scale=2.0), "model.mlp.routing.routed_scale"),
    ],
)
def test_records_refuse_layouts_they_cannot_hold(fields, field):
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, **fields)
    parity.check_family_refuses("cohere2_moe", cfg, field)
