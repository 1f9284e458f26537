"""Hugging Face parity of Qwen3-MoE (archlab/interop/families/qwen3_moe.py): Qwen3's per-head QK-norm and
head_dim over a softmax-routed mixture of experts (top-k weights not renormalised), its dense layers first
(``mlp_only_layers``), attention biases.

A tiny random model (GQA; every parameter redrawn: matrices N(0, 0.2²), biases and norm scales
0.5 + N(0, 0.3²)) gives the same float32 logits in archlab and in transformers' eager attention and experts,
from HF to archlab and from the shrunk preset to HF; every MoE layer routes every token to the same experts
with the same weights; archlab -> HF -> archlab gives back every tensor bit for bit; greedy decoding (padded
batches too) equals HF ``generate``; what Qwen3-MoE cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "qwen3_moe-dense-first-biases": (
        "Qwen3MoeForCausalLM",
        "Qwen3MoeConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            **NO_TOKENS,
            intermediate_size=96,
            moe_intermediate_size=32,
            num_key_value_heads=2,
            head_dim=24,
            attention_bias=True,
            num_experts=6,
            num_experts_per_tok=3,
            norm_topk_prob=False,
            mlp_only_layers=[0],
        ),
    ),
}
TINY = ["model.vocab_size=96", "model.context_length=64", "model.n_layer=3", "model.mlp.d_ff=96"]
# the preset shrunk, its routing kept
PRESET = ["model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2", "model.attention.head_dim=24"]
PRESET += ["model.mlp.routing.n_experts=6", "model.mlp.routing.top_k=3", "model.mlp.expert_d_ff=32"]


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "qwen3_moe-dense-first-biases", seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        impl=EAGER,
        only=(
            "test_from_hf_gives_hf_logits",
            "test_hf_to_archlab_to_hf_and_back",
            "test_greedy_generation_matches_hf_generate",
            "test_padded_batch_generation_matches_hf_generate",
        ),
    )
)


def test_from_hf_reads_the_family_s_parts():
    qwen = from_hf(hf_model()).cfg
    assert (qwen.attention.qk_norm, qwen.attention.head_dim, qwen.attention.qkv_bias, qwen.attention.out_bias) == (
        "head",
        24,
        True,
        True,
    )
    assert (parity.mlp_kinds(qwen), qwen.mlp.d_ff, qwen.mlp.expert_d_ff, qwen.mlp.routing.normalize_top_k) == (
        ["swiglu", "moe", "moe"],  # mlp_only_layers [0]: a layer kind of one SwiGLU
        96,
        32,
        False,
    )


def test_every_token_is_routed_as_hf_routes_it():
    """In every MoE layer, the experts archlab's forward chooses for every token (from its own hidden
    states) are HF's, and on HF's hidden states its router gives HF's weights."""
    parity.check_routed_as_hf(hf_model(seed=8))


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """The shrunk preset converts to its family's HF class with the same logits (HF eager), and back to
    archlab with every tensor bit for bit."""
    parity.check_exports(compose_model(["model=qwen3-30b-a3b", *TINY, *PRESET]), "Qwen3MoeForCausalLM", **EAGER)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.mlp.routing.routed_scale=2.0"], "model.mlp.routing.routed_scale"),
        (["model.mlp.routing.n_groups=8", "model.mlp.routing.top_groups=4"], "model.mlp.routing.n_groups"),
    ],
)
def test_config_to_hf_refuses_what_the_family_cannot_hold(overrides, field):
    parity.check_refuses(
        lambda: config_to_hf(compose_model(["model=qwen3-30b-a3b", *overrides])), field, "Hugging Face"
    )


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(decoder_sparse_step=2), "Qwen3MoeConfig.decoder_sparse_step"),
        (dict(mlp_only_layers=[1]), "Qwen3MoeConfig.mlp_only_layers"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    config = parity.hf_config(HF_CASES, "qwen3_moe-dense-first-biases", **changes)
    parity.check_refuses(lambda: config_from_hf(config), field)
