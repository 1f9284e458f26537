"""Hugging Face parity of Zamba (ZambaForCausalLM): tiny random models of Mamba-1 layers split into heads
(archlab's ``mamba`` with ``heads``) with one weight-shared transformer block before the ``hybrid`` layers
(archlab's ``model.layers.shared``; every parameter redrawn: biases, norm scales, A_log, dt_proj's bias, D
0.5 + N(0, 0.3²)) give the same float32 logits in archlab and in transformers' torch path; greedy and left-padded
decoding equal HF ``generate``; HF -> archlab -> HF -> archlab gives back every tensor bit for bit, and a
save_pretrained directory (the block's tied copies saved once) reads back. What Zamba cannot hold is refused."""

import dataclasses

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, V, randomize

from archlab import build_model
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# 4 layers, the shared block before layers 1 and 3; Mamba-1 of 64 channels in 2 heads of 32, state 8, dt rank 4,
# conv 4; the shared attention 4 heads of 2·32/4 = 16, an MLP of 48
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=4, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2)
SMALL |= dict(n_mamba_heads=2, mamba_dt_rank=4, intermediate_size=48, num_attention_heads=4, num_key_value_heads=4)
SMALL |= dict(layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid"])
SMALL |= dict(max_position_embeddings=64, **NO_TOKENS)
HF_CASES = {
    "zamba": ("ZambaForCausalLM", "ZambaConfig", SMALL),
    # one head, GQA, biases on the Mamba projections and none on its convolution, tanh GELU
    "zamba-one-head-gqa-biases": (
        "ZambaForCausalLM",
        "ZambaConfig",
        dict(SMALL, n_mamba_heads=1, num_key_value_heads=2, mamba_proj_bias=True, mamba_conv_bias=False)
        | dict(hidden_act="gelu_pytorch_tanh"),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


MAPPED = (
    "test_from_hf_gives_hf_logits_and_maps_back_to_the_family",
    "test_hf_to_archlab_to_hf_and_back",
    "test_save_pretrained_directories_round_trip",
)
globals().update(parity.family_tests(hf_model, HF_CASES, impl=ATTN, only=MAPPED))
globals().update(
    parity.family_tests(
        hf_model, {"zamba": HF_CASES["zamba"]}, impl=ATTN, only=("test_generation_matches_hf_generate",)
    )
)


def test_greedy_generation_with_one_head_grouped_heads_and_biases_equals_hf():
    parity.check_greedy_generation(hf_model("zamba-one-head-gqa-biases"))


def test_from_hf_reads_the_heads_and_the_shared_block():
    cfg = from_hf(hf_model("zamba")).cfg
    a, s = cfg.attention, cfg.layers.shared
    assert (a.kind, a.heads, a.inner, a.dt_rank, a.state_size, a.bias, a.conv_bias) == (
        "mamba",
        2,
        None,
        4,
        8,
        False,
        True,
    )
    assert (s.layers, s.blocks, s.n_head, s.n_kv_head, s.d_ff, s.adapter_rank, s.rope) == (
        [1, 3],
        1,
        4,
        None,
        48,
        0,
        False,
    )
    assert (cfg.mlp.kind, cfg.head.tied, cfg.norm.kind) == ("none", True, "rmsnorm")


def test_an_archlab_layout_converts_to_hf_and_back():
    cfg = from_hf(hf_model("zamba")).cfg
    parity.check_to_hf_and_back(randomize(build_model(cfg), 3), "ZambaForCausalLM", attn_implementation="eager")


def test_what_zamba_cannot_hold_is_refused():
    cfg = from_hf(hf_model("zamba")).cfg

    def with_shared(**fields):
        shared = dataclasses.replace(cfg.layers.shared, **fields)
        return dataclasses.replace(cfg, layers=dataclasses.replace(cfg.layers, shared=shared))

    parity.check_family_refuses("zamba", with_shared(adapter_rank=2), "model.layers.shared.adapter_rank")
    parity.check_family_refuses("zamba", with_shared(layers=[1, 2, 3], blocks=2), "model.layers.shared.blocks")
    parity.check_family_refuses("zamba", with_shared(rope=True), "model.layers.shared.rope")
    parity.check_family_refuses("zamba", with_shared(layers=[]), "model.layers.shared.layers")
    # Mamba's own family holds one head only, and no shared blocks
    parity.check_family_refuses("mamba", with_shared(layers=[]), "model.attention.heads")


@pytest.mark.parametrize(
    ("key", "value"),
    [
        ("tie_word_embeddings", False),
        ("attention_head_dim", 8),
        ("hidden_mamba_act", "gelu"),
        ("attention_dropout", 0.1),
    ],
)
def test_a_zamba_config_archlab_cannot_hold_is_refused(key, value):
    c = parity.hf_config(HF_CASES, "zamba", **{key: value})
    parity.check_refuses(lambda: config_from_hf(c), f"ZambaConfig.{key}")
