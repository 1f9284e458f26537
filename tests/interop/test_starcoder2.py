"""Hugging Face parity of StarCoder 2 (archlab/interop/families/starcoder2.py): LayerNorm, pre-norm, GQA, a
sliding window, tanh-GELU, with and without biases.

Tiny random models give the same float32 logits in archlab and in transformers' eager implementation
(every parameter redrawn: biases and norm scales 0.5 + N(0, 0.3²), far from 0 and 1), from HF to archlab
and from an archlab layout to HF; archlab -> HF -> archlab gives back every tensor bit for bit; greedy and
left-padded batched decoding equal HF ``generate``; a save_pretrained directory loads; what StarCoder 2
cannot hold is refused both ways, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WINDOW, layout

from archlab.interop.hf import config_from_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "starcoder2-gqa-window": (
        "Starcoder2ForCausalLM",
        "Starcoder2Config",
        dict(SMALL, num_key_value_heads=2, sliding_window=WINDOW),
    ),
    "starcoder2-gqa-no-bias": (
        "Starcoder2ForCausalLM",
        "Starcoder2Config",
        dict(SMALL, num_key_value_heads=2, use_bias=False, hidden_act="gelu", tie_word_embeddings=False),
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(
    parity.family_tests(
        hf_model,
        HF_CASES,
        only=parity.ROUND_TRIP_TESTS,
    )
)


def test_from_hf_reads_the_family_s_parts():
    coder = from_hf(hf_model("starcoder2-gqa-window")).cfg
    assert (coder.norm.kind, coder.block.kind, coder.attention.window, coder.mlp.kind, coder.mlp.approximate) == (
        "layernorm",
        "pre",
        WINDOW,
        "gelu",
        "tanh",
    )
    plain = from_hf(hf_model("starcoder2-gqa-no-bias")).cfg
    assert (plain.attention.n_kv_head, plain.attention.qkv_bias, plain.mlp.bias, plain.attention.window) == (
        2,
        False,
        False,
        None,
    )


@pytest.mark.parametrize("case", ["starcoder2-gqa-window"])
def test_greedy_generation_matches_hf_generate(case):
    """20 new tokens after a 5-token prompt, past the window of 4: the same ids and step logits as HF."""
    parity.check_greedy_generation(hf_model(case, seed=4))


@pytest.mark.parametrize("case", ["starcoder2-gqa-window"])
def test_padded_batch_generation_matches_hf_generate(case):
    """Prompts of 7, 3 and 5 tokens left-padded into one batch: the same continuations and step logits as HF."""
    parity.check_padded_generation(hf_model(case, seed=6))


@pytest.mark.parametrize("case", ["starcoder2-gqa-window"])
def test_save_pretrained_directories_round_trip(case, tmp_path):
    """save_pretrained -> load_hf_dir -> save_hf_dir -> from_pretrained: the same logits throughout."""
    parity.check_directory_round_trip(hf_model(case, seed=7), tmp_path, **ATTN)


def test_archlab_layout_to_hf_to_archlab_is_bit_identical():
    """A pre-norm LayerNorm layout with GQA and a window, which only StarCoder 2 holds, converts to its HF
    class with the same logits, and back with every tensor bit for bit."""
    cfg = layout("model.attention.n_kv_head=2", f"model.attention.window={WINDOW}")
    parity.check_exports(cfg, "Starcoder2ForCausalLM", "starcoder2", **ATTN)


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model.position.rotary_dim=8"], "model.position.rotary_dim"),
        (["model.attention.out_bias=false"], "model.attention.out_bias"),
        (["model/block=parallel"], "model.block.kind"),
    ],
)
def test_the_family_refuses_what_it_cannot_hold(overrides, field):
    parity.check_family_refuses("starcoder2", layout(*overrides), field)


def test_config_from_hf_refuses_what_archlab_cannot_hold():
    config = parity.hf_config(HF_CASES, "starcoder2-gqa-window", hidden_act="silu")
    parity.check_refuses(lambda: config_from_hf(config), "Starcoder2Config.hidden_act")
