"""Hugging Face parity of Qwen2-MoE (archlab/interop/families/qwen2_moe.py): Qwen2's attention (q/k/v biases,
none on o_proj) over a softmax-routed mixture of SwiGLU experts beside a shared expert gated by
sigmoid(shared_expert_gate(x)), its dense layers first (``mlp_only_layers``).

A tiny random model (GQA; every parameter redrawn: matrices N(0, 0.2²), biases and norm scales
0.5 + N(0, 0.3²)) gives the same float32 logits in archlab and in transformers' eager attention and experts;
every MoE layer routes every token to the same experts with the same weights; archlab -> HF -> archlab gives
back every tensor bit for bit; greedy decoding (padded batches too) equals HF ``generate``; a save_pretrained
directory (each routed expert saved apart) loads; what Qwen2-MoE cannot hold is refused both ways, naming the
field."""

import pytest
from helpers import hf as parity
from helpers.hf import EAGER, HF_SIZES, NO_TOKENS

from archlab import compose_model, count_params
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "qwen2_moe-dense-first": (
        "Qwen2MoeForCausalLM",
        "Qwen2MoeConfig",
        dict(
            HF_SIZES,
            num_hidden_layers=3,
            num_attention_heads=4,
            **NO_TOKENS,
            intermediate_size=96,
            moe_intermediate_size=32,
            shared_expert_intermediate_size=64,
            num_key_value_heads=2,
            num_experts=6,
            num_experts_per_tok=3,
            norm_topk_prob=False,
            mlp_only_layers=[0],
        ),
    ),
}


def hf_model(seed: int = 1):
    return parity.hf_case(HF_CASES, "qwen2_moe-dense-first", seed, **EAGER)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, impl=EAGER, only=parity.MAPPED_TESTS))


def test_from_hf_reads_the_family_s_parts_and_counts_them():
    """Two shared experts' worth (64 = 2 × 32) beside the routed ones, gated; q/k/v biases, none on o_proj;
    the count is HF's."""
    qwen = from_hf(hf_model()).cfg
    assert (qwen.attention.qkv_bias, qwen.attention.out_bias, qwen.attention.qk_norm) == (True, False, "none")
    assert (parity.mlp_kinds(qwen), qwen.mlp.n_shared_experts, qwen.mlp.shared_expert_gate) == (
        ["swiglu", "moe", "moe"],
        2,
        True,
    )
    assert count_params(qwen)["total"] == sum(p.numel() for p in hf_model().parameters())


def test_every_token_is_routed_as_hf_routes_it():
    parity.check_routed_as_hf(hf_model(seed=8))


def test_archlab_to_hf_to_archlab_is_bit_identical():
    """Its layout built in archlab converts to Qwen2-MoE with the same logits (HF eager), and back with every
    tensor bit for bit."""
    layout = ["model=qwen3-30b-a3b", "model.vocab_size=96", "model.context_length=64", "model.n_layer=3"]
    layout += ["model.d_model=64", "model.attention.n_head=4", "model.attention.n_kv_head=2"]
    layout += ["model.attention.head_dim=16", "model.attention.qk_norm=none", "model.attention.qkv_bias=true"]
    layout += ["model.attention.out_bias=false", "model.mlp.routing.n_experts=6", "model.mlp.routing.top_k=3"]
    layout += ["model.mlp.expert_d_ff=32", "model.mlp.n_shared_experts=1", "model.mlp.shared_expert_gate=true"]
    parity.check_exports(compose_model(layout), "Qwen2MoeForCausalLM", **EAGER)


def test_config_to_hf_refuses_what_the_family_cannot_hold():
    cfg = parity.changed_cfg(from_hf(hf_model()).cfg, mlp__shared_expert_gate=False)
    parity.check_family_refuses("qwen2_moe", cfg, "model.mlp.shared_expert_gate")


@pytest.mark.parametrize(
    "changes, field",
    [
        (dict(decoder_sparse_step=2), "Qwen2MoeConfig.decoder_sparse_step"),
        (dict(mlp_only_layers=[1]), "Qwen2MoeConfig.mlp_only_layers"),
        (dict(shared_expert_intermediate_size=48), "Qwen2MoeConfig.shared_expert_intermediate_size"),
        (dict(use_sliding_window=True), "Qwen2MoeConfig.use_sliding_window"),
    ],
)
def test_config_from_hf_refuses_what_archlab_cannot_hold(changes, field):
    config = parity.hf_config(HF_CASES, "qwen2_moe-dense-first", **changes)
    parity.check_refuses(lambda: config_from_hf(config), field)
