"""Hugging Face parity of Qwen2 (archlab/interop/families/qwen2.py): LLaMA's layout with q/k/v biases and sliding
windows on any layers (``max_window_layers``).

A tiny random model (every parameter redrawn: matrices N(0, 0.2²), biases and norm scales 0.5 + N(0, 0.3²),
far from 0 and 1, so a dropped, transposed or swapped tensor shows in the logits; GQA wherever the family has
it; sequences longer than every window of 4) gives the same float32 logits in archlab and in transformers'
eager implementation, from HF to archlab and from the shrunk preset's layout to HF; archlab -> HF -> archlab
gives back every tensor bit for bit; greedy decoding, alone and in a left-padded batch, equals HF
``generate``; what the family cannot hold is refused, naming the field."""

import pytest
from helpers import hf as parity
from helpers.hf import ATTN, SMALL, WINDOW

from archlab import compose_model
from archlab.interop.hf import config_from_hf, config_to_hf, from_hf

transformers = pytest.importorskip("transformers")

pytestmark = pytest.mark.usefixtures("single_thread")  # tiny models: one intra-op thread

# case -> (transformers model class, config class, config keys)
HF_CASES = {
    "qwen2": (
        "Qwen2ForCausalLM",
        "Qwen2Config",
        dict(
            SMALL,
            num_key_value_heads=2,
            use_sliding_window=True,
            sliding_window=WINDOW,
            max_window_layers=0,
            tie_word_embeddings=True,
        ),
    ),
}
D64 = ["model.d_model=64", "model.attention.n_head=4"]
# case -> (preset, the HF class it maps to, sizes): the preset shrunk, its registry choices and features kept
PRESET_CASES = {
    "qwen2-0.5b": ("qwen2-0.5b", "Qwen2ForCausalLM", D64),
    "qwen2-0.5b-every-other-layer-global": (
        "qwen2-0.5b",
        "Qwen2ForCausalLM",
        [*D64, "model.n_layer=3", "model/layers=every_other_global", f"model.attention.window={WINDOW}"],
    ),
}


def hf_model(case: str, seed: int = 1):
    return parity.hf_case(HF_CASES, case, seed, **ATTN)


# the standard parity tests (tests/helpers/hf.py family_tests), bound by name
globals().update(parity.family_tests(hf_model, HF_CASES, PRESET_CASES))


def test_from_hf_reads_the_family_s_parts():
    cfg = from_hf(hf_model("qwen2")).cfg
    q2 = cfg.attention
    assert (q2.qkv_bias, q2.out_bias, q2.window, parity.windows(cfg)) == (True, False, WINDOW, [WINDOW] * 2)


@pytest.mark.parametrize(
    "case, changes, read",
    [
        ("qwen2", dict(max_window_layers=1), [None, WINDOW]),  # layer 0 global, layer 1 slides
    ],
)
def test_any_layers_sliding_read_as_layer_kinds(case, changes, read):
    """Which layers slide, in any order (once refused unless every N-th one was global), reads as model.layers
    kinds giving each layer its window, and writes back the same layer_types."""
    cfg = config_from_hf(parity.hf_config(HF_CASES, case, **changes))
    assert parity.windows(cfg) == read
    assert config_to_hf(cfg).layer_types == ["full_attention" if w is None else "sliding_attention" for w in read]


@pytest.mark.parametrize(
    "overrides, field",
    [
        (["model=qwen2-0.5b", "model.mlp.bias=true"], "model.mlp.bias"),
    ],
)
def test_the_family_a_layout_routes_to_refuses_what_it_cannot_hold(overrides, field):
    parity.check_routed_family_refuses("qwen2", compose_model(overrides), field)
