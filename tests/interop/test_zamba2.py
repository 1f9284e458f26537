"""Hugging Face parity of Zamba2 (Zamba2ForCausalLM): tiny random models of Mamba-2 layers with weight-shared
transformer blocks before the ``hybrid`` ones (archlab's ``model.layers.shared``; every parameter redrawn:
biases, norm scales, A_log, dt_bias, D 0.5 + N(0, 0.3²)), two blocks used round-robin with RoPE and q/k/v
adapters, or one block with grouped key/value heads and biases, give the same float32 logits in archlab and
in transformers' torch path; greedy and left-padded decoding equal HF ``generate`` (each use caching its own
keys and values); HF -> archlab -> HF -> archlab gives back every tensor bit for bit, and a save_pretrained
directory (the blocks' tied copies saved once) reads back. What Zamba2 cannot hold is refused naming it."""

import dataclasses

import pytest
import torch
from helpers import hf as parity
from helpers.hf import ATTN, NO_TOKENS, TOL, V, max_diff, randomize

from archlab import build_model
from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# 5 layers, shared-block uses before layers 1, 3 and 4 (blocks 0, 1, 0); Mamba-2 4 heads of 16, 2 groups of B and
# C of 8, conv 4, chunks of 5; the shared attention 4 heads of 2·32/4 = 16, an MLP of 48, adapters of rank 4
SMALL = dict(vocab_size=V, hidden_size=32, num_hidden_layers=5, mamba_d_state=8, mamba_d_conv=4, mamba_expand=2)
SMALL |= dict(mamba_ngroups=2, n_mamba_heads=4, chunk_size=5, intermediate_size=48, num_attention_heads=4)
SMALL |= dict(layers_block_type=["linear_attention", "hybrid", "linear_attention", "hybrid", "hybrid"])
SMALL |= dict(num_mem_blocks=2, adapter_rank=4, max_position_embeddings=64, **NO_TOKENS)
ONE_BLOCK = dict(SMALL, num_hidden_layers=3, layers_block_type=["hybrid", "linear_attention", "hybrid"])
ONE_BLOCK |= dict(num_mem_blocks=1, num_key_value_heads=2, add_bias_linear=True, hidden_act="gelu_pytorch_tanh")
HF_CASES = {
    "zamba2": (
        "Zamba2ForCausalLM",
        "Zamba2Config",
        dict(SMALL, use_shared_attention_adapter=True, use_mem_rope=True),
    ),
    "zamba2-one-block-gqa-biases": ("Zamba2ForCausalLM", "Zamba2Config", ONE_BLOCK),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


MAPPED = (
    "test_from_hf_gives_hf_logits_and_maps_back_to_the_family",
    "test_hf_to_archlab_to_hf_and_back",
    "test_save_pretrained_directories_round_trip",
)
globals().update(parity.family_tests(hf_model, HF_CASES, impl=ATTN, only=MAPPED))
# left padding with add_bias_linear: transformers' padded rows differ from each prompt alone (as Mamba-2's)
globals().update(
    parity.family_tests(
        hf_model, {"zamba2": HF_CASES["zamba2"]}, impl=ATTN, only=("test_generation_matches_hf_generate",)
    )
)


def test_greedy_generation_with_biases_and_grouped_heads_equals_hf():
    parity.check_greedy_generation(hf_model("zamba2-one-block-gqa-biases"))


def test_from_hf_reads_the_shared_blocks():
    s = from_hf(hf_model("zamba2")).cfg.layers.shared
    assert (s.layers, s.blocks, s.n_head, s.n_kv_head, s.d_ff, s.activation) == ([1, 3, 4], 2, 4, None, 48, "gelu")
    assert (s.adapter_rank, s.attention_adapters, s.rope, s.mlp_bias) == (4, True, True, False)
    cfg = from_hf(hf_model("zamba2-one-block-gqa-biases")).cfg
    s, a = cfg.layers.shared, cfg.attention
    assert (s.layers, s.blocks, s.n_kv_head, s.activation, s.attention_adapters, s.rope) == (
        [0, 2],
        1,
        2,
        "gelu_tanh",
        False,
        False,
    )
    assert (a.kind, a.n_head, a.head_dim, a.groups, a.qkv_bias, a.out_bias, s.mlp_bias) == (
        "mamba2",
        4,
        16,
        2,
        True,
        True,
        True,
    )
    assert (a.dt_limit_min, a.conv_bias, cfg.mlp.kind, cfg.head.tied) == (a.dt_min, True, "none", True)


def test_an_archlab_layout_converts_to_hf_and_back():
    """A model of the first case's layout, its weights redrawn, to Zamba2ForCausalLM: the same logits, and
    back with every tensor bit for bit."""
    cfg = from_hf(hf_model("zamba2")).cfg
    parity.check_to_hf_and_back(randomize(build_model(cfg), 3), "Zamba2ForCausalLM", attn_implementation="eager")


def test_what_zamba2_cannot_hold_is_refused():
    cfg = from_hf(hf_model("zamba2")).cfg
    shared = cfg.layers.shared

    def with_shared(**fields):
        return dataclasses.replace(
            cfg, layers=dataclasses.replace(cfg.layers, shared=dataclasses.replace(shared, **fields))
        )

    parity.check_family_refuses(
        "zamba2", dataclasses.replace(cfg, head=dataclasses.replace(cfg.head, tied=False)), "model.head.tied"
    )
    parity.check_family_refuses("zamba2", with_shared(mlp_bias=True), "model.layers.shared.mlp_bias")
    parity.check_family_refuses("zamba2", with_shared(n_kv_head=2), "model.layers.shared.n_kv_head")
    parity.check_family_refuses("zamba2", with_shared(layers=[], blocks=1), "model.layers.shared.layers")
    eps = dataclasses.replace(cfg, norm=dataclasses.replace(cfg.norm, eps=1e-6))
    parity.check_family_refuses("zamba2", eps, "model.norm.eps")
    parity.check_family_refuses("mamba2", cfg, "model.layers.shared.layers")  # a family of its mixer, no shared blocks


@pytest.mark.parametrize(
    ("key", "value"),
    [("tie_word_embeddings", False), ("rms_norm_eps", 1e-6), ("adapter_rank", 0), ("attention_dropout", 0.1)],
)
def test_a_zamba2_config_archlab_cannot_hold_is_refused(key, value):
    """An untied Zamba2 (whose shared blocks transformers then leaves untied too), another eps than its gated
    norm's, no adapters, attention dropout: each refused naming its key."""
    c = parity.hf_config(HF_CASES, "zamba2", **{key: value})
    parity.check_refuses(lambda: config_from_hf(c), f"Zamba2Config.{key}")


def test_left_padding_with_biases_computes_each_prompt_as_alone():
    """With ``add_bias_linear`` HF's padded row differs from the prompt alone (measured 0.64); archlab's gives
    its logits alone."""
    hf = hf_model("zamba2-one-block-gqa-biases")
    model = from_hf(hf)
    short = torch.randint(0, V, (1, 3), generator=torch.Generator().manual_seed(3))
    long = torch.randint(0, V, (1, 7), generator=torch.Generator().manual_seed(7))
    batch = torch.cat((torch.cat((torch.zeros(1, 4, dtype=torch.long), short), 1), long))
    mask = torch.tensor([[0] * 4 + [1] * 3, [1] * 7])
    with torch.no_grad():
        assert max_diff(hf(batch, attention_mask=mask).logits[0, 4:], hf(short).logits[0]) > 1e-3
        assert max_diff(model(batch, attention_mask=mask)[0, 4:], hf(short).logits[0]) <= TOL
